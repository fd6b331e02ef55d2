"""Managed runs: instance after instance until the job finishes, resuming from its checkpoint.

An attempt is one instance: launch, SSH, setup, push the code (and the newest checkpoint), start the
trainer with ``--resume``, follow its log. While it trains, every new checkpoint is brought home
(and to ``--checkpoint-uri s3://...``). The attempt is *interrupted* when

- the trainer exits 75 (it saw a spot interruption notice and checkpointed) or 143 (SIGTERM, as at
  shutdown),
- EC2 reports the instance shutting down, stopping or terminated (checked every 5 s, and at once
  whenever SSH drops), or
- SSH stays unreachable longer than a bound (``unreachable_s``, default 120 s).

Then the instance is terminated (if EC2 has not done it), billed, and a replacement is launched: the
same type in another zone first, then the next type of ``--instance-type``, then on-demand with
``--spot-fallback on-demand``; up to ``--max-attempts``. A dropped SSH connection alone is not an
interruption: the job runs detached, and the log resumes from the byte it had reached.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..aws import instances
from ..errors import AttemptsExhausted, ExitCode, Interrupted, RemoteError, UsageError  # noqa: F401 (re-exported)

EXIT_SPOT_INTERRUPTED = ExitCode.SPOT_INTERRUPTED  # the trainer's exit after a notice (train/spot.py mirrors it)
EXIT_SIGTERM = 143  # train/mnist.py: SIGTERM, checkpoint written
GONE_STATES = ("shutting-down", "terminated", "stopping", "stopped")
STATE_EVERY_S = 5.0  # how often EC2 is asked about the instance while the job runs


def parse_checkpoint_uri(uri: str | None) -> tuple[str, str] | None:
    """'s3://bucket/prefix' -> (bucket, prefix); None for None. Raises UsageError otherwise."""
    if not uri:
        return None
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise UsageError(f"--checkpoint-uri {uri!r} is not an S3 URI", "use s3://BUCKET/PREFIX")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix.strip("/")


@dataclass
class CheckpointHome:
    """Brings the trainer's newest checkpoint from the instance to ``local`` (and S3)."""

    remote: str  # absolute path on the instance
    local: Path
    s3: object | None = None  # an S3 client, with ``target``
    target: tuple[str, str] | None = None  # (bucket, key)
    log: object = print
    seen: tuple | None = None  # (mtime, size) of the last copy brought home

    def push(self, conn) -> int:
        """Upload the local checkpoint to ``remote`` (a replacement instance); return its size in bytes."""
        conn.sftp().put(str(self.local), self.remote)
        st = conn.sftp().stat(self.remote)
        self.seen = (st.st_mtime, st.st_size)  # not new: no need to bring it home again
        return st.st_size

    def sync(self, conn) -> bool:
        """Copy the remote checkpoint if it changed since the last copy; return whether it did.

        The trainer replaces the file atomically (rename), so an open handle reads one whole
        version; a copy whose size differs from the stat is dropped and retried at the next poll.
        Connection errors propagate (the caller reconnects).
        """
        sftp = conn.sftp()
        try:
            st = sftp.stat(self.remote)
        except FileNotFoundError:
            return False
        if (st.st_mtime, st.st_size) == self.seen:
            return False
        self.local.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.local.with_name(f".{self.local.name}.part")
        try:
            sftp.get(self.remote, str(tmp))
        except FileNotFoundError:
            return False
        if tmp.stat().st_size != st.st_size:
            tmp.unlink(missing_ok=True)
            return False
        os.replace(tmp, self.local)
        self.seen = (st.st_mtime, st.st_size)
        where = str(self.local)
        if self.s3 is not None and self.target:
            try:
                self.s3.upload_file(str(self.local), *self.target)
                where += f" and s3://{'/'.join(self.target)}"
            except Exception as exc:  # S3 is a second copy: a failure is reported, never fatal
                self.log(f"warning: could not upload the checkpoint to s3://{'/'.join(self.target)}: {exc}")
        self.log(f"checkpoint ({st.st_size:,} bytes) brought home to {where}")
        return True


@dataclass
class NoCheckpoints:
    """For nodes whose checkpoints do not come home (every node of a task but node 0)."""

    remote: str = ""

    def sync(self, conn) -> bool:
        return False


