"""A whole run on new instances: estimate -> provision -> attempts (runs/execute/attempt.drive, the
strategy picked per mode: foreground.ForegroundJob, the pool's PoolDriver handed in, bake.ImageBake)
-> teardown -> bill -> ledger (``run_job``).

`ec2gpu run TASK` and `ec2gpu train mnist` (the built-in task, tasks/builtin/mnist.yaml) both come
here. Whatever happens after the first resource is created (an error, Ctrl-C, SIGTERM),
``finally`` tears down everything the run created (provision.teardown) unless the user asked to
``keep`` it. Runs on standing instances are in standing/hosts.py, `--local` in provision/local.py.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar, cast

from ...aws import capacity, catalog, instances
from ...aws.session import Aws
from ...backend import AWS, Backend
from ...errors import AwsError, LedgerError, RemoteError, UsageError
from ...settings import Settings
from ...words import count
from .. import element_table, job_summary
from ..execute import engine, foreground
from ..options import BakeOptions, LaunchOptions, PoolOptions, RunOptions, TrainOptions
from ..options import mnist_args as mnist_args  # re-exported: the built-in trainer's flags live with TrainOptions
from ..plan import checks, costs, limits
from ..plan.costs import budget_hint as budget_hint, preset as preset  # re-exported: a run's estimate is decided there
from ..recover import handover, recovery
from ..settle import ledger
from . import bake
from . import resources as provision
from ..settle import record as run_record
from ..execute.reporter import Reporter as Reporter  # re-exported: pipeline.Reporter; its home is the light reporter.py
from ..execute.reporter import ReporterLike

if TYPE_CHECKING:
    from ..job import TaskJob

_Run = TypeVar("_Run", bound=RunOptions)

PHASES = ("requesting", "waiting for running", "waiting for SSH", "setup", "upload", "task setup", "Ray start", "running",
          "download", "terminating")
#: an array's attempt over the pool: pool/attempt.run_attempt, with foreground.run_attempt's arguments and
#: the run's record. api/tasks.start hands it to ``run_job``: the pool plugs into runs/, which never imports pool/.
PoolAttempt = Callable[..., dict[str, Any]]


def new_run_id() -> str:
    """A sortable, unique run id: YYYYmmdd-HHMMSS-xxxx (UTC)."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


#: how to give the sandbox MNIST, said when it has none (`ec2gpu train mnist`'s words; others pass theirs)
def with_task(opts: RunOptions, backend: Backend) -> RunOptions:
    """``opts`` with its task made: the built-in MNIST task for TrainOptions without one (its
    trainer flags give a sandbox instance this machine's data: the plan put them there,
    runs/plan/sandbox_data.py)."""
    return replace(opts, task=builtin_task(opts, sandbox=backend.is_sandbox))


def builtin_task(opts: RunOptions, sandbox: bool = False) -> TaskJob:
    """``opts.task``, or for TrainOptions without one the built-in MNIST task with its trainer
    flags (an engine.TaskJob). Raises ValueError for other options without a task."""
    if opts.task is not None:
        return opts.task
    if not isinstance(opts, TrainOptions):
        raise ValueError(f"{type(opts).__name__} without a task")
    return engine.builtin_job("mnist", mnist_args(opts, sandbox))


