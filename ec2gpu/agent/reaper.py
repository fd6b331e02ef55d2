"""Run a task's setup and end everything it leaves running, before the job starts.

Shipped beside agent.py and started as ``python3 -I -S -B reaper.py [--grace S] -- bash -c '<the setup>' ...``
(over SSH by runs/execute/engine.setup_node; by agent/attempt.py on a detached run's instance).
Standard library only. It

- makes itself the child subreaper of what it starts (Linux's ``prctl(PR_SET_CHILD_SUBREAPER)``,
  https://man7.org/linux/man-pages/man2/prctl.2.html): a process the setup
  leaves behind whose parent ends (``setsid nohup X &``, a double fork, a daemon) is reparented
  to this process, not to init, so it stays a descendant of this one whatever its session or
  process group;
- runs the command in a session of its own, its stdin, stdout and stderr this process's;
- once the command has ended (or this process gets SIGTERM, SIGINT or SIGHUP: held back until its
  handlers are in place, each ignored once the first came), sends SIGTERM to every descendant, then
  SIGKILL after ``--grace`` seconds (GRACE_S) to those still there, and reaps them; what the setup
  left running is named on stderr (the controller shows the setup's output): a service a job needs
  (``nohup server &``) is started in the task's run;
- exits with the command's exit code (128+N for signal N), or LEFT_CODE when a descendant could
  not be ended within KILL_WAIT_S (said on stderr): the job must not start beside it. A descendant
  it may not signal (root's, started through ``sudo``) is named on stderr and left running.

So a setup cannot leave a process that waits for the agent's key or hand-over URLs, which the
controller writes only after this has returned (runs/execute/engine.start_agent), nor one that
holds the job's GPUs or ports. A process the setup started through ``sudo`` (root: it can leave the
tree through a root daemon, systemd-run) or through a daemon of the user's (cron, at, ``systemd
--user``) is no descendant and is not ended; code it installed (``~/.bashrc``, a Python package)
runs when something later starts it. docs/security.md says what that leaves open.

Elsewhere than Linux (no /proc, no subreaper) only the command's own session is ended.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import NoReturn

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
GRACE_S = 5.0  # from SIGTERM to SIGKILL (s)
KILL_WAIT_S = 10.0  # after SIGKILL, how long a descendant may take to go (one in uninterruptible sleep) (s)
LEFT_CODE = 125  # a descendant outlived SIGKILL (what `env` and `timeout` exit with for their own failures)
TICK_S = 0.05
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # those that end this process (module docstring)


class Stopped(Exception):
    """This process got a signal that ends it: the command and what it left go first."""


def subreaper() -> bool:
    """Make this process the child subreaper of its descendants; whether that worked (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants(root: int | None = None) -> set[int]:
    """The live (not zombie) descendants of process ``root`` (default this one), from /proc: each
    process's parent is the fourth field of /proc/PID/stat, after the name in parentheses (which may
    hold anything, so it is cut at the last ``)``). Empty where there is no /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    zombies = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid, state, ppid = int(name), fields[0], int(fields[1])
        children.setdefault(ppid, []).append(pid)
        if state == b"Z":
            zombies.add(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found - zombies


def reap() -> None:
    """Collect every child of this process that has ended (so it leaves the process table)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_descendants(grace_s: float = GRACE_S, kill_wait_s: float = KILL_WAIT_S) -> tuple[set[int], set[int]]:
    """SIGTERM every descendant of this process (those that appear meanwhile too), SIGKILL those
    still there after ``grace_s`` seconds, again and again for up to ``kill_wait_s`` seconds (a
    process that forks as it is killed leaves children, which are killed in turn); reap them all.
    Returns (the descendants still alive at the end, those this process may not signal: another
    user's, root's through sudo); both empty when all ended. Process ids are taken from /proc and
    signalled at once: Linux hands out ids in order, so one is not reused that soon."""
    termed: set[int] = set()
    foreign: set[int] = set()
    deadline = time.monotonic() + grace_s
    while True:
        reap()
        left = descendants() - foreign
        if not left:
            return set(), foreign
        for pid in left - termed:
            if not _signal(pid, signal.SIGTERM):
                foreign.add(pid)
        termed |= left
        left -= foreign
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(TICK_S)
    deadline = time.monotonic() + kill_wait_s
    while left and time.monotonic() < deadline:
        foreign |= {pid for pid in left if not _signal(pid, signal.SIGKILL)}
        time.sleep(TICK_S)
        reap()
        left = descendants() - foreign
    return left, foreign


def _signal(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid``; False when this process may not (another user's)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    return True


def _end_group(pgid: int, grace_s: float) -> None:
    """SIGTERM process group ``pgid``, SIGKILL after ``grace_s`` seconds (where there is no /proc)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            reap()
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(TICK_S)


def _stop(signum: int, frame: FrameType | None) -> NoReturn:
    for s in SIGNALS:  # a second signal must not end this process before what is left is ended
        signal.signal(s, signal.SIG_IGN)
    raise Stopped(signum)


def _exit_code(status: int) -> int:
    """A wait status as a shell says it: the exit code, or 128+N for signal N."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def run(argv: list[str], grace_s: float = GRACE_S) -> int:
    """Run ``argv`` to its end under the rules above; return its exit code (128+N for signal N),
    LEFT_CODE when something it left could not be ended, 128+N when this process got signal N first."""
    reaping = subreaper()
    code = None
    # held back until the handlers are in place (a signal in between would end this process and leave the
    # command running); the command gets the mask this process had
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        proc = subprocess.Popen(argv, start_new_session=True,
                                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, mask))
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    previous = {s: signal.signal(s, _stop) for s in SIGNALS}
    try:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one that came meanwhile raises Stopped here
            while code is None:
                pid, status = os.waitpid(-1, 0)  # the command, or an orphan reparented here that ended
                if pid == proc.pid:
                    code = proc.returncode = _exit_code(status)
            for s in SIGNALS:  # a signal now must not end this process before what is left is ended
                signal.signal(s, signal.SIG_IGN)
            leftovers = descendants()  # what the setup left running (empty without /proc)
        except Stopped as why:  # _stop ignores the signals that follow
            code, leftovers = 128 + why.args[0], set()  # stopped: the setup itself is among them
        if not reaping:  # no subreaper, no /proc: the command's own session is what can be found
            _end_group(proc.pid, grace_s)
        left, foreign = end_descendants(grace_s)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    ended = leftovers - left - foreign
    if ended:  # an honest setup's `nohup server &` too: the user is told why it is gone
        print(f"ec2gpu: ended {len(ended)} process(es) the setup left running (pids "
              f"{', '.join(str(p) for p in sorted(ended)[:10])}): start services in run", file=sys.stderr, flush=True)
    if foreign:  # root's, through sudo: what root does is out of this process's reach (module docstring)
        print(f"ec2gpu: {len(foreign)} process(es) the setup started as another user (sudo) keep running (pids "
              f"{', '.join(str(p) for p in sorted(foreign)[:10])})", file=sys.stderr, flush=True)
    if left:
        print(f"ec2gpu: {len(left)} process(es) the setup left could not be ended (pids "
              f"{', '.join(str(p) for p in sorted(left)[:10])}); the job does not start beside them",
              file=sys.stderr, flush=True)
        return LEFT_CODE
    return code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    grace_s = GRACE_S
    if args[:1] == ["--grace"] and len(args) > 1:
        grace_s, args = float(args[1]), args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: reaper.py [--grace S] -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run(args, grace_s)


if __name__ == "__main__":
    sys.exit(main())
