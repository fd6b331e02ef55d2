"""EC2 Auto Scaling in the sandbox: groups that launch, replace and end their instances as AWS does.

moto keeps Auto Scaling groups and launches their instances when a request changes the group's
capacity (CreateAutoScalingGroup, SetDesiredCapacity, UpdateAutoScalingGroup), but nothing more
happens by itself, and what it launches is not what the launch template says. Here (in the daemon
only, ``install()`` and ``Scaler.reconcile()``, run by the daemon's loop) a group behaves as on AWS:

- **launch from the template** (``launch``): an instance of a group gets the launch template's key
  pair, security groups, user data, instance profile (its role's credentials reach the instance's
  metadata service: roles.py), metadata options (IMDSv2 required), shutdown behaviour, block
  devices and tags (moto 5.2.5's own launch drops the profile, the metadata options and the
  shutdown behaviour); the group's PropagateAtLaunch tags and ``aws:autoscaling:groupName``; an
  instance type from the MixedInstancesPolicy's Overrides (the first, or for a spot allocation
  strategy that weighs price, the one the simulated market (market.py) prices lowest in the zone);
  the zone (subnet) with the fewest of the group's instances, as AWS balances zones; spot or
  on-demand as the InstancesDistribution says (OnDemandBaseCapacity,
  OnDemandPercentageAboveBaseCapacity), so `ec2gpu sandbox interrupt` can interrupt it; and the
  group's placement group (its Placement.GroupName).
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-mixed-instances-groups.html
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/allocation-strategies.html
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-availability-zone-balanced.html
- **launches that fail** (``refusal``): a type that the zone does not offer
  (DescribeInstanceTypeOfferings: moto's data has us-east-1e without the GPU types, as AWS) or that
  is out of capacity (`ec2gpu sandbox capacity TYPE N`, sandbox/capacity.py) is not launched
  there: the next of the group's zones is tried, and each refusal is a ``Failed`` scaling activity
  with EC2's reason as its StatusMessage; a group no zone could launch for stays short and tries
  again at its next check. DescribeScalingActivities lists the group's activities, newest first
  (moto lists none). https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_Activity.html
- **a cluster placement group is in one zone**: CreateAutoScalingGroup or UpdateAutoScalingGroup
  that gives one with subnets in several zones is refused (``ValidationError``), as AWS refuses it
  ("You cannot specify multiple Availability Zones and a cluster placement group": botocore's
  autoscaling model, PlacementGroup; moto takes it).
- **health checks and replacement**: an instance of a group that is no longer pending or running
  (terminated by anyone, reclaimed by spot, ended by its own ``shutdown``, stopped) fails the EC2
  health check; it is taken out of the group (a stopped one is terminated) and, while the group's
  desired capacity is above what it has, a replacement is launched ``replace_after_s`` later.
  "When you don't use Capacity Rebalancing, Amazon EC2 Auto Scaling doesn't replace Spot Instances
  until after the Amazon EC2 Spot service interrupts the instances and their health check fails."
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-health-checks.html
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/health-checks-overview.html
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-capacity-rebalancing.html
  (moto replaces synchronously inside TerminateInstances only; here every cause takes the same path.)
  A group with more instances than its desired capacity terminates the extra ones (scale in).
  An instance set Unhealthy (SetInstanceHealth) is terminated and replaced the same way: "Amazon EC2
  Auto Scaling terminates and replaces the unhealthy instance"
  (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_SetInstanceHealth.html).
- **capacity rebalancing**: in a group with CapacityRebalance on, a spot instance that received a
  rebalance recommendation (`ec2gpu sandbox interrupt --rebalance`) gets a replacement launched at
  once, above the desired capacity if need be; when the replacement is running the at-risk instance
  is terminated by the group (page above, "Capacity Rebalancing behavior").
- **scheduled actions** (PutScheduledUpdateGroupAction with a StartTime): applied at that time,
  setting the group's minimum, maximum and desired capacity, and then gone, as "a scheduled action
  does not persist in your account once it has reached its end time"; a StartTime in the past is
  refused with ``ValidationError: Given start time is in the past``; action names are unique per
  group (moto 5.2.5 keys them by name alone, so a second group's ``ec2gpu-deadline`` replaced the
  first's); a group's actions go with the group.
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-scheduled-scaling.html
  https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_PutScheduledUpdateGroupAction.html
- **the group's instances' lifecycle state**: ``Pending`` while EC2 has the instance pending (the
  AWS-like mode: likeaws.py), ``InService`` once it runs.
- **UpdateAutoScalingGroup** without a MixedInstancesPolicy keeps the group's (moto 5.2.5 dropped
  it, so the group's next launches were on-demand of the template's type), and
  **DeleteAutoScalingGroup** of a group with instances is refused (``ResourceInUse``) without
  ForceDelete (moto deleted it regardless):
  https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DeleteAutoScalingGroup.html

Not emulated: recurring actions (Recurrence: logged once and never run), lifecycle hooks, warm
pools, instance refresh, scaling policies, AZRebalance (moto keeps SuspendProcesses' list, and
nothing here moves instances between zones whether it is suspended or not), SpotMaxPrice (ignored:
spot launches whatever the simulated price), and the minutes AWS takes (a launch here is
immediate, a replacement ``replace_after_s`` after the health check fails).
"""
from __future__ import annotations

