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
- **throttling**: any EC2 request answers ``RequestLimitExceeded`` (HTTP 503) with probability
  ``throttle_p`` (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html).

The faults come from one ``random.Random(seed)``; the order in which concurrent requests draw from
it can vary, so a run is repeatable in its rates, not request for request. Nothing outside
``sandbox/`` knows this mode exists.
"""
from __future__ import annotations

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


def _error(status: int, code: str, message: str) -> tuple[str, bytes]:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>sandbox-like-aws</RequestID></Response>")
    return {400: "400 Bad Request", 503: "503 Service Unavailable"}[status], body.encode()


@dataclass
class Consistency:
    """Which resources are fresh (created less than ``fresh_s`` ago, never touched since) and the
    faults drawn for them."""

    behaviour: Behaviour
    created: dict[str, float] = field(default_factory=dict)  # resource id or key name -> monotonic time
    released: dict[str, tuple[str, float]] = field(default_factory=dict)  # snapshot -> (its image, deregistered at)
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
        if state.first_touch(gid):
            return "InvalidGroup.NotFound", f"The security group '{gid}' does not exist"
    if action == "RunInstances":
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
        if (params.get("Version") or [""])[0] != EC2_API_VERSION:
            return self.app(environ, start_response)  # not EC2 (STS, SSM, Service Quotas, S3...)
        fault = fault_for(action, params, self.state)
        if fault:
            status, payload = _error(503 if fault[0] == "RequestLimitExceeded" else 400, *fault)
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
            self.state.record(*re.findall(r"<groupId>(sg-[0-9a-f]+)</groupId>", text))
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
