"""Follow a detached run from any machine with the same AWS identity: `ec2gpu status RUN`, `ec2gpu cancel RUN`.

What a detached run is doing is in two places, both AWS's: its record ``state.json`` in the run store
(aws/runstore_records.py; written by the agent on its instance, so read as hostile input:
wire/run_record.view) and its Auto Scaling group (aws/groups.py: desired capacity, the
instances it holds). Neither is this machine's ledger, so a run started on a laptop is followed
from another one, with credentials of the same user id (the run store keeps each user's runs under
``runs/USER_ID/``: aws/runstore.py).

A run that has finished (its state final and its group at 0 with no instance left) has what it
made removed by the first of these commands that sees it so (``remove_finished``): the group, its
launch template, the security group, the key pair and the instance role. Its objects in S3 stay
until the bucket's lifecycle rule expires them.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Callable

from ...aws import groups, runstore, runstore_records, sweep
from ...aws.session import Aws
from ...errors import LedgerError, UsageError
from ...settings import Settings
from ...wire import run_record
from ...aws.runstore import store
from ..settle import ledger
from . import costs
from .costs import AGENT_TIMES
from .fetch import NOT_FOUND_HINT

#: the states after which the agent does nothing more (an "interrupted" attempt is followed by the replacement's)
DONE = run_record.FINAL_STATES
#: how long `cancel` waits (s) for the agent to stop the job and save its outputs before it ends the
#: group itself
CANCEL_WAIT_S = 180.0


def status(aws: Aws, settings: Settings, run_id: str, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The detached run ``run_id`` as AWS knows it: its record's fields (wire/run_record.view:
    state, attempt, restarts, interruptions, instance, times, message; "problem" when the record is
    not readable), plus "group" (its desired capacity and instances: id, state, zone, health, or
    None once it is gone) and "removed" (what ``remove_finished`` removed now). Raises UsageError
    for a run id that is not one or a run the caller's prefix of the store does not hold; AwsError."""
    runstore.check_run_id(run_id)
    s3, bucket, user = store(aws)
    data = runstore_records.get_status_bytes(s3, bucket, user, run_id)
    if data is None:
        raise UsageError(f"no detached run {run_id} in s3://{bucket}/{runstore.user_prefix(user)} ({aws.region})",
                         NOT_FOUND_HINT)
    got = run_record.view(data, run_id)
    group = groups.summary(aws.client("autoscaling"), run_id)
    if got["state"] not in DONE and got["state"] != "unreadable" and _stopped(group):
        got = _ended_without_agent(s3, bucket, user, got, log)
    row = _ledger_row(settings, run_id)  # this machine's, when it started the run (one read for both)
    cost = _cost(aws, settings, run_id, data, row, got["state"] in DONE, (s3, bucket, user), log)  # before the group goes
    removed = remove_finished(aws, settings, run_id, got, group, log)
    _settle_row(settings, got, row, cost, log)
    return {**got, "bucket": bucket, "group": group, "removed": removed,
            **({"billed_seconds": cost["billed_seconds"], "cost_usd": cost["cost_usd"],
                "upper_bound": cost["upper_bound"], "cost": cost} if cost is not None else {})}


def _ledger_row(settings: Settings, run_id: str) -> dict[str, Any] | None:
    """This machine's ledger row of ``run_id``; None when it has none (started elsewhere) or none can be read."""
    try:
        return ledger.get(settings.home, run_id)
    except (UsageError, LedgerError):
        return None


def _cost(aws: Aws, settings: Settings, run_id: str, data: bytes, row: dict[str, Any] | None, over: bool,
          found: tuple[Any, str, str], log: Callable[[str], None]) -> dict[str, Any] | None:
    """The run's cost so far or in all (runs/detached/costs.gather: its instances' own times while
    EC2 lists them, then as its settled.json kept them, else its agent's; a run ``over`` gets its
    settled.json once EC2 lists every instance terminated), or None, said, when AWS does not answer.
    ``found``: (s3 client, bucket, user id), the run store ``store`` found."""
    try:
        return costs.gather(aws, settings.home, {run_id: runstore_records.launches(data, run_id)},
                            {run_id: row} if row is not None else {},
                            settings.root_volume_gib, store=found, final={run_id} if over else set())[run_id]
    except Exception as exc:  # noqa: BLE001 - AwsError or botocore's: the status is shown without its cost
        log(f"the run's cost could not be had ({type(exc).__name__}); `ec2gpu runs --remote` tries again")
        return None


def _stopped(group: dict[str, Any] | None) -> bool:
    """Whether nothing can run the job any more: its group is gone, or at 0 with no instance (the
    deadline's scheduled action, `down`, or an agent that ended it without a word)."""
    return group is None or (not group["desired"] and not group["instances"])


def _ended_without_agent(s3: Any, bucket: str, user: str, got: dict[str, Any],
                         log: Callable[[str], None]) -> dict[str, Any]:
    """The record of a run whose group stopped while its state was not final (the agent was
    killed, or the deadline came first): "failed", said so, written back so every later reader
    agrees. Returns the record as written (as ``got`` when S3 refused it), or, when the agent's own
    end came in between (it writes its end, then ends the group: a reader between its record read
    and the group's can see both), the record as it now is: that end stands."""
    why = (f"ended without its agent's word while {got['state']}: its group is gone or at 0 "
           "(the run's deadline, or `ec2gpu down`/`cleanup`)")
    try:
        wrote = runstore_records.end_status(s3, bucket, user, got["run_id"], "failed", why, _now())
    except Exception as exc:  # noqa: BLE001 - said; the next `status` tries again
        log(f"could not record the run's end ({type(exc).__name__})")
        return got
    if not wrote:  # an end recorded meanwhile (the agent's): read it
        return runstore_records.get_status(s3, bucket, user, got["run_id"]) or got
    log(f"run {got['run_id']}: {why}")
    return {**got, "state": "failed", "message": why}


