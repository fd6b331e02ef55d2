"""Memory and time of the controller on a job log of hundreds of MB (issue 26.7: a 300 MB log took
900 MB of controller memory and 387 s, read whole).

    .venv/bin/python scripts/bench_big_log.py [--mb 300]

Starts one sshd on 127.0.0.99 (the sandbox's, in a temporary directory), writes a log of ``--mb``
MB of 100-byte lines with an exit status beside it on that "instance", then, each in a fresh
Python process so each peak is its own: (1) follows the log to its end as a run does
(jobs.follow: chunked reads, whole lines to a sink that drops them, the tee nodes.LocalLog
writes), (2) copies it home as `download` does (nodes.copy_log, masked line by line). Prints
seconds and the process's peak resident memory (ru_maxrss) beside its baseline after imports.
Removes everything it made. Asserts nothing.
"""
from __future__ import annotations

import argparse
import getpass
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from ec2gpu.remote import jobs, ssh
from ec2gpu.runs.execute import nodes
host, port, user, key, known, run_dir, what, out = sys.argv[1:9]
conn = ssh.connect(host, int(port), user, Path(key), Path(known))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if what == "follow":
    with nodes.LocalLog(Path(out)) as tee:
        lines = jobs.LineSplitter(lambda line: None)
        def deliver(chunk):
            tee.write(chunk)
            lines(chunk)
        jobs.follow(conn, run_dir, "job.log", jobs.LogCursor(deliver), poll_s=0.1)
else:
    nodes.copy_log(conn, f"{run_dir}/job.log", Path(out), lambda line: line.replace("s3cret", "****"))
seconds = time.perf_counter() - t0
print(json.dumps({"what": what, "seconds": seconds, "base_mb": base / 1024,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "local_mb": Path(out).stat().st_size / 1e6}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=300)
    args = p.parse_args()
    from ec2gpu.aws.network import generate_key, write_private_key
    from ec2gpu.remote import ssh
    from ec2gpu.sandbox import sshd

    tmp = Path(tempfile.mkdtemp(prefix="bench-big-log-"))
    private, public = generate_key()
    key = tmp / "id.pem"
    write_private_key(key, private)
    inst = sshd.start("i-bench0001", tmp / "inst", "127.0.0.99", public, {})
    try:
        user, known = getpass.getuser(), tmp / "known_hosts"
        conn = ssh.wait_for_ssh(inst.host, inst.port, user, key, known, timeout_s=20)
        run_dir = str(inst.directory / "home" / "run")
        line = b"x" * 99 + b"\n"
        Path(run_dir).mkdir(parents=True)
        with open(f"{run_dir}/job.log", "wb") as f:
            for _ in range(args.mb):
                f.write(line * 10_000)  # 1 MB
        Path(f"{run_dir}/exit_status").write_text("0\n")
        conn.close()
        print(f"log: {args.mb} MB in {args.mb * 10_000:,} lines; peak resident memory of a fresh process "
              f"(its baseline after imports beside it)")
        for what in ("follow", "copy"):
            done = subprocess.run([sys.executable, "-c", CHILD, inst.host, str(inst.port), user, str(key), str(known),
                                   run_dir, what, str(tmp / f"{what}.log")], capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-2000:])
                return 1
            r = json.loads(done.stdout)
            print(f"{what:7s} {r['seconds']:6.1f} s  peak {r['peak_mb']:6.0f} MB (baseline {r['base_mb']:.0f} MB)  "
                  f"written here {r['local_mb']:.0f} MB")
    finally:
        sshd.stop(inst.pid, inst.instance_id)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"this machine: {resource.getpagesize()} B pages; python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
