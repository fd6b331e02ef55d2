"""What a run costs: the estimate before it, and the bill after it.

Billing rules (https://aws.amazon.com/ec2/pricing/, "Per Second Billing"): Linux instances,
on-demand and spot, are billed per second with a minimum of 60 seconds. A spot instance pays the
spot price in effect in its availability zone for each second, so a price change during a run
splits the bill at the change. docs/cost-model.md explains the estimate and its defaults.
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from ... import words
from ...aws import catalog
from ...aws.catalog import BILLING_MINIMUM_SECONDS
from ...errors import UsageError
from ...train.presets import PRESETS
from ..job_summary import bench_figures, figure
from ..options import PoolOptions, RunOptions, TrainOptions
from ..settle import ledger
from .checks import slots_per_node
from .limits import Limit

if TYPE_CHECKING:
    from ...aws.catalog import Price
    from ...aws.instances import Instance
    from ...aws.session import Aws
    from ..job import TaskJob

#: Phase seconds assumed when the ledger has no earlier run of the same instance type and backend.
#: Assumptions, not measurements: boot = requesting + pending -> running + first SSH login of a
#: Deep Learning AMI (AWS quotes "a few minutes"); setup = ec2gpu/ami/setup-gpu.sh checks on a DLAMI that
#: already has the driver, CUDA and PyTorch; teardown = download + terminate waiter.
DEFAULT_PHASE_SECONDS = {"boot": 150.0, "setup": 45.0, "teardown": 75.0}

#: Seconds of one epoch of each model on a T4 (g4dn), and seconds of trainer start-up (import
#: torch, CUDA init, MNIST download + md5). Assumptions scaled from the public one-epoch recipe
#: (0.76 s on a GTX 1660 Ti, a T4-class GPU), not measured by this project; replaced by the
#: ledger's measurements after the first run of a model on a GPU model.
DEFAULT_EPOCH_SECONDS_T4 = {"cnn": 2.0, "lenet": 2.5, "mlp": 1.5, "dbn": 1.5}
DEFAULT_TRAINER_STARTUP_SECONDS = 30.0
TRAIN_IMAGES = 60_000  # MNIST's training set: one epoch (http://yann.lecun.com/exdb/mnist/)

#: Relative training speed of each GPU model to a T4 for these small models (assumed, from the
#: GPUs' published FP16/BF16 tensor throughput, capped because MNIST-sized steps are launch-bound).
GPU_SPEEDUP = {"T4": 1.0, "A10G": 2.0, "L4": 1.8, "V100": 2.0, "A100": 3.0, "H100": 4.0}


def billed_seconds(launched_at: datetime, ended_at: datetime) -> float:
    """Seconds billed for one instance: (ended - launched), at least 60 s."""
    return max(float(BILLING_MINIMUM_SECONDS), (ended_at - launched_at).total_seconds())


def cost_usd(seconds: float, usd_per_hour: float) -> float:
    """USD for ``seconds`` billed at ``usd_per_hour`` (seconds already include the minimum)."""
    return seconds * usd_per_hour / 3600.0


def price_at(history: list[tuple[datetime, float]], when: datetime) -> float:
    """The spot price (USD/h) in effect at ``when``: the newest entry at or before it.

    ``history`` is [(timestamp, USD/h)] sorted by time. Before the first entry, the first applies.
    Raises ValueError for an empty history.
    """
    if not history:
        raise ValueError("no spot price history")
    current = history[0][1]
    for ts, price in history:
        if ts > when:
            break
        current = price
    return current


def spot_cost_usd(history: list[tuple[datetime, float]], launched_at: datetime, ended_at: datetime) -> float:
    """USD for a spot instance alive from ``launched_at`` to ``ended_at``, following price changes.

    Each second pays the price in effect then; a run shorter than 60 s pays 60 s at its launch price
    (the minimum). ``history`` as for ``price_at``. Raises ValueError for an empty history.
    """
    seconds = (ended_at - launched_at).total_seconds()
    if seconds < BILLING_MINIMUM_SECONDS:
        return cost_usd(BILLING_MINIMUM_SECONDS, price_at(history, launched_at))
    cuts = [launched_at] + [ts for ts, _ in history if launched_at < ts < ended_at] + [ended_at]
    return sum(cost_usd((b - a).total_seconds(), price_at(history, a)) for a, b in itertools.pairwise(cuts))


@dataclass
class Estimate:
    """The expected time (s) and cost (USD) of one run on one instance type."""

    instance_type: str
    market: str  # on-demand | spot
    usd_per_hour: float | None
    price_source: str
    boot_seconds: float
    setup_seconds: float
    train_seconds: float  # trainer start-up + epochs
    teardown_seconds: float
    time_source: str  # "ledger (N runs)" or "default (T4 x speedup)"
    billed_seconds: float = 0.0
    cost_usd: float | None = None
    upper_bound: bool = False  # the job's time is unknown: billed_seconds and cost_usd are at the run's limit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def estimate(instance_type: str, gpu: str, market: str, usd_per_hour: float | None, price_source: str,
             model: str, epochs: int, history: list[dict[str, Any]]) -> Estimate:
    """Estimate a run of ``model`` for ``epochs`` on ``instance_type`` (pure).

    ``history`` holds earlier runs of the same backend from the ledger, newest first, as dicts
    with ``instance_type``, ``gpu``, ``model``, ``phases`` {phase: s}, ``train_seconds`` and
    ``epochs``. Phase times come from runs of the same instance type, the epoch time from runs of
    the same model on the same GPU model, else from the samples/s `ec2gpu bench` measured on that
    type or GPU model (bench_speed); each falls back to the documented defaults above.
    """
    def job_s(r: dict[str, Any]) -> float | None:  # the job's phase: "running" (before the one engine: "training")
        phases = r.get("phases") or {}
        seconds: float | None = phases.get("running") or phases.get("training")
        return seconds

    def trained(r: dict[str, Any]) -> tuple[float, int] | None:
        # (train seconds, epochs) the trainer reported, when both are valid figures (job_summary.py)
        secs, epochs = figure("train_seconds", r.get("train_seconds")), figure("epochs", r.get("epochs"))
        return (secs, epochs) if secs and epochs else None
    same_gpu = [r for r in history if r.get("gpu") == gpu and r.get("model") == model and trained(r) and job_s(r)][:5]
    boot, setup, teardown, same_type = _phase_seconds(history, instance_type)
    measured = bench_speed(history, instance_type, gpu, model)
    if same_gpu:
        # same_gpu is not empty, and each of its runs has both figures: both medians are numbers
        got = [(tr, js) for tr, js in ((trained(r), job_s(r)) for r in same_gpu) if tr and js]
        epoch_s = cast(float, _median([t[0] / t[1] for t, _ in got]))
        startup = cast(float, _median([max(0.0, s - t[0]) for t, s in got]))
        source = f"ledger ({words.count(len(same_gpu), 'earlier run')} of {model} on {gpu})"
    elif measured:
        epoch_s = TRAIN_IMAGES / measured["samples_per_second"]
        startup = DEFAULT_TRAINER_STARTUP_SECONDS
        source = (f"measured: {measured['samples_per_second']:,.0f} samples/s for {model} on the "
                  f"{'GPU' if measured['device'] == 'cuda' else 'CPU'} of {measured['instance_type']} by bench "
                  f"{measured['run_id']}{' (quick sizes)' if measured['quick'] else ''}")
    else:
        speed = GPU_SPEEDUP.get(gpu, 1.0)
        epoch_s = DEFAULT_EPOCH_SECONDS_T4.get(model, 2.0) / speed
        startup = DEFAULT_TRAINER_STARTUP_SECONDS
        source = f"default for {gpu} (assumed, docs/cost-model.md)"
    if same_type and not same_gpu:
        source += f"; phases from ledger ({words.count(len(same_type), 'run')})"
    return _priced(Estimate(instance_type, market, usd_per_hour, price_source, round(boot, 1), round(setup, 1),
                            round(startup + epochs * epoch_s, 1), round(teardown, 1), source))


def bench_speed(history: list[dict[str, Any]], instance_type: str, gpu: str, model: str) -> dict[str, Any] | None:
    """The samples/s `ec2gpu bench` measured for ``model`` on ``instance_type`` (else on another
    type with the same GPU model), on its best device (pure). ``history``: the ledger's completed
    runs, newest first; bench runs are those with task "bench" whose summary passed the built-in
    bench's schema (summary_schema "bench"; on rows from before that column, None) and whose
    figures are within physical bounds (job_summary.bench_figures: a -1 or 1e12 samples/s never
    counts). A full-size bench is preferred to a --quick one. Returns {"samples_per_second",
    "device", "instance_type", "run_id", "quick"} or None."""
    found = []
    for r in history:
        if r.get("task") != "bench" or r.get("summary_schema") not in ("bench", None):
            continue  # a user's own task named "bench" is not the built-in bench
        s = bench_figures(r.get("summary"))
        row = s and s.models.get(model, {}).get(s.best_device)
        if not row or (r.get("instance_type") != instance_type and r.get("gpu") != gpu):
            continue
        assert s is not None  # a row comes from s
        found.append(((r.get("instance_type") != instance_type, s.quick),
                      {"samples_per_second": row.samples_per_second, "device": s.best_device,
                       "instance_type": r.get("instance_type"), "run_id": r.get("run_id"), "quick": s.quick}))
    return min(found, key=lambda f: f[0])[1] if found else None  # min keeps the newest of equals


#: the run phases an estimate counts as boot, setup and teardown; the rest is the job's (or a bake's)
PHASE_GROUPS = {"boot": ("requesting", "waiting for running", "waiting for SSH"),
                "setup": ("setup", "upload", "task setup", "Ray start"), "teardown": ("download", "terminating")}


def _phase_seconds(history: list[dict[str, Any]], instance_type: str) -> tuple[float, float, float, list[dict[str, Any]]]:
    """(boot, setup, teardown) seconds: medians of up to 5 earlier runs on ``instance_type``, else
    the defaults; and those runs (pure)."""
    same_type = [r for r in history if r.get("instance_type") == instance_type and r.get("phases")][:5]

    def phase(names: tuple[str, ...], key: str) -> float:
        got = _median([sum(r["phases"].get(n, 0.0) for n in names) for r in same_type])
        return DEFAULT_PHASE_SECONDS[key] if got is None else got

    return (phase(PHASE_GROUPS["boot"], "boot"), phase(PHASE_GROUPS["setup"], "setup"),
            phase(PHASE_GROUPS["teardown"], "teardown"), same_type)


def _priced(est: Estimate) -> Estimate:
    # billing starts at launch (part of "boot") and ends at termination (end of "teardown")
    est.billed_seconds = round(max(float(BILLING_MINIMUM_SECONDS), est.boot_seconds + est.setup_seconds
                                   + est.train_seconds + est.teardown_seconds), 1)
    if est.usd_per_hour is not None:
        est.cost_usd = round(cost_usd(est.billed_seconds, est.usd_per_hour), 4)
    return est


def estimate_job(aws: Aws | PriceTable, home: Path, instance_type: str, spot: bool, job_seconds: float, job_source: str,
                 backend: str, max_price: float | None = None) -> Estimate:
    """Estimate a user's task: its job runs ``job_seconds`` (said by ``job_source``); boot, setup
    and teardown from the ledger's runs on the same instance type, else the defaults."""
    itype = catalog.lookup(instance_type)
    price = hourly_price(aws, home, itype.name, spot, max_price)
    history = [r for r in ledger.runs(home, backend=backend, limit=50, tolerant=True) if r["status"] == "completed"]
    boot, setup, teardown, _ = _phase_seconds(history, itype.name)
    return _priced(Estimate(itype.name, "spot" if spot else "on-demand", price.usd_per_hour, price.source,
                            round(boot, 1), round(setup, 1), round(job_seconds, 1), round(teardown, 1), job_source))


