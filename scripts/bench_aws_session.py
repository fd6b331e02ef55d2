"""Seconds to make an ``Aws`` and its ec2, sts, iam and fail-fast ec2 clients, the first time in a
process and the next times (issue 29, item 11: one data loader per process).

    .venv/bin/python scripts/bench_aws_session.py [--repeat 5] [--json]

No AWS call is made (the clients point at a closed loopback port); dummy credentials are set when
none are.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="Aws objects made after the first")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    from ec2gpu.aws.session import Aws
    times = []
    for _ in range(args.repeat + 1):
        start = time.perf_counter()
        aws = Aws("us-east-1", endpoint_url="http://127.0.0.1:9")
        for service in ("ec2", "sts", "iam"):
            aws.client(service)
        aws.client("ec2", fail_fast=True)
        times.append(time.perf_counter() - start)
    out = {"first_s": round(times[0], 3), "next_median_s": round(statistics.median(times[1:]), 3),
           "repeat": args.repeat}
    print(json.dumps(out) if args.json else
          f"first Aws + 4 clients: {out['first_s']} s; next ones (median of {args.repeat}): {out['next_median_s']} s")


if __name__ == "__main__":
    main()
