"""Auto Scaling groups for detached runs (aws/groups.py): the requests (pure), and the group, its
launch template and its deadline against the sandbox's moto server."""
import base64
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import botocore.exceptions
import pytest
from botocore.awsrequest import AWSResponse

from ec2gpu.aws import capacity, groups, instances, sweep
from ec2gpu.aws.instances import IdleRule
from ec2gpu.errors import CapacityError

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


def test_a_spot_group_spreads_over_the_types_price_capacity_optimized_without_capacity_rebalancing():
    req = groups.group_request(_spec(spot=True, max_price=0.3), ["g5.xlarge", "g6.xlarge"], ["subnet-a", "subnet-b"], 2)
    dist = req["MixedInstancesPolicy"]["InstancesDistribution"]
    assert (req["MinSize"], req["MaxSize"], req["DesiredCapacity"]) == (0, 2, 2)
    # a rebalance recommendation alone must not end a healthy instance (docs/detached.md): off on spot too
    assert req["VPCZoneIdentifier"] == "subnet-a,subnet-b" and req["CapacityRebalance"] is False
    assert "PlacementGroup" not in req
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


def test_several_nodes_go_to_one_subnet_in_their_cluster_placement_group():
    req = groups.group_request(_spec(spot=True, placement_group="ec2gpu-r1"), ["p4d.24xlarge"], ["subnet-a"], 2)
    assert req["PlacementGroup"] == "ec2gpu-r1" and req["VPCZoneIdentifier"] == "subnet-a"
    with pytest.raises(ValueError, match="one zone"):  # AWS refuses a cluster placement group over zones
        groups.group_request(_spec(placement_group="ec2gpu-r1"), ["p4d.24xlarge"], ["subnet-a", "subnet-b"], 2)


def test_az_rebalance_is_suspended_for_the_runs_group():
    assert groups.suspend_request("r1") == {"AutoScalingGroupName": "ec2gpu-r1", "ScalingProcesses": ["AZRebalance"]}


def test_a_zone_that_offers_none_of_the_types_is_never_given():
    offered = {"p4d.24xlarge": ["us-east-1b", "us-east-1c"], "p5.48xlarge": ["us-east-1a", "us-east-1c"]}
    subnets = {"us-east-1a": "subnet-a", "us-east-1b": "subnet-b", "us-east-1c": "subnet-c", "us-east-1e": "subnet-e"}
    choices = groups.zone_choices(offered, subnets, ["p4d.24xlarge", "p5.48xlarge"])
    # zones that offer the first type first (both types before one), then by name; 1e offers neither
    assert choices == [("us-east-1c", "subnet-c", ["p4d.24xlarge", "p5.48xlarge"]),
                       ("us-east-1b", "subnet-b", ["p4d.24xlarge"]),
                       ("us-east-1a", "subnet-a", ["p5.48xlarge"])]
    assert groups.zone_choices({"p4d.24xlarge": ["us-east-1d"]}, subnets, ["p4d.24xlarge"]) == []


def test_the_zones_of_the_sandbox_region_leave_out_the_one_without_gpus(aws):
    """moto's us-east-1e, as AWS's, offers none of the GPU types: its default subnet is never given."""
    choices = groups.zones(aws.ec2, ["g4dn.xlarge"])
    zones = [z for z, _, _ in choices]
    assert "us-east-1e" not in zones and zones == sorted(zones) and len(zones) >= 2
    assert "us-east-1e" in capacity.default_subnets(aws.ec2)
    with pytest.raises(CapacityError):
        groups.zones(aws.ec2, ["x9.none"])


def test_a_launch_is_found_from_the_groups_instances_or_its_failed_activities():
    assert groups.launch_outcome({"Instances": [{"InstanceId": "i-1"}]}, [{"StatusCode": "Failed"}]) == "launched"
    assert groups.launch_outcome({"Instances": []}, [{"StatusCode": "Successful"}, {"StatusCode": "Failed"}]) == "failed"
    assert groups.launch_outcome({"Instances": []}, [{"StatusCode": "InProgress"}]) is None


