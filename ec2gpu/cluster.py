"""Multi-node runs: N instances, one c10d rendezvous on node 0, PyTorch's ``torchrun`` on each.

No scheduler of our own: every node runs
``python -m torch.distributed.run --nnodes N --nproc-per-node G --rdzv-backend c10d
--rdzv-endpoint <node 0 private IP>:29500 --rdzv-id <run id> -m ec2gpu.train.mnist ...``
(https://pytorch.org/docs/stable/elastic/run.html), node 0 with ``--rdzv-conf is_host=1``, so it
hosts the rendezvous store whatever its address looks like. Standing clusters use elastic bounds
(``--nnodes 1:N``) so `ec2gpu scale` can change the node count between runs.

The controller follows every node's console (all its ranks' lines, prefixed ``node K``), brings
rank 0's checkpoints home, and when one node fails or is lost, stops the others; the run's
teardown then terminates every node. In the sandbox each node is an sshd on its own loopback
address, and that address stands in for the instance's private IP: the rendezvous and gloo's
collectives are real TCP between real processes.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .errors import RemoteError, WaitTimeout

RDZV_PORT = 29500  # torchrun's default rendezvous port (page above)
GRACE_S = 10.0  # after a node fails, how long the others may take to fail or finish by themselves


def torchrun_argv(python: str, nnodes: str, nproc_per_node: int, endpoint: str, run_id: str, is_host: bool,
                  local_addr: str, module_argv: list[str]) -> list[str]:
    """The command line of one node (pure). ``module_argv`` is ['-m', 'ec2gpu.train.mnist', ...];
    ``nnodes`` is 'N', or 'MIN:MAX' for an elastic (standing) cluster."""
    return [python, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
            "--rdzv-conf", f"is_host={1 if is_host else 0}", "--local-addr", local_addr, "--max-restarts", "0",
            *module_argv]


def private_address(instance: dict, resolver=None) -> str:
    """The address other nodes reach ``instance`` at: its private IP, or in the sandbox the loopback
    address of its sshd (which stands in for that private IP)."""
    if resolver:
        return resolver(instance["InstanceId"])[0]
    return instance["PrivateIpAddress"]


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

    @property
    def instance_id(self) -> str:
        return self.instance["InstanceId"]

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


def open_node(nd: Node, aws, settings, prov, run_id: str, resolver, checkpoints, log) -> None:
    """Connect to a node (waiting for SSH; the host key checked against its console output), find
    its run directory, and give it an EC2 watch with its own copy of ``checkpoints`` (a
    recovery.CheckpointHome). The watch exists before SSH answers, so a failed wait can ask EC2
    whether the instance is gone. Raises WaitTimeout, RemoteError (host key)."""
    from dataclasses import replace

    from .aws import instances
    from .remote import jobs, ssh
    from .runs import recovery

    nd.watch = recovery.InstanceWatch(aws.ec2, nd.instance_id, replace(checkpoints), log)
    nd.host, nd.port = ssh.target(nd.instance, resolver)
    known = settings.home / "known_hosts" / nd.instance_id
    nd.connect = lambda: ssh.connect(nd.host, nd.port, settings.ssh_user, prov.key_path, known, log)
    nd.conn = ssh.wait_for_ssh(nd.host, nd.port, settings.ssh_user, prov.key_path, known, log=log,
                               fingerprints=lambda: instances.host_key_fingerprints(aws.ec2, nd.instance_id))
    nd.run_dir = jobs.remote_run_dir(nd.conn, run_id)
    nd.watch.checkpoints.remote = f"{nd.run_dir}/out/checkpoint.pt"


def prepare_node(nd: Node, log) -> None:
    """Run ec2gpu/ami/setup-gpu.sh on the node; ``nd.info`` gets what it found (python, GPUs)."""
    from .remote import setup
    nd.info = setup.setup(nd.conn, nd.run_dir, log=log)


def upload_node(nd: Node, resume: bool, log) -> None:
    """Push the trainer, and when resuming the checkpoint brought home (every rank restores it)."""
    from .remote import jobs, ssh
    size = jobs.push_code(nd.conn, nd.run_dir)
    log(f"uploaded the trainer ({size:,} bytes) to {nd.host}:{nd.run_dir}")
    if resume and nd.watch.checkpoints.local.exists():
        ssh.run(nd.conn, f"mkdir -p {nd.run_dir}/out")
        log(f"pushed the checkpoint ({nd.watch.checkpoints.push(nd.conn):,} bytes); the trainer resumes from it")


class _Stopped(Exception):
    """Raised in a follower when another node failed and the run is stopping."""


def parallel(fn, nodes: list[Node]) -> list:
    """``fn(node)`` for every node at once (setup can take minutes per node); re-raises the first error."""
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return list(pool.map(fn, nodes))


def run_attempt(aws, settings, opts, run_id: str, ui, prov, instances_: list[dict], local_out: Path, resolver,
                n: int, checkpoints, trainer_argv, nnodes: str | None = None) -> dict:
    """Train on a cluster of running instances (node 0 first); return rank 0's summary.json.

    ``trainer_argv(python, out_dir)`` is the trainer's command line (runs/pipeline.trainer_argv).
    ``checkpoints`` (a recovery.CheckpointHome) says where rank 0's checkpoints come home. Raises
    recovery.Interrupted when a node is lost (EC2 reports it gone, SSH unreachable too long, or
    its trainer stopped for a spot notice), RemoteError when a node's job fails (after stopping
    the others), WaitTimeout when SSH never answers.
    """
    from .remote import jobs

    nodes = [Node(k, inst) for k, inst in enumerate(instances_)]

    def say(nd: Node):
        return lambda line: ui.note(f"node {nd.index}: {line}")
    try:
        with ui.phase("waiting for SSH"):
            parallel(lambda nd: open_node(nd, aws, settings, prov, run_id, resolver, checkpoints, ui.note), nodes)
        with ui.phase("setup"):
            parallel(lambda nd: prepare_node(nd, say(nd)), nodes)
        with ui.phase("upload"):
            parallel(lambda nd: upload_node(nd, n > 1, say(nd)), nodes)
        endpoint = f"{private_address(nodes[0].instance, resolver)}:{RDZV_PORT}"
        nproc = processes_per_node(nodes[0].info)
        ui.note(f"torchrun on {len(nodes)} nodes x {nproc} process(es): c10d rendezvous at {endpoint}, id {run_id}")
        threads = []
        if resolver and not nodes[0].info.get("cuda_available"):
            # sandbox nodes share this machine's cores: each takes its share, or their CPU threads
            # fight (2 nodes x 2 threads on 2 cores ran 15x slower than 1 x 2 here)
            threads = ["--threads", str(max(1, (os.cpu_count() or 1) // len(nodes)))]
        with ui.phase("training"):
            for nd in nodes:
                module = trainer_argv(nd.info["python"], f"{nd.run_dir}/out")[1:] + threads
                argv = torchrun_argv(nd.info["python"], nnodes or str(len(nodes)), nproc, endpoint, run_id,
                                     nd.index == 0, private_address(nd.instance, resolver),
                                     module + (["--resume"] if n > 1 else []))
                nd.pid = jobs.start(nd.conn, nd.run_dir, argv)
            follow_all(nodes, ui, local_out, n, opts.unreachable_s)
        _judge(nodes)
        with ui.phase("download"):
            return _download(nodes, local_out)
    except (*jobs.CONNECTION_ERRORS, WaitTimeout, RemoteError):
        for nd in nodes:
            if nd.watch:
                nd.watch.check()  # a lost node explains the failure: Interrupted
        raise
    finally:
        for nd in nodes:
            nd.close()


def follow_all(nodes: list[Node], ui, local_out: Path, attempt: int, unreachable_s: float,
               log_name: str = "console.log", mask=None) -> None:
    """Follow every node's ``log_name`` at once, each line shown as ``node K | line`` (just the line
    for a single node) and teed to attempt-N-node-K.log; ``mask(line)`` hides secrets in both.
    The first node to fail stops the others (their jobs get SIGTERM). Sets each node's
    ``result``. Ctrl-C stops the followers and is re-raised."""
    from .remote import jobs
    from .runs import recovery

    stop = threading.Event()  # followers end at their next poll
    failed = threading.Event()  # a node failed: the others get GRACE_S to end by themselves
    lock = threading.Lock()
    local_out.mkdir(parents=True, exist_ok=True)

    def follow(nd: Node) -> None:
        tee = open(local_out / f"attempt-{attempt}-node-{nd.index}.log", "w" if mask else "wb")

        def emit(line: str) -> None:
            if mask:
                line = mask(line)
                tee.write(line + "\n")
            with lock:
                ui.log(line if len(nodes) == 1 and mask else f"node {nd.index} | {line}")
        lines = jobs.LineSplitter(emit)

        def on_poll(conn) -> None:
            if stop.is_set():
                raise _Stopped()
            nd.watch(conn)
        with tee:
            def deliver(chunk: bytes) -> None:
                if not mask:  # byte for byte; a masked log is written line by line in emit
                    tee.write(chunk)
                lines(chunk)
            try:
                status, nd.conn = jobs.follow_reconnecting(nd.connect, nd.run_dir, log_name, jobs.LogCursor(deliver),
                                                           conn=nd.conn, unreachable_s=unreachable_s, on_poll=on_poll,
                                                           log=lambda m: ui.note(f"node {nd.index}: {m}"))
                nd.result = status
            except _Stopped:
                nd.result = "stopped"
            except jobs.Unreachable as exc:
                nd.result = recovery.Interrupted(str(exc))
            except BaseException as exc:  # noqa: BLE001 - carried to the main thread
                nd.result = exc
            finally:
                lines.flush()
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
    if bad:
        first = bad[0]
        ui.note(f"node {first.index} ({first.instance_id}) ended with {_describe(first.result)}"
                + ("; stopping the other nodes" if len(nodes) > 1 else ""))
        for nd in nodes:
            if nd.result == "stopped":
                stop_job(nd)


def stop_job(nd: Node) -> None:
    """SIGTERM the node's job (torchrun and its workers; the job script then records the exit status)."""
    from .remote import ssh
    with contextlib.suppress(Exception):
        conn = nd.connect()
        try:
            ssh.run(conn, f"pkill -TERM -P {nd.pid} || true", timeout_s=20)
        finally:
            conn.close()


