"""A detached run's prefix in S3 as its agent sees it (``Store``), and the run's record held as a lease
(``Lease``): read at the start of each launch, written whole (PutObject is atomic), every write
conditional on the ETag this launch last read or wrote (S3 conditional writes), so a newer launch's
record written between this launch's check and its write is never lost under it, and of two
launches that read the record at once only the first takes the number. A launch that finds a
later launch recorded (the group may start a replacement while this one still runs: a failed health check
of a live instance; Capacity Rebalancing, off in a run's group, would too), or an
end it did not write, is Superseded: it writes nothing more. The record's schema is
wire/run_record.py. Standard library and boto3 only: shipped beside detached.py.

"End the group" is UpdateAutoScalingGroup to 0/0/0, never a shutdown (the group would replace the
instance); a failed call is retried with backoff for as long as this process lives, each failure
recorded; the group's scheduled deadline action (set by the controller) is the net when even that fails.
"""
from __future__ import annotations

import hashlib
import importlib
import json
from datetime import datetime, timezone
from typing import Any, Callable

if __package__:  # in the package (tests, the controller)
    from ..wire import bounded_json, names, run_record
else:  # on the instance: beside this file (runs/detached/launch.AGENT_FILES), not a package to install
    bounded_json = importlib.import_module("bounded_json")
    names = importlib.import_module("names")
    run_record = importlib.import_module("run_record")

Refused = names.Refused
#: S3's answers to a conditional write that did not hold (NoSuchKey: IfMatch on an object deleted
#: since; https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); the same
#: as aws/runstore_objects.py's, which this file cannot import (it ships alone; a test compares them)
CONFLICT_CODES = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404")
#: the first botocore whose S3 model has PutObject's IfMatch (botocore CHANGELOG.rst 1.35.69: "Add support
#: for ETag based conditional writes in PutObject"; IfNoneMatch came in 1.35.2), boto3 1.35.69 requiring it:
#: the least a run of several nodes needs (the agent's own boto3 is its controller's: launch.agent_files)
MIN_CONDITIONAL_BOTOCORE = "1.35.69"
CONFLICT_TRIES = 5  # record writes tried again after a conflict that does not supersede this launch
END_SAVE_TRIES = 8  # the run's end written before its group is ended (Lease.end): ~4 min
MAX_TRANSFER_FILES = 100_000  # checkpoint and output files listed at once
RECORD = run_record.NAME
CANCEL = "cancel"  # any object there: the run is cancelled (`ec2gpu cancel` writes it)


class Superseded(Exception):
    """A later launch of the run is recorded: this one must stop writing."""


class Conflict(Exception):
    """A conditional write found the object changed since this launch last read or wrote it
    (S3's 412 PreconditionFailed, or 409 ConditionalRequestConflict for a write under way)."""


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def code_of(exc: BaseException) -> str:
    """A botocore ClientError's code ('NoSuchKey', '404'), '' for other errors."""
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


