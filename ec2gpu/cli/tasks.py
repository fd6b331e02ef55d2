"""`ec2gpu run` and `ec2gpu exec`: the user's own job (a task file, or a command) on new or standing instances."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, List, Mapping, Optional, Union

import typer

from ..errors import UsageError
from ..inert import inert
from ..words import count
from .app import JSON, REGION, SANDBOX, _sandbox_flag, app
from .render import RichReporter, _print_record, err, out, render_json, say, table, table_row, warn

if TYPE_CHECKING:  # cli/ imports api/ when a command runs, not for --help
    from ..api import RunResult
    from ..runs.plan.runplan import RunPlan


def _one_line(text: str) -> None:
    """A step's note on stderr, dim, on one line however wide."""
    say(err, text, "dim", soft_wrap=True)


def _size(text: str, flag: str = "--max-upload") -> int:
    """'1GiB', '500MB', '2048' (bytes) -> bytes (tasks.spec.size_bytes). Raises UsageError naming ``flag``."""
    from ..tasks.spec import size_bytes
    try:
        return size_bytes(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}", "use e.g. 500MB or 2GiB") from None


def _env_flags(values: list[str], secrets: Optional[list[str]] = None) -> dict[str, Optional[str]]:
    """--env K=V (a value) or --env K (taken from this machine); each K, and each --secret K in
    ``secrets``, checked like a task file's envs. Raises UsageError for a K that is not a name."""
    from ..tasks.load import check_env_name
    for k in secrets or []:
        check_env_name(k, "--secret")
    out = {}
    for v in values:
        k, eq, val = v.partition("=")
        out[check_env_name(k, "--env")] = val if eq else None
    return out


def _print_plan(plan: Mapping[str, Any], as_json: bool) -> None:
    """`run --dry-run`: the plan as JSON, or as lines with the task's own words printed inert."""
    if as_json:
        render_json(plan)
        return
    from ..runs.plan import dryrun
    for line in dryrun.render(plan):
        say(out, line, soft_wrap=True)


WORKDIR_OUTSIDE = typer.Option(False, "--workdir-outside", help="Send a task file's workdir even when it lies outside "
                               "the task file's directory (your home and credentials directories are never sent).")
ALLOW_WRITE_BUCKET = typer.Option([], "--allow-write-bucket", metavar="BUCKET", help="Let a MOUNT-mode file_mounts "
                                  "entry write back to BUCKET, a bucket the task does not make (name:); repeatable. "
                                  "Without it such an entry is refused; ec2gpu-* buckets are refused always.")


PORT = typer.Option([], "--port", help="A port of node 0 to forward to the same port here while the job runs "
                    "(TensorBoard: --port 6006); repeatable. The task file's own ports go to a free port here, "
                    "printed when the job starts, so a task cannot take a port a local client trusts.")


# the options of `run` (module level: the command's signature stays readable)
RUN_ARGS = typer.Argument(None, help="A task file (task.yaml), or after -- the command to run in the current directory: "
                          "ec2gpu run --gpu T4 -- python train.py --epochs 3")
GPU = typer.Option(None, "--gpu", help="GPU model and count, e.g. T4, A10G:4 (the cheapest type with exactly that "
                   "many); overrides the task's resources.")
ALLOW_LARGER = typer.Option(False, "--allow-larger", help="Where no instance type has exactly the GPU count asked, "
                            "take the cheapest with more: the job sees only the count asked (CUDA_VISIBLE_DEVICES) "
                            "and the whole instance is billed.")
INSTANCE_TYPE = typer.Option(None, "--instance-type", "-t", help="Instance type, or several in order of preference "
                             "(g5.xlarge,g6.xlarge).")
SPOT = typer.Option(None, "--spot/--on-demand", help="Spot (managed: a lost instance is replaced and the job restarts "
                    "with EC2GPU_RESUME=1) or on-demand.")