import copy
import functools
import inspect
import math
import threading
import time
from datetime import datetime, timezone
from typing import Any

_UTC = timezone.utc  # (put_scheduled_update_group_action's parameter ``timezone`` hides the module there)

#: seconds from a group instance failing its health check to its replacement's launch (AWS: the
#: health check's own period, and a launch that takes a minute or two)
REPLACE_AFTER_S = 1.0
#: EC2 states that pass the EC2 health check (a launching instance is pending)
HEALTHY = ("pending", "running")
#: allocation strategies that weigh the spot price (the others take the Overrides in order)
PRICED = ("lowest-price", "price-capacity-optimized")

#: held by every Auto Scaling API call (moto's request threads) and by the reconcile loop, so the
#: loop never launches for a group a request is ending or deleting at that moment
LOCK = threading.RLock()


def log(message: str) -> None:
    """One line in the daemon's log (its stdout: server.log)."""
    print(f"autoscaling: {message}", flush=True)


def _utc(value: Any) -> datetime | None:
    """A StartTime as moto keeps it (an ISO 8601 string, or a datetime) as an aware UTC datetime."""
    if value is None or value == "":
        return None
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)


def on_demand_target(distribution: dict[str, Any], desired: int) -> int:
    """How many of ``desired`` instances are on-demand under an InstancesDistribution (pure): the
    base, then the percentage of the rest (rounded up: on-demand when in doubt)."""
    base = int(distribution.get("OnDemandBaseCapacity") or 0)
    pct = distribution.get("OnDemandPercentageAboveBaseCapacity")
    pct = 100 if pct is None else int(pct)
    return min(desired, base) + math.ceil(max(0, desired - base) * pct / 100)


def choose_type(overrides: list[str], default: str, zone: str, spot: bool, strategy: str | None, price) -> str:
    """The instance type of the next launch (pure apart from ``price(type, zone)`` -> USD/h or
    None): the Overrides' first, or for spot under a strategy that weighs price the cheapest
    (ties: the Overrides' order); the template's type without Overrides."""
    if not overrides:
        return default
    if spot and strategy in PRICED:
        priced = [(p, i, t) for i, t in enumerate(overrides) if (p := price(t, zone)) is not None]
        if priced:
            return min(priced)[2]
    return overrides[0]


def zone_order(subnets: list[tuple[str, str]], counts: dict[str, int]) -> list[tuple[str, str]]:
    """[(subnet id, zone)] in the order the next launch tries them (pure): the zone with the fewest
    of the group's instances first (``counts``: zone -> instances), ties in the group's order, as
    AWS balances zones; a zone that refuses the launch gives way to the next."""
    return sorted(subnets, key=lambda s: (counts.get(s[1], 0), subnets.index(s)))


#: the most scaling activities kept per group (DescribeScalingActivities: newest first)
MAX_ACTIVITIES = 100
_ACTIVITIES: dict[str, list[dict[str, Any]]] = {}  # group ARN -> its activities, newest first


