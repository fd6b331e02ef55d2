"""The run store: one S3 bucket per account and region, ``ec2gpu-<account>-<region>``, holding each
detached run's durable state (`ec2gpu run --detach`: runs/detached/) under ``runs/<user_id>/<run_id>/``.

The bucket is made on first need (``ensure``) and checked by ``ec2gpu doctor`` (``check``). ec2gpu
keeps it:

- private: S3 Block Public Access, all four settings
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/access-control-block-public-access.html);
- encrypted at rest: default encryption SSE-S3
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/default-bucket-encryption.html; SSE-S3 and
  not KMS, so a run's instance role needs no KMS permission);
- TLS only: a bucket policy that denies every ``s3:*`` request whose ``aws:SecureTransport`` is
  false, as S3's security best practices advise
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html);
- bounded in time and cost: a lifecycle rule that expires objects under ``runs/`` after
  ``run_store_expire_days`` days (settings.py; S3 counts from each object's creation and rounds to
  the next midnight UTC) and aborts multipart uploads still incomplete a day after they began, whose
  parts are billed but invisible
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lifecycle-mgmt.html,
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpu-abort-incomplete-mpu-lifecycle-config.html);
- tagged ``ec2gpu:owner`` (the user whose run made it; the bucket is shared by the account's users).

Its name is predictable, so another account could take it first, or take it after the user
deleted it: every request that names the bucket carries ``ExpectedBucketOwner`` (the account in its
name), and S3 answers 403 when another account owns it
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucket-owner-condition.html).

Key layout (``prefix`` and the helpers below are its one definition): ``runs/<user_id>/<run_id>/``
holds ``status.json``, ``logs/``, ``outputs/``, ``checkpoints/``, ``workdir.tar.gz`` and the rest of
one run. ``user_id`` is the caller's, as STS GetCallerIdentity's ``UserId`` gives it, which is the
value of the policy variable ``${aws:userid}`` (``user_id`` below): the user policy
docs/iam-policy.json lets each user of the account read, write and list ``runs/${aws:userid}/``
only, and a run's role reaches ``runs/<its ec2gpu:user tag>/<its ec2gpu:run tag>/`` only
(docs/iam-instance-boundary.json). A run id is checked against the format
``runs/provision/pipeline.new_run_id`` makes (``YYYYmmdd-HHMMSS-xxxx``) and a user id against
``USER_ID``, so no value can name a key outside its run's prefix. Every command finds a run under
its caller's own prefix: the run id is all a user gives.

Runs made before the prefix held the user id lie under ``runs/<run_id>/``: ec2gpu no longer lists
or reads them (under docs/iam-policy.json their owner may not either), and the lifecycle rule,
whose prefix is ``runs/`` still, expires them with the rest.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

import boto3.exceptions
import botocore.exceptions

from ..errors import AwsError, UsageError
from ..wire import bounded_json
from . import tags as T
from .session import Client, Item, Log, error_code

# --- names and keys (pure) --------------------------------------------------------------------

#: an AWS account id: 12 digits ([0-9], not \d: Python's \d also matches other scripts' digits)
_ACCOUNT = re.compile(r"[0-9]{12}")
#: a region code: us-east-1, eu-central-2, ap-southeast-4, us-gov-west-1, cn-north-1
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
#: S3's general purpose bucket names: 3-63 lowercase letters, digits, '.', '-', a letter or digit at
#: each end (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_STORE = re.compile(r"ec2gpu-([0-9]{12})-([a-z]{2}(?:-[a-z]+)+-[0-9]{1,2})")
#: a run id as runs/provision/pipeline.new_run_id makes it: UTC date, time, 4 hex digits
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
#: where every run's objects live, each user's under runs/USER_ID/; the lifecycle rule expires what is under it
RUNS = "runs/"
#: the start of every run store's name (``bucket_name``): no file_mounts entry may name a bucket
#: with it (tasks/mounts.OWN_PREFIX, aws/iam.s3_policy), whatever the account or region
BUCKET_PREFIX = "ec2gpu-"

STATUS = "status.json"
LOGS = "logs/"
OUTPUTS = "outputs/"
CHECKPOINTS = "checkpoints/"
WORKDIR = "workdir.tar.gz"
CANCEL = "cancel"
SPEC = "spec.json"
AGENT = "agent/"
HANDOVER = "handover/"  # a run in the foreground whose controller was lost (agent/agent.py: hand_over)
#: "pool": an array's element table and element logs (pool/attempt.py), the driver's RUN_DIR/pool
HANDOVER_NAMES = {"outputs": "outputs.tar.gz", "log": "job.log", "pool": "pool.tar.gz", "status": "status.json"}
#: the longest a presigned URL made with SigV4 lasts, 7 days; one made with temporary credentials
#: lasts no longer than they do (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-presigned-url.html)
PRESIGN_MAX_S = 7 * 24 * 3600


def bucket_name(account_id: str, region: str) -> str:
    """The run store of ``account_id`` (12 digits) in ``region`` (a code such as us-east-1):
    ``ec2gpu-<account>-<region>`` (pure). Raises UsageError for an account id or region of another
    form, or a name S3 would refuse (more than 63 characters)."""
    if not isinstance(account_id, str) or not _ACCOUNT.fullmatch(account_id):
        raise UsageError(f"run store: {str(account_id)[:40]!r} is not an AWS account id (12 digits)",
                         "the account comes from the credentials (sts get-caller-identity)")
    if not isinstance(region, str) or not _REGION.fullmatch(region):
        raise UsageError(f"run store: {str(region)[:40]!r} is not an AWS region code",
                         "use a region code such as us-east-1 or eu-west-1 (--region)")
    name = f"{BUCKET_PREFIX}{account_id}-{region}"
    if not _BUCKET.fullmatch(name):
        raise UsageError(f"run store: {name!r} is longer than the 63 characters S3 allows in a bucket name",
                         "use a region code such as us-east-1 or eu-west-1 (--region)")
    return name


def _expected_owner(bucket: str) -> dict[str, str]:
    """``{"ExpectedBucketOwner": account}`` for a run store's name (the account in it), else {}."""
    m = _STORE.fullmatch(bucket)
    return {"ExpectedBucketOwner": m.group(1)} if m else {}


def partition(region: str) -> str:
    """The ARN partition of ``region`` (pure): aws-cn for cn-*, aws-us-gov for us-gov-*, else aws
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference-arns.html)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def check_run_id(run_id: str) -> str:
    """``run_id`` when all of it has new_run_id's form ``YYYYmmdd-HHMMSS-xxxx`` (8 digits, 6 digits,
    4 lowercase hex digits), so it has no '/', '..' or anything else that leaves its prefix (pure).
    Raises UsageError otherwise."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise UsageError(f"{str(run_id)[:80]!r} is not a run id",
                         "a run id looks like 20260125-103000-1a2b (ec2gpu runs --remote lists them)")
    return run_id


def user_id(identity: Item) -> str:
    """The caller's user id from STS GetCallerIdentity's answer (``identity``: aws/session.Aws.
    check_credentials), its ``UserId``: the value ``${aws:userid}`` takes in the caller's requests,
    so the prefix made here is the one docs/iam-policy.json lets the caller reach (pure). Raises
    UsageError for a value of another form (``check_user_id``)."""
    return check_user_id(identity.get("UserId") if isinstance(identity, dict) else None)


