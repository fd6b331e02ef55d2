"""The SQLite ledger: migrations, upserts, --since, totals."""
import sqlite3
from datetime import datetime, timezone

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.runs import ledger


def test_a_version_1_ledger_is_migrated_without_losing_runs(tmp_path):
    db = sqlite3.connect(ledger.path_in(tmp_path))
    db.execute(ledger.MIGRATIONS[0])
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO runs (run_id, command, backend, status, started_at) VALUES ('old', 'c', 'aws', "
               "'completed', '2026-01-01T00:00:00+00:00')")
    db.commit()
    db.close()
    assert [r["run_id"] for r in ledger.runs(tmp_path)] == ["old"]
    with sqlite3.connect(ledger.path_in(tmp_path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(ledger.MIGRATIONS)
        assert db.execute("SELECT name FROM sqlite_master WHERE name='runs_started_at'").fetchone()


def test_record_inserts_then_updates_one_row(tmp_path):
    start = {"run_id": "r1", "command": "ec2gpu train mnist", "backend": "sandbox", "status": "running",
             "started_at": "2026-11-21T10:00:00+00:00", "phases": {}, "not_a_column": 1}
    ledger.record(tmp_path, start)
    ledger.record(tmp_path, {**start, "status": "completed", "phases": {"training": 12.5}, "cost_usd": 0.0088,
                             "instance_ids": ["i-1"]})
    (row,) = ledger.runs(tmp_path)
    assert row["status"] == "completed" and row["phases"] == {"training": 12.5} and row["instance_ids"] == ["i-1"]
    assert ledger.get(tmp_path, "r") == row


def test_since_filters_and_totals(tmp_path):
    for i, day in enumerate(["2026-10-01", "2026-11-15", "2026-11-20"]):
        ledger.record(tmp_path, {"run_id": f"r{i}", "command": "c", "backend": "aws", "status": "completed",
                                 "started_at": f"{day}T12:00:00+00:00", "billed_seconds": 100.0, "cost_usd": 0.25,
                                 "estimated_cost_usd": 0.3})
    now = datetime(2026, 11, 21, tzinfo=timezone.utc)
    rows = ledger.runs(tmp_path, since=ledger.parse_since("30d", now))
    assert [r["run_id"] for r in rows] == ["r2", "r1"]
    assert ledger.totals(rows) == {"runs": 2, "billed_seconds": 200.0, "cost_usd": 0.5, "estimated_cost_usd": 0.6}
    assert ledger.parse_since("2026-11-01") == datetime(2026, 11, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("text", ["soon", "30x", ""])
def test_bad_since_is_a_usage_error(text):
    with pytest.raises(UsageError):
        ledger.parse_since(text)


def test_unknown_run_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        ledger.get(tmp_path, "nope")


def test_runs_at_80_columns_keeps_each_run_id_whole_on_one_line(tmp_path):
    import os
    import subprocess
    import sys
    ids = ["20261122-052235-dea6", "20261122-061500-0f3c"]
    for rid in ids:
        ledger.record(tmp_path, {"run_id": rid, "command": "ec2gpu run", "backend": "aws", "status": "spot-interrupted",
                                 "started_at": "2026-11-22T05:22:35+00:00", "task": "a-rather-long-task-name",
                                 "instance_type": "g4dn.12xlarge", "market": "spot", "billed_seconds": 1234.0,
                                 "cost_usd": 0.0441, "estimated_cost_usd": 0.05,
                                 "summary": {"loss": 0.0123, "epochs": 3, "note": "a summary long enough to fold"}})
    env = {**os.environ, "EC2GPU_HOME": str(tmp_path), "COLUMNS": "80", "TERM": "dumb"}
    shown = subprocess.run([sys.executable, "-m", "ec2gpu", "runs"], env=env, capture_output=True, text=True,
                           check=True).stdout
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    assert all(sum(rid in line for line in shown.splitlines()) == 1 for rid in ids), shown


def test_a_corrupt_ledger_is_named_with_the_way_out_and_estimates_go_on_without_it(tmp_path):
    from ec2gpu.errors import LedgerError
    ledger.path_in(tmp_path).write_bytes(b"this is not an SQLite database, it is a note\n" * 100)
    with pytest.raises(LedgerError) as exc:
        ledger.runs(tmp_path)
    assert str(ledger.path_in(tmp_path)) in exc.value.message and "mv " in exc.value.hint
    assert exc.value.exit_code == 3
    with pytest.raises(LedgerError):
        ledger.record(tmp_path, {"run_id": "r1", "command": "c", "backend": "aws", "status": "running",
                                 "started_at": "2026-11-22T00:00:00+00:00"})
    assert ledger.runs(tmp_path, tolerant=True) == []
    assert isinstance(ledger.check(tmp_path), LedgerError)


def test_runs_on_a_corrupt_ledger_exits_3_naming_the_file(tmp_path):
    import os
    import subprocess
    import sys
    ledger.path_in(tmp_path).write_bytes(b"garbage" * 1000)
    done = subprocess.run([sys.executable, "-m", "ec2gpu", "runs"], env={**os.environ, "EC2GPU_HOME": str(tmp_path)},
                          capture_output=True, text=True)
    err = " ".join(done.stderr.split())
    assert done.returncode == 3 and "ledger.sqlite cannot be used" in err and "Traceback" not in err, err


def test_the_run_record_type_covers_every_ledger_column_and_only_a_running_run_names_its_controller(tmp_path):
    from contextlib import closing

    from ec2gpu.runs.record import RunRecord, new
    with closing(ledger.connect(tmp_path)) as db:
        columns = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    assert columns <= set(RunRecord.__annotations__), columns - set(RunRecord.__annotations__)
    running = new("r1", "ec2gpu run", "aws", tmp_path, task="t")
    assert running["status"] == "running" and running["controller"]["pid"] > 0 and running["artifacts"] == str(tmp_path)
    assert "controller" not in new("r2", "ec2gpu train mnist --local", "local", tmp_path, status="completed")