def record_activity(group, status: str, description: str, message: str = "") -> dict[str, Any]:
    """Keep one scaling activity of ``group`` as AWS lists it (API_Activity.html: StatusCode
    Successful or Failed, StatusMessage the launch's refusal); return it."""
    import uuid
    now = datetime.now(timezone.utc)
    activity = {"ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": group.name, "AutoScalingGroupARN": group.arn,
                "Description": description, "Cause": f"At {now:%Y-%m-%dT%H:%M:%SZ} an instance was started in response "
                "to a difference between desired and actual capacity.", "StartTime": now, "EndTime": now,
                "StatusCode": status, "Progress": 100, "Details": "{}"}
    if message:
        activity["StatusMessage"] = message
    kept = _ACTIVITIES.setdefault(group.arn, [])
    kept.insert(0, activity)
    del kept[MAX_ACTIVITIES:]
    return activity


def refusal(ec2, instance_type: str, zone: str) -> str | None:
    """Why EC2 refuses one more ``instance_type`` in ``zone`` for a group (None: it launches): a
    zone that does not offer the type (DescribeInstanceTypeOfferings; EC2's ``Unsupported``), or
    the type out of capacity (`ec2gpu sandbox capacity`: ``InsufficientInstanceCapacity``)."""
    from . import capacity
    offered = ec2.describe_instance_type_offerings(
        location_type="availability-zone", filters={"instance-type": [instance_type], "location": [zone]})
    if not offered:
        return (f"Your requested instance type ({instance_type}) is not supported in your requested Availability "
                f"Zone ({zone}).")
    in_use = sum(1 for i in ec2.all_instances() if i.instance_type == instance_type and i.state in HEALTHY)
    if not capacity.room(instance_type, in_use):
        return (f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you "
                f"requested ({zone}). Our system will be working on provisioning additional capacity.")
    return None


def _template_data(group) -> dict[str, Any]:
    if group.ec2_launch_template is None:
        return {}
    return group.ec2_launch_template.get_version(group.launch_template_version).data


def _spot_next(group, data: dict[str, Any]) -> bool:
    """Whether the group's next instance is spot: the template's own market, or the group's
    InstancesDistribution against the on-demand instances it has."""
    policy = group.mixed_instances_policy or {}
    if not policy:
        return ((data.get("InstanceMarketOptions") or {}).get("MarketType") == "spot")
    desired = int(group.desired_capacity or 0)
    live = [s for s in group.instance_states if s.lifecycle_state in ("Pending", "InService")]
    on_demand = sum(1 for s in live if s.instance.lifecycle != "spot")
    return on_demand >= on_demand_target(policy.get("InstancesDistribution") or {}, max(desired, len(live) + 1))