SPOT_FALLBACK = typer.Option(None, "--spot-fallback", help="on-demand: a last on-demand try.")
NODES = typer.Option(None, "--nodes", "-n", min=1, max=64, help="Instances running the job together.")
ENV = typer.Option([], "--env", "-e", help="K=V, or K to take it from this environment; repeatable.")
SECRET = typer.Option([], "--secret", help="K: like --env K, and its value is masked everywhere.")
WORKDIR = typer.Option(None, "--workdir", help="For a command: the directory to send (default .).")
NAME = typer.Option(None, "--name", help="The run's name (default: the task's, or the directory's).")
MAX_RUNTIME = typer.Option(None, "--max-runtime", help="Minutes (or 90m, 2h) after which the instances terminate "
                           "themselves; the job gets SIGTERM 7 min before (2 to checkpoint, 5 for outputs). "
                           "none: no limit (an idle instance still ends itself). Default: the task's, else 3 x its "
                           "longest run, else 24 h.")
EXPECT = typer.Option(None, "--expect", help="How long the job (an array's: one element) should run (20m, 1h), for "
                      "the estimate when no earlier run of the task says (a first run starts without it).")
BUDGET = typer.Option(None, "--budget", min=0, help="Refuse the run if its estimate in USD is above.")
MAX_PRICE = typer.Option(None, "--max-price", min=0, help="Spot: the highest USD/h to pay.")
MAX_ATTEMPTS = typer.Option(None, "--max-attempts", min=1, help="Instances to try (default 3 with spot, else 1).")
MAX_UPLOAD = typer.Option("1GiB", "--max-upload", help="Refuse a workdir larger than this: bytes, or 500MB, 2GiB "
                          "(MB, GB: 10^6, 10^9 bytes; MiB, GiB: 2^20, 2^30).")
INCLUDE_SECRETS = typer.Option(False, "--include-secrets", help="Also send .git/, .env*, keys and the credential "
                               "files docs/tasks.md lists (never sent otherwise).")
OUT_DIR = typer.Option(None, "--out", help="Where outputs and logs come home (default runs/<run-id>/).")
SSH_CIDR = typer.Option(None, "--ssh-cidr", help="CIDR allowed to SSH (default: your public IP/32).")
AMI = typer.Option(None, "--ami", help="AMI id (default: the newest image baked for the task's setup, else the "
                   "PyTorch Deep Learning AMI).")
NO_BAKED = typer.Option(False, "--no-baked", help="Boot the Deep Learning AMI even when an image baked for this "
                        "setup exists (`ec2gpu image ls`).")
DRY_RUN = typer.Option(False, "--dry-run", help="Print the plan (instance types in order with GPUs and prices, limit, "
                       "most it can cost, the job's environment, setup and run, what changes) and create nothing; "
                       "needs no AWS credentials. With --json: its keys are in docs/tasks.md.")
INFRA = typer.Option(None, "--infra", help="aws, aws/REGION or aws/REGION/ZONE (SkyPilot's override flag): a "
                     "SkyPilot task file naming another cloud runs on AWS; a region here is the run's (the zone is "
                     "chosen at launch).")
DETACH = typer.Option(False, "--detach", help="Hand the run to AWS and return: an Auto Scaling group runs it (a spot "
                      "instance lost is replaced and the job resumes from its last checkpoint in S3), with nobody "
                      "watching; `ec2gpu status RUN` follows it. An array returns once its driver runs on the pool's "
                      "head, which puts the results in S3.")
ARRAY = typer.Option(None, "--array", help="Run the task's run once per index over a pool scheduled by Ray: 100 "
                     "(indices 0-99), 0-99, or 3,7,12 to rerun some; each element gets EC2GPU_ARRAY_INDEX and "
                     "EC2GPU_ARRAY_SIZE, its outputs come home under outputs/INDEX/. A task's array: or sweep: needs "
                     "no flag.")
WORKERS = typer.Option(None, "--workers", help="An array's pool: instances at most (default: the task's max_workers, "
                       "else 1); it shrinks as the queue drains.")
GPUS_PER_JOB = typer.Option(None, "--gpus-per-job", help="An array's elements: GPUs each (default: the task's GPU "
                            "count).")
