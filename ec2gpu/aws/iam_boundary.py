"""The account's permissions boundary for run roles: found, read, and checked against what a run role
needs and against what it must never reach.

docs/iam-instance-boundary.json is the boundary an administrator makes once (``BOUNDARY_COMMAND``);
with it, the user policy docs/iam-policy.json lets ec2gpu create roles only under that boundary
(https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html). Before a run
role is made, ``boundary_gaps`` says which of its actions the boundary would not allow, and
``reaches_other_runs`` which of its statements would let any run role of the account reach another
user's runs (runs/detached/launch.check_boundary; docs/security.md). The shipped boundary lets a
run role use a file_mounts bucket's KMS key (kms:Decrypt, kms:GenerateDataKey) only through S3 and
for those buckets' objects: an older one without it is a gap for a run whose bucket uses SSE-KMS
(aws/iam.key_statements).
"""
from __future__ import annotations

import json
from typing import Any

import botocore.exceptions

from .iam import GONE, PATH, REFUSED
from .iam_match import arn_pattern, listed, names_action, statements
from .runstore import BUCKET_PREFIX, partition
from .session import Client, error_code

#: the permissions boundary every run role gets when the account has it (docs/iam-instance-boundary.json,
#: made once by an administrator): with it, the user policy docs/iam-policy.json lets ec2gpu create
#: roles only under that boundary, so CreateRole + PutRolePolicy + PassRole cannot make a role that
#: may do more than S3 objects (https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html)
BOUNDARY_NAME = "ec2gpu-instance-boundary"
BOUNDARY_COMMAND = ("aws iam create-policy --path /ec2gpu/ --policy-name ec2gpu-instance-boundary "
                    "--policy-document file://docs/iam-instance-boundary.json")
#: how docs/iam-instance-boundary.json names a run role's user: its own ec2gpu:user tag
#: (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html#policy-vars-tags)
BOUNDARY_USER = "${aws:PrincipalTag/ec2gpu:user}"
BOUNDARY_RUN = "${aws:PrincipalTag/ec2gpu:run}"


def boundary_arn(iam: Client, account_id: str, region: str) -> str | None:
    """The ARN of the account's BOUNDARY_NAME policy under PATH, in ``region``'s partition
    (runstore.partition: arn:aws-cn:iam::... in China, arn:aws-us-gov:... in GovCloud, where an
    arn:aws: one is refused as malformed), or None when it has none (or these credentials may not
    read it: GetPolicy). Raises botocore's ClientError for other errors."""
    arn = f"arn:{partition(region)}:iam::{account_id}:policy{PATH}{BOUNDARY_NAME}"
    try:
        iam.get_policy(PolicyArn=arn)
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == GONE or error_code(exc) in REFUSED:
            return None
        raise
    return arn


def boundary_document(iam: Client, arn: str) -> dict[str, Any] | None:
    """The default version's document of the boundary ``arn`` (GetPolicy, GetPolicyVersion), or None
    when these credentials may not read it (refused) or it is not a JSON object. Raises botocore's
    ClientError for other errors."""
    from urllib.parse import unquote
    try:
        version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
        document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) in REFUSED:
            return None
        raise
    if isinstance(document, str):  # IAM's wire form: URL-encoded JSON (boto3 decodes it; moto may not)
        try:
            document = json.loads(unquote(document))
        except ValueError:
            return None  # not a document this can read: said as one it may not read
    return document if isinstance(document, dict) else None


