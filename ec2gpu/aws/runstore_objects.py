"""The run store's objects: bounded reads, writes, listings and the requests every call to the
bucket makes with ``ExpectedBucketOwner`` (the account in its name: S3 answers 403 when another
account owns it, https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucket-owner-condition.html).

The keys and contents under a run's prefix are the instance's (its role may write its own
prefix): hostile input. These functions only list, read and write, with bounds; what may be written
on this machine, and where, is decided by their caller (runs/detached/fetch.py), and what a key is,
by aws/runstore.py.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import boto3.exceptions
import botocore.exceptions

from ..errors import AwsError
from .session import Client, Item, error_code

#: a run store's name (aws/runstore.bucket_name): its account is the one every request expects
_STORE = re.compile(r"ec2gpu-([0-9]{12})-([a-z]{2}(?:-[a-z]+)+-[0-9]{1,2})")
#: the longest a presigned URL made with SigV4 lasts, 7 days; one made with temporary credentials
#: lasts no longer than they do (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-presigned-url.html)
PRESIGN_MAX_S = 7 * 24 * 3600
#: the codes S3 answers for a bucket or a configuration that is not there
MISSING_BUCKET = frozenset({"404", "NoSuchBucket", "NotFound"})
FORBIDDEN = frozenset({"403", "AccessDenied", "Forbidden"})


def expected_owner(bucket: str) -> dict[str, str]:
    """``{"ExpectedBucketOwner": account}`` for a run store's name (the account in it), else {}."""
    m = _STORE.fullmatch(bucket)
    return {"ExpectedBucketOwner": m.group(1)} if m else {}


def absent(code: str | None) -> bool:
    """A missing bucket, object or configuration: NoSuch* (NoSuchBucketPolicy,
    NoSuchLifecycleConfiguration, ...), *NotFound* (ServerSideEncryptionConfigurationNotFoundError) or 404."""
    return bool(code) and (code in MISSING_BUCKET or str(code).startswith("NoSuch") or "NotFound" in str(code))


def missing(s3: Client, bucket: str, key: str, code: str | None) -> bool:
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
    if absent(code):
        return True
    if code not in FORBIDDEN:
        return False
    try:
        got = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1, **expected_owner(bucket))
    except botocore.exceptions.ClientError:
        return False
    return not any(o.get("Key") == key for o in got.get("Contents", []) if isinstance(o, dict))


def get_config(s3: Client, op: str, bucket: str) -> Item | None:
    """What the boto3 method ``op`` (a Get* call) answers for ``bucket``, with
    ExpectedBucketOwner; None when that configuration (or the bucket) is absent. Raises AwsError
    for other errors."""
    try:
        got: Item = getattr(s3, op)(Bucket=bucket, **expected_owner(bucket))
        return got
    except botocore.exceptions.ClientError as exc:
        if absent(error_code(exc)):
            return None
        raise AwsError(f"run store: s3://{bucket}: {api_name(op)} failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None


def api_name(op: str) -> str:
    """S3's name of a boto3 method: get_bucket_policy -> GetBucketPolicy."""
    return "".join(w.title() for w in op.split("_"))


class Conflict(Exception):
    """A conditional write found the object changed since it was read (S3's 412
    PreconditionFailed, 409 ConditionalRequestConflict for a write under way, or 404 NoSuchKey for
    IfMatch on an object deleted since:
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html)."""


#: the same as agent/store.py's (which ships alone, boto3 and the standard library only; a test compares them)
CONFLICT_CODES = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404")


class Forbidden(AwsError):
    """S3 refused a request for want of permission (403 AccessDenied: FORBIDDEN)."""


def request(s3: Client, op: str, bucket: str, **kw: Any) -> None:
    """``op`` on ``bucket`` (ExpectedBucketOwner). Raises Conflict where a conditional write
    (``IfMatch``, ``IfNoneMatch`` in ``kw``) does not hold, Forbidden (an AwsError) for 403,
    AwsError for other S3 errors."""
    try:
        getattr(s3, op)(Bucket=bucket, **expected_owner(bucket), **kw)
    except botocore.exceptions.ClientError as exc:
        if ("IfMatch" in kw or "IfNoneMatch" in kw) and error_code(exc) in CONFLICT_CODES:
            raise Conflict(f"s3://{bucket}/{kw.get('Key')} changed since it was read ({error_code(exc)})") from None
        error = Forbidden if error_code(exc) in FORBIDDEN else AwsError
        raise error(f"run store: s3://{bucket}: {api_name(op)} failed ({error_code(exc)})",
                    "see docs/iam-policy.json") from None


def presign_puts(s3: Client, bucket: str, keys: dict[str, str], expires_s: int,
                 credentials_end: float | None = None, now: float | None = None) -> dict[str, str]:
    """{name: a presigned URL that lets its holder PUT that one key of ``keys`` and nothing else}
    (SigV4, signed here with the caller's credentials; no AWS call), lasting ``presign_seconds``:
    ``expires_s`` seconds, at most PRESIGN_MAX_S, and no longer than the credentials that sign
    them (``credentials_end``, POSIX s: Aws.credentials_expire_at, read before signing; S3 refuses
    the URL from then on whatever its ExpiresIn says)."""
    expires = presign_seconds(expires_s, credentials_end, time.time() if now is None else now)
    return {what: s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires)
            for what, key in keys.items()}


def presign_seconds(expires_s: float, credentials_end: float | None, now: float) -> int:
    """The ExpiresIn (s) of a URL wanted for ``expires_s`` seconds from ``now`` (POSIX s), signed
    with credentials that end at ``credentials_end`` (POSIX s; None: they do not): at least 1, at
    most PRESIGN_MAX_S and the seconds left to the credentials (pure)."""
    cap = PRESIGN_MAX_S if credentials_end is None else min(PRESIGN_MAX_S, credentials_end - now)
    return max(1, int(min(expires_s, cap)))