MAX_RETRIES = typer.Option(None, "--max-retries", help="An array's elements: runs again of one that exits non-zero "
                           "(default 2); one on a lost instance always runs again.")


@app.command("run")
def run_cmd(
    args: List[str] = RUN_ARGS, gpu: Optional[str] = GPU, allow_larger: bool = ALLOW_LARGER,
    instance_type: Optional[str] = INSTANCE_TYPE, spot: Optional[bool] = SPOT, spot_fallback: Optional[str] = SPOT_FALLBACK,
    nodes: Optional[int] = NODES, env: List[str] = ENV, secret: List[str] = SECRET, workdir: Optional[str] = WORKDIR,
    name: Optional[str] = NAME, max_runtime: Optional[str] = MAX_RUNTIME, expect: Optional[str] = EXPECT,
    budget: Optional[float] = BUDGET, max_price: Optional[float] = MAX_PRICE, max_attempts: Optional[int] = MAX_ATTEMPTS,
    max_upload: str = MAX_UPLOAD, include_secrets: bool = INCLUDE_SECRETS, out_dir: Optional[Path] = OUT_DIR,
    ssh_cidr: Optional[str] = SSH_CIDR, ami: Optional[str] = AMI, no_baked: bool = NO_BAKED,
    workdir_outside: bool = WORKDIR_OUTSIDE, allow_write_bucket: List[str] = ALLOW_WRITE_BUCKET,
    dry_run: bool = DRY_RUN, infra: Optional[str] = INFRA, detach: bool = DETACH, array: Optional[str] = ARRAY,
    workers: Optional[int] = WORKERS, gpus_per_job: Optional[int] = GPUS_PER_JOB, max_retries: Optional[int] = MAX_RETRIES,
    port: List[int] = PORT, region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
) -> None:
    """Run your own job on new GPU instances: send the workdir, set up, run, bring outputs home, terminate.

    The job runs in the synced workdir with EC2GPU_OUTPUT_DIR, EC2GPU_CHECKPOINT_DIR, EC2GPU_RESUME,
    EC2GPU_NODE_RANK, EC2GPU_NUM_NODES, EC2GPU_HEAD_IP (and SkyPilot's SKYPILOT_* names) set;
    docs/tasks.md has the task file and the job's contract. Exit 5 when the job fails (its outputs
    still come home)."""
    from .. import api

    task_file = _task_file(args)
    options = api.RunFlags(
        command=None if task_file else list(args or []) or None, workdir=workdir, name=name, gpu=gpu,
        instance_type=instance_type, spot=spot, spot_fallback=spot_fallback, nodes=nodes, env=_env_flags(env, secret),
        secrets=tuple(secret), max_runtime=max_runtime, expect=expect, budget=budget, max_price=max_price,
        max_attempts=max_attempts, max_upload=_size(max_upload), include_secrets=include_secrets, out=out_dir,
        ssh_cidr=ssh_cidr, ami=ami, region=region, sandbox=_sandbox_flag(sandbox),
        as_typed=" ".join(["ec2gpu", *sys.argv[1:]]), baked=not no_baked, workdir_outside=workdir_outside,
        allow_larger=allow_larger, infra=infra, detach=detach, array=array, workers=workers,
        gpus_per_job=gpus_per_job, max_retries=max_retries, allow_write_buckets=tuple(allow_write_bucket),
        ports=tuple(port))
    with failed_array_table(as_json):
        got = api.run(task_file, options=options, reporter=RichReporter(err), on_warning=_warn, dry_run=dry_run)
    print_outcome(got, as_json, detach, sandbox)


@contextlib.contextmanager
def failed_array_table(as_json: bool) -> Iterator[None]:
    """Print the element table of an array or a sweep that failed (what the error carries as
    ``run_record``: runs/provision/pipeline.run_job) before the error is said: which elements
    failed, what each cost. Its cost line was said above it (pipeline.cost_line)."""
    try:
        yield
    except BaseException as exc:
        record = getattr(exc, "run_record", None)
        if isinstance(record, Mapping) and (record.get("pool") or {}).get("elements") and not as_json:
            _print_pool(record["pool"])
        raise


