"""End to end in the sandbox: `ec2gpu train mnist` trains on real MNIST and leaves nothing behind."""
import json
import os

import boto3
import pytest

from ec2gpu import cli
from ec2gpu.runs.settle import ledger
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


def sandbox_settles(home, timeout_s: float = 10) -> bool:
    """True once the sandbox has stopped the sshd of every instance that is no longer running
    (it reconciles every 0.2 s, and stops an instance's processes with a grace period)."""
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(sshd._alive(i["sshd_pid"]) for i in control.read_state(home)["instances"].values()):
            return True
        time.sleep(0.2)
    return False


def processes_gone(instance_ids, timeout_s: float = 15) -> bool:
    """True once no process of these (terminated) instances is left. The sandbox stops them after
    EC2 reports the termination: SIGTERM, which a trainer answers by writing its checkpoint, then
    SIGKILL after a grace period."""
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(sshd.instance_processes(i) for i in instance_ids):
            return True
        time.sleep(0.2)
    return False


def test_train_mnist_in_the_sandbox_reaches_99_percent_and_leaves_nothing(sandbox_env, tmp_path, capsys):
    home, _ = sandbox_env
    code = cli.main(["train", "mnist", "--sandbox", "--epochs", "1", "--out", str(tmp_path / "run"), "--json"])
    assert code == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert "verified against the console output" in captured.err  # host key pinned out of band
    assert record["status"] == "completed" and record["test_acc"] >= 0.99
    for name in ("outputs/train.log", "outputs/metrics.jsonl", "outputs/summary.json", "outputs/model.pt",
                 "outputs/curves.png", "run.json", "job.log", "agent-record.json"):
        assert (tmp_path / "run" / name).exists(), name
    summary = json.loads((tmp_path / "run" / "outputs" / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["epochs"] == 1 and summary["model"] == "cnn"
    assert record["billed_seconds"] >= 60 and record["cost_usd"] > 0
    assert set(record["phases"]) == {"requesting", "waiting for running", "waiting for SSH", "setup", "upload",
                                     "running", "download", "terminating"}
    assert leftovers(home) == ([], [], [])
    assert sandbox_settles(home), control.read_state(home)
    assert not (home / "keys" / f"ec2gpu-{record['run_id']}.pem").exists()
    assert processes_gone([record["instance_id"]])
    check_the_ledger_bills_the_instance_own_times(record, capsys)


def check_the_ledger_bills_the_instance_own_times(record, capsys):
    """`ec2gpu runs` has the run, billed from the instance's launch and termination times."""
    from ec2gpu.aws.instances import Instance
    ec2 = boto3.client("ec2", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    (inst,) = [i for r in ec2.describe_instances(InstanceIds=[record["instance_id"]])["Reservations"]
               for i in r["Instances"]]
    ended = Instance.of(inst).transitioned_at
    assert ended is not None
    lifetime = (ended - inst["LaunchTime"]).total_seconds()
    assert cli.main(["runs", "--json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["run_id"] == record["run_id"]]
    assert row["status"] == "completed" and row["instance_ids"] == [record["instance_id"]]
    assert row["billed_seconds"] == max(60.0, lifetime)
    [att] = record["attempts"]  # compute at the g4dn.xlarge table's price, its public IPv4 address and its volume
    assert att["compute_usd"] == pytest.approx(row["billed_seconds"] * 0.526 / 3600, abs=1e-6)
    assert row["cost_usd"] == pytest.approx(att["compute_usd"] + att["public_ipv4_usd"] + att["ebs_usd"], abs=1e-6)
    assert row["estimated_cost_usd"] > 0 and row["test_acc"] == record["test_acc"]
    assert cli.main(["runs", "show", record["run_id"][:17], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["phases"]["running"] > 0 and shown["estimate"]["instance_type"] == "g4dn.xlarge"
    assert cli.main(["runs", "--since", "1d", "--json"]) == 0
    since = json.loads(capsys.readouterr().out)
    # the sandbox's simulated bills: apart (totals are rounded to 4 decimals, and rounding keeps the order)
    assert since["sandbox_total"]["cost_usd"] >= round(row["cost_usd"], 4)
    assert since["total"] == ledger.totals([r for r in since["runs"] if r["backend"] == "aws"])  # AWS's alone
    # the next estimate for the same model on the same GPU uses this run's measured times
    assert cli.main(["cost", "--sandbox", "-t", "g4dn.xlarge", "--json"]) == 0
    (est,) = json.loads(capsys.readouterr().out)
    assert est["time_source"].startswith("ledger") and est["usd_per_hour"] == 0.526


def test_prices_in_the_sandbox_show_spot_per_zone_and_retired_types(sandbox_env, capsys):
    assert cli.main(["prices", "--sandbox", "--gpu", "T4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    g4 = next(r for r in data["instance_types"] if r["instance_type"] == "g4dn.xlarge")
    assert g4["on_demand_usd_per_hour"] == 0.526 and len(g4["spot_usd_per_hour"]) >= 2
    assert g4["spot_saving_pct"] == pytest.approx(100 * (1 - min(g4["spot_usd_per_hour"].values()) / 0.526), abs=0.1)
    assert {r["gpu"] for r in data["instance_types"]} == {"T4"}
    assert cli.main(["prices", "--sandbox", "--json"]) == 0
    retired = json.loads(capsys.readouterr().out)["retired"]
    assert {"instance_type": "g2.2xlarge", "replacement": "g4dn.xlarge"}.items() <= retired[0].items()


def test_budget_below_the_estimate_refuses_the_run_and_creates_nothing(sandbox_env, capsys):
    home, _ = sandbox_env
    assert cli.main(["train", "mnist", "--sandbox", "--budget", "0.001"]) == 2
    err = capsys.readouterr().err
    assert "above --budget $0.0010" in err and "Traceback" not in err
    assert cli.main(["train", "mnist", "--sandbox", "--spot", "--max-price", "0.01"]) == 2
    assert "below the spot price" in capsys.readouterr().err
    assert leftovers(home) == ([], [], [])


def test_launch_ls_ssh_down_in_the_sandbox(sandbox_env, capsys):
    home, _ = sandbox_env
    from ec2gpu.aws import instances as inst_mod
    # issue 27.10: launch pins the host key, checked against the console output: a console that
    # lists another key (someone in the middle) fails the launch, and it leaves nothing
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inst_mod, "host_key_fingerprints", lambda ec2, iid: ["SHA256:" + "A" * 43])
        assert cli.main(["launch", "--sandbox", "--name", "mitm"]) == 5
    assert "not one the instance printed" in " ".join(capsys.readouterr().err.split())
    assert leftovers(home) == ([], [], [])
    assert cli.main(["launch", "--sandbox", "--name", "lab", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "lab" and row["state"] == "running"
    assert cli.main(["ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["instance_id"] for r in listed] == [row["instance_id"]]
    assert set(listed[0]) >= {"name", "instance_id", "instance_type", "market", "state", "public_ip", "launched_at"}
    control.resolver(home)(row["instance_id"], timeout_s=10)
    known = home / "known_hosts" / row["instance_id"]
    assert known.read_text().split()[0] == row["instance_id"]  # launch pinned it, under the instance id
    known.unlink()  # as for an instance an older version launched: not pinned yet
    # a console that lists another key (someone in the middle): refused, nothing pinned
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inst_mod, "host_key_fingerprints", lambda ec2, iid: ["SHA256:" + "A" * 43])
        assert cli.main(["ssh", "lab", "--", "true"]) == 5
    assert "not one the instance printed" in capsys.readouterr().err and not known.exists()
    assert cli.main(["ssh", "lab", "--", "test", "-n", "$EC2GPU_SANDBOX_INSTANCE"]) == 0
    assert "verified against the console output" in capsys.readouterr().err and known.stat().st_size
    # OpenSSH runs with ssh-config's file and the pinned key only: a changed key is refused
    assert "StrictHostKeyChecking yes" in (home / "ssh_config").read_text()
    from ec2gpu.aws.network import generate_key
    pinned = known.read_text()
    known.write_text(f"{pinned.split()[0]} {generate_key()[1]}\n")
    assert cli.main(["ssh", "lab", "--", "true"]) == 255  # ssh's own refusal
    known.write_text(pinned)
    assert cli.main(["ssh", "lab", "--", "exit", "3"]) == 3  # the remote exit status is ours
    # anyone who can tag in the account plants a command in the Name tag: it never reaches ssh_config
    planted = home / "planted"
    boto3.client("ec2", region_name="us-east-1").create_tags(
        Resources=[row["instance_id"]], Tags=[{"Key": "Name", "Value": f"x\n    ProxyCommand touch {planted}"}])
    capsys.readouterr()
    assert cli.main(["ssh-config", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hosts"] == [row["instance_id"]]
    assert "ProxyCommand" not in (home / "ssh_config").read_text()
    assert cli.main(["ssh", row["instance_id"], "--", "true"]) == 0
    assert "not safe in an ssh_config" in " ".join(capsys.readouterr().err.split()) and not planted.exists()
    assert cli.main(["ls"]) == 0
    shown = capsys.readouterr()
    assert "ProxyCommand" not in shown.out and "Name tag has characters that are not safe" in " ".join(shown.err.split())
    assert cli.main(["down", row["instance_id"]]) == 0
    assert leftovers(home) == ([], [], [])


@pytest.mark.parametrize("argv, code, words", [
    (["train", "mnist", "--sandbox", "--instance-type", "g2.2xlarge"], 2, "retired"),
    (["train", "mnist", "--sandbox", "--instance-type", "t3.micro"], 2, "no NVIDIA GPU"),
    (["train", "mnist", "--sandbox", "--region", "mars-1"], 2, "unknown AWS region"),
    (["train", "mnist", "--local", "--data-dir", "/nonexistent/mnist"], 2, "does not exist"),
    (["down"], 2, "say which"),
    (["train", "mnist", "--sandbox", "--max-price", "0.1"], 2, "spot instances only"),
    (["cost", "--sandbox", "--spot", "--max-price", "0.01"], 2, "below the spot price"),
    (["runs", "--since", "lately"], 2, "not a duration"),
    (["train", "mnist", "--sandbox", "--keep"], 2, "explicit --max-runtime"),
    (["train", "mnist", "--sandbox", "--spot", "--spot-fallback", "reserved"], 2, "only fallback is on-demand"),
    (["runs", "show", "no-such-run"], 2, "no run"),
    (["prices", "--sandbox", "--refresh"], 2, "no AWS Price List API"),
    (["prices", "--gpu", "Z80"], 2, "unknown GPU model"),
    (["train", "mnist", "--bogus"], 2, "No such option"),
    (["train", "mnist", "--sandbox", "--checkpoint-uri", "gs://bucket/x"], 2, "not an S3 URI"),
    (["train", "mnist", "--sandbox", "--cluster", "lab", "--nodes", "2"], 2, "existing cluster"),
    (["train", "mnist", "--sandbox", "--cluster", "nolab"], 2, "no running cluster"),
    (["scale", "nolab", "2", "--sandbox"], 2, "no running cluster"),
    (["logs", "no-such-run", "--sandbox"], 2, "no running instance named"),
    (["sandbox", "interrupt", "i-0123456789abcdef0"], 2, "not a running sandbox instance"),
    (["train", "mnist", "--sandbox", "--ssh-cidr", "notacidr"], 2, "is not a CIDR"),
    (["train", "mnist", "--sandbox", "--instance-type", "g4dn.xlarge,,"], 2, "has an empty entry"),
    (["train", "mnist", "--sandbox", "--instance-type", ""], 2, "has an empty entry"),
    (["train", "mnist", "--sandbox", "--epochs", "100000000"], 2, "the instance would terminate itself before"),
    (["launch", "--sandbox", "--name", "lab\nProxyCommand touch /tmp/x"], 2, "is not a safe name"),
    (["launch", "--sandbox", "--ssh-cidr", "notacidr"], 2, "is not a CIDR"),
    (["run", "--sandbox", "--name", "$(reboot)", "--expect", "1m", "--", "true"], 2, "is not a safe name"),
])
def test_bad_input_is_one_clear_line_and_creates_nothing(sandbox_env, capsys, argv, code, words):
    home, _ = sandbox_env
    runs_before = len(ledger.runs(home))
    assert cli.main(argv) == code
    captured = capsys.readouterr()
    assert words in " ".join(captured.err.split()) and "Traceback" not in captured.err
    assert leftovers(home) == ([], [], [])
    assert len(ledger.runs(home)) == runs_before  # not even a ledger row


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


@pytest.mark.parametrize("argv", [["ls"], ["ssh-config"], ["logs", "lab"], ["ssh", "lab"], ["down", "lab"],
                                  ["cost", "--spot"], ["train", "mnist"], ["cleanup", "--dry-run"]])
def test_without_credentials_every_command_says_so_and_points_at_the_running_sandbox(sandbox_env, monkeypatch,
                                                                                      capsys, argv):
    home, state = sandbox_env
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert cli.main(argv) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert "no AWS credentials found" in err and f"a sandbox is running here (pid {state['pid']})" in err, err
    assert "Traceback" not in err and "--debug" not in err


def test_help_does_not_import_boto3_fabric_or_torch():
    import subprocess
    import sys
    code = ("import sys; from ec2gpu import cli; cli.main(['--help']); "
            "print([m for m in ('boto3', 'fabric', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip().endswith("[]")


def test_cleanup_dry_run_lists_and_cleanup_removes_everything_tagged(sandbox_env, capsys):
    home, _ = sandbox_env
    assert cli.main(["launch", "--sandbox", "--name", "left-on", "--json"]) == 0
    assert cli.main(["launch", "--sandbox", "--spot", "--name", "left-spot", "--json"]) == 0
    capsys.readouterr()
    assert cli.main(["ls", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == {"left-on", "left-spot"}
    on = next(r for r in rows if r["name"] == "left-on")
    assert on["usd_per_hour"] == 0.526 and on["cost_so_far_usd"] >= round(60 * 0.526 / 3600, 4)
    assert on["age_seconds"] >= 0
    assert cli.main(["cleanup", "--dry-run", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["regions"]["us-east-1"]
    assert sorted(planned["instances"]) == sorted(r["instance_id"] for r in rows) and len(planned["key_pairs"]) == 2
    assert leftovers(home)[0] and len(list((home / "keys").glob("*.pem"))) == 2  # nothing removed yet
    assert cli.main(["cleanup", "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["regions"]["us-east-1"]
    assert sorted(removed["security_groups"]) == sorted(planned["security_groups"])
    assert leftovers(home) == ([], [], []) and not list((home / "keys").glob("*.pem"))
    assert cli.main(["cleanup"]) == 0
    assert "nothing of ec2gpu's found" in capsys.readouterr().out


def test_ssh_config_lets_plain_openssh_reach_an_instance(sandbox_env, capsys):
    import shutil
    import stat
    import subprocess
    home, _ = sandbox_env
    assert cli.main(["launch", "--sandbox", "--name", "plain", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    try:
        iid = row["instance_id"]
        control.resolver(home)(iid, timeout_s=10)
        # issue 27.10: never "accept-new". An instance not pinned yet (an older version launched it)
        # is pinned first, checked against its console output, or left out with the reason
        known = home / "known_hosts" / iid
        known.unlink()
        from ec2gpu.aws import instances as inst_mod
        with pytest.MonkeyPatch.context() as mp:  # a console that lists another key
            mp.setattr(inst_mod, "host_key_fingerprints", lambda ec2, iid: ["SHA256:" + "A" * 43])
            assert cli.main(["ssh-config", "--sandbox", "--json"]) == 0
        written = json.loads(capsys.readouterr().out)
        assert written["hosts"] == [] and "not one the instance printed" in written["skipped"][iid]
        assert not known.exists()
        assert cli.main(["ssh-config", "--sandbox", "--json"]) == 0
        shown = capsys.readouterr()
        written = json.loads(shown.out)
        config = home / "ssh_config"
        assert written["hosts"] == ["plain"] and stat.S_IMODE(config.stat().st_mode) == 0o600
        assert "verified against the console output" in " ".join(shown.err.split())
        assert known.read_text().split()[0] == iid
        text = config.read_text()
        assert "StrictHostKeyChecking yes" in text and f"HostKeyAlias {iid}" in text and "accept-new" not in text
        ssh = [shutil.which("ssh"), "-F", str(config), "-o", "BatchMode=yes"]
        done = subprocess.run(ssh + ["plain", "echo", "$EC2GPU_SANDBOX_INSTANCE"], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0 and done.stdout.strip() == iid, done.stderr
        assert subprocess.run(ssh + [iid, "true"], timeout=30).returncode == 0
    finally:
        assert cli.main(["down", "plain"]) == 0


def test_doctor_passes_in_the_sandbox_and_names_the_fix_for_a_loose_key_file(sandbox_env, capsys):
    home, _ = sandbox_env
    assert cli.main(["doctor", "--sandbox", "--json"]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert {"credentials", "region", "default VPC", "GPU vCPU quota", "AMI", "your IP", "price", "ssh client",
            "key files", "sshd (sandbox)"} <= set(checks)
    assert checks["GPU vCPU quota"]["ok"] is True  # the sandbox answers the G and VT quota (sandbox/quotas.py)
    assert "L-DB2E81BA: 256 vCPUs" in checks["GPU vCPU quota"]["detail"]
    assert all(c["ok"] is not False for c in checks.values())
    loose = home / "keys" / "ec2gpu-loose.pem"
    loose.parent.mkdir(exist_ok=True)
    loose.write_text("x")
    loose.chmod(0o644)
    try:
        assert cli.main(["doctor", "--sandbox"]) == 1
        shown = capsys.readouterr().out
        assert "FAIL key files" in shown and f"chmod 600 {loose}" in shown.replace("\n", "")
    finally:
        loose.unlink()


def test_cleanup_all_regions_finds_what_another_region_holds(sandbox_env, capsys):
    assert cli.main(["launch", "--sandbox", "--region", "eu-west-1", "--name", "far", "--json"]) == 0
    capsys.readouterr()
    assert cli.main(["cleanup", "--sandbox", "--dry-run", "--json"]) == 0  # this region only: nothing
    assert json.loads(capsys.readouterr().out)["regions"] == {}
    assert cli.main(["cleanup", "--sandbox", "--all-regions", "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["regions"]
    assert list(removed) == ["eu-west-1"] and len(removed["eu-west-1"]["instances"]) == 1
    ec2 = boto3.client("ec2", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="eu-west-1")
    assert not [i for r in ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["running"]}])[
        "Reservations"] for i in r["Instances"]]


def test_local_runs_the_same_builtin_task_under_the_agent(tmp_path, capsys, mnist_dir):
    out = tmp_path / "local"
    code = cli.main(["train", "mnist", "--local", "--epochs", "1", "--trainer-arg=--train-subset=3000",
                     "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads(captured.out)
    assert record["task"] == "mnist" and record["backend"] == "local" and record["test_acc"] > 0.5
    # the same layout and the same agent as on an instance
    assert json.loads((out / "agent-record.json").read_text())["state"] == "succeeded"
    assert json.loads((out / "outputs" / "summary.json").read_text())["epochs"] == 1
    assert (out / "checkpoints" / "checkpoint.pt").is_file() and "epoch 1/1" in (out / "job.log").read_text()
    assert "epoch 1/1" in captured.err  # the log, followed live


@pytest.mark.parametrize("where", [["--local"], ["--sandbox"]])
def test_a_bad_trainer_arg_shows_the_trainer_own_error_and_exits_5(sandbox_env, tmp_path, capsys, where):
    code = cli.main(["train", "mnist", *where, "--trainer-arg=--lr=abc", "--out", str(tmp_path / "r")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 5, err
    assert "exited 2" in err and "argument --lr: invalid float value: 'abc'" in err and "Traceback" not in err


def test_ctrl_c_while_the_sandbox_starts_leaves_no_server_running(tmp_path):
    import contextlib
    import signal
    import subprocess
    import sys
    import time

    import psutil
    env = {**os.environ, "EC2GPU_HOME": str(tmp_path)}
    cli_proc = subprocess.Popen([sys.executable, "-m", "ec2gpu", "sandbox", "up"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, started = time.monotonic() + 30, []
    while not started and time.monotonic() < deadline:  # the daemon is forked, not ready yet
        started = psutil.Process(cli_proc.pid).children(recursive=True)
        time.sleep(0.02)
    try:
        assert started and not control.read_state(tmp_path)
        cli_proc.send_signal(signal.SIGINT)
        _, err = cli_proc.communicate(timeout=30)
        assert cli_proc.returncode == 130 and "interrupted by Ctrl-C" in err
        gone, alive = psutil.wait_procs(started, timeout=15)
        assert not alive, [p.pid for p in alive]
        assert control.read_state(tmp_path) is None
    finally:  # the test's own processes, by pid, whatever happened
        for p in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        psutil.wait_procs(started, timeout=10)


def test_prices_for_a_gpu_the_region_does_not_offer_says_so_instead_of_an_empty_table(sandbox_env, capsys):
    assert cli.main(["prices", "--gpu", "H100", "--region", "eu-west-1", "--sandbox"]) == 0  # moto's eu-west-1: no p5
    said = " ".join(capsys.readouterr().out.split())
    assert "no instance type with H100 GPUs is offered in eu-west-1" in said and "p5.48xlarge" in said


def test_down_removes_what_an_interrupted_standing_spot_instance_left(sandbox_env, capsys):
    import time
    home, _ = sandbox_env
    assert cli.main(["launch", "--sandbox", "--spot", "--name", "gone", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    control.interrupt(home, row["instance_id"], 0.0)
    ec2 = boto3.client("ec2", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = ec2.describe_instances(InstanceIds=[row["instance_id"]])["Reservations"][0]["Instances"][0]["State"]
        if state["Name"] == "terminated":
            break
        time.sleep(0.2)
    assert state["Name"] == "terminated"
    _, groups, keys = leftovers(home)
    assert groups and keys  # its security group and key pair are still there
    assert cli.main(["down", "gone", "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)[row["run_id"]]
    assert removed["security_groups"] and removed["key_pairs"]
    assert leftovers(home) == ([], [], [])
    assert cli.main(["down", "gone"]) == 0 and "nothing to remove" in capsys.readouterr().out
    assert cli.main(["down", "never-was"]) == 2


def test_a_data_directory_that_is_not_there_is_refused_before_anything_is_created(sandbox_env, monkeypatch, capsys):
    home, _ = sandbox_env
    runs_before = len(ledger.runs(home))
    monkeypatch.setenv("EC2GPU_DATA_DIR", str(home / "no-such-mnist"))
    assert cli.main(["train", "mnist", "--sandbox"]) == 2
    assert "EC2GPU_DATA_DIR" in capsys.readouterr().err
    assert leftovers(home) == ([], [], []) and len(ledger.runs(home)) == runs_before
