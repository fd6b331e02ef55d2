"""One real OpenSSH sshd per sandbox instance, on a loopback address of its own.

The "instance" is a directory: host key, sshd_config, authorized_keys (the run's key pair) and
a home. Sessions get HOME set to that home, so every instance has its own file system root for
the tool's files, and EC2GPU_SANDBOX_INSTANCE so the sandbox can find and stop the processes an
instance started (a detached training job too) when the instance is terminated.

Not every process of an instance keeps that marker: Ray's raylet starts its ``ray::DashboardAgent``
and ``ray::RuntimeEnvAgent`` with an environment of its own, and they outlive the raylet by a
minute, reparented to PID 1. They keep the POSIX session (setsid(2)) of the process that started
them, though, and every session holding a marked process was made by the instance (sshd gives each
connection a session of its own, user data runs in one: cloudinit.py): so the processes of an
instance are its marked ones and every process sharing a session with one (``instance_processes``).
"""
from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

MARKER = "EC2GPU_SANDBOX_INSTANCE"
#: Times orphans() and stop() look for an instance's processes: after stopping the ones found, again
ROUNDS = 3


def sshd_binary() -> str:
    """Absolute path of sshd (sshd refuses a relative one). Raises FileNotFoundError if absent."""
    for path in (shutil.which("sshd"), "/usr/sbin/sshd", "/usr/local/sbin/sshd"):
        if path and os.path.exists(path):
            return path
    raise FileNotFoundError("sshd not found: install OpenSSH server (apt-get install -y openssh-server)")


def free_port(host: str) -> int:
    """An unused TCP port on ``host`` (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class SshdInstance:
    """A running sshd: where it listens and its process id."""

    instance_id: str
    host: str
    port: int
    pid: int
    directory: Path


def config_text(d: Path, host: str, port: int, user: str, env: dict[str, str]) -> str:
    """sshd_config for one instance directory (pure)."""
    setenv = " ".join(f'"{k}={v}"' for k, v in env.items())
    return "\n".join([
        f"ListenAddress {host}", f"Port {port}",
        f"HostKey {d / 'ssh_host_ed25519_key'}", f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no", "LogLevel ERROR",
        f"AllowUsers {user}", "Subsystem sftp internal-sftp", "PrintMotd no",
        f"SetEnv {setenv}", "",
    ])


def session_env(instance_id: str, directory: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment of everything that runs on the instance: its home, its marker, ``env``."""
    return {"HOME": str(directory / "home"), MARKER: instance_id, **env}


def own_sshd(host: str, port: int) -> dict[str, str]:
    """The variables that tell an instance's idle watcher (ami/idle-watch.sh) which of this
    machine's sshds is its own: on EC2 it is the one on port 22."""
    return {"EC2GPU_SSH_ADDRESS": host, "EC2GPU_SSH_PORT": str(port)}


