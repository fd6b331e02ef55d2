"""Sweep: find everything carrying the tool's tags, and delete it (instances first).

A run's instance role (aws/iam.py) is found and removed too when an IAM client is given (``iam``):
IAM is global, so a sweep of one region takes only the roles tagged with that region, and an
untagged one only when its run still holds something there (``find_instance_roles``).
"""
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
    pages = ec2.get_paginator("describe_security_groups").paginate(Filters=filters)
    return [g for page in pages for g in page["SecurityGroups"]]


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
    pages = ec2.get_paginator("describe_spot_instance_requests").paginate(Filters=filters)
    return [r for page in pages for r in page["SpotInstanceRequests"]]


def find_instance_roles(iam, ec2, run_id: str | None = None, runs_here=frozenset(),
                        log=lambda msg: None) -> list[dict]:
    """The run roles and orphan instance profiles (aws/iam.find_run_roles entries) that belong to
    ``ec2``'s region: all of one run's (``run_id``: run ids are unique), else those tagged
    ec2gpu:region with this region and the untagged ones of ``runs_here`` (runs that hold something
    in this region): never the role of a run that may be running in another region. Where these
    credentials may not list IAM roles (AccessDenied: a policy from before the instance roles)
    there are none, and ``log`` says so; other errors propagate (botocore's ClientError)."""
    from . import iam as roles
    try:
        found = roles.find_run_roles(iam, run_id)
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) not in roles.REFUSED:
            raise
        log(f"instance roles not listed ({error_code(exc)}): iam:ListRoles, iam:ListRoleTags and "
            "iam:ListInstanceProfiles are in docs/iam-policy.json")
        return []
    if run_id:
        return found
    region = ec2.meta.region_name
    return [r for r in found if r["region"] == region or (not r["region"] and r["run_id"] in runs_here)]


def inventory(ec2, run_id: str | None = None, log=lambda msg: None, iam=None) -> dict[str, list[dict]]:
    """Everything the tool created (or one run) that still exists in the client's region, by kind.

    Keys: instances (live states), spot_requests (open/active), security_groups, key_pairs,
    placement_groups, images and snapshots (of bakes that did not complete), and with an IAM
    client ``iam`` instance_roles (``find_instance_roles``: a role's ``id`` is its name, which is
    also its instance profile's; ``kind`` "role" or "instance_profile" for a profile whose role is
    gone); each entry has ``id``, ``run_id`` and ``name`` (from the tags) and, for instances,
    ``state``. Without ``iam`` there is no instance_roles key. ``log`` hears what could not be
    listed (placement groups where that API is unavailable, roles these credentials may not list).
    """
    def row(res: dict, id_key: str, **extra) -> dict:
        tg = T.as_dict(res.get("Tags"))
        return {"id": res[id_key], "run_id": tg.get(T.RUN, ""), "name": tg.get(T.NAME, ""), **extra}

    found = {
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
    if iam is not None:
        here = {r["run_id"] for rows in found.values() for r in rows} - {""}
        found["instance_roles"] = [{"id": r["name"], "run_id": r["run_id"], "name": r["name"], "owner": r["owner"],
                                    "kind": r["kind"]} for r in find_instance_roles(iam, ec2, run_id, here, log)]
    return found


def delete_everything(ec2, found: dict[str, list[dict]], keys_dir, log=lambda msg: None,
                      iam=None) -> dict[str, list[str]]:
    """Remove what ``inventory`` found: cancel spot requests, terminate instances (waiting), then
    delete security groups (retrying DependencyViolation) and key pairs with their local files,
    images, snapshots and placement groups, and last (with ``iam``) instance roles with their
    instance profiles (aws/iam.delete_run_role). Returns the ids removed, by kind. Raises the
    first error (botocore's ClientError) of a step that fails."""
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
    if found.get("instance_roles") and iam is None:
        log("instance roles not removed: no IAM client given")
    elif found.get("instance_roles"):
        from . import iam as roles
        for r in found["instance_roles"]:  # after the instances: a running one still uses its role
            log(f"deleting instance role {r['id']}")
            roles.delete_run_role(iam, r["id"])
            removed["instance_roles"].append(r["id"])
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


def delete_run(ec2, run_id: str, keys_dir, log=lambda msg: None, iam=None) -> dict[str, list[str]]:
    """Remove everything of one run (see ``delete_everything``; its instance role too with an IAM
    client ``iam``); returns the ids removed, by kind."""
    return delete_everything(ec2, inventory(ec2, run_id, log, iam), keys_dir, log, iam)


#: EC2's StateReason code of an instance that its own OS shut down (`--max-runtime`, the idle rule):
#: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StateReason.html
SELF_SHUTDOWN = "Client.InstanceInitiatedShutdown"
#: A run's key pair this old (s) with no instance of the run listed at all is taken as left behind:
#: EC2 lists a terminated instance for about an hour after it ends
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/terminating-instances.html), and a run
#: launches its first instance seconds after it creates its key pair.
UNLISTED_AFTER_S = 2 * 3600


