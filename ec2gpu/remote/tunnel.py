"""A port of an instance on this machine's localhost, over SSH (`ec2gpu tunnel NAME PORT`).

OpenSSH's own local forwarding (`ssh -N -L`) with the config `ec2gpu ssh-config` writes: the
instance's key, its pinned host key (StrictHostKeyChecking yes), nothing opened in the security
group. The forward binds 127.0.0.1 on both ends. When SSH drops (a network change, the instance
restarting), it is started again with a growing pause, until the caller stops it.

The ssh process runs in a process group of its own (a terminal's Ctrl-C or hang-up reaches this
process, not it) and is ended by this process on every way out: ``Child.close`` from the thread
that was told to stop (SIGTERM and SIGHUP become KeyboardInterrupt there), whatever the
forwarding thread is doing, then reaped. An ssh left running would hold a session on the
instance, which its idle rule counts as busy (ami/idle-watch.sh).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Collection, Iterator


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
        port: int = s.getsockname()[1]
        return port


def argv(config: Path, host: str, remote_port: int, local_port: int) -> list[str]:
    """The OpenSSH command line of one forward (pure): no shell on the instance (-N), fail rather
    than run without the forward (ExitOnForwardFailure), notice a dead peer within 45 s."""
    return [shutil.which("ssh") or "ssh", "-F", str(config), "-N", "-o", "ExitOnForwardFailure=yes",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR",
            "-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}", host]


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0,
                   stop: threading.Event | None = None) -> bool:
    """True once 127.0.0.1:``port`` accepts connections; False if ``proc`` exits, ``stop`` is set or
    time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None and not (stop and stop.is_set()):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


