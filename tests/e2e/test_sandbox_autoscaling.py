"""Auto Scaling groups in the sandbox run as on AWS (sandbox/autoscaling.py): a group made by
aws/groups.create launches instances from its launch template that are whole sandbox instances
(sshd with the template's key pair, user data run once, the instance profile's credentials through
IMDSv2, spot, the group's tags); an instance that is terminated, interrupted or shuts itself down
is replaced by a new one; capacity 0 ends them all for good; the run's deadline (a scheduled
action) brings the group to 0 with nobody calling anything; a rebalance recommendation gets the
at-risk instance replaced first in a group with Capacity Rebalancing on, and nothing in a run's.
Each test removes its group and finds no process of its instances left."""
import hashlib
import json
import subprocess
import time
from datetime import datetime, timedelta, timezone

import botocore.exceptions
import pytest

from ec2gpu import cli
from ec2gpu.aws import capacity, groups, images, instances, network, sweep
from ec2gpu.aws.session import Aws
from ec2gpu.sandbox import control

from test_detached_run import _nothing_left, _task, _wait  # same folder (pytest prepend import mode)
from test_sandbox_train import processes_gone, sandbox_settles  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # no training
TRUST = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
#: prepended to the run's own user data: what the instance saw on its first boot, as one JSON line
#: in ~/user-data.json, and one line more in ~/boots for every run of the user data
PROBE = """echo "$EC2GPU_SANDBOX_INSTANCE" >>"$HOME/boots"
python3 - >"$HOME/user-data.json.tmp" <<'EOF'
import json, os, urllib.request
base = os.environ["EC2GPU_IMDS_ENDPOINT"]
out = {"instance": os.environ.get("EC2GPU_SANDBOX_INSTANCE")}
try:
    token = urllib.request.urlopen(urllib.request.Request(
        base + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})).read().decode()
    out["imds_instance_id"] = urllib.request.urlopen(urllib.request.Request(
        base + "/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token})).read().decode()
    import boto3
    credentials = boto3.Session().get_credentials()
    out["method"], out["key_id"] = credentials.method, credentials.access_key
    boto3.client("s3", region_name="us-east-1").list_buckets()
    out["s3"] = True
except Exception as exc:
    out["error"] = repr(exc)
print(json.dumps(out))
EOF
mv "$HOME/user-data.json.tmp" "$HOME/user-data.json"
"""
LIVE = ("pending", "running")


