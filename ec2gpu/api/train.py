"""The built-in jobs as library functions: train_mnist (`ec2gpu train mnist`) and bench (`ec2gpu bench`).

Each function validates its arguments before anything is created (UsageError), opens its own
backend.Context (``region``; ``sandbox``: the local sandbox instead of AWS, also EC2GPU_SANDBOX=1),
returns a frozen record (api/run_results.py: RunResult, BenchResult; ``to_json()`` is what the CLI's
``--json`` prints) and raises the ec2gpu.errors tree: UsageError, NoCredentials, AwsError,
CapacityError, RemoteError, WaitTimeout. The modules that import boto3 (runs/provision, runs/standing)
are imported where a function reaches AWS: a dry run imports no AWS SDK (api/tasks.py says why).
"""
from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union, overload

from .. import backend, settings as settings_mod
from ..errors import UsageError
from ..runs.execute import engine
from ..runs.execute.reporter import Reporter, ReporterLike
from ..runs.options import BenchOptions, TrainOptions, mnist_args
from ..runs.plan import checks, runplan
from ..runs.plan.runplan import MODELS as MODELS, RunFlags, RunPlan, Trainer  # MODELS: `train mnist --model`'s
from . import tasks
from .run_results import BenchResult, RunResult

Log = Callable[[str], None]

#: `train mnist`'s flags when none are given: RunFlags' defaults but on-demand, one node, an element
#: of a sweep run again twice (the defaults `train mnist` has always had)
TRAIN_FLAGS = RunFlags(spot=False, nodes=1, max_retries=2)
#: Trainer's fields, set by train_mnist's keyword arguments of the same names
_TRAINER_FIELDS = frozenset(f.name for f in fields(Trainer))


def _quiet(text: str) -> None:
    """The default ``log``: says nothing."""


@overload
def train_mnist(options: Optional[RunFlags] = None, trainer: Optional[Trainer] = None, *,
                reporter: Optional[ReporterLike] = None, dry_run: Literal[False] = False,
                **given: Any) -> RunResult: ...


@overload
def train_mnist(options: Optional[RunFlags] = None, trainer: Optional[Trainer] = None, *,
                reporter: Optional[ReporterLike] = None, dry_run: Literal[True], **given: Any) -> RunPlan: ...


@overload
def train_mnist(options: Optional[RunFlags] = None, trainer: Optional[Trainer] = None, *,
                reporter: Optional[ReporterLike] = None, dry_run: bool, **given: Any) -> Union[RunResult, RunPlan]: ...


