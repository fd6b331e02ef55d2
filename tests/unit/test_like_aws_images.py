"""The sandbox's AWS-like mode (sandbox/likeaws.py) reproduces what EC2 does to images and their
snapshots, and aws/baked.py copes: moto's own server, in this process on 127.0.0.1, behind the
like-aws middleware (no sandbox daemon, no instance)."""
import boto3
import botocore.exceptions
import pytest

from ec2gpu.aws import baked
from ec2gpu.errors import AwsError
from ec2gpu.sandbox import likeaws, server, sshd

REGION = "eu-north-1"  # a region no other test of this process uses: moto's state lives in the process


@pytest.fixture(scope="module")
def ec2():
    """A plain boto3 client (no retries of the tool's) of moto behind the middleware: every fresh
    image answers NotFound on first sight, a deregistered image's snapshot stays in use for 60 s."""
    behaviour = likeaws.Behaviour(not_found_p=1.0, throttle_p=0.0, fresh_s=60.0, snapshot_in_use_s=60.0)
    port = sshd.free_port("127.0.0.1")
    moto = server.moto_server("127.0.0.1", port, lambda app: likeaws.Middleware(app, behaviour))
    moto.start()
    try:
        yield boto3.client("ec2", region_name=REGION, endpoint_url=f"http://127.0.0.1:{port}",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
    finally:
        moto.stop()


def new_image(ec2, name: str) -> tuple[str, str]:
    """(AMI id, snapshot id) of a new image of a new instance."""
    iid = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    image_id = ec2.create_image(InstanceId=iid, Name=name)["ImageId"]
    return image_id, likeaws.moto_image_snapshots(image_id)[0]


def test_an_image_just_made_is_not_found_at_first_and_the_bake_waits_for_it(ec2):
    image_id, _ = new_image(ec2, "fresh-1")
    with pytest.raises(botocore.exceptions.ClientError, match="InvalidAMIID.NotFound"):
        ec2.describe_images(ImageIds=[image_id])
    image_id, _ = new_image(ec2, "fresh-2")  # the same again, through the bake's waiter
    assert baked.wait_available(ec2, image_id, timeout_s=5, delay_s=0.01)["State"] == "available"


def test_a_snapshot_deleted_right_after_its_image_is_in_use_and_the_retry_is_bounded(ec2):
    image_id, snap = new_image(ec2, "race-1")
    ec2.deregister_image(ImageId=image_id)  # without DeleteAssociatedSnapshots: the race EC2 has
    with pytest.raises(botocore.exceptions.ClientError, match="InvalidSnapshot.InUse"):
        ec2.delete_snapshot(SnapshotId=snap)
    with pytest.raises(AwsError, match=f"snapshot {snap} is still in use"):
        baked.delete_snapshots(ec2, [snap], retry_s=0.05, max_wait_s=0.01)
    other_image, other = new_image(ec2, "race-2")
    ec2.deregister_image(ImageId=other_image, DeleteAssociatedSnapshots=True)  # EC2 deletes them itself: no race
    assert baked.delete_snapshots(ec2, [other], retry_s=0.05, max_wait_s=0.01) == [other]
