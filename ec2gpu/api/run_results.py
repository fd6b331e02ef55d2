"""What the run commands of the Python API return: RunResult (run, exec, bake, train_mnist), RunStatus
(status, cancel) and BenchResult (bench), each a frozen dataclass over the one record that command
already has, never a copy of its schema.

A RunResult holds the run record (runs/settle/record.RunRecord, the TypedDict that is also run.json
and the ledger's row), a RunStatus the status dict (runs/detached/follow.status for a detached run,
pool/attempt.local_status for an array this machine runs), a BenchResult one type's bench row
(runs/provision/bench). Each names its most used fields as typed attributes and gives back, by
``to_json()``, exactly the document the CLI's ``--json`` prints (the same keys and values as before
these types existed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..runs.settle.record import RunRecord


@dataclass(frozen=True)
class RunResult:
    """One run as `run`, `exec`, `bake` and `train mnist` end it. ``record``: the run record
    (runs/settle/record.RunRecord: times ISO 8601 UTC, seconds s, money USD), also saved as
    ``artifacts``/run.json and in the ledger."""

    record: RunRecord

    @property
    def run_id(self) -> str:
        """YYYYmmdd-HHMMSS-xxxx."""
        return self.record["run_id"]

    @property
    def status(self) -> str:
        """running | completed | failed | interrupted | spot-interrupted | controller-lost | detached."""
        return self.record["status"]

    @property
    def cost_usd(self) -> Optional[float]:
        """What the run cost (USD; None while unknown, or for a detached run before it ends)."""
        return self.record.get("cost_usd")

    @property
    def artifacts(self) -> str:
        """The local directory of run.json, outputs/ and logs."""
        return self.record["artifacts"]

    @property
    def summary(self) -> Optional[dict[str, Any]]:
        """The job's summary.json as checked and masked (runs/job_summary.py); a bake's names its image."""
        return self.record.get("summary")

    @property
    def test_acc(self) -> Optional[float]:
        """The built-in job's test accuracy (0 to 1), None for any other job."""
        return self.record.get("test_acc")

    @property
    def pool(self) -> Optional[dict[str, Any]]:
        """An array's or a sweep's element table, counts and instance count over time; None for one job."""
        return self.record.get("pool")

    def to_json(self) -> dict[str, Any]:
        """The record as ``--json`` prints it (a new dict: changing it changes nothing here)."""
        return dict(self.record)


@dataclass(frozen=True)
class RunStatus:
    """A run as `ec2gpu status` and `cancel` answer it. ``fields``: the status document ``--json``
    prints: a detached run's (runs/detached/follow.status: its state.json's fields as
    wire/run_record.view checked them, "group", "removed", and its cost so far) or an array's this
    machine runs (pool/attempt.local_status: "array" with its counts, instances, ETA (s), cost so far
    (USD); "handover" once its head handed the results over)."""

    fields: Mapping[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.fields["run_id"])

    @property
    def state(self) -> str:
        """A detached run's (wire/run_record.STATES, or "unreadable") or an array's (the ledger's status,
        "controller-lost" when its controller is gone)."""
        return str(self.fields["state"])

    @property
    def group(self) -> Optional[dict[str, Any]]:
        """A detached run's Auto Scaling group (desired capacity, instances), None once gone or for an array."""
        return self.fields.get("group")

    @property
    def removed(self) -> Optional[dict[str, Any]]:
        """What this call removed of a run that is over (runs/detached/follow.remove_finished), by kind."""
        return self.fields.get("removed")

    @property
    def array(self) -> Optional[dict[str, Any]]:
        """An array's counts, instances, ETA (s) and cost so far (USD); None for a detached single run."""
        return self.fields.get("array")

    @property
    def handover(self) -> Optional[dict[str, Any]]:
        """What the head of an array whose controller was lost handed over to S3 (the driver's state, how
        the hand-over went, when, its counts); None before it did, or for another run."""
        return self.fields.get("handover")

    @property
    def cost_usd(self) -> Optional[float]:
        """The cost so far, or in all once over (USD); None when not known."""
        return self.fields.get("cost_usd")

    def to_json(self) -> dict[str, Any]:
        """The status as ``--json`` prints it (a new dict)."""
        return dict(self.fields)


@dataclass(frozen=True)
class BenchResult:
    """One instance type's bench (runs/provision/bench): ``fields`` as ``--json`` prints it: run_id,
    instance_type, market, status, usd_per_hour (USD/h), cost_usd (USD), artifacts, usd_per_run
    ({model: {seconds, usd, basis}}), bench (bench.json's report, None with "bench_invalid" saying why);
    a failed type's only instance_type, status, error and usd_per_run."""

    fields: Mapping[str, Any]

    @property
    def instance_type(self) -> str:
        return str(self.fields["instance_type"])

    @property
    def status(self) -> str:
        return str(self.fields["status"])

    @property
    def usd_per_run(self) -> Optional[dict[str, Any]]:
        """{model: {"seconds", "usd", "basis"}}: what one run of each model costs on this type."""
        return self.fields.get("usd_per_run")

    def to_json(self) -> dict[str, Any]:
        """The row as ``--json`` prints it (a new dict)."""
        return dict(self.fields)
