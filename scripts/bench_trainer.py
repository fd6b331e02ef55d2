#!/usr/bin/env python
"""Benchmark: time to 99% test accuracy of `--model cnn` vs the classic PyTorch MNIST example.

The classic recipe (pytorch/examples mnist/main.py): conv3x3(32) -> conv3x3(64) -> maxpool ->
dropout 0.25 -> FC 128 -> dropout 0.5 -> FC 10, Adadelta lr 1.0, StepLR gamma 0.7, batch 64,
test accuracy measured after each epoch. Both read the same resident tensors and are timed
the same way (training steps only, evaluation excluded), in one process on one machine.
Prints both times, the ratio, and the accuracies. ``--presets`` instead runs every preset once
(its own epochs, seed 0) and prints the README's preset table. Usage:
    python scripts/bench_trainer.py --data-dir ../shared/data/mnist [--seeds 0 1 2]
    python scripts/bench_trainer.py --data-dir ../shared/data/mnist --presets
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ec2gpu.train import data  # noqa: E402


class Classic(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.d1, self.d2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.d1(x), 1)))
        return F.log_softmax(self.fc2(self.d2(x)), 1)


def classic_time_to_99(data_dir: str, max_epochs: int, seed: int = 1) -> tuple[float | None, list[float]]:
    """Train the classic recipe until test accuracy >= 0.99; return (train seconds or None, accs)."""
    d = data.load(data_dir)
    def norm(a):
        return torch.from_numpy(a.copy()).float().div_(255).sub_(0.1307).div_(0.3081).unsqueeze(1)
    xtr, ytr, xte, yte = norm(d.train_images), torch.from_numpy(d.train_labels), norm(d.test_images), \
        torch.from_numpy(d.test_labels)
    torch.manual_seed(seed)
    model = Classic()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    seconds, accs = 0.0, []
    for epoch in range(max_epochs):
        model.train()
        t0 = time.perf_counter()
        perm = torch.randperm(len(xtr))
        for s in range(0, len(xtr), 64):
            i = perm[s:s + 64]
            loss = F.nll_loss(model(xtr[i]), ytr[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        seconds += time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            acc = sum((model(xte[s:s + 1000]).argmax(1) == yte[s:s + 1000]).sum().item()
                      for s in range(0, 10000, 1000)) / 10000
        accs.append(acc)
        print(f"classic epoch {epoch + 1}: test_acc {acc:.4f}, {seconds:.1f} s of training", flush=True)
        if acc >= 0.99:
            return seconds, accs
    return None, accs


def cnn_run(data_dir: str, seed: int, model: str = "cnn") -> dict:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "ec2gpu.train.mnist", "--model", model, "--seed", str(seed),
                        "--data-dir", data_dir, "--out", out, "--no-plot", "--device", "cpu"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("EC2GPU_DATA_DIR", "../shared/data/mnist"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--classic-max-epochs", type=int, default=14, help="the example's default epoch count")
    p.add_argument("--presets", action="store_true", help="run each preset once and print its accuracy and time")
    args = p.parse_args()
    if args.presets:
        return presets(args.data_dir)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    runs = [cnn_run(args.data_dir, s) for s in args.seeds]
    for s, r in zip(args.seeds, runs, strict=True):
        print(f"cnn seed {s}: test_acc {r['test_acc']:.4f} after {r['epochs']} epoch(s), "
              f"{r['train_seconds']:.2f} s of training, time to 99%: {r['time_to_target_seconds']}")
    classic_s, _ = classic_time_to_99(args.data_dir, args.classic_max_epochs)
    mean_acc = sum(r["test_acc"] for r in runs) / len(runs)
    cnn_s = [r["time_to_target_seconds"] or r["train_seconds"] for r in runs]
    mean_s = sum(cnn_s) / len(cnn_s)
    print(f"\ncnn: mean test accuracy {mean_acc:.4f} over {len(runs)} seeds, mean {mean_s:.2f} s of training")
    if classic_s is None:
        print(f"classic: did not reach 99.0% in {args.classic_max_epochs} epochs")
        return 1
    print(f"classic: {classic_s:.1f} s of training to first reach 99.0%")
    print(f"ratio (classic / cnn): {classic_s / mean_s:.1f}x  [target >= 10x with mean accuracy >= 0.990]")
    return 0 if classic_s / mean_s >= 10 and mean_acc >= 0.99 else 1


def presets(data_dir: str) -> int:
    """One run of every preset (seed 0, its own epochs) on the CPU; a Markdown table row each."""
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print("| preset | epochs | test accuracy | training s | trainer wall s | time to 99% (s) |\n|---|---|---|---|---|---|")
    for model in ("dbn", "mlp", "lenet", "cnn"):
        r = cnn_run(data_dir, 0, model)
        ttt = r["time_to_target_seconds"]
        print(f"| `{model}` | {r['epochs']} | {100 * r['test_acc']:.2f}% | {r['train_seconds']:.1f} | "
              f"{r['wall_seconds']:.1f} | {'-' if ttt is None else f'{ttt:.1f}'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