def wait_for(what: str, check, timeout_s: float = 60, every_s: float = 0.25):
    """``check()``'s first truthy answer within ``timeout_s``; fails the test naming ``what`` if none."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


class Run:
    """One run's key pair, security group, instance profile and group, in the session's sandbox."""

    def __init__(self, home, state, tmp_path, run_id: str, monkeypatch):
        self.home, self.state, self.tmp_path, self.run_id = home, state, tmp_path, run_id
        self.aws = Aws("us-east-1", endpoint_url=state["endpoint"])
        self.ec2, self.asg, self.iam = self.aws.ec2, self.aws.client("autoscaling"), self.aws.client("iam")
        self.key_name, self.key_file = network.create_key_pair(self.ec2, run_id, "alice", tmp_path)
        self.sg = network.create_security_group(self.ec2, run_id, "alice", "127.0.0.1/32")
        self.profile = f"ec2gpu-{run_id}"
        self.iam.create_role(RoleName=self.profile, AssumeRolePolicyDocument=TRUST)
        self.iam.create_instance_profile(InstanceProfileName=self.profile)
        self.made_at = time.time()  # the profile and security group: AWS (and --like-aws) sees them a while later
        self.iam.add_role_to_instance_profile(InstanceProfileName=self.profile, RoleName=self.profile)
        self.ami = images.resolve_ami(self.aws.client("ssm"), self.ec2)
        self.subnets = list(capacity.default_subnets(self.ec2).values())[:2]
        self.seen: set[str] = set()

        def with_probe(spec):  # the run's user data, with PROBE first
            req = instances.run_request(spec)
            req["UserData"] = req["UserData"].replace("#!/bin/bash\n", "#!/bin/bash\n" + PROBE, 1)
            return req
        monkeypatch.setattr(groups, "run_request", with_probe)

    def spec(self, spot: bool = True, run_id: str | None = None) -> instances.LaunchSpec:
        return instances.LaunchSpec(
            run_id=run_id or self.run_id, owner="alice", name="asg", instance_type="g4dn.xlarge",
            image_id=self.ami["ImageId"], root_device_name=self.ami["RootDeviceName"], key_name=self.key_name,
            security_group_id=self.sg, spot=spot, max_runtime_minutes=90, instance_profile=self.profile)

    def create(self, spot: bool = True, deadline: datetime | None = None, run_id: str | None = None) -> str:
        return groups.create(self.ec2, self.asg, self.spec(spot, run_id), ["g5.xlarge", "g4dn.xlarge"], self.subnets,
                             1, deadline, made_at=self.made_at)

    def live(self, run_id: str | None = None) -> list[dict]:
        """The run's pending and running instances, as DescribeInstances lists them."""
        found = [i for r in self.ec2.describe_instances(Filters=[
            {"Name": "tag:ec2gpu:run", "Values": [run_id or self.run_id]},
            {"Name": "instance-state-name", "Values": list(LIVE)}])["Reservations"] for i in r["Instances"]]
        self.seen |= {i["InstanceId"] for i in found}
        return found

    def group(self, run_id: str | None = None) -> dict:
        (found,) = self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[groups.name_of(run_id or self.run_id)])["AutoScalingGroups"]
        return found

    def booted(self, iid: str) -> dict | None:
        """What the user data of ``iid`` wrote, once it has, and its sshd is up; else None."""
        directory = control.state_dir(self.home) / "instances" / iid
        result = directory / "home" / "user-data.json"
        up = iid in (control.read_state(self.home) or {}).get("instances", {})
        return json.loads(result.read_text()) if up and result.exists() else None

    def one_booted(self, other_than: str | None = None, run_id: str | None = None) -> tuple[dict, dict]:
        """(DescribeInstances' instance, its user data's JSON) of the group's one running instance,
        once it is not ``other_than`` and its user data has run."""
        def ready():
            live = [i for i in self.live(run_id) if i["InstanceId"] != other_than]
            if len(live) == 1 and live[0]["State"]["Name"] == "running":
                ran = self.booted(live[0]["InstanceId"])
                return (live[0], ran) if ran else None
            return None
        return wait_for(f"a booted instance of {run_id or self.run_id} other than {other_than}", ready)

    def ssh(self, iid: str, command: str) -> subprocess.CompletedProcess:
        """``command`` on ``iid`` over OpenSSH with the run's key, its host key pinned from the
        instance's directory."""
        host, port = control.resolver(self.home)(iid, 30)
        pub = (control.state_dir(self.home) / "instances" / iid / "ssh_host_ed25519_key.pub").read_text().split()
        known = self.tmp_path / f"known_hosts-{iid}"
        known.write_text(f"[{host}]:{port} {pub[0]} {pub[1]}\n")
        return subprocess.run(["ssh", "-F", "/dev/null", "-i", str(self.key_file), "-p", str(port), "-o", "BatchMode=yes",
                               "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}", host, command],
                              capture_output=True, text=True, timeout=60)

    def described(self, iid: str) -> dict:
        (found,) = [i for r in self.ec2.describe_instances(InstanceIds=[iid])["Reservations"] for i in r["Instances"]]
        return found

    def replaced(self, old: str) -> tuple[dict, dict]:
        """The replacement of ``old``: a new booted instance, then ``old`` terminated and the
        group's one instance the new one."""
        new, ran = self.one_booted(other_than=old)
        assert new["InstanceId"] != old
        wait_for(f"{old} to be terminated and out of the group", lambda: self.described(old)["State"]["Name"] ==
                 "terminated" and [i["InstanceId"] for i in self.group()["Instances"]] == [new["InstanceId"]])
        return new, ran

    def cleanup(self) -> None:
        for run_id in {self.run_id, f"{self.run_id}-b"}:
            groups.delete(self.ec2, self.asg, run_id)
            self.live(run_id)
        self.iam.remove_role_from_instance_profile(InstanceProfileName=self.profile, RoleName=self.profile)
        self.iam.delete_instance_profile(InstanceProfileName=self.profile)
        self.iam.delete_role(RoleName=self.profile)
        sweep.delete_run(self.ec2, self.run_id, self.tmp_path)


