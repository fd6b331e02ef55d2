"""Baked images, pure: aws/baked.py (the tags of a baked image, its snapshots, their stored size and cost)
and runs/provision/bake.py (a bake's estimate, its builder's --max-runtime)."""
import pytest

from ec2gpu.aws import baked
from ec2gpu.aws.instances import Instance
from ec2gpu.runs.provision import bake


def test_an_image_is_tagged_incomplete_with_its_key_base_and_versions_and_none_is_left_out():
    tags = {t["Key"]: t["Value"] for t in baked.image_tags(
        "r1", "me", "proj-1", "ab" * 32, "proj", "dlami", "ami-1",
        {"torch_version": "2.9.0", "cuda_version": "12.8", "driver_version": None})}
    assert tags[baked.BAKE] == "incomplete" and tags[baked.SETUP_HASH] == "ab" * 32
    assert tags["ec2gpu:run"] == "r1" and tags["Name"] == "proj-1" and tags[baked.IMAGE] == "proj-1"
    assert tags["ec2gpu:torch"] == "2.9.0" and tags["ec2gpu:cuda"] == "12.8" and "ec2gpu:driver" not in tags
    assert tags[baked.BASE] == "dlami" and tags[baked.BASE_IMAGE] == "ami-1"


def test_snapshots_come_from_the_block_devices_and_their_stored_bytes_count_before_the_volume_size():
    image = {"BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"SnapshotId": "snap-1"}},
                                     {"DeviceName": "/dev/sdb", "VirtualName": "ephemeral0"}]}
    assert baked.snapshot_ids(image) == ["snap-1"]
    assert baked.stored_gib({"FullSnapshotSizeInBytes": 32 * 2**30, "VolumeSize": 100}) == (32.0, "stored bytes")
    assert baked.stored_gib({"VolumeSize": 100}) == (100.0, "volume size (upper bound)")
    assert 32 * baked.SNAPSHOT_USD_PER_GB_MONTH == pytest.approx(1.6)


def test_a_bakes_estimate_counts_its_own_phases_once(tmp_path):
    """The estimate adds boot, setup and teardown itself: a past bake contributes only the rest."""
    from ec2gpu.runs.provision import bake
    from ec2gpu.runs.execute import engine
    from ec2gpu.runs.settle import ledger
    phases = {"requesting": 1.0, "waiting for running": 30.0, "waiting for SSH": 20.0, "driver": 100.0, "setup": 50.0,
              "upload": 2.0, "cleaning": 3.0, "imaging": 1.0, "waiting for image": 236.0, "terminating": 40.0}
    assert bake.bake_seconds(phases) == 340.0
    ledger.record(tmp_path, {"run_id": "b1", "command": "ec2gpu image bake", "backend": "aws", "status": "completed",
                             "task": "bake", "instance_type": "g4dn.xlarge", "phases": phases,
                             "started_at": "2026-11-22T20:00:00+00:00"})
    plan = bake.plan(engine.builtin_job("mnist", []), "dlami", None, tmp_path, "aws", "g4dn.xlarge", False)
    assert plan.minutes == pytest.approx(340.0 / 60) and "1 past bake" in plan.minutes_source
    fresh = bake.plan(engine.builtin_job("mnist", []), "ubuntu-24.04", None, tmp_path, "aws", "g5.xlarge", False)
    assert fresh.minutes == bake.ASSUMED_MINUTES["ubuntu-24.04"] and fresh.minutes_source.startswith("assumed")


# --- against botocore's Stubber: what is sent to EC2 and how its answers are read ---------------------

import subprocess  # noqa: E402
from datetime import datetime, timedelta, timezone  # noqa: E402

import boto3  # noqa: E402
import botocore.exceptions  # noqa: E402
from botocore.stub import Stubber  # noqa: E402

from ec2gpu.errors import AwsError, UsageError, WaitTimeout  # noqa: E402


def ec2_client():
    return boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def test_a_task_files_stem_becomes_an_ami_name_createimage_accepts(tmp_path):
    """`train+v2.yaml` has no name: its stem names the image, and CreateImage refuses '+'
    (InvalidAMIName.Malformed); a long one is cut to 128 characters."""
    from ec2gpu.runs.provision import bake
    from ec2gpu.runs.execute import engine
    from ec2gpu.tasks.load import load
    task = tmp_path / "train+v2.yaml"
    task.write_text("run: python3 train.py\n")
    job = engine.TaskJob(load(task), {}, None)
    assert job.name == "train+v2"
    name = bake.plan(job, "dlami", None, tmp_path, "aws", "g4dn.xlarge", False).name
    assert name.startswith("train-v2-") and baked.check_ami_name(name) and not baked.check_ami_name("train+v2-1")
    when = datetime(2026, 11, 22, 18, 49, 50)
    assert baked.ami_name("train+v2", when) == "train-v2-20261122-184950"
    assert len(baked.ami_name("x" * 300, when)) == 128 and baked.ami_name("+++", when) == "task-20261122-184950"
    assert baked.check_ami_name("a (b) [c] d./e'f@g_h-i") and not baked.check_ami_name("ab")


