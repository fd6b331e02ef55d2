"""`ec2gpu train mnist --spot --detach` in the sandbox (issue 30, "Done when"): the built-in trainer
handed to an Auto Scaling group, interrupted mid-epoch with nobody watching, resumed by the
replacement from its checkpoint in S3 (one epoch: the suite runs it beside other trainings on two
cores; three epochs reach 99%, README); `fetch` brings its results and says its test accuracy,
which this machine's ledger then shows; nothing of the run is left."""
import json
import time
from pathlib import Path

import pytest

from ec2gpu import api, cli
from ec2gpu.runs.settle import ledger

from test_detached_run import _nothing_left, _object, _prefix, _wait  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e


def _instance_log(home: Path, instance_id: str, run_id: str) -> str:
    """The job's log as the sandbox instance has it now (its disk is a folder here)."""
    path = home / "sandbox" / "instances" / instance_id / "state" / "detached" / "ec2gpu" / "runs" / run_id / "job.log"
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def test_train_mnist_detached_rides_out_an_interruption_and_fetch_says_its_test_accuracy(
        sandbox_env, tmp_path, capsys, monkeypatch):
    home = sandbox_env[0]
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "mnist", "--sandbox", "--detach", "--spot", "--epochs", "1", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    run_id, bucket = record["run_id"], record["bucket"]
    assert (record["status"], record["task"], record["model"], record["epochs"]) == ("detached", "mnist", "cnn", 1)
    first = _wait(run_id, ("running",))
    deadline = time.monotonic() + 180
    while "training cnn" not in _instance_log(home, first["instance_id"], run_id):  # training: SIGTERM checkpoints
        assert time.monotonic() < deadline, _instance_log(home, first["instance_id"], run_id)[-2000:]
        time.sleep(0.5)
    time.sleep(2)
    api.sandbox_interrupt(first["instance_id"], notice_seconds=10)
    done = _wait(run_id, ("succeeded", "failed", "cancelled"), timeout_s=300)
    assert done["state"] == "succeeded" and done["interruptions"] == 1 and done["launches"] == 2, \
        f"{done.get('message')!r} {done}"
    log = _object(bucket, _prefix(run_id) + "logs/job.log")
    assert "stopped: SIGTERM: checkpoint written" in log and "resumed from checkpoint at epoch" in log, log[-3000:]
    assert cli.main(["fetch", run_id, "--sandbox"]) == 0
    said = capsys.readouterr().err
    assert "test accuracy" in said, said
    row = ledger.get(home, run_id)
    assert row["test_acc"] >= 0.95, row  # 1 epoch of the cnn preset on full MNIST, resumed (3 reach 99%: README)
    assert (tmp_path / "runs" / run_id / "outputs" / "summary.json").is_file()
    left = _nothing_left(run_id)
    assert not any(left.values()), left
