"""Managed spot runs and dropped connections in the sandbox: interruptions through the sandbox's
metadata service, replacement instances resuming from the checkpoint, logs followed byte for byte."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from ec2gpu.runs.settle import ledger
from ec2gpu.sandbox import control, sshd

from test_sandbox_train import leftovers, processes_gone, sandbox_settles  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
EC2GPU = str(Path(sys.executable).parent / "ec2gpu")


def drive(argv: list[str], steps: list[tuple[str, object]], timeout_s: float = 240) -> tuple[int, str, str]:
    """Run `ec2gpu ARGV`; when a stderr line contains steps[i][0], call steps[i][1](line, lines_so_far),
    in order. Returns (exit code, stdout, stderr)."""
    proc = subprocess.Popen([EC2GPU, *argv], env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines, pending, deadline = [], list(steps), time.monotonic() + timeout_s
    try:
        for line in proc.stderr:
            lines.append(line)
            if pending and pending[0][0] in line:
                pending.pop(0)[1](line, lines)
            if time.monotonic() > deadline:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        stdout = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not pending, f"never saw {pending[0][0]!r}:\n{''.join(lines)}"
    return code, stdout, "".join(lines)


def launched(lines: list[str]) -> str:
    """The instance id of the newest attempt, from the controller's "launched i-..." note."""
    return re.findall(r"launched (i-[0-9a-f]+)", "".join(lines))[-1]


def interrupt(home, notice_seconds: float):
    return lambda line, lines: control.interrupt(home, launched(lines), notice_seconds)


def assert_nothing_left(home, record):
    assert leftovers(home) == ([], [], [])
    assert sandbox_settles(home)
    assert processes_gone(record["instance_ids"])
    assert not (home / "keys" / f"ec2gpu-{record['run_id']}.pem").exists()


