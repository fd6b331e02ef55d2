"""What a detached run cost (issue 30), from any machine: the times its agent recorded in
its record (state.json) and the prices that applied, as docs/cost-model.md bills every run.

Each launch of the run (the record's ``instances``, read by aws/runstore_records.launches: one per
instance that started the agent) is billed as every run's instance is, by runs/plan/costs (the one
costs module; this module finds the times, types and prices, and bills nothing itself): per second
with a 60-second minimum (``spot_bill``, ``on_demand_bill``), plus its public IPv4 address and its
root volume (``address_and_disk_usd``). Its times:

- **the instance's own**, while DescribeInstances still lists it: from its ``LaunchTime``
  (``Instance.launched_at``) to the time in its StateTransitionReason (``Instance.transitioned_at``,
  its termination), or to now while it runs. They win: the agent starts after the boot and
  writes its last heartbeat before the instance ends;
- else **as the run's settled.json kept them** (``settle``: written by the first reader that saw
  the run over with every instance listed as terminated; read as hostile input);
- else **the agent's**: ``started_at`` to ``last_seen_at`` (its last heartbeat). EC2 forgets a
  terminated instance after about an hour, so a run listed later is billed so; those seconds miss
  the boot before the agent started and the end after its last heartbeat (a lower bound on the
  time: said per instance, ``times_source`` "agent").

Its instance type, market and zone (the agent does not record them):

- from DescribeInstances while the instance is listed (exact);
- else from the run's Auto Scaling group while it exists: the launch template overrides (one type:
  exact; several: the dearest's on-demand price, an upper bound) and its InstancesDistribution
  (spot when no on-demand capacity is asked for);
- else from this machine's ledger row of the run (written by `run --detach` here: its first
  instance type and market); the group may have chosen another type of its list;
- else unknown: that launch's cost is None, and said.

Why these and not another record: a finished run's group and launch template are removed by the
first `ec2gpu status` that sees it over (runs/detached/follow.py), and nothing in S3 names the type
(spec.json has the market only), so past an hour only the ledger of the machine that started the
run knows it.

Prices: on-demand from the catalog (the Price List cache, else the shipped table); spot from the
zone's spot price history over the instance's time (runs/plan/costs.spot_bill: each second at
the price then in effect); a spot instance whose zone or history is unknown is billed at the
on-demand price, spot's ceiling (an upper bound, said).

``cost`` is pure (tested without AWS); ``gather`` fetches what it needs (DescribeInstances by the
run's tag, the groups, spot price history) for several runs at once.
"""
from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ... import words
from ...aws import catalog, groups, pricing, runstore, runstore_objects, runstore_records, sweep
from ...aws.instances import Instance
from ...errors import AwsError, UsageError
from ...wire import run_record
from ..plan import costs as plan
from ..settle import ledger

if TYPE_CHECKING:
    from ...aws.session import Aws

#: where an instance's times came from (``times_source``)
INSTANCE_TIMES = "instance"  # DescribeInstances: LaunchTime to the StateTransitionReason time (or now)
AGENT_TIMES = "agent"  # the run's record (state.json): started_at to last_seen_at


@dataclass(frozen=True)
class Facts:
    """What is known of one launch's instance besides the agent's record: its ``type``, ``market``
    ("spot" | "on-demand"), ``zone`` (or None), and where they came from (``source``); ``types``:
    the candidate types when the type is not known exactly (the group's overrides: the dearest is
    billed, an upper bound)."""

    type: str | None
    market: str | None
    zone: str | None
    source: str
    types: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prices:
    """The prices ``cost`` bills at (all fetched before: ``cost`` is pure).

    ``on_demand``: instance type -> (USD/h or None when unknown, where it came from);
    ``spot``: (instance type, zone) -> [(time, USD/h)] sorted by time (spot price history over the
    instances' times, runs/plan/costs.price_at's shape); ``gp3_usd_per_gb_month``: the region's gp3
    price (None: unknown, the volume counts 0); ``volume_gib``: each instance's root volume (GiB);
    ``now``: the end of an instance still running (UTC)."""

    on_demand: dict[str, tuple[float | None, str]]
    spot: dict[tuple[str, str], list[tuple[datetime, float]]] = field(default_factory=dict)
    gp3_usd_per_gb_month: float | None = None
    volume_gib: float | None = None
    now: datetime | None = None