@dataclass(frozen=True)
class PriceTable:
    """The prices a run's plan is made with, no AWS call: the region's on-demand list prices (the
    refreshed cache, else the shipped table). Stands in for aws/session.Aws where an estimate takes
    one (``hourly_price`` of an on-demand instance reads only its region); a spot price needs AWS."""

    region: str


def hourly_price(aws: Aws | PriceTable, home: Path, instance_type: str, spot: bool,
                 max_price: float | None = None) -> Price:
    """The USD/h a new instance of ``instance_type`` would pay now, as a ``catalog.Price``.

    On-demand: the refreshed Price List cache, else the shipped table. Spot: the highest current
    spot price over the region's availability zones (the launch may land in any of them), capped
    at ``max_price``; with no spot price known, the on-demand price (spot's ceiling). Raises
    UsageError when ``max_price`` is below the spot price in every zone (no launch could succeed),
    ValueError for a spot price asked of a PriceTable.
    """
    on_demand = catalog.on_demand_price(instance_type, aws.region, home)
    if not spot:
        return on_demand
    if isinstance(aws, PriceTable):
        raise ValueError("a spot price needs AWS (pricing.current_spot_prices), not the price table")
    # boto3 (aws/pricing -> aws/session): an on-demand price (a run's plan, a dry run) is the table's alone, and a
    # dry run imports no AWS SDK (tests/unit/test_dry_run.py::test_a_dry_run_imports_no_aws_sdk)
    from ...aws import pricing
    zones = pricing.current_spot_prices(aws.ec2, [instance_type]).get(instance_type, {})
    if not zones:
        return catalog.Price(on_demand.usd_per_hour, "no spot price found; on-demand price as the ceiling")
    worst, lowest = max(zones.values()), min(zones.values())
    if max_price is not None and max_price < lowest:
        raise UsageError(f"--max-price {max_price:.4f} USD/h is below the spot price of {instance_type} in every "
                         f"zone (lowest {lowest:.4f} USD/h now)", "raise --max-price, or see `ec2gpu prices`")
    if max_price is not None and max_price < worst:
        return catalog.Price(max_price, f"--max-price (current spot {lowest:.4f}-{worst:.4f} USD/h)")
    return catalog.Price(worst, f"spot now, highest of {words.count(len(zones), 'zone')}")


