"""The `ec2gpu` command: parse, call the runs/aws layers, render with rich. Nothing else.

Heavy modules (boto3, fabric, torch) are imported inside the commands, so `ec2gpu --help`
starts fast. The one error boundary is ``main()``: an Ec2GpuError becomes one line and a hint
and its exit code; ``--debug`` (anywhere on the line) shows the traceback instead.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from .. import backend
from ..errors import Ec2GpuError, ExitCode, UsageError

app = typer.Typer(help="Rent a GPU on AWS EC2 for exactly as long as a training job needs it.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
train_app = typer.Typer(help="Train a built-in job on a new instance, then terminate it.", no_args_is_help=True)
sandbox_app = typer.Typer(help="The local sandbox: moto's AWS server + one real sshd per instance.",
                          no_args_is_help=True)
app.add_typer(train_app, name="train")
app.add_typer(sandbox_app, name="sandbox")

out = Console()
err = Console(stderr=True)
DEBUG = False

SANDBOX = typer.Option(False, "--sandbox", help="Use the local sandbox (started for this command if none is up). "
                       "Also EC2GPU_SANDBOX=1.")
REGION = typer.Option(None, "--region", help="AWS region (default: EC2GPU_REGION, AWS_REGION, us-east-1).")
JSON = typer.Option(False, "--json", help="Print JSON for scripts instead of a table.")


class Context(backend.Context):
    """backend.Context, telling the terminal when it starts a sandbox for good."""

    def __init__(self, region: str | None, sandbox: bool, persistent: bool = False):
        super().__init__(region, sandbox, persistent, note=lambda text: err.print(f"[dim]{text}[/]"))


_sandbox_flag = backend.sandbox_from_env


class RichReporter:
    """Pipeline reporter: a spinner with elapsed seconds per phase, log lines above it."""

    def __init__(self, console: Console, quiet: bool = False):
        from ..runs.pipeline import Reporter
        self.inner, self.console, self.quiet = Reporter(), console, quiet
        self.phases = self.inner.phases
        self.notes = self.inner.notes

    def phase(self, name: str):
        import contextlib
        import time

        @contextlib.contextmanager
        def cm():
            t0 = time.monotonic()
            status = None if self.quiet else self.console.status(f"[bold]{name}[/] ...")
            if status:
                status.start()
            ok = False
            try:
                with self.inner.phase(name):
                    yield
                ok = True
            finally:
                if status:
                    status.stop()
                mark = "[green]done[/]" if ok else "[red]stopped[/]"
                self._print(f"{mark} {name} [dim]{time.monotonic() - t0:.1f} s[/]")
        return cm()

    def log(self, line: str) -> None:
        from rich.text import Text
        self._print(Text.assemble(("| ", "cyan"), line))

    def note(self, text: str) -> None:
        from rich.text import Text
        self.inner.note(text)
        self._print(Text(text, style="dim"))

    def _print(self, text) -> None:
        if not self.quiet:
            self.console.print(text, highlight=False)


def cost_rows(record: dict) -> list[tuple[str, str]]:
    """'estimate' and 'actual' lines of a run record, side by side in the summary."""
    rows = []
    est = record.get("estimate") or {}
    if record.get("estimated_cost_usd") is not None:
        rows.append(("estimate", f"${record['estimated_cost_usd']:.4f} for {est.get('billed_seconds', 0):.0f} s "
                     f"(times: {est.get('time_source', '')})"))
    if record.get("billed_seconds") is not None and record.get("market") != "local":
        usd = record.get("cost_usd")
        rows.append(("actual", ("unknown" if usd is None else f"${usd:.4f}") +
                     f" = {record['billed_seconds']:.0f} s billed (running from "
                     f"{str(record.get('billing_started_at') or record.get('launched_at', ''))[11:19]}"
                     f" to termination {str(record.get('terminated_at', ''))[11:19]} UTC) x "
                     f"{record.get('usd_per_hour') or 0:.4f} USD/h ({record.get('price_source')})"))
    return rows


def attempt_rows(attempts: list[dict]) -> list[tuple[str, str]]:
    """One line per instance of a managed run: where it ran, its bill, why it ended."""
    rows = []
    for a in attempts:
        usd = a.get("cost_usd")
        node = "" if a.get("node") is None else f" node {a['node']}"
        rows.append((f"attempt {a['attempt']}{node}", f"{a['instance_id']} {a['instance_type']} {a['market']} {a.get('zone') or ''}: "
                     f"{a.get('billed_seconds', 0):.0f} s, {'?' if usd is None else f'${usd:.4f}'}; {a['ended']}"))
    return rows


def _print_record(record: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(record, indent=2, default=str))
        return
    from rich.table import Table

    s = record.get("summary") or {}
    t = Table(title=f"run {record['run_id']}", show_header=False, box=None)
    rows = [("instance", f"{record.get('instance_id', 'local')} {record['instance_type']} "
             f"{record['market']} {record.get('zone') or ''}")]
    if record.get("task") not in (None, "mnist"):  # a user's task: its exit and its own summary.json
        rows += [("task", f"{record['task']}: exit {record.get('exit_status')}"),
                 ("summary", json.dumps(s, default=str)[:200] if s else "- (the job wrote no summary.json)")]
    else:
        rows += [("test accuracy", f"{100 * record['test_acc']:.2f}%" if record.get("test_acc") is not None else "-"),
                 ("training", f"{s.get('epochs')} epochs of {s.get('model')} on {s.get('device')}"
                  f"{' (' + s['gpu_name'] + ')' if s.get('gpu_name') else ''}: {s.get('train_seconds')} s train, "
                  f"{s.get('wall_seconds')} s wall")]
    rows += [(f"  {k}", f"{v:.1f} s") for k, v in record.get("phases", {}).items()]
    rows += cost_rows(record)
    if len(record.get("attempts") or []) > 1:  # several attempts, or a cluster's nodes
        rows += attempt_rows(record["attempts"])
    rows.append(("artifacts", record["artifacts"]))
    for k, v in rows:
        t.add_row(f"[bold]{k}[/]", v)
    out.print(t)


@train_app.command("mnist")
def train_mnist(
    instance_type: str = typer.Option(None, "--instance-type", "-t", help="GPU instance type, or several in order "
                                      "of preference: g4dn.xlarge,g5.xlarge,g6.xlarge (T4, A10G, L4). Each is tried "
                                      "in every zone that offers it before the next."),
    spot: bool = typer.Option(False, "--spot", help="Use a spot instance (one-time, terminated on interruption)."),
    spot_fallback: Optional[str] = typer.Option(None, "--spot-fallback", help="on-demand: when no zone or type has "
                                                "spot capacity, make a last on-demand try."),
    model: str = typer.Option("cnn", "--model", "-m", help="cnn (fast default), lenet, mlp or dbn."),
    epochs: Optional[int] = typer.Option(None, "--epochs", "-e", min=1, help="Epochs (default: the model preset's)."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the trainer."),
    keep: bool = typer.Option(False, "--keep", help="Leave the instance running afterwards (it still "
                              "terminates itself after --max-runtime)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where artifacts go (default runs/<run-id>/)."),
    local: bool = typer.Option(False, "--local", help="Train on this machine instead (needs torch)."),
    ssh_cidr: Optional[str] = typer.Option(None, "--ssh-cidr", help="CIDR allowed to SSH (default: your public IP/32)."),
    ami: Optional[str] = typer.Option(None, "--ami", help="AMI id (default: the AWS Deep Learning AMI, PyTorch)."),
    max_runtime: Optional[int] = typer.Option(None, "--max-runtime", min=1, help="Minutes after which the instance "
                                    "shuts itself down (= terminates), whatever happens to this command "
                                    "(default 120; --keep needs it given explicitly)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="MNIST directory for --local "
                                           "(default EC2GPU_DATA_DIR, else downloaded)."),
    trainer_arg: List[str] = typer.Option([], "--trainer-arg", help="Extra trainer flag, repeatable: "
                                          "--trainer-arg=--lr=0.05"),
    budget: Optional[float] = typer.Option(None, "--budget", min=0, help="Refuse the run (creating nothing) "
                                           "if its estimated cost in USD is above this."),
    max_price: Optional[float] = typer.Option(None, "--max-price", min=0, help="With --spot: the highest "
                                              "spot price to pay, USD/h (default: up to the on-demand price)."),
    on_cluster: Optional[str] = typer.Option(None, "--cluster", help="Train on the nodes a standing cluster has "
                                             "now (ec2gpu launch --nodes N --name NAME; torchrun --nnodes 1:N) "
                                             "and leave it running."),
    nodes: int = typer.Option(1, "--nodes", "-n", min=1, max=64, help="Instances that train together through "
                              "torchrun (c10d rendezvous on node 0), in one security group and a cluster placement "
                              "group where the type supports it."),
    max_attempts: Optional[int] = typer.Option(None, "--max-attempts", min=1, help="Instances to try before "
                                                "giving up: a lost instance (spot interruption, terminated, SSH "
                                                "unreachable) is replaced and training resumes from its last "
                                                "checkpoint (default 3 with --spot, else 1)."),
    checkpoint_uri: Optional[str] = typer.Option(None, "--checkpoint-uri", help="s3://BUCKET/PREFIX: also copy each "
                                                 "checkpoint there (from this machine; the instance gets no "
                                                 "credentials). Checkpoints always come home to --out."),
    unreachable_after: float = typer.Option(120.0, "--unreachable-after", min=5, help="Seconds of SSH "
                                            "unreachability after which the instance counts as lost."),
    region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
):
    """Launch a GPU instance, train MNIST on it, download the results, terminate everything.

    With --spot the run is managed: on an interruption the newest checkpoint (brought home as the
    trainer writes it) goes to a replacement instance, which resumes training.
    """
    from ..runs import pipeline

    if model not in ("cnn", "lenet", "mlp", "dbn"):
        raise UsageError(f"unknown model {model!r}", "choose cnn, lenet, mlp or dbn")
    if on_cluster and (nodes > 1 or spot or instance_type or keep):
        raise UsageError("--cluster trains on an existing cluster as it is",
                         "drop --nodes/--spot/--instance-type/--keep, or `ec2gpu scale NAME N` first")
    if keep and max_runtime is None:
        raise UsageError("--keep needs an explicit --max-runtime MINUTES",
                         "say how long the kept instance may live, e.g. --keep --max-runtime 240")
    max_runtime = max_runtime or 120
    if data_dir and not Path(data_dir).is_dir():
        raise UsageError(f"data directory {data_dir} does not exist", "pass a directory with the four MNIST files")
    opts = pipeline.TrainOptions(
        model=model, epochs=epochs, seed=seed, keep=keep, out=out_dir, ssh_cidr=ssh_cidr, ami=ami,
        spot=spot, trainer_args=list(trainer_arg), max_runtime_minutes=max_runtime,
        instance_type="g4dn.xlarge" if instance_type is None else instance_type, budget_usd=budget,
        max_price=max_price, spot_fallback=spot_fallback,
        max_attempts=max_attempts, checkpoint_uri=checkpoint_uri, unreachable_s=unreachable_after, nodes=nodes,
        command=" ".join(["ec2gpu"] + sys.argv[1:]) if sys.argv[0].endswith("ec2gpu") else "ec2gpu train mnist")
    ui = RichReporter(err)
    if local:
        from ..settings import load
        record = pipeline.train_local(opts, ui, data_dir, load())
    else:
        with Context(region, _sandbox_flag(sandbox)) as ctx:
            if instance_type is None:
                opts.instance_type = ctx.settings.instance_type
            if on_cluster:
                record = pipeline.train_on_cluster(ctx.aws, ctx.settings, opts, ui, on_cluster, ctx.resolver)
            else:
                record = pipeline.train(ctx.aws, ctx.settings, opts, ui, ctx.resolver)
    _print_record(record, as_json)


@app.command()
def launch(
    instance_type: str = typer.Option(None, "--instance-type", "-t", help="GPU instance type."),
    spot: bool = typer.Option(False, "--spot", help="Spot instead of on-demand."),
    name: Optional[str] = typer.Option(None, "--name", help="Name tag (default ec2gpu-<run-id>)."),
    ssh_cidr: Optional[str] = typer.Option(None, "--ssh-cidr", help="CIDR allowed to SSH (default: your IP/32)."),
    ami: Optional[str] = typer.Option(None, "--ami", help="AMI id (default: the AWS Deep Learning AMI)."),
    max_runtime: int = typer.Option(120, "--max-runtime", min=1, help="Minutes until it terminates itself (user data runs `shutdown -h +M`; whole minutes, 1 at least)."),
    nodes: int = typer.Option(1, "--nodes", "-n", min=1, max=64, help="A standing cluster of N nodes (tag "
                              "ec2gpu:cluster = NAME): one security group open between its members, a cluster "
                              "placement group where supported. `ec2gpu scale NAME N` resizes it."),
    region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
):
    """Launch an instance (or a cluster) and leave it running (until `ec2gpu down NAME` or --max-runtime)."""
    from ..aws import catalog
    from ..runs import pipeline

    with Context(region, _sandbox_flag(sandbox), persistent=True) as ctx:
        asked = ctx.settings.instance_type if instance_type is None else instance_type
        if any(not t.strip() for t in asked.split(",")):
            raise UsageError(f"--instance-type {asked!r} has an empty entry", "name each type, e.g. g4dn.xlarge")
        types = [catalog.lookup(t).name for t in asked.split(",")]
        ctx.aws.check_credentials()
        run_id = pipeline.new_run_id()
        opts = pipeline.TrainOptions(instance_type=",".join(types), spot=spot, name=name, ssh_cidr=ssh_cidr, ami=ami,
                                     max_runtime_minutes=max_runtime, nodes=nodes)
        prov = pipeline.Provisioned(run_id)
        ui = RichReporter(err, quiet=as_json)
        try:
            pipeline.provision(ctx.aws, ctx.settings, opts, run_id, ui, prov)
        except BaseException:
            pipeline.teardown(ctx.aws, ctx.settings, prov, ui)
            raise
        from ..aws.instances import summary
        rows = [summary(i) for i in prov.instances]
        if as_json:
            print(json.dumps(rows, indent=2))
        else:
            for r in rows:
                out.print(f"{r['name']}: {r['instance_id']} {r['instance_type']} {r['market']} {r['state']} "
                          f"{r['public_ip']}; `ec2gpu ssh {r['name']}` to log in, `ec2gpu down {r['name']}` to remove")


def _find(ctx: Context, name: str) -> list[dict]:
    from ..aws import sweep
    from ..aws import tags as T

    found = [i for i in sweep.find_instances(ctx.aws.ec2, states=["pending", "running"])
             if name in (i["InstanceId"], *(T.as_dict(i.get("Tags")).get(k) for k in (T.NAME, T.RUN, T.CLUSTER)))]
    if not found:
        raise UsageError(f"no running instance named {name!r}", "see `ec2gpu ls`")
    return found


@app.command()
def scale(name: str = typer.Argument(..., help="The standing cluster's name (ec2gpu launch --nodes N --name NAME)."),
          nodes: int = typer.Argument(..., help="How many nodes it should have (at least 1; node 0 always stays)."),
          max_runtime: int = typer.Option(120, "--max-runtime", min=5, help="Minutes until new nodes terminate "
                                          "themselves."),
          region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Grow or shrink a standing cluster; new nodes join its security group, zone and placement group."""
    from ..aws import clusters

    with Context(region, _sandbox_flag(sandbox), persistent=True) as ctx:
        ctx.aws.check_credentials()
        done = clusters.scale(ctx.aws, ctx.settings, name, nodes, max_runtime, log=lambda m: err.print(f"[dim]{m}[/]"))
    if as_json:
        print(json.dumps(done, indent=2))
    elif not done["added"] and not done["removed"]:
        out.print(f"{name} already has {done['nodes']} node(s)")
    else:
        change = f"added {', '.join(done['added'])}" if done["added"] else f"removed {', '.join(done['removed'])}"
        out.print(f"{name}: {change}; {done['nodes']} node(s) now")


