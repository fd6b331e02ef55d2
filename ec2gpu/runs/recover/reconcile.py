"""Runs whose controller died without closing them (kill -9, a power cut): their ledger rows stay
``running`` with no bill. Each row records which process ran it (host, pid and that process's
start time, so a reused pid is not mistaken for it); a row whose process is gone is *abandoned*.

`ec2gpu runs` says so; `ec2gpu down`, `cleanup` and `ls` settle it once its instances have
terminated (by themselves after --max-runtime, or removed by down/cleanup): status
``controller-lost``, each attempt billed from its instance's own launch and termination times
(costs.actual_cost, as for any run), ended at the last termination.

Standing instances (`launch`, `notebook`) have no controller waiting for them: their row opens
with status ``standing`` and the same commands, and `runs`, settle it (status ``ended``) once every
instance of the run has terminated, billed over each of its running intervals (runs/plan/intervals.py).
"""
from __future__ import annotations

import json
import socket
from datetime import datetime, timezone
from typing import TYPE_CHECKING, AbstractSet, Any, Callable

import psutil

from ...aws import instances, sweep, tags
from ...aws.session import ClientError, error_code
from ..plan import costs, intervals
from ..settle import ledger, record as run_record
from ..settle.record import this_controller as this_controller  # re-exported

if TYPE_CHECKING:
    from pathlib import Path

    from ...aws.instances import Instance
    from ...aws.session import Aws
    from ..settle.record import RunRecord

LOST = "controller-lost"  # the status a settled row gets


def controller_gone(row: dict[str, Any]) -> bool:
    """Whether ``row`` is ``running`` and the process that ran it, on this host, no longer exists.
    False for another host's runs (nothing here can tell) and rows without a ``controller``."""
    c = row.get("controller") or {}
    if row.get("status") != "running" or not c or c.get("host") != socket.gethostname():
        return False
    try:
        started: float = psutil.Process(int(c["pid"])).create_time()
        return started != c.get("started")
    except psutil.NoSuchProcess:
        return True


def abandoned(home: Path, backend: str | None = None) -> list[dict[str, Any]]:
    """The ledger's rows (of ``backend``) whose controller is gone; [] when the ledger cannot be read."""
    return [r for r in ledger.runs(home, backend=backend, limit=500, tolerant=True) if controller_gone(r)]


def settle(aws: Aws, home: Path, row: dict[str, Any], log: Callable[[str], None] = lambda msg: None,
           volume_gib: float | None = None) -> bool:
    """Close ``row`` (an abandoned run, or a finished one whose instances ``--keep`` left running:
    ``kept``) once every instance it launched has terminated: bill each attempt not billed yet
    from its instance's own times (its root volume being ``volume_gib`` GiB), set an abandoned
    run's status LOST and ended_at, write the ledger. Returns False (and changes nothing) while
    any of them still exists. Instances EC2 no longer lists (it forgets terminated ones after
    about an hour) are billed as unknown, and ``log`` says so. Raises botocore errors other than
    InvalidInstanceID.NotFound."""
    attempts = row.get("attempts") or []
    ids = [a["instance_id"] for a in attempts]
    described: dict[str, Instance] = {}
    for iid in ids:  # one at a time: one forgotten id must not hide the others
        try:
            described.update({i.id: i for i in instances.describe_instances(aws.ec2, [iid])})
        except ClientError as exc:
            if error_code(exc) != "InvalidInstanceID.NotFound":
                raise
    if any(i.state != "terminated" for i in described.values()):
        return False
    now = datetime.now(timezone.utc)
    lost = row.get("status") == "running"
    for att in attempts:
        if "billed_seconds" in att or att.get("bill_unknown"):
            continue
        inst = described.get(att["instance_id"])
        if inst is None:
            log(f"run {row['run_id']}: EC2 no longer lists {att['instance_id']}; its bill is unknown")
            att.update(ended=LOST if lost else att.get("ended"), cost_usd=None, bill_unknown=True)
            continue
        start = datetime.fromisoformat(att["billing_started_at"]) if att.get("billing_started_at") else None
        att.update(costs.actual_cost(aws, home, inst, now, start, volume_gib), ended=LOST if lost else att.get("ended"))
    bill = costs.totals([a for a in attempts if "billed_seconds" in a])
    if lost:
        row.update(status=LOST, ended_at=bill.get("terminated_at") or now.isoformat())
    row.update(bill)
    ledger.record(home, row)
    log(f"run {row['run_id']}: " + (f"its controller ended without closing it; settled as {LOST}" if lost else
                                    "the instances it kept (--keep) have ended; billed")
        + (f", ${row['cost_usd']:.4f} for {row['billed_seconds']:.0f} s billed" if row.get("cost_usd") is not None
           else ""))
    return True


