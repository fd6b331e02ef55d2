"""`python -m ec2gpu.train.bench`: what this machine's CPU and GPU do, measured with torch alone.

The instance side of `ec2gpu bench` (shipped with the trainer: torch, numpy and, for the chart,
matplotlib; never boto3 or fabric). It answers "is the GPU worth it, and why" with measurements:

- the machine: CPU model, vCPUs, RAM; each GPU's name and memory, the driver and CUDA versions;
- memory bandwidth (GB/s, 1 GB = 1e9 bytes): a device-to-device copy and a STREAM triad on the
  GPU, the same triad on the CPU, host-to-device and device-to-host copies (pinned and pageable);
- compute (TFLOP/s): a dense square matmul at fp32, tf32 and bf16 (fp16 where bf16 is not
  supported) on the GPU and fp32 on the CPU, after a warm-up, timed with CUDA events on the GPU;
- each GPU figure beside its datasheet peak (GPU_PEAKS, with the source) and the fraction of it;
- the seed experiment: the `dbn` preset (784-800-800-10, the blog's network) and the fast `cnn`
  trained on the CPU and on the GPU by ec2gpu's trainer: seconds, samples/s, test accuracy, the
  GPU/CPU speed-up and the seconds to each model's target accuracy (TARGET_ACC); and the dbn at a
  small and a large batch on each device, which shows when the GPU's advantage appears.

Outputs in ``--out``: bench.json (everything above), summary.json (what the controller's cost
estimates read: samples/s per model and device), bench.png (CPU against GPU, measured against
peak). ``--quick`` uses small sizes and a 6,000-image subset (tests, the sandbox's smoke run).
Exit codes: 0 done, 2 bad input, 1 a measurement failed.
"""
from __future__ import annotations

import argparse
import functools
import json
import operator
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NotRequired, TypedDict

from .files import write_json

if TYPE_CHECKING:  # mnist imports torch; this module imports it only when it measures
    from .summary import Summary

