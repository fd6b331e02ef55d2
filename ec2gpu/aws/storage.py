"""S3 buckets a task's file_mounts name (tasks/mounts.py): checked before anything is created, and
an output bucket made when the task names one that does not exist.

A bucket ec2gpu makes is private and encrypted: S3 Block Public Access on all four settings
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/access-control-block-public-access.html),
default encryption SSE-S3 (https://docs.aws.amazon.com/AmazonS3/latest/userguide/default-bucket-encryption.html),
object ownership "bucket owner enforced" (ACLs off: S3's default for new buckets since April 2023,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/about-object-ownership.html), tagged with
its owner and with the user id of whoever made it (``ec2gpu:user``: STS's UserId, aws/runstore.user_id),
by which a later task that names it knows it for its own. It is the user's: never deleted by ec2gpu.

Also the upload of a file (``upload``: --checkpoint-uri's second copy, runs/recover/recovery.py).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import botocore.exceptions

from ..errors import AwsError, UsageError
from . import consistency, tags
from .session import Client, Log, error_code

#: HeadBucket answers with an HTTP status and no body: its error code is the status
#: (https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadBucket.html)
MISSING = frozenset({"404", "NoSuchBucket", "NotFound"})
FORBIDDEN = frozenset({"403", "AccessDenied", "Forbidden"})


class S3Mount(Protocol):
    """What these functions read of a file_mounts entry (tasks/mounts.Mount, which aws/ does not
    import): an entry of ``kind`` "s3" has its ``bucket``."""

    @property
    def target(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def bucket(self) -> str | None: ...
    @property
    def prefix(self) -> str: ...
    @property
    def create(self) -> bool: ...
    @property
    def url(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def write_back(self) -> bool: ...
    @property
    def write_allowed(self) -> bool: ...


def bucket_region(s3: Client, bucket: str, default_region: str) -> str | None:
    """The region of ``bucket`` (HeadBucket's BucketRegion, else its x-amz-bucket-region header,
    else ``default_region``), or None when it does not exist.

    Raises UsageError when these credentials may not read it (403), AwsError for other errors.
    """
    try:
        got = s3.head_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if code in MISSING:
            return None
        if code in FORBIDDEN:
            raise UsageError(f"file_mounts: s3://{bucket} exists but these AWS credentials may not read it (403)",
                             "name a bucket of this account, or ask its owner for s3:ListBucket and s3:GetObject")
        raise AwsError(f"file_mounts: s3://{bucket}: HeadBucket failed ({code})", "try again")
    headers = got.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    found: str = got.get("BucketRegion") or headers.get("x-amz-bucket-region") or default_region
    return found


def create_private_bucket(s3: Client, bucket: str, region: str, owner: str, user: str) -> None:
    """Create ``bucket`` in ``region``: public access blocked, SSE-S3 default encryption, tagged
    ``ec2gpu:owner`` (``owner``, the local login name: for people) and ``ec2gpu:user`` (``user``, the
    caller's AWS user id: what ``check_buckets`` compares); each setting tried again while S3 does
    not see the new bucket yet (consistency.FreshBucket). Raises UsageError when the name is taken
    by another account (BucketAlreadyExists), AwsError for other errors."""
    req: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":  # us-east-1 refuses its own name as a LocationConstraint
        req["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        s3.create_bucket(**req)
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == "BucketAlreadyOwnedByYou":
            return
        if error_code(exc) == "BucketAlreadyExists":
            raise UsageError(f"file_mounts: the bucket name {bucket} is taken by another AWS account",
                             "S3 bucket names are global: choose another name")
        raise AwsError(f"file_mounts: could not create s3://{bucket} ({error_code(exc)})", "see docs/iam-policy.json")
    s3 = consistency.FreshBucket(s3, bucket)  # S3 may not see the new bucket yet: NoSuchBucket is tried again
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": tags.OWNER, "Value": tags.tag_value(owner)},
                                                             {"Key": tags.USER, "Value": user}]})


def check_buckets(s3: Client, mounts_: Sequence[S3Mount], region: str, user: str) -> tuple[dict[str, str], list[str]]:
    """Check every S3 bucket of ``mounts_`` (tasks/mounts.Mount) with HeadBucket, creating nothing.

    A bucket the task names with ``name:`` (``create``) is its own when it does not exist yet
    (ec2gpu makes it) or when ec2gpu made it for ``user`` before (its ``ec2gpu:user`` tag is
    ``user``, the caller's AWS user id, as create_private_bucket sets it; not the login name, which
    two people share on two machines): a MOUNT-mode entry may write back to it. One that exists
    without that tag (another's bucket, reached by naming it, or one ec2gpu made before it tagged
    buckets with their user) is written to only with --allow-write-bucket (the entry's
    ``write_allowed``), as a ``source:`` bucket is (tasks/mounts.check_write).

    Returns ({bucket: its region, or ``region`` for one to be made}, [buckets to be made]: those
    named with ``create`` that do not exist, for ``make_buckets``). Raises UsageError for a source
    bucket that does not exist or may not be read, and for a write-back to an existing bucket that
    is not the task's own; AwsError for other S3 errors.
    """
    regions: dict[str, str] = {}
    missing: list[str] = []
    for m in mounts_:
        if m.kind != "s3" or m.bucket in regions:
            continue
        assert m.bucket is not None  # an "s3" entry names its bucket (tasks/mounts.py)
        found = bucket_region(s3, m.bucket, region)
        if found is None and not m.create:
            raise UsageError(f"file_mounts.{m.target}: s3://{m.bucket} does not exist",
                             "check the name; a bucket to be written to is made when named with `name:` and no source")
        if found is None:
            missing.append(m.bucket)
        elif any(w.create for w in mounts_ if w.kind == "s3" and w.bucket == m.bucket):
            _check_own(s3, [w for w in mounts_ if w.kind == "s3" and w.bucket == m.bucket], user)
        regions[m.bucket] = found or region
    return regions, missing


def _check_own(s3: Client, mounts_: Sequence[S3Mount], user: str) -> None:
    """Refuse (UsageError) a write-back, not allowed by --allow-write-bucket, to the existing
    bucket of ``mounts_`` (the entries of one bucket) unless its ``ec2gpu:user`` tag is ``user``.
    GetBucketTagging (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketTagging.html)
    answers NoSuchTagSet for a bucket without tags; a refused read counts as not ec2gpu's."""
    writes = [m for m in mounts_ if m.write_back and not m.write_allowed]
    if not writes:
        return
    bucket = writes[0].bucket
    try:
        tag_set = s3.get_bucket_tagging(Bucket=bucket).get("TagSet", [])
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) not in FORBIDDEN | {"NoSuchTagSet"}:
            raise AwsError(f"file_mounts: s3://{bucket}: GetBucketTagging failed ({error_code(exc)})",
                           "try again") from None
        tag_set = []
    bucket_tags = {t.get("Key"): t.get("Value") for t in tag_set if isinstance(t, dict)}
    if bucket_tags.get(tags.USER) != user:
        raise UsageError(f"file_mounts.{writes[0].target}: s3://{bucket} exists and is not a bucket ec2gpu made for "
                         f"you (no {tags.USER} tag of your AWS user id {user}): mode {writes[0].mode} would let the job "
                         "change or replace what is in it",
                         f"give --allow-write-bucket {bucket} to let the job write there (a bucket ec2gpu made for "
                         f"you before it tagged buckets with {tags.USER} needs it too), or name a new bucket")