@app.command("ls")
def ls(region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """List the instances this tool launched that are still alive: age, price and cost so far."""
    from datetime import datetime, timezone

    from ..aws import catalog, instances, sweep

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        rows = [instances.summary(i) for i in sweep.find_instances(ctx.aws.ec2)]
        now = datetime.now(timezone.utc)
        for r in rows:
            age = (now - datetime.fromisoformat(r["launched_at"])).total_seconds() if r["launched_at"] else 0.0
            price = catalog.on_demand_price(r["instance_type"], ctx.aws.region, ctx.settings.home) \
                if r["instance_type"] in catalog.CATALOG else catalog.Price(None, "not a catalog type")
            r.update(age_seconds=round(age), usd_per_hour=price.usd_per_hour, price_source=price.source,
                     cost_so_far_usd=None if price.usd_per_hour is None else
                     round(max(60.0, age) * price.usd_per_hour / 3600, 4))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        out.print("no ec2gpu instances are running")
        return
    from rich.table import Table
    from rich import box
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, padding=(0, 1))
    for col in ("name", "instance id", "type", "zone", "state", "age", "$/h", "so far $"):
        t.add_column(col, overflow="fold")
    rows.sort(key=lambda r: (r["cluster"] is None, r["cluster"] or "", r["node"] or 0, r["launched_at"] or ""))
    group = object()  # no group yet
    for r in rows:
        if r["cluster"] != group:  # one section per cluster, then the single instances
            if r is not rows[0]:
                t.add_section()
            group = r["cluster"]
            if group is not None:
                n = sum(1 for x in rows if x["cluster"] == group)
                t.add_row(f"[bold]cluster {group}[/]", f"{n} node(s)", "", "", "", "", "", "")
        m, sec = divmod(r["age_seconds"], 60)
        t.add_row(r["name"], r["instance_id"], r["instance_type"] + (" spot" if r["market"] == "spot" else ""),
                  r["zone"] or "", r["state"], f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{sec:02d}s",
                  "-" if r["usd_per_hour"] is None else f"{r['usd_per_hour']:.4f}",
                  "-" if r["cost_so_far_usd"] is None else f"{r['cost_so_far_usd']:.4f}")
    out.print(t)
    if any(r["market"] == "spot" for r in rows):
        out.print("[dim]spot instances are shown at the on-demand price (their ceiling); the bill uses the spot "
                  "price history[/]")


