"""The controller's loop while a pool's driver runs (pool/attempt.py's PoolDriver): the driver's
log and table.json read every POLL_S seconds, the progress line (and the run's progress.json),
the pool shrunk once no element waits (each idle worker's Ray stopped, its instance terminated),
lost workers noted and replaced while work remains (pool/grow.py), finished elements' results
brought home as they end, and a head that stops answering retried, then counted as lost.
"""
from __future__ import annotations

import errno
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from .. import words
from ..aws import catalog, instances
from ..errors import RemoteError
from ..inert import inert
from ..remote import jobs, mounts
from ..runs import element_table
from ..runs.job_summary import mask_text
from ..runs.plan import costs
from ..runs.recover import recovery
from . import grow
from .ray_nodes import stop_ray

if TYPE_CHECKING:
    from ..aws.session import Aws
    from ..runs.job import TaskJob
    from ..runs.execute.nodes import Node
    from ..runs.execute.reporter import ReporterLike
    from ..runs.options import PoolOptions
    from ..settings import Settings

POLL_S = 2.0  # how often the controller reads the driver's status (s)
EXIT_NOTICE = 75  # agent/agent.py's exit code when a spot notice stopped the job (EX_TEMPFAIL)
#: an OSError with one of these is this machine's own (a full disk, a read-only or forbidden
#: file), not a dropped connection to the head (errno(3))
LOCAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EMFILE,
                          errno.ENFILE, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG})
PROGRESS_FILE = "progress.json"  # the live figures in the run's directory, which `ec2gpu status RUN` reads
GROW_STOP_WAIT_S = 120.0  # a replacement still being made when the array ends gets this long to stop (s)
BRING_EVERY_S = 10.0  # finished elements' outputs come home this often while the array runs (s)
#: after a launch that failed (no capacity for any type and zone on the list), the pool asks again
#: this long after, while elements wait (s)
GROW_RETRY_S = 60.0


@dataclass
class Pool:
    """The pool as the controller keeps it: its nodes (node 0 the head), those still in it, and
    the instance count over time (seconds since the pool started, instances)."""

    nodes: list[Node]
    started: float = field(default_factory=time.monotonic)
    members: dict[str, Node] = field(default_factory=dict)  # instance id -> node, while in the pool
    timeline: list[tuple[float, int, float]] = field(default_factory=list)  # (s since start, instances, epoch s)
    released: list[str] = field(default_factory=list)
    left_at: dict[str, float] = field(default_factory=dict)  # instance id -> epoch s it left the pool
    slots_per_node: int = 1  # elements one instance runs at once (its GPUs // gpus_per_job)
    lost: list[str] = field(default_factory=list)
    usd_per_hour: dict[str, float | None] = field(default_factory=dict)  # instance id -> its compute price
    replacements: list[dict[str, Any]] = field(default_factory=list)  # grow.Replacement.as_dict, once each is over
    growing: grow.Replacement | None = None  # the one being made now (at most one at a time)
    grow_after: float = 0.0  # time.monotonic() before which the pool does not try to grow again (a launch failed)
    write_back: bool = False  # the task has MOUNT-mode file_mounts: each node writes them back as it leaves

    def cost_so_far(self, now: float) -> float | None:
        """USD the pool's instances have cost until ``now`` (epoch s): each instance's compute
        from its launch to when it left the pool (or ``now``), with EC2's 60 s minimum, at its
        price (``usd_per_hour``; prices_of). None while an instance has no price."""
        total = 0.0
        for nd in self.nodes:
            price = self.usd_per_hour.get(nd.instance_id)
            if price is None:
                return None
            seconds = min(now, self.left_at.get(nd.instance_id, now)) - nd.instance.launched_at.timestamp()
            total += max(float(catalog.BILLING_MINIMUM_SECONDS), seconds) * price / 3600
        return round(total, 4)

    def count(self) -> None:
        now = round(time.monotonic() - self.started, 1)
        if not self.timeline or self.timeline[-1][1] != len(self.members):
            self.timeline.append((now, len(self.members), round(time.time(), 3)))