def make_buckets(s3: Client, buckets: list[str], region: str, owner: str, user: str,
                 log: Log = lambda line: None) -> None:
    """Create each of ``buckets`` in ``region`` for ``owner`` and the AWS user id ``user``
    (create_private_bucket), saying so through ``log``. Raises UsageError or AwsError as
    create_private_bucket does."""
    for bucket in buckets:
        create_private_bucket(s3, bucket, region, owner, user)
        log(f"file_mounts: created s3://{bucket} in {region} (private, encrypted; it stays after the run)")


def upload(s3: Client, path: str | os.PathLike[str], bucket: str, key: str) -> None:
    """Copy the local file ``path`` to s3://``bucket``/``key`` (boto3's managed transfer: multipart
    for a large file), replacing the object there. Raises what boto3 raises (S3UploadFailedError,
    botocore's ClientError, FileNotFoundError for a missing ``path``)."""
    s3.upload_file(str(path), bucket, key)

def single_objects(s3: Client, mounts_: Sequence[S3Mount]) -> set[str]:
    """The targets of S3 source entries of ``mounts_`` whose prefix is one object's whole key and no
    folder (SkyPilot copies that object to the target path as a file): HeadObject on the key, and
    ListObjectsV2 (1 key) under ``PREFIX/`` (so ``a.txt`` beside ``a.txt.bak`` is still a file, and
    ``data`` beside ``data/x`` a folder).

    Raises UsageError for a source prefix that names neither an object nor a folder (nothing there
    to copy: SkyPilot fails the same way), or one these credentials may not read; AwsError for other
    S3 errors.
    """
    out = set()
    for m in mounts_:
        if m.kind != "s3" or m.create or not m.prefix:
            continue
        assert m.bucket is not None  # an "s3" entry names its bucket (tasks/mounts.py)
        folder = m.prefix if m.prefix.endswith("/") else m.prefix + "/"
        try:
            under: int = s3.list_objects_v2(Bucket=m.bucket, Prefix=folder, MaxKeys=1).get("KeyCount", 0)
            is_object = not m.prefix.endswith("/") and not under and _exists(s3, m.bucket, m.prefix)
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) in FORBIDDEN:
                raise UsageError(f"file_mounts.{m.target}: these AWS credentials may not read {m.url} (403)",
                                 "ask its owner for s3:ListBucket and s3:GetObject") from None
            raise AwsError(f"file_mounts.{m.target}: {m.url}: {error_code(exc)}", "try again") from None
        if is_object:
            out.add(m.target)
        elif not under:
            raise UsageError(f"file_mounts.{m.target}: {m.url} holds no object", "check the path (aws s3 ls "
                             f"s3://{m.bucket}/{m.prefix.rpartition('/')[0]})")
    return out


