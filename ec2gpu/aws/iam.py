"""The run's own instance role: S3 access to its file_mounts' prefixes only, never the user's keys.

A task whose ``file_mounts`` copy from S3 (or write back to a bucket) gets an IAM role made for its
run alone: ``ec2gpu-RUN_ID`` under the path ``/ec2gpu/``, trusted by EC2 only, with one inline policy
(``s3_policy``) and an instance profile of the same name; the instance reads the role's temporary
credentials from its metadata service
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/iam-roles-for-amazon-ec2.html). The role and
its profile carry the run's tags (tags.py) and the region the run is in (``REGION``: IAM is global,
so a sweep of one region must not take the role of a run in another), and are removed with the run
(``delete_run_role``; `ec2gpu cleanup` finds what is left with ``find_run_roles``).

The S3 actions and their resources: the Service Authorization Reference for Amazon S3
(https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html): GetObject,
PutObject and AbortMultipartUpload on objects (``arn:aws:s3:::BUCKET/KEY``; PutObject also covers a
multipart upload's Create/UploadPart/Complete calls), ListBucket (ListObjectsV2, HeadBucket) and
GetBucketLocation on buckets (``arn:aws:s3:::BUCKET``); ListBucket's ``s3:prefix`` condition key
limits which prefixes may be listed
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/amazon-s3-policy-keys.html).

A detached run's role (issue 30) gets iam_detached.detached_policy instead (or ``combined`` with the
file_mounts policy): its own run's prefix ``runs/USER_ID/RUN_ID/`` of the run bucket, and the end of
its own Auto Scaling group, nothing else; the permissions boundary docs/iam-instance-boundary.json
(iam_boundary.py) holds every run role to the same, through the role's own ``ec2gpu:run`` and
``ec2gpu:user`` tags (docs/security.md, "A detached run's instance reaches only its own run").
Every run role is tagged ``ec2gpu:user`` with its maker's user id (``${aws:userid}``:
aws/runstore.user_id), and docs/iam-policy.json lets a user pass (iam:PassRole, to launch an
instance with it) only a role tagged with their own.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import botocore.exceptions

from . import tags
from .runstore import BUCKET_PREFIX, HANDOVER, check_user_id, prefix as run_prefix
from .session import Client, Item, error_code

_T = TypeVar("_T")

PATH = "/ec2gpu/"  # every role and instance profile of the tool lives under this IAM path
POLICY_NAME = "ec2gpu-s3"  # the role's one inline policy
#: the region of the run a role belongs to (IAM is global; the run's EC2 resources are not)
REGION = "ec2gpu:region"
#: the role's trust policy: EC2 may assume it for an instance, nothing else may
TRUST = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
#: the aggregate size of a role's inline policies, not counting white space
#: (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html)
MAX_POLICY_CHARS = 10_240

#: S3 general purpose bucket names (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html):
#: 3-63 characters, lowercase letters, digits, dots and hyphens, a letter or digit at each end ...
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
#: ... and none of these reserved prefixes and suffixes
_RESERVED_START = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_END = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
#: IAM role names: 64 characters at most, letters, digits and +=,.@_-
#: (https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateRole.html)
_ROLE_NAME = re.compile(r"[\w+=,.@-]{1,64}", re.ASCII)
#: characters with a meaning in an IAM Resource or StringLike value, written as IAM's fixed policy
#: variables so that an S3 key holding them is matched literally and never widens the grant
#: (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html, special characters)
_IAM_SPECIAL = {"*": "${*}", "?": "${?}", "$": "${$}"}
#: IAM's "missing" and "refused" codes (https://docs.aws.amazon.com/IAM/latest/APIReference/CommonErrors.html)
GONE = "NoSuchEntity"
REFUSED = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})


# --- the S3 policy of file_mounts ----------------------------------------------------------------

def check_bucket(bucket: str) -> str:
    """``bucket`` if S3 allows the name for a general purpose bucket (pure); ValueError otherwise."""
    if (not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket) or ".." in bucket or _IP.fullmatch(bucket)
            or bucket.startswith(_RESERVED_START) or bucket.endswith(_RESERVED_END)):
        raise ValueError(f"{str(bucket)[:70]!r} is not an S3 bucket name (3-63 lowercase letters, digits, dots and "
                         "hyphens, a letter or digit at each end: "
                         "https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)")
    return bucket


def _literal(text: str) -> str:
    """``text`` with IAM's wildcard and variable characters escaped (``_IAM_SPECIAL``; pure)."""
    return "".join(_IAM_SPECIAL.get(c, c) for c in text)