def test_an_image_not_visible_yet_is_waited_for_and_a_real_error_is_named():
    """InvalidAMIID.NotFound right after CreateImage is eventual consistency, not a failure; any other
    error of DescribeImages is reported as EC2 said it, never as a timeout with state None."""
    ec2 = ec2_client()
    image = {"ImageId": "ami-1", "State": "available"}
    with Stubber(ec2) as stub:
        stub.add_client_error("describe_images", "InvalidAMIID.NotFound", "The image id '[ami-1]' does not exist")
        stub.add_response("describe_images", {"Images": [{"ImageId": "ami-1", "State": "pending"}]})
        stub.add_response("describe_images", {"Images": [image]})
        stub.add_response("describe_images", {"Images": [image]})  # the description returned
        assert baked.wait_available(ec2, "ami-1", timeout_s=1, delay_s=0.001)["ImageId"] == "ami-1"
        stub.add_client_error("describe_images", "UnauthorizedOperation", "You are not authorized")
        with pytest.raises(AwsError, match="UnauthorizedOperation: You are not authorized"):
            baked.wait_available(ec2, "ami-1", timeout_s=1, delay_s=0.001)
        for _ in range(3):
            stub.add_client_error("describe_images", "InvalidAMIID.NotFound")
        with pytest.raises(WaitTimeout, match="state not visible yet"):
            baked.wait_available(ec2, "ami-1", timeout_s=0.003, delay_s=0.001)


def test_an_image_is_deregistered_with_its_snapshots_and_the_runs_others_deleted_after():
    ec2 = ec2_client()
    image = {"ImageId": "ami-1", "Tags": [{"Key": "ec2gpu:run", "Value": "r1"}],
             "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"SnapshotId": "snap-1"}}]}
    said = []
    with Stubber(ec2) as stub:
        stub.add_response("deregister_image", {"Return": True, "DeleteSnapshotResults": [
            {"SnapshotId": "snap-1", "ReturnCode": "success"}]}, {"ImageId": "ami-1", "DeleteAssociatedSnapshots": True})
        stub.add_response("describe_snapshots", {"Snapshots": [{"SnapshotId": "snap-2"}]})  # the run's others
        stub.add_response("delete_snapshot", {}, {"SnapshotId": "snap-2"})
        assert baked.delete(ec2, image, said.append) == ["snap-1", "snap-2"]
        stub.assert_no_pending_responses()
    assert said == ["deregistered ami-1", "deleted snapshot snap-1 with ami-1", "deleted snapshot snap-2"]


class InUseEc2:
    """An EC2 client whose DeleteSnapshot answers InvalidSnapshot.InUse ``times`` times, and whose
    DescribeImages lists ``images`` (the tool's)."""

    def __init__(self, times: int, images=()):
        self.times, self.images, self.deletes = times, list(images), 0

    def delete_snapshot(self, SnapshotId):
        self.deletes += 1
        if self.deletes <= self.times:
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "InvalidSnapshot.InUse", "Message": f"{SnapshotId} is in use by ami-1"}},
                "DeleteSnapshot")

    def get_paginator(self, name):
        assert name == "describe_images"
        return self

    def paginate(self, **_):
        return [{"Images": self.images}]


def test_a_snapshot_still_in_use_just_after_its_image_went_is_retried_and_then_named():
    """The deregistration race is retried (no image lists the snapshot any more), within a bound;
    a snapshot an image still uses is named at once, never waited for."""
    racing = InUseEc2(times=2)
    assert baked.delete_snapshots(racing, ["snap-1"], retry_s=5, max_wait_s=0.001) == ["snap-1"]
    assert racing.deletes == 3
    with pytest.raises(AwsError) as err:  # bounded: it ends, and says what is left and who removes it
        baked.delete_snapshots(InUseEc2(times=10**6), ["snap-1"], retry_s=0.02, max_wait_s=0.001)
    assert "snapshot snap-1 is still in use" in err.value.message and "ec2gpu cleanup" in err.value.hint
    held = InUseEc2(times=10**6, images=[{"ImageId": "ami-9", "Tags": [{"Key": baked.BAKE, "Value": "complete"}],
                                          "BlockDeviceMappings": [{"Ebs": {"SnapshotId": "snap-1"}}]}])
    with pytest.raises(AwsError, match="snapshot snap-1 is used by image ami-9"):
        baked.delete_snapshots(held, ["snap-1"], retry_s=60, max_wait_s=0.001)
    assert held.deletes == 1