def kept(home: Path, backend: str | None = None) -> list[dict[str, Any]]:
    """The ledger's finished runs (of ``backend``) with an instance not billed yet: what `--keep`
    left running, or a bill that could not be computed at the end; [] when the ledger cannot be
    read."""
    return [r for r in ledger.runs(home, backend=backend, limit=500, tolerant=True)
            if r.get("status") not in ("running", STANDING, ENDED)
            and any("billed_seconds" not in a and not a.get("bill_unknown") for a in r.get("attempts") or [])]


def settle_all(aws: Aws, home: Path, backend: str, run_ids: set[str] | None = None,
               log: Callable[[str], None] = lambda msg: None,
               volume_gib: float | None = None) -> list[str]:
    """Settle every abandoned or ``kept`` run of ``backend`` in ``aws``'s region (or only
    ``run_ids``) whose instances have terminated (root volumes of ``volume_gib`` GiB); return the
    run ids settled."""
    done = []
    for row in abandoned(home, backend) + kept(home, backend):
        if row.get("region") not in (None, aws.region) or (run_ids is not None and row["run_id"] not in run_ids):
            continue
        if settle(aws, home, row, log, volume_gib):
            done.append(row["run_id"])
    return done


# Standing instances (`launch`, `notebook`, the nodes `scale` adds) have no controller that waits
# for them: their row (status STANDING) is opened at launch and settled by whichever later command
# sees all of the run's instances terminated, as an abandoned run is.
STANDING = "standing"  # the row's status while any instance of the run exists
ENDED = "ended"  # ... once every one has terminated and been billed
#: EC2's StateReason codes -> how the ledger says the instance ended
#: (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StateReason.html)
ENDINGS = {"Client.InstanceInitiatedShutdown": "ended itself", "Server.SpotInstanceTermination": "spot-interrupted",
           "Client.UserInitiatedShutdown": "terminated"}


def standing_attempt(instance: Instance, volume_gib: float | None, now: datetime) -> dict[str, Any]:
    """The ledger's record of one standing instance (``instance``: its description, from
    instances.wait_running where it has the billing start) (pure): its first interval opened."""
    return {"attempt": 1, "node": instance.node, "instance_id": instance.id,
            "instance_type": instance.type, "market": instance.market,
            "zone": instance.zone, "ended": "running",
            "launched_at": instance.launched_at.isoformat(), "volume_gib": volume_gib, "seen_at": now.isoformat(),
            "intervals": intervals.observe([], instance, now, instance.billing_start)}


def standing_row(backend: str, region: str, run_id: str, command: str, described: list[Instance],
                 volume_gib: float | None) -> RunRecord:
    """The ledger row of the standing instances ``described`` just launched under ``run_id``
    (status STANDING, no cost yet; root volumes of ``volume_gib`` GiB)."""
    now = datetime.now(timezone.utc)
    first = described[0]
    row = run_record.new(run_id, command, backend, "", status=STANDING, region=region,
                         zone=first.zone, instance_type=first.type,
                         market=standing_attempt(first, None, now)["market"],
                         instance_ids=[i.id for i in described], instance_id=first.id,
                         attempts=[standing_attempt(i, volume_gib, now) for i in described])
    return row


def open_rows(home: Path, backend: str | None = None) -> list[dict[str, Any]]:
    """The ledger's STANDING rows (of ``backend``); [] when the ledger cannot be read."""
    return [r for r in ledger.runs(home, backend=backend, limit=500, tolerant=True) if r.get("status") == STANDING]


def sync_standing(aws: Aws, home: Path, backend: str, log: Callable[[str], None] = lambda msg: None) -> list[str]:
    """Bring every STANDING row of ``backend`` in ``aws``'s region up to date with what EC2 shows
    of its run's instances (one DescribeInstances, every state): intervals opened and closed
    (runs/plan/intervals.py), nodes the run gained (`scale`) added, each terminated instance billed, and
    the row settled (status ENDED, its bill the sum of its instances') once none is left. Returns
    the run ids settled; ``log`` says each. Raises botocore errors."""
    rows = [r for r in open_rows(home, backend) if r.get("region") in (None, aws.region)]
    if not rows:
        return []
    found: dict[str, list[Instance]] = {}
    for inst in sweep.find_instances(aws.ec2, states=sweep.LIVE_STATES + ["terminated"]):
        found.setdefault(inst.tags.get(tags.RUN, ""), []).append(inst)
    return [r["run_id"] for r in rows if _sync_row(aws, home, r, found.get(r["run_id"], []), log)]


