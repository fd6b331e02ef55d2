"""The whole job: launch -> wait -> SSH -> setup -> upload -> train -> download -> terminate.

Whatever happens after the first resource is created (an error, Ctrl-C, SIGTERM), ``finally``
tears down everything the run created unless the user asked to ``keep`` it.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..aws import capacity, catalog, images, instances, network, placement, sweep
from ..aws.session import Aws
from ..errors import RemoteError, UsageError
from ..settings import Settings
from . import costs, ledger

PHASES = ("requesting", "waiting for running", "waiting for SSH", "setup", "upload", "running",
          "download", "terminating")


@dataclass
class TrainOptions:
    """What `ec2gpu train mnist` was asked to do."""

    instance_type: str = "g4dn.xlarge"  # one type, or several in order of preference: "g4dn.xlarge,g5.xlarge"
    spot: bool = False
    spot_fallback: str | None = None  # "on-demand": a last on-demand try when spot has no capacity
    model: str = "cnn"
    epochs: int | None = None  # None: the preset's
    seed: int = 0
    trainer_args: list[str] = field(default_factory=list)  # passed through to the trainer
    keep: bool = False
    out: Path | None = None  # default runs/<run-id>
    ssh_cidr: str | None = None
    ami: str | None = None
    name: str | None = None
    max_runtime_minutes: int = 120
    budget_usd: float | None = None  # refuse a run whose estimate is above this
    max_price: float | None = None  # spot: the highest USD/h to pay
    nodes: int = 1  # instances training together through torchrun (cluster.py)
    max_attempts: int | None = None  # instances to try before giving up; None: 3 with spot, else 1
    checkpoint_uri: str | None = None  # s3://bucket/prefix: a second home for checkpoints
    unreachable_s: float = 120.0  # SSH unreachable this long (s) counts as a lost instance
    command: str = "ec2gpu train mnist"  # as typed, for the ledger
    task: object | None = None  # engine.TaskJob: a user's task (`ec2gpu run`) instead of the built-in trainer
    expect_minutes: float | None = None  # a task's expected job time (--expect), when the ledger has none

    @property
    def attempts_allowed(self) -> int:
        return self.max_attempts or (3 if self.spot else 1)

    @property
    def instance_types(self) -> list[str]:
        return [t.strip() for t in self.instance_type.split(",") if t.strip()]


class Reporter:
    """What the pipeline tells the user; the CLI renders it with rich, tests record it."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self.notes: list[str] = []

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.monotonic()
        try:
            yield
            _fault_pause(name)
        finally:
            # a managed run repeats phases on each attempt: their times add up
            self.phases[name] = round(self.phases.get(name, 0.0) + time.monotonic() - t0, 2)

    def log(self, line: str) -> None:
        """One line of the job's log."""

    def note(self, text: str) -> None:
        self.notes.append(text)


PAUSE_ENV = "EC2GPU_TEST_PAUSE_IN_PHASE"


def _fault_pause(name: str) -> None:
    """Fault injection for the interrupt tests: with EC2GPU_TEST_PAUSE_IN_PHASE=<phase>, sleep 60 s
    at the end of that phase's work (still inside it), so a signal surely lands there."""
    if os.environ.get(PAUSE_ENV) == name:
        print(f"{PAUSE_ENV}: pausing in phase {name}", file=sys.stderr, flush=True)
        time.sleep(60)


