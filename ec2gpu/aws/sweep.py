"""Sweep: find everything carrying the tool's tags, and delete it (instances first).

A run's instance role (aws/iam.py) is found and removed too when an IAM client is given (``iam``):
IAM is global, so a sweep of one region takes only the roles tagged with that region, and an
untagged one only when its run still holds something there (``find_instance_roles``). A detached
run's Auto Scaling group and launch template (aws/groups.py) are found and removed when an Auto
Scaling client is given (``autoscaling``): the group before its instances, which it would
otherwise replace. A detached run's secrets (aws/parameters.py) are found and removed when an SSM
client is given (``ssm``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import AbstractSet, Any, Callable, cast

import botocore.exceptions

from . import baked, groups, parameters
from . import iam as roles  # as roles: ``iam`` is the IAM client here
from . import instances as inst
from . import placement
from . import tags
from . import network
from .session import Client, error_code

#: what a sweep reports through: one line at a time
Log = Callable[[str], None]

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


def find_instances(ec2: Client, run_id: str | None = None, name: str | None = None,
                   states: list[str] | None = None) -> list[inst.Instance]:
    """Instances tagged by the tool (optionally one run or Name), in ``states`` (default: live)."""
    filters = tags.run_filters(run_id, {"Name": "instance-state-name", "Values": states or LIVE_STATES})
    if name:
        filters.append({"Name": f"tag:{tags.NAME}", "Values": [name]})
    pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return [i for page in pages for i in inst.described(page["Reservations"])]


def find_security_groups(ec2: Client, run_id: str | None = None) -> list[dict[str, Any]]:
    """Security groups tagged by the tool (optionally one run)."""
    filters = tags.run_filters(run_id)
    pages = ec2.get_paginator("describe_security_groups").paginate(Filters=filters)
    return [g for page in pages for g in page["SecurityGroups"]]


def find_key_pairs(ec2: Client, run_id: str | None = None) -> list[dict[str, Any]]:
    """Key pairs tagged by the tool (optionally one run)."""
    filters = tags.run_filters(run_id)
    return cast("list[dict[str, Any]]", ec2.describe_key_pairs(Filters=filters)["KeyPairs"])


def runs_named(ec2: Client, name: str) -> set[str]:
    """The run ids whose resources answer to ``name`` (an instance id, a Name, run or cluster tag),
    found in every instance state (an interrupted spot instance is ``terminated`` and still listed
    by EC2 for a while) and on security groups and key pairs, which outlive their instances."""
    keys = (tags.NAME, tags.RUN, tags.CLUSTER)
    found = {i.run_id for i in find_instances(ec2, states=LIVE_STATES + ["terminated"]) if tags.answers_to(i, name, keys)}
    found |= {tags.as_dict(r.get("Tags")).get(tags.RUN) for r in find_security_groups(ec2) + find_key_pairs(ec2)
              if tags.answers_to(r, name, keys)}
    return {r for r in found if r}


def find_spot_requests(ec2: Client, run_id: str | None = None) -> list[dict[str, Any]]:
    """Open or active spot instance requests tagged by the tool (optionally one run)."""
    filters = tags.run_filters(run_id, {"Name": "state", "Values": ["open", "active"]})
    pages = ec2.get_paginator("describe_spot_instance_requests").paginate(Filters=filters)
    return [r for page in pages for r in page["SpotInstanceRequests"]]


def find_instance_roles(iam: Client, ec2: Client, run_id: str | None = None, runs_here: AbstractSet[str] = frozenset(),
                        log: Callable[[str], None] = lambda msg: None) -> list[dict[str, Any]]:
    """The run roles and orphan instance profiles (aws/iam.find_run_roles entries) that belong to
    ``ec2``'s region: all of one run's (``run_id``: run ids are unique), else those tagged
    ec2gpu:region with this region and the untagged ones of ``runs_here`` (runs that hold something
    in this region): never the role of a run that may be running in another region. Where these
    credentials may not list IAM roles (AccessDenied: a policy from before the instance roles)
    there are none, and ``log`` says so; other errors propagate (botocore's ClientError)."""
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


@dataclass(frozen=True)
class Kind:
    """One kind of resource ec2gpu creates: how a sweep finds it by the ec2gpu:run tag and removes
    it. ``key``: its name in inventories and reports (security_groups); ``label``: in messages;
    ``find(clients, run_id, log) -> rows`` ({"id", "run_id", "name", ...}); ``remove(clients, id,
    log)`` (the list of ids when ``batch``; raises botocore's ClientError, AwsError or WaitTimeout
    when it fails, and all it was given counts as left); ``after``: the kinds that must be gone first (else this one is
    not tried and is reported left); ``needs``: the client it works with besides EC2's ("iam", "ssm",
    "autoscaling": without it the kind is neither listed nor removed); ``refind``: below."""

    key: str
    label: str
    find: Callable[[Clients, str | None, Log], list[dict[str, Any]]]
    remove: Callable[[Clients, Any, Log], Any]
    after: tuple[str, ...] = ()
    batch: bool = False
    needs: str | None = None
    #: found again for the sweep's runs once its ``after`` kinds removed something (a snapshot is
    #: a bake's leftover only once its image is gone: baked.incomplete_snapshots)
    refind: bool = False


@dataclass
class Clients:
    """What a sweep works with: the region's EC2 client, an IAM client (None: roles are not
    touched), the folder of local private keys, and the seconds a security group's deletion may
    wait, in all, for its instances' network interfaces to go (DependencyViolation)."""

    ec2: Client  # boto3 clients: untyped
    iam: Client = None
    autoscaling: Client = None
    keys_dir: Path | None = None
    group_wait_s: float = 300.0
    group_deadline: float | None = None  # time.monotonic() by which the groups' wait ends (set at the first)
    ssm: Client = None
    #: the caller's user id (aws/runstore.user_id): only the secret parameters tagged with it are
    #: found (the ones docs/iam-policy.json lets the caller delete); None: every run's
    user: str | None = None


def _row(res: dict[str, Any], id_key: str, **extra: Any) -> dict[str, Any]:
    tg = tags.as_dict(res.get("Tags"))
    return {"id": res[id_key], "run_id": tg.get(tags.RUN, ""), "name": tg.get(tags.NAME, ""), **extra}


def _find_roles(c: Clients, run_id: str | None, log: Log, here: AbstractSet[str] = frozenset()) -> list[dict[str, Any]]:
    return [{"id": r["name"], "run_id": r["run_id"], "name": r["name"], "owner": r["owner"], "kind": r["kind"]}
            for r in find_instance_roles(c.iam, c.ec2, run_id, here, log)]


def _cancel_spot(c: Clients, ids: list[str], log: Log) -> list[str]:
    log(f"cancelling spot requests {', '.join(ids)}")
    c.ec2.cancel_spot_instance_requests(SpotInstanceRequestIds=ids)
    return list(ids)


def _terminate(c: Clients, ids: list[str], log: Log) -> list[str]:
    log(f"terminating {', '.join(ids)}")
    inst.terminate(c.ec2, ids)
    return list(ids)


def _delete_group(c: Clients, group_id: str, log: Log) -> None:
    if c.group_deadline is None:  # one wait shared by every group of the sweep
        c.group_deadline = time.monotonic() + c.group_wait_s
    log(f"deleting security group {group_id}")
    delete_security_group(c.ec2, group_id, timeout_s=max(0.0, c.group_deadline - time.monotonic()))


def _delete_role(c: Clients, name: str, log: Log) -> None:
    log(f"deleting instance role {name}")
    roles.delete_run_role(c.iam, name)


def _delete_key_pair(c: Clients, name: str, log: Log) -> None:
    log(f"deleting key pair {name}")
    # delete_everything always gives keys_dir; only inventory's Clients (which removes nothing) has None
    network.delete_key_pair(c.ec2, name, cast(Path, c.keys_dir))


def _find_groups(c: Clients, run_id: str | None, log: Log) -> list[dict[str, Any]]:
    """The run's Auto Scaling groups (aws/groups.find_groups), less those already being deleted
    (Status "Delete in progress": their instances are going with them); none where these
    credentials may not list groups, which ``log`` hears."""
    try:
        found = groups.find_groups(c.autoscaling, run_id)
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) not in _REFUSED:
            raise
        log(f"Auto Scaling groups not listed ({error_code(exc)}): autoscaling:DescribeAutoScalingGroups is in "
            "docs/iam-policy.json")
        return []
    return [_row(g, "AutoScalingGroupName", desired=g.get("DesiredCapacity"),
                 instances=[i["InstanceId"] for i in g.get("Instances", [])])
            for g in found if g.get("Status") != "Delete in progress"]