def print_outcome(got: Union[RunResult, RunPlan], as_json: bool, detach: bool, sandbox: bool) -> None:
    """What `run` and `train mnist` print: a dry run's plan (runs/plan/dryrun.plan), a detached run's
    or array's start, or the run record (with an array's table first)."""
    from ..api import RunPlan
    from ..runs.plan import dryrun
    if isinstance(got, RunPlan):  # a dry run: the plan
        _print_plan(dryrun.plan(got), as_json)
        return
    record = got.to_json()
    if detach and record.get("pool") is not None:
        _print_detached_array(record, as_json, sandbox)
    elif detach:
        _print_detached(record, as_json)
    else:
        if record.get("pool") and not as_json:
            _print_pool(record["pool"])
        _print_record(record, as_json)


def _print_pool(pool: Mapping[str, Any]) -> None:
    """An array's table: index, status, attempts, instance address, seconds, exit status, cost
    share, and where there are any, the sweep's parameters and each element's test accuracy (every
    value inert: it came from the instance)."""
    elements = pool["elements"]
    params = any(e.get("params") for e in elements)
    accuracy = any(e.get("test_accuracy") is not None for e in elements)
    t = table("index", "status", "tries", "node", "s", "exit", "USD", *(["parameters"] if params else []),
              *(["test acc"] if accuracy else []),
              title=f"array: {count(len(elements), 'element')}, {count(pool['gpus_per_job'], 'GPU')} each")
    for e in elements:
        share = e.get("cost_usd")
        table_row(t, str(e["index"]), e["status"], str(e["attempts"]), inert(e.get("node") or "-"),
                  "-" if e.get("seconds") is None else f"{e['seconds']:.1f}",
                  "-" if e.get("exit_status") is None else str(e["exit_status"]),
                  "-" if share is None else f"{share:.4f}",
                  *([" ".join(f"{k}={inert(v)}" for k, v in e.get("params", {}).items())] if params else []),
                  *(["-" if e.get("test_accuracy") is None else f"{100 * e['test_accuracy']:.2f}%"] if accuracy else []))
    say(out, t)
    over = ", ".join(f"{p['instances']} at {p['seconds']:.0f} s" for p in pool.get("instances_over_time", []))
    if over:
        say(out, f"instances over time: {over}", "dim")


def _print_detached_array(record: Mapping[str, Any], as_json: bool, sandbox: bool) -> None:
    """A detached array's start: its id, its pool, what happens without this command, and how to follow it."""
    if as_json:
        render_json(record)
        return
    run_id, where = record["run_id"], " --sandbox" if sandbox else ""
    say(out, f"run {run_id} detached: its driver runs on the pool's head ({len(record.get('instance_ids') or [])} "
             "instance(s)); idle workers end themselves, and once the last element ends the head puts the results "
             "in S3 and ends itself")
    say(out, f"follow it: ec2gpu status {run_id}{where}; the driver's log: ec2gpu logs {run_id}{where} --follow; "
             f"the results, once it ended: ec2gpu fetch {run_id}{where}")


def _print_detached(record: Mapping[str, Any], as_json: bool) -> None:
    """A detached run's start: its id, where it lives, its deadline, and the command that follows it."""
    if as_json:
        render_json(record)
        return
    run_id = record["run_id"]
    say(out, f"run {run_id} detached: Auto Scaling group {record['group']}, store s3://{record['bucket']}/runs/{run_id}/")
    say(out, f"it ends by {record['deadline']} at the latest (the group's scheduled action), whoever is watching")
    where = " --sandbox" if record.get("backend") == "sandbox" else ""
    say(out, f"follow it: ec2gpu status {run_id}{where} (logs, fetch, cancel: the same way)", "dim")