def new_run_id() -> str:
    """A sortable, unique run id: YYYYmmdd-HHMMSS-xxxx (UTC)."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


@dataclass
class Provisioned:
    """What a run created, so teardown removes exactly that."""

    run_id: str
    key_name: str | None = None
    key_path: Path | None = None
    security_group_id: str | None = None
    placement_group: str | None = None
    ami: dict | None = None
    instances: list[dict] = field(default_factory=list)  # every instance of the run, in launch order
    ended: set[str] = field(default_factory=set)  # those already terminated (interrupted attempts)

    @property
    def instance_ids(self) -> list[str]:
        return [i["InstanceId"] for i in self.instances]


def provision(aws: Aws, settings: Settings, opts: TrainOptions, run_id: str, ui: Reporter,
              prov: Provisioned, avoid_zones=()) -> list[dict]:
    """Create the key pair and security group (once per run) and launch an instance, filling
    ``prov`` as it goes; wait until it runs and return its description(s).

    ``avoid_zones`` are tried last (where an earlier attempt was interrupted).
    """
    ec2 = aws.ec2
    name = opts.name or f"ec2gpu-{run_id}"
    if prov.key_name is None:
        cidr = network.ssh_cidr(opts.ssh_cidr)
        prov.ami = images.resolve_ami(aws.client("ssm"), ec2, opts.ami)
        ui.note(f"AMI {prov.ami['ImageId']} ({prov.ami['Name']}): {prov.ami['why']}, via {prov.ami['source']}; "
                f"SSH allowed from {cidr}")
    ami = prov.ami
    with ui.phase("requesting"):
        if prov.key_name is None:
            prov.key_name, prov.key_path = network.create_key_pair(ec2, run_id, settings.owner, settings.keys_dir)
            prov.security_group_id = network.create_security_group(ec2, run_id, settings.owner, cidr)
            if opts.nodes > 1:
                network.allow_within_group(ec2, prov.security_group_id)
                prov.placement_group, how = placement.create(ec2, run_id, settings.owner, name, opts.instance_types[0])
                ui.note(f"{opts.nodes} nodes: one security group that also admits its own members; {how}")
        spec = instances.LaunchSpec(
            run_id=run_id, owner=settings.owner, name=name, instance_type=opts.instance_types[0],
            image_id=ami["ImageId"], root_device_name=ami["RootDeviceName"], key_name=prov.key_name,
            security_group_id=prov.security_group_id, spot=opts.spot,
            root_volume_gib=settings.root_volume_gib, max_runtime_minutes=opts.max_runtime_minutes,
            max_price=opts.max_price if opts.spot else None, count=opts.nodes,
            # a cluster placement group lives in one zone: a replacement elsewhere goes without it
            placement_group=None if avoid_zones else prov.placement_group, cluster=name if opts.nodes > 1 else None)
        new, attempts = capacity.launch_with_fallback(
            aws.client("ec2", fail_fast=True), spec, opts.instance_types, opts.spot_fallback == "on-demand",
            log=ui.note, avoid_zones=tuple(avoid_zones))
        if opts.nodes > 1:
            new = instances.tag_nodes(ec2, new, name)
        prov.instances += new
        ids = [i["InstanceId"] for i in new]
        got = attempts[-1]
        ui.note(f"launched {', '.join(ids)} ({got.instance_type}, {got.market}, {got.zone or 'any zone'}"
                f"{f', after {len(attempts) - 1} refusal(s)' if len(attempts) > 1 else ''})")
    with ui.phase("waiting for running"):
        running = {i["InstanceId"]: i for i in instances.wait_running(ec2, ids)}
        prov.instances = [running.get(i["InstanceId"], i) for i in prov.instances]
    return [running[i] for i in ids]


def teardown(aws: Aws, settings: Settings, prov: Provisioned, ui: Reporter) -> dict:
    """Terminate the run's instances (waiting), delete its security group, key pair and placement
    group: each step tried on its own, best-effort. Never raises (an exception here would hide the
    error that ended the run): a step that fails is reported with the `ec2gpu cleanup` command and
    listed under "failed". The security group is left while its instances may still exist (EC2
    refuses to delete a group in use). A second Ctrl-C is answered with how to finish by hand.

    Returns {"instances", "security_groups", "key_pairs", "placement_groups": ids removed, "failed":
    ["what: why", ...]}.
    """
    def on_sigint(*_):
        ui.note("cleanup is under way; if you stop it, finish by hand with `ec2gpu cleanup`")
    previous = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    removed: dict = {"instances": [], "security_groups": [], "key_pairs": [], "placement_groups": [], "failed": []}

    def step(what: str, fn) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001 - every failure is reported and the next step runs
            removed["failed"].append(f"{what}: {type(exc).__name__}: {exc}"[:300])
            ui.note(f"could not remove the {what} ({type(exc).__name__}: {exc}); finish with `ec2gpu cleanup "
                    f"--region {aws.region}` (it finds everything by the ec2gpu:run tag {prov.run_id})")
            return False
    try:
        with ui.phase("terminating"):
            ec2 = aws.ec2
            live = [i for i in prov.instance_ids if i not in prov.ended]
            gone = not live or step("instances", lambda: instances.terminate(ec2, live))
            if live and gone:
                prov.ended.update(live)
            if gone:
                removed["instances"] = prov.instance_ids
            if prov.security_group_id:
                if not gone:
                    removed["failed"].append(f"security group: {prov.security_group_id} is still in use by the instances")
                elif step("security group", lambda: sweep.delete_security_group(ec2, prov.security_group_id)):
                    removed["security_groups"] = [prov.security_group_id]
            if prov.key_name and step("key pair", lambda: network.delete_key_pair(ec2, prov.key_name, settings.keys_dir)):
                removed["key_pairs"] = [prov.key_name]
            if prov.placement_group and gone and step("placement group", lambda: placement.delete(ec2, prov.placement_group)):
                removed["placement_groups"] = [prov.placement_group]
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    done = "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in removed.items() if v and k != "failed")
    if done:
        ui.note("removed: " + done)
    return removed


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def mnist_args(opts: TrainOptions, sandbox: bool = False) -> list[str]:
    """The built-in trainer's flags for `ec2gpu train mnist` (pure): "$@" of tasks/builtin/mnist.yaml.

    In the sandbox, the nodes of a cluster share this machine's cores: each takes its share, or
    their CPU threads fight (2 nodes x 2 threads on 2 cores ran 15x slower than 1 x 2 here).
    """
    args = ["--model", opts.model, "--seed", str(opts.seed)]
    if opts.epochs:
        args += ["--epochs", str(opts.epochs)]
    if sandbox and opts.nodes > 1:
        args += ["--threads", str(max(1, (os.cpu_count() or 1) // opts.nodes))]
    return args + list(opts.trainer_args)


def builtin_task(opts: TrainOptions, sandbox: bool = False):
    """``opts.task``, or the built-in MNIST task with ``opts``' trainer flags (an engine.TaskJob)."""
    from . import engine
    return opts.task if opts.task is not None else engine.builtin_job("mnist", mnist_args(opts, sandbox))


