"""What a run runs and what it made, below every stage of runs/ (plan, provision, execute, recover and
settle import it; it imports none of them): ``TaskJob``, a task made ready to run (runs/execute/engine.prepare
and builtin_job make it); ``BakePlan``, the image a bake makes (runs/provision/bake.plan_bake makes it);
``Provisioned``, what a run created (runs/provision/resources.provision fills it, its teardown removes
exactly that, an attempt reads its instances). runs/options.py's types carry the first two;
engine.TaskJob, bake.BakePlan and resources.Provisioned are these, re-exported.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tasks.resolve import gpus_asked, visible_devices

if TYPE_CHECKING:
    from ..aws.instances import Instance
    from ..remote import sync
    from ..tasks.load import LoadedTask
    from ..tasks.mounts import Mount
    from ..tasks.spec import Task


MAX_KEY_CHARS = 1000  # a history key (TaskJob.history_key) is cut here: a long command is still told apart
PROGRESS_FILE = "progress.json"  # in the run's directory on the instance: $EC2GPU_PROGRESS_FILE


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

    @property
    def history_key(self) -> str:
        """What the ledger's history of this job is keyed by (runs/settle/ledger.history_key: its
        limit and its estimates come from earlier runs with the same key): the task's name for a
        task file or a built-in job; for a command (`ec2gpu run -- CMD`, named for its directory)
        the name and the command, so a smoke test and a training run in one directory never share
        a history."""
        if self.loaded.path is not None or self.builtin:
            return self.name
        return f"{self.name}: {self.task.run or ''}"[:MAX_KEY_CHARS]


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


@dataclass
class Provisioned:
    """What a run created, so teardown removes exactly that."""

    run_id: str
    key_name: str | None = None
    key_path: Path | None = None
    security_group_id: str | None = None
    placement_group: str | None = None
    ami: dict[str, Any] | None = None
    bake: bool = False  # an image bake: teardown also removes the run's incomplete image and snapshots
    instance_profile: str | None = None  # the run's own instance role and profile (aws/iam.py), same name
    profile_created_at: float | None = None  # time.time() when it was made (EC2 sees it a moment later)
    instances: list[Instance] = field(default_factory=list)  # every instance of the run, in launch order
    ended: set[str] = field(default_factory=set)  # those already terminated (interrupted attempts)

    @property
    def instance_ids(self) -> list[str]:
        return [i.id for i in self.instances]


def workdir_of(run_dir: str, job: TaskJob) -> str:
    """Where the task's workdir lives on an instance: $HOME/ec2gpu/workdirs/<task name>, the same for
    every run of the task there, so a rerun (`ec2gpu exec`) sends only what changed (pure)."""
    return f"{run_dir.rsplit('/runs/', 1)[0]}/workdirs/{job.name}"


def node_env(job: TaskJob, run_id: str, run_dir: str, index: int, addresses: list[str], gpus: int,
             resume: bool, python: str = "python3", instance_type: str | None = None) -> dict[str, str]:
    """The environment of the job on node ``index`` (pure): the task's envs, then ours.

    EC2GPU_PYTHON is the Python with torch that setup found (the Deep Learning AMI's is not the
    first python3 on PATH): the agent and the setup put its directory first on PATH.

    On a node whose type has more GPUs than the task asked for (taken because of
    ``resources.allow_larger``: tasks/resolve.gpus_asked; ``instance_type`` is the node's type where
    the caller knows it, else its ``gpus`` tell), the job sees only the count asked, N:
    CUDA_VISIBLE_DEVICES=0,...,N-1, and EC2GPU_GPUS_PER_NODE and SKYPILOT_NUM_GPUS_PER_NODE are N.
    """
    limit = gpus_asked(job.task.resources, instance_type, gpus)
    gpus = limit or gpus
    workdir = workdir_of(run_dir, job)
    ckpt = f"{workdir}/{job.task.checkpoint_dir}" if job.task.checkpoint_dir else f"{run_dir}/checkpoints"
    ours = {
        "EC2GPU_RUN_ID": run_id, "EC2GPU_OUTPUT_DIR": f"{run_dir}/out", "EC2GPU_CHECKPOINT_DIR": ckpt,
        "EC2GPU_RESUME": "1" if resume else "0", "EC2GPU_NODE_RANK": str(index), "EC2GPU_NUM_NODES": str(len(addresses)),
        "EC2GPU_HEAD_IP": addresses[0], "EC2GPU_NODE_IP": addresses[index], "EC2GPU_GPUS_PER_NODE": str(gpus),
        "EC2GPU_PROGRESS_FILE": f"{run_dir}/{PROGRESS_FILE}",  # node 0's is read: nodes.ProgressReader
        "EC2GPU_WORKDIR": workdir, "EC2GPU_PYTHON": python,
        # SkyPilot's names, so its users' scripts run unchanged
        "SKYPILOT_NODE_RANK": str(index), "SKYPILOT_NUM_NODES": str(len(addresses)),
        "SKYPILOT_NODE_IPS": "\n".join(addresses), "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus),
        # the same for every node and attempt of the run (SkyPilot's: sky-<time>_<cluster>_<job id>)
        "SKYPILOT_TASK_ID": f"ec2gpu-{run_id}_{job.name}",
    }
    if limit:
        ours["CUDA_VISIBLE_DEVICES"] = visible_devices(limit)
    return {**job.env, **ours}
