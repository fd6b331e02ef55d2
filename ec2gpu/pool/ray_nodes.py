"""Ray on a pool's nodes, as the controller drives it over SSH (pool/attempt.py's PoolDriver):
this machine's Ray version checked and installed there, Ray started on the head and the workers
(ec2gpu/pool/node.py, detached from SSH, with the pool's token), a replacement joined, a released
worker's Ray stopped, and the driver (ec2gpu/pool/driver.py) started on the head under the agent.
"""
from __future__ import annotations

import json
import re
import secrets
import shlex
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from .. import words
from ..aws import catalog
from ..errors import RemoteError, UsageError, WaitTimeout
from ..remote import files, jobs, ssh
from ..runs.execute import engine
from ..runs.execute import nodes as run_nodes
from ..runs.plan import limits
from ..tasks import resolve
from .driver import TOKEN_FILE

if TYPE_CHECKING:
    from ..runs.job import TaskJob
    from ..runs.execute.nodes import Node
    from ..runs.options import PoolOptions
    from ..settings import Settings

HERE = Path(__file__).parent
#: what the driver imports from beside it on the head (name there: file of ec2gpu here): ec2gpu's
#: one unpacker (pool/driver._unpack) with the name checks it makes, stdlib only
SHIPPED = {"ec2gpu_unpack.py": "wire/unpack.py"}
HEAD_PORT_WAIT_S = 300.0  # the head's Ray starts within this (s; node.py tries up to 3 times)
WORKER_JOIN_WAIT_S = 120.0  # the driver starts once every worker's Ray is up, or this has passed (s)
#: the Ray a pool runs on: the `pool` extra's (pyproject.toml; tests/unit/test_pool_ray_private_parts.py
#: checks they agree). Token authentication came in Ray 2.52
#: (https://docs.ray.io/en/latest/ray-security/token-auth.html); an older Ray ignores RAY_AUTH_MODE
#: and lets anyone who reaches its ports in. 2.60: node.py's flags and drain timeout (pyproject.toml)
RAY_REQUIREMENT = "ray>=2.60,<3"
MIN_RAY = (2, 60)


def ray_version() -> str:
    """This machine's Ray (the `pool` extra), which check_ray installs on the nodes. Raises
    UsageError, with the install line, without it or when it is older than MIN_RAY."""
    try:
        version = metadata.version("ray")
    except metadata.PackageNotFoundError:
        raise UsageError("an array or a sweep runs on Ray, which is not installed here",
                         "pip install 'ec2gpu[pool]'") from None
    got = re.match(r"(\d+)\.(\d+)", version)
    if got is None or (int(got[1]), int(got[2])) < MIN_RAY:
        raise UsageError(f"an array or a sweep needs Ray {MIN_RAY[0]}.{MIN_RAY[1]} or later (Ray's token "
                         f"authentication keeps strangers off the pool); this machine has Ray {version[:40]}",
                         f"pip install {RAY_REQUIREMENT!r}")
    return version


def ray_here(sandbox_shim: Callable[[], object] | None = None) -> str:
    """What a pool needs on this machine, checked before anything is created: its Ray
    (ray_version), and in the sandbox ``sandbox_shim()``, given by api/ (sandbox/bindshim.for_sandbox:
    pool/ never imports sandbox/), which builds the bind shim that keeps each instance's Ray on its
    own loopback address. Returns the Ray version. Raises UsageError for either."""
    version = ray_version()
    if sandbox_shim is not None:
        sandbox_shim()
    return version


def new_token() -> str:
    """A pool's Ray token (Ray's token authentication): 256 random bits, as hex, made here for
    one attempt's pool and never written anywhere but its nodes' driver.TOKEN_FILE."""
    return secrets.token_hex(32)


def check_ray(nd: Node, want: str, log: Callable[[str], None]) -> None:
    """Make the node's Python have Ray ``want`` (this machine's version: the driver's pickles and
    Ray's protocol need the same on both sides): kept when it has it, else installed with pip.
    Raises RemoteError when it cannot be."""
    python = shlex.quote(str(nd.info.get("python") or "python3"))
    probe = f"{python} -c 'import ray; print(ray.__version__)' 2>/dev/null"
    got = ssh.attempt(nd.conn, probe, timeout_s=120)
    have = (got.stdout.strip().splitlines() or [""])[-1][:40]
    if got.ok and have == want:
        return
    log(f"Ray {want} (this machine's) for the pool: installing it there (it has {have or 'none'})")
    done = ssh.attempt(nd.conn, f"{python} -m pip install -q 'ray=={want}'", timeout_s=900)
    if not done.ok:
        raise RemoteError(f"could not install Ray {want} on node {nd.index} ({nd.instance_id})",
                          "bake it into an image with the task's setup (ec2gpu image bake), or pin this machine's "
                          "Ray to one the instance can install", command="pip install ray", host=nd.host,
                          exit_status=done.exited, tail=(done.stdout + done.stderr)[-2000:])


