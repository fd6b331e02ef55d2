"""The instance agent's record of one job, ``RUN_DIR/agent-record.json``: written by agent/agent.py
(signed, replaced atomically, when the job starts, on a notice and when it ends), read by the
controller (runs/execute/status.py), by a detached run's agent (agent/attempt.py), by the
instance's idle rule (ami/idle-watch.sh) and, handed over to S3 when the controller is lost
(``handover/agent-record.json``), by `ec2gpu fetch` (runs/recover/handover.py).

One field list (FIELDS), one signature rule (``canonical``, ``sign``) and one validator (``parse``)
for the writer and every reader. The record is written where the job runs as the agent's user: the
job (or a process it left behind) can rewrite it. So the controller gives each attempt's agent a key
of its own and believes only a record signed with it; whatever the file holds, ``parse`` returns a
record of the shape below and never raises.

Standard library only: shipped flat beside agent.py (runs/execute/engine.py, runs/detached/launch.
AGENT_FILES), which loads it by its path as ``agent_record``; the controller imports
``ec2gpu.wire.agent_record``.

What the agent writes (FIELDS): ``state`` ("running" | "succeeded" | "failed" | "interrupted"),
``pid`` (the job's process group), ``agent_pid``, ``exit_code``, ``signal``, ``started_at``,
``ended_at`` (UTC, ISO 8601), ``notice`` (the spot interruption notice, when seen), ``rebalance``
(``{"notice_time", "seen_at"}``), ``limit`` (``{"ends_at", "stopped_at"}``: the agent stopped the job
before the run's --max-runtime), ``error`` (torchrun's root cause: ``{"message", "exit_code", "rank",
"timestamp"}``), the hand-over's ``handover``, ``handover_at``, ``handover_files``, ``array`` (an
array's element counts), and ``signature``.

``parse``'s shape: ``{"state": STATES | "unreadable" | "unverified", "exit_code": int | None,
"signal": int | None, "started_at": str | None, "ended_at": str | None, "notice": {"action": str,
"time": str} | None, "error": {"message": str, "exit_code": int | None, "rank": int | None,
"timestamp": float | None} | None, "rebalance": {"notice_time": str | None, "seen_at": str | None} |
None, "limit": {"ends_at": str | None, "stopped_at": str | None} | None, "problem": str | None}``.
"""
from __future__ import annotations

import hashlib
import hmac
import importlib.util
import json
import os
from typing import Any

if __package__:  # in the package (the controller, the tests)
    from . import bounded_json
else:  # flat, loaded by its path (agent.py runs with -I: nothing beside it is on sys.path), and so is
    # bounded_json.py beside it (shipped with it; in the source tree both lie in wire/)
    _spec = importlib.util.spec_from_file_location(
        "bounded_json", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bounded_json.py"))
    bounded_json = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]  # a path's spec: never None
    _spec.loader.exec_module(bounded_json)  # type: ignore[union-attr]

NAME = "agent-record.json"  # in the run directory
STATES = ("running", "succeeded", "failed", "interrupted")
FINAL_STATES = ("succeeded", "failed", "interrupted")
FIELDS = ("state", "pid", "agent_pid", "exit_code", "signal", "started_at", "ended_at", "notice", "rebalance",
          "limit", "error", "handover", "handover_at", "handover_files", "array", "signature")
MAX_BYTES = 64 * 1024  # a record is a few hundred bytes; more is not the agent's
MAX_TEXT = 2000  # characters kept of any text field (the agent keeps 2000 of a worker's error message)


def canonical(record: dict[str, Any]) -> bytes:
    """What a signature covers: ``record`` without ``signature``, as JSON with sorted keys and no spaces."""
    return json.dumps({k: v for k, v in record.items() if k != "signature"}, sort_keys=True,
                      separators=(",", ":")).encode()


def sign(record: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 of ``canonical(record)`` under ``key``, in hex (RFC 2104; Python's hmac)."""
    return hmac.new(key, canonical(record), hashlib.sha256).hexdigest()


def dumps(record: dict[str, Any], key: bytes | None) -> str:
    """The record's text as written: ``record`` (FIELDS only: ValueError for another) signed with
    ``key`` when there is one, indented JSON."""
    unknown = [k for k in record if k not in FIELDS]
    if unknown:
        raise ValueError(f"not fields of the agent's record: {', '.join(unknown)}")
    record = {k: v for k, v in record.items() if k != "signature"}
    if key:
        record["signature"] = sign(record, key)
    return json.dumps(record, indent=2)


def _int(v: object, lo: int = -(2 ** 31), hi: int = 2 ** 31) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi else None


def _text(v: object) -> str | None:
    return v[:MAX_TEXT] if isinstance(v, str) else None


def as_number(v: object) -> float | None:
    """A timestamp: a number, or text holding one (torchelastic writes it as text); else None."""
    try:
        f = float(v) if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None
    except ValueError:
        return None
    return f if f is not None and f == f and abs(f) < 1e12 else None  # NaN and absurd values: None


def _error(v: object) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        return None
    return {"message": _text(v.get("message")) or "", "exit_code": _int(v.get("exit_code")),
            "rank": _int(v.get("rank"), 0, 1 << 20), "timestamp": as_number(v.get("timestamp"))}


def _notice(v: object) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        return None
    return {"action": _text(v.get("action")) or "", "time": _text(v.get("time")) or ""}


def _rebalance(v: object) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        return None
    return {"notice_time": _text(v.get("notice_time")), "seen_at": _text(v.get("seen_at"))}


def _limit(v: object) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        return None
    return {"ends_at": _text(v.get("ends_at")), "stopped_at": _text(v.get("stopped_at"))}


def _problem(state: str, problem: str) -> dict[str, Any]:
    return {"state": state, "exit_code": None, "signal": None, "started_at": None, "ended_at": None,
            "notice": None, "error": None, "rebalance": None, "limit": None, "problem": problem}


def parse(data: bytes | None, key: str | None) -> dict[str, Any] | None:
    """The record in ``data`` (its bytes; None or b'': no record, None returned), its signature
    checked against ``key`` (hex; None: an agent started without one, nothing checked) and its
    fields validated to the shape above (pure; never raises)."""
    if not data:
        return None
    if len(data) > MAX_BYTES:
        return _problem("unreadable", f"{NAME} holds {len(data):,} bytes, more than an agent writes")
    try:
        raw = bounded_json.loads(data, max_bytes=MAX_BYTES)
    except bounded_json.Refused as exc:
        return _problem("unreadable", f"{NAME} refused: {exc}")
    if not isinstance(raw, dict):
        return _problem("unreadable", f"{NAME} is not a JSON object")
    if key is not None:
        sig = raw.get("signature")
        if not isinstance(sig, str) or not hmac.compare_digest(sig, sign(raw, key.encode())):
            return _problem("unverified", f"{NAME} does not carry the agent's signature: something else wrote it")
    state = raw.get("state") if raw.get("state") in STATES else None
    if state is None:
        return _problem("unreadable", f"{NAME} has no known state")
    return {"state": state, "exit_code": _int(raw.get("exit_code")), "signal": _int(raw.get("signal"), 0, 1 << 16),
            "started_at": _text(raw.get("started_at")), "ended_at": _text(raw.get("ended_at")),
            "notice": _notice(raw.get("notice")), "error": _error(raw.get("error")),
            "rebalance": _rebalance(raw.get("rebalance")), "limit": _limit(raw.get("limit")), "problem": None}
