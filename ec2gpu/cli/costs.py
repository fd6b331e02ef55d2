"""Commands about money: `ec2gpu prices`, `ec2gpu cost`, `ec2gpu runs` (the ledger).

Only parsing, calling and rendering: each command is one function of api/costs.py (prices,
estimate, list_runs, show_run), over runs/plan/costs.py and runs/settle/ledger.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, cast

import typer

from ..words import count
from .app import JSON, REGION, SANDBOX, _sandbox_flag, app, group
from .render import attempt_rows, cost_rows, err, note, out, plain, render_json, say, table, table_row

runs_app = group("The ledger of runs: what ran, how it ended, what it cost.", invoke_without_command=True,
                 no_args_is_help=False)
app.add_typer(runs_app, name="runs")

if TYPE_CHECKING:  # cli/ imports api/ when a command runs (`--help` stays fast)
    from ..api.costs import RemoteRunList


def _usd(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


@app.command()
def prices(gpu: Optional[str] = typer.Option(None, "--gpu", help="Only this GPU model: T4, A10G, L4, V100, A100, H100."),
           refresh: bool = typer.Option(False, "--refresh", help="Fetch on-demand prices from the AWS Price List "
                                        "API and cache them (otherwise the shipped table or the cache)."),
           region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """GPU instance types of the region: GPUs, vCPUs, RAM, on-demand and current spot USD/h, saving."""
    from ..api import costs as ops
    from ..aws import catalog

    found = ops.prices(gpu=gpu, refresh=refresh, region=region, sandbox=_sandbox_flag(sandbox), log=note)
    if as_json:
        render_json(found)
        return
    region_name, rows, retired, sandbox_note = found.region, found.instance_types, found.retired, found.note
    t = table("type", "GPUs", "vCPU/RAM", "on-demand", "spot $/h by zone", "saving",
              title=f"GPU instance types in {region_name}, USD/h")
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
        say(out, f"no instance type with {gpu.upper() if gpu else 'NVIDIA'} GPUs is offered in {region_name} (the "
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
         region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Estimate the seconds (boot, setup, training) and USD of `train mnist` on each candidate type."""
    from ..api import costs as ops

    ests = ops.estimate(instance_type, spot=spot, max_price=max_price, model=model, epochs=epochs, region=region,
                        sandbox=_sandbox_flag(sandbox), log=note)
    if as_json:
        render_json(ests)
        return
    backend = ests.backend
    t = table("type", "$/h", "boot", "setup", "train", "teardown", "billed", "USD",
              title=f"estimate: `train mnist --model {model}{f' --epochs {epochs}' if epochs else ''}`, "
              f"{'spot' if spot else 'on-demand'}, {backend}; seconds")
    for e in ests.estimates:
        table_row(t, e.instance_type, _usd(e.usd_per_hour), f"{e.boot_seconds:.0f}",
                  f"{e.setup_seconds:.0f}", f"{e.train_seconds:.0f}", f"{e.teardown_seconds:.0f}",
                  f"{e.billed_seconds:.0f}", _usd(e.cost_usd))
    say(out, t)
    say(out, "per-second billing, 60 s minimum.", "dim")
    for e in ests.estimates:
        say(out, f"{e.instance_type}: price {e.price_source}; times {e.time_source}", "dim")