@app.command("exec")
def exec_cmd(
    target: str = typer.Argument(..., help="A standing instance or cluster (ec2gpu launch --name NAME)."),
    args: List[str] = typer.Argument(None, help="A task file, or after -- a command to run in the current directory."),
    env: List[str] = typer.Option([], "--env", "-e", help="K=V, or K to take it from this environment; repeatable."),
    secret: List[str] = typer.Option([], "--secret", help="K: like --env K, and its value is masked everywhere."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="For a command: the directory to send (default .)."),
    max_upload: str = typer.Option("1GiB", "--max-upload", help="Refuse a workdir larger than this (500MB, 2GiB)."),
    include_secrets: bool = typer.Option(False, "--include-secrets", help="Also send .git/, .env*, keys, credentials."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where outputs and logs come home."),
    workdir_outside: bool = WORKDIR_OUTSIDE, allow_write_bucket: List[str] = ALLOW_WRITE_BUCKET,
    infra: Optional[str] = typer.Option(None, "--infra", help="aws: read a SkyPilot task file written for another "
                                        "cloud (SkyPilot's override flag); the standing instance runs it."),
    port: List[int] = PORT, region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
) -> None:
    """Run a task on a standing instance or cluster and leave it running.

    The workdir is synced again (rsync sends only what changed) and a setup that already ran there
    is skipped."""
    from .. import api

    task_file = _task_file(args)
    record = api.exec(target, task_file, command=None if task_file else list(args or []) or None, workdir=workdir,
                      env=_env_flags(env, secret), secrets=secret, max_upload=_size(max_upload),
                      include_secrets=include_secrets, out=out_dir, region=region, sandbox=_sandbox_flag(sandbox),
                      reporter=RichReporter(err), on_warning=_warn, as_typed=" ".join(["ec2gpu", *sys.argv[1:]]),
                      workdir_outside=workdir_outside, infra=infra, allow_write_buckets=allow_write_bucket, ports=port)
    _print_record(record.to_json(), as_json)


def _task_file(args: Optional[List[str]]) -> str | None:
    """ARGS is a task file when it is one *.yaml / *.yml path; otherwise a command."""
    return args[0] if args and len(args) == 1 and args[0].endswith((".yaml", ".yml")) else None


def _warn(text: str) -> None:
    """A task file's warning: it may quote the file's values (inert, never markup: render.warn)."""
    warn(text)


@app.command("status")
def status_cmd(run_id: str = typer.Argument(..., help="The run id `ec2gpu run --detach` (or an array) printed."),
               region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Show a detached run from any machine of the account: state, attempt, instance, interruptions.

    Read from the run's record (state.json) in S3 (written by its agent) and its Auto Scaling group. A run
    that is over has its group, launch template, security group, key pair and role removed now.
    An array or a sweep this machine runs: its elements done, running, queued and failed, its
    instances, the cost so far and the ETA, as its live line shows them (no AWS call)."""
    from .. import api
    got = api.status(run_id, region=region, sandbox=_sandbox_flag(sandbox), log=_one_line).to_json()
    if as_json:
        render_json(got)
        return
    _say_status(got, sandbox)


@app.command("cancel")
def cancel_cmd(run_id: str = typer.Argument(..., help="The run id `ec2gpu run --detach` printed."),
               wait: float = typer.Option(180.0, "--wait", min=0, help="Seconds to give the agent to stop the job "
                                          "and save its outputs to S3 before the group is removed."),
               region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Cancel a detached run: the job is stopped, its outputs saved to S3, everything it made removed."""
    from .. import api
    got = api.cancel(run_id, wait=wait, region=region, sandbox=_sandbox_flag(sandbox), log=_one_line).to_json()
    if as_json:
        render_json(got)
        return
    _say_status(got, sandbox)


def _say_array(got: Mapping[str, Any], sandbox: bool = False) -> None:
    """An array's status as its live line shows it (every value a number the reader checked)."""
    a = got["array"]
    c = a.get("counts") or {}
    state = "detached" if got.get("detached") and got["state"] in ("running", "controller-lost") else got["state"]
    say(out, f"run {got['run_id']}: {state} (an array"
             + (f" of task {got['task']}" if got.get("task") else "") + ")")
    parts = [f"elements: {c.get('done', 0)} done, {c.get('running', 0)} running, {c.get('queued', 0)} queued, "
             f"{c.get('failed', 0)} failed"]
    if a.get("instances") is not None:
        parts.append(f"{count(a['instances'], 'instance')}")
    if got.get("cost_usd") is not None:
        parts.append(f"cost ${got['cost_usd']:.4f}")
    elif a.get("cost_so_far_usd") is not None:
        parts.append(f"${a['cost_so_far_usd']:.4f} so far")
    if a.get("eta_s") is not None:
        parts.append(f"ETA {int(a['eta_s']) // 60}:{int(a['eta_s']) % 60:02d}")
    say(out, "; ".join(parts))
    where = " --sandbox" if sandbox else ""
    handed, fetch = got.get("handover"), f"`ec2gpu fetch {got['run_id']}{where}`"
    left = "it was detached (--detach)" if got.get("detached") else "its controller was lost"
    if handed:
        say(out, f"{left}; its head handed the results over to S3 at {handed.get('handover_at')} "
                 f"(the driver {handed.get('state')}; hand-over: {handed.get('handover')}): {fetch} brings them home")
    elif a.get("updated_at") and (got["state"] == "running" or not a.get("final")):
        say(out, f"as of {a['updated_at']} (the run's progress.json, {got['artifacts']})"
            + ("" if got["state"] == "running" else f": {left} then; its driver's lines: `ec2gpu logs "
               f"{got['run_id']}{where} --follow`; once its head has handed the results "
               f"over, {fetch} brings them home"))


def _say_status(got: Mapping[str, Any], sandbox: bool = False) -> None:
    """A detached run's status in a few plain lines (every value inert: it came from the instance);
    ``sandbox``: the command was given --sandbox (the commands it suggests need it too)."""
    group = got.get("group")
    line = f"run {got['run_id']}: {got['state']}"
    if got.get("array") is not None:  # an array this machine runs (pool/attempt.local_status)
        _say_array(got, sandbox)
        return
    if got.get("attempt"):
        line += f", attempt {got['attempt']}"
    if got.get("interruptions"):
        line += f", {count(got['interruptions'], 'spot interruption')} survived"
    if got.get("restarts"):
        line += f", {count(got['restarts'], 'restart')} after errors"
    say(out, line)
    if got.get("instance_id"):
        facts = ", ".join(str(got[k]) for k in ("instance_type", "market") if got.get(k))
        say(out, f"instance {got['instance_id']}" + (f" ({facts})" if facts else ""))
    if got.get("exit_code") is not None:
        say(out, f"exit code {got['exit_code']}")
    if "cost_usd" in got:  # a detached run's (runs/detached/costs.py): a cost so far while it runs
        c = got.get("cost") or {}
        cost = "unknown (" + "; ".join(c.get("unknown") or ["no price"]) + ")" if got["cost_usd"] is None \
            else f"${got['cost_usd']:.4f}" + (" so far" if c.get("running") else "") \
            + (" (an upper bound)" if got.get("upper_bound") else "")
        say(out, f"cost {cost} for {got.get('billed_seconds') or 0:.0f} s billed")
        if c.get("not_this_runs"):  # the record named another run's instances (costs.own_launches, costs.settle)
            warn("state.json names instances that are not this run's, not billed here: "
                 + ", ".join(inert(str(i)) for i in c["not_this_runs"]))
    if got.get("message"):
        say(out, f"message: {got['message']}")
    if got.get("problem"):
        warn(f"state.json: {got['problem']}")
    if group:
        say(out, f"group {group['name']}: desired {group['desired']}, instances "
                 + (", ".join(f"{i['id']} {i['state']}" + (f" ({i['instance_type']})" if i.get("instance_type") else "")
                              for i in group["instances"]) or "none"), soft_wrap=True)
    removed = {k: v for k, v in (got.get("removed") or {}).items() if k != "left" and v}
    if removed:
        say(out, "removed " + "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in removed.items()))
    if (got.get("removed") or {}).get("left"):
        warn("could not remove " + ", ".join(got["removed"]["left"]) + " (`ec2gpu cleanup` tries again)")