def check_estimate(aws: Aws, settings: Settings, opts: RunOptions, backend: str, ui: ReporterLike) -> costs.Estimate:
    """Estimate the run (costs.estimate_for, at the price AWS has now), tell the user, and refuse it
    (UsageError) as costs.refusal says: above ``opts.budget_usd``, or a job alone that would outlast
    ``opts.max_runtime_minutes`` (the instance would end itself first); or (costs.hourly_price) an
    ``opts.max_price`` below the spot price in every zone. Creates nothing. A planned run
    (runs/plan/runplan.py) had the same judgement at on-demand prices before any backend was
    opened: what is refused here first is what needs the spot price."""
    est = costs.estimate_for(aws, settings.home, opts, backend)
    if est.upper_bound:
        _say_at_most(est, opts, ui)
    else:
        job = cast("TaskJob", opts.task)  # run_job() sets opts.task before it asks for the estimate
        what = ("bake" if opts.bake else "elements" if isinstance(opts, PoolOptions) else
                "training" if job.builtin == "mnist" else "job")
        cost = "unknown (no price)" if est.cost_usd is None else f"${est.cost_usd:.4f}"
        ui.note(f"estimate: {cost} for ~{est.billed_seconds:.0f} s billed at "
                f"{'?' if est.usd_per_hour is None else f'{est.usd_per_hour:.4f}'} USD/h"
                f"{f' x {opts.nodes} nodes' if opts.nodes > 1 else ''} ({est.price_source}); "
                f"boot {est.boot_seconds:.0f} s, setup {est.setup_seconds:.0f} s, {what} {est.train_seconds:.0f} s, "
                f"teardown {est.teardown_seconds:.0f} s [{est.time_source}]")
        _say_limit(opts, ui)
    refused = costs.refusal(est, opts, aws)
    if refused is not None:
        raise refused
    return est


def _say_at_most(est: costs.Estimate, opts: RunOptions, ui: ReporterLike) -> None:
    """Say the estimate of a task whose job time nothing says (costs.at_most): its price per hour
    and the most it can cost, at its limit (runs/plan/limits.py); the run goes on unless its
    --budget refuses it (costs.refusal)."""
    why = est.time_source.removeprefix("unknown: ")
    price = "an unknown price (no price table for this region)" if est.usd_per_hour is None else \
        f"{est.usd_per_hour:.4f} USD/h{f' x {opts.nodes} nodes' if opts.nodes > 1 else ''} ({est.price_source})"
    bound = ("nothing bounds its cost (--max-runtime none)" if opts.max_runtime_minutes is None else
             f"so it costs at most {'an unknown amount' if est.cost_usd is None else f'${est.cost_usd:.2f}'}")
    ui.note(f"estimate: {why}, so its time is unknown (--expect 20m gives an estimate); it runs at {price}, "
            f"and its instances end themselves after {_limit_words(opts)}: {bound}")
    _say_limit(opts, ui)


def _limit_words(opts: LaunchOptions) -> str:
    return limits.Limit(opts.max_runtime_minutes, opts.limit_source or "").words()


def _say_limit(opts: LaunchOptions, ui: ReporterLike) -> None:
    """One line before launch: the run's limit and where it comes from (a user's task only)."""
    if opts.limit_source is None:
        return
    if opts.max_runtime_minutes is None:
        ui.note(f"max runtime: none ({opts.limit_source}); an instance left idle (no job, SSH connection or busy "
                f"GPU) ends itself after {limits.NO_LIMIT_IDLE_SECONDS // 60} min")
    else:
        ui.note(f"max runtime: {_limit_words(opts)} ({opts.limit_source}); the job gets SIGTERM before it, to "
                "checkpoint (--max-runtime 8h raises it, none removes it)")


def _status(exc: BaseException | None, spot: bool = False) -> str:
    if exc is None:
        return "completed"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, recovery.AttemptsExhausted):
        return "spot-interrupted" if spot else "failed"
    return "failed"


def _ledger(settings: Settings, row: Mapping[str, Any], ui: ReporterLike) -> None:
    """Write ``row`` to the ledger; a ledger problem is reported (once per run), never allowed to
    stop a run."""
    try:
        ledger.record(settings.home, row)
    except LedgerError as exc:
        said = f"warning: {exc.message}; this run goes on without it. To fix: {exc.hint}"
        if said not in ui.notes:  # once, not at the start and again at the end
            ui.note(said)


