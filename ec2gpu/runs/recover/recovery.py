"""Managed runs: instance after instance until the job finishes, resuming from its checkpoint.

An attempt is the run's instances (execute/engine.py): launch, SSH, setup, the workdir up (and, on a
replacement, the checkpoint directory as last brought home), the job started with
EC2GPU_RESUME=1, its log followed. While it runs, node 0's checkpoint directory is brought home
(and to ``--checkpoint-uri s3://...``) as it changes. The attempt is *interrupted* when

- the instance agent saw a spot interruption notice and stopped the job (its record's state
  "interrupted"),
- EC2 reports an instance shutting down, stopping or terminated (checked every 5 s, and at once
  whenever SSH drops), or
- SSH stays unreachable longer than a bound (``unreachable_s``, default 120 s).

Then the instance is terminated (if EC2 has not done it), billed, and a replacement is launched: the
same type in another zone first, then the next type of ``--instance-type``, then on-demand with
``--spot-fallback on-demand``; up to ``--max-attempts``. A dropped SSH connection alone is not an
interruption: the job runs detached, and the log resumes from the byte it had reached.

The same holds before the job runs (issue 51, item 10): a step on a node that fails while its
instance is being reclaimed (SSH dropped in the machine setup, the upload, the file_mounts, the
task's setup, Ray's start) is a ``Loss`` once EC2 says the instance is gone (``lost``), and
``after_loss`` says what the attempt does: a pool's worker is dropped (its pool goes on and
launches a replacement while elements wait: pool/follow.py), any other node (a run's, one of a
several-node run's, a pool's head) ends the attempt as Interrupted, which the run's recovery above
relaunches.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet, Any, Callable

from ... import words
from ...aws import instances, storage
from ...aws.session import AWS_ERRORS
from ...errors import AwsError, RemoteError, WaitTimeout
# re-exported (recovery.Interrupted, recovery.AttemptsExhausted: what an attempt raises)
from ...errors import AttemptsExhausted as AttemptsExhausted, Interrupted as Interrupted
from ...remote import files
from ..plan.checks import parse_checkpoint_uri as parse_checkpoint_uri  # a flag's check: the plan makes it first

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...aws.session import Aws
    from ...remote.files import Limits, RemoteFile

GONE_STATES = ("shutting-down", "terminated", "stopping", "stopped")
STATE_EVERY_S = 5.0  # how often EC2 is asked about the instance while the job runs
#: how often what a job wrote under a MOUNT-mode file_mounts target is written back to its bucket
#: while it runs (SkyPilot's MOUNT writes through; so a spot interruption loses at most this much)
WRITE_BACK_EVERY_S = 60.0
#: while the job runs, a file modified in the last this many seconds is left for the next write-back
#: (it may be half-written), and one write-back may take at most WRITE_BACK_TIMEOUT_S (the log waits
#: for it); the write-back when the job ends sends everything, with no such bounds
WRITE_BACK_SETTLED_S = 30.0
WRITE_BACK_TIMEOUT_S = 300.0
MAX_API_FAILURES = 12  # DescribeInstances errors in a row (about a minute of polls) before the run gives up
#: after a step on a node failed the way a reclaimed instance makes it fail (its SSH connection
#: dropped, SSH never answered), how long EC2 is asked whether the instance is gone (s), every
#: LOST_ASK_EVERY_S: EC2 stops or terminates a spot instance two minutes after its notice
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html),
#: and what DescribeInstances says of it follows "eventually", so it is asked again for a few
#: seconds (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html)
LOST_CONFIRM_S = 10.0
LOST_ASK_EVERY_S = 2.0
DROP, RELAUNCH = "drop", "relaunch"  # after_loss's answers


def s3_home(aws: Aws, uri: str | None, run_id: str) -> dict[str, Any]:
    """DirCheckpoints' S3 fields for ``--checkpoint-uri s3://bucket/prefix``: files go to
    s3://bucket/prefix/<run id>/<path in the checkpoint directory>; {} without a URI."""
    target = parse_checkpoint_uri(uri)
    if not target:
        return {}
    return {"s3": aws.client("s3"), "target": (target[0], "/".join(p for p in (target[1], run_id) if p))}


