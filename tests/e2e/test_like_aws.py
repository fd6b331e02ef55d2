"""The sandbox behaving like EC2 where moto does not (`ec2gpu sandbox up --like-aws`): instances
pending for a while, sshd later, the console's host key fingerprints later still, NotFound for
just-created resources and RequestLimitExceeded now and then, user data run as cloud-init runs it.
The real code path must hold up: host keys verified (never trusted on first use), billing from
running, and the --max-runtime safety net firing on the instance itself."""
import base64
import json
import os
import time
from datetime import datetime, timezone

import pytest

from ec2gpu import cli
from ec2gpu.aws import instances, network, sweep
from ec2gpu.aws.session import Aws
from ec2gpu.sandbox import control

from test_sandbox_train import processes_gone  # same folder (pytest prepend import mode)
from test_spot_recovery import drive, interrupt

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def like_aws_home(tmp_path_factory, mnist_dir):
    """A sandbox of its own, in the AWS-like mode, for this module; stopped by pid after."""
    home = tmp_path_factory.mktemp("like-aws-home")
    saved = os.environ.get("EC2GPU_DATA_DIR")
    os.environ["EC2GPU_DATA_DIR"] = str(mnist_dir)
    state = control.up(home, like_aws=True)
    assert state["like_aws"]
    yield home, state
    control.down(home)
    if saved is None:
        os.environ.pop("EC2GPU_DATA_DIR", None)
    else:
        os.environ["EC2GPU_DATA_DIR"] = saved


@pytest.fixture
def like_aws(like_aws_home, monkeypatch):
    home, state = like_aws_home
    monkeypatch.setenv("EC2GPU_HOME", str(home))
    for k, v in control.env_vars(state).items():
        monkeypatch.setenv(k, v)
    return home, Aws("us-east-1", endpoint_url=state["endpoint"]).ec2  # the tool's client: its retries too


@pytest.fixture(scope="module")
def standing(like_aws_home):
    """A standing instance launched with --max-runtime 1 at the start of the module: it must end
    itself (user data `shutdown -h +1`, run by the sandbox's cloud-init) while the others run."""
    home, state = like_aws_home
    env = {"EC2GPU_HOME": str(home), **control.env_vars(state)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        assert cli.main(["launch", "--sandbox", "--name", "selfstop", "--max-runtime", "1", "--json"]) == 0
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return "selfstop"


def run_leftovers(ec2, record) -> list:
    """What of this run is still there: live instances, its security groups and key pairs."""
    described = instances.describe_instances(ec2, record["instance_ids"])
    live = [i.id for i in described if i.state in ("pending", "running")]
    return live + [g["GroupId"] for g in sweep.find_security_groups(ec2, record["run_id"])] + \
        [k["KeyName"] for k in sweep.find_key_pairs(ec2, record["run_id"])]


def assert_verified_not_trusted(err: str, instances_: int) -> None:
    assert err.count("verified against the console output") == instances_, err
    assert "trusted on first use" not in err and "waiting for" in err


def test_mnist_run_passes_with_the_host_key_verified(like_aws, standing, tmp_path):
    home, ec2 = like_aws
    code, stdout, err = drive(["train", "mnist", "--sandbox", "--json", "--out", str(tmp_path / "r"),
                               "--trainer-arg=--train-subset=2000"], [])
    assert code == 0, err
    record = json.loads(stdout)
    assert record["status"] == "completed" and record["test_acc"] > 0.2  # it learned (chance is 0.1) from 2,000 images
    assert_verified_not_trusted(err, 1)
    assert run_leftovers(ec2, record) == [] and processes_gone(record["instance_ids"])


def test_spot_interruption_recovers_verifies_host_keys_and_bills_from_running(like_aws, tmp_path):
    home, ec2 = like_aws
    code, stdout, err = drive(
        ["train", "mnist", "--sandbox", "--spot", "--epochs", "2", "--json", "--out", str(tmp_path / "r"),
         "--trainer-arg=--train-subset=10000"],
        [("epoch 1/2 train_loss", interrupt(home, 2.0))])  # the end of epoch 1 (not its progress line)
    assert code == 0, err
    record = json.loads(stdout)
    first, second = record["attempts"]
    # the trainer saw the notice, or the controller saw EC2's termination first: either is an interruption
    assert ("interruption notice" in first["ended"] or "SpotInstanceTermination" in first["ended"]), first
    assert second["ended"] == "completed" and record["status"] == "completed"
    assert_verified_not_trusted(err, 2)
    # pending is not billed: each instance's billing starts after its launch, when it was seen to run
    assert all(a["billing_started_at"] > a["launched_at"] for a in (first, second))
    assert record["phases"]["waiting for running"] >= 1.5
    assert run_leftovers(ec2, record) == [] and processes_gone(record["instance_ids"])


def test_two_nodes_train_together_under_like_aws(like_aws, torchrun_port, tmp_path):
    home, ec2 = like_aws
    code, stdout, err = drive(["train", "mnist", "--sandbox", "--nodes", "2", "--json", "--out", str(tmp_path / "r"),
                               "--trainer-arg=--train-subset=6000"], [])
    assert code == 0, err
    record = json.loads(stdout)
    assert record["status"] == "completed" and record["summary"]["world_size"] == 2
    assert_verified_not_trusted(err, 2)
    assert run_leftovers(ec2, record) == [] and processes_gone(record["instance_ids"])


def test_user_data_encoded_twice_is_not_run_as_on_ec2(like_aws):
    """The bug this mode exists to catch: base64 text reaches cloud-init, which runs nothing."""
    home, ec2 = like_aws
    ami = ec2.describe_images(Owners=["898082745236"])["Images"][0]["ImageId"]
    ec2.import_key_pair(KeyName="twice", PublicKeyMaterial=network.generate_key()[1].encode())
    script = "#!/bin/bash\nshutdown -h now\n"
    (inst,) = ec2.run_instances(ImageId=ami, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1, KeyName="twice",
                                UserData=base64.b64encode(script.encode()).decode(),  # the bug: encoded twice
                                InstanceInitiatedShutdownBehavior="terminate")["Instances"]
    iid = inst["InstanceId"]
    log = home / "sandbox" / "instances" / iid / "cloud-init-output.log"
    deadline = time.monotonic() + 30
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "not a script" in log.read_text()
    time.sleep(1.0)  # a `shutdown -h now` would have ended it by now
    (desc,) = instances.describe_instances(ec2, [iid])
    assert desc.state == "running"
    ec2.terminate_instances(InstanceIds=[iid])
    ec2.delete_key_pair(KeyName="twice")


def test_max_runtime_ends_the_standing_instance_by_itself_within_90_s(like_aws, standing):
    home, ec2 = like_aws
    deadline = time.monotonic() + 150
    while True:  # normally already over: the tests above took longer than a minute
        (inst,) = [i for r in ec2.describe_instances(Filters=[{"Name": "tag:Name", "Values": [standing]}])["Reservations"]
                   for i in r["Instances"]]
        if inst["State"]["Name"] == "terminated" or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert inst["State"]["Name"] == "terminated"
    assert inst["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"  # the instance's own shutdown
    ended = instances.Instance.of(inst).transitioned_at
    assert ended is not None
    assert 55 <= (ended - inst["LaunchTime"]).total_seconds() <= 90
    assert ended <= datetime.now(timezone.utc)
    # teardown of what the launch left: group and key pair (the instance is gone)
    assert cli.main(["cleanup", "--sandbox"]) == 0
