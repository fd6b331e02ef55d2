"""The AWS layer against a real moto server (the sandbox's), through the same boto3 calls."""
from datetime import datetime, timezone
import stat

import pytest
import botocore.exceptions
from botocore.stub import Stubber

from ec2gpu.aws import capacity, images, instances, network, sweep
from ec2gpu.aws.session import Aws
from ec2gpu.runs.plan import costs
from ec2gpu.sandbox import market
from ec2gpu.errors import AwsError, UsageError


def test_key_pair_is_ed25519_written_0600_and_tagged(aws, tmp_path):
    name, path = network.create_key_pair(aws.ec2, "run-k", "alice", tmp_path / "keys")
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
        (kp,) = aws.ec2.describe_key_pairs(KeyNames=[name])["KeyPairs"]
        assert kp["KeyType"] == "ed25519"
        assert sweep.find_key_pairs(aws.ec2, "run-k")[0]["KeyName"] == name
    finally:
        network.delete_key_pair(aws.ec2, name, tmp_path / "keys")
    assert not path.exists()


def test_security_group_admits_ssh_from_the_caller_only(aws):
    cidr = network.ssh_cidr(None)  # the sandbox's checkip answers 127.0.0.1
    assert cidr == "127.0.0.1/32"
    gid = network.create_security_group(aws.ec2, "run-sg", "alice", cidr)
    try:
        (sg,) = aws.ec2.describe_security_groups(GroupIds=[gid])["SecurityGroups"]
        ranges = [r["CidrIp"] for p in sg["IpPermissions"] for r in p["IpRanges"]]
        assert ranges == ["127.0.0.1/32"] and "0.0.0.0/0" not in ranges
        assert {t["Key"] for t in sg["Tags"]} >= {"ec2gpu:run", "ec2gpu:owner", "Name"}
    finally:
        sweep.delete_security_group(aws.ec2, gid)


def _refuse_ssm(stub, answer_name: str | None = None, value: str | None = None):
    """GetParametersByPath refused; GetParameter refused for every name (or answered for one)."""
    stub.add_client_error("get_parameters_by_path", "AccessDeniedException")
    for name in images.SSM_PARAMETERS:
        if name == answer_name:
            stub.add_response("get_parameter", {"Parameter": {"Name": name, "Value": value}}, {"Name": name})
            return
        stub.add_client_error("get_parameter", "ParameterNotFound")


def test_ami_falls_back_to_the_newest_24_04_deep_learning_ami_by_name_when_ssm_is_refused(aws):
    ssm = aws.client("ssm")
    with Stubber(ssm) as stub:
        _refuse_ssm(stub)
        ami = images.resolve_ami(ssm, aws.ec2)
    assert ami["source"].startswith("describe_images") and "(Ubuntu 24.04)" in ami["Name"]


def test_ami_comes_from_a_named_ssm_parameter_when_listing_them_is_refused(aws):
    target = images.resolve_ami(aws.client("ssm"), aws.ec2)["ImageId"]
    ssm = aws.client("ssm")
    name = images.SSM_PARAMETERS[1]
    with Stubber(ssm) as stub:
        _refuse_ssm(stub, name, target)
        ami = images.resolve_ami(ssm, aws.ec2)
    assert ami["ImageId"] == target and ami["source"] == f"ssm:{name}"


def test_unknown_ami_override_is_a_clear_error(aws):
    with pytest.raises(AwsError):
        images.resolve_ami(aws.client("ssm"), aws.ec2, "ami-00000000000000000")


def test_spot_launch_is_recorded_as_spot_and_teardown_removes_everything(aws, tmp_path):
    ec2 = aws.ec2
    key, _ = network.create_key_pair(ec2, "run-l", "alice", tmp_path)
    gid = network.create_security_group(ec2, "run-l", "alice", "127.0.0.1/32")
    ami = images.resolve_ami(aws.client("ssm"), ec2)
    spec = instances.LaunchSpec(run_id="run-l", owner="alice", name="lab", instance_type="g4dn.xlarge",
                                image_id=ami["ImageId"], root_device_name=ami["RootDeviceName"], key_name=key,
                                security_group_id=gid, spot=True)
    (inst,), _ = capacity.launch_with_fallback(aws.client("ec2", fail_fast=True), spec, ["g4dn.xlarge"])
    (desc,) = instances.wait_running(ec2, [inst.id], timeout_s=30)
    row = instances.summary(desc)
    assert (row["market"], row["state"], row["name"], row["run_id"]) == ("spot", "running", "lab", "run-l")
    (raw,) = ec2.describe_instances(InstanceIds=[desc.id])["Reservations"][0]["Instances"]
    assert raw["MetadataOptions"]["HttpTokens"] == "required"
    removed = sweep.delete_run(ec2, "run-l", tmp_path)
    assert removed["instances"] == [inst.id] and removed["security_groups"] == [gid]
    assert sweep.find_instances(ec2, run_id="run-l") == []
    assert sweep.find_security_groups(ec2, "run-l") == [] and sweep.find_key_pairs(ec2, "run-l") == []
    # the bill of a spot instance follows its zone's spot price history (the sandbox's market)
    (gone,) = instances.describe_instances(ec2, [inst.id])
    bill = costs.actual_cost(aws, tmp_path, gone, ended_fallback=datetime.now(timezone.utc))
    zone = gone.zone
    assert "spot price history of " + zone in bill["price_source"]
    assert bill["usd_per_hour"] == pytest.approx(market.spot_price("g4dn.xlarge", zone))
    assert bill["usd_per_hour"] < 0.526  # below the on-demand price
    assert bill["compute_usd"] == pytest.approx(bill["billed_seconds"] * bill["usd_per_hour"] / 3600)


