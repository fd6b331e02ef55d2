"""A detached run's records in the run store, as the controller reads and writes them: the run's
record ``state.json`` (its fields, vocabulary and validator are wire/run_record.py, which the agent
ships too), the launches it lists (the cost of a detached run, issue 30), ``settled.json`` (its
instances as EC2 described them at their end), the cancel object, the names of its secrets, and the
run ids a user has there. Every object under a run's prefix may have been written by the run's
role: hostile input, read with bounds (aws/runstore_objects.py) and checked field by field.

A run started by the previous release has its record as ``status.json``, in that release's
vocabulary: it is read (and its end written) there when the run has no ``state.json``, for one
release (run_record.upgrade).
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import botocore.exceptions

from ..errors import AwsError
from ..wire import bounded_json, run_record
from . import runstore
from .runstore_objects import Conflict, absent, expected_owner, get_object, put_json, read_tagged, request
from .session import Client, Item, error_code

CONFLICT_TRIES = 5  # end_status: reads and writes of the record before a conflict is raised
#: launches billed from the record: the newest it keeps (the agent keeps run_record.MAX_ENTRIES)
MAX_LAUNCHES = run_record.MAX_ENTRIES
#: an instance id of EC2's form: the only ones a launch is billed by (EC2 describes them)
_EC2_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
_INSTANCE_TYPE = re.compile(r"[a-z0-9][a-z0-9-]{0,15}\.[a-z0-9-]{1,16}")
#: times outside these years are not an instance's (EC2 opened in 2006)
_YEARS = (2006, 2200)


def _match(v: object, pattern: re.Pattern[str]) -> str | None:
    return v if isinstance(v, str) and pattern.fullmatch(v) else None


# --- the run's record (state.json) ------------------------------------------------------------

def get_record_tagged(s3: Client, bucket: str, user: str, run_id: str) -> tuple[bytes | None, str | None, str]:
    """(the first run_record.MAX_BYTES + 1 bytes of the run's record, its ETag, its key): ``state.json``,
    or the previous release's ``status.json`` when there is none; (None, None, the record's key)
    when there is neither (no object, no bucket). Raises UsageError for a bad user or run id,
    AwsError for other S3 errors."""
    for key in (runstore.record_key(user, run_id), runstore.legacy_record_key(user, run_id)):
        data, etag = read_tagged(s3, bucket, key, run_record.MAX_BYTES + 1)
        if data is not None:
            return data, etag, key
    return None, None, runstore.record_key(user, run_id)


def get_status_bytes(s3: Client, bucket: str, user: str, run_id: str) -> bytes | None:
    """The bytes of the run's record (get_record_tagged: at most run_record.MAX_BYTES + 1, so a
    larger object reads as too large without being downloaded), None when there is none. For
    run_record.view (what `status` shows) and ``launches`` (the cost) from one read."""
    return get_record_tagged(s3, bucket, user, run_id)[0]


def get_status(s3: Client, bucket: str, user: str, run_id: str) -> Item | None:
    """The run's record as run_record.view shows it, or None when there is none (no object, no
    bucket). An object over run_record.MAX_BYTES (its ContentLength) is unreadable without being
    downloaded. Raises UsageError for a bad user or run id, AwsError for other S3 errors."""
    for key in (runstore.record_key(user, run_id), runstore.legacy_record_key(user, run_id)):
        got = get_object(s3, bucket, key)
        if got is None:
            continue
        body = got["Body"]
        try:
            size = got.get("ContentLength")
            if isinstance(size, int) and size > run_record.MAX_BYTES:  # not downloaded
                return run_record.unreadable(run_id, f"the record holds {size:,} bytes, more than "
                                                     f"{run_record.MAX_BYTES:,}")
            data: bytes = body.read(run_record.MAX_BYTES + 1)
        finally:
            body.close()
        return run_record.view(data, run_id)
    return None


def put_status(s3: Client, bucket: str, user: str, run_id: str, status: dict[str, Any], *,
               if_match: str | None = None, if_absent: bool = False, key: str | None = None) -> None:
    """Write ``status`` (some or all of run_record.FIELDS; ``run_id`` set to ``run_id``) as the
    run's record (``key``: its key, default runstore.record_key), replacing the one there; with
    ``if_match`` only over the object of that ETag, with ``if_absent`` only where there is none.
    Raises UsageError for a bad user or run id, ValueError for a record run_record.dumps refuses
    (not JSON, too large, a field not of its kind: what is written is what every reader takes),
    Conflict when the condition does not hold, AwsError for other S3 errors."""
    key = key or runstore.record_key(user, run_id)
    body = run_record.dumps(status, run_id)
    cond = {"IfMatch": if_match} if if_match is not None else {"IfNoneMatch": "*"} if if_absent else {}
    request(s3, "put_object", bucket, Key=key, Body=body, ContentType="application/json", **cond)


def end_status(s3: Client, bucket: str, user: str, run_id: str, state: str, message: str, at: str) -> bool:
    """Record the run's end when its agent cannot (`ec2gpu cancel` after its wait; `status` for a
    group that stopped without the agent's word): the record as it is, its launches and attempts
    kept (the run's cost is computed from them: runs/detached/costs.py), with ``state`` (one of
    run_record.FINAL_STATES), ``message`` and ``ended_at`` (``at``, ISO 8601 UTC) set, where it was
    read (get_record_tagged). A record that cannot be read is replaced by a new one; an end
    already recorded stands (nothing is written). The write is conditional on the record being as
    it was read: where the agent wrote in between, it is read again, and so an end it recorded
    meanwhile stands too. Returns whether this end was written. Raises ValueError for a state that
    is not final, Conflict when the record changed under CONFLICT_TRIES writes in a row, AwsError
    for other S3 errors."""
    if state not in run_record.FINAL_STATES:
        raise ValueError(f"{state!r} is not a final state")
    for _ in range(CONFLICT_TRIES):
        data, etag, key = get_record_tagged(s3, bucket, user, run_id)
        try:
            record = run_record.loads(data, run_id) if data is not None else {}
        except run_record.Unreadable:
            record = {}
        if record.get("state") in run_record.FINAL_STATES:  # an end recorded stands (the agent's, written since)
            return False
        try:
            put_status(s3, bucket, user, run_id, {**record, "state": state, "message": message[:run_record.MAX_TEXT],
                                                  "ended_at": at}, if_match=etag, if_absent=etag is None, key=key)
            return True
        except Conflict:
            continue  # written meanwhile: read again
    raise Conflict(f"the record of {run_id} changed under {CONFLICT_TRIES} writes in a row")


def put_cancel(s3: Client, bucket: str, user: str, run_id: str) -> None:
    """Write the run's cancel object (runstore.cancel_key): the agent, polling for it, stops the job
    and saves its outputs. Raises UsageError for a bad user or run id, AwsError for S3 errors."""
    request(s3, "put_object", bucket, Key=runstore.cancel_key(user, run_id), Body=b"cancelled by `ec2gpu cancel`\n")


def list_runs(s3: Client, bucket: str, user: str) -> list[str]:
    """The run ids of the user ``user`` that have objects in ``bucket`` (the ``runs/<user>/<run_id>/``
    prefixes, ListObjectsV2 with Delimiter '/', every page through boto3's paginator), sorted
    (oldest first, as run ids sort); a prefix that is not a run id is skipped. Another user's runs,
    and runs of the layout before the user id (``runs/<run_id>/``), are not listed. [] when the
    bucket does not exist. Raises UsageError for a bad user id, AwsError for other S3 errors."""
    found = set()
    mine = runstore.user_prefix(user)
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=mine, Delimiter="/",
                                                             **expected_owner(bucket))
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                name = str(common.get("Prefix", ""))[len(mine):]
                if name.endswith("/") and runstore.RUN_ID.fullmatch(name[:-1]):
                    found.add(name[:-1])
    except botocore.exceptions.ClientError as exc:
        if absent(error_code(exc)):
            return []
        raise AwsError(f"run store: s3://{bucket}/{mine}: ListObjectsV2 failed ({error_code(exc)})",
                       "see docs/iam-policy.json") from None
    return sorted(found)


def secret_names(s3: Client, bucket: str, user: str, run_id: str) -> list[str]:
    """The names of the run's secrets as its spec.json lists them (``secrets``; [] without any or
    without a spec): their values are in SSM Parameter Store (aws/parameters.py). The run's role
    could rewrite spec.json: a name that is not an environment variable's is left out, and at most
    100 are read. Raises AwsError for S3 errors other than a missing object."""
    data, _ = read_tagged(s3, bucket, runstore.spec_key(user, run_id), (1 << 20) + 1)
    try:
        spec = bounded_json.loads(data, max_bytes=1 << 20) if data else {}
    except bounded_json.Refused:
        return []
    names = spec.get("secrets") if isinstance(spec, dict) else None
    return [n for n in names if isinstance(n, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", n)][:100] \
        if isinstance(names, list) else []


# --- the record's launches (issue 30: the cost of a detached run) ------------------------------

def _when(v: object) -> str | None:
    """``v`` as ISO 8601 UTC text (``YYYY-mm-ddTHH:MM:SS[.f]+00:00``) when it is a time of
    run_record.time's form, with a zone (or none: UTC), that is a real date within _YEARS; else None."""
    text = run_record.time(v)
    if text is None:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    return t.isoformat() if _YEARS[0] <= t.year < _YEARS[1] else None