def estimate_run(aws: Aws | PriceTable, home: Path, instance_type: str, spot: bool, model: str, epochs: int | None,
                 backend: str, max_price: float | None = None) -> Estimate:
    """Estimate time and cost of one `train` run from current prices and the ledger's history."""
    itype = catalog.lookup(instance_type)
    price = hourly_price(aws, home, itype.name, spot, max_price)
    history = [r for r in ledger.runs(home, backend=backend, limit=50, tolerant=True) if r["status"] == "completed"]
    return estimate(itype.name, itype.gpu, "spot" if spot else "on-demand", price.usd_per_hour, price.source,
                    model, epochs or PRESETS[model].epochs, history)


def preset(opts: RunOptions) -> tuple[str, int | None]:
    """The built-in trainer's model and epochs (None: the preset's) as ``opts`` asks for them:
    TrainOptions' own, else the trainer's defaults (a built-in task run without its flags)."""
    if isinstance(opts, TrainOptions):
        return opts.model, opts.epochs
    return TrainOptions.model, None


def estimate_for(aws: Aws | PriceTable, home: Path, opts: RunOptions, backend: str) -> Estimate:
    """The estimate a run of ``opts`` is judged by (``refusal``): an image bake's from its plan, a
    user's task's from its job's time (estimate_minutes; an array's element_minutes, run in rounds
    over its pool), else the built-in trainer's (estimate_run); x the nodes. A job whose time
    nothing says gets ``at_most``. pipeline.check_estimate makes it with ``aws`` (a spot price is
    AWS's), the run's plan (runs/plan/runplan.py) with the PriceTable, before anything is opened.
    Raises UsageError as hourly_price and catalog.lookup do."""
    pool = opts if isinstance(opts, PoolOptions) else None
    first = opts.instance_types[0]
    if opts.bake is not None:
        est = estimate_job(aws, home, first, opts.spot, opts.bake.minutes * 60, opts.bake.minutes_source, backend,
                           opts.max_price)
    elif opts.task is not None and opts.task.builtin != "mnist":  # an array's: an element's time (from history)
        minutes, source = (element_minutes if pool else estimate_minutes)(home, opts.task, first, opts.expect_minutes,
                                                                           backend)
        if minutes is None:
            return at_most(aws, home, opts, backend, source)
        est = estimate_job(aws, home, first, opts.spot, minutes * 60, source, backend, opts.max_price)
    else:
        model, epochs = preset(opts)
        est = estimate_run(aws, home, first, opts.spot, model, epochs, backend, opts.max_price)
    if pool:  # the pool's instances run its elements in rounds (docs/pool.md, "What it costs")
        slots = slots_per_node(pool.instance_types, pool.gpus_per_job)
        est = in_rounds(est, *rounds_words(len(pool.elements), pool.nodes, slots))
    if opts.nodes > 1 and est.cost_usd is not None:  # N instances for the same time (docs/cost-model.md)
        est = replace(est, cost_usd=round(est.cost_usd * opts.nodes, 6))
    return est


