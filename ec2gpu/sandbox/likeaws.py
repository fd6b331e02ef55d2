"""The sandbox's AWS-like mode (`ec2gpu sandbox up --like-aws`, EC2GPU_SANDBOX_LIKE_AWS=1).

moto is kinder than EC2: its instances are running the moment RunInstances returns, every
resource is visible at once, and it never throttles. Code that works against moto alone can still
break on AWS. In this mode the sandbox behaves the way EC2 does, in the places that matter:

- **pending**: a new instance stays ``pending`` for ``pending_s`` before it is ``running``
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html);
- **boot**: its sshd answers ``sshd_delay_s`` after it is running, and cloud-init prints the host
  key fingerprints to the console ``console_delay_s`` after that (they come in cloud-init's final
  stage, after sshd is up);
- **images**: an image CreateImage made stays ``pending`` for ``image_pending_s`` (EC2 snapshots
  the volume meanwhile: minutes there), so the image_available waiter really waits; its first
  DescribeImages by id may answer ``InvalidAMIID.NotFound`` as other fresh resources do (below);
- **snapshots of a deregistered image**: DeleteSnapshot of one, less than ``snapshot_in_use_s``
  after DeregisterImage without DeleteAssociatedSnapshots, answers ``InvalidSnapshot.InUse`` ("The
  snapshot ... is currently in use by ami-..."), the race EC2 has between the two calls (moto frees
  the snapshot at once; the documented way is DeleteAssociatedSnapshots:
  https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeregisterImage.html);
- **eventual consistency**: the first describe, tag or use of a resource created less than
  ``fresh_s`` ago answers ``InvalidInstanceID.NotFound`` / ``InvalidGroup.NotFound`` /
  ``InvalidKeyPair.NotFound`` with probability ``not_found_p``
  (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html);
- **a new instance profile**: RunInstances naming an instance profile made (CreateInstanceProfile)
  less than ``profile_unseen_s`` ago answers ``InvalidParameterValue`` ("Value (NAME) for parameter
  iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"), and CreateAutoScalingGroup
  whose launch template names one answers ``ValidationError`` ("You must use a valid fully-formed
  launch template. Value (NAME) ..."), as AWS does for tens of seconds
  (https://github.com/eksctl-io/eksctl/issues/8039, aws/consistency.py); CreateLaunchTemplate
  takes it, as EC2 does ("Launch template parameters are not fully validated when you create the
  launch template": https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/launch-template-restrictions.html);
- **a new security group**: for its first ``group_unseen_s``, RunInstances naming it answers
  ``InvalidGroup.NotFound`` and CreateAutoScalingGroup whose template names it ``ValidationError``
  (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html);
- **throttling**: any EC2 request answers ``RequestLimitExceeded`` (HTTP 503) with probability
  ``throttle_p`` (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html).

The faults come from one ``random.Random(seed)``; the order in which concurrent requests draw from
it can vary, so a run is repeatable in its rates, not request for request. Nothing outside
``sandbox/`` knows this mode exists.
"""
from __future__ import annotations

import html
import io
import os
from typing import Any
import random
import re
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs

ENV = "EC2GPU_SANDBOX_LIKE_AWS"
EC2_API_VERSION = "2016-11-15"  # the Version parameter of every EC2 query request
IAM_API_VERSION = "2010-05-08"
AUTOSCALING_API_VERSION = "2011-01-01"


@dataclass
class Behaviour:
    """How the sandbox departs from moto; all times in seconds. Short enough for tests."""

    seed: int = 0
    pending_s: float = 2.0
    sshd_delay_s: float = 1.0
    console_delay_s: float = 2.5
    image_pending_s: float = 3.0  # CreateImage: pending this long, then available (sandbox/images.py)
    snapshot_in_use_s: float = 2.0  # DeregisterImage: its snapshots answer InUse this long
    fresh_s: float = 15.0
    profile_unseen_s: float = 20.0  # EC2 and Auto Scaling refuse a new instance profile this long
    group_unseen_s: float = 3.0  # ... and a new security group this long
    not_found_p: float = 0.5
    throttle_p: float = 0.03

    @classmethod
    def from_env(cls, environ=os.environ) -> Behaviour | None:
        """The AWS-like behaviour when EC2GPU_SANDBOX_LIKE_AWS is 1/true/yes, else None (moto as it is).

        A number other than 1 is taken as the seed.
        """
        value = (environ.get(ENV) or "").strip().lower()
        if value in ("", "0", "false", "no"):
            return None
        return cls(seed=int(value)) if value.isdigit() and value != "1" else cls()