def _covers(k: str, p: str) -> bool:
    """Whether the grant of prefix ``k`` holds prefix ``p`` (pure): "team" holds "team" and
    "team/x", never "teamwork" (a prefix is a folder or one object's key, as s3files.py reads it)."""
    return k == "" or p == k or p.startswith(k if k.endswith("/") else k + "/")


def _patterns(p: str) -> list[str]:
    """The IAM patterns of prefix ``p`` (pure): "" and "dir/" -> "dir/*"; "team" -> "team" (the
    object itself) and "team/*" (the folder), never "team*", which would take "team-b/"."""
    return [f"{_literal(p)}*"] if p == "" or p.endswith("/") else [_literal(p), f"{_literal(p)}/*"]


def _merged(entries: Iterable[tuple[str, object]]) -> dict[str, list[str]]:
    """{bucket: prefixes} of (bucket, prefix) ``entries``: buckets checked, duplicates merged, and a
    prefix dropped when a shorter one of the same bucket already covers it (pure)."""
    by_bucket: dict[str, set[str]] = {}
    for bucket, prefix in entries:
        if not isinstance(prefix, str):
            raise ValueError(f"s3://{bucket}: the prefix must be a string, not {type(prefix).__name__}")
        if check_bucket(bucket).startswith(BUCKET_PREFIX):  # the run store: every run's data and agent code
            raise ValueError(f"s3://{bucket} is ec2gpu's own bucket ({BUCKET_PREFIX}*): a file_mounts role never "
                             "reaches it (a detached run's role reaches its own run there: detached_policy)")
        by_bucket.setdefault(bucket, set()).add(prefix)
    out = {}
    for bucket, prefixes in sorted(by_bucket.items()):
        kept: list[str] = []
        for p in sorted(prefixes, key=lambda s: (len(s), s)):
            if not any(_covers(k, p) for k in kept):
                kept.append(p)
        out[bucket] = sorted(kept)
    return out


