"""agent/reaper.py: a task's setup runs under it, and what the setup leaves running ends with it,
whatever session, process group or parent it escaped to (issue 44.4)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from ec2gpu.agent import reaper

REAPER = reaper.__file__
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's child subreaper and /proc")

#: a setup that leaves three processes behind, each writing its pid where the test reads it: one in a
#: session of its own (setsid nohup), one double-forked (its parent gone), one that ignores SIGTERM
LEAVES = """\
setsid nohup sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > {d}/setsid
( (sleep 301 & echo $! > {d}/double) & )
setsid bash -c 'trap "" TERM; echo $$ > {d}/stubborn; while :; do sleep 0.1; done' > /dev/null 2>&1 < /dev/null &
for f in setsid double stubborn; do while [ ! -s {d}/$f ]; do sleep 0.02; done; done
echo "setup said this"
exit 3
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", "rb") as f:  # a zombie is gone but for its parent's wait
        return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"


def _pids(d) -> list[int]:
    return [int((d / f).read_text()) for f in ("setsid", "double", "stubborn")]


def _wait_gone(pids: list[int], within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_what_the_setup_leaves_ends_with_it_whatever_session_or_parent_it_escaped_to(tmp_path):
    started = time.monotonic()
    got = subprocess.run([sys.executable, REAPER, "--grace", "1", "--", "bash", "-c", LEAVES.format(d=tmp_path)],
                         capture_output=True, text=True, timeout=60)
    pids = _pids(tmp_path)
    try:
        assert got.returncode == 3 and got.stdout == "setup said this\n", got.stderr
        assert [p for p in pids if _alive(p)] == []  # gone when the reaper returned: before any job starts
        assert time.monotonic() - started < 15  # the stubborn one had its 1 s grace, then SIGKILL
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_stopped_reaper_ends_the_setup_and_what_it_left(tmp_path):
    script = LEAVES.format(d=tmp_path).replace("exit 3", "sleep 300")
    proc = subprocess.Popen([sys.executable, REAPER, "--grace", "1", "--", "bash", "-c", script],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "setup said this\n"  # every pid is written by now
        pids = _pids(tmp_path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert _wait_gone(pids, 1.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_setup_that_leaves_nothing_costs_no_grace(tmp_path):
    started = time.monotonic()
    got = subprocess.run([sys.executable, REAPER, "--", "bash", "-c", "sleep 0.1 & wait; kill -9 $$"],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 128 + signal.SIGKILL and time.monotonic() - started < reaper.GRACE_S


def test_a_process_the_reaper_may_not_signal_is_named_and_does_not_hold_the_setup(tmp_path):
    """A process the setup started through sudo is root's: the user's reaper may not signal it (an
    OS refusal, simulated here by refusing one pid); it is named, and the setup's result stands
    without waiting out the kill time for it."""
    snippet = (f"import subprocess, sys, time; sys.path.insert(0, {os.path.dirname(REAPER)!r}); import reaper; "
               "child = subprocess.Popen(['sleep', '30']); real = reaper._signal; "
               "reaper._signal = lambda pid, sig: False if pid == child.pid else real(pid, sig); "
               "started = time.monotonic(); left, foreign = reaper.end_descendants(0.2, 5.0); "
               "print(sorted(left), sorted(foreign) == [child.pid], time.monotonic() - started < 2); child.kill()")
    got = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60)
    assert got.stdout == "[] True True\n", got.stderr