def node_gpus(nd: Node, job: TaskJob) -> int:
    """The GPUs of node ``nd`` the pool may hand out: its type's, or the count the task asked of
    a larger type (tasks/resolve.gpus_asked)."""
    got = catalog.CATALOG.get(nd.instance.type)
    count = got.gpu_count if got else int(nd.info.get("gpu_count") or 0)
    return resolve.gpus_asked(job.task.resources, nd.instance.type, count) or count


def _cpus(nd: Node) -> int:
    got = catalog.CATALOG.get(nd.instance.type)
    return got.vcpus if got else 1


Each = Callable[[Callable[["Node"], Any], list["Node"]], dict[int, Any]]  # start_ray's ``each``


def start_ray(nodes: list[Node], addresses: dict[int, str], job: TaskJob, log: Callable[[str], None],
              token: str, end_with_head: bool = False, each: Each | None = None) -> str:
    """Start Ray on every node (the head first; ec2gpu/pool/node.py) with the pool's ``token``
    (new_token) and return the head's address (IP:PORT). Each node's Ray runs detached from SSH in
    ``RUN_DIR/ray`` (``nd.pid``: its process group); with ``end_with_head`` a worker ends its
    instance once its Ray ends by itself (node.py's --end-instance: the head gone). ``each(fn,
    workers)`` runs a step on the workers at once and returns {node index: result} of those still
    in the pool (PoolDriver's: runs/execute/attempt.on_nodes, which drops a worker lost meanwhile;
    default: all of them, the first error raised). Raises RemoteError / WaitTimeout when the
    head's Ray does not start."""
    def launch(nd: Node, role: list[str]) -> None:
        launch_ray(nd, role, addresses[nd.index], job, token)

    on = each or _every
    head = nodes[0]
    launch(head, ["head", "--ready-file", f"{head.run_dir}/ray/ready"])
    raw = wait_ready(head, HEAD_PORT_WAIT_S) or ""
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise RemoteError(f"Ray's head on {head.instance_id} gave no GCS port", "its log is above",
                          command="ray start --head", host=head.host)
    address = f"{addresses[0]}:{int(raw)}"
    workers = nodes[1:]
    launched = on(lambda nd: launch(nd, worker_role(address, nd, end_with_head)), workers)
    workers = [nd for nd in workers if nd.index in launched]
    joined = on(lambda nd: wait_ready(nd, WORKER_JOIN_WAIT_S, required=False) is not None, workers)
    late = [nd.instance_id for nd in workers if nd.index in joined and not joined[nd.index]]
    up = 1 + sum(1 for ok in joined.values() if ok)
    log(f"Ray started on {up} of {words.count(up + len(late), 'node')}, head {address}"
        + (f"; not yet on {', '.join(late)} (they join when they can, or are let go)" if late else ""))
    return address


def _every(fn: Callable[[Node], Any], nodes: list[Node]) -> dict[int, Any]:
    """``fn`` on every node at once, {node index: result} (run_nodes.parallel: the first error raised)."""
    return {nd.index: got for nd, got in zip(nodes, run_nodes.parallel(fn, nodes), strict=True)}


def join_ray(nd: Node, address: str, head_address: str, job: TaskJob, log: Callable[[str], None],
             token: str, end_with_head: bool = False) -> None:
    """Make node ``nd`` (a replacement, at private ``address``) a worker of the Ray whose head is
    at ``head_address`` (IP:PORT), with the pool's ``token``: this machine's Ray version there
    (check_ray), Ray started (``end_with_head``: start_ray's), its ready file waited for. Raises
    RemoteError, WaitTimeout."""
    check_ray(nd, ray_version(), log)
    launch_ray(nd, worker_role(head_address, nd, end_with_head), address, job, token)
    wait_ready(nd, WORKER_JOIN_WAIT_S)


def worker_role(head_address: str, nd: Node, end_with_head: bool) -> list[str]:
    """node.py's arguments for a worker of the head at ``head_address`` (IP:PORT) (pure)."""
    return ["worker", "--address", head_address, "--ready-file", f"{nd.run_dir}/ray/ready",
            *(["--end-instance"] if end_with_head else [])]


def launch_ray(nd: Node, role: list[str], address: str, job: TaskJob, token: str) -> None:
    """Start Ray (ec2gpu/pool/node.py with ``role``: ["head", ...] or ["worker", "--address",
    HEAD, ...]) on node ``nd``, whose private address is ``address``, detached from SSH in
    ``RUN_DIR/ray`` (``nd.pid``: its process group), declaring the node's GPUs and vCPUs; the
    pool's ``token`` in its driver.TOKEN_FILE, which node.py is given by name, written 0600 by the
    command that starts it (remote/jobs.start's ``private``: the token on its stdin). What the
    task's setup (the same user, earlier) left under those names, a link among them, is removed
    first, never written through."""
    ray_dir = f"{nd.run_dir}/ray"  # TOKEN_FILE's directory: jobs.start writes its private files where it starts
    files.make_dirs(nd.conn, ray_dir)
    ssh.run(nd.conn, f"rm -f -- {shlex.quote(ray_dir + '/node.py')}")
    files.put_file(nd.conn, HERE / "node.py", f"{ray_dir}/node.py")
    python = str(nd.info.get("python") or "python3")
    nd.pid = jobs.start(nd.conn, ray_dir, [python, f"{ray_dir}/node.py", *role, "--ip", address,
                                           "--gpus", str(node_gpus(nd, job)), "--cpus", str(_cpus(nd)),
                                           "--token-file", f"{nd.run_dir}/{TOKEN_FILE}"],
                        private={TOKEN_FILE.rsplit("/", 1)[1]: token})


