"""One attempt of an array or a sweep over a pool of instances, scheduled by Ray.

runs/provision/pipeline.py provisions the pool's instances (up to ``opts.nodes``: as many as EC2
has, pool/grow.py; the run's security group letting members reach each other and nobody else
reach more than SSH) and calls ``run_attempt``, which api/tasks.start hands it (runs/ never
imports pool/): the one attempt lifecycle (runs/execute/attempt.py) with this module's
``PoolDriver`` as its strategy. Every node is opened, set up and given the workdir as for any run,
Ray starts on each (pool/ray_nodes.py; ec2gpu/pool/node.py: node 0 the head), and
the driver (ec2gpu/pool/driver.py) runs on the head under the agent. While it runs, the controller
reads the driver's table.json (ec2gpu/runs/element_table.py) every POLL_S seconds (pool/follow.py): the progress line,
and the pool's shrinking: once no element waits, each worker whose node runs none is released
(its Ray node stopped, its instance terminated), so the last element does not keep every
instance billing. A worker that is lost (a spot interruption) takes its running elements with it:
Ray runs them again elsewhere. The outputs (``outputs/<index>/``), each element's log and the
driver's record come home from the head; the run record gets ``pool``: the element table and the
instance count over time.
"""
from __future__ import annotations

import json
import math
import time
from concurrent.futures import Future
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import words
from ..errors import Ec2GpuError, LedgerError, RemoteError, UsageError, WaitTimeout
from ..remote import files, jobs, sync
from ..runs import element_table, job_summary
from ..runs.execute import attempt as lifecycle
from ..runs.execute import nodes as run_nodes
from ..runs.job_summary import mask_text
from ..runs.plan.checks import slots_per_node as slots_per_node  # how many a node runs: the run's plan decides it
from ..runs.recover import handover as run_handover  # as run_handover: run_attempt's ``handover`` is the hand-over itself
from ..runs.recover import reconcile, recovery
from ..runs.settle import ledger
from ..tasks import arrays
from ..wire import bounded_json
from ..wire.shell import HANDOFF, INTERACTIVE, PROLOGUE
from . import follow, grow, ray_nodes
from .ray_nodes import ray_here as ray_here  # re-exported: api/ checks Ray here through pool/attempt.ray_here

if TYPE_CHECKING:
    from ..aws.instances import Instance
    from ..aws.session import Aws
    from ..backend import Backend
    from ..runs.job import TaskJob
    from ..runs.execute.nodes import Node
    from ..runs.execute.reporter import ReporterLike
    from ..runs.options import PoolOptions
    from ..runs.job import Provisioned
    from ..runs.recover.handover import Handover
    from ..runs.recover.recovery import DirCheckpoints
    from ..settings import Settings

HERE = Path(__file__).parent
MAX_ELEMENT_OUTPUT_BYTES = 256 * 1024 * 1024  # one element's outputs, carried home through the head
MAX_ELEMENT_LOG_BYTES = 4 * 1024 * 1024  # one element's log kept on the head (its last bytes)


def pool_spec(run_id: str, opts: PoolOptions, job: TaskJob, address: str, gpus_per_job: int,
              controller_silent_s: float | None = None) -> dict[str, Any]:
    """pool.json, the driver's input (pure); ``controller_silent_s``: the hand-over wait, after
    which a silent controller counts as lost and the driver shrinks the pool itself (driver._release)."""
    return {"run_id": run_id, "address": address, "head_ip": address.rsplit(":", 1)[0], "gpus_per_job": gpus_per_job,
            "max_retries": opts.max_retries,
            "elements": [e.as_dict() for e in opts.elements],
            "script": ["bash", "-c", INTERACTIVE, HANDOFF, PROLOGUE + job.task.run, job.name, *job.args],
            "max_output_bytes": MAX_ELEMENT_OUTPUT_BYTES, "max_log_bytes": MAX_ELEMENT_LOG_BYTES,
            **({"controller_silent_s": controller_silent_s} if controller_silent_s is not None else {})}


def gpus_per_job(opts: PoolOptions, node_gpus: int) -> int:
    """GPUs each element holds (pure): ``--gpus-per-job``/``pool.gpus_per_job``, else all the
    node's (the task's GPU count); at least 1 (a node declares its type's GPUs to Ray). Raises
    UsageError when it is more than a node has."""
    want = opts.gpus_per_job or max(1, node_gpus)
    if node_gpus and want > node_gpus:
        raise UsageError(f"--gpus-per-job {want}: the pool's instances have {words.count(node_gpus, 'GPU')} each",
                         f"ask for at most {node_gpus}, or for a larger instance type (--gpu A10G:{want})")
    return want