def _t(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def span(launch: dict[str, Any], instance: Instance | None, now: datetime | None) -> dict[str, Any]:
    """One launch's billed span (pure): {"from", "to": datetime, "times_source": INSTANCE_TIMES |
    AGENT_TIMES, "running": bool (no end yet: billed to ``now``)}. The instance's own times when
    DescribeInstances listed it (``instance``): LaunchTime to its termination time, or to ``now``
    while it is not shut down; else the agent's ``started_at`` to ``last_seen_at`` (its start when
    it has none)."""
    if instance is not None:
        ended = instance.state in ("shutting-down", "terminated", "stopping", "stopped")
        if instance.transitioned_at is not None and ended:
            return {"from": instance.launched_at, "to": instance.transitioned_at, "times_source": INSTANCE_TIMES,
                    "running": False}
        if not ended and now is not None:
            return {"from": instance.launched_at, "to": max(now, instance.launched_at),
                    "times_source": INSTANCE_TIMES, "running": True}
    start = _t(launch["started_at"])
    end = _t(launch["last_seen_at"]) if launch.get("last_seen_at") else start
    return {"from": start, "to": max(start, end), "times_source": AGENT_TIMES, "running": False}


def one(launch: dict[str, Any], instance: Instance | None, facts: Facts | None, prices: Prices) -> dict[str, Any]:
    """The bill of one launch (pure): its span (``span``), its type and market (``instance``'s,
    else ``facts``'), and its compute at ``prices`` plus its address and volume.

    Returns {"launch", "instance_id", "in_status" (False: an instance of the run that its record
    does not hold, ``unrecorded``), "instance_type", "market", "zone", "type_source", "from",
    "to" (ISO text), "times_source", "running", "billed_seconds" (s, 60 s minimum), "usd_per_hour"
    (the mean compute price, or None), "compute_usd", "public_ipv4_usd", "ebs_usd", "cost_usd"
    (USD; cost_usd None when no compute price is known), "price_source", "upper_bound" (a ceiling
    price was used), "unknown" (why the cost is None, or None)}."""
    if instance is not None:
        facts = Facts(instance.type, instance.market, instance.zone,
                      "DescribeInstances" if SETTLED_TAG not in instance.tags
                      else "DescribeInstances at the run's end, kept in its settled.json")
    s = span(launch, instance, prices.now)
    seconds = plan.billed_seconds(s["from"], s["to"])
    row: dict[str, Any] = {
        "launch": launch.get("launch"), "instance_id": launch["instance_id"], "in_status": launch.get("in_status", True),
        "instance_type": facts.type if facts else None, "market": facts.market if facts else None,
        "zone": facts.zone if facts else None, "type_source": facts.source if facts else None,
        "from": s["from"].isoformat(), "to": s["to"].isoformat(), "times_source": s["times_source"],
        "running": s["running"], "billed_seconds": round(seconds, 1), "usd_per_hour": None, "compute_usd": None,
        "price_source": None, "upper_bound": False, "unknown": None}
    row.update(_compute(s["from"], s["to"], facts, prices))
    alive_s = (s["to"] - s["from"]).total_seconds()  # running and alive alike: the span is all that is known
    row.update(plan.address_and_disk_usd(alive_s, alive_s, prices.volume_gib, prices.gp3_usd_per_gb_month))
    return plan.with_total(row)


def _compute(start: datetime, end: datetime, facts: Facts | None, prices: Prices) -> dict[str, Any]:
    """{"usd_per_hour", "compute_usd", "price_source", "upper_bound", "unknown"} of one span, billed
    by runs/plan/costs' rules (``spot_bill``, ``on_demand_bill``), as every run is."""
    if facts is None or (facts.type is None and not facts.types):
        return {"unknown": "its instance type is not known (DescribeInstances no longer lists it, its group is "
                           "gone and this machine's ledger has no row of the run)"}
    if facts.type is None:  # candidate types: the dearest on-demand price bounds every one of them
        priced = [(p, t, src) for t in facts.types for p, src in [prices.on_demand.get(t, (None, "no price"))]
                  if p is not None]
        if len(priced) < len(facts.types):
            return {"unknown": f"no on-demand price for every type of the group ({', '.join(facts.types)})"}
        dearest, itype, src = max(priced)
        return {**plan.on_demand_bill(dearest, f"on-demand price of {itype}, the dearest of the group's types "
                                               f"({src}): an upper bound", start, end), "upper_bound": True}
    history = prices.spot.get((facts.type, facts.zone or "")) if facts.market == "spot" else None
    if history:
        return plan.spot_bill(history, facts.zone, start, end)
    usd_h, src = prices.on_demand.get(facts.type, (None, "no price"))
    if usd_h is None:
        return {"unknown": f"no on-demand price for {facts.type} ({src})"}
    ceiling = facts.market != "on-demand"  # spot with no zone or no history; or a market not known
    return {**plan.on_demand_bill(usd_h, f"on-demand {src}" + (": spot's ceiling, an upper bound (no spot price "
                                                              "history of its zone)" if ceiling else ""), start, end),
            "upper_bound": ceiling}


def cost(launches: list[dict[str, Any]], prices: Prices, instances: dict[str, Instance] | None = None,
         facts: Facts | None = None) -> dict[str, Any]:
    """The cost of a detached run (pure): each of ``launches`` (aws/runstore_records.launches' shape:
    launch, instance_id, started_at, last_seen_at) billed by ``one`` at ``prices``, with the
    instance's own times and type where ``instances`` (instance id -> DescribeInstances' Instance)
    has it, else the agent's times and ``facts`` (the group's or this machine's ledger's type and
    market).

    Returns {"billed_seconds" (s, the sum), "cost_usd" (USD, the sum; None when one launch's is
    unknown), "compute_usd", "public_ipv4_usd", "ebs_usd", "per_instance": [``one``'s dicts],
    "price_source" (the distinct sources, "; "-joined), "times_source" ({INSTANCE_TIMES: n,
    AGENT_TIMES: n}), "upper_bound" (a ceiling price was used for one launch at least), "running"
    (one still runs: a cost so far), "unknown" ([why, one per launch not priced])}. No launch: all
    zero, cost 0.0."""
    rows = [one(launch, (instances or {}).get(launch["instance_id"]), facts, prices) for launch in launches]
    unknown = [f"{r['instance_id']}: {r['unknown']}" for r in rows if r["unknown"]]

    def total(key: str) -> float | None:
        values = [r[key] for r in rows]
        return None if any(v is None for v in values) else round(sum(values), 6)
    return {"billed_seconds": round(sum(r["billed_seconds"] for r in rows), 1),
            "cost_usd": None if unknown else round(sum(r["cost_usd"] for r in rows), 6),
            "compute_usd": None if unknown else total("compute_usd"),
            "public_ipv4_usd": total("public_ipv4_usd"), "ebs_usd": total("ebs_usd"),
            "per_instance": rows,
            "price_source": "; ".join(dict.fromkeys(r["price_source"] for r in rows if r["price_source"])) or None,
            "times_source": {k: sum(1 for r in rows if r["times_source"] == k) for k in (INSTANCE_TIMES, AGENT_TIMES)},
            "upper_bound": any(r["upper_bound"] for r in rows), "running": any(r["running"] for r in rows),
            "unknown": unknown}


# --- what cost needs, fetched (several runs at once) ------------------------------------------------

#: every state DescribeInstances lists (a terminated instance for about an hour)
ALL_STATES = ["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]


def unrecorded(launches: list[dict[str, Any]], listed: list[Instance]) -> list[dict[str, Any]]:
    """Launches for the run's instances that DescribeInstances lists (``listed``, by the run's tag)
    but its record does not hold (an agent that never wrote, or a record written over): billed
    from their own times like any other, with "in_status" False (pure)."""
    known = {launch["instance_id"] for launch in launches}
    return [{"launch": None, "instance_id": i.id, "started_at": i.launched_at.isoformat(), "last_seen_at": None,
             "in_status": False} for i in listed if i.id not in known]


def own_launches(launches: list[dict[str, Any]], run_id: str, listed: dict[str, Instance]
                 ) -> tuple[list[dict[str, Any]], list[str]]:
    """(the launches billed to run ``run_id``, the instance ids refused) (pure): the record is
    written by the run's own instances, whose job can write anything there, so a launch naming an
    instance that DescribeInstances lists (``listed``: ec2gpu's instances, found by their ec2gpu:run
    tag) under another run's tag is not this run's: billing it here would bill it twice (issue
    44.7). A launch EC2 does not list (forgotten, about an hour after it ended) is kept here: settle
    refuses it for a run whose settled.json lacks it, and otherwise it is billed by the agent's
    times, whoever's instance it was."""
    kept, refused = [], []
    for launch in launches:
        inst = listed.get(launch["instance_id"])
        if inst is not None and SETTLED_TAG not in inst.tags and inst.run_id != run_id:
            refused.append(launch["instance_id"])
        else:
            kept.append(launch)
    return kept, refused


def group_facts(group: dict[str, Any]) -> Facts | None:
    """The type(s) and market of a run's Auto Scaling group (a DescribeAutoScalingGroups entry:
    aws/runstore_records.group_launches reads its launch template overrides and InstancesDistribution): one
    type, that type; several, candidates (the dearest is billed). None when it names no type (pure)."""
    types, market = runstore_records.group_launches(group)
    if not types:
        return None
    return Facts(types[0] if len(types) == 1 else None, market, None,
                 f"the run's Auto Scaling group ({words.count(len(types), 'type')})", types if len(types) > 1 else ())


def ledger_facts(row: dict[str, Any] | None) -> Facts | None:
    """The type and market this machine's ledger row of the run holds (`run --detach` wrote it
    here: the first of the run's types), or None (pure)."""
    if not row or not row.get("instance_type"):
        return None
    market = row.get("market") if row.get("market") in ("spot", "on-demand") else None
    return Facts(str(row["instance_type"]), market, None, "this machine's ledger (the run's first type)")


def gather(aws: Aws, home: Path, runs: dict[str, list[dict[str, Any]]], rows: dict[str, dict[str, Any]],
           volume_gib: float | None, now: datetime | None = None, store: tuple[Any, str, str] | None = None,
           final: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """The cost (``cost``) of each run of ``runs`` (run id -> its launches, aws/runstore_records.launches),
    from one DescribeInstances of ec2gpu's instances in every state (by the ec2gpu:run tag), one
    DescribeAutoScalingGroups of ec2gpu's groups, this machine's ledger ``rows`` (run id -> row),
    and the prices: on-demand from the catalog, spot price history per type and zone over the
    instances' times (one DescribeSpotPriceHistory each), gp3 from the catalog; ``volume_gib``: each
    instance's root volume (GiB; this machine's setting, as `run --detach` sends it). With ``store``
    (the run store's S3 client, bucket and the caller's user id, whose prefix holds the runs): an
    instance EC2 no longer lists is taken from its run's settled.json (aws/runstore_records.get_settled),
    and a run of ``final`` (run ids whose state is final) whose every instance EC2 lists as
    terminated gets its settled.json written (``settle``). Launches naming another run's instance
    (``own_launches``; a final run's that neither EC2 nor its settled.json names: ``settle``) are
    left out and named in the dict's "not_this_runs". Returns run id ->
    ``cost``'s dict. Raises AwsError, botocore's errors as AWS answers."""
    if not runs:
        return {}
    now = now or datetime.now(timezone.utc)
    everything = sweep.find_instances(aws.ec2, None, states=ALL_STATES)  # every ec2gpu instance, by its tag
    owned = {r: own_launches(launches, r, {i.id: i for i in everything}) for r, launches in runs.items()}
    runs = {r: kept for r, (kept, _) in owned.items()}
    listed = [i for i in everything if i.run_id in runs]
    by_id = {i.id: i for i in listed}
    strangers: dict[str, list[str]] = {}
    if store is not None:
        by_id.update(settle(store, runs, by_id, final, strangers))
        runs = {r: [la for la in launches if la["instance_id"] not in strangers.get(r, ())] for r, launches in runs.items()}
    runs = {r: launches + unrecorded(launches, [i for i in listed if i.run_id == r]) for r, launches in runs.items()}
    found = {str((g.get("AutoScalingGroupName") or "")).removeprefix(groups.PREFIX): g
             for g in groups.find_groups(aws.client("autoscaling"))}
    facts = {r: group_facts(found[r]) if r in found else None for r in runs}
    facts = {r: f or ledger_facts(rows.get(r)) for r, f in facts.items()}
    spans: dict[tuple[str, str], list[datetime]] = {}
    types: set[str] = set()
    for run_id, launches in runs.items():
        for launch in launches:
            inst, f = by_id.get(launch["instance_id"]), facts[run_id]
            fact = Facts(inst.type, inst.market, inst.zone, "") if inst else f
            if fact is None:
                continue
            types.update(fact.types or ([fact.type] if fact.type else []))
            if fact.market == "spot" and fact.type and fact.zone:
                s = span(launch, inst, now)
                spans.setdefault((fact.type, fact.zone), []).extend([s["from"], s["to"]])
    spot = {key: pricing.spot_price_history(aws.ec2, key[0], key[1], min(ts), max(ts)) for key, ts in spans.items()}
    on_demand = {t: _on_demand(t, aws.region, home) for t in sorted(types)}
    gp3 = catalog.ebs_price("gp3", aws.region, home).usd_per_gb_month
    prices = Prices(on_demand, spot, gp3, volume_gib, now)
    return {run_id: {**cost(launches, prices, by_id, facts[run_id]),
                     "not_this_runs": owned[run_id][1] + strangers.get(run_id, [])} for run_id, launches in runs.items()}


#: the tag an Instance made from settled.json carries (``one`` names its facts' source by it)
SETTLED_TAG = "ec2gpu:settled"


def settle(store: tuple[Any, str, str], runs: dict[str, list[dict[str, Any]]], listed: dict[str, Instance],
           final: Collection[str], strangers: dict[str, list[str]] | None = None) -> dict[str, Instance]:
    """The instances of ``runs`` (run id -> launches) that EC2 no longer lists (not in ``listed``),
    from each such run's settled.json, as terminated Instances tagged SETTLED_TAG; and for each run
    of ``final`` whose every launch EC2 lists as terminated with its time, its settled.json written
    (what EC2 says, to be read once it forgets them). A write S3 refuses is skipped (the next
    reader tries again); a settled.json S3 will not read counts as none. ``strangers`` (run id ->
    instance ids), when given, gets the launches of a run of ``final`` that EC2 no longer lists and
    its settled.json, which held every launch of the run at its end, does not name: another run's
    instance its record named after, not billed here."""
    s3, bucket, user = store
    found: dict[str, Instance] = {}
    for run_id, launches in runs.items():
        ids = [launch["instance_id"] for launch in launches]
        missing = {i for i in ids if i not in listed}
        if missing:
            try:
                kept = runstore_records.get_settled(s3, bucket, user, run_id)
            except AwsError:  # that object refused (the run's role could write it): this run's agent times
                kept = []
            if strangers is not None and run_id in final and kept:
                named = {row["instance_id"] for row in kept}
                strangers[run_id] = [i for i in ids if i in missing and i not in named]
            for row in kept:
                if row["instance_id"] in missing:
                    found[row["instance_id"]] = Instance(
                        id=row["instance_id"], type=row["instance_type"], state="terminated",
                        launched_at=_t(row["launched_at"]), market=row["market"], zone=row["zone"],
                        transitioned_at=_t(row["terminated_at"]), tags={SETTLED_TAG: runstore_records.SETTLED})
        elif ids and run_id in final and all(listed[i].state == "terminated" and listed[i].transitioned_at
                                             for i in ids):
            rows = [{"instance_id": i, "instance_type": listed[i].type, "market": listed[i].market,
                     "zone": listed[i].zone, "launched_at": listed[i].launched_at.isoformat(),
                     "terminated_at": cast(datetime, listed[i].transitioned_at).isoformat()} for i in ids]
            try:
                runstore_records.put_settled(s3, bucket, user, run_id, rows)
            except AwsError:
                pass
    return found


def _on_demand(itype: str, region: str, home: Path) -> tuple[float | None, str]:
    """(USD/h, source) of ``itype`` on-demand in ``region`` (aws/catalog.on_demand_price); (None,
    why) for a type ec2gpu's catalog does not know."""
    try:
        p = catalog.on_demand_price(itype, region, home)
    except UsageError:
        return None, f"{itype} is not in ec2gpu's catalog"
    return p.usd_per_hour, p.source


# --- `ec2gpu runs --remote` ---------------------------------------------------------------------------

#: record reads at once (GetObject; boto3's clients are thread-safe, its sessions are not)
WORKERS = 8


def remote_runs(aws: Aws, home: Path, volume_gib: float | None, limit: int, since: datetime | None = None,
                workers: int = WORKERS) -> dict[str, Any]:
    """The caller's detached runs in the region's run store (aws/runstore_records.list_runs: those under
    the caller's own prefix ``runs/USER_ID/``), newest first, at most
    ``limit`` of them (started since ``since``, by the UTC time in the run id), each with its
    record (wire/run_record.view) and its cost (``gather``), and whether this machine's
    ledger ($EC2GPU_HOME/ledger.sqlite, read once; an unreadable one counts as holding none) has it.
    The status objects are read by ``workers`` threads (1: one after the other); one that cannot be
    read (AwsError) gives its run state "unknown" and the error as its "problem".

    Returns {"bucket", "region", "in_store": runs in the store, "runs": [run_record.view's fields
    (state, attempt, restarts, interruptions, launches, instance_id, started_at, updated_at,
    ended_at, message, problem...) + "billed_seconds" (s), "cost_usd" (USD or None), "upper_bound",
    "cost" (``cost``'s whole dict), "in_ledger" (bool), "ledger_status" (its row's status or None)]}.
    Raises AwsError (S3, EC2, Auto Scaling), NoCredentials."""
    s3, bucket, user = runstore.store(aws)
    ids = runstore_records.list_runs(s3, bucket, user)
    picked = [r for r in reversed(ids) if since is None or _started(r) >= since][:max(0, limit)]

    failed: dict[str, str] = {}

    def read(run_id: str) -> tuple[str, bytes | None]:
        try:
            return run_id, runstore_records.get_status_bytes(s3, bucket, user, run_id)
        except AwsError as exc:  # one run's object (403 on it, say): that run says so, the rest are listed
            failed[run_id] = exc.message
            return run_id, None
    if workers > 1 and len(picked) > 1:
        with ThreadPoolExecutor(max_workers=min(workers, len(picked))) as pool:
            got = dict(pool.map(read, picked))
    else:
        got = dict(map(read, picked))
    rows = {r["run_id"]: r for r in ledger.runs(home, tolerant=True)}
    records = {r: None if data is None else run_record.view(data, r) for r, data in got.items()}
    launches = {r: [] if data is None else runstore_records.launches(data, r) for r, data in got.items()}
    final = {r for r, rec in records.items() if rec is not None and rec["state"] in run_record.FINAL_STATES}
    costs = gather(aws, home, launches, rows, volume_gib, store=(s3, bucket, user), final=final)
    out = []
    for r in picked:
        rec = records[r] or {**run_record.unreadable(r, failed.get(r) or _no_status(s3, bucket, user, r)),
                             "state": "unknown"}
        c = costs[r]
        out.append({**rec, "billed_seconds": c["billed_seconds"], "cost_usd": c["cost_usd"],
                    "upper_bound": c["upper_bound"], "cost": c, "in_ledger": r in rows,
                    "ledger_status": (rows.get(r) or {}).get("status")})
    return {"bucket": bucket, "region": aws.region, "in_store": len(ids), "runs": out}


def _no_status(s3: Any, bucket: str, user: str, run_id: str) -> str:
    """Why a run in the store has no record (state.json): a run in the foreground whose instance handed its
    outputs over (runs/recover/handover.py), or a launch that did not get that far (or expired)."""
    try:
        handed = runstore_objects.read_head(s3, bucket, runstore.handover_keys(user, run_id)["record"], 1) is not None
    except AwsError:
        handed = False
    return ("a run in the foreground whose controller was lost: its instance handed its outputs over "
            "(`ec2gpu fetch RUN`)") if handed else "no state.json (its launch did not get that far, or it expired)"


def _started(run_id: str) -> datetime:
    """The UTC start in a run id (YYYYmmdd-HHMMSS-xxxx, runs/provision/pipeline.new_run_id)."""
    return datetime.strptime(run_id[:15], "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc)