def test_unknown_region_is_a_usage_error():
    with pytest.raises(UsageError, match="region"):
        Aws("mars-north-1")


def test_missing_credentials_are_reported_with_a_hint(monkeypatch, tmp_path):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(AwsError) as exc:
        Aws("us-east-1").check_credentials()
    assert "aws configure" in exc.value.hint


class _GroupInUse:
    """An EC2 client whose DeleteSecurityGroup answers DependencyViolation ``busy`` times, then
    ``then`` (None: success)."""

    def __init__(self, busy: int, then: str | None = None):
        self.busy, self.then, self.calls = busy, then, 0

    def delete_security_group(self, GroupId):
        self.calls += 1
        code = "DependencyViolation" if self.calls <= self.busy else self.then
        if code:
            raise botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "m"}}, "DeleteSecurityGroup")


def test_a_group_in_use_is_deleted_once_its_instances_are_gone_and_a_gone_group_is_fine():
    ec2 = _GroupInUse(busy=3)
    sweep.delete_security_group(ec2, "sg-1", timeout_s=5, delay_s=0.01)
    assert ec2.calls == 4
    ec2 = _GroupInUse(busy=1, then="InvalidGroup.NotFound")
    sweep.delete_security_group(ec2, "sg-1", timeout_s=5, delay_s=0.01)
    assert ec2.calls == 2


def test_a_group_still_in_use_at_the_deadline_or_another_error_is_raised():
    ec2 = _GroupInUse(busy=10**6)
    with pytest.raises(botocore.exceptions.ClientError, match="DependencyViolation"):
        sweep.delete_security_group(ec2, "sg-1", timeout_s=0.2, delay_s=0.05)
    assert 2 <= ec2.calls <= 6
    ec2 = _GroupInUse(busy=0, then="UnauthorizedOperation")
    with pytest.raises(botocore.exceptions.ClientError, match="UnauthorizedOperation"):
        sweep.delete_security_group(ec2, "sg-1", timeout_s=5, delay_s=0.01)
    assert ec2.calls == 1


def test_a_stuck_security_group_does_not_stop_the_sweep_and_is_reported_left(aws, tmp_path, monkeypatch):
    """`cleanup`/`down` are best-effort (one registry, aws/sweep.KINDS): a group EC2 keeps refusing
    (DependencyViolation) is waited for within the sweep's bound and then left, named, while the
    key pairs, the other group and the placement group of the same sweep are still removed."""
    import botocore.exceptions

    ec2 = aws.ec2
    key, _ = network.create_key_pair(ec2, "run-stuck", "alice", tmp_path)
    stuck = network.create_security_group(ec2, "run-stuck", "alice", "127.0.0.1/32")
    other = network.create_security_group(ec2, "run-stuck2", "alice", "127.0.0.1/32")
    real = ec2.delete_security_group

    def refuse(GroupId):
        if GroupId == stuck:
            raise botocore.exceptions.ClientError({"Error": {"Code": "DependencyViolation", "Message": "in use"}},
                                                  "DeleteSecurityGroup")
        return real(GroupId=GroupId)
    monkeypatch.setattr(ec2, "delete_security_group", refuse)
    found = {k: v for k, v in sweep.inventory(ec2).items() if k in ("security_groups", "key_pairs")}
    found = {k: [r for r in v if r["run_id"] in ("run-stuck", "run-stuck2")] for k, v in found.items()}
    removed = sweep.delete_everything(ec2, found, tmp_path, group_wait_s=0.5)
    assert removed["security_groups"] == [other] and removed["key_pairs"] == [key]
    assert removed["left"] == [f"{stuck} (DependencyViolation)"]
    monkeypatch.setattr(ec2, "delete_security_group", real)
    assert sweep.delete_run(ec2, "run-stuck", tmp_path)["security_groups"] == [stuck]