def launches(data: bytes | dict[str, Any], run_id: str) -> list[dict[str, Any]]:
    """The run's launches from its record (``data``: its bytes, or the JSON object already parsed)
    as the agent keeps them in ``instances`` (run_record.INSTANCE_FIELDS): one per instance that
    started the agent. Pure, never raises. A record run_record.parse does not take (hostile input:
    the job's role can write it) gives []; of its entries (the newest MAX_LAUNCHES) one without an
    instance id of EC2's form (``i-`` and 8-17 hex digits) or a valid ``started_at`` is dropped; a
    ``last_seen_at`` that is not a valid time, or is before ``started_at``, is None; a ``launch``
    that is not an int 1..run_record.MAX_COUNT is None. Two entries of one instance are one: the
    earliest start, the latest sighting. Times are normalised to ISO 8601 UTC ("+00:00"), years 2006-2199.

    Shape: ``[{"launch": int | None, "instance_id": "i-...", "started_at": ISO text,
    "last_seen_at": ISO text | None}]`` in the order recorded (oldest launch first).
    """
    try:
        record = run_record.parse(data, run_id) if isinstance(data, dict) else run_record.loads(bytes(data), run_id)
    except run_record.Unreadable:
        return []
    out: dict[str, dict[str, Any]] = {}
    for entry in record["instances"][-MAX_LAUNCHES:]:
        iid, start = _match(entry["instance_id"], _EC2_INSTANCE_ID), _when(entry["started_at"])
        if iid is None or start is None:
            continue
        seen = _when(entry["last_seen_at"])
        if seen is not None and _utc(seen) < _utc(start):
            seen = None
        got = {"launch": entry["launch"] or None, "instance_id": iid, "started_at": start, "last_seen_at": seen}
        if iid in out:  # one instance recorded twice: one span, the widest
            was = out[iid]
            got["started_at"] = min(was["started_at"], start, key=_utc)
            got["last_seen_at"] = max((t for t in (was["last_seen_at"], seen) if t), key=_utc, default=None)
            got["launch"] = was["launch"] if was["launch"] is not None else got["launch"]
        out[iid] = got
    return list(out.values())


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text)


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


