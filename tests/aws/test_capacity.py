"""Capacity fallback and quota checks against moto, with AWS errors injected through botocore's
event hooks (a `before-call` handler that answers instead of the server)."""
import os
import time

import pytest
from botocore.awsrequest import AWSResponse

from ec2gpu.aws import capacity, instances, sweep
from ec2gpu.aws.session import Aws
from ec2gpu.errors import AwsError, CapacityError


RUN_ID = "run-cap"  # the spec fixture's (conftest.py)


def inject(client, fail: dict[tuple[str, str | None, bool], str], calls: list):
    """Answer RunInstances with ``fail[(type, zone, spot)]`` (an error code) where listed."""
    zone_of = {s: z for z, s in capacity.default_subnets(client).items()}

    def before_call(params, **_):
        body = params["body"]
        key = (body["InstanceType"], zone_of.get(body.get("SubnetId")), "InstanceMarketOptions.MarketType" in body)
        calls.append(key)
        if key in fail:
            error = {"Error": {"Code": fail[key], "Message": f"injected {fail[key]}"},
                     "ResponseMetadata": {"HTTPStatusCode": 500}}
            return AWSResponse("https://ec2.amazonaws.com/", 500, {}, None), error
        return None
    client.meta.events.register("before-call.ec2.RunInstances", before_call)


def test_full_zones_then_a_full_type_fall_over_in_order(aws, spec):
    ec2 = aws.client("ec2", fail_fast=True)
    zones = capacity.zones_offering(ec2, "g4dn.xlarge")
    assert len(zones) >= 2
    fail = {("g4dn.xlarge", z, False): "InsufficientInstanceCapacity" for z in zones}
    g5_zones = capacity.zones_offering(ec2, "g5.xlarge")
    fail[("g5.xlarge", g5_zones[0], False)] = "Unsupported"
    calls, log = [], []
    inject(ec2, fail, calls)
    found, attempts = capacity.launch_with_fallback(ec2, spec, ["g4dn.xlarge", "g5.xlarge"], log=log.append)
    expected = [("g4dn.xlarge", z, False) for z in zones] + [("g5.xlarge", g5_zones[0], False),
                                                             ("g5.xlarge", g5_zones[1], False)]
    assert calls == expected
    assert [a.outcome for a in attempts] == ["InsufficientInstanceCapacity"] * len(zones) + ["Unsupported", "launched"]
    assert found[0].type == "g5.xlarge" and found[0].zone == g5_zones[1]
    assert len(log) == len(zones) + 1 and "trying the next zone or type" in log[0]


def test_the_zones_of_an_interrupted_attempt_are_tried_last_for_each_type(aws):
    """A replacement after a spot interruption tries the other zones first (capacity.plan's
    ``avoid_zones``), the interrupted ones last, in their usual order, for every type; nothing is
    dropped."""
    ec2 = aws.client("ec2", fail_fast=True)
    subnets = capacity.default_subnets(ec2)
    zones = {t: [z for z in capacity.zones_offering(ec2, t) if z in subnets] for t in ("g4dn.xlarge", "g5.xlarge")}
    assert len(zones["g4dn.xlarge"]) >= 3
    interrupted = [zones["g4dn.xlarge"][1], zones["g4dn.xlarge"][0]]  # as recovery lists them: any order

    def expected(t):
        return [z for z in zones[t] if z not in interrupted] + [z for z in zones[t] if z in interrupted]
    order = capacity.plan(ec2, ["g4dn.xlarge", "g5.xlarge"], spot=True, spot_fallback_on_demand=False,
                          avoid_zones=interrupted)
    assert [(t, z) for t, z, _, _ in order] == [("g4dn.xlarge", z) for z in expected("g4dn.xlarge")] + [
        ("g5.xlarge", z) for z in expected("g5.xlarge")]
    assert [z for t, z, _, _ in order if t == "g4dn.xlarge"][-2:] == zones["g4dn.xlarge"][:2]
    assert all(s == subnets[z] and spot for _, z, s, spot in order)
    assert [z for _, z, _, _ in capacity.plan(ec2, ["g4dn.xlarge"], True, False)] == zones["g4dn.xlarge"]  # none avoided


