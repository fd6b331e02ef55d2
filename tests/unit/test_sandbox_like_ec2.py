"""The sandbox's EC2 stand-ins, pure parts: the instance's `shutdown`, the AWS-like faults."""
from datetime import datetime

import pytest

from ec2gpu.sandbox import capacity, guest, likeaws


def test_shutdown_arguments_mean_what_they_mean_to_systemd():
    assert guest.parse("shutdown", ["-h", "+90", "ec2gpu: max runtime reached"]) == {"action": "shutdown",
                                                                                      "delay_s": 5400.0}
    assert guest.parse("shutdown", ["-h", "now"])["delay_s"] == 0.0
    assert guest.parse("shutdown", [])["delay_s"] == 60.0  # shutdown(8): +1 by default
    assert guest.parse("shutdown", ["-c"])["action"] == "cancel"
    assert guest.parse("poweroff", []) == {"action": "shutdown", "delay_s": 0.0}
    assert guest.parse("shutdown", ["-r", "now"])["action"] == "reboot"
    assert guest.delay_seconds("10:30", now=datetime(2026, 11, 22, 10, 0)) == 1800.0
    assert guest.delay_seconds("09:30", now=datetime(2026, 11, 22, 10, 0)) == 23.5 * 3600  # tomorrow
    with pytest.raises(ValueError):
        guest.parse("shutdown", ["-h", "soon"])


def test_like_aws_is_off_unless_asked_and_a_number_is_its_seed():
    assert likeaws.Behaviour.from_env({}) is None and likeaws.Behaviour.from_env({likeaws.ENV: "0"}) is None
    assert likeaws.Behaviour.from_env({likeaws.ENV: "1"}).seed == 0
    assert likeaws.Behaviour.from_env({likeaws.ENV: "7"}).seed == 7


def test_a_fresh_resource_is_not_found_on_first_touch_only_and_old_ones_never():
    state = likeaws.Consistency(likeaws.Behaviour(not_found_p=1.0, throttle_p=0.0))
    state.record("i-new", "sg-new", "key:k")
    assert likeaws.fault_for("DescribeInstances", {"InstanceId.1": ["i-new"]}, state)[0] == "InvalidInstanceID.NotFound"
    assert likeaws.fault_for("DescribeInstances", {"InstanceId.1": ["i-new"]}, state) is None  # once
    assert likeaws.fault_for("DescribeInstances", {"InstanceId.1": ["i-old"]}, state) is None
    assert likeaws.fault_for("RunInstances", {"SecurityGroupId.1": ["sg-new"], "KeyName": ["k"]}, state)[0] == \
        "InvalidGroup.NotFound"
    assert likeaws.fault_for("RunInstances", {"SecurityGroupId.1": ["sg-new"], "KeyName": ["k"]}, state)[0] == \
        "InvalidKeyPair.NotFound"
    stale = likeaws.Consistency(likeaws.Behaviour(not_found_p=1.0, throttle_p=0.0, fresh_s=0.0))
    stale.record("i-x")
    assert likeaws.fault_for("CreateTags", {"ResourceId.1": ["i-x"]}, stale) is None  # visible by now


def test_throttling_is_drawn_from_the_seeded_generator():
    draws = [likeaws.fault_for("DescribeSubnets", {}, likeaws.Consistency(likeaws.Behaviour(seed=3, throttle_p=0.5)))
             for _ in range(2)]
    assert draws[0] == draws[1]  # same seed, same first draw
    always = likeaws.Consistency(likeaws.Behaviour(throttle_p=1.0))
    assert likeaws.fault_for("DescribeSubnets", {}, always)[0] == "RequestLimitExceeded"


def test_a_short_type_launches_as_many_as_fit_above_the_minimum_or_none():
    """EC2's RunInstances (API_RunInstances: MinCount, MaxCount), as the sandbox's capacity limits apply it."""
    assert capacity.launchable(1, 3, None, 50) == 3  # no limit: all of MaxCount (moto launched MinCount)
    assert capacity.launchable(1, 3, 2, 0) == 2
    assert capacity.launchable(1, 3, 2, 1) == 1
    assert capacity.launchable(1, 3, 2, 2) == 0  # InsufficientInstanceCapacity
    assert capacity.launchable(2, 2, 3, 2) == 0  # MinCount does not fit: none
    with pytest.raises(ValueError):
        capacity.limit("g4dn.xlarge", -1)
