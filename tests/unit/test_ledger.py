"""The SQLite ledger: migrations, upserts, --since, totals."""
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.runs.settle import ledger
from ec2gpu.aws.instances import Instance


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

    from ec2gpu.runs.settle.record import RunRecord, new
    with closing(ledger.connect(tmp_path)) as db:
        columns = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    assert columns <= set(RunRecord.__annotations__), columns - set(RunRecord.__annotations__)
    running = new("r1", "ec2gpu run", "aws", tmp_path, task="t")
    assert running["status"] == "running" and running["controller"]["pid"] > 0 and running["artifacts"] == str(tmp_path)
    assert "controller" not in new("r2", "ec2gpu train mnist --local", "local", tmp_path, status="completed")


def test_a_standing_instance_has_a_row_settled_over_every_running_interval_and_runs_since_counts_it(tmp_path):
    """Issue 27, item 16: `launch` opens a row, each command that sees the instance records its
    intervals (a stop dated by EC2, a start's new LaunchTime), and once it has terminated the row
    holds its actual cost, which `runs --since` adds up."""
    import json
    import os
    import subprocess
    import sys
    from datetime import timedelta

    from ec2gpu.runs.recover import reconcile

    class Aws:  # what billing an on-demand instance reads of an Aws: its region
        region, ec2 = "us-east-1", None

    t0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
    l1, s1, l2, t2 = t0, t0 + timedelta(seconds=200), t0 + timedelta(hours=1), t0 + timedelta(hours=1, seconds=30)

    def seen(state, launched, at=None, code=""):
        return Instance.of({"InstanceId": "i-1", "InstanceType": "g4dn.xlarge", "LaunchTime": launched,
                            "State": {"Name": state}, "Placement": {"AvailabilityZone": "us-east-1a"},
                            "Tags": [{"Key": "ec2gpu:run", "Value": "r1"}],
                            "StateTransitionReason": f"User initiated ({at:%Y-%m-%d %H:%M:%S} GMT)" if at else "",
                            **({"StateReason": {"Code": code}} if code else {})})
    row = reconcile.standing_row("aws", "us-east-1", "r1", "ec2gpu launch --name dev", [seen("running", l1)], 100)
    ledger.record(tmp_path, row)
    said = []
    for shown in (seen("stopped", l1, s1), seen("running", l2),
                  seen("terminated", l2, t2, "Client.InstanceInitiatedShutdown")):
        reconcile._sync_row(Aws(), tmp_path, ledger.get(tmp_path, "r1"), [shown], said.append)
    done = ledger.get(tmp_path, "r1")
    [att] = done["attempts"]
    assert done["status"] == reconcile.ENDED and att["ended"] == "ended itself" and len(att["intervals"]) == 2
    assert done["billed_seconds"] == 200 + 60  # the second start pays its own minimum
    compute, ipv4 = 260 * 0.526 / 3600, 230 * 0.005 / 3600
    ebs = 100 * 0.08 * (t2 - l1).total_seconds() / (30 * 86400)  # the volume is billed while stopped too
    assert done["cost_usd"] == pytest.approx(compute + ipv4 + ebs, abs=1e-5)
    assert "every instance has ended" in said[-1] and reconcile.open_rows(tmp_path) == []
    env = {**os.environ, "EC2GPU_HOME": str(tmp_path)}
    listed = json.loads(subprocess.run([sys.executable, "-m", "ec2gpu", "runs", "--since", "1d", "--json"], env=env,
                                       capture_output=True, text=True, check=True).stdout)
    assert listed["total"]["cost_usd"] == pytest.approx(done["cost_usd"], abs=1e-4)
    assert [r["command"] for r in listed["runs"]] == ["ec2gpu launch --name dev"]