def finish(made: Run) -> None:
    """Remove the run's group and resources; then none of its instances is live, and none of
    their processes (sshd, user data, sessions) is left."""
    made.cleanup()
    assert wait_for("no live instance of the run", lambda: not made.live() and not made.live(f"{made.run_id}-b"), 30)
    assert processes_gone(made.seen), made.seen
    assert sandbox_settles(made.home)


@pytest.fixture
def run(sandbox_env, tmp_path, request, monkeypatch):
    home, state = sandbox_env
    made = Run(home, state, tmp_path, f"asg-{hashlib.sha1(request.node.name.encode()).hexdigest()[:8]}", monkeypatch)
    try:
        yield made
    finally:
        finish(made)


@pytest.fixture(scope="module")
def like_aws_home(tmp_path_factory):
    """A sandbox of its own in the AWS-like mode (likeaws.py), for the tests that need it."""
    home = tmp_path_factory.mktemp("asg-like-aws-home")
    state = control.up(home, like_aws=True)
    assert state["like_aws"]
    yield home, state
    control.down(home)


def assert_whole_instance(run: Run, inst: dict, ran: dict) -> None:
    """``inst`` (DescribeInstances) is everything a RunInstances-launched sandbox instance is."""
    iid = inst["InstanceId"]
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["ec2gpu:run"] == run.run_id and tags["ec2gpu:owner"] == "alice"  # the group's, propagated
    assert tags["aws:autoscaling:groupName"] == groups.name_of(run.run_id)
    assert tags["ec2gpu:max-runtime"] == "90"  # the template's own instance tags
    assert inst["KeyName"] == run.key_name and [g["GroupId"] for g in inst["SecurityGroups"]] == [run.sg]
    assert inst["InstanceLifecycle"] == "spot"  # the group's InstancesDistribution: all spot
    assert inst["InstanceType"] == "g4dn.xlarge"  # price-capacity-optimized: the cheaper of the overrides
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    assert inst["IamInstanceProfile"]["Arn"].endswith(f"/{run.profile}")
    assert inst["SubnetId"] in run.subnets
    behaviour = run.ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    # user data ran (once) on the instance, and found its role's credentials through IMDSv2
    assert ran["instance"] == iid and ran["imds_instance_id"] == iid, ran
    assert ran["method"] == "iam-role" and ran["key_id"].startswith("ASIA") and ran["s3"] is True, ran
    home = control.state_dir(run.home) / "instances" / iid / "home"
    assert (home / "boots").read_text() == f"{iid}\n"
    # its sshd takes the template's key pair, and it is the instance that ran the user data
    done = run.ssh(iid, 'cat "$HOME/user-data.json"')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ran


def test_a_group_instance_is_a_whole_instance_and_a_terminated_one_is_replaced(run):
    run.create()
    first, ran = run.one_booted()
    assert_whole_instance(run, first, ran)
    assert run.group()["Instances"][0]["LifecycleState"] == "InService"

    run.ec2.terminate_instances(InstanceIds=[first["InstanceId"]])
    second, ran = run.replaced(first["InstanceId"])
    assert_whole_instance(run, second, ran)

    # set Unhealthy (a detached run's node whose agent went silent: agent/gang.py): replaced too
    run.asg.set_instance_health(InstanceId=second["InstanceId"], HealthStatus="Unhealthy",
                                ShouldRespectGracePeriod=False)
    third, ran = run.replaced(second["InstanceId"])
    assert_whole_instance(run, third, ran)


