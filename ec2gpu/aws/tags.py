"""Tags: the tool's identity for every resource it creates (no local state is needed to find them)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import UsageError

RUN = "ec2gpu:run"
OWNER = "ec2gpu:owner"
#: the user id (STS GetCallerIdentity's UserId = ${aws:userid}: aws/runstore.user_id) of whoever made a
#: run role or a detached run's secret: docs/iam-policy.json lets a user pass only roles, and read
#: only secrets, tagged with their own id, and the boundary holds a role to its own user's runs
USER = "ec2gpu:user"
NAME = "Name"
CLUSTER = "ec2gpu:cluster"  # the cluster's name, on every node of a multi-node run, pool or standing cluster
IDLE = "ec2gpu:idle"  # a standing instance's idle rule: "stop 1800" or "down 3600" (IdleRule)
MAX_RUNTIME = "ec2gpu:max-runtime"  # minutes: `start` schedules the shutdown again (runs/standing/stopstart.py)
NODE = "ec2gpu:node"  # the node's index in its cluster (0 hosts the torchrun rendezvous)
#: every tag ec2gpu may put on one instance or its volume (aws/instances.run_request, tag_nodes):
#: a several-node run's with an idle rule and a max runtime carries them all
INSTANCE_TAGS = (RUN, OWNER, NAME, CLUSTER, NODE, MAX_RUNTIME, IDLE)
#: EC2's tags per resource; those whose key starts with aws: (Auto Scaling's aws:autoscaling:groupName)
#: do not count (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions)
MAX_TAGS = 50
#: a task's labels (SkyPilot's resources.labels: tags of its instances and volumes): what EC2's
#: limit leaves once ec2gpu's own are counted, all of them, as on a several-node run
MAX_LABELS = MAX_TAGS - len(INSTANCE_TAGS)


#: a name the user gives (--name, a task's name): safe in tags, file names, an ssh_config Host
#: line and a shell word, as it is (letters, digits, then also . _ -; 63 characters at most).
#: Python's ``$`` also matches before a final newline: match it with ``re.fullmatch`` (pydantic's
#: ``pattern`` in tasks/spec.py, a Rust regex, reads ``$`` as the end of the text)
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a tag value read back (a cluster node adds -K): fullmatch


def safe(value: str | None) -> bool:
    """Whether a tag value read from EC2 may go into an ssh_config, a hint or a shell string as it
    is. Anyone who can tag resources in the account can set one, so it is never trusted (pure)."""
    if not value:
        return False
    return _SAFE.fullmatch(value) is not None  # "x\n" would split an ssh_config line


def check_name(name: str, flag: str = "--name") -> str:
    """``name`` if all of it matches NAME_RE (a final newline too: it would split an ssh_config Host
    line); else UsageError naming the allowed characters."""
    if re.fullmatch(NAME_RE, name) is None:
        raise UsageError(f"{flag} {name!r} is not a safe name",
                         "use letters, digits, '.', '_' and '-' (starting with a letter or digit), 63 at most")
    return name


#: an EC2 tag key or value: letters (any script), digits, spaces and _ . : / = + - @; keys 1-128
#: characters, values at most 256; keys starting with aws: are AWS's
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions)
_TAG_TEXT = re.compile(r"[\w .:/=+\-@]*")
_TAG_BAD = re.compile(r"[^\w .:/=+\-@]")


def tag_value(value: str) -> str:
    """``value`` (an owner, a run's name) as every service ec2gpu tags accepts a tag value (pure):
    characters outside letters, digits, spaces and ``_ . : / = + - @`` become "_", 256 at most.
    EC2 takes any character; IAM, SSM and S3 refuse the others (an owner such as ``DOMAIN\\user``
    or ``O'Brien``): botocore's models give IAM's tagValueType and SSM's TagValue the pattern
    ``[\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*``, 256 at most, and S3 answers InvalidTag
    (https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketTagging.html)."""
    return _TAG_BAD.sub("_", value or "")[:256]


def check_label(key: str, value: str) -> None:
    """A task's label (SkyPilot's resources.labels) as an EC2 tag (pure). Raises ValueError for a key
    or value EC2 refuses, and for a key of AWS's (aws:) or ec2gpu's own (ec2gpu:, Name)."""
    if not (1 <= len(key) <= 128) or len(value) > 256 or not _TAG_TEXT.fullmatch(key) or not _TAG_TEXT.fullmatch(value):
        raise ValueError(f"label {key[:60]!r}: {value[:60]!r}: an EC2 tag has a key of 1-128 and a value of at most "
                         "256 letters, digits, spaces and _ . : / = + - @")
    if key.lower().startswith(("aws:", "ec2gpu:")) or key == NAME:
        raise ValueError(f"label {key[:60]!r}: aws:, ec2gpu: and Name are not a task's to set")


def tags(run_id: str, owner: str, name: str) -> list[dict[str, Any]]:
    """The three tags every resource of a run carries, as an EC2 Tags list."""
    return [{"Key": RUN, "Value": run_id}, {"Key": OWNER, "Value": owner}, {"Key": NAME, "Value": name}]


def tag_spec(resource_type: str, run_id: str, owner: str, name: str) -> dict[str, Any]:
    """One TagSpecifications entry for ``resource_type`` (instance, volume, security-group, key-pair)."""
    return {"ResourceType": resource_type, "Tags": tags(run_id, owner, name)}


def run_filters(run_id: str | None = None, *more: dict[str, Any]) -> list[dict[str, Any]]:
    """Describe* ``Filters`` for what the tool tagged (the ec2gpu:run key), of one run when
    ``run_id`` is given, and ``more`` (pure). EC2's and Auto Scaling's Describe calls take the same
    ``tag-key`` and ``tag:KEY`` filters."""
    filters = [{"Name": "tag-key", "Values": [RUN]}, *more]
    if run_id:
        filters.append({"Name": f"tag:{RUN}", "Values": [run_id]})
    return filters


def as_dict(tag_list: list[dict[str, Any]] | None) -> dict[str, str]:
    """EC2's [{'Key': k, 'Value': v}] as {k: v}."""
    return {t["Key"]: t["Value"] for t in tag_list or []}


class Tagged(Protocol):
    """What ``answers_to`` reads of a resource aws/ has typed (aws/instances.Instance): its id and
    its tags ({key: value}). A Protocol, so that this module, which instances.py imports, imports
    nothing of it."""

    @property
    def id(self) -> str: ...

    @property
    def tags(self) -> dict[str, str]: ...


def answers_to(resource: Tagged | dict[str, Any], name: str, keys: tuple[str, ...] = (NAME,)) -> bool:
    """Whether a resource (an aws/instances.Instance: its id; or a described security group or
    key pair: its tags only) is called ``name``: its id, or the value of one of its tags ``keys``
    (Name by default; RUN and CLUSTER where a run or a cluster may be named too) (pure). The one
    way every command finds an instance by what the user calls it."""
    if isinstance(resource, dict):
        rid, tg = resource.get("InstanceId"), as_dict(resource.get("Tags"))
    else:
        rid, tg = resource.id, resource.tags
    return bool(name) and (name == rid or name in (tg.get(k) for k in keys))


@dataclass(frozen=True)
class IdleRule:
    """--idle-stop / --idle-down: the instance stops (``action`` "stop") or terminates ("down")
    itself after ``seconds`` without a job, an SSH connection or a busy GPU (ami/idle-watch.sh)."""

    action: str  # "stop" | "down"
    seconds: int

    @property
    def check_seconds(self) -> int:
        """How often the instance looks (s): every 30 s, more often for a rule under 2 minutes."""
        return max(2, min(30, self.seconds // 4))

    def tag(self) -> str:
        """The ec2gpu:idle tag's value, e.g. "down 3600" (parse_idle_tag reads it back)."""
        return f"{self.action} {self.seconds}"


def parse_idle_tag(value: str | None) -> IdleRule | None:
    """The IdleRule an ec2gpu:idle tag holds, or None (no tag, or one not written by ``tag``) (pure)."""
    action, _, seconds = (value or "").partition(" ")
    return IdleRule(action, int(seconds)) if action in ("stop", "down") and seconds.isdigit() else None