class Store:
    """The run's prefix ``runs/<user>/<run_id>/`` in ``bucket`` (names.run_prefix, as the run store's
    aws/runstore.prefix): every key is built here from a relative path checked by names.safe_rel."""

    def __init__(self, s3: Any, bucket: str, user: str, run_id: str):
        self.s3, self.bucket, self.run_id = s3, bucket, run_id
        self.prefix = names.run_prefix(user, run_id)

    def key(self, rel: str) -> str:
        if names.safe_rel(rel) is None:
            raise Refused(f"not a key inside the run: {rel[:200]!r}")
        return self.prefix + rel

    @property
    def conditional(self) -> bool:
        """Whether this machine's botocore can write conditionally (PutObject's IfMatch and
        IfNoneMatch, both in its model from MIN_CONDITIONAL_BOTOCORE): an older one writes unconditionally."""
        shape = self.s3.meta.service_model.operation_model("PutObject").input_shape
        return "IfMatch" in shape.members and "IfNoneMatch" in shape.members

    def get_tagged(self, rel: str, limit: int, sha256: str | None = None) -> tuple[bytes | None, str | None]:
        """(the object's first ``limit`` + 1 bytes, its ETag), (None, None) when there is none.
        Raises Refused when ``sha256`` is given and the object is over ``limit`` bytes (its hash
        could only fail on the bytes read: said as what it is), or its bytes have another (lowercase hex)."""
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as exc:
            if code_of(exc) in ("NoSuchKey", "404", "NotFound"):
                return None, None
            raise
        data = bytes(got["Body"].read(limit + 1))
        if sha256 is not None and len(data) > limit:
            raise Refused(f"{rel} is too large: over {limit:,} bytes, more than the agent reads")
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise Refused(f"{rel} is not the one this run was launched with (another sha256 than its launch template "
                          "says): rewritten in S3 after launch")
        return data, got.get("ETag")

    def get_bytes(self, rel: str, limit: int) -> bytes | None:
        return self.get_tagged(rel, limit)[0]

    def get_json(self, rel: str, limit: int, sha256: str | None = None) -> object:
        return self.get_json_tagged(rel, limit, sha256)[0]

    def get_json_tagged(self, rel: str, limit: int, sha256: str | None = None) -> tuple[object, str | None]:
        """(the JSON object at ``rel`` or None, its ETag or None). Raises Refused (over ``limit``
        bytes, not JSON, not of ``sha256``: get_tagged)."""
        data, etag = self.get_tagged(rel, limit, sha256)
        if data is None:
            return None, None
        if len(data) > limit:
            raise Refused(f"{rel}: over {limit} bytes")
        try:
            return bounded_json.loads(data, max_bytes=limit), etag
        except bounded_json.Refused as exc:
            raise Refused(f"{rel}: {exc}") from None

    def put(self, rel: str, body: bytes, *, if_match: str | None = None, if_absent: bool = False,
            content_type: str = "application/json") -> str | None:
        """Write ``body`` at ``rel``; returns its new ETag. ``if_match``: only over the object of that
        ETag; ``if_absent``: only where there is none (S3 conditional writes). Raises Conflict when the
        condition does not hold."""
        cond: dict[str, str] = {}
        if if_match is not None:
            cond["IfMatch"] = if_match
        elif if_absent:
            cond["IfNoneMatch"] = "*"
        try:
            put = self.s3.put_object(Bucket=self.bucket, Key=self.key(rel), Body=body, ContentType=content_type, **cond)
        except Exception as exc:
            if cond and code_of(exc) in CONFLICT_CODES:
                raise Conflict(f"{rel} changed ({code_of(exc)})") from None
            raise
        return put.get("ETag") if isinstance(put, dict) else None

    def put_json(self, rel: str, obj: object, *, if_match: str | None = None, if_absent: bool = False) -> str | None:
        """``put`` of ``obj`` as JSON."""
        return self.put(rel, json_bytes(obj), if_match=if_match, if_absent=if_absent)

    def exists(self, rel: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=self.key(rel))
            return True
        except Exception as exc:
            if code_of(exc) in ("NoSuchKey", "404", "NotFound"):
                return False
            raise

    def listing(self, rel_dir: str, limit: int = MAX_TRANSFER_FILES) -> dict[str, int]:
        """{path under ``rel_dir``: size} of the objects there, at most ``limit``; keys that are not
        plain relative paths are left out."""
        base = self.key(rel_dir) + "/"
        found: dict[str, int] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            for o in page.get("Contents", []):
                rel = o["Key"][len(base):]
                if names.safe_rel(rel) is not None and len(found) < limit:
                    found[rel] = int(o.get("Size", 0))
        return found


def json_bytes(obj: object) -> bytes:
    return json.dumps(obj, indent=1).encode()


