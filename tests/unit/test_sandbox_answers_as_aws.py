"""The sandbox answers placement groups (sandbox/placement.py) and the G and VT vCPU quotas
(sandbox/quotas.py) as EC2 and Service Quotas do, so a sandbox run, `down` and `cancel` hear what
they would hear on AWS, and say nothing of an API that is missing (aws/placement, aws/capacity)."""
import boto3
import pytest
from moto import mock_aws

from ec2gpu.aws import capacity, placement
from ec2gpu.aws import tags as T
from ec2gpu.sandbox import placement as sandbox_placement
from ec2gpu.sandbox import quotas as sandbox_quotas

RUN = "20261128-230000-abcd"


@pytest.fixture
def sandbox_aws(monkeypatch):
    """moto in this process with the sandbox's two patches, undone afterwards (they patch classes)."""
    from moto.ec2.responses import EC2Response
    from moto.servicequotas.models import ServiceQuotasBackend
    monkeypatch.setattr(ServiceQuotasBackend, "get_service_quota", ServiceQuotasBackend.get_service_quota)
    for name in ("create_placement_group", "describe_placement_groups", "delete_placement_group"):
        monkeypatch.setattr(EC2Response, name, None, raising=False)  # restored (removed) afterwards
        monkeypatch.delattr(EC2Response, name)
    monkeypatch.setattr(sandbox_placement, "_GROUPS", {})
    sandbox_placement.install()
    sandbox_quotas.install()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        yield boto3.client("ec2", "us-east-1"), boto3.client("service-quotas", "us-east-1")


def test_a_run_checks_the_gvt_quota_in_the_sandbox_as_on_aws_and_says_no_warning(sandbox_aws):
    ec2, quotas = sandbox_aws
    said = []
    for spot in (False, True):
        got = capacity.check_quota(quotas, ec2, "g4dn.xlarge", spot, log=said.append)
        code, _ = capacity.QUOTA_CODES["spot" if spot else "on-demand"]
        assert got == {"quota": code, "value": sandbox_quotas.VCPUS, "in_use": 0, "needed": 4}
    assert said == []
    answer = quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-DB2E81BA")["Quota"]
    assert answer["QuotaName"] == "Running On-Demand G and VT instances" and answer["Adjustable"] is True
    assert answer["QuotaArn"].startswith("arn:aws:servicequotas:us-east-1:") and answer["Unit"] == "None"
    with pytest.raises(capacity.CapacityError, match="needs 1024 vCPUs"):
        capacity.check_quota(quotas, ec2, "g4dn.xlarge", False, count=256)
    with pytest.raises(quotas.exceptions.NoSuchResourceException):  # any other code: as before
        quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-1216C47A")


def test_placement_groups_are_created_found_by_run_and_deleted_as_ec2_does_without_a_warning(sandbox_aws):
    ec2, _ = sandbox_aws
    group, note = placement.create(ec2, RUN, "alice", "mine", "g5.xlarge")
    assert group == f"ec2gpu-{RUN}" and note == f"cluster placement group {group}"
    said = []
    [found] = placement.find(ec2, RUN, log=said.append)
    assert found["GroupName"] == group and found["State"] == "available" and found["Strategy"] == "cluster"
    assert found["GroupId"].startswith("pg-") and T.as_dict(found["Tags"])[T.RUN] == RUN
    assert placement.find(ec2, "20261128-230000-ffff", log=said.append) == []
    assert said == []
    with pytest.raises(ec2.exceptions.ClientError, match="InvalidPlacementGroup.Duplicate"):
        ec2.create_placement_group(GroupName=group, Strategy="cluster")
    placement.delete(ec2, group)
    assert placement.find(ec2, RUN, log=said.append) == [] and said == []
    placement.delete(ec2, group)  # a missing one: EC2's InvalidPlacementGroup.Unknown, which is fine
    with pytest.raises(ec2.exceptions.ClientError, match="InvalidPlacementGroup.Unknown"):
        ec2.describe_placement_groups(GroupNames=[group])