def check_estimate(aws: Aws, settings: Settings, opts: TrainOptions, backend: str, ui: Reporter) -> costs.Estimate:
    """Estimate the run, tell the user, and refuse it (UsageError) when above ``opts.budget_usd``
    or when ``opts.max_price`` is below the spot price in every zone. Creates nothing."""
    if opts.max_price is not None and not opts.spot:
        raise UsageError("--max-price applies to spot instances only", "add --spot, or drop --max-price")
    if opts.task is not None and opts.task.builtin != "mnist":
        from . import engine
        minutes, source = engine.estimate_minutes(settings.home, opts.task, opts.instance_types[0], opts.expect_minutes,
                                                  backend)
        est = costs.estimate_job(aws, settings.home, opts.instance_types[0], opts.spot, minutes * 60, source, backend,
                                 opts.max_price)
    else:
        est = costs.estimate_run(aws, settings.home, opts.instance_types[0], opts.spot, opts.model, opts.epochs,
                                 backend, opts.max_price)
    if opts.nodes > 1 and est.cost_usd is not None:  # N instances for the same time (docs/cost-model.md)
        from dataclasses import replace
        est = replace(est, cost_usd=round(est.cost_usd * opts.nodes, 6))
    cost = "unknown (no price)" if est.cost_usd is None else f"${est.cost_usd:.4f}"
    ui.note(f"estimate: {cost} for ~{est.billed_seconds:.0f} s billed at "
            f"{'?' if est.usd_per_hour is None else f'{est.usd_per_hour:.4f}'} USD/h"
            f"{f' x {opts.nodes} nodes' if opts.nodes > 1 else ''} ({est.price_source}); "
            f"boot {est.boot_seconds:.0f} s, setup {est.setup_seconds:.0f} s, "
            f"{'training' if opts.task is None or opts.task.builtin == 'mnist' else 'job'} {est.train_seconds:.0f} s, "
            f"teardown {est.teardown_seconds:.0f} s [{est.time_source}]")
    if opts.budget_usd is not None:
        if est.cost_usd is None:
            raise UsageError("--budget needs a price, and none is known for this region",
                             f"run `ec2gpu prices --refresh --region {aws.region}` first")
        if est.cost_usd > opts.budget_usd:
            raise UsageError(f"the estimate ${est.cost_usd:.4f} is above --budget ${opts.budget_usd:.4f}",
                             "raise --budget, use --spot, a cheaper --instance-type or fewer --epochs")
    return est


def _status(exc: BaseException | None, spot: bool = False) -> str:
    if exc is None:
        return "completed"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    from .recovery import AttemptsExhausted
    if isinstance(exc, AttemptsExhausted):
        return "spot-interrupted" if spot else "failed"
    return "failed"


