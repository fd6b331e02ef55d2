"""How long `ec2gpu --help` takes, and which imports cost the most (issue: a CLI that starts fast).

    .venv/bin/python scripts/bench_help.py [--runs 10]

Prints the median and best wall seconds of `ec2gpu --help` and of a bare `python -c pass` (the
floor), then the ten slowest imports (cumulative microseconds, `python -X importtime`).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def wall(argv: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    exe = shutil.which("ec2gpu") or str(__import__("pathlib").Path(sys.executable).with_name("ec2gpu"))
    for label, argv in (("ec2gpu --help", [exe, "--help"]), ("python -c pass", [sys.executable, "-c", "pass"])):
        t = wall(argv, args.runs)
        print(f"{label:16s} median {statistics.median(t):.3f} s, best {min(t):.3f} s ({args.runs} runs)")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import sys; sys.argv = ['ec2gpu', '--help']\nfrom ec2gpu.cli import main; main()"],
                          capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
            rows.append((int(cumulative), name))
    print("slowest imports (cumulative us):")
    for us, name in sorted(rows, reverse=True)[:10]:
        print(f"  {us:8,d}  {name}")


if __name__ == "__main__":
    main()
