"""The one plan of a run (issue 45, item 1): every value a run needs, checked, and where each came from.

``plan(job, flags, settings)`` is pure: it reads this machine's files alone (the task made ready, the
ledger, the price cache) and calls no AWS API. `--dry-run` prints the RunPlan it returns
(runs/plan/dryrun.py); the real run turns that same RunPlan into the options its pipeline runs
(``options``), so the two cannot disagree. Every refusal that needs no AWS call is made while the plan
is made (runs/plan/checks.py; costs.refusal at on-demand list prices), before any backend is opened:
after the credentials check only what needs AWS is left (a spot price, the vCPU quota, the S3 buckets
a task names, the caller's identity, the run store).

`ec2gpu run` (api/tasks.run: a task file or a command) and `ec2gpu train mnist` (api/train.train_mnist:
the built-in task, tasks/builtin/mnist.yaml, with a ``Trainer``) both come here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ...aws import catalog
from ...aws.tags import IdleRule
from ...backend import name_for
from ...errors import UsageError
from ...settings import Settings
from ...tasks import arrays, resolve
from ...tasks.load import aws_infra, zone_note
from ...tasks.spec import minutes
from ..options import PoolOptions, RunOptions, TrainOptions
from . import checks, costs, detached_spec, limits, sandbox_data
from ..job_summary import mask_text

if TYPE_CHECKING:
    from ...tasks.arrays import Element
    from ..job import TaskJob

#: The models of the built-in trainer (train/presets.py), `train mnist --model`.
MODELS = ("cnn", "lenet", "mlp", "dbn")
#: the names a sweep of the built-in trainer may vary: its flags (train/mnist.py, train/presets.Hparams)
SWEEP_FLAGS = ("model", "seed", "epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "schedule",
               "lr_decay", "warmup_frac", "dropout", "label_smoothing")
#: `train mnist`'s limit when --max-runtime is not given (minutes)
TRAINER_LIMIT_MINUTES = 120
#: where the SSH rule comes from when --ssh-cidr is not given (aws/network.ssh_cidr)
DEFAULT_SSH = "your public IP/32, looked up at launch"


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """What the caller asked of a run: `ec2gpu run`'s flags, api.run's keyword arguments (None: not
    given, so the task's value, else the default, holds). Units: minutes or '90m'/'2h'/'none'
    (max_runtime, expect), USD (budget), USD/h (max_price), bytes (max_upload), seconds (unreachable_s)."""

    # what to run and what to send: read while the task is made ready (api/tasks.load_task, _prepare)
    command: Sequence[str] | None = None
    workdir: str | None = None
    name: str | None = None
    env: Mapping[str, str | None] | None = None
    secrets: Sequence[str] = ()
    max_upload: int | None = None
    include_secrets: bool = False
    workdir_outside: bool = False
    allow_write_buckets: Sequence[str] = ()
    ports: Sequence[int] = ()
    infra: str | None = None
    allow_larger: bool = False
    # where, and on what
    gpu: str | None = None
    instance_type: str | None = None
    spot: bool | None = None
    spot_fallback: str | None = None
    nodes: int | None = None
    max_price: float | None = None
    ssh_cidr: str | None = None
    ami: str | None = None
    baked: bool = True
    region: str | None = None
    sandbox: bool = False
    # how long, for how much
    max_runtime: str | float | None = None
    expect: str | float | None = None
    budget: float | None = None
    max_attempts: int | None = None
    # how it runs
    detach: bool = False
    keep: bool = False
    checkpoint_uri: str | None = None
    unreachable_s: float = 120.0
    out: Path | None = None
    as_typed: str | None = None
    # an array's pool
    array: int | str | None = None
    workers: int | None = None
    gpus_per_job: int | None = None
    max_retries: int | None = None


@dataclass(frozen=True, kw_only=True)
class Trainer:
    """`ec2gpu train mnist`'s own flags: the built-in trainer's preset (``model``, ``epochs`` (None:
    the preset's), ``seed``, extra ``trainer_args``), a ``sweep`` ({trainer flag: values}), and where it
    trains: new instances, this machine (``local``, MNIST in ``data_dir``) or a standing ``cluster``."""

    model: str = "cnn"
    epochs: int | None = None
    seed: int = 0
    trainer_args: tuple[str, ...] = ()
    sweep: Mapping[str, Sequence[Any]] | None = None
    data_dir: str | None = None
    local: bool = False
    cluster: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """Everything a run does, decided and checked before anything is opened (``plan``), and
    ``sources``: where each value came from, in words ({"instance_types": "--gpu T4", ...})."""

    job: TaskJob  # the task made ready (runs/execute/engine.TaskJob; the built-in one for `train mnist`)
    flags: RunFlags
    trainer: Trainer | None  # `train mnist`'s
    settings: Settings  # as loaded, with the run's region
    backend: str  # "aws" or "sandbox" (backend.name_for)
    instance_types: tuple[str, ...]  # in the order they are tried, the catalog's names
    spot: bool
    max_price: float | None  # USD/h, spot only
    nodes: int  # instances launched together; an array's: the pool's size at most
    limit: limits.Limit  # the instances end themselves after limit.minutes (None: no limit)
    idle_seconds: int | None  # the idle rule's (None: none)
    ami: str | None
    budget_usd: float | None
    expect_minutes: float | None
    command: str  # as typed, secrets masked: the ledger's
    elements: tuple[Element, ...] = ()  # an array's or a sweep's
    slots: int = 1  # elements one instance runs at once
    gpus_per_job: int | None = None
    max_retries: int = 2
    ssh_warning: str | None = None  # --ssh-cidr lets more than a /24 reach port 22
    warnings: tuple[str, ...] = ()  # what the task file or the flags changed or dropped, said before anything
    sources: Mapping[str, str] = field(default_factory=dict)
    estimate: costs.Estimate | None = None  # what the run is judged by, at on-demand list prices (costs.estimate_for)

    @property
    def region(self) -> str:
        return self.settings.region

    @property
    def where(self) -> str:
        """"new instances", "this machine" (`train mnist --local`) or "cluster NAME" (--cluster)."""
        if self.trainer is not None and self.trainer.local:
            return "this machine"
        if self.trainer is not None and self.trainer.cluster:
            return f"cluster {self.trainer.cluster}"
        return "new instances"

    @property
    def persistent(self) -> bool:
        """What the run launches outlives the command (a detached run, --keep): a sandbox it starts keeps running."""
        return self.flags.detach or self.flags.keep

    @property
    def mode(self) -> str:
        """How it runs, in words: "foreground", "detached", "array" or "detached array"."""
        return ("detached " if self.flags.detach else "") + "array" if self.elements else \
            "detached" if self.flags.detach else "foreground"


def plan(job: TaskJob, flags: RunFlags, settings: Settings, trainer: Trainer | None = None,
         warnings: Sequence[str] = ()) -> RunPlan:
    """The plan of a run of ``job`` (an engine.TaskJob, its flags' overrides in place) as ``flags``
    ask, with ``settings`` (settings.load: the configured region, type, home) and, for `train
    mnist`, ``trainer``; ``warnings``: what loading the task said. Reads the ledger and the price
    cache; calls no AWS API. Raises UsageError for every refusal that needs no AWS call: a flag out
    of its range or form (a CIDR, a type, an S3 URI, a duration), a combination the run cannot do
    (--max-price without spot, --detach without a limit, an array with ports or --nodes, ...), an
    estimate the run would refuse (its --budget at on-demand prices, a job longer than its limit)."""
    _check_ranges(flags, trainer)
    elements = _sweep_elements(flags, trainer) if trainer is not None else _elements(job, flags)
    infra_region, infra_zone = infra_of(flags.infra, flags.region)
    said = list(warnings)
    if infra_zone:
        said.append(f"--infra {flags.infra}: {zone_note(infra_zone, infra_region)}")
    expect = _expect(flags.expect)
    res = job.task.resources
    region = flags.region or infra_region or res.region
    st = settings if region is None else settings.model_copy(update={"region": region})
    backend = name_for(st)
    limit = _limit(job, flags, st, backend, trainer)
    sources = {"region": _region_source(flags.region, infra_region, res.region), "max_runtime": limit.source}
    p = RunPlan(job=job, flags=flags, trainer=trainer, settings=st, backend=backend, instance_types=(),
                spot=bool(flags.spot), max_price=flags.max_price if flags.max_price is not None else res.max_price,
                nodes=flags.nodes or job.task.nodes, limit=limit, idle_seconds=idle_seconds(job.task, limit),
                ami=None, budget_usd=flags.budget if flags.budget is not None else job.task.budget,
                expect_minutes=expect, elements=tuple(elements), warnings=tuple(said), sources=sources,
                command=mask_text(flags.as_typed or ("ec2gpu.train_mnist()" if trainer else f"ec2gpu.run({job.name!r})"),
                                  job.secret_values))
    if p.where != "new instances":  # `train mnist --local` or --cluster: no instance is launched, nothing is priced
        p = replace(p, instance_types=(flags.instance_type or st.instance_type,))
    else:
        p = _on_new_instances(p)
    return _with_sandbox_data(p)


def _with_sandbox_data(p: RunPlan) -> RunPlan:
    """``p``, for `train mnist` on sandbox instances (new ones or a cluster's), with the trainer
    flags that give them MNIST (sandbox_data.sandbox_data_args: this machine's files, or none when
    the instance can download them); UsageError when there is none here and the mirrors cannot be
    reached, in a dry run as in the real run."""
    t = p.trainer
    if t is None or t.local or p.backend != "sandbox":
        return p
    data = sandbox_data.sandbox_data_args(list(t.trainer_args))
    if not data:
        return p
    return replace(p, trainer=replace(t, trainer_args=(*t.trainer_args, *data)),
                   job=replace(p.job, args=[*p.job.args, *data]))  # mnist_args ends with the trainer's flags


def _on_new_instances(p: RunPlan) -> RunPlan:
    """``p`` with what new instances need decided (types, market, nodes, AMI, SSH, estimate) and
    checked as the run checks its options (checks.check_launch, checks.check_detached, a detached
    run's spec as its agent checks it: detached_spec.check, costs.refusal)."""
    flags, res, st = p.flags, p.job.task.resources, p.settings
    _check_region(st.region)
    types, types_source = _types(flags, res, st.instance_type)
    spot, spot_source = _market(flags, res, bool(p.elements))
    sources = {**p.sources, "instance_types": types_source, "market": spot_source,
               "ami": _ami_source(flags.ami, res.ami), "ssh_cidr": "--ssh-cidr" if flags.ssh_cidr else DEFAULT_SSH,
               "budget": "--budget" if flags.budget is not None else "the task's budget" if p.budget_usd is not None
               else "none", "max_price": "--max-price" if flags.max_price is not None else
               "the task's resources.max_price" if p.max_price is not None else "none (up to the on-demand price)",
               "expect": "--expect" if p.expect_minutes is not None else "none",
               "idle_rule": _idle_source(p.job.task, p.idle_seconds)}
    p = replace(p, instance_types=tuple(types), spot=spot, ami=_ami(flags.ami, res, st.region), sources=sources)
    if p.elements:
        p = _pool(p)
    else:
        p = replace(p, sources={**p.sources, "nodes": "--nodes" if flags.nodes else "the task's nodes"
                                if "nodes" in p.job.task.model_fields_set else "default: 1"})
    opts = options(p)
    wide: list[str] = []
    checks.check_launch(opts.instance_type, spot=opts.spot, name=opts.name, spot_fallback=opts.spot_fallback,
                        max_price=opts.max_price, checkpoint_uri=opts.checkpoint_uri, ssh_cidr=opts.ssh_cidr,
                        warn=wide.append)
    if flags.detach and not p.elements:
        checks.check_detached(max_runtime_minutes=opts.max_runtime_minutes, max_attempts=opts.max_attempts,
                              nodes=opts.nodes, keep=opts.keep, secrets=checks.secret_env(p.job.env, p.job.task.secrets))
        detached_spec.check(p.job, opts, st.ssh_user)  # a spec its agent would refuse, or one too large
    # spot's price is AWS's: judged here at the on-demand price, its ceiling, on what needs no price
    prices = costs.PriceTable(st.region)
    est = costs.estimate_for(prices, st.home, replace(opts, spot=False), p.backend)
    refused = costs.refusal(est, opts, prices, priced=not spot)
    if refused is not None:
        raise refused
    return replace(p, estimate=est, ssh_warning=wide[0] if wide else None)


def _pool(p: RunPlan) -> RunPlan:
    """``p`` (an array's or a sweep's) with its pool sized: the elements one instance runs at once,
    its GPUs per element and its retries (pure; UsageError: more GPUs per element than a type has)."""
    flags, task = p.flags, p.job.task
    per_job = flags.gpus_per_job or task.gpus_per_job
    slots = checks.slots_per_node(list(p.instance_types), per_job)
    nodes = pool_size(task, list(p.elements), flags.workers, slots)
    source = "--workers" if flags.workers else "the task's max_workers" if "max_workers" in task.model_fields_set \
        else "default: 1 instance"
    return replace(p, nodes=nodes, slots=slots, gpus_per_job=per_job,
                   max_retries=task.max_retries if flags.max_retries is None else flags.max_retries,
                   sources={**p.sources, "nodes": f"{source}, never more than the elements need"})


def options(p: RunPlan) -> RunOptions:
    """The options the pipeline runs for plan ``p`` (the one place they are made from a plan):
    PoolOptions for an array or a sweep (a sweep's task: the built-in one, each element adding its
    flags), TrainOptions for `train mnist` (its task made by runs/provision/pipeline.with_task, which
    gives the sandbox's instance its data), else RunOptions."""
    if p.elements:
        return PoolOptions(**_common(p), task=p.job, elements=p.elements, gpus_per_job=p.gpus_per_job,
                           max_retries=p.max_retries, detach=p.flags.detach)
    if p.trainer is not None:
        return train_options(p)
    return RunOptions(**_common(p), task=p.job)


def train_options(p: RunPlan) -> TrainOptions:
    """`train mnist`'s TrainOptions for plan ``p``: its trainer's flags (a sweep's too: the flags
    every element starts from). Raises ValueError for a plan without a trainer."""
    if p.trainer is None:
        raise ValueError("a plan without a trainer has no TrainOptions")
    t = p.trainer
    return TrainOptions(**_common(p), model=t.model, epochs=t.epochs, seed=t.seed, trainer_args=list(t.trainer_args))


def _common(p: RunPlan) -> dict[str, Any]:
    """The fields of RunOptions every plan gives (pure)."""
    f = p.flags
    return dict(instance_type=",".join(p.instance_types), spot=p.spot, spot_fallback=f.spot_fallback,
                max_price=p.max_price, ssh_cidr=f.ssh_cidr, ami=p.ami, baked=f.baked, name=f.name, nodes=p.nodes,
                out=f.out, keep=f.keep, max_runtime_minutes=p.limit.minutes,
                limit_source=None if p.trainer else p.limit.source,  # said before launch for a user's task alone
                idle=None if p.idle_seconds is None else IdleRule("down", p.idle_seconds), command=p.command,
                budget_usd=p.budget_usd, expect_minutes=p.expect_minutes, max_attempts=f.max_attempts,
                checkpoint_uri=f.checkpoint_uri, unreachable_s=f.unreachable_s)


def _check_ranges(flags: RunFlags, trainer: Trainer | None) -> None:
    """Each number in its range (the CLI's, for the Python API), and `train mnist`'s combinations."""
    if trainer is not None:
        _check_trainer(flags, trainer)
    checks.check_nodes(flags.nodes)
    if trainer is not None:
        checks.at_least(trainer.epochs, 1, "--epochs", "give at least 1 epoch")
        if not isinstance(flags.max_runtime, str):
            checks.at_least(flags.max_runtime, 1, "--max-runtime", "give at least 1 minute")
    checks.at_least(flags.budget, 0, "--budget", "give a budget in USD, 0 or more")
    checks.at_least(flags.max_price, 0, "--max-price", "give a price in USD/h, 0 or more")
    checks.at_least(flags.max_attempts, 1, "--max-attempts", "give at least 1")
    checks.at_least(flags.unreachable_s, 5, "--unreachable-after", "give at least 5 seconds")


def _check_trainer(flags: RunFlags, t: Trainer) -> None:
    """`train mnist`'s own refusals: an unknown model, --cluster with what would change the cluster,
    --detach or a sweep off new instances, --keep without a limit, a data directory that is not one."""
    if t.model not in MODELS:
        raise UsageError(f"unknown model {t.model!r}", "choose cnn, lenet, mlp or dbn")
    if t.cluster and ((flags.nodes or 1) > 1 or flags.spot or flags.instance_type or flags.keep):
        raise UsageError("--cluster trains on an existing cluster as it is",
                         "drop --nodes/--spot/--instance-type/--keep, or `ec2gpu scale NAME N` first")
    if flags.detach and (t.cluster or t.local):
        raise UsageError("--detach trains on new instances of its own", "drop --cluster or --local, or drop --detach")
    if flags.detach and flags.keep:
        raise UsageError("--keep has no meaning with --detach: the group ends when the training does", "drop --keep")
    if flags.detach and flags.checkpoint_uri:
        raise UsageError("--checkpoint-uri is for a run in the foreground: a detached run keeps its checkpoints "
                         "in its run store in S3 (ec2gpu fetch RUN brings them)", "drop --checkpoint-uri")
    if flags.keep and flags.max_runtime is None:
        raise UsageError("--keep needs an explicit --max-runtime MINUTES",
                         "say how long the kept instance may live, e.g. --keep --max-runtime 240")
    check_data_dir(t.data_dir)


def check_data_dir(data_dir: str | Path | None) -> None:
    """Raise UsageError when ``data_dir`` is given and is not a directory."""
    if data_dir and not Path(data_dir).is_dir():
        raise UsageError(f"data directory {data_dir} does not exist", "pass a directory with the four MNIST files")


def _elements(job: TaskJob, flags: RunFlags) -> list[Element]:
    """The array's elements (tasks/arrays.elements; [] for a task that is no array), its flags
    checked. Raises UsageError: a bad --array, pool flags without an array, --nodes or ports with
    one. MOUNT-mode file_mounts are written back by each node of the pool as it leaves
    it (pool/attempt.py)."""
    task = job.task
    try:
        elements = arrays.elements(task.array, task.sweep, flags.array)
    except ValueError as exc:
        raise UsageError(f"--array: {exc}" if flags.array is not None else f"the task's array/sweep: {exc}",
                         "e.g. --array 100, --array 0-99 or --array 3,7,12") from None
    pool_flags = [f for f, v in (("--workers", flags.workers), ("--gpus-per-job", flags.gpus_per_job),
                                 ("--max-retries", flags.max_retries)) if v is not None]
    if not elements and pool_flags:
        raise UsageError(f"{pool_flags[0]} is for an array or a sweep", "add --array N, or array:/sweep: to the task")
    if elements and task.ports:
        raise UsageError("an array or a sweep does not take ports yet",
                         "run its service as a task of its own, or run without array/sweep")
    if elements and (flags.nodes or task.nodes) > 1:
        raise UsageError("--nodes runs one job over several instances; an array runs each element on one",
                         "drop --nodes, and give --workers N for the pool's size")
    arrays.check_flags(workers=flags.workers, gpus_per_job=flags.gpus_per_job, max_retries=flags.max_retries)
    return elements


def _sweep_elements(flags: RunFlags, t: Trainer) -> list[Element]:
    """The elements of a sweep of the built-in trainer, each with its parameters as trainer flags
    ([] without a sweep). Raises UsageError: an unknown flag, a bad value, a sweep with --cluster,
    --local, --nodes or --keep, --workers or --max-retries out of range or without a sweep."""
    sweep = t.sweep
    if not sweep:
        if flags.workers is not None:
            raise UsageError("--workers is for a sweep", "add --sweep NAME=V1,V2 (e.g. --sweep lr=0.1,0.05)")
        return []
    unknown = [k for k in sweep if k not in SWEEP_FLAGS]
    if unknown:
        raise UsageError(f"--sweep {unknown[0]}: not a flag of the built-in trainer", f"sweep {', '.join(SWEEP_FLAGS)}")
    if t.cluster or t.local or (flags.nodes or 1) > 1 or flags.keep:
        raise UsageError("a sweep runs on a pool of new instances", "drop --cluster, --local, --nodes and --keep")
    arrays.check_flags(workers=flags.workers, max_retries=flags.max_retries)
    try:
        elements = arrays.elements(None, dict(sweep))
    except ValueError as exc:
        raise UsageError(f"--sweep: {exc}", "e.g. --sweep lr=0.1,0.05 --sweep seed=0,1,2") from None
    bad = [m for m in sweep.get("model", ()) if m not in MODELS]
    if bad:
        raise UsageError(f"--sweep model: unknown model {bad[0]!r}", "choose cnn, lenet, mlp or dbn")
    return [e.with_flags() for e in elements]


def pool_size(task: Any, elements: list[Element], workers: int | None, slots: int = 1) -> int:
    """The pool's instances (pure): --workers, else the task's max_workers; never more than the
    elements need, ``slots`` of them at once on each instance."""
    return max(1, min(workers or task.max_workers, -(-len(elements) // max(1, slots))))


def infra_of(infra: str | None, region: str | None) -> tuple[str | None, str | None]:
    """(region, zone) the --infra flag names (None each where it names none; tasks.load.aws_infra).
    Raises UsageError for another cloud, or a region other than --region's."""
    if infra is None:
        return None, None
    infra_region, zone = aws_infra(infra)
    if region and infra_region and region != infra_region:
        raise UsageError(f"--region {region} and --infra {infra} name different regions", "give one of them")
    return infra_region, zone


def _expect(expect: str | float | None) -> float | None:
    """--expect in minutes (None: not given). Raises UsageError for a value that is no duration."""
    try:
        return minutes(expect) if expect is not None else None
    except ValueError as exc:
        raise UsageError(f"--expect: {exc}", "e.g. --expect 20m")


def _limit(job: TaskJob, flags: RunFlags, st: Settings, backend: str, trainer: Trainer | None) -> limits.Limit:
    """The run's limit (runs/plan/limits.for_task); `train mnist`'s: --max-runtime, else TRAINER_LIMIT_MINUTES."""
    if trainer is None:
        return limits.for_task(st.home, job.history_key, backend, flags.max_runtime, job.task.max_runtime)
    given, minutes_ = limits.parse(flags.max_runtime)
    return limits.Limit(minutes_, "--max-runtime") if given else \
        limits.Limit(TRAINER_LIMIT_MINUTES, f"the built-in trainer's default ({TRAINER_LIMIT_MINUTES} min)")


def _check_region(region: str) -> None:
    """Raise UsageError for a region EC2 does not have, as the run's AWS session would (aws/session.check_region)."""
    if region in catalog.SHIPPED_PRICE_REGIONS:
        return  # EC2's: the AWS SDK's endpoint data is not read (a dry run imports no SDK)
    from ...aws import session  # boto3: only for a region the price table does not name
    session.check_region(region)


def _types(flags: RunFlags, res: Any, default: str) -> tuple[list[str], str]:
    """The instance types to try, in order, the catalog's names (--gpu's cheapest, else
    --instance-type's list, else the task's resources ``res``, else ``default``: the configured
    type), and where they come from. Raises UsageError as checks.instance_types and resolve do."""
    if flags.gpu:
        return [resolve.instance_type_for_gpu(flags.gpu, res.allow_larger, resolve.need_of(res))], f"--gpu {flags.gpu}"
    if flags.instance_type is not None:
        return checks.instance_types(flags.instance_type), "--instance-type"
    asked = any(c.instance_type for c in resolve.plan(res).choices)
    return checks.instance_types(",".join(resolve.instance_types(res, default))), (
        "the task's resources" if asked else "the configured instance type (EC2GPU_INSTANCE_TYPE, else g4dn.xlarge)")


def _market(flags: RunFlags, res: Any, pool: bool) -> tuple[bool, str]:
    """(spot, where that comes from): the flag, else the task's resources.spot; a pool is spot
    unless asked otherwise (--on-demand, or the task's spot: false)."""
    if flags.spot:
        return True, "--spot"
    if flags.spot is not None:  # `run --on-demand`; `train mnist` without --spot
        return False, "--on-demand, or no --spot"
    if "spot" in res.model_fields_set:
        return res.spot, "the task's resources.spot (SkyPilot's use_spot)"
    if pool:
        return True, "an array's pool: spot unless asked otherwise"
    return res.spot, "default: on-demand"


def _region_source(region: str | None, infra_region: str | None, task_region: str | None) -> str:
    """Where the run's region comes from, in words (pure)."""
    return ("--region" if region else "--infra" if infra_region else
            "the task's resources.region (SkyPilot's infra or region)" if task_region else
            "the configured region (EC2GPU_REGION, AWS_REGION, else us-east-1)")


def _ami(ami: str | None, resources: Any, region: str) -> str | None:
    """The AMI to boot in ``region``: the --ami flag, else the task's (resources.ami, SkyPilot's
    image_id: one, or one per region), else None (the baked image or the DLAMI, found at launch).
    Raises UsageError when the task names AMIs per region and none for ``region``."""
    if ami:
        return ami
    try:
        got: str | None = resources.ami_for(region)
        return got
    except ValueError as exc:
        names = ", ".join(resources.ami)
        raise UsageError(str(exc), f"run it in one of those regions (--region {names.split(',')[0]}), "
                         "or give --ami for this one")


def _ami_source(flag: str | None, task_ami: Any) -> str:
    """Where the AMI comes from, in words (pure)."""
    return ("--ami" if flag else "the task's resources.ami (SkyPilot's image_id)" if task_ami else
            "none asked: the newest image baked for this setup, else the PyTorch Deep Learning AMI, found at launch")


def idle_seconds(task: Any, limit: limits.Limit) -> int | None:
    """The seconds of a run's idle rule (None: no rule): the task's ``idle_timeout`` (SkyPilot's
    autostop), else 30 min (limits.NO_LIMIT_IDLE_SECONDS) where ``limit`` is none. Its action is
    always "down": a run's instances are terminated, never kept stopped."""
    if task.idle_timeout is not None:
        return int(math.ceil(minutes(task.idle_timeout))) * 60
    return limits.NO_LIMIT_IDLE_SECONDS if limit.minutes is None else None


def _idle_source(task: Any, seconds: int | None) -> str:
    """Where the idle rule comes from, in words (pure)."""
    return ("none" if seconds is None else "idle_timeout (autostop)" if task.idle_timeout is not None
            else "max runtime none")
