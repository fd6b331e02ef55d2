"""The pool's Ray driver: runs on the pool's head under the agent; stdlib and Ray only.

The agent starts it through the head's RUN_DIR/ray/node.py (``node.py driver``), which gives it
the environment of the node's own Ray (pool/node.ray_env: the pool's token file named to Ray, read
when Ray is imported; in the sandbox the bind shim, preloaded, that keeps the servers of its
``ray.init`` on the head's own address).

It reads ``pool.json`` (written by ec2gpu/pool/attempt.py), connects to the pool's Ray cluster,
and runs each element of the array as a Ray task holding ``gpus_per_job`` GPUs (Ray sets
CUDA_VISIBLE_DEVICES per task). A task runs the task's ``run`` in the node's workdir with the
node's job environment, the element's EC2GPU_ARRAY_INDEX/SIZE, its sweep parameters, and an
output directory of its own; it returns the exit status, the log's last lines and the outputs
(a tar, at most ``max_output_bytes``), which the driver unpacks on the head under
``out/<index>/`` with ec2gpu's one unpacker (wire/unpack.py, shipped beside this file as
ec2gpu_unpack.py: regular files only, names checked, tarfile's "data" filter, at most
``max_output_bytes`` and MAX_OUTPUT_FILES files).

Retries: an element on a node that was lost (a spot interruption, a dead instance) is run again
by Ray itself (``max_retries`` of the task: Ray's fault tolerance,
https://docs.ray.io/en/latest/ray-core/fault_tolerance/tasks.html); an element whose ``run`` exits
non-zero is submitted again by the driver, up to the pool's ``max_retries``. A small actor on the
head counts each element's attempts and where each runs.

It writes its element table ``pool/table.json`` (atomically, about once a second, and at the end): counts (done,
running, queued, failed), the live nodes and how many elements each runs, and one record per
element (index, status, attempts, node, seconds, exit status, last lines). The controller reads
it as hostile input (ec2gpu/runs/element_table.py).

The controller shrinks the pool. With ``controller_silent_s`` in pool.json (the run's hand-over
wait, runs/recover/handover.py) the driver does it itself once the controller's heartbeat has been
silent that long (a controller lost): when no element waits, each worker that runs none ends its
instance (_release), so that idle workers do not bill until the run's max runtime.

Exit status: 0 when every element succeeded, 1 when one failed, 2 for a bad pool.json.
"""
from __future__ import annotations

import importlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import time
import typing

if __package__:  # in the package (tests)
    from ..wire import unpack as unpacking
else:  # on the head: beside this file (pool/ray_nodes.SHIPPED)
    unpacking = importlib.import_module("ec2gpu_unpack")

#: The element's keeper (``python -I -c REAPER PARENT_PID GRACE_S -- ARGV``), between the Ray worker
#: and the element: it asks Linux for SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG; a
#: Ray worker killed with SIGKILL, by Ray's memory monitor for one, cannot pass anything on), runs
#: the element in a process group of its own, and on SIGTERM (or once the element exits) ends that
#: whole group: SIGTERM, then SIGKILL after GRACE_S. Without it, an element's processes outlived a
#: killed worker, holding its GPU until the instance ended. Exit status: the element's, or 128+N
#: for a signal N (a shell's convention).
REAPER = r"""
import ctypes, os, signal, subprocess, sys, time
parent, grace, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[4:]
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (linux/prctl.h: 1)
except (AttributeError, OSError):
    pass
child = None

def end_group():
    if child is None:
        return
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(child.pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass

def on_term(signum, frame):
    end_group()
    try:
        if child is not None:
            child.wait(timeout=1)
    except subprocess.TimeoutExpired:
        pass
    sys.exit(128 + signum)

signal.signal(signal.SIGTERM, on_term)  # before the element starts: a death signal never leaves it alone
if os.getppid() != parent:  # the worker died before the death signal was set
    sys.exit(128 + signal.SIGTERM)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # held while the element starts, then handled
child = subprocess.Popen(argv, start_new_session=True,  # the element's own mask: SIGTERM not held
                         preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
code = child.wait()
try:
    os.killpg(child.pid, signal.SIGKILL)  # what the element left running in its group ends with it
except OSError:
    pass
sys.exit(code if code >= 0 else 128 - code)
"""
#: the pool's Ray token on each node, in its run directory: written 0600 over the run's SSH
#: connection by the controller (pool/ray_nodes.launch_ray), named to Ray as RAY_AUTH_TOKEN_PATH in
#: the environment of the node's Ray and of this driver (pool/node.ray_env)
TOKEN_FILE = "ray/auth_token"
REAPER_GRACE_S = 10.0  # an element's group gets this long between SIGTERM and SIGKILL (s)
NODE_LOSS_RETRIES = 8  # Ray's retries of an element whose node was lost (not counted as its failures)
TAIL_LINES = 20
STATUS_EVERY_S = 1.0
MAX_OUTPUT_FILES = unpacking.MAX_LISTED  # an element's files unpacked: the most that come home from a listing