@app.command()
def cleanup(dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
            all_regions: bool = typer.Option(False, "--all-regions", help="Every region the account can use."),
            region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Find by tag and remove everything ec2gpu created: instances, spot requests, security groups,
    key pairs (and their local key files)."""
    from ..aws import sweep
    from ..aws.session import Aws

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        ctx.aws.check_credentials()
        regions = [ctx.aws.region]
        if all_regions:
            known = set(ctx.aws.partition_regions())  # describe_regions may list other partitions' (China, GovCloud)
            regions = sorted(r["RegionName"] for r in ctx.aws.ec2.describe_regions()["Regions"] if r["RegionName"] in known)
        report = {}
        for name in regions:
            aws = ctx.aws if name == ctx.aws.region else Aws(name, endpoint_url=ctx.aws.endpoint_url)
            found = sweep.inventory(aws.ec2)
            if not any(found.values()):
                continue
            if dry_run:
                report[name] = {k: [r["id"] for r in v] for k, v in found.items()}
            else:
                report[name] = sweep.delete_everything(aws.ec2, found, ctx.settings.keys_dir,
                                                       log=lambda m, n=name: err.print(f"[dim]{n}: {m}[/]"))
    if as_json:
        print(json.dumps({"dry_run": dry_run, "regions": report}, indent=2))
        return
    if not report:
        out.print(f"nothing of ec2gpu's found in {', '.join(regions) if len(regions) < 4 else f'{len(regions)} regions'}")
        return
    verb = "would remove" if dry_run else "removed"
    for name, kinds in report.items():
        out.print(f"{name}: {verb} " + "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in kinds.items() if v))
    if dry_run:
        out.print("[dim]run again without --dry-run to remove them[/]")


@app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh_cmd(ctx_: typer.Context, name: str = typer.Argument(..., help="Name, instance id or run id."),
            region: Optional[str] = REGION, sandbox: bool = SANDBOX):
    """Open a shell on an instance, or run a command after `--`: ec2gpu ssh NAME -- nvidia-smi.

    Uses the config `ec2gpu ssh-config` writes and the instance's pinned host key (verified against
    its console output first if it is not pinned yet): OpenSSH refuses any other key."""
    import shutil
    import subprocess

    from ..aws import instances, network
    from ..remote import ssh
    from ..remote.ssh import target as ssh_target

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        inst = _find(ctx, name)[0]
        iid = inst["InstanceId"]
        known = ctx.settings.home / "known_hosts" / iid
        if not (known.is_file() and known.stat().st_size):
            host, port = ssh_target(inst, ctx.resolver)
            key = network.require_private_key(ctx.settings.keys_dir, inst["KeyName"])
            ssh.wait_for_ssh(host, port, ctx.settings.ssh_user, key, known, timeout_s=ssh.FINGERPRINT_WAIT_S + 60,
                             log=lambda m: err.print(f"[dim]{m}[/]", highlight=False),
                             fingerprints=lambda: instances.host_key_fingerprints(ctx.aws.ec2, iid)).close()
        config, _, _ = _write_ssh_config(ctx)
        argv = [shutil.which("ssh") or "ssh", "-F", str(config), "-o", "LogLevel=ERROR", iid, *ctx_.args]
        code = subprocess.call(argv)
    raise typer.Exit(code)


@app.command()
def logs(name: str = typer.Argument(..., help="Run id, name or instance id."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends, "
                                     "reconnecting when SSH drops (no line missed or repeated)."),
         region: Optional[str] = REGION, sandbox: bool = SANDBOX):
    """Print a run's job log (job.log: the job's output, byte for byte) from its instance, or from
    the artifacts once the run is over. With --follow, exit with the job's exit status."""
    from ..aws import instances, network
    from ..aws import tags as T
    from ..errors import RemoteError
    from ..remote import jobs, ssh
    from ..runs import ledger
    from ..remote.ssh import target as ssh_target

    stdout = sys.stdout.buffer

    def write(chunk: bytes) -> None:
        stdout.write(chunk)
        stdout.flush()

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        try:
            inst = _find(ctx, name)[0]
        except UsageError:
            inst = None
        if inst is None:  # over: the log as it was brought home
            try:
                artifacts = Path(ledger.get(ctx.settings.home, name).get("artifacts") or "")
                path = next((p for p in (artifacts / "job.log", artifacts / "job-node-0.log") if p.is_file()),
                            artifacts / "job.log")
            except UsageError as exc:
                raise UsageError(f"no running instance named {name!r}, and {exc.message}", "see `ec2gpu ls` and `ec2gpu runs`")
            if not path.is_file():
                raise UsageError(f"run {name!r} has no instance left and no log at {path}",
                                 "its artifacts were moved or never downloaded")
            write(path.read_bytes())
            return
        run_id, iid = T.as_dict(inst.get("Tags")).get(T.RUN), inst["InstanceId"]
        host, port = ssh_target(inst, ctx.resolver)
        key = network.require_private_key(ctx.settings.keys_dir, inst["KeyName"])
        known = ctx.settings.home / "known_hosts" / iid
        note = lambda m: err.print(f"[dim]{m}[/]", highlight=False)  # noqa: E731
        conn = ssh.wait_for_ssh(host, port, ctx.settings.ssh_user, key, known, timeout_s=60, log=note,
                                fingerprints=lambda: instances.host_key_fingerprints(ctx.aws.ec2, iid))
        run_dir = jobs.remote_run_dir(conn, run_id)
        cursor = jobs.LogCursor(write)
        status = None
        try:
            if follow:
                try:
                    status, conn = jobs.follow_reconnecting(
                        lambda: ssh.connect(host, port, ctx.settings.ssh_user, key, known, note), run_dir,
                        "job.log", cursor, conn=conn, log=note)
                except jobs.Unreachable as exc:
                    raise RemoteError(f"{iid}: {exc}", "see `ec2gpu ls`; the instance may have been terminated")
            else:
                cursor.deliver(jobs.read_from(conn, f"{run_dir}/job.log", 0))
        finally:
            conn.close()
    if follow:
        err.print(f"[dim]the job on {iid} ended with exit status {status}; `ec2gpu down {run_id}` removes the instance[/]")
        raise typer.Exit(status)


