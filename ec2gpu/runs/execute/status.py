"""The agent's status record as the controller believes it: signature checked, every field validated.

status.json is written on the instance, where the job runs as the same user as the agent: the job
(or a process it left behind) can rewrite it. So the controller gives each attempt's agent a key of
its own (agent/agent.py ``--key-file``, written once the task's setup and all it left running have
ended, read and deleted before the job starts) and believes only a record signed with it; it
reads the record once, when the job has ended, and uses that copy for the verdict and for the
status.json it writes at home. Whatever the file holds, ``parse`` returns a record of the shape
below and never raises: an unreadable or unsigned record is a failed job
(exit 5) with its outputs and last lines brought home, never a crash of the controller.

Shape: ``{"state": "running" | "succeeded" | "failed" | "interrupted" | "unreadable" | "unverified",
"exit_code": int | None, "signal": int | None, "started_at": str | None, "ended_at": str | None,
"notice": {"action": str, "time": str} | None, "error": {"message": str, "exit_code": int | None,
"rank": int | None, "timestamp": float | None} | None, "rebalance": {"notice_time": str | None, "seen_at":
str | None} | None, "limit": {"ends_at": str | None, "stopped_at": str | None} | None (the agent stopped
the job before the run's --max-runtime), "problem": str | None}``.
"""
from __future__ import annotations

import hmac
import secrets
from typing import Any

from ...agent import agent
from ...wire import bounded_json

STATES = ("running", "succeeded", "failed", "interrupted")
FINAL_STATES = ("succeeded", "failed", "interrupted")
MAX_BYTES = 64 * 1024  # a status record is a few hundred bytes; more is not the agent's
MAX_TEXT = 2000  # characters kept of any text field (the agent keeps 2000 of a worker's error message)


def new_key() -> str:
    """A fresh signing key for one agent: 32 random bytes in hex (Python's secrets)."""
    return secrets.token_hex(32)


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
    """The record in ``data`` (status.json's bytes; None or b'': no record, None returned), its
    signature checked against ``key`` (hex; None: an agent started without one, nothing checked)
    and its fields validated to the shape above (pure; never raises)."""
    if not data:
        return None
    if len(data) > MAX_BYTES:
        return _problem("unreadable", f"status.json holds {len(data):,} bytes, more than an agent writes")
    try:
        raw = bounded_json.loads(data, max_bytes=MAX_BYTES)
    except bounded_json.Refused as exc:
        return _problem("unreadable", f"status.json refused: {exc}")
    if not isinstance(raw, dict):
        return _problem("unreadable", "status.json is not a JSON object")
    if key is not None:
        sig = raw.get("signature")
        if not isinstance(sig, str) or not hmac.compare_digest(sig, agent.sign(raw, key.encode())):
            return _problem("unverified", "status.json does not carry the agent's signature: something else wrote it")
    state = raw.get("state") if raw.get("state") in STATES else None
    if state is None:
        return _problem("unreadable", "status.json has no known state")
    return {"state": state, "exit_code": _int(raw.get("exit_code")), "signal": _int(raw.get("signal"), 0, 1 << 16),
            "started_at": _text(raw.get("started_at")), "ended_at": _text(raw.get("ended_at")),
            "notice": _notice(raw.get("notice")), "error": _error(raw.get("error")),
            "rebalance": _rebalance(raw.get("rebalance")), "limit": _limit(raw.get("limit")), "problem": None}


def read(conn: Any, run_dir: str, key: str | None) -> dict[str, Any] | None:
    """The agent's record on an instance (``parse`` of RUN_DIR/status.json, read once, at most
    MAX_BYTES + 1 bytes). Raises the connection's errors."""
    from ...remote import jobs
    return parse(jobs.read_from(conn, f"{run_dir}/status.json", 0, MAX_BYTES + 1), key)
