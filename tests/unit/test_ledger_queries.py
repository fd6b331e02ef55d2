"""Issue 29, item 13: one run is found in the run id's index and only it is decoded; a write reads the
table's columns once; ledgers written before are read as they are."""
import json
import sqlite3

import pytest

from ec2gpu.errors import LedgerError, UsageError
from ec2gpu.runs.settle import ledger

IDS = [f"20261122-{h:02d}{m:02d}00-{(h * 60 + m) * 7 % 65536:04x}" for h in range(10) for m in range(0, 60, 3)]


def fill(home, ids=IDS):
    for i, rid in enumerate(ids):
        ledger.record(home, {"run_id": rid, "command": f"ec2gpu run #{i}", "backend": "aws", "status": "completed",
                             "started_at": f"2026-11-22T00:00:{i % 60:02d}+00:00", "phases": {"training": float(i)},
                             "instance_ids": [f"i-{i}"], "cost_usd": 0.01 * i})


@pytest.fixture
def decoded(monkeypatch):
    """The run ids ledger._row decodes while the test runs."""
    seen = []
    row = ledger._row

    def counting(r):
        seen.append(r["run_id"])
        return row(r)
    monkeypatch.setattr(ledger, "_row", counting)
    return seen


def test_one_run_among_many_is_found_by_its_id_or_a_unique_prefix_and_only_it_is_decoded(tmp_path, decoded):
    fill(tmp_path)
    want = IDS[123]
    every = {r["run_id"]: r for r in ledger.runs(tmp_path)}
    decoded.clear()
    assert ledger.get(tmp_path, want) == every[want] and decoded == [want]
    decoded.clear()
    assert ledger.get(tmp_path, want[:16]) == every[want] and decoded == [want]  # "20261122-060900-": one run of 200
    decoded.clear()
    with pytest.raises(UsageError, match=r"'20261122-06' matches 20 runs"):
        ledger.get(tmp_path, "20261122-06")
    with pytest.raises(UsageError, match="no run '20261122-99'"):
        ledger.get(tmp_path, "20261122-99")
    assert decoded == []


def test_an_exact_id_wins_over_the_longer_ids_it_begins_and_prefixes_are_literal_text(tmp_path, decoded):
    fill(tmp_path, ["r1", "r10", "r11", "a_1", "ab1", "a%", "ab\u00e9", "ab\u00e9x", "ab\U0001f600", "c\u00e9\u00e9",
                    "b"])
    assert ledger.get(tmp_path, "r1")["command"] == "ec2gpu run #0"
    with pytest.raises(UsageError, match="'r' matches 3 runs"):
        ledger.get(tmp_path, "r")
    assert ledger.get(tmp_path, "a_")["run_id"] == "a_1"  # _ and % are no wildcards
    assert ledger.get(tmp_path, "a%")["run_id"] == "a%"
    with pytest.raises(UsageError, match="'ab' matches 4 runs"):  # ab1 and the three beyond ASCII
        ledger.get(tmp_path, "ab")
    assert ledger.get(tmp_path, "ab\u00e9")["run_id"] == "ab\u00e9"
    assert ledger.get(tmp_path, "c\u00e9")["run_id"] == "c\u00e9\u00e9"
    with pytest.raises(UsageError, match="'' matches 11 runs"):
        ledger.get(tmp_path, "")
    with pytest.raises(UsageError, match="no run"):
        ledger.get(tmp_path, "ab\udcff")  # not UTF-8 (a byte of argv that was not): matches nothing, no crash
    assert decoded == ["r1", "a_1", "a%", "ab\u00e9", "c\u00e9\u00e9"]  # each run asked for, once; no other


def test_a_missing_ledger_holds_no_run_and_is_not_created(tmp_path):
    with pytest.raises(UsageError, match="no run 'r1'"):
        ledger.get(tmp_path, "r1")
    assert not ledger.path_in(tmp_path).exists()


def test_only_the_run_found_must_decode(tmp_path):
    """A run whose stored JSON is broken is named as a ledger error when it is the one asked for;
    it no longer stands in the way of reading another."""
    fill(tmp_path, ["good", "bad"])
    with sqlite3.connect(ledger.path_in(tmp_path)) as db:
        db.execute("UPDATE runs SET phases = 'not json' WHERE run_id = 'bad'")
    assert ledger.get(tmp_path, "go")["phases"] == {"training": 0.0}
    with pytest.raises(LedgerError, match="cannot be used"):
        ledger.get(tmp_path, "ba")


def test_a_write_reads_the_table_columns_once_and_still_keeps_only_known_keys(tmp_path, monkeypatch):
    reads = []
    columns = ledger._columns
    monkeypatch.setattr(ledger, "_columns", lambda db: reads.append(1) or columns(db))
    row = {"run_id": "r1", "command": "c", "backend": "aws", "status": "running", "started_at": "2026-11-22T00:00:00",
           "region": "us-east-1", "zone": "us-east-1a", "instance_type": "g4dn.xlarge", "gpu": "T4", "market": "spot",
           "phases": {"setup": 1.5}, "attempts": [], "task": "t", "not_a_column": 1, "nor_this": 2}
    ledger.record(tmp_path, row)
    assert len(reads) == 1
    got = ledger.get(tmp_path, "r1")
    assert got["phases"] == {"setup": 1.5} and got["gpu"] == "T4" and "not_a_column" not in got


def _raw_ledger(home, version):
    """A ledger file as the code of schema ``version`` left it (its migrations, its user_version), with
    rows written by plain SQL: JSON columns as JSON text."""
    db = sqlite3.connect(ledger.path_in(home))
    for i, sql in enumerate(ledger.MIGRATIONS[:version], start=1):
        db.execute(sql)
        db.execute(f"PRAGMA user_version = {i}")
    for k in range(30):
        db.execute("INSERT INTO runs (run_id, command, backend, status, started_at, instance_ids, phases, estimate) "
                   "VALUES (?, 'ec2gpu train mnist', 'aws', 'completed', ?, ?, ?, ?)",
                   (f"20261001-1200{k:02d}-{k:04x}", f"2026-10-01T12:00:{k:02d}+00:00", json.dumps([f"i-{k}"]),
                    json.dumps({"training": k}), json.dumps({"usd": 0.5}) if k % 2 else None))
    db.commit()
    db.close()


@pytest.mark.parametrize("version", [1, len(ledger.MIGRATIONS)])
def test_a_ledger_written_before_is_read_one_run_at_a_time(tmp_path, version, decoded):
    _raw_ledger(tmp_path, version)
    got = ledger.get(tmp_path, "20261001-120007")
    assert got["run_id"] == "20261001-120007-0007" and got["instance_ids"] == ["i-7"]
    assert got["phases"] == {"training": 7}
    assert got["estimate"] == {"usd": 0.5} and decoded == ["20261001-120007-0007"]
    assert ledger.get(tmp_path, "20261001-120008-0008")["estimate"] is None
    with pytest.raises(UsageError, match="matches 10 runs"):
        ledger.get(tmp_path, "20261001-12001")
    with sqlite3.connect(ledger.path_in(tmp_path)) as db:  # migrated on the way, nothing lost
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(ledger.MIGRATIONS)
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 30
