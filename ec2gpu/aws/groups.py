"""Auto Scaling groups for detached runs (issue 30): a run's instances owned by AWS, not by a
controller of ours. A launch template holds what every instance of the run is (the same request
``instances.run_request`` builds for RunInstances); a group of N built from it, with the run's
instance types as overrides, keeps N running: when AWS interrupts a spot instance, the group
launches a replacement. Every limit is AWS's too: a scheduled action sets the group to 0 at the
run's deadline, whoever is left to ask.

Building a request is pure (tested without AWS); sending it is one call.

AWS documentation this module follows:
- Launch templates: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RequestLaunchTemplateData.html
  (``UserData`` "must be base64-encoded" in a template: botocore encodes it only for RunInstances)
- Mixed instances groups: https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-mixed-instances-groups.html
  (spot through ``InstancesDistribution``; a template that itself requests spot is refused there)
- price-capacity-optimized: https://docs.aws.amazon.com/autoscaling/ec2/userguide/allocation-strategies.html
- Capacity Rebalancing, off (docs/detached.md, "Rebalance recommendations"):
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-capacity-rebalancing.html
- One zone and a cluster placement group for several nodes ("You cannot specify multiple Availability
  Zones and a cluster placement group": CreateAutoScalingGroup's PlacementGroup, botocore's
  autoscaling model), AZRebalance suspended:
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/as-suspend-resume-processes.html
- The group's launches, as scaling activities (StatusCode Successful, Failed, ...):
  https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_Activity.html
- Scheduled actions: https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-scheduled-scaling.html
- DeleteAutoScalingGroup with ForceDelete terminates the group's instances:
  https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DeleteAutoScalingGroup.html
"""
from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from ..errors import CapacityError
from ..inert import inert
from . import capacity, consistency, tags
from .session import Client, Log, error_code
from .instances import LaunchSpec, run_request

#: the name of a run's launch template and group: one of each per run
PREFIX = "ec2gpu-"
#: the scheduled action that ends a run at its deadline (max runtime, or the idle rule's)
DEADLINE_ACTION = "ec2gpu-deadline"
#: the soonest a deadline is scheduled, in s from now: Auto Scaling refuses a scheduled action whose
#: StartTime is in the past (PutScheduledUpdateGroupAction: "If you try to schedule your action in
#: the past, Amazon EC2 Auto Scaling returns an error message":
#: https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_PutScheduledUpdateGroupAction.html)
SCHEDULE_LEAD_S = 60
#: RunInstances fields a launch template does not take, or that a group decides per instance:
#: how many (the group's size), where (its subnets), and the market (its InstancesDistribution)
_NOT_IN_TEMPLATE = ("MinCount", "MaxCount", "SubnetId", "Placement", "InstanceMarketOptions")


def name_of(run_id: str) -> str:
    """The launch template's and the group's name for ``run_id`` (pure)."""
    return f"{PREFIX}{run_id}"


def template_request(spec: LaunchSpec) -> dict[str, Any]:
    """CreateLaunchTemplate kwargs for the run ``spec`` describes (pure): its RunInstances request
    as LaunchTemplateData, less what the group decides (count, subnet, placement, market), with
    UserData base64-encoded, and an instance that shuts itself down terminated (in a group a
    stopped instance would only be replaced). The template itself carries the run's tags."""
    req = run_request(spec)
    data = {k: v for k, v in req.items() if k not in _NOT_IN_TEMPLATE}
    data["UserData"] = base64.b64encode(req["UserData"].encode()).decode()
    data["InstanceInitiatedShutdownBehavior"] = "terminate"
    data["TagSpecifications"] = [ts for ts in req["TagSpecifications"] if ts["ResourceType"] in ("instance", "volume")]
    return {"LaunchTemplateName": name_of(spec.run_id), "LaunchTemplateData": data,
            "TagSpecifications": [tags.tag_spec("launch-template", spec.run_id, spec.owner, spec.name)]}


