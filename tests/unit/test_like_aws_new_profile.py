"""The sandbox's AWS-like mode (sandbox/likeaws.py) refuses what AWS refuses right after
CreateInstanceProfile and CreateSecurityGroup, in AWS's words, and aws/consistency.when_visible
rides it out: moto's own server, in this process on 127.0.0.1, behind the like-aws middleware (no
sandbox daemon, no instance)."""
import time

import boto3
import botocore.exceptions
import pytest

from ec2gpu.aws import consistency
from ec2gpu.sandbox import likeaws, server, sshd

REGION = "eu-south-2"  # a region no other test of this process uses: moto's state lives in the process
IMAGE = "ami-12c6146b"  # one of moto's own images


@pytest.fixture(scope="module")
def clients():
    """Plain boto3 clients (no retries of the tool's) of moto behind the middleware: a new profile
    unseen for 3 s, a new security group for 1 s, no other fault."""
    behaviour = likeaws.Behaviour(not_found_p=0.0, throttle_p=0.0, profile_unseen_s=3.0, group_unseen_s=1.0)
    port = sshd.free_port("127.0.0.1")
    moto = server.moto_server("127.0.0.1", port, lambda app: likeaws.Middleware(app, behaviour))
    moto.start()
    kw = {"region_name": REGION, "endpoint_url": f"http://127.0.0.1:{port}", "aws_access_key_id": "testing",
          "aws_secret_access_key": "testing"}
    try:
        made = {name: boto3.client(name, **kw) for name in ("ec2", "iam", "autoscaling")}
        # moto loads each service's backend on its first request (seconds): not inside a test's window
        made["iam"].list_instance_profiles(), made["ec2"].describe_launch_templates()
        made["autoscaling"].describe_auto_scaling_groups()
        yield made
    finally:
        moto.stop()


def _template(ec2, name: str, profile: str | None, group: str | None) -> None:
    data = {"ImageId": IMAGE, "InstanceType": "g4dn.xlarge"}
    if profile:
        data["IamInstanceProfile"] = {"Name": profile}
    if group:
        data["SecurityGroupIds"] = [group]
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=data)


def _group(asg, name: str) -> dict:
    return {"AutoScalingGroupName": name, "MinSize": 0, "MaxSize": 1, "DesiredCapacity": 0,
            "AvailabilityZones": [f"{REGION}a"],
            "MixedInstancesPolicy": {"LaunchTemplate": {"LaunchTemplateSpecification": {
                "LaunchTemplateName": name, "Version": "$Latest"}}}}


def test_a_new_instance_profile_is_refused_in_aws_words_until_seen_and_the_group_waits_for_it(clients):
    ec2, iam, asg = clients["ec2"], clients["iam"], clients["autoscaling"]
    iam.create_instance_profile(InstanceProfileName="ec2gpu-r1")
    made_at = time.time()
    _template(ec2, "ec2gpu-r1", "ec2gpu-r1", None)  # EC2 takes the template: the profile is checked at use
    with pytest.raises(botocore.exceptions.ClientError) as err:
        asg.create_auto_scaling_group(**_group(asg, "ec2gpu-r1"))
    assert err.value.response["Error"] == {
        "Type": "Sender", "Code": "ValidationError",
        "Message": "You must use a valid fully-formed launch template. Value (ec2gpu-r1) for parameter "
                   "iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"}
    with pytest.raises(botocore.exceptions.ClientError) as err:
        ec2.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1, IamInstanceProfile={"Name": "ec2gpu-r1"})
    assert (err.value.response["Error"]["Code"], err.value.response["Error"]["Message"]) == (
        "InvalidParameterValue",
        "Value (ec2gpu-r1) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name")
    said = []
    consistency.when_visible(lambda: asg.create_auto_scaling_group(**_group(asg, "ec2gpu-r1")), made_at, said.append)
    assert [g["AutoScalingGroupName"] for g in asg.describe_auto_scaling_groups(
        AutoScalingGroupNames=["ec2gpu-r1"])["AutoScalingGroups"]] == ["ec2gpu-r1"]
    assert "ValidationError" in said[0] and said[-1].startswith("AWS sees it now")
    ec2.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1, IamInstanceProfile={"Name": "ec2gpu-r1"})  # seen now


def test_a_new_security_group_is_refused_for_a_moment_and_an_old_one_never(clients):
    ec2, asg = clients["ec2"], clients["autoscaling"]
    fresh = ec2.create_security_group(GroupName="fresh", Description="new")["GroupId"]
    _template(ec2, "ec2gpu-r2", None, fresh)
    with pytest.raises(botocore.exceptions.ClientError) as err:
        asg.create_auto_scaling_group(**_group(asg, "ec2gpu-r2"))
    assert err.value.response["Error"]["Code"] == "ValidationError" and fresh in err.value.response["Error"]["Message"]
    with pytest.raises(botocore.exceptions.ClientError, match="InvalidGroup.NotFound"):
        ec2.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1, SecurityGroupIds=[fresh])
    time.sleep(1.0)
    asg.create_auto_scaling_group(**_group(asg, "ec2gpu-r2"))
    ec2.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1, SecurityGroupIds=[fresh])
    _template(ec2, "ec2gpu-r3", None, None)  # names nothing new: never refused
    asg.create_auto_scaling_group(**_group(asg, "ec2gpu-r3"))