def at_most(aws: Aws | PriceTable, home: Path, opts: RunOptions, backend: str, why: str) -> Estimate:
    """The estimate of a task whose job time nothing says (``why``: its first run on this type, no
    --expect): its price per hour, and as its cost the most it can cost at its limit
    (runs/plan/limits.py), all nodes (None: no limit, or no price); ``upper_bound`` set and
    ``time_source`` "unknown: WHY"."""
    est = estimate_job(aws, home, opts.instance_types[0], opts.spot, 0.0, why, backend, opts.max_price)
    limit_s = None if opts.max_runtime_minutes is None else opts.max_runtime_minutes * 60.0
    most = None if limit_s is None or est.usd_per_hour is None else round(
        cost_usd(limit_s, est.usd_per_hour) * opts.nodes, 4)
    return replace(est, time_source=f"unknown: {why}", upper_bound=True, billed_seconds=limit_s or 0.0, cost_usd=most)


def refusal(est: Estimate, opts: RunOptions, prices: Aws | PriceTable, priced: bool = True) -> UsageError | None:
    """Why a run of ``opts`` with the estimate ``est`` (``estimate_for``, made with ``prices``) is
    refused, or None (pure): its job alone would outlast its --max-runtime (the instance would end
    itself first); it is above its --budget, or its cost is unknown (no price for the region) or, for a job whose time
    nothing says, unbounded or above the budget at its limit. ``priced`` False: ``est``'s price is
    not the one the run pays (the plan's on-demand price for a spot run), so only what needs no
    price is judged."""
    budget, limit = opts.budget_usd, opts.max_runtime_minutes
    if est.upper_bound:
        if budget is None or (est.cost_usd is not None and est.cost_usd <= budget) or (limit is not None and not priced):
            return None
        cost = "without bound" if limit is None else "an unknown amount" if est.cost_usd is None else \
            f"up to ${est.cost_usd:.2f}"
        return UsageError(f"--budget ${budget:.2f}: {est.time_source.removeprefix('unknown: ')}, and at its limit "
                          f"({Limit(limit, '').words()}) it could cost {cost}",
                          "say how long it takes (--expect 20m), or bound it (--max-runtime 1h)")
    if limit is not None and est.train_seconds > limit * 60:  # the instance would end itself first (user data's shutdown)
        return UsageError(f"the estimate says the job needs ~{est.train_seconds / 60:,.0f} min, longer than "
                          f"--max-runtime {limit} min: the instance would terminate itself before the job finishes",
                          f"raise --max-runtime to at least {int(est.train_seconds // 60) + 1} (minutes), or make the "
                          "job shorter (fewer --epochs)")
    if budget is None or not priced:
        return None
    if est.cost_usd is None:
        return UsageError("--budget needs a price, and none is known for this region",
                          f"run `ec2gpu prices --refresh --region {prices.region}` first")
    if est.cost_usd > budget:
        return UsageError(f"the estimate ${est.cost_usd:.4f} is above --budget ${budget:.4f}",
                          budget_hint(opts, est.time_source))
    return None


