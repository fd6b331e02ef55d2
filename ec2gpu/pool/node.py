"""One Ray node of a pool, on its instance: stdlib only; runs ``ray start --block``.

Run by ec2gpu/pool/attempt.py (detached from SSH, its own session, remote/jobs.start): the head
first, then each worker with the head's address (a worker whose Ray fails while starting is started
again, up to START_TRIES times). ``--block`` keeps Ray's processes in this process's group, so
ending the group (SIGTERM, then SIGKILL: Ray's own ``ray stop`` would end every Ray node on the
machine, and a sandbox's instances share one) ends this node alone.

The head's GCS port is Ray's default, 6379, unless something already listens there (another pool
on a machine shared by sandbox instances): then a free one. Once the node's raylet (and the head's
GCS) accepts connections, ``--ready-file`` is written (the head's holds the GCS port): the
controller waits for the head's before it starts the workers, and for theirs before the driver.
A worker started with ``--end-instance`` (a run whose instances do not outlive it) ends its
instance once its Ray ends by itself and the head's GCS does not answer either: its raylet leaves
when the head's GCS has not answered for Ray's reconnect timeout (60 s), so a head that ended (a
lost controller's, after its hand-over) leaves no worker billing. ``node.py end`` ends the node
the same way (end_instance: its MOUNT-mode file_mounts written back first). Ray's ports are reachable only
from the pool's own security group (aws/network.allow_within_group), never from an address.

Every Ray process of the node asks for the pool's token (Ray's token authentication,
https://docs.ray.io/en/latest/ray-security/token-auth.html: RAY_AUTH_MODE=token, the token read
from the 0600 file ``--token-file`` names, which the controller wrote over the run's SSH
connection; never on a command line or in the environment). Its Ray directory (sessions,
sockets, logs) is one of its own, made private (0700, tempfile.mkdtemp) and removed when the
node ends. On a sandbox instance (this machine, whose Ray would listen on every address of
it) Ray's processes get the sandbox's bind shim (ec2gpu/sandbox/bindshim.c): each listens on the
node's own 127.0.0.N; a sandbox instance without one does not start Ray. The pool's driver gets
the same environment from the same function (ray_env): the head's agent starts it as
``node.py driver ... -- python pool_driver.py pool.json`` (run_driver).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping

DEFAULT_GCS_PORT = 6379  # `ray start --head`'s default --port
START_TRIES = 3  # a node whose Ray fails while starting is started again (two on one machine can race for a port)
STARTUP_S = 90.0  # a Ray that does not listen within this failed to start (s)


def gcs_port(preferred: int = DEFAULT_GCS_PORT) -> int:
    """``preferred`` when nothing listens on it on any address, else a free port (Ray's GCS
    listens on every address)."""
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError("no free port for Ray's GCS")


#: Ray's ports with a fixed default, or one it picks and binds later (a race between two nodes of one
#: machine: seen here as "bind: Address already in use" and an agent that failed, when nodes picked
#: random free ports at the same moment): each node takes a block of its own, chosen by its address
#: (ports_for). On EC2 each node has its machine to itself; the block is as good as Ray's defaults.
PORT_FLAGS = ("--object-manager-port", "--node-manager-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
#: ports for Ray's worker processes on this node (--worker-port-list): each worker process (and the
#: driver, an actor, an IO worker) binds one of its own for as long as it lives (Ray's "Configuring
#: Ray", ports: https://docs.ray.io/en/latest/ray-core/configure.html), and the raylet starts as many
#: workers as the node has CPUs (--num-cpus: 96 on p4d, 192 on p5) and one more for each task that
#: blocks in ray.get; with too few every further worker fails "No available ports" and Ray may hang
#: (ray-project/ray#28071). So two per CPU, and WORKER_PORTS more for the driver, actors, IO workers
#: and workers still exiting (worker_ports)
WORKER_PORTS, WORKER_PORTS_PER_CPU = 24, 2
#: how a node leaves: at once on SIGTERM (an instance shutting down, or one the pool lets go), not
#: after Ray's 30 s drain (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, ray/_private/ray_constants.py), which
#: held a lost worker's elements back that long before they ran again (seen here); and a node that
#: falls silent without one is called dead by the head after about 6 s, not Ray's 30 s (its
#: health checks: every 3 s, 10 s timeout, 5 failures; RAY_<name> sets a Ray config value)
HEALTH_CHECKS = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_health_check_period_ms": "1000",
                 "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3"}
PORT_BASE, PORT_BLOCK, PORT_BLOCKS = 11000, 100, 200  # 11000-30999: below Linux's ephemeral ports (32768-)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that nothing listens on now (bound together, then let go)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("0.0.0.0", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


#: each node's private directory goes under here: short, as Ray's Unix sockets are under it
#: (PRIVATE/ray/session_<date>_<time>_<us>_<pid>/sockets/plasma_store.N) and a socket's path is at
#: most 107 bytes (sun_path, unix(7)); never TMPDIR, which may be long
TEMP_ROOT = "/tmp"
SOCKET_PATH_MAX = 107
#: the longest socket path Ray makes under its directory, past the directory itself (bytes):
#: "/session_" 9, the date and time with microseconds 26, "_" and a pid of up to 7 digits 8,
#: "/sockets/plasma_store.NNN" 25 (ray/_private/node.py: session_name, _prepare_socket_file)
SOCKET_TAIL = 68
#: Ray's directory inside the node's private one: Ray makes its directory 0777 (ray/_common/utils.py,
#: try_make_directory_shared), so the privacy is its parent's
RAY_SUBDIR = "ray"


def temp_dir(root: str = TEMP_ROOT) -> str:
    """A new private directory for this node, Ray's directory (sessions, sockets, logs) in it
    (ray_dir): a random name made with O_EXCL (tempfile.mkdtemp: never an earlier node's or
    another pool's on this machine), mode 0700. Raises OSError when it cannot be made, ValueError
    when it is too long for Ray's sockets (the root is then too long)."""
    path = tempfile.mkdtemp(prefix="ec2gpu-ray-", dir=root)
    if len(os.fsencode(ray_dir(path))) + SOCKET_TAIL > SOCKET_PATH_MAX:
        os.rmdir(path)
        raise ValueError(f"{path} is too long for Ray's sockets (at most {SOCKET_PATH_MAX} bytes)")
    return path


def ray_dir(private: str) -> str:
    """Ray's directory (``--temp-dir``) in the node's private one (pure)."""
    return os.path.join(private, RAY_SUBDIR)


#: the sandbox names its bind shim (ec2gpu/sandbox/bindshim.py) in its instances' environment; the
#: shim reads the address to bind from BIND_VAR; MARKER is in every sandbox session's (sandbox/sshd.py)
SHIM_VAR, BIND_VAR, SANDBOX_MARKER = "EC2GPU_SANDBOX_BIND_SHIM", "EC2GPU_SANDBOX_BIND", "EC2GPU_SANDBOX_INSTANCE"


def ray_env(environ: Mapping[str, str], ip: str, token_file: str) -> dict[str, str]:
    """The environment of this node's ``ray start`` (pure), which each of its Ray processes
    inherits: ``environ`` with the pool's token file (RAY_AUTH_MODE=token; a token in
    RAY_AUTH_TOKEN, which Ray would take first, dropped), no usage stats, the health checks; and
    where ``environ`` names the sandbox's bind shim (SHIM_VAR), the shim preloaded with ``ip``,
    the node's own address, as the one its servers bind."""
    env = {k: v for k, v in environ.items() if k != "RAY_AUTH_TOKEN"}
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.update(HEALTH_CHECKS)
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_file})
    shim = environ.get(SHIM_VAR)
    if shim:
        env["LD_PRELOAD"] = " ".join(p for p in (shim, environ.get("LD_PRELOAD", "")) if p)
        env[BIND_VAR] = ip
    return env


