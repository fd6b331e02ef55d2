"""Standing instances and clusters: launch, stop, start, scale, ls, down, cleanup, doctor."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

import typer

from .. import words
from .app import JSON, REGION, SANDBOX, _sandbox_flag, app
from .render import RichReporter, err, note, out, plain, render_json, say, table, table_row, warn

if TYPE_CHECKING:  # aws/ is imported inside the commands (`ec2gpu --help` stays fast)
    from ..aws.instances import IdleRule
    from ..api.instances import InstanceRow




def _one_line(text: str) -> None:
    """A step's note on stderr, dim, on one line however wide (a script or a log keeps it whole)."""
    say(err, text, "dim", soft_wrap=True)


def _yellow(text: str) -> None:
    """A note that needs the user's eye (a bill settled, a run that could not be reached), on stderr."""
    note(text, "yellow")


@app.command()
def launch(
    instance_type: str = typer.Option(None, "--instance-type", "-t", help="GPU instance type."),
    spot: bool = typer.Option(False, "--spot", help="Spot instead of on-demand."),
    name: Optional[str] = typer.Option(None, "--name", help="Name tag (default ec2gpu-<run-id>)."),
    ssh_cidr: Optional[str] = typer.Option(None, "--ssh-cidr", help="CIDR allowed to SSH (default: your IP/32)."),
    ami: Optional[str] = typer.Option(None, "--ami", help="AMI id (default: the AWS Deep Learning AMI)."),
    max_runtime: Optional[int] = typer.Option(None, "--max-runtime", min=1, help="Minutes until it ends itself "
                                              "(user data runs `shutdown -h +M`: it terminates, or with --idle-stop "
                                              "stops; default 120, required with --no-idle)."),
    idle_stop: Optional[str] = typer.Option(None, "--idle-stop", help="Stop itself (disk kept, `ec2gpu start` brings "
                                            "it back) after this long idle: no job, no SSH connection, every GPU "
                                            "under 5% (30m, 1h). Then --max-runtime stops it too. On-demand only."),
    idle_down: Optional[str] = typer.Option(None, "--idle-down", help="Terminate itself after this long idle "
                                            "(default 60m)."),
    no_idle: bool = typer.Option(False, "--no-idle", help="No idle rule (then --max-runtime must be given)."),
    nodes: int = typer.Option(1, "--nodes", "-n", min=1, max=64, help="A standing cluster of N nodes (tag "
                              "ec2gpu:cluster = NAME): one security group open between its members, a cluster "
                              "placement group where supported. `ec2gpu scale NAME N` resizes it."),
    region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
) -> None:
    """Launch an instance (or a cluster) and leave it running, until it idles out or is taken down.

    It lives until `ec2gpu down NAME`, its idle rule (by default it terminates itself after 60
    idle minutes: no job, no SSH connection, GPUs under 5%) or --max-runtime, whichever comes first."""
    from .. import api
    from ..api import instances as ops

    idle = api.idle_rule(idle_stop, idle_down, no_idle, max_runtime, spot)
    rows = ops.launch(instance_type=instance_type, spot=spot, name=name, ssh_cidr=ssh_cidr, ami=ami,
                      max_runtime=max_runtime, idle_stop=idle_stop, idle_down=idle_down, no_idle=no_idle, nodes=nodes,
                      region=region, sandbox=_sandbox_flag(sandbox), reporter=RichReporter(err, quiet=as_json),
                      log=note, warn=_yellow)
    if as_json:
        render_json(rows)
    else:
        for r in rows:
            say(out, f"{r.name}: {r.instance_id} {r.instance_type} {r.market} {r.state} "
                f"{r.public_ip}; `ec2gpu ssh {r.name}` to log in, `ec2gpu down {r.name}` to remove")
        say(out, lifetime_words(idle, max_runtime or 120, len(rows)))