@dataclass
class NoCheckpoints:
    """For nodes whose checkpoints do not come home (every node of a task but node 0)."""

    remote: str = ""

    def sync(self, conn: Any, force: bool = False) -> bool:
        return False


@dataclass
class DirCheckpoints:
    """Brings a task's checkpoint directory (``remote`` on node 0) home to ``local``, at most every
    ``every_s`` seconds: files new or changed since the last look (by size and mtime), each
    replaced atomically. ``push`` gives a replacement instance the directory as it came home."""

    remote: str
    local: Path
    log: Callable[[str], object] = print
    every_s: float = 5.0
    seen: dict[str, tuple[int, float]] | None = None  # relative path -> (size, mtime) of the copy brought home
    last: float = 0.0
    s3: Any = None  # an S3 client (boto3: untyped), with ``target``: a second home (--checkpoint-uri)
    target: tuple[str, str] | None = None  # (bucket, key prefix)
    limits: Limits | None = None  # remote/files.Limits: what may come home in all (None: its defaults)
    warned: set[str] | None = None  # names already reported as not brought home

    def __post_init__(self) -> None:
        if self.limits is None:
            self.limits = files.Limits()

    def has_any(self) -> bool:
        return self.local.is_dir() and any(p.is_file() for p in self.local.rglob("*"))

    def sync(self, conn: Any, force: bool = False) -> bool:
        """Copy what changed (``force``: even within ``every_s`` of the last look); return whether
        anything did. Names are the instance's (hostile input): each is checked and written only
        inside ``local`` (remote/files.py), at most ``limits`` files and bytes in all, and what is
        skipped is said once per name. Connection errors propagate."""
        if not force and time.monotonic() - self.last < self.every_s:
            return False
        self.last = time.monotonic()
        self.seen = self.seen if self.seen is not None else {}
        self.warned = self.warned if self.warned is not None else set()
        listed = self._listing(conn, self.remote)
        changed = [f for f in listed.values() if self.seen.get(f.name) != (f.size, f.mtime)]
        left = self.limits_left({f.name for f in changed})
        sel = files.select(changed, self.local, left)
        for name, why in sel.skipped + [(f.name, "above the limit") for f in sel.left]:
            if name not in self.warned:
                self.warned.add(name)
                self.log(f"warning: checkpoint file {name!r} not brought home: {why}")
        copied, budget = 0, left.bytes
        for f in sel.files:
            target = self.local / f.name
            try:
                budget -= files.pull_bounded(conn, f"{self.remote}/{f.name}", target, budget)
            except (FileNotFoundError, files.TooBig):
                continue  # replaced or growing while it was copied: the next look takes it
            self.seen[f.name] = (f.size, f.mtime)
            copied += 1
            self._to_s3(target, f.name)
        if copied:
            also = f" and s3://{'/'.join(self.target)}/" if self.s3 is not None and self.target else ""
            self.log(f"checkpoint directory: {words.count(copied, 'file')} brought home to {self.local}{also}")
        return bool(copied)

    def limits_left(self, replacing: AbstractSet[str] = frozenset()) -> Limits:
        """The download limits less what this directory already holds at home (the files named in
        ``replacing``, about to be replaced, left out)."""
        assert self.limits is not None  # __post_init__ gives the defaults
        have = [p for p in self.local.rglob("*") if p.is_file() and not p.is_symlink()
                and p.relative_to(self.local).as_posix() not in replacing] if self.local.is_dir() else []
        return files.Limits(max(0, self.limits.files - len(have)),
                            max(0, self.limits.bytes - sum(p.stat().st_size for p in have)))

    def _to_s3(self, path: Path, rel: str) -> None:
        if self.s3 is None or not self.target:
            return
        try:
            storage.upload(self.s3, path, self.target[0], f"{self.target[1]}/{rel}".lstrip("/"))
        except Exception as exc:  # S3 is a second copy: a failure is reported, never fatal
            self.log(f"warning: could not upload {rel} to s3://{self.target[0]}/{self.target[1]}: {exc}")

    def push(self, conn: Any, remote_dir: str) -> int:
        """Upload the local directory to ``remote_dir`` on a replacement; return the file count."""
        paths = [p for p in self.local.rglob("*") if p.is_file() and not p.name.startswith(".")]
        files.put_tree(conn, self.local, paths, remote_dir)
        if remote_dir == self.remote:  # what it has now came from here: not brought home again
            self.seen = {f.name: (f.size, f.mtime) for f in self._listing(conn, remote_dir).values()}
        return len(paths)

    @staticmethod
    def _listing(conn: Any, remote_dir: str) -> dict[str, RemoteFile]:
        """{relative path: remote_files.RemoteFile} of the regular files under ``remote_dir`` (none:
        {}), listed over SFTP (no shell), hidden ones (a file being written, by the atomic-rename
        convention) left out."""
        return {f.name: f for f in files.list_files(conn, remote_dir, hidden=False)}


