"""aws/consistency.py, pure (no sandbox): a call naming what was made a moment ago is tried again
while AWS refuses it for not seeing that yet, for about two minutes after, and says so; anything
else is raised at once. The new bucket's configuration calls are tried again on NoSuchBucket."""
from __future__ import annotations

import botocore.exceptions
import pytest

from ec2gpu.aws import consistency

NOW = 1_000_000.0


def _error(code: str, operation: str = "RunInstances", message: str = "refused") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": message}}, operation)


class _Clock:
    """time.time() that the fake sleep moves on."""

    def __init__(self, now: float = NOW):
        self.now, self.slept = now, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _refused(times: int, exc: BaseException):
    calls = {"n": 0}

    def call():
        calls["n"] += 1
        if calls["n"] <= times:
            raise exc
        return "made"
    return call, calls


@pytest.mark.parametrize("operation,code", [
    ("RunInstances", "InvalidParameterValue"), ("RunInstances", "InvalidGroup.NotFound"),
    ("CreateFleet", "InvalidParameterValue"), ("CreateLaunchTemplate", "InvalidGroup.NotFound"),
    ("CreateAutoScalingGroup", "ValidationError")])
def test_the_refusals_of_a_fresh_profile_or_group_count_for_two_minutes_after_it_was_made(operation, code):
    exc = _error(code, operation)
    assert consistency.not_visible(exc, NOW, NOW + 0.5)
    assert consistency.not_visible(exc, NOW, NOW + 119.9)
    assert not consistency.not_visible(exc, NOW, NOW + 120)
    assert consistency.not_visible(exc, NOW, NOW - 5)  # a clock stepped back: "just now"
    assert not consistency.not_visible(exc, NOW, NOW - 3600)
    assert not consistency.not_visible(exc, None, NOW)  # nothing the call names is new


def test_other_refusals_and_other_errors_never_count():
    for code in ("InsufficientInstanceCapacity", "UnauthorizedOperation", "InvalidParameterCombination"):
        assert not consistency.not_visible(_error(code), NOW, NOW + 1)
    assert not consistency.not_visible(_error("ValidationError", "RunInstances"), NOW, NOW + 1)  # Auto Scaling's code
    assert not consistency.not_visible(_error("InvalidParameterValue", "CreateAutoScalingGroup"), NOW, NOW + 1)
    assert not consistency.not_visible(ValueError("InvalidParameterValue"), NOW, NOW + 1)


def test_message_text_decides_nothing():
    assert consistency.not_visible(_error("InvalidParameterValue", message=""), NOW, NOW + 1)
    msg = "Value (ec2gpu-x) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
    assert not consistency.not_visible(_error("Unsupported", message=msg), NOW, NOW + 1)


def test_a_group_refused_while_the_new_profile_is_unseen_is_made_once_aws_sees_it_and_says_it_waited():
    clock, said = _Clock(), []
    message = ("You must use a valid fully-formed launch template. Value (ec2gpu-r1) for parameter "
               "iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name")
    call, calls = _refused(3, _error("ValidationError", "CreateAutoScalingGroup", message))
    assert consistency.when_visible(call, NOW, said.append, sleep=clock.sleep, clock=clock) == "made"
    assert calls["n"] == 4 and clock.slept == [1, 2, 4]
    assert len(said) == 2 and "CreateAutoScalingGroup: ValidationError" in said[0] and "ec2gpu-r1" in said[0]
    assert "up to 120 s" in said[0] and "3 refusals" in said[1]


def test_a_refusal_that_lasts_is_raised_about_two_minutes_after_the_profile_was_made():
    clock, said = _Clock(), []
    call, calls = _refused(10_000, _error("InvalidParameterValue"))
    with pytest.raises(botocore.exceptions.ClientError):
        consistency.when_visible(call, NOW, said.append, sleep=clock.sleep, clock=clock)
    assert 115 <= clock.now - NOW < 120 + consistency.MAX_WAIT_S and max(clock.slept) == consistency.MAX_WAIT_S
    assert len(said) == 1  # one line, not one per try


def test_nothing_new_or_another_refusal_is_raised_at_once_without_a_word():
    for made_at, exc in ((None, _error("InvalidParameterValue")), (NOW, _error("InsufficientInstanceCapacity")),
                         (NOW - 600, _error("InvalidParameterValue"))):
        clock, said = _Clock(), []
        call, calls = _refused(1, exc)
        with pytest.raises(botocore.exceptions.ClientError):
            consistency.when_visible(call, made_at, said.append, sleep=clock.sleep, clock=clock)
        assert calls["n"] == 1 and clock.slept == [] and said == []


class _S3:
    def __init__(self, refusals: int, code: str = "NoSuchBucket"):
        self.refusals, self.code, self.calls = refusals, code, []

    def put_bucket_encryption(self, **kw):
        self.calls.append(kw)
        if len(self.calls) <= self.refusals:
            raise botocore.exceptions.ClientError({"Error": {"Code": self.code, "Message": "x"}}, "PutBucketEncryption")
        return {"ok": True}


def test_a_new_buckets_configuration_is_tried_again_while_s3_answers_no_such_bucket():
    clock = _Clock(0.0)
    s3 = _S3(2)
    fresh = consistency.FreshBucket(s3, "b", sleep=clock.sleep, clock=clock)
    assert fresh.put_bucket_encryption(Bucket="b") == {"ok": True}
    assert len(s3.calls) == 3 and len(clock.slept) == 2


def test_a_new_bucket_that_stays_missing_or_another_refusal_is_raised():
    clock = _Clock(0.0)
    s3 = _S3(10_000)
    with pytest.raises(botocore.exceptions.ClientError):
        consistency.FreshBucket(s3, "b", sleep=clock.sleep, clock=clock).put_bucket_encryption(Bucket="b")
    assert consistency.BUCKET_PROPAGATION_S <= clock.now < consistency.BUCKET_PROPAGATION_S + consistency.MAX_WAIT_S
    denied = _S3(1, "AccessDenied")
    with pytest.raises(botocore.exceptions.ClientError):
        consistency.FreshBucket(denied, "b", sleep=clock.sleep, clock=clock).put_bucket_encryption(Bucket="b")
    assert len(denied.calls) == 1