def budget_hint(opts: RunOptions, time_source: str) -> str:
    """How to get under --budget (pure): fewer --epochs only for the built-in trainer, the one job
    that takes them; a user's task is told where its job's time came from (``time_source``:
    estimate_minutes' past runs, --expect or the task's max_runtime)."""
    hint = "raise --budget, use --spot or a cheaper --instance-type"
    if opts.bake is None and (isinstance(opts, TrainOptions) or opts.task is not None and opts.task.builtin == "mnist"):
        return hint + ", or train fewer --epochs"
    if opts.bake is None and opts.task is not None and opts.task.builtin is None:
        return hint + f" (the job's time in the estimate: {time_source})"
    return hint


def actual_cost(aws: Aws, home: Path, instance: Instance, ended_fallback: datetime, billing_start: datetime | None = None,
                volume_gib: float | None = None) -> dict[str, Any]:
    """Billed seconds and USD of one instance from its own times.

    ``instance`` is the instance as described after termination. Billing runs from when it was
    ``running`` (``billing_start``, as wait_running saw it: pending is not billed), else from
    its LaunchTime, to its termination time from StateTransitionReason (``ended_fallback``, the
    controller's clock, when it has none). Spot instances pay the spot price history of their zone
    over that time; on-demand ones the catalog's price. Its public IPv4 address and its root volume
    of ``volume_gib`` GiB are added (``address_and_disk``). Returns the ledger's columns:
    launched_at, billing_started_at, terminated_at, billed_seconds, usd_per_hour (compute),
    compute_usd, public_ipv4_usd, ebs_usd, cost_usd (their sum; None when no compute price is
    known), price_source.
    """

    launched = instance.launched_at
    start = max(billing_start, launched) if billing_start else launched
    ended = instance.transitioned_at or ended_fallback
    row = {"launched_at": launched.isoformat(), "billing_started_at": start.isoformat(),
           "terminated_at": ended.isoformat(), "billed_seconds": round(billed_seconds(start, ended), 1),
           **compute_cost(aws, home, instance, start, ended)}
    row.update(address_and_disk(aws.region, home, (ended - start).total_seconds(),
                                (ended - launched).total_seconds(), volume_gib))
    return with_total(row)


