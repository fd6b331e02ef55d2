"""Runs whose controller died without closing them (kill -9, a power cut): their ledger rows stay
``running`` with no bill. Each row records which process ran it (host, pid and that process's
start time, so a reused pid is not mistaken for it); a row whose process is gone is *abandoned*.

`ec2gpu runs` says so; `ec2gpu down`, `cleanup` and `ls` settle it once its instances have
terminated (by themselves after --max-runtime, or removed by down/cleanup): status
``controller-lost``, each attempt billed from its instance's own launch and termination times
(costs.actual_cost, as for any run), ended at the last termination.
"""
from __future__ import annotations

import os
import socket
from datetime import datetime, timezone

from . import ledger

LOST = "controller-lost"  # the status a settled row gets


def this_controller() -> dict:
    """The ``controller`` column for a run this process starts: host name, pid, process start
    time (s since the epoch, psutil's create_time)."""
    import psutil
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def controller_gone(row: dict) -> bool:
    """Whether ``row`` is ``running`` and the process that ran it, on this host, no longer exists.
    False for another host's runs (nothing here can tell) and rows without a ``controller``."""
    import psutil
    c = row.get("controller") or {}
    if row.get("status") != "running" or not c or c.get("host") != socket.gethostname():
        return False
    try:
        return psutil.Process(int(c["pid"])).create_time() != c.get("started")
    except psutil.NoSuchProcess:
        return True


def abandoned(home, backend: str | None = None) -> list[dict]:
    """The ledger's rows (of ``backend``) whose controller is gone; [] when the ledger cannot be read."""
    return [r for r in ledger.runs(home, backend=backend, limit=500, tolerant=True) if controller_gone(r)]


def settle(aws, home, row: dict, log=lambda msg: None) -> bool:
    """Close ``row`` (an abandoned run) once every instance it launched has terminated: bill each
    attempt from its instance's own times, set status LOST and ended_at, write the ledger. Returns
    False (and changes nothing) while any of them still exists. Instances EC2 no longer lists (it
    forgets terminated ones after about an hour) are billed as unknown, and ``log`` says so.
    Raises botocore errors other than InvalidInstanceID.NotFound."""
    import botocore.exceptions

    from ..aws import instances
    from ..aws.session import error_code
    from . import costs, provision

    attempts = row.get("attempts") or []
    ids = [a["instance_id"] for a in attempts]
    described: dict[str, dict] = {}
    for iid in ids:  # one at a time: one forgotten id must not hide the others
        try:
            described.update({i["InstanceId"]: i for i in instances.describe_instances(aws.ec2, [iid])})
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != "InvalidInstanceID.NotFound":
                raise
    if any(i["State"]["Name"] != "terminated" for i in described.values()):
        return False
    now = datetime.now(timezone.utc)
    for att in attempts:
        if "billed_seconds" in att:
            continue
        inst = described.get(att["instance_id"])
        if inst is None:
            log(f"run {row['run_id']}: EC2 no longer lists {att['instance_id']}; its bill is unknown")
            att.update(ended=LOST, cost_usd=None)
            continue
        start = datetime.fromisoformat(att["billing_started_at"]) if att.get("billing_started_at") else None
        att.update(costs.actual_cost(aws, home, inst, now, start), ended=LOST)
    bill = provision.totals([a for a in attempts if "billed_seconds" in a])
    ended = bill.get("terminated_at") or now.isoformat()
    row.update(bill, status=LOST, ended_at=ended)
    ledger.record(home, row)
    log(f"run {row['run_id']}: its controller ended without closing it; settled as {LOST}"
        + (f", ${row['cost_usd']:.4f} for {row['billed_seconds']:.0f} s billed" if row.get("cost_usd") is not None
           else ""))
    return True


def settle_all(aws, home, backend: str, run_ids: set[str] | None = None, log=lambda msg: None) -> list[str]:
    """Settle every abandoned run of ``backend`` in ``aws``'s region (or only ``run_ids``) whose
    instances have terminated; return the run ids settled."""
    done = []
    for row in abandoned(home, backend):
        if row.get("region") not in (None, aws.region) or (run_ids is not None and row["run_id"] not in run_ids):
            continue
        if settle(aws, home, row, log):
            done.append(row["run_id"])
    return done