def _find_templates(c: Clients, run_id: str | None, log: Log) -> list[dict[str, Any]]:
    """The run's launch templates (aws/groups.find_templates), by id; none where these
    credentials may not list them, which ``log`` hears."""
    try:
        return [_row(t, "LaunchTemplateId", template_name=t.get("LaunchTemplateName"))
                for t in groups.find_templates(c.ec2, run_id)]
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) not in _REFUSED:
            raise
        log(f"launch templates not listed ({error_code(exc)}): ec2:DescribeLaunchTemplates is in docs/iam-policy.json")
        return []


def _delete_asg(c: Clients, name: str, log: Log) -> None:
    log(f"deleting Auto Scaling group {name} (and its instances)")
    groups.delete_group(c.autoscaling, name)


def _delete_template(c: Clients, template_id: str, log: Log) -> None:
    log(f"deleting launch template {template_id}")
    groups.delete_template(c.ec2, template_id=template_id)


def _find_parameters(c: Clients, run_id: str | None, log: Log) -> list[dict[str, Any]]:
    """A detached run's secret parameters (aws/parameters.find); none where these credentials may
    not list them, which ``log`` hears."""
    try:
        return parameters.find(c.ssm, run_id, c.user)
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) not in _REFUSED:
            raise
        log(f"secret parameters not listed ({error_code(exc)}): ssm:DescribeParameters is in docs/iam-policy.json")
        return []


