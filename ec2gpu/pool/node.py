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
from the pool's own security group (aws/network.allow_within_group), never from an address
(Ray has no authentication: https://docs.ray.io/en/latest/ray-security/index.html).
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time

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
WORKER_PORTS = 24  # ports for Ray's worker processes on this node (--worker-port-list)
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


def temp_dir(ip: str) -> str:
    """This node's Ray directory (sessions, sockets, logs): one per address (pure)."""
    return f"/tmp/ec2gpu-ray-{ip}"


def ports_for(ip: str) -> list[int]:
    """This node's ports (pure): a block of PORT_BLOCK from PORT_BASE, chosen by the last two
    bytes of its address, so that the nodes of one machine (the sandbox's loopback addresses)
    never pick the same ones."""
    parts = [int(x) for x in ip.split(".")] if ip.count(".") == 3 else [0, 0, 0, 0]
    start = PORT_BASE + ((parts[2] * 256 + parts[3]) % PORT_BLOCKS) * PORT_BLOCK
    return list(range(start, start + len(PORT_FLAGS) + WORKER_PORTS))


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
    PORT_FLAGS entry, then the workers'."""
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
    # share, where two starting at once can take the same name: each node has its own (short, as a
    # socket's path is at most 107 bytes)
    cmd += [f"--temp-dir={temp_dir(args.ip)}"]
    if args.object_store_bytes:
        cmd += [f"--object-store-memory={args.object_store_bytes}"]
    return cmd


def main(raw: list[str]) -> int:
    if raw == ["end"]:  # the pool's driver letting this node go (driver.end_node)
        end_instance()
        return 0
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("role", choices=("head", "worker"))
    p.add_argument("--ip", required=True, help="this node's private address (Ray's --node-ip-address)")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--cpus", type=int, required=True)
    p.add_argument("--address", help="worker: the head's IP:PORT")
    p.add_argument("--ready-file", required=True, help="written once this node's Ray is up (the head's: its GCS port)")
    p.add_argument("--object-store-bytes", type=int, default=0)
    p.add_argument("--end-instance", action="store_true",
                   help="worker: once Ray ends by itself (the head gone), end this instance (shutdown -h now)")
    args = p.parse_args(raw)
    port = gcs_port() if args.role == "head" else None
    if args.role == "worker" and not args.address:
        p.error("a worker needs --address")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.update(HEALTH_CHECKS)
    shutil.rmtree(temp_dir(args.ip), ignore_errors=True)  # an earlier node's of this address (a sandbox's)
    for attempt in range(1, START_TRIES + 1):
        if args.role == "head" and attempt > 1:
            port = gcs_port(0)
        ports = ports_for(args.ip)
        if attempt > 1 or not _all_free(ports):
            ports = free_ports(len(ports))
        proc = subprocess.Popen(argv(args, port, ports))  # the same process group: ending the group ends Ray too
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
        code = proc.wait()  # SIGTERM (the controller letting the node go) ends this process first
        if args.end_instance and args.role == "worker":
            if head_answers(args.address):  # a Ray of this node's own that died: the controller sees to it
                print(f"ec2gpu: Ray ended (exit {code}); the pool's head answers: this instance stays", flush=True)
            else:
                print(f"ec2gpu: Ray ended (exit {code}): the pool's head is gone, this instance ends", flush=True)
                end_instance()
        return code
    return 1


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


def _ready(proc: subprocess.Popen, targets: list[tuple[str, int]], timeout_s: float = STARTUP_S) -> bool:
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


def _end(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
