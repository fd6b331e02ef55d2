"""What a run runs, below every stage of runs/ (plan, provision, execute, recover, settle import it; it
imports none of them but the masking rule): ``TaskJob``, a task made ready to run (runs/execute/engine.prepare
and builtin_job make it), and ``BakePlan``, the image a bake makes (runs/provision/bake.plan_bake makes it).
runs/options.py's types carry them; engine.TaskJob and bake.BakePlan are these, re-exported.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .execute.job_summary import mask_text

if TYPE_CHECKING:
    from ..remote import sync
    from ..tasks.load import LoadedTask
    from ..tasks.mounts import Mount
    from ..tasks.spec import Task


@dataclass
class TaskJob:
    """A task made ready to run: the task, its environment (secrets resolved), the files to send."""

    loaded: LoadedTask
    env: dict[str, str]
    manifest: sync.Manifest | None
    include_secrets: bool = False
    secret_values: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)  # the run script's "$@" (a built-in task's flags)
    builtin: str | None = None  # "mnist" for `ec2gpu train mnist`
    # file_mounts target -> sync.Manifest of a local directory
    mount_manifests: dict[str, sync.Manifest] = field(default_factory=dict)
    bucket_regions: dict[str, str] = field(default_factory=dict)  # S3 file_mounts bucket -> region (pipeline fills it)
    s3_files: set[str] = field(default_factory=set)  # S3 file_mounts targets whose prefix is one object (a file)
    buckets_to_make: list[str] = field(default_factory=list)  # output buckets that do not exist yet (provision makes them)
    role_policy: dict[str, Any] | None = None  # the run role's inline policy (aws/iam.s3_policy), checked before anything is made
    role_boundary: str | None = None  # the account's ec2gpu-instance-boundary ARN, when it has one
    # ports named by --port: forwarded to the same port here when it is free; the task file's others to a
    # free port the kernel picks, so a task cannot take a well-known local port (5432, 6379, ...) that a
    # client here would send its credentials to (remote/tunnel.forwarding)
    same_ports: tuple[int, ...] = ()

    @property
    def mounts(self) -> list[Mount]:
        """The task's file_mounts made ready (tasks/mounts.Mount)."""
        return self.loaded.mounts

    @property
    def task(self) -> Task:
        return self.loaded.task

    @property
    def name(self) -> str:
        return self.task.name or (self.loaded.path.stem if self.loaded.path else "task")

    def mask(self, text: str) -> str:
        """``text`` with every secret value replaced by **** (job_summary.mask_text: longest first,
        so a secret inside a longer one leaves nothing of the longer one)."""
        return mask_text(text, self.secret_values)


@dataclass
class BakePlan:
    """What a bake makes: the image's name, its base, and its key (``bake_key``)."""

    name: str
    base: str  # one of aws.images.BASES
    key: str
    minutes: float  # the bake's expected time (its estimate)
    minutes_source: str
    data_dir: str | None = None  # pre-fetch MNIST from this directory (on the instance) instead of downloading
    image_timeout_s: float = 1800.0
    image_delay_s: float = 15.0  # the waiter's poll interval (s): the sandbox polls faster
