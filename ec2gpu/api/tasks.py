"""The Python API: what the CLI's `run` and `exec` call, for scripts and notebooks.

    import ec2gpu
    result = ec2gpu.run("examples/quickstart/task.yaml", sandbox=True, expect="1m")
    print(result.status, result.cost_usd, result.summary)

``run``, ``exec`` and ``bake`` return a RunResult (api/run_results.py: the run record, also saved
as run.json and in the ledger), ``status`` and ``cancel`` a RunStatus; each raises the ec2gpu.errors
tree (UsageError for bad input before anything is created; AwsError, CapacityError, RemoteError for
a failed job (its outputs still come home), WaitTimeout).

The modules that import boto3 or fabric (runs/provision, runs/detached, runs/standing,
runs/recover/handover, pool/attempt) are imported where a function reaches AWS, not here: a dry run imports no AWS SDK
(tests/unit/test_dry_run.py::test_a_dry_run_imports_no_aws_sdk), and the CLI imports this module for one.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union, overload

from .. import backend, settings as settings_mod
from ..aws.tags import check_name
from ..errors import AwsError, UsageError
from ..remote.sync import MAX_UPLOAD_BYTES
from ..runs.execute import engine
from ..runs.execute.reporter import Reporter, ReporterLike
from ..runs.job import TaskJob
from ..runs.job_summary import mask_text
from ..runs.options import BakeOptions, PoolOptions
from ..runs.plan import runplan, sandbox_data
from ..runs.plan.runplan import RunFlags, RunPlan
from ..runs.settle.record import RunRecord
from ..sandbox import bindshim  # the sandbox's part is given to pool/, which never imports sandbox/
from ..tasks import load, resolve
from ..tasks.mounts import access, access_words
from ..tasks.spec import Task
from .run_results import RunResult, RunStatus

Log = Callable[[str], None]


def _quiet(text: str) -> None:
    """The default ``on_warning`` and ``log``: says nothing."""


def load_task(task: Union[str, Path, Task, None] = None, command: Optional[Sequence[str]] = None,
              workdir: Optional[str] = None, name: Optional[str] = None, workdir_outside: bool = False,
              overrides: Optional[Mapping[str, Any]] = None, infra: Optional[str] = None,
              env: Optional[Mapping[str, Optional[str]]] = None,
              allow_write_buckets: Sequence[str] = ()) -> load.LoadedTask:
    """A tasks.load.LoadedTask from a task file path, a Task, or a ``command`` run in ``workdir``;
    ``overrides``: resources fields set by flags, ``infra``: the --infra flag (tasks.load.parse).

    A task file's workdir may lie outside the file's directory only with ``workdir_outside``; no
    directory to send may be the home directory or a credentials one (tasks.load.check_local_source).
    A MOUNT-mode file_mounts entry writes back only to a bucket the task makes (``name:``) or one
    of ``allow_write_buckets`` (--allow-write-bucket; tasks/mounts.check_write); no entry may name
    one of ec2gpu's own buckets (ec2gpu-*).
    Raises UsageError when neither or both are given, for a bad task file, or a refused directory
    or bucket.
    """
    if name is not None:
        check_name(name)
    if (task is None) == (not command):
        raise UsageError("say what to run: a task file, or a command",
                         "e.g. `ec2gpu run task.yaml` or `ec2gpu run --gpu T4 -- python train.py`")
    if isinstance(task, (str, Path)):
        if workdir:
            raise UsageError("--workdir is for a command; a task file names its own workdir", "set workdir: in the file")
        loaded = load.load(task, workdir_outside, dict(overrides) if overrides else None, infra,
                           dict(env) if env else None, allow_write_buckets)
    elif isinstance(task, Task):
        base = Path(workdir or ".").resolve()
        loaded = load.LoadedTask(task, None, None if task.workdir is None else _sendable(base / task.workdir, workdir))
    else:
        assert command  # neither or both are refused above: a command is given here
        base = _sendable(Path(workdir or "."), workdir)
        if not base.is_dir():
            raise UsageError(f"--workdir {base} is not a directory", "give the directory to send")
        _check_program(command, base)
        default = re.sub(r"[^A-Za-z0-9_.-]", "-", base.name).strip("-.")[:63] or "task"
        loaded = load.LoadedTask(Task(name=name or default, workdir=str(base), run=shlex.join(command)), None, base)
    if name:
        loaded.task = loaded.task.model_copy(update={"name": name})
    if overrides and loaded.path is None:  # a file's are in place already
        loaded.task = loaded.task.model_copy(update={"resources": loaded.task.resources.model_copy(update=overrides)})
    return loaded


def _check_program(command: Sequence[str], base: Path) -> None:
    """Refuse, before launch, a command whose program is a file of the workdir named without a path
    (`ec2gpu run train.py`): bash on the instance looks a bare name up on PATH, not in the workdir, and
    the job would end in "command not found" (issue 48 item 9). A name with a "/" (./run.sh), or a
    program this machine has on PATH, passes. Raises UsageError with the command that works."""
    program = command[0]
    if "/" in program or shutil.which(program) or not (base / program).is_file():
        return
    how = (["python", program] if program.endswith(".py") else [f"./{program}"] if os.access(base / program, os.X_OK)
           else ["bash", program])
    raise UsageError(f"{program} is a file of the workdir, not a program: on the instance the job would end in "
                     "\"command not found\"", f"run it with `ec2gpu run -- {shlex.join([*how, *command[1:]])}`, "
                     "or name a task file (*.yaml)")


def _sendable(path: Path, workdir: Optional[str]) -> Path:
    """``path`` resolved, when a command's (or a Task object's) directory may be sent: never the home
    directory or a credentials one (tasks.load.check_local_source). Raises UsageError naming the fix."""
    try:
        return load.check_local_source(path)
    except UsageError as exc:
        where = "--workdir" if workdir else "the current directory (a command's workdir)"
        raise UsageError(f"{where}: {exc.message}",
                         "cd into your project's directory first (or give --workdir PROJECT): only it is sent")


def _prepare(task: Union[str, Path, Task, None], command: Optional[Sequence[str]], workdir: Optional[str],
             name: Optional[str], env: Optional[Mapping[str, Optional[str]]], secrets: Sequence[str],
             max_upload: Optional[int], include_secrets: bool, reporter: Optional[ReporterLike], on_warning: Log,
             workdir_outside: bool = False, overrides: Optional[Mapping[str, Any]] = None, infra: Optional[str] = None,
             allow_write_buckets: Sequence[str] = (), ports: Sequence[int] = ()) -> tuple[TaskJob, ReporterLike]:
    """(engine.TaskJob, reporter): the task loaded, its warnings said, its environment resolved (the names taken
    from this machine said), its workdir listed (what will be sent said) and the buckets the job may read and write
    said, before anything is created; ``ports`` (--port) forwarded too, each to the same port here (_ports)."""
    loaded = load_task(task, command, workdir, name, workdir_outside, overrides, infra, env, allow_write_buckets)
    for w in loaded.warnings:
        on_warning(w)
    same = _ports(ports, loaded)
    if secrets:
        loaded.task = loaded.task.model_copy(update={"secrets": sorted(set(loaded.task.secrets) | set(secrets))})
    if max_upload is None:
        max_upload = MAX_UPLOAD_BYTES
    job = engine.prepare(loaded, os.environ, max_upload, include_secrets, {**{k: None for k in secrets}, **(env or {})})
    reporter = reporter or Reporter()
    taken = load.from_this_machine(job.task)
    if taken:  # a task file is untrusted: what it takes from here is said before anything is sent
        secret = set(job.task.secrets)
        reporter.note("from this machine's environment: " + ", ".join(
            f"{k} (secret, masked)" if k in secret else k for k in taken))
    note = engine.manifest_note(job)
    if note:
        reporter.note(note)
    said = access_words(access(job.mounts))
    if said:  # the buckets the job may read and write, before anything is created
        reporter.note(said)
    job.same_ports = same
    return job, reporter


def _ports(ports: Sequence[int], loaded: Optional[load.LoadedTask] = None) -> tuple[int, ...]:
    """The --port values checked, each a TCP port (1 to 65535), repeats once, and added to ``loaded``'s
    task's ports (a tasks.load.LoadedTask; None: checked only). Only a port named here is forwarded to
    the same port on this machine; a task file's go to a free port the kernel picks
    (remote/tunnel.forwarding: issue 44.7). Raises UsageError, also for more than tasks.load.MAX_PORTS
    ports in all."""
    for p in ports:
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
            raise UsageError(f"--port {p!r} is not a TCP port", "give a number from 1 to 65535, e.g. --port 6006")
    same = tuple(dict.fromkeys(ports))
    if same and loaded is not None:
        merged = list(dict.fromkeys([*loaded.task.ports, *same]))
        if len(merged) > load.MAX_PORTS:
            raise UsageError(f"more than {load.MAX_PORTS} ports with --port: ec2gpu forwards each one over SSH",
                             "name the ports the job serves on")
        loaded.task = loaded.task.model_copy(update={"ports": merged})
    return same


@overload
def run(task: Union[str, Path, Task, None] = None, options: Optional[RunFlags] = None, *,
        reporter: Optional[ReporterLike] = None, on_warning: Log = _quiet, dry_run: Literal[False] = False,
        **flags: Any) -> RunResult: ...


@overload
def run(task: Union[str, Path, Task, None] = None, options: Optional[RunFlags] = None, *,
        reporter: Optional[ReporterLike] = None, on_warning: Log = _quiet, dry_run: Literal[True],
        **flags: Any) -> RunPlan: ...


@overload
def run(task: Union[str, Path, Task, None] = None, options: Optional[RunFlags] = None, *,
        reporter: Optional[ReporterLike] = None, on_warning: Log = _quiet, dry_run: bool,
        **flags: Any) -> Union[RunResult, RunPlan]: ...


def run(task: Union[str, Path, Task, None] = None, options: Optional[RunFlags] = None, *,
        reporter: Optional[ReporterLike] = None, on_warning: Log = _quiet, dry_run: bool = False,
        **flags: Any) -> Union[RunResult, RunPlan]:
    """Run a task on new instances end to end (estimate, launch, sync, setup, job, outputs home,
    teardown, bill); return its RunResult (api/run_results.py: the run record, run.json's).

    ``options``: what the caller asks of the run, a runs.plan.runplan.RunFlags (the one type of
    `ec2gpu run`'s flags); keyword arguments ``flags`` are a convenience that sets RunFlags' fields
    of the same names over ``options`` (TypeError for a name RunFlags has not). The fields:

    ``task``: a task file path or a tasks.spec.Task; or ``command`` (argv) run in ``workdir``.
    ``workdir_outside``: send a task file's workdir that lies outside the file's directory.
    ``allow_write_buckets`` (--allow-write-bucket): buckets a MOUNT-mode file_mounts entry may write back to besides
    the ones the task makes (``name:``); any other MOUNT entry is refused, and so is every entry in one of ec2gpu's
    own buckets (ec2gpu-*: the run store). ``ports`` (--port): node 0's ports forwarded to the same port here (the
    task file's own go to a free one).
    Flags override the task's own values: ``gpu`` ('T4', 'A10G:4') or ``instance_type`` ('g5.xlarge'
    or 'g5.xlarge,g6.xlarge'), ``spot``, ``nodes``, ``env`` ({K: V, or K: None from this
    environment}), ``secrets`` (names, masked everywhere), ``max_runtime`` (minutes or '90m', '2h';
    'none': no limit; default: runs/plan/limits.for_task, from the task's history, 24 h for its first
    run), ``allow_larger`` (as the task's resources.allow_larger: with ``gpu``, where no type has
    exactly the count asked, the cheapest with more, the job seeing only the count asked),
    ``expect`` (minutes: the job's expected time, an array's element's, for the estimate), ``budget`` (USD),
    ``max_price`` (USD/h), ``max_upload`` (bytes; default remote/sync.MAX_UPLOAD_BYTES, 1 GiB). ``reporter``:
    a runs.provision.pipeline.Reporter (default: silent). ``baked``: launch from the newest image baked for
    the task's setup (`ec2gpu image bake`) when the region has one. ``dry_run``: return the run's
    plan instead (a runs/plan/runplan.RunPlan; runs/plan/dryrun.plan shows it as `--dry-run --json` does:
    instance types, prices, limit, environment, where each value comes from, what changes), having created
    nothing and called no AWS API; the run itself runs that same plan, and refuses what it would refuse,
    with the same line, before anything is opened. ``infra``: SkyPilot's override flag, 'aws' or
    'aws/REGION[/ZONE]': a SkyPilot file naming another cloud runs on AWS (tasks.load.parse), and its
    region is the run's. The region: ``region``, else the one ``infra`` names, else the task's
    (resources.region: SkyPilot's infra/region), else the configured one; the AMI: ``ami``, else the
    task's for that region (resources.ami, SkyPilot's image_id); the idle rule: the task's
    idle_timeout (SkyPilot's autostop), else 30 min idle where there is no max runtime
    (runs/plan/runplan.idle_seconds). A zone (from ``infra`` or the file) is chosen at launch, said in a warning.
    ``detach``: hand the run to AWS and return once its Auto Scaling group is made
    (runs/detached/launch.start: the record has status "detached", its bucket, group and deadline);
    the job runs, recovers from spot interruptions and ends its group with nobody watching.
    ``array`` (100, '0-99', '3,7,12'; over the task's own ``array:``), or the task's ``array:`` or
    ``sweep:``: run the task's ``run`` once per element over a pool of at most ``workers``
    instances (the task's max_workers, else 1), spot unless ``spot`` is False or the task says
    ``spot: false``, scheduled by Ray (ec2gpu/pool/), each element holding ``gpus_per_job`` GPUs
    and run again up to ``max_retries`` times when it exits non-zero;
    the record's ``pool`` has the element table (index, status, attempts, node, seconds, exit
    status, cost share) and the instance count over time. Needs Ray here (``pip install
    'ec2gpu[pool]'``). An array with ``detach`` returns once its driver runs on the pool's head
    (the record's "detached" True, its status "running"): the driver lets idle workers go, the
    head's agent puts the results in S3 and ends its instance, a worker ends with its head;
    `ec2gpu status RUN` and `ec2gpu fetch RUN` from this machine follow it (docs/pool.md).
    Raises as the module docstring says.
    """

    asked = with_flags(options or RunFlags(), flags)
    planned, ui = plan_run(task, asked, reporter, on_warning)
    if dry_run:  # this machine's files alone: no Context (no sandbox started, no AWS client made)
        return planned
    ready_here(planned)
    with backend.Context(planned.region, asked.sandbox, persistent=planned.persistent, note=ui.note) as ctx:
        return RunResult(start(ctx, planned, ui))


#: RunFlags' fields given as sequences: kept as tuples, so that a frozen RunFlags holds no list
_TUPLES = ("secrets", "allow_write_buckets", "ports")


def with_flags(options: RunFlags, flags: Mapping[str, Any]) -> RunFlags:
    """``options`` with ``flags`` ({RunFlags field: value}, api.run's keyword arguments) set over it
    (pure); a sequence given for secrets, allow_write_buckets or ports becomes a tuple. Raises
    TypeError for a name that is not one of RunFlags' fields, as a call with a wrong keyword does."""
    unknown = sorted(set(flags) - {f.name for f in fields(RunFlags)})
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}: not RunFlags fields")
    given: dict[str, Any] = {k: tuple(v) if k in _TUPLES else v for k, v in flags.items()}
    return replace(options, **given)


def plan_run(task: Union[str, Path, Task, None], flags: RunFlags, reporter: Optional[ReporterLike] = None,
             on_warning: Log = _quiet) -> tuple[RunPlan, ReporterLike]:
    """(the run's plan, its reporter): ``task`` (a task file path, a tasks.spec.Task, or None for
    ``flags.command``) loaded and made ready as ``flags`` ask (_prepare: its warnings said to
    ``on_warning``, what it takes from this machine and sends said to ``reporter``), then planned
    (runs/plan/runplan.plan: every value decided, everything that needs no AWS call checked).
    Opens no backend and calls no AWS API. Raises UsageError as ``run`` does before anything is created."""
    warned: list[str] = []

    def warn(text: str) -> None:
        warned.append(text)
        on_warning(text)

    runplan.infra_of(flags.infra, flags.region)  # the flag itself, before the task file it may be needed to read
    job, ui = _prepare(task, flags.command, flags.workdir, flags.name, flags.env or None, flags.secrets,
                       flags.max_upload, flags.include_secrets, reporter, warn, flags.workdir_outside,
                       _overrides(flags) or None, flags.infra, flags.allow_write_buckets, flags.ports)
    planned = runplan.plan(job, flags, settings_mod.load({"sandbox": flags.sandbox or None}), warnings=warned)
    for text in planned.warnings[len(warned):]:  # the plan's own (a zone --infra names)
        on_warning(text)
    return planned, ui


def _overrides(flags: RunFlags) -> dict[str, Any]:
    """The task's resources fields the flags replace (pure), so that what runs (engine.node_env)
    follows the flag: --gpu or --instance-type replace the task's choice, --allow-larger adds to it."""
    overrides: dict[str, Any] = (
        {"gpu": flags.gpu, "instance_type": None, "any_of": [], "ordered": []} if flags.gpu else
        {"instance_type": flags.instance_type.split(","), "gpu": None, "any_of": [], "ordered": []}
        if flags.instance_type is not None else {})
    if flags.allow_larger:
        overrides["allow_larger"] = True
    return overrides


def ready_here(planned: RunPlan) -> None:
    """Refuse (UsageError) before any backend is opened what ``planned`` needs of this machine and
    has not: for an array or a sweep, Ray here (pool/attempt.ray_here: none, or one too old) and, in
    the sandbox, its bind shim (sandbox/bindshim.for_sandbox, built into the sandbox's state
    directory of ``planned.settings.home``: the daemon a Context starts names that same file). Not
    part of the plan: a dry run shows an array's plan on a machine without Ray, and builds nothing."""
    if not planned.elements or planned.where != "new instances":
        return
    home = planned.settings.home
    from ..pool import attempt as pool_attempt  # fabric, boto3: see the module docstring
    pool_attempt.ray_here((lambda: bindshim.for_sandbox(home)) if planned.backend == "sandbox" else None)


def start(ctx: backend.Context, planned: RunPlan, ui: ReporterLike) -> RunRecord:
    """Run ``planned`` (runs/plan/runplan.RunPlan) in the open backend.Context ``ctx``: the one
    dispatcher of a run on new instances. An array or a sweep goes to the pool (runs/provision/
    pipeline.run_job with PoolOptions, handed pool/attempt.run_attempt: runs/ never imports pool/; Ray
    here and the sandbox's bind shim were checked by ``ready_here`` before ``ctx`` was opened), a
    detached run to AWS (runs/detached/launch.start), any other to runs/provision/pipeline.run_job.
    The options are runplan.options(planned): what the plan says, nothing else; ``ctx`` gives the
    clients, the backend and the settings (the task's disk size applied). Raises as ``run`` does."""
    from ..runs.provision import pipeline  # boto3: a dry run never comes here

    disk = planned.job.task.resources.disk_gib
    settings = ctx.settings.model_copy(update={"root_volume_gib": disk}) if disk else ctx.settings
    opts = runplan.options(planned)
    if isinstance(opts, PoolOptions):
        if planned.trainer is not None:  # a sweep's task: the built-in one, given the sandbox's data there
            topts = runplan.train_options(planned)  # the sandbox's data in its flags (runs/plan/sandbox_data.py)
            opts = replace(opts, task=pipeline.builtin_task(topts, sandbox=ctx.backend.is_sandbox))
        # the pool's strategy, handed to runs/ (which never imports pool/)
        from ..pool import attempt as pool_attempt  # fabric, boto3: see the module docstring
        return pipeline.run_job(ctx.aws, settings, opts, ui, ctx.backend, pool_attempt=pool_attempt.run_attempt)
    if planned.flags.detach:
        from ..runs.detached import launch
        return launch.start(ctx.aws, settings, opts, ui, ctx.backend)
    return pipeline.run_job(ctx.aws, settings, opts, ui, ctx.backend)


def exec(target: str, task: Union[str, Path, Task, None] = None, *,  # noqa: A001 - the command's name
         command: Optional[Sequence[str]] = None, workdir: Optional[str] = None,
         env: Optional[Mapping[str, Optional[str]]] = None, secrets: Sequence[str] = (),
         max_upload: Optional[int] = None, include_secrets: bool = False, out: Optional[Path] = None,
         region: Optional[str] = None, sandbox: bool = False, reporter: Optional[ReporterLike] = None,
         on_warning: Log = _quiet, as_typed: Optional[str] = None, workdir_outside: bool = False,
         infra: Optional[str] = None, allow_write_buckets: Sequence[str] = (), ports: Sequence[int] = ()) -> RunResult:
    """Run a task once on the standing instance or cluster ``target`` and leave it running; return
    its RunResult (the run record). A setup that already ran there is skipped; rsync sends only what changed.
    ``workdir_outside``, ``allow_write_buckets`` and ``ports`` as for ``run``; ``infra`` ('aws'): a
    SkyPilot file naming another cloud is read as for ``run`` (the target's own region and type are
    what run it)."""
    from ..runs.standing import hosts as standing  # boto3: see the module docstring

    runplan.infra_of(infra, None)
    job, ui = _prepare(task, command, workdir, None, env, secrets, max_upload, include_secrets, reporter,
                       on_warning, workdir_outside, None, infra, allow_write_buckets, ports)
    with backend.Context(region, sandbox) as ctx:
        return RunResult(standing.exec_task(ctx.aws, ctx.settings, job, ui, target, ctx.backend, out,
                                            mask_text(as_typed or f"ec2gpu.exec({target!r})", job.secret_values)))


def bake(task: Union[str, Path, Task], *, base: str = "dlami", name: Optional[str] = None,
         instance_type: Optional[str] = None, spot: bool = False, ssh_cidr: Optional[str] = None,
         ami: Optional[str] = None, region: Optional[str] = None, sandbox: bool = False,
         reporter: Optional[ReporterLike] = None, on_warning: Log = _quiet, as_typed: Optional[str] = None,
         workdir_outside: bool = False, max_runtime: Optional[int] = None,
         allow_write_buckets: Sequence[str] = ()) -> RunResult:
    """Bake a machine image holding ``task``'s setup (a task file, a Task, or "mnist" for the
    built-in job) from ``base`` ("dlami" or "ubuntu-24.04"); return the bake's RunResult, whose
    summary names the image. Runs of a task with the same setup then launch from the image.
    ``workdir_outside`` as for ``run`` (the workdir is baked into the image); ``allow_write_buckets``
    as for ``run`` (a task file is checked as a run checks it; a bake copies no S3 entry). ``max_runtime``:
    minutes after its launch when the builder terminates itself (runs/provision/bake.builder_max_runtime:
    default 120, at least 10).
    Raises as the module docstring says; UsageError for an unknown base or a max_runtime under 10
    before anything is created.
    """
    from ..runs.provision import bake as baking, pipeline  # boto3: see the module docstring

    limit = baking.builder_max_runtime(max_runtime)
    if str(task) == "mnist":
        job, ui = engine.builtin_job("mnist", []), reporter or Reporter()
    else:
        job, ui = _prepare(task, None, None, None, None, (), None, False, reporter, on_warning,
                           workdir_outside, allow_write_buckets=allow_write_buckets)
    with backend.Context(region, sandbox, persistent=True, note=ui.note) as ctx:  # the image outlives the command
        types = instance_type.split(",") if instance_type is not None else \
            resolve.instance_types(job.task.resources, ctx.settings.instance_type)
        data = sandbox_data.sandbox_data_args([]) if ctx.backend.is_sandbox and job.builtin == "mnist" else []
        plan = baking.plan(job, base, name, ctx.settings.home, ctx.backend.name, types[0].strip(),
                           ctx.backend.is_sandbox, data[1] if data else None)
        opts = BakeOptions(instance_type=",".join(types), spot=spot, ssh_cidr=ssh_cidr, ami=ami, task=job, plan=plan,
                           max_runtime_minutes=limit, command=as_typed or f"ec2gpu.bake({job.name!r})")
        # the task's disk size: a run cannot launch from an image with a smaller root volume than the image's
        disk = job.task.resources.disk_gib
        settings = ctx.settings.model_copy(update={"root_volume_gib": disk}) if disk else ctx.settings
        return RunResult(pipeline.run_job(ctx.aws, settings, opts, ui, ctx.backend))


def status(run_id: str, *, region: Optional[str] = None, sandbox: bool = False, log: Log = _quiet) -> RunStatus:
    """A detached run (`ec2gpu run --detach`) as AWS knows it, from any machine of the account, as a
    RunStatus whose fields are: its record (state.json) in the run store (state: pending, running, interrupted,
    succeeded, failed or cancelled; attempt, restarts, interruptions survived, instance, times, message) and its Auto
    Scaling group ("group": desired capacity and instances, None once gone). A run that is over has
    what it made removed by this call ("removed", by kind; runs/detached/follow.remove_finished).
    An array or a sweep this machine runs (or ran) is answered from its ledger and run directory
    instead: "array" has its counts, instances, ETA (s) and cost so far (USD), as its live line
    shows them (pool/attempt.local_status), with no AWS call. One whose controller was lost (or
    that was detached) also has "handover", read from the run store of the run's region: what its
    head handed over (the driver's state, how the hand-over went, when, and the final counts,
    which "array" then shows), None before it did.
    Raises UsageError for a bad run id, one the region's store does not hold, or a run in the
    foreground of this machine's ledger (its message points to `runs show` and `logs`);
    NoCredentials, AwsError."""
    from ..runs.detached import follow  # boto3: see the module docstring

    from ..pool import attempt as pool_attempt  # fabric, boto3: see the module docstring
    local = pool_attempt.local_status(settings_mod.load({"region": region, "sandbox": sandbox or None}).home, run_id)
    if local is not None and local["state"] == "controller-lost" and not local["array"]["final"]:
        with backend.Context(region or local.get("region"), sandbox, False, note=log) as ctx:  # its store: the run's region
            local["handover"] = _handed(ctx, local["run_id"], log)
            counts = (local["handover"] or {}).get("array")
            if counts:  # the driver's own counts, as its head handed them over
                local["array"].update(counts=counts, final=True)
    if local is not None:
        return RunStatus(local)
    from ..runs.settle import ledger
    row = ledger.in_foreground(settings_mod.load({"region": region, "sandbox": sandbox or None}).home, run_id)
    if row is not None:  # its record and log are this machine's: never looked for in the run store
        where = " --sandbox" if row.get("backend") == "sandbox" and row["status"] == "running" else ""
        raise UsageError(f"run {row['run_id']} runs in the foreground (it was not started with --detach): status "
                         "shows detached runs and arrays", f"its record: ec2gpu runs show {row['run_id']}; its log: "
                         f"ec2gpu logs {row['run_id']}{where}" + (" --follow" if row["status"] == "running" else ""))
    with backend.Context(region, sandbox, False, note=log) as ctx:
        return RunStatus(follow.status(ctx.aws, ctx.settings, run_id, log))


def _handed(ctx: backend.Context, run_id: str, log: Log) -> Optional[dict[str, Any]]:
    """What the head of run ``run_id`` (an array whose controller was lost) handed over to S3:
    {"state" (the driver's), "handover" (how it went), "handover_at", "array" (its counts)}, or
    None when nothing was (yet); an S3 error is said to ``log``, then None."""
    from ..runs.recover import handover  # boto3: see the module docstring
    try:
        got = handover.handed(ctx.aws, run_id)
    except AwsError as exc:
        log(f"the run store could not be read ({exc.message})")
        return None
    return None if got is None else {k: got.get(k) for k in ("state", "handover", "handover_at", "array")}


def cancel(run_id: str, *, wait: float = 180.0, region: Optional[str] = None, sandbox: bool = False,
           log: Log = _quiet) -> RunStatus:
    """Cancel a detached run: its agent stops the job and saves its outputs and log to S3 (waited
    for up to ``wait`` seconds), then its group (and instances), launch template, security group,
    key pair and role are removed (runs/detached/follow.cancel). Returns ``status``' RunStatus after it,
    with "removed" and "waited_s" among its fields. A run already over is only cleaned up. Raises as ``status``."""
    from ..runs.detached import follow  # boto3: see the module docstring

    if wait < 0:
        raise UsageError(f"--wait {wait} is negative", "give the seconds to wait for the agent, 0 or more")
    with backend.Context(region, sandbox, False, note=log) as ctx:
        return RunStatus(follow.cancel(ctx.aws, ctx.settings, run_id, log, wait_s=wait))
