"""Instance type facts from DescribeInstanceTypes, the catalog's table only where the API cannot answer."""
from ec2gpu.aws import catalog, types


def test_gpus_vcpus_memory_and_placement_come_from_ec2(aws):
    got = types.describe(aws.ec2, ["g4dn.xlarge", "g5.12xlarge"])
    g5 = got["g5.12xlarge"]
    assert (g5.gpu, g5.gpu_count, g5.vcpus, g5.memory_gib) == ("A10G", 4, 48, 192.0)
    assert g5.cluster_placement and g5.source == types.API
    assert got["g4dn.xlarge"].vcpus == catalog.CATALOG["g4dn.xlarge"].vcpus == 4


def test_a_client_asks_about_a_type_once(aws):
    asked = []
    aws.ec2.meta.events.register("before-call.ec2.DescribeInstanceTypes", lambda **_: asked.append(1))
    first = types.facts(aws.ec2, "g6.xlarge")
    assert types.describe(aws.ec2, ["g6.xlarge"])["g6.xlarge"] == first and types.facts(aws.ec2, "g6.xlarge") == first
    assert len(asked) == 1
    types.describe(aws.ec2, ["g6.xlarge", "g5.xlarge"])
    assert len(asked) == 2  # only g5.xlarge was new


def test_without_the_api_the_catalogs_table_answers_and_says_so(aws, wire_errors):
    inject, calls, _ = wire_errors
    inject(aws.ec2, "DescribeInstanceTypes", "UnauthorizedOperation", times=1)
    said = []
    got = types.describe(aws.ec2, ["g5.12xlarge"], log=said.append)
    assert got["g5.12xlarge"].source == types.TABLE and got["g5.12xlarge"].vcpus == catalog.CATALOG["g5.12xlarge"].vcpus
    assert calls["DescribeInstanceTypes"] == 1 and "UnauthorizedOperation" in said[0]