def test_spot_without_capacity_anywhere_falls_back_to_on_demand_when_asked(aws, spec):
    ec2 = aws.client("ec2", fail_fast=True)
    zones = capacity.zones_offering(ec2, "g4dn.xlarge")
    calls = []
    inject(ec2, {("g4dn.xlarge", z, True): "SpotMaxPriceTooLow" for z in zones}, calls)
    spot = instances.LaunchSpec(**{**spec.__dict__, "spot": True})
    with pytest.raises(CapacityError) as info:
        capacity.launch_with_fallback(ec2, spot, ["g4dn.xlarge"])
    assert "--spot-fallback on-demand" in info.value.hint and len(calls) == len(zones)
    assert not sweep.find_instances(aws.ec2, run_id="run-cap")  # nothing was launched
    found, attempts = capacity.launch_with_fallback(ec2, spot, ["g4dn.xlarge"], spot_fallback_on_demand=True)
    assert attempts[-1].market == "on-demand" and found[0].market == "on-demand"


def test_an_account_limit_stops_at_once_with_the_quota_to_raise(aws, spec):
    ec2 = aws.client("ec2", fail_fast=True)
    zones = capacity.zones_offering(ec2, "g4dn.xlarge")
    calls = []
    inject(ec2, {("g4dn.xlarge", zones[0], False): "VcpuLimitExceeded"}, calls)
    with pytest.raises(CapacityError) as info:
        capacity.launch_with_fallback(ec2, spec, ["g4dn.xlarge", "g5.xlarge"])
    assert len(calls) == 1 and "L-DB2E81BA" in info.value.hint


def quota_answer(client, value: float):
    def before_call(**_):
        body = {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "Value": value,
                          "QuotaName": "Running On-Demand G and VT instances"}, "ResponseMetadata": {}}
        return AWSResponse("https://servicequotas.amazonaws.com/", 200, {}, None), body
    client.meta.events.register("before-call.service-quotas.GetServiceQuota", before_call)


def test_quota_too_small_refuses_before_anything_is_created(aws):
    quotas = Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).client("service-quotas")
    quota_answer(quotas, 0.0)  # a new account: 0 vCPUs for G and VT
    with pytest.raises(CapacityError) as info:
        capacity.check_quota(quotas, aws.ec2, "g4dn.xlarge", spot=False)
    assert "needs 4 vCPUs" in info.value.message and "is 0 vCPUs" in info.value.message
    assert "request-service-quota-increase" in info.value.hint and "L-DB2E81BA" in info.value.hint


def test_quota_large_enough_passes_and_an_unreadable_quota_is_only_reported(aws):
    quotas = Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).client("service-quotas")
    quota_answer(quotas, 8.0)
    assert capacity.check_quota(quotas, aws.ec2, "g4dn.xlarge", spot=False) == {
        "quota": "L-DB2E81BA", "value": 8.0, "in_use": 0, "needed": 4}
    log = []
    fresh = Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).client("service-quotas")
    assert capacity.check_quota(fresh, aws.ec2, "g5.xlarge", spot=True, log=log.append)["quota"] == "L-3819A6DF"
    assert log == []  # the sandbox answers the G and VT quotas as Service Quotas does (sandbox/quotas.py)

    def denied(**_):
        return AWSResponse("https://servicequotas.amazonaws.com/", 400, {}, None), {
            "Error": {"Code": "AccessDeniedException", "Message": "not authorized"}, "ResponseMetadata": {}}
    fresh.meta.events.register("before-call.service-quotas.GetServiceQuota", denied)
    assert capacity.check_quota(fresh, aws.ec2, "g5.xlarge", spot=True, log=log.append) is None
    assert "not checked" in log[0]  # an unreadable quota: said, and the launch goes on


