"""Pure request builders and catalog rules: no AWS, no mocks."""

from datetime import datetime, timezone

import pytest

from ec2gpu.aws import catalog, instances, network
from ec2gpu.aws.instances import Instance
from ec2gpu.errors import RetiredInstanceType, UsageError
from ec2gpu.remote import jobs
from ec2gpu.runs.plan import costs, sandbox_data
from ec2gpu.runs.options import TrainOptions
from ec2gpu.runs.provision import pipeline


def spec(**kw):
    base = dict(run_id="r1", owner="alice", name="ec2gpu-r1", instance_type="g4dn.xlarge", image_id="ami-1",
                root_device_name="/dev/sda1", key_name="k", security_group_id="sg-1")
    return instances.LaunchSpec(**{**base, **kw})


def test_run_request_requires_imdsv2_encrypted_gp3_root_and_terminate_on_shutdown():
    req = instances.run_request(spec())
    assert req["MetadataOptions"]["HttpTokens"] == "required"
    ebs = req["BlockDeviceMappings"][0]["Ebs"]
    assert req["BlockDeviceMappings"][0]["DeviceName"] == "/dev/sda1"
    assert ebs["Encrypted"] is True and ebs["VolumeType"] == "gp3" and ebs["DeleteOnTermination"] is True
    assert req["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert "InstanceMarketOptions" not in req


def test_a_run_asks_for_all_its_nodes_at_once_and_a_pool_for_one_at_least():
    req = instances.run_request(spec(count=3))
    assert (req["MinCount"], req["MaxCount"]) == (3, 3)  # torchrun's nodes: all of them or none
    req = instances.run_request(spec(count=3, min_count=1))
    assert (req["MinCount"], req["MaxCount"]) == (1, 3)  # a pool: what EC2 has, then it grows


def test_run_request_tags_instance_and_volume_with_run_owner_and_name():
    req = instances.run_request(spec())
    kinds = {t["ResourceType"]: {x["Key"]: x["Value"] for x in t["Tags"]} for t in req["TagSpecifications"]}
    common = {"ec2gpu:run": "r1", "ec2gpu:owner": "alice", "Name": "ec2gpu-r1"}
    assert kinds["volume"] == common
    assert kinds["instance"] == {**common, "ec2gpu:max-runtime": "120"}  # `ec2gpu start` schedules it again


def test_an_idle_rule_sets_the_shutdown_behaviour_tags_the_instance_and_ships_the_watcher():
    from ec2gpu.aws.instances import IdleRule, parse_idle_tag
    stop = instances.run_request(spec(idle=IdleRule("stop", 1800)))
    assert stop["InstanceInitiatedShutdownBehavior"] == "stop"  # the watcher's shutdown stops it, keeping the disk
    tags = {x["Key"]: x["Value"] for x in stop["TagSpecifications"][0]["Tags"]}
    assert tags["ec2gpu:idle"] == "stop 1800" and parse_idle_tag(tags["ec2gpu:idle"]) == IdleRule("stop", 1800)
    down = instances.run_request(spec(idle=IdleRule("down", 60)))
    assert down["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert "idle-watch.sh" in down["UserData"] and 'echo "60 15"' in down["UserData"]  # checked every 15 s
    assert "idle-watch.sh" not in instances.run_request(spec())["UserData"]
    assert parse_idle_tag("x 5") is None and parse_idle_tag(None) is None and parse_idle_tag("down 1h") is None


def test_the_console_says_how_long_the_instance_has_been_idle():
    said = ("boot\nec2gpu-idle: idle since 1000 rule 60\nec2gpu-idle: busy ssh since 1010 rule 60\n"
            "ec2gpu-idle: idle since 1040 rule 60\n")
    assert instances.idle_state(said, now=1100.4) == {"idle_seconds": 60, "busy": None}
    assert instances.idle_state(said.rsplit("ec2gpu-idle: idle", 1)[0], now=1100) == {"idle_seconds": None,
                                                                                      "busy": "ssh"}
    assert instances.idle_state("boot only\n", now=1) is None


@pytest.mark.parametrize("flags, expected", [
    ({}, ("down", 3600)), ({"idle_stop": "30m"}, ("stop", 1800)), ({"idle_down": "2h"}, ("down", 7200)),
    ({"idle_down": "20s"}, ("down", 20)), ({"no_idle": True, "max_runtime": 60}, None),
])
def test_launch_gets_an_idle_rule_by_default(flags, expected):
    from ec2gpu.api.instances import idle_rule
    rule = idle_rule(flags.get("idle_stop"), flags.get("idle_down"), flags.get("no_idle", False),
                     flags.get("max_runtime"), spot=False)
    assert (rule.action, rule.seconds) == expected if expected else rule is None


@pytest.mark.parametrize("flags, message", [
    ({"no_idle": True}, "explicit --max-runtime"), ({"idle_stop": "1h", "idle_down": "1h"}, "exclude each other"),
    ({"idle_down": "soon"}, "not a duration"), ({"idle_down": "5s"}, "under 10 seconds"),
    ({"idle_stop": "1h", "spot": True}, "spot"),
])
def test_launch_refuses_an_idle_rule_that_cannot_hold(flags, message):
    from ec2gpu.api.instances import idle_rule
    with pytest.raises(UsageError, match=message):
        idle_rule(flags.get("idle_stop"), flags.get("idle_down"), flags.get("no_idle", False), None,
                  spot=flags.get("spot", False))


def test_start_reads_the_max_runtime_tag_and_schedules_the_shutdown_with_the_logins_own_command():
    from ec2gpu.runs.standing import stopstart
    def tagged(tags):
        return Instance("i-1", "g4dn.xlarge", "stopped", datetime.now(timezone.utc), tags=tags)
    assert stopstart.max_runtime_minutes(tagged({"ec2gpu:max-runtime": "45"})) == 45
    assert stopstart.max_runtime_minutes(tagged({})) == stopstart.DEFAULT_MAX_RUNTIME_MINUTES
    assert stopstart.max_runtime_minutes(tagged({"ec2gpu:max-runtime": "x; rm"})) == 120
    line = stopstart.schedule_shutdown_command(45)
    # sudo's secure_path would find /usr/sbin/shutdown even where the login's PATH has another
    assert line.startswith("cmd=$(command -v shutdown) && ") and 'sudo -n "$cmd" -h +45' in line


def test_spot_request_is_one_time_and_terminates_on_interruption():
    opts = instances.run_request(spec(spot=True))["InstanceMarketOptions"]
    assert opts == {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time",
                                                          "InstanceInterruptionBehavior": "terminate"}}


def test_user_data_is_the_plain_script_boto3_encodes_once():
    data = instances.run_request(spec(max_runtime_minutes=90))["UserData"]
    assert data.startswith("#!/bin/bash\n") and "shutdown -h +90" in data
    assert "shutdown" not in instances.user_data(None)


def test_ingress_opens_port_22_to_the_given_cidr_only():
    req = network.ingress_request("sg-1", "203.0.113.7/32")
    (perm,) = req["IpPermissions"]
    assert (perm["FromPort"], perm["ToPort"], perm["IpProtocol"]) == (22, 22, "tcp")
    assert [r["CidrIp"] for r in perm["IpRanges"]] == ["203.0.113.7/32"]


def test_ssh_cidr_uses_caller_ip_slash_32_and_validates_explicit_cidr(monkeypatch):
    monkeypatch.setattr(network, "caller_ip", lambda url=None: "198.51.100.4")
    assert network.ssh_cidr(None) == "198.51.100.4/32"
    assert network.ssh_cidr("10.0.0.0/8") == "10.0.0.0/8"
    with pytest.raises(UsageError):
        network.ssh_cidr("not-a-cidr")


def test_g2_is_retired_and_suggests_g4dn():
    with pytest.raises(RetiredInstanceType) as exc:
        catalog.lookup("g2.2xlarge")
    assert "K520" in exc.value.message and "g4dn.xlarge" in exc.value.hint


@pytest.mark.parametrize("name", ["t3.micro", "c5.large", "g9.huge"])
def test_non_gpu_or_unknown_types_are_refused(name):
    with pytest.raises(UsageError):
        catalog.lookup(name)


def test_catalog_knows_the_supported_families():
    assert {catalog.lookup(n).gpu for n in ("g4dn.xlarge", "g5.xlarge", "g6.xlarge", "p4d.24xlarge")} == \
        {"T4", "A10G", "L4", "A100"}


def test_billing_is_per_second_with_a_60_second_minimum():
    from datetime import datetime, timedelta
    t0 = datetime(2026, 1, 1)
    assert costs.billed_seconds(t0, t0 + timedelta(seconds=20)) == 60
    assert costs.billed_seconds(t0, t0 + timedelta(seconds=125.5)) == 125.5
    assert costs.cost_usd(3600, 0.526) == pytest.approx(0.526)


def test_train_mnist_flags_become_the_builtin_task_args():
    opts = TrainOptions(model="lenet", epochs=3, seed=7, trainer_args=["--lr", "0.05"])
    job = pipeline.builtin_task(opts)
    argv = job.args
    assert job.builtin == "mnist" and job.task.name == "mnist"
    assert argv[argv.index("--model") + 1] == "lenet" and argv[argv.index("--epochs") + 1] == "3"
    assert argv[argv.index("--seed") + 1] == "7" and argv[-2:] == ["--lr", "0.05"]
    # its workdir is the trainer: torch and numpy only, never the AWS or SSH layers
    assert "ec2gpu/train/mnist.py" in job.manifest.files and "ec2gpu/train/launch.py" in job.manifest.files
    assert not [f for f in job.manifest.files if f.startswith(("ec2gpu/aws", "ec2gpu/remote", "ec2gpu/runs"))]


def test_sandbox_cluster_nodes_share_the_cores():
    opts = TrainOptions(nodes=2)
    assert "--threads" in pipeline.mnist_args(opts, sandbox=True)
    assert "--threads" not in pipeline.mnist_args(opts, sandbox=False)


def test_line_splitter_emits_whole_lines_across_chunk_boundaries():
    got = []
    split = jobs.LineSplitter(got.append)
    for chunk in (b"ab", b"c\nde", b"f\n", b"tail"):
        split(chunk)
    split.flush()
    assert got == ["abc", "def", "tail"]


def test_job_script_stops_when_its_directory_is_gone_and_writes_status_only_there(tmp_path):
    import subprocess

    from ec2gpu.remote import jobs
    gone = tmp_path / "run-dir-removed"
    script = jobs.job_script(str(gone), ["touch", "ran-here"])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True)
    assert done.returncode == 1 and list(tmp_path.iterdir()) == []  # nothing ran, no exit_status elsewhere
    gone.mkdir()
    subprocess.run(["bash", "-c", jobs.job_script(str(gone), ["sh", "-c", "cd / && exit 4"])], cwd=tmp_path, check=True)
    assert (gone / "exit_status").read_text().strip() == "4"


