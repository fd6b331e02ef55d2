"""What aws/capacity.py checks before a launch, pure (no sandbox, no AWS): the G and VT vCPU quota,
the vCPUs in use, and the spot service-linked role, each at its exact edge. tests/aws/test_capacity.py
holds the zone and type fallback and these checks against the sandbox's moto server (this module
cannot share its name: the test folders are not packages)."""
from __future__ import annotations

from types import SimpleNamespace

import botocore.exceptions
import pytest

from ec2gpu.errors import CapacityError
from fakes import FakeEC2  # same folder (pytest prepend import mode)


# --- the G and VT vCPU quota (ec2gpu/aws/capacity.py check_quota) ------------------------------
# In use + needed equal to the quota passes, one over is refused.

class _Quotas:
    def __init__(self, value: float):
        self.value = value
        self.asked: list[tuple[str, str]] = []

    def get_service_quota(self, ServiceCode, QuotaCode):
        self.asked.append((ServiceCode, QuotaCode))
        return {"Quota": {"Value": self.value}}


def _running(*types: str, spot: bool = False) -> FakeEC2:
    """An EC2 client with these G/VT instances running (and a p3 and an other-market g4dn that do not
    count)."""
    other = {"InstanceType": "g4dn.xlarge", **({} if spot else {"InstanceLifecycle": "spot"})}
    instances = [{"InstanceType": t, **({"InstanceLifecycle": "spot"} if spot else {})} for t in types]
    instances += [{"InstanceType": "p3.2xlarge", **({"InstanceLifecycle": "spot"} if spot else {})}, other]
    return FakeEC2(describe_instances=[{"Reservations": [{"Instances": instances}]}])


@pytest.mark.parametrize("spot,code", [(False, "L-DB2E81BA"), (True, "L-3819A6DF")])
def test_the_quota_check_passes_at_exactly_the_limit_and_refuses_one_vcpu_over(spot, code):
    """g4dn.xlarge has 4 vCPUs. 8 in use (two g4dn.xlarge) + 4 needed = 12: a quota of 12 passes,
    a quota of 11 refuses. Instances of the other market and p-family ones are not counted."""
    from ec2gpu.aws import capacity

    ec2 = _running("g4dn.xlarge", "g4dn.xlarge", spot=spot)
    assert capacity.gvt_vcpus_in_use(ec2, spot) == 8
    quotas = _Quotas(12)
    assert capacity.check_quota(quotas, ec2, "g4dn.xlarge", spot) == {"quota": code, "value": 12, "in_use": 8,
                                                                      "needed": 4}
    assert quotas.asked == [("ec2", code)]
    with pytest.raises(CapacityError, match=r"needs 4 vCPUs, but the quota .* is 11 vCPUs and 8 are in use"):
        capacity.check_quota(_Quotas(11), ec2, "g4dn.xlarge", spot)


def test_the_quota_counts_every_instance_of_the_request():
    """count=3 of g4dn.xlarge needs 12 vCPUs: a quota of 12 with none in use passes, 11 refuses."""
    from ec2gpu.aws import capacity

    ec2 = _running()
    checked = capacity.check_quota(_Quotas(12), ec2, "g4dn.xlarge", False, count=3)
    assert checked is not None and checked["needed"] == 12
    with pytest.raises(CapacityError):
        capacity.check_quota(_Quotas(11), ec2, "g4dn.xlarge", False, count=3)


def test_a_p_family_type_is_not_checked_against_the_gvt_quota():
    from ec2gpu.aws import capacity

    quotas = _Quotas(0)
    assert capacity.check_quota(quotas, _running(), "p3.2xlarge", False) is None
    assert quotas.asked == []


# --- aws/capacity.py ----------------------------------------------------------------------------
# A mutmut run over this module with the fast tier (issue 29, item 14) left these mutants alive;
# each test fails when the one token it pins changes (a limit, a bill, an estimate, a quota).

class _Described:
    """describe_instances honouring its instance-state-name filter; describe_instance_types answers nothing."""

    def __init__(self, instances):
        self.instances = instances

    def get_paginator(self, name):
        return SimpleNamespace(paginate=lambda **kw: self._pages(name, kw))

    def _pages(self, name, kw):
        if name == "describe_instance_types":
            return [{"InstanceTypes": []}]
        (f,) = kw["Filters"]
        assert f["Name"] == "instance-state-name"
        return [{"Reservations": [{"Instances": [i for i in self.instances if i["State"]["Name"] in f["Values"]]}]}]


def test_vcpus_in_use_count_pending_and_running_only_and_an_unknown_type_by_its_cpu_options():
    from ec2gpu.aws import capacity

    ec2 = _Described([{"InstanceType": "g4dn.xlarge", "State": {"Name": "pending"}},
                      {"InstanceType": "g4dn.xlarge", "State": {"Name": "running"}},
                      {"InstanceType": "g4dn.xlarge", "State": {"Name": "stopped"}},
                      {"InstanceType": "g99.new", "State": {"Name": "running"},
                       "CpuOptions": {"CoreCount": 3, "ThreadsPerCore": 2}},
                      {"InstanceType": "g98.new", "State": {"Name": "running"}}])
    assert capacity.gvt_vcpus_in_use(ec2, False) == 4 + 4 + 3 * 2 + 1


def test_an_unreadable_quota_is_said_and_not_checked():
    from ec2gpu.aws import capacity

    class Quotas:
        def get_service_quota(self, **kw):
            raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}},
                                                  "GetServiceQuota")
    said: list[str] = []
    assert capacity.check_quota(Quotas(), _Described([]), "g4dn.xlarge", False, log=said.append) is None
    assert len(said) == 1 and said[0].startswith("could not read the vCPU quota L-DB2E81BA (")
    assert said[0].endswith("); not checked") and "AccessDenied" in said[0]


def test_a_quota_refusal_says_how_to_raise_it():
    from ec2gpu.aws import capacity
    from ec2gpu.errors import CapacityError

    class Quotas:
        def get_service_quota(self, **kw):
            return {"Quota": {"Value": 0}}
    for spot, market in ((False, "on-demand"), (True, "spot")):
        with pytest.raises(CapacityError) as refused:
            capacity.check_quota(Quotas(), _Described([]), "g4dn.xlarge", spot)
        assert refused.value.hint == capacity.quota_hint(market) and refused.value.hint


def test_the_spot_role_is_there_missing_or_unknown():
    from ec2gpu.aws import capacity

    class Iam:
        def __init__(self, code=None):
            self.code = code

        def get_role(self, RoleName):
            assert RoleName == "AWSServiceRoleForEC2Spot"
            if self.code:
                raise botocore.exceptions.ClientError({"Error": {"Code": self.code, "Message": "x"}}, "GetRole")
            return {"Role": {"RoleName": RoleName}}
    assert capacity.spot_role_exists(Iam()) is True
    assert capacity.spot_role_exists(Iam("NoSuchEntity")) is False
    assert capacity.spot_role_exists(Iam("AccessDenied")) is None