def put_file(s3: Client, bucket: str, key: str, path: str | os.PathLike[str]) -> None:
    """Upload the file at ``path`` to ``key`` (boto3's managed transfer: multipart when large).
    Raises AwsError for S3 errors."""
    try:
        s3.upload_file(str(path), bucket, key, ExtraArgs=expected_owner(bucket))
    except boto3.exceptions.S3UploadFailedError as exc:
        raise AwsError(f"run store: s3://{bucket}/{key}: upload failed ({exc})", "see docs/iam-policy.json") from None


def put_bytes(s3: Client, bucket: str, key: str, body: bytes, content_type: str | None = None) -> None:
    """Write ``body`` to ``key`` in one PutObject (these bytes exactly: a detached run's agent files
    and spec.json, whose hashes its user data holds; S3 takes up to 5 GB so:
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/upload-objects.html). Raises AwsError for
    S3 errors."""
    request(s3, "put_object", bucket, Key=key, Body=body, **({"ContentType": content_type} if content_type else {}))


def put_json(s3: Client, bucket: str, key: str, document: Any) -> None:
    """Write ``document`` as JSON to ``key``. Raises AwsError for S3 errors."""
    request(s3, "put_object", bucket, Key=key, Body=json.dumps(document, indent=2).encode(),
            ContentType="application/json")


def read_head(s3: Client, bucket: str, key: str, size: int) -> bytes | None:
    """The first ``size`` bytes of ``key`` (None when there is no such object, or bucket), from one
    GetObject with ExpectedBucketOwner. Raises AwsError for other S3 errors."""
    return read_tagged(s3, bucket, key, size)[0]


def download_head(s3: Client, bucket: str, key: str, path: str | os.PathLike[str], max_bytes: int) -> int | None:
    """Stream ``key`` to the file ``path`` in 1 MiB pieces, stopping after ``max_bytes`` + 1 bytes
    (the caller tells a larger object by the count); the bytes written, or None when there is no such
    object (or bucket). Raises AwsError for other S3 errors, OSError when ``path`` cannot be written."""
    got = get_object(s3, bucket, key)
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


def get_object(s3: Client, bucket: str, key: str) -> Item | None:
    """GetObject's answer for ``key`` (ExpectedBucketOwner; its Body not read yet), or None when
    there is no such object (or bucket: missing, whether S3 says 404 or 403). Raises AwsError for
    other S3 errors."""
    try:
        got: Item = s3.get_object(Bucket=bucket, Key=key, **expected_owner(bucket))
    except botocore.exceptions.ClientError as exc:
        if missing(s3, bucket, key, error_code(exc)):
            return None
        raise AwsError(f"run store: s3://{bucket}/{key}: GetObject failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None
    return got


def read_tagged(s3: Client, bucket: str, key: str, size: int) -> tuple[bytes | None, str | None]:
    """(the first ``size`` bytes of ``key``, its ETag) from one GetObject (ExpectedBucketOwner), or
    (None, None) when there is no such object (or bucket). Raises AwsError for other S3 errors."""
    got = get_object(s3, bucket, key)
    if got is None:
        return None, None
    body = got["Body"]
    try:
        data: bytes = body.read(size)
    finally:
        body.close()
    return data, got.get("ETag")


# --- what a run left: listing and bounded reads (`ec2gpu fetch RUN`, `ec2gpu logs RUN`) ---------

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
                                                             **expected_owner(bucket))
        for page in pages:
            for obj in page.get("Contents", []):
                if len(out) >= max_entries:
                    return out, True
                key, size = obj.get("Key"), obj.get("Size")
                if isinstance(key, str):
                    out.append((key, size if isinstance(size, int) and size >= 0 else 0))
    except botocore.exceptions.ClientError as exc:
        if absent(error_code(exc)):
            return [], False
        raise AwsError(f"run store: s3://{bucket}/{key_prefix}: ListObjectsV2 failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None
    return out, False


def head_object(s3: Client, bucket: str, key: str) -> Item | None:
    """{"size": bytes, "etag": str} of the object ``key`` (HeadObject with ExpectedBucketOwner), or
    None when it (or the bucket) is not there (missing). Raises AwsError for other S3 errors."""
    try:
        got = s3.head_object(Bucket=bucket, Key=key, **expected_owner(bucket))
    except botocore.exceptions.ClientError as exc:
        if missing(s3, bucket, key, error_code(exc)):
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
        got = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}", **extra, **expected_owner(bucket))
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if code in ("412", "PreconditionFailed", "416", "InvalidRange") or missing(s3, bucket, key, code):
            return None
        raise AwsError(f"run store: s3://{bucket}/{key}: GetObject failed ({code})",
                       "see docs/iam-policy.json") from None
    body = got["Body"]
    try:
        data: bytes = body.read(end - start + 1)
    finally:
        body.close()
    return data


def download(s3: Client, bucket: str, key: str, out: Any, max_bytes: int) -> int:
    """Write the object ``key`` to ``out`` (a binary file object), in chunks of CHUNK_BYTES (memory
    stays bounded); return the bytes written. Raises TooLarge when it holds more than ``max_bytes``
    (what was written then is the caller's to remove), FileNotFoundError when it is gone, AwsError
    for other S3 errors."""
    try:
        got = s3.get_object(Bucket=bucket, Key=key, **expected_owner(bucket))
    except botocore.exceptions.ClientError as exc:
        if missing(s3, bucket, key, error_code(exc)):
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