def s3_policy(reads: list[tuple[str, str]], writes: list[tuple[str, str]],
              keys: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The role's inline policy (pure): read access to the ``reads`` prefixes, read and write access
    to the ``writes`` ones, and nothing else. Each entry is (bucket, key prefix); "" is the whole bucket.
    ``keys``: {bucket: the KMS key its default encryption names (SSE-KMS: storage.bucket_keys)}: the
    role may use that key through S3 for that bucket's objects (``key_statements``).

    Returns an IAM policy document {"Version": "2012-10-17", "Statement": [...]} with, in order:
    "Read": s3:GetObject on ``arn:aws:s3:::BUCKET/PREFIX`` and ``BUCKET/PREFIX/*`` (``PREFIX*`` for a
    prefix ending in / or empty: _patterns) for every read and write entry;
    "Write" (only with writes): s3:AbortMultipartUpload and s3:PutObject on those of the writes;
    "List1", "List2", ...: one per bucket, s3:ListBucket on ``arn:aws:s3:::BUCKET`` with
    ``{"StringLike": {"s3:prefix": [the same patterns]}}`` (no condition when a prefix is "");
    "Locate": s3:GetBucketLocation on the buckets; "ReadKeys" / "WriteKeys" (``key_statements``) for
    the buckets of ``keys``. Duplicates are merged, a prefix another of the
    same bucket covers is dropped, and ``*``, ``?`` and ``$`` in a prefix are written as IAM's
    ``${*}``, ``${?}``, ``${$}`` (matched literally). Actions and resource types:
    https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html.

    Raises ValueError for a bucket name S3 does not allow, one of ec2gpu's own buckets
    (runstore.BUCKET_PREFIX: the run store, whose objects are every run's outputs and every
    detached run's agent code), when there is nothing to allow, or when the policy is over IAM's
    10,240 characters for a role's inline policies.
    """
    read, write = _merged(list(reads) + list(writes)), _merged(writes)
    if not read:
        raise ValueError("s3_policy: no bucket to allow")

    def objects(by_bucket: dict[str, list[str]]) -> list[str]:
        return [f"arn:aws:s3:::{b}/{x}" for b, prefixes in by_bucket.items() for p in prefixes for x in _patterns(p)]

    statements: list[dict[str, Any]] = [{"Sid": "Read", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": objects(read)}]
    if write:
        statements.append({"Sid": "Write", "Effect": "Allow", "Action": ["s3:AbortMultipartUpload", "s3:PutObject"],
                           "Resource": objects(write)})
    for n, (bucket, prefixes) in enumerate(read.items(), 1):
        listing: dict[str, Any] = {"Sid": f"List{n}", "Effect": "Allow", "Action": ["s3:ListBucket"],
                   "Resource": f"arn:aws:s3:::{bucket}"}
        if "" not in prefixes:
            listing["Condition"] = {"StringLike": {"s3:prefix": [x for p in prefixes for x in _patterns(p)]}}
        statements.append(listing)
    statements.append({"Sid": "Locate", "Effect": "Allow", "Action": ["s3:GetBucketLocation"],
                       "Resource": [f"arn:aws:s3:::{b}" for b in read]})
    statements += key_statements({b: k for b, k in (keys or {}).items() if b in read}, set(write))
    policy = {"Version": "2012-10-17", "Statement": statements}
    size = len(json.dumps(policy, separators=(",", ":")))
    if size > MAX_POLICY_CHARS:
        raise ValueError(f"s3_policy: {size} characters, over IAM's {MAX_POLICY_CHARS} for a role's inline policies "
                         "(name fewer prefixes, or one shared prefix)")
    return policy



#: a KMS key as IAM names it in a Resource: its ARN (arn:PARTITION:kms:REGION:ACCOUNT:key/ID)
_KEY_ARN = re.compile(r"arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]{1,128}")
_KEY_ID = re.compile(r"(mrk-)?[A-Za-z0-9-]{1,128}")
_ALIAS = re.compile(r"(arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:)?(alias/[A-Za-z0-9/_-]{1,250})")


def key_statements(keys: Mapping[str, str], writes: set[str]) -> list[dict[str, Any]]:
    """The statements that let a run role use the KMS keys of SSE-KMS buckets (pure): ``keys`` is
    {bucket: the key S3 names in its default encryption, GetBucketEncryption's KMSMasterKeyID: a key
    ARN, a key id or an alias}; the buckets of ``writes`` are written too. A GetObject of an SSE-KMS
    object needs kms:Decrypt on its key, a PutObject kms:GenerateDataKey (and kms:Decrypt for a
    multipart upload): https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html
    (permissions). "ReadKeys" (kms:Decrypt) and "WriteKeys" (kms:Decrypt, kms:GenerateDataKey),
    each only through S3 (kms:ViaService) and for those buckets' objects (S3's encryption context,
    kms:EncryptionContext:aws:s3:arn: the object's ARN, or the bucket's with S3 Bucket Keys);
    a key named by alias is matched by kms:ResourceAliases
    (https://docs.aws.amazon.com/kms/latest/developerguide/conditions-kms.html). Raises ValueError
    for a key S3 cannot have named."""
    out: list[dict[str, Any]] = []
    for sid, actions, buckets in (("ReadKeys", ["kms:Decrypt"], sorted(set(keys) - writes)),
                                  ("WriteKeys", ["kms:Decrypt", "kms:GenerateDataKey"], sorted(set(keys) & writes))):
        arns, aliases = set(), set()
        for b in buckets:
            key = keys[b]
            alias = _ALIAS.fullmatch(key)
            if _KEY_ARN.fullmatch(key):
                arns.add(key)
            elif alias:
                aliases.add(alias.group(2))
            elif _KEY_ID.fullmatch(key):
                arns.add(f"arn:*:kms:*:*:key/{key}")
            else:
                raise ValueError(f"s3://{b}: {key[:80]!r} is not a KMS key S3 could name")
        context = {"kms:ViaService": "s3.*.amazonaws.com",
                   "kms:EncryptionContext:aws:s3:arn": [x for b in buckets for x in (f"arn:aws:s3:::{b}", f"arn:aws:s3:::{b}/*")]}
        if arns:
            out.append({"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": sorted(arns),
                        "Condition": {"StringLike": context}})
        if aliases:
            out.append({"Sid": sid + "ByAlias", "Effect": "Allow", "Action": actions, "Resource": "arn:*:kms:*:*:key/*",
                        "Condition": {"StringLike": context,
                                      "ForAnyValue:StringEquals": {"kms:ResourceAliases": sorted(aliases)}}})
    return out


def handover_policy(bucket: str, user: str, run_id: str) -> dict[str, Any]:
    """A run in the foreground's own hand-over objects (pure), for its role beside its file_mounts
    policy (``combined``): "HandOver", s3:PutObject and s3:AbortMultipartUpload on
    ``arn:aws:s3:::BUCKET/runs/USER_ID/RUN_ID/handover/*`` only (aws/runstore.handover_keys), so
    that its agent may sign again a hand-over URL S3 refuses once the controller's temporary
    credentials have ended (wire/handover_urls.py; issue 51, item 2). The permissions boundary
    already holds a run role to ``runs/${ec2gpu:user}/${ec2gpu:run}/*`` (iam_boundary.py). Raises
    ValueError for a bucket name S3 does not allow, UsageError for a user or run id of another form
    (runstore.prefix)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "HandOver", "Effect": "Allow", "Action": ["s3:AbortMultipartUpload", "s3:PutObject"],
         "Resource": f"arn:aws:s3:::{check_bucket(bucket)}/{run_prefix(user, run_id)}{HANDOVER}*"}]}


def combined(*policies: dict[str, Any]) -> dict[str, Any]:
    """One policy document holding the statements of ``policies`` in order (pure), for a run
    role's one inline policy: a detached run with S3 file_mounts gets ``iam_detached.detached_policy`` and
    ``s3_policy`` together. Raises ValueError when there is no policy, when two statements share a
    Sid, or when the result is over IAM's 10,240 characters for a role's inline policies."""
    if not policies:
        raise ValueError("combined: no policy")
    statements = [s for p in policies for s in p["Statement"]]
    sids = [s["Sid"] for s in statements if "Sid" in s]
    if len(sids) != len(set(sids)):
        raise ValueError(f"combined: statement ids repeat: {sorted(s for s in set(sids) if sids.count(s) > 1)}")
    policy = {"Version": "2012-10-17", "Statement": statements}
    size = len(json.dumps(policy, separators=(",", ":")))
    if size > MAX_POLICY_CHARS:
        raise ValueError(f"combined: {size} characters, over IAM's {MAX_POLICY_CHARS} for a role's inline policies")
    return policy


# --- the role ---------------------------------------------------------------------------------

def role_name(run_id: str) -> str:
    """The role's (and its instance profile's) name, ``ec2gpu-RUN_ID`` (pure). Raises ValueError
    when IAM would refuse it (64 characters at most, letters, digits and +=,.@_-)."""
    name = f"ec2gpu-{run_id}"
    if not run_id or not _ROLE_NAME.fullmatch(name):
        raise ValueError(f"run id {run_id[:80]!r} cannot name an IAM role (64 characters at most, letters, digits "
                         "and +=,.@_-)")
    return name


def run_tags(run_id: str, owner: str, name: str, region: str | None = None, *, user: str) -> list[dict[str, str]]:
    """The tags of a run's role and profile (pure): tags.tags' three, values made IAM-safe
    (``tags.tag_value``), ``REGION`` when given, and ``ec2gpu:user`` = ``user`` as it is (the caller's
    user id: the boundary reads it as ``${aws:PrincipalTag/ec2gpu:user}`` and docs/iam-policy.json
    compares it with ``${aws:userid}``, so it is never rewritten). Raises UsageError for a user id
    not of aws/runstore.USER_ID's form (which an IAM tag value holds)."""
    out = [{"Key": t["Key"], "Value": tags.tag_value(t["Value"])} for t in tags.tags(run_id, owner, name)]
    return (out + ([{"Key": REGION, "Value": tags.tag_value(region)}] if region else [])
            + [{"Key": tags.USER, "Value": check_user_id(user)}])


def _retry_gone(call: Callable[[], _T], sleep: Callable[[float], object], tries: int = 5) -> _T | None:
    """``call()``, again while IAM answers NoSuchEntity for what was made a moment ago (IAM is
    eventually consistent: https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html),
    waiting 0.5, 1, 2, 4 s; then the last error is raised."""
    for attempt in range(tries):
        try:
            return call()
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != GONE or attempt == tries - 1:
                raise
            sleep(min(4.0, 0.5 * 2 ** attempt))
    return None  # tries < 1: nothing called



def create_run_role(iam: Client, run_id: str, owner: str, policy: dict[str, Any], *, user: str,
                    region: str | None = None, boundary: str | None = None,
                    sleep: Callable[[float], object] = time.sleep) -> str:
    """Create the run's role and instance profile; return the profile's name (= the role's).

    The role ``ec2gpu-RUN_ID`` (``role_name``) under ``/ec2gpu/``, trusted by ec2.amazonaws.com only
    (``TRUST``; default session duration), tagged ``run_tags`` (ec2gpu:run, ec2gpu:owner, Name,
    ec2gpu:user = ``user``, the caller's user id: aws/runstore.user_id, and ec2gpu:region when
    ``region`` is given: pass the run's region, or a one-region sweep cannot tell whose it is), with
    ``policy`` as its inline policy ``ec2gpu-s3``; an instance profile of the same name, path and
    tags holding the role; then boto3's ``instance_profile_exists`` waiter. IAM
    calls: CreateRole, PutRolePolicy, CreateInstanceProfile, AddRoleToInstanceProfile (which needs
    iam:PassRole on the role), GetInstanceProfile; tags are given at creation (iam:TagRole,
    iam:TagInstanceProfile: https://docs.aws.amazon.com/IAM/latest/UserGuide/id_tags.html).

    ``boundary``: a permissions boundary ARN (``iam_boundary.boundary_arn``) the role gets; the user policy of
    docs/iam-policy.json refuses CreateRole without it.

    If anything fails half-way (an exception, Ctrl-C), what this call made is removed (never what
    existed before it: a role of the same name is EntityAlreadyExists, raised as it is) and the
    error is raised again. Raises ValueError for a run id that cannot name a role, UsageError for a
    user id that is not one (before anything is made), botocore's ClientError or WaiterError otherwise.
    """
    name = role_name(run_id)
    role_tags = run_tags(run_id, owner, name, region, user=user)
    made: list[str] = []
    try:
        iam.create_role(RoleName=name, Path=PATH, AssumeRolePolicyDocument=json.dumps(TRUST), Tags=role_tags,
                        Description=f"ec2gpu run {run_id}: its instance's S3 access (detached: its own group's end); "
                                    "removed with the run",
                        **({"PermissionsBoundary": boundary} if boundary else {}))
        made.append("role")
        _retry_gone(lambda: iam.put_role_policy(RoleName=name, PolicyName=POLICY_NAME,
                                                PolicyDocument=json.dumps(policy)), sleep)
        made.append("policy")
        iam.create_instance_profile(InstanceProfileName=name, Path=PATH, Tags=role_tags)
        made.append("profile")
        _retry_gone(lambda: iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name), sleep)
        made.append("in profile")
        iam.get_waiter("instance_profile_exists").wait(InstanceProfileName=name,
                                                       WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    except BaseException:
        _undo(iam, name, made)
        raise
    return name


def _undo(iam: Client, name: str, made: list[str]) -> None:
    """Remove what create_run_role made (``made``, in the order made), newest first; each step
    tried on its own and its failure swallowed (the caller raises the error that stopped it)."""
    steps = {"in profile": lambda: iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name),
             "profile": lambda: iam.delete_instance_profile(InstanceProfileName=name),
             "policy": lambda: iam.delete_role_policy(RoleName=name, PolicyName=POLICY_NAME),
             "role": lambda: iam.delete_role(RoleName=name)}
    for what in reversed(made):
        try:
            steps[what]()
        except Exception:  # noqa: BLE001 - best-effort; `ec2gpu cleanup` finds the rest by its path and tags
            pass


def _ok_if_gone(call: Callable[[], object]) -> bool:
    """``call()``; False when IAM says it is already gone (NoSuchEntity), True when done. Other
    errors are raised."""
    try:
        call()
        return True
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == GONE:
            return False
        raise


def delete_run_role(iam: Client, name: str, *, sleep: Callable[[float], object] = time.sleep) -> None:
    """Remove the role ``name`` and the instance profile of the same name completely, best-effort:
    the role out of every instance profile that holds it (and every role out of the profile
    ``name``), the profile ``name`` deleted, the role's inline policies deleted and managed ones
    detached, then the role deleted (DeleteConflict, IAM not yet seeing a removal, retried for
    about 10 s). Anything already gone (NoSuchEntity, at any step) counts as removed, so a second
    call is a no-op. Decided from error codes only.

    Every step is tried; then the first error is raised (botocore's ClientError). Raises ValueError,
    removing nothing, for a role or profile of that name outside the ``/ec2gpu/`` path (not the
    tool's). IAM: https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_manage_delete.html.
    """
    errors: list[BaseException] = []

    def attempt(call: Callable[..., object]) -> None:  # called with no argument; `...`: the lambdas below bind theirs as defaults
        try:
            _ok_if_gone(call)
        except botocore.exceptions.ClientError as exc:
            errors.append(exc)

    role = profile = None
    try:
        role = iam.get_role(RoleName=name)["Role"]
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) != GONE:
            errors.append(exc)
    try:
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) != GONE:
            errors.append(exc)
    for what in (role, profile):
        if what is not None and what.get("Path") != PATH:
            raise ValueError(f"{name} is not ec2gpu's (IAM path {what.get('Path')!r}, not {PATH!r}): not removed")

    holding: set[str] = set()
    if role is not None:
        try:
            pages = iam.get_paginator("list_instance_profiles_for_role").paginate(RoleName=name)
            holding = {p["InstanceProfileName"] for page in pages for p in page["InstanceProfiles"]}
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != GONE:
                errors.append(exc)
    for other in sorted(holding - {name}):  # not the tool's profile: only the role taken out of it
        attempt(lambda p=other: iam.remove_role_from_instance_profile(InstanceProfileName=p, RoleName=name))
    if profile is not None:
        for r in profile.get("Roles", []):
            attempt(lambda r=r: iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=r["RoleName"]))
        attempt(lambda: iam.delete_instance_profile(InstanceProfileName=name))

    if role is not None:
        try:
            inline = [p for page in iam.get_paginator("list_role_policies").paginate(RoleName=name)
                      for p in page["PolicyNames"]]
            attached = [p["PolicyArn"] for page in iam.get_paginator("list_attached_role_policies").paginate(
                RoleName=name) for p in page["AttachedPolicies"]]
        except botocore.exceptions.ClientError as exc:
            inline, attached = [], []
            if error_code(exc) != GONE:
                errors.append(exc)
        for p in inline:
            attempt(lambda p=p: iam.delete_role_policy(RoleName=name, PolicyName=p))
        for arn in attached:
            attempt(lambda arn=arn: iam.detach_role_policy(RoleName=name, PolicyArn=arn))
        for n in range(6):  # 0.5 + 1 + 2 + 4 + 4 s at most while IAM still sees a profile or policy
            try:
                _ok_if_gone(lambda: iam.delete_role(RoleName=name))
                break
            except botocore.exceptions.ClientError as exc:
                if error_code(exc) != "DeleteConflict" or n == 5:
                    errors.append(exc)
                    break
                sleep(min(4.0, 0.5 * 2 ** n))
    if errors:
        raise errors[0]


# --- finding them -----------------------------------------------------------------------------

def _tags(iam: Client, name: str) -> dict[str, str]:
    """The tags of role ``name`` ({} once it is gone). ListRoles does not return them."""
    try:
        pages = iam.get_paginator("list_role_tags").paginate(RoleName=name)
        return tags.as_dict([t for page in pages for t in page["Tags"]])
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == GONE:
            return {}
        raise


def _profile_tags(iam: Client, profile: Item) -> dict[str, str] | None:
    """The tags of an instance profile entry of ListInstanceProfiles (which need not return them:
    then GetInstanceProfile); None once it is gone."""
    if "Tags" in profile:
        return tags.as_dict(profile["Tags"])
    try:
        return tags.as_dict(iam.get_instance_profile(InstanceProfileName=profile["InstanceProfileName"])
                         ["InstanceProfile"].get("Tags"))
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == GONE:
            return None
        raise


def find_run_roles(iam: Client, run_id: str | None = None, owner: str | None = None, *,
                   region: str | None = None) -> list[dict[str, Any]]:
    """The tool's run roles, and its orphan instance profiles, optionally of one run, owner or region.

    Roles under ``/ec2gpu/`` (ListRoles with PathPrefix, paginated; their tags from ListRoleTags)
    that carry the ec2gpu:run tag; and instance profiles under ``/ec2gpu/`` that carry it and hold
    no role of those (the role is gone: an orphan profile, which ``delete_run_role`` removes by the
    same name). ``owner`` is compared as tagged (``tags.tag_value``); ``region`` keeps those tagged
    ``REGION`` with it (an untagged one is left out).

    Returns [{"name": role or profile name, "run_id", "owner", "region" ("" when untagged),
    "created": datetime (CreateDate), "kind": "role" | "instance_profile"}], roles first, each
    sorted by name. Raises botocore's ClientError (AccessDenied without iam:ListRoles,
    iam:ListRoleTags, iam:ListInstanceProfiles).
    """
    def wanted(tg: dict[str, str]) -> bool:
        return (bool(tg.get(tags.RUN)) and (run_id is None or tg.get(tags.RUN) == run_id)
                and (owner is None or tg.get(tags.OWNER) == tags.tag_value(owner))
                and (region is None or tg.get(REGION) == region))

    def row(name: str, tg: dict[str, str], created: datetime | None, kind: str) -> dict[str, Any]:
        return {"name": name, "run_id": tg.get(tags.RUN, ""), "owner": tg.get(tags.OWNER, ""), "region": tg.get(REGION, ""),
                "created": created, "kind": kind}

    roles = [r for page in iam.get_paginator("list_roles").paginate(PathPrefix=PATH) for r in page["Roles"]]
    found = []
    for r in sorted(roles, key=lambda r: r["RoleName"]):
        tg = tags.as_dict(r["Tags"]) if "Tags" in r else _tags(iam, r["RoleName"])
        if wanted(tg):
            found.append(row(r["RoleName"], tg, r.get("CreateDate"), "role"))
    role_names = {r["RoleName"] for r in roles}
    profiles = [p for page in iam.get_paginator("list_instance_profiles").paginate(PathPrefix=PATH)
                for p in page["InstanceProfiles"]]
    for p in sorted(profiles, key=lambda p: p["InstanceProfileName"]):
        if p["InstanceProfileName"] in role_names or any(r["RoleName"] in role_names for r in p.get("Roles", [])):
            continue  # its role is listed above: removing that removes this profile too
        ptg = _profile_tags(iam, p)
        if ptg is not None and wanted(ptg):
            found.append(row(p["InstanceProfileName"], ptg, p.get("CreateDate"), "instance_profile"))
    return found