def read_status(head: Node, opts: PoolOptions, ui: ReporterLike) -> dict[str, Any] | None:
    raw = jobs.read_from(head.conn, f"{head.run_dir}/pool/{element_table.TABLE}", 0, element_table.MAX_STATUS_BYTES + 1)
    if not raw:
        return None
    try:
        status = element_table.parse_status(raw, [e.as_dict() for e in opts.elements])
    except element_table.BadStatus as exc:
        said = f"warning: the pool's status not accepted ({exc})"
        if said not in getattr(ui, "notes", ()):  # once, not at every poll
            ui.note(said)
        return None
    return masked(status, cast("TaskJob", opts.task))


def masked(status: dict[str, Any], job: TaskJob) -> dict[str, Any]:
    """``status`` with each secret value of the task masked in its elements' last lines and errors
    (the job's own lines: a secret it printed is never shown or kept)."""
    if job.secret_values:
        for e in status["elements"]:
            e["tail"] = [mask_text(line, job.secret_values) for line in e["tail"]]
            e["error"] = mask_text(e["error"], job.secret_values) if e["error"] else e["error"]
    return status


def follow(aws: Aws, pool: Pool, head: Node, opts: PoolOptions, addresses: dict[int, str],
           ui: ReporterLike, on_status: Callable[[dict[str, Any]], None],
           progress_path: Path | None = None, grow_ctx: grow.Context | None = None) -> dict[str, Any] | None:
    """Until the driver ends: its log lines shown, the progress line (also written to
    ``progress_path``), the pool shrunk, lost workers noted and replaced while work remains
    (pool/grow.py, with ``grow_ctx``; none without it), ``on_status(status)`` after each read.
    Returns the driver's last status."""
    try:
        return _follow_loop(aws, pool, head, opts, addresses, ui, on_status, progress_path,
                            lambda status: _grow(aws, pool, status, grow_ctx, addresses, ui))
    finally:
        rep = pool.growing
        if rep is not None and not rep.over:  # the array ended first: it goes no further
            rep.halt()
            assert rep.thread is not None
            rep.thread.join(GROW_STOP_WAIT_S)
            if rep.thread.is_alive():
                ui.note(f"warning: the {_what(rep.lost)} did not stop within {GROW_STOP_WAIT_S:.0f} s; "
                        "`ec2gpu cleanup` ends what it made")


def _grow(aws: Aws, pool: Pool, status: dict[str, Any] | None, ctx: grow.Context | None, addresses: dict[int, str],
          ui: ReporterLike) -> None:
    """Take a replacement that is over into the pool (or say why there is none), and start the
    next one while a lost worker is owed one, elements wait, and the pool is below its size."""
    rep = pool.growing
    if rep is not None:
        if not rep.over:
            if status is not None and not status["counts"]["queued"] and not rep.stop.is_set():
                ui.note(f"pool: no element waits any more: the {_what(rep.lost)} stops")
                rep.halt()  # not needed: stopped at its next step, its instance ended
            return
        pool.growing = None
        pool.replacements.append(rep.as_dict())
        nd = rep.node
        if nd is not None and rep.address is not None and ctx is not None:
            addresses[nd.index] = rep.address
            pool.nodes.append(nd)
            pool.members[nd.instance_id] = nd
            pool.usd_per_hour.update(prices_of(aws, ctx.settings, [nd]))
            pool.count()
            ui.note(f"pool: {nd.instance_id} joined as node {nd.index}, "
                    f"{f'replacing {rep.lost}' if rep.lost else 'the pool grows'} ({words.count(len(pool.members), 'instance')})")
        else:
            pool.grow_after = time.monotonic() + GROW_RETRY_S
            ui.note(f"pool: no {_what(rep.lost)} ({rep.error}); the others go on"
                    + (f", asked again in {GROW_RETRY_S:.0f} s while elements wait" if ctx is not None else ""))
            if rep.instance_id:
                try:
                    instances.terminate(aws.ec2, [rep.instance_id], wait=False)
                except Exception as exc:  # noqa: BLE001 - it is one of the run's: the teardown ends it
                    ui.note(f"warning: {rep.instance_id} not ended now ({type(exc).__name__}); the teardown ends it")
                pool.left_at[rep.instance_id] = round(time.time(), 3)
    if ctx is None or status is None or len(pool.members) >= ctx.opts.nodes:
        return
    c = status["counts"]
    waiting = c["queued"] - max(0, len(pool.members) * pool.slots_per_node - c.get("running", 0))
    owed = [iid for iid in pool.lost if iid not in {r["for"] for r in pool.replacements}]
    if waiting <= 0 or (not owed and time.monotonic() < pool.grow_after):
        return
    lost = owed[0] if owed else None
    zone = next((nd.instance.zone for nd in pool.nodes if nd.instance_id == lost), None)
    ui.note(f"pool: {words.count(c['queued'], 'element')} wait and " + (f"{lost} is lost: launching a replacement" if lost else
            f"the pool has {len(pool.members)} of its {words.count(ctx.opts.nodes, 'instance')}: launching one more"))
    # the next node index: never one a replacement that failed had (its tags and attempt row keep it)
    index = 1 + max([nd.index for nd in pool.nodes] + [int(r["node"]) for r in pool.replacements])
    pool.growing = grow.start(ctx, lost, zone, index, list(addresses.values()), ui)