@dataclass
class DirCheckpoints:
    """Brings a task's checkpoint directory (``remote`` on node 0) home to ``local``, at most every
    ``every_s`` seconds: files new or changed since the last look (by size and mtime), each
    replaced atomically. ``push`` gives a replacement instance the directory as it came home."""

    remote: str
    local: Path
    log: object = print
    every_s: float = 5.0
    seen: dict = None  # relative path -> (size, mtime) of the copy brought home
    last: float = 0.0

    def has_any(self) -> bool:
        return self.local.is_dir() and any(p.is_file() for p in self.local.rglob("*"))

    def sync(self, conn, force: bool = False) -> bool:
        """Copy what changed (``force``: even within ``every_s`` of the last look); return whether
        anything did. Connection errors propagate."""
        import shlex
        if not force and time.monotonic() - self.last < self.every_s:
            return False
        self.last = time.monotonic()
        self.seen = self.seen if self.seen is not None else {}
        listing = conn.run(f"find {shlex.quote(self.remote)} -type f -printf '%P\\t%s\\t%T@\\n' 2>/dev/null || true",
                           hide=True, in_stream=False).stdout
        changed = []
        for line in listing.splitlines():
            rel, size, mtime = line.rsplit("\t", 2)
            if not rel.startswith(".") and self.seen.get(rel) != (size, mtime):
                changed.append((rel, size, mtime))
        sftp = conn.sftp()
        for rel, size, mtime in changed:
            target = self.local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.part")
            try:
                sftp.get(f"{self.remote}/{rel}", str(tmp))
            except FileNotFoundError:
                continue
            os.replace(tmp, target)
            self.seen[rel] = (size, mtime)
        if changed:
            self.log(f"checkpoint directory: {len(changed)} file(s) brought home to {self.local}")
        return bool(changed)

    def push(self, conn, remote_dir: str) -> int:
        """Upload the local directory to ``remote_dir`` on a replacement; return the file count."""
        import shlex
        files = [p for p in self.local.rglob("*") if p.is_file() and not p.name.startswith(".")]
        conn.run(f"mkdir -p {shlex.quote(remote_dir)}", hide=True, in_stream=False)
        sftp = conn.sftp()
        for path in files:
            rel = path.relative_to(self.local).as_posix()
            if "/" in rel:
                conn.run(f"mkdir -p {shlex.quote(remote_dir + '/' + rel.rsplit('/', 1)[0])}", hide=True, in_stream=False)
            sftp.put(str(path), f"{remote_dir}/{rel}")
        return len(files)


class InstanceWatch:
    """``on_poll`` for jobs.follow_reconnecting: brings checkpoints home while connected, and asks
    EC2 about the instance every ``every_s`` seconds, or at once while disconnected. Raises
    Interrupted when EC2 reports it gone."""

    def __init__(self, ec2, instance_id: str, checkpoints: CheckpointHome, log, every_s: float = STATE_EVERY_S):
        self.ec2, self.instance_id, self.checkpoints, self.log, self.every_s = ec2, instance_id, checkpoints, log, every_s
        self.last = time.monotonic()

    def __call__(self, conn) -> None:
        if conn is not None:
            self.checkpoints.sync(conn)
        if conn is None or time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            self.check()

    def check(self) -> None:
        try:
            inst = instances.describe_instances(self.ec2, [self.instance_id])[0]
        except Exception as exc:  # an API hiccup is not an interruption: ask again at the next poll
            self.log(f"could not read the state of {self.instance_id}: {exc}")
            return
        state = inst["State"]["Name"]
        if state in GONE_STATES:
            why = (inst.get("StateReason") or {}).get("Message") or inst.get("StateTransitionReason") or ""
            raise Interrupted(f"EC2 reports the instance {state}" + (f" ({why})" if why else ""))


def attempt_row(n: int, instance: dict, node: int | None = None) -> dict:
    """The ledger's record of one instance of attempt ``n`` (``node`` K of a cluster), before it ends (pure)."""
    start = instance.get(instances.BILLING_START)
    return {"attempt": n, "node": node, "instance_id": instance["InstanceId"], "instance_type": instance["InstanceType"],
            "zone": instance.get("Placement", {}).get("AvailabilityZone"), "market": instances.market(instance),
            "ended": "running", "billing_started_at": start.isoformat() if start else None}


def follow_training(conn, connect, run_dir: str, cursor, watch: InstanceWatch, ui, unreachable_s: float):
    """Follow the job's log to its end through dropped connections; return (exit status, connection).

    Raises Interrupted for exits 75/143, an instance EC2 reports gone, or SSH unreachable too long.
    """
    from ..remote import jobs

    try:
        status, conn = jobs.follow_reconnecting(connect, run_dir, "out/train.log", cursor, conn=conn,
                                                unreachable_s=unreachable_s, on_poll=watch, log=ui.note)
    except jobs.Unreachable as exc:
        raise Interrupted(str(exc))
    if status in (EXIT_SPOT_INTERRUPTED, EXIT_SIGTERM):
        with contextlib.suppress(*jobs.CONNECTION_ERRORS):
            watch.checkpoints.sync(conn)  # the one the trainer wrote as it stopped
        raise Interrupted("spot interruption notice: the trainer checkpointed and exited 75"
                          if status == EXIT_SPOT_INTERRUPTED else "the trainer was stopped by SIGTERM (exit 143)")
    return status, conn


def summary_of(local_out: Path) -> dict:
    return json.loads((local_out / "summary.json").read_text())


def exhausted(attempts: list[dict], local_ckpt: Path, spot: bool, allowed: int) -> AttemptsExhausted:
    """The error for a run whose last allowed attempt was interrupted."""
    where = f"the last checkpoint is {local_ckpt}" if local_ckpt.exists() else "no checkpoint was brought home"
    return AttemptsExhausted(
        f"stopped after {allowed} attempt(s), each interrupted (last: {attempts[-1]['ended']}); {where}",
        "raise --max-attempts" + (", add --spot-fallback on-demand, or run on-demand" if spot else ""))


def remote_failure(conn, run_dir: str, status: int, local_out: Path) -> RemoteError:
    from ..remote import jobs
    return RemoteError(f"the trainer on {conn.host} exited {status}", f"see {local_out / 'console.log'}",
                       command="python -m ec2gpu.train.mnist", host=conn.host, exit_status=status,
                       tail=jobs.tail(conn, f"{run_dir}/console.log"))