def test_every_kind_of_the_registry_is_listed_by_inventory_and_removed_in_its_order(aws):
    """One registry: inventory lists every kind (roles with an IAM client, groups with an Auto
    Scaling one, secret parameters with an SSM one), teardown's kinds are
    registry kinds, and what a kind waits for comes before it."""
    keys = [k.key for k in sweep.KINDS]
    assert list(sweep.inventory(aws.ec2, "run-none", iam=aws.client("iam"), autoscaling=aws.client("autoscaling"),
                                ssm=aws.client("ssm"))) == keys
    assert not {"instance_roles", "auto_scaling_groups", "secret_parameters"} & set(sweep.inventory(aws.ec2, "run-none"))
    for kind in sweep.KINDS:
        assert all(keys.index(a) < keys.index(kind.key) for a in kind.after)


def test_cleanup_removes_what_it_can_names_what_it_cannot_and_exits_1(aws, tmp_path, monkeypatch, capsys):
    import botocore.exceptions

    from ec2gpu import cli

    key, _ = network.create_key_pair(aws.ec2, "run-left", "alice", tmp_path)
    group = network.create_security_group(aws.ec2, "run-left", "alice", "127.0.0.1/32")

    def in_use(ec2, group_id, timeout_s=300, delay_s=3):
        raise botocore.exceptions.ClientError({"Error": {"Code": "DependencyViolation", "Message": "in use"}},
                                              "DeleteSecurityGroup")
    with monkeypatch.context() as stuck:
        stuck.setattr(sweep, "delete_security_group", in_use)
        assert cli.main(["cleanup", "--sandbox", "--no-fetch"]) == 1
    said = capsys.readouterr()
    assert f"removed key pairs {key}" in " ".join(said.out.split())
    assert f"could not remove us-east-1: {group} (DependencyViolation)" in " ".join(said.err.split())
    assert sweep.find_key_pairs(aws.ec2, "run-left") == [] and sweep.find_security_groups(aws.ec2, "run-left")
    assert cli.main(["cleanup", "--sandbox", "--no-fetch"]) == 0
    assert sweep.find_security_groups(aws.ec2, "run-left") == []


def test_a_several_node_run_with_the_most_labels_stays_within_ec2s_tags_per_resource(aws, spec):
    """EC2 refuses a 51st tag (TagLimitExceeded, which moto shows too): a task's labels and every
    tag of ec2gpu's own on a node of a several-node run (cluster, node, idle rule, max runtime)
    fit, the node's number (tag_nodes, after the launch) included."""
    from dataclasses import replace
    from ec2gpu.aws import tags
    labels = tuple((f"label-{k:02d}", "x") for k in range(tags.MAX_LABELS))
    spec = replace(spec, count=2, cluster="big", idle=tags.IdleRule("down", 3600), labels=labels)
    launched = aws.ec2.run_instances(**instances.run_request(spec))["Instances"]
    nodes = instances.tag_nodes(aws.ec2, instances.describe_instances(aws.ec2, [i["InstanceId"] for i in launched]),
                                "big")
    for node in instances.describe_instances(aws.ec2, [n.id for n in nodes]):
        own = {k for k in node.tags if k not in dict(labels)}
        assert own == set(tags.INSTANCE_TAGS)  # every tag ec2gpu puts is counted in INSTANCE_TAGS
        assert len(node.tags) == tags.MAX_TAGS


def test_the_sandbox_answers_the_accounts_default_ebs_key_as_ec2_does(sandbox_env):
    """GetEbsDefaultKmsKeyId (sandbox/ebskeys.py; moto has none): alias/aws/ebs, the AWS managed key,
    also once volumes were encrypted (moto then keeps a key of its own as the default), until
    ModifyEbsDefaultKmsKeyId names another: then its ARN. us-west-2: no other test's region."""
    import os
    aws = Aws("us-west-2", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    ec2, kms = aws.ec2, aws.client("kms")
    ec2.create_volume(AvailabilityZone="us-west-2a", Size=1, Encrypted=True)
    assert ec2.get_ebs_default_kms_key_id()["KmsKeyId"] == "alias/aws/ebs"
    key = kms.create_key()["KeyMetadata"]
    ec2.modify_ebs_default_kms_key_id(KmsKeyId=key["KeyId"])
    assert ec2.get_ebs_default_kms_key_id()["KmsKeyId"] == key["Arn"]
