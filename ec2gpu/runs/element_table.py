"""The pool driver's element table (RUN_DIR/pool/table.json), read as hostile input, and the run's
element table brought home (pure). In runs/, below every stage, because a pool run is a run: its
ledger row, its logs (`ec2gpu logs`) and its hand-over read the table as pool/ does (runs/ never
imports pool/).

The driver (ec2gpu/pool/driver.py) runs on an instance the job shares: what it writes is bounded,
checked field by field and printed inert, like every record that comes from an instance.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..tasks.arrays import MAX_ELEMENTS, MAX_PARAMS
from ..wire import bounded_json
from . import job_summary

TABLE = "table.json"  # in RUN_DIR/pool/, where the driver writes it (pool/driver.py)
MAX_STATUS_BYTES = 16 * 1024 * 1024  # 10,000 elements' records with their last lines fit
#: the run directory's pool.json (and the records beside it) read back: the element table checked
#: from a status of at most MAX_STATUS_BYTES, written again with indentation
MAX_TABLE_BYTES = 4 * MAX_STATUS_BYTES
ELEMENT_STATES = ("queued", "running", "succeeded", "failed")
MAX_TAIL_LINES = 20
MAX_LINE_CHARS = 512
MAX_NODES = 256


class BadStatus(ValueError):
    """The driver's table is not one the controller accepts (the message says why)."""


