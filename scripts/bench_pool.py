#!/usr/bin/env python
"""Benchmark: an array of trivial elements over a sandbox pool; prints the scheduling overhead per
element and the pool's idle instance-seconds after its queue drained (issue 31's figures).

Runs `ec2gpu run` (the library call, as the CLI does) of a task whose ``run`` is ``true``, with
``--array N --workers W`` on the sandbox (started for the run and stopped after, under its own
EC2GPU_HOME), and reads the run record's element table:

- overhead per element = (the pool's busy span x its slots - the seconds the elements' own
  processes ran) / N, where the busy span is from the first element's start to the last one's end
  and the slots are the workers (one GPU element each): the time a slot spent on anything but a
  job (Ray's scheduling and worker start, the driver's bookkeeping, our per-element files);
- idle instance-seconds = for each instance, from the moment the queue drained (the last element
  started) or its own last element ended, whichever is later, to the moment it left the pool
  (released, or the run's end for the head): what the pool billed after its work was handed out.

Usage: python scripts/bench_pool.py [--elements 100] [--workers 3]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

TASK = "name: bench-pool\nworkdir: null\nrun: 'true'\nresources:\n  instance_type: g4dn.xlarge\nmax_runtime: 30m\n"


def figures(record: dict) -> dict:
    """The benchmark's figures from a pool run's record (pure)."""
    pool = record["pool"]
    elements = pool["elements"]
    starts = [e["ended_at"] - e["seconds"] for e in elements]
    span = max(e["ended_at"] for e in elements) - min(starts)
    slots = pool["workers"]
    ran = sum(e["seconds"] for e in elements)
    drained = max(starts)
    last_end: dict[str, float] = {}
    for e in elements:
        last_end[e["node"]] = max(last_end.get(e["node"], 0.0), e["ended_at"])
    ids = record["instance_ids"]
    # node addresses are the sandbox's loopback ones in launch order (node 0 the head); an
    # instance with no element idles from the drain on
    by_address = sorted(last_end, key=lambda a: tuple(int(x) for x in a.split(".")))
    idle = 0.0
    for k, iid in enumerate(ids):
        left = pool["left_at"].get(iid, pool["ended_at"])
        busy_until = last_end.get(by_address[k], drained) if k < len(by_address) else drained
        idle += max(0.0, left - max(drained, busy_until))
    return {"elements": len(elements), "workers": slots, "span_s": round(span, 2), "job_s": round(ran, 2),
            "overhead_per_element_s": round((span * slots - ran) / len(elements), 3),
            "idle_instance_s": round(idle, 1), "attempts": sum(e["attempts"] for e in elements),
            "instances_over_time": [(p["seconds"], p["instances"]) for p in pool["instances_over_time"]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elements", type=int, default=100)
    p.add_argument("--workers", type=int, default=3)
    args = p.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ec2gpu-bench-pool-"))
    os.environ["EC2GPU_HOME"] = str(home / "home")
    (home / "task.yaml").write_text(TASK)
    from ec2gpu import api
    t0 = time.monotonic()
    record = api.run(str(home / "task.yaml"), array=args.elements, workers=args.workers, sandbox=True,
                     out=home / "run")
    wall = time.monotonic() - t0
    got = figures(record.to_json())
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.python_version()}; sandbox")
    print(f"{got['elements']} trivial elements on {got['workers']} sandbox workers: command {wall:.1f} s, "
          f"elements' busy span {got['span_s']} s, their own processes {got['job_s']} s, attempts {got['attempts']}")
    print(f"scheduling overhead per element: {got['overhead_per_element_s']:.3f} s (goal: under 0.5 s)")
    print(f"idle instance-seconds after the queue drained: {got['idle_instance_s']:.1f}")
    print(f"instances over time (s since the pool started, instances): {got['instances_over_time']}")


if __name__ == "__main__":
    main()