def _error(status: int, code: str, message: str, version: str = EC2_API_VERSION) -> tuple[str, bytes]:
    """An error answer as the service of ``version`` gives it: EC2's <Response><Errors>, the other
    query APIs' (Auto Scaling's) <ErrorResponse>."""
    message = html.escape(message, quote=False)
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>sandbox-like-aws</RequestID></Response>"
            if version == EC2_API_VERSION else
            f'<?xml version="1.0" encoding="UTF-8"?>\n<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>'
            f"<Message>{message}</Message></Error><RequestId>sandbox-like-aws</RequestId></ErrorResponse>")
    return {400: "400 Bad Request", 503: "503 Service Unavailable"}[status], body.encode()


@dataclass
class Consistency:
    """Which resources are fresh (created less than ``fresh_s`` ago, never touched since) and the
    faults drawn for them."""

    behaviour: Behaviour
    created: dict[str, float] = field(default_factory=dict)  # resource id or key name -> monotonic time
    released: dict[str, tuple[str, float]] = field(default_factory=dict)  # snapshot -> (its image, deregistered at)
    made: dict[str, float] = field(default_factory=dict)  # "profile:NAME" or a security group id -> monotonic time
    templates: dict[str, list[str]] = field(default_factory=dict)  # launch template name -> what it names (made keys)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.rng = random.Random(self.behaviour.seed)

    def record(self, *names: str) -> None:
        with self.lock:
            for n in names:
                self.created[n] = time.monotonic()

    def first_touch(self, name: str) -> bool:
        """True (once) if ``name`` is fresh and the draw says it is not visible yet."""
        with self.lock:
            born = self.created.pop(name, None)
            return (born is not None and time.monotonic() - born < self.behaviour.fresh_s
                    and self.rng.random() < self.behaviour.not_found_p)

    def release(self, image_id: str, snapshot_ids: list[str]) -> None:
        """``image_id`` was deregistered and its snapshots left: they stay in use for a while."""
        with self.lock:
            for sid in snapshot_ids:
                self.released[sid] = (image_id, time.monotonic())

    def in_use_by(self, snapshot_id: str) -> str | None:
        """The deregistered image that still holds ``snapshot_id``, or None."""
        with self.lock:
            image_id, at = self.released.get(snapshot_id, ("", float("-inf")))
            return image_id if time.monotonic() - at < self.behaviour.snapshot_in_use_s else None

    def made_now(self, *keys: str) -> None:
        """``keys`` ("profile:NAME", a security group id) were made just now."""
        with self.lock:
            for k in keys:
                self.made[k] = time.monotonic()

    def unseen(self, key: str) -> bool:
        """Whether ``key`` was made too recently to be seen: a profile within ``profile_unseen_s``,
        a security group within ``group_unseen_s``."""
        with self.lock:
            born = self.made.get(key)
        window = self.behaviour.profile_unseen_s if key.startswith("profile:") else self.behaviour.group_unseen_s
        return born is not None and time.monotonic() - born < window

    def throttled(self) -> bool:
        with self.lock:
            return self.rng.random() < self.behaviour.throttle_p


def _values(params: dict, prefix: str) -> list[str]:
    """Every ``prefix.N`` value of a query request (InstanceId.1, ResourceId.2, ...)."""
    return [v[0] for k, v in params.items() if k == prefix or k.startswith(prefix + ".")]