def _sync_row(aws: Aws, home: Path, row: dict[str, Any], described: list[Instance], log: Callable[[str], None]) -> bool:
    """One STANDING row brought up to date with ``described`` (its run's instances); written when
    anything changed. Returns whether it was settled."""
    now = datetime.now(timezone.utc)
    before = json.dumps(row, sort_keys=True, default=str)
    attempts = {a["instance_id"]: a for a in row.get("attempts") or []}
    volume = next((a.get("volume_gib") for a in attempts.values()), None)
    for inst in described:
        att = attempts.get(inst.id)
        if att is None:  # a node `ec2gpu scale` added to the run
            att = attempts[inst.id] = standing_attempt(inst, volume, now)
            row["attempts"].append(att)
            row["instance_ids"] = [*row.get("instance_ids", []), inst.id]
        if "billed_seconds" in att:
            continue
        att["seen_at"] = now.isoformat()
        if inst.state == "terminated":
            code = inst.state_reason_code or ""
            att.update(intervals.bill(aws, home, att, inst, now), ended=ENDINGS.get(code, "terminated"))
        else:
            att["intervals"] = intervals.observe(att.get("intervals") or [], inst, now)
    seen = {i.id for i in described}
    for att in attempts.values():  # unlisted for longer than EC2 lists a terminated instance: forgotten
        if "billed_seconds" not in att and att["instance_id"] not in seen and (now - datetime.fromisoformat(
                att.get("seen_at") or att["launched_at"])).total_seconds() > sweep.UNLISTED_AFTER_S:
            log(f"run {row['run_id']}: EC2 no longer lists {att['instance_id']}; the end of its last running interval, "
                "and so its bill, is unknown")
            closed = [i for i in att.get("intervals") or [] if i["to"]]
            att.update(ended="no longer listed by EC2", cost_usd=None, terminated_at=None, usd_per_hour=None,
                       price_source="unknown: EC2 no longer lists the instance",
                       billed_seconds=round(sum(costs_billed(i) for i in closed), 1))
    settled = all("billed_seconds" in a for a in row["attempts"])
    if settled:
        row.update(costs.totals(row["attempts"]), status=ENDED)
        row["ended_at"] = row.get("terminated_at") or now.isoformat()
        usd = row.get("cost_usd")
        log(f"run {row['run_id']} ({row.get('command') or 'launch'}): every instance has ended; "
            + (f"${usd:.4f} for {row['billed_seconds']:.0f} s billed" if usd is not None else "its bill is unknown")
            + " (`ec2gpu runs show " + row["run_id"] + "`)")
    if json.dumps(row, sort_keys=True, default=str) != before:
        ledger.record(home, row)
    return settled


def costs_billed(interval: dict[str, Any]) -> float:
    """Billed seconds of one closed interval (60 s minimum) (pure)."""
    return costs.billed_seconds(datetime.fromisoformat(interval["from"]), datetime.fromisoformat(interval["to"]))


def remove_ended(aws: Aws, home: Path, keys_dir: Path, keep: AbstractSet[str] = frozenset(),
                 log: Callable[[str], None] = lambda msg: None) -> dict[str, dict[str, list[str]]]:
    """Remove what runs whose instances have all ended left behind (aws/sweep.ended_leftovers:
    security groups, key pairs with their key files, placement groups), and say it in one line
    through ``log``. Never the runs of ``keep`` nor those a controller in this ledger may still be
    using (status running, its process not known to be gone). Returns run id -> {kind: ids}.
    Raises botocore errors."""
    busy = {r["run_id"] for r in ledger.runs(home, limit=500, tolerant=True)
            if r.get("status") == "running" and not controller_gone(r)}
    found = sweep.ended_leftovers(aws.ec2, busy | set(keep), iam=aws.client("iam"), autoscaling=aws.client("autoscaling"))
    if not found:
        return {}
    removed = sweep.remove_leftovers(aws.ec2, found, keys_dir, iam=aws.client("iam"))
    said = []
    for run, done in removed.items():
        items = [f"{kind.replace('_', ' ')[:-1]} {x}" for kind in ("security_groups", "key_pairs", "key_files",
                                                                    "placement_groups") for x in done[kind]]
        items += [f"not yet {x}: a later command tries again" for x in done["left"]]
        said.append(f"run {run} ({found[run]['why']}): " + ", ".join(items))
    log("removed what instances that have ended left behind: " + "; ".join(said))
    return removed
