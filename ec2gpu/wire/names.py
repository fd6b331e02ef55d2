"""The names a detached run is known by on every side: its run id, its user id, its prefix in the
run store, a key inside that prefix, its Auto Scaling group.

Standard library only, and no import of the package: shipped flat beside the detached agent
(runs/detached/launch.AGENT_FILES), which imports it as ``names``, and imported by the controller as
``ec2gpu.wire.names`` (aws/runstore.py builds every key from these), so the agent and the run store
cannot disagree on what a run id or a user id is.
"""
from __future__ import annotations

import re

#: a run id as runs/provision/pipeline.new_run_id makes it: UTC date, time, 4 hex digits ([0-9],
#: not \d: Python's \d also matches other scripts' digits)
RUN_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{4}")
#: a caller's user id, as STS GetCallerIdentity's UserId and the policy variable ${aws:userid} give it
#: (the same value: https://docs.aws.amazon.com/STS/latest/APIReference/API_GetCallerIdentity.html):
#: an IAM user's unique id (AIDA...), a role session's role id and session name (AROA...:NAME), a
#: federated user's account and name (ACCOUNT:NAME), the root user's account id
#: (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html#principaltable).
#: A session name is [\w+=,.@-]{2,64} (https://docs.aws.amazon.com/STS/latest/APIReference/API_AssumeRole.html);
#: "," is left out here: the run's role and secrets carry the id as a tag, and an IAM or SSM tag value
#: holds letters, digits, spaces and _ . : / = + - @ only (https://docs.aws.amazon.com/IAM/latest/APIReference/API_Tag.html,
#: https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_Tag.html). No "/", "*", "?" or "$":
#: a prefix made from it is one user's, and matches nothing else in an IAM pattern.
USER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+=.@:-]{0,127}")
#: where every run's objects live, each user's under runs/USER_ID/
RUNS = "runs/"
#: a detached run's Auto Scaling group is GROUP_PREFIX + its run id (aws/groups.name_of)
GROUP_PREFIX = "ec2gpu-"
#: the task's workdir, packed, under the run's prefix (what a replacement instance pulls)
WORKDIR = "workdir.tar.gz"
#: the local file_mounts sources under the run's prefix: ``mounts/N.tar.gz`` (a directory) or ``mounts/N`` (a file)
MOUNTS = "mounts/"


class Refused(ValueError):
    """Input that breaks the contract (a run id, a spec, a record, an archive): nothing of it is used."""


def check_run_id(run_id: object) -> str:
    """``run_id`` when all of it reads YYYYmmdd-HHMMSS-xxxx (RUN_ID), so it has no '/', '..' or
    other text that leaves its prefix; else Refused."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise Refused(f"not a run id: {str(run_id)[:80]!r}")
    return run_id


def check_user(user: object) -> str:
    """``user`` when all of it is a user id (USER_ID: no '/', '*' or '..'), else Refused."""
    if not isinstance(user, str) or not USER_ID.fullmatch(user):
        raise Refused(f"not a user id: {str(user)[:80]!r}")
    return user


def run_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/``: where everything of the run is kept (pure). Refused for a value
    that is not a user id or a run id."""
    return f"{RUNS}{check_user(user)}/{check_run_id(run_id)}/"


def safe_rel(rel: str) -> str | None:
    """``rel`` as a relative path of plain names ('a/b'), or None when it is absolute, empty, has
    '..', '.' or empty parts, a backslash or a NUL."""
    if not rel or rel.startswith("/") or "\0" in rel or "\\" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return rel