class InstanceWatch:
    """``on_poll`` for jobs.follow_reconnecting: brings checkpoints home while connected, and asks
    EC2 about the instance every ``every_s`` seconds, or at once while disconnected. Raises
    Interrupted when EC2 reports it gone."""

    def __init__(self, ec2: Any, instance_id: str, checkpoints: NoCheckpoints | DirCheckpoints,
                 log: Callable[[str], object], every_s: float = STATE_EVERY_S) -> None:
        self.ec2, self.instance_id, self.checkpoints, self.log, self.every_s = ec2, instance_id, checkpoints, log, every_s
        self.last = time.monotonic()
        self.failures = 0  # API errors in a row
        # fn(conn): MOUNT-mode file_mounts written back (engine), every WRITE_BACK_EVERY_S
        self.write_back: Callable[[Any], None] | None = None
        self.written_back = time.monotonic()

    def __call__(self, conn: Any) -> None:
        if conn is not None:
            self.checkpoints.sync(conn)
        if conn is not None and self.write_back and time.monotonic() - self.written_back >= WRITE_BACK_EVERY_S:
            self.written_back = time.monotonic()
            try:
                self.write_back(conn)
            except RemoteError as exc:  # the end of the job writes back again; a failure then fails the run
                self.log(f"warning: file_mounts not written back this time: {exc.message}")
        if conn is None or time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            self.check()

    def check(self) -> None:
        """Raise Interrupted when EC2 reports the instance gone. An API error (botocore's) is not an
        interruption: it is reported and asked again at the next poll, up to MAX_API_FAILURES in a
        row, then AwsError (the run cannot watch its instance, so it stops and tears down)."""
        try:
            inst = instances.describe_instances(self.ec2, [self.instance_id])[0]
        except AWS_ERRORS as exc:
            self.failures += 1
            if self.failures <= MAX_API_FAILURES:
                self.log(f"could not read the state of {self.instance_id} ({self.failures} of {MAX_API_FAILURES}): "
                         f"{exc}")
            if self.failures >= MAX_API_FAILURES:
                raise AwsError(f"EC2 did not answer for the state of {self.instance_id} {self.failures} times in a row "
                               f"({type(exc).__name__})", "check the network and the AWS endpoint; once it answers, "
                               "`ec2gpu cleanup` removes what the run left (listed above)") from exc
            return
        self.failures = 0
        why = gone_reason(inst.state, inst.state_reason)
        if why is not None:
            raise Interrupted(why)


def gone_reason(state: str, reason: str | None) -> str | None:
    """Why an instance in EC2 ``state`` (StateReason's ``reason``, or None) is gone, in the words an
    Interrupted gives; None while it is not (pure)."""
    if state not in GONE_STATES:
        return None
    return f"EC2 reports the instance {state}" + (f" ({reason})" if reason else "")


def gone_now(ec2: Any, instance_ids: list[str]) -> dict[str, str]:
    """{instance id: gone_reason's words} of those of ``instance_ids`` EC2 says are gone, asked in
    one DescribeInstances; {} when EC2 does not answer (botocore's errors: the next look asks
    again; a step is never stopped for an API error)."""
    try:
        found = instances.describe_instances(ec2, instance_ids)
    except AWS_ERRORS:
        return {}
    return {i.id: why for i in found if (why := gone_reason(i.state, i.state_reason)) is not None}


@dataclass(frozen=True)
class Loss:
    """A node lost before or while its job ran: node ``node`` (its index in the attempt), its
    instance, the ``phase`` it was lost in ("machine setup", "upload", "file_mounts", "task
    setup", "Ray start", ...) and EC2's ``reason`` (gone_reason's words)."""

    node: int
    instance_id: str
    phase: str
    reason: str

    def words(self) -> str:
        return f"node {self.node} ({self.instance_id}) lost in the {self.phase}: {self.reason}"


