"""The ledger: a SQLite history of runs in the tool's home ($EC2GPU_HOME/ledger.sqlite).

A run is recorded when it starts (status "running") and updated when it ends, so a controller that
died mid-run still leaves a row. Schema changes are appended to MIGRATIONS and applied in order;
``PRAGMA user_version`` records how many have run. Never edit or remove an applied migration.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping

from ...errors import LedgerError, UsageError
from ...settings import private_home
from ...tasks.spec import minutes
from .. import job_summary

MIGRATIONS: list[str] = [
    # 1: the runs table
    """
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        command TEXT NOT NULL,
        backend TEXT NOT NULL,            -- aws | sandbox | local
        region TEXT,
        zone TEXT,
        instance_ids TEXT NOT NULL DEFAULT '[]',   -- JSON list
        instance_type TEXT,
        gpu TEXT,
        market TEXT,                      -- on-demand | spot | local
        model TEXT,
        epochs INTEGER,
        status TEXT NOT NULL,             -- running | completed | failed | interrupted | spot-interrupted
        exit_status INTEGER,
        test_acc REAL,
        started_at TEXT NOT NULL,         -- ISO 8601 UTC, when the command started
        ended_at TEXT,
        launched_at TEXT,                 -- the instance's LaunchTime
        terminated_at TEXT,               -- from the instance's StateTransitionReason
        billed_seconds REAL,
        usd_per_hour REAL,
        cost_usd REAL,
        price_source TEXT,
        estimated_cost_usd REAL,
        estimate TEXT,                    -- JSON: costs.Estimate
        phases TEXT NOT NULL DEFAULT '{}',  -- JSON: phase -> seconds
        train_seconds REAL,
        samples_per_second REAL,
        artifacts TEXT
    )
    """,
    # 2: listing by time (`ec2gpu runs --since`)
    "CREATE INDEX runs_started_at ON runs (started_at)",
    # 3: one entry per instance a managed run used: instance, zone, market, seconds, cost, why it ended
    "ALTER TABLE runs ADD COLUMN attempts TEXT NOT NULL DEFAULT '[]'",
    # 4: which task ran (`ec2gpu run`: the task's name; the built-in job: mnist)
    "ALTER TABLE runs ADD COLUMN task TEXT",
    # 5: the job's own summary.json (from $EC2GPU_OUTPUT_DIR), when it wrote one
    "ALTER TABLE runs ADD COLUMN summary TEXT",
    # 6: the process that runs it (JSON: host, pid, start time), so a run whose controller died
    # can be told from one still running; such a run ends as status controller-lost (reconcile.py)
    "ALTER TABLE runs ADD COLUMN controller TEXT",
    # 7: which check the summary passed (job_summary.py): mnist, bench or task; invalid when it failed
    # (summary then holds {"invalid": why, "raw": text}); NULL on rows written before the checks
    "ALTER TABLE runs ADD COLUMN summary_schema TEXT",
    # 8: an array's or a sweep's element times (JSON: {"count", "mean_seconds"} of its succeeded
    # elements; runs/element_table.element_seconds), from which the next run's estimate is made
    "ALTER TABLE runs ADD COLUMN element_seconds TEXT",
    # 9: what the run's history is keyed by (runs/job.TaskJob.history_key: a command's is its task's
    # name and the command); NULL on older rows, whose key is their task's name (``history_key``)
    "ALTER TABLE runs ADD COLUMN task_key TEXT",
]

JSON_COLUMNS = ("instance_ids", "estimate", "phases", "attempts", "summary", "controller", "element_seconds")
NULLABLE_JSON_COLUMNS = ("estimate", "summary", "controller", "element_seconds")
#: columns a table formats as numbers: a value that is not a finite number reads as None
NUMBER_COLUMNS = ("billed_seconds", "usd_per_hour", "cost_usd", "estimated_cost_usd")


def path_in(home: Path) -> Path:
    return home / "ledger.sqlite"


def unreadable(home: Path, exc: Exception) -> LedgerError:
    """The LedgerError for ``exc`` (sqlite3 or OS error) on the ledger in ``home``: names the file and
    how to set it aside."""
    path = path_in(home)
    return LedgerError(f"the ledger {path} cannot be used ({type(exc).__name__}: {exc})",
                       f"set it aside with `mv {path} {path}.bad` (a new ledger starts; nothing on AWS depends on it)")


def connect(home: Path) -> sqlite3.Connection:
    """Open (creating and migrating) the ledger in ``home`` (made 0700: settings.private_home). The
    file is 0600, this user's alone whatever the umask: SQLite would make it 0644 (and its journal
    takes the database's mode). Raises LedgerError when it is not a usable SQLite database."""
    try:
        private_home(home)
        path = path_in(home)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        if path.stat().st_mode & 0o077:  # one an older version made
            path.chmod(0o600)
        db = sqlite3.connect(path, timeout=10)
        db.row_factory = sqlite3.Row
        migrate(db)
    except (sqlite3.Error, OSError) as exc:
        raise unreadable(home, exc) from None
    return db


