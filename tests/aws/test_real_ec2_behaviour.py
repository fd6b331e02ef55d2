"""What EC2 does that moto alone does not: user data on the wire, eventual consistency, the spot
service-linked role, the DLAMI line, billing from running. Against the sandbox's moto server, with
EC2's answers injected on the wire where moto has none."""
import base64
import os
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from ec2gpu.aws import capacity, images, instances, network, sweep
from ec2gpu.aws.session import Aws
from ec2gpu.errors import SpotRoleMissing
from ec2gpu.runs.plan import costs


RUN_ID = "run-real"  # the spec fixture's (conftest.py)


def test_user_data_goes_on_the_wire_base64_encoded_once(aws, spec):
    ec2 = aws.client("ec2", fail_fast=True)
    sent = []
    ec2.meta.events.register("before-send.ec2.RunInstances",
                             lambda request, **_: sent.append(parse_qs(_text(request.body))["UserData"][0]))
    (inst,), _ = capacity.launch_with_fallback(ec2, spec, ["g4dn.xlarge"])
    script = base64.b64decode(sent[0]).decode()  # what the instance receives: decoded once by EC2
    assert script.startswith("#!/bin/bash") and "shutdown -h +90" in script
    stored = aws.ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")
    assert base64.b64decode(stored["UserData"]["Value"]).decode().startswith("#!")


def test_a_group_not_visible_yet_is_retried_until_it_is(aws, wire_errors):
    inject, calls, sleeps = wire_errors
    inject(aws.ec2, "AuthorizeSecurityGroupIngress", "InvalidGroup.NotFound", times=2)
    gid = network.create_security_group(aws.ec2, "run-ec", "alice", "127.0.0.1/32")
    try:
        assert calls["AuthorizeSecurityGroupIngress"] == 3 and sleeps == [0.25, 0.5]
        (sg,) = aws.ec2.describe_security_groups(GroupIds=[gid])["SecurityGroups"]
        assert [r["CidrIp"] for p in sg["IpPermissions"] for r in p["IpRanges"]] == ["127.0.0.1/32"]
    finally:
        sweep.delete_security_group(aws.ec2, gid)


def test_a_new_instance_not_found_by_create_tags_and_run_instances_missing_key_are_retried(aws, spec, wire_errors):
    inject, calls, sleeps = wire_errors
    ec2 = aws.client("ec2", fail_fast=True)
    inject(ec2, "RunInstances", "InvalidKeyPair.NotFound", times=1)
    (inst,), attempts = capacity.launch_with_fallback(ec2, spec, ["g4dn.xlarge"])
    assert [a.outcome for a in attempts] == ["launched"] and calls["RunInstances"] == 2
    inject(aws.ec2, "CreateTags", "InvalidInstanceID.NotFound", times=1)
    instances.tag_nodes(aws.ec2, [inst], "real")
    (desc,) = instances.describe_instances(aws.ec2, [inst.id])
    assert desc.tags["ec2gpu:node"] == "0"


def test_only_the_listed_codes_are_retried_and_only_so_often(aws, wire_errors):
    inject, calls, sleeps = wire_errors
    inject(aws.ec2, "AuthorizeSecurityGroupIngress", "InvalidGroupId.Malformed", times=1)
    with pytest.raises(ClientError):
        aws.ec2.authorize_security_group_ingress(**network.ingress_request("sg-123", "127.0.0.1/32"))
    assert calls["AuthorizeSecurityGroupIngress"] == 1
    inject(aws.ec2, "CreateTags", "InvalidInstanceID.NotFound", times=100)
    with pytest.raises(ClientError) as exc:
        aws.ec2.create_tags(Resources=["i-0123456789abcdef0"], Tags=[{"Key": "a", "Value": "b"}])
    assert exc.value.response["Error"]["Code"] == "InvalidInstanceID.NotFound"
    assert calls["CreateTags"] == 8 and sum(sleeps[-7:]) == pytest.approx(15.75)  # bounded: ~16 s, 8 calls