def confirm_wait_s(exc: BaseException) -> float | None:
    """How long (s) EC2 is asked whether a node is gone after a step on it raised ``exc`` (pure):
    LOST_CONFIRM_S for what a reclaimed instance makes a step raise (a dropped connection: an
    OSError, EOFError or paramiko's SSHException; SSH that never answered: WaitTimeout; a command
    whose channel closed without an exit status: RemoteError with exit status None or -1), 0 (asked
    once) for a command that ended with its own exit status, None for anything else (a usage
    error, this machine's bug: no instance explains it)."""
    from ...remote import jobs  # here: a dry run imports no paramiko (test_dry_run.py)
    if isinstance(exc, RemoteError):
        return LOST_CONFIRM_S if exc.exit_status in (None, -1) else 0.0
    if isinstance(exc, (*jobs.CONNECTION_ERRORS, WaitTimeout)):
        return LOST_CONFIRM_S
    return None


def lost(watch: InstanceWatch | None, exc: BaseException, wait_s: float | None = None,
         every_s: float = LOST_ASK_EVERY_S) -> Interrupted | None:
    """The Interrupted that explains ``exc``, raised by a step on the node ``watch`` watches: ``exc``
    itself when it is one (SSH unreachable past its bound), else the watch's when EC2 says the
    instance is gone, asked for up to ``wait_s`` seconds (default: confirm_wait_s(exc)) every
    ``every_s``; None when it is not (the step failed for its own reasons). An EC2 error while
    asking is no answer (InstanceWatch.check), and AwsError after MAX_API_FAILURES passes through."""
    if isinstance(exc, Interrupted):
        return exc
    wait = confirm_wait_s(exc) if wait_s is None else wait_s
    if watch is None or wait is None:
        return None
    deadline = time.monotonic() + wait
    while True:
        try:
            watch.check()
        except Interrupted as gone:
            return gone
        if time.monotonic() + every_s > deadline:
            return None
        time.sleep(every_s)


def after_loss(losses: list[Loss], pool: bool) -> str:
    """What an attempt does once ``losses`` (nodes lost in a step before the job ran) are known
    (pure): DROP when it is a pool's (``pool``) and its head (node 0) is not among them: the workers
    leave the pool, which goes on and is given replacements while elements wait (pool/follow.py);
    RELAUNCH otherwise (a run's node, any node of a several-node run, a pool's head, whose driver
    and Ray's scheduler go with it): the attempt ends as Interrupted, and the run's recovery
    launches it again (runs/provision/pipeline.py, up to --max-attempts)."""
    return DROP if pool and losses and all(x.node != 0 for x in losses) else RELAUNCH


def interrupted_by(losses: list[Loss]) -> Interrupted:
    """The Interrupted that ends an attempt for ``losses`` (after_loss's RELAUNCH): the first one's
    words, and how many more."""
    more = f" (and {words.count(len(losses) - 1, 'more node')})" if len(losses) > 1 else ""
    return Interrupted(losses[0].words() + more)


def attempt_row(n: int, instance: Instance, node: int | None = None) -> dict[str, Any]:
    """The ledger's record of one instance of attempt ``n`` (``node`` K of a cluster), before it ends (pure)."""
    start = instance.billing_start
    return {"attempt": n, "node": node, "instance_id": instance.id, "instance_type": instance.type,
            "zone": instance.zone, "market": instance.market,
            "ended": "running", "billing_started_at": start.isoformat() if start else None}


def exhausted(attempts: list[dict[str, Any]], local_ckpt: Path, spot: bool, allowed: int) -> AttemptsExhausted:
    """The error for a run whose last allowed attempt was interrupted."""
    where = f"the last checkpoints are in {local_ckpt}" if local_ckpt.exists() else "no checkpoint was brought home"
    return AttemptsExhausted(
        f"stopped after {words.count(allowed, 'attempt')}, each interrupted (last: {attempts[-1]['ended']}); {where}",
        "raise --max-attempts" + (", add --spot-fallback on-demand, or run on-demand" if spot else ""))
