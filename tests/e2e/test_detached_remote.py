"""`ec2gpu runs --remote` in the sandbox (issue 30, item 2): detached runs are listed from the
region's S3 run store with their cost, from this machine and from another one whose ledger has
never heard of them."""
import json
import time
from pathlib import Path

import pytest

from ec2gpu import api, cli

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False


def _task(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    task = work / "task.yaml"
    task.write_text("name: remote\nworkdir: .\nrun: |\n  echo done > \"$EC2GPU_OUTPUT_DIR/done.txt\"\n")
    return task


def _wait(run_id: str, timeout_s: float = 180.0) -> dict:
    deadline, got = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        got = api.status(run_id, sandbox=True).to_json()
        if got["state"] in ("succeeded", "failed", "cancelled"):
            return got
        time.sleep(2)
    raise AssertionError(f"{run_id} still {got.get('state')} after {timeout_s} s: {got}")


def _remote(capsys, *more: str) -> dict:
    assert cli.main(["runs", "--remote", "--json", *more]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_remote_lists_finished_detached_runs_with_their_cost_from_any_machine(sandbox_env, tmp_path, capsys,
                                                                                   monkeypatch):
    task = _task(tmp_path)
    ids = []
    for market in ([], ["--spot"]):
        assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "30m", *market, "--json"]) == 0
        ids.append(json.loads(capsys.readouterr().out)["run_id"])
    for run_id in ids:
        assert _wait(run_id)["state"] == "succeeded"

    here = _remote(capsys, "--sandbox")
    listed = {r["run_id"]: r for r in here["runs"]}
    assert set(ids) <= set(listed) and here["bucket"].startswith("ec2gpu-")
    newest_first = [r["run_id"] for r in here["runs"]]
    assert newest_first == sorted(newest_first, reverse=True)
    for run_id in ids:
        r = listed[run_id]
        assert r["state"] == "succeeded" and r["attempt"] == 1 and r["interruptions"] == 0, r
        assert r["cost_usd"] > 0 and r["billed_seconds"] >= 60, r["cost"]
        assert r["in_ledger"] is True and r["ledger_status"] == "completed"
        [inst] = r["cost"]["per_instance"]
        # EC2 (the sandbox) still lists the terminated instance: its own times and type are the bill
        assert inst["times_source"] == "instance" and inst["type_source"] == "DescribeInstances", inst
        assert inst["instance_id"] == r["instance_id"] and inst["upper_bound"] is False
    on_demand, spot = (listed[run_id]["cost"]["per_instance"][0] for run_id in ids)
    assert on_demand["market"] == "on-demand" and on_demand["price_source"].startswith("on-demand shipped table")
    assert spot["market"] == "spot" and spot["price_source"].startswith(f"spot price history of {spot['zone']}")

    # another machine: a fresh EC2GPU_HOME (no ledger, no sandbox state), the same account's endpoint
    other = tmp_path / "other-home"
    other.mkdir()
    monkeypatch.setenv("EC2GPU_HOME", str(other))
    monkeypatch.delenv("EC2GPU_SANDBOX", raising=False)
    there = _remote(capsys, "--limit", "5")
    seen = {r["run_id"]: r for r in there["runs"]}
    assert set(ids) <= set(seen) and len(there["runs"]) <= 5 and there["limit"] == 5
    for run_id in ids:
        assert seen[run_id]["state"] == "succeeded" and seen[run_id]["cost_usd"] == listed[run_id]["cost_usd"]
        assert seen[run_id]["in_ledger"] is False and seen[run_id]["ledger_status"] is None
    assert not (other / "ledger.sqlite").exists()  # listing the store writes no ledger

    assert cli.main(["runs", "--remote"]) == 0  # the table
    shown = capsys.readouterr().out
    assert all(run_id in shown for run_id in ids) and "succeeded" in shown and "in the store" in shown