def _ledger(settings: Settings, row: dict, ui: Reporter) -> None:
    """Write ``row`` to the ledger; a ledger problem is reported, never allowed to stop a run."""
    import sqlite3
    try:
        ledger.record(settings.home, row)
    except (sqlite3.Error, OSError) as exc:
        ui.note(f"warning: could not write the ledger {ledger.path_in(settings.home)}: {exc}")


def train(aws: Aws, settings: Settings, opts: TrainOptions, ui: Reporter, resolver=None) -> dict:
    """Run ``opts`` on a new instance end to end; return the run record (also saved as run.json).

    Shows the estimate first and refuses (UsageError, nothing created) a run above the budget. The
    run is in the ledger from its start; at the end it gets its status, its attempts (one per
    instance: a lost instance is replaced and the trainer resumes from its checkpoint, up to
    ``opts.attempts_allowed``), and billed seconds and cost from each instance's own launch and
    termination times. Raises UsageError before creating anything for a bad instance type or
    --checkpoint-uri; AwsError, CapacityError, RemoteError, WaitTimeout as they happen, and
    recovery.AttemptsExhausted (all after teardown); KeyboardInterrupt after teardown.
    """
    if any(not t.strip() for t in opts.instance_type.split(",")):
        raise UsageError(f"--instance-type {opts.instance_type!r} has an empty entry",
                         "name each type, e.g. --instance-type g4dn.xlarge,g5.xlarge")
    types = [catalog.lookup(t).name for t in opts.instance_types]
    if opts.spot_fallback not in (None, "on-demand"):
        raise UsageError(f"--spot-fallback {opts.spot_fallback!r} is not known", "the only fallback is on-demand")
    from .recovery import parse_checkpoint_uri
    parse_checkpoint_uri(opts.checkpoint_uri)
    if opts.ssh_cidr:  # before any AWS call: a bad CIDR creates nothing and leaves no ledger row
        network.check_cidr(opts.ssh_cidr, ui.note)
    opts.instance_type = ",".join(types)
    itype = catalog.lookup(types[0])
    opts.task = builtin_task(opts, sandbox=resolver is not None)
    aws.check_credentials()
    backend = costs.backend_of(resolver)
    est = check_estimate(aws, settings, opts, backend, ui)
    checked = capacity.check_quota(aws.client("service-quotas"), aws.ec2, itype.name, opts.spot, count=opts.nodes,
                                   log=ui.note)
    if checked:
        ui.note(f"vCPU quota {checked['quota']}: {checked['in_use']} in use + {checked['needed']} needed "
                f"<= {checked['value']:g}")
    run_id = new_run_id()
    out = Path(opts.out or Path("runs") / run_id).resolve()
    prov = Provisioned(run_id)
    mnist = opts.task.builtin == "mnist"
    record = {"run_id": run_id, "command": opts.command, "backend": backend, "instance_type": itype.name,
              "gpu": itype.gpu, "market": "spot" if opts.spot else "on-demand", "task": opts.task.name,
              "model": opts.model if mnist else None, "epochs": opts.epochs if mnist else None,
              "region": aws.region, "artifacts": str(out),
              "status": "running", "started_at": datetime.now(timezone.utc).isoformat(),
              "estimated_cost_usd": est.cost_usd, "estimate": est.as_dict()}
    _ledger(settings, record, ui)
    attempts: list[dict] = []
    record["attempts"] = attempts
    error = None
    try:
        return _with_summary(record, _run_attempts(aws, settings, opts, run_id, ui, prov, out, resolver, record))
    except BaseException as exc:
        error = exc
        raise
    finally:
        from .recovery import attempt_row
        known, n = {a["instance_id"] for a in attempts}, max((a["attempt"] for a in attempts), default=0) + 1
        for inst in prov.instances:  # launched, but stopped before its attempt began (Ctrl-C while requesting)
            if inst["InstanceId"] not in known:
                attempts.append(attempt_row(n, inst))
        for att in attempts:
            if att["ended"] == "running":
                att["ended"] = "completed" if error is None else \
                    "stopped by the user" if isinstance(error, KeyboardInterrupt) else f"failed: {error}"[:200]
        if opts.keep and prov.instances:
            ui.note(f"--keep: {', '.join(prov.instance_ids)} keeps running (and billing) until "
                    f"`ec2gpu down {opts.name or 'ec2gpu-' + run_id}` or {opts.max_runtime_minutes} min pass")
        elif prov.key_name or prov.security_group_id or prov.instances:
            record["teardown_failed"] = teardown(aws, settings, prov, ui)["failed"]
            try:
                _bill(aws, settings, [a for a in attempts if "billed_seconds" not in a], prov, ui)
                record.update(_totals(attempts))
            except Exception as exc:  # noqa: BLE001 - a bill we cannot compute must not hide the run's end
                ui.note(f"warning: could not compute the bill ({type(exc).__name__}: {exc})")
        record.update(instance_ids=prov.instance_ids, status=_status(error, opts.spot),
                      phases=dict(ui.phases),
                      ended_at=datetime.now(timezone.utc).isoformat())
        if isinstance(error, RemoteError) and error.exit_status is not None:
            record["exit_status"] = error.exit_status
        _ledger(settings, record, ui)
        if out.exists() or record["status"] == "completed":
            out.mkdir(parents=True, exist_ok=True)
            (out / "run.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        if error is None and record.get("teardown_failed"):
            from ..errors import AwsError
            raise AwsError(f"the run {record['status']}, but teardown left: {'; '.join(record['teardown_failed'])}",
                           f"remove it now: ec2gpu cleanup --region {aws.region} (everything carries ec2gpu:run "
                           f"{run_id}); the instances also terminate themselves after --max-runtime")


def _with_summary(record: dict, summary: dict) -> dict:
    """``record`` with the job's summary.json ({} when it wrote none) and the ledger columns the
    built-in trainer's summary fills (test accuracy, epochs, train seconds, samples/s)."""
    record.update(summary=summary or None, exit_status=0)
    if "test_acc" in summary:
        record.update(test_acc=summary["test_acc"], epochs=summary.get("epochs"),
                      train_seconds=summary.get("train_seconds"), samples_per_second=summary.get("samples_per_second"))
    return record


def _run_attempts(aws: Aws, settings: Settings, opts: TrainOptions, run_id: str, ui: Reporter, prov: Provisioned,
                  out: Path, resolver, record: dict) -> dict:
    """Attempt after attempt (recovery.py) of ``opts.task`` until its job finishes; return its summary.

    Raises recovery.AttemptsExhausted when the last attempt allowed is interrupted too.
    """
    from . import engine, recovery

    attempts = record["attempts"]
    checkpoints = recovery.DirCheckpoints(remote="", local=out / "checkpoints", log=ui.note,
                                          **recovery.s3_home(aws, opts.checkpoint_uri, run_id))
    avoid: list[str] = []
    for n in range(1, opts.attempts_allowed + 1):
        if n > 1:
            ui.note(f"attempt {n} of {opts.attempts_allowed}: launching a replacement"
                    + (f" (zones {', '.join(avoid)} last)" if avoid else ""))
        nodes = provision(aws, settings, opts, run_id, ui, prov, avoid_zones=avoid)
        instance = nodes[0]
        mine = [recovery.attempt_row(n, i, k if len(nodes) > 1 else None) for k, i in enumerate(nodes)]
        attempts += mine
        got = catalog.CATALOG.get(instance["InstanceType"])
        record.update(instance_type=instance["InstanceType"], gpu=got.gpu if got else None,
                      market=instances.market(instance), instance_id=instance["InstanceId"],
                      instance_ids=prov.instance_ids, zone=attempts[-1]["zone"],
                      launched_at=prov.instances[0]["LaunchTime"].isoformat())
        _ledger(settings, record, ui)
        try:
            return engine.run_attempt(aws, settings, opts, run_id, ui, prov, nodes, out, resolver, n, checkpoints)
        except recovery.Interrupted as why:
            ui.note(f"attempt {n} interrupted on {', '.join(a['instance_id'] for a in mine)} "
                    f"({mine[0]['zone']}): {why.reason}")
            if mine[0]["zone"]:
                avoid.append(mine[0]["zone"])
            _end_instances(aws, prov, [a["instance_id"] for a in mine], ui)
            for att in mine:
                att["ended"] = why.reason
            _bill(aws, settings, mine, prov, ui)
            _ledger(settings, record, ui)
    raise recovery.exhausted(attempts, checkpoints.local, opts.spot, opts.attempts_allowed)


def _end_instances(aws: Aws, prov: Provisioned, instance_ids: list[str], ui: Reporter) -> None:
    """Make sure an interrupted attempt's instances are terminated (EC2 may have done it already)."""
    with ui.phase("terminating"):
        states = {i["InstanceId"]: i["State"]["Name"] for i in instances.describe_instances(aws.ec2, instance_ids)}
        live = [i for i in instance_ids if states.get(i) not in ("shutting-down", "terminated")]
        if live:  # those EC2 is terminating already keep EC2's own reason and time
            instances.terminate(aws.ec2, live, wait=False)
        instances.wait_terminated(aws.ec2, instance_ids)
        prov.ended.update(instance_ids)


def _bill(aws: Aws, settings: Settings, attempts: list[dict], prov: Provisioned, ui: Reporter) -> None:
    """Add billed seconds and cost to each attempt row, from its (terminated) instance's own launch
    and termination times (one DescribeInstances for all of them)."""
    if not attempts:
        return
    ended = datetime.now(timezone.utc)
    ids = [a["instance_id"] for a in attempts]
    try:
        described = {i["InstanceId"]: i for i in instances.describe_instances(aws.ec2, ids)}
    except Exception as exc:  # the bill is still computable from what launch returned
        ui.note(f"could not read the termination times of {', '.join(ids)} ({exc}); using this machine's clock")
        described = {i["InstanceId"]: i for i in prov.instances}
    for att in attempts:
        start = datetime.fromisoformat(att["billing_started_at"]) if att.get("billing_started_at") else None
        att.update(costs.actual_cost(aws, settings.home, described[att["instance_id"]], ended, start))


def _totals(attempts: list[dict]) -> dict:
    """The run's bill from its attempts' bills (pure): sums, first launch, last termination."""
    billed = [a for a in attempts if "billed_seconds" in a]
    if not billed:
        return {}
    seconds = sum(a["billed_seconds"] for a in billed)
    usd = None if any(a.get("cost_usd") is None for a in billed) else round(sum(a["cost_usd"] for a in billed), 6)
    one = len(billed) == 1
    return {"billed_seconds": round(seconds, 1), "cost_usd": usd,
            "usd_per_hour": billed[0]["usd_per_hour"] if one else (None if usd is None else round(usd * 3600 / seconds, 6)),
            "price_source": billed[0]["price_source"] if one else f"sum of {len(billed)} instances' bills",
            "launched_at": billed[0]["launched_at"], "billing_started_at": billed[0].get("billing_started_at"),
            "terminated_at": billed[-1]["terminated_at"]}


def _standing(aws: Aws, settings: Settings, found: list[dict], out, resolver, command: str):
    """A run on standing instances ``found``: (their fresh descriptions in node order, run id,
    absolute artifacts dir, Provisioned with their key, the run record's common columns).
    Raises UsageError when their private key is not on this machine."""
    from ..aws import tags as T

    key = network.require_private_key(settings.keys_dir, found[0]["KeyName"])
    nodes = instances.wait_running(aws.ec2, [i["InstanceId"] for i in found])  # fresh descriptions
    nodes.sort(key=lambda i: int(T.as_dict(i.get("Tags")).get(T.NODE, "0") or 0))
    run_id = new_run_id()
    out = Path(out or Path("runs") / run_id).resolve()
    prov = Provisioned(T.as_dict(nodes[0].get("Tags")).get(T.RUN, run_id), key_name=nodes[0]["KeyName"], key_path=key)
    record = {"run_id": run_id, "command": command, "backend": costs.backend_of(resolver),
              "instance_type": nodes[0]["InstanceType"], "market": instances.market(nodes[0]), "region": aws.region,
              "artifacts": str(out), "status": "running", "started_at": datetime.now(timezone.utc).isoformat(),
              "instance_ids": [i["InstanceId"] for i in nodes], "instance_id": nodes[0]["InstanceId"],
              "zone": nodes[0].get("Placement", {}).get("AvailabilityZone")}
    return nodes, run_id, out, prov, record


def train_on_cluster(aws: Aws, settings: Settings, opts: TrainOptions, ui: Reporter, cluster_name: str,
                     resolver=None) -> dict:
    """Train MNIST on the nodes a standing cluster has now (``ec2gpu launch --nodes N --name NAME``)
    and leave the cluster running: ``exec_task`` with the built-in task. Raises UsageError for an
    unknown cluster or a missing key file; RemoteError/recovery.Interrupted as the attempt raises them."""
    from ..aws import clusters

    nodes = clusters.members(aws.ec2, cluster_name)
    if not nodes:
        raise UsageError(f"no running cluster named {cluster_name!r}",
                         "start one with `ec2gpu launch --nodes N --name NAME` (see `ec2gpu ls`)")
    opts.nodes = len(nodes)
    job = builtin_task(opts, sandbox=resolver is not None)
    return exec_task(aws, settings, job, ui, cluster_name, resolver, opts.out, opts.command,
                     extra={"model": opts.model, "epochs": opts.epochs})


def exec_task(aws, settings, job, ui, target: str, resolver, out: Path | None, command: str,
              extra: dict | None = None) -> dict:
    """Run ``job`` once on the standing instance or cluster ``target`` (its Name, cluster name or
    instance id) and leave it running; return the run record (in the ledger, without a cost of its
    own: the instances bill as they stand). Raises UsageError for an unknown target or a missing
    key file; RemoteError, recovery.Interrupted as the attempt raises them. ``extra``: more columns
    for the record (a built-in task's model and epochs)."""
    from ..aws import clusters, sweep
    from ..aws import tags as T
    from . import engine, recovery

    found = clusters.members(aws.ec2, target) or [
        i for i in sweep.find_instances(aws.ec2, states=["pending", "running"])
        if target in (i["InstanceId"], T.as_dict(i.get("Tags")).get(T.NAME))]
    if not found:
        raise UsageError(f"no running instance or cluster named {target!r}",
                         "start one with `ec2gpu launch --name NAME` (see `ec2gpu ls`)")
    nodes, run_id, out, prov, record = _standing(aws, settings, found, out, resolver, command)
    opts = TrainOptions(task=job, nodes=len(nodes), command=command)
    record.update(task=job.name, **(extra or {}))
    itype = catalog.CATALOG.get(nodes[0]["InstanceType"])
    record["gpu"] = itype.gpu if itype else None
    ui.note(f"{target}: {len(nodes)} node(s); they keep running afterwards")
    _ledger(settings, record, ui)
    error = None
    try:
        checkpoints = recovery.DirCheckpoints(remote="", local=out / "checkpoints", log=ui.note)
        return _with_summary(record, engine.run_attempt(aws, settings, opts, run_id, ui, prov, nodes, out, resolver, 1,
                                                        checkpoints))
    except BaseException as exc:
        error = exc
        raise
    finally:
        record.update(status=_status(error), phases=dict(ui.phases),
                      ended_at=datetime.now(timezone.utc).isoformat())
        if isinstance(error, RemoteError) and error.exit_status is not None:
            record["exit_status"] = error.exit_status
        _ledger(settings, record, ui)
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


def train_local(opts: TrainOptions, ui: Reporter, data_dir: str | None = None, settings: Settings | None = None) -> dict:
    """Run the built-in MNIST task on this machine (needs torch), under the same agent and with the
    same job contract as on an instance (engine.run_local); return its run record.

    With ``settings``, the run goes into the ledger (backend "local", no cost).

    Raises UsageError when torch is missing, RemoteError when the trainer fails.
    """
    import importlib.util

    from . import engine

    if importlib.util.find_spec("torch") is None:
        raise UsageError("--local needs PyTorch on this machine", "pip install 'ec2gpu[train]' (or make demo)")
    opts.trainer_args = list(opts.trainer_args) + (["--data-dir", data_dir] if data_dir else [])
    job = builtin_task(opts)
    run_id = new_run_id()
    started = datetime.now(timezone.utc).isoformat()
    out = Path(opts.out or Path("runs") / run_id).resolve()
    with ui.phase("running"):
        summary = engine.run_local(job, run_id, out, ui)
    record = {"run_id": run_id, "command": opts.command, "backend": "local", "status": "completed", "task": job.name,
              "instance_type": "local", "market": "local", "model": opts.model, "artifacts": str(out),
              "phases": dict(ui.phases), "started_at": started, "ended_at": datetime.now(timezone.utc).isoformat(),
              "billed_seconds": 0.0, "cost_usd": 0.0}
    _with_summary(record, summary)
    (out / "run.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    if settings is not None:
        _ledger(settings, record, ui)
    return record


def as_json(record: dict) -> str:
    return json.dumps(record, indent=2, default=str)