def launch(group, count: int) -> list:
    """Launch ``count`` instances for moto's FakeAutoScalingGroup ``group`` as AWS does from its
    launch template (module docstring); return moto's Instances. The replacement of moto's
    ``replace_autoscaling_group_instances``. Raises what moto's EC2 raises for a launch it refuses."""
    from moto.autoscaling.models import ASG_NAME_TAG
    from moto.ec2.utils import convert_tag_spec

    from . import market

    data = _template_data(group)
    policy = group.mixed_instances_policy or {}
    overrides = [o["InstanceType"] for o in (policy.get("LaunchTemplate") or {}).get("Overrides") or []
                 if o.get("InstanceType")]
    strategy = (policy.get("InstancesDistribution") or {}).get("SpotAllocationStrategy")
    ec2 = group.ec2_backend
    subnet_ids = [s for s in (group.vpc_zone_identifier or "").split(",") if s]
    subnets = sorted(((s.id, s.availability_zone) for s in ec2.describe_subnets(subnet_ids=subnet_ids)),
                     key=lambda s: subnet_ids.index(s[0])) if subnet_ids else [("", z) for z in group.availability_zones]
    tags = {**{t["Key"]: t["Value"] for t in group.tags if t.get("PropagateAtLaunch")}, ASG_NAME_TAG: group.name}
    template_tags = convert_tag_spec(data.get("TagSpecifications") or [])
    profile = data.get("IamInstanceProfile") or {}
    key_name, sg_names = data.get("KeyName"), list(data.get("SecurityGroups") or [])
    if group.launch_config is not None:  # a launch configuration's group (not ec2gpu's): its own fields
        lc = group.launch_config
        key_name, sg_names, profile = lc.key_name, list(lc.security_groups or []), {"Name": lc.iam_instance_profile}
    template = {"LaunchTemplateId": group.ec2_launch_template.id, "Version": group.launch_template_version} \
        if group.ec2_launch_template is not None else None
    launched = []
    for _ in range(count):
        counts: dict[str, int] = {}
        for s in group.instance_states:
            counts[s.instance.placement.zone] = counts.get(s.instance.placement.zone, 0) + 1
        spot = _spot_next(group, data)
        for subnet_id, zone in zone_order(subnets, counts):
            here = [t for t in overrides if refusal(ec2, t, zone) is None] or overrides
            itype = choose_type(here, group.instance_type, zone, spot, strategy, market.spot_price)
            why = refusal(ec2, itype, zone)
            if why is not None:
                record_activity(group, "Failed", f"Launching a new EC2 instance. Status Reason: {why} "
                                "Launching EC2 instance failed.", why)
                log(f"{group.name}: no {itype} in {zone}: {why}")
                continue
            kwargs: dict[str, Any] = {
                "instance_type": itype, "is_instance_type_default": False, "region_name": group.region,
                "placement": zone, "key_name": key_name,
                "security_group_ids": list(data.get("SecurityGroupIds") or []),
                "tags": {"instance": {**template_tags.get("instance", {}), **tags},
                         "volume": template_tags.get("volume", {})},
                "metadata_options": data.get("MetadataOptions") or {},
                "instance_initiated_shutdown_behavior": data.get("InstanceInitiatedShutdownBehavior"),
                "disable_api_termination": bool(data.get("DisableApiTermination")),
                "ebs_optimized": bool(data.get("EbsOptimized")),
                "launch_template": template, "launch_config": group.launch_config, "sg_names": sg_names,
            }
            if subnet_id:
                kwargs["subnet_id"] = subnet_id
            if spot:
                kwargs["instance_market_options"] = "spot"  # what moto's RunInstances passes: MarketType
            launched += _run(group, ec2, kwargs, profile)
            break
        else:
            break  # no zone launched: the group stays short and tries again at its next check
    if launched:
        log(f"{group.name}: launched " + ", ".join(
            f"{i.id} ({i.instance_type}, {'spot' if i.lifecycle == 'spot' else 'on-demand'}, {i.placement.zone})"
            for i in launched))
    return launched


def _run(group, ec2, kwargs: dict[str, Any], profile: dict[str, Any]) -> list:
    """One instance of ``group`` launched with moto's ``kwargs``: its instance profile associated,
    in the group's placement group, in the group (Pending or InService) and a Successful activity."""
    from moto.autoscaling.models import InstanceState

    reservation = ec2.run_instances(group.image_id, 1, group.user_data, list(kwargs.pop("sg_names")), **kwargs)
    for inst in reservation.instances:
        if profile.get("Name") or profile.get("Arn"):
            ec2.associate_iam_instance_profile(instance_id=inst.id, iam_instance_profile_name=profile.get("Name"),
                                               iam_instance_profile_arn=profile.get("Arn"))
        inst.placement.group_name = group.placement_group or ""
        inst.autoscaling_group = group
        group.instance_states.append(InstanceState(
            inst, lifecycle_state="Pending" if inst.state == "pending" else "InService",
            protected_from_scale_in=group.new_instances_protected_from_scale_in))
        record_activity(group, "Successful", f"Launching a new EC2 instance: {inst.id}")
    return list(reservation.instances)
def install() -> None:
    """Patch moto's Auto Scaling (in the daemon, after moto is imported): launches from the
    template, scheduled actions per group and refused in the past, no synchronous replacement in
    TerminateInstances (the health check in ``Scaler.reconcile`` replaces), DeleteAutoScalingGroup
    refused without ForceDelete while the group has instances, a cluster placement group refused
    with several zones, the groups' scaling activities listed, and every API call under LOCK."""
    _patch_group()
    _patch_backend()
    _patch_responses()