def refusal(environ: Mapping[str, str], token_file: str) -> str | None:
    """Why this node must not start Ray, in words (None: it may): the token file is not a
    regular file of this user's that only they can read (a link is refused, whatever it points
    to: the file's own mode is what keeps the token), or this is a sandbox instance
    (SANDBOX_MARKER) whose bind shim is not there (its Ray would listen on every address)."""
    try:
        st = os.lstat(token_file)
    except OSError as exc:
        return f"the pool's token file {token_file}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"the pool's token file {token_file} is not a file of its own (a link, or another kind)"
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return f"the pool's token file {token_file} is not this user's alone (mode {stat.S_IMODE(st.st_mode):o})"
    if environ.get(SANDBOX_MARKER):
        shim = environ.get(SHIM_VAR) or ""
        if not os.path.isfile(shim):
            return ("this sandbox instance has no bind shim" + (f" ({shim} is not there)" if shim else "")
                    + ": its Ray would listen on every address; restart the sandbox: ec2gpu sandbox down && ec2gpu sandbox up")
    return None


def worker_ports(cpus: int) -> int:
    """How many ports Ray's worker processes of a node with ``cpus`` CPUs (its --num-cpus) get
    (pure): WORKER_PORTS_PER_CPU for each, WORKER_PORTS more."""
    return WORKER_PORTS_PER_CPU * max(cpus, 0) + WORKER_PORTS


