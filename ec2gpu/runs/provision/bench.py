"""`ec2gpu bench`: the built-in bench task (tasks/builtin/bench.yaml, ec2gpu/train/bench.py) on one
or several instance types, on this machine, or in the sandbox; each run ranked by USD per run.

A bench is an ordinary run of the one engine: it is launched, measured, brought home and
terminated like `ec2gpu train mnist`, and recorded in the ledger with task "bench" and the
figures of its summary.json. costs.estimate then prefers those measured samples/s over its
assumed defaults for the same instance type and model (costs.bench_speed).
"""
from __future__ import annotations

import importlib.util
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from ...aws import catalog
from ...aws.session import Aws
from ...backend import Backend
from ...errors import Ec2GpuError, UsageError
from ...settings import Settings
from ...train.bench import TRAINED_MIN_ACC, trained
from ..execute import engine
from . import pipeline
from ..plan import sandbox_data
from ..settle import record as run_record
from ..execute.reporter import ReporterLike
from ..options import BenchOptions
from ..job_summary import bench_figures, columns, read_bench_report
from .local import run_local

#: Minutes a bench's job is assumed to take for its first estimate (before the ledger has one on
#: that instance type): measured on this project's 2-vCPU machine without a GPU, the full bench's
#: job took 56 s and --quick's 9 s (`ec2gpu bench --local [--quick]`); a GPU instance adds its
#: GPU runs, which are faster than its CPU runs. Rounded up generously.
EXPECT_MINUTES = {"full": 4.0, "quick": 1.0}

#: The model whose USD per run ranks instance types first (the fast default), then the other.
RANK_MODELS = ("cnn", "dbn")


def job_args(quick: bool, sandbox: bool, data_dir: str | None = None) -> list[str]:
    """bench.yaml's "$@": --quick, and MNIST for a sandbox instance (runs/plan/sandbox_data.sandbox_data_args:
    raises UsageError, before anything is created, when there is none)."""
    args = ["--quick"] if quick else []
    if data_dir:
        return args + ["--data-dir", data_dir]
    give = "ec2gpu bench --sandbox --data-dir /path/to/mnist (or EC2GPU_DATA_DIR=/path/to/mnist)"
    return args + (sandbox_data.sandbox_data_args([], give=give) if sandbox else [])


def usd_per_run(summary: dict[str, Any] | None, usd_per_hour: float | None) -> dict[str, dict[str, Any]]:
    """Per model of a bench's summary: the seconds that count (to the target accuracy on the best
    device, else the whole training when the target was not reached), what they cost at
    ``usd_per_hour`` (USD, None without a price), and which basis was used (pure). A model that
    did not train (train/bench.trained: its test accuracy near chance) has no seconds and no USD:
    what it ran is not a run that trains it. A summary that is not the bench's, or has a figure
    out of bounds (job_summary.bench_figures), gives {}."""
    figures = bench_figures(summary)
    out: dict[str, dict[str, Any]] = {}
    for model, by_device in (figures.models if figures else {}).items():
        assert figures is not None  # its models are what is iterated
        row = by_device.get(figures.best_device) or by_device.get("cpu")
        if not row:
            continue
        if row.test_acc is not None and not trained(row.test_acc):
            out[model] = {"seconds": None, "usd": None, "basis": f"did not train (test accuracy "
                          f"{100 * row.test_acc:.2f}%, under {100 * TRAINED_MIN_ACC:.0f}%)"}
            continue
        to_target = row.time_to_target_seconds
        secs = to_target if to_target is not None else row.train_seconds
        out[model] = {"seconds": secs, "basis": "to target" if to_target is not None else "whole run (target not reached)",
                      "usd": None if usd_per_hour is None else round(secs * usd_per_hour / 3600, 6)}
    return out