def check_user_id(user: object) -> str:
    """``user`` when all of it has USER_ID's form (pure). Raises UsageError otherwise: for a role
    session name with ",", which no tag can hold, naming it."""
    if isinstance(user, str) and USER_ID.fullmatch(user):
        return user
    if isinstance(user, str) and USER_ID.fullmatch(user.replace(",", "_")):
        raise UsageError(f"your AWS user id {user!r} holds a ',', which an AWS tag cannot hold: ec2gpu tags a run's "
                         "role and secrets with it, so that only your runs reach them",
                         "use a role session name without ',' (aws sts assume-role --role-session-name), "
                         "or an IAM user's credentials")
    raise UsageError(f"{str(user)[:80]!r} is not an AWS user id",
                     "it comes from the credentials (sts get-caller-identity's UserId)")


def user_prefix(user: str) -> str:
    """``runs/<user>/``: where every run of the user ``user`` (a USER_ID) is kept (pure). Raises
    UsageError for a value that is not a user id (check_user_id)."""
    return f"{RUNS}{check_user_id(user)}/"


def prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/``: where everything of the run is kept (pure). Raises UsageError
    for a value that is not a user id (check_user_id) or a run id (check_run_id)."""
    return f"{user_prefix(user)}{check_run_id(run_id)}/"


def status_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/status.json``: the run's status record (put_status, get_status)."""
    return prefix(user, run_id) + STATUS


def logs_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/logs/``: the job's logs, uploaded by the agent."""
    return prefix(user, run_id) + LOGS


def outputs_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/outputs/``: what the job wrote to $EC2GPU_OUTPUT_DIR (`ec2gpu fetch RUN`)."""
    return prefix(user, run_id) + OUTPUTS


def checkpoints_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/checkpoints/``: the job's checkpoints, which a replacement instance resumes from."""
    return prefix(user, run_id) + CHECKPOINTS


def cancel_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/cancel``: present once `ec2gpu cancel` asked the run's agent to stop."""
    return prefix(user, run_id) + CANCEL


def spec_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/spec.json``: what the agent runs (runs/detached/launch.spec_document)."""
    return prefix(user, run_id) + SPEC


def agent_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/agent/``: the instance-side files the boot script fetches."""
    return prefix(user, run_id) + AGENT


def handover_keys(user: str, run_id: str) -> dict[str, str]:
    """{"outputs", "log", "pool", "status": the key under ``runs/<user>/<run_id>/handover/``}: where the
    agent of a run in the foreground puts what its lost controller did not collect (pure)."""
    return {what: prefix(user, run_id) + HANDOVER + name for what, name in HANDOVER_NAMES.items()}


def presign_puts(s3: Client, bucket: str, keys: dict[str, str], expires_s: int) -> dict[str, str]:
    """{name: a presigned URL that lets its holder PUT that one key of ``keys`` and nothing else}
    (SigV4, signed here with the caller's credentials; no AWS call), lasting ``expires_s`` seconds,
    at most PRESIGN_MAX_S."""
    expires = max(1, min(int(expires_s), PRESIGN_MAX_S))
    return {what: s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires)
            for what, key in keys.items()}


def put_cancel(s3: Client, bucket: str, user: str, run_id: str) -> None:
    """Write the run's cancel object (``cancel_key``): the agent, polling for it, stops the job and
    saves its outputs. Raises UsageError for a bad user or run id, AwsError for S3 errors."""
    _put(s3, "put_object", bucket, Key=cancel_key(user, run_id), Body=b"cancelled by `ec2gpu cancel`\n")


def put_file(s3: Client, bucket: str, key: str, path: str | os.PathLike[str]) -> None:
    """Upload the file at ``path`` to ``key`` (boto3's managed transfer: multipart when large).
    Raises AwsError for S3 errors."""
    try:
        s3.upload_file(str(path), bucket, key, ExtraArgs=_expected_owner(bucket))
    except boto3.exceptions.S3UploadFailedError as exc:
        raise AwsError(f"run store: s3://{bucket}/{key}: upload failed ({exc})", "see docs/iam-policy.json") from None


def put_bytes(s3: Client, bucket: str, key: str, body: bytes, content_type: str | None = None) -> None:
    """Write ``body`` to ``key`` in one PutObject (these bytes exactly: a detached run's agent files
    and spec.json, whose hashes its user data holds; S3 takes up to 5 GB so:
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/upload-objects.html). Raises AwsError for
    S3 errors."""
    _put(s3, "put_object", bucket, Key=key, Body=body, **({"ContentType": content_type} if content_type else {}))


def put_json(s3: Client, bucket: str, key: str, document: Any) -> None:
    """Write ``document`` as JSON to ``key``. Raises AwsError for S3 errors."""
    _put(s3, "put_object", bucket, Key=key, Body=json.dumps(document, indent=2).encode(),
         ContentType="application/json")


def workdir_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/workdir.tar.gz``: the task's workdir, as a replacement instance pulls it."""
    return prefix(user, run_id) + WORKDIR


# --- the bucket's settings (pure request builders) --------------------------------------------

#: Block Public Access: all four on
PUBLIC_ACCESS_BLOCK: dict[str, bool] = {"BlockPublicAcls": True, "IgnorePublicAcls": True,
                                        "BlockPublicPolicy": True, "RestrictPublicBuckets": True}
ENCRYPTION: Item = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}
TLS_SID = "DenyInsecureTransport"
RULE_ID = "ec2gpu-runs-expire"
ABORT_DAYS = 1