def run_job(aws: Aws, settings: Settings, opts: RunOptions, ui: ReporterLike, backend: Backend = AWS,
          pool_attempt: PoolAttempt | None = None) -> run_record.RunRecord:
    """Run ``opts`` on new instances end to end, whatever the job: a task under the agent
    (runs/execute/foreground.ForegroundJob), an array over the pool (``pool_attempt``) or an image
    bake (runs/provision/bake.ImageBake), each attempt through runs/execute/attempt.drive; return
    the run record (also saved as run.json).

    Shows the estimate first and refuses (UsageError, nothing created) a run above the budget. The
    run is in the ledger from its start; at the end it gets its status, its attempts (one per
    instance: a lost instance is replaced and the trainer resumes from its checkpoint, up to
    ``opts.attempts_allowed``), and billed seconds and cost from each instance's own launch and
    termination times. Raises UsageError before creating anything for a bad instance type or
    --checkpoint-uri; AwsError, CapacityError, RemoteError, WaitTimeout as they happen, and
    recovery.AttemptsExhausted (all after teardown); KeyboardInterrupt after teardown. Once the run
    has started, what it raises carries its record, ended and billed, as ``run_record`` (an array's
    element table in its ``pool``), and its cost was said (``cost_line``) before it.

    ``pool_attempt``: an array's attempt over the pool (pool/attempt.run_attempt), which api/tasks.start
    hands in for PoolOptions: runs/ never imports pool/. Raises ValueError for PoolOptions without it.
    """
    if isinstance(opts, PoolOptions) and pool_attempt is None:
        raise ValueError("an array runs over the pool: pass pool_attempt (pool/attempt.run_attempt)")
    opts, itype = check_options(opts, ui)
    opts = with_task(opts, backend)
    job = cast("TaskJob", opts.task)
    aws.check_credentials()
    est = check_estimate(aws, settings, opts, backend.name, ui)
    checked = capacity.check_quota(aws.client("service-quotas"), aws.ec2, itype.name, opts.spot, count=opts.nodes,
                                   log=ui.note)
    if checked:
        ui.note(f"vCPU quota {checked['quota']}: {checked['in_use']} in use + {checked['needed']} needed "
                f"<= {checked['value']:g}")
    if opts.bake is None and any(m.kind == "s3" for m in job.mounts):  # checked before anything is created
        provision.check_s3_access(aws, job)
    run_id = new_run_id()
    out = Path(opts.out or Path("runs") / run_id).resolve()
    prov = provision.Provisioned(run_id, bake=opts.bake is not None)
    mnist, (model, epochs) = job.builtin == "mnist" and opts.bake is None, preset(opts)
    record = run_record.new(run_id, opts.command, backend.name, out, instance_type=itype.name, gpu=itype.gpu,
                            market="spot" if opts.spot else "on-demand", task="bake" if opts.bake else job.name,
                            task_key="bake" if opts.bake else job.history_key,
                            model=model if mnist else None, epochs=epochs if mnist else None,
                            region=aws.region, estimated_cost_usd=None if est.upper_bound else est.cost_usd,
                            estimate=est.as_dict())
    _ledger(settings, record, ui)
    ui.note(followed_by(run_id, backend.is_sandbox, isinstance(opts, PoolOptions)))
    attempts: list[dict[str, Any]] = []
    record["attempts"] = attempts
    error: BaseException | None = None
    try:
        return _with_summary(record, _run_attempts(aws, settings, opts, run_id, ui, prov, out, backend, record,
                                                  pool_attempt))
    except handover.HandedOver:  # an array's --detach: its instances end themselves, and `ec2gpu ls`/`runs` settle it
        record.update({"detached": True, "instance_ids": prov.instance_ids, "phases": dict(ui.phases)})
        _ledger(settings, record, ui)  # "running" until then, its controller (this process) gone
        run_record.save(record, out)
        return record
    except BaseException as exc:
        error = exc
        exc.run_record = record  # type: ignore[attr-defined]  # what it cost, its element table: said on every path
        raise
    finally:
        if not record.get("detached"):
            _end_run(aws, settings, opts, prov, record, ui, out, error)


