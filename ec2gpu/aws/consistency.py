"""What AWS does not see yet: a call that names something made a moment ago, tried again until it does.

IAM and EC2 are eventually consistent: a just-made instance profile, role or security group is
refused by the next call that names it for a while, with no way to ask when it will be seen
(IAM answers GetInstanceProfile at once, and its ``instance_profile_exists`` waiter proves nothing
to EC2). ``when_visible`` is the one place that tries such a call again, for about two minutes
after the resource was made, and says it is waiting; ``FreshBucket`` does the same for the
configuration calls that follow CreateBucket.

Sources:
- IAM: "If you create the instance profile and immediately launch, you may see an error"
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_iam-ec2.html); changes take time
  to propagate (https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html#troubleshoot_general_eventual-consistency).
- EC2: InvalidGroup.NotFound right after CreateSecurityGroup, retried with backoff "up to a few
  minutes" (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html).
- Auto Scaling: CreateAutoScalingGroup answers ``ValidationError: You must use a valid fully-formed
  launch template. Value (NAME) for parameter iamInstanceProfile.name is invalid. Invalid IAM
  Instance Profile name`` for tens of seconds after CreateInstanceProfile (seen at 3 s, fine at
  34 s: https://github.com/eksctl-io/eksctl/issues/8039; terraform-provider-aws retries the same
  refusal for 2 minutes: https://github.com/hashicorp/terraform-provider-aws/pull/5633).
  ValidationError is Auto Scaling's code for every bad request, and AWS documents no narrower one,
  so within the window every ValidationError of that call is tried again: a request that is
  wrong for another reason fails as before, later by at most the window.
- S3: bucket configurations are eventually consistent
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/Welcome.html#ConsistencyModel): a
  configuration call right after CreateBucket may answer NoSuchBucket.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import botocore.exceptions
import tenacity

from .. import words
from .session import Client, Log, error_code

_T = TypeVar("_T")

#: how long after a resource was made its refusals are taken for "not seen yet" (s): about two
#: minutes, the figure terraform-provider-aws settled on for the same refusals (module docstring)
PROPAGATION_S = 120.0
#: the refusals, per operation, that mean "a fresh instance profile, role, security group or key
#: pair is not visible yet". RunInstances and CreateFleet: InvalidParameterValue ("Value (NAME) for
#: parameter iamInstanceProfile.name is invalid"), InvalidGroup.NotFound, InvalidKeyPair.NotFound
#: (the EC2 page above); CreateLaunchTemplate does not fully validate what it names
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/launch-template-restrictions.html), so its
#: codes are there for a check EC2 may add; Auto Scaling: ValidationError.
NOT_VISIBLE: dict[str, frozenset[str]] = {
    "RunInstances": frozenset({"InvalidParameterValue", "InvalidGroup.NotFound", "InvalidKeyPair.NotFound"}),
    "CreateFleet": frozenset({"InvalidParameterValue", "InvalidGroup.NotFound", "InvalidKeyPair.NotFound"}),
    "CreateLaunchTemplate": frozenset({"InvalidParameterValue", "InvalidGroup.NotFound"}),
    "CreateAutoScalingGroup": frozenset({"ValidationError"}),
}
#: the waits between tries (s): 1, 2, 4, then every 5 (tenacity.wait_exponential)
FIRST_WAIT_S, MAX_WAIT_S = 1.0, 5.0
#: a new bucket's configuration calls answer NoSuchBucket this long at most (s)
BUCKET_PROPAGATION_S = 60.0


def not_visible(exc: BaseException, made_at: float | None, now: float, window_s: float = PROPAGATION_S) -> bool:
    """Whether ``exc`` is AWS not seeing yet what was made at ``made_at`` (pure): a ClientError whose
    code is one of its operation's NOT_VISIBLE codes, less than ``window_s`` after ``made_at``
    (time.time() seconds; a clock stepped back counts as "just now" for at most as long). None
    for ``made_at``: nothing the call names is fresh, so no refusal is."""
    if made_at is None or not isinstance(exc, botocore.exceptions.ClientError):
        return False
    return error_code(exc) in NOT_VISIBLE.get(exc.operation_name, frozenset()) and \
        -window_s < now - made_at < window_s


def when_visible(call: Callable[[], _T], made_at: float | None, log: Log = lambda line: None,
                 sleep: Callable[[float], Any] = time.sleep, clock: Callable[[], float] = time.time,
                 window_s: float = PROPAGATION_S) -> _T:
    """``call()`` (one AWS request naming a profile, role or security group made at ``made_at``,
    time.time() seconds, or None when none of them is new), tried again after 1, 2, 4, then every
    5 s while it is refused as ``not_visible``: for at most ``window_s`` (s) after ``made_at``, and
    never longer than that in all. ``log`` hears one line at the first such refusal (AWS's
    words, and how long it may wait) and one when the call goes through after waiting.
    Returns what ``call`` returns; raises its last error otherwise (botocore's ClientError)."""
    waited = {"tries": 0}

    def refused(exc: BaseException) -> bool:
        return not_visible(exc, made_at, clock(), window_s)

    def note(state: tenacity.RetryCallState) -> None:
        waited["tries"] += 1
        exc = state.outcome.exception() if state.outcome else None
        if waited["tries"] == 1 and isinstance(exc, botocore.exceptions.ClientError):
            message = str(exc.response.get("Error", {}).get("Message", ""))[:300]
            log(f"AWS does not see what this run just made yet ({exc.operation_name}: {error_code(exc)}: {message}); "
                f"trying again for up to {window_s:.0f} s after it was made (IAM and EC2 are eventually consistent)")

    for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception(refused), reraise=True, sleep=sleep, before_sleep=note,
            wait=tenacity.wait_exponential(multiplier=FIRST_WAIT_S, max=MAX_WAIT_S),
            stop=tenacity.stop_after_delay(window_s)):
        with attempt:
            result = call()
    if waited["tries"]:
        log(f"AWS sees it now: went through after {words.count(waited['tries'], 'refusal')}")
    return result


class FreshBucket:
    """An S3 client for the calls that follow CreateBucket of ``bucket``: each of its methods is the
    client's, tried again while S3 answers NoSuchBucket (its eventual consistency: module
    docstring), for up to ``window_s`` (s) after this object was made; any other answer is the
    client's own. ``storage.create_private_bucket`` and ``runstore.ensure`` configure the buckets
    they make through it."""

    def __init__(self, s3: Client, bucket: str, window_s: float = BUCKET_PROPAGATION_S,
                 sleep: Callable[[float], Any] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self._s3, self.bucket, self._window_s, self._sleep, self._clock = s3, bucket, window_s, sleep, clock
        self._made_at = clock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._s3, name)
        if not callable(method) or name.startswith(("generate_", "get_paginator", "get_waiter", "can_paginate")):
            return method

        def missing(exc: BaseException) -> bool:
            return isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) == "NoSuchBucket" and \
                self._clock() - self._made_at < self._window_s

        def call(*args: Any, **kwargs: Any) -> Any:
            for attempt in tenacity.Retrying(
                    retry=tenacity.retry_if_exception(missing), reraise=True, sleep=self._sleep,
                    wait=tenacity.wait_exponential(multiplier=FIRST_WAIT_S / 2, max=MAX_WAIT_S)):
                with attempt:
                    return method(*args, **kwargs)
            raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover
        return call