# --- the run's instances as EC2 described them at their end (settled.json) --------------------
#
# EC2 lists a terminated instance for about an hour (DescribeInstances); after that its type,
# market, zone and times are known nowhere else. The first `status` or `runs --remote` that sees a
# run over, with every instance it launched listed as terminated, writes them here
# (runs/detached/costs.gather), so that its cost stays exact from any machine afterwards. It lies
# in the run's own prefix, which the run's role could write while an instance ran: read as hostile
# input like the record, and written again whenever EC2 still lists the instances (EC2 wins).

SETTLED = "settled.json"
MAX_SETTLED_BYTES = 256 * 1024
MAX_SETTLED = 1000  # instances kept (spec.json's max_launches at most)
_ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}[a-z]")


def put_settled(s3: Client, bucket: str, user: str, run_id: str, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` ({"instance_id", "instance_type", "market", "zone", "launched_at",
    "terminated_at"}: ISO 8601 UTC times) as the run's settled.json. Raises AwsError for S3 errors."""
    put_json(s3, bucket, runstore.prefix(user, run_id) + SETTLED, {"run_id": run_id, "instances": rows[:MAX_SETTLED]})


def get_settled(s3: Client, bucket: str, user: str, run_id: str) -> list[dict[str, Any]]:
    """The rows of the run's settled.json (put_settled's shape), each field checked: an entry
    with an instance id, type, market, zone or time not of EC2's form, or ending before it
    started, is dropped; another run's record, an object that is not JSON or is larger than
    MAX_SETTLED_BYTES gives []. [] when there is none. Raises AwsError for other S3 errors."""
    data, _ = read_tagged(s3, bucket, runstore.prefix(user, run_id) + SETTLED, MAX_SETTLED_BYTES + 1)
    if data is None:
        return []
    try:
        raw = bounded_json.loads(data, max_bytes=MAX_SETTLED_BYTES)
    except bounded_json.Refused:
        return []
    if not isinstance(raw, dict) or raw.get("run_id") != run_id or not isinstance(raw.get("instances"), list):
        return []
    out = []
    for e in raw["instances"][:MAX_SETTLED]:
        if not isinstance(e, dict):
            continue
        row = {"instance_id": _match(e.get("instance_id"), _EC2_INSTANCE_ID),
               "instance_type": _match(e.get("instance_type"), _INSTANCE_TYPE),
               "market": e.get("market") if e.get("market") in ("spot", "on-demand") else None,
               "zone": _match(e.get("zone"), _ZONE), "launched_at": _when(e.get("launched_at")),
               "terminated_at": _when(e.get("terminated_at"))}
        start, end = row["launched_at"], row["terminated_at"]
        if all(v is not None for v in row.values()) and start and end and _utc(end) >= _utc(start):
            out.append(row)
    return out