def test_spot_run_interrupted_after_the_first_epoch_resumes_on_a_replacement(sandbox_env, tmp_path):
    home, state = sandbox_env
    s3 = boto3.client("s3", endpoint_url=state["endpoint"], region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    out = tmp_path / "run"
    code, stdout, err = drive(
        ["train", "mnist", "--sandbox", "--spot", "--epochs", "2", "--out", str(out), "--json",
         "--checkpoint-uri", "s3://ckpt/mnist"],
        # EC2 gives two minutes' notice (AWS docs, "Spot Instance interruption notices"); 10 s is
        # enough for the job to write its checkpoint and for the controller to bring it home
        [("epoch 1/2 train_loss", interrupt(home, 10.0))])  # the end of epoch 1 (not its progress line)
    assert code == 0, err
    record = json.loads(stdout)
    assert record["status"] == "completed" and record["test_acc"] >= 0.99, err
    first, second = record["attempts"]
    # the agent saw the notice (its record), or the controller saw EC2 terminate it first: both interrupt
    assert "interruption notice" in first["ended"] or "SpotInstanceTermination" in first["ended"], first
    assert second["ended"] == "completed"
    assert first["market"] == second["market"] == "spot"
    assert second["zone"] != first["zone"]  # same type, another zone first
    # at most one epoch of work lost: the replacement resumed at or after the end of epoch 1
    resumed = re.search(r"resumed from checkpoint at epoch (\d+) step (\d+)", " ".join(err.split()))
    assert resumed, err[-4000:]
    epoch, step = map(int, resumed.groups())
    assert epoch >= 1
    summary = json.loads((out / "outputs" / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["resumed_from"] == {"epoch": epoch, "step": step}
    # each attempt billed from its own instance; the run's bill is their sum
    assert all(a["billed_seconds"] >= 60 and a["cost_usd"] > 0 for a in (first, second))
    assert record["cost_usd"] == pytest.approx(first["cost_usd"] + second["cost_usd"])
    row = ledger.get(home, record["run_id"])
    assert [a["instance_id"] for a in row["attempts"]] == row["instance_ids"] == record["instance_ids"]
    assert row["status"] == "completed" and len(row["attempts"]) == 2
    # the checkpoint also went to S3 (from this machine)
    body = s3.get_object(Bucket="ckpt", Key=f"mnist/{record['run_id']}/checkpoint.pt")["Body"].read()
    assert body[:2] == b"PK"  # torch.save's zip container
    assert_nothing_left(home, record)


def test_interrupted_in_the_first_epoch_and_again_on_the_replacement_still_finishes(sandbox_env, tmp_path):
    home, _ = sandbox_env
    code, stdout, err = drive(
        ["train", "mnist", "--sandbox", "--spot", "--epochs", "1", "--max-attempts", "3", "--json",
         "--out", str(tmp_path / "run"), "--trainer-arg=--train-subset=20000"],  # the recovery is tested
        # attempt 1: reclaimed at once, in its first epoch (no time to checkpoint: EC2's state tells)
        [("training cnn", interrupt(home, 0.0)),
         # attempt 2: a notice as soon as it trains
         ("attempt 2 of 3", lambda line, lines: None), ("training cnn", interrupt(home, 1.0))])
    assert code == 0, err
    record = json.loads(stdout)
    assert record["status"] == "completed" and record["test_acc"] >= 0.95  # it learned, from 20,000 images
    ended = [a["ended"] for a in record["attempts"]]
    assert len(ended) == 3 and ended[-1] == "completed", ended
    # both ended as interruptions: EC2 reclaimed the first (its state says so), the second had a notice
    assert all("interruption notice" in e or "SpotInstanceTermination" in e for e in ended[:2]), ended
    assert len({a["instance_id"] for a in record["attempts"]}) == 3
    assert_nothing_left(home, record)


def test_a_run_stops_cleanly_at_max_attempts_and_says_so(sandbox_env, tmp_path):
    home, _ = sandbox_env
    code, _, err = drive(["train", "mnist", "--sandbox", "--spot", "--max-attempts", "1", "--out", str(tmp_path / "r")],
                         [("training cnn", interrupt(home, 0.5))])
    assert code == 75, err
    assert "stopped after 1 attempt," in err and "--max-attempts" in err and "Traceback" not in err
    row = ledger.runs(home, limit=1)[0]
    assert row["status"] == "spot-interrupted" and len(row["attempts"]) == 1
    assert_nothing_left(home, row)


def drop_ssh_connections(home, instance_id: str) -> int:
    """Kill the server side of every SSH connection to the instance (by pid): the network "drops"."""
    pid = control.read_state(home)["instances"][instance_id]["sshd_pid"]
    kids = sshd.descendants(pid)
    for k in kids:
        os.kill(k, signal.SIGKILL)
    return len(kids)


def test_a_dropped_ssh_connection_loses_no_log_line_and_stops_no_training(sandbox_env, tmp_path):
    home, _ = sandbox_env
    out = tmp_path / "run"

    def drop(line, lines):
        assert drop_ssh_connections(home, launched(lines)) >= 1
    code, stdout, err = drive(["train", "mnist", "--sandbox", "--epochs", "1", "--json", "--out", str(out),
                               "--trainer-arg=--train-subset=10000"], [("| ", drop)])
    assert code == 0, err
    assert "SSH connection lost" in err and "reconnected after" in err
    record = json.loads(stdout)
    assert record["status"] == "completed" and len(record["attempts"]) == 1
    # what the user was shown (the controller's stream, teed) is the job's own log, byte for byte
    assert (out / "attempt-1-node-0.log").read_bytes() == (out / "job.log").read_bytes()
    assert b"done: test_acc" in (out / "job.log").read_bytes()
    trained = (out / "outputs" / "train.log").read_text().splitlines()
    assert trained and all(line in (out / "job.log").read_text() for line in trained)


def test_killing_the_controller_leaves_training_running_and_logs_follow_picks_it_up(sandbox_env, tmp_path):
    home, _ = sandbox_env
    proc = subprocess.Popen([EC2GPU, "train", "mnist", "--sandbox", "--epochs", "1", "--out", str(tmp_path / "r"),
                             "--trainer-arg=--train-subset=12000"],
                            env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("| "):
                proc.kill()  # SIGKILL: no teardown, the job must go on by itself
                break
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    iid = launched(lines)
    run_id = ledger.runs(home, limit=1)[0]["run_id"]
    try:
        follow = subprocess.run([EC2GPU, "logs", run_id, "--sandbox", "--follow"], env=dict(os.environ),
                                capture_output=True, timeout=180)
        assert follow.returncode == 0, follow.stderr.decode()
        inst_home = Path(control.read_state(home)["instances"][iid]["directory"]) / "home"
        log = (inst_home / "ec2gpu" / "runs" / run_id / "job.log").read_bytes()
        assert follow.stdout == log and b"done: test_acc" in log
    finally:
        assert subprocess.run([EC2GPU, "down", run_id, "--sandbox"], env=dict(os.environ),
                              capture_output=True, timeout=120).returncode == 0
    assert leftovers(home) == ([], [], [])
    assert sandbox_settles(home)