def run_attempt(aws: Aws, settings: Settings, opts: PoolOptions, run_id: str, ui: ReporterLike, prov: Provisioned,
                instances_: list[Instance], local_out: Path, backend: Backend, n: int,
                checkpoints: DirCheckpoints, record: dict[str, Any],
                handover: Future[Handover | None] | Handover | None = None, shutdown: bool = False) -> dict[str, Any]:
    """One attempt of the array ``opts.elements`` over the pool ``instances_`` (node 0 the head);
    ``record["pool"]`` gets the element table, counts and the instance count over time. Returns {}
    (an array has no one summary.json). ``handover`` (runs/recover/handover.py; its Future while
    it is being made): if this controller is lost, the head's agent puts the elements' outputs
    (``out/<index>/``), the driver's log and its record in S3 once the driver ends, and with
    ``shutdown`` ends the head (the driver lets idle workers go, and a worker ends with its head:
    driver._release, node.py). With
    ``opts.detach`` this controller leaves as soon as the driver runs: the driver shrinks the pool
    itself and the head's agent hands over at once (raises handover.HandedOver then, with
    ``record["pool"]`` the pool as it started). Raises RemoteError when an element failed (after
    every result came home) or Ray could not start, recovery.Interrupted when the head is lost.
    The lifecycle is runs/execute/attempt.drive's; PoolDriver is what an array does in it."""
    job = cast("TaskJob", opts.task)
    done: dict[str, dict[str, Any]] = record.setdefault("pool_done", {})  # index -> its record, outputs home
    skipped = sorted(int(k) for k in done)
    if done:  # an earlier attempt's head was lost: what it finished (and brought home) is not run again
        opts = replace(opts, elements=tuple(e for e in opts.elements if str(e.index) not in done))
        ui.note(f"pool: {words.count(len(done), 'element')} finished in an earlier attempt, their outputs home; "
                f"running the other {len(opts.elements)}")
    a = lifecycle.new(aws, settings, run_id, ui, prov, backend, job, instances_, local_out, n)
    # every node the pool had (a lost one's cost and index kept); a.nodes: those the next steps run on
    pool = follow.Pool(list(a.nodes), members={nd.instance_id: nd for nd in a.nodes},
                       write_back=any(m.write_back for m in job.mounts))
    pool.count()
    return lifecycle.drive(a, PoolDriver(opts, pool, record, done, skipped, shutdown), handover)