def fault_for(action: str, params: dict, state: Consistency) -> tuple[str, str] | None:
    """(code, message) of the fault this EC2 request meets, or None (it goes to moto)."""
    if state.throttled():
        return "RequestLimitExceeded", "Request limit exceeded."
    instances = _values(params, "InstanceId") if action in (
        "DescribeInstances", "GetConsoleOutput", "TerminateInstances") else \
        [r for r in _values(params, "ResourceId") if r.startswith("i-")] if action == "CreateTags" else []
    for iid in instances:
        if state.first_touch(iid):
            return "InvalidInstanceID.NotFound", f"The instance ID '{iid}' does not exist"
    groups = _values(params, "GroupId") if action == "AuthorizeSecurityGroupIngress" else \
        _values(params, "SecurityGroupId") if action == "RunInstances" else []
    for gid in groups:
        if (action == "RunInstances" and state.unseen(gid)) or state.first_touch(gid):
            return "InvalidGroup.NotFound", f"The security group '{gid}' does not exist"
    if action == "RunInstances":
        refused = _profile_fault(params, "IamInstanceProfile", state)
        if refused:
            return "InvalidParameterValue", refused
        for key in _values(params, "KeyName"):
            if state.first_touch(f"key:{key}"):
                return "InvalidKeyPair.NotFound", f"The key pair '{key}' does not exist"
    if action == "DescribeImages":
        for ami in _values(params, "ImageId"):
            if state.first_touch(ami):
                return "InvalidAMIID.NotFound", f"The image id '[{ami}]' does not exist"
    if action == "DeleteSnapshot":
        for sid in _values(params, "SnapshotId"):
            image_id = state.in_use_by(sid)
            if image_id:
                return "InvalidSnapshot.InUse", f"The snapshot {sid} is currently in use by {image_id}"
    return None


def _profile_fault(params: dict, prefix: str, state: Consistency) -> str | None:
    """EC2's words for an instance profile (``prefix``.Name or ``prefix``.Arn of a request) it does
    not see yet, or None. The messages are those AWS gives (eksctl#8039, terraform-provider-aws#4769)."""
    for field_, what in (("Name", "name"), ("Arn", "ARN")):
        for value in _values(params, f"{prefix}.{field_}"):
            if state.unseen(f"profile:{value.rsplit('/', 1)[-1]}"):
                return f"Value ({value}) for parameter iamInstanceProfile.{field_.lower()} is invalid. " \
                       f"Invalid IAM Instance Profile {what}"
    return None


def template_names(params: dict) -> list[str]:
    """What a CreateLaunchTemplate request's data names that may be too new to be seen: its
    instance profile ("profile:NAME") and its security groups."""
    data = "LaunchTemplateData"
    return [f"profile:{v.rsplit('/', 1)[-1]}" for f in ("Name", "Arn")
            for v in _values(params, f"{data}.IamInstanceProfile.{f}")] + _values(params, f"{data}.SecurityGroupId")


def group_fault(action: str, params: dict, state: Consistency) -> tuple[str, str] | None:
    """(code, message) of CreateAutoScalingGroup naming a launch template whose instance profile or
    security group Auto Scaling does not see yet, or None (it goes to moto)."""
    if action != "CreateAutoScalingGroup":
        return None
    names = _values(params, "LaunchTemplate.LaunchTemplateName") + _values(
        params, "MixedInstancesPolicy.LaunchTemplate.LaunchTemplateSpecification.LaunchTemplateName")
    for template in names:
        with state.lock:
            named = list(state.templates.get(template, []))
        for key in named:
            if key.startswith("profile:") and state.unseen(key):
                return "ValidationError", ("You must use a valid fully-formed launch template. Value "
                                           f"({key.split(':', 1)[1]}) for parameter iamInstanceProfile.name is "
                                           "invalid. Invalid IAM Instance Profile name")
            if not key.startswith("profile:") and state.unseen(key):
                return "ValidationError", (f"You must use a valid fully-formed launch template. The security group "
                                           f"'{key}' does not exist")
    return None


