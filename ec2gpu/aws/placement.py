"""Cluster placement groups: the nodes of a multi-node run close together on the network.

https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html#placement-groups-cluster
The GPU families the catalog lists (g4dn, g5, g6, g6e, p4d, p4de, p5, p5en, p6-b200) all support the
cluster strategy.
Where the API refuses (an account without the permission, an emulator such as moto that does not
implement placement groups), the run goes on without one and says so: placement is a speed-up,
never a requirement.
"""
from __future__ import annotations

import botocore.exceptions
import botocore.parsers

from . import tags
from . import types
from .catalog import CLUSTER_FAMILIES  # noqa: F401 - the families' list lives with the catalog's facts
from .session import Client, Item, Log, describe


def create(ec2: Client, run_id: str, owner: str, name: str, instance_type: str) -> tuple[str | None, str]:
    """Create the run's cluster placement group; return (its name or None, a note for the user).
    Whether the type may join one comes from DescribeInstanceTypes (types.py; the family list
    offline)."""
    if not types.facts(ec2, instance_type).cluster_placement:
        return None, f"no placement group: {instance_type} does not support the cluster strategy"
    group = f"ec2gpu-{run_id}"
    try:
        ec2.create_placement_group(GroupName=group, Strategy="cluster", TagSpecifications=[
            {"ResourceType": "placement-group", "Tags": tags.tags(run_id, owner, name)}])
    except Exception as exc:  # noqa: BLE001 - any refusal (moto answers 500) means "go on without one"
        why = describe(exc) if isinstance(exc, botocore.exceptions.ClientError) else f"{type(exc).__name__}"
        return None, f"no placement group (CreatePlacementGroup refused: {why.splitlines()[0][:120]}); launching without"
    return group, f"cluster placement group {group}"


def unavailable(exc: Exception) -> bool:
    """Whether ``exc`` says the placement-group API is not there (an emulator's 5xx or an answer
    botocore cannot parse; moto does not implement placement groups), as opposed to a refusal
    (AccessDenied, UnauthorizedOperation) that the caller must hear about."""
    if isinstance(exc, botocore.parsers.ResponseParserError):
        return True
    if isinstance(exc, botocore.exceptions.ClientError):
        status: int = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500
    return False


def find(ec2: Client, run_id: str | None = None, log: Log = lambda msg: None) -> list[Item]:
    """Placement groups tagged by the tool (optionally one run). Where the API is unavailable
    (``unavailable``) there are none to find, and ``log`` says so; any other error propagates."""
    filters = tags.run_filters(run_id)
    try:
        groups: list[Item] = ec2.describe_placement_groups(Filters=filters)["PlacementGroups"]
        return groups
    except (botocore.exceptions.ClientError, botocore.parsers.ResponseParserError) as exc:
        if not unavailable(exc):
            raise
        log(f"placement groups not listed: the API is unavailable here ({type(exc).__name__})")
        return []


#: EC2's code for a placement group that does not exist (Amazon EC2 API, "Error codes")
MISSING = "InvalidPlacementGroup.Unknown"


def delete(ec2: Client, group_name: str) -> None:
    """Delete a placement group (after its instances are terminated); a missing one is fine."""
    try:
        ec2.delete_placement_group(GroupName=group_name)
    except botocore.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != MISSING:
            raise
