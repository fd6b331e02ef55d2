"""Cold start: seconds from the command to the job's first log line, per phase, with and without a
baked image, in a sandbox that behaves like EC2 (--like-aws: instances pending 2 s, sshd 1 s after
running, the console's host key fingerprints 2.5 s after that, images pending 3 s).

    .venv/bin/python scripts/bench_cold_start.py [--repeat 3] [--data-dir DIR]

Two tasks: the built-in MNIST trainer (`ec2gpu train mnist`: machine setup, no task setup) and
examples/quickstart (a user task whose setup is `python3 --version`). Each is run --no-baked, then
baked (`ec2gpu image bake`), then run from its image; the median of ``--repeat`` runs per phase is
printed. The sandbox runs on this machine: its phases after SSH are this machine's, its boot phases
are the AWS-like mode's emulated delays. Starts a sandbox of its own (a temporary EC2GPU_HOME) and
removes everything it made. Prints a table and JSON; asserts nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart" / "task.yaml"


def clock_reporter():
    """A silent pipeline.Reporter that also notes when the job's first log line arrived."""
    from ec2gpu.runs.provision import pipeline

    class Clock(pipeline.Reporter):
        def __init__(self):
            super().__init__()
            self.t0, self.first_line_s = time.monotonic(), None

        def log(self, line: str) -> None:
            if self.first_line_s is None:
                self.first_line_s = round(time.monotonic() - self.t0, 2)
    return Clock()


def one_run(task: str, baked: bool, data_dir: str | None) -> dict:
    """One run in the sandbox; its phases (s) up to the job and the seconds to its first log line."""
    from ec2gpu import api
    from ec2gpu.backend import Context
    from ec2gpu.runs.options import TrainOptions
    from ec2gpu.runs.provision import pipeline

    rep = clock_reporter()
    if task == "mnist":
        with Context(None, True) as ctx:
            opts = TrainOptions(epochs=1, baked=baked, trainer_args=["--train-subset=2000"]
                                + (["--data-dir", data_dir] if data_dir else []))
            pipeline.run_job(ctx.aws, ctx.settings, opts, rep, ctx.backend)
    else:
        api.run(task, sandbox=True, expect="1m", reporter=rep, baked=baked)
    keep = ("requesting", "waiting for running", "waiting for SSH", "setup", "upload")
    return {**{k: rep.phases.get(k, 0.0) for k in keep}, "to first line": rep.first_line_s}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data-dir", default=os.environ.get("EC2GPU_DATA_DIR"), help="MNIST (the sandbox has no internet)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    os.environ["EC2GPU_HOME"] = str(tmp / "home")
    if args.data_dir:
        args.data_dir = str(Path(args.data_dir).resolve())
        os.environ["EC2GPU_DATA_DIR"] = args.data_dir
    os.chdir(tmp)
    from ec2gpu import api
    from ec2gpu.aws import baked as baked_images
    from ec2gpu.backend import Context
    from ec2gpu.sandbox import control

    control.up(tmp / "home", like_aws=True)
    results = {}
    try:
        for task in ("mnist", str(QUICKSTART)):
            label = "mnist" if task == "mnist" else "quickstart"
            results[f"{label}, DLAMI + setup"] = [one_run(task, False, args.data_dir) for _ in range(args.repeat)]
            t0 = time.monotonic()
            bake = api.bake(task, sandbox=True)
            results[f"{label}: bake"] = [{"bake (whole command)": round(time.monotonic() - t0, 1),
                                          **{k: v for k, v in bake.record["phases"].items()}}]
            results[f"{label}, baked image"] = [one_run(task, True, args.data_dir) for _ in range(args.repeat)]
    finally:
        with contextlib.suppress(Exception), Context(None, True) as ctx:
            for image in baked_images.images(ctx.aws.ec2, complete=None):
                baked_images.delete(ctx.aws.ec2, image)
        control.down(tmp / "home")
    medians = {name: {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
               for name, runs in results.items()}
    for name, row in medians.items():
        print(f"{name:32s} " + "  ".join(f"{k} {v:.1f}" for k, v in row.items()))
    print(json.dumps({"repeat": args.repeat, "medians_s": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