def boundary_gaps(iam: Client, arn: str, policy: dict[str, Any]) -> list[str] | None:
    """The actions of ``policy`` (a role's inline policy) that the boundary ``arn``'s default
    version allows in no statement, sorted: a role under that boundary could not do them (an
    effective permission is in both its policies and its boundary:
    https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html). Actions
    are matched as IAM matches them (``*`` and ``?`` wildcards, case-insensitive; an Allow's
    NotAction allows what it does not name; a Deny's Action denies what it names, whatever its
    resources); resources and conditions are not compared otherwise (the shipped boundary's own
    resources are the account's to edit), but for one: a detached run's policy (its "RunObjects")
    under a boundary that names resources with ``BOUNDARY_RUN`` and none with ``BOUNDARY_USER`` (the
    shipped one from before the run store's per-user prefix, which reached ``runs/RUN_ID/``) gets
    the gap "s3:PutObject under runs/${aws:PrincipalTag/ec2gpu:user}/ ...".
    None when these credentials may not read the boundary's document (boundary_document).
    Raises botocore's ClientError for other errors."""
    document = boundary_document(iam, arn)
    return None if document is None else gaps_in(document, policy)


def gaps_in(document: dict[str, Any], policy: dict[str, Any]) -> list[str]:
    """``boundary_gaps`` of a boundary's ``document`` as read (pure)."""
    def allowed(action: str) -> bool:  # an Allow that names it (Action) or leaves it out (NotAction); no Deny
        allows = any(st.get("Effect") == "Allow" and names_action(st, action) for st in statements(document))
        denies = any(st.get("Effect") == "Deny" and "Action" in st and names_action(st, action)
                     for st in statements(document))
        return allows and not denies

    wanted = {a for st in statements(policy) if st.get("Effect") == "Allow" for a in listed(st.get("Action"))}
    gaps = sorted(a for a in wanted if not allowed(a.lower()))
    named = [r for st in statements(document) if st.get("Effect") == "Allow" for r in listed(st.get("Resource"))]
    if (any(st.get("Sid") == "RunObjects" for st in statements(policy)) and any(BOUNDARY_RUN in r for r in named)
            and not any(BOUNDARY_USER in r for r in named)):
        gaps.append(f"s3:PutObject under runs/{BOUNDARY_USER}/ (the run store's per-user prefix)")
    return gaps


def reaches_other_runs(document: dict[str, Any] | None, user: str, run_id: str, account: str) -> list[str]:
    """The statements of a boundary ``document`` (their Sids, else "statement N") that let a run
    role of run ``run_id`` made by ``user`` read or write another user's run in an ec2gpu-* bucket
    of ``account`` (pure): an Allow of s3:GetObject or s3:PutObject whose Resource, read with that
    role's tags for ``${aws:PrincipalTag/...}``, matches such an object, or whose NotResource leaves
    it out. docs/iam-instance-boundary.json holds a role to its own run's prefix, but its file_mounts
    statements name what an administrator writes for YOUR-FILE-MOUNTS-BUCKET: ``*`` or ``ec2gpu-*``
    there gives every run role of the account every user's runs, and IAM cannot deny "ec2gpu-*/runs/*
    but the role's own run" in one statement (a statement has a Resource or a NotResource, not both:
    https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_grammar.html).
    Conditions are not read: those the shipped boundary sets (s3:ResourceAccount, ec2:SourceInstanceARN)
    hold for any run role of the account on its instance. [] for None."""
    other = "AIDAEC2GPUANOTHERUSER" if user != "AIDAEC2GPUANOTHERUSER" else "AIDAEC2GPUYETANOTHER"
    probe = f"arn:aws:s3:::{BUCKET_PREFIX}{account}-us-east-1/runs/{other}/{run_id}/agent/detached.py"
    values = {"aws:PrincipalTag/ec2gpu:user": user, "aws:PrincipalTag/ec2gpu:run": run_id,
              "aws:PrincipalAccount": account}

    def covers(patterns: list[str]) -> bool:
        return any(rx is not None and rx.fullmatch(probe) for rx in (arn_pattern(p, values) for p in patterns))

    found = []
    for n, st in enumerate(statements(document)):
        if st.get("Effect") != "Allow" or not any(names_action(st, a) for a in ("s3:getobject", "s3:putobject")):
            continue
        if covers(listed(st.get("Resource"))) if "Resource" in st else not covers(listed(st.get("NotResource"))):
            found.append(str(st.get("Sid") or f"statement {n + 1}"))
    return found