def followed_by(run_id: str, sandbox: bool, array: bool) -> str:
    """The first line of a run this command runs in the foreground (pure): its id, and the commands
    that follow it from another terminal (an array's progress by `status`, a job's log by `logs`)."""
    where = " --sandbox" if sandbox else ""
    how = f"ec2gpu status {run_id}{where}" if array else f"ec2gpu logs {run_id}{where} --follow"
    return f"run {run_id}: from another terminal, {how}; once it ended, ec2gpu runs show {run_id}"


def cost_line(record: Mapping[str, Any]) -> str:
    """What a run that did not complete cost (pure): 'run RUN failed: $0.0088 for 60 s billed ...',
    or that nothing was billed when no instance was launched."""
    head = f"run {record['run_id']} {record.get('status')}"
    if not record.get("attempts"):
        return f"{head}: no instance was launched, nothing billed"
    usd, billed = record.get("cost_usd"), record.get("billed_seconds")
    cost = "cost unknown (the bill could not be computed)" if usd is None or billed is None else \
        f"${usd:.4f} for {billed:.0f} s billed"
    return f"{head}: {cost} ({count(len(record['attempts']), 'instance')}); ec2gpu runs show {record['run_id']}"


def _end_run(aws: Aws, settings: Settings, opts: RunOptions, prov: provision.Provisioned,
             record: run_record.RunRecord, ui: ReporterLike, out: Path, error: BaseException | None) -> None:
    """The end of a run this command saw to its end: its attempts closed, what it made removed,
    the bill, the ledger and run.json. Raises AwsError when the run ended well but teardown left
    something behind."""
    attempts = record["attempts"]
    run_id = record["run_id"]
    _close_attempts(attempts, prov, error)
    _teardown_and_bill(aws, settings, opts, prov, record, ui)
    record.update({"instance_ids": prov.instance_ids, "status": _status(error, opts.spot),
                   "phases": dict(ui.phases),
                   "ended_at": datetime.now(timezone.utc).isoformat()})
    if isinstance(error, RemoteError) and error.exit_status is not None:
        record["exit_status"] = error.exit_status
    if record.get("pool"):  # an array's: each element's share of the bill just made
        element_table.with_cost_shares(record)
        record["element_seconds"] = element_table.element_seconds(record["pool"]["elements"])
        best = element_table.best_accuracy(record["pool"]["elements"])
        if best is not None and record.get("test_acc") is None:  # a sweep's result: its best element's
            record["test_acc"] = best[0]
    _ledger(settings, record, ui)
    if error is not None:  # a success says its cost in its record's table; a failure's is worth most
        ui.note(cost_line(record))
    if out.exists() or record["status"] == "completed":
        run_record.save(record, out)
    if error is None and record.get("teardown_failed"):
        raise AwsError(f"the run {record['status']}, but teardown left: {'; '.join(record['teardown_failed'])}",
                       f"remove it now: ec2gpu cleanup --region {aws.region} (everything carries ec2gpu:run "
                       f"{run_id}); the instances also terminate themselves after --max-runtime")


def _teardown_and_bill(aws: Aws, settings: Settings, opts: RunOptions, prov: provision.Provisioned,
                       record: run_record.RunRecord, ui: ReporterLike) -> None:
    """Remove what the run created (unless --keep) and bill its attempts into ``record``; never
    raises (what teardown could not remove is in record["teardown_failed"])."""
    attempts = record["attempts"]
    if opts.keep and prov.instances:
        ui.note(f"--keep: {', '.join(prov.instance_ids)} keeps running (and billing) until "
                f"`ec2gpu down {opts.name or 'ec2gpu-' + prov.run_id}` or {_limit_words(opts)} pass")
    elif prov.key_name or prov.security_group_id or prov.instances:
        record["teardown_failed"] = provision.teardown(aws, settings, prov, ui)["failed"]
        try:
            provision.bill(aws, settings, [a for a in attempts if "billed_seconds" not in a], prov, ui)
            record.update(cast(run_record.RunRecord, costs.totals(attempts)))
        except Exception as exc:  # noqa: BLE001 - a bill we cannot compute must not hide the run's end
            ui.note(f"warning: could not compute the bill ({type(exc).__name__}: {exc})")