def ports_for(ip: str, cpus: int) -> list[int]:
    """This node's ports (pure): a block from PORT_BASE, one per PORT_FLAGS entry then
    worker_ports(cpus), chosen by the last two bytes of its address, so that the nodes of one size
    on one machine (the sandbox's loopback addresses) never pick the same ones (nodes of several
    sizes may: _run then takes free ones). Blocks are PORT_BLOCK
    apart, or a multiple of it for a node whose ports do not fit one (a large instance: on EC2 each
    node has its machine to itself), and all lie below PORT_BASE + PORT_BLOCK * PORT_BLOCKS."""
    count = len(PORT_FLAGS) + worker_ports(cpus)
    stride = -(-count // PORT_BLOCK) * PORT_BLOCK
    parts = [int(x) for x in ip.split(".")] if ip.count(".") == 3 else [0, 0, 0, 0]
    start = PORT_BASE + ((parts[2] * 256 + parts[3]) % (PORT_BLOCK * PORT_BLOCKS // stride)) * stride
    return list(range(start, start + count))


def _all_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


def argv(args: argparse.Namespace, port: int | None, ports: list[int]) -> list[str]:
    """``ray start``'s command line for this node (pure): ``ports`` are free ones, one per
    PORT_FLAGS entry, then the workers'; Ray's directory in ``args.temp_dir`` (temp_dir)."""
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--node-ip-address={args.ip}",
           f"--num-gpus={args.gpus}", f"--num-cpus={args.cpus}", "--disable-usage-stats", "--block"]
    cmd += [f"{flag}={ports[k]}" for k, flag in enumerate(PORT_FLAGS)]
    rest = ports[len(PORT_FLAGS):]
    if args.role == "head":
        cmd += ["--head", f"--port={port}", "--include-dashboard=false"]
    cmd += [f"--worker-port-list={','.join(map(str, rest))}"]
    if args.role != "head":
        cmd += [f"--address={args.address}"]
    # Ray names its Unix sockets in its session directory, by default one the nodes of one machine
    # share (/tmp/ray, anyone's), where two starting at once can take the same name: each node has
    # its own, private
    cmd += [f"--temp-dir={ray_dir(args.temp_dir)}"]
    if args.object_store_bytes:
        cmd += [f"--object-store-memory={args.object_store_bytes}"]
    return cmd


def run_driver(raw: list[str]) -> int:
    """``node.py driver --ip IP --token-file FILE -- ARGV...``: the pool's driver (ARGV, started by
    the head's agent, pool/ray_nodes.start_driver) run in the environment this node's Ray has
    (ray_env: the pool's token, and in the sandbox the bind shim: its ray.init starts a core worker
    whose gRPC server would listen on every address), in place of this process (exec: the agent's
    child is the driver). Refuses (exit 2, one line) as main does."""
    p = argparse.ArgumentParser(prog="node.py driver")
    p.add_argument("--ip", required=True, help="this node's private address: the one the driver's servers bind")
    p.add_argument("--token-file", required=True, help="the pool's Ray token: a file only this user can read")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the driver's command line")
    args = p.parse_args(raw)
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        p.error("no driver command line after --")
    why = refusal(os.environ, args.token_file)
    if why:
        print(f"ec2gpu: the pool's driver not started: {why}", flush=True)
        return 2
    os.execvpe(argv[0], argv, ray_env(os.environ, args.ip, args.token_file))


def main(raw: list[str]) -> int:
    if raw == ["end"]:  # the pool's driver letting this node go (driver.end_node)
        end_instance()
        return 0
    if raw[:1] == ["driver"]:  # the pool's driver, under the head's agent
        return run_driver(raw[1:])
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("role", choices=("head", "worker"))
    p.add_argument("--ip", required=True, help="this node's private address (Ray's --node-ip-address)")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--cpus", type=int, required=True)
    p.add_argument("--address", help="worker: the head's IP:PORT")
    p.add_argument("--ready-file", required=True, help="written once this node's Ray is up (the head's: its GCS port)")
    p.add_argument("--token-file", required=True, help="the pool's Ray token: a file only this user can read")
    p.add_argument("--object-store-bytes", type=int, default=0)
    p.add_argument("--end-instance", action="store_true",
                   help="worker: once Ray ends by itself (the head gone), end this instance (shutdown -h now)")
    args = p.parse_args(raw)
    if args.role == "worker" and not args.address:
        p.error("a worker needs --address")
    why = refusal(os.environ, args.token_file)
    if why:
        print(f"ec2gpu: Ray not started: {why}", flush=True)
        return 2
    env = ray_env(os.environ, args.ip, args.token_file)
    args.temp_dir = temp_dir()
    # SIGTERM (the controller letting the node go, an instance ending) unwinds: Ray ended, its directory removed
    signal.signal(signal.SIGTERM, lambda signum, frame: _terminated(signum, args.temp_dir))
    try:
        code = _run(args, env)
    finally:
        shutil.rmtree(args.temp_dir, ignore_errors=True)
    if code is not None and args.end_instance and args.role == "worker":
        if head_answers(args.address):  # a Ray of this node's own that died: the controller sees to it
            print(f"ec2gpu: Ray ended (exit {code}); the pool's head answers: this instance stays", flush=True)
        else:
            print(f"ec2gpu: Ray ended (exit {code}): the pool's head is gone, this instance ends", flush=True)
            end_instance()
    return 1 if code is None else code


def _terminated(signum: int, private: str) -> None:
    """SIGTERM: the directory goes at once (a sandbox instance's end follows with SIGKILL within
    3 s, sandbox/sshd.stop; Ray's own stop takes longer), then Ray ends as main unwinds."""
    signal.signal(signum, signal.SIG_IGN)  # once: a second one does not cut the cleanup short
    shutil.rmtree(private, ignore_errors=True)
    sys.exit(128 + signum)


def _run(args: argparse.Namespace, env: dict[str, str]) -> int | None:
    """Start this node's Ray (up to START_TRIES times), write the ready file once it is up, and
    wait for it to end: its exit status, None when it never started."""
    port = gcs_port() if args.role == "head" else None
    for attempt in range(1, START_TRIES + 1):
        if args.role == "head" and attempt > 1:
            port = gcs_port(0)
        ports = ports_for(args.ip, args.cpus)
        if attempt > 1 or not _all_free(ports):
            ports = free_ports(len(ports))
        proc = subprocess.Popen(argv(args, port, ports), env=env)  # the same process group: ending the group ends Ray too
        try:
            # up: its raylet listens (and the head's GCS): the controller waits for the file before going on
            manager = ports[PORT_FLAGS.index("--node-manager-port")]
            if not _ready(proc, [(args.ip, manager)] + ([(args.ip, int(port or 0))] if args.role == "head" else [])):
                print(f"ec2gpu: Ray did not start (exit {proc.poll()}, try {attempt} of {START_TRIES})", flush=True)
                _end(proc)
                time.sleep(2.0 * attempt)
                continue
            tmp = f"{args.ready_file}.tmp"
            with open(tmp, "w") as f:
                f.write(str(port) if args.role == "head" else "up")  # the head's: its GCS port
            os.replace(tmp, args.ready_file)
            return proc.wait()  # SIGTERM (the controller letting the node go) ends this process first
        finally:
            if proc.poll() is None:  # SIGTERM here: Ray ends before its directory goes
                _end(proc)
    return None


def head_answers(address: str, tries: int = 3, timeout_s: float = 3.0) -> bool:
    """Whether the head's GCS at ``address`` (IP:PORT) accepts a connection (``tries`` tries, 1 s apart)."""
    host, _, port = address.rpartition(":")
    for n in range(tries):
        if n:
            time.sleep(1.0)
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
            return True
        except (OSError, ValueError):
            continue
    return False


#: the longest a node that ends itself spends writing its MOUNT-mode file_mounts back (s)
WRITE_BACK_S = 600


def end_instance() -> None:
    """End this instance (a worker the pool lets go without its controller): first what its
    elements wrote under the task's MOUNT-mode file_mounts goes to their buckets (RUN_DIR/s3files.py
    out, with the instance's role, as the controller has a node do before it lets it go), then
    ``shutdown -h now`` as the run's agent does (RUN_DIR/agent.py's end_instance; a run's instances
    terminate on shutdown). This file is RUN_DIR/ray/node.py."""
    import importlib.util
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mounts = os.path.join(run_dir, "s3mounts.json")
    if os.path.exists(mounts):
        try:
            subprocess.run([sys.executable, os.path.join(run_dir, "s3files.py"), "out", mounts], timeout=WRITE_BACK_S,
                           stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"ec2gpu: file_mounts not written back ({type(exc).__name__})", flush=True)
    found = importlib.util.spec_from_file_location("ec2gpu_agent", os.path.join(run_dir, "agent.py"))
    if found is None or found.loader is None:
        return
    agent = importlib.util.module_from_spec(found)
    found.loader.exec_module(agent)
    agent.end_instance()


def _ready(proc: subprocess.Popen[bytes], targets: list[tuple[str, int]], timeout_s: float = STARTUP_S) -> bool:
    """Whether every (address, port) of ``targets`` accepts connections before ``proc`` ends or
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    waiting = list(targets)
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(waiting[0], timeout=1.0).close()
            waiting.pop(0)
            if not waiting:
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
