"""End to end in the sandbox: `ec2gpu train mnist` trains on real MNIST and leaves nothing behind."""
import json
import os

import boto3
import pytest

from ec2gpu import cli
from ec2gpu.sandbox import control, sshd

pytestmark = pytest.mark.e2e


def leftovers(home):
    """Instances pending/running, run security groups and key pairs, and live sshd pids."""
    ec2 = boto3.client("ec2", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    live = [i["InstanceId"] for r in ec2.describe_instances(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"] for i in r["Instances"]]
    groups = [g["GroupId"] for g in ec2.describe_security_groups(
        Filters=[{"Name": "tag-key", "Values": ["ec2gpu:run"]}])["SecurityGroups"]]
    keys = [k["KeyName"] for k in ec2.describe_key_pairs(
        Filters=[{"Name": "tag-key", "Values": ["ec2gpu:run"]}])["KeyPairs"]]
    return live, groups, keys


def test_train_mnist_in_the_sandbox_reaches_99_percent_and_leaves_nothing(sandbox_env, tmp_path, capsys):
    home, _ = sandbox_env
    code = cli.main(["train", "mnist", "--sandbox", "--epochs", "1", "--out", str(tmp_path / "run"), "--json"])
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["status"] == "completed" and record["test_acc"] >= 0.99
    for name in ("train.log", "metrics.jsonl", "summary.json", "model.pt", "curves.png", "run.json"):
        assert (tmp_path / "run" / name).exists(), name
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["epochs"] == 1 and summary["model"] == "cnn"
    assert record["billed_seconds"] >= 60 and record["cost_usd"] > 0
    assert set(record["phases"]) == {"requesting", "waiting for running", "waiting for SSH", "setup", "upload",
                                     "training", "download", "terminating"}
    assert leftovers(home) == ([], [], [])
    state = control.read_state(home)
    assert state["instances"] == {} or not any(sshd._alive(i["sshd_pid"]) for i in state["instances"].values())
    assert not (home / "keys" / f"ec2gpu-{record['run_id']}.pem").exists()
    assert not sshd.instance_processes(record["instance_id"])


def test_launch_ls_ssh_down_in_the_sandbox(sandbox_env, capsys):
    home, _ = sandbox_env
    assert cli.main(["launch", "--sandbox", "--name", "lab", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "lab" and row["state"] == "running"
    assert cli.main(["ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["instance_id"] for r in listed] == [row["instance_id"]]
    assert set(listed[0]) >= {"name", "instance_id", "instance_type", "market", "state", "public_ip", "launched_at"}
    control.resolver(home)(row["instance_id"], timeout_s=10)
    assert cli.main(["ssh", "lab", "--", "test", "-n", "$EC2GPU_SANDBOX_INSTANCE"]) == 0
    assert cli.main(["down", "lab"]) == 0
    assert leftovers(home) == ([], [], [])


@pytest.mark.parametrize("argv, code, words", [
    (["train", "mnist", "--sandbox", "--instance-type", "g2.2xlarge"], 2, "retired"),
    (["train", "mnist", "--sandbox", "--instance-type", "t3.micro"], 2, "no NVIDIA GPU"),
    (["train", "mnist", "--sandbox", "--region", "mars-1"], 2, "unknown AWS region"),
    (["train", "mnist", "--local", "--data-dir", "/nonexistent/mnist"], 2, "does not exist"),
    (["down"], 2, "say which"),
])
def test_bad_input_is_one_clear_line_and_creates_nothing(sandbox_env, capsys, argv, code, words):
    home, _ = sandbox_env
    assert cli.main(argv) == code
    captured = capsys.readouterr()
    assert words in captured.err and "Traceback" not in captured.err
    assert leftovers(home) == ([], [], [])


def test_missing_credentials_exit_3_without_traceback(monkeypatch, tmp_path, capsys):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert cli.main(["train", "mnist"]) == 3
    err = capsys.readouterr().err
    assert "no AWS credentials" in err and "Traceback" not in err and not (tmp_path / "keys").exists()


def test_help_does_not_import_boto3_fabric_or_torch():
    import subprocess
    import sys
    code = ("import sys; from ec2gpu import cli; cli.main(['--help']); "
            "print([m for m in ('boto3', 'fabric', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip().endswith("[]")
