"""Capacity: try the next availability zone, then the next instance type; check vCPU quotas first.

Capacity errors (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html):
InsufficientInstanceCapacity, InsufficientCapacity (capacity-not-available), SpotMaxPriceTooLow and
Unsupported (the type is not offered in that zone) mean "not here": the launch moves on at once,
with no SDK retries. Throttling (RequestLimitExceeded) is retried with exponential backoff
(aws/session.py, also by the fail-fast client).
Quotas: Service Quotas codes for G and VT instances, on-demand L-DB2E81BA ("Running On-Demand G and
VT instances") and spot L-3819A6DF ("All G and VT Spot Instance Requests"); both count vCPUs.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from dataclasses import dataclass, replace
from functools import partial

import botocore.exceptions

from .. import words
from ..errors import AwsError, CapacityError, SpotRoleMissing
from . import consistency, types
from .instances import Instance, LaunchSpec, run_request
from .session import Client, describe, error_code

#: codes that move the launch to the next zone / type
NEXT_ZONE = {"InsufficientInstanceCapacity", "InsufficientCapacity", "SpotMaxPriceTooLow", "Unsupported",
             "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity"}
#: the account's first spot request creates the service-linked role AWSServiceRoleForEC2Spot; a
#: caller without iam:CreateServiceLinkedRole gets this code, in every zone, for every type
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/service-linked-roles-spot-instance-requests.html)
SPOT_ROLE_MISSING = "AuthFailure.ServiceLinkedRoleCreationNotPermitted"
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
SPOT_ROLE_COMMAND = "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com"
#: codes that no other zone or type will fix (the account's limits)
LIMITS = {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"}

QUOTA_CODES = {"on-demand": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
               "spot": ("L-3819A6DF", "All G and VT Spot Instance Requests")}
GVT_FAMILIES = ("g", "vt")  # families that count against the G and VT quotas


@dataclass
class Attempt:
    """One run_instances try: where, and how it ended ('launched' or the AWS error code)."""

    instance_type: str
    zone: str | None
    market: str
    outcome: str
    message: str = ""


def zones_offering(ec2: Client, instance_type: str) -> list[str]:
    """Availability zones of the client's region that offer ``instance_type``, sorted."""
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}])
    return sorted({o["Location"] for p in pages for o in p["InstanceTypeOfferings"]})


def offered_in_region(ec2: Client, names: list[str]) -> set[str] | None:
    """Which of ``names`` the client's region offers at all; None when the API refuses."""
    try:
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="region", Filters=[{"Name": "instance-type", "Values": names}])
        return {o["InstanceType"] for p in pages for o in p["InstanceTypeOfferings"]}
    except botocore.exceptions.ClientError:
        return None


def default_subnets(ec2: Client) -> dict[str, str]:
    """Availability zone -> the default VPC's default subnet there."""
    subnets = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    return {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}


def plan(ec2: Client, instance_types: list[str], spot: bool, spot_fallback_on_demand: bool,
         avoid_zones: tuple[str, ...] | list[str] = ()) -> list[tuple[str, str | None, str | None, bool]]:
    """The launch order: [(instance type, zone, subnet id, spot)], each type's zones in turn.

    Zones come from describe_instance_type_offerings and need a default subnet; with none known
    (no default VPC subnets) the type is tried once without a zone. ``avoid_zones`` (where an
    earlier attempt was interrupted) go last within each type. A final on-demand pass over the
    first type's zones is added when ``spot_fallback_on_demand``.
    """
    subnets = default_subnets(ec2)
    order: list[tuple[str, str | None, str | None, bool]] = []
    for itype in instance_types:
        zones = sorted((z for z in zones_offering(ec2, itype) if z in subnets), key=lambda z: z in avoid_zones)
        order += [(itype, z, subnets[z], spot) for z in zones] or [(itype, None, None, spot)]
    if spot and spot_fallback_on_demand:
        first = instance_types[0]
        order += [(t, z, s, False) for t, z, s, sp in order if t == first]
    return order


def run_instances(ec2: Client, request: dict[str, Any]) -> list[Instance]:
    """Send one run_instances ``request``; return the instances (pending).

    Throttling, and a security group or key pair not visible yet (eventual consistency), are
    retried in place by the client itself (session.retry_handler, the fail-fast client included).
    Any other ClientError is raised at once for the caller to judge.
    """
    return [Instance.of(i) for i in ec2.run_instances(**request)["Instances"]]