def check_options(opts: _Run, ui: ReporterLike) -> tuple[_Run, catalog.InstanceType]:
    """Refuse bad options before any AWS call (runs/plan/checks.check_launch: UsageError, nothing
    created, no ledger row); return ``opts`` with its instance types in canonical names, and the
    first one's catalog entry. A planned run (runs/plan/runplan.py) was refused the same way before
    its backend was opened; this guards the operations that are not planned there."""
    types = checks.check_launch(opts.instance_type, spot=opts.spot, name=opts.name, spot_fallback=opts.spot_fallback,
                                max_price=opts.max_price, checkpoint_uri=opts.checkpoint_uri, ssh_cidr=opts.ssh_cidr,
                                warn=ui.note)
    return replace(opts, instance_type=",".join(types)), catalog.lookup(types[0])


def _close_attempts(attempts: list[dict[str, Any]], prov: provision.Provisioned, error: BaseException | None) -> None:
    """Give every attempt row its end: instances launched but stopped before their attempt began
    (Ctrl-C while requesting) get a row, and rows still "running" end as the run did."""
    known, n = {a["instance_id"] for a in attempts}, max((a["attempt"] for a in attempts), default=0) + 1
    for inst in prov.instances:
        if inst.id not in known:
            attempts.append(recovery.attempt_row(n, inst))
    for att in attempts:
        if att["ended"] == "running":
            att["ended"] = "completed" if error is None else \
                "stopped by the user" if isinstance(error, KeyboardInterrupt) else f"failed: {error}"[:200]


def _with_summary(record: run_record.RunRecord, summary: dict[str, Any]) -> run_record.RunRecord:
    """``record`` with the job's summary.json ({} when it wrote none) and the ledger columns the
    built-in trainer's summary fills (test accuracy, epochs, train seconds, samples/s), as
    job_summary.columns checks them: a summary that failed its checks is kept marked, and a figure
    that is not a valid one is None."""
    record.update(cast(run_record.RunRecord, {"exit_status": 0, **job_summary.columns(summary)}))
    return record


