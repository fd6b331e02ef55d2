"""The local sandbox (moto's AWS server + one real sshd per instance) as library functions:
sandbox_up, sandbox_down, sandbox_status, sandbox_interrupt, sandbox_env (`ec2gpu sandbox ...`).
Named sandbox_* because ec2gpu.sandbox is the subpackage that implements it.

The sandbox belongs to EC2GPU_HOME (settings.load().home); each function returns a typed record (its
``to_json()`` is what the CLI's ``--json`` prints) and raises the ec2gpu.errors tree: UsageError (no moto installed, bad
input), SandboxError (no sandbox running, sshd missing, it did not come up, an unknown instance).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import SandboxError, UsageError
from ..sandbox import control
from ..settings import load

Log = Callable[[str], None]


def _quiet(text: str) -> None:
    """The default ``log``: says nothing."""


# ---- what these functions return (the CLI's ``--json`` prints each one's ``to_json()``) ----------

@dataclass(frozen=True)
class SandboxState:
    """The running sandbox, as its state file says (sandbox/server.py's state.json): its server's
    ``pid``, the AWS ``endpoint`` URL, ``checkip_url``, ``imds_url``, ``like_aws``, ``instances``
    ({instance id: {host, port, sshd_pid, directory}}: the sshd of each), ``shutdowns``
    ({instance id: when its OS powers off, ISO 8601 UTC}) and ``bind_shim`` (the library its
    instances' Ray preloads)."""
    pid: int
    endpoint: str
    checkip_url: str
    imds_url: str
    like_aws: bool
    instances: dict[str, dict[str, Any]]
    shutdowns: dict[str, str]
    bind_shim: str

    @classmethod
    def of(cls, state: dict[str, Any]) -> SandboxState:
        """The record of a state.json document (sandbox/control.read_state, control.up)."""
        return cls(pid=state["pid"], endpoint=state["endpoint"], checkip_url=state["checkip_url"],
                   imds_url=state["imds_url"], like_aws=state["like_aws"], instances=state["instances"],
                   shutdowns=state["shutdowns"], bind_shim=state["bind_shim"])

    def to_json(self) -> dict[str, Any]:
        """The state file's document, its keys in its order."""
        return {"pid": self.pid, "endpoint": self.endpoint, "checkip_url": self.checkip_url, "imds_url": self.imds_url,
                "like_aws": self.like_aws, "instances": self.instances, "shutdowns": self.shutdowns,
                "bind_shim": self.bind_shim}


@dataclass(frozen=True)
class Interruption:
    """What `sandbox_interrupt` published for ``instance_id`` on its metadata service
    (sandbox/imds.py), at ``published_at`` (epoch s): a spot interruption ``notice`` ({"action":
    "terminate", "time": ISO 8601 UTC}) with the ``notice_seconds`` (s) before termination, or with
    --rebalance a ``rebalance`` recommendation ({"noticeTime"}) and neither of those."""
    instance_id: str
    published_at: float
    notice: Optional[dict[str, str]] = None
    notice_seconds: Optional[float] = None
    rebalance: Optional[dict[str, str]] = None

    @classmethod
    def of(cls, published: dict[str, Any]) -> Interruption:
        """The record of the sandbox's answer (sandbox/imds.py: interrupt's or rebalance's)."""
        return cls(instance_id=published["instance_id"], published_at=published["published_at"],
                   notice=published.get("notice"), notice_seconds=published.get("notice_seconds"),
                   rebalance=published.get("rebalance"))

    def to_json(self) -> dict[str, Any]:
        """{"instance_id", "notice", "notice_seconds", "published_at"}, or with a rebalance
        {"instance_id", "rebalance", "published_at"}: the sandbox's answer as it gave it."""
        if self.rebalance is not None:
            return {"instance_id": self.instance_id, "rebalance": self.rebalance, "published_at": self.published_at}
        return {"instance_id": self.instance_id, "notice": self.notice, "notice_seconds": self.notice_seconds,
                "published_at": self.published_at}


@dataclass(frozen=True)
class CapacityLimits:
    """The sandbox's capacity limits in force: {instance type: instances that may be pending or
    running at once, all zones together} (sandbox/capacity.py)."""
    limits: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        """{"limits": {instance type: count}}."""
        return {"limits": self.limits}


def _home() -> Path:
    """EC2GPU_HOME (settings.load), whose sandbox these functions mean."""
    return load().home


def sandbox_up(like_aws: bool = False, *, log: Log = _quiet) -> SandboxState:
    """Start the sandbox in the background unless one runs; it keeps its state until sandbox_down.
    ``like_aws``: behave like EC2 where moto does not (instances pending a few seconds, late
    fingerprints, NotFound now and then, RequestLimitExceeded; also EC2GPU_SANDBOX_LIKE_AWS=1);
    ``log`` is told when a sandbox without it already runs (it is kept as it is).
    Returns its SandboxState (sandbox/server.py's state.json): pid, endpoint (the AWS endpoint URL),
    checkip_url, imds_url, like_aws, instances ({instance id: {host, port, sshd_pid, directory}}),
    shutdowns ({instance id: when its OS powers off, ISO 8601 UTC}), bind_shim. Raises UsageError without the
    `sandbox` extra (moto), SandboxError when sshd is missing or it does not come up in time."""
    state = control.up(_home(), like_aws=like_aws or None)
    if like_aws and not state.get("like_aws"):
        log("a sandbox without --like-aws is already running; `ec2gpu sandbox down` first")
    return SandboxState.of(state)


def sandbox_down() -> bool:
    """Stop the sandbox and every sshd and process it started. Returns whether one was running."""
    return control.down(_home())


def sandbox_status() -> Optional[SandboxState]:
    """The running sandbox's SandboxState (as sandbox_up returns it: pid, endpoint, instances
    {instance id: {host, port, sshd_pid, directory}}, ...), or None when none runs (`sandbox status
    --json` prints {"running": false} then)."""
    state = control.read_state(_home())
    return SandboxState.of(state) if state else None


def sandbox_interrupt(instance_id: str, notice_seconds: float = 120.0, rebalance: bool = False) -> Interruption:
    """Interrupt the sandbox's running spot instance ``instance_id`` as EC2 does: a spot
    interruption notice on its metadata service, then termination ``notice_seconds`` (s, EC2
    gives 120) later; with ``rebalance``, a rebalance recommendation instead and nothing else (it
    keeps running). Returns what was published (sandbox/imds.py), an Interruption: instance_id,
    notice {"action", "time"}, notice_seconds, published_at (epoch s), or with ``rebalance``
    instance_id, rebalance {"noticeTime"}, published_at. Raises UsageError for a negative or non-finite
    ``notice_seconds``; SandboxError when no sandbox runs, or for an unknown, stopped or on-demand
    instance."""
    if not math.isfinite(notice_seconds) or notice_seconds < 0:
        raise UsageError(f"--notice-seconds {notice_seconds:g} is not a number of seconds, 0 or more",
                         "EC2 gives 120")
    return Interruption.of(control.interrupt(_home(), instance_id, notice_seconds, rebalance=rebalance))


def sandbox_capacity(instance_type: str, count: Optional[int]) -> CapacityLimits:
    """Let at most ``count`` instances of ``instance_type`` be pending or running at once in the
    sandbox, all zones together (None: no limit, the default). RunInstances then launches as many
    as fit, up to its MaxCount, and answers InsufficientInstanceCapacity when its MinCount do not
    fit, as EC2 does when a type is short (sandbox/capacity.py). Returns CapacityLimits: limits
    {instance type: count}, every limit in force. Raises UsageError for a negative count; SandboxError when
    no sandbox runs."""
    if count is not None and count < 0:
        raise UsageError(f"count {count} is below 0", "give 0 or more, or --unlimited")
    return CapacityLimits(limits=control.capacity(_home(), instance_type, count)["limits"])


def sandbox_env() -> dict[str, str]:
    """The environment variables that point AWS clients (boto3, the aws CLI) at the running
    sandbox: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
    AWS_DEFAULT_REGION, EC2GPU_CHECKIP_URL (sandbox/control.env_vars). Raises SandboxError when none runs."""
    state = control.read_state(_home())
    if not state:
        raise SandboxError("no sandbox is running", "start it with `ec2gpu sandbox up`")
    return control.env_vars(state)
