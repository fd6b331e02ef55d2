"""Samples/s of `ec2gpu train mnist --nodes N` for N = 1, 2, 3 in the sandbox (a thin wrapper).

Each run is the real path: N sandbox instances (sshd on their own loopback addresses), torchrun
with a c10d rendezvous on node 0, gloo on the CPU. All nodes share this machine's cores, so expect
no speed-up here: this shows the mechanism and its overhead. docs/multi-node.md says what to expect
on real GPU nodes and how to measure it there (the same command without --sandbox).

    python scripts/bench_scaling.py [--nodes 1,2,3] [--epochs 1] [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

EC2GPU = str(Path(sys.executable).parent / "ec2gpu")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="1,2,3", help="node counts to run, comma-separated")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--data-dir", default=os.environ.get("EC2GPU_DATA_DIR"), help="MNIST directory (EC2GPU_DATA_DIR)")
    args = p.parse_args()
    home = tempfile.mkdtemp(prefix="ec2gpu-bench-scaling-")
    env = {**os.environ, "EC2GPU_HOME": home, **({"EC2GPU_DATA_DIR": args.data_dir} if args.data_dir else {})}
    subprocess.run([EC2GPU, "sandbox", "up"], env=env, check=True, stdout=subprocess.DEVNULL)
    rows = []
    try:
        for n in [int(x) for x in args.nodes.split(",")]:
            out = Path(home) / f"run-{n}"
            done = subprocess.run([EC2GPU, "train", "mnist", "--sandbox", "--nodes", str(n), "--epochs", str(args.epochs),
                                   "--out", str(out), "--json"], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            s = json.loads((out / "outputs" / "summary.json").read_text())
            rows.append((n, s["world_size"], s["samples_per_second"], [x["samples_per_second"] for x in s["per_node"]],
                         s["train_seconds"], s["test_acc"]))
            print(f"nodes {n}: world_size {s['world_size']}, {s['samples_per_second']:.0f} samples/s in all "
                  f"(per node {', '.join(f'{x:.0f}' for x in rows[-1][3])}), {s['train_seconds']:.1f} s of training, "
                  f"test accuracy {100 * s['test_acc']:.2f}%", flush=True)
    finally:
        subprocess.run([EC2GPU, "sandbox", "down"], env=env, stdout=subprocess.DEVNULL)
    base = rows[0][2]
    print(f"\nmachine: {os.cpu_count()} CPU cores shared by every sandbox node; speed-up against {rows[0][0]} node(s): "
          + ", ".join(f"{n} nodes {sps / base:.2f}x" for n, _, sps, *_ in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