def lifetime_words(idle: IdleRule | None, max_runtime_minutes: int, count: int = 1) -> str:
    """What `launch` set for how its instances end (pure): the idle rule (an aws.instances.IdleRule,
    None for --no-idle) and the --max-runtime shutdown that user data schedules at first boot
    (InstanceInitiatedShutdownBehavior: stop with --idle-stop, else terminate)."""
    it = "it" if count == 1 else "each"
    if idle is None:
        return (f"no idle rule (--no-idle): {it} terminates itself {max_runtime_minutes} min after it boots "
                "(--max-runtime)")
    busy = "no job, no SSH connection, GPUs under 5%"
    if idle.action == "stop":
        return (f"{it} stops itself after {_duration(idle.seconds)} idle (--idle-stop: {busy}; its EBS disk is kept, "
                f"`ec2gpu start` brings it back) or {max_runtime_minutes} min after it boots (--max-runtime), whichever "
                "comes first")
    return (f"{it} terminates itself after {_duration(idle.seconds)} idle (--idle-down: {busy}) or "
            f"{max_runtime_minutes} min after it boots (--max-runtime), whichever comes first")


@app.command()
def stop(name: str = typer.Argument(..., help="Name, instance id or cluster of a standing on-demand instance."),
         region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Stop a standing on-demand instance (or cluster): keep the EBS disk, stop paying for the GPU.

    The EBS disk is billed per GB-month (`ec2gpu ls` shows how much); what was on the type's
    instance-store NVMe, if it has one (/opt/dlami/nvme on the Deep Learning AMI), is lost.
    `ec2gpu start NAME` brings it back. Spot instances cannot be stopped (say `ec2gpu down NAME`)."""
    from ..api import instances as ops
    rows = ops.stop(name, region=region, sandbox=_sandbox_flag(sandbox), log=note, warn=_yellow)
    if as_json:
        render_json(rows)
        return
    for r in rows:
        say(out, stopped_words(r.to_json(), name))


def stopped_words(r: Mapping[str, Any], name: str) -> str:
    """What `stop` says of one stopped instance (pure; ``r`` as runs/standing/stopstart.stop returns it):
    its EBS disk is kept and billed, and its instance-store NVMe, where the type has one, was
    erased (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-store-lifetime.html)."""
    gb = r.get("instance_store_gb")
    nvme = "instance-store NVMe (/opt/dlami/nvme on the Deep Learning AMI)"
    lost = (f"; its {gb:,} GB {nvme} was erased: what was there is lost" if gb else
            f"; if {r['instance_type']} has {nvme}, what was there is lost" if gb is None else "")
    return (f"{r['name'] or r['instance_id']}: {r['state']}; its EBS disk is kept and billed (`ec2gpu ls`){lost}; "
            f"`ec2gpu start {name}` brings it back, `ec2gpu down {name}` removes it")


@app.command()
def start(name: str = typer.Argument(..., help="Name, instance id or cluster of a stopped instance."),
          region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Start a stopped instance (or cluster) again.

    Waits until it answers SSH with its pinned host key at its new address, and schedules its
    --max-runtime shutdown again (a stop cancels it)."""
    from ..api import instances as ops
    rows = ops.start(name, region=region, sandbox=_sandbox_flag(sandbox), log=note, warn=_yellow)
    if as_json:
        render_json(rows)
        return
    for r in rows:
        say(out, f"{r.name or r.instance_id}: {r.state} at {r.public_ip or '-'}; "
            f"`ec2gpu ssh {name}` to log in")


@app.command()
def scale(name: str = typer.Argument(..., help="The standing cluster's name (ec2gpu launch --nodes N --name NAME)."),
          nodes: int = typer.Argument(..., help="How many nodes it should have (at least 1; node 0 always stays)."),
          max_runtime: int = typer.Option(120, "--max-runtime", min=5, help="Minutes until new nodes terminate "
                                          "themselves."),
          region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Grow or shrink a standing cluster; new nodes join its security group, zone and placement group.

    Each new node's host key is pinned under its instance id, checked against its console output,
    as `launch` does, and $EC2GPU_HOME/ssh_config is written again; a node whose key cannot be
    pinned is terminated."""
    from ..api import instances as ops
    done = ops.scale(name, nodes, max_runtime=max_runtime, region=region, sandbox=_sandbox_flag(sandbox), log=note,
                     warn=_yellow)
    if as_json:
        render_json(done)
    elif not done.added and not done.removed:
        say(out, f"{name} already has {words.count(done.nodes, 'node')}")
    else:
        change = f"added {', '.join(done.added)}" if done.added else f"removed {', '.join(done.removed)}"
        say(out, f"{name}: {change}; {words.count(done.nodes, 'node')} now")


def _idle_cell(r: InstanceRow) -> str:
    from ..aws import instances
    rule = instances.parse_idle_tag(r.idle_rule)
    if rule is None:
        return "-"
    text = f"{rule.action} after {_duration(rule.seconds)}"
    if r.idle_seconds is not None:
        return f"{text}; idle {_duration(r.idle_seconds)}"
    return f"{text}; busy ({r.busy})" if r.busy else text


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    if m >= 60:
        return f"{m // 60}h{m % 60:02d}m"
    return (f"{m}m{s:02d}s" if s else f"{m}m") if m else f"{s}s"


def _state_cell(r: InstanceRow) -> str:
    if r.disk_usd_per_month is None:
        return r.state
    return f"{r.state}: disk {r.disk_gib} GiB, ${r.disk_usd_per_month:.2f}/month"


@app.command("ls")
def ls(region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """List the instances this tool launched that are still alive: age, price and cost so far."""
    from ..api import instances as ops
    rows = ops.list_instances(region=region, sandbox=_sandbox_flag(sandbox), log=_one_line, warn=_yellow)
    if as_json:
        render_json(rows)
        return
    if not rows:
        say(out, "no ec2gpu instances are running or stopped")
        return
    from rich import box
    t = table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, padding=(0, 1))
    for col in ("name", "instance id", "type", "zone", "state", "idle rule", "age", "$/h", "so far $"):
        if col == "instance id":  # what a user copies: it never wraps or shrinks; the other columns fold
            t.add_column(col, no_wrap=True, min_width=max(len(r.instance_id) for r in rows))
        else:
            t.add_column(col, overflow="fold")
    rows.sort(key=lambda r: (r.cluster is None, r.cluster or "", r.node or 0, r.launched_at or ""))
    group: object = object()  # no group yet
    for r in rows:
        if r.cluster != group:  # one section per cluster, then the single instances
            if r is not rows[0]:
                t.add_section()
            group = r.cluster
            if group is not None:
                n = sum(1 for x in rows if x.cluster == group)
                table_row(t, plain(f"cluster {group}", "bold"), f"{words.count(n, 'node')}", "", "", "", "", "", "", "")
        m, sec = divmod(r.age_seconds, 60)
        # tags are set by ec2gpu, but anyone with the account's rights can change them: cells inert, never markup
        table_row(t, r.name, r.instance_id, r.instance_type + (" spot" if r.market == "spot" else ""),
                  r.zone or "", _state_cell(r), _idle_cell(r),
                  f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{sec:02d}s",
                  "-" if r.usd_per_hour is None else f"{r.usd_per_hour:.4f}",
                  "-" if r.cost_so_far_usd is None else f"{r.cost_so_far_usd:.4f}")
    say(out, t)
    for r in rows:
        if r.unsafe_tags:
            warn(f"{r.instance_id}: its {', '.join(r.unsafe_tags)} tag has characters that are not safe to "
                 "show or paste into a command; left out (use the instance id)")
    if any(r.market == "spot" for r in rows):
        say(out, "spot instances are shown at the on-demand price (their ceiling); the bill uses the spot "
            "price history", "dim")


@app.command()
def cleanup(dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
            all_regions: bool = typer.Option(False, "--all-regions", help="Every region the account can use."),
            no_fetch: bool = typer.Option(False, "--no-fetch", help="Do not bring home first what the jobs of runs "
                                          "whose controller died wrote (it is, by default)."),
            region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Find by tag and remove everything ec2gpu created.

    Auto Scaling groups (before their instances, which they would replace), instances, spot
    requests, security groups, key pairs (and their local key files), placement groups, instance
    roles, launch templates, and the images and snapshots of bakes that did not complete (a
    complete baked image stays: `ec2gpu image rm`). Runs whose controller died get their files brought home first (this
    region) and their bills settled."""
    from ..api import instances as ops
    swept = ops.cleanup(dry_run=dry_run, all_regions=all_regions, fetch=not no_fetch, region=region,
                        sandbox=_sandbox_flag(sandbox), log=_one_line, warn=_yellow)
    report, regions = swept.regions, swept.searched
    if as_json:
        render_json({"dry_run": dry_run, "regions": report})
        raise typer.Exit(1 if any(r.get("left") for r in report.values()) else 0)
    if not report:
        say(out, f"nothing of ec2gpu's found in {', '.join(regions) if len(regions) < 4 else f'{len(regions)} regions'}")
        return
    verb = "would remove" if dry_run else "removed"
    for name, kinds in report.items():
        done = _removed_words(kinds)
        if done:
            say(out, f"{name}: {verb} {done}")
    if dry_run:
        say(out, "run again without --dry-run to remove them", "dim")
    _left(report)


def _removed_words(kinds: Mapping[str, list[str]]) -> str:
    """'security groups sg-1; key pairs k' of a sweep's report, without what is left (pure)."""
    return "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in kinds.items() if v and k != "left")


def _left(report: Mapping[str, Mapping[str, list[str]]]) -> None:
    """Say what a sweep could not remove (its "left" entries, by region or run) and exit 1 when
    there is any: the rest was removed (aws/sweep.delete_everything is best-effort)."""
    left = [f"{where}: {', '.join(r['left'])}" for where, r in report.items() if r.get("left")]
    if left:
        warn("could not remove " + "; ".join(left) + " (run `ec2gpu cleanup` again once AWS lets go of them)")
        raise typer.Exit(1)


@app.command()
def doctor(instance_type: Optional[str] = typer.Option(None, "--instance-type", "-t", help="The type to check for."),
           spot: bool = typer.Option(False, "--spot", help="Check the spot quota instead of on-demand."),
           region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Check credentials, region, default VPC, GPU quota, AMI, your IP, prices, ssh, rsync and key files.

    Exit 0 when no check fails; 3 without usable AWS credentials (nothing else can be asked, as
    for every command); 1 when another check fails."""
    from ..api import instances as ops
    from ..runs.plan import doctor as doc
    checks = ops.doctor(instance_type=instance_type, spot=spot, region=region, sandbox=_sandbox_flag(sandbox), log=note)
    failed = [c for c in checks if c.ok is False]
    if as_json:
        render_json([c.as_dict() for c in checks])
    else:
        for c in checks:  # a check's detail and fix may quote AWS's words: plain text
            mark, style = {True: ("ok  ", "green"), False: ("FAIL", "red"), None: ("?   ", "yellow")}[c.ok]
            say(out, f"{c.name}: {c.detail}", label=mark, label_style=style)
            if c.fix and not c.ok:
                say(out, c.fix, label="     fix:", label_style="yellow")
        unknown = [c.name for c in checks if c.ok is None]
        could_not = f"; could not tell: {', '.join(unknown)}" if unknown else ""
        if failed:
            say(out, f"{', '.join(c.name for c in failed)}{could_not}", label=f"{words.count(len(failed), 'check')} failed:",
                label_style="red")
        else:
            say(out, f"{len(checks) - len(unknown)} of {len(checks)} checks passed{could_not}")
    if failed:
        raise typer.Exit(doc.exit_code(checks))


@app.command()
def down(name: Optional[str] = typer.Argument(None, help="Name, instance id or run id."),
         all_: bool = typer.Option(False, "--all", help="Remove everything ec2gpu created in the region."),
         no_fetch: bool = typer.Option(False, "--no-fetch", help="Do not bring home first what the job of a run "
                                       "whose controller died wrote (it is, by default)."),
         region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Terminate instances and delete their security groups and key pairs.

    A run whose controller died (`ec2gpu runs` says so) gets its outputs, checkpoints and log
    brought home first, and its bill settled from the instances' own times."""
    from ..api import instances as ops
    removed = ops.down(name, all=all_, fetch=not no_fetch, region=region, sandbox=_sandbox_flag(sandbox),
                       log=_one_line, warn=_yellow)
    if as_json:
        render_json(removed)
        raise typer.Exit(1 if any(r.get("left") for r in removed.values()) else 0)
    if not any(v for r in removed.values() for v in r.values()):
        say(out, "nothing to remove")
    for run_id, r in removed.items():
        if _removed_words(r):
            say(out, f"run {run_id}: removed {_removed_words(r)}")
    _left({f"run {run_id}": r for run_id, r in removed.items()})
