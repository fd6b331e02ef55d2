"""How long `ec2gpu --help` takes next to a bare `python -c pass`, measured paired (issue 29).

    .venv/bin/python scripts/help_time.py [--runs 20] [--json] [--command "run --help"] [--no-pyc]

Runs the two alternately, N times each (``python -c pass``, then ``python -m ec2gpu --help``: what
the console script ``ec2gpu = "ec2gpu.cli:run"`` runs, from the ec2gpu of the current directory),
so that a change in the machine's load hits both alike. Prints each one's median and best wall
milliseconds, the ratio of the medians and the median of the per-pair ratios, and the load average;
``--json`` prints the same as one JSON document. It asserts nothing: the figures go in
docs/testing.md.

By default the runs may write and read ec2gpu's bytecode cache (__pycache__, as an installed
ec2gpu has it), whatever PYTHONDONTWRITEBYTECODE says: one run before the measured ones writes it.
``--no-pyc`` runs a copy of ./ec2gpu without its __pycache__ and with PYTHONDONTWRITEBYTECODE=1,
so that each run compiles ec2gpu's modules again: a source checkout in a shell that sets
PYTHONDONTWRITEBYTECODE=1, as this project's container does.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def wall(argv: list[str], env: dict | None = None) -> float:
    """Wall seconds of one run of ``argv`` (its output thrown away); SystemExit if it fails."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"error: {shlex.join(argv)} exited {done.returncode}: "
                         f"{done.stderr.decode(errors='replace').strip()[-400:]}")
    return seconds


def measure(runs: int, args: list[str], python: str = sys.executable, pyc: bool = True) -> dict:
    """``runs`` pairs of (``python -c pass``, ``python -m ec2gpu ARGS``), alternating, after one
    unmeasured run of each; their medians, bests and ratios. ``pyc``: ec2gpu's bytecode cache is
    written and read; else a copy of ./ec2gpu without one runs, compiled at each run."""
    env = dict(os.environ)
    base_argv, cli_argv = [python, "-c", "pass"], [python, "-m", "ec2gpu", *args]
    with tempfile.TemporaryDirectory(prefix="help_time.") as tmp:
        if pyc:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
            if not os.path.isdir("ec2gpu"):
                raise SystemExit("error: --no-pyc copies ./ec2gpu: run it from the repository's root")
            shutil.copytree("ec2gpu", os.path.join(tmp, "ec2gpu"), ignore=shutil.ignore_patterns("__pycache__"))
            cli_argv = [python, "-c", f"import sys; sys.path.insert(0, {tmp!r}); sys.argv[0] = 'ec2gpu'; "
                        "from ec2gpu.cli import run; run()", *args]
        wall(base_argv, env)  # once unmeasured: the page cache warm,
        wall(cli_argv, env)  # and (pyc) ec2gpu's bytecode written
        base, cli = [], []
        for _ in range(runs):
            base.append(wall(base_argv, env))
            cli.append(wall(cli_argv, env))
    return {
        "runs": runs,
        "command": shlex.join(["python", "-m", "ec2gpu", *args]),
        "bytecode_cache": pyc,
        "python_c_pass": {"median_s": statistics.median(base), "best_s": min(base)},
        "ec2gpu": {"median_s": statistics.median(cli), "best_s": min(cli)},
        "ratio_of_medians": statistics.median(cli) / statistics.median(base),
        "median_pair_ratio": statistics.median(c / b for b, c in zip(base, cli, strict=True)),
        "cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the options, measure, print the figures (or their JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="pairs of runs (default 20)")
    ap.add_argument("--command", default="--help", help="ec2gpu's arguments (default --help)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--no-pyc", action="store_true", help="a copy of ./ec2gpu, compiled at each run "
                    "(PYTHONDONTWRITEBYTECODE=1, no __pycache__)")
    opts = ap.parse_args(argv)
    if opts.runs < 1:
        ap.error("--runs must be at least 1")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = measure(opts.runs, shlex.split(opts.command), pyc=not opts.no_pyc)
    result["load_average_1m_at_start"] = load
    if opts.json:
        print(json.dumps(result, indent=2))
        return 0
    for label, key in (("python -c pass", "python_c_pass"), (result["command"], "ec2gpu")):
        print(f"{label:28s} median {result[key]['median_s'] * 1000:6.1f} ms, "
              f"best {result[key]['best_s'] * 1000:6.1f} ms ({opts.runs} runs)")
    end = result["load_average_1m"]
    print(f"ratio of medians {result['ratio_of_medians']:.2f}x, median of pair ratios "
          f"{result['median_pair_ratio']:.2f}x; bytecode cache {'on' if result['bytecode_cache'] else 'off'}; "
          f"{result['cores']} cores, load average {'-' if load is None else f'{load:.2f}'} at start, "
          f"{'-' if end is None else f'{end:.2f}'} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