@runs_app.callback()
def runs(ctx: typer.Context,
         since: Optional[str] = typer.Option(None, "--since", help="Only runs started since: 30m, 12h, 30d, 2w or a date; "
                                             "prints the total spend."),
         sandbox: bool = typer.Option(False, "--sandbox", help="Only the sandbox's runs (the ledger is this "
                                      "machine's: no sandbox is started for it). Also EC2GPU_SANDBOX=1."),
         remote: bool = typer.Option(False, "--remote", help="The detached runs recorded in the region's S3 run "
                                     "store, from any machine of the account, with their cost."),
         limit: Optional[int] = typer.Option(None, "--limit", min=1, help="At most this many runs, the newest "
                                             "(--remote: default 50)."),
         region: Optional[str] = typer.Option(None, "--region", help="With --remote: the region whose run store "
                                              "is read (default: the configured one)."),
         as_json: bool = JSON) -> None:
    """List runs from the ledger, newest first (`ec2gpu runs show ID` for one)."""
    if ctx.invoked_subcommand:
        return
    from ..api import costs as ops

    if remote:
        found = ops.list_runs(since=since, sandbox=_sandbox_flag(sandbox), remote=True, limit=limit, region=region,
                              log=note)
        assert isinstance(found, ops.RemoteRunList)  # remote=True: the run store's
        _remote(found, as_json)
        return
    listed = ops.list_runs(since=since, sandbox=_sandbox_flag(sandbox), limit=limit, region=region,
                           log=lambda m: say(err, m, "dim", soft_wrap=True), warn=lambda m: note(m, "yellow"))
    assert isinstance(listed, ops.RunList)  # remote=False: the ledger's
    rows, total, sandbox_total = listed.runs, listed.total, listed.sandbox_total
    if as_json:
        body = [{k: r.get(k) for k in ops.RUN_KEYS} for r in rows]
        render_json({**listed.to_json(), "runs": body} if since else body)
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
    for r in rows:
        if r["controller_gone"]:
            say(out, plain(f"run {r['run_id']}: its controller ended without closing it", "yellow")
                + plain(f" (killed?); `ec2gpu down {r['run_id']}` removes what it left and bills it from the "
                        "instances' own times"))
    from datetime import datetime
    # the runs listed: since --since, or the newest --limit, or every run the ledger holds
    listed_words = f"since {datetime.fromisoformat(cast(str, listed.since)):%Y-%m-%d %H:%M} UTC" if since else \
        f"in the {count(len(rows), 'run')} listed" if limit else "in the ledger"
    say(out, f"total on AWS {listed_words}: {count(total['runs'], 'run')}, "
        f"{total['billed_seconds']:.0f} s billed, ${total['cost_usd']:.4f} "
        f"(estimated ${total['estimated_cost_usd']:.4f})")
    if sandbox_total["runs"]:
        say(out, f"not counted: {count(sandbox_total['runs'], 'sandbox run')}, whose bills are simulated "
            f"(${sandbox_total['cost_usd']:.4f})", "dim")


def _remote(listed: RemoteRunList, as_json: bool) -> None:
    """`ec2gpu runs --remote`: the run store's detached runs as a table (or --json: each run's
    api.costs.REMOTE_KEYS)."""
    from ..api import costs as ops
    rows = listed.runs
    if as_json:
        render_json({**listed.to_json(), "runs": [{k: r.get(k) for k in ops.REMOTE_KEYS} for r in rows]})
        return
    where = f"s3://{listed.bucket} ({listed.region})"
    if not rows:
        say(out, f"no detached runs in {where}" + (f" since {listed.since[:16]}" if listed.since else ""))
        return
    from rich import box
    t = table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, padding=(0, 1),
              title=f"detached runs in {where}, newest first")
    t.add_column("run id", no_wrap=True, min_width=max(len(r["run_id"]) for r in rows))
    for name in ("state", "try", "intr", "started", "ended", "cost $", "here"):
        t.add_column(name, overflow="fold", no_wrap=name in ("state", "try", "intr", "cost $"))
    for r in rows:  # the state and times come from the run's record, which the job's role can write: inert cells
        usd = _usd(r.get("cost_usd")) + (" max" if r.get("upper_bound") and r.get("cost_usd") is not None else "") + \
            (" so far" if (r.get("cost") or {}).get("running") else "")
        table_row(t, r["run_id"], r["state"], "-" if r.get("attempt") is None else str(r["attempt"]),
                  "-" if r.get("interruptions") is None else str(r["interruptions"]),
                  _short(r.get("started_at")), _short(r.get("ended_at")), usd,
                  r["ledger_status"] or "in ledger" if r["in_ledger"] else "-")
    say(out, t)
    shown = len(rows)
    say(out, f"{shown} of the {count(listed.in_store, 'run')} in the store (--limit {listed.limit}). cost: per-second "
        "billing, 60 s minimum, from each instance's own times while EC2 lists it, else the times its agent "
        "recorded; \"max\": a ceiling price was used. try: the job's attempt; intr: spot interruptions survived; "
        "started, ended: UTC. "
        "here: this machine's ledger status of the run.", "dim")
    for r in rows:
        for why in (r.get("cost") or {}).get("unknown") or []:
            say(out, plain(f"run {r['run_id']}: cost unknown: {why}", "yellow"))


def _short(iso: str | None) -> str:
    """An ISO 8601 time as mm-dd HH:MM (UTC, as the agent writes it), '-' for none (pure)."""
    return "-" if not iso else iso[5:16].replace("T", " ")


def _task(r: Mapping[str, Any]) -> str:
    """The task's name; for standing instances the command that made them (launch, notebook); for
    rows older than the task column, the built-in job (pure)."""
    from ..runs.recover import reconcile
    if r.get("task"):
        return str(r["task"])
    if r.get("status") in (reconcile.STANDING, reconcile.ENDED):
        words = str(r.get("command") or "").split()
        return words[1] if len(words) > 1 else "launch"
    return "mnist"


