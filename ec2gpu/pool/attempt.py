"""One attempt of an array or a sweep over a pool of instances, scheduled by Ray.

runs/provision/pipeline.py provisions the pool's instances (up to ``opts.nodes``: as many as EC2
has, pool/grow.py; the run's security group letting members reach each other and nobody else
reach more than SSH) and calls
``run_attempt``. Here: every node is opened, set up and given the workdir as for any run
(runs/execute/engine.py's steps), Ray starts on each (ec2gpu/pool/node.py: node 0 the head), and
the driver (ec2gpu/pool/driver.py) runs on the head under the agent. While it runs, the controller
reads the driver's table.json (ec2gpu/pool/records.py) every POLL_S seconds: the progress line,
and the pool's shrinking: once no element waits, each worker whose node runs none is released
(its Ray node stopped, its instance terminated), so the last element does not keep every
instance billing. A worker that is lost (a spot interruption) takes its running elements with it:
Ray runs them again elsewhere. The outputs (``outputs/<index>/``), each element's log and the
driver's record come home from the head; the run record gets ``pool``: the element table and the
instance count over time.
"""
from __future__ import annotations

import errno
import json
import re
import secrets
import shlex
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from ..errors import RemoteError, UsageError, WaitTimeout
from ..runs.plan.checks import slots_per_node as slots_per_node  # how many a node runs: the run's plan decides it
from ..wire import bounded_json
from . import grow, records
from .driver import TOKEN_FILE

if TYPE_CHECKING:
    from ..aws.instances import Instance
    from ..aws.session import Aws
    from ..backend import Backend
    from ..runs.execute.engine import TaskJob
    from ..runs.execute.nodes import Node
    from ..runs.execute.reporter import ReporterLike
    from ..runs.options import PoolOptions
    from ..runs.provision.resources import Provisioned
    from ..runs.recover.handover import Handover
    from ..runs.recover.recovery import DirCheckpoints
    from ..settings import Settings

HERE = Path(__file__).parent
#: what the driver imports from beside it on the head (name there: file of ec2gpu here): ec2gpu's
#: one unpacker (pool/driver._unpack) and the name checks it uses, both stdlib only
SHIPPED = {"ec2gpu_unpack.py": "remote/unpack.py", "ec2gpu_files.py": "remote/files.py"}
POLL_S = 2.0  # how often the controller reads the driver's status (s)
HEAD_PORT_WAIT_S = 300.0  # the head's Ray starts within this (s; node.py tries up to 3 times)
WORKER_JOIN_WAIT_S = 120.0  # the driver starts once every worker's Ray is up, or this has passed (s)
MAX_ELEMENT_OUTPUT_BYTES = 256 * 1024 * 1024  # one element's outputs, carried home through the head
MAX_ELEMENT_LOG_BYTES = 4 * 1024 * 1024  # one element's log kept on the head (its last bytes)
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
#: the Ray a pool runs on: the `pool` extra's (pyproject.toml; tests/unit/test_pool_ray_private_parts.py
#: checks they agree). Token authentication came in Ray 2.52
#: (https://docs.ray.io/en/latest/ray-security/token-auth.html); an older Ray ignores RAY_AUTH_MODE
#: and lets anyone who reaches its ports in. 2.60: node.py's flags and drain timeout (pyproject.toml)
RAY_REQUIREMENT = "ray>=2.60,<3"
MIN_RAY = (2, 60)


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
        from ..aws.catalog import BILLING_MINIMUM_SECONDS
        total = 0.0
        for nd in self.nodes:
            price = self.usd_per_hour.get(nd.instance_id)
            if price is None:
                return None
            seconds = min(now, self.left_at.get(nd.instance_id, now)) - nd.instance.launched_at.timestamp()
            total += max(float(BILLING_MINIMUM_SECONDS), seconds) * price / 3600
        return round(total, 4)

    def count(self) -> None:
        now = round(time.monotonic() - self.started, 1)
        if not self.timeline or self.timeline[-1][1] != len(self.members):
            self.timeline.append((now, len(self.members), round(time.time(), 3)))


def ray_version() -> str:
    """This machine's Ray (the `pool` extra), which check_ray installs on the nodes. Raises
    UsageError, with the install line, without it or when it is older than MIN_RAY."""
    from importlib import metadata
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
    from ..remote import ssh
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