class Child:
    """The forward's ssh process, started in a process group of its own and ended (its group:
    SIGTERM, SIGKILL after ``grace_s`` seconds) and reaped by ``close()`` from any thread; once
    closed, ``start`` starts nothing."""

    proc: subprocess.Popen[bytes] | None

    def __init__(self, grace_s: float = 5.0):
        self.lock, self.proc, self.closed, self.grace_s = threading.Lock(), None, False, grace_s
        self.ending = threading.Lock()  # one thread at a time signals and reaps

    def start(self, command: list[str]) -> subprocess.Popen[bytes] | None:
        """Start ``command``; None once closed."""
        with self.lock:
            if self.closed:
                return None
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, process_group=0)
            return self.proc

    def end(self, proc: subprocess.Popen[bytes]) -> None:
        """End ``proc`` (its process group) if it runs, and reap it."""
        with self.ending:
            if proc.poll() is None:  # not reaped: its pid (and group id) cannot be anyone else's yet
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(self.grace_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def close(self) -> None:
        """Start nothing more; end and reap the running ssh, if any."""
        with self.lock:
            self.closed, proc = True, self.proc
        if proc is not None:
            self.end(proc)


@contextlib.contextmanager
def hangup_interrupts() -> Iterator[None]:
    """While the block runs (in the main thread), SIGHUP (a closed terminal, a supervisor) raises
    KeyboardInterrupt as Ctrl-C does, so the same clean-up runs; its default would end this
    process at once and leave the ssh child running. Elsewhere, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGHUP, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """While the block runs (in the main thread), SIGINT, SIGTERM and SIGHUP are ignored: a second
    one cannot cut short the ending of a child. Elsewhere, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kinds = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {k: signal.signal(k, signal.SIG_IGN) for k in kinds}
    try:
        yield
    finally:
        for k, handler in previous.items():
            signal.signal(k, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


@contextlib.contextmanager
def forwarding(config: Path, host: str, ports: list[int], log: Callable[[str], None],
               same_ports: Collection[int] = ()) -> Iterator[None]:
    """While the block runs, forward each of ``ports`` of ``host`` (its alias in ``config``) to
    127.0.0.1 here: those of ``same_ports`` (the user named them: `--port`) on the same port when it
    is free, every other on a free port the kernel picks, so that a task file cannot take a local
    port a client here sends credentials to (PostgreSQL's 5432, Redis's 6379: issue 44.7). Give no
    ``same_ports`` where the instance shares this machine's ports (a sandbox instance on loopback,
    whose job has yet to bind its port). ``log`` says where each one is. Every ssh it started is
    ended and reaped when the block ends, however it ends."""
    stop, threads, children = threading.Event(), [], []
    try:
        for port in ports:
            here = free_local_port(port if port in same_ports else None)
            log(f"port {port} of {host} is at http://127.0.0.1:{here} while the job runs")
            children.append(Child())
            t = threading.Thread(target=keep_forwarding, args=(argv(config, host, port, here), here, stop,
                                                               lambda m: None), kwargs={"child": children[-1]},
                                 name=f"forward-{port}", daemon=True)
            t.start()
            threads.append(t)
        yield
    finally:
        with signals_held():
            stop.set()
            for c in children:
                c.close()
        for t in threads:
            t.join(10)


def forward_until_interrupted(command: list[str], port: int, log: Callable[[str], None],
                              refresh: Callable[[], object] = lambda: None,
                              when_up: Callable[[], object] = lambda: None) -> None:
    """Forward (``keep_forwarding`` in a thread of its own), call ``when_up()`` here, then wait
    until KeyboardInterrupt (Ctrl-C; the CLI turns SIGTERM and SIGHUP into it), which is raised.
    Raises RemoteError if the forwarding ends by itself, and what ``when_up`` raises. The ssh is
    ended and reaped on every way out by this thread itself, whatever the forwarding thread is
    doing (a reconnect pause, ``refresh``'s AWS calls), with its signals held meanwhile so that a
    second SIGTERM cannot cut that short; at exit too, should even that be escaped."""
    import atexit

    from ..errors import RemoteError

    stop, ended, child = threading.Event(), threading.Event(), Child()

    def forward() -> None:
        try:
            keep_forwarding(command, port, stop, log, refresh, child=child)
        finally:
            ended.set()
    atexit.register(child.close)
    threading.Thread(target=forward, daemon=True, name=f"forward-{port}").start()
    try:
        when_up()
        # not Thread.join: a KeyboardInterrupt landing inside it marks the running thread stopped
        # (CPython 3.11's bpo-45274 handling in Thread._wait_for_tstate_lock), so a later join
        # returns at once and the interpreter exits with the forward's ssh still running
        while not ended.wait(0.5):
            pass
        raise RemoteError(f"the SSH forward to 127.0.0.1:{port} ended", "run the command again")
    finally:
        with signals_held():
            stop.set()
            child.close()
            ended.wait(5)
        atexit.unregister(child.close)


def keep_forwarding(command: list[str], port: int, stop: threading.Event, log: Callable[[str], None],
                    refresh: Callable[[], object] = lambda: None,
                    max_pause_s: float = 30.0, child: Child | None = None) -> None:
    """Run the forward ``command`` (``argv``) until ``stop`` is set; when it ends by itself (SSH
    dropped), say so through ``log``, call ``refresh()`` (rewrite the config: the instance's
    address may have changed), and start it again after a pause that doubles from 1 s up to
    ``max_pause_s``. Returns when stopped; the ssh process is always ended and reaped. ``child``:
    the holder of the ssh process, for a caller that must end it from another thread (set
    ``stop``, then ``child.close()``: the process ends whatever this thread is doing)."""
    child = child or Child()
    pause = 1.0
    while not stop.is_set():
        proc = child.start(command)
        if proc is None:  # closed
            return
        try:
            if wait_listening(port, proc, stop=stop):
                log(f"forwarding 127.0.0.1:{port}")
                pause = 1.0
            while proc.poll() is None and not stop.wait(0.2):
                pass
        finally:
            child.end(proc)
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
