"""One sandbox per EC2GPU_HOME, shared by concurrent commands, stopped by the last one; a server
killed with SIGKILL leaves no instance behind once the next one starts."""
import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from ec2gpu import cli
from ec2gpu.sandbox import control

pytestmark = pytest.mark.e2e


def _server_pids(home) -> list[int]:
    """The sandbox servers of ``home`` (by their command line, which names its state directory)."""
    d = str(control.state_dir(home))
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "ec2gpu.sandbox.server" in (p.info.get("cmdline") or []) and d in (p.info.get("cmdline") or [])]


def test_overlapping_commands_share_one_sandbox_and_the_last_one_stops_it(tmp_path):
    first, second = control.session(tmp_path), control.session(tmp_path)
    state = first.__enter__()
    try:
        assert second.__enter__()["pid"] == state["pid"]  # joined, not a second server
        first.__exit__(None, None, None)  # the first to finish must not stop the other's sandbox
        assert control.read_state(tmp_path)["pid"] == state["pid"]
    finally:
        second.__exit__(None, None, None)
    assert control.read_state(tmp_path) is None and not psutil.pid_exists(state["pid"])


def test_a_sandbox_started_for_good_outlives_the_commands_that_used_it(tmp_path):
    state = control.up(tmp_path)  # `ec2gpu sandbox up`
    try:
        with control.session(tmp_path):
            pass
        assert control.read_state(tmp_path)["pid"] == state["pid"]
    finally:
        control.down(tmp_path)


def test_two_commands_starting_it_at_the_same_instant_get_one_server(tmp_path):
    code = ("import json, sys; from pathlib import Path; from ec2gpu.sandbox import control; "
            "print(json.dumps(control.up(Path(sys.argv[1]))['pid']))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        pids = {json.loads(p.communicate(timeout=90)[0]) for p in procs}
        assert len(pids) == 1 and _server_pids(tmp_path) == list(pids)
    finally:
        control.down(tmp_path)


def test_a_server_killed_with_sigkill_leaves_no_sshd_once_the_sandbox_starts_again(tmp_path, monkeypatch, capsys):
    state = control.up(tmp_path)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    for k, v in control.env_vars(state).items():
        monkeypatch.setenv(k, v)
    try:
        assert cli.main(["launch", "--sandbox", "--name", "left", "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        control.resolver(tmp_path)(row["instance_id"], timeout_s=10)
        sshd_pid = control.read_state(tmp_path)["instances"][row["instance_id"]]["sshd_pid"]
        os.kill(state["pid"], signal.SIGKILL)
        psutil.wait_procs([psutil.Process(state["pid"])], timeout=10)
        assert psutil.pid_exists(sshd_pid)  # nothing could stop it
        again = control.up(tmp_path)
        assert again["pid"] != state["pid"]
        gone, alive = psutil.wait_procs([psutil.Process(sshd_pid)], timeout=10) if psutil.pid_exists(sshd_pid) \
            else ([], [])
        assert not alive
    finally:
        control.down(tmp_path)
        for pid in [state["pid"]]:  # the test's own server, by pid, whatever happened
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