def _gpus(nd: Node, job: TaskJob) -> int:
    """The GPUs of node ``nd`` the pool may hand out: its type's, or the count the task asked of
    a larger type (tasks/resolve.gpus_asked)."""
    from ..aws import catalog
    from ..tasks.resolve import gpus_asked
    got = catalog.CATALOG.get(nd.instance.type)
    count = got.gpu_count if got else int(nd.info.get("gpu_count") or 0)
    return gpus_asked(job.task.resources, nd.instance.type, count) or count


def _cpus(nd: Node) -> int:
    from ..aws import catalog
    got = catalog.CATALOG.get(nd.instance.type)
    return got.vcpus if got else 1


def start_ray(nodes: list[Node], addresses: dict[int, str], job: TaskJob, log: Callable[[str], None],
              token: str, end_with_head: bool = False) -> str:
    """Start Ray on every node (the head first; ec2gpu/pool/node.py) with the pool's ``token``
    (new_token) and return the head's address (IP:PORT). Each node's Ray runs detached from SSH in
    ``RUN_DIR/ray`` (``nd.pid``: its process group); with ``end_with_head`` a worker ends its
    instance once its Ray ends by itself (node.py's --end-instance: the head gone). Raises
    RemoteError / WaitTimeout when the head's Ray does not start."""
    from ..runs.execute import nodes as N

    def launch(nd: Node, role: list[str]) -> None:
        launch_ray(nd, role, addresses[nd.index], job, token)

    head = nodes[0]
    launch(head, ["head", "--ready-file", f"{head.run_dir}/ray/ready"])
    raw = wait_ready(head, HEAD_PORT_WAIT_S) or ""
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise RemoteError(f"Ray's head on {head.instance_id} gave no GCS port", "its log is above",
                          command="ray start --head", host=head.host)
    address = f"{addresses[0]}:{int(raw)}"
    N.parallel(lambda nd: launch(nd, worker_role(address, nd, end_with_head)), nodes[1:])
    joined = N.parallel(lambda nd: wait_ready(nd, WORKER_JOIN_WAIT_S, required=False) is not None, nodes[1:])
    late = [nd.instance_id for nd, ok in zip(nodes[1:], joined, strict=True) if not ok]
    log(f"Ray started on {len(nodes) - len(late)} of {len(nodes)} node(s), head {address}"
        + (f"; not yet on {', '.join(late)} (they join when they can, or are let go)" if late else ""))
    return address


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
    from ..remote import files, jobs, ssh
    ray_dir = f"{nd.run_dir}/ray"  # TOKEN_FILE's directory: jobs.start writes its private files where it starts
    files.make_dirs(nd.conn, ray_dir)
    ssh.run(nd.conn, f"rm -f -- {shlex.quote(ray_dir + '/node.py')}")
    files.put_file(nd.conn, HERE / "node.py", f"{ray_dir}/node.py")
    python = str(nd.info.get("python") or "python3")
    nd.pid = jobs.start(nd.conn, ray_dir, [python, f"{ray_dir}/node.py", *role, "--ip", address,
                                           "--gpus", str(_gpus(nd, job)), "--cpus", str(_cpus(nd)),
                                           "--token-file", f"{nd.run_dir}/{TOKEN_FILE}"],
                        private={TOKEN_FILE.rsplit("/", 1)[1]: token})


def wait_ready(nd: Node, timeout_s: float, required: bool = True) -> str | None:
    """The text of the node's ready file (ec2gpu/pool/node.py: the head's GCS port, a worker's
    "up") once its Ray is up, within ``timeout_s`` (s). Raises RemoteError when its Ray ended
    first, WaitTimeout when it does not come (``required``; else None for either)."""
    from ..remote import jobs
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
    from ..remote import jobs, ssh
    if nd.pid is None:
        return
    try:
        ssh.run(nd.conn, f"kill -TERM -- -{int(nd.pid)} 2>/dev/null; true", timeout_s=20)
    except (*jobs.CONNECTION_ERRORS, RemoteError, WaitTimeout) as exc:
        log(f"node {nd.index} ({nd.instance_id}): Ray not stopped ({type(exc).__name__}); its instance ends anyway")