def test_the_shell_shipped_to_instances_passes_shellcheck(tmp_path):
    import shutil
    import subprocess

    import pytest

    from ec2gpu.remote import jobs, setup
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (.ci/run installs it)")
    from ec2gpu.runs.standing import stopstart
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\n" + jobs.job_script("/home/ubuntu/ec2gpu/runs/r1", ["python3", "-m", "x"], {"A": "b c"}))
    data = tmp_path / "user-data.sh"
    data.write_text(instances.user_data(120, instances.IdleRule("down", 3600)))  # the idle watcher inside
    start = tmp_path / "start.sh"
    start.write_text("#!/bin/bash\n" + stopstart.RESUME_IDLE_WATCH + "\n" + stopstart.schedule_shutdown_command(5) + "\n")
    from datetime import datetime, timezone

    from ec2gpu.runs.provision import bake  # the bake's one-liners and the builder's per-boot script
    hook = bake.per_boot_script("i-0123", datetime(2026, 11, 22, tzinfo=timezone.utc))
    baking = tmp_path / "bake.sh"
    baking.write_text("#!/bin/bash\n" + bake.keep_setup_command("/home/ubuntu/ec2gpu/runs/r 1", "img (1)") + "\n" +
                      bake.per_boot_install_command("/home/ubuntu/ec2gpu/runs/r 1/ec2gpu-max-runtime.sh") + "\n")
    (tmp_path / "per-boot.sh").write_text(hook)
    done = subprocess.run(["shellcheck", str(setup.script_path()), str(job), str(data), str(start), str(baking),
                           str(tmp_path / "per-boot.sh"),
                           *[str(setup.script_path().parent / f) for f in ("idle-watch.sh", "install-cuda.sh",
                                                                             "clean-for-image.sh")]],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_a_wide_ssh_cidr_is_said_and_a_bad_one_refused():
    said = []
    assert network.check_cidr("0.0.0.0/0", said.append) == "0.0.0.0/0" and "anyone on the internet" in said[0]
    assert network.check_cidr("203.0.113.7", said.append) == "203.0.113.7/32" and len(said) == 1
    network.check_cidr("10.0.0.0/16", said.append)
    assert "65,536 addresses" in said[1]
    with pytest.raises(UsageError, match="not a CIDR"):
        network.check_cidr("notacidr")


def test_placement_groups_unlisted_only_where_the_api_is_unavailable_never_on_a_refusal():
    import boto3
    import botocore.exceptions
    from botocore.stub import Stubber

    from ec2gpu.aws import placement
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    said = []
    with Stubber(ec2) as stub:
        stub.add_client_error("describe_placement_groups", "InternalError", http_status_code=500)
        assert placement.find(ec2, log=said.append) == [] and "unavailable" in said[0]
        stub.add_client_error("describe_placement_groups", "UnauthorizedOperation", http_status_code=403)
        with pytest.raises(botocore.exceptions.ClientError):  # cleanup must not skip them in silence
            placement.find(ec2, log=said.append)
        stub.add_client_error("delete_placement_group", placement.MISSING, http_status_code=400)
        placement.delete(ec2, "gone")  # already gone: fine
        stub.add_client_error("delete_placement_group", "InvalidPlacementGroup.InUse", http_status_code=400)
        with pytest.raises(botocore.exceptions.ClientError):
            placement.delete(ec2, "busy")


def test_the_instance_watch_reports_api_errors_then_gives_up_and_lets_bugs_through():
    import botocore.exceptions

    from ec2gpu.errors import AwsError
    from ec2gpu.runs.recover import recovery

    class Ec2:
        error: Exception = botocore.exceptions.EndpointConnectionError(endpoint_url="http://x")

        def describe_instances(self, **kw):
            raise self.error
    said = []
    watch = recovery.InstanceWatch(Ec2(), "i-1", recovery.NoCheckpoints(), said.append)
    for _ in range(recovery.MAX_API_FAILURES - 1):
        watch.check()  # reported, not an interruption
    assert len(said) == recovery.MAX_API_FAILURES - 1 and "i-1" in said[0]
    with pytest.raises(AwsError):
        watch.check()
    Ec2.error = KeyError("a bug")
    with pytest.raises(KeyError):  # not swallowed as an "API hiccup"
        recovery.InstanceWatch(Ec2(), "i-1", recovery.NoCheckpoints(), said.append).check()


def _builtin_argv(tmp_path, nodes: int, index: int, gpus: int, args=("--epochs", "1")) -> list[str]:
    """What the built-in task's run script executes on node ``index`` of ``nodes`` (a fake Python
    records its argv), with the environment the engine gives that node."""
    import subprocess

    from ec2gpu.runs.execute import engine
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    job = pipeline.builtin_task(TrainOptions(nodes=nodes))
    addresses = [f"10.0.0.{k + 1}" for k in range(nodes)]
    env = engine.node_env(job, "r1", str(tmp_path / "run"), index, addresses, gpus, resume=False, python=str(fake))
    done = subprocess.run(["bash", "-c", job.task.run, job.name, *args], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_torchrun_rendezvous_is_on_node_0_and_each_node_binds_its_own_address(tmp_path):
    for index in (0, 1):
        argv = _builtin_argv(tmp_path, nodes=2, index=index, gpus=0)
        assert argv[:2] == ["-m", "ec2gpu.train.launch"]
        flag = {f: argv[argv.index(f) + 1] for f in ("--nnodes", "--nproc-per-node", "--node-rank", "--master-addr",
                                                     "--local-addr", "--max-restarts")}
        assert flag == {"--nnodes": "2", "--nproc-per-node": "1", "--node-rank": str(index),
                        "--master-addr": "10.0.0.1", "--local-addr": f"10.0.0.{index + 1}", "--max-restarts": "0"}
        assert argv[argv.index("-m", 2) + 1] == "ec2gpu.train.mnist" and argv[-2:] == ["--epochs", "1"]


def test_one_gpu_on_one_node_runs_the_trainer_directly_and_four_gpus_get_four_processes(tmp_path):
    argv = _builtin_argv(tmp_path, nodes=1, index=0, gpus=1)
    assert argv[:2] == ["-m", "ec2gpu.train.mnist"] and "--nnodes" not in argv
    argv = _builtin_argv(tmp_path, nodes=1, index=0, gpus=4)
    assert argv[argv.index("--nproc-per-node") + 1] == "4" and argv[argv.index("--master-addr") + 1] == "10.0.0.1"


def test_the_sandbox_gets_this_runs_data_directory_or_a_clear_refusal_before_anything(tmp_path, monkeypatch):
    from ec2gpu.train import sources
    monkeypatch.setattr(sources, "DEFAULT_CACHE", tmp_path / "no-cache")
    monkeypatch.setenv("EC2GPU_DATA_DIR", str(tmp_path))
    assert sandbox_data.sandbox_data_args([]) == ["--data-dir", str(tmp_path.resolve())]  # this run's, not the sandbox's
    assert sandbox_data.sandbox_data_args(["--data-dir=/x"]) == []  # the user's own wins
    monkeypatch.setenv("EC2GPU_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="is not a directory"):
        sandbox_data.sandbox_data_args([])
    monkeypatch.delenv("EC2GPU_DATA_DIR")
    assert sandbox_data.sandbox_data_args([], reachable=lambda url: True) == []  # the instance downloads, as on EC2
    with pytest.raises(UsageError, match="cannot be reached from here") as exc:
        sandbox_data.sandbox_data_args([], reachable=lambda url: False)
    assert "EC2GPU_DATA_DIR=/path/to/mnist" in exc.value.hint
    for name in sources.FILES:  # a cached copy on this machine is used
        (tmp_path / "no-cache").mkdir(exist_ok=True)
        (tmp_path / "no-cache" / f"{name}.gz").write_bytes(b"")
    assert sandbox_data.sandbox_data_args([], reachable=lambda url: False) == ["--data-dir", str(tmp_path / "no-cache")]