def test_a_spot_interruption_and_a_shutdown_from_inside_are_replaced(run):
    run.create()
    first, _ = run.one_booted()
    control.interrupt(run.home, first["InstanceId"], 1.0)  # `ec2gpu sandbox interrupt` with a 1 s notice
    second, _ = run.replaced(first["InstanceId"])
    assert run.described(first["InstanceId"])["StateReason"]["Code"] == "Server.SpotInstanceTermination"
    assert second["InstanceLifecycle"] == "spot"

    # the job's OS powers off (guest.py): the template says terminate, and the group replaces it
    done = run.ssh(second["InstanceId"], "shutdown now")
    # as on EC2, the power-off may close the SSH session before the command's own exit comes back
    assert done.returncode == 0 or (done.returncode == 255 and "closed by remote host" in done.stderr), done.stderr
    third, ran = run.replaced(second["InstanceId"])
    assert run.described(second["InstanceId"])["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
    assert ran["instance"] == third["InstanceId"] and ran["method"] == "iam-role"


def test_capacity_zero_ends_every_instance_and_none_replaces_them(run):
    run.create(spot=False)
    first, _ = run.one_booted()
    assert "InstanceLifecycle" not in first  # an on-demand group: OnDemandPercentageAboveBaseCapacity 100
    assert first["InstanceType"] == "g5.xlarge"  # on-demand, prioritized: the overrides' first
    groups.end(run.asg, run.run_id)  # UpdateAutoScalingGroup(MinSize=0, MaxSize=0, DesiredCapacity=0)
    wait_for("the group's instance to end", lambda: not run.live())
    time.sleep(3)  # several health checks and replacement delays later: still nothing
    assert run.live() == []
    group = run.group()
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"], group["Instances"]) == (0, 0, 0, [])
    assert group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]  # kept by the update, as on AWS

    # back to 1: a new instance of the same policy; then SetDesiredCapacity 0 ends it too
    run.asg.update_auto_scaling_group(AutoScalingGroupName=groups.name_of(run.run_id), MaxSize=1, DesiredCapacity=1)
    again, _ = run.one_booted(other_than=first["InstanceId"])
    assert again["InstanceType"] == "g5.xlarge" and "InstanceLifecycle" not in again
    run.asg.set_desired_capacity(AutoScalingGroupName=groups.name_of(run.run_id), DesiredCapacity=0)
    wait_for("the group's instance to end", lambda: not run.live())
    time.sleep(3)
    assert run.live() == [] and run.group()["Instances"] == []

    # a group with an instance is deleted with ForceDelete only (groups.delete passes it), as on AWS
    run.asg.update_auto_scaling_group(AutoScalingGroupName=groups.name_of(run.run_id), DesiredCapacity=1)
    run.one_booted(other_than=again["InstanceId"])
    with pytest.raises(botocore.exceptions.ClientError, match="ResourceInUse"):
        run.asg.delete_auto_scaling_group(AutoScalingGroupName=groups.name_of(run.run_id))


def test_the_deadline_brings_the_group_to_zero_by_itself(run):
    other = f"{run.run_id}-b"
    run.create(deadline=datetime.now(timezone.utc) + timedelta(seconds=8))
    run.create(deadline=datetime.now(timezone.utc) + timedelta(hours=2), run_id=other)  # same action name
    first, _ = run.one_booted()
    kept, _ = run.one_booted(run_id=other)
    actions = run.asg.describe_scheduled_actions()["ScheduledUpdateGroupActions"]
    assert sorted(a["AutoScalingGroupName"] for a in actions if a["ScheduledActionName"] == groups.DEADLINE_ACTION) \
        == sorted([groups.name_of(run.run_id), groups.name_of(other)])  # one per group, none replaced
    with pytest.raises(botocore.exceptions.ClientError, match="Given start time is in the past"):
        run.asg.put_scheduled_update_group_action(**groups.deadline_request(
            run.run_id, datetime.now(timezone.utc) - timedelta(minutes=1)))

    wait_for("the deadline to end the group's instance", lambda: not run.live(), timeout_s=90)
    group = run.group()
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"], group["Instances"]) == (0, 0, 0, [])
    assert run.asg.describe_scheduled_actions(AutoScalingGroupName=groups.name_of(run.run_id))[
        "ScheduledUpdateGroupActions"] == []  # a one-time action is gone once it ran
    time.sleep(3)
    assert run.live() == []  # and nothing replaces it
    assert [i["InstanceId"] for i in run.live(other)] == [kept["InstanceId"]]  # the other run's is untouched
    assert run.described(first["InstanceId"])["State"]["Name"] == "terminated"