def ended_runs(described: list[dict], key_pairs: list[dict], runs: set[str], now, keep=frozenset()) -> dict[str, str]:
    """Of ``runs`` (run ids that hold a security group, key pair, placement group or instance role),
    those whose instances have all ended, each with why (pure): "ended itself" when every instance
    of the run in ``described`` (DescribeInstances entries, every state) is terminated and one of
    them by its own shutdown (SELF_SHUTDOWN); "no instance listed any more" when none is listed and
    the newest of its key pairs (``key_pairs``: anything with the run's Tags and a CreateTime, an
    instance role's too) is older than UNLISTED_AFTER_S at ``now``. Never one of ``keep`` (runs
    a controller may still be using: a spot run between an interruption and its replacement)."""
    by_run: dict[str, list[dict]] = {}
    for described_one in described:
        by_run.setdefault(T.as_dict(described_one.get("Tags")).get(T.RUN, ""), []).append(described_one)
    created: dict = {}
    for k in key_pairs:
        run, at = T.as_dict(k.get("Tags")).get(T.RUN), k.get("CreateTime")
        if at:
            created[run] = max(created.get(run, at), at)
    out = {}
    for run in sorted(set(runs) - set(keep)):
        mine = by_run.get(run, [])
        if mine and all(i["State"]["Name"] == "terminated" for i in mine) and any(
                (i.get("StateReason") or {}).get("Code") == SELF_SHUTDOWN for i in mine):
            out[run] = "ended itself"
        elif not mine and run in created and (now - created[run]).total_seconds() > UNLISTED_AFTER_S:
            out[run] = "no instance listed any more"
    return out


def ended_leftovers(ec2, keep=frozenset(), iam=None) -> dict[str, dict]:
    """What runs whose instances have all ended left (``ended_runs``): run id -> {"why",
    "security_groups", "key_pairs", "placement_groups": their ids, and with an IAM client ``iam``
    "instance_roles": the names of its roles and orphan instance profiles (``find_instance_roles``;
    a role's creation dates its run as a key pair does)}. Where the placement group API is
    unavailable, or these credentials may not list IAM roles, there are none of those (`cleanup`
    says so). Raises botocore errors."""
    from datetime import datetime, timezone

    held = {"security_groups": [(g, "GroupId") for g in find_security_groups(ec2)],
            "key_pairs": [(k, "KeyName") for k in find_key_pairs(ec2)],
            "placement_groups": [(g, "GroupName") for g in placement.find(ec2)]}
    if iam is not None:
        here = {T.as_dict(r.get("Tags")).get(T.RUN) for found in held.values() for r, _ in found} - {None, ""}
        held["instance_roles"] = [({"Tags": [{"Key": T.RUN, "Value": r["run_id"]}], "Name": r["name"],
                                    "CreateTime": r["created"]}, "Name")
                                  for r in find_instance_roles(iam, ec2, runs_here=here)]
    runs = {T.as_dict(r.get("Tags")).get(T.RUN) for found in held.values() for r, _ in found} - {None, ""}
    if not runs:
        return {}
    dated = [k for k, _ in held["key_pairs"] + held.get("instance_roles", [])]
    ended = ended_runs(find_instances(ec2, states=LIVE_STATES + ["terminated"]), dated,
                       runs, datetime.now(timezone.utc), keep)
    return {run: {"why": why, **{kind: [r[key] for r, key in found if T.as_dict(r.get("Tags")).get(T.RUN) == run]
                                 for kind, found in held.items()}}
            for run, why in ended.items()}


def remove_leftovers(ec2, found: dict[str, dict], keys_dir, iam=None) -> dict[str, dict[str, list[str]]]:
    """Delete what ``ended_leftovers`` found, per run, best-effort: its security groups (one try
    each: a group whose ended instance's network interface lingers is left for the next command),
    then, once they are gone, its key pairs with their local key files and its placement groups;
    and with an IAM client ``iam``, on their own, its instance roles (aws/iam.delete_run_role).
    Returns run id -> {kind: ids removed ("instance_roles" only with ``iam``); "key_files": the
    local files deleted; "left": "what (why)" for what AWS refused or still holds}. Never raises
    for one resource."""
    from .network import private_key_path

    removed = {}
    for run, what in found.items():
        done: dict[str, list[str]] = {"security_groups": [], "key_pairs": [], "key_files": [], "placement_groups": [],
                                      "left": []}
        try:
            for group in what["security_groups"]:
                try:
                    ec2.delete_security_group(GroupId=group)
                    done["security_groups"].append(group)
                except botocore.exceptions.ClientError as exc:
                    if error_code(exc) != "InvalidGroup.NotFound":
                        raise
            for name in what["key_pairs"]:  # the run's date (ended_runs): kept while a group stays
                had_file = private_key_path(keys_dir, name).exists()
                delete_key_pair(ec2, name, keys_dir)
                done["key_pairs"].append(name)
                done["key_files"] += [str(private_key_path(keys_dir, name))] if had_file else []
            for name in what["placement_groups"]:
                placement.delete(ec2, name)
                done["placement_groups"].append(name)
        except botocore.exceptions.ClientError as exc:  # DependencyViolation: try again next time
            kinds = ("security_groups", "key_pairs", "placement_groups")
            rest = [x for k in kinds for x in what[k] if x not in done[k]]
            done["left"].append(f"{', '.join(rest)} ({error_code(exc)})")
        if iam is not None:
            done["instance_roles"] = _remove_roles(iam, what.get("instance_roles", []), done["left"])
        removed[run] = done
    return removed


def _remove_roles(iam, names: list[str], left: list[str]) -> list[str]:
    """Delete each instance role of ``names`` (aws/iam.delete_run_role); return those removed, and
    add "name (code)" to ``left`` for each that IAM refused."""
    from . import iam as roles

    done = []
    for name in names:
        try:
            roles.delete_run_role(iam, name)
            done.append(name)
        except (botocore.exceptions.ClientError, ValueError) as exc:
            left.append(f"{name} ({error_code(exc) or type(exc).__name__})")
    return done
