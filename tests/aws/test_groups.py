"""Auto Scaling groups for detached runs (aws/groups.py): the requests (pure), and the group, its
launch template and its deadline against the sandbox's moto server."""
import base64
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import botocore.exceptions
import pytest

from ec2gpu.aws import capacity, groups, instances, sweep
from ec2gpu.aws.instances import IdleRule

RUN_ID = "run-asg"


def _spec(**kw):
    base = instances.LaunchSpec(run_id="r1", owner="alice", name="job", instance_type="g4dn.xlarge", image_id="ami-1",
                                root_device_name="/dev/sda1", key_name="k", security_group_id="sg-1",
                                max_runtime_minutes=90, instance_profile="ec2gpu-r1")
    return replace(base, **kw)


def test_the_template_is_the_run_request_less_what_the_group_decides():
    req = groups.template_request(_spec(spot=True, subnet_id="subnet-1", idle=IdleRule("stop", 600)))
    data = req["LaunchTemplateData"]
    assert req["LaunchTemplateName"] == "ec2gpu-r1"
    assert not {"MinCount", "MaxCount", "SubnetId", "Placement", "InstanceMarketOptions"} & set(data)
    assert data["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 only, as every instance
    assert data["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    assert data["IamInstanceProfile"] == {"Name": "ec2gpu-r1"}
    # base64 here: botocore encodes UserData for RunInstances only
    assert base64.b64decode(data["UserData"]).decode().startswith("#!/bin/bash")
    # an instance of a group that shuts itself down ends; a stopped one would only be replaced
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert {ts["ResourceType"] for ts in data["TagSpecifications"]} == {"instance", "volume"}
    tags = {t["Key"]: t["Value"] for t in req["TagSpecifications"][0]["Tags"]}
    assert req["TagSpecifications"][0]["ResourceType"] == "launch-template" and tags["ec2gpu:run"] == "r1"


def test_a_spot_group_spreads_over_the_types_price_capacity_optimized_with_rebalancing():
    req = groups.group_request(_spec(spot=True, max_price=0.3), ["g5.xlarge", "g6.xlarge"], ["subnet-a", "subnet-b"], 2)
    dist = req["MixedInstancesPolicy"]["InstancesDistribution"]
    assert (req["MinSize"], req["MaxSize"], req["DesiredCapacity"]) == (0, 2, 2)
    assert req["VPCZoneIdentifier"] == "subnet-a,subnet-b" and req["CapacityRebalance"] is True
    assert dist["OnDemandPercentageAboveBaseCapacity"] == 0 and dist["OnDemandBaseCapacity"] == 0
    assert dist["SpotAllocationStrategy"] == "price-capacity-optimized" and dist["SpotMaxPrice"] == "0.3000"
    lt = req["MixedInstancesPolicy"]["LaunchTemplate"]
    assert lt["Overrides"] == [{"InstanceType": "g5.xlarge"}, {"InstanceType": "g6.xlarge"}]
    assert lt["LaunchTemplateSpecification"] == {"LaunchTemplateName": "ec2gpu-r1", "Version": "$Latest"}
    assert all(t["PropagateAtLaunch"] for t in req["Tags"]) and {t["Key"] for t in req["Tags"]} >= {"ec2gpu:run", "Name"}


def test_an_on_demand_group_takes_the_types_in_order_and_no_spot():
    req = groups.group_request(_spec(), ["g5.xlarge"], ["subnet-a"], 1)
    dist = req["MixedInstancesPolicy"]["InstancesDistribution"]
    assert dist["OnDemandPercentageAboveBaseCapacity"] == 100 and dist["OnDemandAllocationStrategy"] == "prioritized"
    assert "SpotAllocationStrategy" not in dist and req["CapacityRebalance"] is False
    with pytest.raises(ValueError):
        groups.group_request(_spec(), ["g5.xlarge"], [], 1)


def test_the_deadline_sets_the_group_to_zero_at_that_time():
    at = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
    assert groups.deadline_request("r1", at) == {
        "AutoScalingGroupName": "ec2gpu-r1", "ScheduledActionName": "ec2gpu-deadline", "StartTime": at,
        "MinSize": 0, "MaxSize": 0, "DesiredCapacity": 0}


def test_a_group_runs_its_size_ends_at_zero_and_is_removed_with_its_template(aws, spec):
    asg = aws.client("autoscaling")
    subnets = list(capacity.default_subnets(aws.ec2).values())[:2]
    deadline = datetime.now(timezone.utc) + timedelta(hours=2)
    name = groups.create(aws.ec2, asg, spec, ["g4dn.xlarge", "g5.xlarge"], subnets, 2, deadline)
    try:
        (group,) = groups.find_groups(asg, RUN_ID)
        assert group["AutoScalingGroupName"] == name and group["DesiredCapacity"] == 2
        assert [t["LaunchTemplateName"] for t in groups.find_templates(aws.ec2, RUN_ID)] == [name]
        (action,) = asg.describe_scheduled_actions(AutoScalingGroupName=name)["ScheduledUpdateGroupActions"]
        assert (action["ScheduledActionName"], action["DesiredCapacity"], action["MaxSize"]) == (
            "ec2gpu-deadline", 0, 0)
        running = sweep.find_instances(aws.ec2, RUN_ID, states=["pending", "running"])
        assert len(running) == 2 and all(i.tags.get("ec2gpu:run") == RUN_ID for i in running)  # tags propagated
        groups.end(asg, RUN_ID)
        assert sweep.find_instances(aws.ec2, RUN_ID, states=["pending", "running"]) == []
    finally:
        removed = groups.delete(aws.ec2, asg, RUN_ID)
    assert removed == [f"group {name}", f"launch template {name}"]
    assert groups.find_groups(asg, RUN_ID) == [] and groups.find_templates(aws.ec2, RUN_ID) == []
    assert groups.delete(aws.ec2, asg, RUN_ID) == []  # nothing left: nothing to do, no error


def test_a_group_aws_refuses_leaves_no_launch_template(aws, spec):
    asg = aws.client("autoscaling")
    with pytest.raises(botocore.exceptions.ClientError):
        groups.create(aws.ec2, asg, spec, ["g4dn.xlarge"], ["subnet-doesnotexist"], 1, None)
    assert groups.find_templates(aws.ec2, RUN_ID) == [] and groups.find_groups(asg, RUN_ID) == []
