"""An instance's running intervals across stops and starts, and what they cost.

EC2 bills compute per second while an instance runs, with a 60-second minimum each time it starts
("Each time you start a stopped instance, we charge a minimum of one minute for usage":
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html), and sets its
LaunchTime again at every start (DescribeInstances, ``LaunchTime``: "The time that the instance
was last launched"), so its own description shows its last running interval only: from
LaunchTime to now, or to the stop or termination its StateTransitionReason dates.

A standing instance (`launch`, `notebook`, a node `scale` adds) therefore keeps every interval in
its ledger row (the attempt's ``intervals``), each {"launch": its LaunchTime, "from": billing
start, "to": end, None while it runs}. ``observe`` records what a description shows; `launch`
opens the first interval, and every command that sees the instance (`ls`, `runs`, `stop`, `start`,
`down`, `cleanup`) calls it, so a stop is dated by EC2's own record of it whoever stopped it (an
--idle-stop, the console). Only a stop followed by a start that no ec2gpu command saw in between
loses its date: that interval is then closed at the next LaunchTime, an upper bound (said in the
interval as ``"to_source": "next start"``).
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import costs

if TYPE_CHECKING:
    from pathlib import Path

    from ...aws.instances import Instance
    from ...aws.session import Aws

#: states in which the interval of the instance's LaunchTime has ended (stopping and shutting-down
#: are not billed: ec2-instance-lifecycle.html above)
ENDED_STATES = ("stopping", "stopped", "shutting-down", "terminated")


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def observe(intervals: list[dict[str, Any]], instance: Instance, now: datetime,
            billing_start: datetime | None = None) -> list[dict[str, Any]]:
    """``intervals`` brought up to date with ``instance``, a DescribeInstances entry (pure; a new
    list). The interval of its LaunchTime is opened if new (from ``billing_start``, else its
    LaunchTime) and, in a stopping, stopped, shutting-down or terminated instance, closed at its
    StateTransitionReason time (``now`` when it has none); an interval already closed keeps its
    end (an instance terminated while stopped stopped paying for compute at the stop). An older
    interval still open is closed at this LaunchTime (module docstring)."""
    launch = instance.launched_at
    key = launch.isoformat()
    out = [dict(i) for i in intervals]
    for i in out:
        if i["launch"] != key and i["to"] is None and _at(i["launch"]) < launch:
            i.update(to=key, to_source="next start")
    mine = next((i for i in out if i["launch"] == key), None)
    if mine is None:
        start = max(billing_start, launch) if billing_start else launch
        mine = {"launch": key, "from": start.isoformat(), "to": None}
        out.append(mine)
    if instance.state in ENDED_STATES and mine["to"] is None:
        mine["to"] = (instance.transitioned_at or now).isoformat()
    return out


def spans(intervals: list[dict[str, Any]], now: datetime) -> list[tuple[datetime, datetime]]:
    """(from, to) of each interval, an open one ending ``now`` (pure)."""
    return [(_at(i["from"]), max(_at(i["from"]), _at(i["to"]) if i["to"] else now)) for i in intervals]


def running_seconds(intervals: list[dict[str, Any]], now: datetime) -> float:
    """Seconds the instance has run over all its intervals (pure)."""
    return sum((b - a).total_seconds() for a, b in spans(intervals, now))


def so_far(intervals: list[dict[str, Any]], now: datetime, usd_per_hour: float | None, region: str, home: Path,
           volume_gib: float | None, first_launch: datetime) -> dict[str, Any]:
    """What an instance has cost so far at ``usd_per_hour`` (on-demand compute): each interval
    billed with its 60 s minimum, its public IPv4 address while running and its root volume since
    ``first_launch`` (costs.address_and_disk). Returns {"running_seconds", "billed_seconds",
    "compute_usd" (None without a price), "public_ipv4_usd", "ebs_usd", "cost_usd", ...}."""
    each = spans(intervals, now)
    billed = sum(costs.billed_seconds(a, b) for a, b in each)
    row: dict[str, Any] = {"running_seconds": round(running_seconds(intervals, now), 1), "billed_seconds": round(billed, 1),
           "compute_usd": None if usd_per_hour is None else round(costs.cost_usd(billed, usd_per_hour), 6)}
    row.update(costs.address_and_disk(region, home, row["running_seconds"], (now - first_launch).total_seconds(),
                                      volume_gib))
    return costs.with_total(row)


def bill(aws: Aws, home: Path, attempt: dict[str, Any], instance: Instance, now: datetime) -> dict[str, Any]:
    """The bill of a standing instance that has terminated (``instance``, its description), over
    the intervals ``attempt`` recorded: each interval's compute (costs.compute_cost, 60 s minimum
    each), its public IPv4 address while it ran, its root volume from its first launch to its
    termination. Returns the attempt's ledger columns, as costs.actual_cost does, with the
    intervals."""
    ivs = observe(attempt.get("intervals") or [], instance, now)
    each = spans(ivs, now)
    parts = [costs.compute_cost(aws, home, instance, a, b) for a, b in each]
    first = _at(attempt.get("launched_at") or ivs[0]["launch"])
    ended = instance.transitioned_at or max(b for _, b in each)
    source = parts[0]["price_source"] + (f"; {len(parts)} running intervals" if len(parts) > 1 else "")
    row = {"intervals": ivs, "launched_at": first.isoformat(), "billing_started_at": ivs[0]["from"],
           "terminated_at": ended.isoformat(),
           "billed_seconds": round(sum(costs.billed_seconds(a, b) for a, b in each), 1),
           "usd_per_hour": parts[0]["usd_per_hour"], "price_source": source,
           "compute_usd": None if any(p["compute_usd"] is None for p in parts) else
           round(sum(p["compute_usd"] for p in parts), 6)}
    row.update(costs.address_and_disk(aws.region, home, running_seconds(ivs, now), (ended - first).total_seconds(),
                                      attempt.get("volume_gib")))
    return costs.with_total(row)