def _patch_group() -> None:
    """moto's groups: launches from the template (``launch``), launching instances counted as
    capacity, and UpdateAutoScalingGroup keeping the group's mixed instances policy."""
    from moto.autoscaling.models import FakeAutoScalingGroup

    def replace_instances(self, count_needed: int, propagated_tags: dict) -> None:
        launch(self, count_needed)

    def active_instances(self) -> list:  # what the group counts as its capacity: launching ones too
        return [s for s in self.instance_states if s.lifecycle_state in ("Pending", "InService")]

    update = FakeAutoScalingGroup.update

    def update_keeping_policy(self, *args, **kwargs):
        # UpdateAutoScalingGroup without MixedInstancesPolicy keeps the group's (AWS); moto 5.2.5
        # sets it to None, so the group's next launches would be on-demand of the template's type
        if kwargs.get("mixed_instances_policy") is None and self.mixed_instances_policy and \
                not kwargs.get("launch_template") and not kwargs.get("launch_config_name"):
            policy = copy.deepcopy(self.mixed_instances_policy)
            policy["LaunchTemplate"]["LaunchTemplateSpecification"].pop("LaunchTemplateName", None)  # moto takes one
            kwargs["mixed_instances_policy"] = policy
        return update(self, *args, **kwargs)

    FakeAutoScalingGroup.replace_autoscaling_group_instances = replace_instances
    FakeAutoScalingGroup.active_instances = active_instances
    FakeAutoScalingGroup.update = update_keeping_policy


def _patch_backend() -> None:
    """moto's Auto Scaling backend: scheduled actions per group (refused in the past, deleted with
    their group), no replacement in TerminateInstances, a cluster placement group in one zone only,
    and every public method under LOCK."""
    from moto.autoscaling.exceptions import ValidationError
    from moto.autoscaling.models import AutoScalingBackend

    put = AutoScalingBackend.put_scheduled_update_group_action

    def put_scheduled_update_group_action(self, name, desired_capacity, max_size, min_size, scheduled_action_name,
                                          start_time, end_time, recurrence, timezone):
        at = _utc(start_time)
        if at is not None and at < datetime.now(tz=_UTC):
            raise ValidationError("Given start time is in the past")
        action = put(self, name, desired_capacity, max_size, min_size, scheduled_action_name, start_time, end_time,
                     recurrence, timezone)
        self.scheduled_actions.pop(scheduled_action_name, None)  # moto's key (the name alone): one per group here
        self.scheduled_actions[(name, scheduled_action_name)] = action
        return action

    def delete_scheduled_action(self, auto_scaling_group_name, scheduled_action_name):
        if self.scheduled_actions.pop((auto_scaling_group_name, scheduled_action_name), None) is None:
            raise ValidationError("Scheduled action name not found")

    delete_group = AutoScalingBackend.delete_auto_scaling_group

    def delete_auto_scaling_group(self, group_name):
        group = self.autoscaling_groups.get(group_name)
        delete_group(self, group_name)
        if group is not None:
            _ACTIVITIES.pop(group.arn, None)
        for key in [k for k, a in self.scheduled_actions.items() if a.auto_scaling_group_name == group_name]:
            del self.scheduled_actions[key]

    def notify_terminate_instances(self, instance_ids):
        pass  # the group notices at its next health check (Scaler.reconcile), as on AWS

    create = AutoScalingBackend.create_auto_scaling_group
    update = AutoScalingBackend.update_auto_scaling_group

    def create_auto_scaling_group(self, name, *args, **kwargs):
        _one_zone_for_a_cluster(self, kwargs.get("placement_group"), kwargs.get("vpc_zone_identifier"))
        return create(self, name, *args, **kwargs)

    def update_auto_scaling_group(self, name, *args, **kwargs):
        group = self.autoscaling_groups.get(name)
        if group is not None and kwargs.get("vpc_zone_identifier"):
            _one_zone_for_a_cluster(self, group.placement_group, kwargs["vpc_zone_identifier"])
        return update(self, name, *args, **kwargs)

    AutoScalingBackend.create_auto_scaling_group = create_auto_scaling_group
    AutoScalingBackend.update_auto_scaling_group = update_auto_scaling_group
    AutoScalingBackend.put_scheduled_update_group_action = put_scheduled_update_group_action
    AutoScalingBackend.delete_scheduled_action = delete_scheduled_action
    AutoScalingBackend.delete_auto_scaling_group = delete_auto_scaling_group
    AutoScalingBackend.notify_terminate_instances = notify_terminate_instances
    for attr, fn in list(vars(AutoScalingBackend).items()):
        if inspect.isfunction(fn) and not attr.startswith("_"):
            setattr(AutoScalingBackend, attr, _locked(fn))