def pool_spec(run_id: str, opts: PoolOptions, job: TaskJob, address: str, gpus_per_job: int,
              controller_silent_s: float | None = None) -> dict[str, Any]:
    """pool.json, the driver's input (pure); ``controller_silent_s``: the hand-over wait, after
    which a silent controller counts as lost and the driver shrinks the pool itself (driver._release)."""
    from ..runs.execute.engine import HANDOFF, INTERACTIVE, PROLOGUE
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
        raise UsageError(f"--gpus-per-job {want}: the pool's instances have {node_gpus} GPU(s) each",
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
    itself and the head's agent hands over at once (raises handover.Detached then, with
    ``record["pool"]`` the pool as it started). Raises RemoteError when an element failed (after
    every result came home) or Ray could not start, recovery.Interrupted when the head is lost."""
    from ..remote import jobs, ssh_config as sc
    from ..runs.execute import engine, nodes as N
    from ..runs.recover import recovery

    from dataclasses import replace

    job = cast("TaskJob", opts.task)
    done: dict[str, dict[str, Any]] = record.setdefault("pool_done", {})  # index -> its record, outputs home
    skipped = sorted(int(k) for k in done)
    if done:  # an earlier attempt's head was lost: what it finished (and brought home) is not run again
        opts = replace(opts, elements=tuple(e for e in opts.elements if str(e.index) not in done))
        ui.note(f"pool: {len(done)} element(s) finished in an earlier attempt, their outputs home; "
                f"running the other {len(opts.elements)}")
    nodes = [N.Node(k, inst) for k, inst in enumerate(instances_)]
    pool = Pool(nodes, members={nd.instance_id: nd for nd in nodes}, write_back=any(m.write_back for m in job.mounts))
    pool.count()
    config = settings.home / "ssh" / f"{run_id}.config"
    beating = None  # the heartbeat the head's agent watches (runs/recover/handover.py), while there is a plan
    plan, per_job = None, 1
    try:
        with ui.phase("waiting for SSH"):
            N.parallel(lambda nd: N.open_node(nd, aws, settings, prov, run_id, backend, ui.note), nodes)
            assert prov.key_path is not None
            known = settings.home / "known_hosts"
            sc.write(config, sc.render([sc.HostEntry((nd.instance_id,), nd.host, nd.port, settings.ssh_user,
                                                     prov.key_path, known / nd.instance_id) for nd in nodes], config))
        with ui.phase("setup"):
            N.parallel(lambda nd: N.prepare_node(nd, _say(ui, nd, nodes)), nodes)
        addresses = {nd.index: backend.private_address(nd.instance) for nd in nodes}  # node index -> private address
        with ui.phase("upload"):
            N.parallel(lambda nd: engine.upload_node(nd, job, config, run_id, list(addresses.values()), False, None,
                                                     _say(ui, nd, nodes)), nodes)
            if job.mounts:  # each instance gets its copy; MOUNT-mode ones are written back as it leaves
                N.parallel(lambda nd: engine.mounts_node(nd, job, config, _say(ui, nd, nodes)), nodes)
        with ui.phase("setup"):
            if job.task.setup:
                N.parallel(lambda nd: engine.setup_node(nd, job, _say(ui, nd, nodes)), nodes)
            want = ray_version()
            N.parallel(lambda nd: check_ray(nd, want, _say(ui, nd, nodes)), nodes)
            token = new_token()  # this attempt's pool's, to its nodes over SSH only
            address = start_ray(nodes, addresses, job, ui.note, token, end_with_head=shutdown)
        per_job = gpus_per_job(opts, _gpus(nodes[0], job))
        pool.slots_per_node = max(1, _gpus(nodes[0], job) // per_job)
        head = nodes[0]
        plan = handover.result() if isinstance(handover, Future) else handover
        if plan is not None:
            from ..runs.recover.handover import Heartbeat
            if not opts.detach:  # a controller that stays: its heartbeat (detached, none: the head is on its own)
                engine.mark([head], "controller")
                beating = Heartbeat(lambda: engine.mark([head], "controller"), plan.wait_s).start()
        with ui.phase("running"):  # the first figures at once: `ec2gpu status RUN` knows it for an array
            _write_progress(local_out / PROGRESS_FILE, {
                "done": 0, "total": len(opts.elements), "instances": len(pool.members), "at": round(time.time(), 3),
                "counts": {"done": 0, "failed": 0, "running": 0, "queued": len(opts.elements)}})
            _start_driver(head, pool_spec(run_id, opts, job, address, per_job, plan.wait_s if plan else None), opts,
                          settings, plan.document(True, shutdown, sorted(job.task.secrets), pool=True) if plan else None)
            ui.note(f"pool: {records_words(opts)} over {len(nodes)} instance(s), {per_job} GPU(s) each; the driver "
                    f"runs on the head ({addresses[0]})")
            if not opts.detach:
                limits = settings.download_limits
                pool.usd_per_hour = prices_of(aws, settings, nodes)
                growing = grow.Context(aws, settings, opts, run_id, prov, backend, job, n,
                                       record.setdefault("attempts", []), config,
                                       lambda nd, at, log: join_ray(nd, at, address, job, log, token, shutdown))
                status = _follow(aws, pool, head, opts, addresses, ui,
                                 lambda st: _bring_done(head, st, done, job, local_out, config, ui, limits),
                                 local_out / PROGRESS_FILE, growing)
        if opts.detach:  # after the phase: it ended as it should (its line says "done", not "stopped")
            from ..runs.recover.handover import Detached
            record["pool"] = {**_pool_record(pool, None, opts, per_job), "skipped": skipped, "ended_at": None}
            raise Detached(run_id)
        with ui.phase("download"):
            if pool.write_back:  # the nodes still in the pool (the others wrote theirs back as they left)
                N.parallel(lambda nd: _write_back(nd, ui), list(pool.members.values()))
            status = _home(head, job, local_out, config, ui, opts, done, limits) or status
            if plan is not None:
                engine.mark([head], "collected")
        return _conclude(record, pool, status, opts, per_job, skipped, local_out, head)
    except (*jobs.CONNECTION_ERRORS, WaitTimeout, RemoteError, recovery.Interrupted) as exc:
        lost = exc if isinstance(exc, recovery.Interrupted) else _lost(nodes[0])  # a lost head explains it
        if lost is None:
            raise
        if plan is None or not _handed_over(aws, run_id):  # lost: what it had not brought home runs again
            raise lost from (None if lost is exc else exc)
        pool.left_at.setdefault(nodes[0].instance_id, round(time.time(), 3))
        return _conclude(record, pool, _adopt(aws, run_id, opts, local_out, done, settings.download_limits, ui),
                         opts, per_job, skipped, local_out, nodes[0])
    finally:
        if beating is not None:
            beating.stop()
        for nd in nodes:
            nd.close()
        config.unlink(missing_ok=True)


def _conclude(record: dict[str, Any], pool: Pool, status: dict[str, Any] | None, opts: PoolOptions, per_job: int,
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
                             f"{first['attempts']} attempt(s))" if first else ": the pool's record did not come home"),
                          f"its log: {local_out / 'logs'}; run those again with --array "
                          + ",".join(str(e["index"]) for e in failed[:20]),
                          command="pool", host=head.host, exit_status=first["exit_status"] if first else None,
                          tail="\n".join(first["tail"]) if first else "")
    return {}


def _lost(head: Node) -> Exception | None:
    """recovery.Interrupted when EC2 says the head ``head`` is gone (its watch), else None."""
    from ..runs.recover import recovery
    try:
        if head.watch:
            head.watch.check()
    except recovery.Interrupted as exc:
        return exc
    return None


def _handed_over(aws: Aws, run_id: str) -> bool:
    """Whether the lost head's agent handed over a driver that ended (runs/recover/handover.ended):
    the head ended itself while this controller was away (a laptop asleep past the wait). An S3
    error reads as no: the elements not brought home run again, as for any lost head."""
    from ..errors import Ec2GpuError
    from ..runs.recover import handover
    try:
        return handover.ended(aws, run_id)
    except Ec2GpuError:
        return False


def _adopt(aws: Aws, run_id: str, opts: PoolOptions, local_out: Path, done: dict[str, dict[str, Any]],
           limits: Any, ui: ReporterLike) -> dict[str, Any] | None:
    """What the head handed over while this controller was away, brought home from S3 rather than
    run again (runs/recover/handover.fetch): the outputs (``outputs/<index>/``), the element logs
    and table, the table checked against ``opts.elements`` and completed as _home completes it.
    Returns the table, None when it did not come (an S3 error, or not accepted)."""
    from ..errors import Ec2GpuError
    from ..runs.recover import handover
    job = cast("TaskJob", opts.task)
    try:
        got = handover.fetch(aws, run_id, local_out, limits, ui.note, [e.as_dict() for e in opts.elements])
    except Ec2GpuError as exc:
        ui.note(f"warning: what the pool's head handed over could not be read ({exc.message})")
        return None
    status = got["array"] if got else None
    if status is None:
        return None
    ui.note("the pool's head ended itself after handing the array's results over to S3 while this command was "
            "away: they are home, and its elements are not run again")
    _mask_logs(local_out / "logs", job)  # the agent masked them too: this machine's rule, as for any log home
    return _complete(_masked(status, job), done, job, local_out)


def records_words(opts: PoolOptions) -> str:
    from ..tasks.arrays import describe
    return describe(list(opts.elements))


def _say(ui: ReporterLike, nd: Node, nodes: list[Node]) -> Callable[[str], None]:
    return (lambda line: ui.note(f"node {nd.index}: {line}")) if len(nodes) > 1 else ui.note


def _start_driver(head: Node, spec: dict[str, Any], opts: PoolOptions, settings: Settings,
                  handover: str | None = None) -> None:
    """Put the driver, what it imports (SHIPPED) and pool.json on the head (what the task's setup
    left under those names, a link among them, removed first: never written through) and start
    the driver under the agent (runs/execute/engine.start_agent, after the setup and all it left;
    ``handover``: the hand-over's document, which the agent reads from RUN_DIR/handover.json,
    runs/recover/handover.py), through the head's RUN_DIR/ray/node.py (``node.py driver``: the
    environment of the node's own Ray, the pool's token and in the sandbox the bind shim)."""
    from ..remote import files, ssh
    from ..runs.execute import engine
    from ..runs.plan import limits
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


def _read_status(head: Node, opts: PoolOptions, ui: ReporterLike) -> dict[str, Any] | None:
    from ..remote import jobs
    raw = jobs.read_from(head.conn, f"{head.run_dir}/pool/{records.TABLE}", 0, records.MAX_STATUS_BYTES + 1)
    if not raw:
        return None
    try:
        status = records.parse_status(raw, [e.as_dict() for e in opts.elements])
    except records.BadStatus as exc:
        said = f"warning: the pool's status not accepted ({exc})"
        if said not in getattr(ui, "notes", ()):  # once, not at every poll
            ui.note(said)
        return None
    return _masked(status, cast("TaskJob", opts.task))


def _masked(status: dict[str, Any], job: TaskJob) -> dict[str, Any]:
    """``status`` with each secret value of the task masked in its elements' last lines and errors
    (the job's own lines: a secret it printed is never shown or kept)."""
    if job.secret_values:
        for e in status["elements"]:
            e["tail"] = [job.mask(line) for line in e["tail"]]
            e["error"] = job.mask(e["error"]) if e["error"] else e["error"]
    return status


def _mask_logs(directory: Path, job: TaskJob) -> None:
    """The element logs that came home to ``directory``, each secret value of the task masked
    (each log is at most MAX_ELEMENT_LOG_BYTES: the driver keeps its last bytes)."""
    if not job.secret_values or not directory.is_dir():
        return
    for path in directory.glob("*.log"):
        if path.is_file() and not path.is_symlink():
            text = path.read_text(encoding="utf-8", errors="replace")
            masked = "".join(job.mask(line) for line in text.splitlines(keepends=True))
            if masked != text:
                tmp = path.with_name(f".{path.name}.part")
                tmp.write_text(masked)
                tmp.replace(path)


def _follow(aws: Aws, pool: Pool, head: Node, opts: PoolOptions, addresses: dict[int, str],
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
    from ..aws import instances
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
                    f"{f'replacing {rep.lost}' if rep.lost else 'the pool grows'} ({len(pool.members)} instance(s))")
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
    ui.note(f"pool: {c['queued']} element(s) wait and " + (f"{lost} is lost: launching a replacement" if lost else
            f"the pool has {len(pool.members)} of its {ctx.opts.nodes} instance(s): launching one more"))
    # the next node index: never one a replacement that failed had (its tags and attempt row keep it)
    index = 1 + max([nd.index for nd in pool.nodes] + [int(r["node"]) for r in pool.replacements])
    pool.growing = grow.start(ctx, lost, zone, index, list(addresses.values()), ui)


def _what(lost: str | None) -> str:
    """The words for a Replacement: for a lost worker, or the pool's growth (pure)."""
    return f"replacement for {lost}" if lost else "instance the pool grows by"


def _follow_loop(aws: Aws, pool: Pool, head: Node, opts: PoolOptions, addresses: dict[int, str],
                 ui: ReporterLike, on_status: Callable[[dict[str, Any]], None], progress_path: Path | None,
                 grow_step: Callable[[dict[str, Any] | None], None]) -> dict[str, Any] | None:
    """_follow's loop: a poll every POLL_S; through a dropped SSH connection to the head it
    reconnects (0.5 s doubling to 8 s) for up to ``opts.unreachable_s``, then the head counts as
    lost (recovery.Interrupted: the run goes on as a new attempt where attempts are left)."""
    from ..inert import inert
    from ..remote import jobs
    from ..runs.recover import recovery
    job = cast("TaskJob", opts.task)
    cursor = jobs.LogCursor(jobs.LineSplitter(lambda line: ui.log(inert(job.mask(line)))))
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
    from ..aws import instances
    from ..remote import jobs
    jobs.drain(head.conn, f"{head.run_dir}/job.log", cursor)
    status = state["status"] = _read_status(head, opts, ui) or state["status"]
    if status is not None:
        _shrink(aws, pool, status, addresses, ui)
        progress = _progress(pool, status, len(opts.elements))
        ui.progress(progress)
        _write_progress(progress_path, progress)
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
            from ..runs.recover import recovery
            raise recovery.Interrupted(f"the pool's head ({head.instance_id}) got a spot interruption notice")
        return True, _read_status(head, opts, ui) or status
    grow_step(status)  # only while the driver runs
    return False, status


def prices_of(aws: Aws, settings: Settings, nodes: list[Node]) -> dict[str, float | None]:
    """Each node's compute price (USD/h; None when none is known), as its bill will price it
    (runs/plan/costs.compute_cost: a spot instance its zone's spot price history since its launch,
    an on-demand one the price table; asked once per type, market and zone), for the cost so far
    on the live line."""
    from ..runs.plan import costs
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
                     f"{len(pool.members)} instance(s)" + ("" if cost is None else f"; ${cost:.4f} so far")}


