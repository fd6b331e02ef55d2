"""api/run_results.py (issue 45, item 5): what the run commands return is a frozen record over the
one record the command already has (the run record, the status document, a bench row), with typed
attributes, and ``to_json()`` is exactly that record: what ``--json`` printed before these types."""
import dataclasses

import pytest

from ec2gpu import api

RECORD = {"run_id": "20261125-041200-ab12", "status": "completed", "cost_usd": 0.0123, "artifacts": "runs/r1",
          "summary": {"epochs": 3}, "test_acc": 0.98, "pool": None, "instance_type": "g4dn.xlarge"}


def test_a_run_result_names_the_records_fields_and_cannot_be_changed():
    got = api.RunResult(dict(RECORD))
    assert (got.run_id, got.status, got.cost_usd, got.artifacts, got.summary, got.test_acc, got.pool) == \
        ("20261125-041200-ab12", "completed", 0.0123, "runs/r1", {"epochs": 3}, 0.98, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.record = {}  # type: ignore[misc]
    assert api.RunResult({"run_id": "r", "status": "detached", "artifacts": "a"}).cost_usd is None  # not known yet


def test_to_json_is_the_record_as_it_was_and_a_copy():
    got = api.RunResult(dict(RECORD))
    printed = got.to_json()
    assert printed == RECORD and list(printed) == list(RECORD)  # the same keys, in the same order
    printed["status"] = "failed"
    assert got.status == "completed" and got.to_json() == RECORD


def test_a_run_status_and_a_bench_result_give_back_their_document():
    doc = {"run_id": "r1", "state": "running", "group": {"name": "ec2gpu-r1", "desired": 1, "instances": []},
           "removed": None, "cost_usd": None, "array": None}
    got = api.RunStatus(doc)
    assert (got.run_id, got.state, got.group, got.removed, got.array, got.handover, got.cost_usd) == \
        ("r1", "running", doc["group"], None, None, None, None)
    assert got.to_json() == doc and got.to_json() is not doc
    row = {"instance_type": "g6.xlarge", "status": "completed", "usd_per_run": {"cnn": {"seconds": 9.0}}}
    bench = api.BenchResult(row)
    assert (bench.instance_type, bench.status, bench.usd_per_run) == ("g6.xlarge", "completed", row["usd_per_run"])
    assert bench.to_json() == row
    with pytest.raises(dataclasses.FrozenInstanceError):
        bench.fields = {}  # type: ignore[misc]
