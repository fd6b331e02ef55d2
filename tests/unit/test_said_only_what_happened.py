"""What a newcomer is told says only what happened (issue 27.20-22): the transfer used and why, the
message of an interrupted command, how a standing instance ends, what a stop loses, the setup's
words on a machine without a GPU, the hints of refusals, the bench's figures that did not train."""
import json
import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import botocore.exceptions
import pytest

from ec2gpu import cli
from ec2gpu.aws.instances import IdleRule
from ec2gpu.remote import sync

ROOT = Path(__file__).resolve().parents[2]


class _Conn:
    """A connection whose instance has rsync or not; records what is put and run."""

    def __init__(self, instance_has_rsync: bool):
        self.has, self.put_paths, self.ran = instance_has_rsync, [], []

    def run(self, command, **_):
        self.ran.append(command)
        return SimpleNamespace(ok=self.has if command == "command -v rsync" else True)

    def put(self, _buf, path):
        self.put_paths.append(path)


def _workdir(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    return sync.manifest(tmp_path)


@pytest.mark.parametrize("here, there, why", [
    (False, True, "rsync is missing on this machine"),
    (True, False, "rsync is missing on the instance"),
])
def test_a_workdir_without_rsync_goes_by_sftp_and_the_run_is_told_why(tmp_path, monkeypatch, here, there, why):
    monkeypatch.setattr(sync.shutil, "which", lambda name: "/usr/bin/rsync" if here and name == "rsync" else None)
    conn = _Conn(instance_has_rsync=there)
    how = sync.push(conn, _workdir(tmp_path), "/r/w", tmp_path / "ssh.config", "i-1")
    assert how == f"sftp ({why}: the whole workdir as one archive each time, not only what changed)"
    assert conn.put_paths == ["/r/w/.ec2gpu-workdir.tar.gz"]
    assert sync.rsync_missing(conn) == why and sync.rsync_available(conn) is False


def test_doctor_warns_without_rsync_here_and_names_its_version_and_the_old_ones_flaw():
    from ec2gpu.runs.plan import doctor
    ok, detail, fix = doctor.rsync_check(lambda: (None, None))
    assert ok is True and "no rsync on this machine" in detail and "SFTP" in detail and "apt-get install rsync" in fix
    ok, detail = doctor.rsync_check(lambda: ("/usr/bin/rsync", "3.2.7"))
    assert ok is True and detail.startswith("rsync 3.2.7 at /usr/bin/rsync") and "CVE" not in detail
    ok, detail = doctor.rsync_check(lambda: ("/usr/bin/rsync", "3.2.3"))
    assert ok is True and "CVE-2022-29154" in detail


def test_doctor_exits_0_without_rsync_here_as_every_run_works_through_sftp():
    from ec2gpu.runs.plan import doctor
    missing = doctor._run("rsync", lambda: doctor.rsync_check(lambda: (None, None)))
    assert missing.warning and missing.ok is not False
    assert doctor.exit_code([doctor.Check("credentials", True, "arn"), missing]) == 0


def test_the_rsync_here_is_found_with_its_version():
    path, version = sync.local_rsync()
    if path is None:
        pytest.skip("no rsync on this machine")
    assert version and version[0].isdigit()


def _doctor_env(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith(("AWS_", "EC2GPU_")) and k != "AWS_CA_BUNDLE":
            monkeypatch.delenv(k)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_doctor_without_credentials_exits_3_as_every_command_does(monkeypatch, tmp_path, capsys):
    _doctor_env(monkeypatch, tmp_path)
    assert cli.main(["doctor"]) == 3
    assert "FAIL credentials" in capsys.readouterr().out
    from ec2gpu.runs.plan.doctor import Check, exit_code
    assert exit_code([Check("credentials", True, ""), Check("key files", False, "")]) == 1
    assert exit_code([Check("credentials", True, ""), Check("GPU vCPU quota", None, "")]) == 0


class _Iam:
    def get_role(self, RoleName):
        raise botocore.exceptions.ClientError({"Error": {"Code": "NoSuchEntity", "Message": "no"}}, "GetRole")


def test_the_spot_role_the_sandbox_creates_on_first_use_is_no_failure_there():
    from ec2gpu.runs.plan import doctor
    aws = SimpleNamespace(client=lambda name: _Iam())
    ok, detail = doctor._spot_role(aws, spot=True, sandbox=True)
    assert ok is True and "the sandbox's first spot request creates it" in detail
    ok, _, fix = doctor._spot_role(aws, spot=True, sandbox=False)  # on AWS: said, with the command
    assert ok is False and "create-service-linked-role" in fix


def _interrupting(signum, monkeypatch):
    """`logs --follow` of a run, stopped by ``signum`` while it looks the run up."""
    from ec2gpu.runs.execute import logs

    def finished(home, name):
        os.kill(os.getpid(), signum)
        raise AssertionError("the signal was not delivered")
    monkeypatch.setattr(logs, "finished", finished)


@pytest.mark.parametrize("signum, said", [(signal.SIGINT, "interrupted by Ctrl-C"),
                                          (signal.SIGTERM, "interrupted by SIGTERM")])
def test_logs_follow_stopped_by_a_signal_says_which_and_not_that_anything_was_removed(monkeypatch, tmp_path, capsys,
                                                                                     signum, said):
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    _interrupting(signum, monkeypatch)
    assert cli.main(["logs", "r-1", "--follow"]) == 130
    err = capsys.readouterr().err
    assert said in err and "removed" not in err and "created" not in err
    assert {s: signal.getsignal(s) for s in before} == before  # main's handlers are gone again


def test_a_jobs_own_exit_130_passed_on_by_logs_follow_is_not_called_an_interruption(monkeypatch, tmp_path, capsys):
    from ec2gpu.runs.execute import logs
    log = tmp_path / "job.log"
    log.write_text("bye\n")
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setattr(logs, "finished", lambda home, name: {"run_id": "r-1", "status": "failed", "exit_status": 130})
    monkeypatch.setattr(logs, "saved_log", lambda home, name: log)
    assert cli.main(["logs", "r-1", "--follow"]) == 130
    captured = capsys.readouterr()
    assert "bye" in captured.out and "interrupted" not in captured.err


def _instance(idle_tag=None):
    from datetime import datetime, timezone

    from ec2gpu.aws.instances import Instance
    return Instance("i-1", "g4dn.xlarge", "running", datetime.now(timezone.utc),
                    tags={"ec2gpu:idle": idle_tag} if idle_tag else {})


def test_start_says_an_idle_stop_instance_stops_itself_and_others_terminate():
    from ec2gpu.runs.standing.stopstart import max_runtime_words
    stops = max_runtime_words(_instance("stop 1800"), 120)
    assert stops.startswith("it stops itself in 120 min") and "terminates" not in stops
    assert max_runtime_words(_instance("down 3600"), 90).startswith("it terminates itself in 90 min")
    assert max_runtime_words(_instance(), 120).startswith("it terminates itself in 120 min")


def test_launch_says_the_idle_rule_and_the_max_runtime_it_set():
    from ec2gpu.cli.instances import lifetime_words
    down = lifetime_words(IdleRule("down", 3600), 120)
    assert "terminates itself after 1h00m idle (--idle-down" in down and "120 min after it boots (--max-runtime)" in down
    stop = lifetime_words(IdleRule("stop", 1800), 240, count=2)
    assert stop.startswith("each stops itself after 30m idle (--idle-stop") and "240 min after it boots" in stop
    assert "terminates" not in stop
    assert lifetime_words(None, 480) == ("no idle rule (--no-idle): it terminates itself 480 min after it boots "
                                         "(--max-runtime)")


def test_stop_says_the_instance_store_is_lost_only_where_the_type_has_one():
    from ec2gpu.aws import types
    from ec2gpu.cli.instances import stopped_words
    described = {"InstanceType": "g4dn.xlarge", "VCpuInfo": {"DefaultVCpus": 4}, "MemoryInfo": {"SizeInMiB": 16384},
                 "InstanceStorageSupported": True, "InstanceStorageInfo": {"TotalSizeInGB": 125}}
    assert types._from_api(described).instance_store_gb == 125
    assert types._from_api({**described, "InstanceStorageSupported": False}).instance_store_gb == 0
    assert types.from_table(types.catalog.CATALOG["g4dn.xlarge"]).instance_store_gb is None
    row = {"name": "dev", "instance_id": "i-1", "instance_type": "g4dn.xlarge", "state": "stopped"}
    with_store = stopped_words({**row, "instance_store_gb": 125}, "dev")
    assert "EBS disk is kept" in with_store and "125 GB instance-store NVMe (/opt/dlami/nvme" in with_store
    assert "is lost" in with_store
    assert "instance-store" not in stopped_words({**row, "instance_type": "p3.2xlarge", "instance_store_gb": 0}, "dev")
    assert "if g4dn.xlarge has instance-store NVMe" in stopped_words({**row, "instance_store_gb": None}, "dev")


def test_setup_on_a_machine_without_a_gpu_says_the_job_sees_none_and_not_that_it_trains(tmp_path):
    """setup-gpu.sh runs before every job, and most jobs are not a trainer."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    python = bin_ / "python3"  # a Python "with torch": answers the probe, writes setup.json
    python.write_text('#!/bin/bash\n[ "$1" = -c ] && exit 0\ncat >/dev/null\n'
                      'printf \'{"python": "%s", "gpu_count": 0}\\n\' "$0" > "$2"\necho "python $0"\n')
    python.chmod(0o755)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp_path), "EC2GPU_PYTHON": str(python)}
    done = subprocess.run(["bash", str(ROOT / "ec2gpu" / "ami" / "setup-gpu.sh"), str(tmp_path / "setup.json")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA GPU found" in done.stdout and "the job will see no GPU" in done.stdout
    assert "training" not in done.stdout


def _user_task():
    from ec2gpu.runs.execute import engine
    from ec2gpu.tasks import load
    return engine.TaskJob(load.parse("name: mine\nrun: python train.py\n"), {}, None)


def test_a_budget_refusal_suggests_fewer_epochs_only_for_the_built_in_trainer():
    from ec2gpu.runs.execute import engine
    from ec2gpu.runs.options import RunOptions, TrainOptions
    from ec2gpu.runs.provision import pipeline
    mnist = pipeline.budget_hint(TrainOptions(task=engine.builtin_job("mnist", [])), "defaults")
    assert mnist.endswith("or train fewer --epochs")
    mine = pipeline.budget_hint(RunOptions(task=_user_task()), "--expect")
    assert "--epochs" not in mine and "the job's time in the estimate: --expect" in mine
    bench = pipeline.budget_hint(RunOptions(task=engine.builtin_job("bench", [])), "--expect")
    assert "--epochs" not in bench


def test_no_outputs_are_said_as_none_brought_home_not_by_none(monkeypatch, tmp_path):
    from ec2gpu.remote import files
    from ec2gpu.runs.execute import engine
    monkeypatch.setattr(engine.sync, "pull", lambda *a, **k: ([], "none"))
    said = []
    head = SimpleNamespace(conn=None, run_dir="/r", instance_id="i-1")
    engine._outputs_home(head, SimpleNamespace(task=SimpleNamespace(outputs=[])), tmp_path, None, said.append,
                         files.Limits())
    assert said == [f"outputs: 0 files brought home to {tmp_path / 'outputs'}"]


def test_image_bake_name_help_names_the_default_the_code_makes():
    import typer
    from datetime import datetime, timezone

    from ec2gpu.aws import baked
    bake = typer.main.get_command(cli.app).commands["image"].commands["bake"]
    (help_,) = [p.help for p in bake.params if p.name == "name"]
    assert "default <task>-<UTC time>, e.g. quickstart-20261122-184950" in help_
    assert baked.ami_name("quickstart", datetime(2026, 11, 22, 18, 49, 50, tzinfo=timezone.utc)) == \
        "quickstart-20261122-184950"


def test_runs_takes_sandbox_like_every_command_and_lists_the_sandboxs_runs(monkeypatch, tmp_path, capsys):
    from ec2gpu.runs.settle import ledger
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.delenv("EC2GPU_SANDBOX", raising=False)
    for run_id, backend in (("r-aws", "aws"), ("r-box", "sandbox")):
        ledger.record(tmp_path, {"run_id": run_id, "command": "c", "backend": backend, "status": "completed",
                                 "started_at": "2026-11-20T12:00:00+00:00", "cost_usd": 0.01})
    assert cli.main(["runs", "--sandbox", "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == ["r-box"]
    assert cli.main(["runs", "--json"]) == 0
    assert sorted(r["run_id"] for r in json.loads(capsys.readouterr().out)) == ["r-aws", "r-box"]


def _bench_summary(dbn_acc):
    row = {"samples_per_second": 500.0, "train_seconds": 22.5, "time_to_target_seconds": None, "epochs": 2}
    return {"kind": "bench", "quick": True, "best_device": "cpu",
            "models": {"dbn": {"cpu": {**row, "test_acc": dbn_acc}}, "cnn": {"cpu": {**row, "test_acc": 0.93}}}}


def test_a_bench_figure_at_chance_is_marked_did_not_train_and_has_no_usd_per_run():
    from ec2gpu.runs.provision import bench
    from ec2gpu.train import bench as instance
    assert not instance.trained(0.1028) and not instance.trained(0.1135) and instance.trained(0.35)
    per = bench.usd_per_run(_bench_summary(0.1028), 0.526)
    assert per["dbn"] == {"seconds": None, "usd": None,
                          "basis": "did not train (test accuracy 10.28%, under 20%)"}
    assert per["cnn"]["usd"] is not None and per["cnn"]["basis"] == "whole run (target not reached)"
    trained = {"instance_type": "a", "usd_per_run": bench.usd_per_run(_bench_summary(0.97), 10.0)}
    untrained = {"instance_type": "b", "usd_per_run": bench.usd_per_run(_bench_summary(0.1028), 0.001)}
    assert [r["instance_type"] for r in bench.rank([untrained, trained])][0] == "b"  # cnn first, and b is cheaper
    assert bench.rank([{**untrained, "usd_per_run": {"dbn": untrained["usd_per_run"]["dbn"]}},
                       {**trained, "usd_per_run": {"dbn": trained["usd_per_run"]["dbn"]}}])[0]["instance_type"] == "a"


def test_the_bench_table_says_did_not_train_beside_a_figure_at_chance(monkeypatch):
    import io

    from rich.console import Console

    from ec2gpu.cli import bench as cli_bench
    buf = io.StringIO()
    monkeypatch.setattr(cli_bench, "out", Console(file=buf, width=160, force_terminal=False))
    row = {"train_seconds": 22.51, "samples_per_second": 529.0, "epochs": 2, "target_acc": 0.96,
           "time_to_target_seconds": None, "batch_size": 64}
    report = {"quick": True, "devices": ["cpu"],
              "machine": {"cpu": "AMD EPYC", "vcpus": 2, "ram_bytes": 2**34, "gpus": [], "driver": None, "cuda": None,
                          "torch": "2.13.0", "python": "3.11"},
              "bandwidth": {"cpu": {"copy_gbs": 80.0, "triad_gbs": 70.0}}, "compute": {"cpu": {"fp32_tflops": 0.17}},
              "training": {"models": {"dbn": {"cpu": {**row, "test_acc": 0.1028}},
                                      "cnn": {"cpu": {**row, "test_acc": 0.9302}}}, "batch": {}}}
    summary = _bench_summary(0.1028)
    from ec2gpu.runs.provision import bench
    cli_bench._show({"instance_type": "g4dn.xlarge", "bench": report, "usd_per_hour": 0.526, "artifacts": "/r",
                     "usd_per_run": bench.usd_per_run(summary, 0.526)})
    shown = " ".join(buf.getvalue().split())
    assert "10.28% did not train" in shown and "93.02% did not train" not in shown
    assert "did not train: dbn on the CPU" in shown and "dbn - (did not train" in shown


def test_the_bench_without_data_names_its_own_data_option(monkeypatch, tmp_path):
    from ec2gpu.errors import UsageError
    from ec2gpu.runs.plan import sandbox_data
    from ec2gpu.runs.provision import bench
    from ec2gpu.train import sources
    monkeypatch.delenv("EC2GPU_DATA_DIR", raising=False)
    monkeypatch.setattr(sources, "DEFAULT_CACHE", tmp_path / "no-cache")
    monkeypatch.setattr(sandbox_data, "_reachable", lambda url: False)
    with pytest.raises(UsageError) as info:
        bench.job_args(True, sandbox=True)
    assert "ec2gpu bench --sandbox --data-dir /path/to/mnist" in info.value.hint
    assert "train mnist" not in info.value.hint
    with pytest.raises(UsageError) as info:  # `train mnist`'s own words are unchanged
        sandbox_data.sandbox_data_args([])
    assert "EC2GPU_DATA_DIR=/path/to/mnist ec2gpu train mnist --sandbox" in info.value.hint


def test_bench_refuses_a_data_dir_an_instance_on_aws_cannot_read(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("EC2GPU_SANDBOX", raising=False)
    assert cli.main(["bench", "--data-dir", str(tmp_path)]) == 2
    assert "an instance on AWS cannot read" in " ".join(capsys.readouterr().err.split())