def _write_progress(path: Path | None, progress: dict[str, Any]) -> None:
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


def local_status(home: Path, run_id: str) -> dict[str, Any] | None:
    """An array's or a sweep's status, for `ec2gpu status RUN` on the machine that runs it (None
    for a run that is no array, or that this machine's ledger does not hold): the ledger's state
    ("controller-lost" for a running one whose controller process is gone, as `ec2gpu runs` settles
    it; "detached" True when it left on purpose, `run --detach`) and cost, and "array": the
    counts, instances, ETA (s) and cost so far (USD) of the live line (its progress.json), or once
    the run is over the driver's final counts (pool.json; "final" True). Files that do not parse
    read as absent."""
    from ..errors import LedgerError
    from ..runs.settle import ledger
    try:
        row = ledger.get(home, run_id)
    except (UsageError, LedgerError):
        return None
    if row.get("status") == "detached" or row.get("controller") is None:  # a detached run's is in S3
        return None
    where = Path(str(row.get("artifacts") or "")) if row.get("artifacts") else None
    live = _json_file(where / PROGRESS_FILE) if where else None
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
    array["counts"] = records.counts_of(counts)
    if row["status"] != "running":
        array.update(instances=0, eta_s=None)
    from ..runs.recover import reconcile
    state = reconcile.LOST if row["status"] == "running" and reconcile.controller_gone(row) else row["status"]
    if state != row["status"]:  # its controller is gone: what is left running is not known here
        array.update(instances=None, eta_s=None)
    detached = ((_json_file(where / "run.json") if where else None) or {}).get("detached") is True  # --detach
    return {"run_id": row["run_id"], "state": state, "task": row.get("task"), "array": array,
            "cost_usd": row.get("cost_usd"), "artifacts": str(where), "detached": detached,
            "region": row.get("region")}


