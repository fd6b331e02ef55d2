"""Tags: the tool's identity for every resource it creates (no local state is needed to find them)."""
from __future__ import annotations

RUN = "ec2gpu:run"
OWNER = "ec2gpu:owner"
NAME = "Name"
CLUSTER = "ec2gpu:cluster"  # the cluster's name, on every node of a multi-node run or standing cluster
NODE = "ec2gpu:node"  # the node's index in its cluster (0 hosts the torchrun rendezvous)


def tags(run_id: str, owner: str, name: str) -> list[dict]:
    """The three tags every resource of a run carries, as an EC2 Tags list."""
    return [{"Key": RUN, "Value": run_id}, {"Key": OWNER, "Value": owner}, {"Key": NAME, "Value": name}]


def tag_spec(resource_type: str, run_id: str, owner: str, name: str) -> dict:
    """One TagSpecifications entry for ``resource_type`` (instance, volume, security-group, key-pair)."""
    return {"ResourceType": resource_type, "Tags": tags(run_id, owner, name)}


def as_dict(tag_list: list[dict] | None) -> dict[str, str]:
    """EC2's [{'Key': k, 'Value': v}] as {k: v}."""
    return {t["Key"]: t["Value"] for t in tag_list or []}