class Activities:
    """An Auto Scaling client whose group launches nothing in the zones ``refusing`` (a Failed
    activity each time it is asked) and one instance elsewhere."""

    def __init__(self, refusing, zone_of):
        self.refusing, self.zone_of, self.subnet, self.updates, self.n = refusing, zone_of, "subnet-a", [], 0

    def update_auto_scaling_group(self, **kw):
        self.updates.append(kw)
        self.subnet = kw["VPCZoneIdentifier"]

    def describe_auto_scaling_groups(self, **kw):
        here = self.zone_of[self.subnet] not in self.refusing
        return {"AutoScalingGroups": [{"Instances": [{"InstanceId": "i-1"}] if here else []}]}

    def describe_scaling_activities(self, **kw):
        self.n += 1
        return {"Activities": [{"ActivityId": f"a{self.n}", "StatusCode": "Failed",
                                "StatusMessage": "no capacity\x1b[2J here"}]}


def test_find_zone_moves_the_group_to_the_next_zone_when_its_launch_fails():
    client = Activities({"us-east-1a"}, {"subnet-a": "us-east-1a", "subnet-b": "us-east-1b"})
    said = []
    choices = [("us-east-1a", "subnet-a", ["g5.xlarge"]), ("us-east-1b", "subnet-b", ["g5.xlarge"])]
    assert groups.find_zone(client, _spec(spot=True), choices, log=said.append, sleep=lambda s: None) == "us-east-1b"
    (moved,) = client.updates
    assert moved["VPCZoneIdentifier"] == "subnet-b" and moved["AutoScalingGroupName"] == "ec2gpu-r1"
    assert moved["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"] == [{"InstanceType": "g5.xlarge"}]
    assert said[0].startswith("no launch in us-east-1a: no capacity\\x1b[2J")  # AWS's reason, inert


def test_find_zone_names_each_zone_and_why_when_none_launched():
    client = Activities({"us-east-1a", "us-east-1b"}, {"subnet-a": "us-east-1a", "subnet-b": "us-east-1b"})
    choices = [("us-east-1a", "subnet-a", ["g5.xlarge"]), ("us-east-1b", "subnet-b", ["g5.xlarge"])]
    with pytest.raises(CapacityError, match="us-east-1a: no capacity.*us-east-1b: no capacity"):
        groups.find_zone(client, _spec(), choices, sleep=lambda s: None)


def test_find_zone_gives_a_zone_that_launched_nothing_in_time_way_to_the_next():
    client = Activities({"us-east-1a"}, {"subnet-a": "us-east-1a", "subnet-b": "us-east-1b"})
    client.describe_scaling_activities = lambda **kw: {"Activities": [{"ActivityId": "x", "StatusCode": "InProgress"}]}
    clock = iter(range(0, 10_000, 50))
    choices = [("us-east-1a", "subnet-a", ["g5.xlarge"]), ("us-east-1b", "subnet-b", ["g5.xlarge"])]
    assert groups.find_zone(client, _spec(), choices, sleep=lambda s: None, wait_s=120,
                            clock=lambda: float(next(clock))) == "us-east-1b"


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


def test_a_deadline_already_past_when_the_group_is_made_is_scheduled_a_minute_ahead(aws, spec):
    """A short limit spent on the requests before the group: Auto Scaling refuses a scheduled action
    in the past (the sandbox does too), so the group's end is scheduled SCHEDULE_LEAD_S from now,
    and the run is not torn down for it (the agent stops the job at its own limit_at)."""
    asg = aws.client("autoscaling")
    subnets = list(capacity.default_subnets(aws.ec2).values())[:1]
    before = datetime.now(timezone.utc)
    name = groups.create(aws.ec2, asg, spec, ["g4dn.xlarge"], subnets, 1, before - timedelta(seconds=30))
    try:
        (action,) = asg.describe_scheduled_actions(AutoScalingGroupName=name)["ScheduledUpdateGroupActions"]
        assert action["StartTime"] >= before + timedelta(seconds=groups.SCHEDULE_LEAD_S - 1)
    finally:
        groups.delete(aws.ec2, asg, RUN_ID)


def test_a_group_aws_refuses_leaves_no_launch_template(aws, spec):
    asg = aws.client("autoscaling")
    with pytest.raises(botocore.exceptions.ClientError):
        groups.create(aws.ec2, asg, spec, ["g4dn.xlarge"], ["subnet-doesnotexist"], 1, None)
    assert groups.find_templates(aws.ec2, RUN_ID) == [] and groups.find_groups(asg, RUN_ID) == []


