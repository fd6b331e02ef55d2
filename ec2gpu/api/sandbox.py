"""The local sandbox (moto's AWS server + one real sshd per instance) as library functions:
sandbox_up, sandbox_down, sandbox_status, sandbox_interrupt, sandbox_env (`ec2gpu sandbox ...`).
Named sandbox_* because ec2gpu.sandbox is the subpackage that implements it.

The sandbox belongs to EC2GPU_HOME (settings.load().home); each function returns plain data (what
the CLI's ``--json`` prints) and raises the ec2gpu.errors tree: UsageError (no moto installed, bad
input), SandboxError (no sandbox running, sshd missing, it did not come up, an unknown instance).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import SandboxError, UsageError
from ..sandbox import control
from ..settings import load

Log = Callable[[str], None]


def _quiet(text: str) -> None:
    """The default ``log``: says nothing."""


def _home() -> Path:
    """EC2GPU_HOME (settings.load), whose sandbox these functions mean."""
    return load().home


def sandbox_up(like_aws: bool = False, *, log: Log = _quiet) -> dict[str, Any]:
    """Start the sandbox in the background unless one runs; it keeps its state until sandbox_down.
    ``like_aws``: behave like EC2 where moto does not (instances pending a few seconds, late
    fingerprints, NotFound now and then, RequestLimitExceeded; also EC2GPU_SANDBOX_LIKE_AWS=1);
    ``log`` is told when a sandbox without it already runs (it is kept as it is).
    Returns its state (sandbox/server.py's state.json): pid, endpoint (the AWS endpoint URL),
    checkip_url, imds_url, like_aws, instances ({instance id: {host, port, sshd_pid, directory}}),
    shutdowns ({instance id: when its OS powers off, ISO 8601 UTC}). Raises UsageError without the
    `sandbox` extra (moto), SandboxError when sshd is missing or it does not come up in time."""
    state = control.up(_home(), like_aws=like_aws or None)
    if like_aws and not state.get("like_aws"):
        log("a sandbox without --like-aws is already running; `ec2gpu sandbox down` first")
    return state


def sandbox_down() -> bool:
    """Stop the sandbox and every sshd and process it started. Returns whether one was running."""
    return control.down(_home())


def sandbox_status() -> dict[str, Any]:
    """The running sandbox's state (as sandbox_up returns it: pid, endpoint, instances {instance
    id: {host, port, sshd_pid, directory}}, ...), or {"running": False} when none runs."""
    return control.read_state(_home()) or {"running": False}


def sandbox_interrupt(instance_id: str, notice_seconds: float = 120.0, rebalance: bool = False) -> dict[str, Any]:
    """Interrupt the sandbox's running spot instance ``instance_id`` as EC2 does: a spot
    interruption notice on its metadata service, then termination ``notice_seconds`` (s, EC2
    gives 120) later; with ``rebalance``, a rebalance recommendation instead and nothing else (it
    keeps running). Returns what was published (sandbox/imds.py): {"instance_id", "notice":
    {"action", "time"}, "notice_seconds", "published_at" (epoch s)}, or with ``rebalance``
    {"instance_id", "rebalance": {"noticeTime"}, "published_at"}. Raises UsageError for a negative or non-finite
    ``notice_seconds``; SandboxError when no sandbox runs, or for an unknown, stopped or on-demand
    instance."""
    if not math.isfinite(notice_seconds) or notice_seconds < 0:
        raise UsageError(f"--notice-seconds {notice_seconds:g} is not a number of seconds, 0 or more",
                         "EC2 gives 120")
    return control.interrupt(_home(), instance_id, notice_seconds, rebalance=rebalance)


def sandbox_capacity(instance_type: str, count: Optional[int]) -> dict[str, Any]:
    """Let at most ``count`` instances of ``instance_type`` be pending or running at once in the
    sandbox, all zones together (None: no limit, the default). RunInstances then launches as many
    as fit, up to its MaxCount, and answers InsufficientInstanceCapacity when its MinCount do not
    fit, as EC2 does when a type is short (sandbox/capacity.py). Returns {"limits": {instance
    type: count}}, every limit in force. Raises UsageError for a negative count; SandboxError when
    no sandbox runs."""
    if count is not None and count < 0:
        raise UsageError(f"count {count} is below 0", "give 0 or more, or --unlimited")
    return control.capacity(_home(), instance_type, count)


def sandbox_env() -> dict[str, str]:
    """The environment variables that point AWS clients (boto3, the aws CLI) at the running
    sandbox: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
    AWS_DEFAULT_REGION, EC2GPU_CHECKIP_URL (sandbox/control.env_vars). Raises SandboxError when none runs."""
    state = control.read_state(_home())
    if not state:
        raise SandboxError("no sandbox is running", "start it with `ec2gpu sandbox up`")
    return control.env_vars(state)
