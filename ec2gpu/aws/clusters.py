"""Standing clusters in AWS: their members (found by the ec2gpu:cluster tag) and their scale.

A cluster is N instances of one launch, numbered by the tags ec2gpu:node and Name NAME-K
(instances.tag_nodes); `ec2gpu launch --nodes N --name NAME` makes one, `ec2gpu scale NAME M`
resizes it. Running a job on the members is runs/ (standing/hosts.py, execute/engine.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import botocore.exceptions

from .. import words
from ..errors import AwsError, CapacityError, UsageError
from . import capacity, images, instances, sweep
from . import tags
from .session import Client, describe, error_code

if TYPE_CHECKING:
    from ..settings import Settings
    from .session import Aws


def members(ec2: Client, name: str) -> list[instances.Instance]:
    """The pending/running instances of cluster ``name`` (tag ec2gpu:cluster), in node order."""
    found = [i for i in sweep.find_instances(ec2, states=["pending", "running"]) if i.tags.get(tags.CLUSTER) == name]
    return sorted(found, key=lambda i: i.node or 0)


def scale(aws: Aws, settings: Settings, name: str, target: int, max_runtime_minutes: int,
          log: Callable[[str], None] = lambda msg: None,
          pin: Callable[[list[instances.Instance]], object] = lambda described: None) -> dict[str, Any]:
    """Grow or shrink standing cluster ``name`` to ``target`` nodes; return {cluster, added,
    removed (instance ids), nodes (how many it has now)}.

    New nodes copy node 0's type, market, AMI, key pair, security group, subnet (so its zone),
    placement group and idle rule, get the next node indices and end themselves
    ``max_runtime_minutes`` minutes after boot; once they run, ``pin(described)`` is called with
    their descriptions (the CLI pins each one's host key under its instance id, checked against
    its console output, as `launch` does: runs/standing/hosts.pin_all). Shrinking terminates the
    highest indices (node 0 hosts the rendezvous and always stays). Raises UsageError for an
    unknown cluster or a target below 1, CapacityError/AwsError when EC2 refuses the new nodes;
    what ``pin`` or the wait raises (RemoteError for a host key the console does not list,
    WaitTimeout, KeyboardInterrupt) after the added nodes are terminated again.
    """
    from dataclasses import replace

    if target < 1:
        raise UsageError("a cluster needs at least 1 node", "to remove it entirely: ec2gpu down NAME")
    nodes = members(aws.ec2, name)
    if not nodes:
        raise UsageError(f"no running cluster named {name!r}", "start one with `ec2gpu launch --nodes N --name NAME`")
    current, added, removed = len(nodes), [], []
    if target > current:
        head = nodes[0]
        tg = head.tags
        image = images.described(aws.ec2, ImageIds=[head.image_id])[0]
        spec = instances.LaunchSpec(
            run_id=tg[tags.RUN], owner=tg.get(tags.OWNER, settings.owner), name=name, instance_type=head.type,
            image_id=head.image_id or "", root_device_name=image.get("RootDeviceName", "/dev/sda1"),
            key_name=head.key_name or "", security_group_id=head.security_group_ids[0],
            spot=head.market == "spot", root_volume_gib=settings.root_volume_gib,
            max_runtime_minutes=max_runtime_minutes, subnet_id=head.subnet_id,
            placement_group=head.placement_group, cluster=name,
            idle=instances.parse_idle_tag(tg.get(tags.IDLE)))  # new nodes keep the rule
        spec = replace(spec, count=target - current)
        try:
            new = capacity.run_instances(aws.client("ec2", fail_fast=True), instances.run_request(spec))
        except botocore.exceptions.ClientError as exc:
            err = CapacityError if error_code(exc) in capacity.NEXT_ZONE | capacity.LIMITS else AwsError
            raise err(f"could not add {words.count(target - current, 'node')} to {name}: {describe(exc)}",
                      "try again later, or a smaller target")
        added = [i.id for i in new]
        try:
            last = max(i.node or 0 for i in nodes)
            added = [i.id for i in instances.tag_nodes(aws.ec2, new, name, first_index=last + 1)]
            log(f"launched {', '.join(added)}; waiting until they run")
            pin(instances.wait_running(aws.ec2, added))
        except BaseException:  # a node nobody can reach safely, or a stop half-way: not left behind
            log(f"terminating {', '.join(added)}: they did not become usable nodes")
            try:
                instances.terminate(aws.ec2, added)
            except Exception as exc:  # noqa: BLE001 - said with the fix; the first error is the one raised
                log(f"could not terminate them ({type(exc).__name__}: {exc}); they may still run: "
                    f"`aws ec2 terminate-instances --instance-ids {' '.join(added)}`")
            raise
    elif target < current:
        removed = [i.id for i in nodes[target:]]
        log(f"terminating {', '.join(removed)}")
        instances.terminate(aws.ec2, removed)
    return {"cluster": name, "added": added, "removed": removed, "nodes": len(members(aws.ec2, name))}
