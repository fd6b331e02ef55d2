"""The instance side of `ec2gpu bench` (python -m ec2gpu.train.bench) on this machine's CPU, at
small sizes: figures that are positive and of the right shape, and the files it writes. The
figures themselves are printed by the bench, never asserted."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from ec2gpu.train import bench  # noqa: E402


def test_bandwidth_and_matmul_give_positive_figures_for_the_cpu():
    bw = bench.bandwidth("cpu", 1 << 16, repeats=2)
    assert bw["elements"] == 1 << 16 and bw["copy_gbs"] > 0 and bw["triad_gbs"] > 0
    assert not any(k.startswith(("h2d", "d2h")) for k in bw)  # host transfers exist only with a GPU
    mm = bench.matmul("cpu", 64, repeats=2)
    assert mm["n"] == 64 and mm["fp32_tflops"] > 0 and set(mm) == {"n", "fp32_tflops"}


def test_machine_names_cpu_memory_and_no_gpu_here():
    m = bench.machine()
    assert m["vcpus"] >= 1 and m["ram_bytes"] > 2 ** 28 and m["cpu"] and m["torch"]
    assert m["gpus"] == []  # the torch CPU build: no GPU, and the bench says so (CPU only)


def test_the_bench_without_training_writes_bench_json_and_summary(tmp_path):
    """(The seed experiment's runs are the trainer's, tested in test_trainer.py; `ec2gpu bench
    --sandbox`/`--local` run them end to end in tests/e2e/test_bench.py.)"""
    progress = tmp_path / "progress.json"
    r = subprocess.run([sys.executable, "-m", "ec2gpu.train.bench", "--quick", "--skip-training",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "EC2GPU_PROGRESS_FILE": str(progress)})
    assert r.returncode == 0, r.stdout + r.stderr
    b = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert b["quick"] and b["devices"] == ["cpu"] and b["bandwidth"]["cpu"]["triad_gbs"] > 0
    assert b["compute"]["cpu"]["n"] == bench.SIZES["quick"]["cpu_matmul"] and "against_peak" not in b
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["kind"] == "bench" and s["best_device"] == "cpu" and s["gpu"] is None and s["gpu_count"] == 0
    assert s["triad_gbs"] == {"cpu": b["bandwidth"]["cpu"]["triad_gbs"]}
    assert json.loads(progress.read_text())["label"] == "matmul on cpu"  # the controller's live display
    assert "cpu: triad" in r.stdout and not (tmp_path / "out" / "bench.png").exists()  # no training, no chart


def test_a_missing_data_dir_is_refused_with_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ec2gpu.train.bench", "--out", str(tmp_path),
                        "--data-dir", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not a directory" in r.stderr and not (tmp_path / "bench.json").exists()


def test_bf16_counts_only_where_the_gpu_has_it_in_hardware(monkeypatch):
    """A T4 (g4dn) emulates bf16: torch's default answer (including_emulation=True) is True there,
    and bf16 autocast would run without tensor cores; the trainer and the bench ask for hardware."""
    import torch

    from ec2gpu.train import mnist
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert mnist.native_bf16() is False
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # torch < 2.3: the hardware's answer
    assert mnist.native_bf16() is True