def test_a_group_refused_while_auto_scaling_does_not_see_the_new_profile_is_made_once_it_does(aws, spec):
    """CreateAutoScalingGroup answers ValidationError for tens of seconds after CreateInstanceProfile
    (eksctl#8039; aws/consistency.py): the group is asked for again, and the run is told it waits."""
    asg, left, said = aws.client("autoscaling"), {"n": 2}, []
    message = ("You must use a valid fully-formed launch template. Value (ec2gpu-run-asg) for parameter "
               "iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name")

    def not_seen_yet(**_):
        if left["n"] <= 0:
            return None
        left["n"] -= 1
        return AWSResponse("https://autoscaling.amazonaws.com/", 400, {}, None), {
            "Error": {"Code": "ValidationError", "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400}}
    asg.meta.events.register("before-call.auto-scaling.CreateAutoScalingGroup", not_seen_yet)
    subnets = list(capacity.default_subnets(aws.ec2).values())[:1]
    try:
        name = groups.create(aws.ec2, asg, spec, ["g4dn.xlarge"], subnets, 1, None, made_at=time.time(), log=said.append)
        assert left["n"] == 0 and [g["AutoScalingGroupName"] for g in groups.find_groups(asg, RUN_ID)] == [name]
        assert "CreateAutoScalingGroup: ValidationError" in said[0] and "iamInstanceProfile.name" in said[0]
        assert said[-1] == "AWS sees it now: went through after 2 refusals"
    finally:
        asg.meta.events.unregister("before-call.auto-scaling.CreateAutoScalingGroup", not_seen_yet)
        groups.delete(aws.ec2, asg, RUN_ID)


def test_a_sweep_removes_a_runs_group_before_its_instances_and_its_template_after(aws, spec, tmp_path):
    """The registry (aws/sweep.KINDS) holds groups and launch templates: `down`/`cleanup` remove
    the group first (else it replaces the instances they terminate), its template after it."""
    asg, run = aws.client("autoscaling"), "run-asg-sweep"
    subnets = list(capacity.default_subnets(aws.ec2).values())[:1]
    name = groups.create(aws.ec2, asg, replace(spec, run_id=run), ["g4dn.xlarge"], subnets, 1, None)
    keys = [k.key for k in sweep.KINDS]
    assert keys.index("auto_scaling_groups") < keys.index("instances") < keys.index("launch_templates")
    found = sweep.inventory(aws.ec2, run, autoscaling=asg)
    assert [g["id"] for g in found["auto_scaling_groups"]] == [name] and found["auto_scaling_groups"][0]["desired"] == 1
    (template,) = found["launch_templates"]
    assert template["template_name"] == name and template["id"].startswith("lt-") and len(found["instances"]) == 1
    # without an Auto Scaling client the group is not listed, and not removable: reported left
    assert "auto_scaling_groups" not in sweep.inventory(aws.ec2, run)
    kept = sweep.delete_everything(aws.ec2, {"auto_scaling_groups": found["auto_scaling_groups"],
                                             "launch_templates": found["launch_templates"]}, None)
    assert kept["left"] == [f"{name} (no autoscaling client given)", f"{template['id']} (Auto Scaling group still there)"]
    removed = sweep.delete_run(aws.ec2, run, tmp_path, autoscaling=asg)
    assert removed["auto_scaling_groups"] == [name] and removed["launch_templates"] == [template["id"]]
    assert removed["left"] == [] and groups.find_groups(asg, run) == [] and groups.find_templates(aws.ec2, run) == []
    assert sweep.find_instances(aws.ec2, run, states=["pending", "running"]) == []


def test_deleting_a_group_or_template_that_is_gone_is_fine_and_a_busy_group_is_tried_again(aws):
    asg = aws.client("autoscaling")
    groups.delete_group(asg, "ec2gpu-never-made")  # listed nowhere: nothing to do
    groups.delete_template(aws.ec2, name="ec2gpu-never-made")
    groups.delete_template(aws.ec2, template_id="lt-0123456789abcdef0")
    with pytest.raises(ValueError):
        groups.delete_template(aws.ec2)
    calls = []

    class Busy:
        def delete_auto_scaling_group(self, **kw):
            calls.append(kw)
            if len(calls) < 3:
                raise botocore.exceptions.ClientError({"Error": {"Code": "ScalingActivityInProgress", "Message": ""}},
                                                      "DeleteAutoScalingGroup")

        def describe_auto_scaling_groups(self, **kw):
            return {"AutoScalingGroups": [{"AutoScalingGroupName": "g"}]}
    groups.delete_group(Busy(), "g", wait_s=5, delay_s=0.01)
    assert len(calls) == 3 and calls[-1] == {"AutoScalingGroupName": "g", "ForceDelete": True}


def test_the_ended_runs_leftovers_never_take_what_a_live_group_needs(aws, spec, tmp_path, monkeypatch):
    """A detached run between a spot interruption and its replacement lists no instance (EC2 drops a
    terminated one after an hour), yet its launch template needs its security group, key pair and
    role: while the run has a group, `ls`/`runs` (reconcile.remove_ended) leave them alone."""
    from ec2gpu.aws import network
    asg, run = aws.client("autoscaling"), "run-asg-live"
    network.create_key_pair(aws.ec2, run, "alice", tmp_path)
    subnets = list(capacity.default_subnets(aws.ec2).values())[:1]
    groups.create(aws.ec2, asg, replace(spec, run_id=run), ["g4dn.xlarge"], subnets, 1, None)
    seen = {}

    def ended_runs(described, key_pairs, runs, now, keep=frozenset()):
        seen["keep"] = set(keep)
        return {r: "no instance listed any more" for r in runs if r not in keep}
    monkeypatch.setattr(sweep, "ended_runs", ended_runs)
    try:
        assert run not in sweep.ended_leftovers(aws.ec2, autoscaling=asg) and run in seen["keep"]
        assert run in sweep.ended_leftovers(aws.ec2)  # without the group known, it would have gone
    finally:
        sweep.delete_run(aws.ec2, run, tmp_path, autoscaling=asg)


def test_a_group_aws_will_not_delete_keeps_its_own_runs_instances_but_no_other_runs(aws, spec, tmp_path):
    """Terminating the instances of a group that is still there only has the group launch others:
    a sweep leaves that run's instances (reported), and still ends another run's."""
    asg, run, other = aws.client("autoscaling"), "run-asg-stuck", "run-asg-free"
    subnets = list(capacity.default_subnets(aws.ec2).values())[:1]
    groups.create(aws.ec2, asg, replace(spec, run_id=run), ["g4dn.xlarge"], subnets, 1, None)
    aws.ec2.run_instances(**instances.run_request(replace(spec, run_id=other, subnet_id=None)))

    class Refusing:  # AccessDenied on DeleteAutoScalingGroup, as a policy without it answers
        def __getattr__(self, name):
            return getattr(asg, name)

        def delete_auto_scaling_group(self, **kw):
            raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": ""}},
                                                  "DeleteAutoScalingGroup")
    try:
        found = {k: v for k, v in sweep.inventory(aws.ec2, autoscaling=Refusing()).items()
                 if k in ("auto_scaling_groups", "instances")}
        found = {k: [r for r in v if r["run_id"] in (run, other)] for k, v in found.items()}
        mine = [r["id"] for r in found["instances"] if r["run_id"] == run]
        theirs = [r["id"] for r in found["instances"] if r["run_id"] == other]
        assert mine and theirs
        done = sweep.delete_everything(aws.ec2, found, tmp_path, autoscaling=Refusing())
        assert done["instances"] == theirs and done["auto_scaling_groups"] == []
        assert set(done["left"]) == {f"ec2gpu-{run} (AccessDenied)"} | {f"{i} (Auto Scaling group still there)"
                                                                           for i in mine}
        assert [i.id for i in sweep.find_instances(aws.ec2, run, states=["running"])] == mine
    finally:
        sweep.delete_run(aws.ec2, run, tmp_path, autoscaling=asg)
        sweep.delete_run(aws.ec2, other, tmp_path)


def test_a_cluster_placement_group_over_several_zones_is_refused_as_aws_refuses_it(aws, spec):
    """The sandbox answers as AWS: ValidationError (CreateAutoScalingGroup's PlacementGroup)."""
    from ec2gpu.aws import placement
    asg, run = aws.client("autoscaling"), "run-asg-pg"
    pg, _ = placement.create(aws.ec2, run, "alice", "test", "g4dn.xlarge")
    assert pg is not None
    subnets = [s for _, s, _ in groups.zones(aws.ec2, ["g4dn.xlarge"])][:2]
    req = groups.group_request(replace(spec, run_id=run, placement_group=pg), ["g4dn.xlarge"], subnets[:1], 1)
    aws.ec2.create_launch_template(**groups.template_request(replace(spec, run_id=run)))
    try:
        with pytest.raises(botocore.exceptions.ClientError, match="multiple Availability Zones"):
            asg.create_auto_scaling_group(**{**req, "VPCZoneIdentifier": ",".join(subnets)})
        asg.create_auto_scaling_group(**req)  # one zone: made, its instance in the placement group
        (inst,) = sweep.find_instances(aws.ec2, run, states=["pending", "running"])
        assert inst.placement_group == pg
        with pytest.raises(botocore.exceptions.ClientError, match="multiple Availability Zones"):
            asg.update_auto_scaling_group(AutoScalingGroupName=groups.name_of(run), VPCZoneIdentifier=",".join(subnets))
    finally:
        groups.delete(aws.ec2, asg, run)
        placement.delete(aws.ec2, pg)


def test_a_group_in_a_zone_without_its_type_fails_there_and_find_zone_moves_it(aws, spec):
    """The sandbox's group launches nothing in us-east-1e (no g4dn there, as on AWS): a Failed
    activity with EC2's reason; find_zone sends the group to the next zone, where both nodes launch,
    with AZRebalance suspended."""
    asg, run = aws.client("autoscaling"), "run-asg-zone"
    subnets = capacity.default_subnets(aws.ec2)
    bad = ("us-east-1e", subnets["us-east-1e"], ["g4dn.xlarge"])
    good = groups.zones(aws.ec2, ["g4dn.xlarge"])[0]
    run_spec = replace(spec, run_id=run)
    groups.create(aws.ec2, asg, run_spec, ["g4dn.xlarge"], [bad[1]], 2, None)
    try:
        asg.suspend_processes(**groups.suspend_request(run))
        failed = asg.describe_scaling_activities(AutoScalingGroupName=groups.name_of(run))["Activities"]
        assert failed and {a["StatusCode"] for a in failed} == {"Failed"}
        assert "not supported in your requested Availability Zone (us-east-1e)" in failed[0]["StatusMessage"]
        assert groups.find_zone(asg, run_spec, [bad, good], poll_s=0.2, wait_s=30) == good[0]
        wait_until = time.monotonic() + 30
        while len(sweep.find_instances(aws.ec2, run, states=["pending", "running"])) < 2:
            assert time.monotonic() < wait_until, "the group did not launch its 2 nodes"
            time.sleep(0.2)
        found = sweep.find_instances(aws.ec2, run, states=["pending", "running"])
        assert {i.zone for i in found} == {good[0]}
        (group,) = groups.find_groups(asg, run)
        assert group["VPCZoneIdentifier"] == good[1]
        assert [p["ProcessName"] for p in group["SuspendedProcesses"]] == ["AZRebalance"]
    finally:
        groups.delete(aws.ec2, asg, run)


def test_a_group_with_no_capacity_in_any_zone_is_refused_naming_each_zone(aws, spec, sandbox_env):
    """`ec2gpu sandbox capacity g6.xlarge 0`: the group's launch fails in every zone (a Failed
    activity, InsufficientInstanceCapacity's reason), and find_zone says so for each."""
    from ec2gpu.sandbox import control
    asg, run, home = aws.client("autoscaling"), "run-asg-full", sandbox_env[0]
    choices = groups.zones(aws.ec2, ["g6.xlarge"])[:2]
    run_spec = replace(spec, run_id=run)
    control.capacity(home, "g6.xlarge", 0)
    try:
        groups.create(aws.ec2, asg, run_spec, choices[0][2], [choices[0][1]], 2, None)
        with pytest.raises(CapacityError) as got:
            groups.find_zone(asg, run_spec, choices, poll_s=0.2, wait_s=30)
        assert all(f"{z}: We currently do not have sufficient g6.xlarge capacity" in got.value.message
                   for z, _, _ in choices)
        assert sweep.find_instances(aws.ec2, run, states=["pending", "running"]) == []
    finally:
        control.capacity(home, "g6.xlarge", None)
        groups.delete(aws.ec2, asg, run)
