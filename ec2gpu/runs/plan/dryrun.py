"""`ec2gpu run --dry-run`: the plan of a run, made from the task and this machine's files alone.

Nothing is created and no AWS API is called (so no credentials are needed and a sandbox is not
started): instance types come from the task (tasks/resolve.py) and the catalog, prices from the
refreshed price cache or the shipped table (aws/catalog.py), the limit and the estimate from the
ledger (runs/plan/limits.py, runs/plan/costs.py), the job's environment from engine.node_env with the
values only a launch knows shown as <placeholders>. SkyPilot has the same: `sky launch --dryrun`.

The JSON form (``plan`` below; ``--dry-run --json``) is stable: keys are only ever added. Its keys
are listed in docs/tasks.md ("Seeing the plan first").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from ...settings import Settings
    from ...tasks.arrays import Element
    from ...tasks.mounts import Mount
    from ..execute.engine import TaskJob
    from .limits import Limit

PLAN_VERSION = 1

#: what every run has, whatever the task says (aws/network.py, aws/instances.py, runs/provision/resources.py)
SAFETY = (
    "SSH (port 22) open to your public IP/32 alone (looked up at launch; --ssh-cidr to change it); no other port",
    "host keys pinned from the instance's console output before the first connection",
    "IMDSv2 required (HttpTokens=required, hop limit 1)",
    "root volume gp3, encrypted; deleted with the instance",
    "no AWS credentials or secrets copied to the instance except the secrets the task names (masked in logs)",
    "everything the run creates (instances, security group, key pair) is deleted on every exit path",
)

#: said when the task copies from or writes to S3 (file_mounts)
ROLE_SAFETY = ("an instance role of this run alone: read access to the file_mounts' S3 prefixes, write access to "
               "the MOUNT-mode ones, nothing else; deleted with the run")


def placeholders(nodes: int) -> list[str]:
    """The addresses node_env is given in a plan (pure): '<node 0 private IP>', ..."""
    return [f"<node {i} private IP>" for i in range(nodes)]


def plan(job: TaskJob, settings: Settings, types: list[str], *, nodes: int, spot: bool, spot_fallback: str | None,
         limit: Limit, idle_seconds: int | None, ami: str | None, baked: bool, expect_minutes: float | None,
         backend: str, warnings: list[str], region_source: str | None = None, ami_source: str | None = None,
         idle_source: str | None = None, budget_usd: float | None = None,
         elements: Sequence[Element] = (), slots: int = 1) -> dict[str, Any]:
    """The plan of a run of ``job`` (an engine.TaskJob) on ``types`` (instance types in the order
    they are tried) as a JSON-ready dict; ``limit`` is a runs/plan/limits.Limit, ``idle_seconds`` the
    idle rule's (None: none); ``region_source``, ``ami_source``, ``idle_source``: where the region,
    the AMI and the idle rule come from, in words (api.run); ``budget_usd`` (--budget, the task's
    budget) is judged as the run judges it. ``elements``: an array's or a sweep's (tasks/arrays.py):
    the plan's ``array`` says how many, over how many instances (``nodes``, each running ``slots``
    at once), and the first ones' parameters; the estimate is an element's time x the rounds.
    Prices in USD/h, sizes in bytes and GiB, times in minutes.

    Raises UsageError as catalog.lookup does for a type ec2gpu cannot run. Calls no AWS API."""
    from ...aws import catalog
    from ...tasks import arrays, mounts, resolve
    from . import costs
    from ..execute import engine

    res = job.task.resources
    try:
        choices = {c.instance_type: c for c in resolve.plan(res).choices if c.instance_type}
        skipped = list(resolve.plan(res).skipped)
    except Exception:  # noqa: BLE001 - a flag chose the types: the task's own request does not apply
        choices, skipped = {}, []
    rows: list[dict[str, Any]] = []
    for name in types:
        t = catalog.lookup(name)
        price = catalog.on_demand_price(t.name, settings.region, settings.home)
        c = choices.get(t.name)
        used = (c.gpus_asked if c is not None and c.larger else None) or t.gpu_count
        rows.append({"instance_type": t.name, "asked": c.asked if c is not None else "the configured default",
                     "gpu": t.gpu, "gpu_count": t.gpu_count, "gpus_used": used, "gpu_memory_gib": t.gpu_memory_gib,
                     "vcpus": t.vcpus, "memory_gib": t.memory_gib, "on_demand_usd_per_hour": price.usd_per_hour,
                     "price_source": price.source, "larger": bool(c is not None and c.larger)})
    first = rows[0]
    if elements:  # an element's time, run in rounds over the pool (pipeline.check_estimate)
        minutes, time_source = costs.element_minutes(settings.home, job, first["instance_type"], expect_minutes,
                                                     backend)
        rounds, words = costs.rounds_words(len(elements), nodes, slots)
        if minutes is not None:
            minutes, time_source = minutes * rounds, f"{time_source}; {words}"
    else:
        minutes, time_source = costs.estimate_minutes(settings.home, job, first["instance_type"], expect_minutes,
                                                      backend)
    # spot costs at most the on-demand price (spot's ceiling); the zone's spot price is looked up at launch
    worst = max((r["on_demand_usd_per_hour"] for r in rows if r["on_demand_usd_per_hour"] is not None), default=None)
    at_most = (None if limit.minutes is None or worst is None else
               round(costs.cost_usd(limit.minutes * 60.0, worst) * nodes, 2))
    expected = (None if minutes is None or first["on_demand_usd_per_hour"] is None else
                round(costs.cost_usd(minutes * 60.0, first["on_demand_usd_per_hour"]) * nodes, 4))
    run_dir = "~/ec2gpu/runs/<run id>"
    env = engine.node_env(job, "<run id>", run_dir, 0, placeholders(nodes), first["gpu_count"], False,
                          "<the python with torch>", instance_type=first["instance_type"])
    m = job.manifest
    return {
        "kind": "plan", "version": PLAN_VERSION, "task": job.name,
        "source": str(job.loaded.path) if job.loaded.path else "a command",
        "backend": backend, "region": settings.region,
        "region_source": region_source or "the configured region",
        "zones": "any availability zone of the region with capacity, chosen at launch (the next one on "
                 "InsufficientInstanceCapacity)",
        "nodes": nodes, "market": "spot" if spot else "on-demand", "spot_fallback": spot_fallback,
        "instance_types": rows, "skipped": skipped,
        "disk_gib": res.disk_gib or settings.root_volume_gib,
        "ami": ami, "ami_source": ami_source if ami else None,
        "image": (ami if ami else "the newest image baked for this setup (ec2gpu image ls), else the PyTorch Deep "
                  "Learning AMI, resolved at launch" if baked else "the PyTorch Deep Learning AMI, resolved at launch"),
        "max_runtime": {"minutes": limit.minutes, "source": limit.source},
        "idle_rule_minutes": None if idle_seconds is None else idle_seconds // 60,
        "idle_rule": None if idle_seconds is None else {
            "minutes": idle_seconds // 60, "action": "terminate", "source": idle_source or "max runtime none",
            "meaning": "an instance with no job, SSH connection or busy GPU that long terminates itself"},
        "estimate": {"job_minutes": None if minutes is None else round(minutes, 2), "source": time_source,
                     "expected_usd": expected, "at_most_usd": at_most,
                     "note": "on-demand list prices; spot pays the zone's spot price, at most the on-demand one"},
        "budget": None if budget_usd is None else _budget(budget_usd, expected, at_most, minutes is not None),
        "workdir": {"local": str(m.root) if m else None, "remote": engine.workdir_of(run_dir, job),
                    "git": job.loaded.git,
                    "files": len(m.files) if m else 0, "bytes": m.bytes if m else 0,
                    "withheld": list(m.withheld) if m else []},
        "env": {k: job.mask(v) for k, v in sorted(env.items())},
        "setup": job.mask(job.task.setup or ""), "run": job.mask(job.task.run),
        "outputs": list(job.task.outputs),
        "ports": [{"port": p, "node": 0,
                   "local": f"127.0.0.1:{p}" if p in job.same_ports else "127.0.0.1:(a free port, said when the job starts)",
                   "how": "forwarded over SSH while the job runs; not opened in the security group"}
                  for p in job.task.ports],
        "file_mounts": [_mount_row(mnt, job) for mnt in job.mounts],
        "s3_access": mounts.access(job.mounts),
        "labels": dict(job.task.resources.labels),
        "safety": list(SAFETY) + ([ROLE_SAFETY] if any(mnt.kind == "s3" for mnt in job.mounts) else []),
        "changes": list(warnings),
        "array": None if not elements else {
            "elements": len(elements), "size": elements[0].size, "workers": nodes,
            "described": arrays.describe(elements),
            "first": [e.env() for e in elements[:3]],
            "scheduler": "Ray on the pool's instances (ec2gpu/pool); the pool shrinks as the queue drains"},
    }


def _budget(usd: float, expected: float | None, at_most: float | None, known: bool) -> dict[str, Any]:
    """{usd, refused, why}: a run refuses (pipeline.check_estimate) an estimate above its budget,
    and, for a job whose time is unknown, a most-it-can-cost above it or unbounded (pure)."""
    judged, what = (expected, "the estimate") if known else (at_most, "the most it can cost at its max runtime")
    refused = judged is None or judged > usd
    why = (f"{what} is unbounded or unknown" if judged is None else
           f"{what}, ${judged:.2f}, is {'above' if refused else 'within'} the budget ${usd:.2f}")
    why += " (on-demand list prices, the job alone; the run judges its own estimate, boot and setup included)"
    return {"usd": usd, "refused": refused, "why": why}


def _mount_row(mnt: Mount, job: TaskJob) -> dict[str, Any]:
    """One file_mounts entry of the plan: where it goes, from where, how (tasks/mounts.Mount)."""
    man = job.mount_manifests.get(mnt.target)
    return {"target": mnt.target, "kind": mnt.kind, "source": mnt.url, "mode": mnt.mode,
            "files": len(man.files) if man else None, "bytes": man.bytes if man else None,
            "write_back": mnt.write_back, "create_bucket": mnt.create, "write_allowed": mnt.write_allowed,
            "how": mnt.words()}


def render(p: Mapping[str, Any]) -> list[str]:
    """The plan as lines for a terminal (pure); values from the task are the caller's to print inert."""
    out = [f"plan for task {p['task']} ({p['source']}), {p['backend']} {p['region']}: nothing is created"]
    for i, r in enumerate(p["instance_types"]):
        price = "?" if r["on_demand_usd_per_hour"] is None else f"{r['on_demand_usd_per_hour']:.4f}"
        used = f", the job sees {r['gpus_used']}" if r["gpus_used"] != r["gpu_count"] else ""
        out.append(f"  {'then ' if i else 'try  '}{r['instance_type']}: {r['gpu_count']} x {r['gpu']} "
                   f"{r['gpu_memory_gib']} GiB{used}, {r['vcpus']} vCPUs, {r['memory_gib']} GiB, {price} USD/h "
                   f"on-demand ({r['asked']})")
    out += [f"  skipped: {s}" for s in p["skipped"]]
    if p.get("array"):
        a = p["array"]
        out.append(f"  array: {a['described']} over at most {a['workers']} instance(s), scheduled by Ray; "
                   f"element 0's environment: {' '.join(f'{k}={v}' for k, v in a['first'][0].items())}")
    out.append(f"  {p['nodes']} node(s), {p['market']}"
               + (f" (then {p['spot_fallback']})" if p["spot_fallback"] else "") + f"; zones: {p['zones']}")
    out.append(f"  region {p['region']} ({p.get('region_source') or 'the configured region'}); disk {p['disk_gib']} "
               f"GiB gp3 encrypted; image: {p['image']}" + (f" ({p['ami_source']})" if p.get("ami_source") else ""))
    lim = p["max_runtime"]
    est = p["estimate"]
    from .limits import Limit
    limit = Limit(lim["minutes"], lim["source"]).words()
    idle = p.get("idle_rule")
    out.append(f"  max runtime: {limit} ({lim['source']})"
               + (f"; idle instances end after {idle['minutes']} min ({idle['source']})" if idle else ""))
    if p.get("budget"):
        out.append(f"  budget: {'the run would be REFUSED: ' if p['budget']['refused'] else ''}{p['budget']['why']}")
    out += [f"  port {q['port']} of node 0 -> {q['local']} here ({q['how']})" for q in p.get("ports", [])]
    cost = (f"~${est['expected_usd']:.4f} for {est['job_minutes']} min of job ({est['source']})"
            if est["expected_usd"] is not None else f"job time unknown ({est['source']})")
    out.append(f"  cost: {cost}; at most "
               + ("unbounded (no max runtime)" if est["at_most_usd"] is None else f"${est['at_most_usd']:.2f}")
               + " at the max runtime")
    w = p["workdir"]
    git = w.get("git")
    sent = (f"git clone {git['url']} at {git['ref'] or 'its default branch'}, on the instance" if git
            else w["local"] or "nothing sent")
    out.append(f"  workdir: {sent} -> {w['remote']}"
               + (f" ({w['files']:,} files, {w['bytes']:,} bytes)" if w["local"] else "")
               + (f"; withheld: {', '.join(w['withheld'][:5])}" if w["withheld"] else ""))
    out += [f"  file_mounts {f['target']}: {f['how']}" + (f" ({f['files']:,} files, {f['bytes']:,} bytes)"
                                                           if f["files"] is not None else "")
            for f in p.get("file_mounts", [])]
    from ...tasks.mounts import access_words
    access = access_words(p.get("s3_access") or {})
    if access:
        out.append(f"  {access}")
    out.append("  environment of node 0: " + ", ".join(f"{k}={v}" for k, v in p["env"].items()))
    if p["setup"]:
        out.append("  setup (bash, once per instance, in the workdir):")
        out += [f"    {line}" for line in p["setup"].splitlines()]
    out.append("  run (bash, on every node, in the workdir):")
    out += [f"    {line}" for line in p["run"].splitlines()]
    out += [f"  safety: {s}" for s in p["safety"]]
    out += [f"  changed or dropped: {c}" for c in p["changes"]]
    return out
