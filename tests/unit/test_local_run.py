"""runs/provision/local.py: a run on this machine (`train mnist --local`, `bench --local`) as the
one lifecycle's LocalRun strategy: the agent started here with the job's environment, its log
followed, its record judged, and the environment file (which may hold the job's secrets) removed
on every way out, Ctrl-C included."""
import subprocess
from pathlib import Path

import pytest

from ec2gpu.errors import RemoteError
from ec2gpu.runs.execute import engine
from ec2gpu.runs.provision import local
from ec2gpu.tasks import load


class _UI:
    def __init__(self):
        self.notes, self.lines = [], []

    def note(self, text):
        self.notes.append(text)

    def log(self, line):
        self.lines.append(line)


def _job(run: str) -> engine.TaskJob:
    return engine.TaskJob(load.parse(f"name: mine\nrun: {run}\n"), {"A": "1"}, None)


def test_a_failed_local_job_is_a_remote_error_with_its_exit_status_after_its_log_and_leaves_no_environment_file(tmp_path):
    ui, out = _UI(), tmp_path / "out"
    with pytest.raises(RemoteError, match="the job on this machine exited 3") as err:
        local.run_local(_job('echo hello; echo "A=$A out=$EC2GPU_OUTPUT_DIR"; exit 3'), "r1", out, ui, poll_s=0.05)
    assert err.value.exit_status == 3 and err.value.host == "local"
    assert ui.lines == ["hello", f"A=1 out={out / 'outputs'}"]  # followed live, with the job's environment
    assert not (out / "job.env.json").exists()
    assert (out / "job.log").exists() and (out / "agent-record.json").exists()


def test_a_local_job_that_succeeds_gives_its_summary_or_none(tmp_path):
    out = tmp_path / "out"
    assert local.run_local(_job("echo done"), "r1", out, _UI(), poll_s=0.05) == {}
    assert not (out / "job.env.json").exists()


def test_ctrl_c_during_a_local_run_stops_the_agent_and_removes_the_environment_file(tmp_path, monkeypatch):
    started: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            started.append(self)

    real_sleep, pressed = local.time.sleep, []

    def interrupt(seconds):
        if not pressed and Path(tmp_path / "out" / "job.log").exists():  # the job runs: Ctrl-C now, once
            pressed.append(True)
            raise KeyboardInterrupt
        real_sleep(seconds)
    monkeypatch.setattr(local.subprocess, "Popen", Recorded)
    monkeypatch.setattr(local.time, "sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        local.run_local(_job("echo started; sleep 60"), "r1", tmp_path / "out", _UI(), poll_s=0.05)
    assert pressed and len(started) == 1 and started[0].poll() is not None  # the agent (and its job) stopped
    assert not (tmp_path / "out" / "job.env.json").exists()