def compute_cost(aws: Aws, home: Path, instance: Instance, start: datetime, ended: datetime) -> dict[str, Any]:
    """The compute bill of ``instance`` running from ``start`` to ``ended`` (one running interval,
    60 s minimum): {"usd_per_hour", "compute_usd" (None when no price is known), "price_source"}.
    Spot: the zone's spot price history over the interval (``spot_bill``); on-demand, or a spot
    instance whose history is empty: the catalog's price (``on_demand_bill``)."""
    from ...aws import pricing  # boto3: a dry run imports none (hourly_price)

    if instance.market == "spot":
        history = pricing.spot_price_history(aws.ec2, instance.type, instance.zone or "", start, ended)
        if history:
            return spot_bill(history, instance.zone, start, ended)
    price = catalog.on_demand_price(instance.type, aws.region, home)
    return on_demand_bill(price.usd_per_hour, price.source, start, ended)


def spot_bill(history: list[tuple[datetime, float]], zone: str | None, start: datetime,
              ended: datetime) -> dict[str, Any]:
    """The compute bill of a spot instance in ``zone`` running from ``start`` to ``ended``, at its
    zone's spot price ``history`` (not empty; ``spot_cost_usd``: each second at the price then in
    effect, 60 s minimum) (pure): {"usd_per_hour" (the mean, USD/h), "compute_usd" (USD),
    "price_source"}. Every bill of a run's compute, foreground or detached, is this or
    ``on_demand_bill``."""
    usd = spot_cost_usd(history, start, ended)
    return {"usd_per_hour": round(usd * 3600 / billed_seconds(start, ended), 6), "compute_usd": round(usd, 6),
            "price_source": f"spot price history of {zone} ({words.count(len(history), 'price')} in effect)"}


def on_demand_bill(usd_per_hour: float | None, source: str, start: datetime, ended: datetime) -> dict[str, Any]:
    """The compute bill of an instance running from ``start`` to ``ended`` at ``usd_per_hour``
    (None: unknown) said by ``source``, per second with a 60 s minimum (pure): {"usd_per_hour",
    "compute_usd" (USD; None without a price), "price_source"}."""
    usd = None if usd_per_hour is None else round(cost_usd(billed_seconds(start, ended), usd_per_hour), 6)
    return {"usd_per_hour": usd_per_hour, "compute_usd": usd, "price_source": source}


