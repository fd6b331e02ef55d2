"""The instance side of a detached run (issue 30): the run's own agent owns the job's lifecycle,
S3 holds everything that must survive, and the run's Auto Scaling group (aws/groups.py) replaces
an interrupted spot instance. No controller of ours runs anywhere once the run is launched.

Shipped with its modules as flat files (runs/detached/launch.AGENT_FILES, each checked against its
sha256 in the launch template before any runs) and started by the instance's user data (root, at
boot) as ``python3 detached.py --bucket B --user U --run-id R --region REGION [--home DIR] [--every S]
[--poll S] [--imds-endpoint URL] [--spec-sha256 HEX]`` (U: the user id of whoever started the run,
whose prefix holds it; HOME is the job's; the run's directory is HOME/ec2gpu/runs/RUN_ID, as
remote/jobs.run_dir; the workdir RUN_DIR/workdir). Standard library and boto3 only (the Deep Learning
AMI has boto3). Credentials: boto3's default chain, which on the instance is the instance profile
through IMDSv2, and only that (``role_session``): never a file the controller sent, nor keys in the
environment. Endpoints: boto3 honours AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL_AUTO_SCALING and
AWS_EC2_METADATA_SERVICE_ENDPOINT (the sandbox sets them); the metadata endpoint is handed to
agent.py as EC2GPU_IMDS_ENDPOINT.

The agent, by concern:

- this module: one launch, start to end (``Detached``), and the command line;
- context.py: what a launch works with (its clients, clock, log, places and pace);
- wire/run_spec.py: spec.json, the run's contract, written by the controller before launch;
- store.py: the run's prefix in S3 (``runs/<user>/<run_id>/``: wire/names.py), and the run's record
  ``state.json`` (wire/run_record.py) held as a lease: conditional writes, a later launch supersedes;
  the ``cancel`` object (any object there: ``ec2gpu cancel`` wrote it; checked at the start and on
  every poll);
- prepare.py: the instance made ready (the workdir from ``workdir.tar.gz``, the secrets, file_mounts);
- mirror.py: checkpoints, outputs, the log and the MOUNT-mode file_mounts up to S3;
- attempt.py: one attempt of the setup and the job, under agent.py (its record: wire/agent_record.py);
- gang.py, members.py, several.py: a run of several nodes.

What happens, in order: the launch is counted (a launch beyond max_launches, a terminal state or a
cancel object ends the group at once); the workdir is unpacked, the earlier log and the checkpoints
downloaded; the setup runs (a failed setup is a user-code failure); the job runs under agent.py,
which signs its record with a key this agent gave it (a job cannot forge its verdict). On the job's
end: succeeded -> outputs, log, record, end the group; failed -> restarted on this instance with
EC2GPU_RESUME=1 while ``restarts`` < max_restarts_on_errors, else outputs, log, record failed, end
the group; a spot notice -> checkpoints and log at once, ``interrupted``, and the group is NOT
ended: AWS replaces the instance and the next launch resumes; cancel -> SIGTERM (agent.py forwards
it to the job), outputs, log, ``cancelled``, end the group. A launch that finds a later launch
recorded (the group may start a replacement while this one still runs: a failed health check
of a live instance; Capacity Rebalancing, off in a run's group, would too) stops its job and
writes nothing more: the later one owns the prefix.

A secret that is missing (deleted, or the role may not read it) ends the run failed before the
setup, with the names that were missing.

Known limit: the job runs with the same instance role and so could rewrite the run's prefix
(state.json included); the launch cap read from state.json is then the job's to forge, and the
group's deadline action is what bounds a run whose job is hostile. What it cannot rewrite is the
code a later launch runs as root: the user data checks each agent file against the sha256 in the
launch template before any runs (runs/detached/launch.boot_script), and hands this agent
``--spec-sha256``, the sha256 of spec.json's bytes: a spec.json with other bytes is refused (the
run ends failed, nothing of it used). spec.json is written once, by the controller, before launch;
nothing rewrites it, so one hash holds for every launch.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
from typing import Any, Callable

if __package__:  # in the package (tests, the controller)
    from ..wire import names, run_record, run_spec
    from . import agent, attempt, context, gang, members, mirror, prepare, several, store
else:  # on the instance: the agent's files beside this file (sys.path[0]), not a package to install
    names = importlib.import_module("names")
    run_record = importlib.import_module("run_record")
    run_spec = importlib.import_module("run_spec")
    agent = importlib.import_module("agent")
    attempt = importlib.import_module("attempt")
    context = importlib.import_module("context")
    gang = importlib.import_module("gang")
    members = importlib.import_module("members")
    mirror = importlib.import_module("mirror")
    prepare = importlib.import_module("prepare")
    several = importlib.import_module("several")
    store = importlib.import_module("store")

#: this process's exit codes (context.py's), named here too: the command line's and the tests' module
EXIT_REFUSED, EXIT_INTERRUPTED, EXIT_SUPERSEDED = context.EXIT_REFUSED, context.EXIT_INTERRUPTED, context.EXIT_SUPERSEDED
Refused = names.Refused

FINAL = run_record.FINAL_STATES


class Detached:
    """One launch of a detached run on this instance (module docstring), made of its parts: ``ctx``
    (context.Context: everything from outside, injectable: ``s3`` and ``asg`` boto3 clients,
    ``clock`` POSIX seconds, ``sleep``, ``imds`` path -> text or None, ``gpus`` -> GPU count),
    ``lease`` (store.Lease: the run's record), ``uploads`` (mirror.Uploads), ``job``
    (attempt.Job), ``members`` (members.Members: several nodes). Refused for a user id or run id
    that is not one, before any key is made."""

    def __init__(self, *, bucket: str, user: str, run_id: str, home: str, s3: Any, asg: Any, ssm: Any = None,
                 s3_for: Callable[[str], Any] | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 imds: Callable[[str], str | None] | None = None, imds_endpoint: str = agent.IMDS,
                 gpus: Callable[[], int] = prepare.gpu_count, every_s: float = 60.0, poll_s: float = 5.0,
                 agent_poll_s: float = agent.SPOT_POLL_S, stop_grace_s: float = 90.0, settled_s: float = 5.0,
                 spec_sha256: str | None = None,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)):
        endpoint = imds_endpoint.rstrip("/")
        runs = store.Store(s3, bucket, user, names.check_run_id(run_id))
        self.ctx = context.Context(store=runs, asg=asg, ssm=ssm, s3_for=s3_for, clock=clock, sleep=sleep, log=log,
                                   imds=imds or prepare.imds_reader(endpoint), imds_endpoint=endpoint, gpus=gpus,
                                   home=os.path.abspath(home), every_s=every_s, poll_s=poll_s,
                                   agent_poll_s=agent_poll_s, stop_grace_s=stop_grace_s, settled_s=settled_s,
                                   stale_s=gang.STALE_S)
        self.spec_sha256 = spec_sha256  # spec.json's, from the user data (main: --spec-sha256); None: not checked
        self.run_id = run_id
        self.lease = store.Lease(self.ctx, names.GROUP_PREFIX + run_id)
        self.uploads = mirror.Uploads(self.ctx)
        self.job = attempt.Job(self.ctx, {}, "")
        self.members = members.Members(self.ctx)
        self.spec: dict[str, Any] = {}
        self.hooks = attempt.Hooks(cancelled=self.lease.cancelled, tick=lambda: self.uploads.tick(self.lease),
                                   begin=self.lease.save)

    def execute(self) -> int:
        """This launch, start to end; returns this process's exit code (0: the run ended)."""
        try:
            return self._execute()
        except store.Superseded as exc:
            self.ctx.log(f"superseded: {exc}; this instance writes nothing more")
            return EXIT_SUPERSEDED
        except Exception as exc:  # a bug or S3 out of reach: the run ends rather than bill on
            job = self.job
            if job.proc is not None and job.proc.poll() is None:
                job.stop(job.proc, job.key)
            self.ctx.log(f"detached agent error: {type(exc).__name__}: {exc}"[:1000])
            return self.lease.end("failed", f"the detached agent failed: {type(exc).__name__}: {exc}"[:1000]) or 1

    def _execute(self) -> int:
        ctx, lease = self.ctx, self.lease
        at = ctx.clock()
        st = lease.load()
        if not lease.conditional:
            ctx.log(f"this boto3 cannot write S3 objects conditionally (botocore {store.MIN_CONDITIONAL_BOTOCORE} or "
                    f"later can): {run_record.NAME} is written without a check")
        instance_id = self.count_launch(at)
        try:
            data = ctx.store.get_json(run_spec.NAME, run_spec.MAX_BYTES, self.spec_sha256)
            self.spec = self.job.spec = run_spec.parse(data, self.run_id, ctx.store.prefix)
        except Refused as exc:
            ctx.log(f"refused: {exc}")
            if st["state"] not in FINAL:
                st.update(state="failed", message=f"spec refused: {exc}"[:1000])
            lease.end(st["state"], st["message"])
            return EXIT_REFUSED
        if self.spec["nodes"] > 1:
            return several.Several(ctx, self.spec, lease, self.uploads, self.job, self.members).run(instance_id, at)
        if st["state"] in FINAL:  # ended before; the group was not (or this launch is late)
            return lease.end(st["state"], st["message"])
        if lease.cancelled():
            return lease.end("cancelled", "cancelled before this launch ran anything")
        if lease.launch > self.spec["max_launches"]:
            return lease.end("failed", f"launch {lease.launch} is beyond max_launches {self.spec['max_launches']}")
        if self.spec["limit_at"] is not None and at >= self.spec["limit_at"]:
            return lease.end("failed", "the run's time limit passed before this launch")
        st["state"] = "starting"
        lease.save()
        return self.run_one()

    def count_launch(self, at: float) -> str:
        """This launch counted in the record (``launches``, its entry of ``instances``; the last
        attempt "lost" when it was still running: its instance went away without a word); returns
        this instance's id ("unknown" when the metadata service does not say)."""
        lease = self.lease
        st = lease.status
        lease.launch = st["launches"] + 1
        instance_id = self.ctx.imds("/latest/meta-data/instance-id") or "unknown"
        instance_id = instance_id if re.fullmatch(r"[A-Za-z0-9-]{1,64}", instance_id) else "unknown"
        st.update(launches=lease.launch, instance_id=instance_id)
        last = st["attempts"][-1] if st["attempts"] else None
        if last and last.get("outcome") == "running":  # its instance went away without a word
            last.update(outcome="lost", ended_at=st.get("updated_at"))
            st["interruptions"] += 1
        st["instances"] = (st["instances"] + [
            {"launch": lease.launch, "instance_id": instance_id, "started_at": store.iso(at),
             "last_seen_at": store.iso(at), "setup_exit_code": None, "setup_runs": 0, "resumed": False,
             "checkpoint_files": 0}])[-run_record.MAX_ENTRIES:]
        return instance_id

    def run_one(self) -> int:
        """The launch of a run of one node: the instance made ready, the earlier log and the
        checkpoints pulled, then the attempts."""
        ctx, spec, uploads = self.ctx, self.spec, self.uploads
        try:
            self.job.workdir, uploads.write_backs = prepare.instance(ctx, spec)
        except Refused as exc:
            ctx.log(f"refused: {exc}")
            return self.lease.end("failed", str(exc)[:1000])
        ip = ctx.imds("/latest/meta-data/local-ipv4") or "127.0.0.1"
        ip = ip if re.fullmatch(r"[0-9a-fA-F.:]{1,64}", ip) else "127.0.0.1"
        python = attempt.find_python(spec["python"])
        env = attempt.job_env(spec, ctx.run_dir, self.job.workdir, ip, ctx.gpus(), False, python, ctx.secrets)
        uploads.start(env["EC2GPU_OUTPUT_DIR"], env["EC2GPU_CHECKPOINT_DIR"], spec["outputs"])
        uploads.pull_log()
        prepare.share_log(ctx, spec["log_reader"])
        found = uploads.ckpt.pull() if uploads.ckpt else 0
        self.lease.status["instances"][-1].update(resumed=found > 0, checkpoint_files=found)
        prepare.link_sky_workdir(ctx.home, self.job.workdir)
        return self.attempts(ip, python, resume=found > 0)

    def attempts(self, ip: str, python: str, resume: bool) -> int:
        """The setup (until it succeeds) and the job, restarted on this instance after a failure
        while max_restarts_on_errors allows; this process's exit code."""
        ctx, spec, lease, uploads = self.ctx, self.spec, self.lease, self.uploads
        st = lease.status
        setup_done = spec["setup"] is None
        while True:
            if lease.cancelled():
                return uploads.finish(lease, "cancelled", "cancelled")
            env = attempt.job_env(spec, ctx.run_dir, self.job.workdir, ip, ctx.gpus(), resume, python, ctx.secrets)
            if not setup_done:
                code = self.job.run_setup(env, self.hooks)
                inst = st["instances"][-1]
                inst.update(setup_exit_code=code, setup_runs=inst["setup_runs"] + 1)
                if code == -1:
                    return uploads.finish(lease, "cancelled", "cancelled during the setup")
                if code != 0:
                    if st["restarts"] < spec["max_restarts_on_errors"]:
                        st["restarts"] += 1
                        ctx.log(f"the setup exited {code}: running it again")
                        lease.try_save()
                        continue
                    st.update(exit_code=code, signal=None)
                    return uploads.finish(lease, "failed", f"the setup exited {code}")
                setup_done = True
            outcome, record = self.job.run_job(env, lease, self.hooks)
            if outcome != "failed":
                return self.ended(outcome)
            if st["restarts"] < spec["max_restarts_on_errors"]:
                st["restarts"] += 1
                uploads.push(settled=False)
                lease.try_save()
                resume = True
                continue
            how = f"signal {record.get('signal')}" if record.get("signal") else f"exit {record.get('exit_code')}"
            return uploads.finish(lease, "failed", f"the job failed ({how}) with {st['restarts']} "
                                                   f"restart(s) on errors used")

    def ended(self, outcome: str) -> int:
        """What an attempt that did not fail (``outcome``: succeeded, interrupted, cancelled, limit)
        leaves: the run's end, or (a spot notice) the checkpoints and log up for the group's replacement."""
        lease, uploads = self.lease, self.uploads
        if outcome == "interrupted":
            uploads.push(settled=False)
            lease.status.update(state="interrupted", message="spot interruption: the group replaces the instance")
            lease.status["interruptions"] += 1
            lease.try_save()
            return EXIT_INTERRUPTED
        if outcome == "succeeded":
            return uploads.finish(lease, "succeeded", None)
        if outcome == "limit":
            return uploads.finish(lease, "failed", "the run's time limit: the job was stopped")
        return uploads.finish(lease, "cancelled", "cancelled")


def role_session(region: str) -> Any:
    """A boto3 session whose only source of credentials is the instance profile through the
    metadata service (botocore's "iam-role" provider, IMDSv2): keys in the environment, in
    ~/.aws files or from a process there are never used, whoever put them there."""
    import boto3
    import botocore.session
    core = botocore.session.get_session()
    resolver = core.get_component("credential_provider")
    resolver.providers = [p for p in resolver.providers if getattr(p, "METHOD", "") == "iam-role"]
    return boto3.session.Session(botocore_session=core, region_name=region)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--bucket", required=True)
    p.add_argument("--user", required=True, help="the user id whose prefix runs/USER/ holds the run")
    p.add_argument("--run-id", required=True)
    p.add_argument("--region", required=True)
    p.add_argument("--home", default=os.environ.get("HOME") or "/root",
                   help="the job's HOME; the run's directory is HOME/ec2gpu/runs/RUN_ID")
    p.add_argument("--every", type=float, default=60.0, help="seconds between uploads of the log and checkpoints")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between checks of the job and the cancel object")
    p.add_argument("--imds-endpoint", default=os.environ.get("EC2GPU_IMDS_ENDPOINT")
                   or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or agent.IMDS)
    p.add_argument("--spec-sha256", help="spec.json's sha256 (lowercase hex), from the user data: another is refused")
    args = p.parse_args(argv)
    try:
        names.run_prefix(args.user, args.run_id)
    except Refused as exc:
        print(f"detached: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,62}", args.bucket) or not re.fullmatch(r"[a-z0-9-]{1,32}", args.region):
        print("detached: refused: not a bucket name or region", file=sys.stderr)
        return EXIT_REFUSED
    if args.spec_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", args.spec_sha256):
        print("detached: refused: --spec-sha256 is not a sha256", file=sys.stderr)
        return EXIT_REFUSED
    session = role_session(args.region)
    run = Detached(bucket=args.bucket, user=args.user, run_id=args.run_id, home=args.home, s3=session.client("s3"),
                   asg=session.client("autoscaling"), ssm=session.client("ssm"),
                   s3_for=lambda region: session.client("s3", region_name=region), imds_endpoint=args.imds_endpoint,
                   every_s=args.every, poll_s=args.poll, spec_sha256=args.spec_sha256)
    return run.execute()


if __name__ == "__main__":
    sys.exit(main())
