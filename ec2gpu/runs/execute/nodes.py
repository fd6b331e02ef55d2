"""The nodes of an attempt: one instance each (a single instance is a cluster of one).

Opening a node (SSH with the host key checked against its console output, its run directory, an
EC2 watch), preparing it (ec2gpu/ami/setup-gpu.sh), doing something on every node at once, and
following every node's job log together: each line shown as ``node K | line`` (just the line for a
single node), the first node to fail stopping the others. In the sandbox each node is an sshd on
its own loopback address, and that address stands in for the instance's private IP, so torchrun's
rendezvous and gloo's collectives are real TCP between real processes.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, TypeVar

from ...aws import network
from ...errors import RemoteError, WaitTimeout
from ...wire import bounded_json
from . import status
from ..job import PROGRESS_FILE as PROGRESS_FILE  # re-exported: nodes.PROGRESS_FILE (node_env names it: runs/job.py)

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...aws.session import Aws
    from ...backend import Backend
    from ...settings import Settings
    from ..job import Provisioned
    from .reporter import ReporterLike

T = TypeVar("T")

GRACE_S = 10.0  # after a node fails, how long the others may take to fail or finish by themselves


def processes_per_node(info: dict[str, Any]) -> int:
    """One process per GPU; one (gloo on the CPU) where torch sees no GPU."""
    return max(1, int(info.get("gpu_count") or 0)) if info.get("cuda_available") else 1


@dataclass
class Node:
    """One node of a cluster attempt, as the controller follows it."""

    index: int
    instance: Instance
    host: str = ""
    port: int = 22
    conn: Any = None  # a fabric Connection (untyped)
    connect: Any = None  # () -> a fresh Connection
    run_dir: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None
    watch: Any = None  # recovery.InstanceWatch, from open_node on
    result: object = None  # exit status, Interrupted, or another exception
    agent_key: str | None = None  # the key the agent signs its record with (runs/execute/status.py)
    status: dict[str, Any] | None = None  # the agent's record, read once when the job ended (foreground.snapshot_statuses)

    @property
    def instance_id(self) -> str:
        return self.instance.id

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


def connect_verified(aws: Aws, settings: Settings, backend: Backend, inst: Instance, key: Path | None = None,
                     log: Callable[[str], None] = lambda msg: None,
                     timeout_s: float = 300.0, gone: Callable[[], None] | None = None) -> tuple[Any, str, int, Path, Path]:
    """The one way ec2gpu opens SSH to an instance it has not pinned yet (or has): wait until SSH
    answers (``timeout_s`` seconds, s), its host key checked against the fingerprints the
    instance published in its console output and pinned under its instance id
    ($EC2GPU_HOME/known_hosts/ID). ``key``: the private key file (default: the instance's key
    pair's, which must be on this machine). Returns (Connection, host, port, known_hosts path,
    key path). ``gone()``, called before each look at the console while its fingerprints are
    awaited, raises (recovery.InstanceWatch.check: Interrupted) when the instance is gone, so a
    spot instance reclaimed while it boots is not waited for. Raises RemoteError (a key the console
    does not list, or not the pinned one), WaitTimeout, UsageError (no private key here), what
    ``gone`` raises."""
    from ...aws import instances  # here: a dry run imports no boto3 (test_dry_run.py)
    from ...remote import ssh  # here: a dry run imports no paramiko (test_dry_run.py)

    iid = inst.id
    host, port = backend.ssh_target(inst)
    key = key or network.require_private_key(settings.keys_dir, inst.key_name or "")
    known = settings.home / "known_hosts" / iid
    def fingerprints() -> list[str]:
        if gone is not None:
            gone()
        return instances.host_key_fingerprints(aws.ec2, iid)
    conn = ssh.wait_for_ssh(host, port, settings.ssh_user, key, known, timeout_s=timeout_s, log=log,
                            fingerprints=fingerprints)
    return conn, host, port, known, key


def open_node(nd: Node, aws: Aws, settings: Settings, prov: Provisioned, run_id: str, backend: Backend,
              log: Callable[[str], None]) -> None:
    """Connect to a node (waiting for SSH; the host key checked against its console output), find
    its run directory, and give it an EC2 watch (bringing nothing home until the engine gives node
    0 its checkpoints). The watch exists before SSH answers, so a failed wait can ask EC2 whether
    the instance is gone, and is asked while the console's fingerprints are awaited. Raises
    WaitTimeout, RemoteError (host key), recovery.Interrupted (EC2 says it is gone)."""
    from ...remote import jobs, ssh  # here: a dry run imports no paramiko (test_dry_run.py)
    from ..recover import recovery  # here: a dry run imports no boto3 (test_dry_run.py)

    # the run's key pair: made by provision (found by standing/hosts.py) before any node is opened
    assert prov.key_path is not None
    nd.watch = recovery.InstanceWatch(aws.ec2, nd.instance_id, recovery.NoCheckpoints(), log)
    nd.host, nd.port = backend.ssh_target(nd.instance)
    known = settings.home / "known_hosts" / nd.instance_id
    nd.connect = lambda: ssh.connect(nd.host, nd.port, settings.ssh_user, prov.key_path, known, log)
    nd.conn = connect_verified(aws, settings, backend, nd.instance, prov.key_path, log, gone=nd.watch.check)[0]
    nd.run_dir = jobs.remote_run_dir(nd.conn, run_id)


def prepare_node(nd: Node, log: Callable[[str], None]) -> None:
    """Run ec2gpu/ami/setup-gpu.sh on the node, or reuse what the same script found on this same
    instance (id and type) before (remote/setup.py); ``nd.info`` gets it (python, GPUs, ``reused``)."""
    from ...remote import setup  # here: a dry run imports no paramiko (test_dry_run.py)
    nd.info = setup.setup(nd.conn, nd.run_dir, log=log,
                          machine=f"{nd.instance_id} {nd.instance.type}")


class _Stopped(Exception):
    """Raised in a follower when another node failed and the run is stopping."""


def parallel(fn: Callable[[Node], T], nodes: list[Node]) -> list[T]:
    """``fn(node)`` for every node at once (setup can take minutes per node); re-raises the first
    error. [] for no nodes (a pool of one instance has no workers)."""
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return list(pool.map(fn, nodes))


def each(fn: Callable[[Node], T], nodes: list[Node], gone: Callable[[list[Node]], list[Node]] | None = None,
         every_s: float = 5.0) -> list[tuple[Node, T | None, Exception | None]]:
    """``fn(node)`` for every node at once, as ``parallel``, but each node's outcome kept: [(node,
    its result, None) or (node, None, the exception its step raised)], in ``nodes``' order, so that
    a node lost in the step can be told from the others (runs/execute/attempt.on_nodes). While
    steps run, ``gone(busy)`` is asked every ``every_s`` seconds which of the nodes still in their
    step have lost their instance (EC2 says so): each one's connection is closed, so that what runs
    there fails now, not once TCP gives up on a peer whose packets vanish (many minutes)."""
    def one(nd: Node) -> tuple[Node, T | None, Exception | None]:
        try:
            return nd, fn(nd), None
        except Exception as exc:  # noqa: BLE001 - kept for the caller, who decides what it means
            return nd, None, exc
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        running = [pool.submit(one, nd) for nd in nodes]
        halted: set[int] = set()
        while gone is not None and futures.wait(running, timeout=every_s).not_done:
            busy = [nd for nd, f in zip(nodes, running, strict=True) if not f.done() and nd.index not in halted]
            for nd in gone(busy) if busy else []:
                halted.add(nd.index)
                nd.close()
        return [f.result() for f in running]


def follow_all(nodes: list[Node], ui: ReporterLike, local_out: Path, attempt: int, unreachable_s: float,
               log_name: str = "job.log", mask: Callable[[str], str] | None = None) -> None:
    """Follow every node's ``log_name`` at once, each line shown as ``node K | line`` (just the line
    for a single node) and teed to attempt-N-node-K.log; ``mask(line)`` hides secrets in both.
    The first node to fail stops the others (their jobs get SIGTERM). Sets each node's
    ``result``. Ctrl-C stops the followers and is re-raised."""
    stop = threading.Event()  # followers end at their next poll
    failed = threading.Event()  # a node failed: the others get GRACE_S to end by themselves
    lock = threading.Lock()
    local_out.mkdir(parents=True, exist_ok=True)

    def show(nd: Node, line: str) -> None:
        with lock:
            ui.log(line if len(nodes) == 1 else f"node {nd.index} | {line}")

    ended = {nd.index: threading.Event() for nd in nodes}  # set by each follower as it ends

    def follow(nd: Node) -> None:
        try:
            _follow_node(nd, local_out / f"attempt-{attempt}-node-{nd.index}.log", log_name, unreachable_s, mask,
                         lambda line: show(nd, line), lambda m: ui.note(f"node {nd.index}: {m}"), stop,
                         ProgressReader(nd.run_dir, ui.progress, ui.note) if nd.index == 0 else None)
            if nd.result != 0:
                failed.set()
        finally:
            ended[nd.index].set()

    threads = [threading.Thread(target=follow, args=(nd,), name=f"follow-node-{nd.index}", daemon=True) for nd in nodes]
    for t in threads:
        t.start()
    failed_at = None
    try:
        while not all(e.is_set() for e in ended.values()):
            for e in ended.values():
                e.wait(0.2)
            if failed.is_set() and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                stop.set()
    except BaseException:
        # the followers' own Events, not Thread.join: after Ctrl-C interrupted a join, the next join
        # returned at once while the thread still ran (CPython 3.11 here: tests/unit/test_follow_interrupt.py)
        stop.set()
        deadline = time.monotonic() + 10
        for e in ended.values():
            e.wait(max(0.0, deadline - time.monotonic()))
        raise
    bad = [nd for nd in nodes if nd.result not in (0, "stopped")]
    if bad and len(nodes) > 1:
        ui.note(f"node {bad[0].index} ({bad[0].instance_id}) ended with {_describe(bad[0].result)}; "
                "stopping the other nodes")
        for nd in nodes:
            if nd.result == "stopped":
                stop_job(nd, ui.note)


class ProgressReader:
    """Reads the job's progress file (node 0's $EC2GPU_PROGRESS_FILE, docs/tasks.md) at most every
    ``every_s`` seconds while the log is followed, and passes each new, well-formed content to
    ``show(progress)``: a dict with ``done`` and ``total`` (numbers), and optional ``label``,
    ``rate`` with ``rate_unit``, ``eta_s``. A missing, partial or malformed file is skipped: the
    progress display is a courtesy, never a reason to fail the run. One the reader refuses for its
    size or depth (bounded_json: never a partial write) is said to ``note``, once."""

    seen: dict[str, Any] | None

    def __init__(self, run_dir: str, show: Callable[[dict[str, Any]], None], note: Callable[[str], None] = lambda m: None,
                 every_s: float = 1.0) -> None:
        self.path, self.show, self.every_s, self.last, self.seen = f"{run_dir}/{PROGRESS_FILE}", show, every_s, 0.0, None
        self.note, self.refused = note, False

    def __call__(self, conn: Any) -> None:
        if conn is None or time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        from ...remote import jobs  # here: a dry run imports no paramiko (test_dry_run.py)
        try:
            p = bounded_json.loads(jobs.read_from(conn, self.path, 0, MAX_PROGRESS_BYTES + 1) or b"null",
                                   max_bytes=MAX_PROGRESS_BYTES)
        except bounded_json.Refused as exc:
            if exc.reason != bounded_json.NOT_JSON and not self.refused:  # not JSON: most often a write half done
                self.refused = True
                self.note(f"warning: the job's progress file ({PROGRESS_FILE}) is refused ({exc}): no progress shown")
            return
        if isinstance(p, dict) and isinstance(p.get("done"), (int, float)) and isinstance(p.get("total"), (int, float)) \
                and p != self.seen:
            self.seen = p
            self.show(p)


MAX_PROGRESS_BYTES = 32 * 1024  # a progress record (done, total, label, rate, eta_s) is a few hundred bytes


def _follow_node(nd: Node, tee_path: Path, log_name: str, unreachable_s: float, mask: Callable[[str], str] | None,
                 show: Callable[[str], None], note: Callable[[str], None],
                 stop: threading.Event, progress: ProgressReader | None = None) -> None:
    """Follow one node's log to its end through dropped connections (its EC2 watch polled on the
    way), each line to ``show`` and teed to ``tee_path`` (byte for byte, or masked line by line);
    set ``nd.result``: the exit status, "stopped" once ``stop`` is set, Interrupted when SSH stays
    unreachable, or the exception that ended it."""
    from ...remote import jobs  # here: a dry run imports no paramiko (test_dry_run.py)
    from ..recover import recovery  # here: a dry run imports no boto3 (test_dry_run.py)

    def on_poll(conn: Any) -> None:
        if stop.is_set():
            raise _Stopped()
        nd.watch(conn)
        if progress is not None:
            progress(conn)
    with LocalLog(tee_path) as tee:
        def emit(line: str) -> None:
            if mask:
                line = mask(line)
                tee.write((line + "\n").encode())
            show(line)
        lines = jobs.LineSplitter(emit)

        def deliver(chunk: bytes) -> None:
            if not mask:  # byte for byte; a masked log is written line by line in emit
                tee.write(chunk)
            lines(chunk)
        try:
            exited, nd.conn = jobs.follow_reconnecting(nd.connect, nd.run_dir, log_name, jobs.LogCursor(deliver),
                                                       conn=nd.conn, unreachable_s=unreachable_s, on_poll=on_poll,
                                                       log=note)
            nd.result = exited
        except _Stopped:
            nd.result = "stopped"
        except jobs.Unreachable as exc:
            nd.result = recovery.Interrupted(str(exc))
        except BaseException as exc:  # noqa: BLE001 - carried to the main thread
            nd.result = exc
        finally:
            lines.flush()


MAX_LOG_BYTES = 256 << 20  # a job log written on this machine stops growing here: 256 MiB


class LocalLog:
    """A job log on this machine, written through as bytes arrive (unbuffered: a controller killed
    mid-run leaves every byte it received) and capped at ``max_bytes``, with one line saying so."""

    f: BinaryIO | None  # open between __enter__ and __exit__

    def __init__(self, path: Path, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.path, self.max_bytes, self.written, self.f, self.capped = path, max_bytes, 0, None, False

    def __enter__(self) -> LocalLog:
        self.f = open(self.path, "wb", buffering=0)
        return self

    def write(self, data: bytes) -> None:
        assert self.f is not None  # written inside its with block
        room = self.max_bytes - self.written
        if room > 0:
            self.f.write(data[:room])
            self.written += min(len(data), room)
        if len(data) > room and not self.capped:
            self.capped = True
            self.f.write(f"\n[ec2gpu: this log stops at {self.max_bytes:,} bytes; the job's whole log is "
                         "job.log on the instance while it runs]\n".encode())

    def __exit__(self, *exc: object) -> None:
        assert self.f is not None  # __enter__ opened it
        self.f.close()


def copy_log(conn: Any, remote: str, local: Path, mask: Callable[[str], str]) -> None:
    """Copy the remote log ``remote`` to ``local``, its last MAX_LOG_BYTES bytes, in chunks
    (memory stays bounded whatever its size), ``mask`` applied line by line."""
    from ...remote import jobs  # here: a dry run imports no paramiko (test_dry_run.py)
    start = max(0, jobs.size_of(conn, remote) - MAX_LOG_BYTES)
    with open(local, "wb") as f:
        lines = jobs.LineSplitter(lambda line: f.write((mask(line) + "\n").encode()))
        jobs.drain(conn, remote, jobs.LogCursor(lines, start), limit=start + MAX_LOG_BYTES)
        lines.flush()


def record_steps(nodes: list[Node], mask: Callable[[str], str], local_out: Path,
                 only: list[Node] | None = None) -> list[tuple[str, Callable[..., object]]]:
    """[(name, step)]: each node's job.log (``mask`` applied line by line, its last MAX_LOG_BYTES)
    and its record (the copy already read into ``nd.status``) to ``local_out``: job.log and
    agent-record.json, job-node-K.log and agent-record-node-K.json for a cluster; ``only``: those nodes alone."""
    steps: list[tuple[str, Callable[..., object]]] = []
    for nd in nodes if only is None else [nd for nd in nodes if any(nd is o for o in only)]:
        suffix = "" if len(nodes) == 1 else f"-node-{nd.index}"
        steps.append((f"job{suffix}.log", lambda nd=nd, suffix=suffix: copy_log(
            nd.conn, f"{nd.run_dir}/job.log", local_out / f"job{suffix}.log", mask)))
        if nd.status is not None:
            steps.append((f"agent-record{suffix}.json", lambda nd=nd, suffix=suffix: (
                local_out / f"agent-record{suffix}.json").write_text(json.dumps(nd.status, indent=2))))
    return steps


STOP_WAIT_S = 5.0  # after Ctrl-C, how long a stopped job may take to end before its records come home
RECORDS_HOME_S = 30.0  # after Ctrl-C, the most the job's records may delay the teardown (s)


def records_home_on_interrupt(nodes: list[Node], mask: Callable[[str], str], local_out: Path,
                              log: Callable[[str], None], wait_s: float = STOP_WAIT_S,
                              budget_s: float = RECORDS_HOME_S) -> None:
    """After Ctrl-C or SIGTERM while the job runs, before the teardown: ask each node's job to
    stop (SIGTERM through its agent: a job that checkpoints on SIGTERM does so), give them
    ``wait_s`` seconds in all to end, then bring each node's job.log (``mask`` applied) and status
    record (as it is then, signature checked) home as a finished run does (record_steps). Nodes
    whose connection was already lost are left out; all of it takes at most ``budget_s`` seconds
    (then the teardown goes on, and ``log`` says what did not come home). Never raises but a
    second KeyboardInterrupt, which ends the wait (the caller re-raises; the teardown runs)."""
    reachable = [nd for nd in nodes if nd.pid is not None and nd.conn is not None  # followed to the end, or stopped
                 and (nd.result in (None, "stopped") or type(nd.result) is int)]
    done = threading.Event()

    def work() -> None:
        try:
            _records_home(nodes, reachable, mask, local_out, log, wait_s)
        except Exception as exc:  # noqa: BLE001 - a thread's error must not print a traceback; the teardown goes on
            log(f"warning: the job's log and status not brought home ({type(exc).__name__}: {exc})")
        finally:
            done.set()
    threading.Thread(target=work, name="records-home", daemon=True).start()
    if not done.wait(budget_s):
        log(f"warning: the job's log and status did not all come home in {budget_s:.0f} s; terminating without them")


def _records_home(nodes: list[Node], started: list[Node], mask: Callable[[str], str], local_out: Path,
                  log: Callable[[str], None], wait_s: float) -> None:
    """records_home_on_interrupt's work, on the nodes ``started`` of ``nodes``."""
    from ...remote import jobs  # here: a dry run imports no paramiko (test_dry_run.py)
    stopped = [stop_job(nd, log) for nd in started]
    deadline = time.monotonic() + wait_s
    for nd in started:
        try:
            while jobs.exit_status(nd.conn, nd.run_dir) is None and time.monotonic() < deadline:
                time.sleep(0.2)
            nd.status = status.read(nd.conn, nd.run_dir, nd.agent_key)
        except (*jobs.CONNECTION_ERRORS, RemoteError) as exc:
            log(f"warning: node {nd.index}: its job's record not read ({type(exc).__name__}: {exc})")
    brought = []
    local_out.mkdir(parents=True, exist_ok=True)
    for what, step in record_steps(nodes, mask, local_out, only=started):
        try:
            step()
            brought.append(what)
        except (*jobs.CONNECTION_ERRORS, RemoteError, ValueError, UnicodeError) as exc:
            log(f"warning: {what} not brought home: {type(exc).__name__}: {exc}")
    if brought:
        log(f"interrupted: {'the job was sent SIGTERM; ' if all(stopped) else ''}{', '.join(brought)} brought home "
            f"to {local_out}")


def stop_job(nd: Node, log: Callable[[str], None]) -> bool:
    """SIGTERM the node's job: its agent, which passes it to the job's process group (torchrun and
    its workers); whether it was sent. A node that cannot be reached is reported through ``log``;
    teardown ends it anyway."""
    from ...remote import jobs, ssh  # here: a dry run imports no paramiko (test_dry_run.py)
    try:
        conn = nd.connect()
        try:
            ssh.run(conn, f"pkill -TERM -P {nd.pid} || true", timeout_s=20)
        finally:
            conn.close()
        return True
    except (*jobs.CONNECTION_ERRORS, RemoteError, WaitTimeout) as exc:
        log(f"node {nd.index} ({nd.instance_id}): could not stop its job ({type(exc).__name__}: {exc}); "
            "terminating the instance ends it")
        return False


def _describe(result: object) -> str:
    return f"exit status {result}" if isinstance(result, int) else f"{type(result).__name__}: {result}"