def launch_with_fallback(ec2: Client, spec: LaunchSpec, instance_types: list[str], spot_fallback_on_demand: bool = False,
                         log: Callable[[str], None] = lambda msg: None, avoid_zones: tuple[str, ...] = (),
                         profile_created_at: float | None = None,
                         sleep: Callable[[float], None] = time.sleep) -> tuple[list[Instance], list[Attempt]]:
    """Launch ``spec`` as the first type and zone that has capacity; return (instances, attempts).

    ``ec2`` should be a fail-fast client (no SDK retries). ``avoid_zones`` are tried last (plan). Each failed attempt is reported
    through ``log``. ``profile_created_at`` (time.time()): when the run's instance profile was made;
    EC2 may not see it for a while, so each try is repeated while it is refused for that
    (consistency.when_visible, which says so through ``log``). Raises CapacityError listing every
    attempt when none succeeds (or at once for an account limit), AwsError for any other error.
    """
    attempts: list[Attempt] = []
    order = plan(ec2, instance_types, spec.spot, spot_fallback_on_demand, avoid_zones)
    spot_refused = False  # the spot role is missing: no spot launch can succeed, on-demand still may
    for itype, zone, subnet, spot in order:
        market = "spot" if spot else "on-demand"
        if spot and spot_refused:
            continue
        try_spec = replace(spec, instance_type=itype, subnet_id=subnet, spot=spot,
                           max_price=spec.max_price if spot else None)
        try:
            found = consistency.when_visible(partial(run_instances, ec2, run_request(try_spec)), profile_created_at, log, sleep)
        except botocore.exceptions.ClientError as exc:
            code = error_code(exc)
            attempts.append(Attempt(itype, zone, market, code or "?", describe(exc)))
            if code in NEXT_ZONE:
                log(f"{itype} {market} in {zone or 'any zone'}: {code}; trying the next zone or type")
                continue
            if code == SPOT_ROLE_MISSING:
                if not spot_fallback_on_demand:
                    raise SpotRoleMissing(spot_role_message(), spot_role_hint(with_fallback=True))
                log(f"spot refused: {spot_role_message()}; trying on-demand (--spot-fallback on-demand)")
                spot_refused = True
                continue
            if code in LIMITS:
                raise CapacityError(f"{itype} {market}: {describe(exc)}", quota_hint(market))
            raise AwsError(f"run_instances failed: {describe(exc)}", "see docs/iam-policy.json for the permissions needed")
        attempts.append(Attempt(itype, zone, market, "launched"))
        return found, attempts
    tried = "; ".join(f"{a.instance_type} {a.market} {a.zone or ''}: {a.outcome}" for a in attempts)
    raise CapacityError(f"no capacity for {', '.join(instance_types)} in {words.count(len(attempts), 'attempt')}: {tried}",
                        "try later, another --region, more types (--instance-type a,b,c)"
                        + ("" if spot_fallback_on_demand or not spec.spot else ", or --spot-fallback on-demand"))


def spot_role_message() -> str:
    return (f"this account's first spot request needs the service-linked role {SPOT_ROLE}, "
            "and these credentials may not create it (iam:CreateServiceLinkedRole)")


def spot_role_hint(with_fallback: bool = False) -> str:
    return (f"create it once: `{SPOT_ROLE_COMMAND}` (or add iam:CreateServiceLinkedRole for spot.amazonaws.com, "
            "docs/iam-policy.json)" + ("; or run on-demand (drop --spot, or add --spot-fallback on-demand)"
                                       if with_fallback else ""))


def spot_role_exists(iam: Client) -> bool | None:
    """Whether the account has AWSServiceRoleForEC2Spot: True, False, or None when it cannot be read."""
    try:
        iam.get_role(RoleName=SPOT_ROLE)
        return True
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == "NoSuchEntity":
            return False
        return None


def quota_hint(market: str) -> str:
    code, name = QUOTA_CODES[market]
    return (f"ask for more in Service Quotas (\"{name}\", {code}): aws service-quotas request-service-quota-increase "
            f"--service-code ec2 --quota-code {code} --desired-value N, or "
            f"https://console.aws.amazon.com/servicequotas/home/services/ec2/quotas/{code}")


def gvt_vcpus_in_use(ec2: Client, spot: bool) -> int:
    """vCPUs of pending/running G and VT instances of the market: each type's from
    DescribeInstanceTypes (types.py), else the instance's own CpuOptions."""
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    running = [i for page in pages for r in page["Reservations"] for i in r["Instances"]
               if (i.get("InstanceLifecycle") == "spot") == spot and i["InstanceType"].startswith(GVT_FAMILIES)]
    known = types.describe(ec2, [i["InstanceType"] for i in running]) if running else {}
    total = 0
    for i in running:
        cpu = i.get("CpuOptions", {})
        total += known[i["InstanceType"]].vcpus if i["InstanceType"] in known else \
            cpu.get("CoreCount", 1) * cpu.get("ThreadsPerCore", 1)
    return total


def check_quota(quotas: Client, ec2: Client, instance_type: str, spot: bool, count: int = 1,
                log: Callable[[str], None] = lambda msg: None) -> dict[str, Any] | None:
    """Refuse (CapacityError) a launch that would exceed the account's G/VT vCPU quota.

    ``quotas`` is a Service Quotas client. Returns {quota, value, in_use, needed} when checked,
    None when the type is not a G/VT type or the quota cannot be read (reported through ``log``).
    """
    if not instance_type.startswith(GVT_FAMILIES):
        return None  # p-family quotas (L-417A185B) are checked by EC2 itself at launch
    market = "spot" if spot else "on-demand"
    code, name = QUOTA_CODES[market]
    try:
        value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        why = describe(exc) if isinstance(exc, botocore.exceptions.ClientError) else str(exc)
        log(f"could not read the vCPU quota {code} ({why.splitlines()[0]}); not checked")
        return None
    needed = types.facts(ec2, instance_type, log).vcpus * count  # EC2's own figure, the table offline
    in_use = gvt_vcpus_in_use(ec2, spot)
    if in_use + needed > value:
        raise CapacityError(f"{instance_type} {market} needs {needed} vCPUs, but the quota \"{name}\" ({code}) "
                            f"is {value:g} vCPUs and {in_use} are in use", quota_hint(market))
    return {"quota": code, "value": value, "in_use": in_use, "needed": needed}
