"""The built-in jobs as library functions: train_mnist (`ec2gpu train mnist`) and bench (`ec2gpu bench`).

Each function validates its arguments before anything is created (UsageError), opens its own
backend.Context (``region``; ``sandbox``: the local sandbox instead of AWS, also EC2GPU_SANDBOX=1),
returns plain data (what the CLI's ``--json`` prints) and raises the ec2gpu.errors tree: UsageError,
NoCredentials, AwsError, CapacityError, RemoteError, WaitTimeout.
"""
from __future__ import annotations

from pathlib import Path
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from .. import backend, settings as settings_mod
from ..errors import UsageError
from ..runs.execute import engine
from ..runs.options import TrainOptions, mnist_args
from ..runs.plan import checks, dryrun, runplan
from ..runs.plan.runplan import MODELS as MODELS, RunFlags, RunPlan, Trainer  # MODELS: `train mnist --model`'s
from . import tasks

if TYPE_CHECKING:
    from ..runs.settle.record import RunRecord
    from ..runs.execute.reporter import ReporterLike

Log = Callable[[str], None]


def _quiet(text: str) -> None:
    """The default ``log``: says nothing."""


def train_mnist(*, instance_type: Optional[str] = None, spot: bool = False, spot_fallback: Optional[str] = None,
                model: str = "cnn", epochs: Optional[int] = None, seed: int = 0, keep: bool = False,
                out: Optional[Path] = None, local: bool = False, ssh_cidr: Optional[str] = None,
                ami: Optional[str] = None, baked: bool = True, max_runtime: Optional[int] = None,
                data_dir: Optional[str] = None, trainer_args: Sequence[str] = (), budget: Optional[float] = None,
                max_price: Optional[float] = None, cluster: Optional[str] = None, nodes: int = 1,
                max_attempts: Optional[int] = None, checkpoint_uri: Optional[str] = None,
                unreachable_after: float = 120.0, region: Optional[str] = None, sandbox: bool = False,
                reporter: Optional[ReporterLike] = None, as_typed: Optional[str] = None,
                sweep: Optional[Mapping[str, Sequence[Any]]] = None, workers: Optional[int] = None,
                max_retries: int = 2, detach: bool = False, dry_run: bool = False) -> Union[RunRecord, dict]:
    """Train the built-in MNIST job on a new instance (or ``nodes`` of them through torchrun), bring
    its results home and terminate everything; `ec2gpu train mnist`. Returns the run record (also
    saved as run.json and in the ledger: run_id, status, instance_type, market, test_acc, phases
    (s), billed_seconds, cost_usd (USD), artifacts, summary, attempts ...).

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
    ``dry_run``: return the run's plan instead, as `run`'s ``dry_run`` does (runs/plan/runplan.plan,
    shown by runs/plan/dryrun.plan), having created nothing and called no AWS API; the training runs
    that same plan (new instances only: not with ``local`` or ``cluster``).

    Raises UsageError before anything is created, with ``dry_run`` or not (runs/plan/runplan.plan):
    an unknown model, ``cluster`` with nodes/spot/instance_type/keep, ``keep`` without
    ``max_runtime``, a ``data_dir`` that is not a directory, a value out of range, a bad type, CIDR,
    fallback or checkpoint URI, ``max_price`` without ``spot``, an estimate above the budget (at
    on-demand prices) or longer than ``max_runtime``, ``detach`` with ``cluster``/``local``/``keep``;
    then NoCredentials, AwsError, CapacityError, RemoteError, WaitTimeout, recovery.AttemptsExhausted.
    """
    flags = RunFlags(instance_type=instance_type, spot=spot, spot_fallback=spot_fallback, keep=keep, out=out,
                     ssh_cidr=ssh_cidr, ami=ami, baked=baked, max_runtime=max_runtime, budget=budget,
                     max_price=max_price, nodes=nodes, max_attempts=max_attempts, checkpoint_uri=checkpoint_uri,
                     unreachable_s=unreachable_after, region=region, sandbox=sandbox, as_typed=as_typed,
                     workers=workers, max_retries=max_retries, detach=detach)
    trainer = Trainer(model=model, epochs=epochs, seed=seed, trainer_args=tuple(trainer_args), sweep=sweep,
                      data_dir=data_dir, local=local, cluster=cluster)
    planned = plan_training(flags, trainer)
    if dry_run:
        if planned.where != "new instances":
            raise UsageError(f"--dry-run shows a run on new instances, and this one trains on {planned.where}",
                             "drop --dry-run, or drop --local/--cluster")
        return dryrun.plan(planned)
    from ..runs.execute.reporter import Reporter
    ui = reporter or Reporter()
    if local:
        from ..runs.provision import local as run_local
        return run_local.train_local(runplan.train_options(planned), ui, data_dir, settings_mod.load())
    tasks.ready_here(planned)  # a sweep's Ray, before anything is opened
    # a kept instance or a detached run outlives a sandbox this starts
    with backend.Context(planned.region, sandbox, persistent=planned.persistent, note=ui.note) as ctx:
        if cluster:
            from ..runs.standing import hosts as standing
            return standing.train_on_cluster(ctx.aws, ctx.settings, runplan.train_options(planned), ui, cluster,
                                             ctx.backend)
        return tasks.start(ctx, planned, ui)


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
          as_typed: Optional[str] = None) -> list[dict]:
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

    Returns one dict per type, cheapest USD per run first (runs/provision/bench._result: run_id,
    instance_type, market, status, usd_per_hour (USD/h), cost_usd (USD), artifacts, usd_per_run
    ({model: {seconds, usd, basis}}), bench (bench.json's report, None with "bench_invalid" saying
    why); with several types, one whose run failed is {instance_type, status, error, usd_per_run}
    and the others still run; ``local``: this machine's one).

    Raises UsageError before anything is created: ``local`` with instance_type/spot/sandbox, a
    ``data_dir`` that is not a directory or that an instance on AWS could not read, ``max_runtime``
    under 1, a negative budget, a bad type, an estimate above the budget; then NoCredentials,
    AwsError, RemoteError (``local``: the bench failed), KeyboardInterrupt after teardown.
    """
    from ..backend import sandbox_from_env
    in_sandbox = sandbox_from_env(sandbox)
    if local and (instance_type or spot or in_sandbox):
        raise UsageError("--local benches this machine", "drop --instance-type/--spot/--sandbox, or drop --local")
    runplan.check_data_dir(data_dir)
    if data_dir and not (local or in_sandbox):
        raise UsageError(f"--data-dir {data_dir} is a directory on this machine, which an instance on AWS cannot "
                         "read", "drop --data-dir (the instance downloads MNIST), or add --local or --sandbox")
    checks.at_least(max_runtime, 1, "--max-runtime", "give at least 1 minute")
    checks.at_least(budget, 0, "--budget", "give a budget in USD, 0 or more")

    from ..runs.options import BenchOptions
    from ..runs.provision import bench as benching
    from ..runs.execute.reporter import Reporter
    opts = BenchOptions(spot=spot, out=out, ssh_cidr=ssh_cidr, ami=ami, max_runtime_minutes=max_runtime,
                        budget_usd=budget, quick=quick, data_dir=data_dir, command=as_typed or "ec2gpu.bench()")
    ui = reporter or Reporter()
    if local:
        from ..settings import load
        return benching.local(opts, ui, load())
    from ..backend import Context
    with Context(region, in_sandbox) as ctx:
        opts = replace(opts, instance_type=instance_type or ctx.settings.instance_type)
        if ctx.backend.is_sandbox:
            log("sandbox: the instance is this machine, without a GPU: the figures are its CPU's")
        return benching.on_instances(ctx.aws, ctx.settings, opts, ui, ctx.backend)
