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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

GRACE_S = 10.0  # after a node fails, how long the others may take to fail or finish by themselves


def processes_per_node(info: dict) -> int:
    """One process per GPU; one (gloo on the CPU) where torch sees no GPU."""
    return max(1, int(info.get("gpu_count") or 0)) if info.get("cuda_available") else 1


@dataclass
class Node:
    """One node of a cluster attempt, as the controller follows it."""

    index: int
    instance: dict
    host: str = ""
    port: int = 22
    conn: object = None
    connect: object = None  # () -> a fresh Connection
    run_dir: str = ""
    info: dict = field(default_factory=dict)
    pid: int | None = None
    watch: object = None  # recovery.InstanceWatch
    result: object = None  # exit status, Interrupted, or another exception
    agent_key: str | None = None  # the key the agent signs status.json with (runs/status.py)
    status: dict | None = None  # the agent's record, read once when the job ended (engine.snapshot_statuses)

    @property
    def instance_id(self) -> str:
        return self.instance["InstanceId"]

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


def open_node(nd: Node, aws, settings, prov, run_id: str, backend, log) -> None:
    """Connect to a node (waiting for SSH; the host key checked against its console output), find
    its run directory, and give it an EC2 watch (bringing nothing home until the engine gives node
    0 its checkpoints). The watch exists before SSH answers, so a failed wait can ask EC2 whether
    the instance is gone. Raises WaitTimeout, RemoteError (host key)."""
    from ..aws import instances
    from ..remote import jobs, ssh
    from . import recovery

    nd.watch = recovery.InstanceWatch(aws.ec2, nd.instance_id, recovery.NoCheckpoints(), log)
    nd.host, nd.port = backend.ssh_target(nd.instance)
    known = settings.home / "known_hosts" / nd.instance_id
    nd.connect = lambda: ssh.connect(nd.host, nd.port, settings.ssh_user, prov.key_path, known, log)
    nd.conn = ssh.wait_for_ssh(nd.host, nd.port, settings.ssh_user, prov.key_path, known, log=log,
                               fingerprints=lambda: instances.host_key_fingerprints(aws.ec2, nd.instance_id))
    nd.run_dir = jobs.remote_run_dir(nd.conn, run_id)


def prepare_node(nd: Node, log) -> None:
    """Run ec2gpu/ami/setup-gpu.sh on the node; ``nd.info`` gets what it found (python, GPUs)."""
    from ..remote import setup
    nd.info = setup.setup(nd.conn, nd.run_dir, log=log)


class _Stopped(Exception):
    """Raised in a follower when another node failed and the run is stopping."""


def parallel(fn, nodes: list[Node]) -> list:
    """``fn(node)`` for every node at once (setup can take minutes per node); re-raises the first error."""
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return list(pool.map(fn, nodes))


def follow_all(nodes: list[Node], ui, local_out: Path, attempt: int, unreachable_s: float,
               log_name: str = "job.log", mask=None) -> None:
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

    def follow(nd: Node) -> None:
        _follow_node(nd, local_out / f"attempt-{attempt}-node-{nd.index}.log", log_name, unreachable_s, mask,
                     lambda line: show(nd, line), lambda m: ui.note(f"node {nd.index}: {m}"), stop,
                     ProgressReader(nd.run_dir, ui.progress) if nd.index == 0 else None)
        if nd.result != 0:
            failed.set()

    threads = [threading.Thread(target=follow, args=(nd,), name=f"follow-node-{nd.index}", daemon=True) for nd in nodes]
    for t in threads:
        t.start()
    failed_at = None
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
            if failed.is_set() and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                stop.set()
    except BaseException:
        stop.set()
        for t in threads:
            t.join(10)
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
    progress display is a courtesy, never a reason to fail the run."""

    def __init__(self, run_dir: str, show, every_s: float = 1.0):
        self.path, self.show, self.every_s, self.last, self.seen = f"{run_dir}/{PROGRESS_FILE}", show, every_s, 0.0, None

    def __call__(self, conn) -> None:
        if conn is None or time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        from ..remote import jobs
        try:
            p = json.loads(jobs.read_from(conn, self.path, 0) or b"null")
        except ValueError:
            return
        if isinstance(p, dict) and isinstance(p.get("done"), (int, float)) and isinstance(p.get("total"), (int, float)) \
                and p != self.seen:
            self.seen = p
            self.show(p)


PROGRESS_FILE = "progress.json"  # in the run's directory on the instance: $EC2GPU_PROGRESS_FILE


def _follow_node(nd: Node, tee_path: Path, log_name: str, unreachable_s: float, mask, show, note,
                 stop: threading.Event, progress: ProgressReader | None = None) -> None:
    """Follow one node's log to its end through dropped connections (its EC2 watch polled on the
    way), each line to ``show`` and teed to ``tee_path`` (byte for byte, or masked line by line);
    set ``nd.result``: the exit status, "stopped" once ``stop`` is set, Interrupted when SSH stays
    unreachable, or the exception that ended it."""
    from ..remote import jobs
    from . import recovery

    def on_poll(conn) -> None:
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
            status, nd.conn = jobs.follow_reconnecting(nd.connect, nd.run_dir, log_name, jobs.LogCursor(deliver),
                                                       conn=nd.conn, unreachable_s=unreachable_s, on_poll=on_poll,
                                                       log=note)
            nd.result = status
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

    def __init__(self, path: Path, max_bytes: int = MAX_LOG_BYTES):
        self.path, self.max_bytes, self.written, self.f, self.capped = path, max_bytes, 0, None, False

    def __enter__(self):
        self.f = open(self.path, "wb", buffering=0)
        return self

    def write(self, data: bytes) -> None:
        room = self.max_bytes - self.written
        if room > 0:
            self.f.write(data[:room])
            self.written += min(len(data), room)
        if len(data) > room and not self.capped:
            self.capped = True
            self.f.write(f"\n[ec2gpu: this log stops at {self.max_bytes:,} bytes; the job's whole log is "
                         "job.log on the instance while it runs]\n".encode())

    def __exit__(self, *exc) -> None:
        self.f.close()


def stop_job(nd: Node, log) -> None:
    """SIGTERM the node's job: its agent, which passes it to the job's process group (torchrun and
    its workers). A node that cannot be reached is reported through ``log``; teardown ends it anyway."""
    from ..errors import RemoteError, WaitTimeout
    from ..remote import jobs, ssh
    try:
        conn = nd.connect()
        try:
            ssh.run(conn, f"pkill -TERM -P {nd.pid} || true", timeout_s=20)
        finally:
            conn.close()
    except (*jobs.CONNECTION_ERRORS, RemoteError, WaitTimeout) as exc:
        log(f"node {nd.index} ({nd.instance_id}): could not stop its job ({type(exc).__name__}: {exc}); "
            "terminating the instance ends it")


def _describe(result) -> str:
    return f"exit status {result}" if isinstance(result, int) else f"{type(result).__name__}: {result}"
