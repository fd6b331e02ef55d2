"""Time of choosing a workdir's files (sync.manifest: ignore rules, secrets withheld) on a generated tree.

    .venv/bin/python scripts/bench_manifest.py [--files 10000] [--repeat 5] [--git] [--sync PATH] [--json]

Builds a temporary workdir of --files files in nested folders (src/pNN/sMM/...), with a .gitignore
of a few rules (a directory, a glob, a negation), a nested src/p00/.gitignore (git honours it; a
plain directory reads only the top one), an .ec2gpuignore, and a few secrets (*.pem, .env). With
--git the workdir is a git repository (git ls-files decides, then .ec2gpuignore). Times
``sync.manifest`` --repeat times and prints the median and every time (seconds) with the counts of
files sent and withheld. ``--sync PATH`` times another copy of ec2gpu/remote/sync.py (e.g. the code
before a change), imported in this package's place. Removes what it made. Asserts nothing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(root: Path, n: int) -> None:
    """``n`` small files under ``root`` in nested folders, with ignore files and a few secrets."""
    (root / ".gitignore").write_text("build/\n*.log\n!keep.log\n__pycache__/\n")
    (root / ".ec2gpuignore").write_text("*.tmp\n")
    (root / "src" / "p00").mkdir(parents=True)
    (root / "src" / "p00" / ".gitignore").write_text("*.dat\n")
    for i in range(n - 3):
        folder = root / "src" / f"p{i // 10 % 40:02d}" / f"s{i // 400 % 8}"
        if i % 97 == 0:
            folder = root / "build" / f"b{i % 5}"
        name = f"f{i:05d}" + (".log" if i % 10 == 3 else ".tmp" if i % 10 == 7 else ".dat" if i % 10 == 5 else ".py")
        if i % 250 == 1:
            name = "keep.log"
        if i % 500 == 2:
            name = f"k{i}.pem"
        if i % 700 == 4:
            name = ".env"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x\n")


def load_sync(path: str | None):
    """The sync module: this package's, or the file at ``path`` imported in its place."""
    if path is None:
        from ec2gpu.remote import sync
        return sync
    import ec2gpu.remote  # noqa: F401  (the package its relative imports need)
    spec = importlib.util.spec_from_file_location("ec2gpu.remote._bench_sync", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=10_000, help="files in the generated workdir")
    p.add_argument("--repeat", type=int, default=5, help="timed calls of sync.manifest (the median is reported)")
    p.add_argument("--git", action="store_true", help="make the workdir a git repository")
    p.add_argument("--sync", metavar="PATH", help="time this copy of ec2gpu/remote/sync.py instead")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()

    sync = load_sync(args.sync)
    tmp = Path(tempfile.mkdtemp(prefix="bench-manifest-"))
    try:
        root = tmp / "work"
        root.mkdir()
        build(root, args.files)
        if args.git:
            subprocess.run(["git", "init", "-q", str(root)], check=True)
        times, m = [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            m = sync.manifest(root)
            times.append(time.perf_counter() - t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"files_in_workdir": args.files, "files_sent": len(m.files), "withheld": len(m.withheld),
           "git": args.git, "sync": args.sync or "ec2gpu/remote/sync.py", "repeat": args.repeat,
           "median_s": round(statistics.median(times), 4), "times_s": [round(t, 4) for t in times]}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"sync.manifest on {args.files:,} files{' (git)' if args.git else ''} [{out['sync']}]: "
              f"median {out['median_s']:.3f} s of {args.repeat} ({', '.join(f'{t:.3f}' for t in times)}); "
              f"{out['files_sent']:,} files sent, {out['withheld']} withheld")
    return 0


if __name__ == "__main__":
    sys.exit(main())
