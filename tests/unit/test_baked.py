"""aws/baked.py's pure parts: the tags of a baked image, its snapshots, their stored size and cost."""
import pytest

from ec2gpu.aws import baked


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
    from ec2gpu.runs import bake, engine, ledger
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
