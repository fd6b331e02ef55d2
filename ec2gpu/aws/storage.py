"""S3 buckets a task's file_mounts name (tasks/mounts.py): checked before anything is created, and
an output bucket made when the task names one that does not exist.

A bucket ec2gpu makes is private and encrypted: S3 Block Public Access on all four settings
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/access-control-block-public-access.html),
default encryption SSE-S3 (https://docs.aws.amazon.com/AmazonS3/latest/userguide/default-bucket-encryption.html),
object ownership "bucket owner enforced" (ACLs off: S3's default for new buckets since April 2023,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/about-object-ownership.html), tagged with
its owner. It is the user's: never deleted by ec2gpu.
"""
from __future__ import annotations

import botocore.exceptions

from ..errors import AwsError, UsageError
from . import tags as T
from .session import error_code

#: HeadBucket answers with an HTTP status and no body: its error code is the status
#: (https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadBucket.html)
MISSING = frozenset({"404", "NoSuchBucket", "NotFound"})
FORBIDDEN = frozenset({"403", "AccessDenied", "Forbidden"})


def bucket_region(s3, bucket: str, default_region: str) -> str | None:
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
    return got.get("BucketRegion") or headers.get("x-amz-bucket-region") or default_region


def create_private_bucket(s3, bucket: str, region: str, owner: str) -> None:
    """Create ``bucket`` in ``region``: public access blocked, SSE-S3 default encryption, tagged
    ``ec2gpu:owner``. Raises UsageError when the name is taken by another account
    (BucketAlreadyExists), AwsError for other errors."""
    req = {"Bucket": bucket}
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
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": T.OWNER, "Value": owner}]})


def ready_buckets(s3, mounts_: list, region: str, owner: str, log=lambda line: None) -> dict[str, str]:
    """Check every S3 bucket of ``mounts_`` (tasks/mounts.Mount) and create those named to be
    made (``create``) that do not exist; return {bucket: region}.

    Raises UsageError (nothing created, when it is a source) for a source bucket that does not
    exist or may not be read.
    """
    regions: dict[str, str | None] = {}
    for m in mounts_:  # every bucket checked before any is made
        if m.kind != "s3" or m.bucket in regions:
            continue
        regions[m.bucket] = bucket_region(s3, m.bucket, region)
        if regions[m.bucket] is None and not m.create:
            raise UsageError(f"file_mounts.{m.target}: s3://{m.bucket} does not exist",
                             "check the name; a bucket to be written to is made when named with `name:` and no source")
    for bucket, found in list(regions.items()):
        if found is None:
            create_private_bucket(s3, bucket, region, owner)
            log(f"file_mounts: created s3://{bucket} in {region} (private, encrypted; it stays after the run)")
            regions[bucket] = region
    return regions


def single_objects(s3, mounts_: list) -> set[str]:
    """The targets of S3 entries of ``mounts_`` whose prefix is one object's whole key (SkyPilot
    copies that object to the target path as a file): one ListObjectsV2 (2 keys) per entry.
    Raises botocore's ClientError as it comes."""
    out = set()
    for m in mounts_:
        if m.kind == "s3" and m.prefix and not m.prefix.endswith("/"):
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=m.bucket, Prefix=m.prefix, MaxKeys=2).get("Contents", [])]
            if keys == [m.prefix]:
                out.add(m.target)
    return out