def address_and_disk(region: str, home: Path, running_s: float, life_s: float, volume_gib: float | None) -> dict[str, Any]:
    """What an instance costs beside its compute: its public IPv4 address for the ``running_s``
    seconds it ran (catalog.PUBLIC_IPV4_USD_PER_HOUR, by the second), and its gp3 root volume of
    ``volume_gib`` GiB for the ``life_s`` seconds it existed, stopped or not (catalog.ebs_price,
    by the second, 60 s minimum, a 30-day month). Returns {"public_ipv4_usd", "ebs_usd" (None
    when the size or the region's price is unknown), "volume_gib", "ebs_price_source"}."""
    gp3 = catalog.ebs_price("gp3", region, home)
    return {**address_and_disk_usd(running_s, life_s, volume_gib, gp3.usd_per_gb_month), "volume_gib": volume_gib,
            "ebs_price_source": f"gp3 {gp3.source}"}


def address_and_disk_usd(running_s: float, life_s: float, volume_gib: float | None,
                         gp3_usd_per_gb_month: float | None) -> dict[str, float | None]:
    """``address_and_disk``'s figures at a known gp3 price (``gp3_usd_per_gb_month``, USD per GB-month;
    None: unknown) (pure): {"public_ipv4_usd", "ebs_usd" (None when the size or the price is unknown)}."""
    ebs = None if volume_gib is None or gp3_usd_per_gb_month is None else round(
        volume_gib * gp3_usd_per_gb_month * max(float(BILLING_MINIMUM_SECONDS), life_s) / catalog.EBS_MONTH_SECONDS, 6)
    return {"public_ipv4_usd": round(max(0.0, running_s) * catalog.PUBLIC_IPV4_USD_PER_HOUR / 3600, 6), "ebs_usd": ebs}


