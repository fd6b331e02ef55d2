"""Runs on standing instances (`ec2gpu launch`): `ec2gpu exec NAME TASK` and `train mnist --cluster
NAME` run one attempt there through the engine and leave the instances running; the run is in the
ledger without a cost of its own: the instances' cost is in the row `launch` opened for them
(runs/recover/reconcile.py: settled once they have all ended; `ec2gpu ls` shows it so far).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, cast

import sys
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from ... import words
from ...aws import catalog, clusters, instances, network, sweep, tags
from ...aws.session import Aws
from ...backend import AWS, Backend
from ...errors import Ec2GpuError, RemoteError, UsageError
from ...remote import ssh, ssh_config
from ...sandbox import control
from ...settings import Settings
from ..settle import record as run_record
from ..options import LaunchOptions, RunOptions, TrainOptions
from ..provision.pipeline import (
    _ledger,
    _status,
    _with_summary,
    builtin_task,
    new_run_id,
)
from ..provision.resources import Provisioned
from ..execute.reporter import ReporterLike
from ..provision import resources
from ..execute import foreground
from ..execute.nodes import connect_verified
from ..recover import reconcile, recovery
from ..plan import intervals

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...remote.ssh_config import HostEntry
    from ..job import TaskJob


def _standing(aws: Aws, settings: Settings, found: list[Instance], out: str | Path | None, backend: Backend,
              command: str) -> tuple[list[Instance], str, Path, Provisioned, run_record.RunRecord]:
    """A run on standing instances ``found``: (their fresh descriptions in node order, run id,
    absolute artifacts dir, Provisioned with their key, the run record's common columns).
    Raises UsageError when their private key is not on this machine."""
    key = network.require_private_key(settings.keys_dir, found[0].key_name or "")
    nodes = instances.wait_running(aws.ec2, [i.id for i in found])  # fresh descriptions
    nodes.sort(key=lambda i: i.node or 0)
    run_id = new_run_id()
    out = Path(out or Path("runs") / run_id).resolve()
    prov = Provisioned(nodes[0].tags.get(tags.RUN, run_id), key_name=nodes[0].key_name, key_path=key)
    record = run_record.new(run_id, command, backend.name, out, instance_type=nodes[0].type,
                            market=nodes[0].market, region=aws.region,
                            instance_ids=[i.id for i in nodes], instance_id=nodes[0].id,
                            zone=nodes[0].zone)
    return nodes, run_id, out, prov, record


def train_on_cluster(aws: Aws, settings: Settings, opts: TrainOptions, ui: ReporterLike, cluster_name: str,
                     backend: Backend = AWS) -> run_record.RunRecord:
    """Train MNIST on the nodes a standing cluster has now (``ec2gpu launch --nodes N --name NAME``)
    and leave the cluster running: ``exec_task`` with the built-in task. Raises UsageError for an
    unknown cluster or a missing key file; RemoteError/recovery.Interrupted as the attempt raises them."""
    nodes = clusters.members(aws.ec2, cluster_name)
    if not nodes:
        raise UsageError(f"no running cluster named {cluster_name!r}",
                         "start one with `ec2gpu launch --nodes N --name NAME` (see `ec2gpu ls`)")
    opts = replace(opts, nodes=len(nodes))  # the sandbox's data: in the trainer's flags (runs/plan/sandbox_data.py)
    job = builtin_task(opts, sandbox=backend.is_sandbox)
    return exec_task(aws, settings, job, ui, cluster_name, backend, opts.out, opts.command,
                     extra={"model": opts.model, "epochs": opts.epochs})


def exec_task(aws: Aws, settings: Settings, job: TaskJob, ui: ReporterLike, target: str, backend: Backend,
              out: Path | None, command: str, extra: dict[str, Any] | None = None) -> run_record.RunRecord:
    """Run ``job`` once on the standing instance or cluster ``target`` (its Name, cluster name or
    instance id) and leave it running; return the run record (in the ledger, without a cost of its
    own: the instances bill as they stand). Raises UsageError for an unknown target, a missing
    key file or S3 file_mounts (a standing instance has no run role to copy with); RemoteError,
    recovery.Interrupted as the attempt raises them. ``extra``: more columns
    for the record (a built-in task's model and epochs)."""
    if any(m.kind == "s3" for m in job.mounts):  # a standing instance has no run role to copy with
        raise UsageError(f"{job.name}: file_mounts from S3 need an instance role of the run's own, and `exec` runs on "
                         f"a standing instance that has none", "run the task with `ec2gpu run` (it makes that role "
                         "and removes it after), or copy the data in the task's setup")
    found = clusters.members(aws.ec2, target) or [
        i for i in sweep.find_instances(aws.ec2, states=["pending", "running"])
        if tags.answers_to(i, target)]
    if not found:
        raise UsageError(f"no running instance or cluster named {target!r}",
                         "start one with `ec2gpu launch --name NAME` (see `ec2gpu ls`)")
    nodes, run_id, out, prov, record = _standing(aws, settings, found, out, backend, command)
    # no limit of the run's own: a standing instance keeps the one it was launched with (and a stop
    # and start clears user data's shutdown), so the agent is given none to stop the job before
    opts = RunOptions(task=job, nodes=len(nodes), command=command, max_runtime_minutes=None)
    # extra: RunRecord's columns
    record.update(cast(run_record.RunRecord, {"task": job.name, "task_key": job.history_key, **(extra or {})}))
    itype = catalog.CATALOG.get(nodes[0].type)
    record["gpu"] = itype.gpu if itype else None
    ui.note(f"{target}: {words.count(len(nodes), 'node')}; they keep running afterwards")
    _ledger(settings, record, ui)
    error = None
    try:
        checkpoints = recovery.DirCheckpoints(remote="", local=out / "checkpoints", log=ui.note)
        return _with_summary(record, foreground.run_attempt(aws, settings, opts, run_id, ui, prov, nodes, out,
                                                            backend, 1, checkpoints))
    except BaseException as exc:
        error = exc
        raise
    finally:
        record.update({"status": _status(error), "phases": dict(ui.phases),
                       "ended_at": datetime.now(timezone.utc).isoformat()})
        if isinstance(error, RemoteError) and error.exit_status is not None:
            record["exit_status"] = error.exit_status
        _ledger(settings, record, ui)
        run_record.save(record, out)



def launch(aws: Aws, settings: Settings, opts: LaunchOptions, ui: ReporterLike,
           backend: Backend = AWS) -> list[dict[str, Any]]:
    """`ec2gpu launch`: provision standing instances for ``opts`` (instance types, spot, name,
    nodes, --max-runtime, idle rule), pin each one's host key (verified against its console
    output, as a run does: ``pin_all``), write $EC2GPU_HOME/ssh_config, and leave them running;
    return their summaries (aws/instances.summary). Whatever failed half-way is removed before the
    error is raised (UsageError, AwsError, CapacityError, WaitTimeout, RemoteError for a host key
    the console does not list, KeyboardInterrupt)."""
    aws.check_credentials()
    run_id = new_run_id()
    prov = Provisioned(run_id)

    def in_the_ledger() -> None:  # every instance made has a row, settled once they have all ended
        _ledger(settings, reconcile.standing_row(_backend_name(aws, settings, backend), aws.region, run_id,
                                                 _command_line("ec2gpu launch"), prov.instances,
                                                 settings.root_volume_gib), ui)
    try:
        try:
            resources.provision(aws, settings, opts, run_id, ui, prov)
        finally:
            if prov.instances:  # also those a failed wait leaves: teardown ends them, a later command bills them
                in_the_ledger()
        with ui.phase("waiting for SSH"):
            pin_all(aws, settings, backend, prov.instances, ui.note)
        path, _, _ = write_ssh_config(aws, settings, backend, ui.note, log=ui.note)
        ui.note(f"wrote {path}: `ssh NAME` reaches the instance with its pinned host key once ~/.ssh/config has "
                f"`Include {path}`")
    except BaseException:
        resources.teardown(aws, settings, prov, ui)
        raise
    return [instances.summary(i) for i in prov.instances]


def _backend_name(aws: Aws, settings: Settings, backend: Backend) -> str:
    """The ledger's backend of instances launched through ``aws``: ``backend``'s, or "sandbox" where
    that is the default AWS but the client talks to the sandbox's endpoint (as backend.Context
    decides), so the sandbox's simulated bills never count as money."""
    state = control.read_state(settings.home) or {}
    return "sandbox" if backend.is_sandbox or (aws.endpoint_url and aws.endpoint_url == state.get("endpoint")) \
        else backend.name


def _command_line(default: str) -> str:
    """The command as typed (`ec2gpu launch --name dev`), else ``default`` (the API, tests)."""
    return " ".join(["ec2gpu", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith("ec2gpu") else default


def write_ssh_config(aws: Aws, settings: Settings, backend: Backend, warn: Callable[[str], None] = lambda line: None,
                     pin: bool = False,
                     log: Callable[[str], None] = lambda line: None) -> tuple[Path, list[HostEntry], dict[str, str]]:
    """Write $EC2GPU_HOME/ssh_config for every running instance whose key is here and whose host key
    is pinned: (path, entries, {instance id: why it was left out}). With ``pin``, an instance not
    pinned yet is pinned first (``pin_host_key``: verified against its console output; up to
    ``PIN_TIMEOUT_S`` each; ``log`` says how) and left out only if that fails; without, it is left
    out (OpenSSH never trusts on first use). A key pinned under an address is pinned under the
    instance id too (remote/ssh.pin_under_alias). A Name tag that is not safe in a Host line
    (tags.safe: anyone who can tag in the account could plant a ProxyCommand) is left out, and
    ``warn`` says so; the instance is still reachable by its id."""
    entries, skipped = [], {}
    for inst in sweep.find_instances(aws.ec2, states=["running"]):
        iid = inst.id
        key = network.private_key_path(settings.keys_dir, (inst.key_name or ""))
        if not key.exists():
            skipped[iid] = "its private key is not on this machine"
            continue
        if not ssh.pin_under_alias(settings.home / "known_hosts" / iid, iid, log):
            if not pin:
                skipped[iid] = "its host key is not pinned yet (`ec2gpu ssh-config` pins it)"
                continue
            try:
                pin_host_key(aws, settings, backend, inst, log=log).close()
            except Ec2GpuError as exc:  # a key the console does not list, no answer: not written
                skipped[iid] = f"its host key could not be pinned: {exc.message}"
                continue
        host, port = backend.ssh_target(inst)
        name = inst.tags.get(tags.NAME)
        if name is not None and not tags.safe(name):
            warn(f"{inst.id}: its Name tag {name!r} has characters that are not safe in an ssh_config; "
                 "left out (use the instance id)")
            name = None
        entries.append(ssh_config.HostEntry(tuple(a for a in (name, inst.id) if a), host, port,
                                            settings.ssh_user, key, settings.home / "known_hosts" / inst.id))
    path = settings.home / "ssh_config"
    (settings.home / "known_hosts").mkdir(parents=True, exist_ok=True)  # OpenSSH won't create it
    ssh_config.write(path, ssh_config.render(entries, path))
    return path, entries, skipped


#: How long pinning a standing instance's host key waits for SSH (s): the console's fingerprints
#: (remote/ssh.FINGERPRINT_WAIT_S) and a minute more; `run` waits 300 s, as `launch` does (pin_all).
PIN_TIMEOUT_S = 180.0 + 60


def pin_host_key(aws: Aws, settings: Settings, backend: Backend, inst: Instance,
                 log: Callable[[str], None] = lambda msg: None, timeout_s: float = PIN_TIMEOUT_S) -> Any:
    """Connect to ``inst`` over SSH, pinning its host key under its instance id (verified against
    its console output) when it is not pinned yet; return the open Connection. Raises
    RemoteError (a key the console does not list, or not the pinned one), WaitTimeout (no answer
    in ``timeout_s`` seconds), UsageError (its private key is not on this machine)."""
    return connect_verified(aws, settings, backend, inst, log=log, timeout_s=timeout_s)[0]


def pin_all(aws: Aws, settings: Settings, backend: Backend, found: list[Instance],
            log: Callable[[str], None] = lambda msg: None) -> None:
    """Pin the host key of each of ``found`` (at once; pin_host_key, waiting up to 300 s for SSH as
    a run does: remote/ssh.wait_for_ssh's default). Raises the first error (RemoteError,
    WaitTimeout, UsageError). The waits run in daemon threads, so that an interrupt here (the
    caller then removes the instances) does not wait for the others' SSH at exit."""
    if len(found) == 1:
        pin_host_key(aws, settings, backend, found[0], log, timeout_s=300.0).close()
        return
    errors: list[BaseException] = []

    def one(inst: Instance) -> None:
        try:
            pin_host_key(aws, settings, backend, inst, lambda line: log(f"{inst.id}: {line}"),
                         timeout_s=300.0).close()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(i,), daemon=True, name=f"pin-{i.id}") for i in found]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def listing(aws: Aws, settings: Settings) -> list[dict[str, Any]]:
    """`ec2gpu ls`: every live instance of the tool (aws/instances.summary) with its age (s: the
    time it has run, over every running interval its ledger row recorded, runs/plan/intervals.py), the
    on-demand price (USD/h; the ceiling of a spot one) and the cost so far (USD: each interval's
    compute with its 60 s minimum, its public IPv4 address, its root volume; ``so_far`` has the
    parts); for a stopped one, its volumes and their monthly cost; for one with an idle rule, how
    long it has been idle or why it is busy."""
    described = sweep.find_instances(aws.ec2)
    rows = [instances.summary(i) for i in described]
    known = {a["instance_id"]: a for r in reconcile.open_rows(settings.home) for a in r.get("attempts") or []}
    disks = instances.root_volume_gib(aws.ec2, [r["instance_id"] for r in rows])
    now = datetime.now(timezone.utc)
    for r, inst in zip(rows, described, strict=True):
        att = known.get(r["instance_id"]) or {}
        ivs = intervals.observe(att.get("intervals") or [], inst, now)
        first = datetime.fromisoformat(att["launched_at"]) if att.get("launched_at") else inst.launched_at
        price = catalog.on_demand_price(r["instance_type"], aws.region, settings.home) \
            if r["instance_type"] in catalog.CATALOG else catalog.Price(None, "not a catalog type")
        cost = intervals.so_far(ivs, now, price.usd_per_hour, aws.region, settings.home,
                                disks.get(r["instance_id"]), first)
        r.update(age_seconds=round(cost["running_seconds"]), running_intervals=len(ivs),
                 intervals_recorded=bool(att), first_launched_at=first.isoformat(), usd_per_hour=price.usd_per_hour,
                 price_source=price.source, so_far=cost,
                 cost_so_far_usd=None if cost["cost_usd"] is None else round(cost["cost_usd"], 4))
    _stopped_disks(aws.region, settings.home, rows, disks)
    _idle_columns(aws.ec2, rows, time.time())
    return rows


def _stopped_disks(region: str, home: Path, rows: list[dict[str, Any]], disks: dict[str, int]) -> None:
    """For stopped (or stopping) instances: no compute price (EC2 bills none while stopped), their
    volumes' GiB (``disks``) and what those cost per month (gp3 in ``region``, catalog.ebs_price)."""
    gp3 = catalog.ebs_price("gp3", region, home).usd_per_gb_month
    for r in (r for r in rows if r["state"] in ("stopping", "stopped")):
        gib = disks.get(r["instance_id"])
        r.update(usd_per_hour=None, disk_gib=gib,
                 disk_usd_per_month=None if gib is None or gp3 is None else round(gib * gp3, 2))


def _idle_columns(ec2: Any, rows: list[dict[str, Any]], now: float) -> None:
    """For running instances with an idle rule: how long they have been idle, or why they are busy,
    from what their watcher last wrote to the console (read through the EC2 API: asking over SSH
    would itself count as a connection and keep them busy)."""
    for r in rows:
        rule = instances.parse_idle_tag(r.get("idle_rule"))
        state = instances.idle_state(instances.console_output(ec2, r["instance_id"]), now) \
            if rule and r["state"] == "running" else None
        r.update(idle_seconds=(state or {}).get("idle_seconds"), busy=(state or {}).get("busy"))
