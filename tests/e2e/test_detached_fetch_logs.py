"""`ec2gpu fetch RUN` and `ec2gpu logs RUN [--follow]` for a detached run in the sandbox (issue 30):
what the job wrote comes home from the run's S3 store once it succeeded, its log is printed from
S3 once its instance is gone, and `logs --follow` prints a running job's lines live over SSH
and stops when the run ends (from state.json's state)."""
import json
import time
from pathlib import Path

import pytest

from ec2gpu import api, cli

from test_detached_run import _nothing_left, _wait  # same folder (pytest prepend import mode)
from test_detached_run import _task as _task_with_setup

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False


def _task(tmp_path: Path, run: str) -> Path:
    return _task_with_setup(tmp_path, run, setup=False)


def _start(task: Path, capsys) -> str:
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "30m", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["run_id"]


def test_fetch_brings_a_detached_runs_outputs_home_and_logs_reads_s3_once_it_is_gone(sandbox_env, tmp_path, capsys):
    task = _task(tmp_path, 'cp data.txt "$EC2GPU_OUTPUT_DIR/result.txt"\nmkdir -p "$EC2GPU_OUTPUT_DIR/sub"\n'
                           'echo nested > "$EC2GPU_OUTPUT_DIR/sub/n.txt"\nprintf "line one\\n\\033[2Jline two\\n"')
    run_id = _start(task, capsys)
    done = _wait(run_id, ("succeeded", "failed", "cancelled"))
    assert done["state"] == "succeeded", f"{done.get('message')!r} exit {done.get('exit_code')} {done}"
    left = _nothing_left(run_id)  # the instance, group and the rest are gone: only S3 has the run
    assert not any(left.values()), left

    here = tmp_path / "fetched"
    assert cli.main(["fetch", run_id, "--sandbox", "--out", str(here), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["source"] == "s3" and got["state"] == "succeeded" and got["out"] == str(here.resolve())
    assert got["outputs"] == ["result.txt", "sub/n.txt"] and got["files"] == ["job.log", "state.json"]
    assert (here / "outputs/result.txt").read_text() == "from the workdir\n"
    assert (here / "outputs/sub/n.txt").read_text() == "nested\n"
    assert json.loads((here / "state.json").read_text())["state"] == "succeeded"
    assert b"line one\n" in (here / "job.log").read_bytes()

    assert cli.main(["logs", run_id, "--sandbox"]) == 0  # the instance is gone: from S3
    shown = capsys.readouterr().out
    assert "line one\n" in shown and "\\x1b[2Jline two" in shown and "\x1b" not in shown  # inert
    assert cli.main(["logs", run_id, "--follow", "--sandbox"]) == 0  # over: printed, exit status 0
    assert "line two" in capsys.readouterr().out


def test_logs_follow_reads_a_running_jobs_log_live_over_ssh_masked_and_stops_when_it_ends(
        sandbox_env, tmp_path, capsys, monkeypatch):
    """The agent uploads the log to S3 every 60 s and at the end; on the machine that started the
    run (its private key is here) `logs --follow` reads it live over SSH, so the first line arrives
    while the job still runs, 10 s before the second, its --secret masked as in S3; the follow stops
    on state.json's final state and exits with the job's status."""
    monkeypatch.setenv("LIVE_TOKEN", "live-secret-0123456789")
    task = _task(tmp_path, 'echo "first-line $LIVE_TOKEN"\nsleep 10\necho second-line\nexit 3')
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "30m", "--json",
                     "--secret", "LIVE_TOKEN"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    _wait(run_id, ("running",))
    came: list[tuple[float, bytes]] = []
    notes: list[str] = []

    def write(chunk: bytes, final: bool = False) -> None:
        if chunk:
            came.append((time.monotonic(), chunk))

    got = api.logs(run_id, follow=True, write=write, sandbox=True, log=notes.append)
    ended = time.monotonic()
    assert got.source == "s3" and got.state == "failed" and got.exit_status == 3, got
    text = b"".join(c for _, c in came)
    assert text.count(b"first-line ****") == 1 and text.count(b"second-line") == 1, text  # nothing repeated
    assert b"live-secret" not in text
    first = next(t for t, c in came if b"first-line" in c)
    second = next(t for t, c in came if b"second-line" in c)
    assert second - first > 5, "the first line came live while the job ran, not with the upload at its end"
    assert ended - second < 30  # it stopped once the run ended
    assert any("live on" in n for n in notes), notes
    assert cli.main(["logs", run_id, "--follow", "--sandbox"]) == 3  # the CLI exits with the job's status
    _nothing_left(run_id)