def test_a_row_read_back_and_written_again_keeps_no_summary_as_none(tmp_path):
    """A row settled later (reconcile.py reads it, bills it, writes it back) had its missing
    summary stored as the text "null", which read back as an invalid summary."""
    ledger.record(tmp_path, {"run_id": "r1", "command": "ec2gpu launch", "backend": "aws", "status": "standing",
                             "started_at": "2026-11-22T00:00:00+00:00"})
    row = ledger.get(tmp_path, "r1")
    assert row["summary"] is None and row["summary_schema"] is None
    ledger.record(tmp_path, {**row, "status": "ended"})
    again = ledger.get(tmp_path, "r1")
    assert again["summary"] is None and again["summary_schema"] is None and again["status"] == "ended"


def test_a_standing_instance_not_listed_is_settled_as_unknown_only_after_ec2_would_have_forgotten_it(tmp_path):
    """A DescribeInstances that misses a new instance (eventual consistency) settles nothing; one
    that has not listed it for longer than EC2 lists a terminated instance settles it, its bill
    unknown and said."""
    from datetime import timedelta

    from ec2gpu.aws import sweep
    from ec2gpu.runs.recover import reconcile
    now = datetime.now(timezone.utc)
    inst = Instance("i-1", "g4dn.xlarge", "running", now)
    ledger.record(tmp_path, reconcile.standing_row("aws", "us-east-1", "r1", "ec2gpu launch", [inst], 100))
    said = []
    assert not reconcile._sync_row(None, tmp_path, ledger.get(tmp_path, "r1"), [], said.append)
    assert ledger.get(tmp_path, "r1")["status"] == reconcile.STANDING and not said
    row = ledger.get(tmp_path, "r1")
    long_ago = (now - timedelta(seconds=sweep.UNLISTED_AFTER_S + 60)).isoformat()
    row["attempts"][0]["seen_at"] = row["attempts"][0]["launched_at"] = long_ago
    assert reconcile._sync_row(None, tmp_path, row, [], said.append)
    done = ledger.get(tmp_path, "r1")
    assert done["status"] == reconcile.ENDED and done["cost_usd"] is None and "no longer lists i-1" in said[0]


def test_instances_a_run_kept_are_billed_into_its_row_once_they_have_ended(tmp_path):
    """`run --keep` finishes with its instance running and unbilled; the first command that sees
    it terminated bills it into the run's row, whose status stays the job's."""
    from datetime import timedelta

    from ec2gpu.runs.recover import reconcile
    t0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    ended = t0 + timedelta(seconds=600)
    gone = {"InstanceId": "i-1", "InstanceType": "g4dn.xlarge", "LaunchTime": t0, "State": {"Name": "terminated"},
            "StateTransitionReason": f"User initiated ({ended:%Y-%m-%d %H:%M:%S} GMT)", "Placement": {}}

    class Ec2:
        def describe_instances(self, InstanceIds):
            return {"Reservations": [{"Instances": [gone]}]}

    class Aws:
        region, ec2 = "us-east-1", Ec2()
    ledger.record(tmp_path, {"run_id": "r1", "command": "ec2gpu run --keep", "backend": "aws", "status": "completed",
                             "started_at": t0.isoformat(), "attempts": [
                                 {"attempt": 1, "instance_id": "i-1", "ended": "completed",
                                  "billing_started_at": t0.isoformat()}]})
    assert [r["run_id"] for r in reconcile.kept(tmp_path, "aws")] == ["r1"]
    said = []
    assert reconcile.settle_all(Aws(), tmp_path, "aws", log=said.append, volume_gib=100) == ["r1"]
    row = ledger.get(tmp_path, "r1")
    assert row["status"] == "completed" and row["billed_seconds"] == 600 and "--keep" in said[0]
    assert row["cost_usd"] == pytest.approx(600 * 0.526 / 3600 + 600 * 0.005 / 3600 + 100 * 0.08 * 600 / (30 * 86400),
                                            abs=1e-5)
    assert reconcile.kept(tmp_path, "aws") == []