def _run_attempts(aws: Aws, settings: Settings, opts: RunOptions, run_id: str, ui: ReporterLike, prov: provision.Provisioned,
                  out: Path, backend: Backend, record: run_record.RunRecord,
                  pool_attempt: PoolAttempt | None = None) -> dict[str, Any]:
    """Attempt after attempt (recovery.py) of ``opts.task`` until its job finishes; return its summary.

    Raises recovery.AttemptsExhausted when the last attempt allowed is interrupted too.
    """
    attempts = record["attempts"]
    checkpoints = recovery.DirCheckpoints(remote="", local=out / "checkpoints", log=ui.note,
                                          **recovery.s3_home(aws, opts.checkpoint_uri, run_id))
    # a job's outputs outlive this controller (runs/recover/handover.py): made beside provisioning
    detach = isinstance(opts, PoolOptions) and opts.detach
    plan = None if isinstance(opts, BakeOptions) else \
        handover.start(aws, settings, run_id, opts.max_runtime_minutes, ui.note, wait_s=0 if detach else None)
    if detach and plan is not None and plan.result() is None:  # before anything is launched
        raise UsageError("a detached array needs the region's run store, where its head puts the results, and it "
                         "could not be used (the warning above says why)", "run it without --detach")
    avoid: list[str] = []
    for n in range(1, opts.attempts_allowed + 1):
        if n > 1:
            ui.note(f"attempt {n} of {opts.attempts_allowed}: launching a replacement"
                    + (f" (zones {', '.join(avoid)} last)" if avoid else ""))
        try:
            nodes = provision.provision(aws, settings, opts, run_id, ui, prov, avoid_zones=avoid)
        except instances.EndedBeforeRunning as lost:  # reclaimed at launch: this attempt again, elsewhere
            _ended_at_launch(aws, settings, n, lost, prov, attempts, avoid, ui)
            _ledger(settings, record, ui)
            continue
        instance = nodes[0]
        mine = [recovery.attempt_row(n, i, k if opts.nodes > 1 else None) for k, i in enumerate(nodes)]
        attempts += mine
        got = catalog.CATALOG.get(instance.type)
        record.update({"instance_type": instance.type, "gpu": got.gpu if got else None,
                       "market": instance.market, "instance_id": instance.id,
                       "instance_ids": prov.instance_ids, "zone": attempts[-1]["zone"],
                       "launched_at": prov.instances[0].launched_at.isoformat()})
        _ledger(settings, record, ui)
        try:
            if isinstance(opts, BakeOptions):
                return bake.bake_attempt(aws, settings, opts, run_id, ui, prov, nodes, out, backend, n, checkpoints)
            if isinstance(opts, PoolOptions) and pool_attempt is not None:  # run_job() refused one without it
                return pool_attempt(aws, settings, opts, run_id, ui, prov, nodes, out, backend, n, checkpoints,
                                    cast(dict[str, Any], record), plan, shutdown=not opts.keep)
            return foreground.run_attempt(aws, settings, opts, run_id, ui, prov, nodes, out, backend, n, checkpoints,
                                          plan, shutdown=not opts.keep)
        except recovery.Interrupted as why:
            # the instance ended itself after handing the job's outputs over while this controller was away
            # (an array's is taken in pool/attempt.py, which has its element table)
            made = plan is not None and plan.done() and plan.result() is not None and not isinstance(opts, PoolOptions)
            adopted = handover.adopt(aws, run_id, out, opts.task, settings.download_limits, ui.note) if made else None
            if adopted is not None:
                return adopted
            mine = [a for a in attempts if a["attempt"] == n]  # with any an array's pool added (pool/grow.py)
            ui.note(f"attempt {n} interrupted on {', '.join(a['instance_id'] for a in mine)} "
                    f"({mine[0]['zone']}): {why.reason}")
            if mine[0]["zone"]:
                avoid.append(mine[0]["zone"])
            provision.end_instances(aws, prov, [a["instance_id"] for a in mine], ui)
            for att in mine:
                att["ended"] = why.reason
            provision.bill(aws, settings, mine, prov, ui)
            _ledger(settings, record, ui)
    raise recovery.exhausted(attempts, checkpoints.local, opts.spot, opts.attempts_allowed)


def _ended_at_launch(aws: Aws, settings: Settings, n: int, lost: instances.EndedBeforeRunning,
                     prov: provision.Provisioned, attempts: list[dict[str, Any]], avoid: list[str],
                     ui: ReporterLike) -> None:
    """Attempt ``n`` whose instance (or one of its nodes) ended before running (``lost``): the
    others of its launch ended too and billed as an interrupted attempt's are (from their own
    times: one that never ran costs nothing, as EC2 bills from running), their rows added to
    ``attempts``; the zones it was in tried last (``avoid``)."""
    ui.note(f"attempt {n}: {lost.message}")
    launch = [i for i in prov.instances if i.id not in prov.ended]
    for i in launch:
        if i.zone and i.zone not in avoid:
            avoid.append(i.zone)
    if launch:
        provision.end_instances(aws, prov, [i.id for i in launch], ui)
    mine = [recovery.attempt_row(n, i, k if len(launch) > 1 else None) for k, i in enumerate(launch)]
    never = [att for att in mine if att["instance_id"] in lost.ended]
    for att in mine:
        state, code = lost.ended.get(att["instance_id"], ("", None))
        att["ended"] = f"ended before running ({state}{f': {code}' if code else ''})" if state \
            else "another node of its launch ended before running"
    for att in never:  # EC2 bills an instance from running: nothing
        att.update({"billed_seconds": 0.0, "compute_usd": 0.0, "public_ipv4_usd": 0.0, "ebs_usd": 0.0,
                    "cost_usd": 0.0, "price_source": "none: it ended before running"})
    provision.bill(aws, settings, [att for att in mine if att not in never], prov, ui)
    attempts += mine


def as_json(record: Mapping[str, Any]) -> str:
    return json.dumps(record, indent=2, default=str)