def migrate(db: sqlite3.Connection) -> int:
    """Apply the migrations not yet applied; return the schema version now."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    for i, sql in enumerate(MIGRATIONS[version:], start=version + 1):
        with db:
            db.execute(sql)
            db.execute(f"PRAGMA user_version = {i}")
    return len(MIGRATIONS)


def _columns(db: sqlite3.Connection) -> set[str]:
    """The names of the runs table's columns (``PRAGMA table_info``): read once per write, not per key."""
    return {r[1] for r in db.execute("PRAGMA table_info(runs)")}


def record(home: Path, row: Mapping[str, Any]) -> None:
    """Insert or update the run ``row['run_id']`` with the known columns of ``row``. Raises
    LedgerError when the ledger cannot be written."""
    row = _checked(row)
    with closing(connect(home)) as db:
        try:
            with db:
                known = _columns(db)  # once per connection: `k in _columns(db)` read the table's info per key
                cols = [k for k in row if k in known]
                # None in a JSON column that may be NULL is NULL, not the text "null" (which reads back as a
                # summary that is "not a JSON object")
                values = [json.dumps(row[k], default=str) if k in JSON_COLUMNS and not (
                    row[k] is None and k in NULLABLE_JSON_COLUMNS) else row[k] for k in cols]
                db.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                           f"ON CONFLICT(run_id) DO UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in cols)}",
                           values)
        except sqlite3.Error as exc:
            raise unreadable(home, exc) from None


