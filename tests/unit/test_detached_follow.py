"""`status` and `cancel` of a detached run (runs/detached/follow.py), decided from the record in S3
and the group's fields alone: AWS is replaced by fakes here; tests/e2e/test_detached_run.py runs them
against the sandbox."""
import json
from types import SimpleNamespace

import pytest

from ec2gpu.runs.detached import costs, follow

RUN = "20261125-103000-1a2b"


@pytest.fixture
def world(monkeypatch, tmp_path):
    """A run whose record and group the test sets; what was written and removed, recorded."""
    w = SimpleNamespace(record={"run_id": RUN, "state": "running", "message": None}, group=None, written=[],
                        removed=[], cancelled=[])
    monkeypatch.setattr(follow, "store", lambda aws: (None, "bucket", "AIDAEXAMPLEUSERID0001"))
    monkeypatch.setattr(follow.runstore_records, "get_status", lambda s3, bucket, user, run_id: dict(w.record))
    monkeypatch.setattr(follow.runstore_records, "get_status_bytes",
                        lambda s3, bucket, user, run_id: json.dumps(w.record).encode())
    monkeypatch.setattr(costs, "gather", lambda aws, home, runs, rows, volume_gib, **k: {
        r: {"billed_seconds": 120.0, "cost_usd": 0.05, "upper_bound": False, "running": False} for r in runs})
    monkeypatch.setattr(follow.runstore_records, "put_status", lambda s3, bucket, user, run_id, rec: (
        w.written.append(rec), w.record.update(rec)))
    monkeypatch.setattr(follow.runstore_records, "end_status", lambda s3, bucket, user, run_id, state, message, at: (
        w.written.append({"state": state, "message": message}), w.record.update(state=state, message=message), True)[-1])
    monkeypatch.setattr(follow.runstore_records, "put_cancel", lambda s3, bucket, user, run_id: w.cancelled.append(run_id))
    monkeypatch.setattr(follow.groups, "summary", lambda asg, run_id: w.group)
    monkeypatch.setattr(follow.sweep, "inventory", lambda *a, **k: {"instances": [{"id": "i-1"}]})
    monkeypatch.setattr(follow.sweep, "delete_everything", lambda *a, **k: (w.removed.append("all"), {"left": []})[1])
    monkeypatch.setattr(follow.sweep, "delete_run", lambda *a, **k: (w.removed.append("run"), {"left": []})[1])
    w.aws = SimpleNamespace(client=lambda name: None, ec2=None)
    w.settings = SimpleNamespace(home=tmp_path, keys_dir=tmp_path, root_volume_gib=100)
    return w


def _group(desired, instances=()):
    return {"name": f"ec2gpu-{RUN}", "desired": desired, "status": None,
            "instances": [{"id": i, "state": "InService"} for i in instances]}


def test_a_run_whose_group_stopped_before_its_agent_said_so_is_recorded_failed_and_cleaned_up(world):
    world.group = _group(0)  # the deadline's scheduled action, with the agent killed
    got = follow.status(world.aws, world.settings, RUN)
    assert got["state"] == "failed" and "without its agent's word while running" in got["message"]
    assert world.written[-1]["state"] == "failed" and world.removed == ["all"]


def test_an_end_the_agent_recorded_between_the_read_and_the_group_stands(world, monkeypatch):
    """The agent writes its end, then ends its group: `status` read the record before the first and
    the group after the second. runstore_records.end_status then writes nothing (an end recorded stands),
    and `status` says the agent's end, not "failed" (nor puts "failed" in the ledger)."""
    world.group = _group(0)

    def agent_first(s3, bucket, user, run_id, state, message, at):
        world.record.update(state="succeeded", exit_code=0)  # the agent's, landed meanwhile
        return False
    monkeypatch.setattr(follow.runstore_records, "end_status", agent_first)
    got = follow.status(world.aws, world.settings, RUN)
    assert got["state"] == "succeeded" and got.get("exit_code") == 0 and "without its agent" not in str(got)


@pytest.mark.parametrize("group", [_group(1, ["i-1"]), _group(1)])  # running; or launching its first instance
def test_a_run_whose_group_still_runs_is_left_as_it_is(world, group):
    world.group = group
    got = follow.status(world.aws, world.settings, RUN)
    assert got["state"] == "running" and world.written == [] and world.removed == []


def test_cancel_of_a_run_over_by_its_record_whose_group_still_runs_removes_it_all_the_same(world):
    world.record["state"], world.group = "succeeded", _group(1, ["i-1"])  # a record the job wrote itself
    got = follow.cancel(world.aws, world.settings, RUN, sleep=lambda s: None)
    assert world.removed == ["run"] and world.cancelled == [] and got["waited_s"] == 0.0


def test_cancel_records_the_end_itself_when_the_agent_does_not_answer(world):
    world.group = _group(1, ["i-1"])
    ticks = iter(range(0, 1000, 30))
    got = follow.cancel(world.aws, world.settings, RUN, wait_s=60, sleep=lambda s: None, clock=lambda: next(ticks))
    assert world.cancelled == [RUN] and world.written[-1]["state"] == "cancelled" and "removed" in got
    assert world.removed[-1] == "run"


def test_status_has_the_runs_cost_and_goes_on_without_it_when_aws_does_not_answer(world, monkeypatch):
    world.group = _group(1, ["i-1"])
    got = follow.status(world.aws, world.settings, RUN)
    assert got["cost_usd"] == 0.05 and got["billed_seconds"] == 120.0 and got["upper_bound"] is False

    def refused(*a, **k):
        raise follow.UsageError("no", "no")  # any error of the cost's calls
    monkeypatch.setattr(costs, "gather", refused)
    said = []
    got = follow.status(world.aws, world.settings, RUN, log=said.append)
    assert got["state"] == "running" and "cost_usd" not in got and "could not be had" in said[-1]