def _delete_parameters(c: Clients, names: list[str], log: Log) -> list[str]:
    return parameters.delete(c.ssm, names, log)


def _delete_placement_group(c: Clients, name: str, log: Log) -> None:
    log(f"deleting placement group {name}")
    placement.delete(c.ec2, name)


def _kinds() -> tuple[Kind, ...]:
    """The registry, in the order a sweep removes: spot requests and instances first, then what
    they used. A new kind of resource (a launch template, an Auto Scaling group, a bucket policy)
    is one entry here: inventory, cleanup, down, a run's teardown and the ended runs' leftovers
    all follow it."""
    return (
        # first: a group replaces an instance terminated under it (ForceDelete ends its instances)
        Kind("auto_scaling_groups", "Auto Scaling group", _find_groups, _delete_asg, needs="autoscaling"),
        Kind("spot_requests", "spot requests",
             lambda c, run, log: [_row(r, "SpotInstanceRequestId", state=r["State"])
                                  for r in find_spot_requests(c.ec2, run)], _cancel_spot, batch=True),
        Kind("instances", "instances",
             lambda c, run, log: [{"id": i.id, "run_id": i.run_id or "", "name": i.name or "", "state": i.state,
                                   "instance_type": i.type} for i in find_instances(c.ec2, run)], _terminate, batch=True,
             after=("auto_scaling_groups",)),  # a group AWS would not delete replaces what is terminated under it
        Kind("security_groups", "security group",
             lambda c, run, log: [_row(g, "GroupId") for g in find_security_groups(c.ec2, run)],
             _delete_group, after=("instances",)),
        Kind("key_pairs", "key pair",
             lambda c, run, log: [_row(k, "KeyName") for k in find_key_pairs(c.ec2, run)],
             _delete_key_pair),
        # a bake's image not yet complete (Ctrl-C, a crash): never a complete one (`ec2gpu image rm`)
        Kind("images", "image",
             lambda c, run, log: [_row(i, "ImageId", state=i.get("State"))
                                  for i in baked.images(c.ec2, run, complete=False)],
             lambda c, image_id, log: baked.deregister(c.ec2, image_id, log), after=("instances",)),
        Kind("snapshots", "snapshot",  # after the images: EC2 refuses to delete a snapshot an image uses
             lambda c, run, log: [_row(x, "SnapshotId") for x in baked.incomplete_snapshots(c.ec2, run)],
             lambda c, snap_id, log: baked.delete_snapshots(c.ec2, [snap_id], log), after=("images",), refind=True),
        Kind("placement_groups", "placement group",
             lambda c, run, log: [_row(g, "GroupName") for g in placement.find(c.ec2, run, log)],
             _delete_placement_group, after=("instances",)),
        Kind("instance_roles", "instance role", _find_roles, _delete_role, after=("instances",), needs="iam"),
        Kind("launch_templates", "launch template", _find_templates, _delete_template,
             after=("auto_scaling_groups",)),
        # once nothing of the run can launch or run: a replacement's agent reads them at its start
        Kind("secret_parameters", "secret parameter", _find_parameters, _delete_parameters, batch=True,
             after=("auto_scaling_groups", "instances"), needs="ssm"),
    )