def group_request(spec: LaunchSpec, instance_types: list[str], subnet_ids: list[str], size: int) -> dict[str, Any]:
    """CreateAutoScalingGroup kwargs (pure): ``size`` instances (at most that many: MaxSize) of the
    run's template, the first of ``instance_types`` that has capacity in ``subnet_ids``' zones.
    Spot (``spec.spot``): every instance spot, price-capacity-optimized across the types,
    ``spec.max_price`` the most paid; else every instance on-demand, types tried in the order
    given. Capacity Rebalancing is off: a rebalance recommendation alone would end a healthy
    instance as soon as its replacement runs, a restart of the job (docs/detached.md). With
    ``spec.placement_group`` (a cluster placement group: one zone) the group launches into it. The
    group's tags reach its instances (PropagateAtLaunch). Raises ValueError for no type, no subnet,
    a size below 1, or a placement group with several subnets (AWS refuses it)."""
    if not instance_types or not subnet_ids or size < 1:
        raise ValueError("a group needs an instance type, a subnet and a size of at least 1")
    if spec.placement_group and len(subnet_ids) > 1:
        raise ValueError("a cluster placement group is in one zone: give one subnet")
    name = name_of(spec.run_id)
    req: dict[str, Any] = {
        "AutoScalingGroupName": name, "MinSize": 0, "MaxSize": size, "DesiredCapacity": size,
        "VPCZoneIdentifier": ",".join(subnet_ids), "CapacityRebalance": False, "HealthCheckType": "EC2",
        "MixedInstancesPolicy": mixed_instances_policy(spec, instance_types),
        "Tags": [{"Key": t["Key"], "Value": t["Value"], "PropagateAtLaunch": True, "ResourceId": name,
                  "ResourceType": "auto-scaling-group"} for t in tags.tags(spec.run_id, spec.owner, spec.name)],
    }
    if spec.placement_group:
        req["PlacementGroup"] = spec.placement_group
    return req


def mixed_instances_policy(spec: LaunchSpec, instance_types: Sequence[str]) -> dict[str, Any]:
    """The group's MixedInstancesPolicy (pure): the run's template with ``instance_types`` as its
    Overrides, spot or on-demand as ``group_request`` says."""
    distribution: dict[str, Any] = {"OnDemandBaseCapacity": 0, "OnDemandAllocationStrategy": "prioritized",
                                    "OnDemandPercentageAboveBaseCapacity": 0 if spec.spot else 100}
    if spec.spot:
        distribution["SpotAllocationStrategy"] = "price-capacity-optimized"
        if spec.max_price is not None:
            distribution["SpotMaxPrice"] = f"{spec.max_price:.4f}"
    return {"LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": name_of(spec.run_id),
                                                               "Version": "$Latest"},
                               "Overrides": [{"InstanceType": t} for t in instance_types]},
            "InstancesDistribution": distribution}


#: Auto Scaling processes a run's group goes without: AZRebalance "balances the number of EC2
#: instances in the group evenly across all of the specified Availability Zones when the group
#: becomes unbalanced", ending a healthy instance (a restart of the job) to launch one elsewhere
#: (https://docs.aws.amazon.com/autoscaling/ec2/userguide/as-suspend-resume-processes.html)
SUSPENDED = ("AZRebalance",)


def suspend_request(run_id: str) -> dict[str, Any]:
    """SuspendProcesses kwargs that keep the run's group from moving instances between zones (pure)."""
    return {"AutoScalingGroupName": name_of(run_id), "ScalingProcesses": list(SUSPENDED)}


def zone_choices(offered: Mapping[str, Iterable[str]], subnets: Mapping[str, str],
                 instance_types: Sequence[str]) -> list[tuple[str, str, list[str]]]:
    """Where the run's group may launch (pure): [(zone, its default subnet, the ``instance_types``
    offered there, in their order)] for each zone that has a default subnet and offers at least one
    of the types (``offered``: type -> its zones, DescribeInstanceTypeOfferings:
    aws/capacity.zones_offering); zones that offer the earlier types first, then by name. A zone
    that offers none of them is never given: every launch there would fail."""
    found = []
    for zone, subnet in subnets.items():
        here = [t for t in instance_types if zone in set(offered.get(t, ()))]
        if here:
            found.append((zone, subnet, here))
    return sorted(found, key=lambda c: ([t not in c[2] for t in instance_types], c[0]))


def zones(ec2: Client, instance_types: Sequence[str]) -> list[tuple[str, str, list[str]]]:
    """``zone_choices`` of the region's default subnets and the zones offering each of
    ``instance_types`` (DescribeInstanceTypeOfferings). Raises CapacityError when no zone with a
    default subnet offers any of them."""
    offered = {t: capacity.zones_offering(ec2, t) for t in instance_types}
    choices = zone_choices(offered, capacity.default_subnets(ec2), instance_types)
    if not choices:
        raise CapacityError(f"no availability zone of this region with a default subnet offers "
                            f"{', '.join(instance_types)}", "try another --region or --instance-type")
    return choices


def move_request(spec: LaunchSpec, subnet_id: str, instance_types: Sequence[str]) -> dict[str, Any]:
    """UpdateAutoScalingGroup kwargs that send the run's group to another zone (pure): its subnet
    there and the types that zone offers."""
    return {"AutoScalingGroupName": name_of(spec.run_id), "VPCZoneIdentifier": subnet_id,
            "MixedInstancesPolicy": mixed_instances_policy(spec, instance_types)}


