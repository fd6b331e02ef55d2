"""Runs on standing instances (`ec2gpu launch`): `ec2gpu exec NAME TASK` and `train mnist --cluster
NAME` run one attempt there through the engine and leave the instances running; the run is in the
ledger without a cost of its own (the instances bill as they stand; `ec2gpu ls` shows it).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from ..aws import catalog, instances, network
from ..aws.session import Aws
from ..backend import AWS
from ..errors import RemoteError, UsageError
from ..settings import Settings
from . import record as run_record
from .pipeline import (Reporter, TrainOptions, _ledger, _status, _with_summary, builtin_task, new_run_id,
                       sandbox_data_args)
from .provision import Provisioned


def _standing(aws: Aws, settings: Settings, found: list[dict], out, backend, command: str):
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
    record = run_record.new(run_id, command, backend.name, out, instance_type=nodes[0]["InstanceType"],
                            market=instances.market(nodes[0]), region=aws.region,
                            instance_ids=[i["InstanceId"] for i in nodes], instance_id=nodes[0]["InstanceId"],
                            zone=nodes[0].get("Placement", {}).get("AvailabilityZone"))
    return nodes, run_id, out, prov, record


def train_on_cluster(aws: Aws, settings: Settings, opts: TrainOptions, ui: Reporter, cluster_name: str,
                     backend=AWS) -> dict:
    """Train MNIST on the nodes a standing cluster has now (``ec2gpu launch --nodes N --name NAME``)
    and leave the cluster running: ``exec_task`` with the built-in task. Raises UsageError for an
    unknown cluster or a missing key file; RemoteError/recovery.Interrupted as the attempt raises them."""
    from ..aws import clusters

    nodes = clusters.members(aws.ec2, cluster_name)
    if not nodes:
        raise UsageError(f"no running cluster named {cluster_name!r}",
                         "start one with `ec2gpu launch --nodes N --name NAME` (see `ec2gpu ls`)")
    opts.nodes = len(nodes)
    if backend.is_sandbox:
        opts.trainer_args = [*opts.trainer_args, *sandbox_data_args(opts.trainer_args)]
    job = builtin_task(opts, sandbox=backend.is_sandbox)
    return exec_task(aws, settings, job, ui, cluster_name, backend, opts.out, opts.command,
                     extra={"model": opts.model, "epochs": opts.epochs})


def exec_task(aws, settings, job, ui, target: str, backend, out: Path | None, command: str,
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
    nodes, run_id, out, prov, record = _standing(aws, settings, found, out, backend, command)
    opts = TrainOptions(task=job, nodes=len(nodes), command=command)
    record.update(task=job.name, **(extra or {}))
    itype = catalog.CATALOG.get(nodes[0]["InstanceType"])
    record["gpu"] = itype.gpu if itype else None
    ui.note(f"{target}: {len(nodes)} node(s); they keep running afterwards")
    _ledger(settings, record, ui)
    error = None
    try:
        checkpoints = recovery.DirCheckpoints(remote="", local=out / "checkpoints", log=ui.note)
        return _with_summary(record, engine.run_attempt(aws, settings, opts, run_id, ui, prov, nodes, out, backend, 1,
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



def launch(aws: Aws, settings: Settings, opts: TrainOptions, ui: Reporter) -> list[dict]:
    """`ec2gpu launch`: provision standing instances for ``opts`` (instance types, spot, name,
    nodes, --max-runtime, idle rule) and leave them running; return their summaries
    (aws/instances.summary). Whatever failed half-way is removed before the error is raised
    (UsageError, AwsError, CapacityError, WaitTimeout, KeyboardInterrupt)."""
    from . import provision
    aws.check_credentials()
    run_id = new_run_id()
    prov = Provisioned(run_id)
    try:
        provision.provision(aws, settings, opts, run_id, ui, prov)
    except BaseException:
        provision.teardown(aws, settings, prov, ui)
        raise
    return [instances.summary(i) for i in prov.instances]


def write_ssh_config(aws: Aws, settings: Settings, backend, warn=lambda line: None) -> tuple[Path, list, list[str]]:
    """Write $EC2GPU_HOME/ssh_config for every running instance whose key is here: (path, entries,
    instance ids skipped for want of their private key). A Name tag that is not safe in a Host line
    (tags.safe: anyone who can tag in the account could plant a ProxyCommand) is left out, and
    ``warn`` says so; the instance is still reachable by its id."""
    from ..aws import sweep
    from ..aws import tags as T
    from ..remote import ssh_config as sc

    entries, skipped = [], []
    for inst in sweep.find_instances(aws.ec2, states=["running"]):
        key = network.private_key_path(settings.keys_dir, inst.get("KeyName") or "")
        if not key.exists():
            skipped.append(inst["InstanceId"])
            continue
        host, port = backend.ssh_target(inst)
        name = T.as_dict(inst.get("Tags")).get(T.NAME)
        if name is not None and not T.safe(name):
            warn(f"{inst['InstanceId']}: its Name tag {name!r} has characters that are not safe in an ssh_config; "
                 "left out (use the instance id)")
            name = None
        entries.append(sc.HostEntry(tuple(a for a in (name, inst["InstanceId"]) if a), host, port,
                                    settings.ssh_user, key, settings.home / "known_hosts" / inst["InstanceId"]))
    path = settings.home / "ssh_config"
    (settings.home / "known_hosts").mkdir(parents=True, exist_ok=True)  # OpenSSH won't create it
    sc.write(path, sc.render(entries, path))
    return path, entries, skipped


def pin_host_key(aws: Aws, settings: Settings, backend, inst: dict, log=lambda msg: None):
    """Connect to ``inst`` over SSH, pinning its host key (verified against its console output) when
    it is not pinned yet; return the open Connection. Raises RemoteError, WaitTimeout, UsageError
    (its private key is not on this machine)."""
    from ..remote import ssh

    iid = inst["InstanceId"]
    host, port = backend.ssh_target(inst)
    key = network.require_private_key(settings.keys_dir, inst["KeyName"])
    return ssh.wait_for_ssh(host, port, settings.ssh_user, key, settings.home / "known_hosts" / iid,
                            timeout_s=ssh.FINGERPRINT_WAIT_S + 60, log=log,
                            fingerprints=lambda: instances.host_key_fingerprints(aws.ec2, iid))


def listing(aws: Aws, settings: Settings) -> list[dict]:
    """`ec2gpu ls`: every live instance of the tool (aws/instances.summary) with its age (s), the
    on-demand price (USD/h; the ceiling of a spot one) and the cost so far (USD, 60 s minimum);
    for a stopped one its volumes and their monthly cost instead; for one with an idle rule, how
    long it has been idle or why it is busy."""
    import time

    from ..aws import sweep
    rows = [instances.summary(i) for i in sweep.find_instances(aws.ec2)]
    now = datetime.now(timezone.utc)
    for r in rows:
        age = (now - datetime.fromisoformat(r["launched_at"])).total_seconds() if r["launched_at"] else 0.0
        price = catalog.on_demand_price(r["instance_type"], aws.region, settings.home) \
            if r["instance_type"] in catalog.CATALOG else catalog.Price(None, "not a catalog type")
        r.update(age_seconds=round(age), usd_per_hour=price.usd_per_hour, price_source=price.source,
                 cost_so_far_usd=None if price.usd_per_hour is None else
                 round(max(60.0, age) * price.usd_per_hour / 3600, 4))
    _stopped_disks(aws.ec2, rows)
    _idle_columns(aws.ec2, rows, time.time())
    return rows


def _stopped_disks(ec2, rows: list[dict]) -> None:
    """For stopped (or stopping) instances: no compute price (EC2 bills none while stopped), their
    volumes' GiB and what those cost per month (gp3, catalog.EBS_GP3_USD_PER_GB_MONTH)."""
    stopped = [r for r in rows if r["state"] in ("stopping", "stopped")]
    disks = instances.root_volume_gib(ec2, [r["instance_id"] for r in stopped])
    for r in stopped:
        gib = disks.get(r["instance_id"])
        r.update(usd_per_hour=None, cost_so_far_usd=None, disk_gib=gib,
                 disk_usd_per_month=None if gib is None else round(gib * catalog.EBS_GP3_USD_PER_GB_MONTH, 2))


def _idle_columns(ec2, rows: list[dict], now: float) -> None:
    """For running instances with an idle rule: how long they have been idle, or why they are busy,
    from what their watcher last wrote to the console (read through the EC2 API: asking over SSH
    would itself count as a connection and keep them busy)."""
    for r in rows:
        rule = instances.parse_idle_tag(r.get("idle_rule"))
        state = instances.idle_state(instances.console_output(ec2, r["instance_id"]), now) \
            if rule and r["state"] == "running" else None
        r.update(idle_seconds=(state or {}).get("idle_seconds"), busy=(state or {}).get("busy"))