def test_train_refused_by_the_quota_exits_4_and_creates_nothing(sandbox_env, monkeypatch, capsys, tmp_path):
    from ec2gpu import cli
    # The quota is read before any training: the run needs no MNIST, only a data directory that
    # passes the (earlier, local) data check, so this test passes on a machine with no data set
    # and no internet (`make test-fast DATA=/nonexistent`).
    monkeypatch.setenv("EC2GPU_DATA_DIR", str(tmp_path))
    original = Aws.client

    def client(self, service, fail_fast=False):
        c = original(self, service, fail_fast)
        if service == "service-quotas" and not getattr(c, "_quota_injected", False):
            quota_answer(c, 0.0)
            c._quota_injected = True
        return c
    monkeypatch.setattr(Aws, "client", client)
    ec2 = Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).ec2
    before = (sweep.find_instances(ec2), sweep.find_security_groups(ec2), sweep.find_key_pairs(ec2))
    assert cli.main(["train", "mnist", "--sandbox"]) == 4
    err = capsys.readouterr().err
    assert "L-DB2E81BA" in err and "Traceback" not in err
    assert (sweep.find_instances(ec2), sweep.find_security_groups(ec2), sweep.find_key_pairs(ec2)) == before


def test_throttling_is_retried_in_place_with_backoff_even_by_the_fail_fast_client(aws, spec, wire_errors):
    inject, calls, sleeps = wire_errors
    ec2 = aws.client("ec2", fail_fast=True)
    zone = capacity.zones_offering(ec2, "g4dn.xlarge")[0]
    inject(ec2, "RunInstances", "RequestLimitExceeded", times=2, status=503)
    inject(ec2, "DescribeInstanceTypeOfferings", "RequestLimitExceeded", times=1, status=503)
    found, attempts = capacity.launch_with_fallback(ec2, spec, ["g4dn.xlarge"])
    assert calls["RunInstances"] == 3 and sleeps == [0.25, 0.25, 0.5]  # in place, backing off
    assert [a.outcome for a in attempts] == ["launched"]  # one attempt: the zone was not given up
    assert found[0].zone == zone


def test_a_launch_refused_while_ec2_does_not_see_the_new_instance_profile_is_tried_again_in_place(
        aws, spec, wire_errors):
    inject, calls, _ = wire_errors
    ec2, said, waited = aws.client("ec2", fail_fast=True), [], []
    inject(ec2, "RunInstances", "InvalidParameterValue", times=2)
    found, attempts = capacity.launch_with_fallback(ec2, spec, ["g4dn.xlarge"], log=said.append,
                                                    profile_created_at=time.time(), sleep=waited.append)
    assert calls["RunInstances"] == 3 and waited == [1, 2] and [a.outcome for a in attempts] == ["launched"]
    assert "RunInstances: InvalidParameterValue" in said[0] and len(found) == 1
    inject(ec2, "RunInstances", "InvalidParameterValue", times=1)  # no new profile: a bad request, at once
    with pytest.raises(AwsError, match="InvalidParameterValue"):
        capacity.launch_with_fallback(ec2, spec, ["g4dn.xlarge"], sleep=waited.append)
    assert waited == [1, 2]


def test_a_capacity_error_is_not_retried_in_place(aws, spec, wire_errors):
    inject, calls, sleeps = wire_errors
    ec2 = aws.client("ec2", fail_fast=True)
    inject(ec2, "RunInstances", "InsufficientInstanceCapacity", times=1, status=500)
    found, attempts = capacity.launch_with_fallback(ec2, spec, ["g4dn.xlarge"])
    assert [a.outcome for a in attempts] == ["InsufficientInstanceCapacity", "launched"]
    assert attempts[0].zone != attempts[1].zone and calls["RunInstances"] == 2


def test_quota_counts_the_running_g_instances(aws, spec):
    (inst,), _ = capacity.launch_with_fallback(aws.client("ec2", fail_fast=True), spec, ["g4dn.xlarge"])
    instances.wait_running(aws.ec2, [inst.id], timeout_s=30)
    quotas = Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).client("service-quotas")
    quota_answer(quotas, 7.0)  # 4 vCPUs running + 4 needed > 7
    with pytest.raises(CapacityError, match="4 are in use"):
        capacity.check_quota(quotas, aws.ec2, "g4dn.xlarge", spot=False)
    assert capacity.gvt_vcpus_in_use(aws.ec2, spot=True) == 0  # spot instances count against the other quota