def train_mnist(options: Optional[RunFlags] = None, trainer: Optional[Trainer] = None, *,
                reporter: Optional[ReporterLike] = None, dry_run: bool = False,
                **given: Any) -> Union[RunResult, RunPlan]:
    """Train the built-in MNIST job on a new instance (or ``nodes`` of them through torchrun), bring
    its results home and terminate everything; `ec2gpu train mnist`. Returns a RunResult: the run record
    (also saved as run.json and in the ledger: run_id, status, instance_type, market, test_acc, phases
    (s), billed_seconds, cost_usd (USD), artifacts, summary, attempts ...).

    ``options``: the run's flags, a runs.plan.runplan.RunFlags (default TRAIN_FLAGS); ``trainer``: the
    trainer's, a runs.plan.runplan.Trainer (model, epochs, seed, trainer_args, sweep, data_dir, local,
    cluster). Keyword arguments ``given`` are a convenience that sets the fields of the same names over
    them (a Trainer's name over ``trainer``, any other over ``options``; ``unreachable_after`` is
    RunFlags' unreachable_s); TypeError for a name neither has. The fields:

    ``instance_type``: one type or several in order of preference ('g4dn.xlarge,g5.xlarge'; default
    the configured one); ``spot`` (managed: an interrupted instance is replaced and training resumes
    from its last checkpoint, up to ``max_attempts``, default 3 with spot, else 1);
    ``spot_fallback`` ('on-demand'); ``model`` (MODELS), ``epochs`` (default: the preset's), ``seed``,
    ``trainer_args`` (extra trainer flags); ``keep``: leave the instance running (needs
    ``max_runtime``); ``max_runtime``: minutes after which the instance terminates itself (default
    120); ``budget`` (USD): refuse a run estimated above it; ``max_price`` (USD/h, spot);
    ``baked``: launch from the newest image baked for mnist when there is one; ``checkpoint_uri``
    (s3://BUCKET/PREFIX); ``unreachable_after`` (s of SSH unreachability that count as a lost
    instance); ``cluster``: train on the nodes a standing cluster has now and leave it running;
    ``local``: train on this machine (needs torch; ``data_dir``: its MNIST directory); ``out``:
    where artifacts go (default runs/<run-id>/). ``reporter``: a runs.execute.reporter.Reporter (default:
    silent); ``as_typed``: the command line, for the ledger. ``sweep`` ({trainer flag: values}, e.g.
    {"lr": [0.1, 0.05], "seed": [0, 1, 2]}: every combination): one training per parameter set,
    over a pool of at most ``workers`` instances scheduled by Ray (ec2gpu/pool/; each element gets
    its parameters as flags and environment variables, up to ``max_retries`` runs again of one that
    fails); the record's ``pool`` lists each set's test accuracy. ``detach``: hand the training to
    AWS and return once its Auto Scaling group is made, as `run --detach` does
    (runs/detached/launch.start: the record has status "detached", its bucket, group and deadline;
    the instance's agent uploads checkpoints and outputs to S3, a spot instance lost is replaced
    and training resumes from the last checkpoint there; `status`, `logs`, `fetch` and `cancel`
    follow it from any machine of the account; ``max_runtime``, default 120, is the group's deadline);
    a sweep with ``detach`` returns once its pool's driver runs, as `run --detach` of an array does.
    ``dry_run``: return the run's plan (a runs/plan/runplan.RunPlan) instead, as `run`'s ``dry_run`` does
    (shown by runs/plan/dryrun.plan), having created nothing and called no AWS API; the training runs
    that same plan (new instances only: not with ``local`` or ``cluster``).

    Raises UsageError before anything is created, with ``dry_run`` or not (runs/plan/runplan.plan):
    an unknown model, ``cluster`` with nodes/spot/instance_type/keep, ``keep`` without
    ``max_runtime``, a ``data_dir`` that is not a directory, a value out of range, a bad type, CIDR,
    fallback or checkpoint URI, ``max_price`` without ``spot``, an estimate above the budget (at
    on-demand prices) or longer than ``max_runtime``, ``detach`` with ``cluster``/``local``/``keep``;
    then NoCredentials, AwsError, CapacityError, RemoteError, WaitTimeout, recovery.AttemptsExhausted.
    """
    asked, training = _asked(options, trainer, given)
    planned = plan_training(asked, training)
    if dry_run:
        if planned.where != "new instances":
            raise UsageError(f"--dry-run shows a run on new instances, and this one trains on {planned.where}",
                             "drop --dry-run, or drop --local/--cluster")
        return planned
    ui = reporter or Reporter()
    if training.local:
        from ..runs.provision import local as run_local  # boto3: see the module docstring
        return RunResult(run_local.train_local(runplan.train_options(planned), ui, training.data_dir,
                                               settings_mod.load()))
    tasks.ready_here(planned)  # a sweep's Ray, before anything is opened
    # a kept instance or a detached run outlives a sandbox this starts
    with backend.Context(planned.region, asked.sandbox, persistent=planned.persistent, note=ui.note) as ctx:
        if training.cluster:
            from ..runs.standing import hosts as standing  # boto3: see the module docstring
            return RunResult(standing.train_on_cluster(ctx.aws, ctx.settings, runplan.train_options(planned), ui,
                                                       training.cluster, ctx.backend))
        return RunResult(tasks.start(ctx, planned, ui))


def _asked(options: Optional[RunFlags], trainer: Optional[Trainer], given: dict[str, Any]) -> tuple[RunFlags, Trainer]:
    """(the run's flags, the trainer's): ``given`` (train_mnist's keyword arguments) set over
    ``options`` (default TRAIN_FLAGS) and ``trainer`` (default Trainer()) by name (pure). Raises
    TypeError for a name neither has, as a call with a wrong keyword does."""
    given = dict(given)
    if "unreachable_after" in given:  # `--unreachable-after`'s name; RunFlags calls it unreachable_s
        given["unreachable_s"] = given.pop("unreachable_after")
    training: dict[str, Any] = {k: given.pop(k) for k in list(given) if k in _TRAINER_FIELDS}
    if "trainer_args" in training:
        training["trainer_args"] = tuple(training["trainer_args"])
    return tasks.with_flags(options or TRAIN_FLAGS, given), replace(trainer or Trainer(), **training)