def _figure(value: object) -> int | float | None:
    """``value`` when it is a finite number from 0 to 1e12 (not a bool), else None (pure)."""
    import math
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= 1e12:
        return value
    return None


def _json_file(path: Path) -> dict[str, Any] | None:
    try:  # the run directory's records, as this tool wrote them (the element table: the driver's, checked)
        got = bounded_json.loads(path.read_bytes(), max_bytes=records.MAX_TABLE_BYTES, allow_nan=True)
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def _ray_ended(aws: Aws, pool: Pool, iid: str, ui: ReporterLike) -> None:
    """A worker whose Ray has ended (it could not join, or died) is no use to the pool: released."""
    from ..aws import instances
    from ..remote import jobs
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
    times = [e["seconds"] for e in status["elements"] if e["status"] in ("succeeded", "failed") and e["seconds"]]
    if not times or slots < 1:
        return None
    mean, c = sum(times) / len(times), status["counts"]
    return round(mean * (c["queued"] + c["running"] / 2) / slots, 1)


def _shrink(aws: Aws, pool: Pool, status: dict[str, Any], addresses: dict[int, str], ui: ReporterLike) -> None:
    """Release the workers the pool no longer needs (records.idle_workers): Ray stopped on each,
    then its instance terminated (without waiting)."""
    from ..aws import instances
    head = pool.nodes[0].instance_id
    workers = {iid: addresses[nd.index] for iid, nd in pool.members.items() if iid != head}
    idle = records.idle_workers(status, workers)
    for iid in idle:
        nd = pool.members.pop(iid)
        stop_ray(nd, ui.note)  # first: no element starts there meanwhile
        if pool.write_back:  # what its elements wrote under a MOUNT-mode target, before the instance goes
            _write_back(nd, ui, RELEASE_WRITE_BACK_S)
        nd.close()  # before the instance goes: a connection it drops is noise on the user's terminal
        instances.terminate(aws.ec2, [iid], wait=False)
        pool.released.append(iid)
        pool.left_at[iid] = round(time.time(), 3)
        ui.note(f"pool: no element waits, released {iid} ({len(pool.members)} instance(s) left)")
    if idle:
        pool.count()


