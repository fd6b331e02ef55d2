"""`ec2gpu run --dry-run` and `ec2gpu train mnist --dry-run`: a run's plan (runs/plan/runplan.RunPlan, the
one the real run would run), as JSON and as lines for a terminal.

Nothing is created and no AWS API is called (so no credentials are needed and a sandbox is not
started): instance types come from the task (tasks/resolve.py) and the catalog, prices from the
refreshed price cache or the shipped table (aws/catalog.py), the limit and the estimate from the
ledger (runs/plan/limits.py, runs/plan/costs.py), the job's environment from runs/job.node_env with the
values only a launch knows shown as <placeholders>. SkyPilot has the same: `sky launch --dryrun`.

The JSON form (``plan`` below; ``--dry-run --json``) is stable: keys are only ever added. Its keys
are listed in docs/tasks.md ("Seeing the plan first").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from ... import words
from ...aws import catalog, network
from ...tasks import arrays, mounts, resolve, tools
from . import costs
from .limits import Limit
from .runplan import RunPlan
from ..job import node_env, workdir_of  # the job's contract, as a launch gives it
from ..job_summary import mask_text

if TYPE_CHECKING:
    from ...tasks.mounts import Mount
    from ..job import TaskJob
    from .costs import Estimate

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


def element_env(p: RunPlan, run_dir: str, first: dict[str, Any]) -> dict[str, str]:
    """Element 0's environment in the plan of an array or a sweep (pure): each element is a one-node
    job on the instance Ray chose, holding the GPUs it was given (pool/driver.run_element, which
    sets these on the node's own environment): one node, its own address, its element's index,
    size, output and checkpoint directories and parameters."""
    gpus = p.gpus_per_job or first["gpu_count"]
    here = "<its instance's private IP>"
    env = node_env(p.job, "<run id>", run_dir, 0, [here], gpus, False, "<the python with torch>",
                   instance_type=first["instance_type"])
    element = p.elements[0]
    edir = f"{run_dir}/elements/{element.index}"
    return {**env, **element.env(), "EC2GPU_OUTPUT_DIR": f"{edir}/out", "EC2GPU_CHECKPOINT_DIR": f"{edir}/checkpoints",
            "EC2GPU_POOL_HEAD_IP": placeholders(1)[0]}


def plan(p: RunPlan) -> dict[str, Any]:
    """The run plan ``p`` (runs/plan/runplan.plan, already checked: what the run would refuse was
    refused while it was made) as a JSON-ready dict: its instance types in the order they are
    tried, with their GPUs and on-demand prices; its region, limit, idle rule, image and who may
    reach SSH, each with where it comes from (``sources``); the estimate the run is judged by
    (``estimate.run``, at on-demand prices) and the job's time and cost alone; the workdir, the
    file_mounts and the S3 access; node 0's environment, setup and run, masked; an array's or a
    sweep's elements over how many instances (``nodes``, each running ``slots`` at once). Prices in
    USD/h, sizes in bytes and GiB, times in minutes.

    Raises UsageError as catalog.lookup does for a type ec2gpu cannot run. Calls no AWS API."""
    job, settings, nodes, est = p.job, p.settings, p.nodes, p.estimate
    res = job.task.resources
    rows = _type_rows(p)
    first = rows[0]
    run_dir = "~/ec2gpu/runs/<run id>"
    env = node_env(job, "<run id>", run_dir, 0, placeholders(nodes), first["gpu_count"], False,
                   "<the python with torch>", instance_type=first["instance_type"]) if not p.elements else \
        element_env(p, run_dir, first)
    m = job.manifest
    return {
        "kind": "plan", "version": PLAN_VERSION, "task": job.name, "source": _source(job),
        "backend": p.backend, "region": settings.region, "region_source": p.sources.get("region"),
        "zones": "any availability zone of the region with capacity, chosen at launch (the next one on "
                 "InsufficientInstanceCapacity)",
        "mode": p.mode, "nodes": nodes, "market": "spot" if p.spot else "on-demand",
        "spot_fallback": p.flags.spot_fallback, "max_price_usd_per_hour": p.max_price if p.spot else None,
        "instance_types": rows, "skipped": _skipped(res),
        "disk_gib": res.disk_gib or settings.root_volume_gib,
        "ami": p.ami, "ami_source": p.sources.get("ami") if p.ami else None,
        "image": (p.ami if p.ami else "the newest image baked for this setup (ec2gpu image ls), else the PyTorch Deep "
                  "Learning AMI, resolved at launch" if p.flags.baked else "the PyTorch Deep Learning AMI, resolved at "
                  "launch"),
        "ssh": {"cidr": _cidr(p), "source": p.sources.get("ssh_cidr"), "warning": p.ssh_warning},
        "max_runtime": {"minutes": p.limit.minutes, "source": p.limit.source},
        "idle_rule_minutes": None if p.idle_seconds is None else p.idle_seconds // 60,
        "idle_rule": None if p.idle_seconds is None else {
            "minutes": p.idle_seconds // 60, "action": "terminate", "source": p.sources.get("idle_rule"),
            "meaning": "an instance with no job, SSH connection or busy GPU that long terminates itself"},
        "estimate": _estimate(p, rows),
        "budget": None if p.budget_usd is None or est is None else _budget(p.budget_usd, est, p.spot),
        "workdir": {"local": str(m.root) if m else None, "remote": workdir_of(run_dir, job),
                    "git": job.loaded.git,
                    "files": len(m.files) if m else 0, "bytes": m.bytes if m else 0,
                    "withheld": list(m.withheld) if m else []},
        "env": {k: mask_text(v, job.secret_values) for k, v in sorted(env.items())},
        # the setup as the task wrote it; "tools" says what runs before it (tasks/tools.py)
        "setup": mask_text(tools.own_setup(job.task.setup, job.loaded.tools) or "", job.secret_values),
        "run": mask_text(job.task.run, job.secret_values),
        "tools": [{"tool": t, "how": tools.WHERE[t]} for t in job.loaded.tools],
        "outputs": list(job.task.outputs),
        "ports": [{"port": port, "node": 0,
                   "local": f"127.0.0.1:{port}" if port in job.same_ports else
                   "127.0.0.1:(a free port, said when the job starts)",
                   "how": "forwarded over SSH while the job runs; not opened in the security group"}
                  for port in job.task.ports],
        "file_mounts": [_mount_row(mnt, job) for mnt in job.mounts],
        "s3_access": mounts.access(job.mounts),
        "labels": dict(job.task.resources.labels),
        "safety": _safety(p) + ([ROLE_SAFETY] if any(mnt.kind == "s3" for mnt in job.mounts) else []),
        "changes": list(p.warnings),
        "array": None if not p.elements else {
            "elements": len(p.elements), "size": p.elements[0].size, "workers": nodes,
            "described": arrays.describe(list(p.elements)),
            "first": [e.env() for e in p.elements[:3]],
            "scheduler": "Ray on the pool's instances (ec2gpu/pool); the pool shrinks as the queue drains"},
        "trainer": None if p.trainer is None else {
            "model": p.trainer.model, "epochs": p.trainer.epochs, "seed": p.trainer.seed,
            "trainer_args": mask_text(" ".join(p.trainer.trainer_args), job.secret_values)},
        "sources": dict(p.sources),
    }


def _estimate(p: RunPlan, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The plan's estimate: the job's minutes alone and where they come from (None: the first run),
    what they cost on the first type, the most the run can cost at its max runtime on the dearest
    type (all nodes, on-demand prices: spot's ceiling), and ``run``: the estimate the run is judged
    by (costs.estimate_for: boot, setup and teardown included), as a dict (pure)."""
    est = p.estimate
    minutes = None if est is None or est.upper_bound else est.train_seconds / 60
    source = "" if est is None else est.time_source.removeprefix("unknown: ") if est.upper_bound else est.time_source
    worst = max((r["on_demand_usd_per_hour"] for r in rows if r["on_demand_usd_per_hour"] is not None), default=None)
    price = rows[0]["on_demand_usd_per_hour"]
    run = None if est is None else est.as_dict()
    # the figure the run itself prints and judges its budget by: boot, setup, teardown and EC2's 60 s
    # minimum billed too (issue 48 item 3: the job's minutes alone said $0.0008 where the run said $0.0088)
    expected = (run["cost_usd"] if run and not run["upper_bound"] and run["cost_usd"] is not None
                else None if minutes is None or price is None else round(costs.cost_usd(minutes * 60.0, price) * p.nodes, 4))
    return {"job_minutes": None if minutes is None else round(minutes, 2), "source": source,
            "expected_usd": expected,
            "at_most_usd": None if p.limit.minutes is None or worst is None else
            round(costs.cost_usd(p.limit.minutes * 60.0, worst) * p.nodes, 2),
            "note": "on-demand list prices; spot pays the zone's spot price, at most the on-demand one",
            "run": run}


def _type_rows(p: RunPlan) -> list[dict[str, Any]]:
    """One row per instance type of ``p``, in the order they are tried: its GPUs, size and on-demand
    price, and the request that chose it (pure apart from the price cache)."""
    res = p.job.task.resources
    try:
        choices = {c.instance_type: c for c in resolve.plan(res).choices if c.instance_type}
    except Exception:  # noqa: BLE001 - a flag chose the types: the task's own request does not apply
        choices = {}
    rows: list[dict[str, Any]] = []
    for name in p.instance_types:
        t = catalog.lookup(name)
        price = catalog.on_demand_price(t.name, p.settings.region, p.settings.home)
        c = choices.get(t.name)
        used = (c.gpus_asked if c is not None and c.larger else None) or t.gpu_count
        rows.append({"instance_type": t.name, "asked": c.asked if c is not None else "the configured default",
                     "gpu": t.gpu, "gpu_count": t.gpu_count, "gpus_used": used, "gpu_memory_gib": t.gpu_memory_gib,
                     "vcpus": t.vcpus, "memory_gib": t.memory_gib, "on_demand_usd_per_hour": price.usd_per_hour,
                     "price_source": price.source, "larger": bool(c is not None and c.larger)})
    return rows


def _skipped(res: Any) -> list[str]:
    """The task's candidates EC2 cannot run, with why ([] where a flag chose the types)."""
    try:
        return list(resolve.plan(res).skipped)
    except Exception:  # noqa: BLE001 - a flag chose the types: the task's own request does not apply
        return []


def _source(job: TaskJob) -> str:
    """Where the task comes from, in words: its file, the built-in task's, or "a command"."""
    if job.loaded.path:
        return str(job.loaded.path)
    return f"the built-in task {job.builtin} (tasks/builtin/{job.builtin}.yaml)" if job.builtin else "a command"


def _cidr(p: RunPlan) -> str:
    """Who may reach port 22: --ssh-cidr's network (normalized), else the /32 looked up at launch."""
    return network.check_cidr(p.flags.ssh_cidr) if p.flags.ssh_cidr else "<your public IP>/32"


def _safety(p: RunPlan) -> list[str]:
    """The nets every run has (SAFETY), its first line saying who may reach port 22 as the plan has
    it: the /32 looked up at launch, or --ssh-cidr's network, with its warning when wider than a /24."""
    if not p.flags.ssh_cidr:
        return list(SAFETY)
    ssh = f"SSH (port 22) open to {_cidr(p)} alone (--ssh-cidr); no other port"
    return [ssh + (f" ({p.ssh_warning})" if p.ssh_warning else ""), *SAFETY[1:]]


def _budget(usd: float, est: Estimate, spot: bool) -> dict[str, Any]:
    """{usd, refused, why}: the run's own judgement of its budget (costs.refusal): its estimate, or
    for a job whose time is unknown the most it can cost at its max runtime, against ``usd`` (pure).
    A plan is only made of a run its budget does not refuse at on-demand prices; a spot run's
    estimate here is at the on-demand price, its ceiling, and the run judges the zone's spot price."""
    what = "the most it can cost at its max runtime" if est.upper_bound else "the estimate"
    judged = est.cost_usd
    refused = judged is None or judged > usd
    why = (f"{what} is unbounded or unknown" if judged is None else
           f"{what}, ${judged:.2f}, is {'above' if refused else 'within'} the budget ${usd:.2f}")
    why += (" (at the on-demand price, spot's ceiling: the run judges the zone's spot price)" if spot else
            " (on-demand list prices; boot, setup and teardown included)")
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
        out.append(f"  array: {a['described']} over at most {words.count(a['workers'], 'instance')}, scheduled by Ray; "
                   f"element 0's environment: {' '.join(f'{k}={v}' for k, v in a['first'][0].items())}")
    out.append(f"  {words.count(p['nodes'], 'node')}, {p['market']}"
               + (f" (then {p['spot_fallback']})" if p["spot_fallback"] else "") + f"; zones: {p['zones']}")
    if p.get("mode") not in (None, "foreground", "array"):
        out.append(f"  {p['mode']}: AWS runs it with nobody watching (an Auto Scaling group, or the pool's head), "
                   "until its max runtime at the latest")
    if p.get("trainer"):
        t = p["trainer"]
        out.append(f"  trainer: --model {t['model']} --seed {t['seed']}"
                   + (f" --epochs {t['epochs']}" if t["epochs"] else " (the preset's epochs)")
                   + (f" {t['trainer_args']}" if t["trainer_args"] else ""))
    out.append(f"  region {p['region']} ({p.get('region_source') or 'the configured region'}); disk {p['disk_gib']} "
               f"GiB gp3 encrypted; image: {p['image']}" + (f" ({p['ami_source']})" if p.get("ami_source") else ""))
    lim = p["max_runtime"]
    est = p["estimate"]
    limit = Limit(lim["minutes"], lim["source"]).words()
    idle = p.get("idle_rule")
    out.append(f"  max runtime: {limit} ({lim['source']})"
               + (f"; idle instances end after {idle['minutes']} min ({idle['source']})" if idle else ""))
    if p.get("budget"):
        out.append(f"  budget: {'the run would be REFUSED: ' if p['budget']['refused'] else ''}{p['budget']['why']}")
    out += [f"  port {q['port']} of node 0 -> {q['local']} here ({q['how']})" for q in p.get("ports", [])]
    run = est.get("run")
    if run and not run["upper_bound"] and run["cost_usd"] is not None:  # what the run will say, and judge --budget by
        cost = (f"~${run['cost_usd']:.4f} for ~{run['billed_seconds']:.0f} s billed x {words.count(p['nodes'], 'node')} (boot "
                f"{run['boot_seconds']:.0f} s, setup {run['setup_seconds']:.0f} s, job {run['train_seconds']:.0f} s "
                f"({est['source']}), teardown {run['teardown_seconds']:.0f} s; 60 s at least)")
    elif est["expected_usd"] is not None:
        cost = f"~${est['expected_usd']:.4f} for {est['job_minutes']} min of job ({est['source']})"
    else:
        cost = f"job time unknown ({est['source']})"
    out.append(f"  cost: {cost}; "
               + ("no upper bound (no max runtime)" if est["at_most_usd"] is None
                  else f"at most ${est['at_most_usd']:.2f} at the max runtime"))
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
    access = mounts.access_words(p.get("s3_access") or {})
    if access:
        out.append(f"  {access}")
    # a value is shown on one line: SKYPILOT_NODE_IPS holds one address per line
    out.append(f"  environment of {'element 0' if p.get('array') else 'node 0'}: "
               + ", ".join(f"{k}={v}".replace("\n", "\\n") for k, v in p["env"].items()))
    if p.get("tools"):
        out.append(f"  tools: {', '.join(t['tool'] for t in p['tools'])} installed by the setup on first use, "
                   f"before its own lines ({'; '.join(t['how'] for t in p['tools'])}): the Deep Learning AMI has "
                   "neither, SkyPilot's images both")
    if p["setup"]:
        out.append("  setup (bash, once per instance, in the workdir):")
        out += [f"    {line}" for line in p["setup"].splitlines()]
    out.append("  run (bash, on every node, in the workdir):")
    out += [f"    {line}" for line in p["run"].splitlines()]
    out += [f"  safety: {s}" for s in p["safety"]]
    out += [f"  changed or dropped: {c}" for c in p["changes"]]
    return out