class Lease:
    """The run's record (``status``: wire/run_record.py's fields) as this launch holds it, and the
    group it ends. ``launch``: this launch's number; with several nodes (``several``) the head of
    ``generation`` writes it, its ``instances`` from the node records (``instances_of``)."""

    def __init__(self, ctx: Any, group: str):
        self.ctx, self.group = ctx, group
        self.status: dict[str, Any] = run_record.new(ctx.run_id, group, iso(ctx.clock()))
        #: the record's ETag as this launch last read or wrote it: each write is conditional on it
        #: (None: there was none), so a write by another launch in between is never lost under ours
        self.etag: str | None = None
        self.conditional = ctx.store.conditional
        self.launch = 0
        self.several = False
        self.generation = 0
        self.instances_of: Callable[[], list[dict[str, Any]]] = lambda: self.status["instances"]

    def now(self) -> str:
        return iso(self.ctx.clock())

    def adopt(self, data: bytes | None) -> dict[str, Any]:
        """``status`` from the record's bytes ``data``: a fresh record with every field the stored one
        holds of its kind (wire/run_record.parse; one that is not a record: a fresh one)."""
        st = run_record.new(self.ctx.run_id, self.group, self.now())
        st.update({k: v for k, v in (self.parsed(data) or {}).items() if v is not None})
        self.status = st
        return st

    def parsed(self, data: bytes | None) -> dict[str, Any] | None:
        """The record in ``data`` (run_record.loads), None for none or one that is not this run's record."""
        try:
            return run_record.loads(data, self.ctx.run_id) if data is not None else None
        except run_record.Unreadable:
            return None

    def _read(self, tagged: bool) -> bytes | None:
        """The record's bytes (its ETag kept with ``tagged``). Raises Refused for one over
        run_record.MAX_BYTES or not JSON, S3's errors."""
        data: bytes | None  # Store.get_tagged's
        data, etag = self.ctx.store.get_tagged(RECORD, run_record.MAX_BYTES)
        if tagged:
            self.etag = etag
        if data is not None and len(data) > run_record.MAX_BYTES:
            raise Refused(f"{RECORD}: over {run_record.MAX_BYTES} bytes")
        try:
            bounded_json.loads(data, max_bytes=run_record.MAX_BYTES) if data is not None else None
        except bounded_json.Refused as exc:
            raise Refused(f"{RECORD}: {exc}") from None
        return data

    def load(self) -> dict[str, Any]:
        """``status`` adopted from the record read at the start of a launch, its ETag kept. Raises
        Refused for one over run_record.MAX_BYTES or not JSON (the launch then ends the run failed)."""
        return self.adopt(self._read(tagged=True))

    def fetch(self) -> dict[str, Any]:
        """``status`` adopted from the record read again (its ETag not taken). Raises as ``load``."""
        return self.adopt(self._read(tagged=False))

    def read_tagged(self) -> dict[str, Any] | None:
        """The record read again, its ETag kept for the next conditional write; one that is not a
        record (too large, not JSON) is None: written over."""
        data, self.etag = self.ctx.store.get_tagged(RECORD, run_record.MAX_BYTES)
        return self.parsed(data)

    def reread(self) -> dict[str, Any]:
        """``status`` adopted from the record read again, its ETag kept (one that is not a record:
        a fresh one, written over). Raises S3's errors."""
        data, self.etag = self.ctx.store.get_tagged(RECORD, run_record.MAX_BYTES)
        return self.adopt(data)

    def check_superseded(self) -> None:
        """Superseded when the record holds a later launch than this one, or an end this launch
        did not write (`ec2gpu cancel` records "cancelled" itself when the agent does not answer in
        time): an end recorded is never overwritten. An error reading it is said, not raised: the
        next check reads it again."""
        try:
            there = self.parsed(self.ctx.store.get_bytes(RECORD, run_record.MAX_BYTES))
        except Exception as exc:
            self.ctx.log(f"{RECORD} not read: {type(exc).__name__}: {exc}"[:500])
            return
        self.raise_if_superseded(there)

    def raise_if_superseded(self, there: dict[str, Any] | None, ends: bool = True) -> None:
        """Superseded when the record read (``there``) holds a later launch, the same launch number
        taken by another instance (two launches that read the record at once: the first to write
        it has it), or (with ``ends``) an end this launch did not write."""
        if there is None:
            return
        ended = ends and there["state"] in run_record.FINAL_STATES and self.status["state"] not in run_record.FINAL_STATES
        if self.several:  # a newer generation's head writes the record now
            if (there["generation"] or 0) > self.generation:
                raise Superseded(f"generation {there['generation']} is recorded; this head's is {self.generation}")
            if ended:
                raise Superseded(f"the run is already recorded as {there['state']}")
            return
        launches, mine = there["launches"], self.status["instance_id"]
        if launches is not None and launches > self.launch:
            raise Superseded(f"launch {launches} is recorded; this is launch {self.launch}")
        if launches == self.launch and there["instance_id"] not in (None, mine) and mine not in (None, "unknown"):
            raise Superseded(f"launch {launches} was taken by {there['instance_id']!r} first")
        if ended:
            raise Superseded(f"the run is already recorded as {there['state']}")

    def save(self, check: bool = True) -> None:
        """The record written whole; with ``check``, Superseded first when a later launch is recorded.

        The write is conditional on the record being as this launch last read or wrote it: where
        another writer came in between (check_superseded read it, and a newer launch wrote before
        this write), S3 refuses it (Conflict); the record is read again then, and this launch is
        Superseded by a later launch (even with ``check`` False: this launch's own end does not
        overwrite a newer launch's record, nor end its group), by an end it did not write (with
        ``check``), or else writes over it (an older launch's last heartbeat, a record that is not
        one), up to CONFLICT_TRIES times. Raises ValueError for a record run_record.dumps refuses."""
        if check:
            self.check_superseded()
        self.status["updated_at"] = self.now()
        if self.several:
            self.status.update(generation=self.generation, instances=self.instances_of())
        elif self.status["instances"]:
            self.status["instances"][-1]["last_seen_at"] = self.status["updated_at"]
        body = run_record.dumps(self.status, self.ctx.run_id)
        store = self.ctx.store
        if not self.conditional:
            store.put(RECORD, body)
            return
        for _ in range(CONFLICT_TRIES):
            try:
                self.etag = store.put(RECORD, body, if_match=self.etag, if_absent=self.etag is None)
                return
            except Conflict as exc:
                self.ctx.log(f"{RECORD}: {exc}; read again")
                self.raise_if_superseded(self.read_tagged(), ends=check)  # one not a record supersedes nothing
        raise Conflict(f"{RECORD} changed under {CONFLICT_TRIES} writes in a row")

    def try_save(self, check: bool = True) -> None:
        try:
            self.save(check)
        except Superseded:
            raise
        except Exception as exc:  # S3 for a moment out of reach: the next write carries the record
            self.ctx.log(f"{RECORD} not written: {type(exc).__name__}: {exc}"[:500])

    def end(self, state: str, message: str | None) -> int:
        """The run's end: ``state`` recorded, then the group set to 0 (end_group). The record is
        written before the group goes, tried END_SAVE_TRIES times with backoff (2 s doubling) when
        S3 does not take it: a group at 0 under a record that still says "running" reads, to
        `ec2gpu status`, as a run that ended without its agent's word (failed). When S3 never takes
        it, the group is ended all the same (the record's last word is then the group's). Returns 0."""
        message = message if message is None else message[:run_record.MAX_TEXT]
        self.status.update(state=state, message=message, ended_at=self.status["ended_at"] or self.now())
        delay = 2.0
        for attempt in range(END_SAVE_TRIES):
            try:
                self.save(check=False)
                break
            except Superseded:
                raise
            except Exception as exc:  # S3 out of reach for a moment: tried again, the group still up
                self.ctx.log(f"the end ({state}) not recorded yet: {type(exc).__name__}: {exc}"[:500])
                if attempt + 1 < END_SAVE_TRIES:
                    self.ctx.sleep(delay)
                    delay = min(delay * 2, 60.0)
        self.end_group()
        return 0

    def end_group(self) -> None:
        """UpdateAutoScalingGroup to 0/0/0 with the instance role's credentials, retried with
        backoff (2 s doubling to 60 s) until it is done; each failure recorded."""
        delay = 2.0
        while True:
            try:
                self.ctx.asg.update_auto_scaling_group(AutoScalingGroupName=self.group, MinSize=0, MaxSize=0,
                                                       DesiredCapacity=0)
            except Exception as exc:
                self.status["group_end_error"] = f"{self.now()} {type(exc).__name__}: {exc}"[:1000]
                self.ctx.log(f"the group is not ended yet: {self.status['group_end_error']}")
                self.try_save(check=False)
                self.ctx.sleep(delay)
                delay = min(delay * 2, 60.0)
                continue
            self.status.update(group_ended_at=self.now(), group_end_error=None)
            self.try_save(check=False)
            return

    def cancelled(self) -> bool:
        """Whether the run's cancel object is there; an error reading it is said, and False."""
        try:
            return bool(self.ctx.store.exists(CANCEL))
        except Exception as exc:
            self.ctx.log(f"cancel not checked: {type(exc).__name__}: {exc}"[:300])
            return False