def test_a_rebalance_recommendation_gets_the_at_risk_instance_replaced_first(run, monkeypatch):
    made = groups.group_request  # a run's group has Capacity Rebalancing off: this one has it on, as AWS allows
    monkeypatch.setattr(groups, "group_request", lambda *a: {**made(*a), "CapacityRebalance": True})
    run.create()  # spot: CapacityRebalance on
    first, _ = run.one_booted()
    control.interrupt(run.home, first["InstanceId"], 0, rebalance=True)
    second, _ = run.replaced(first["InstanceId"])  # launched, in service, then the at-risk one terminated
    # the group ended it, before the spot service did, and the group is back at its size
    assert run.described(first["InstanceId"])["StateReason"]["Code"] != "Server.SpotInstanceTermination"
    assert run.group()["DesiredCapacity"] == 1


def test_a_rebalance_recommendation_alone_launches_nothing_in_a_runs_group(run):
    """A run's group (aws/groups.group_request: Capacity Rebalancing off) keeps its at-risk instance
    and launches no replacement: a recommendation is not an interruption (docs/detached.md)."""
    run.create()
    first, _ = run.one_booted()
    control.interrupt(run.home, first["InstanceId"], 0, rebalance=True)
    time.sleep(4)  # the sandbox's group checks every tick and replaces after 1 s
    assert [i["InstanceId"] for i in run.live()] == [first["InstanceId"]]
    assert [i["InstanceId"] for i in run.group()["Instances"]] == [first["InstanceId"]]


def test_like_aws_a_group_instance_is_pending_first(like_aws_home, tmp_path, monkeypatch):
    home, state = like_aws_home
    monkeypatch.setenv("EC2GPU_HOME", str(home))
    for k, v in control.env_vars(state).items():  # its endpoint and dummy credentials
        monkeypatch.setenv(k, v)
    made = Run(home, state, tmp_path, "asg-like-aws", monkeypatch)
    try:
        made.create()
        # the launch is in CreateAutoScalingGroup; EC2 keeps the instance pending 2 s, and the group says so
        assert [i["LifecycleState"] for i in made.group()["Instances"]] == ["Pending"]
        (pending,) = made.live()
        assert pending["State"]["Name"] == "pending" and made.booted(pending["InstanceId"]) is None
        running, ran = made.one_booted()
        assert running["InstanceId"] == pending["InstanceId"]
        assert [i["LifecycleState"] for i in made.group()["Instances"]] == ["InService"]
        assert_whole_instance(made, running, ran)
    finally:
        finish(made)


def test_like_aws_a_detached_run_starts_on_the_first_try_while_aws_does_not_see_its_new_profile(
        like_aws_home, tmp_path, monkeypatch, capsys):
    """--like-aws refuses the run's new instance profile for 20 s, as AWS refuses it for tens of
    seconds after CreateInstanceProfile (eksctl#8039): the hand-off waits for it, says so, and the
    run starts and succeeds on its first group, with nothing left after."""
    home, state = like_aws_home
    monkeypatch.setenv("EC2GPU_HOME", str(home))
    for k, v in control.env_vars(state).items():
        monkeypatch.setenv(k, v)
    task = _task(tmp_path, 'cat data.txt > "$EC2GPU_OUTPUT_DIR/result.txt"', setup=False)
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "30m", "--json"]) == 0
    out = capsys.readouterr()
    record = json.loads(out.out)
    said = " ".join(out.err.split())  # the console wraps its lines
    assert record["status"] == "detached", said
    assert "CreateAutoScalingGroup: ValidationError" in said and "Invalid IAM Instance Profile name" in said
    assert "AWS sees it now" in said
    done = _wait(record["run_id"], ("succeeded", "failed", "cancelled"), timeout_s=300)
    assert done["state"] == "succeeded" and done["exit_code"] == 0, f"{done.get('message')!r} {done}"
    left = _nothing_left(record["run_id"])
    assert not any(left.values()), left
