"""`ec2gpu bench`: is the GPU worth it, and why: measured on the instance itself (runs/provision/bench.py)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import typer

from .app import JSON, REGION, SANDBOX, _sandbox_flag, app
from .render import RichReporter, err, out, plain, render_json, say, table, table_row

DEVICE = {"cpu": "CPU", "cuda": "GPU"}


@app.command("bench")
def bench_cmd(
    instance_type: Optional[str] = typer.Option(None, "--instance-type", "-t", help="GPU instance type, or several "
                                                "(g4dn.xlarge,g5.xlarge,g6.xlarge): each is benched on its own "
                                                "instance, one after another, and they are ranked by USD per run."),
    spot: bool = typer.Option(False, "--spot", help="Spot instances (USD per run at the zone's spot price)."),
    local: bool = typer.Option(False, "--local", help="Bench this machine instead (needs torch)."),
    quick: bool = typer.Option(False, "--quick", help="Small sizes and a 6,000-image subset: seconds instead of "
                               "minutes (the figures are rougher, the models do not reach their targets, and the "
                               "dbn stays at chance in so few steps: it is marked \"did not train\")."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="MNIST directory on this machine, for --local "
                                           "and --sandbox (default EC2GPU_DATA_DIR, else downloaded; an instance on "
                                           "AWS downloads it)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where results go (default runs/<run-id>/; with "
                                           "several types, one folder per type under it)."),
    max_runtime: int = typer.Option(60, "--max-runtime", min=1, help="Minutes after which each instance terminates "
                                    "itself, whatever happens to this command."),
    budget: Optional[float] = typer.Option(None, "--budget", min=0, help="Refuse a type whose estimated cost in "
                                           "USD is above this (nothing is created for it)."),
    ssh_cidr: Optional[str] = typer.Option(None, "--ssh-cidr", help="CIDR allowed to SSH (default: your public IP/32)."),
    ami: Optional[str] = typer.Option(None, "--ami", help="AMI id (default: the PyTorch Deep Learning AMI)."),
    region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
) -> None:
    """Is the GPU worth it: measure an instance's CPU and GPU, rank types by USD per run.

    Memory bandwidth, matmul TFLOP/s (against the GPU's datasheet peak) and the seed experiment
    (dbn and cnn on its CPU and its GPU); bench.json and bench.png come home, the instance is
    terminated. Results go into the ledger: later estimates of that type use them.

    docs/why-gpus.md explains the figures. In the sandbox the instance is this machine: CPU only."""
    from ..api import train as training
    as_typed = " ".join(["ec2gpu", *sys.argv[1:]]) if sys.argv[0].endswith("ec2gpu") else "ec2gpu bench"
    benched = training.bench(instance_type=instance_type, spot=spot, local=local, quick=quick, data_dir=data_dir,
                             out=out_dir, max_runtime=max_runtime, budget=budget, ssh_cidr=ssh_cidr, ami=ami,
                             region=region, sandbox=_sandbox_flag(sandbox), reporter=RichReporter(err, quiet=as_json),
                             log=lambda line: say(err, line, "dim"), as_typed=as_typed)
    results = [r.to_json() for r in benched]
    if as_json:
        render_json(results)
        return
    for r in results:
        _show(r)
    if len(results) > 1:
        _show_ranking(results)
    failed = [r for r in results if r.get("error")]
    if failed and len(failed) == len(results):
        raise typer.Exit(5)


def _show(r: Mapping[str, Any]) -> None:
    """One bench as rich tables: the machine, bandwidth and compute (with the peak), the seed experiment."""
    from ..train.bench import TRAINED_MIN_ACC, trained  # stdlib only at import (not torch)
    if r.get("error") or not r.get("bench"):
        why = r.get("error") or (f"bench.json not accepted: {r['bench_invalid']}" if r.get("bench_invalid")
                                 else "no bench.json came home")
        say(out, f"{r['instance_type']}: {why}", "red")
        return
    b = r["bench"]
    m = b["machine"]
    gpus = ", ".join(f"{g['name']} ({g['memory_bytes'] / 2**30:.0f} GiB)" for g in m["gpus"]) or "none (CPU only)"
    # bench.json is the instance's: what it says about itself is printed inert, never as markup
    say(out, plain(r["instance_type"], "bold")
        + plain(f": {m['cpu']}, {m['vcpus']} vCPUs, {m['ram_bytes'] / 2**30:.0f} GiB; GPU {gpus}; "
                f"torch {m['torch']}, CUDA {m['cuda'] or '-'}, driver {m['driver'] or '-'}")
        + plain(" (quick sizes)" if b["quick"] else "", "dim"))
    peak = b.get("against_peak") or {}
    t = table("measure", *[DEVICE[d] for d in b["devices"]], "GPU peak", "of peak", title="memory and compute")
    for key, label in (("copy_gbs", "copy GB/s"), ("triad_gbs", "triad GB/s"), ("h2d_pinned_gbs", "host->GPU pinned GB/s"),
                       ("h2d_pageable_gbs", "host->GPU pageable GB/s"), ("d2h_pinned_gbs", "GPU->host pinned GB/s"),
                       ("fp32_tflops", "matmul fp32 TFLOP/s"), ("tf32_tflops", "matmul tf32 TFLOP/s"),
                       ("bf16_tflops", "matmul bf16 TFLOP/s"), ("fp16_tflops", "matmul fp16 TFLOP/s")):
        cells = [b["bandwidth"][d].get(key, b["compute"][d].get(key)) for d in b["devices"]]
        if all(c is None for c in cells):
            continue
        p = peak.get(key)
        table_row(t, label, *["-" if c is None else f"{c:,.2f}" for c in cells],
                  f"{p['peak']:,.1f}" if p else "-", f"{100 * p['fraction']:.0f}%" if p else "-")
    say(out, t)
    t = table("model", "device", "batch", "seconds", "samples/s", "test accuracy", "to target", title="the seed experiment")
    untrained = []  # (model, device) whose test accuracy says it did not train (train/bench.trained)
    for model, by_device in b["training"]["models"].items():
        for d, row in by_device.items():
            if isinstance(row, dict):
                if not trained(row["test_acc"]):
                    untrained.append(f"{model} on the {DEVICE[d]}")
                table_row(t, model, DEVICE[d], row["batch_size"], f"{row['train_seconds']:.2f}",
                          f"{row['samples_per_second']:,.0f}", f"{100 * row['test_acc']:.2f}%"
                          + ("" if trained(row["test_acc"]) else " did not train"),
                          "-" if row["time_to_target_seconds"] is None else f"{row['time_to_target_seconds']:.2f} s")
        if "speedup" in by_device:
            table_row(t, model, "GPU/CPU", "", f"x{by_device['speedup']:.2f} faster", "", "", "")
    say(out, t)
    if untrained:
        say(out, plain(f"did not train: {', '.join(untrained)} (test accuracy under {100 * TRAINED_MIN_ACC:.0f}%; "
                        "chance is 10%): its seconds are a speed, not the cost of a trained model, and it has no USD "
                        "per run" + (" (--quick is too short for it: run without --quick)" if b["quick"] else ""),
                        "yellow"))
    t = table("device", "batch", "seconds", "samples/s", title="the dbn at a small and a large batch (the GPU needs "
              "large ones to be filled)")
    for d, by_batch in b["training"]["batch"].items():
        for batch, row in by_batch.items():
            table_row(t, DEVICE[d], batch, f"{row['train_seconds']:.2f}", f"{row['samples_per_second']:,.0f}")
    say(out, t)
    if r.get("usd_per_hour") is None:
        say(out, f"USD per run: - (no price for {r['instance_type']}); results in {r['artifacts']}/outputs")
        return
    usd = ", ".join(f"{m} {'-' if v['seconds'] is None else _usd(v['usd'])} ({v['basis']})"
                    for m, v in r["usd_per_run"].items())
    say(out, f"USD per run at {r['usd_per_hour']:.4f} USD/h: {usd or '-'}; results in {r['artifacts']}/outputs")


def _usd(value: float | None) -> str:
    return "?" if value is None else f"${value:.5f}"


def _show_ranking(results: Sequence[Mapping[str, Any]]) -> None:
    t = table("rank", "instance type", "market", "USD/h", *[f"{m} USD per run" for m in ("cnn", "dbn")],
              title="ranked by USD per run")
    for i, r in enumerate(results, 1):
        per = r.get("usd_per_run") or {}
        table_row(t, str(i), r["instance_type"], r.get("market") or "-",
                  "-" if r.get("usd_per_hour") is None else f"{r['usd_per_hour']:.4f}",
                  *["-" if (per.get(m) or {}).get("usd") is None else f"{per[m]['usd']:.5f}" for m in ("cnn", "dbn")])
    say(out, t)