class PoolDriver(lifecycle.Strategy[dict[str, Any]]):
    """The array's attempt as a strategy of runs/execute/attempt.py: Ray on every node after the
    task's setup, the driver on the head under the agent, the pool followed (shrunk, grown, its
    results brought home as they finish), the element table home; a lost head's hand-over adopted."""

    def __init__(self, opts: PoolOptions, pool: follow.Pool, record: dict[str, Any], done: dict[str, dict[str, Any]],
                 skipped: list[int], shutdown: bool) -> None:
        self.opts, self.pool, self.record, self.done, self.skipped = opts, pool, record, done, skipped
        self.shutdown, self.per_job = shutdown, 1
        self.addresses: dict[int, str] = {}  # node index -> private address (a replacement's added)
        self.address = self.token = ""  # the head's Ray (IP:PORT) and the pool's Ray token
        self.status: dict[str, Any] | None = None

    def setup(self, a: lifecycle.Attempt) -> None:
        """The task's setup, this machine's Ray on every node, Ray started with a new token; a
        worker lost meanwhile is dropped (``lost``)."""
        job = a.job
        self.addresses = {nd.index: address for nd, address in zip(a.nodes, a.addresses, strict=True)}
        if job.task.setup:
            with a.ui.phase("task setup"):  # as a run's (runs/execute/attempt.Strategy.setup)
                lifecycle.task_setup(a, self)
        with a.ui.phase("Ray start"):
            want = ray_nodes.ray_version()
            lifecycle.on_nodes(a, "Ray start", lambda nd: ray_nodes.check_ray(nd, want, a.say(nd)), self)
            self.token = ray_nodes.new_token()  # this attempt's pool's, to its nodes over SSH only
            self.address = ray_nodes.start_ray(a.nodes, self.addresses, job, a.ui.note, self.token,
                                               end_with_head=self.shutdown,
                                               each=lambda fn, nodes: lifecycle.on_nodes(a, "Ray start", fn, self, nodes))
        self.per_job = gpus_per_job(self.opts, ray_nodes.node_gpus(a.nodes[0], job))
        self.pool.slots_per_node = max(1, ray_nodes.node_gpus(a.nodes[0], job) // self.per_job)

    def lost(self, a: lifecycle.Attempt, losses: list[recovery.Loss]) -> None:
        """Nodes lost before the driver runs (recovery.after_loss): lost workers are dropped, and
        the pool goes on without them (follow.follow launches a replacement for each while
        elements wait: ``pool.lost``); a lost head ends the attempt (recovery.Interrupted: the run's
        recovery launches a new pool)."""
        if recovery.after_loss(losses, pool=True) != recovery.DROP:
            raise recovery.interrupted_by(losses)
        for x in losses:
            a.ui.note(f"pool: worker {x.words()}; dropped, the others go on (a replacement is launched while "
                      "elements wait)")
        follow.drop(a.aws, self.pool, a.drop({x.instance_id for x in losses}), a.ui)
        for x in losses:
            self.addresses.pop(x.node, None)

    def watched(self, a: lifecycle.Attempt) -> list[Node]:
        # a controller that stays: its heartbeat (detached, none: the head is on its own)
        return [] if self.opts.detach else [a.nodes[0]]

    def run(self, a: lifecycle.Attempt) -> None:
        """The driver started on the head; unless detached, the pool followed until it ends."""
        opts, job, ui, head, pool, plan = self.opts, a.job, a.ui, a.nodes[0], self.pool, a.plan
        with ui.phase("running"):  # the first figures at once: `ec2gpu status RUN` knows it for an array
            follow.write_progress(a.local_out / follow.PROGRESS_FILE, {
                "done": 0, "total": len(opts.elements), "instances": len(pool.members), "at": round(time.time(), 3),
                "counts": {"done": 0, "failed": 0, "running": 0, "queued": len(opts.elements)}})
            spec = pool_spec(a.run_id, opts, job, self.address, self.per_job, plan.wait_s if plan else None)
            ray_nodes.start_driver(head, spec, opts, a.settings,
                                   plan.document(True, self.shutdown, sorted(job.task.secrets), pool=True) if plan else None)
            ui.note(f"pool: {records_words(opts)} over {words.count(len(a.nodes), 'instance')}, "
                    f"{words.count(self.per_job, 'GPU')} each; the "
                    f"driver runs on the head ({self.addresses[0]})")
            if not opts.detach:
                self._follow(a, pool, head)
        if opts.detach:  # after the phase: it ended as it should (its line says "done", not "stopped")
            self.record["pool"] = {**_pool_record(pool, None, opts, self.per_job), "skipped": self.skipped,
                                   "ended_at": None}
            raise run_handover.HandedOver(a.run_id)

    def _follow(self, a: lifecycle.Attempt, pool: follow.Pool, head: Node) -> None:
        address, token, job, limits = self.address, self.token, a.job, a.settings.download_limits
        pool.usd_per_hour = follow.prices_of(a.aws, a.settings, pool.nodes)
        growing = grow.Context(a.aws, a.settings, self.opts, a.run_id, a.prov, a.backend, job, a.n,
                               self.record.setdefault("attempts", []), a.config,
                               lambda nd, at, log: ray_nodes.join_ray(nd, at, address, job, log, token, self.shutdown))
        self.status = follow.follow(a.aws, pool, head, self.opts, self.addresses, a.ui,
                                    lambda st: _bring_done(head, st, self.done, job, a.local_out, a.config, a.ui, limits),
                                    a.local_out / follow.PROGRESS_FILE, growing)

    def collect(self, a: lifecycle.Attempt) -> dict[str, Any]:
        """The MOUNT-mode file_mounts written back, the results and the element table home."""
        pool, head, ui = self.pool, a.nodes[0], a.ui
        with ui.phase("download"):
            if pool.write_back:  # the nodes still in the pool (the others wrote theirs back as they left)
                run_nodes.parallel(lambda nd: follow.write_back(nd, ui), list(pool.members.values()))
            self.status = _home(head, a.job, a.local_out, a.config, ui, self.opts, self.done,
                                a.settings.download_limits) or self.status
            if a.plan is not None:
                lifecycle.mark([head], "collected")
        return _conclude(self.record, pool, self.status, self.opts, self.per_job, self.skipped, a.local_out, head)

    def close(self, a: lifecycle.Attempt) -> None:
        """Every node the pool had closed (a replacement is the pool's, not in ``a.nodes``), then
        Strategy's close."""
        for nd in self.pool.nodes:
            nd.close()
        super().close(a)

    def failed(self, a: lifecycle.Attempt, exc: Exception) -> dict[str, Any]:
        """A lost head (EC2 says so: recovery.lost, asked for a few seconds after a dropped
        connection) explains the failure: recovery.Interrupted, unless its agent handed over a
        driver that ended, whose results are adopted from S3."""
        if not isinstance(exc, (*jobs.CONNECTION_ERRORS, WaitTimeout, RemoteError, recovery.Interrupted)):
            raise exc
        lost = recovery.lost(a.nodes[0].watch, exc)  # a lost head explains it (EC2 asked a few seconds)
        if lost is None:
            raise exc
        if a.plan is None or not _handed_over(a.aws, a.run_id):  # lost: what it had not brought home runs again
            raise lost from (None if lost is exc else exc)
        pool = self.pool
        pool.left_at.setdefault(a.nodes[0].instance_id, round(time.time(), 3))
        return _conclude(self.record, pool, _adopt(a.aws, a.run_id, self.opts, a.local_out, self.done,
                                                   a.settings.download_limits, a.ui),
                         self.opts, self.per_job, self.skipped, a.local_out, a.nodes[0])


def _conclude(record: dict[str, Any], pool: follow.Pool, status: dict[str, Any] | None, opts: PoolOptions, per_job: int,
              skipped: list[int], local_out: Path, head: Node) -> dict[str, Any]:
    """The run record's ``pool`` (the element table, counts, the instance count over time); {}
    when every element succeeded. Raises RemoteError naming the first failed element (and the
    ``--array`` that runs the failed ones again), or when the table did not come home."""
    record["pool"] = {**_pool_record(pool, status, opts, per_job), "skipped": skipped}
    failed = [e for e in status["elements"] if e["status"] != "succeeded"] if status else []
    if status is None or failed:
        first = failed[0] if failed else None
        raise RemoteError(f"{len(failed) if status else 'the'} element(s) of the array failed"
                          + (f", first: element {first['index']} (exit status {first['exit_status']}, "
                             f"{words.count(first['attempts'], 'attempt')})" if first
                             else ": the pool's record did not come home"),
                          f"its log: {local_out / 'logs'}; run those again with --array "
                          + ",".join(str(e["index"]) for e in failed[:20]),
                          command="pool", host=head.host, exit_status=first["exit_status"] if first else None,
                          tail="\n".join(first["tail"]) if first else "")
    return {}


def _handed_over(aws: Aws, run_id: str) -> bool:
    """Whether the lost head's agent handed over a driver that ended (runs/recover/handover.ended):
    the head ended itself while this controller was away (a laptop asleep past the wait). An S3
    error reads as no: the elements not brought home run again, as for any lost head."""
    try:
        return run_handover.ended(aws, run_id)
    except Ec2GpuError:
        return False


def _adopt(aws: Aws, run_id: str, opts: PoolOptions, local_out: Path, done: dict[str, dict[str, Any]],
           limits: Any, ui: ReporterLike) -> dict[str, Any] | None:
    """What the head handed over while this controller was away, brought home from S3 rather than
    run again (runs/recover/handover.fetch): the outputs (``outputs/<index>/``), the element logs
    and table, the table checked against ``opts.elements`` and completed as _home completes it.
    Returns the table, None when it did not come (an S3 error, or not accepted)."""
    job = cast("TaskJob", opts.task)
    try:
        got = run_handover.fetch(aws, run_id, local_out, limits, ui.note, [e.as_dict() for e in opts.elements])
    except Ec2GpuError as exc:
        ui.note(f"warning: what the pool's head handed over could not be read ({exc.message})")
        return None
    status = got["array"] if got else None
    if status is None:
        return None
    ui.note("the pool's head ended itself after handing the array's results over to S3 while this command was "
            "away: they are home, and its elements are not run again")
    _mask_logs(local_out / "logs", job)  # the agent masked them too: this machine's rule, as for any log home
    return _complete(follow.masked(status, job), done, job, local_out)


def records_words(opts: PoolOptions) -> str:
    return arrays.describe(list(opts.elements))


def _mask_logs(directory: Path, job: TaskJob) -> None:
    """The element logs that came home to ``directory``, each secret value of the task masked
    (each log is at most MAX_ELEMENT_LOG_BYTES: the driver keeps its last bytes)."""
    if not job.secret_values or not directory.is_dir():
        return
    for path in directory.glob("*.log"):
        if path.is_file() and not path.is_symlink():
            text = path.read_text(encoding="utf-8", errors="replace")
            masked = "".join(mask_text(line, job.secret_values) for line in text.splitlines(keepends=True))
            if masked != text:
                tmp = path.with_name(f".{path.name}.part")
                tmp.write_text(masked)
                tmp.replace(path)


def local_status(home: Path, run_id: str) -> dict[str, Any] | None:
    """An array's or a sweep's status, for `ec2gpu status RUN` on the machine that runs it (None
    for a run that is no array, or that this machine's ledger does not hold): the ledger's state
    ("controller-lost" for a running one whose controller process is gone, as `ec2gpu runs` settles
    it; "detached" True when it left on purpose, `run --detach`) and cost, and "array": the
    counts, instances, ETA (s) and cost so far (USD) of the live line (its progress.json), or once
    the run is over the driver's final counts (pool.json; "final" True). Files that do not parse
    read as absent."""
    try:
        row = ledger.get(home, run_id)
    except (UsageError, LedgerError):
        return None
    if row.get("status") == "detached" or row.get("controller") is None:  # a detached run's is in S3
        return None
    where = Path(str(row.get("artifacts") or "")) if row.get("artifacts") else None
    live = _json_file(where / follow.PROGRESS_FILE) if where else None
    final = _json_file(where / "pool.json") if where else None
    if live is None and final is None:
        return None
    array: dict[str, Any] = {"instances": None, "eta_s": None, "cost_so_far_usd": None, "updated_at": None}
    if live is not None:
        array.update({k: _figure(live.get(k)) for k in ("instances", "eta_s", "cost_so_far_usd", "total")})
        at = _figure(live.get("at"))
        array["updated_at"] = datetime.fromtimestamp(at, timezone.utc).isoformat() if at and at < 1e11 else None
    array["final"] = row["status"] != "running" and final is not None  # else the live line's, as last written
    counts = ((final if array["final"] else live or final) or {}).get("counts")
    array["counts"] = element_table.counts_of(counts)
    if row["status"] != "running":
        array.update(instances=0, eta_s=None)
    state = reconcile.LOST if row["status"] == "running" and reconcile.controller_gone(row) else row["status"]
    if state != row["status"]:  # its controller is gone: what is left running is not known here
        array.update(instances=None, eta_s=None)
    detached = ((_json_file(where / "run.json") if where else None) or {}).get("detached") is True  # --detach
    return {"run_id": row["run_id"], "state": state, "task": row.get("task"), "array": array,
            "cost_usd": row.get("cost_usd"), "artifacts": str(where), "detached": detached,
            "region": row.get("region")}


def _figure(value: object) -> int | float | None:
    """``value`` when it is a finite number from 0 to 1e12 (not a bool), else None (pure)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= 1e12:
        return value
    return None


def _json_file(path: Path) -> dict[str, Any] | None:
    try:  # the run directory's records, as this tool wrote them (the element table: the driver's, checked)
        got = bounded_json.loads(path.read_bytes(), max_bytes=element_table.MAX_TABLE_BYTES, allow_nan=True)
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def element_patterns(patterns: list[str]) -> list[str]:
    """The task's ``outputs`` globs (relative to an element's $EC2GPU_OUTPUT_DIR) as globs of the
    head's ``out/``, where each element's outputs are ``INDEX/...`` (pure): one with a slash is
    anchored (gitignore), so it is anchored one level down; one without matches at any depth."""
    out = []
    for p in patterns:
        neg, body = (p.startswith("!"), p[1:] if p.startswith("!") else p)
        if "/" in body.rstrip("/"):
            body = "/*/" + body.lstrip("/")
        out.append(("!" if neg else "") + body)
    return out


def _bring_done(head: Node, status: dict[str, Any], done: dict[str, dict[str, Any]], job: TaskJob, local_out: Path,
                config: Path, ui: ReporterLike, limits: Any) -> None:
    """The outputs and logs of the elements that succeeded since the last look, home now (rsync
    sends only what is new), so that a lost head loses none of them: ``done`` gets their records
    (the next attempt skips them). Raises the connection's errors (a lost head)."""
    new = [e for e in status["elements"] if e["status"] == "succeeded" and str(e["index"]) not in done]
    if not new:
        return

    def warn(line: str) -> None:
        ui.note(f"warning: {line}")
    try:
        sync.pull(head.conn, f"{head.run_dir}/out", local_out / "outputs", element_patterns(job.task.outputs), config,
                  head.instance_id, limits, warn=warn)
        sync.pull(head.conn, f"{head.run_dir}/pool/logs", local_out / "logs", [], config, head.instance_id,
                  files.Limits(), warn=warn)
    except RemoteError as exc:  # a transfer that failed: tried again at the next look, and at the end
        warn(f"finished elements' outputs not brought home yet ({exc.message})")
        return
    _mask_logs(local_out / "logs", job)
    for e in new:
        done[str(e["index"])] = e


