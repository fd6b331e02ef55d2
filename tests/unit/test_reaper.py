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


def test_what_an_honest_setup_left_running_is_named_when_it_is_ended(tmp_path):
    """Review of issue 44 (round 3): a setup's `nohup server &` was ended without a word. Now the
    reaper says so on stderr (the controller shows the setup's output), with the pids and a hint."""
    got = subprocess.run([sys.executable, REAPER, "--grace", "1", "--", "bash", "-c",
                          f"nohup sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > {tmp_path}/pid"],
                         capture_output=True, text=True, timeout=60)
    pid = int((tmp_path / "pid").read_text())
    assert got.returncode == 0 and not _alive(pid)
    assert got.stderr == f"ec2gpu: ended 1 process(es) the setup left running (pids {pid}): start services in run\n"
    quiet = subprocess.run([sys.executable, REAPER, "--", "bash", "-c", "sleep 0.1 & wait"], capture_output=True,
                           text=True, timeout=60)
    assert (quiet.returncode, quiet.stderr) == (0, "")  # nothing left: nothing said


#: the reaper, sent SIGTERM right after it started the setup and before its handlers are in place
EARLY_SIGNAL = """\
import os, signal, subprocess, sys
sys.path.insert(0, sys.argv[1])
import reaper
real = subprocess.Popen
def popen(*args, **kwargs):
    proc = real(*args, **kwargs)
    with open(sys.argv[2], "w") as f:
        f.write(str(proc.pid))
    os.kill(os.getpid(), signal.SIGTERM)
    return proc
reaper.subprocess.Popen = popen
print(reaper.run(["sh", "-c", "exec sleep 300 > /dev/null 2>&1"], grace_s=1.0))  # holds no pipe of the test's
"""


def test_a_signal_before_the_handlers_are_in_place_still_ends_the_setup_first(tmp_path):
    """Review of issue 44 (round 3): the handlers were installed after Popen, so a SIGTERM or SIGHUP
    in between ended the reaper with the setup running on. Now those signals are held back until the
    handlers are in place (the setup itself gets none held back)."""
    got = subprocess.run([sys.executable, "-c", EARLY_SIGNAL, os.path.dirname(REAPER), str(tmp_path / "pid")],
                         capture_output=True, text=True, timeout=60)
    pid = int((tmp_path / "pid").read_text())
    try:
        assert got.returncode == 0 and got.stdout == f"{128 + signal.SIGTERM}\n", got.stderr
        assert _wait_gone([pid], 1.0) == []
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    mask = subprocess.run([sys.executable, REAPER, "--", "bash", "-c", "grep SigBlk /proc/$$/status"],
                          capture_output=True, text=True, timeout=60)
    assert mask.stdout.split() == ["SigBlk:", "0" * 16], mask.stderr


def test_the_stop_handler_ignores_the_signals_that_follow_before_it_raises():
    """A second signal between the first one's Stopped and the switch to SIG_IGN raised Stopped out
    of run() with a traceback and nothing ended; the handler now ignores them itself first."""
    before = {s: signal.getsignal(s) for s in reaper.SIGNALS}
    try:
        with pytest.raises(reaper.Stopped):
            reaper._stop(signal.SIGTERM, None)
        assert [signal.getsignal(s) for s in reaper.SIGNALS] == [signal.SIG_IGN] * len(reaper.SIGNALS)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