def _result(r: Mapping[str, Any]) -> str:
    """Test accuracy for the built-in MNIST job; the image a bake made; how standing instances
    ended; the job's own summary.json otherwise (compact)."""
    from ..runs.recover import reconcile
    if r.get("status") in (reconcile.STANDING, reconcile.ENDED):
        return ", ".join(f"{a.get('instance_id')} {a.get('ended') or 'running'}" for a in r.get("attempts") or [])
    if r.get("task") == "bake" and (r.get("summary") or {}).get("image_id"):
        return f"image {r['summary']['image_id']} ({r['summary'].get('task')})"
    if r.get("test_acc") is not None:  # an array's or a sweep's: its best element's
        return f"{'best ' if r.get('element_seconds') else ''}acc {100 * r['test_acc']:.2f}%"
    if isinstance(r.get("element_seconds"), dict) and isinstance(r["element_seconds"].get("count"), int):
        e = r["element_seconds"]  # an array's: its elements that succeeded
        return (f"{count(e['count'], 'element')} succeeded" + (f", {e['mean_seconds']:.0f} s each"
                if isinstance(e.get("mean_seconds"), (int, float)) else "")
                + ("" if r.get("exit_status") in (None, 0) else f"; exit {r['exit_status']}"))
    if r.get("summary_schema") == "invalid":
        return f"summary.json not accepted ({(r.get('summary') or {}).get('invalid')})"
    if r.get("summary"):
        return ", ".join(f"{k} {v}" for k, v in list(r["summary"].items())[:3])
    return "-" if r.get("exit_status") in (None, 0) else f"exit {r['exit_status']}"


#: why a run that is over has no exit status, by its ledger status (pure words; runs/settle/record.RunRecord)
NO_EXIT_STATUS = {"interrupted": "stopped by Ctrl-C or a signal before its job ended",
                  "spot-interrupted": "its spot instances were reclaimed before its job ended",
                  "controller-lost": "its controller ended before the job did"}


def status_words(r: Mapping[str, Any]) -> str:
    """A ledger row's status with its job's exit status, or why it has none (pure): 'failed (exit
    3)', 'interrupted (stopped by Ctrl-C or a signal before its job ended)', 'running'."""
    code, status = r.get("exit_status"), str(r.get("status"))
    if code is not None:
        return f"{status} (exit {code})"
    if status in ("running", "completed", "standing", "ended", "detached"):
        return status
    return f"{status} ({NO_EXIT_STATUS.get(status, 'before its job ended: no exit status')})"


@runs_app.command("show")
def runs_show(run_id: str = typer.Argument(..., help="Run id (or a unique prefix)."), as_json: bool = JSON) -> None:
    """Everything the ledger knows about one run: instances, phases, estimate and actual cost."""
    import json

    from ..api import costs as ops

    r = ops.show_run(run_id)
    if as_json:
        render_json(r)
        return
    t = table(show_header=False, box=None, title=f"run {r['run_id']}")
    test_acc = r.get("test_acc")
    acc = "-" if test_acc is None else f"{100 * test_acc:.2f}%"
    rows = [("command", r["command"]), ("status", status_words(r)),
            ("where", f"{r['backend']} {r.get('region') or ''} {r.get('zone') or ''}".strip()),
            ("instances", " ".join([", ".join(r.get("instance_ids") or []) or "-",
                                    *(str(r[k]) for k in ("instance_type", "market") if r.get(k))])),
            (("model", f"{r.get('model')} x {r.get('epochs')} epochs; "
                       f"{'best ' if r.get('element_seconds') else ''}test accuracy {acc}") if r.get("model") else
             ("how they ended", _result(r)) if r["status"] in ("standing", "ended") else
             ("task", f"{r.get('task') or '-'}: summary {json.dumps(r.get('summary')) if r.get('summary') else '-'}")),
            ("started", r["started_at"]), ("ended", r.get("ended_at") or "-")]
    rows += [(f"  {k}", f"{v:.1f} s") for k, v in (r.get("phases") or {}).items()]
    rows += cost_rows(r)
    rows += attempt_rows(r.get("attempts") or [])
    rows.append(("artifacts", r.get("artifacts") or "-"))
    for k, v in rows:  # the summary, the task, the attempts' endings are not ours: never markup
        table_row(t, plain(k, "bold"), v)
    say(out, t)
