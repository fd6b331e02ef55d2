"""Wall seconds of `ec2gpu run FILE --dry-run --json`, one fresh process per task file.

    .venv/bin/python scripts/dry_run_times.py DIR_OR_FILE... [--ec2gpu PATH] [--limit 1.0] [--json]

A dry run prints the plan and creates nothing; it must need no AWS credentials and finish in under
a second per file. Every ``*.yaml``/``*.yml`` under each DIR that looks like a SkyPilot task file (a
line starting with one of TASK_KEYS and a colon) is run once, as a subprocess, in sequence (so the
figures are not shared between processes on a small machine), with every AWS_* and EC2GPU_*
variable removed from the environment, the AWS config and credentials files pointed at /dev/null
and EC2GPU_HOME set to a fresh temporary directory. A non-zero exit is a refusal (the file is not
one ec2gpu runs): it is timed like the others and counted separately.

Prints one line per file (wall seconds, CPU seconds of the process (user + system: what the other
work on a busy machine changes least), exit status, path), then the count, median, max and the
number of files at or over ``--limit`` wall seconds (overall and for the files that exited 0).
SkyPilot's own example files are in its repository's examples/ and llm/ directories.

Python's bytecode caches: the children get this environment's PYTHONDONTWRITEBYTECODE and caches
as they are, so where it is set (it is on the development machine) every module edited since its
cache was written is compiled from source in every run, which an installed ec2gpu never does.
``--fresh-bytecode`` measures as an installed copy runs: the children write and read their caches
under a temporary PYTHONPYCACHEPREFIX (nothing is written beside the sources), warmed by one
untimed run first.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASK_KEYS = ("run", "setup", "resources", "num_nodes", "file_mounts")
TASK_LINE = re.compile(rf"^({'|'.join(TASK_KEYS)})\s*:", re.MULTILINE)


def task_files(paths: list[str]) -> list[Path]:
    """The task files named or found under ``paths``, sorted (each directory's, then the next's)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p.resolve())
            continue
        for f in sorted(p.rglob("*")):
            if f.suffix in (".yaml", ".yml") and f.is_file():
                try:
                    text = f.read_text(errors="replace")
                except OSError:
                    continue
                if TASK_LINE.search(text):
                    found.append(f.resolve())
    return found


def clean_env(home: str, pycache: str | None = None) -> dict[str, str]:
    """This environment less its AWS and ec2gpu variables; no AWS files; EC2GPU_HOME=``home``;
    with ``pycache``, bytecode caches written and read under that directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "EC2GPU_"))}
    env.update(AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null", EC2GPU_HOME=home)
    if pycache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def default_ec2gpu() -> str:
    """The ``ec2gpu`` console script beside this Python (a venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "ec2gpu"
    return str(beside) if beside.exists() else (shutil.which("ec2gpu") or "ec2gpu")


def time_one(ec2gpu: str, path: Path, env: dict[str, str], cwd: str, timeout: float) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, exit status) of one dry run of ``path`` (-1: it ran past ``timeout``)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        code = subprocess.run([ec2gpu, "run", str(path), "--dry-run", "--json"], env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = -1
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), code


def summary(rows: list[tuple[str, float, float, int]], limit: float) -> dict:
    """Count, median and max wall and CPU seconds, and the files at or over ``limit`` wall seconds,
    overall and for exit 0 (pure). ``rows``: (path, wall, cpu, exit)."""
    def stats(picked: list[tuple[str, float, float, int]]) -> dict:
        wall, cpu = [r[1] for r in picked], [r[2] for r in picked]
        return {"count": len(wall), "median_s": round(statistics.median(wall), 3) if wall else None,
                "max_s": round(max(wall), 3) if wall else None, "over_limit": sum(s >= limit for s in wall),
                "median_cpu_s": round(statistics.median(cpu), 3) if cpu else None,
                "max_cpu_s": round(max(cpu), 3) if cpu else None}
    return {"limit_s": limit, "all": stats(rows), "ok": stats([r for r in rows if r[3] == 0]),
            "refused": sum(r[3] != 0 for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="task files, or directories to search for them")
    ap.add_argument("--ec2gpu", default=default_ec2gpu(), help="the command to time (default: %(default)s)")
    ap.add_argument("--limit", type=float, default=1.0, help="seconds a dry run may take (default 1.0)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds after which a run is stopped")
    ap.add_argument("--fresh-bytecode", action="store_true", help="bytecode caches as an installed copy has "
                    "them (a temporary PYTHONPYCACHEPREFIX, one warm-up run), whatever PYTHONDONTWRITEBYTECODE says")
    ap.add_argument("--json", action="store_true", help="print the per-file rows and summary as JSON")
    args = ap.parse_args(argv)

    files = task_files(args.paths)
    if not files:
        ap.error("no task files found")
    rows: list[tuple[str, float, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="ec2gpu-dry-run-") as tmp:
        home = os.path.join(tmp, "home")
        os.mkdir(home)
        env = clean_env(home, os.path.join(tmp, "pycache") if args.fresh_bytecode else None)
        if args.fresh_bytecode:
            time_one(args.ec2gpu, files[0], env, tmp, args.timeout)  # writes the caches: not timed
        for f in files:
            wall, cpu, code = time_one(args.ec2gpu, f, env, tmp, args.timeout)
            rows.append((str(f), wall, cpu, code))
            if not args.json:
                print(f"{wall:6.3f} s  cpu {cpu:6.3f} s  exit {code:3d}  {f}", flush=True)
    result = summary(rows, args.limit)
    if args.json:
        print(json.dumps({"files": [{"path": p, "seconds": round(w, 3), "cpu_seconds": round(u, 3), "exit": c}
                                    for p, w, u, c in rows],
                          **result}, indent=2))
    else:
        for label in ("all", "ok"):
            s = result[label]
            print(f"{label:>3}: {s['count']} files, median {s['median_s']} s, max {s['max_s']} s, "
                  f"{s['over_limit']} at or over {args.limit:g} s; cpu median {s['median_cpu_s']} s, "
                  f"max {s['max_cpu_s']} s")
        print(f"refused (non-zero exit): {result['refused']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
