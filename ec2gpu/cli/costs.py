"""Commands about money: `ec2gpu prices`, `ec2gpu cost`, `ec2gpu runs` (the ledger).

Only parsing and rendering; the price table and estimates come from runs/costs.py (over
aws/catalog.py, aws/pricing.py and aws/types.py), history from runs/ledger.py.
"""
from __future__ import annotations

import os
from typing import Optional

import typer

from . import (JSON, REGION, SANDBOX, Context, _sandbox_flag, app, attempt_rows, cost_rows, err, group, note, out, plain,
               render_json, say, table, table_row)
from ..errors import UsageError

runs_app = group("The ledger of runs: what ran, how it ended, what it cost.", invoke_without_command=True,
                 no_args_is_help=False)
app.add_typer(runs_app, name="runs")


def _usd(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


@app.command()
def prices(gpu: Optional[str] = typer.Option(None, "--gpu", help="Only this GPU model: T4, A10G, L4, V100, A100, H100."),
           refresh: bool = typer.Option(False, "--refresh", help="Fetch on-demand prices from the AWS Price List "
                                        "API and cache them (otherwise the shipped table or the cache)."),
           region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """GPU instance types of the region: GPUs, vCPUs, RAM, on-demand and current spot USD/h, saving."""
    from ..aws import catalog, pricing
    from ..runs import costs

    known_gpus = sorted({t.gpu for t in catalog.CATALOG.values()})
    if gpu and gpu.upper() not in {g.upper() for g in known_gpus} | set(catalog.RETIRED_GPUS):
        raise UsageError(f"unknown GPU model {gpu!r}", f"choose one of {', '.join(known_gpus)}")
    with Context(region, _sandbox_flag(sandbox)) as ctx:
        aws, home = ctx.aws, ctx.settings.home
        if refresh and ctx.backend.is_sandbox:
            raise UsageError("the sandbox has no AWS Price List API (moto does not implement it)",
                             "drop --refresh: the sandbox uses the shipped on-demand table")
        if refresh:
            cache = pricing.refresh_cache(aws.pricing(), aws.region, home)
            say(err, f"fetched {len(cache['prices'])} on-demand prices for {aws.region} from the Price List "
                f"API into {catalog.price_cache_path(home, aws.region)}", "dim")
            storage = pricing.refresh_storage(aws.pricing(), aws.region, home)
            say(err, "EBS, USD per GB-month: " + (", ".join(f"{k} {v:g}" for k, v in storage.items()) or
                                                  "none listed for this region"), "dim")
        rows, retired = costs.price_rows(aws, home, gpu, log=note)
        sandbox_note = "sandbox: spot prices come from the sandbox's simulated market" if ctx.backend.is_sandbox else None
    if as_json:
        render_json({"region": aws.region, "instance_types": rows, "retired": retired,
                     **({"note": sandbox_note} if sandbox_note else {})})
        return
    t = table("type", "GPUs", "vCPU/RAM", "on-demand", "spot $/h by zone", "saving",
              title=f"GPU instance types in {aws.region}, USD/h")
    for r in rows:
        zones = " ".join(f"{z[-1]}:{p:.4f}" for z, p in r["spot_usd_per_hour"].items())
        table_row(t, r["instance_type"], f"{r['gpu_count']}x {r['gpu']} {r['gpu_memory_gib']}G",
                  f"{r['vcpus']}/{r['memory_gib']:g}G", _usd(r["on_demand_usd_per_hour"]), zones or "-",
                  "-" if r["spot_saving_pct"] is None else f"{r['spot_saving_pct']:.0f}%")
    for r in retired:
        table_row(t, *(plain(c, "dim") for c in (r["instance_type"], "retired", "",
                                                 _usd(r["last_known_on_demand_usd_per_hour"]),
                                                 f"last price; use {r['replacement']}", "")))
    if not rows and not retired:  # never an empty table with no word
        listed = ", ".join(n for n, c in catalog.CATALOG.items() if not gpu or c.gpu.upper() == gpu.upper())
        say(out, f"no instance type with {gpu.upper() if gpu else 'NVIDIA'} GPUs is offered in {aws.region} (the "
            f"catalog's: {listed}); try another --region")
        return
    say(out, t)
    sources = sorted({r["on_demand_source"] for r in rows})
    say(out, f"GPUs, vCPUs, memory: {'; '.join(sorted({r['facts_source'] for r in rows}))}. "
        f"on-demand: {'; '.join(sources) or '-'}. spot: describe_spot_price_history, newest price per zone."
        f"{' ' + sandbox_note + '.' if sandbox_note else ''}", "dim")


@app.command()
def cost(instance_type: str = typer.Option("g4dn.xlarge,g5.xlarge,g6.xlarge", "--instance-type", "-t",
                                           help="Candidate instance types, comma-separated."),
         spot: bool = typer.Option(False, "--spot", help="Estimate with current spot prices."),
         max_price: Optional[float] = typer.Option(None, "--max-price", min=0, help="With --spot: cap, USD/h."),
         model: str = typer.Option("cnn", "--model", "-m", help="cnn, lenet, mlp or dbn."),
         epochs: Optional[int] = typer.Option(None, "--epochs", "-e", min=1, help="Epochs (default: the preset's)."),
         region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Estimate the seconds (boot, setup, training) and USD of `train mnist` on each candidate type."""
    from ..aws import catalog
    from ..runs import costs

    if model not in ("cnn", "lenet", "mlp", "dbn"):
        raise UsageError(f"unknown model {model!r}", "choose cnn, lenet, mlp or dbn")
    if max_price is not None and not spot:
        raise UsageError("--max-price applies to spot instances only", "add --spot, or drop --max-price")
    names = [catalog.lookup(n).name for n in instance_type.split(",") if n.strip()]
    if not names:
        raise UsageError("no instance type given", "e.g. --instance-type g4dn.xlarge,g5.xlarge")
    with Context(region, _sandbox_flag(sandbox)) as ctx:
        backend = ctx.backend.name
        ests = [costs.estimate_run(ctx.aws, ctx.settings.home, n, spot, model, epochs, backend, max_price)
                for n in names]
    if as_json:
        render_json([e.as_dict() for e in ests])
        return
    t = table("type", "$/h", "boot", "setup", "train", "teardown", "billed", "USD",
              title=f"estimate: `train mnist --model {model}{f' --epochs {epochs}' if epochs else ''}`, "
              f"{'spot' if spot else 'on-demand'}, {backend}; seconds")
    for e in ests:
        table_row(t, e.instance_type, _usd(e.usd_per_hour), f"{e.boot_seconds:.0f}", f"{e.setup_seconds:.0f}",
                  f"{e.train_seconds:.0f}", f"{e.teardown_seconds:.0f}", f"{e.billed_seconds:.0f}", _usd(e.cost_usd))
    say(out, t)
    say(out, "per-second billing, 60 s minimum.", "dim")
    for e in ests:
        say(out, f"{e.instance_type}: price {e.price_source}; times {e.time_source}", "dim")


@runs_app.callback()
def runs(ctx: typer.Context,
         since: Optional[str] = typer.Option(None, "--since", help="Only runs started since: 30m, 12h, 30d, 2w or a date; "
                                             "prints the total spend."),
         sandbox: bool = typer.Option(False, "--sandbox", help="Only the sandbox's runs (the ledger is this "
                                      "machine's: no sandbox is started for it). Also EC2GPU_SANDBOX=1."),
         as_json: bool = JSON):
    """List runs from the ledger, newest first (`ec2gpu runs show ID` for one)."""
    if ctx.invoked_subcommand:
        return
    from ..runs import ledger
    from ..settings import load

    from ..runs import reconcile

    start = ledger.parse_since(since) if since else None
    _up_to_date(load().home, _sandbox_flag(sandbox))
    rows = ledger.runs(load().home, since=start, backend="sandbox" if _sandbox_flag(sandbox) else None)
    lost = [r["run_id"] for r in rows if reconcile.controller_gone(r)]
    for r in rows:
        r["controller_gone"] = r["run_id"] in lost
    keys = ("run_id", "status", "controller_gone", "backend", "command", "task", "instance_type", "market", "model",
            "test_acc", "exit_status",
            "summary", "summary_schema", "billed_seconds",
            "cost_usd", "estimated_cost_usd", "started_at", "region", "zone", "instance_ids", "artifacts")
    # real money and the sandbox's simulated bills are never added up together
    total = ledger.totals([r for r in rows if r.get("backend") == "aws"])
    sandbox_total = ledger.totals([r for r in rows if r.get("backend") == "sandbox"])
    if as_json:
        body = [{k: r.get(k) for k in keys} for r in rows]
        render_json({"runs": body, "total": total, "sandbox_total": sandbox_total,
                     "since": start.isoformat() if start else None} if since else body)
        return
    if not rows:
        say(out, f"no {'sandbox ' if _sandbox_flag(sandbox) else ''}runs in the ledger" +
            (f" since {since}" if since else ""))
        return
    from rich import box
    t = table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, padding=(0, 1))
    # the run id is what a user copies (`ec2gpu runs show ID`): it never wraps or shrinks; words fold
    t.add_column("run id (start UTC)", no_wrap=True, min_width=max(len(r["run_id"]) for r in rows))
    for name in ("status", "task", "type", "result", "billed", "cost $", "est. $"):
        t.add_column(name, overflow="fold", no_wrap=name in ("billed", "cost $", "est. $"))
    for r in rows:  # the result quotes the job's summary.json: every cell inert, none read as markup
        kind = (r.get("instance_type") or "") + (" spot" if r.get("market") == "spot" else "")
        table_row(t, r["run_id"], "controller gone" if r["controller_gone"] else r["status"], _task(r), kind, _result(r),
                  "-" if r.get("billed_seconds") is None else f"{r['billed_seconds']:.0f}",
                  _usd(r.get("cost_usd")), _usd(r.get("estimated_cost_usd")))
    say(out, t)
    for run_id in lost:
        say(out, plain(f"run {run_id}: its controller ended without closing it", "yellow")
            + plain(f" (killed?); `ec2gpu down {run_id}` removes what it left and bills it from the instances' own "
                    "times"))
    if since:
        say(out, f"total on AWS since {start:%Y-%m-%d %H:%M} UTC: {total['runs']} run(s), "
            f"{total['billed_seconds']:.0f} s billed, ${total['cost_usd']:.4f} "
            f"(estimated ${total['estimated_cost_usd']:.4f})")
        if sandbox_total["runs"]:
            say(out, f"not counted: {sandbox_total['runs']} sandbox run(s), whose bills are simulated "
                f"(${sandbox_total['cost_usd']:.4f})", "dim")


def _up_to_date(home, sandbox: bool = False) -> None:
    """Before `runs` lists the ledger: where it has rows still open (standing instances, runs whose
    controller is gone, instances `--keep` left) of the backend this shell uses (the sandbox with
    ``sandbox`` or its endpoint in AWS_ENDPOINT_URL), bring them up to date from AWS as `ec2gpu ls`
    does (runs/reconcile.py: bills of instances that have ended; what they left removed), in each
    of their regions. Where AWS cannot be reached (no credentials, no network), one line says so
    and the ledger is listed as it is. A sandbox that is not up is not started for this."""
    import botocore.exceptions

    from ..errors import Ec2GpuError
    from ..runs import reconcile
    from ..sandbox import control
    from .instances import _settle

    pending = reconcile.open_rows(home) + reconcile.abandoned(home) + reconcile.kept(home)
    endpoint = (control.read_state(home) or {}).get("endpoint")
    sandbox = sandbox or bool(endpoint and os.environ.get("AWS_ENDPOINT_URL") == endpoint)
    backend = "sandbox" if sandbox else "aws"
    regions = sorted({r.get("region") or "" for r in pending if r.get("backend") == backend})
    if not regions or (sandbox and not control.read_state(home)):
        return
    try:
        for region in regions:
            with Context(region or None, sandbox) as ctx:
                _settle(ctx)
    except (Ec2GpuError, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        note(f"could not bring the ledger's open rows up to date from AWS ({type(exc).__name__}: {exc}); "
             "listed as they are", "yellow")


def _task(r: dict) -> str:
    """The task's name; for standing instances the command that made them (launch, notebook); for
    rows older than the task column, the built-in job (pure)."""
    from ..runs import reconcile
    if r.get("task"):
        return r["task"]
    if r.get("status") in (reconcile.STANDING, reconcile.ENDED):
        words = str(r.get("command") or "").split()
        return words[1] if len(words) > 1 else "launch"
    return "mnist"


def _result(r: dict) -> str:
    """Test accuracy for the built-in MNIST job; the image a bake made; how standing instances
    ended; the job's own summary.json otherwise (compact)."""
    from ..runs import reconcile
    if r.get("status") in (reconcile.STANDING, reconcile.ENDED):
        return ", ".join(f"{a.get('instance_id')} {a.get('ended') or 'running'}" for a in r.get("attempts") or [])
    if r.get("task") == "bake" and (r.get("summary") or {}).get("image_id"):
        return f"image {r['summary']['image_id']} ({r['summary'].get('task')})"
    if r.get("test_acc") is not None:
        return f"acc {100 * r['test_acc']:.2f}%"
    if r.get("summary_schema") == "invalid":
        return f"summary.json not accepted ({(r.get('summary') or {}).get('invalid')})"
    if r.get("summary"):
        return ", ".join(f"{k} {v}" for k, v in list(r["summary"].items())[:3])
    return "-" if r.get("exit_status") in (None, 0) else f"exit {r['exit_status']}"


@runs_app.command("show")
def runs_show(run_id: str = typer.Argument(..., help="Run id (or a unique prefix)."), as_json: bool = JSON):
    """Everything the ledger knows about one run: instances, phases, estimate and actual cost."""
    import json

    from ..runs import ledger
    from ..settings import load

    r = ledger.get(load().home, run_id)
    if as_json:
        render_json(r)
        return
    t = table(show_header=False, box=None, title=f"run {r['run_id']}")
    acc = "-" if r.get("test_acc") is None else f"{100 * r['test_acc']:.2f}%"
    rows = [("command", r["command"]), ("status", f"{r['status']} (exit {r.get('exit_status')})"),
            ("where", f"{r['backend']} {r.get('region') or ''} {r.get('zone') or ''}"),
            ("instances", f"{', '.join(r.get('instance_ids') or []) or '-'} {r.get('instance_type')} {r.get('market')}"),
            (("model", f"{r.get('model')} x {r.get('epochs')} epochs; test accuracy {acc}") if r.get("model") else
             ("how they ended", _result(r)) if r["status"] in ("standing", "ended") else
             ("task", f"{r.get('task')}: summary {json.dumps(r.get('summary')) if r.get('summary') else '-'}")),
            ("started", r["started_at"]), ("ended", r.get("ended_at") or "-")]
    rows += [(f"  {k}", f"{v:.1f} s") for k, v in (r.get("phases") or {}).items()]
    rows += cost_rows(r)
    rows += attempt_rows(r.get("attempts") or [])
    rows.append(("artifacts", r.get("artifacts") or "-"))
    for k, v in rows:  # the summary, the task, the attempts' endings are not ours: never markup
        table_row(t, plain(k, "bold"), v)
    say(out, t)
