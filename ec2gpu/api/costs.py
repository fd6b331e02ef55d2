"""Money, as library functions: prices, estimate, list_runs and show_run (the ledger).

Prices are USD per hour (on-demand: the refreshed Price List cache, else the shipped table; spot:
the newest price per zone), times are seconds, costs USD. prices and estimate open a
backend.Context (``region``; ``sandbox``: the local sandbox instead of AWS, also
EC2GPU_SANDBOX=1); list_runs and show_run read this machine's ledger ($EC2GPU_HOME/ledger.sqlite),
list_runs first bringing its open rows up to date from AWS where it can. Each returns a typed
record (its ``to_json()`` is what the CLI's ``--json`` prints; show_run the ledger's row) and
raises the ec2gpu.errors tree: UsageError for bad input before anything is opened, NoCredentials,
AwsError. ``log(text)`` is told what happens on the way
(default: nothing), ``warn(text)`` what the user should look at (default: ``log``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Sequence, Union, cast

from ..aws import catalog
from ..backend import sandbox_from_env
from ..errors import Ec2GpuError, UsageError
from ..runs.plan import costs
from ..runs.plan.costs import Estimate
from ..runs.recover import reconcile
from ..runs.settle import ledger
from ..runs.settle.record import RunRecord
from ..sandbox import control
from ..settings import load
from .instances import Log, _context, _quiet, settle

# aws/pricing, aws/session and runs/detached/costs load boto3: imported inside the functions that reach AWS, since `ec2gpu run
# --dry-run` imports api/ and loads no AWS SDK (tests/unit/test_dry_run.py::test_a_dry_run_imports_no_aws_sdk).

#: The models `estimate` knows: the built-in `train mnist` job's (train/presets.py).
MODELS = ("cnn", "lenet", "mlp", "dbn")

#: The columns of each run `ec2gpu runs --json` prints (list_runs returns every column of the ledger).
RUN_KEYS = ("run_id", "status", "controller_gone", "backend", "command", "task", "instance_type", "market", "model",
            "test_acc", "exit_status", "summary", "summary_schema", "billed_seconds", "cost_usd", "estimated_cost_usd",
            "started_at", "region", "zone", "instance_ids", "artifacts")


# ---- what these functions return (the CLI's ``--json`` prints each one's ``to_json()``) ----------

@dataclass(frozen=True)
class PriceList:
    """The GPU instance types of ``region`` with their prices (`prices`): ``instance_types``, one
    runs/plan/costs.price_rows row each (USD/h; spot by zone); ``retired``, the retired types with
    their last known on-demand price and replacement; ``note`` in the sandbox (its spot prices are
    simulated), else None."""
    region: str
    instance_types: list[dict[str, Any]]
    retired: list[dict[str, Any]]
    note: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """{"region", "instance_types", "retired"}, and "note" in the sandbox."""
        listed: dict[str, Any] = {"region": self.region, "instance_types": self.instance_types,
                                  "retired": self.retired}
        if self.note is not None:
            listed["note"] = self.note
        return listed


@dataclass(frozen=True)
class CostEstimates:
    """`estimate`'s answer: one runs/plan/costs.Estimate (seconds, USD) per instance type asked, in
    order, all from the ledger of ``backend`` ("aws" or "sandbox")."""
    backend: str
    estimates: list[Estimate]

    def to_json(self) -> list[dict[str, Any]]:
        """One Estimate.as_dict() per type, each with "backend"."""
        return [{**e.as_dict(), "backend": self.backend} for e in self.estimates]


@dataclass(frozen=True)
class RunList:
    """The ledger's runs (`list_runs`), newest first: ``runs``, every ledger column of each
    (runs/settle/ledger.py) with "controller_gone"; ``total`` and ``sandbox_total``,
    runs/settle/ledger.totals of AWS's runs and of the sandbox's apart ({"runs", "billed_seconds"
    (s), "cost_usd", "estimated_cost_usd"}); ``since``, the start asked as ISO 8601, or None."""
    runs: list[dict[str, Any]]
    total: dict[str, Any]
    sandbox_total: dict[str, Any]
    since: Optional[str]

    def to_json(self) -> dict[str, Any]:
        """{"runs", "total", "sandbox_total", "since"}."""
        return {"runs": self.runs, "total": self.total, "sandbox_total": self.sandbox_total, "since": self.since}


@dataclass(frozen=True)
class RemoteRunList:
    """The detached runs of a region's run store (`list_runs(remote=True)`): ``bucket``,
    ``region``, ``in_store`` (runs in the store), ``runs`` (at most ``limit``, newest first, each
    its record's fields and cost: runs/detached/costs.remote_runs), ``since`` (ISO 8601, or None)."""
    bucket: str
    region: str
    in_store: int
    runs: list[dict[str, Any]]
    limit: int
    since: Optional[str]

    def to_json(self) -> dict[str, Any]:
        """{"bucket", "region", "in_store", "runs", "limit", "since"}."""
        return {"bucket": self.bucket, "region": self.region, "in_store": self.in_store, "runs": self.runs,
                "limit": self.limit, "since": self.since}


def prices(*, gpu: Optional[str] = None, refresh: bool = False, region: Optional[str] = None, sandbox: bool = False,
           log: Log = _quiet) -> PriceList:
    """The GPU instance types of the region with their prices; `ec2gpu prices`.

    ``gpu``: only this GPU model (T4, A10G, L4, V100, A100, H100; case-insensitive). ``refresh``:
    first fetch the region's on-demand prices and EBS storage prices from the AWS Price List API
    into the cache (said to ``log``). Returns a PriceList: region, instance_types [one dict per type the
    region offers (runs/plan/costs.price_rows): instance_type, gpu, gpu_count, gpu_memory_gib, vcpus,
    memory_gib, facts_source, on_demand_usd_per_hour, on_demand_source, spot_usd_per_hour ({zone:
    USD/h}), spot_saving_pct (percent, or None)], "retired": [instance_type, retired, why,
    replacement, last_known_on_demand_usd_per_hour], and in the sandbox note (its spot prices
    are simulated). Raises UsageError (an unknown GPU model; ``refresh`` in the sandbox, which has
    no Price List API), NoCredentials, AwsError."""
    from ..aws import pricing

    known_gpus = sorted({t.gpu for t in catalog.CATALOG.values()})
    if gpu and gpu.upper() not in {g.upper() for g in known_gpus} | set(catalog.RETIRED_GPUS):
        raise UsageError(f"unknown GPU model {gpu!r}", f"choose one of {', '.join(known_gpus)}")
    no_refresh = UsageError("the sandbox has no AWS Price List API (moto does not implement it)",
                            "drop --refresh: the sandbox uses the shipped on-demand table")
    if refresh and sandbox_from_env(sandbox):
        raise no_refresh
    with _context(region, sandbox, log=log) as ctx:
        aws, home = ctx.aws, ctx.settings.home
        if refresh and ctx.backend.is_sandbox:  # the sandbox's endpoint, exported in this shell
            raise no_refresh
        if refresh:
            cache = pricing.refresh_cache(aws.pricing(), aws.region, home)
            log(f"fetched {len(cache['prices'])} on-demand prices for {aws.region} from the Price List "
                f"API into {catalog.price_cache_path(home, aws.region)}")
            storage = pricing.refresh_storage(aws.pricing(), aws.region, home)
            log("EBS, USD per GB-month: " + (", ".join(f"{k} {v:g}" for k, v in storage.items()) or
                                             "none listed for this region"))
        rows, retired = costs.price_rows(aws, home, gpu, log=log)
        is_sandbox = ctx.backend.is_sandbox
    return PriceList(region=aws.region, instance_types=rows, retired=retired,
                     note="sandbox: spot prices come from the sandbox's simulated market" if is_sandbox else None)


def estimate(instance_types: Union[str, Sequence[str]] = "g4dn.xlarge,g5.xlarge,g6.xlarge", *, spot: bool = False,
             max_price: Optional[float] = None, model: str = "cnn", epochs: Optional[int] = None,
             region: Optional[str] = None, sandbox: bool = False, log: Log = _quiet) -> CostEstimates:
    """Estimate the seconds (boot, setup, training, teardown) and USD of `train mnist` on each of
    ``instance_types`` (comma-separated, or a list); `ec2gpu cost`.

    ``spot``: at the highest current spot price over the region's zones (capped at ``max_price``,
    USD/h); ``model``: cnn, lenet, mlp or dbn; ``epochs``: default the model's preset. Times come
    from the backend's ledger (past runs, `ec2gpu bench`), else defaults. Returns CostEstimates: one
    runs/plan/costs.Estimate per type, in order (instance_type, market, usd_per_hour, price_source, boot_seconds,
    setup_seconds, train_seconds, teardown_seconds, time_source, billed_seconds (per-second
    billing, 60 s minimum), cost_usd, upper_bound), and backend ("aws" or "sandbox": whose ledger
    and prices). Raises UsageError (an unknown model or type, none given, ``max_price`` without
    ``spot`` or below every zone's spot price, epochs under 1), NoCredentials, AwsError."""

    if model not in MODELS:
        raise UsageError(f"unknown model {model!r}", "choose cnn, lenet, mlp or dbn")
    if max_price is not None and not spot:
        raise UsageError("--max-price applies to spot instances only", "add --spot, or drop --max-price")
    if max_price is not None and max_price < 0:
        raise UsageError(f"--max-price {max_price} is negative", "give the highest USD/h to pay, e.g. 0.5")
    if epochs is not None and epochs < 1:
        raise UsageError(f"--epochs {epochs} is under 1", "give 1 or more")
    asked = instance_types.split(",") if isinstance(instance_types, str) else list(instance_types)
    names = [catalog.lookup(n).name for n in asked if n.strip()]
    if not names:
        raise UsageError("no instance type given", "e.g. --instance-type g4dn.xlarge,g5.xlarge")
    with _context(region, sandbox, log=log) as ctx:
        backend = ctx.backend.name
        ests = [costs.estimate_run(ctx.aws, ctx.settings.home, n, spot, model, epochs, backend, max_price)
                for n in names]
    return CostEstimates(backend=backend, estimates=ests)


#: runs `ec2gpu runs --remote` lists when no limit is given (each costs one S3 GetObject)
REMOTE_LIMIT = 50
#: The columns of each run `ec2gpu runs --remote --json` prints (list_runs(remote=True) returns more)
REMOTE_KEYS = ("run_id", "state", "attempt", "restarts", "interruptions", "launches", "instance_id", "started_at",
               "updated_at", "ended_at", "exit_code", "message", "problem", "billed_seconds", "cost_usd",
               "upper_bound", "cost", "in_ledger", "ledger_status")


def list_runs(*, since: Optional[str] = None, sandbox: bool = False, remote: bool = False,
              limit: Optional[int] = None, region: Optional[str] = None, log: Log = _quiet,
              warn: Optional[Log] = None) -> Union[RunList, RemoteRunList]:
    """The ledger's runs, newest first; `ec2gpu runs`. ``since``: only runs started since then
    (30m, 12h, 30d, 2w, or a date; UTC); ``sandbox``: only the sandbox's runs; ``limit``: at most
    this many (the newest; default all; the totals are of the runs listed).

    ``remote``: instead, the detached runs recorded in the region's run store (S3, ``region``;
    ``sandbox``: the sandbox's), from any machine of the account, not only this one's ledger
    (runs/detached/costs.remote_runs): at most ``limit`` (default REMOTE_LIMIT) newest first, each
    with its record's fields (state.json: state, attempt, restarts, interruptions, instance_id,
    started_at, ended_at, message, problem: runs/detached/follow's), its cost from the times its
    agent recorded and the prices that applied (billed_seconds in s, cost_usd in USD or None when a
    price or an instance type is unknown, upper_bound, "cost": the whole bill with per_instance
    and where each time and price came from: runs/detached/costs.cost), and "in_ledger"/
    "ledger_status": whether this machine's ledger has the run. Returns a RemoteRunList (runs,
    bucket, region, in_store: runs in the store, limit, since); it reads only (nothing is removed or settled).
    Raises UsageError (a limit under 1; ``region`` without ``remote``), NoCredentials, AwsError as well.

    First, where the ledger has rows still open (standing instances, runs whose controller is gone,
    instances --keep left) of the backend in use, they are brought up to date from AWS as
    `ec2gpu ls` does (bills of instances that have ended; what they left removed; each said to
    ``log``, a settled bill to ``warn``); where AWS cannot be reached one line says so to ``warn``
    and the ledger is listed as it is. A sandbox that is not up is not started for this.

    Returns a RunList: runs [every ledger column of each run (runs/settle/ledger.py), with "controller_gone":
    whether its controller ended without closing it], total and sandbox_total: runs/settle/ledger.totals
    of AWS's runs and of the sandbox's apart ({"runs", "billed_seconds", "cost_usd",
    "estimated_cost_usd"}: real money and simulated bills are never added up), since: the start
    as ISO 8601, or None. `ec2gpu runs --json` prints each run's RUN_KEYS. Raises UsageError (a
    ``since`` that is neither a duration nor a date), LedgerError (an unreadable ledger)."""

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(f"--limit {limit!r} is not a whole number of runs, 1 or more", "e.g. --limit 20")
    start = ledger.parse_since(since) if since else None
    if remote:
        return _remote_runs(start, sandbox, limit or REMOTE_LIMIT, region, log)
    if region is not None:
        raise UsageError("--region applies to --remote only: the ledger holds every region's runs",
                         "add --remote, or drop --region")
    sandbox = sandbox_from_env(sandbox)
    home = load().home
    _up_to_date(home, sandbox, log, warn or log)
    rows = ledger.runs(home, since=start, backend="sandbox" if sandbox else None, limit=limit)
    for r in rows:
        r["controller_gone"] = reconcile.controller_gone(r)
    return RunList(runs=rows, total=ledger.totals([r for r in rows if r.get("backend") == "aws"]),
                   sandbox_total=ledger.totals([r for r in rows if r.get("backend") == "sandbox"]),
                   since=start.isoformat() if start else None)


def _remote_runs(start: Optional[datetime], sandbox: bool, limit: int, region: Optional[str],
                 log: Log) -> RemoteRunList:
    """list_runs(remote=True): the region's run store, read (runs/detached/costs.remote_runs)."""
    from ..runs.detached import costs as detached_costs
    with _context(region, sandbox, log=log) as ctx:
        found = detached_costs.remote_runs(ctx.aws, ctx.settings.home, ctx.settings.root_volume_gib, limit, start)
    return RemoteRunList(bucket=found["bucket"], region=found["region"], in_store=found["in_store"],
                         runs=found["runs"], limit=limit, since=start.isoformat() if start else None)


def _up_to_date(home: Path, sandbox: bool, log: Log, warn: Log) -> None:
    """Before list_runs reads the ledger: where it has rows still open (standing instances, runs
    whose controller is gone, instances `--keep` left) of the backend this shell uses (the sandbox
    with ``sandbox`` or its endpoint in AWS_ENDPOINT_URL), bring them up to date from AWS
    (api.instances.settle), in each of their regions. Where AWS cannot be reached (no credentials,
    no network), ``warn`` says so once. A sandbox that is not up is not started for this."""
    from ..aws.session import AWS_ERRORS

    pending = reconcile.open_rows(home) + reconcile.abandoned(home) + reconcile.kept(home)
    endpoint = (control.read_state(home) or {}).get("endpoint")
    sandbox = sandbox or bool(endpoint and os.environ.get("AWS_ENDPOINT_URL") == endpoint)
    backend = "sandbox" if sandbox else "aws"
    regions = sorted({r.get("region") or "" for r in pending if r.get("backend") == backend})
    if not regions or (sandbox and not control.read_state(home)):
        return
    try:
        for region in regions:
            with _context(region or None, sandbox, log=log) as ctx:
                settle(ctx, log=log, warn=warn)
    except (Ec2GpuError, *AWS_ERRORS) as exc:
        warn(f"could not bring the ledger's open rows up to date from AWS ({type(exc).__name__}: {exc}); "
             "listed as they are")


def show_run(run_id: str) -> RunRecord:
    """Everything the ledger knows about one run (``run_id``: an id or a unique prefix); `ec2gpu runs
    show`: its row, a runs/settle/record.RunRecord (the ledger's columns: command, status, exit_status, backend, region, zone,
    instance_ids, instance_type, market, phases (s), estimate and estimated_cost_usd, billed_seconds,
    cost_usd, attempts, summary, artifacts, started_at, ended_at...). This machine's ledger alone.
    Raises UsageError (no such run, or a prefix of several), LedgerError."""
    return cast(RunRecord, ledger.get(load().home, run_id))  # the ledger's row: its columns are RunRecord's
