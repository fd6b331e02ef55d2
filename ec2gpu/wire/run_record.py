"""A detached run's record, ``runs/<user>/<run_id>/state.json`` in the run store: its durable state,
written by the run's agent (agent/store.py) and, when the agent cannot, by the controller
(aws/runstore_records.py: the "pending" record at launch, an end recorded for it) and the boot
script (runs/detached/launch.boot_script: an agent refused); read by the agent of every launch and
by `ec2gpu status`, `runs --remote`, `fetch`, `logs` and the costs (runs/detached/).

One field list (FIELDS, INSTANCE_FIELDS, ATTEMPT_FIELDS), one vocabulary and one validator
(``parse``), for both sides: the writer writes only what ``parse`` gives back unchanged (``dumps``),
the reader takes nothing ``parse`` did not check. The run's role can rewrite the object (its job
holds the role), so every read is of hostile input: bounded (MAX_BYTES, bounded_json), each field
of its kind or None, unknown fields dropped.

Standard library only: shipped flat beside the detached agent (runs/detached/launch.AGENT_FILES),
which imports it as ``run_record``; the controller imports ``ec2gpu.wire.run_record``.

The record (JSON object; times ISO 8601 UTC): ``version`` (VERSION); ``run_id``; ``state``
(STATES: "pending" is the controller's, before any instance; starting | running | interrupted, then
FINAL_STATES); ``message`` (why the run ended, or null); ``launches`` (instances that started the
agent); ``attempt`` (job starts so far, all instances); ``restarts`` (restarts after a failed job or
setup, against spec.json's max_restarts_on_errors); ``interruptions`` (attempts that ended because
their instance went away: a spot notice, or an instance lost without one); ``instance_id`` (the
latest launch's, or the head's); ``instance_type``, ``market`` (written by no one today: null);
``started_at`` (the first launch's start), ``updated_at`` (the last write), ``ended_at``;
``exit_code``, ``signal`` (the last attempt's); ``group``; ``group_ended_at``; ``group_end_error``
(the last failure to set the group to 0, or null); ``generation`` (several nodes: the generation
the head that wrote it heads, agent/gang.py; 0 for one node); ``instances`` (one per launch:
INSTANCE_FIELDS); ``attempts`` (one per job start: ATTEMPT_FIELDS, ``outcome`` one of OUTCOMES:
"lost" when the next launch found it still running, its instance gone without a word; "regroup"
when the nodes stopped it to start again together). Each list keeps its newest MAX_ENTRIES.

Before this release the record was ``status.json`` and spoke another vocabulary (``reason``,
``created_at``, ``heartbeat_at``, ``restarts_on_errors``): a run started then is still read, for one
release, through ``upgrade`` (aws/runstore_records.py reads LEGACY_NAME when there is no NAME).
"""
from __future__ import annotations

import importlib
import json
import re
from typing import Any, Callable

if __package__:  # in the package (the controller, the tests)
    from . import bounded_json, names
else:  # on the instance: beside this file (runs/detached/launch.AGENT_FILES)
    bounded_json = importlib.import_module("bounded_json")
    names = importlib.import_module("names")

NAME = "state.json"  # its key under the run's prefix
LEGACY_NAME = "status.json"  # the previous release's name for it (read for one release)
VERSION = 2
STATES = ("pending", "starting", "running", "interrupted", "succeeded", "failed", "cancelled")
FINAL_STATES = ("succeeded", "failed", "cancelled")
OUTCOMES = ("running", "succeeded", "failed", "interrupted", "cancelled", "limit", "regroup", "lost")
MAX_BYTES = 1024 * 1024  # the agent keeps 100 launches and 100 attempts in it, ~80 KB
MAX_ENTRIES = 100  # instances and attempts kept (the newest)
MAX_TEXT = 2000  # characters of a message
MAX_COUNT = 1_000_000
#: the previous release's names (version 1, or a record without a version) -> this one's
RENAMED = {"reason": "message", "created_at": "started_at", "heartbeat_at": "updated_at",
           "restarts_on_errors": "restarts"}

_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:?[0-9]{2})?")
#: an instance id as the agent takes it from the metadata service (agent/gang.IID_RE)
_INSTANCE_ID = re.compile(r"[A-Za-z0-9-]{1,64}")
_INSTANCE_TYPE = re.compile(r"[a-z0-9][a-z0-9-]{0,15}\.[a-z0-9-]{1,16}")