#: a detached run's final state -> the ledger's status of a run (runs/settle/record.RunRecord)
LEDGER_STATUS = {"succeeded": "completed", "failed": "failed", "cancelled": "cancelled"}


def _settle_row(settings: Settings, got: dict[str, Any], row: dict[str, Any] | None, cost: dict[str, Any] | None,
                log: Callable[[str], None]) -> None:
    """When the run is over and this machine's ledger holds it as "detached" (it was started
    here), give its row the run's end: status, exit status, end time; and its cost (``cost``,
    costs.gather's) once every instance has ended, billed from EC2's own times, at that call or a
    later one (``row``: its ledger row, None when this machine has none). A ledger problem is
    said, never raised: the run's record is in S3 either way."""
    if got.get("state") not in DONE or row is None:  # not over, or started on another machine
        return
    billed = (cost is not None and cost["cost_usd"] is not None and not cost["running"]
              and not (cost.get("times_source") or {}).get(AGENT_TIMES))  # EC2's times (or kept), never a lower bound
    if row.get("status") != "detached" and not (billed and row.get("cost_usd") is None
                                                and row.get("status") in LEDGER_STATUS.values()):
        return
    update = {"status": LEDGER_STATUS[got["state"]], "ended_at": got.get("ended_at"),
              "exit_status": got.get("exit_code")}
    if billed and cost is not None:
        update.update(cost_usd=cost["cost_usd"], billed_seconds=cost["billed_seconds"],
                      price_source=cost.get("price_source"))
    try:
        ledger.record(settings.home, {**row, **update})  # the whole row: an upsert
    except LedgerError as exc:
        log(f"warning: {exc.message}; the run's record is in S3")


def remove_finished(aws: Aws, settings: Settings, run_id: str, got: dict[str, Any], group: dict[str, Any] | None,
                    log: Callable[[str], None]) -> dict[str, list[str]]:
    """When the run is over (state in DONE, and its group at 0 with no instance, or gone), remove
    what it made (aws/sweep.delete_run with IAM and Auto Scaling clients); {} otherwise, or when
    nothing was left. Never raises for one resource (sweep's best effort)."""
    if got.get("state") not in DONE or (group is not None and (group["desired"] or group["instances"])):
        return {}
    found = sweep.inventory(aws.ec2, run_id, iam=aws.client("iam"), autoscaling=aws.client("autoscaling"),
                            ssm=aws.client("ssm"), user=store(aws)[2])
    if not any(found.values()):
        return {}
    done = sweep.delete_everything(aws.ec2, found, settings.keys_dir, log=log, iam=aws.client("iam"),
                                   autoscaling=aws.client("autoscaling"), ssm=aws.client("ssm"))
    return {k: v for k, v in done.items() if v}


def cancel(aws: Aws, settings: Settings, run_id: str, log: Callable[[str], None] = lambda line: None,
           wait_s: float = CANCEL_WAIT_S, poll_s: float = 5.0, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Cancel the detached run ``run_id``: write its ``cancel`` object (the agent, polling for it,
    stops the job, uploads its outputs and log and records "cancelled"), wait up to ``wait_s``
    seconds for that, then remove the group (its instances with it, whatever the agent did) and
    everything else the run made (aws/sweep.delete_run). Returns ``status``' dict after it, with
    "waited_s". A run already over is only cleaned up. Raises UsageError for an unknown run; AwsError."""
    first = status(aws, settings, run_id, log)
    if first["state"] in DONE:
        if _stopped(first["group"]):
            return {**first, "waited_s": 0.0}
        # over by its record, yet its group still runs something (a record the job wrote itself, or
        # an earlier cancel whose removal failed): remove it all the same
        removed = sweep.delete_run(aws.ec2, run_id, settings.keys_dir, log=log, iam=aws.client("iam"),
                                   autoscaling=aws.client("autoscaling"), ssm=aws.client("ssm"), user=store(aws)[2])
        return {**status(aws, settings, run_id, log), "removed": {k: v for k, v in removed.items() if v},
                "waited_s": 0.0}
    s3, bucket, user = store(aws)
    runstore_records.put_cancel(s3, bucket, user, run_id)
    log(f"asked the agent of {run_id} to stop the job and save its outputs "
        f"(s3://{bucket}/{runstore.prefix(user, run_id)})")
    start, got = clock(), first
    while clock() - start < wait_s and first.get("group") and first["group"]["instances"]:
        got = runstore_records.get_status(s3, bucket, user, run_id) or got
        if got.get("state") in DONE:
            break
        sleep(poll_s)
    waited = round(clock() - start, 1)
    if got.get("state") not in DONE:
        log(f"the agent did not answer in {waited:.0f} s: ending the group without it")
        runstore_records.end_status(s3, bucket, user, run_id, "cancelled", "cancelled: the group was ended by `ec2gpu cancel`",
                            _now())
    removed = sweep.delete_run(aws.ec2, run_id, settings.keys_dir, log=log, iam=aws.client("iam"),
                               autoscaling=aws.client("autoscaling"),
                               ssm=aws.client("ssm"), user=user)  # the group first: none replaces anything
    return {**status(aws, settings, run_id, log), "removed": {k: v for k, v in removed.items() if v},
            "waited_s": waited}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()
