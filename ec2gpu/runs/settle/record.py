"""The run record: what `ec2gpu run`, `train mnist` and `exec` return, save as run.json, print with
--json and write to the ledger (its columns are the keys the ledger knows). One type, built by
``new`` in every place a run starts, so the three kinds of run cannot drift apart."""
from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, TypedDict

import psutil


class RunRecord(TypedDict, total=False):
    """One run. Times are ISO 8601 UTC strings, seconds are s, money is USD."""

    run_id: str  # YYYYmmdd-HHMMSS-xxxx
    command: str  # as typed, secrets masked
    backend: str  # aws | sandbox | local
    status: str  # running | completed | failed | interrupted | spot-interrupted | controller-lost | detached
    started_at: str
    ended_at: Optional[str]
    controller: Optional[dict[str, Any]]  # host, pid, started (reconcile.py)
    task: Optional[str]
    task_key: Optional[str]  # what its history is keyed by (runs/job.TaskJob.history_key; ledger.history_key)
    model: Optional[str]  # the built-in job's preset
    epochs: Optional[int]
    region: Optional[str]
    zone: Optional[str]
    instance_type: Optional[str]
    gpu: Optional[str]
    market: Optional[str]  # on-demand | spot | local
    instance_id: Optional[str]  # node 0 of the last attempt
    instance_ids: list[str]
    attempts: list[dict[str, Any]]  # one per instance: recovery.attempt_row, then its bill
    artifacts: str  # the local directory of run.json, outputs/, logs
    estimate: Optional[dict[str, Any]]  # costs.Estimate.as_dict()
    estimated_cost_usd: Optional[float]
    billed_seconds: Optional[float]
    cost_usd: Optional[float]
    usd_per_hour: Optional[float]
    price_source: Optional[str]
    launched_at: Optional[str]
    billing_started_at: Optional[str]
    terminated_at: Optional[str]
    phases: dict[str, float]  # phase -> seconds
    # the job's summary.json as job_summary.py checked and masked it; {"invalid", "raw"} if it failed
    summary: Optional[dict[str, Any]]
    summary_schema: Optional[str]  # the check it passed: mnist | bench | task; invalid (job_summary.py)
    exit_status: Optional[int]
    test_acc: Optional[float]
    train_seconds: Optional[float]
    samples_per_second: Optional[float]
    teardown_failed: list[str]
    # a detached run (runs/detached/launch.py): its run store, Auto Scaling group and deadline (ISO 8601 UTC)
    bucket: Optional[str]
    group: Optional[str]
    deadline: Optional[str]
    # an array or a sweep (ec2gpu/pool/attempt.py): the element table, counts, the instance count over time
    pool: dict[str, Any]
    detached: bool  # an array's --detach: this command left once its driver ran (the ledger keeps "running")
    element_seconds: Optional[dict[str, Any]]  # {"count", "mean_seconds"} of its succeeded elements (the next estimate's)
    pool_done: dict[str, Any]  # an array's elements whose outputs came home, by index (a later attempt skips them)


def new(run_id: str, command: str, backend: str, artifacts: str | Path, status: str = "running",
        **fields: Any) -> RunRecord:
    """A run record as a run starts: its id, command, backend, artifacts directory, status and
    start time, and for a run that is still going the process that runs it (reconcile.py), plus
    ``fields`` (RunRecord's keys)."""
    record: RunRecord = RunRecord(run_id=run_id, command=command, backend=backend, artifacts=str(artifacts), status=status,
                                  started_at=datetime.now(timezone.utc).isoformat(),
                                  **fields)  # type: ignore[typeddict-item]  # ``fields``: RunRecord's other keys, unchecked
    if status == "running":
        record["controller"] = this_controller()
    return record


def save(record: RunRecord, out: str | Path) -> None:
    """Write ``record`` as ``out``/run.json (the folder made if need be): JSON indented 2, anything
    not JSON (a datetime, a Path) as its ``str()``; written whole or not at all (a temporary file
    renamed over it), so a reader never sees half a record. Raises OSError as the write does."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".run.json.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, folder / "run.json")


def this_controller() -> dict[str, Any]:
    """The ``controller`` column for a run this process starts: host name, pid, process start
    time (s since the epoch, psutil's create_time)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}
