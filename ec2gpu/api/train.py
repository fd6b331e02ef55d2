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

from ..errors import UsageError

if TYPE_CHECKING:
    from ..runs.settle.record import RunRecord
    from ..runs.execute.reporter import ReporterLike

Log = Callable[[str], None]

#: The models of the built-in trainer (train/presets.py), `train mnist --model`.
MODELS = ("cnn", "lenet", "mlp", "dbn")


def _quiet(text: str) -> None:
    """The default ``log``: says nothing."""


def _check_data_dir(data_dir: Union[str, Path, None]) -> None:
    """Raise UsageError when ``data_dir`` is given and is not a directory."""
    if data_dir and not Path(data_dir).is_dir():
        raise UsageError(f"data directory {data_dir} does not exist", "pass a directory with the four MNIST files")


def _at_least(value: Optional[float], least: float, flag: str, hint: str) -> None:
    """Raise UsageError when ``value`` is given and below ``least`` (the CLI's typer ranges, for the Python API)."""
    if value is not None and value < least:
        raise UsageError(f"{flag} {value:g} is under {least:g}", hint)


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
                max_retries: int = 2, detach: bool = False) -> RunRecord:
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

    Raises UsageError before anything is created: an unknown model, ``cluster`` with
    nodes/spot/instance_type/keep, ``keep`` without ``max_runtime``, a ``data_dir`` that is not a
    directory, a value out of range, a bad type, CIDR, fallback or checkpoint URI, an estimate above
    the budget, ``detach`` with ``cluster``/``local``/``keep``; then AwsError,
    CapacityError, RemoteError, WaitTimeout, recovery.AttemptsExhausted.
    """
    if model not in MODELS:
        raise UsageError(f"unknown model {model!r}", "choose cnn, lenet, mlp or dbn")
    if cluster and (nodes > 1 or spot or instance_type or keep):
        raise UsageError("--cluster trains on an existing cluster as it is",
                         "drop --nodes/--spot/--instance-type/--keep, or `ec2gpu scale NAME N` first")
    if detach and (cluster or local):
        raise UsageError("--detach trains on new instances of its own",
                         "drop --cluster or --local, or drop --detach")
    if detach and keep:
        raise UsageError("--keep has no meaning with --detach: the group ends when the training does", "drop --keep")
    if detach and checkpoint_uri:
        raise UsageError("--checkpoint-uri is for a run in the foreground: a detached run keeps its checkpoints "
                         "in its run store in S3 (ec2gpu fetch RUN brings them)", "drop --checkpoint-uri")
    if keep and max_runtime is None:
        raise UsageError("--keep needs an explicit --max-runtime MINUTES",
                         "say how long the kept instance may live, e.g. --keep --max-runtime 240")
    _check_data_dir(data_dir)
    if not 1 <= nodes <= 64:
        raise UsageError(f"--nodes {nodes} is out of range", "give 1 to 64")
    _at_least(epochs, 1, "--epochs", "give at least 1 epoch")
    _at_least(max_runtime, 1, "--max-runtime", "give at least 1 minute")
    _at_least(budget, 0, "--budget", "give a budget in USD, 0 or more")
    _at_least(max_price, 0, "--max-price", "give a price in USD/h, 0 or more")
    _at_least(max_attempts, 1, "--max-attempts", "give at least 1")
    _at_least(unreachable_after, 5, "--unreachable-after", "give at least 5 seconds")
    elements = _sweep_elements(sweep, workers, max_retries, cluster, local, nodes, keep)

    from ..runs.options import TrainOptions
    from ..runs.provision import pipeline
    from ..runs.execute.reporter import Reporter
    from ..settings import DEFAULT_INSTANCE_TYPE

    opts = TrainOptions(
        model=model, epochs=epochs, seed=seed, keep=keep, out=out, ssh_cidr=ssh_cidr, ami=ami,
        spot=spot, trainer_args=list(trainer_args), max_runtime_minutes=max_runtime or 120,
        instance_type=DEFAULT_INSTANCE_TYPE if instance_type is None else instance_type, budget_usd=budget,
        max_price=max_price, spot_fallback=spot_fallback,
        max_attempts=max_attempts, checkpoint_uri=checkpoint_uri, unreachable_s=unreachable_after, nodes=nodes,
        baked=baked, command=as_typed or "ec2gpu.train_mnist()")
    ui = reporter or Reporter()
    if local:
        from ..runs.execute import local as run_local
        from ..settings import load
        return run_local.train_local(opts, ui, data_dir, load())
    from ..backend import Context
    from ..runs.standing import hosts as standing
    with Context(region, sandbox, persistent=keep or detach, note=ui.note) as ctx:  # a kept instance or detached run outlives
        # a sandbox this starts
        if instance_type is None:
            opts = replace(opts, instance_type=ctx.settings.instance_type)
        if cluster:
            return standing.train_on_cluster(ctx.aws, ctx.settings, opts, ui, cluster, ctx.backend)
        if elements:
            return _train_sweep(ctx, opts, ui, elements, workers, max_retries, detach)
        if detach:
            from ..runs.detached import launch
            return launch.start(ctx.aws, ctx.settings, opts, ui, ctx.backend)
        return pipeline.train(ctx.aws, ctx.settings, opts, ui, ctx.backend)


#: the names a sweep of the built-in trainer may vary: its flags (train/mnist.py, train/presets.Hparams)
SWEEP_FLAGS = ("model", "seed", "epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "schedule",
               "lr_decay", "warmup_frac", "dropout", "label_smoothing")


def _sweep_elements(sweep, workers, max_retries, cluster, local, nodes, keep) -> list:
    """The elements of a sweep of the built-in trainer, each with its parameters as trainer flags
    ([] without a sweep). Raises UsageError: an unknown flag, a bad value, a sweep with --cluster,
    --local, --nodes or --keep, --workers or --max-retries out of range or without a sweep."""
    if not sweep:
        if workers is not None:
            raise UsageError("--workers is for a sweep", "add --sweep NAME=V1,V2 (e.g. --sweep lr=0.1,0.05)")
        return []
    from ..tasks import arrays
    unknown = [k for k in sweep if k not in SWEEP_FLAGS]
    if unknown:
        raise UsageError(f"--sweep {unknown[0]}: not a flag of the built-in trainer", f"sweep {', '.join(SWEEP_FLAGS)}")
    if cluster or local or nodes > 1 or keep:
        raise UsageError("a sweep runs on a pool of new instances", "drop --cluster, --local, --nodes and --keep")
    from ..tasks.arrays import check_flags
    check_flags(workers=workers, max_retries=max_retries)
    try:
        elements = arrays.elements(None, dict(sweep))
    except ValueError as exc:
        raise UsageError(f"--sweep: {exc}", "e.g. --sweep lr=0.1,0.05 --sweep seed=0,1,2") from None
    if "model" in sweep:
        bad = [m for m in sweep["model"] if m not in MODELS]
        if bad:
            raise UsageError(f"--sweep model: unknown model {bad[0]!r}", "choose cnn, lenet, mlp or dbn")
    return [e.with_flags() for e in elements]


def _train_sweep(ctx, opts, ui, elements, workers, max_retries, detach=False) -> RunRecord:
    """The sweep as a pool run of the built-in task (runs/options.PoolOptions); with ``detach``,
    returned once its driver runs (docs/pool.md, "Without its controller")."""
    from dataclasses import fields

    from ..pool import attempt as pool_attempt
    from ..runs.options import PoolOptions
    from ..runs.provision import pipeline
    from ..sandbox import bindshim  # the sandbox's part is given to pool/, which never imports sandbox/
    pool_attempt.ray_here((lambda: bindshim.for_sandbox(ctx.settings.home)) if ctx.backend.is_sandbox else None)
    opts = replace(opts, nodes=max(1, min(workers or 1, len(elements))))  # --spot as given: on-demand by default here
    if ctx.backend.is_sandbox:  # the sandbox's MNIST, as pipeline.train gives a single run
        opts = replace(opts, trainer_args=[*opts.trainer_args, *pipeline.sandbox_data_args(opts.trainer_args)])
    job = pipeline.builtin_task(opts, sandbox=ctx.backend.is_sandbox)
    same = {f.name for f in fields(PoolOptions)} - {"task", "elements", "gpus_per_job", "max_retries", "detach"}
    popts = PoolOptions(**{name: getattr(opts, name) for name in same}, task=job, elements=tuple(elements),
                        max_retries=max_retries, detach=detach)
    return pipeline.train(ctx.aws, ctx.settings, popts, ui, ctx.backend)


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
    _check_data_dir(data_dir)
    if data_dir and not (local or in_sandbox):
        raise UsageError(f"--data-dir {data_dir} is a directory on this machine, which an instance on AWS cannot "
                         "read", "drop --data-dir (the instance downloads MNIST), or add --local or --sandbox")
    _at_least(max_runtime, 1, "--max-runtime", "give at least 1 minute")
    _at_least(budget, 0, "--budget", "give a budget in USD, 0 or more")

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