def _checked(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with what a job wrote (its summary, the figures taken from it, its exit code) checked
    again (job_summary.py), whoever made it: nothing unchecked is stored."""
    row = dict(row)
    if "summary" in row:
        row["summary"], row["summary_schema"] = job_summary.for_ledger(row["summary"], row.get("summary_schema"))
    row.update({k: job_summary.figure(k, row[k]) for k in job_summary.TRAINER_COLUMNS if k in row})
    if "exit_status" in row:
        row["exit_status"] = _exit_status(row["exit_status"])
    return row


def _exit_status(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and -2 ** 31 <= value < 2 ** 31 else None


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def _row(r: sqlite3.Row) -> dict[str, Any]:
    """One run as a dict, JSON columns parsed. What a job wrote is checked again (job_summary.py):
    a row from an older version with a summary that is not an object, a test accuracy of "x" or
    a figure out of bounds reads as a marked summary and None figures, never as an error."""
    d = dict(r)
    d["summary"], d["summary_schema"] = job_summary.from_ledger(d.get("summary"), d.get("summary_schema"))
    for k in JSON_COLUMNS:
        if k != "summary" and d.get(k) is not None:
            d[k] = json.loads(d[k])
    d.update(job_summary.trainer_columns(d))
    d.update({k: _number(d.get(k)) for k in NUMBER_COLUMNS})
    d["exit_status"] = _exit_status(d.get("exit_status"))
    return d


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A duration ago in the grammar of every duration (tasks/spec.minutes, a unit required: '30m',
    '12h', '30d', '2w') or an ISO date ('2026-11-01') -> an aware UTC datetime.

    Raises UsageError for anything else.
    """
    now = now or datetime.now(timezone.utc)
    try:
        return now - timedelta(minutes=minutes(text, default_unit=None, max_minutes=None))
    except (ValueError, OverflowError):
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since {text!r} is not a duration or a date", "use e.g. 30m, 12h, 30d, 2w or 2026-11-01")
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def runs(home: Path, since: datetime | None = None, backend: str | None = None, limit: int | None = None,
         tolerant: bool = False) -> list[dict[str, Any]]:
    """Runs newest first, optionally started at or after ``since`` and of one ``backend``. Raises
    LedgerError when the ledger cannot be read, unless ``tolerant`` (then: no runs; for estimates,
    which the run has already warned about, see ``check``)."""
    if not path_in(home).exists():
        return []
    try:
        return _runs(home, since, backend, limit)
    except LedgerError:
        if tolerant:
            return []
        raise


def check(home: Path) -> LedgerError | None:
    """None when the ledger in ``home`` can be read (or does not exist yet), else the LedgerError."""
    try:
        runs(home, limit=1)
    except LedgerError as exc:
        return exc
    return None


def _runs(home: Path, since: datetime | None, backend: str | None, limit: int | None) -> list[dict[str, Any]]:
    args: list[str]
    sql, args = "SELECT * FROM runs WHERE 1=1", []
    if since:
        sql, args = sql + " AND started_at >= ?", args + [since.astimezone(timezone.utc).isoformat()]
    if backend:
        sql, args = sql + " AND backend = ?", args + [backend]
    sql += " ORDER BY started_at DESC" + (f" LIMIT {int(limit)}" if limit else "")
    with closing(connect(home)) as db:
        try:
            return [_row(r) for r in db.execute(sql, args)]
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a JSON column that is not JSON
            raise unreadable(home, exc) from None


def get(home: Path, run_id: str) -> dict[str, Any]:
    """One run by id (or a unique prefix of it). Raises UsageError when none or several match,
    LedgerError when the ledger cannot be read.

    The exact id first, else the ids that start with ``run_id``: both are looked up in the run id's
    index (its primary key), and only the one run found is decoded (``_row``), whatever the size
    of the ledger. A ledger that does not exist yet holds no run (and is not created)."""
    found = _find(home, run_id) if path_in(home).exists() else []
    if len(found) != 1:
        raise UsageError(f"no run {run_id!r} in the ledger" if not found else f"{run_id!r} matches {len(found)} runs",
                         "see `ec2gpu runs` for the ids")
    run: dict[str, Any] = found[0]  # one match: the run itself, decoded
    return run


def history_key(row: Mapping[str, Any]) -> Any:
    """The key of a ledger row in the history that limits and estimates read (pure): its
    ``task_key``, else (a row written before migration 9, or by a run that records none) its
    task's name, as such rows were always read."""
    return row.get("task_key") or row.get("task")


def in_foreground(home: Path, run_id: str) -> dict[str, Any] | None:
    """The ledger's row of run ``run_id`` (an id or a unique prefix) when it ran in the foreground
    (a controller process is recorded: `run --detach` records none, every run in the foreground
    does since migration 6) and is no array (an array's status is its own); else None, and None
    when the ledger cannot be read."""
    try:
        row = get(home, run_id)
    except (UsageError, LedgerError):
        return None
    return row if row.get("controller") is not None and not row.get("element_seconds") else None


def _find(home: Path, run_id: str) -> list[Any]:
    """[the run ``run_id`` decoded] when it exists, else [the one run whose id starts with it,
    decoded], else the ids that start with it (none, or several: nothing decoded)."""
    try:
        run_id.encode()
    except UnicodeEncodeError:  # not UTF-8 text (e.g. a lone surrogate from argv): no stored id starts with it
        return []
    with closing(connect(home)) as db:
        try:
            exact = db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if exact is not None:
                return [_row(exact)]
            # the ids that start with run_id are contiguous in the index's order (BINARY: UTF-8 bytes, as
            # code points), from the first id >= run_id on: read ids only, and stop at the first that does not
            ids = []
            for (rid,) in db.execute("SELECT run_id FROM runs WHERE run_id >= ? ORDER BY run_id", (run_id,)):
                if not (isinstance(rid, str) and rid.startswith(run_id)):
                    break
                ids.append(rid)
            if len(ids) != 1:
                return ids
            return [_row(db.execute("SELECT * FROM runs WHERE run_id = ?", (ids[0],)).fetchone())]
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a JSON column that is not JSON
            raise unreadable(home, exc) from None


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Count, billed seconds, actual and estimated USD over ``rows`` (None values count as 0)."""
    return {"runs": len(rows),
            "billed_seconds": round(sum(r.get("billed_seconds") or 0 for r in rows), 1),
            "cost_usd": round(sum(r.get("cost_usd") or 0 for r in rows), 4),
            "estimated_cost_usd": round(sum(r.get("estimated_cost_usd") or 0 for r in rows), 4)}