def _home(head: Node, job: TaskJob, local_out: Path, config: Path, ui: ReporterLike,
          opts: PoolOptions, done: dict[str, dict[str, Any]], limits_: Any) -> dict[str, Any] | None:
    """Outputs (``outputs/<index>/``), element logs (``logs/<index>.log``) and the driver's
    record (``pool.json``) home from the head; the record as checked, with the elements an
    earlier attempt finished (``done``) in it."""
    limits = files.Limits()
    names, how = sync.pull(head.conn, f"{head.run_dir}/out", local_out / "outputs", element_patterns(job.task.outputs),
                           config, head.instance_id, limits_, warn=lambda line: ui.note(f"warning: {line}"))
    ui.note(f"outputs: {words.count(len(names), 'file')} brought home" + (f" by {how}" if names else "") +
            f" to {local_out / 'outputs'}")
    sync.pull(head.conn, f"{head.run_dir}/pool/logs", local_out / "logs", [], config, head.instance_id,
              limits, warn=lambda line: ui.note(f"warning: {line}"))
    _mask_logs(local_out / "logs", job)
    local_out.mkdir(parents=True, exist_ok=True)
    run_nodes.copy_log(head.conn, f"{head.run_dir}/job.log", local_out / "job.log",
                       lambda line: mask_text(line, job.secret_values))  # the driver's: `ec2gpu logs RUN`
    status = follow.read_status(head, opts, ui)
    return _complete(status, done, job, local_out) if status is not None else None


