"""Sweep: find everything carrying the tool's tags, and delete it (instances first)."""
from __future__ import annotations

import botocore.exceptions

from . import baked
from . import instances as inst
from . import placement
from . import tags as T
from .network import delete_key_pair
from .session import error_code

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


def find_instances(ec2, run_id: str | None = None, name: str | None = None,
                   states: list[str] | None = None) -> list[dict]:
    """Instances tagged by the tool (optionally one run or Name), in ``states`` (default: live)."""
    filters = [{"Name": "tag-key", "Values": [T.RUN]},
               {"Name": "instance-state-name", "Values": states or LIVE_STATES}]
    if run_id:
        filters.append({"Name": f"tag:{T.RUN}", "Values": [run_id]})
    if name:
        filters.append({"Name": f"tag:{T.NAME}", "Values": [name]})
    pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def find_security_groups(ec2, run_id: str | None = None) -> list[dict]:
    """Security groups tagged by the tool (optionally one run)."""
    filters = [{"Name": "tag-key", "Values": [T.RUN]}]
    if run_id:
        filters.append({"Name": f"tag:{T.RUN}", "Values": [run_id]})
    return ec2.describe_security_groups(Filters=filters)["SecurityGroups"]


def find_key_pairs(ec2, run_id: str | None = None) -> list[dict]:
    """Key pairs tagged by the tool (optionally one run)."""
    filters = [{"Name": "tag-key", "Values": [T.RUN]}]
    if run_id:
        filters.append({"Name": f"tag:{T.RUN}", "Values": [run_id]})
    return ec2.describe_key_pairs(Filters=filters)["KeyPairs"]


def runs_named(ec2, name: str) -> set[str]:
    """The run ids whose resources answer to ``name`` (an instance id, a Name, run or cluster tag),
    found in every instance state (an interrupted spot instance is ``terminated`` and still listed
    by EC2 for a while) and on security groups and key pairs, which outlive their instances."""
    keys = (T.NAME, T.RUN, T.CLUSTER)
    found = set()
    for i in find_instances(ec2, states=LIVE_STATES + ["terminated"]):
        tg = T.as_dict(i.get("Tags"))
        if name == i["InstanceId"] or name in (tg.get(k) for k in keys):
            found.add(tg.get(T.RUN))
    for res in find_security_groups(ec2) + find_key_pairs(ec2):
        tg = T.as_dict(res.get("Tags"))
        if name in (tg.get(k) for k in keys):
            found.add(tg.get(T.RUN))
    return {r for r in found if r}


def find_spot_requests(ec2, run_id: str | None = None) -> list[dict]:
    """Open or active spot instance requests tagged by the tool (optionally one run)."""
    filters = [{"Name": "tag-key", "Values": [T.RUN]}, {"Name": "state", "Values": ["open", "active"]}]
    if run_id:
        filters.append({"Name": f"tag:{T.RUN}", "Values": [run_id]})
    return ec2.describe_spot_instance_requests(Filters=filters)["SpotInstanceRequests"]


def inventory(ec2, run_id: str | None = None, log=lambda msg: None) -> dict[str, list[dict]]:
    """Everything the tool created (or one run) that still exists in the client's region, by kind.

    Keys: instances (live states), spot_requests (open/active), security_groups, key_pairs,
    placement_groups, images and snapshots (of bakes that did not complete); each
    entry has ``id``, ``run_id`` and ``name`` (from the tags) and, for instances, ``state``.
    ``log`` hears what could not be listed (placement groups where that API is unavailable).
    """
    def row(res: dict, id_key: str, **extra) -> dict:
        tg = T.as_dict(res.get("Tags"))
        return {"id": res[id_key], "run_id": tg.get(T.RUN, ""), "name": tg.get(T.NAME, ""), **extra}

    return {
        "instances": [row(i, "InstanceId", state=i["State"]["Name"], instance_type=i["InstanceType"])
                      for i in find_instances(ec2, run_id)],
        "spot_requests": [row(r, "SpotInstanceRequestId", state=r["State"]) for r in find_spot_requests(ec2, run_id)],
        "security_groups": [row(g, "GroupId") for g in find_security_groups(ec2, run_id)],
        "key_pairs": [row(k, "KeyName") for k in find_key_pairs(ec2, run_id)],
        "placement_groups": [row(g, "GroupName") for g in placement.find(ec2, run_id, log)],
        # a bake's image not yet complete (Ctrl-C, a crash): never a complete one (`ec2gpu image rm`)
        "images": [row(i, "ImageId", state=i.get("State")) for i in baked.images(ec2, run_id, complete=False)],
        "snapshots": [row(s, "SnapshotId") for s in baked.incomplete_snapshots(ec2, run_id)],
    }


def delete_everything(ec2, found: dict[str, list[dict]], keys_dir, log=lambda msg: None) -> dict[str, list[str]]:
    """Remove what ``inventory`` found: cancel spot requests, terminate instances (waiting), then
    delete security groups (retrying DependencyViolation) and key pairs with their local files.
    Returns the ids removed, by kind."""
    removed: dict[str, list[str]] = {k: [] for k in found}
    if found["spot_requests"]:
        ids = [r["id"] for r in found["spot_requests"]]
        log(f"cancelling spot requests {', '.join(ids)}")
        ec2.cancel_spot_instance_requests(SpotInstanceRequestIds=ids)
        removed["spot_requests"] = ids
    if found["instances"]:
        ids = [r["id"] for r in found["instances"]]
        log(f"terminating {', '.join(ids)}")
        inst.terminate(ec2, ids)
        removed["instances"] = ids
    for g in found["security_groups"]:
        log(f"deleting security group {g['id']}")
        delete_security_group(ec2, g["id"])
        removed["security_groups"].append(g["id"])
    for k in found["key_pairs"]:
        log(f"deleting key pair {k['id']}")
        delete_key_pair(ec2, k["id"], keys_dir)
        removed["key_pairs"].append(k["id"])
    for i in found.get("images", []):  # images first: EC2 refuses to delete a snapshot an image uses
        baked.deregister(ec2, i["id"], log)
        removed["images"].append(i["id"])
    removed["snapshots"] = baked.delete_snapshots(ec2, [s["id"] for s in found.get("snapshots", [])], log)
    for g in found.get("placement_groups", []):
        log(f"deleting placement group {g['id']}")
        placement.delete(ec2, g["id"])
        removed["placement_groups"].append(g["id"])
    return removed


def delete_security_group(ec2, group_id: str, timeout_s: float = 300, delay_s: float = 3) -> None:
    """Delete a security group, retrying DependencyViolation (every ``delay_s`` for up to
    ``timeout_s`` seconds) while its instances terminate; a group already gone is fine. Raises
    the last ClientError otherwise."""
    import tenacity

    def in_use(exc: BaseException) -> bool:
        return isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) == "DependencyViolation"

    for attempt in tenacity.Retrying(retry=tenacity.retry_if_exception(in_use), wait=tenacity.wait_fixed(delay_s),
                                     stop=tenacity.stop_after_delay(timeout_s), reraise=True):
        with attempt:
            try:
                ec2.delete_security_group(GroupId=group_id)
            except botocore.exceptions.ClientError as exc:
                if error_code(exc) != "InvalidGroup.NotFound":
                    raise


def delete_run(ec2, run_id: str, keys_dir, log=lambda msg: None) -> dict[str, list[str]]:
    """Remove everything of one run (see ``delete_everything``); returns the ids removed, by kind."""
    return delete_everything(ec2, inventory(ec2, run_id), keys_dir, log)