def _write_json(path: str, data: object) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _tail(path: str, lines: int = TAIL_LINES, max_bytes: int = 16384, line_chars: int | None = 512) -> list[str]:
    """The last ``lines`` lines of the last ``max_bytes`` of ``path``, each at most ``line_chars``."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line if line_chars is None else line[:line_chars] for line in text.splitlines()[-lines:]]


def _pack(directory: str, max_bytes: int) -> tuple[bytes, str | None]:
    """A tar of ``directory``'s regular files (at most ``max_bytes`` of them in all), and what was
    left out, in words (None: nothing)."""
    buf, total, skipped = io.BytesIO(), 0, []
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for root, dirs, names in os.walk(directory):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(root, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    skipped.append(os.path.relpath(path, directory))
                    continue
                size = os.path.getsize(path)
                if total + size > max_bytes:
                    skipped.append(os.path.relpath(path, directory))
                    continue
                total += size
                tar.add(path, arcname=os.path.relpath(path, directory), recursive=False)
    why = None if not skipped else f"{len(skipped)} file(s) left out (links, or past {max_bytes:,} bytes)"
    return buf.getvalue(), why


def keep(argv: list[str], cwd: str, env: dict[str, str], log: typing.IO[bytes]) -> int:
    """Run ``argv`` under its keeper (REAPER) with output to ``log`` (a file); return its exit
    status. Interrupted here (Ray cancelling the task), the keeper gets SIGTERM and ends the
    element's group before this returns (SIGKILL, which subprocess.run would send, would leave it)."""
    # -I: isolated (no workdir or PYTHONPATH module shadows the keeper's stdlib)
    proc = subprocess.Popen([sys.executable, "-I", "-c", REAPER, str(os.getpid()), str(REAPER_GRACE_S), "--", *argv],
                            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        return proc.wait()
    except BaseException:
        proc.terminate()
        try:
            proc.wait(REAPER_GRACE_S + 5)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise


def run_element(spec: dict[str, typing.Any], element: dict[str, typing.Any], tracker: object) -> dict[str, typing.Any]:
    """One attempt of one element on whichever node Ray chose (a Ray task's body)."""
    import ray
    node = ray.util.get_node_ip_address()
    index = element["index"]
    ray.get(tracker.started.remote(index, node))  # type: ignore[attr-defined]
    run_dir = os.path.expanduser(f"~/ec2gpu/runs/{spec['run_id']}")
    edir = f"{run_dir}/elements/{index}"
    out = f"{edir}/out"
    subprocess.run(["rm", "-rf", out], check=False)  # an attempt starts with an empty output directory
    os.makedirs(out, exist_ok=True)
    os.makedirs(f"{edir}/checkpoints", exist_ok=True)
    with open(f"{run_dir}/job.env.json") as f:  # this node's job environment (engine.node_env)
        env = {**os.environ, **json.load(f)}
    if "CUDA_VISIBLE_DEVICES" in os.environ:  # the GPUs Ray gave this task, not the node's (allow_larger's) list
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    env.update({k: str(v) for k, v in element["params"].items()})
    # each element is a one-node job on this node, holding the GPUs Ray gave it
    gpus = str(spec["gpus_per_job"])
    env.update({"EC2GPU_ARRAY_INDEX": str(index), "EC2GPU_ARRAY_SIZE": str(element["size"]),
                "EC2GPU_OUTPUT_DIR": out, "EC2GPU_CHECKPOINT_DIR": f"{edir}/checkpoints",
                "EC2GPU_ELEMENT_ATTEMPT": str(element["attempt"]), "EC2GPU_POOL_HEAD_IP": spec["head_ip"],
                "EC2GPU_NUM_NODES": "1", "EC2GPU_NODE_RANK": "0", "EC2GPU_HEAD_IP": node,
                "EC2GPU_GPUS_PER_NODE": gpus, "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_RANK": "0",
                "SKYPILOT_NODE_IPS": node, "SKYPILOT_NUM_GPUS_PER_NODE": gpus})
    started = time.time()
    with open(f"{edir}/job.log", "ab") as log:
        exit_status = keep(spec["script"] + list(element.get("args", [])), env.get("EC2GPU_WORKDIR") or run_dir,
                           env, log)
    seconds = time.time() - started
    tar, left = _pack(out, int(spec["max_output_bytes"]))
    ray.get(tracker.ended.remote(index))  # type: ignore[attr-defined]
    return {"index": index, "exit_status": exit_status, "node": node, "seconds": round(seconds, 3),
            "tail": _tail(f"{edir}/job.log"), "outputs": tar, "outputs_left_out": left,
            "log": _tail(f"{edir}/job.log", lines=10**6, max_bytes=int(spec["max_log_bytes"]), line_chars=None)}


class Tracker:
    """The head's count of each element's attempts and of where each one runs (a Ray actor)."""

    def __init__(self) -> None:
        self.attempts: dict[int, int] = {}
        self.running: dict[int, str] = {}
        self.nodes: dict[int, list[str]] = {}

    def started(self, index: int, node: str) -> None:
        self.attempts[index] = self.attempts.get(index, 0) + 1
        self.running[index] = node
        self.nodes.setdefault(index, []).append(node)

    def ended(self, index: int) -> None:
        self.running.pop(index, None)

    def state(self) -> tuple[dict[int, int], dict[int, str], dict[int, list[str]]]:
        return self.attempts, self.running, self.nodes


def _unpack(tar: bytes, target: str, max_bytes: int) -> None:
    """Unpack an element's outputs (``tar``, from its Ray task) under ``target`` with the one
    unpacker: at most MAX_OUTPUT_FILES files and ``max_bytes`` bytes, what is within the rules
    written. Raises tarfile.TarError naming what was not (a member refused, the first one over the
    limits, an archive cut short)."""
    got = unpacking.unpack(io.BytesIO(tar), target, max_files=MAX_OUTPUT_FILES, max_bytes=max_bytes)
    said = got.warnings("outputs", "the rest stays in the element's directory on its worker")
    if said:
        raise tarfile.TarError("; ".join(said)[:2000])


def main(argv: list[str]) -> int:  # noqa: C901 - one loop that reads as the driver's life
    import ray  # the pool's token named in this process's environment already (RUN_DIR/ray/node.py driver)
    with open(argv[0]) as f:
        spec = json.load(f)
    try:
        elements = list(spec["elements"])
        address, gpus, max_retries = spec["address"], int(spec["gpus_per_job"]), int(spec["max_retries"])
    except (KeyError, TypeError, ValueError) as exc:
        print(f"pool.json: {exc}", file=sys.stderr)
        return 2
    run_dir = os.path.dirname(os.path.abspath(argv[0]))
    status_path = f"{run_dir}/pool/table.json"  # runs/element_table.TABLE (this file ships alone: a test compares them)
    os.makedirs(f"{run_dir}/pool/logs", exist_ok=True)
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    head = ray.get_runtime_context().get_node_id()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    tracker = ray.remote(Tracker).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
    task = ray.remote(run_element).options(num_gpus=gpus, num_cpus=0, max_retries=NODE_LOSS_RETRIES,
                                           retry_exceptions=False)
    records = {e["index"]: {"index": e["index"], "status": "queued", "attempts": 0, "failures": 0,
                            "params": e["params"]} for e in elements}
    pending: dict[typing.Any, dict[str, typing.Any]] = {}  # Ray's ObjectRef -> its element

    def submit(element: dict[str, typing.Any]) -> None:
        element = {**element, "attempt": records[element["index"]]["failures"] + 1}
        pending[task.remote(spec, element, tracker)] = element

    for element in elements:
        submit(element)
    print(f"pool: {len(elements)} element(s) submitted, {gpus} GPU(s) each", flush=True)
    last, started_at = 0.0, time.time()
    released: dict[str, str] = {}  # Ray node id -> address: the workers this driver let go (_release)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=STATUS_EVERY_S)
        if ready:  # and every other one that is ready: one status write for all of them
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in ready:
            element = pending.pop(ref)
            rec = records[element["index"]]
            try:
                res = ray.get(ref)
            except ray.exceptions.RayError as exc:  # retries on lost nodes exhausted, or Ray's own failure
                res = {"exit_status": None, "error": type(exc).__name__, "tail": [], "outputs": b"", "log": []}
            ok = res.get("exit_status") == 0
            rec.update({k: res.get(k) for k in ("exit_status", "node", "seconds", "tail", "error")})
            if not ok:
                rec["failures"] += 1
                if rec["failures"] <= max_retries and res.get("exit_status") is not None:
                    print(f"element {rec['index']}: exit status {res['exit_status']}, run again "
                          f"({rec['failures']} of {max_retries} retries)", flush=True)
                    submit(element)
                    continue
            rec["status"] = "succeeded" if ok else "failed"
            rec["ended_at"] = round(time.time(), 3)
            with open(f"{run_dir}/pool/logs/{rec['index']}.log", "w") as f:
                f.write("\n".join(res.get("log") or []) + "\n")
            if res.get("outputs"):
                try:
                    _unpack(res["outputs"], f"{run_dir}/out/{rec['index']}", int(spec["max_output_bytes"]))
                except (tarfile.TarError, OSError) as exc:
                    rec["outputs_error"] = f"{type(exc).__name__}: {exc}"
            if res.get("outputs_left_out"):
                rec["outputs_left_out"] = res["outputs_left_out"]
            print(f"element {rec['index']}: {rec['status']} on {rec.get('node')} in {rec.get('seconds')} s", flush=True)
        if time.monotonic() - last >= STATUS_EVERY_S:
            _write_json(status_path, _release(_status(records, tracker, final=False), spec, head, released, started_at))
            last = time.monotonic()
    _write_json(status_path, _release(_status(records, tracker, final=True), spec, head, released, started_at))
    failed = [r["index"] for r in records.values() if r["status"] != "succeeded"]
    print(f"pool: {len(records) - len(failed)} succeeded, {len(failed)} failed", flush=True)
    return 1 if failed else 0


def controller_silent(path: str, silent_s: float, since: float, now: float | None = None) -> bool:
    """Whether the controller's heartbeat (the modification time of ``path``, its ``controller``
    file: runs/recover/handover.Heartbeat) has been silent ``silent_s`` seconds, counted from
    ``since`` (POSIX s: the driver's start) at the earliest."""
    try:
        beat = max(since, os.path.getmtime(path))
    except OSError:
        beat = since
    return (time.time() if now is None else now) - beat >= silent_s


def to_release(queued: int, nodes: list[dict[str, typing.Any]], busy: dict[str, int], head_id: str,
               released: dict[str, str]) -> list[dict[str, typing.Any]]:
    """The worker nodes the driver lets go itself once its controller is silent (pure): none while
    an element waits; else each live node of ``nodes`` (ray.nodes()'s records) but the head that
    runs no element (``busy``: {address: elements running}) and was not let go already."""
    if queued:
        return []
    return [n for n in nodes if n.get("Alive") and n.get("NodeID") != head_id and n.get("NodeID") not in released
            and not busy.get(n.get("NodeManagerAddress", ""))]


def end_node(run_id: str) -> None:
    """A Ray task's body, on a worker the pool lets go: its instance ends (``node.py end``: its
    MOUNT-mode file_mounts written back, then ``shutdown -h now``; a run's instances terminate on
    shutdown)."""
    node = os.path.expanduser(f"~/ec2gpu/runs/{run_id}/ray/node.py")
    subprocess.run([sys.executable, node, "end"], stdin=subprocess.DEVNULL, check=False, timeout=900)


def _release(status: dict[str, typing.Any], spec: dict[str, typing.Any], head_id: str, released: dict[str, str],
             started_at: float) -> dict[str, typing.Any]:
    """Shrink the pool without its controller: once the controller's heartbeat has been silent
    ``spec["controller_silent_s"]`` (its hand-over wait; absent: the controller shrinks the pool
    itself), each worker node to_release names ends its instance (end_node, pinned to it). The
    controller that comes back sees them gone. Returns ``status`` with "released" (their addresses)."""
    silent_s = spec.get("controller_silent_s")
    run_dir = os.path.expanduser(f"~/ec2gpu/runs/{spec['run_id']}")
    if isinstance(silent_s, (int, float)) and controller_silent(f"{run_dir}/controller", silent_s, started_at):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        for n in to_release(status["counts"]["queued"], ray.nodes(), status["nodes"], head_id, released):
            print(f"pool: the controller is silent and no element waits: {n['NodeManagerAddress']} ends its "
                  "instance", flush=True)
            ray.remote(end_node).options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                n["NodeID"], soft=False)).remote(spec["run_id"])
            released[n["NodeID"]] = n["NodeManagerAddress"]
    status["released"] = sorted(released.values())
    return status


def _status(records: dict[int, dict[str, typing.Any]], tracker: object, final: bool) -> dict[str, typing.Any]:
    """The pool's record: counts, live nodes and what each runs, each element's record."""
    import ray
    attempts, running, where = ray.get(tracker.state.remote())  # type: ignore[attr-defined]
    alive = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    busy: dict[str, int] = {ip: 0 for ip in alive}
    counts = {"done": 0, "failed": 0, "running": 0, "queued": 0}
    for index, rec in records.items():
        rec["attempts"] = attempts.get(index, 0)
        rec["nodes"] = where.get(index, [])
        if rec["status"] in ("succeeded", "failed"):
            counts["done" if rec["status"] == "succeeded" else "failed"] += 1
            continue
        node = running.get(index)
        if node in alive:
            rec["status"] = "running"
            busy[node] += 1
            counts["running"] += 1
        else:
            rec["status"] = "queued"
            counts["queued"] += 1
    return {"schema": 1, "final": final, "at": time.time(), "counts": counts, "nodes": busy,
            "elements": sorted(records.values(), key=lambda r: r["index"])}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