#: Datasheet peaks of the GPUs in ec2gpu's catalog (dense, without sparsity): memory bandwidth in
#: GB/s and TFLOP/s. ``None``: the GPU has no such tensor-core mode. Sources, NVIDIA datasheets:
#: T4 https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf;
#: A10 https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf
#: (the A10G is AWS's variant of the A10; AWS publishes no separate figures, so these are upper
#: bounds for it); L4 https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet
#: (its tensor figures are quoted with sparsity: halved here); V100 SXM2
#: https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf;
#: A100 SXM4 40 GB https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf;
#: H100 SXM and H200 SXM https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
#: (sparse figures halved; the H200 has the H100's compute and 4.8 TB/s); A100 SXM4 80 GB: the A100
#: datasheet above (2,039 GB/s); L40S https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413
#: (sparse figures halved); B200: the HGX B200 8-GPU figures of https://www.nvidia.com/en-us/data-center/hgx/
#: divided by 8 (64 TB/s, FP32 600 TFLOPS, sparse TF32 18 and FP16/BF16 36 PFLOPS halved).
#: Transcribed 2026-11; fp16 is the tensor-core fp16 figure (fp16 accumulate aside).
GPU_PEAKS: dict[str, dict[str, float | None]] = {
    "T4": {"bandwidth_gbs": 320, "fp32": 8.1, "tf32": None, "bf16": None, "fp16": 65.0},
    "A10G": {"bandwidth_gbs": 600, "fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "L4": {"bandwidth_gbs": 300, "fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
    "V100": {"bandwidth_gbs": 900, "fp32": 15.7, "tf32": None, "bf16": None, "fp16": 125.0},
    "A100": {"bandwidth_gbs": 1555, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "H100": {"bandwidth_gbs": 3350, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "A100-80GB": {"bandwidth_gbs": 2039, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"bandwidth_gbs": 864, "fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0},
    "H200": {"bandwidth_gbs": 4800, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "B200": {"bandwidth_gbs": 8000, "fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0},
}

#: The test accuracy each model of the seed experiment is timed to (the trainer's --target-acc):
#: the cnn is built for 99.0%; the dbn preset ends near 97.2% after its 10 epochs here.
TARGET_ACC = {"cnn": 0.99, "dbn": 0.96}

#: Sizes: elements per array for the bandwidth tests (fp32), the matmul's side, repeats, and the
#: training subset (0: all 60,000 images). Full sizes keep each timed kernel well above a
#: millisecond on the catalog's GPUs and every array far larger than any CPU cache.
SIZES: dict[str, dict[str, Any]] = {
    "full": {"gpu_elems": 1 << 26, "cpu_elems": 1 << 25, "gpu_matmul": 8192, "cpu_matmul": 2048, "repeats": 10,
             "train_subset": 0, "dbn_epochs": None, "batch_epochs": 1},
    "quick": {"gpu_elems": 1 << 22, "cpu_elems": 1 << 22, "gpu_matmul": 2048, "cpu_matmul": 512, "repeats": 3,
              "train_subset": 6000, "dbn_epochs": 2, "batch_epochs": 1},
}
SMALL_BATCH, LARGE_BATCH = 64, 1024  # the dbn preset's batch, and one that fills a GPU better

#: Under this test accuracy a run of the seed experiment did not train (shown so, no USD per run).
#: The best constant answer scores 11.35% on MNIST's test set (digit 1: 1,135 of 10,000); 20% is
#: twice chance. Measured on this project's development machine (2 vCPU x86-64, 24 GiB): a net that
#: learns is far above it after 1 epoch of --quick's 6,000 images (mlp 89.3%, cnn 93.0%); the dbn's
#: sigmoid layers sit at chance ~2 epochs of the full set (`python -m ec2gpu.train.mnist --model
#: dbn`: 9.8, 10.3, 35.1, 89.8% after epochs 1-4), so --quick's ~190 steps of 64 end at 10-11%.
TRAINED_MIN_ACC = 0.2


class Gpu(TypedDict):
    """One GPU as torch sees it: its name, the catalog model in it (gpu_model), memory (bytes)."""

    name: str
    model: str | None
    memory_bytes: int


class Machine(TypedDict):
    """What ``machine`` reads: CPU model, vCPUs (None: unknown), RAM (bytes), the GPUs, the NVIDIA
    driver (None: no nvidia-smi), the CUDA, torch and Python versions."""

    cpu: str
    vcpus: int | None
    ram_bytes: int
    gpus: list[Gpu]
    driver: str | None
    cuda: str | None
    torch: str
    python: str


class AgainstPeak(TypedDict):
    """A measured figure beside its datasheet peak (the same unit) and the fraction of it."""

    measured: float
    peak: float
    fraction: float


class RunRow(TypedDict):
    """One run of the seed experiment: seconds of training, samples/s and test accuracy (None: no
    epoch ran), epochs, the target accuracy and seconds to it (None: not reached), the batch size."""

    train_seconds: float
    samples_per_second: float | None
    test_acc: float | None
    epochs: int
    target_acc: float
    time_to_target_seconds: float | None
    batch_size: int


class Training(TypedDict):
    """The seed experiment: per model, a RunRow per device and ``speedup`` (a float: CPU seconds /
    GPU seconds) where both ran; per device, a RunRow per batch size (its decimal string)."""

    models: dict[str, dict[str, RunRow | float]]
    batch: dict[str, dict[str, RunRow]]


class Bench(TypedDict):
    """bench.json (the module docstring): per device, bandwidth (GB/s, and the element count) and
    matmul TFLOP/s (and the side); with a GPU its datasheet peaks and each figure against them."""

    quick: bool
    machine: Machine
    devices: list[str]
    bandwidth: dict[str, dict[str, float]]
    compute: dict[str, dict[str, float]]
    peaks_source: str
    peak: NotRequired[dict[str, float | None] | None]
    against_peak: NotRequired[dict[str, AgainstPeak]]
    training: NotRequired[Training]  # set last (run)


class BenchSummary(TypedDict):
    """The bench's summary.json (summary_of): what the controller keeps in the ledger."""

    kind: str
    quick: bool
    best_device: str
    gpu: str | None
    gpu_count: int
    models: dict[str, dict[str, dict[str, float | None]]]
    triad_gbs: dict[str, float]
    fp32_tflops: dict[str, float]


def trained(test_acc: object) -> bool:
    """Whether a run that reached ``test_acc`` (a fraction) trained at all (TRAINED_MIN_ACC) (pure)."""
    return isinstance(test_acc, (int, float)) and test_acc >= TRAINED_MIN_ACC


def copy_bytes(n: int, itemsize: int) -> int:
    """Bytes a copy of ``n`` elements moves: each read once and written once (pure)."""
    return 2 * n * itemsize


def triad_bytes(n: int, itemsize: int) -> int:
    """Bytes STREAM's triad a = b + s*c moves over ``n`` elements: two arrays read, one written
    (pure; the convention of https://www.cs.virginia.edu/stream/ref.html, write-allocate traffic
    not counted)."""
    return 3 * n * itemsize


def matmul_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of an (m x k) @ (k x n) matmul: one multiply and one add per
    term (pure)."""
    return 2 * m * n * k


def gpu_model(name: str | None) -> str | None:
    """The catalog GPU model in a device name ('Tesla T4' -> 'T4', 'NVIDIA A10G' -> 'A10G',
    'NVIDIA H100 80GB HBM3' -> 'H100', 'NVIDIA A100-SXM4-80GB' -> 'A100-80GB'; 'NVIDIA A10' -> None),
    or None (pure)."""
    words = (name or "").upper().replace("-", " ").split()
    model = next((model for model in GPU_PEAKS if model in words), None)
    return "A100-80GB" if model == "A100" and "80GB" in words else model


def timed(fn: Callable[[], object], device: str, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed ones; CUDA events
    on a GPU (kernels are asynchronous), perf_counter on the CPU."""
    import torch
    for _ in range(warmup):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bandwidth(device: str, n: int, repeats: int) -> dict[str, float]:
    """GB/s of a copy and a triad over ``n`` fp32 elements on ``device``; on a GPU also the host
    transfers (pinned and pageable, each way)."""
    import torch
    a, b, c = (torch.rand(n, device=device) for _ in range(3))
    size = a.element_size()
    out: dict[str, float] = {"elements": n,
           "copy_gbs": copy_bytes(n, size) / timed(lambda: a.copy_(b), device, repeats) / 1e9,
           "triad_gbs": triad_bytes(n, size) / timed(lambda: torch.add(b, c, alpha=3.0, out=a), device, repeats) / 1e9}
    if device == "cuda":
        for kind in ("pinned", "pageable"):
            host = torch.empty(n, pin_memory=kind == "pinned")
            nbytes = n * size
            out[f"h2d_{kind}_gbs"] = nbytes / timed(functools.partial(a.copy_, host, non_blocking=True), device,
                                                    repeats) / 1e9
            out[f"d2h_{kind}_gbs"] = nbytes / timed(functools.partial(host.copy_, a, non_blocking=True), device,
                                                    repeats) / 1e9
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def matmul(device: str, n: int, repeats: int) -> dict[str, float]:
    """TFLOP/s of an n x n matmul on ``device``: fp32 (tf32 off), and on a GPU tf32 and bf16 (fp16
    where the GPU has no bf16)."""
    import torch
    modes = [("fp32", torch.float32, False)]
    if device == "cuda":
        from .mnist import native_bf16
        half = ("bf16", torch.bfloat16) if native_bf16() else ("fp16", torch.float16)
        modes += [("tf32", torch.float32, True), (*half, False)]
    out: dict[str, float] = {"n": n}
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, dtype, tf32 in modes:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            x, y = torch.rand(n, n, device=device, dtype=dtype), torch.rand(n, n, device=device, dtype=dtype)
            tflops = matmul_flops(n, n, n) / timed(functools.partial(operator.matmul, x, y), device, repeats) / 1e12
            out[f"{name}_tflops"] = float(f"{tflops:.4g}")  # 4 significant digits: a slow CPU's is never 0.0
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return out


def machine() -> Machine:
    """What this machine is: CPU model, vCPUs, RAM (bytes), torch and CUDA versions, the NVIDIA
    driver (from nvidia-smi, None without it), and each GPU's name and memory (bytes)."""
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    driver = None
    if shutil.which("nvidia-smi"):
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30, check=True).stdout.split("\n")[0].strip()
        except (subprocess.SubprocessError, OSError):
            driver = None
    gpus: list[Gpu] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "model": gpu_model(p.name), "memory_bytes": p.total_memory})
    return {"cpu": cpu, "vcpus": os.cpu_count(), "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "gpus": gpus, "driver": driver, "cuda": torch.version.cuda, "torch": torch.__version__,
            "python": platform.python_version()}


def against_peak(measured: dict[str, float], model: str | None) -> dict[str, AgainstPeak]:
    """Each GPU figure with its datasheet peak and the measured fraction of it (pure): keys like
    ``triad_gbs`` -> {"measured", "peak", "fraction"}; {} for a GPU not in GPU_PEAKS."""
    peak = GPU_PEAKS.get(model or "")
    if not peak:
        return {}
    out: dict[str, AgainstPeak] = {}
    for key, value in measured.items():
        limit = peak["bandwidth_gbs"] if key in ("copy_gbs", "triad_gbs") else \
            peak.get(key.removesuffix("_tflops")) if key.endswith("_tflops") else None
        if limit and isinstance(value, (int, float)):
            out[key] = {"measured": value, "peak": limit, "fraction": round(value / limit, 3)}
    return out


def train(model: str, device: str, out: Path, data_dir: str | None, extra: list[str]) -> Summary:
    """Train ``model`` on ``device`` with ec2gpu's trainer, in this process (torch and CUDA start
    once for all the runs: a child process each cost 2-3 s more here); its summary.json. Its log
    lines go to this process's output. Raises RuntimeError when it fails."""
    from . import mnist
    argv = ["--model", model, "--device", device, "--out", str(out), "--no-plot",
            "--target-acc", str(TARGET_ACC.get(model, 0.99)), *extra, *(["--data-dir", data_dir] if data_dir else [])]
    progress = os.environ.pop("EC2GPU_PROGRESS_FILE", None)  # the bench's own progress, not each run's
    handler = signal.getsignal(signal.SIGTERM)  # the trainer sets its own (checkpoint, then stop)
    try:
        code = mnist.main(argv)
    except Exception as exc:  # noqa: BLE001 - any failure of one run (CUDA out of memory, ...) is the bench's
        raise RuntimeError(f"the trainer ({model} on {device}) failed: {type(exc).__name__}: {exc}") from exc
    finally:
        signal.signal(signal.SIGTERM, handler)
        if progress is not None:
            os.environ["EC2GPU_PROGRESS_FILE"] = progress
    if code != 0:
        raise RuntimeError(f"the trainer ({model} on {device}) exited {code}; its log is above")
    summary: Summary = json.loads((out / "summary.json").read_text())  # the trainer's, just written
    return summary


def seed_experiment(devices: list[str], sizes: dict[str, Any], data_dir: str | None,
                    progress: Callable[[int, int, str], None]) -> Training:
    """The dbn and cnn presets on each device, and the dbn at a small and a large batch: per run
    seconds of training, samples/s, test accuracy, seconds to TARGET_ACC (None: not reached);
    ``speedup`` = CPU seconds / GPU seconds per model. ``progress(done, total, label)``."""
    subset = ["--train-subset", str(sizes["train_subset"])] if sizes["train_subset"] else []
    runs: list[dict[str, Any]] = [{"model": m, "device": d, "batch": None,
             "extra": subset + (["--epochs", str(sizes["dbn_epochs"])] if m == "dbn" and sizes["dbn_epochs"] else [])}
            for m in ("dbn", "cnn") for d in devices]
    runs += [{"model": "dbn", "device": d, "batch": b,
              "extra": subset + ["--epochs", str(sizes["batch_epochs"]), "--batch-size", str(b)]}
             for d in devices for b in (SMALL_BATCH, LARGE_BATCH)]
    result: Training = {"models": {}, "batch": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i, r in enumerate(runs):
            label = f"{r['model']} on {r['device']}" + (f", batch {r['batch']}" if r["batch"] else "")
            progress(i, len(runs), f"training {label}")
            s = train(r["model"], r["device"], Path(tmp) / f"run{i}", data_dir, r["extra"])
            row: RunRow = {"train_seconds": s["train_seconds"], "samples_per_second": s["samples_per_second"],
                   "test_acc": s["test_acc"], "epochs": s["epochs"], "target_acc": s["target_acc"],
                   "time_to_target_seconds": s["time_to_target_seconds"], "batch_size": s["hparams"]["batch_size"]}
            if r["batch"]:
                result["batch"].setdefault(r["device"], {})[str(r["batch"])] = row
            else:
                result["models"].setdefault(r["model"], {})[r["device"]] = row
    for by_device in result["models"].values():
        cpu, cuda = by_device.get("cpu"), by_device.get("cuda")
        if isinstance(cpu, dict) and isinstance(cuda, dict):
            by_device["speedup"] = round(cpu["train_seconds"] / cuda["train_seconds"], 2)
    return result


def _headline(row: RunRow) -> dict[str, float | None]:
    """A run's figures summary_of keeps (pure)."""
    return {"samples_per_second": row["samples_per_second"], "train_seconds": row["train_seconds"],
            "time_to_target_seconds": row["time_to_target_seconds"], "test_acc": row["test_acc"],
            "epochs": row["epochs"]}


def summary_of(bench: Bench) -> BenchSummary:
    """The figures the controller keeps in the ledger (pure): per model and device, samples/s,
    seconds of training and to the target; the best device's; the headline bandwidth and TFLOP/s."""
    best = "cuda" if bench["machine"]["gpus"] else "cpu"
    models = {m: {d: _headline(row) for d, row in by_device.items() if isinstance(row, dict)}
              for m, by_device in bench["training"]["models"].items()}
    return {"kind": "bench", "quick": bench["quick"], "best_device": best,
            "gpu": bench["machine"]["gpus"][0]["model"] if bench["machine"]["gpus"] else None,
            "gpu_count": len(bench["machine"]["gpus"]),
            "models": models,
            "triad_gbs": {d: b["triad_gbs"] for d, b in bench["bandwidth"].items()},
            "fp32_tflops": {d: c["fp32_tflops"] for d, c in bench["compute"].items()}}


def plot(bench: Bench, path: Path) -> None:
    """bench.png: left, seconds to train each model on the CPU and on the GPU (the seed experiment);
    right, each GPU figure as a fraction of its datasheet peak (or, without a GPU, the CPU's
    figures). Raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    models = list(bench["training"]["models"])
    devices = ["cpu"] + (["cuda"] if bench["machine"]["gpus"] else [])
    width = 0.8 / len(devices)
    for j, d in enumerate(devices):
        rows = [bench["training"]["models"][m].get(d) for m in models]
        secs = [row["train_seconds"] if isinstance(row, dict) else 0 for row in rows]
        bars = left.bar([i + j * width for i in range(len(models))], secs, width, label={"cpu": "CPU", "cuda": "GPU"}[d])
        left.bar_label(bars, fmt="%.1f s", fontsize=8)
    left.set_xticks([i + width * (len(devices) - 1) / 2 for i in range(len(models))], models)
    left.set_ylabel("seconds of training")
    left.set_title("the seed experiment: CPU against GPU")
    left.legend()
    peaks = bench.get("against_peak") or {}
    if peaks:
        keys = list(peaks)
        right.barh(keys, [peaks[k]["fraction"] * 100 for k in keys], color="tab:green")
        for i, k in enumerate(keys):
            right.text(1, i, f"{peaks[k]['measured']:,.1f} of {peaks[k]['peak']:,.1f}", va="center", fontsize=8)
        right.set_xlim(0, 100)
        right.set_xlabel("percent of the datasheet peak")
        right.set_title(f"{bench['machine']['gpus'][0]['name']}: measured against peak")
    else:
        cpu = {"triad GB/s": bench["bandwidth"]["cpu"]["triad_gbs"], "copy GB/s": bench["bandwidth"]["cpu"]["copy_gbs"],
               "fp32 TFLOP/s x100": bench["compute"]["cpu"]["fp32_tflops"] * 100}
        right.barh(list(cpu), list(cpu.values()), color="tab:blue")
        right.set_title("CPU only (no GPU on this machine)")
    fig.suptitle(f"ec2gpu bench: {bench['machine']['cpu']}, {bench['machine']['vcpus']} vCPUs"
                 + (" (quick sizes)" if bench["quick"] else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Progress:
    """Writes $EC2GPU_PROGRESS_FILE (when set) for the controller's live display: steps done of
    the total, with a label."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def __call__(self, done: int, total: int, label: str) -> None:
        print(label + (f" ({done + 1} of {total})" if total > 1 else ""), flush=True)
        if not self.path:
            return
        try:
            write_json(self.path, {"label": label, "done": done, "total": total})
        except OSError:
            pass  # a display aid


def run(out: Path, quick: bool, data_dir: str | None, skip_training: bool = False) -> Bench:
    """Measure this machine (module docstring) and write bench.json, summary.json and bench.png to
    ``out``; return bench.json's content."""
    import torch
    sizes = SIZES["quick" if quick else "full"]
    progress = Progress(os.environ.get("EC2GPU_PROGRESS_FILE"))
    info = machine()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    bench: Bench = {"quick": quick, "machine": info, "devices": devices, "bandwidth": {}, "compute": {},
                   "peaks_source": "GPU_PEAKS in ec2gpu/train/bench.py (NVIDIA datasheets)"}
    for d in devices:
        progress(0, 1, f"memory bandwidth on {d}")
        bench["bandwidth"][d] = bandwidth(d, sizes["gpu_elems" if d == "cuda" else "cpu_elems"], sizes["repeats"])
        progress(0, 1, f"matmul on {d}")
        bench["compute"][d] = matmul(d, sizes["gpu_matmul" if d == "cuda" else "cpu_matmul"], sizes["repeats"])
    if "cuda" in devices:
        model = info["gpus"][0]["model"]
        bench["peak"] = GPU_PEAKS.get(model or "")
        bench["against_peak"] = against_peak({**bench["bandwidth"]["cuda"], **bench["compute"]["cuda"]}, model)
    bench["training"] = {"models": {}, "batch": {}} if skip_training else seed_experiment(devices, sizes, data_dir,
                                                                                          progress)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(bench, indent=2) + "\n")
    (out / "summary.json").write_text(json.dumps(summary_of(bench), indent=2) + "\n")
    if bench["training"]["models"]:
        try:
            plot(bench, out / "bench.png")
        except ImportError as exc:
            print(f"bench.png skipped: {exc}", flush=True)
    return bench


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ec2gpu.train.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("EC2GPU_OUTPUT_DIR", "bench"),
                   help="where bench.json, summary.json and bench.png go (default $EC2GPU_OUTPUT_DIR, else ./bench)")
    p.add_argument("--quick", action="store_true", help="small sizes and a 6,000-image subset (seconds, not minutes)")
    p.add_argument("--data-dir", help="MNIST directory for the trainer (default: its own: $EC2GPU_DATA_DIR or "
                                      "the public mirrors)")
    p.add_argument("--skip-training", action="store_true", help="bandwidth and compute only")
    args = p.parse_args(argv)
    if args.data_dir and not Path(args.data_dir).is_dir():
        print(f"error: --data-dir {args.data_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        bench = run(Path(args.out), args.quick, args.data_dir, args.skip_training)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for d in bench["devices"]:
        b, c = bench["bandwidth"][d], bench["compute"][d]
        print(f"{d}: triad {b['triad_gbs']:,.1f} GB/s, copy {b['copy_gbs']:,.1f} GB/s, fp32 matmul "
              f"{c['fp32_tflops']:,.3f} TFLOP/s", flush=True)
    for m, by_device in bench["training"]["models"].items():
        for d, row in by_device.items():
            if isinstance(row, dict):
                acc, rate = row["test_acc"], row["samples_per_second"]
                assert acc is not None and rate is not None  # each run trains an epoch at least (SIZES): measured
                print(f"{m} on {d}: {row['train_seconds']:.2f} s, {rate:,.0f} samples/s, "
                      f"test accuracy {100 * acc:.2f}%" + ("" if trained(acc) else
                      f" (did not train: under {100 * TRAINED_MIN_ACC:.0f}%)"), flush=True)
    print(f"done: bench.json, summary.json{', bench.png' if (Path(args.out) / 'bench.png').exists() else ''} in "
          f"{args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
