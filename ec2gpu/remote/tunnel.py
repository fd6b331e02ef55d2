"""A port of an instance on this machine's localhost, over SSH (`ec2gpu tunnel NAME PORT`).

OpenSSH's own local forwarding (`ssh -N -L`) with the config `ec2gpu ssh-config` writes: the
instance's key, its pinned host key (StrictHostKeyChecking yes), nothing opened in the security
group. The forward binds 127.0.0.1 on both ends. When SSH drops (a network change, the instance
restarting), it is started again with a growing pause, until the caller stops it.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path


def free_local_port(preferred: int | None = None) -> int:
    """``preferred`` when nothing listens on 127.0.0.1 there, else a port the kernel picks."""
    if preferred:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", preferred))
                return preferred
            except OSError:
                pass
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def argv(config: Path, host: str, remote_port: int, local_port: int) -> list[str]:
    """The OpenSSH command line of one forward (pure): no shell on the instance (-N), fail rather
    than run without the forward (ExitOnForwardFailure), notice a dead peer within 45 s."""
    return [shutil.which("ssh") or "ssh", "-F", str(config), "-N", "-o", "ExitOnForwardFailure=yes",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR",
            "-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}", host]


def wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> bool:
    """True once 127.0.0.1:``port`` accepts connections; False if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


@contextlib.contextmanager
def forwarding(config: Path, host: str, ports: list[int], log):
    """While the block runs, forward each of ``ports`` of ``host`` (its alias in ``config``) to
    127.0.0.1 here, on the same port when it is free; ``log`` says where each one is."""
    stop, threads = threading.Event(), []
    for port in ports:
        here = free_local_port(port)
        log(f"port {port} of {host} is at http://127.0.0.1:{here} while the job runs")
        t = threading.Thread(target=keep_forwarding, args=(argv(config, host, port, here), here, stop, lambda m: None),
                             name=f"forward-{port}", daemon=True)
        t.start()
        threads.append(t)
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(10)


def keep_forwarding(command: list[str], port: int, stop: threading.Event, log, refresh=lambda: None,
                    max_pause_s: float = 30.0) -> None:
    """Run the forward ``command`` (``argv``) until ``stop`` is set; when it ends by itself (SSH
    dropped), say so through ``log``, call ``refresh()`` (rewrite the config: the instance's
    address may have changed), and start it again after a pause that doubles from 1 s up to
    ``max_pause_s``. Returns when stopped; the ssh process is always ended."""
    pause = 1.0
    while not stop.is_set():
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        try:
            if wait_listening(port, proc):
                log(f"forwarding 127.0.0.1:{port}")
                pause = 1.0
            while proc.poll() is None and not stop.wait(0.2):
                pass
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if stop.is_set():
            return
        log(f"SSH ended (exit {proc.returncode}); reconnecting in {pause:.0f} s")
        if stop.wait(pause):
            return
        pause = min(max_pause_s, pause * 2)
        try:
            refresh()
        except Exception as exc:  # noqa: BLE001 - e.g. AWS unreachable: the old config may still do; said
            log(f"could not refresh the SSH config ({type(exc).__name__}: {exc}); trying with the old one")