class Unreadable(ValueError):
    """Not a record of this run: not JSON, not an object, too large, another run's, no known state."""


def count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT else None


def exit_code(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and -(2 ** 31) <= v <= 2 ** 31 else None


def signal(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 65535 else None


def text(v: object) -> str | None:
    return v[:MAX_TEXT] if isinstance(v, str) else None


def time(v: object) -> str | None:
    """``v`` when it is ISO 8601 text of _TIME's form, else None."""
    return v if isinstance(v, str) and _TIME.fullmatch(v) else None


def instance_id(v: object) -> str | None:
    return v if isinstance(v, str) and _INSTANCE_ID.fullmatch(v) else None


def flag(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _small(fields: tuple[str, ...]) -> Callable[[object], dict[str, str | None] | None]:
    """A checker of a small object of ``fields``, each text of at most 200 characters or None."""
    def check(v: object) -> dict[str, str | None] | None:
        if not isinstance(v, dict):
            return None
        return {k: v[k][:200] if isinstance(v.get(k), str) else None for k in fields}
    return check


#: a spot interruption notice as agent.py recorded it (the metadata service's instance-action, when seen)
notice = _small(("action", "time", "seen_at"))
#: a rebalance recommendation as agent.py recorded it
rebalance = _small(("notice_time", "seen_at"))

INSTANCE_FIELDS: dict[str, Callable[[object], Any]] = {
    "launch": count, "instance_id": instance_id, "started_at": time, "last_seen_at": time,
    "setup_exit_code": exit_code, "setup_runs": count, "resumed": flag, "checkpoint_files": count}
ATTEMPT_FIELDS: dict[str, Callable[[object], Any]] = {
    "attempt": count, "launch": count, "instance_id": instance_id, "started_at": time, "ended_at": time,
    "outcome": lambda v: v if v in OUTCOMES else None, "exit_code": exit_code, "signal": signal,
    "resume": flag, "notice": notice, "rebalance": rebalance}


def _entries(fields: dict[str, Callable[[object], Any]]) -> Callable[[object], list[dict[str, Any]]]:
    """A checker of a list of objects of ``fields``: the newest MAX_ENTRIES objects, each field checked."""
    def check(v: object) -> list[dict[str, Any]]:
        items = v[-MAX_ENTRIES:] if isinstance(v, list) else []
        return [{k: f(e.get(k)) for k, f in fields.items()} for e in items if isinstance(e, dict)]
    return check


#: every field of the record, in the order written, with its check (value or None; [] for a list)
FIELDS: dict[str, Callable[[object], Any]] = {
    "version": count, "run_id": lambda v: v if isinstance(v, str) and names.RUN_ID.fullmatch(v) else None,
    "state": lambda v: v if v in STATES else None, "message": text,
    "launches": count, "attempt": count, "restarts": count, "interruptions": count,
    "instance_id": instance_id, "instance_type": lambda v: v if isinstance(v, str) and _INSTANCE_TYPE.fullmatch(v) else None,
    "market": lambda v: v if v in ("spot", "on-demand") else None,
    "started_at": time, "updated_at": time, "ended_at": time, "exit_code": exit_code, "signal": signal,
    "group": lambda v: v if isinstance(v, str) and v.startswith(names.GROUP_PREFIX) and len(v) <= 255 else None,
    "group_ended_at": time, "group_end_error": text, "generation": count,
    "instances": _entries(INSTANCE_FIELDS), "attempts": _entries(ATTEMPT_FIELDS)}
#: what `ec2gpu status` shows of it (``view``), with "problem" (why a record was not readable)
VIEW_FIELDS = ("run_id", "state", "attempt", "restarts", "interruptions", "launches", "instance_id", "instance_type",
               "market", "exit_code", "signal", "started_at", "updated_at", "ended_at", "message", "problem")


def new(run_id: str, group: str, at: str) -> dict[str, Any]:
    """A fresh record (every field) of a run whose first launch starts at ``at`` (ISO 8601 UTC)."""
    return {**{k: None for k in FIELDS}, "version": VERSION, "run_id": run_id, "state": "starting", "launches": 0,
            "attempt": 0, "restarts": 0, "interruptions": 0, "started_at": at, "group": group, "generation": 0,
            "instances": [], "attempts": []}


def upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    """A record of the previous release (``version`` 1 or none) in this one's vocabulary (RENAMED);
    one of this release as it is. Drop with LEGACY_NAME in the release after this one."""
    if raw.get("version") == VERSION:
        return raw
    return {RENAMED.get(k, k): v for k, v in raw.items() if not (k in RENAMED and RENAMED[k] in raw)}


def parse(raw: object, run_id: str) -> dict[str, Any]:
    """The record of run ``run_id`` in ``raw`` (JSON already read), every field of FIELDS checked:
    None (a list: []) when absent or not of its kind, unknown fields dropped (pure). Raises
    Unreadable when ``raw`` is not an object, names another run, or has no known state."""
    if not isinstance(raw, dict):
        raise Unreadable("the record is not a JSON object")
    raw = upgrade(raw)
    if raw.get("run_id", run_id) != run_id:
        raise Unreadable("the record names another run")
    if raw.get("state") not in STATES:
        raise Unreadable("the record has no known state")
    return {**{k: check(raw.get(k)) for k, check in FIELDS.items()}, "run_id": run_id}


def loads(data: bytes, run_id: str) -> dict[str, Any]:
    """``parse`` of ``data``, the object's bytes (read through bounded_json, at most MAX_BYTES).
    Raises Unreadable, its message saying why in plain words."""
    if len(data) > MAX_BYTES:
        raise Unreadable(f"the record holds more than {MAX_BYTES:,} bytes")
    try:
        raw = bounded_json.loads(data, max_bytes=MAX_BYTES)
    except bounded_json.Refused as exc:
        raise Unreadable(f"the record refused: {exc}") from None
    return parse(raw, run_id)


def dumps(record: dict[str, Any], run_id: str) -> bytes:
    """``record`` (some or all of FIELDS; ``run_id`` set to ``run_id``) as the object's bytes.
    Raises ValueError for a record that is not JSON, is larger than MAX_BYTES, has a field FIELDS
    does not name, or one ``parse`` would not give back as it is (an entry's fields not given are
    read as None): what is written is what every reader takes."""
    if not isinstance(record, dict):
        raise ValueError(f"a run record is a dict, not {type(record).__name__}")
    record = {**record, "version": VERSION, "run_id": run_id}
    try:
        body = json.dumps(record, indent=1, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the record of {run_id} is not JSON ({exc})") from None
    if len(body) > MAX_BYTES:
        raise ValueError(f"the record of {run_id} holds more than {MAX_BYTES:,} bytes")
    checked = parse(record, run_id)  # Unreadable is a ValueError
    wrong = [k for k in record if k not in FIELDS or not _kept(record[k], checked[k])]
    if wrong:
        raise ValueError(f"the record of {run_id}: {', '.join(wrong)} not of the record's fields and kinds")
    return body


def _kept(given: object, checked: object) -> bool:
    """Whether ``parse`` gave back ``given`` as it was: an object's fields that were given (the
    others it adds as None), a list's items one by one, any other value equal."""
    if isinstance(given, dict):
        return isinstance(checked, dict) and all(k in checked and _kept(v, checked[k]) for k, v in given.items())
    if isinstance(given, list):
        return isinstance(checked, list) and len(given) == len(checked) and all(map(_kept, given, checked))
    return given == checked and type(given) is type(checked)


def view(data: bytes, run_id: str) -> dict[str, Any]:
    """What `ec2gpu status` shows of the record in ``data`` (pure, never raises): VIEW_FIELDS, each
    as ``parse`` checked it (text as it came, bounded: print it through ec2gpu.inert), "problem"
    None. A record that is not readable (``loads`` raised) is all None but ``run_id``, ``state``
    "unreadable" and ``problem`` saying why."""
    try:
        record = loads(data, run_id)
    except Unreadable as exc:
        return unreadable(run_id, str(exc))
    return {**{k: record.get(k) for k in VIEW_FIELDS}, "problem": None}


def unreadable(run_id: str, problem: str) -> dict[str, Any]:
    """``view``'s answer for a record that could not be read, ``problem`` saying why."""
    return {**{k: None for k in VIEW_FIELDS}, "run_id": run_id, "state": "unreadable", "problem": problem}