def rank(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results`` (each with ``usd_per_run``) cheapest first by RANK_MODELS' USD per run; those
    without a price or a figure last, in their order (pure)."""
    def key(r: dict[str, Any]) -> tuple[tuple[bool, float], ...]:
        costs = [(r.get("usd_per_run") or {}).get(m, {}).get("usd") for m in RANK_MODELS]
        return tuple((c is None, c or 0.0) for c in costs)
    return sorted(results, key=key)


def _result(record: Mapping[str, Any]) -> dict[str, Any]:
    """One bench's line: run id, type, market, price, status, the bench.json it brought home (as
    job_summary.read_bench_report checks it: None, with ``bench_invalid`` saying why, when it is
    not the bench's report)."""
    out = Path(record.get("artifacts") or ".")
    report, why = read_bench_report(out / "outputs" / "bench.json", root=out)
    price = record.get("usd_per_hour")
    if price is None:
        price = (record.get("estimate") or {}).get("usd_per_hour")
    return {"run_id": record["run_id"], "instance_type": record.get("instance_type"), "market": record.get("market"),
            "status": record.get("status"), "usd_per_hour": price, "cost_usd": record.get("cost_usd"),
            "artifacts": str(out), "usd_per_run": usd_per_run(record.get("summary"), price),
            "bench": report, **({"bench_invalid": why} if why else {})}


def on_instances(aws: Aws, settings: Settings, opts: BenchOptions, ui: ReporterLike,
                 backend: Backend) -> list[dict[str, Any]]:
    """Bench each of ``opts.instance_types`` on its own new instance, one after another (each
    launched, measured, brought home and terminated by pipeline.run_job); return one result per type
    (``_result``, plus ``error`` for a type whose run failed: the others still run), cheapest first.

    Raises UsageError before anything is created for a bad type, no MNIST in the sandbox, or an
    estimate above the budget; KeyboardInterrupt after the current run's teardown.
    """
    types = [catalog.lookup(t).name for t in opts.instance_types]  # every type checked before any launch
    args = job_args(opts.quick, backend.is_sandbox, opts.data_dir)
    results = []
    for itype in types:
        one = replace(opts, instance_type=itype, task=engine.builtin_job("bench", args),
                      expect_minutes=EXPECT_MINUTES["quick" if opts.quick else "full"],
                      out=(opts.out / itype) if opts.out and len(types) > 1 else opts.out)
        if len(types) > 1:
            ui.note(f"bench {itype} ({types.index(itype) + 1} of {len(types)})")
        try:
            results.append(_result(pipeline.run_job(aws, settings, one, ui, backend)))
        except Ec2GpuError as exc:
            if len(types) == 1:
                raise
            ui.note(f"bench {itype} failed: {exc.message}; going on with the others")
            results.append({"instance_type": itype, "status": "failed", "error": exc.message, "usd_per_run": {}})
    return rank(results)


def local(opts: BenchOptions, ui: ReporterLike, settings: Settings | None) -> list[dict[str, Any]]:
    """Bench this machine under the same agent and job contract as an instance (local.run_local);
    the run goes into the ledger as backend "local", instance type "local", no cost. Raises
    UsageError without torch, RemoteError when the bench fails."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError("--local needs PyTorch on this machine", "pip install 'ec2gpu[train]' (or make demo)")
    job = engine.builtin_job("bench", job_args(opts.quick, False, opts.data_dir))
    run_id = pipeline.new_run_id()
    out = Path(opts.out or Path("runs") / run_id).resolve()
    started = datetime.now(timezone.utc).isoformat()
    with ui.phase("running"):
        summary = run_local(job, run_id, out, ui)
    record = run_record.new(run_id, opts.command, "local", out, status="completed", task="bench",
                            instance_type="local", market="local", phases=dict(ui.phases),
                            **columns(summary, "bench"), exit_status=0,
                            ended_at=datetime.now(timezone.utc).isoformat(), billed_seconds=0.0, cost_usd=0.0)
    record["started_at"] = started
    run_record.save(record, out)
    if settings is not None:
        pipeline._ledger(settings, record, ui)
    return [_result(record)]