def _describe(result) -> str:
    return f"exit status {result}" if isinstance(result, int) else f"{type(result).__name__}: {result}"


def _judge(nodes: list[Node]) -> None:
    """Turn the nodes' results into the attempt's outcome: return when all exited 0; raise
    Interrupted for a lost node (or a spot notice), the first node's error otherwise."""
    from .runs import recovery

    for nd in nodes:
        if isinstance(nd.result, recovery.Interrupted):
            raise recovery.Interrupted(f"node {nd.index} ({nd.instance_id}): {nd.result.reason}")
    for nd in nodes:
        if isinstance(nd.result, BaseException):
            raise nd.result
    bad = [nd for nd in nodes if nd.result not in (0, "stopped")]
    if not bad:
        return
    for nd in nodes:  # a node EC2 took away explains every other failure
        try:
            nd.watch.check()
        except recovery.Interrupted as why:
            raise recovery.Interrupted(f"node {nd.index} ({nd.instance_id}): {why.reason}")
    tails = {nd.index: _tail(nd, 40) for nd in bad}
    if any("stopped: spot interruption notice" in t for t in tails.values()):  # train/mnist.py's words
        raise recovery.Interrupted(f"node {bad[0].index} ({bad[0].instance_id}): spot interruption notice")
    # the root cause: a node whose worker died of a signal (torchrun: "exitcode : -9"); the others'
    # collectives then failed because that peer vanished
    killed = [nd for nd in bad if re.search(r"exitcode\s*:\s*-\d+", tails[nd.index])]
    first = (killed or bad)[0]
    sig = re.search(r"Signal (\d+) \((SIG\w+)\)|exitcode\s*:\s*-(\d+)", tails[first.index])
    why = "" if not sig else f" (a worker died of {sig.group(2) or _signal_name(int(sig.group(1) or sig.group(3)))})"
    also = [f"node {nd.index} exited {nd.result}" for nd in bad if nd is not first]
    raise RemoteError(f"node {first.index} ({first.instance_id}) exited {first.result}{why}; "
                      + (f"then {', '.join(also)}; " if also else "") + "the other nodes were stopped",
                      "its console is shown above; every node is terminated", exit_status=first.result,
                      host=first.host, command="torchrun ... -m ec2gpu.train.mnist", tail=_root_cause(tails[first.index]))