def wait_ready(nd: Node, timeout_s: float, required: bool = True) -> str | None:
    """The text of the node's ready file (ec2gpu/pool/node.py: the head's GCS port, a worker's
    "up") once its Ray is up, within ``timeout_s`` (s). Raises RemoteError when its Ray ended
    first, WaitTimeout when it does not come (``required``; else None for either)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw = jobs.read_from(nd.conn, f"{nd.run_dir}/ray/ready", 0, 16).decode("ascii", "replace").strip()
        if raw:
            return raw
        if jobs.exit_status(nd.conn, f"{nd.run_dir}/ray") is not None:
            if not required:
                return None
            raise RemoteError(f"Ray did not start on {nd.instance_id}", "its log is above", command="ray start",
                              host=nd.host, tail=jobs.tail(nd.conn, f"{nd.run_dir}/ray/console.log"))
        time.sleep(0.5)
    if not required:
        return None
    raise WaitTimeout(f"Ray did not start on {nd.instance_id} within {timeout_s:.0f} s")


def stop_ray(nd: Node, log: Callable[[str], None]) -> None:
    """End node ``nd``'s Ray: SIGTERM to its process group (it leaves at once: node.py's
    HEALTH_CHECKS), without waiting, as its instance is terminated next; a node that cannot be
    reached is left to that termination."""
    if nd.pid is None:
        return
    try:
        ssh.run(nd.conn, f"kill -TERM -- -{int(nd.pid)} 2>/dev/null; true", timeout_s=20)
    except (*jobs.CONNECTION_ERRORS, RemoteError, WaitTimeout) as exc:
        log(f"node {nd.index} ({nd.instance_id}): Ray not stopped ({type(exc).__name__}); its instance ends anyway")


def start_driver(head: Node, spec: dict[str, Any], opts: PoolOptions, settings: Settings,
                 handover: str | None = None) -> None:
    """Put the driver, what it imports (SHIPPED) and pool.json on the head (what the task's setup
    left under those names, a link among them, removed first: never written through) and start
    the driver under the agent (runs/execute/engine.start_agent, after the setup and all it left;
    ``handover``: the hand-over's document, which the agent reads from RUN_DIR/handover.json,
    runs/recover/handover.py), through the head's RUN_DIR/ray/node.py (``node.py driver``: the
    environment of the node's own Ray, the pool's token and in the sandbox the bind shim)."""
    put = {"pool_driver.py": HERE / "driver.py", **{name: HERE.parent / module for name, module in SHIPPED.items()}}
    ssh.run(head.conn, f"cd {shlex.quote(head.run_dir)} && rm -f -- pool.json "
                       + " ".join(shlex.quote(name) for name in put))
    for name, local in put.items():
        files.put_file(head.conn, local, f"{head.run_dir}/{name}")
    files.write_text(head.conn, f"{head.run_dir}/pool.json", json.dumps(spec))
    python = str(head.info.get("python") or "python3")
    grace = settings.limit_grace_seconds
    at = limits.stop_at(head.instance, opts.max_runtime_minutes, grace)
    limit = [] if at is None else ["--limit-at", f"{at:.0f}", "--limit-grace",
                                   f"{limits.grace_seconds(cast(int, opts.max_runtime_minutes), grace):.0f}"]
    engine.start_agent(head, [
        *engine.agent_command(python, head.run_dir), "--dir", head.run_dir, "--env-file", f"{head.run_dir}/job.env.json",
        "--key-file", f"{head.run_dir}/agent.key", *limit,
        *(["--handover-file", f"{head.run_dir}/handover.json"] if handover is not None else []),
        "--", *driver_argv(python, head.run_dir, spec["head_ip"])], handover)


def driver_argv(python: str, run_dir: str, head_ip: str) -> list[str]:
    """The driver's command line under the head's agent (pure): RUN_DIR/ray/node.py (put there by
    launch_ray) gives it its Ray's environment for ``head_ip``, the head's own address, then
    becomes ``python RUN_DIR/pool_driver.py RUN_DIR/pool.json``."""
    return [python, f"{run_dir}/ray/node.py", "driver", "--ip", head_ip, "--token-file", f"{run_dir}/{TOKEN_FILE}",
            "--", python, f"{run_dir}/pool_driver.py", f"{run_dir}/pool.json"]