def test_cleanup_finds_a_bake_snapshot_whose_image_is_gone_whatever_its_tag_says():
    """`image rm` stopped between DeregisterImage and DeleteSnapshot leaves a snapshot tagged
    complete: nothing holds it, so it is found; a complete image's own snapshot never is."""
    ec2 = ec2_client()
    tagged = lambda sid, state: {"SnapshotId": sid, "Tags": [{"Key": baked.IMAGE, "Value": "x"},  # noqa: E731
                                                              {"Key": baked.BAKE, "Value": state}]}
    with Stubber(ec2) as stub:
        stub.add_response("describe_images", {"Images": [
            {"ImageId": "ami-kept", "Tags": [{"Key": baked.BAKE, "Value": "complete"}],
             "BlockDeviceMappings": [{"Ebs": {"SnapshotId": "snap-held"}}]},
            {"ImageId": "ami-half", "Tags": [{"Key": baked.BAKE, "Value": "incomplete"}],  # goes with its image
             "BlockDeviceMappings": [{"Ebs": {"SnapshotId": "snap-half"}}]}]})
        stub.add_response("describe_snapshots", {"Snapshots": [
            tagged("snap-held", "complete"), tagged("snap-orphan", "complete"), tagged("snap-cut", "incomplete"),
            tagged("snap-half", "incomplete")]})
        assert [s["SnapshotId"] for s in baked.incomplete_snapshots(ec2)] == ["snap-orphan", "snap-cut"]


def test_every_describe_that_pages_is_read_to_its_last_page():
    """EC2 pages DescribeImages, DescribeSecurityGroups and DescribeSpotInstanceRequests (NextToken):
    what sits on a second page is found too."""
    from ec2gpu.aws import images, sweep
    ec2 = ec2_client()
    mine = lambda i: {"ImageId": f"ami-{i}", "Tags": [{"Key": baked.BAKE, "Value": "complete"}]}  # noqa: E731
    with Stubber(ec2) as stub:
        stub.add_response("describe_images", {"Images": [mine(1)], "NextToken": "t"})
        stub.add_response("describe_images", {"Images": [mine(2)]})
        assert {i["ImageId"] for i in baked.images(ec2)} == {"ami-1", "ami-2"}
        stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": "sg-1"}], "NextToken": "t"})
        stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": "sg-2"}]})
        assert [g["GroupId"] for g in sweep.find_security_groups(ec2)] == ["sg-1", "sg-2"]
        stub.add_response("describe_spot_instance_requests", {"SpotInstanceRequests": [
            {"SpotInstanceRequestId": "sir-1"}], "NextToken": "t"})
        stub.add_response("describe_spot_instance_requests",
                          {"SpotInstanceRequests": [{"SpotInstanceRequestId": "sir-2"}]})
        assert [r["SpotInstanceRequestId"] for r in sweep.find_spot_requests(ec2)] == ["sir-1", "sir-2"]
        stub.add_response("describe_images", {"Images": [{"ImageId": "ami-old", "CreationDate": "2026-01-01"}],
                                              "NextToken": "t"})
        stub.add_response("describe_images", {"Images": [{"ImageId": "ami-new", "CreationDate": "2026-11-01"}]})
        assert [i["ImageId"] for i in images.described(ec2, Owners=["amazon"])] == ["ami-old", "ami-new"]
        stub.assert_no_pending_responses()


# --- the builder's --max-runtime across its driver reboot (runs/provision/bake.py) -------------------------------

def test_the_max_runtime_deadline_is_launch_plus_minutes_and_the_time_left_is_rounded_down():
    from ec2gpu.runs.provision import bake
    launched = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
    builder = Instance("i-1", "g4dn.xlarge", "running", launched)
    end = bake.max_runtime_deadline(builder, 120)
    assert end == launched + timedelta(minutes=120) and bake.max_runtime_deadline(builder, None) is None
    assert bake.minutes_left(end, launched + timedelta(minutes=7, seconds=30)) == 112  # never later than the deadline
    assert bake.minutes_left(end, end + timedelta(seconds=5)) == 0


@pytest.mark.parametrize("on_builder", [True, False])
def test_the_per_boot_script_arms_the_time_left_on_its_builder_only(tmp_path, on_builder):
    """cloud-init runs it at every boot: on the builder it schedules the shutdown for the minutes left;
    on any other instance (an image's, should one hold it) it does nothing."""
    from ec2gpu.runs.provision import bake
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "shutdown").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/called\n')
    (tmp_path / "bin" / "shutdown").chmod(0o755)
    (tmp_path / "instance-id").write_text("i-builder\n" if on_builder else "i-other\n")
    end = datetime.now(timezone.utc) + timedelta(minutes=42, seconds=30)
    script = tmp_path / "per-boot.sh"
    script.write_text(bake.per_boot_script("i-builder", end, id_file=str(tmp_path / "instance-id")))
    done = subprocess.run(["sh", str(script)], env={"PATH": f"{tmp_path}/bin:/usr/bin:/bin"}, timeout=10)
    assert done.returncode == 0
    if on_builder:
        assert (tmp_path / "called").read_text().split()[:2] in (["-h", "+42"], ["-h", "+41"])
    else:
        assert not (tmp_path / "called").exists()


def test_the_builders_max_runtime_defaults_to_120_minutes_and_is_at_least_10():
    assert bake.builder_max_runtime(None) == bake.MAX_RUNTIME_MINUTES == 120
    assert bake.builder_max_runtime(10) == 10 and bake.builder_max_runtime(600) == 600
    with pytest.raises(UsageError, match="at least 10 minutes"):
        bake.builder_max_runtime(9)