def _exists(s3: Client, bucket: str, key: str) -> bool:
    """HeadObject ``key``: False on 404; other errors are raised (botocore's ClientError)."""
    try:
        s3.head_object(Bucket=bucket, Key=key)
        return True
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) in MISSING or error_code(exc) == "NoSuchKey":
            return False
        raise


def bucket_keys(s3: Client, buckets: Sequence[str]) -> dict[str, str]:
    """{bucket: the KMS key its default encryption names} for those of ``buckets`` that encrypt
    with SSE-KMS or DSSE-KMS and a key of their own (GetBucketEncryption's KMSMasterKeyID: a key
    ARN, id or alias, as the bucket's owner set it): the run role needs kms:Decrypt on it to read,
    kms:GenerateDataKey to write (aws/iam.key_statements). A bucket with SSE-S3, with SSE-KMS and
    no key named (the AWS managed aws/s3, which every principal of the account may use through S3:
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html), or whose
    configuration these credentials may not read is left out. Raises AwsError for other errors."""
    out: dict[str, str] = {}
    for bucket in dict.fromkeys(buckets):
        try:
            rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) in FORBIDDEN | {"ServerSideEncryptionConfigurationNotFoundError", "NoSuchBucket"}:
                continue
            raise AwsError(f"file_mounts: s3://{bucket}: GetBucketEncryption failed ({error_code(exc)})",
                           "try again") from None
        for rule in rules if isinstance(rules, list) else []:
            default = rule.get("ApplyServerSideEncryptionByDefault") if isinstance(rule, dict) else None
            key = (default or {}).get("KMSMasterKeyID")
            if str((default or {}).get("SSEAlgorithm", "")).startswith("aws:kms") and isinstance(key, str) and key:
                out[bucket] = key
    return out
