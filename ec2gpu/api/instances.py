"""Standing instances and clusters, as library functions: launch, stop, start, scale, list_instances,
down, cleanup, doctor; and what several commands share (settle the ledger, find an instance by
name, the idle rule of the --idle-* flags).

Each function opens its own backend.Context (``region``; ``sandbox``: the local sandbox instead of
AWS, also EC2GPU_SANDBOX=1), returns typed records (their ``to_json()`` is what the CLI's ``--json`` prints) and raises the
ec2gpu.errors tree: UsageError for bad input before anything is created or changed, NoCredentials,
AwsError, RemoteError, WaitTimeout. ``log(text)`` is told what happens on the way (default: nothing).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import AbstractSet, Any, Callable, Optional, cast

from .. import backend
from ..aws import catalog, clusters, network, sweep, tags
from ..aws.instances import IdleRule, Instance
from ..errors import Ec2GpuError, UsageError
from ..remote.jobs import CONNECTION_ERRORS
from ..runs.execute import logs as run_logs
from ..runs.execute.reporter import Reporter, ReporterLike
from ..runs.options import LaunchOptions
from ..runs.plan import doctor as doctor_checks
from ..runs.plan.doctor import Check
from ..runs.recover import reconcile
from ..runs.standing import hosts as standing
from ..runs.standing import stopstart
from ..tasks.spec import minutes

Log = Callable[[str], None]


def _quiet(text: str) -> None:
    """The default ``log``: says nothing."""


def _context(region: Optional[str], sandbox: bool, persistent: bool = False, log: Log = _quiet) -> backend.Context:
    """A backend.Context (a context manager) for one operation; ``log`` is told when a sandbox is started for good."""
    return backend.Context(region, sandbox, persistent, note=log)


# ---- what these functions return (the CLI's ``--json`` prints each one's ``to_json()``) ----------

@dataclass(frozen=True)
class InstanceSummary:
    """One instance as aws/instances.summary gives it (`launch`, `start`): its Name (``name``) and
    ``run_id`` tags ("" when absent or not safe to show: ``unsafe_tags`` names those), ``cluster``
    and ``node`` (None outside a cluster), ``market`` (on-demand | spot), ``state`` (EC2's),
    addresses (None without one), ``zone``, ``launched_at`` (ISO 8601 UTC) and ``idle_rule`` (its
    tag: "stop 1800" / "down 3600", seconds; None without one)."""
    name: str
    run_id: str
    instance_id: str
    cluster: Optional[str]
    node: Optional[int]
    instance_type: str
    market: str
    state: str
    public_ip: Optional[str]
    private_ip: Optional[str]
    zone: Optional[str]
    launched_at: Optional[str]
    idle_rule: Optional[str]
    unsafe_tags: list[str]

    def to_json(self) -> dict[str, Any]:
        """Every field, in aws/instances.summary's order."""
        return asdict(self)


@dataclass(frozen=True)
class StoppedInstance(InstanceSummary):
    """An instance `stop` stopped: its summary and ``instance_store_gb``, the GB of instance-store
    NVMe the stop erased (0: none; None: not known; aws/types.Facts)."""
    instance_store_gb: Optional[int]


#: InstanceRow's fields a running instance's row has not (its volumes: runs/standing/hosts._stopped_disks).
STOPPED_ONLY = ("disk_gib", "disk_usd_per_month")


@dataclass(frozen=True)
class InstanceRow(InstanceSummary):
    """One live instance as `ec2gpu ls` lists it (runs/standing/hosts.listing): its summary, with
    ``age_seconds`` (s it has run, over ``running_intervals`` intervals; ``intervals_recorded``:
    whether its ledger row recorded them), ``first_launched_at`` (ISO 8601), ``usd_per_hour``
    (on-demand, a spot one's ceiling; None while stopped or not known) and its ``price_source``,
    ``so_far`` (the parts of) ``cost_so_far_usd`` (USD); a stopped (or stopping) one's volumes
    ``disk_gib`` and their ``disk_usd_per_month`` (USD, gp3); and for a running one with an idle
    rule, ``idle_seconds`` (s) or why it is ``busy``."""
    age_seconds: int
    running_intervals: int
    intervals_recorded: bool
    first_launched_at: str
    usd_per_hour: Optional[float]
    price_source: str
    so_far: dict[str, Any]
    cost_so_far_usd: Optional[float]
    disk_gib: Optional[int] = None
    disk_usd_per_month: Optional[float] = None
    idle_seconds: Optional[float] = None
    busy: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """Every field in this order; the disk's two for a stopped (or stopping) instance alone."""
        row = asdict(self)
        if self.state not in ("stopping", "stopped"):
            for key in STOPPED_ONLY:
                del row[key]
        return row


@dataclass(frozen=True)
class Scaled:
    """What `scale` did to ``cluster``: the instance ids ``added`` and ``removed``, and how many
    ``nodes`` it has now (aws/clusters.scale)."""
    cluster: str
    added: list[str]
    removed: list[str]
    nodes: int

    def to_json(self) -> dict[str, Any]:
        """{"cluster", "added", "removed", "nodes"}."""
        return asdict(self)


@dataclass(frozen=True)
class Cleanup:
    """What `cleanup` found (``dry_run``) or removed: ``regions``, {region: {kind: [ids], "left":
    [ids it could not remove]}} (regions where nothing was found left out); ``searched``, the
    regions looked in."""
    dry_run: bool
    regions: dict[str, dict[str, list[str]]]
    searched: list[str]

    def to_json(self) -> dict[str, Any]:
        """{"dry_run", "regions", "searched"}."""
        return asdict(self)


# ---- shared by several commands -------------------------------------------------------------

#: The idle rule `launch` gives when none is asked for (issue: instances that end themselves).
DEFAULT_IDLE = ("down", "60m")


def idle_rule(idle_stop: str | None, idle_down: str | None, no_idle: bool, max_runtime: int | None,
              spot: bool) -> Optional[IdleRule]:
    """The aws.instances.IdleRule of `launch`'s flags (None for --no-idle; default DEFAULT_IDLE).
    ``idle_stop``/``idle_down``: durations ('30m', '1h'; tasks.spec.minutes); ``max_runtime``: minutes.
    Raises UsageError for two rules at once, a duration that is not one (or under 10 s), --no-idle
    without --max-runtime, and --idle-stop on spot (EC2 cannot stop ec2gpu's one-time spot instances:
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/stop-start-spot-instances.html)."""

    given = [(a, v) for a, v in (("stop", idle_stop), ("down", idle_down)) if v is not None]
    if len(given) + no_idle > 1:
        raise UsageError("--idle-stop, --idle-down and --no-idle exclude each other", "give one of them")
    if no_idle:
        if max_runtime is None:
            raise UsageError("--no-idle needs an explicit --max-runtime MINUTES",
                             "say how long the instance may live, e.g. --no-idle --max-runtime 480")
        return None
    action, text = given[0] if given else DEFAULT_IDLE
    try:
        seconds = round(minutes(text) * 60)
    except ValueError as exc:
        raise UsageError(f"--idle-{action}: {exc}", "e.g. --idle-down 30m") from None
    if seconds < 10:
        raise UsageError(f"--idle-{action} {text} is under 10 seconds", "give at least 10s (e.g. 30m)")
    if action == "stop" and spot:
        raise UsageError("--idle-stop cannot apply to a spot instance: EC2 stops only spot instances of a persistent "
                         "request, and ec2gpu's are one-time", "use --idle-down (it terminates itself when idle)")
    return IdleRule(action, seconds)


def settle(ctx: backend.Context, run_ids: set[str] | None = None, ended: bool = True, keep: AbstractSet[str] = frozenset(),
           log: Log = _quiet, warn: Optional[Log] = None) -> None:
    """Bring the ledger up to date with the instances of ``ctx``'s backend and region (runs/recover/reconcile.py):
    settle the runs (only ``run_ids`` if given) whose controller died and whose instances have
    terminated, record the standing instances' running intervals and settle those that have all
    ended; and (``ended``) remove what runs whose instances have all ended left, but ``keep``'s.
    Each is said to ``log`` (a settled bill to ``warn``, default ``log``). Raises AwsError."""
    home = ctx.settings.home
    reconcile.settle_all(ctx.aws, home, ctx.backend.name, run_ids, log=warn or log,
                         volume_gib=ctx.settings.root_volume_gib)
    reconcile.sync_standing(ctx.aws, home, ctx.backend.name, log=log)
    if ended:
        reconcile.remove_ended(ctx.aws, home, ctx.settings.keys_dir, keep, log=log)


def fetch_abandoned(ctx: backend.Context, run_ids: set[str] | None = None, log: Log = _quiet,
                    warn: Optional[Log] = None) -> list[str]:
    """Before their instances go: bring home what the jobs of runs whose controller died wrote
    (runs/recover/reconcile.abandoned, runs/execute/logs.fetch) to each run's artifacts directory (only ``run_ids``'
    if given). Returns the run ids that could not be reached, each also said to ``warn`` (default
    ``log``); removing them goes on."""
    missed = []
    for row in reconcile.abandoned(ctx.settings.home, ctx.backend.name):
        if run_ids is not None and row["run_id"] not in run_ids:
            continue
        head = run_logs.head_instance(ctx.aws.ec2, row)
        if head is None:
            continue
        out = Path(row.get("artifacts") or Path("runs") / row["run_id"])
        try:
            run_logs.fetch(ctx, head, row["run_id"], out, log)
        except (Ec2GpuError, *CONNECTION_ERRORS) as exc:  # its words may quote the instance: printed inert
            missed.append(row["run_id"])
            (warn or log)(f"run {row['run_id']}: could not bring its files home first ({exc}); removing it anyway")
    return missed


def find(ctx: backend.Context, name: str) -> list[Instance]:
    """The running (or pending) instances called ``name`` (a Name tag, instance id, run id or
    cluster): DescribeInstances dicts. Raises UsageError saying what they are instead."""
    return stopstart.find(ctx.aws.ec2, name, ["pending", "running"])


# ---- the commands ---------------------------------------------------------------------------

def _types(asked: str) -> list[str]:
    """The catalog's names of a comma-separated --instance-type (pure). Raises UsageError for an
    empty entry or a type the catalog does not know (a retired one names its replacement)."""
    if any(not t.strip() for t in asked.split(",")):
        raise UsageError(f"--instance-type {asked!r} has an empty entry", "name each type, e.g. g4dn.xlarge")
    return [catalog.lookup(t).name for t in asked.split(",")]


def launch(*, instance_type: Optional[str] = None, spot: bool = False, name: Optional[str] = None,
           ssh_cidr: Optional[str] = None, ami: Optional[str] = None, max_runtime: Optional[int] = None,
           idle_stop: Optional[str] = None, idle_down: Optional[str] = None, no_idle: bool = False, nodes: int = 1,
           region: Optional[str] = None, sandbox: bool = False, reporter: Optional[ReporterLike] = None, log: Log = _quiet,
           warn: Optional[Log] = None) -> list[InstanceSummary]:
    """Launch an instance (or a standing cluster of ``nodes``) and leave it running; `ec2gpu launch`.

    ``instance_type``: one type or several in order of preference (default: the configured one);
    ``max_runtime``: minutes after boot when it ends itself (default 120); the idle rule from
    ``idle_stop``/``idle_down``/``no_idle`` (idle_rule: by default it terminates after 60 idle min).
    Returns one InstanceSummary per instance (runs/standing/hosts.launch: name, instance_id,
    instance_type, market, state, public_ip, zone ...). Without a ``reporter``, what the launch says
    goes to ``log``. Raises UsageError (a bad name, CIDR, type or rule) before anything is
    created; AwsError, CapacityError, WaitTimeout."""

    if name is not None:
        tags.check_name(name)  # it goes into tags, ssh_config Host lines and commands shown to the user
    if ssh_cidr is not None:
        network.check_cidr(ssh_cidr, warn or log)  # a wide CIDR is warned of
    if not 1 <= nodes <= 64:
        raise UsageError(f"nodes {nodes} is out of range", "give 1 to 64")
    idle = idle_rule(idle_stop, idle_down, no_idle, max_runtime, spot)
    asked = None if instance_type is None else _types(instance_type)  # refused before a sandbox is started
    with _context(region, sandbox, True, log) as ctx:
        types = asked or _types(ctx.settings.instance_type)
        opts = LaunchOptions(instance_type=",".join(types), spot=spot, name=name, ssh_cidr=ssh_cidr, ami=ami,
                             max_runtime_minutes=max_runtime or 120, nodes=nodes, idle=idle)
        return [InstanceSummary(**row) for row in standing.launch(ctx.aws, ctx.settings, opts, reporter or Reporter(log),
                                                                  ctx.backend)]


def stop(name: str, *, region: Optional[str] = None, sandbox: bool = False, log: Log = _quiet,
         warn: Optional[Log] = None) -> list[StoppedInstance]:
    """Stop a standing on-demand instance (or every node of cluster ``name``): its EBS disk is kept
    and billed, its instance-store NVMe erased. Returns one StoppedInstance per instance
    (runs/standing/stopstart.stop: name, instance_id, instance_type, state, instance_store_gb ...).
    Raises UsageError for an unknown name or a spot instance (EC2 cannot stop it), NoCredentials, AwsError, WaitTimeout."""
    with _context(region, sandbox, True, log) as ctx:
        ctx.aws.check_credentials()
        rows = stopstart.stop(ctx.aws, name, log=log)
        settle(ctx, ended=False, log=log, warn=warn)  # the stop, dated by EC2, ends a running interval in the ledger
    return [StoppedInstance(**row) for row in rows]


def start(name: str, *, region: Optional[str] = None, sandbox: bool = False, log: Log = _quiet,
          warn: Optional[Log] = None) -> list[InstanceSummary]:
    """Start a stopped instance (or cluster) again: wait until it answers SSH with its pinned host
    key at its new address, and schedule its --max-runtime shutdown again (a stop cancels it).
    Returns one InstanceSummary per instance (runs/standing/stopstart.start: name, instance_id, state,
    public_ip ...).
    Raises UsageError for an unknown name, NoCredentials, AwsError, RemoteError, WaitTimeout."""
    with _context(region, sandbox, True, log) as ctx:
        ctx.aws.check_credentials()
        settle(ctx, ended=False, log=log, warn=warn)  # a stop no command has seen yet (--idle-stop) is recorded first
        rows = stopstart.start(ctx.aws, ctx.settings, ctx.backend, name, log=log)
        settle(ctx, ended=False, log=log, warn=warn)  # ... and the new running interval
    return [InstanceSummary(**row) for row in rows]


def scale(name: str, nodes: int, *, max_runtime: int = 120, region: Optional[str] = None, sandbox: bool = False,
          log: Log = _quiet, warn: Optional[Log] = None) -> Scaled:
    """Grow or shrink the standing cluster ``name`` to ``nodes`` (node 0 always stays); new nodes
    join its security group, zone and placement group, each host key pinned and checked against
    its console output, and end themselves after ``max_runtime`` minutes. Returns a Scaled
    (aws/clusters.scale's: cluster, added and removed instance ids, nodes now). Raises UsageError
    (fewer than 1 node, no such cluster), NoCredentials, AwsError, RemoteError, WaitTimeout."""
    if nodes < 1:
        raise UsageError(f"a cluster keeps at least 1 node (asked {nodes})", "`ec2gpu down NAME` removes it all")
    if max_runtime < 5:
        raise UsageError(f"max_runtime {max_runtime} min is under 5", "give at least 5 minutes")
    with _context(region, sandbox, True, log) as ctx:
        ctx.aws.check_credentials()
        done = clusters.scale(ctx.aws, ctx.settings, name, nodes, max_runtime, log=log,
                              pin=lambda found: standing.pin_all(ctx.aws, ctx.settings, ctx.backend, found, log))
        if done["added"] or done["removed"]:
            standing.write_ssh_config(ctx.aws, ctx.settings, ctx.backend, log, log=log)
            settle(ctx, ended=False, log=log, warn=warn)  # the nodes' running intervals, while EC2 lists the ended
    return Scaled(**done)


def list_instances(*, region: Optional[str] = None, sandbox: bool = False, log: Log = _quiet,
                   warn: Optional[Log] = None) -> list[InstanceRow]:
    """The instances ec2gpu launched that are still alive (running or stopped), after the ledger is
    brought up to date (settle). One InstanceRow each (runs/standing/hosts.listing): name, instance_id,
    instance_type, market, zone, state, cluster, node, launched_at, age_seconds, usd_per_hour
    (on-demand: spot's ceiling), cost_so_far_usd, idle_rule, idle_seconds, busy, disk_gib,
    disk_usd_per_month, unsafe_tags. Raises NoCredentials, AwsError."""
    with _context(region, sandbox, False, log) as ctx:
        settle(ctx, log=log, warn=warn)  # bills of instances that have ended (by themselves, too), and what they left
        return [InstanceRow(**row) for row in standing.listing(ctx.aws, ctx.settings)]


def _prefixed(log: Log, prefix: str) -> Log:
    """``log`` with ``prefix`` before each line."""
    return lambda line: log(prefix + line)


def cleanup(*, dry_run: bool = False, all_regions: bool = False, fetch: bool = True, region: Optional[str] = None,
            sandbox: bool = False, log: Log = _quiet, warn: Optional[Log] = None) -> Cleanup:
    """Find by tag and remove everything ec2gpu created (aws/sweep.KINDS: Auto Scaling groups,
    instances, spot requests, security groups, key pairs and their key files, placement groups,
    roles, launch templates, images and snapshots of bakes that did not complete, and the caller's
    own detached runs' secrets: another user's are theirs to remove), best-effort: a
    kind that cannot go is left and named, the rest still goes. ``fetch``: first bring home what
    the jobs of runs whose controller died wrote.
    Returns a Cleanup: dry_run, regions {region: {kind: [ids], "left": [ids it could not remove]}}
    (regions where nothing was found are left out), searched (the regions looked in).
    Raises NoCredentials, AwsError."""
    report: dict[str, Any] = {}
    with _context(region, sandbox, False, log) as ctx:
        ctx.aws.check_credentials()
        if not dry_run and fetch:
            fetch_abandoned(ctx, log=log, warn=warn)
        if not dry_run:
            settle(ctx, set(), ended=False, log=log, warn=warn)  # a stopped instance's stop is dated before it goes
        regions = [ctx.aws.region]
        if all_regions:
            regions = ctx.aws.enabled_regions()
        for name in regions:
            aws = ctx.aws.in_region(name)
            say = _prefixed(log, f"{name}: ")
            found = sweep.inventory(aws.ec2, log=say, iam=aws.client("iam"), autoscaling=aws.client("autoscaling"),
                                    ssm=aws.client("ssm"), user=ctx.aws.check_credentials().get("UserId"))
            if not any(found.values()):
                continue
            if dry_run:
                report[name] = {k: [r["id"] for r in v] for k, v in found.items()}
            else:
                report[name] = sweep.delete_everything(aws.ec2, found, ctx.settings.keys_dir, log=say,
                                                       iam=aws.client("iam"), autoscaling=aws.client("autoscaling"),
                                                       ssm=aws.client("ssm"))
        if not dry_run:
            settle(ctx, log=log, warn=warn)
    return Cleanup(dry_run=dry_run, regions=report, searched=regions)


def down(name: Optional[str] = None, *, all: bool = False, fetch: bool = True,  # noqa: A002 - the flag's name
         region: Optional[str] = None, sandbox: bool = False, log: Log = _quiet, warn: Optional[Log] = None) -> dict[str, Any]:
    """Terminate the instances of the runs called ``name`` (a Name tag, instance id, run id or
    cluster; or ``all`` of ec2gpu's in the region) and delete what they made (aws/sweep.delete_run:
    security groups, key pairs, placement groups, roles, a detached run's Auto Scaling group and
    launch template), best-effort. ``fetch``: first bring home
    what the job of a run whose controller died wrote; its bill is settled from the instances' own
    times. Returns {run_id: {kind: [ids removed], "left": [ids it could not remove]}}. Raises
    UsageError (neither or both of ``name`` and ``all``; nothing of ec2gpu's called ``name``)
    before anything is removed; NoCredentials, AwsError."""
    if bool(name) == all:
        raise UsageError("say which instances to remove", "ec2gpu down NAME, or ec2gpu down --all")
    with _context(region, sandbox, False, log) as ctx:
        ec2 = ctx.aws.ec2
        runs: AbstractSet[str | None]
        if all:
            runs = {i.run_id for i in sweep.find_instances(ec2)} | {
                tags.as_dict(r.get("Tags")).get(tags.RUN) for r in sweep.find_security_groups(ec2) + sweep.find_key_pairs(ec2)}
        else:  # terminated instances too: an interrupted spot instance leaves its group and key pair
            runs = sweep.runs_named(ec2, cast(str, name))  # without --all a name is given (refused above)
            if not runs:
                raise UsageError(f"nothing of ec2gpu's is named {name!r}", "see `ec2gpu ls`; `ec2gpu cleanup` "
                                 "removes everything the tool created")
        if fetch:
            fetch_abandoned(ctx, {r for r in runs if r}, log=log, warn=warn)
        settle(ctx, set(), ended=False, log=log, warn=warn)  # a stopped instance's stop is dated before it goes
        removed = {}
        for run_id in sorted(r for r in runs if r):
            removed[run_id] = sweep.delete_run(ec2, run_id, ctx.settings.keys_dir, log=log, iam=ctx.aws.client("iam"),
                                               autoscaling=ctx.aws.client("autoscaling"), ssm=ctx.aws.client("ssm"),
                                               user=ctx.aws.check_credentials().get("UserId"))  # own secrets only
        settle(ctx, set(removed), keep=set(removed), log=log, warn=warn)
    return removed


def doctor(*, instance_type: Optional[str] = None, spot: bool = False, region: Optional[str] = None,
           sandbox: bool = False, log: Log = _quiet) -> list[Check]:
    """Check credentials, region, default VPC, GPU quota (on-demand, or spot with ``spot``), AMI,
    this machine's IP, prices, ssh, rsync and key files for ``instance_type`` (default: the
    configured one). Returns one runs/plan/doctor.Check per check (name, ok (True, False, or None:
    could not tell), detail, fix; ``as_dict()`` is what --json prints); missing credentials are a
    failed "credentials" check, not an error. The command's exit code: runs/plan/doctor.exit_code(checks)."""
    with _context(region, sandbox, False, log) as ctx:
        checks = doctor_checks.run_checks(ctx.aws, ctx.settings, instance_type or ctx.settings.instance_type, spot,
                                ctx.backend.is_sandbox)
    return checks