def _one_zone_for_a_cluster(backend, placement_group: str | None, vpc_zone_identifier: str | None) -> None:
    """Refuse a cluster placement group with subnets in several zones, as AWS does: "A cluster
    placement group is a logical grouping of instances within a single Availability Zone. You
    cannot specify multiple Availability Zones and a cluster placement group." (botocore's
    autoscaling model, CreateAutoScalingGroup's and UpdateAutoScalingGroup's PlacementGroup;
    moto takes both). Raises moto's ValidationError."""
    from moto.autoscaling.exceptions import ValidationError

    from . import placement

    ids = [s for s in (vpc_zone_identifier or "").split(",") if s]
    if not placement_group or len(ids) < 2:
        return
    if placement.strategy(backend.account_id, backend.region_name, placement_group) != "cluster":
        return
    zones = {s.availability_zone for s in backend.ec2_backend.describe_subnets(subnet_ids=ids)}
    if len(zones) > 1:
        raise ValidationError("You cannot specify multiple Availability Zones and a cluster placement group.")


def _patch_responses() -> None:
    """moto's Auto Scaling responses: DeleteAutoScalingGroup refused (ResourceInUse) without
    ForceDelete while the group has instances; DescribeScalingActivities with the group's launches."""
    from moto.autoscaling.exceptions import AutoscalingClientError
    from moto.autoscaling.responses import AutoScalingResponse

    class InUse(AutoscalingClientError):
        code = "ResourceInUse"

    respond = AutoScalingResponse.delete_auto_scaling_group

    def delete_response(self):
        # https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DeleteAutoScalingGroup.html:
        # "If the group has instances or scaling activities in progress, you must specify the
        # option to force the deletion in order for it to succeed." (moto deletes regardless)
        group = self.autoscaling_backend.autoscaling_groups.get(self._get_param("AutoScalingGroupName"))
        if group is not None and group.instance_states and not self._get_bool_param("ForceDelete", False):
            raise InUse("You cannot delete an AutoScalingGroup while there are instances or pending Spot "
                        "instance request(s) still in the group.")
        return respond(self)

    def describe_scaling_activities(self):
        # moto answers none: here the group's launches as ``launch`` recorded them, newest first
        from moto.core.responses import ActionResult
        group = self.autoscaling_backend.autoscaling_groups.get(self._get_param("AutoScalingGroupName"))
        return ActionResult({"Activities": list(_ACTIVITIES.get(group.arn, [])) if group is not None else []})

    AutoScalingResponse.delete_auto_scaling_group = delete_response
    AutoScalingResponse.describe_scaling_activities = describe_scaling_activities