def moto_image_snapshots(image_id: str) -> list[str]:
    """The snapshots moto keeps for ``image_id`` (in the daemon: moto is imported there)."""
    from moto.ec2.models import ec2_backends

    for account in list(ec2_backends.keys()):
        for region in list(ec2_backends[account].keys()):
            ami = ec2_backends[account][region].amis.get(image_id)
            if ami is not None:
                snapshot = getattr(ami, "ebs_snapshot", None)
                return [snapshot.id] if snapshot is not None else []
    return []


class Middleware:
    """WSGI middleware around moto's server: EC2's eventual consistency and throttling."""

    def __init__(self, app, behaviour: Behaviour, image_snapshots=moto_image_snapshots):
        self.app, self.state, self.image_snapshots = app, Consistency(behaviour), image_snapshots

    def __call__(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        params = parse_qs(body.decode(errors="replace")) if body else {}
        action = (params.get("Action") or [""])[0]
        version = (params.get("Version") or [""])[0]
        if version not in (EC2_API_VERSION, IAM_API_VERSION, AUTOSCALING_API_VERSION):
            return self.app(environ, start_response)  # not EC2, IAM or Auto Scaling (STS, SSM, S3...)
        fault = fault_for(action, params, self.state) if version == EC2_API_VERSION else \
            group_fault(action, params, self.state) if version == AUTOSCALING_API_VERSION else None
        if fault:
            status, payload = _error(503 if fault[0] == "RequestLimitExceeded" else 400, *fault, version=version)
            start_response(status, [("Content-Type", "text/xml"), ("Content-Length", str(len(payload)))])
            return [payload]
        held = self.image_snapshots((params.get("ImageId") or [""])[0]) if action == "DeregisterImage" else []
        captured: dict[str, Any] = {}

        def capture(status, headers, exc_info=None):
            captured.update(status=status, headers=headers)
            return start_response(status, headers, exc_info) if exc_info else (lambda data: None)

        result = self.app(environ, capture)
        try:
            payload = b"".join(result)
        finally:
            getattr(result, "close", lambda: None)()
        if captured["status"].startswith("200"):
            self._record_created(action, params, payload)
            if held and (params.get("DeleteAssociatedSnapshots") or ["false"])[0].lower() != "true":
                self.state.release(params["ImageId"][0], held)
        start_response(captured["status"], captured["headers"])
        return [payload]

    def _record_created(self, action: str, params: dict, payload: bytes) -> None:
        text = payload.decode(errors="replace")
        if action == "RunInstances":
            self.state.record(*re.findall(r"<instanceId>(i-[0-9a-f]+)</instanceId>", text))
        elif action == "CreateSecurityGroup":
            made = re.findall(r"<groupId>(sg-[0-9a-f]+)</groupId>", text)
            self.state.record(*made)
            self.state.made_now(*made)
        elif action == "CreateInstanceProfile":
            self.state.made_now(*(f"profile:{n}" for n in _values(params, "InstanceProfileName")))
        elif action == "CreateLaunchTemplate":
            with self.state.lock:
                for name in _values(params, "LaunchTemplateName"):
                    self.state.templates[name] = template_names(params)
        elif action == "ImportKeyPair":
            self.state.record(*(f"key:{k}" for k in _values(params, "KeyName")))
        elif action == "CreateImage":
            self.state.record(*re.findall(r"<imageId>(ami-[0-9a-f]+)</imageId>", text))


def install_pending(behaviour: Behaviour) -> None:
    """Patch moto (in the daemon) so new instances are ``pending`` for ``behaviour.pending_s``."""
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.run_instances

    def run_instances(self, *args, **kwargs):
        reservation = original(self, *args, **kwargs)
        for inst in reservation.instances:
            inst._state.name, inst._state.code = "pending", 0

        def boot():
            for inst in reservation.instances:
                if inst._state.name == "pending":  # not terminated while pending
                    inst._state.name, inst._state.code = "running", 16
        timer = threading.Timer(behaviour.pending_s, boot)
        timer.daemon = True
        timer.start()
        return reservation

    InstanceBackend.run_instances = run_instances