@app.command()
def doctor(instance_type: Optional[str] = typer.Option(None, "--instance-type", "-t", help="The type to check for."),
           spot: bool = typer.Option(False, "--spot", help="Check the spot quota instead of on-demand."),
           region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Check credentials, region, default VPC, GPU quota, AMI, your IP, prices, ssh and key files."""
    from ..runs import doctor as doc

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        checks = doc.run_checks(ctx.aws, ctx.settings, instance_type or ctx.settings.instance_type, spot,
                                bool(ctx.resolver))
    failed = [c for c in checks if c.ok is False]
    if as_json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        for c in checks:
            mark = {True: "[green]ok  [/]", False: "[red]FAIL[/]", None: "[yellow]?   [/]"}[c.ok]
            out.print(f"{mark} {c.name}: {c.detail}" + (f"\n     [yellow]fix:[/] {c.fix}" if c.fix and not c.ok else ""),
                      highlight=False)
        unknown = [c.name for c in checks if c.ok is None]
        out.print((f"{len(checks) - len(failed) - len(unknown)} of {len(checks)} checks passed" if not failed else
                   f"[red]{len(failed)} check(s) failed[/]: {', '.join(c.name for c in failed)}") +
                  (f"; could not tell: {', '.join(unknown)}" if unknown else ""))
    if failed:
        raise typer.Exit(1)


def _write_ssh_config(ctx: Context) -> tuple[Path, list, list[str]]:
    """Write $EC2GPU_HOME/ssh_config for every running instance whose key is here: (path, entries,
    instance ids skipped for want of their private key)."""
    from ..aws import network, sweep
    from ..aws import tags as T
    from ..remote import ssh_config as sc
    from ..remote.ssh import target as ssh_target

    entries, skipped = [], []
    for inst in sweep.find_instances(ctx.aws.ec2, states=["running"]):
        key = network.private_key_path(ctx.settings.keys_dir, inst.get("KeyName") or "")
        if not key.exists():
            skipped.append(inst["InstanceId"])
            continue
        host, port = ssh_target(inst, ctx.resolver)
        name = T.as_dict(inst.get("Tags")).get(T.NAME)
        entries.append(sc.HostEntry(tuple(a for a in (name, inst["InstanceId"]) if a), host, port,
                                    ctx.settings.ssh_user, key, ctx.settings.home / "known_hosts" / inst["InstanceId"]))
    path = ctx.settings.home / "ssh_config"
    (ctx.settings.home / "known_hosts").mkdir(parents=True, exist_ok=True)  # OpenSSH won't create it
    sc.write(path, sc.render(entries, path))
    return path, entries, skipped


@app.command("ssh-config")
def ssh_config(region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Write ~/.ec2gpu/ssh_config so plain `ssh NAME`, scp and editors reach the running instances."""
    with Context(region, _sandbox_flag(sandbox)) as ctx:
        path, entries, skipped = _write_ssh_config(ctx)
    if as_json:
        print(json.dumps({"path": str(path), "hosts": [e.aliases[0] for e in entries], "skipped": skipped}, indent=2))
        return
    out.print(f"wrote {path} with {len(entries)} host(s): {', '.join(e.aliases[0] for e in entries) or '-'}")
    if skipped:
        out.print(f"[yellow]skipped[/] {', '.join(skipped)}: their private keys are not on this machine")
    out.print(f"[dim]add this line to ~/.ssh/config once: Include {path}[/]")


@app.command()
def down(name: Optional[str] = typer.Argument(None, help="Name, instance id or run id."),
         all_: bool = typer.Option(False, "--all", help="Remove everything ec2gpu created in the region."),
         region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Terminate instances and delete their security groups and key pairs."""
    from ..aws import sweep
    from ..aws import tags as T

    if bool(name) == all_:
        raise UsageError("say which instances to remove", "ec2gpu down NAME, or ec2gpu down --all")
    with Context(region, _sandbox_flag(sandbox)) as ctx:
        ec2 = ctx.aws.ec2
        if all_:
            runs = {T.as_dict(r.get("Tags")).get(T.RUN) for r in
                    sweep.find_instances(ec2) + sweep.find_security_groups(ec2) + sweep.find_key_pairs(ec2)}
        else:
            runs = {T.as_dict(i.get("Tags")).get(T.RUN) for i in _find(ctx, name)}
        removed = {}
        for run_id in sorted(r for r in runs if r):
            removed[run_id] = sweep.delete_run(ec2, run_id, ctx.settings.keys_dir,
                                               log=lambda m: err.print(f"[dim]{m}[/]"))
    if as_json:
        print(json.dumps(removed, indent=2))
    elif not removed:
        out.print("nothing to remove")
    else:
        for run_id, r in removed.items():
            out.print(f"run {run_id}: removed " + "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}"
                                                          for k, v in r.items() if v))


@sandbox_app.command("up")
def sandbox_up(like_aws: bool = typer.Option(False, "--like-aws", help="Behave like EC2 where moto does not: "
                                             "instances pending for a few seconds, sshd and the console's host key "
                                             "fingerprints later still, NotFound for just-created resources now and "
                                             "then, occasional RequestLimitExceeded (docs/sandbox.md). Also "
                                             "EC2GPU_SANDBOX_LIKE_AWS=1."),
               as_json: bool = JSON):
    """Start the sandbox in the background; it keeps its state until `ec2gpu sandbox down`."""
    from ..sandbox import control
    from ..settings import load
    state = control.up(load().home, like_aws=like_aws or None)
    if like_aws and not state.get("like_aws"):
        err.print("[yellow]a sandbox without --like-aws is already running; `ec2gpu sandbox down` first[/]")
    print(json.dumps(state, indent=2)) if as_json else out.print(
        f"sandbox up{' (like AWS)' if state.get('like_aws') else ''}: AWS endpoint {state['endpoint']} "
        f"(pid {state['pid']}); `eval \"$(ec2gpu sandbox env)\"` points any AWS client at it")


@sandbox_app.command("down")
def sandbox_down():
    """Stop the sandbox and every sshd and process it started."""
    from ..sandbox import control
    from ..settings import load
    out.print("sandbox stopped" if control.down(load().home) else "no sandbox was running")


@sandbox_app.command("status")
def sandbox_status(as_json: bool = JSON):
    """Say whether the sandbox runs, where, and which instances have an sshd."""
    from ..sandbox import control
    from ..settings import load
    state = control.read_state(load().home)
    if as_json:
        print(json.dumps(state or {"running": False}, indent=2))
    elif not state:
        out.print("no sandbox is running (`ec2gpu sandbox up` starts one)")
    else:
        out.print(f"sandbox running: pid {state['pid']}, AWS endpoint {state['endpoint']}, "
                  f"{len(state['instances'])} instance(s)")
        for iid, i in state["instances"].items():
            out.print(f"  {iid}: sshd {i['host']}:{i['port']} (pid {i['sshd_pid']})")


@sandbox_app.command("interrupt")
def sandbox_interrupt(instance_id: str = typer.Argument(..., help="A running spot instance of the sandbox."),
                      notice_seconds: float = typer.Option(120.0, "--notice-seconds", min=0,
                                                           help="Seconds between the notice and the termination "
                                                           "(EC2 gives 120)."),
                      as_json: bool = JSON):
    """Interrupt a spot instance as EC2 does: a notice on its metadata service, then termination."""
    from ..sandbox import control
    from ..settings import load
    done = control.interrupt(load().home, instance_id, notice_seconds)
    if as_json:
        print(json.dumps(done, indent=2))
    else:
        out.print(f"{instance_id}: spot interruption notice published (action {done['notice']['action']} at "
                  f"{done['notice']['time']}); the sandbox terminates it in {notice_seconds:g} s")


@sandbox_app.command("env")
def sandbox_env():
    """Print `export` lines that point AWS clients (boto3, the aws CLI) at the running sandbox."""
    import shlex

    from ..errors import SandboxError
    from ..sandbox import control
    from ..settings import load
    state = control.read_state(load().home)
    if not state:
        raise SandboxError("no sandbox is running", "start it with `ec2gpu sandbox up`")
    for k, v in control.env_vars(state).items():
        print(f"export {k}={shlex.quote(v)}")


from . import costs as _costs  # noqa: E402,F401  (registers prices, cost, runs)
from . import tasks as _tasks  # noqa: E402,F401  (registers run, exec)


def _click_errors(name: str) -> tuple[type, ...]:
    """click's exception class ``name``, from click and from the copy typer >= 0.2x vendors as
    ``typer._click`` (a usage error raised by typer is not a ``click.ClickException``)."""
    import importlib
    found = []
    for module in ("click.exceptions", "typer._click.exceptions"):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _aws_error(exc: Exception):
    """An AwsError (exit 3) for a botocore error (its code, message and operation), else None."""
    import sys as _sys
    if "botocore" not in _sys.modules:  # nothing AWS ran: not an AWS error (and no import for it)
        return None
    import botocore.exceptions

    from ..errors import AwsError
    if isinstance(exc, botocore.exceptions.ClientError):
        e = exc.response.get("Error", {})
        code, op = e.get("Code", "?"), getattr(exc, "operation_name", "?")
        hint = ("these credentials lack the permission: see docs/iam-policy.json"
                if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure")
                else "AWS's own words are above; `ec2gpu doctor` checks every precondition")
        return AwsError(f"AWS refused {op}: {code}: {e.get('Message', '')}", hint + "; anything the run made is "
                        "removed by its teardown, or by `ec2gpu cleanup`")
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return AwsError(f"AWS could not be reached or asked: {exc}",
                        "check the network and credentials (`ec2gpu doctor`); `ec2gpu cleanup` removes what a "
                        "run may have left")
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code. The only place exceptions become messages."""
    global DEBUG
    argv = list(sys.argv[1:] if argv is None else argv)
    DEBUG = "--debug" in argv or os.environ.get("EC2GPU_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    import signal

    def on_sigterm(*_):
        raise KeyboardInterrupt  # same path as Ctrl-C: clean up, exit 130
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        # without standalone mode, click/typer *return* the code of typer.Exit and 130 for Ctrl-C
        code = app(args=argv, prog_name="ec2gpu", standalone_mode=False)
        if code == ExitCode.CTRL_C:
            raise KeyboardInterrupt
        return code if isinstance(code, int) else 0
    except Ec2GpuError as exc:
        if DEBUG:
            raise
        err.print(f"[red]error:[/] {exc.message}", highlight=False, markup=True)
        if getattr(exc, "tail", ""):
            err.print(exc.tail, highlight=False, markup=False)
        if exc.hint:
            err.print(f"[yellow]hint:[/] {exc.hint}", highlight=False)
        return int(exc.exit_code)
    except _click_errors("Exit") as exc:
        return exc.exit_code
    except (*_click_errors("Abort"), KeyboardInterrupt):
        err.print("interrupted: what this command created was removed (see above)")
        return ExitCode.CTRL_C
    except _click_errors("ClickException") as exc:
        exc.show()
        return ExitCode.USAGE
    except Exception as exc:  # the one boundary: an AWS error the layers below did not map, or a bug
        if DEBUG:
            raise
        aws = _aws_error(exc)
        if aws is not None:
            err.print(f"[red]error:[/] {aws.message}", highlight=False)
            err.print(f"[yellow]hint:[/] {aws.hint}", highlight=False)
            return int(aws.exit_code)
        from rich.text import Text
        err.print(Text.assemble(("error:", "red"), f" {type(exc).__name__}: {exc}"), highlight=False)
        err.print("[yellow]hint:[/] run again with --debug for the traceback")
        return ExitCode.ERROR


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