def tls_deny_statement(bucket: str, region: str = "us-east-1") -> Item:
    """The bucket policy statement that denies every S3 action on ``bucket`` and its objects to any
    principal when the request did not come over TLS (``aws:SecureTransport`` false), as
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html advises (pure)."""
    arn = f"arn:{partition(region)}:s3:::{bucket}"
    return {"Sid": TLS_SID, "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [arn, f"{arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}


def bucket_policy(bucket: str, region: str = "us-east-1", current: Item | None = None) -> Item:
    """The bucket policy (JSON as a dict, pure): ``current``'s statements (a parsed policy already
    on the bucket, kept: the user's own) but one with TLS_SID, then tls_deny_statement."""
    kept = [s for s in _listed((current or {}).get("Statement", []))
            if not (isinstance(s, dict) and s.get("Sid") == TLS_SID)]
    return {"Version": "2012-10-17", "Statement": [*kept, tls_deny_statement(bucket, region)]}


def expire_rule(expire_days: int) -> Item:
    """The lifecycle rule (pure): objects under ``runs/`` expire ``expire_days`` days after they
    were written; multipart uploads under it still incomplete ABORT_DAYS after they began are
    aborted and their parts deleted. Raises UsageError for ``expire_days`` < 1 (S3's minimum)."""
    return {"ID": RULE_ID, "Filter": {"Prefix": RUNS}, "Status": "Enabled",
            "Expiration": {"Days": _days(expire_days)},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": ABORT_DAYS}}


def lifecycle(expire_days: int, current: list[Item] | None = None) -> Item:
    """The lifecycle configuration (pure): ``current``'s rules (kept: the user's own) but one with
    RULE_ID, then expire_rule. A PutBucketLifecycleConfiguration replaces the whole configuration,
    so the others are sent again."""
    kept = [r for r in current or [] if r.get("ID") != RULE_ID]
    return {"Rules": [*kept, expire_rule(expire_days)]}


def _days(expire_days: int) -> int:
    if not isinstance(expire_days, int) or isinstance(expire_days, bool) or expire_days < 1:
        raise UsageError(f"run_store_expire_days must be a whole number of days, at least 1 (got {expire_days!r})",
                         "fix it in EC2GPU_RUN_STORE_EXPIRE_DAYS or ec2gpu.toml")
    return expire_days


_TAG_BAD = re.compile(r"[^\w .:/=+\-@]")  # S3 tag values: letters, digits, spaces and _ . : / = + - @


def owner_tag(owner: str) -> str:
    """``owner`` as an S3 tag value (pure): other characters become "_", 256 at most."""
    return _TAG_BAD.sub("_", owner or "")[:256] or "unknown"


# --- ensure and check -------------------------------------------------------------------------

#: the codes S3 answers for a bucket or a configuration that is not there
MISSING_BUCKET = frozenset({"404", "NoSuchBucket", "NotFound"})
FORBIDDEN = frozenset({"403", "AccessDenied", "Forbidden"})


def _absent(code: str | None) -> bool:
    """A missing bucket, object or configuration: NoSuch* (NoSuchBucketPolicy,
    NoSuchLifecycleConfiguration, ...), *NotFound* (ServerSideEncryptionConfigurationNotFoundError) or 404."""
    return bool(code) and (code in MISSING_BUCKET or str(code).startswith("NoSuch") or "NotFound" in str(code))


def _missing(s3: Client, bucket: str, key: str, code: str | None) -> bool:
    """Whether a GetObject or HeadObject of ``key`` that failed with ``code`` found no such object (or
    bucket). S3 answers a missing key 404 only to a caller allowed s3:ListBucket on the bucket, and
    403 AccessDenied to any other (GetObject's and HeadObject's "Permissions":
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html). docs/iam-policy.json and a
    run's role allow s3:ListBucket on the run store only with an ``s3:prefix`` condition under their
    own prefix, and AWS does not document which ``s3:prefix``, if any, that check sees; so a 403 is
    told from a refusal by ListObjectsV2 with the key itself as its Prefix, which those same
    statements allow (ListBucket's ``s3:prefix`` is the request's Prefix:
    https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html): the key
    not listed is a missing object; listed, or the listing refused too, is a refusal (False). The
    key is the first one listed when it exists: no other key with that prefix sorts before it."""
    if _absent(code):
        return True
    if code not in FORBIDDEN:
        return False
    try:
        got = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1, **_expected_owner(bucket))
    except botocore.exceptions.ClientError:
        return False
    return not any(o.get("Key") == key for o in got.get("Contents", []) if isinstance(o, dict))


def exists(s3: Client, bucket: str) -> bool:
    """Whether ``bucket`` exists and is this account's (GetBucketLocation with ExpectedBucketOwner);
    creates nothing. Not HeadBucket: it is authorised as s3:ListBucket, which the user policy
    (docs/iam-policy.json) grants on the run store only for a listing under the caller's own
    prefix (an ``s3:prefix`` condition, which a HeadBucket, carrying no prefix, never meets), so
    that no user lists another's runs; GetBucketLocation is authorised as s3:GetBucketLocation on
    the bucket (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketLocation.html). Raises
    UsageError on 403 (another account owns the name, or these credentials may not read it),
    AwsError for other errors."""
    try:
        s3.get_bucket_location(Bucket=bucket, **_expected_owner(bucket))
        return True
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if code in MISSING_BUCKET:
            return False
        if code in FORBIDDEN:
            raise UsageError(f"run store: s3://{bucket} exists but is not this account's, or these credentials "
                             "may not read it (403)",
                             "allow s3:GetBucketLocation on it (docs/iam-policy.json); a name another AWS account "
                             "took cannot be used: see docs/security.md, 'The run store'") from None
        raise AwsError(f"run store: s3://{bucket}: GetBucketLocation failed ({code})", "try again") from None


def ensure(s3: Client, account_id: str, region: str, owner: str, expire_days: int, log: Log = lambda line: None) -> str:
    """The run store of ``account_id`` in ``region``, made on first need and returned by name.

    Idempotent: a bucket that exists keeps its data, and each setting of the module docstring that
    differs (Block Public Access, SSE-S3, the TLS-deny statement, the lifecycle rule with
    ``expire_days`` (>= 1), an ``ec2gpu:owner`` tag when it has none) is set again; the user's own
    policy statements, lifecycle rules and tags are kept. ``log`` hears one line per change.

    A setting these credentials may not make (403) is left as it is, and ``log`` hears one line
    naming them: docs/iam-policy.json gives a user no s3:PutBucketPolicy, PutLifecycleConfiguration,
    PutEncryptionConfiguration or PutBucketPublicAccessBlock on the run store, since whoever may set
    its bucket policy may grant themselves every user's runs (a bucket policy that names a principal
    of the account allows what it grants whatever that principal's own policies say:
    https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html), and
    whoever may set its lifecycle may expire them. An administrator's credentials set them (their
    first run, detached or with a hand-over, calls this); `ec2gpu doctor` says what the bucket lacks.
    Raises UsageError for a bad account, region or ``expire_days``, or a name another account owns
    (BucketAlreadyExists, or 403 on GetBucketLocation); AwsError for other S3 errors.
    """
    bucket = bucket_name(account_id, region)
    days = _days(expire_days)
    if not exists(s3, bucket):
        _create(s3, bucket, region)
        log(f"run store: created s3://{bucket} in {region}")
    done, refused = _apply(s3, bucket, region, owner, days)
    for what in done:
        log(f"run store: s3://{bucket}: {what}")
    if refused:
        log(f"run store: s3://{bucket}: not set, these credentials may not: {'; '.join(refused)} (docs/iam-policy.json "
            "leaves the bucket's settings to an administrator, whose credentials set them at their next run; "
            "`ec2gpu doctor` says what the bucket lacks)")
    return bucket


def _create(s3: Client, bucket: str, region: str) -> None:
    req: dict[str, Any] = {"Bucket": bucket}  # ACLs off: S3's default for new buckets since April 2023
    if region != "us-east-1":  # us-east-1 refuses its own name as a LocationConstraint
        req["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        s3.create_bucket(**req)
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if code == "BucketAlreadyOwnedByYou":  # made meanwhile by another command of this account
            return
        if code == "BucketAlreadyExists":
            raise UsageError(f"run store: the bucket name {bucket} is taken by another AWS account",
                             "S3 bucket names are global and this one is ec2gpu's for this account and region: "
                             "detached runs cannot use it (runs in the foreground still work); docs/security.md, "
                             "'The run store'") from None
        raise AwsError(f"run store: could not create s3://{bucket} ({code})", "see docs/iam-policy.json") from None


def _get(s3: Client, op: str, bucket: str) -> Item | None:
    """What the boto3 method ``op`` (a Get* call) answers for ``bucket``, with
    ExpectedBucketOwner; None when that configuration (or the bucket) is absent. Raises AwsError
    for other errors."""
    try:
        got: Item = getattr(s3, op)(Bucket=bucket, **_expected_owner(bucket))
        return got
    except botocore.exceptions.ClientError as exc:
        if _absent(error_code(exc)):
            return None
        raise AwsError(f"run store: s3://{bucket}: {_api(op)} failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None


def _api(op: str) -> str:
    """S3's name of a boto3 method: get_bucket_policy -> GetBucketPolicy."""
    return "".join(w.title() for w in op.split("_"))


class Conflict(Exception):
    """A conditional write found the object changed since it was read (S3's 412
    PreconditionFailed, 409 ConditionalRequestConflict for a write under way, or 404 NoSuchKey for
    IfMatch on an object deleted since:
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html)."""


#: the same as agent/detached.py's (which ships alone, boto3 and the standard library only; a test compares them)
CONFLICT_CODES = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404")
CONFLICT_TRIES = 5  # end_status: reads and writes of status.json before a conflict is raised


class Forbidden(AwsError):
    """S3 refused a request for want of permission (403 AccessDenied: FORBIDDEN)."""


def _put(s3: Client, op: str, bucket: str, **kw: Any) -> None:
    """``op`` on ``bucket`` (ExpectedBucketOwner). Raises Conflict where a conditional write
    (``IfMatch``, ``IfNoneMatch`` in ``kw``) does not hold, Forbidden (an AwsError) for 403,
    AwsError for other S3 errors."""
    try:
        getattr(s3, op)(Bucket=bucket, **_expected_owner(bucket), **kw)
    except botocore.exceptions.ClientError as exc:
        if ("IfMatch" in kw or "IfNoneMatch" in kw) and error_code(exc) in CONFLICT_CODES:
            raise Conflict(f"s3://{bucket}/{kw.get('Key')} changed since it was read ({error_code(exc)})") from None
        error = Forbidden if error_code(exc) in FORBIDDEN else AwsError
        raise error(f"run store: s3://{bucket}: {_api(op)} failed ({error_code(exc)})",
                    "see docs/iam-policy.json") from None


#: S3 keeps a bucket policy to 20 KB (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-iam-policies.html)
MAX_POLICY_BYTES = 64 * 1024


def _policy_of(got: Item | None) -> Item | None:
    """The bucket policy GetBucketPolicy answered, parsed; None when absent or not a JSON object."""
    try:
        policy = bounded_json.loads((got or {}).get("Policy") or "null", max_bytes=MAX_POLICY_BYTES)
    except ValueError:
        return None
    return policy if isinstance(policy, dict) else None


def _apply(s3: Client, bucket: str, region: str, owner: str, days: int) -> tuple[list[str], list[str]]:
    """Set each setting of ``bucket`` that differs from ec2gpu's; returns (what was set, what these
    credentials were refused: 403)."""
    done: list[str] = []
    refused: list[str] = []

    def put(op: str, what: str, **kw: Any) -> None:
        try:
            _put(s3, op, bucket, **kw)
            done.append(what)
        except Forbidden:
            refused.append(what)
    bpa = (_get(s3, "get_public_access_block", bucket) or {}).get("PublicAccessBlockConfiguration", {})
    if any(bpa.get(k) is not True for k in PUBLIC_ACCESS_BLOCK):
        put("put_public_access_block", "Block Public Access on (all four)", PublicAccessBlockConfiguration=PUBLIC_ACCESS_BLOCK)
    if _encryption_problem(_get(s3, "get_bucket_encryption", bucket)):
        put("put_bucket_encryption", "default encryption SSE-S3", ServerSideEncryptionConfiguration=ENCRYPTION)
    policy = _policy_of(_get(s3, "get_bucket_policy", bucket))
    if not any(_denies_plain_http(s, bucket) for s in _listed((policy or {}).get("Statement", []))):
        put("put_bucket_policy", "bucket policy: requests without TLS denied",
            Policy=json.dumps(bucket_policy(bucket, region, policy)))
    rules = (_get(s3, "get_bucket_lifecycle_configuration", bucket) or {}).get("Rules", [])
    ours = [r for r in rules if r.get("ID") == RULE_ID]
    if not ours or _normal(ours[0]) != _normal(expire_rule(days)):
        put("put_bucket_lifecycle_configuration",
            f"lifecycle: runs/ expire after {days} days, incomplete uploads aborted after {ABORT_DAYS}",
            LifecycleConfiguration=lifecycle(days, rules))
    tag_set = (_get(s3, "get_bucket_tagging", bucket) or {}).get("TagSet", [])
    if not any(t.get("Key") == T.OWNER for t in tag_set):
        put("put_bucket_tagging", f"tagged {T.OWNER}",
            Tagging={"TagSet": [*tag_set, {"Key": T.OWNER, "Value": owner_tag(owner)}]})
    return done, refused


def _normal(rule: Item) -> tuple[Any, ...]:
    """What of a lifecycle rule ec2gpu sets, comparable across S3's spellings of it."""
    return (rule.get("Status"), _rule_prefix(rule), (rule.get("Expiration") or {}).get("Days"),
            (rule.get("AbortIncompleteMultipartUpload") or {}).get("DaysAfterInitiation"))


def _rule_prefix(rule: Item) -> str | None:
    """The key prefix a lifecycle rule applies to: its Filter's Prefix, the legacy top-level Prefix,
    "" for an empty filter (every object); None for a rule that picks objects otherwise (tags, sizes)."""
    flt = rule.get("Filter")
    if flt is None:
        p = rule.get("Prefix")
        return p if isinstance(p, str) else None
    if not isinstance(flt, dict):
        return None
    if not flt:
        return ""
    if set(flt) == {"Prefix"} and isinstance(flt["Prefix"], str):
        return str(flt["Prefix"])
    return None


def _covers_runs(rule: Item) -> bool:
    p = _rule_prefix(rule)
    return rule.get("Status") == "Enabled" and p is not None and RUNS.startswith(p)


def _lifecycle_problems(rules: list[Item], expire_days: int | None) -> list[str]:
    out = []
    expiring = [r for r in rules if _covers_runs(r) and isinstance((r.get("Expiration") or {}).get("Days"), int)]
    if not expiring:
        out.append("no lifecycle rule expires what is under runs/: run data is kept (and billed) forever")
    elif expire_days is not None and all(r["Expiration"]["Days"] != expire_days for r in expiring):
        got = ", ".join(str(r["Expiration"]["Days"]) for r in expiring)
        out.append(f"runs/ expire after {got} days, not the {expire_days} that run_store_expire_days asks for")
    if not any(_covers_runs(r) and (r.get("AbortIncompleteMultipartUpload") or {}).get("DaysAfterInitiation")
               for r in rules):
        out.append("no lifecycle rule aborts incomplete multipart uploads: their parts are kept (and billed) unseen")
    return out


def _encryption_problem(got: Item | None) -> str | None:
    if got is None:
        return "no default encryption"
    algos = [(r.get("ApplyServerSideEncryptionByDefault") or {}).get("SSEAlgorithm")
             for r in (got.get("ServerSideEncryptionConfiguration") or {}).get("Rules", [])]
    if "AES256" not in algos:
        return (f"default encryption is {', '.join(str(a) for a in algos) or 'unset'}, not SSE-S3 (AES256): "
                "a run's instance role has no KMS permission")
    return None


def _listed(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def _denies_plain_http(stmt: Any, bucket: str) -> bool:
    """Whether a policy statement denies every S3 action on ``bucket`` and its objects, to everyone,
    when aws:SecureTransport is false (tls_deny_statement, or an equivalent the user wrote)."""
    if not isinstance(stmt, dict) or stmt.get("Effect") != "Deny":
        return False
    principal = stmt.get("Principal")
    if principal != "*" and not (isinstance(principal, dict) and "*" in _listed(principal.get("AWS"))):
        return False
    if "s3:*" not in _listed(stmt.get("Action")) and "*" not in _listed(stmt.get("Action")):
        return False
    resources = {str(r).split(":::", 1)[-1] for r in _listed(stmt.get("Resource"))}
    if not ({bucket, f"{bucket}/*"} <= resources or "*" in _listed(stmt.get("Resource"))):
        return False
    secure = ((stmt.get("Condition") or {}).get("Bool") or {}).get("aws:SecureTransport")
    return [str(v).lower() for v in _listed(secure)] == ["false"]


def check(s3: Client, bucket: str, expire_days: int | None = None) -> list[str]:
    """What of the module docstring's settings ``bucket`` lacks, one sentence each; [] when it has
    them all. ``expire_days``, when given, must also be the days of the rule that expires runs/.
    Reads only (Get* with ExpectedBucketOwner), creates nothing; a missing bucket or configuration
    (NoSuch* codes) is a problem, not an error. Raises AwsError for other S3 errors (403: these
    credentials may not read the setting)."""
    if _get(s3, "get_bucket_location", bucket) is None:  # not HeadBucket: ``exists`` says why
        return [f"s3://{bucket} does not exist"]
    problems = []
    bpa = _get(s3, "get_public_access_block", bucket)
    if bpa is None:
        problems.append("Block Public Access is not set on the bucket")
    else:
        conf = bpa.get("PublicAccessBlockConfiguration", {})
        problems += [f"Block Public Access: {k} is off" for k in PUBLIC_ACCESS_BLOCK if conf.get(k) is not True]
    encryption = _encryption_problem(_get(s3, "get_bucket_encryption", bucket))
    if encryption:
        problems.append(encryption)
    got = _get(s3, "get_bucket_policy", bucket)
    policy = _policy_of(got)
    if got is None:
        problems.append("no bucket policy: requests without TLS are not denied")
    elif not any(_denies_plain_http(s, bucket) for s in _listed((policy or {}).get("Statement", []))):
        problems.append("the bucket policy does not deny requests without TLS (aws:SecureTransport false)")
    life = _get(s3, "get_bucket_lifecycle_configuration", bucket)
    if life is None:
        problems.append("no lifecycle configuration: run data under runs/ never expires and incomplete multipart "
                        "uploads are kept (and billed)")
    else:
        problems += _lifecycle_problems(life.get("Rules", []), expire_days)
    return problems


# --- status.json ------------------------------------------------------------------------------

MAX_STATUS_BYTES = 1024 * 1024  # the agent keeps 100 launches and 100 attempts in it (agent/detached.MAX_RECORDS), ~80 KB
MAX_TEXT = 2000  # characters kept of a message
MAX_COUNT = 1_000_000
#: the run's states: "pending" (the controller's, before any instance), then the agent's
#: (agent/detached.py): starting, running, interrupted (a replacement resumes), and the final ones
STATES = ("pending", "starting", "running", "interrupted", "succeeded", "failed", "cancelled")
FINAL_STATES = ("succeeded", "failed", "cancelled")
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:?[0-9]{2})?")
_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
_INSTANCE_TYPE = re.compile(r"[a-z0-9][a-z0-9-]{0,15}\.[a-z0-9-]{1,16}")


def _int(v: object, lo: int, hi: int) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi else None


def _match(v: object, pattern: re.Pattern[str]) -> str | None:
    return v if isinstance(v, str) and pattern.fullmatch(v) else None


def validate_status(data: bytes, run_id: str) -> Item:
    """The record in ``data`` (the bytes of a run's status.json), every field validated (pure, never
    raises). An object that came from an instance is hostile input: more than MAX_STATUS_BYTES, not
    JSON, not a JSON object, a state not in STATES or another run's id gives a record with state
    "unreadable", its ``problem`` saying why, and nothing of the rest taken. Unknown fields are
    dropped; a known field of the wrong type or out of bounds is None. Text is kept as it came
    (bounded): print it through ec2gpu.inert.

    Shape: ``{"run_id": str (``run_id``), "state": one of STATES | "unreadable", "attempt",
    "restarts", "interruptions", "launches": int 0..1e6 | None (restarts: after job failures, the
    agent's restarts_on_errors; interruptions: spot interruptions survived; launches: instances
    that ran the agent), "instance_id": "i-..." | None, "instance_type": str | None,
    "market": "spot" | "on-demand" | None, "exit_code": int | None, "signal": int 0..65535 | None,
    "started_at", "updated_at", "ended_at": ISO 8601 UTC text | None, "message": str (at most
    MAX_TEXT characters) | None, "problem": str | None}``.
    """
    def unreadable(problem: str) -> Item:
        return _unreadable(run_id, problem)
    if len(data) > MAX_STATUS_BYTES:
        return unreadable(f"status.json holds more than {MAX_STATUS_BYTES:,} bytes")
    try:
        raw = bounded_json.loads(data, max_bytes=MAX_STATUS_BYTES)
    except bounded_json.Refused as exc:
        return unreadable(f"status.json refused: {exc}")
    if not isinstance(raw, dict):
        return unreadable("status.json is not a JSON object")
    if raw.get("run_id", run_id) != run_id:
        return unreadable("status.json names another run")
    if raw.get("state") not in STATES:
        return unreadable("status.json has no known state")
    message = raw.get("message", raw.get("reason"))  # the agent's is "reason"
    return {"run_id": run_id, "state": raw["state"],
            **{k: _int(raw.get(k), 0, MAX_COUNT) for k in ("attempt", "interruptions", "launches")},
            "restarts": _int(raw.get("restarts", raw.get("restarts_on_errors")), 0, MAX_COUNT),
            "instance_id": _match(raw.get("instance_id"), _INSTANCE_ID),
            "instance_type": _match(raw.get("instance_type"), _INSTANCE_TYPE),
            "market": raw.get("market") if raw.get("market") in ("spot", "on-demand") else None,
            "exit_code": _int(raw.get("exit_code"), -(2 ** 31), 2 ** 31), "signal": _int(raw.get("signal"), 0, 65535),
            # the agent's names: created_at, heartbeat_at
            "started_at": _match(raw.get("started_at", raw.get("created_at")), _TIME),
            "updated_at": _match(raw.get("updated_at", raw.get("heartbeat_at")), _TIME),
            "ended_at": _match(raw.get("ended_at"), _TIME),
            "message": message[:MAX_TEXT] if isinstance(message, str) else None,
            "problem": None}


def _unreadable(run_id: str, problem: str) -> Item:
    return {**{k: None for k in _FIELDS}, "run_id": run_id, "state": "unreadable", "problem": problem}


_FIELDS = ("run_id", "state", "attempt", "restarts", "interruptions", "launches", "instance_id", "instance_type", "market",
           "exit_code", "signal", "started_at", "updated_at", "ended_at", "message", "problem")


def put_status(s3: Client, bucket: str, user: str, run_id: str, status: dict[str, Any], *,
               if_match: str | None = None, if_absent: bool = False) -> None:
    """Write ``status`` (validate_status's shape; ``run_id`` set to ``run_id``) as the run's
    status.json, JSON, replacing the one there; with ``if_match`` only over the object of that ETag,
    with ``if_absent`` only where there is none. Raises UsageError for a bad user or run id, ValueError for a
    record that is not JSON, is larger than MAX_STATUS_BYTES or would be read back as unreadable
    (what is written must be what get_status accepts), Conflict when the condition does not hold,
    AwsError for other S3 errors."""
    key = status_key(user, run_id)
    if not isinstance(status, dict):
        raise ValueError(f"a status record is a dict, not {type(status).__name__}")
    try:
        body = json.dumps({**status, "run_id": run_id}, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"status record of {run_id}: not JSON ({exc})") from None
    problem = validate_status(body, run_id)["problem"]
    if problem:
        raise ValueError(f"status record of {run_id}: {problem}")
    cond = {"IfMatch": if_match} if if_match is not None else {"IfNoneMatch": "*"} if if_absent else {}
    _put(s3, "put_object", bucket, Key=key, Body=body, ContentType="application/json", **cond)


def get_status(s3: Client, bucket: str, user: str, run_id: str) -> Item | None:
    """The run's status.json as validate_status returns it, or None when there is none (no object,
    no bucket). At most MAX_STATUS_BYTES + 1 bytes are read: a larger object is unreadable without
    being downloaded. Raises UsageError for a bad user or run id, AwsError for other S3 errors."""
    key = status_key(user, run_id)
    got = _get_object(s3, bucket, key)
    if got is None:
        return None
    body = got["Body"]
    try:
        size = got.get("ContentLength")
        if isinstance(size, int) and size > MAX_STATUS_BYTES:  # not downloaded
            return _unreadable(run_id, f"status.json holds {size:,} bytes, more than {MAX_STATUS_BYTES:,}")
        data: bytes = body.read(MAX_STATUS_BYTES + 1)
    finally:
        body.close()
    return validate_status(data, run_id)


def list_runs(s3: Client, bucket: str, user: str) -> list[str]:
    """The run ids of the user ``user`` that have objects in ``bucket`` (the ``runs/<user>/<run_id>/``
    prefixes, ListObjectsV2 with Delimiter '/', every page through boto3's paginator), sorted
    (oldest first, as run ids sort); a prefix that is not a run id is skipped. Another user's runs,
    and runs of the layout before the user id (``runs/<run_id>/``), are not listed. [] when the
    bucket does not exist. Raises UsageError for a bad user id, AwsError for other S3 errors."""
    found = set()
    mine = user_prefix(user)
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=mine, Delimiter="/",
                                                             **_expected_owner(bucket))
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                name = str(common.get("Prefix", ""))[len(mine):]
                if name.endswith("/") and RUN_ID.fullmatch(name[:-1]):
                    found.add(name[:-1])
    except botocore.exceptions.ClientError as exc:
        if _absent(error_code(exc)):
            return []
        raise AwsError(f"run store: s3://{bucket}/{mine}: ListObjectsV2 failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None
    return sorted(found)


# --- status.json's launches (issue 30: the cost of a detached run) -----------------------------

#: the bytes of status.json read for its launches: the agent's own bound (agent/detached.py
#: MAX_STATUS_BYTES, 4 MiB: it keeps up to 1000 launches and 1000 attempts)
MAX_LAUNCH_STATUS_BYTES = 4 * 1024 * 1024
#: launches kept (the newest), as the agent keeps them (agent/detached.py MAX_RECORDS)
MAX_LAUNCHES = 1000
#: times outside these years are not an instance's (EC2 opened in 2006)
_YEARS = (2006, 2200)


def _when(v: object) -> str | None:
    """``v`` as ISO 8601 UTC text (``YYYY-mm-ddTHH:MM:SS[.f]+00:00``) when it is a time of _TIME's
    form, with a zone (or none: UTC), that is a real date within _YEARS; else None."""
    from datetime import datetime, timezone
    text = _match(v, _TIME)
    if text is None:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    return t.isoformat() if _YEARS[0] <= t.year < _YEARS[1] else None


def launches(data: bytes | dict[str, Any], run_id: str) -> list[dict[str, Any]]:
    """The run's launches from its status.json (``data``: its bytes, or the JSON object already
    parsed), as agent/detached.py records them in ``instances``: one per instance that started the
    agent. Pure, never raises. status.json is hostile input (the job's role can write it): bytes
    over MAX_LAUNCH_STATUS_BYTES, not JSON, not an object, another run's id or no list give [];
    of the list only the newest MAX_LAUNCHES entries are looked at, and an entry that is not an
    object, has no instance id of EC2's form (``i-`` and 8-17 hex digits) or no valid
    ``started_at`` is dropped; a ``last_seen_at`` that is not a valid time, or is before
    ``started_at``, is None; a ``launch`` that is not an int 1..MAX_COUNT is None. Two entries of
    one instance are one: the earliest start, the latest sighting. Times are normalised to ISO 8601
    UTC ("+00:00"), years 2006-2199.

    Shape: ``[{"launch": int | None, "instance_id": "i-...", "started_at": ISO text,
    "last_seen_at": ISO text | None}]`` in the order recorded (oldest launch first).
    """
    raw: object = data
    if isinstance(data, (bytes, bytearray)):
        if len(data) > MAX_LAUNCH_STATUS_BYTES:
            return []
        try:
            raw = bounded_json.loads(data, max_bytes=MAX_LAUNCH_STATUS_BYTES)
        except bounded_json.Refused:
            return []
    if not isinstance(raw, dict) or raw.get("run_id", run_id) != run_id or not isinstance(raw.get("instances"), list):
        return []
    out: dict[str, dict[str, Any]] = {}
    for entry in raw["instances"][-MAX_LAUNCHES:]:
        if not isinstance(entry, dict):
            continue
        iid, start = _match(entry.get("instance_id"), _INSTANCE_ID), _when(entry.get("started_at"))
        if iid is None or start is None:
            continue
        seen = _when(entry.get("last_seen_at"))
        if seen is not None and _utc(seen) < _utc(start):
            seen = None
        got = {"launch": _int(entry.get("launch"), 1, MAX_COUNT), "instance_id": iid, "started_at": start,
               "last_seen_at": seen}
        if iid in out:  # one instance recorded twice: one span, the widest
            was = out[iid]
            got["started_at"] = min(was["started_at"], start, key=_utc)
            got["last_seen_at"] = max((t for t in (was["last_seen_at"], seen) if t), key=_utc, default=None)
            got["launch"] = was["launch"] if was["launch"] is not None else got["launch"]
        out[iid] = got
    return list(out.values())


def _utc(text: str) -> Any:
    from datetime import datetime
    return datetime.fromisoformat(text)


def get_status_bytes(s3: Client, bucket: str, user: str, run_id: str,
                     limit: int = MAX_LAUNCH_STATUS_BYTES) -> bytes | None:
    """The bytes of the run's status.json (at most ``limit`` + 1 of them: a larger object is not
    downloaded whole, and its first ``limit`` + 1 bytes tell launches and validate_status it is too
    large), or None when there is none (no object, no bucket). One GetObject with
    ExpectedBucketOwner. For validate_status (the record) and launches (its instances) from one
    read. Raises UsageError for a bad user or run id, AwsError for other S3 errors."""
    return get_status_tagged(s3, bucket, user, run_id, limit)[0]


def secret_names(s3: Client, bucket: str, user: str, run_id: str) -> list[str]:
    """The names of the run's secrets as its spec.json lists them (``secrets``; [] without any or
    without a spec): their values are in SSM Parameter Store (aws/parameters.py). The run's role
    could rewrite spec.json: a name that is not an environment variable's is left out, and at most
    100 are read. Raises AwsError for S3 errors other than a missing object."""
    data, _ = _read_head(s3, bucket, spec_key(user, run_id), (1 << 20) + 1)
    try:
        spec = bounded_json.loads(data, max_bytes=1 << 20) if data else {}
    except bounded_json.Refused:
        return []
    names = spec.get("secrets") if isinstance(spec, dict) else None
    return [n for n in names if isinstance(n, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", n)][:100] \
        if isinstance(names, list) else []


def get_status_tagged(s3: Client, bucket: str, user: str, run_id: str,
                      limit: int = MAX_LAUNCH_STATUS_BYTES) -> tuple[bytes | None, str | None]:
    """get_status_bytes's bytes, and the object's ETag (for a write conditional on it); (None, None)
    when there is none."""
    return _read_head(s3, bucket, status_key(user, run_id), limit + 1)


def read_head(s3: Client, bucket: str, key: str, size: int) -> bytes | None:
    """The first ``size`` bytes of ``key`` (None when there is no such object, or bucket), from one
    GetObject with ExpectedBucketOwner. Raises AwsError for other S3 errors."""
    return _read_head(s3, bucket, key, size)[0]


def download_head(s3: Client, bucket: str, key: str, path: str | os.PathLike[str], max_bytes: int) -> int | None:
    """Stream ``key`` to the file ``path`` in 1 MiB pieces, stopping after ``max_bytes`` + 1 bytes
    (the caller tells a larger object by the count); the bytes written, or None when there is no such
    object (or bucket). Raises AwsError for other S3 errors, OSError when ``path`` cannot be written."""
    got = _get_object(s3, bucket, key)
    if got is None:
        return None
    body, written = got["Body"], 0
    try:
        with open(path, "wb") as f:
            while written <= max_bytes:
                piece = body.read(min(1 << 20, max_bytes + 1 - written))
                if not piece:
                    break
                f.write(piece)
                written += len(piece)
    finally:
        body.close()
    return written


def _get_object(s3: Client, bucket: str, key: str) -> Item | None:
    """GetObject's answer for ``key`` (ExpectedBucketOwner; its Body not read yet), or None when
    there is no such object (or bucket: _missing, whether S3 says 404 or 403). Raises AwsError for
    other S3 errors."""
    try:
        got: Item = s3.get_object(Bucket=bucket, Key=key, **_expected_owner(bucket))
    except botocore.exceptions.ClientError as exc:
        if _missing(s3, bucket, key, error_code(exc)):
            return None
        raise AwsError(f"run store: s3://{bucket}/{key}: GetObject failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None
    return got


def _read_head(s3: Client, bucket: str, key: str, size: int) -> tuple[bytes | None, str | None]:
    """(the first ``size`` bytes of ``key``, its ETag) from one GetObject (ExpectedBucketOwner), or
    (None, None) when there is no such object (or bucket). Raises AwsError for other S3 errors."""
    got = _get_object(s3, bucket, key)
    if got is None:
        return None, None
    body = got["Body"]
    try:
        data: bytes = body.read(size)
    finally:
        body.close()
    return data, got.get("ETag")


# --- the run's instances as EC2 described them at their end (settled.json) --------------------
#
# EC2 lists a terminated instance for about an hour (DescribeInstances); after that its type,
# market, zone and times are known nowhere else. The first `status` or `runs --remote` that sees a
# run over, with every instance it launched listed as terminated, writes them here
# (runs/detached/costs.gather), so that its cost stays exact from any machine afterwards. It lies
# in the run's own prefix, which the run's role could write while an instance ran: read as hostile
# input like status.json, and written again whenever EC2 still lists the instances (EC2 wins).

SETTLED = "settled.json"
MAX_SETTLED_BYTES = 256 * 1024
_ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}[a-z]")


def put_settled(s3: Client, bucket: str, user: str, run_id: str, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` ({"instance_id", "instance_type", "market", "zone", "launched_at",
    "terminated_at"}: ISO 8601 UTC times) as the run's settled.json. Raises AwsError for S3 errors."""
    put_json(s3, bucket, prefix(user, run_id) + SETTLED, {"run_id": run_id, "instances": rows[:MAX_LAUNCHES]})


def get_settled(s3: Client, bucket: str, user: str, run_id: str) -> list[dict[str, Any]]:
    """The rows of the run's settled.json (put_settled's shape), each field checked: an entry
    with an instance id, type, market, zone or time not of EC2's form, or ending before it
    started, is dropped; another run's record, an object that is not JSON or is larger than
    MAX_SETTLED_BYTES gives []. [] when there is none. Raises AwsError for other S3 errors."""
    data, _ = _read_head(s3, bucket, prefix(user, run_id) + SETTLED, MAX_SETTLED_BYTES + 1)
    if data is None:
        return []
    try:
        raw = bounded_json.loads(data, max_bytes=MAX_SETTLED_BYTES)
    except bounded_json.Refused:
        return []
    if not isinstance(raw, dict) or raw.get("run_id") != run_id or not isinstance(raw.get("instances"), list):
        return []
    out = []
    for e in raw["instances"][:MAX_LAUNCHES]:
        if not isinstance(e, dict):
            continue
        row = {"instance_id": _match(e.get("instance_id"), _INSTANCE_ID),
               "instance_type": _match(e.get("instance_type"), _INSTANCE_TYPE),
               "market": e.get("market") if e.get("market") in ("spot", "on-demand") else None,
               "zone": _match(e.get("zone"), _ZONE), "launched_at": _when(e.get("launched_at")),
               "terminated_at": _when(e.get("terminated_at"))}
        start, end = row["launched_at"], row["terminated_at"]
        if all(v is not None for v in row.values()) and start and end and _utc(end) >= _utc(start):
            out.append(row)
    return out


# --- what a run left: listing and bounded reads (`ec2gpu fetch RUN`, `ec2gpu logs RUN`) ---------
#
# The keys and contents under a run's prefix are the instance's (its role may write its own
# prefix): hostile input. These functions only list and read, with bounds; what may be written on
# this machine, and where, is decided by their caller (runs/detached/fetch.py).

#: objects looked at in one listing: bounds this machine's memory, not what is brought home
MAX_LISTED = 100_000
#: bytes read from S3 per request of a streamed or ranged read
CHUNK_BYTES = 1 << 20


class TooLarge(Exception):
    """An object held more bytes than it was read with (it changed since it was listed, or lied)."""


def list_objects(s3: Client, bucket: str, key_prefix: str,
                 max_entries: int = MAX_LISTED) -> tuple[list[tuple[str, int]], bool]:
    """The objects under ``key_prefix`` in ``bucket`` as (key, size in bytes), in S3's order (UTF-8
    binary order of the keys), every page through boto3's paginator (ListObjectsV2 with
    ExpectedBucketOwner), and whether more were left unlisted: at most ``max_entries`` are looked
    at. Keys are returned as S3 has them (hostile: the caller checks them); a size that is not a
    non-negative int is 0. ([], False) when the bucket does not exist. Raises AwsError for other S3
    errors."""
    out: list[tuple[str, int]] = []
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key_prefix,
                                                             **_expected_owner(bucket))
        for page in pages:
            for obj in page.get("Contents", []):
                if len(out) >= max_entries:
                    return out, True
                key, size = obj.get("Key"), obj.get("Size")
                if isinstance(key, str):
                    out.append((key, size if isinstance(size, int) and size >= 0 else 0))
    except botocore.exceptions.ClientError as exc:
        if _absent(error_code(exc)):
            return [], False
        raise AwsError(f"run store: s3://{bucket}/{key_prefix}: ListObjectsV2 failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None
    return out, False


def head_object(s3: Client, bucket: str, key: str) -> Item | None:
    """{"size": bytes, "etag": str} of the object ``key`` (HeadObject with ExpectedBucketOwner), or
    None when it (or the bucket) is not there (_missing). Raises AwsError for other S3 errors."""
    try:
        got = s3.head_object(Bucket=bucket, Key=key, **_expected_owner(bucket))
    except botocore.exceptions.ClientError as exc:
        if _missing(s3, bucket, key, error_code(exc)):
            return None
        raise AwsError(f"run store: s3://{bucket}/{key}: HeadObject failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None
    size = got.get("ContentLength")
    return {"size": size if isinstance(size, int) and size >= 0 else 0, "etag": str(got.get("ETag") or "")}


def read_range(s3: Client, bucket: str, key: str, start: int, end: int, etag: str | None = None) -> bytes | None:
    """Bytes ``start`` to ``end`` (inclusive, ``end`` >= ``start`` >= 0) of the object ``key``: a
    Range GET, with ``etag`` as IfMatch when given; at most ``end - start + 1`` bytes are read
    whatever S3 sends. None when the object is gone, was replaced (412: not ``etag`` any more) or
    is shorter than ``start`` (416). Raises ValueError for a bad range, AwsError for other S3
    errors."""
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
        raise ValueError(f"bad byte range {start!r}-{end!r}")
    extra: dict[str, Any] = {"IfMatch": etag} if etag else {}
    try:
        got = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}", **extra, **_expected_owner(bucket))
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if code in ("412", "PreconditionFailed", "416", "InvalidRange") or _missing(s3, bucket, key, code):
            return None
        raise AwsError(f"run store: s3://{bucket}/{key}: GetObject failed ({code})",
                       "see docs/iam-policy.json") from None
    body = got["Body"]
    try:
        data: bytes = body.read(end - start + 1)
    finally:
        body.close()
    return data


def end_status(s3: Client, bucket: str, user: str, run_id: str, state: str, message: str, at: str) -> bool:
    """Record the run's end when its agent cannot (`ec2gpu cancel` after its wait; `status` for a
    group that stopped without the agent's word): status.json as it is, its launches and attempts
    kept (the run's cost is computed from them: runs/detached/costs.py), with ``state`` (one of
    FINAL_STATES), ``message``/``reason`` and ``ended_at`` (``at``, ISO 8601 UTC) set. A record
    that cannot be read is replaced by a new one; an end already recorded stands (nothing is
    written). The write is conditional on status.json being as it was read: where the agent wrote
    in between, it is read again, and so an end it recorded meanwhile stands too. Returns whether
    this end was written. Raises ValueError for a state that is not final, Conflict when status.json
    changed under CONFLICT_TRIES writes in a row, AwsError for other S3 errors."""
    if state not in FINAL_STATES:
        raise ValueError(f"{state!r} is not a final state")
    for _ in range(CONFLICT_TRIES):
        data, etag = get_status_tagged(s3, bucket, user, run_id)
        try:
            raw = bounded_json.loads(data, max_bytes=MAX_STATUS_BYTES) if data is not None else {}
        except bounded_json.Refused:
            raw = {}
        record = raw if isinstance(raw, dict) and raw.get("run_id", run_id) == run_id else {}
        if record.get("state") in FINAL_STATES:  # an end recorded stands (the agent's, written since the caller read)
            return False
        try:
            put_status(s3, bucket, user, run_id, {**record, "state": state, "message": message, "reason": message,
                                            "ended_at": at}, if_match=etag, if_absent=etag is None)
            return True
        except Conflict:
            continue  # written meanwhile: read again
    raise Conflict(f"status.json of {run_id} changed under {CONFLICT_TRIES} writes in a row")


def group_launches(group: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
    """(instance types, market) a detached run's Auto Scaling group launches (pure): the types of
    its MixedInstancesPolicy's launch template overrides, in order, without repeats (aws/groups.
    group_request's shape; at most 40, as many as Auto Scaling takes), and "spot" when it asks for no
    on-demand capacity (OnDemandBaseCapacity 0 and OnDemandPercentageAboveBaseCapacity 0), else
    "on-demand"; ((), None) for a group that names no type. Here beside ``launches``, with the same
    field checks, for the cost of a detached run (runs/detached/costs.py)."""
    def obj(v: object) -> dict[str, Any]:
        return v if isinstance(v, dict) else {}
    policy = obj(obj(group).get("MixedInstancesPolicy"))
    overrides = obj(policy.get("LaunchTemplate")).get("Overrides")
    overrides = overrides if isinstance(overrides, list) else []
    types = tuple(dict.fromkeys(t for o in overrides[:40] if isinstance(o, dict)
                                for t in [_match(o.get("InstanceType"), _INSTANCE_TYPE)] if t))
    if not types:
        return (), None
    dist = obj(policy.get("InstancesDistribution"))
    spot = dist.get("OnDemandPercentageAboveBaseCapacity") == 0 and not dist.get("OnDemandBaseCapacity")
    return types, "spot" if spot else "on-demand"


def download(s3: Client, bucket: str, key: str, out: Any, max_bytes: int) -> int:
    """Write the object ``key`` to ``out`` (a binary file object), in chunks of CHUNK_BYTES (memory
    stays bounded); return the bytes written. Raises TooLarge when it holds more than ``max_bytes``
    (what was written then is the caller's to remove), FileNotFoundError when it is gone, AwsError
    for other S3 errors."""
    try:
        got = s3.get_object(Bucket=bucket, Key=key, **_expected_owner(bucket))
    except botocore.exceptions.ClientError as exc:
        if _missing(s3, bucket, key, error_code(exc)):
            raise FileNotFoundError(key) from None
        raise AwsError(f"run store: s3://{bucket}/{key}: GetObject failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None
    body, written = got["Body"], 0
    try:
        size = got.get("ContentLength")
        if isinstance(size, int) and size > max_bytes:
            raise TooLarge(f"{key} holds {size:,} bytes, more than {max_bytes:,}")
        while True:
            chunk = body.read(min(CHUNK_BYTES, max_bytes - written + 1))
            if not chunk:
                return written
            written += len(chunk)
            if written > max_bytes:
                raise TooLarge(f"{key} holds more than {max_bytes:,} bytes")
            out.write(chunk)
    finally:
        body.close()