def with_total(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with cost_usd = compute_usd + public_ipv4_usd + ebs_usd (an unknown EBS part counts
    0; an unknown compute part makes the total None)."""
    parts = (row.get("compute_usd"), row.get("public_ipv4_usd"), row.get("ebs_usd"))
    row["cost_usd"] = None if parts[0] is None else round(sum(p or 0.0 for p in parts), 6)
    return row


def estimate_minutes(home: Path, job: TaskJob, instance_type: str, expect_minutes: float | None,
                     backend: str) -> tuple[float | None, str]:
    """Minutes the job should run, and where that figure comes from: the ledger's past completed
    runs of the same task on the same instance type (their mean), else ``--expect``; (None, why)
    when neither says (a task's first run: its cost is then bounded by its --max-runtime)."""
    past = [r for r in ledger.runs(home, backend=backend, limit=200, tolerant=True)
            if ledger.history_key(r) == job.history_key and r.get("instance_type") == instance_type
            and r["status"] == "completed"
            and (r.get("phases") or {}).get("running") and not r.get("element_seconds")]  # an array's: per element
    if past:
        mean = sum(r["phases"]["running"] for r in past) / len(past) / 60
        return mean, f"mean of {words.count(len(past), 'past run')} of task {job.history_key} on {instance_type} (ledger)"
    if expect_minutes:
        return expect_minutes, "--expect"
    return None, f"task {job.history_key} has not run on {instance_type} before"


def element_minutes(home: Path, job: TaskJob, instance_type: str, expect_minutes: float | None,
                    backend: str) -> tuple[float | None, str]:
    """Minutes one element of an array or a sweep of ``job`` should run, and where that figure comes
    from: the mean of the elements that succeeded in the ledger's past completed arrays of the same
    task on the same instance type (weighted by their count; runs/element_table.element_seconds), else
    ``--expect`` (an element's time); (None, why) when neither says."""
    count, total, runs = 0, 0.0, 0
    for r in ledger.runs(home, backend=backend, limit=200, tolerant=True):
        got = r.get("element_seconds")
        if (ledger.history_key(r) != job.history_key or r.get("instance_type") != instance_type or r["status"] != "completed"
                or not isinstance(got, dict)):
            continue
        n, mean = got.get("count"), got.get("mean_seconds")
        if (isinstance(n, int) and not isinstance(n, bool) and n > 0 and isinstance(mean, (int, float))
                and not isinstance(mean, bool) and math.isfinite(mean) and mean >= 0):
            count, total, runs = count + n, total + n * mean, runs + 1
    if count:
        return total / count / 60, (f"mean of {words.count(count, 'element')} of {words.count(runs, 'past array')} "
                                    f"of task {job.history_key} on {instance_type} (ledger)")
    if expect_minutes:
        return expect_minutes, "--expect (an element's)"
    return None, f"no element of task {job.history_key} has run on {instance_type} before"


def in_rounds(est: Estimate, rounds: int, why: str) -> Estimate:
    """``est`` (of one element) with its job run ``rounds`` times one after another, as an array's
    pool runs them (pool_rounds), billed again; ``why`` joins its time source (pure)."""
    return _priced(replace(est, train_seconds=round(est.train_seconds * rounds, 1),
                           time_source=f"{est.time_source}; {why}"))


def pool_rounds(elements: int, instances: int, slots: int) -> int:
    """How many elements run one after another on a pool slot (pure): ``elements`` over
    ``instances`` instances that each run ``slots`` at once, so a pool of them runs about
    rounds x an element's time."""
    return max(1, -(-elements // max(1, instances * slots)))


def rounds_words(elements: int, instances: int, slots: int) -> tuple[int, str]:
    """(pool_rounds, the words an estimate's time source gets for them) (pure)."""
    rounds = pool_rounds(elements, instances, slots)
    return rounds, (f"x {words.count(rounds, 'round')}: {words.count(elements, 'element')} over "
                    f"{words.count(instances, 'instance')}, {slots} at once on each")


def price_rows(aws: Aws, home: Path, gpu: str | None = None,
               log: Callable[[str], None] = lambda msg: None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`ec2gpu prices`: (rows, retired). One row per catalog type (of GPU model ``gpu``) the region
    offers: GPUs, vCPUs and memory as EC2 describes them (aws/types.py, with their source), the
    on-demand USD/h and its source, the newest spot USD/h per zone and the saving (percent). Retired
    types (of ``gpu``) with their last known price and replacement."""
    from ...aws import capacity, pricing, types as type_facts  # boto3: a dry run imports none (hourly_price)
    types = [t for t in catalog.CATALOG.values() if not gpu or t.gpu.upper() == gpu.upper()]
    offered = capacity.offered_in_region(aws.ec2, [t.name for t in types]) if types else set()
    if offered is not None:
        types = [t for t in types if t.name in offered]
    spot = pricing.current_spot_prices(aws.ec2, [t.name for t in types]) if types else {}
    facts = type_facts.describe(aws.ec2, [t.name for t in types], log=log) if types else {}
    rows = []
    for t in types:
        od = catalog.on_demand_price(t.name, aws.region, home)
        zones = spot.get(t.name, {})
        low = min(zones.values()) if zones else None
        saving = None if low is None or not od.usd_per_hour else round(100 * (1 - low / od.usd_per_hour), 1)
        f = facts.get(t.name) or type_facts.from_table(t)
        rows.append({"instance_type": t.name, "gpu": f.gpu, "gpu_count": f.gpu_count,
                     "gpu_memory_gib": f.gpu_memory_gib, "vcpus": f.vcpus, "memory_gib": f.memory_gib,
                     "facts_source": f.source, "on_demand_usd_per_hour": od.usd_per_hour,
                     "on_demand_source": od.source, "spot_usd_per_hour": zones, "spot_saving_pct": saving})
    retired = [{"instance_type": n, "retired": True, "why": why, "replacement": instead,
                "last_known_on_demand_usd_per_hour": catalog.RETIRED_LAST_PRICE.get(n)}
               for n, (why, instead) in catalog.RETIRED.items() if not gpu or gpu.upper() in why.upper()]
    return rows, retired


def totals(attempts: list[dict[str, Any]]) -> dict[str, Any]:
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