def _locked(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with LOCK:
            return fn(*args, **kwargs)
    return call


class Scaler:
    """What EC2 Auto Scaling does between API calls: health checks, replacements, capacity
    rebalancing, scheduled actions. ``reconcile()`` is one pass over every group of every account
    and region; the daemon calls it every tick. ``rebalanced()`` -> the instance ids that received a
    rebalance recommendation (the metadata service's, imds.py)."""

    def __init__(self, replace_after_s: float = REPLACE_AFTER_S, rebalanced=lambda: set()):
        self.replace_after_s = replace_after_s
        self.rebalanced = rebalanced
        self.short_since: dict[str, float] = {}  # group ARN -> when it was first seen below its desired capacity
        self.rebalancing: dict[str, str] = {}  # at-risk instance id -> the id of its replacement
        self.warned: set[str] = set()  # recurring actions logged once

    def reconcile(self, now: datetime | None = None) -> None:
        from moto.autoscaling.models import autoscaling_backends

        now = now or datetime.now(timezone.utc)
        for account in list(autoscaling_backends.keys()):
            for region in list(autoscaling_backends[account].keys()):
                backend = autoscaling_backends[account][region]
                with LOCK:
                    self._scheduled(backend, now)
                    for group in list(backend.autoscaling_groups.values()):
                        try:
                            self._group(group)
                        except Exception as exc:  # a launch EC2 refused: logged, tried again next time
                            log(f"{group.name}: {type(exc).__name__}: {exc}")
                            self.short_since[group.arn] = time.monotonic()

    def _scheduled(self, backend, now: datetime) -> None:
        for key, action in list(backend.scheduled_actions.items()):
            if action.recurrence:
                if action.scheduled_action_name not in self.warned:
                    self.warned.add(action.scheduled_action_name)
                    log(f"{action.auto_scaling_group_name}: recurring action {action.scheduled_action_name} "
                        "is not emulated")
                continue
            at = _utc(action.start_time)
            if at is None or at > now:
                continue
            del backend.scheduled_actions[key]
            group = backend.autoscaling_groups.get(action.auto_scaling_group_name)
            if group is None:
                continue
            if action.min_size is not None:
                group.min_size = action.min_size
            if action.max_size is not None:
                group.max_size = action.max_size
            desired = action.desired_capacity if action.desired_capacity is not None else group.desired_capacity or 0
            desired = max(group.min_size or 0, desired if group.max_size is None else min(desired, group.max_size))
            log(f"{group.name}: scheduled action {action.scheduled_action_name} (StartTime {at:%H:%M:%S}Z): "
                f"min {group.min_size}, max {group.max_size}, desired {desired}")
            group.set_desired_capacity(desired)

    def _group(self, group) -> None:
        at_risk = self.rebalanced() if group.capacity_rebalance else set()
        for s in list(group.instance_states):
            inst, state = s.instance, s.instance.state
            if s.lifecycle_state not in ("Pending", "InService"):
                continue  # Standby, Detaching...: outside the health checks
            if s.health_status == "Unhealthy" and state in HEALTHY:  # SetInstanceHealth: terminated, replaced
                group.instance_states.remove(s)
                self.rebalancing.pop(inst.id, None)
                group.ec2_backend.terminate_instances([inst.id])
                log(f"{group.name}: {inst.id} was set Unhealthy: terminated, taken out of the group")
                self.short_since.setdefault(group.arn, time.monotonic())
                continue
            if state in HEALTHY:
                s.lifecycle_state = "Pending" if state == "pending" else "InService"
                if inst.id in at_risk and inst.lifecycle == "spot" and inst.id not in self.rebalancing \
                        and state == "running":
                    for new in launch(group, 1):
                        self.rebalancing[inst.id] = new.id
                        log(f"{group.name}: {inst.id} received a rebalance recommendation: {new.id} launched to "
                            "replace it")
                continue
            s.health_status = "Unhealthy"
            group.instance_states.remove(s)
            self.rebalancing.pop(inst.id, None)
            if state in ("stopping", "stopped"):
                group.ec2_backend.terminate_instances([inst.id])
            log(f"{group.name}: {inst.id} is {state} ({inst.state_reason.code or 'no reason'}): "
                "failed its health check, taken out of the group")
            self.short_since.setdefault(group.arn, time.monotonic())
        for old, new in list(self.rebalancing.items()):  # a replacement in service: the at-risk one goes
            states = {s.instance.id: s for s in group.instance_states}
            if old in states and states.get(new) is not None and states[new].instance.state == "running":
                del self.rebalancing[old]
                group.instance_states.remove(states[old])
                group.ec2_backend.terminate_instances([old])
                log(f"{group.name}: {new} is in service: terminated {old}, the instance at risk (Capacity Rebalancing)")
        live = [s for s in group.instance_states if s.lifecycle_state in ("Pending", "InService")]
        desired = int(group.desired_capacity or 0)
        extra = len(live) - desired - len([o for o in self.rebalancing if o in {s.instance.id for s in live}])
        if extra > 0:  # more than desired (a launch that raced a request lowering it): scale in
            gone = [s for s in live if not s.protected_from_scale_in][:extra]
            for s in gone:
                group.instance_states.remove(s)
            if gone:
                group.ec2_backend.terminate_instances([s.instance.id for s in gone])
                log(f"{group.name}: terminated {', '.join(s.instance.id for s in gone)} (desired capacity {desired})")
        if len(live) >= desired:
            self.short_since.pop(group.arn, None)
            return
        since = self.short_since.setdefault(group.arn, time.monotonic())
        if time.monotonic() - since >= self.replace_after_s:
            del self.short_since[group.arn]
            log(f"{group.name}: {len(live)} of desired {desired} in service: launching {desired - len(live)}")
            launch(group, desired - len(live))