def test_the_tool_home_and_the_ledger_are_this_users_alone_whatever_the_umask(tmp_path):
    """Issue 44.7: the home (keys, known hosts, the ledger) was made with the umask (0755) and the
    ledger 0644; now 0700 and 0600, and an older version's are narrowed when next opened."""
    import os
    import stat
    old = os.umask(0o022)
    try:
        home = tmp_path / "fresh" / ".ec2gpu"
        ledger.connect(home).close()
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert stat.S_IMODE(ledger.path_in(home).stat().st_mode) == 0o600
        older = tmp_path / "older"
        older.mkdir(mode=0o755)
        sqlite3.connect(ledger.path_in(older)).close()
        assert stat.S_IMODE(ledger.path_in(older).stat().st_mode) == 0o644  # as SQLite makes it
        ledger.connect(older).close()
        assert stat.S_IMODE(older.stat().st_mode) == 0o700
        assert stat.S_IMODE(ledger.path_in(older).stat().st_mode) == 0o600
        from ec2gpu.sandbox import control  # the sandbox's state lives in the home too
        sandbox_home = tmp_path / "sandbox-first" / ".ec2gpu"
        with control._locked(sandbox_home):
            pass
        assert stat.S_IMODE(sandbox_home.stat().st_mode) == 0o700
    finally:
        os.umask(old)


# --- --since (ec2gpu/runs/settle/ledger.py parse_since, runs) -----------------------------------------
# Seconds to weeks back to the second, a unit required, no 30-day bound; a run started at
# the boundary counted, one second before it not.

SINCE_NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text,back", [
    ("45s", timedelta(seconds=45)), ("1m", timedelta(minutes=1)), ("30m", timedelta(minutes=30)),
    ("1h", timedelta(hours=1)), ("12h", timedelta(hours=12)), ("1.5h", timedelta(minutes=90)),
    ("1d", timedelta(days=1)), ("30d", timedelta(days=30)), ("90d", timedelta(days=90)),
    ("1w", timedelta(days=7)), ("2w", timedelta(days=14)), (" 2W ", timedelta(days=14)), ("3 d", timedelta(days=3)),
    ("0h", timedelta(0)),
])
def test_since_takes_seconds_to_weeks_back_to_the_second(text, back):
    """The grammar of every duration (tasks/spec.minutes) with its unit required, and no 30-day
    bound: --since 90d is a quarter back."""
    from ec2gpu.runs.settle import ledger

    assert ledger.parse_since(text, SINCE_NOW) == SINCE_NOW - back


@pytest.mark.parametrize("text", ["2", "d", "-2d", "2dd", "2y", "1w2d", "soon", ""])
def test_since_refuses_what_is_neither_a_duration_nor_a_date(text):
    """A bare number is not a duration here (minutes? days?): the unit is required."""
    from ec2gpu.runs.settle import ledger

    with pytest.raises(UsageError, match="is not a duration or a date"):
        ledger.parse_since(text, SINCE_NOW)


def test_since_dates_are_utc_unless_they_say_otherwise():
    from ec2gpu.runs.settle import ledger

    assert ledger.parse_since("2026-11-01", SINCE_NOW) == datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert ledger.parse_since("2026-11-01T05:00:00+02:00", SINCE_NOW) == datetime(2026, 11, 1, 3, tzinfo=timezone.utc)


def test_runs_since_counts_a_run_started_at_the_boundary_and_not_one_second_before(tmp_path):
    from ec2gpu.runs.settle import ledger

    since = ledger.parse_since("2w", SINCE_NOW)
    for run_id, started in (("before", since - timedelta(seconds=1)), ("at", since),
                            ("after", since + timedelta(seconds=1))):
        ledger.record(tmp_path, {"run_id": run_id, "command": "c", "backend": "aws", "status": "completed",
                                 "started_at": started.isoformat()})
    assert [r["run_id"] for r in ledger.runs(tmp_path, since=since)] == ["after", "at"]
    assert [r["run_id"] for r in ledger.runs(tmp_path)] == ["after", "at", "before"]