def plan_training(flags: RunFlags, trainer: Trainer) -> RunPlan:
    """The plan of `ec2gpu train mnist` (runs/plan/runplan.plan): the built-in task
    (tasks/builtin/mnist.yaml) with ``trainer``'s flags as its "$@", as ``flags`` ask, with the
    settings loaded here. Opens no backend and calls no AWS API. Raises UsageError as ``train_mnist``
    does before anything is created."""
    args = mnist_args(TrainOptions(model=trainer.model, epochs=trainer.epochs, seed=trainer.seed,
                                   trainer_args=list(trainer.trainer_args), nodes=flags.nodes or 1))
    return runplan.plan(engine.builtin_job("mnist", args), flags, settings_mod.load({"sandbox": flags.sandbox or None}),
                        trainer=trainer)


def bench(*, instance_type: Optional[str] = None, spot: bool = False, local: bool = False, quick: bool = False,
          data_dir: Optional[str] = None, out: Optional[Path] = None, max_runtime: int = 60,
          budget: Optional[float] = None, ssh_cidr: Optional[str] = None, ami: Optional[str] = None,
          region: Optional[str] = None, sandbox: bool = False, reporter: Optional[ReporterLike] = None, log: Log = _quiet,
          as_typed: Optional[str] = None) -> list[BenchResult]:
    """Is the GPU worth it: measure an instance's memory bandwidth, matmul TFLOP/s and the seed
    experiment (dbn and cnn on its CPU and its GPU); `ec2gpu bench`. Each of ``instance_type``'s
    types (comma-separated; default the configured one) is benched on its own new instance, one
    after another, each terminated after; the results go into the ledger.

    ``spot``: spot instances; ``local``: bench this machine instead (needs torch); ``quick``: small
    sizes and a 6,000-image subset (seconds, rougher figures); ``data_dir``: MNIST on this machine
    (with ``local`` or the sandbox only); ``out``: where results go (default runs/<run-id>/);
    ``max_runtime``: minutes after which each instance terminates itself; ``budget`` (USD): a type
    estimated above it is refused. ``reporter``: a runs.execute.reporter.Reporter (default: silent);
    ``log`` is told that the sandbox's figures are this machine's CPU's; ``as_typed``: the command
    line, for the ledger.

    Returns one BenchResult per type (api/run_results.py), cheapest USD per run first (runs/provision/bench._result: run_id,
    instance_type, market, status, usd_per_hour (USD/h), cost_usd (USD), artifacts, usd_per_run
    ({model: {seconds, usd, basis}}), bench (bench.json's report, None with "bench_invalid" saying
    why); with several types, one whose run failed is {instance_type, status, error, usd_per_run}
    and the others still run; ``local``: this machine's one).

    Raises UsageError before anything is created: ``local`` with instance_type/spot/sandbox, a
    ``data_dir`` that is not a directory or that an instance on AWS could not read, ``max_runtime``
    under 1, a negative budget, a bad type, an estimate above the budget; then NoCredentials,
    AwsError, RemoteError (``local``: the bench failed), KeyboardInterrupt after teardown.
    """
    in_sandbox = backend.sandbox_from_env(sandbox)
    if local and (instance_type or spot or in_sandbox):
        raise UsageError("--local benches this machine", "drop --instance-type/--spot/--sandbox, or drop --local")
    runplan.check_data_dir(data_dir)
    if data_dir and not (local or in_sandbox):
        raise UsageError(f"--data-dir {data_dir} is a directory on this machine, which an instance on AWS cannot "
                         "read", "drop --data-dir (the instance downloads MNIST), or add --local or --sandbox")
    checks.at_least(max_runtime, 1, "--max-runtime", "give at least 1 minute")
    checks.at_least(budget, 0, "--budget", "give a budget in USD, 0 or more")

    from ..runs.provision import bench as benching  # boto3: see the module docstring

    opts = BenchOptions(spot=spot, out=out, ssh_cidr=ssh_cidr, ami=ami, max_runtime_minutes=max_runtime,
                        budget_usd=budget, quick=quick, data_dir=data_dir, command=as_typed or "ec2gpu.bench()")
    ui = reporter or Reporter()
    if local:
        return [BenchResult(row) for row in benching.local(opts, ui, settings_mod.load())]
    with backend.Context(region, in_sandbox) as ctx:
        opts = replace(opts, instance_type=instance_type or ctx.settings.instance_type)
        if ctx.backend.is_sandbox:
            log("sandbox: the instance is this machine, without a GPU: the figures are its CPU's")
        return [BenchResult(row) for row in benching.on_instances(ctx.aws, ctx.settings, opts, ui, ctx.backend)]