def _what(lost: str | None) -> str:
    """The words for a Replacement: for a lost worker, or the pool's growth (pure)."""
    return f"replacement for {lost}" if lost else "instance the pool grows by"


def _follow_loop(aws: Aws, pool: Pool, head: Node, opts: PoolOptions, addresses: dict[int, str],
                 ui: ReporterLike, on_status: Callable[[dict[str, Any]], None], progress_path: Path | None,
                 grow_step: Callable[[dict[str, Any] | None], None]) -> dict[str, Any] | None:
    """follow's loop: a poll every POLL_S; through a dropped SSH connection to the head it
    reconnects (0.5 s doubling to 8 s) for up to ``opts.unreachable_s``, then the head counts as
    lost (recovery.Interrupted: the run goes on as a new attempt where attempts are left)."""
    job = cast("TaskJob", opts.task)
    cursor = jobs.LogCursor(jobs.LineSplitter(lambda line: ui.log(inert(mask_text(line, job.secret_values)))))
    state: dict[str, Any] = {"status": None, "described": 0.0, "brought": 0.0}
    unreachable_since, wait = None, 0.5
    while True:
        try:
            ended, result = _poll(aws, pool, head, opts, addresses, ui, on_status, progress_path, grow_step, cursor,
                                  state)
        except jobs.CONNECTION_ERRORS as exc:
            if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
                raise  # this machine's disk or files (the results coming home), not the head: not retried
            now = time.monotonic()
            if unreachable_since is None:
                unreachable_since = now
                ui.note(f"the pool's head ({head.instance_id}) did not answer ({type(exc).__name__}); reconnecting "
                        f"for up to {opts.unreachable_s:.0f} s")
            if head.watch:
                head.watch.check()  # EC2 says the head is gone: Interrupted now, not after the bound
            if now - unreachable_since > opts.unreachable_s:
                raise recovery.Interrupted(f"the pool's head ({head.instance_id}) was unreachable over SSH for "
                                           f"{now - unreachable_since:.0f} s") from None
            time.sleep(wait)
            wait = min(8.0, wait * 2)
            head.close()
            try:
                head.conn = head.connect()
            except jobs.CONNECTION_ERRORS:
                pass
            continue
        if unreachable_since is not None:
            ui.note(f"the pool's head answers again after {time.monotonic() - unreachable_since:.0f} s")
            unreachable_since, wait = None, 0.5
        if ended:
            return result
        time.sleep(POLL_S)