#: the longest a worker being released may take to write its MOUNT-mode file_mounts back (the
#: pool's loop waits for it: results coming home and loss detection pause meanwhile)
RELEASE_WRITE_BACK_S = 600.0


def _write_back(nd: Node, ui: ReporterLike, timeout_s: float = 6 * 3600) -> None:
    """Node ``nd``'s MOUNT-mode file_mounts written back to their buckets (remote/mounts.write_back:
    what its elements wrote there) within ``timeout_s``; a failure is said, and the run goes on."""
    from ..remote import mounts
    from ..remote.jobs import CONNECTION_ERRORS
    from ..errors import RemoteError
    try:
        mounts.write_back(nd.conn, nd.run_dir, str(nd.info.get("python") or "python3"),
                          lambda line: ui.note(f"node {nd.index}: {line}"), timeout_s=timeout_s)
    except (RemoteError, *CONNECTION_ERRORS) as exc:
        ui.note(f"warning: node {nd.index}: file_mounts not written back ({type(exc).__name__}: {exc})")


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
    from ..remote import files, sync
    from ..errors import RemoteError
    new = [e for e in status["elements"] if e["status"] == "succeeded" and str(e["index"]) not in done]
    if not new:
        return
    warn = lambda line: ui.note(f"warning: {line}")  # noqa: E731
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
    from ..remote import files, sync
    limits = files.Limits()
    names, how = sync.pull(head.conn, f"{head.run_dir}/out", local_out / "outputs", element_patterns(job.task.outputs),
                           config, head.instance_id, limits_, warn=lambda line: ui.note(f"warning: {line}"))
    ui.note(f"outputs: {len(names)} file(s) brought home" + (f" by {how}" if names else "") +
            f" to {local_out / 'outputs'}")
    sync.pull(head.conn, f"{head.run_dir}/pool/logs", local_out / "logs", [], config, head.instance_id,
              limits, warn=lambda line: ui.note(f"warning: {line}"))
    _mask_logs(local_out / "logs", job)
    from ..runs.execute.nodes import copy_log
    local_out.mkdir(parents=True, exist_ok=True)
    copy_log(head.conn, f"{head.run_dir}/job.log", local_out / "job.log", job.mask)  # the driver's: `ec2gpu logs RUN`
    status = _read_status(head, opts, ui)
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
    from ..runs.execute import job_summary
    records.accuracies(status, local_out, job_summary.schema_of(job), job.secret_values)


def _pool_record(pool: Pool, status: dict[str, Any] | None, opts: PoolOptions, per_job: int) -> dict[str, Any]:
    return {"elements": status["elements"] if status else [], "counts": status["counts"] if status else None,
            "size": opts.elements[0].size if opts.elements else 0, "gpus_per_job": per_job,
            "max_retries": opts.max_retries, "workers": len(pool.nodes),
            "instances_over_time": [{"seconds": t, "instances": k, "at": at} for t, k, at in pool.timeline],
            "released": pool.released, "lost": pool.lost, "left_at": pool.left_at,
            "replacements": pool.replacements,
            "ended_at": round(time.time(), 3)}