def test_spot_without_the_service_linked_role_has_its_own_error_and_lets_on_demand_have_its_turn(aws, spec,
                                                                                                    wire_errors):
    inject, calls, sleeps = wire_errors
    ec2 = aws.client("ec2", fail_fast=True)
    inject(ec2, "RunInstances", capacity.SPOT_ROLE_MISSING, times=100, status=403)
    spot = spec.__class__(**{**spec.__dict__, "spot": True})
    with pytest.raises(SpotRoleMissing) as exc:
        capacity.launch_with_fallback(ec2, spot, ["g4dn.xlarge"])
    assert capacity.SPOT_ROLE_COMMAND in exc.value.hint and exc.value.exit_code == 3
    assert calls["RunInstances"] == 1  # no other zone can fix it
    ec2b = Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).client("ec2", fail_fast=True)
    inject(ec2b, "RunInstances", capacity.SPOT_ROLE_MISSING, times=100, status=403,
           when=lambda body: "InstanceMarketOptions" in _text(body))  # spot refused, on-demand as usual
    (inst,), attempts = capacity.launch_with_fallback(ec2b, spot, ["g4dn.xlarge"], spot_fallback_on_demand=True)
    assert [a.market for a in attempts] == ["spot", "on-demand"] and inst.market != "spot"


def test_doctor_sees_the_spot_role_once_the_first_spot_request_made_it(aws, spec):
    before = capacity.spot_role_exists(aws.client("iam"))
    ec2 = aws.client("ec2", fail_fast=True)
    capacity.launch_with_fallback(ec2, spec.__class__(**{**spec.__dict__, "spot": True}), ["g4dn.xlarge"])
    assert capacity.spot_role_exists(aws.client("iam")) is True
    assert before in (False, True)  # False on a fresh sandbox, True if an earlier test launched spot


def test_the_newest_ubuntu_24_04_pytorch_dlami_is_preferred_and_22_04_is_a_said_fallback(aws):
    ami = images.resolve_ami(aws.client("ssm"), aws.ec2)
    assert "Ubuntu 24.04" in ami["Name"] and "Ubuntu 24.04" in ami["why"] and "ubuntu-24.04" in ami["source"]
    base = images.DLAMI_PATH
    params = {f"{base}/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id": "ami-22",
              f"{base}/oss-nvidia-driver-gpu-pytorch-2.10-ubuntu-24.04/latest/ami-id": "ami-24new",
              f"{base}/oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id": "ami-24old",
              f"{base}/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id": "ami-base"}
    assert images.pick_parameter(params)[1:] == ("ami-24new", "24.04")  # 2.10 > 2.9, not string order
    only_old = {k: v for k, v in params.items() if "22.04" in k}
    assert images.pick_parameter(only_old)[1:] == ("ami-22", "22.04")


def test_a_22_04_fallback_says_why(aws):
    ssm = aws.client("ssm")
    target = images.resolve_ami(ssm, aws.ec2)["ImageId"]
    name = f"{images.DLAMI_PATH}/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id"
    with Stubber(ssm) as stub:
        stub.add_response("get_parameters_by_path", {"Parameters": [{"Name": name, "Value": target}]},
                          {"Path": images.DLAMI_PATH, "Recursive": True})
        ami = images.resolve_ami(ssm, aws.ec2)
    assert "end of patching" in ami["why"] and ami["source"] == f"ssm:{name}"


def test_billing_starts_when_the_instance_runs_not_at_launch():
    launched = datetime(2026, 11, 22, 10, 0, 0, tzinfo=timezone.utc)
    running = launched + timedelta(seconds=40)
    ended = launched + timedelta(seconds=340)
    inst = instances.Instance.of({"InstanceId": "i-1", "LaunchTime": launched, "InstanceType": "g4dn.xlarge",
                                  "Placement": {"AvailabilityZone": "us-east-1a"},
                                  "StateTransitionReason": f"User initiated ({ended:%Y-%m-%d %H:%M:%S} GMT)"})
    aws = type("A", (), {"region": "us-east-1"})()
    bill = costs.actual_cost(aws, None, inst, ended, billing_start=running)
    assert bill["billed_seconds"] == 300.0 and bill["billing_started_at"] == running.isoformat()
    assert bill["compute_usd"] == pytest.approx(300 * 0.526 / 3600, abs=1e-6)
    assert costs.actual_cost(aws, None, inst, ended)["billed_seconds"] == 340.0  # not seen: from launch


def _text(body) -> str:
    return body.decode() if isinstance(body, bytes) else body