def start(instance_id: str, directory: Path, host: str, public_key: str, env: dict[str, str],
          timeout_s: float = 10.0) -> SshdInstance:
    """Start sshd for ``instance_id`` on ``host`` (a free port) accepting ``public_key``.

    Returns once it accepts TCP connections. Raises RuntimeError if it does not within
    ``timeout_s`` seconds (its log is in the message).
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "home").mkdir(exist_ok=True)
    key = directory / "ssh_host_ed25519_key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (directory / "authorized_keys").write_text(public_key.strip() + "\n")
    port = free_port(host)
    env = {**session_env(instance_id, directory, env), **own_sshd(host, port)}
    (directory / "sshd_config").write_text(config_text(directory, host, port, getpass.getuser(), env))
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory
    logf = open(directory / "sshd.log", "ab")
    proc = subprocess.Popen([sshd_binary(), "-D", "-e", "-f", str(directory / "sshd_config")],
                            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return SshdInstance(instance_id, host, port, proc.pid, directory)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"sshd for {instance_id} did not start: {(directory / 'sshd.log').read_text()[-2000:]}")


def marked_processes(instance_id: str) -> list[int]:
    """Pids whose environment carries MARKER=instance_id (what the instance's sessions started)."""
    pids = []
    for proc in psutil.process_iter(["environ"]):
        env = proc.info.get("environ") or {}  # None where we may not read it (another user's process)
        if env.get(MARKER) == instance_id:
            pids.append(proc.pid)
    return pids


def instance_processes(instance_id: str, sessions: set[int] | None = None) -> list[int]:
    """Pids of the instance's processes: those marked with MARKER=instance_id, and every process
    in a session (setsid(2)) of one of them, as Ray's agents, started by the raylet without the
    marker. ``sessions``: session ids seen before (their marked processes may be gone since); the
    ones found now are added to it."""
    marked = marked_processes(instance_id)
    found = _sessions(marked)
    if sessions is not None:
        sessions |= found
        found = sessions
    return sorted(set(marked) | set(in_sessions(found)))


def _sessions(pids: list[int]) -> set[int]:
    """Session ids of ``pids``, less this process's own (a caller that started one without a
    session of its own must never stop itself) and init's."""
    own = os.getsid(0)
    sids = set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            sids.add(os.getsid(pid))
    return {sid for sid in sids if sid > 1 and sid != own}


def in_sessions(sids: set[int]) -> list[int]:
    """Pids of the live processes whose session id (setsid(2)) is in ``sids``."""
    if not sids:
        return []
    pids = []
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(proc.pid) in sids:
                pids.append(proc.pid)
    return pids


def orphans(instances_dir: Path, stop: bool = False) -> list[int]:
    """Pids of processes that are provably one of this sandbox's instances: an sshd whose config
    is under ``instances_dir``, or a process whose environment carries MARKER and a HOME under it
    (what an instance's sessions started). Only a server that died without stopping them (SIGKILL)
    leaves any. ``stop``: SIGTERM them, SIGKILL after 3 s, and look again (up to ROUNDS times): a
    process caught starting another (user data starting the idle watcher) leaves that one behind."""
    root = str(Path(instances_dir).resolve()) + os.sep

    sessions: set[int] = set()  # of the instances' marked processes: Ray's agents are in them unmarked

    def scan() -> list:
        found, marked = [], []
        for proc in psutil.process_iter(["cmdline", "environ"]):
            cmdline = proc.info.get("cmdline") or []
            env = proc.info.get("environ") or {}  # None where we may not read it (another user's process)
            if any(a.startswith(root) and a.endswith("sshd_config") for a in cmdline):
                found.append(proc)
            elif env.get(MARKER) and env.get("HOME", "").startswith(root):
                marked.append(proc)
        sessions.update(_sessions([p.pid for p in marked]))
        seen = {p.pid for p in found + marked}
        for pid in in_sessions(sessions):
            if pid not in seen:
                with contextlib.suppress(psutil.NoSuchProcess):
                    marked.append(psutil.Process(pid))
        return found + marked

    every = []
    for _ in range(ROUNDS if stop else 1):
        found = scan()
        if not found:
            break
        every += found
        if stop:
            for proc in found:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.terminate()
            _, alive = psutil.wait_procs(found, timeout=3)
            for proc in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            psutil.wait_procs(alive, timeout=3)
    return sorted({p.pid for p in every})


def descendants(pid: int) -> list[int]:
    """Pids of every process under ``pid`` (its SSH connections' sshd-session processes, for an
    sshd). A job started with setsid and reparented is not among them: instance_processes finds it."""
    try:
        return sorted(p.pid for p in psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def stop(sshd_pid: int, instance_id: str, grace_s: float = 3.0) -> None:
    """Stop the instance: its sshd and open SSH connections, and every process its sessions
    started (all by pid), as a terminated instance drops its connections. Looks again (up to
    ROUNDS times) for processes started while the first ones were being stopped, in the sessions
    seen first too (Ray's agents outlive their raylet: instance_processes)."""
    sessions: set[int] = set()
    _stop_pids([sshd_pid] + descendants(sshd_pid) + instance_processes(instance_id, sessions), grace_s)
    for _ in range(ROUNDS - 1):
        late = [pid for pid in instance_processes(instance_id, sessions) if _alive(pid)]
        if not late:
            return
        _stop_pids(late, grace_s)


def _stop_pids(targets: list[int], grace_s: float) -> None:
    """SIGTERM ``targets``, SIGKILL those still alive after ``grace_s`` seconds."""
    for pid in targets:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for pid in targets:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs; a zombie (reaped here when it is our child) counts as gone."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
