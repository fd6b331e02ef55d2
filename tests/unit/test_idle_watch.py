"""ami/idle-watch.sh, the idle rule an instance enforces on itself, run here with a stand-in
`shutdown` on PATH: idle for the rule's seconds -> shutdown; a running job keeps it up."""
import json
import os
import subprocess
from pathlib import Path

import pytest

WATCH = Path(__file__).resolve().parents[2] / "ec2gpu" / "ami" / "idle-watch.sh"


@pytest.fixture
def instance(tmp_path):
    (tmp_path / "bin").mkdir()
    stand_in = tmp_path / "bin" / "shutdown"
    stand_in.write_text(f'#!/bin/sh\necho "$*" > {tmp_path}/shutdown-called\n')
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "EC2GPU_CONSOLE": str(tmp_path / "console"), "EC2GPU_SSH_PORT": "1"}  # no connection can be on port 1
    return tmp_path, env


def test_idle_for_the_rules_seconds_shuts_the_instance_down_and_says_so(instance):
    home, env = instance
    done = subprocess.run(["bash", str(WATCH), "2", "1"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "idle for" in done.stdout
    assert (home / "shutdown-called").read_text().startswith("-h now")
    assert (home / "console").read_text().startswith("ec2gpu-idle: idle since ")


@pytest.mark.parametrize("record", [
    {"state": "running"},
    {"state": "succeeded", "handover": "pending"},  # ended; its agent waits for the controller (agent.after_end)
])
def test_a_running_job_keeps_it_up(instance, record):
    home, env = instance
    run = home / "ec2gpu" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "agent-record.json").write_text(json.dumps({**record, "agent_pid": os.getpid()}, indent=2))
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["bash", str(WATCH), "2", "1"], env=env, capture_output=True, timeout=4)
    assert not (home / "shutdown-called").exists()
    assert "ec2gpu-idle: busy job since" in (home / "console").read_text()
