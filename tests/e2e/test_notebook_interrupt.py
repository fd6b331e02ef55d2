"""Ctrl-C and SIGTERM in the startup phases of `ec2gpu notebook` (issue 27, "done when"): before
JupyterLab answers, an interrupt leaves a true message (which phase it stopped, what was removed),
no process of the command's (its children, listed by pid while it ran) and no AWS resource: the
instance launched for the notebook, its security group, key pair and key file are removed. An
instance that ran before the command (`--name`) is left running, and the message says so."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from test_interrupts import PAUSE  # same folder (pytest prepend import mode)
from test_sandbox_train import leftovers, processes_gone, sandbox_settles
from test_spot_recovery import EC2GPU

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # no training: the instance's Python only starts JupyterLab


def interrupt_notebook(env: dict, args: list[str], trigger: str, sig, pause_in: str | None = None,
                       timeout_s: float = 60) -> tuple[int, str, str, list[psutil.Process]]:
    """Start `ec2gpu notebook --sandbox ARGS` (pausing at the end of phase ``pause_in``), send ``sig``
    once ``trigger`` appears on its stderr; (code, stdout, stderr, every child process it had)."""
    argv = ["notebook", "--sandbox", *args]
    command = [EC2GPU, *argv] if pause_in is None else [sys.executable, PAUSE, pause_in, *argv]
    # the default SIGINT disposition, as a terminal gives it (test_interrupts.run_and_interrupt says why)
    proc = subprocess.Popen(command, env={**env, "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    me, children, lines, sent = psutil.Process(proc.pid), {}, [], False
    watchdog = threading.Timer(timeout_s, proc.kill)  # a notebook that never sees its signal runs on: ended
    watchdog.start()

    def note_children() -> None:
        try:
            for c in me.children(recursive=True):
                if c.pid not in children:
                    c.command = c.name()  # asked while it runs: ssh, ...
                    children[c.pid] = c
        except psutil.NoSuchProcess:
            pass
    try:
        for line in proc.stderr:
            lines.append(line)
            note_children()
            if not sent and trigger in line:
                proc.send_signal(sig)
                sent = True
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sent, f"never saw {trigger!r}:\n{''.join(lines)}"
    return proc.returncode, out, "".join(lines), list(children.values())


def still_running(children: list[psutil.Process], timeout_s: float = 5) -> list[psutil.Process]:
    """Those of ``children`` still running after up to ``timeout_s`` s (is_running checks the
    start time too: a pid used again by another process does not count)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                                              for c in children):
        time.sleep(0.1)
    return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("phase, sig, trigger", [
    ("requesting", signal.SIGINT, None), ("waiting for SSH", signal.SIGTERM, None),
    ("setup", signal.SIGINT, "CUDA available"),  # a real one, while JupyterLab starts on the instance
    ("waiting for JupyterLab", signal.SIGTERM, None)])  # JupyterLab runs there, the forward's ssh here
def test_an_interrupt_before_the_notebook_answers_removes_what_it_launched(sandbox_env, phase, sig, trigger):
    home, _ = sandbox_env
    code, out, err, children = interrupt_notebook(dict(os.environ), [], trigger or f"pausing in phase {phase}", sig,
                                                  pause_in=None if trigger else phase)
    said = " ".join(err.split())
    assert code == 130, err
    assert f"stopped {phase}" in said and "Traceback" not in err
    assert said.endswith("interrupted by Ctrl-C" if sig == signal.SIGINT else "interrupted by SIGTERM"), err
    [iid] = re.findall(r"launched (i-[0-9a-f]+)", said)
    removed = re.search(rf"removed: instances {iid}; security groups sg-[0-9a-f]+; key pairs (ec2gpu-[\w-]+)", said)
    assert removed, err
    assert "keeps running" not in said and "/lab?token=" not in out  # no URL was given, no instance is kept
    assert leftovers(home) == ([], [], [])
    assert not (home / "keys" / f"{removed.group(1)}.pem").exists()
    if phase == "waiting for JupyterLab":
        assert [c for c in children if c.command == "ssh"], "the forward had not started: the case tests nothing"
    assert still_running(children) == []
    assert processes_gone([iid])  # JupyterLab, started on the instance, ended with it
    assert sandbox_settles(home)


def test_an_interrupt_before_the_notebook_answers_leaves_an_instance_that_ran_before(sandbox_env):
    home, _ = sandbox_env
    env = dict(os.environ)
    launched = subprocess.run([EC2GPU, "launch", "--sandbox", "--name", "nbkeep", "--max-runtime", "30"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert launched.returncode == 0, launched.stderr
    try:
        code, out, err, children = interrupt_notebook(env, ["--name", "nbkeep"], "pausing in phase waiting for "
                                                      "JupyterLab", signal.SIGTERM, pause_in="waiting for JupyterLab")
        said = " ".join(err.split())
        assert code == 0 and "Traceback" not in err, err
        assert "stopped waiting for JupyterLab" in said and "removed" not in said
        assert "nbkeep keeps running with its idle rule" in said
        assert [c for c in children if c.command == "ssh"] and still_running(children) == []
        instances, _, _ = leftovers(home)
        assert len(instances) == 1  # the instance that ran before, still running
    finally:
        assert subprocess.run([EC2GPU, "down", "nbkeep", "--sandbox"], env=env, capture_output=True,
                              timeout=120).returncode == 0
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)
