"""What each operation on new instances was asked to do: one frozen options type per operation.

Each is built once by its ``api/`` function and never changed after (a step that adds to one makes
a copy with ``dataclasses.replace``). They nest the way the operations do:

- ``LaunchOptions``: new instances alone: `ec2gpu launch`, `ec2gpu notebook` on a new instance,
  and the provisioning step of every run (runs/provision/resources.provision reads only these);
- ``RunOptions(LaunchOptions)``: a job on them: `ec2gpu run` (a user's task), `ec2gpu exec` on
  standing instances (its job fields only);
- ``TrainOptions(RunOptions)``: `ec2gpu train mnist`, the built-in trainer's flags;
- ``BenchOptions(RunOptions)``: `ec2gpu bench`;
- ``BakeOptions(RunOptions)``: `ec2gpu image bake`, whose job is the task's setup alone;
- ``PoolOptions(RunOptions)``: `ec2gpu run` of an array or a sweep, over a pool (ec2gpu/pool/).

The classes are keyword-only: ``RunOptions(task=job, spot=True)``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..settings import DEFAULT_INSTANCE_TYPE

if TYPE_CHECKING:
    from ..aws.instances import IdleRule
    from ..tasks.arrays import Element
    from .job import BakePlan, TaskJob


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """New instances: which types, which market, who may reach them, how long they may live."""

    instance_type: str = DEFAULT_INSTANCE_TYPE  # one type, or several in order of preference: "g4dn.xlarge,g5.xlarge"
    spot: bool = False
    spot_fallback: str | None = None  # "on-demand": a last on-demand try when spot has no capacity
    max_price: float | None = None  # spot: the highest USD/h to pay
    ssh_cidr: str | None = None  # who may reach SSH (default: this machine's address /32)
    ami: str | None = None  # an image id or alias (default: the Deep Learning AMI)
    baked: bool = True  # launch from the newest image baked for the task's setup, when there is one
    name: str | None = None  # the Name tag (default ec2gpu-RUN_ID)
    nodes: int = 1  # instances launched together (a cluster placement group when > 1)
    max_runtime_minutes: int | None = 120  # instances end themselves after this (None: no limit): runs/plan/limits.py
    limit_source: str | None = None  # where max_runtime_minutes comes from, said before launch
    idle: IdleRule | None = None  # aws.instances.IdleRule: a standing instance stops or ends itself when idle

    @property
    def instance_types(self) -> list[str]:
        """The types to try, in order of preference (``instance_type`` split at commas)."""
        return [t.strip() for t in self.instance_type.split(",") if t.strip()]

    @property
    def forms_cluster(self) -> bool:
        """The instances are one cluster's members: each tagged ec2gpu:cluster (``ec2gpu ls`` shows
        them together), one security group that also admits its own members. True for more than one node."""
        return self.nodes > 1

    @property
    def needs_placement_group(self) -> bool:
        """One job spans the nodes (torchrun's all-reduce between them), so they go in a cluster
        placement group, for its low latency and high throughput between instances
        (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html). True for more than one node."""
        return self.nodes > 1


@dataclass(frozen=True, kw_only=True)
class RunOptions(LaunchOptions):
    """A job on new instances: its task, where its results go, what it may cost, how it recovers."""

    task: TaskJob | None = None  # engine.TaskJob; None only in TrainOptions before pipeline.run_job sets the built-in
    out: Path | None = None  # default runs/<run-id>
    keep: bool = False  # leave the instances running after the job
    command: str = "ec2gpu run"  # as typed, for the ledger
    budget_usd: float | None = None  # refuse a run whose estimate is above this (USD)
    expect_minutes: float | None = None  # the job's expected time (--expect), when the ledger has none
    max_attempts: int | None = None  # instances to try before giving up; None: 3 with spot, else 1
    checkpoint_uri: str | None = None  # s3://bucket/prefix: a second home for checkpoints
    unreachable_s: float = 120.0  # SSH unreachable this long (s) counts as a lost instance

    @property
    def attempts_allowed(self) -> int:
        """Instances this run may try (one per attempt): ``max_attempts``, else 3 with spot, 1 without."""
        return self.max_attempts or (3 if self.spot else 1)

    @property
    def bake(self) -> BakePlan | None:
        """The image this run makes instead of running a job (BakeOptions), else None."""
        return None


@dataclass(frozen=True, kw_only=True)
class TrainOptions(RunOptions):
    """`ec2gpu train mnist`: the built-in trainer's preset and flags (tasks/builtin/mnist.yaml)."""

    command: str = "ec2gpu train mnist"
    model: str = "cnn"
    epochs: int | None = None  # None: the preset's
    seed: int = 0
    trainer_args: list[str] = field(default_factory=list)  # passed through to the trainer


def mnist_args(opts: TrainOptions, sandbox: bool = False) -> list[str]:
    """The built-in trainer's flags for `ec2gpu train mnist` (pure): "$@" of tasks/builtin/mnist.yaml.

    In the sandbox, the nodes of a cluster share this machine's cores: each takes its share, or
    their CPU threads fight (2 nodes x 2 threads on 2 cores ran 15x slower than 1 x 2 here).
    """
    args = ["--model", opts.model, "--seed", str(opts.seed)]
    if opts.epochs:
        args += ["--epochs", str(opts.epochs)]
    if sandbox and opts.nodes > 1:
        args += ["--threads", str(max(1, (os.cpu_count() or 1) // opts.nodes))]
    return args + list(opts.trainer_args)


@dataclass(frozen=True, kw_only=True)
class BenchOptions(RunOptions):
    """`ec2gpu bench`: the built-in benchmark on each of ``instance_types`` (or this machine)."""

    command: str = "ec2gpu bench"
    quick: bool = False  # the short benchmark (runs/provision/bench.EXPECT_MINUTES)
    data_dir: str | None = None  # MNIST on this machine (--local, or the sandbox's instances)
    max_runtime_minutes: int | None = 60


@dataclass(frozen=True, kw_only=True)
class BakeOptions(RunOptions):
    """`ec2gpu image bake`: a builder instance runs the task's setup and becomes an image (``plan``)."""

    plan: BakePlan

    @property
    def bake(self) -> BakePlan:
        return self.plan


@dataclass(frozen=True, kw_only=True)
class PoolOptions(RunOptions):
    """`ec2gpu run` of an array or a sweep: its ``elements`` over a pool of ``nodes`` instances
    (at most --workers, never more than the elements), each element holding ``gpus_per_job`` GPUs
    (None: a node's), an element whose run exits non-zero run again up to ``max_retries`` times."""

    elements: tuple[Element, ...]
    gpus_per_job: int | None = None
    max_retries: int = 2
    #: `--detach`: this command leaves once the driver runs; the head's agent hands the results over
    #: to S3 and the pool ends itself (pool/attempt.py, runs/recover/handover.HandedOver)
    detach: bool = False

    @property
    def forms_cluster(self) -> bool:
        """A pool is a cluster whatever its size: a replacement launched alone (nodes=1) is tagged
        with the others, and Ray's ports are open between members only (issue 31, item 8)."""
        return True

    @property
    def needs_placement_group(self) -> bool:
        """No: elements are independent jobs with no traffic between instances, and a cluster
        placement group keeps the pool in one zone (the placement-strategies page above), where
        a spot pool wants every zone's capacity."""
        return False