def _int(value: Any, lo: int, hi: int, what: str, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadStatus(f"{what}: {str(value)[:40]!r} is not an integer in {lo}..{hi}")
    return value


def _seconds(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            not 0 <= value <= 366 * 86400:
        raise BadStatus(f"{what}: {str(value)[:40]!r} is not a number of seconds")
    return float(value)


def _epoch(value: Any, what: str) -> float | None:
    """A time as seconds since the epoch, between 2020 and 2100, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.5e9 <= value <= 4.1e9:
        raise BadStatus(f"{what}: {str(value)[:40]!r} is not a time")
    return float(value)


def _text(value: Any, what: str, limit: int = MAX_LINE_CHARS) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadStatus(f"{what}: not a string")
    return value[:limit]


def _params(raw: Any, index: int) -> dict[str, str]:
    """An element's own sweep parameters (a record read without the submitted elements): names
    and values as bounded text, at most MAX_PARAMS of them."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > MAX_PARAMS:
        raise BadStatus(f"element {index}: params is not an object of at most {MAX_PARAMS} names")
    return {str(_text(k, f"element {index}: a parameter's name", 64)):
            str(_text(v, f"element {index}: parameter {str(k)[:64]}", MAX_LINE_CHARS)) for k, v in raw.items()}


def _element(raw: Any, known: Mapping[int, Mapping[str, str]] | None) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise BadStatus("an element record is not an object")
    index = _int(raw.get("index"), 0, MAX_ELEMENTS - 1, "index")
    assert index is not None
    if known is not None and index not in known:
        raise BadStatus(f"element {index} was not submitted")
    status = raw.get("status")
    if status not in ELEMENT_STATES:
        raise BadStatus(f"element {index}: status {str(status)[:40]!r}")
    tail = raw.get("tail") or []
    if not isinstance(tail, list):
        raise BadStatus(f"element {index}: tail is not a list")
    nodes = raw.get("nodes") or []
    if not isinstance(nodes, list):
        raise BadStatus(f"element {index}: nodes is not a list")
    return {"index": index, "status": status,
            "params": dict(known[index]) if known is not None else _params(raw.get("params"), index),
            "attempts": _int(raw.get("attempts", 0), 0, 1000, f"element {index}: attempts"),
            "exit_status": _int(raw.get("exit_status"), -255, 255, f"element {index}: exit_status", optional=True),
            "node": _text(raw.get("node"), f"element {index}: node", 64),
            "nodes": [_text(n, f"element {index}: nodes", 64) for n in nodes[:1000]],
            "seconds": _seconds(raw.get("seconds"), f"element {index}: seconds"),
            "ended_at": _epoch(raw.get("ended_at"), f"element {index}: ended_at"),
            "error": _text(raw.get("error"), f"element {index}: error", 120),
            "tail": [_text(line, f"element {index}: tail") for line in tail[-MAX_TAIL_LINES:]]}


def parse_status(data: bytes, submitted: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """The driver's table (``data``: table.json's bytes, at most MAX_STATUS_BYTES) checked against the elements
    that were ``submitted`` (each with ``index`` and ``params``; None where they are not known,
    as for `ec2gpu fetch` on another machine: each record's own parameters are taken, checked
    as bounded text): {"final", "counts", "nodes" ({address: elements running}), "elements"
    [records in index order]}. Raises BadStatus."""
    if len(data) > MAX_STATUS_BYTES:
        raise BadStatus(f"{len(data):,} bytes: at most {MAX_STATUS_BYTES:,}")
    try:
        raw = bounded_json.loads(data, max_bytes=MAX_STATUS_BYTES)
    except bounded_json.Refused as exc:
        raise BadStatus(str(exc)) from None
    if not isinstance(raw, dict) or raw.get("schema") != 1:
        raise BadStatus("not a pool status (schema 1)")
    known = {int(e["index"]): e["params"] for e in submitted} if submitted is not None else None
    counts_raw = raw.get("counts")
    if not isinstance(counts_raw, dict):
        raise BadStatus("counts is not an object")
    counts = {k: _int(counts_raw.get(k, 0), 0, MAX_ELEMENTS, f"counts.{k}") for k in ("done", "failed", "running",
                                                                                         "queued")}
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, dict) or len(nodes_raw) > MAX_NODES:
        raise BadStatus("nodes is not an object of at most 256 addresses")
    nodes = {str(k)[:64]: _int(v, 0, MAX_ELEMENTS, f"nodes.{str(k)[:64]}") for k, v in nodes_raw.items()}
    elements_raw = raw.get("elements")
    if not isinstance(elements_raw, list) or len(elements_raw) > MAX_ELEMENTS:
        raise BadStatus("elements is not a list of at most 10,000 records")
    elements = sorted((_element(e, known) for e in elements_raw), key=lambda e: e["index"])
    return {"final": raw.get("final") is True, "counts": counts, "nodes": nodes, "elements": elements}


def accuracies(status: dict[str, Any], out: Any, schema: str = "task", secrets: Sequence[str] = ()) -> None:
    """Each element of ``status`` (parse_status's) given its test accuracy, where its outputs under
    ``out`` (a run's directory: outputs/INDEX/) hold a summary.json that has one (the built-in
    trainer's; read as hostile input, checked against ``schema``: runs/job_summary.py)."""
    for e in status["elements"]:
        path = Path(out) / "outputs" / str(e["index"]) / "summary.json"
        if path.is_file():
            summary = job_summary.read_summary(path, schema, secrets, root=Path(out))
            e["test_accuracy"] = job_summary.columns(summary or {}).get("test_acc")


def counts_of(raw: Any) -> dict[str, int]:
    """The element counts in ``raw`` (hostile: a live line's, a handed-over record's): each of
    done, failed, running and queued that is an integer from 0 to MAX_ELEMENTS, the others left
    out (pure; {} for what is not a mapping)."""
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k in ("done", "failed", "running", "queued")
            if isinstance(v := raw.get(k), int) and not isinstance(v, bool) and 0 <= v <= MAX_ELEMENTS}


def idle_workers(status: Mapping[str, Any], workers: Mapping[str, str]) -> list[str]:
    """The worker instances the pool can let go now (pure): none while an element waits; else
    each of ``workers`` ({instance id: private address}) whose node runs no element, or that Ray
    no longer lists (its node is gone)."""
    if status["counts"]["queued"]:
        return []
    nodes = status["nodes"]
    return [iid for iid, address in workers.items() if not nodes.get(address)]


def element_seconds(elements: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """{"count", "mean_seconds"} of the elements that succeeded (their last attempt's seconds), for
    the ledger, whose mean the next run of the task is estimated from (runs/plan/costs.element_minutes);
    None when none succeeded (pure)."""
    seconds = [float(e["seconds"]) for e in elements if e.get("status") == "succeeded"
               and isinstance(e.get("seconds"), (int, float)) and e["seconds"] > 0]
    return {"count": len(seconds), "mean_seconds": round(sum(seconds) / len(seconds), 3)} if seconds else None


def cost_shares(elements: Sequence[Mapping[str, Any]], cost_usd: float | None) -> list[float | None]:
    """Each element's share of the run's cost (pure): the run's ``cost_usd`` split by the seconds
    each element ran (its last attempt's), so the shares add up to the cost; None without a cost."""
    seconds = [float(e.get("seconds") or 0.0) for e in elements]
    total = sum(seconds)
    if cost_usd is None:
        return [None] * len(elements)
    if total <= 0:
        return [round(cost_usd / len(elements), 6) if elements else 0.0] * len(elements)
    return [round(cost_usd * s / total, 6) for s in seconds]


def with_cost_shares(record: Any) -> Any:
    """``record`` (a run record) with each element of ``record["pool"]`` given its ``cost_usd``
    share of the run's cost (cost_shares); a record without a pool is returned as it is."""
    pool = record.get("pool") if isinstance(record, Mapping) else None
    if pool and pool.get("elements"):
        for element, share in zip(pool["elements"], cost_shares(pool["elements"], record.get("cost_usd")), strict=True):
            element["cost_usd"] = share
    return record


def best_accuracy(elements: Sequence[Mapping[str, Any]]) -> tuple[float, int] | None:
    """(the highest test accuracy, a fraction 0..1, of the elements that succeeded; its element's
    index), or None when none has one (pure): a sweep's result, as `runs` and the run's table say it."""
    got = [(float(e["test_accuracy"]), int(e["index"])) for e in elements if e.get("status") == "succeeded"
           and isinstance(e.get("test_accuracy"), (int, float)) and not isinstance(e.get("test_accuracy"), bool)]
    return max(got, key=lambda a: (a[0], -a[1])) if got else None