def _root_cause(console_tail: str) -> str:
    """The trainer's "error:" lines and torchrun's "Root Cause (first observed failure)" block when
    the tail has one, else the tail."""
    at = console_tail.find("Root Cause")
    if at < 0:
        return console_tail
    said = [line for line in console_tail[:at].splitlines() if "error:" in line][-3:]  # the trainer's own words
    return "\n".join(said + [console_tail[at:].strip()])


def _signal_name(number: int) -> str:
    import signal
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(nd: Node, lines: int = 15) -> str:
    from .remote import jobs
    try:
        conn = nd.connect()
    except Exception:
        return ""
    try:
        return jobs.tail(conn, f"{nd.run_dir}/console.log", lines)
    except Exception:
        return ""
    finally:
        conn.close()


def _download(nodes: list[Node], local_out: Path) -> dict:
    """Fetch rank 0's outputs (from whichever node it ran on) and every node's console log."""
    import json

    from .remote import jobs

    rank0 = None
    for nd in nodes:
        if jobs.read_from(nd.conn, f"{nd.run_dir}/out/summary.json", 0):
            rank0 = nd
        (local_out / f"console-node-{nd.index}.log").write_bytes(jobs.read_from(nd.conn, f"{nd.run_dir}/console.log", 0))
    if rank0 is None:
        raise RemoteError("no node has rank 0's summary.json", "see the console-node-K.log files")
    jobs.fetch(rank0.conn, f"{rank0.run_dir}/out", local_out)
    return json.loads((local_out / "summary.json").read_text())