#: an activity's StatusCode that means its launch did not happen (API_Activity.html)
LAUNCH_FAILED = frozenset({"Failed", "Cancelled"})
#: how long (s) the group may take in one zone before the next is tried; a refusal (no capacity,
#: the type not offered) ends the launch's activity Failed sooner
ZONE_WAIT_S = 120.0


def launch_outcome(group: Mapping[str, Any], activities: Iterable[Mapping[str, Any]]) -> str | None:
    """How the group's launch went (pure): "launched" once it has an instance (DescribeAutoScalingGroups'
    Instances), "failed" when one of ``activities`` (DescribeScalingActivities') ended in
    LAUNCH_FAILED before any, None while it is still trying."""
    if group.get("Instances"):
        return "launched"
    return "failed" if any(a.get("StatusCode") in LAUNCH_FAILED for a in activities) else None


def find_zone(autoscaling: Client, spec: LaunchSpec, choices: Sequence[tuple[str, str, list[str]]],
              log: Callable[[str], None] = lambda msg: None, wait_s: float = ZONE_WAIT_S, poll_s: float = 3.0,
              sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> str:
    """The zone the run's group found capacity in; return it. The group (made in ``choices[0]``,
    zone_choices' order) is watched until it has an instance; a zone whose launch failed (an activity
    in LAUNCH_FAILED), or that launched nothing in ``wait_s`` seconds, gives way to the next
    (``move_request``): the group never spans zones. Raises CapacityError naming each zone and why
    (AWS's StatusMessage, inert) when none launched."""
    name, seen, tried = name_of(spec.run_id), set[str](), []
    for i, (zone, subnet, types) in enumerate(choices):
        if i:
            autoscaling.update_auto_scaling_group(**move_request(spec, subnet, types))
            log(f"trying {zone} ({', '.join(types)})")
        until = clock() + wait_s
        while True:
            (group,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
            acts = [a for a in autoscaling.describe_scaling_activities(AutoScalingGroupName=name)["Activities"]
                    if a.get("ActivityId") not in seen]
            outcome = launch_outcome(group, acts)
            if outcome == "launched":
                return zone
            if outcome == "failed" or clock() >= until:
                failed = [a for a in acts if a.get("StatusCode") in LAUNCH_FAILED]
                why = inert(str(failed[0].get("StatusMessage") or failed[0]["StatusCode"]))[:300] if failed \
                    else f"nothing launched in {wait_s:.0f} s"
                tried.append(f"{zone}: {why}")
                log(f"no launch in {zone}: {why}")
                seen |= {str(a.get("ActivityId")) for a in acts}
                break
            sleep(poll_s)
    raise CapacityError(f"no zone had capacity for the run's nodes together ({len(tried)} tried): " + "; ".join(tried),
                        "try later, another --region, more types (--instance-type a,b,c)")


def deadline_request(run_id: str, at: datetime) -> dict[str, Any]:
    """PutScheduledUpdateGroupAction kwargs that set the run's group to 0 at ``at`` (UTC), so its
    instances end then even if the agent on them does not (pure)."""
    return {"AutoScalingGroupName": name_of(run_id), "ScheduledActionName": DEADLINE_ACTION, "StartTime": at,
            "MinSize": 0, "MaxSize": 0, "DesiredCapacity": 0}


def create(ec2: Client, autoscaling: Client, spec: LaunchSpec, instance_types: list[str], subnet_ids: list[str],
           size: int, deadline: datetime | None, made_at: float | None = None, log: Log = lambda line: None) -> str:
    """Create the run's launch template, its group (``group_request``) and, with a ``deadline``,
    the scheduled action that ends it then; return the group's name. ``made_at`` (time.time()):
    when the run's instance profile and security group were made; while EC2 does not see them yet
    the template and the group are asked for again (consistency.when_visible, for about two
    minutes after, saying so through ``log``). What was made before a refusal is removed again
    (``delete``) before the error is raised: botocore's ClientError."""
    consistency.when_visible(lambda: ec2.create_launch_template(**template_request(spec)), made_at, log)
    try:
        request = group_request(spec, instance_types, subnet_ids, size)
        consistency.when_visible(lambda: autoscaling.create_auto_scaling_group(**request), made_at, log)
        if deadline is not None:  # never in the past, which Auto Scaling refuses: a short limit spent on the
            # requests above; the agent ends the job at its own limit_at whatever the group's time
            soonest = datetime.now(timezone.utc) + timedelta(seconds=SCHEDULE_LEAD_S)
            autoscaling.put_scheduled_update_group_action(**deadline_request(spec.run_id, max(deadline, soonest)))
    except BaseException:
        delete(ec2, autoscaling, spec.run_id)
        raise
    return name_of(spec.run_id)


def end(autoscaling: Client, run_id: str) -> None:
    """Set the run's group to 0 (min, max and desired): its instances terminate and none replaces
    them. What the agent does when the job ends; never a plain shutdown, which the group would
    answer with a new instance."""
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=name_of(run_id), MinSize=0, MaxSize=0,
                                          DesiredCapacity=0)


def find_groups(autoscaling: Client, run_id: str | None = None) -> list[dict[str, Any]]:
    """Groups tagged by the tool (optionally one run's), as DescribeAutoScalingGroups lists them."""
    filters = tags.run_filters(run_id)
    pages = autoscaling.get_paginator("describe_auto_scaling_groups").paginate(Filters=filters)
    return [g for page in pages for g in cast("list[dict[str, Any]]", page["AutoScalingGroups"])]


def summary(autoscaling: Client, run_id: str) -> dict[str, Any] | None:
    """The run's group as `ec2gpu status` shows it, or None when it is gone: {"name", "desired",
    "status" (AWS's, e.g. "Delete in progress", or None), "instances": [{"id", "state" (its
    LifecycleState: Pending, InService, Terminating, ...), "zone", "health", "instance_type"}]}."""
    found = find_groups(autoscaling, run_id)
    if not found:
        return None
    g = found[0]
    return {"name": g["AutoScalingGroupName"], "desired": g.get("DesiredCapacity"), "status": g.get("Status"),
            "instances": [{"id": i.get("InstanceId"), "state": i.get("LifecycleState"),
                           "zone": i.get("AvailabilityZone"), "health": i.get("HealthStatus"),
                           "instance_type": i.get("InstanceType")} for i in g.get("Instances", [])]}


def find_templates(ec2: Client, run_id: str | None = None) -> list[dict[str, Any]]:
    """Launch templates tagged by the tool (optionally one run's)."""
    filters = tags.run_filters(run_id)
    pages = ec2.get_paginator("describe_launch_templates").paginate(Filters=filters)
    return [t for page in pages for t in cast("list[dict[str, Any]]", page["LaunchTemplates"])]


#: DeleteAutoScalingGroup's answers while the group is still launching or ending something: worth
#: another try (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DeleteAutoScalingGroup.html)
BUSY = frozenset({"ScalingActivityInProgress", "ResourceInUse"})


def delete_group(autoscaling: Client, name: str, wait_s: float = 60.0, delay_s: float = 5.0) -> None:
    """Delete the group ``name`` with ForceDelete (its instances terminate with it), trying again
    every ``delay_s`` for up to ``wait_s`` seconds while AWS answers BUSY; a group no longer
    listed is fine. Raises botocore's ClientError otherwise (or the last BUSY one)."""
    import botocore.exceptions
    import tenacity

    def busy(exc: BaseException) -> bool:
        return isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in BUSY

    for attempt in tenacity.Retrying(retry=tenacity.retry_if_exception(busy), wait=tenacity.wait_fixed(delay_s),
                                     stop=tenacity.stop_after_delay(wait_s), reraise=True):
        with attempt:
            try:
                autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
            except botocore.exceptions.ClientError as exc:
                # a missing group is a ValidationError, a code shared with bad requests: ask again
                listed = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
                if error_code(exc) in BUSY or listed:
                    raise


def delete_template(ec2: Client, *, name: str | None = None, template_id: str | None = None) -> None:
    """Delete the launch template called ``name`` (or with id ``template_id``); one no longer
    listed is fine (EC2 answers InvalidLaunchTemplateName.NotFoundException or
    InvalidLaunchTemplateId.NotFound, moto MissingParameter). Raises botocore's ClientError
    otherwise, ValueError without a name or id."""
    import botocore.exceptions
    if (name is None) == (template_id is None):
        raise ValueError("give the launch template's name or its id")
    which = {"LaunchTemplateName": name} if name is not None else {"LaunchTemplateId": template_id}
    try:
        ec2.delete_launch_template(**which)
    except botocore.exceptions.ClientError:
        key, value = next(iter(which.items()))
        if any(t[key] == value for t in find_templates(ec2)):
            raise


def delete(ec2: Client, autoscaling: Client, run_id: str) -> list[str]:
    """Remove the run's group (ForceDelete: its instances are terminated with it) and then its
    launch template, each if it is listed; return what was removed ("group NAME", "launch
    template NAME"). Raises botocore's ClientError when AWS refuses."""
    name, removed = name_of(run_id), []
    if any(g["AutoScalingGroupName"] == name for g in find_groups(autoscaling, run_id)):
        delete_group(autoscaling, name)
        removed.append(f"group {name}")
    if any(t["LaunchTemplateName"] == name for t in find_templates(ec2, run_id)):
        delete_template(ec2, name=name)
        removed.append(f"launch template {name}")
    return removed