def _poll(aws: Aws, pool: Pool, head: Node, opts: PoolOptions, addresses: dict[int, str], ui: ReporterLike,
          on_status: Callable[[dict[str, Any]], None], progress_path: Path | None,
          grow_step: Callable[[dict[str, Any] | None], None], cursor: Any,
          state: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """One poll of the driver on the head: (ended, its last status). Raises the connection's
    errors (jobs.CONNECTION_ERRORS) as they come; ``state`` carries the last status and times."""
    jobs.drain(head.conn, f"{head.run_dir}/job.log", cursor)
    status = state["status"] = read_status(head, opts, ui) or state["status"]
    if status is not None:
        _shrink(aws, pool, status, addresses, ui)
        progress = _progress(pool, status, len(opts.elements))
        ui.progress(progress)
        write_progress(progress_path, progress)
        if time.monotonic() - state["brought"] >= BRING_EVERY_S:  # rsync's round trips: not at every poll
            state["brought"] = time.monotonic()
            on_status(status)
    if time.monotonic() - state["described"] > 5 * POLL_S:
        state["described"] = time.monotonic()
        ids = [i for i in pool.members if i != head.instance_id]
        for inst in instances.describe_instances(aws.ec2, ids) if ids else []:
            if inst.state not in ("pending", "running"):
                ui.note(f"worker {inst.id} lost ({inst.state}): Ray runs its elements again on the others")
                gone = pool.members.pop(inst.id, None)
                if gone is not None:
                    gone.close()
                pool.lost.append(inst.id)
                pool.left_at[inst.id] = round(time.time(), 3)
        for iid in [i for i in pool.members if i != head.instance_id]:
            _ray_ended(aws, pool, iid, ui)
        pool.count()
        if jobs.exit_status(head.conn, f"{head.run_dir}/ray") is not None:  # no scheduler: the run cannot go on
            raise RemoteError(f"Ray ended on the pool's head ({head.instance_id}) while the array ran",
                              "its log is above; run the elements that did not finish again with --array",
                              command="ray start --head", host=head.host,
                              tail=jobs.tail(head.conn, f"{head.run_dir}/ray/console.log"))
    code = jobs.exit_status(head.conn, head.run_dir)
    if code is not None:
        jobs.drain(head.conn, f"{head.run_dir}/job.log", cursor)
        if code == EXIT_NOTICE:  # the agent stopped the driver for the head's spot notice: a lost head
            raise recovery.Interrupted(f"the pool's head ({head.instance_id}) got a spot interruption notice")
        return True, read_status(head, opts, ui) or status
    grow_step(status)  # only while the driver runs
    return False, status


def prices_of(aws: Aws, settings: Settings, nodes: list[Node]) -> dict[str, float | None]:
    """Each node's compute price (USD/h; None when none is known), as its bill will price it
    (runs/plan/costs.compute_cost: a spot instance its zone's spot price history since its launch,
    an on-demand one the price table; asked once per type, market and zone), for the cost so far
    on the live line."""
    now = datetime.now(timezone.utc)
    prices: dict[str, float | None] = {}
    asked: dict[tuple[str, str, str | None], float | None] = {}  # one lookup per type, market and zone
    for nd in nodes:
        key = (nd.instance.type, nd.instance.market, nd.instance.zone)
        if key not in asked:
            try:
                asked[key] = costs.compute_cost(aws, settings.home, nd.instance, nd.instance.launched_at,
                                                max(now, nd.instance.launched_at + timedelta(seconds=60))
                                                )["usd_per_hour"]
            except Exception:  # noqa: BLE001 - a price for the live line only: without one it shows no cost so far
                asked[key] = None
        prices[nd.instance_id] = asked[key]
    return prices


def _progress(pool: Pool, status: dict[str, Any], total: int) -> dict[str, Any]:
    """The live line's figures (and progress.json's, which `ec2gpu status RUN` shows): the counts,
    the instances, the ETA (s) and the cost so far (USD)."""
    c = status["counts"]
    cost = pool.cost_so_far(time.time())
    return {"done": c["done"] + c["failed"], "total": total, "counts": dict(c), "instances": len(pool.members),
            "eta_s": eta_s(status, len(pool.members) * pool.slots_per_node), "cost_so_far_usd": cost,
            "at": round(time.time(), 3),
            "label": f"elements: {c['done']} done, {c['running']} running, {c['queued']} queued, {c['failed']} failed; "
                     f"{words.count(len(pool.members), 'instance')}" + ("" if cost is None else f"; ${cost:.4f} so far")}


def write_progress(path: Path | None, progress: dict[str, Any]) -> None:
    """``progress`` as ``path`` (the run's progress.json), whole or not at all (a reader never sees
    half a file); a file that cannot be written is skipped: the run goes on."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.part")
        part.write_text(json.dumps({k: v for k, v in progress.items() if k != "label"}))
        part.replace(path)
    except OSError:
        pass


def drop(aws: Aws, pool: Pool, nodes: list[Node], ui: ReporterLike) -> None:
    """Take ``nodes`` (workers lost before the driver ran: PoolDriver.lost) out of the pool: each
    is no member any more, counted as lost (so follow's _grow owes it a replacement while
    elements wait) from now (``left_at``: its cost stops), its connection closed and its instance
    terminated without waiting (EC2 reports it gone already; a stopped one is ended)."""
    for nd in nodes:
        pool.members.pop(nd.instance_id, None)
        nd.close()
        try:
            instances.terminate(aws.ec2, [nd.instance_id], wait=False)
        except Exception as exc:  # noqa: BLE001 - one of the run's: the teardown ends it
            ui.note(f"warning: {nd.instance_id} not ended now ({type(exc).__name__}); the teardown ends it")
        pool.lost.append(nd.instance_id)
        pool.left_at[nd.instance_id] = round(time.time(), 3)
    if nodes:
        pool.count()


def _ray_ended(aws: Aws, pool: Pool, iid: str, ui: ReporterLike) -> None:
    """A worker whose Ray has ended (it could not join, or died) is no use to the pool: released."""
    nd = pool.members[iid]
    try:
        code = jobs.exit_status(nd.conn, f"{nd.run_dir}/ray")
    except jobs.CONNECTION_ERRORS:
        return  # EC2 says whether it is lost
    if code is None:
        return
    pool.members.pop(iid).close()
    instances.terminate(aws.ec2, [iid], wait=False)
    pool.lost.append(iid)
    pool.left_at[iid] = round(time.time(), 3)
    ui.note(f"worker {iid}: its Ray ended (exit status {code}); released, the others go on")


def eta_s(status: dict[str, Any], slots: int) -> float | None:
    """Seconds until the array ends, as its finished elements say (pure): their mean time for
    each element still to run, ``slots`` at a time, the running ones half done; None before any
    element has finished."""
    times: list[float] = [e["seconds"] for e in status["elements"] if e["status"] in ("succeeded", "failed") and e["seconds"]]
    if not times or slots < 1:
        return None
    mean, c = sum(times) / len(times), status["counts"]
    left: float = c["queued"] + c["running"] / 2
    return round(mean * left / slots, 1)


def _shrink(aws: Aws, pool: Pool, status: dict[str, Any], addresses: dict[int, str], ui: ReporterLike) -> None:
    """Release the workers the pool no longer needs (element_table.idle_workers): Ray stopped on each,
    then its instance terminated (without waiting)."""
    head = pool.nodes[0].instance_id
    workers = {iid: addresses[nd.index] for iid, nd in pool.members.items() if iid != head}
    idle = element_table.idle_workers(status, workers)
    for iid in idle:
        nd = pool.members.pop(iid)
        stop_ray(nd, ui.note)  # first: no element starts there meanwhile
        if pool.write_back:  # what its elements wrote under a MOUNT-mode target, before the instance goes
            write_back(nd, ui, RELEASE_WRITE_BACK_S)
        nd.close()  # before the instance goes: a connection it drops is noise on the user's terminal
        instances.terminate(aws.ec2, [iid], wait=False)
        pool.released.append(iid)
        pool.left_at[iid] = round(time.time(), 3)
        ui.note(f"pool: no element waits, released {iid} ({words.count(len(pool.members), 'instance')} left)")
    if idle:
        pool.count()
#: the longest a worker being released may take to write its MOUNT-mode file_mounts back (the
#: pool's loop waits for it: results coming home and loss detection pause meanwhile)
RELEASE_WRITE_BACK_S = 600.0


def write_back(nd: Node, ui: ReporterLike, timeout_s: float = 6 * 3600) -> None:
    """Node ``nd``'s MOUNT-mode file_mounts written back to their buckets (remote/mounts.write_back:
    what its elements wrote there) within ``timeout_s``; a failure is said, and the run goes on."""
    try:
        mounts.write_back(nd.conn, nd.run_dir, str(nd.info.get("python") or "python3"),
                          lambda line: ui.note(f"node {nd.index}: {line}"), timeout_s=timeout_s)
    except (RemoteError, *jobs.CONNECTION_ERRORS) as exc:
        ui.note(f"warning: node {nd.index}: file_mounts not written back ({type(exc).__name__}: {exc})")