#: the error codes of a call these credentials may not make (aws/iam.REFUSED's)
_REFUSED = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})
KINDS = _kinds()
#: the kinds by key, for callers that name one
KIND = {k.key: k for k in KINDS}


def inventory(ec2: Client, run_id: str | None = None, log: Log = lambda msg: None,
              iam: Client = None, autoscaling: Client = None, ssm: Client = None,
              user: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Everything the tool created (or one run) that still exists in the client's region, by kind
    (``KINDS``, in removal order).

    Keys: instances (live states), spot_requests (open/active), security_groups, key_pairs,
    placement_groups, images and snapshots (of bakes that did not complete), and with an IAM
    client ``iam`` instance_roles (``find_instance_roles``: a role's ``id`` is its name, which is
    also its instance profile's; ``kind`` "role" or "instance_profile" for a profile whose role is
    gone); each entry has ``id``, ``run_id`` and ``name`` (from the tags) and, for instances,
    ``state``. Without ``iam`` there is no instance_roles key. With an Auto Scaling client
    ``autoscaling``, auto_scaling_groups (``desired``: its desired capacity, ``instances``: their
    ids); with an SSM client ``ssm``, secret_parameters (aws/parameters.find: ``id`` is the
    parameter's name, ``name`` the environment variable's; with ``user``, the caller's user id,
    only those tagged with it: another user's secrets are theirs to remove); launch_templates always. ``log``
    hears what could not be listed (placement groups where that API is unavailable, roles,
    groups, templates or parameters these credentials may not list).
    """
    c = Clients(ec2, iam, autoscaling, ssm=ssm, user=user)
    found = {k.key: k.find(c, run_id, log) for k in KINDS if k.needs is None or (k.needs != "iam" and
                                                                                  getattr(c, k.needs) is not None)}
    if iam is not None:
        here = frozenset({r["run_id"] for rows in found.values() for r in rows} - {""})
        found["instance_roles"] = _find_roles(c, run_id, log, here)
    return {k.key: found[k.key] for k in KINDS if k.key in found}


def delete_everything(ec2: Client, found: dict[str, list[dict[str, Any]]], keys_dir: Path | None,
                      log: Log = lambda msg: None, iam: Client = None, group_wait_s: float = 300.0,
                      on_failure: Callable[[str, list[str], str], object] | None = None,
                      autoscaling: Client = None, ssm: Client = None) -> dict[str, list[str]]:
    """Remove what ``inventory`` found (or any {kind key: rows with "id"}), kind by kind in
    ``KINDS`` order, best-effort: a resource AWS refuses is reported and the next one is tried; a
    kind whose ``after`` kinds are not all gone is not tried (a security group while its instances
    still run). Security groups wait up to ``group_wait_s`` seconds in all for their instances'
    network interfaces (DependencyViolation); instance roles need ``iam``, Auto Scaling groups
    ``autoscaling``, secret parameters ``ssm`` (without the client they are reported left). ``log``
    hears each step and each failure; ``on_failure(label, ids, why)`` each failure (``why``: the AWS error
    code, the exception's class, or what is still there).

    Returns {kind key: ids removed} for every kind in ``found``, and "left": ["ID (why)", ...] for
    what is still there (empty when everything went). Never raises for one resource.
    """
    c = Clients(ec2, iam, autoscaling, keys_dir, group_wait_s, ssm=ssm)
    removed: dict[str, list[str]] = {key: [] for key in found}
    left: dict[str, str] = {}  # id -> why
    for kind in KINDS:
        ids = [r["id"] for r in found.get(kind.key, [])]
        if kind.refind and any(removed.get(a) for a in kind.after):
            runs = sorted({str(r["run_id"]) for rows in found.values() for r in rows if r.get("run_id")})
            again = [r["id"] for run in runs for r in kind.find(c, run, log)]
            ids = list(dict.fromkeys(ids + [i for i in again if i not in removed.get(kind.key, [])]))
            removed.setdefault(kind.key, [])
        if not ids:
            continue
        if kind.needs is not None and getattr(c, kind.needs) is None:
            why = f"no {kind.needs} client given"
            left.update({i: why for i in ids})
            if on_failure:
                on_failure(kind.label, ids, why)
            continue
        blocked = _blocked(kind, ids, found, left)
        for label, held in _grouped(blocked).items():
            why = f"{label} still there"
            left.update({i: why for i in held})
            if on_failure:
                on_failure(kind.label, held, why)
        ids = [i for i in ids if i not in blocked]
        if ids:
            for batch in ([ids] if kind.batch else [[i] for i in ids]):
                try:
                    kind.remove(c, batch if kind.batch else batch[0], log)
                    removed[kind.key] += batch
                except Exception as exc:  # noqa: BLE001 - reported, and the next resource is tried
                    why = error_code(exc) or type(exc).__name__
                    log(f"could not remove the {kind.label} {', '.join(batch)} ({why})")
                    left.update({i: why for i in batch})
                    if on_failure:
                        on_failure(kind.label, batch, why)
    removed["left"] = [f"{i} ({why})" for i, why in left.items()]
    return removed


def _blocked(kind: Kind, ids: list[str], found: dict[str, list[dict[str, Any]]], left: dict[str, str]) -> dict[str, str]:
    """Of ``ids`` (of ``kind``), those an ``after`` kind of their own run still holds: id -> that
    kind's label (pure). A resource of the same run that could not go blocks it (one run's group
    that AWS keeps refusing stops the termination of that run's instances, which it would replace,
    not another run's); a row without a run id is blocked by anything left before it."""
    run_of = {r["id"]: r.get("run_id") or None for rows in found.values() for r in rows}
    stuck = {a: {run_of.get(r["id"]) for r in found.get(a, []) if r["id"] in left} for a in kind.after}
    out = {}
    for i in ids:
        run = run_of.get(i)
        label = next((KIND[a].label for a, runs in stuck.items()
                      if runs and (run is None or None in runs or run in runs)), None)
        if label:
            out[i] = label
    return out


def _grouped(blocked: dict[str, str]) -> dict[str, list[str]]:
    """{label: [ids]} of ``_blocked``'s answer, in its order (pure)."""
    out: dict[str, list[str]] = {}
    for i, label in blocked.items():
        out.setdefault(label, []).append(i)
    return out


def delete_security_group(ec2: Client, group_id: str, timeout_s: float = 300, delay_s: float = 3) -> None:
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


def delete_run(ec2: Client, run_id: str, keys_dir: Path, log: Log = lambda msg: None,
               iam: Client = None, autoscaling: Client = None, ssm: Client = None,
               user: str | None = None) -> dict[str, list[str]]:
    """Remove everything of one run (see ``delete_everything``; its instance role too with an IAM
    client ``iam``, its Auto Scaling group with ``autoscaling``, its secret parameters with
    ``ssm``: those tagged with ``user``, the caller's id, when given); returns the ids removed, by kind."""
    return delete_everything(ec2, inventory(ec2, run_id, log, iam, autoscaling, ssm, user), keys_dir, log, iam,
                             autoscaling=autoscaling, ssm=ssm)


#: EC2's StateReason code of an instance that its own OS shut down (`--max-runtime`, the idle rule):
#: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StateReason.html
SELF_SHUTDOWN = "Client.InstanceInitiatedShutdown"
#: A run's key pair this old (s) with no instance of the run listed at all is taken as left behind:
#: EC2 lists a terminated instance for about an hour after it ends
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/terminating-instances.html), and a run
#: launches its first instance seconds after it creates its key pair.
UNLISTED_AFTER_S = 2 * 3600


def ended_runs(described: list[inst.Instance], key_pairs: list[dict[str, Any]], runs: set[str], now: datetime,
               keep: AbstractSet[str] = frozenset()) -> dict[str, str]:
    """Of ``runs`` (run ids that hold a security group, key pair, placement group or instance role),
    those whose instances have all ended, each with why (pure): "ended itself" when every instance
    of the run in ``described`` (its instances, every state) is terminated and one of
    them by its own shutdown (SELF_SHUTDOWN); "no instance listed any more" when none is listed and
    the newest of its key pairs (``key_pairs``: anything with the run's Tags and a CreateTime, an
    instance role's too) is older than UNLISTED_AFTER_S at ``now``. Never one of ``keep`` (runs
    a controller may still be using: a spot run between an interruption and its replacement)."""
    by_run: dict[str, list[inst.Instance]] = {}
    for described_one in described:
        by_run.setdefault(described_one.run_id or "", []).append(described_one)
    created: dict[str | None, Any] = {}
    for k in key_pairs:
        run, at = tags.as_dict(k.get("Tags")).get(tags.RUN), k.get("CreateTime")
        if at:
            created[run] = max(created.get(run, at), at)
    out = {}
    for run in sorted(set(runs) - set(keep)):
        mine = by_run.get(run, [])
        if mine and all(i.state == "terminated" for i in mine) and any(i.state_reason_code == SELF_SHUTDOWN for i in mine):
            out[run] = "ended itself"
        elif not mine and run in created and (now - created[run]).total_seconds() > UNLISTED_AFTER_S:
            out[run] = "no instance listed any more"
    return out


def ended_leftovers(ec2: Client, keep: AbstractSet[str] = frozenset(), iam: Client = None,
                    autoscaling: Client = None) -> dict[str, dict[str, Any]]:
    """What runs whose instances have all ended left (``ended_runs``): run id -> {"why",
    "security_groups", "key_pairs", "placement_groups": their ids, and with an IAM client ``iam``
    "instance_roles": the names of its roles and orphan instance profiles (``find_instance_roles``;
    a role's creation dates its run as a key pair does)}. Never a run that still has an Auto
    Scaling group (found with ``autoscaling``): a detached run between a spot interruption and its
    replacement has no instance listed, and its template needs its security group, key pair and
    role for the next launch. Where the placement group API is unavailable, or these credentials
    may not list IAM roles, there are none of those (`cleanup` says so). Raises botocore errors."""
    held = {"security_groups": [(g, "GroupId") for g in find_security_groups(ec2)],
            "key_pairs": [(k, "KeyName") for k in find_key_pairs(ec2)],
            "placement_groups": [(g, "GroupName") for g in placement.find(ec2)]}
    if iam is not None:
        here = cast(set[str], {tags.as_dict(r.get("Tags")).get(tags.RUN) for found in held.values() for r, _ in found}
                    - {None, ""})
        held["instance_roles"] = [({"Tags": [{"Key": tags.RUN, "Value": r["run_id"]}], "Name": r["name"],
                                    "CreateTime": r["created"]}, "Name")
                                  for r in find_instance_roles(iam, ec2, runs_here=here)]
    runs = cast(set[str], {tags.as_dict(r.get("Tags")).get(tags.RUN) for found in held.values() for r, _ in found} - {None, ""})
    if not runs:
        return {}
    dated = [k for k, _ in held["key_pairs"] + held.get("instance_roles", [])]
    if autoscaling is not None:  # a detached run's group owns its run until the group is gone
        keep = set(keep) | {g["run_id"] for g in _find_groups(Clients(ec2, iam, autoscaling), None, lambda m: None)}
    ended = ended_runs(find_instances(ec2, states=LIVE_STATES + ["terminated"]), dated,
                       runs, datetime.now(timezone.utc), keep)
    return {run: {"why": why, **{kind: [r[key] for r, key in found if tags.as_dict(r.get("Tags")).get(tags.RUN) == run]
                                 for kind, found in held.items()}}
            for run, why in ended.items()}


def remove_leftovers(ec2: Client, found: dict[str, dict[str, Any]], keys_dir: Path,
                     iam: Client = None) -> dict[str, dict[str, list[str]]]:
    """Delete what ``ended_leftovers`` found, per run, best-effort (``delete_everything`` with no
    wait: a group whose ended instance's network interface lingers is left for the next command,
    and the run's key pair with it); instance roles only with an IAM client ``iam``. Returns run id
    -> {kind: ids removed ("instance_roles" only with ``iam``); "key_files": the local files
    deleted; "left": "ID (why)" for what AWS refused or still holds}. Never raises for one
    resource."""
    removed = {}
    for run, what in found.items():
        kinds = ["security_groups", "placement_groups"] + (["instance_roles"] if iam is not None else [])
        done = delete_everything(ec2, {k: [{"id": x} for x in what.get(k, [])] for k in kinds}, keys_dir, iam=iam,
                                 group_wait_s=0)
        pairs = what.get("key_pairs", [])  # the run's date (ended_runs): kept while one of its groups stays
        had_file = {n for n in pairs if network.private_key_path(keys_dir, n).exists()}
        if len(done["security_groups"]) < len(what.get("security_groups", [])):
            done["key_pairs"] = []
            done["left"] += [f"{n} (its security group is still there)" for n in pairs]
        else:
            more = delete_everything(ec2, {"key_pairs": [{"id": n} for n in pairs]}, keys_dir)
            done["key_pairs"], done["left"] = more["key_pairs"], done["left"] + more["left"]
        done["key_files"] = [str(network.private_key_path(keys_dir, n)) for n in done["key_pairs"] if n in had_file]
        removed[run] = done
    return removed