def _complete(status: dict[str, Any], done: dict[str, dict[str, Any]], job: TaskJob, local_out: Path
              ) -> dict[str, Any]:
    """The driver's table ``status`` with the elements an earlier attempt finished (``done``) in
    it, each element's test accuracy where its outputs say (_accuracies), written to
    ``local_out``/pool.json; ``done`` gets the ones that succeeded."""
    now = {e["index"] for e in status["elements"]}
    earlier = [e for k, e in done.items() if int(k) not in now]
    status["elements"] = sorted(status["elements"] + earlier, key=lambda e: e["index"])
    status["counts"]["done"] += len(earlier)
    done.update({str(e["index"]): e for e in status["elements"] if e["status"] == "succeeded"})
    _accuracies(status, job, local_out)
    local_out.mkdir(parents=True, exist_ok=True)
    (local_out / "pool.json").write_text(json.dumps(status, indent=2))
    return status


def _accuracies(status: dict[str, Any], job: TaskJob, local_out: Path) -> None:
    element_table.accuracies(status, local_out, job_summary.schema_of(job), job.secret_values)


def _pool_record(pool: follow.Pool, status: dict[str, Any] | None, opts: PoolOptions, per_job: int) -> dict[str, Any]:
    return {"elements": status["elements"] if status else [], "counts": status["counts"] if status else None,
            "size": opts.elements[0].size if opts.elements else 0, "gpus_per_job": per_job,
            "max_retries": opts.max_retries, "workers": len(pool.nodes),
            "instances_over_time": [{"seconds": t, "instances": k, "at": at} for t, k, at in pool.timeline],
            "released": pool.released, "lost": pool.lost, "left_at": pool.left_at,
            "replacements": pool.replacements,
            "ended_at": round(time.time(), 3)}
