"""The instance side of a detached run (issue 30): the run's own agent owns the job's lifecycle,
S3 holds everything that must survive, and the run's Auto Scaling group (aws/groups.py) replaces
an interrupted spot instance. No controller of ours runs anywhere once the run is launched.

Shipped beside agent.py and started by the instance's user data (root, at boot) as
``python3 detached.py --bucket B --user U --run-id R --region REGION [--home DIR] [--every S]
[--poll S] [--imds-endpoint URL]`` (U: the user id of whoever started the run, whose prefix holds
it; HOME is the job's; the run's directory is HOME/ec2gpu/runs/RUN_ID, as remote/jobs.run_dir;
the workdir RUN_DIR/workdir). Standard library and
boto3 only (the Deep Learning AMI has boto3). Credentials: boto3's default chain, which on the
instance is the instance profile through IMDSv2, and only that (``role_session``): never a file
the controller sent, nor keys in the environment. Endpoints: boto3
honours AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL_AUTO_SCALING and AWS_EC2_METADATA_SERVICE_ENDPOINT
(the sandbox sets them); the metadata endpoint is handed to agent.py as EC2GPU_IMDS_ENDPOINT.

S3 keys, all under ``runs/<user>/<run_id>/`` (the run id must read YYYYmmdd-HHMMSS-xxxx, as
runs/provision/pipeline.new_run_id makes it, and the user id USER_ID_RE, aws/runstore.USER_ID, so no
key leaves the run's prefix):

- ``spec.json``      the run's contract, written by the controller before launch (below); read only
- ``status.json``    the run's durable state (below), always written whole (PutObject is atomic)
- ``cancel``         any object: the run is cancelled (``ec2gpu cancel`` writes it); checked at
                     the start and on every poll
- ``workdir.tar.gz`` the workdir (``workdir_key``), unpacked with the hostile-input rules of
                     ``extract_workdir``
- ``checkpoints/...`` a mirror of EC2GPU_CHECKPOINT_DIR: downloaded at the start (then the job
                     gets EC2GPU_RESUME=1), files new or changed uploaded every ``--every`` seconds,
                     at once on a spot notice or rebalance recommendation, and at the end; a file
                     the job deleted is deleted there too
- ``outputs/...``    EC2GPU_OUTPUT_DIR (the ``outputs`` globs of it, else all), at the end
- ``logs/job.log``   the job's log (the setup's output too), whole, at most LOG_MAX bytes (its
                     last ones), every ``--every`` seconds and at the end; a replacement instance
                     starts its log from it, so it covers the whole run

spec.json (JSON object; unknown fields are ignored, a field of the wrong type refuses the spec):
``version`` 1; ``run_id`` (must equal --run-id); ``name`` (the task's, [A-Za-z0-9._-], 1-128);
``setup`` (shell or null: run once per instance, before the job); ``run`` (shell, required);
``args`` (list of strings: the run script's "$@"; default []); ``envs`` ({NAME: str}, not secret);
``secrets`` (list of NAMEs, default []: each one's value is the SecureString parameter
``/ec2gpu/runs/<run_id>/NAME`` in SSM Parameter Store, aws/parameters.py, read with the instance
role at each launch into the setup's and the job's environment only; the log uploaded to S3 has
each value replaced by ****);
``workdir_key`` (``runs/<user>/<run_id>/...`` or null: no workdir); ``outputs`` (gitignore-style globs
relative to EC2GPU_OUTPUT_DIR, ``!`` to exclude; default []: all); ``checkpoint_dir`` (relative
to the workdir, or null: RUN_DIR/checkpoints); ``max_restarts_on_errors`` (SkyPilot's
job_recovery field, default 0); ``max_launches`` (instances launched for this run at most: a
launch beyond it ends the group without running; default 10); ``group`` (must be
``ec2gpu-<run_id>``, aws/groups.name_of); ``nodes`` (1-64: the group's size; above 1 the nodes run
the job together, agent/gang.py, and ``max_launches`` counts every node's launches); ``limit_at``
(POSIX seconds or null: the job gets SIGTERM then, agent.py --limit-at, and is not restarted);
``limit_grace_s`` (seconds from limit_at to the instance's end, default 120);
``gpus_limit`` (int or null: the GPUs the job may use when
the instance has more, resources.allow_larger); ``python`` (absolute path or null: EC2GPU_PYTHON;
null: the Deep Learning AMI's PyTorch Python when there, else python3); ``mounts`` (list, default []:
the task's file_mounts, runs/detached/launch.mounts_document: each ``target`` ``~/PATH`` or
``/PATH`` (no ``..``; an absolute one under EC2GPU_SANDBOX_ROOT in the sandbox) and ``kind``
"local" (``key`` under ``runs/<user>/<run_id>/``, ``is_file``: the file itself, else a gzipped tar unpacked
with the workdir's rules) or "s3" (``bucket``, ``prefix``, ``region``, ``file``, ``write_back``:
copied in by agent/s3files.py with the instance role; the MOUNT modes' written back with the
checkpoints every ``--every`` seconds, on a spot notice and at the end). They are put in place
once per instance, before the setup; ``log_reader`` (a user name or null: the SSH user, whom the
agent lets read job.log, and nothing else of the run's directory, so `ec2gpu logs RUN --follow`
reads it live over SSH: ``share_log``).

status.json (JSON object, ``STATUS_FIELDS``; times ISO 8601 UTC):
``version`` 1; ``run_id``; ``state`` (starting | running | interrupted | succeeded | failed |
cancelled); ``reason`` (why the run ended, or null); ``launches`` (instances that started this
agent, this one included); ``attempt`` (job starts so far, all instances); ``restarts_on_errors``
(restarts after a failed job or setup, against max_restarts_on_errors); ``interruptions`` (attempts
that ended because their instance went away: a spot notice, or an instance lost without one);
``instance_id`` (the latest launch's); ``created_at``, ``heartbeat_at``, ``ended_at``;
``exit_code``, ``signal`` (the last attempt's); ``group``; ``group_ended_at``;
``group_end_error`` (the last failure to set the group to 0, or null); ``instances`` (one per
launch: ``launch``, ``instance_id``, ``started_at``, ``last_seen_at``, ``setup_exit_code``,
``setup_runs``, ``resumed`` (checkpoints were downloaded), ``checkpoint_files``); ``attempts``
(one per job start: ``attempt``, ``launch``, ``instance_id``, ``started_at``, ``ended_at``,
``outcome`` (running | succeeded | failed | interrupted | cancelled | limit | regroup | lost: the next
launch found it still running, its instance gone without a word), ``exit_code``, ``signal``,
``resume``, ``notice``, ``rebalance``).

What happens, in order: the launch is counted (a launch beyond max_launches, a terminal state or a
cancel object ends the group at once); the workdir is unpacked, the earlier log and the checkpoints
downloaded; the setup runs (a failed setup is a user-code failure); the job runs under agent.py,
which signs its status.json with a key this agent gave it (a job cannot forge its verdict). On
the job's end: succeeded -> outputs, log, status, end the group; failed -> restarted on this
instance with EC2GPU_RESUME=1 while restarts_on_errors < max_restarts_on_errors, else outputs,
log, status failed, end the group; a spot notice -> checkpoints and log at once, ``interrupted``,
and the group is NOT ended: AWS replaces the instance and the next launch resumes; cancel ->
SIGTERM (agent.py forwards it to the job), outputs, log, ``cancelled``, end the group. A launch that
finds a later launch recorded in status.json (Capacity Rebalancing starts the replacement before
it ends this one) stops its job and writes nothing more: the later one owns the prefix. Every
write of status.json is conditional on the ETag this launch last read or wrote (S3 conditional
writes), so a newer launch's record written between this launch's check and its write is never
lost under it, and of two launches that read the record at once only the first takes the number.

"End the group" is UpdateAutoScalingGroup to 0/0/0, never a shutdown (the group would replace the
instance); a failed call is retried with backoff for as long as this process lives, each failure
recorded in status.json; the group's scheduled deadline action (set by the controller) is the
net when even that fails.

Several nodes (``nodes`` > 1, agent/gang.py for the rules): each instance writes its own record
``nodes/<instance_id>.json`` (a heartbeat thread keeps it fresh), the instances agree on a
generation in ``gang.json`` (S3 conditional writes: ranks and SKYPILOT_NODE_IPS), and every member
runs the job once per generation; the head (rank 0) alone writes status.json (with the
``generation`` it heads), checkpoints, outputs and ``logs/job.log``; the others upload their own log
to ``logs/nodes/<instance_id>.log``. A member lost (a spot notice, or a record gone stale) stops
every member's job (SIGTERM: it checkpoints); the group's replacement joins the next generation and
all start again from the head's checkpoints (EC2GPU_RESUME=1, the new SKYPILOT_NODE_IPS). After a
failure on any rank the head restarts them all together while max_restarts_on_errors allows. An
attempt stopped that way is recorded with the outcome ``regroup``.

A secret that is missing (deleted, or the role may not read it) ends the run failed before the
setup, with the names that were missing.

Known limit: the job runs with the same instance role and so could rewrite the run's prefix
(status.json included); the launch cap read from status.json is then the job's to forge, and the
group's deadline action is what bounds a run whose job is hostile. What it cannot rewrite is the
code a later launch runs as root: the user data checks each agent file against the sha256 in the
launch template before any runs (runs/detached/launch.boot_script), and hands this agent
``--spec-sha256``, the sha256 of spec.json's bytes: a spec.json with other bytes is refused (the
run ends failed, nothing of it used). spec.json is written once, by the controller, before launch;
nothing rewrites it, so one hash holds for every launch.
"""
from __future__ import annotations

import argparse
import email.utils
import fnmatch
import hashlib
import hmac
import importlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

if __package__:  # in the package (tests, the controller)
    from ..wire import bounded_json
    from . import agent, gang, s3files
else:  # on the instance: agent.py, gang.py and s3files.py beside this file (sys.path[0]), not a package to install
    agent = importlib.import_module("agent")
    gang = importlib.import_module("gang")
    s3files = importlib.import_module("s3files")
    bounded_json = importlib.import_module("bounded_json")  # beside them too (runs/detached/launch.AGENT_FILES)

RUN_ID_RE = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")  # runs/provision/pipeline.new_run_id
USER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+=.@:-]{0,127}")  # aws/runstore.USER_ID (a test compares them)
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
GROUP_PREFIX = "ec2gpu-"  # aws/groups.PREFIX
TERMINAL = ("succeeded", "failed", "cancelled")
STATUS_FIELDS = ("version", "run_id", "state", "reason", "launches", "attempt", "restarts_on_errors", "interruptions",
                 "instance_id", "created_at", "heartbeat_at", "ended_at", "exit_code", "signal", "group",
                 "group_ended_at", "group_end_error", "instances", "attempts")
MAX_SPEC_BYTES = 1024 * 1024
MAX_STATUS_BYTES = 4 * 1024 * 1024
MAX_SCRIPT_BYTES = 100 * 1024  # tasks/spec.MAX_SCRIPT_BYTES
MAX_SECRETS = 100  # names in spec.json's secrets
MAX_SECRET_BYTES = 8192  # a parameter's value read back (standard: 4 KB; advanced: 8 KB)
SECRET_ROOT = "/ec2gpu/runs/"  # aws/parameters.ROOT (a test compares them)
MASK = "****"  # runs/execute/job_summary.MASK
MAX_RECORDS = 100  # instances and attempts kept in status.json (the newest): well under the 1 MiB the controller reads
#: the workdir archive: hostile input (refused beyond these)
MAX_ARCHIVE_BYTES = 5 * 1024 ** 3
MAX_WORKDIR_BYTES = 20 * 1024 ** 3
MAX_WORKDIR_MEMBERS = 200_000
MAX_TRANSFER_FILES = 100_000  # checkpoint and output files moved at once
LOG_MAX = 64 * 1024 ** 2  # bytes of job.log kept in S3 (the last ones)
SETUP_TIMEOUT_S = 3600  # runs/execute/engine.py's
EXIT_INTERRUPTED = 75  # this process's exit: the instance is going away, the group replaces it
EXIT_SUPERSEDED = 76  # a later launch owns the run
EXIT_REFUSED = 2  # bad arguments or spec
#: Pythons with torch on the Deep Learning AMIs (ami/setup-gpu.sh's order)
PYTHONS = ("/opt/pytorch/bin/python", "/opt/pytorch/bin/python3", "/opt/conda/envs/pytorch/bin/python3")
#: how engine.py starts setup and run (the same words: a test compares them)
INTERACTIVE = 'exec bash -i -c "$0" "$@" 3>&2 2>/dev/null'
HANDOFF = ('exec 2>&3 3>&-; for _ec2gpu_f in $(compgen -A function); do export -f "$_ec2gpu_f" 2>/dev/null; done; '
           'unset _ec2gpu_f; exec bash -c "$0" "$@"')
PROLOGUE = ("trap 'exit 143' TERM; "
            'case "${EC2GPU_PYTHON:-}" in */*) export PATH="${EC2GPU_PYTHON%/*}:$PATH";; esac; '
            'cd "${EC2GPU_WORKDIR:-.}" || exit 1\n')
PROGRESS_FILE = "progress.json"  # runs/execute/nodes.PROGRESS_FILE


class Refused(ValueError):
    """Input that breaks the contract (a run id, a spec, an archive): nothing of it is used."""


class Superseded(Exception):
    """A later launch of the run is recorded: this one must stop writing."""


class Conflict(Exception):
    """A conditional write found the object changed since this launch last read or wrote it
    (S3's 412 PreconditionFailed, or 409 ConditionalRequestConflict for a write under way)."""


#: S3's answers to a conditional write that did not hold (NoSuchKey: IfMatch on an object deleted
#: since; https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); the same
#: as aws/runstore.py's, which this file cannot import (it ships alone; a test compares them)
CONFLICT_CODES = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404")
CONFLICT_TRIES = 5  # status.json writes tried again after a conflict that does not supersede this launch
END_SAVE_TRIES = 8  # the run's end written to status.json before its group is ended (Detached.end): ~4 min
IMDS_TRIES = 5  # several nodes: the metadata service asked this often (2 s apart) for the private address
UNHEALTHY_TRIES = 5  # several nodes: SetInstanceHealth asked this often for one silent member at most
MAX_ERRORS_IN_ROW = 5  # several nodes: generations not begun for S3 or the disk before the run ends failed
SETTLE_S = 60.0  # several nodes: the others' jobs awaited this long after the head's failed (Detached.settle)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def check_run_id(run_id: object) -> str:
    """``run_id`` when it reads YYYYmmdd-HHMMSS-xxxx, else Refused (no '/', '..' or other text)."""
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise Refused(f"not a run id: {str(run_id)[:80]!r}")
    return run_id


def check_user(user: object) -> str:
    """``user`` when all of it is a user id (USER_ID_RE: no '/', '*' or '..'), else Refused."""
    if not isinstance(user, str) or not USER_ID_RE.fullmatch(user):
        raise Refused(f"not a user id: {str(user)[:80]!r}")
    return user


def safe_rel(rel: str) -> str | None:
    """``rel`` as a relative path of plain names ('a/b'), or None when it is absolute, empty, has
    '..', '.' or empty parts, or a NUL."""
    if not rel or rel.startswith("/") or "\0" in rel or "\\" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return rel


# --- the spec ---------------------------------------------------------------------------------------

def parse_spec(data: object, run_id: str, prefix: str) -> dict[str, Any]:
    """spec.json checked (module docstring) -> a dict with every field, defaults filled; every key
    it names must lie under ``prefix`` (the run's, Store.prefix). Refused for anything else."""
    if not isinstance(data, dict):
        raise Refused("spec.json is not a JSON object")

    def get(name: str, kinds: tuple[type, ...], default: Any = None, required: bool = False) -> Any:
        v = data.get(name, default)
        if v is None and not required:
            return None
        if not isinstance(v, kinds) or isinstance(v, bool) and bool not in kinds:
            raise Refused(f"spec.json: {name} is {type(v).__name__}, not {'/'.join(k.__name__ for k in kinds)}")
        return v
    if check_run_id(data.get("run_id")) != run_id:
        raise Refused(f"spec.json is for run {data.get('run_id')!r}, not {run_id}")
    name = get("name", (str,), required=True)
    if not NAME_RE.fullmatch(name):
        raise Refused(f"spec.json: name {name[:80]!r} is not [A-Za-z0-9._-]{{1,128}}")
    run = get("run", (str,), required=True)
    setup = get("setup", (str,))
    for what, script in (("run", run), ("setup", setup or "")):
        if len(script.encode("utf-8", "surrogatepass")) > MAX_SCRIPT_BYTES or "\0" in script:
            raise Refused(f"spec.json: {what} is over {MAX_SCRIPT_BYTES} bytes or has a NUL")
    if not run.strip():
        raise Refused("spec.json: run is empty")
    args = get("args", (list,), [])
    envs = get("envs", (dict,), {})
    if not all(isinstance(a, str) and "\0" not in a for a in args):
        raise Refused("spec.json: args must be strings")
    for k, v in envs.items():
        if not ENV_NAME_RE.fullmatch(k) or not isinstance(v, str) or "\0" in v:
            raise Refused(f"spec.json: envs: {k[:80]!r} is not NAME: string")
    workdir_key = get("workdir_key", (str,))
    if workdir_key is not None and (not workdir_key.startswith(prefix) or safe_rel(workdir_key) is None):
        raise Refused(f"spec.json: workdir_key {workdir_key[:120]!r} is not under {prefix}")
    outputs = get("outputs", (list,), [])
    if not all(isinstance(g, str) and safe_rel(g.removeprefix("!").strip("/") or "x") is not None for g in outputs):
        raise Refused("spec.json: outputs must be relative globs inside $EC2GPU_OUTPUT_DIR")
    checkpoint_dir = get("checkpoint_dir", (str,))
    if checkpoint_dir is not None and safe_rel(checkpoint_dir.rstrip("/")) is None:
        raise Refused("spec.json: checkpoint_dir must be a relative path inside the workdir")
    restarts = get("max_restarts_on_errors", (int,), 0)
    launches = get("max_launches", (int,), 10)
    if not 0 <= restarts <= 1000 or not 1 <= launches <= 1000:
        raise Refused("spec.json: max_restarts_on_errors must be 0-1000 and max_launches 1-1000")
    group = get("group", (str,), GROUP_PREFIX + run_id)
    if group != GROUP_PREFIX + run_id:
        raise Refused(f"spec.json: group {group[:120]!r} is not this run's ({GROUP_PREFIX}{run_id})")
    nodes = get("nodes", (int,), 1)
    if not 1 <= nodes <= gang.MAX_NODES:
        raise Refused(f"spec.json: nodes must be 1-{gang.MAX_NODES}")
    limit_at = get("limit_at", (int, float))
    grace = get("limit_grace_s", (int, float), 120.0)
    if limit_at is not None and not math.isfinite(limit_at) or not (math.isfinite(grace) and 0 <= grace <= 86400):
        raise Refused("spec.json: limit_at must be a finite time and limit_grace_s 0-86400 seconds")
    gpus_limit = get("gpus_limit", (int,))
    if gpus_limit is not None and gpus_limit < 1:
        raise Refused("spec.json: gpus_limit must be at least 1")
    secret_names = get("secrets", (list,), [])
    if (len(secret_names) > MAX_SECRETS or len(set(map(str, secret_names))) != len(secret_names)
            or not all(isinstance(n, str) and len(n) <= 128 and ENV_NAME_RE.fullmatch(n) for n in secret_names)):
        raise Refused(f"spec.json: secrets must be at most {MAX_SECRETS} distinct environment variable names")
    mounts = parse_mounts(get("mounts", (list,), []), prefix)
    reader = data.get("log_reader")  # a convenience (`logs --follow`, live): one that is not a user name is none
    reader = reader if isinstance(reader, str) and re.fullmatch(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,31}", reader) else None
    python = get("python", (str,))
    if python is not None and (not python.startswith("/") or not re.fullmatch(r"[A-Za-z0-9._/+-]{1,512}", python)):
        raise Refused("spec.json: python must be an absolute path")
    return {"run_id": run_id, "name": name, "setup": setup, "run": run, "args": list(args), "envs": dict(envs),
            "workdir_key": workdir_key, "outputs": list(outputs), "checkpoint_dir": checkpoint_dir,
            "max_restarts_on_errors": restarts, "max_launches": launches, "group": group, "nodes": nodes,
            "limit_at": None if limit_at is None else float(limit_at), "limit_grace_s": float(grace),
            "gpus_limit": gpus_limit, "python": python, "secrets": list(secret_names), "mounts": mounts,
            "log_reader": reader}


#: a file_mounts target as the controller writes it (tasks/mounts.TARGET_RE, normal_target's spelling)
TARGET_RE = re.compile(r"(~/|/)[A-Za-z0-9._+@,=/-]{0,1022}")
BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # tasks/mounts.BUCKET_RE
MAX_MOUNTS = 100


def parse_mounts(data: list[Any], run_prefix: str) -> list[dict[str, Any]]:
    """spec.json's ``mounts`` checked (module docstring): Refused for anything else, so no key
    leaves the run's prefix ``run_prefix`` and no target holds ``..`` or a character a shell would read."""
    if len(data) > MAX_MOUNTS:
        raise Refused(f"spec.json: more than {MAX_MOUNTS} mounts")
    out = []
    for m in data:
        if not isinstance(m, dict):
            raise Refused("spec.json: a mount is not an object")
        target = m.get("target")
        if (not isinstance(target, str) or not TARGET_RE.fullmatch(target) or ".." in target.split("/")
                or target.rstrip("/") in ("", "~")):
            raise Refused(f"spec.json: mount target {str(target)[:120]!r} is not ~/PATH or /PATH")
        kind = m.get("kind")
        if kind == "local":
            key, is_file = m.get("key"), m.get("is_file")
            if not isinstance(key, str) or not key.startswith(f"{run_prefix}mounts/") or safe_rel(key) is None:
                raise Refused(f"spec.json: mount key {str(key)[:120]!r} is not under {run_prefix}mounts/")
            if not isinstance(is_file, bool):
                raise Refused("spec.json: a local mount's is_file must be true or false")
            out.append({"target": target, "kind": kind, "key": key, "is_file": is_file})
        elif kind == "s3":
            bucket, prefix, region = m.get("bucket"), m.get("prefix"), m.get("region")
            if not isinstance(bucket, str) or not BUCKET_RE.fullmatch(bucket):
                raise Refused(f"spec.json: mount bucket {str(bucket)[:80]!r} is not a bucket name")
            if not isinstance(prefix, str) or len(prefix) > 1024 or "\0" in prefix:
                raise Refused("spec.json: a mount prefix must be a string of at most 1024 characters")
            if not isinstance(region, str) or not re.fullmatch(r"[a-z0-9-]{1,32}", region):
                raise Refused("spec.json: a mount region must be a region name")
            flags = (m.get("file", False), m.get("write_back", False))
            if not all(isinstance(f, bool) for f in flags):
                raise Refused("spec.json: a mount's file and write_back must be true or false")
            out.append({"target": target, "kind": kind, "bucket": bucket, "prefix": prefix, "region": region,
                        "file": flags[0], "write_back": flags[1]})
        else:
            raise Refused(f"spec.json: mount kind {str(kind)[:40]!r} is not local or s3")
    return out


def on_instance(target: str, home: str, root: str = "") -> str:
    """The absolute path of ``target`` (``~/x`` or ``/x``) on this instance (pure):
    tasks/mounts.on_instance's rule (a test compares them)."""
    if target.startswith("~/"):
        return f"{home.rstrip('/')}/{target[2:]}"
    return f"{root.rstrip('/')}{target}" if root else target


# --- the status record -------------------------------------------------------------------------------

def new_status(run_id: str, group: str, at: float) -> dict[str, Any]:
    return {"version": 1, "run_id": run_id, "state": "starting", "reason": None, "launches": 0, "attempt": 0,
            "restarts_on_errors": 0, "interruptions": 0, "instance_id": None, "created_at": iso(at),
            "heartbeat_at": None, "ended_at": None, "exit_code": None, "signal": None, "group": group,
            "group_ended_at": None, "group_end_error": None, "instances": [], "attempts": [], "generation": 0}


def parse_status(data: object, run_id: str, group: str, at: float) -> dict[str, Any]:
    """A status.json read back (it may have been written by anyone holding the role: hostile
    input), as a record of the right shape: counters non-negative ints, lists of dicts, the newest
    MAX_RECORDS kept; anything else from the default."""
    st = new_status(run_id, group, at)
    if not isinstance(data, dict):
        return st
    for k in ("launches", "attempt", "restarts_on_errors", "interruptions", "generation"):
        v = data.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10 ** 9:
            st[k] = v
    if data.get("state") in ("starting", "running", "interrupted") + TERMINAL:
        st["state"] = data["state"]
    for k in ("reason", "instance_id", "created_at", "heartbeat_at", "ended_at", "group_ended_at", "group_end_error"):
        if isinstance(data.get(k), str):
            st[k] = data[k][:2000]
    for k in ("exit_code", "signal"):
        if isinstance(data.get(k), int) and not isinstance(data.get(k), bool):
            st[k] = data[k]
    for k in ("instances", "attempts"):
        if isinstance(data.get(k), list):
            st[k] = [r for r in data[k] if isinstance(r, dict)][-MAX_RECORDS:]
    return st


# --- the workdir archive --------------------------------------------------------------------------------

def extract_workdir(archive: str, dest: str, max_bytes: int = MAX_WORKDIR_BYTES,
                    max_members: int = MAX_WORKDIR_MEMBERS) -> int:
    """Unpack the gzip'd tar ``archive`` into ``dest`` (which must not exist), as hostile input:
    every member checked before anything is written; Refused (and ``dest`` removed) for an
    absolute name, a '..' part, a device, FIFO or other special file, a hard link to anything but
    an earlier regular member, a symbolic link whose target is absolute or resolves outside
    ``dest`` (links are made last and each resolved after all are made), a duplicate name, more
    than ``max_members`` members or ``max_bytes`` bytes. Files keep their owner's permission bits
    (setuid, setgid and sticky dropped) and get this process's owner. Returns the file count."""
    root = os.path.realpath(dest)
    members: list[tarfile.TarInfo] = []
    total, seen = 0, set()
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar:
            if len(members) >= max_members:
                raise Refused(f"workdir archive: more than {max_members} members")
            name = m.name[2:] if m.name.startswith("./") else m.name
            name = name.rstrip("/") if m.isdir() else name
            if name in ("", "."):
                continue
            if safe_rel(name) is None:
                raise Refused(f"workdir archive: member {m.name[:200]!r} is absolute or leaves the workdir")
            if name in seen:
                raise Refused(f"workdir archive: member {name[:200]!r} appears twice")
            if m.issym():
                if m.linkname.startswith("/") or "\0" in m.linkname:
                    raise Refused(f"workdir archive: link {name[:200]!r} points outside ({m.linkname[:200]!r})")
            elif m.islnk():
                target = m.linkname[2:] if m.linkname.startswith("./") else m.linkname
                if target not in seen or not next((x for x in members if x.name == target and x.isreg()), None):
                    raise Refused(f"workdir archive: hard link {name[:200]!r} to {m.linkname[:200]!r}, not an earlier file")
            elif not (m.isreg() or m.isdir()):
                raise Refused(f"workdir archive: member {name[:200]!r} is a device, FIFO or other special file")
            total += max(0, m.size)
            if total > max_bytes:
                raise Refused(f"workdir archive: more than {max_bytes:,} bytes")
            m.name = name
            if m.islnk():
                m.linkname = m.linkname[2:] if m.linkname.startswith("./") else m.linkname
            seen.add(name)
            members.append(m)
        os.makedirs(root)
        try:
            count = _unpack(tar, members, root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
    return count


def _unpack(tar: tarfile.TarFile, members: list[tarfile.TarInfo], root: str) -> int:
    """Write checked ``members`` under ``root``: directories and files first (never through a
    link: there is none yet, and O_NOFOLLOW|O_EXCL), links last, then each link resolved."""
    count = 0
    for m in members:
        path = os.path.join(root, m.name)
        if m.isdir():
            os.makedirs(path, exist_ok=True)
            os.chmod(path, (m.mode & 0o777) | 0o700)
            continue
        if not (m.isreg() or m.islnk()):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        src = m if m.isreg() else tar.getmember(m.linkname)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            if m.isreg():
                data = tar.extractfile(m)
                left = m.size
                while left > 0 and data is not None:
                    chunk = data.read(min(left, 1024 * 1024))
                    if not chunk:
                        break
                    out.write(chunk)
                    left -= len(chunk)
            else:  # a copy of the earlier file, not a link
                with open(os.path.join(root, src.name), "rb") as f:
                    shutil.copyfileobj(f, out)
        os.chmod(path, (src.mode & 0o777) | 0o600)
        count += 1
    links = [m for m in members if m.issym()]
    for m in links:
        path = os.path.join(root, m.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(m.linkname, path)
    for m in links:  # resolved now that every link exists: a chain cannot lead out either
        real = os.path.realpath(os.path.join(root, m.name))
        if real != root and not real.startswith(root + os.sep):
            raise Refused(f"workdir archive: link {m.name[:200]!r} points outside ({m.linkname[:200]!r})")
    return count


# --- globs (gitignore-style, as remote/sync.pull reads the task's outputs) ----------------------------------

def wanted(rel: str, patterns: list[str]) -> bool:
    """Whether ``rel`` (a file under EC2GPU_OUTPUT_DIR) is one of ``patterns``: every file when
    there are none; else the last pattern that matches decides ('!' excludes). A pattern without a
    '/' matches a name at any depth, one with a '/' the path from the top; 'dir/' a directory and
    all under it. Approximates gitignore with fnmatch ('*' also crosses '/')."""
    if not patterns:
        return True
    parts = rel.split("/")
    verdict = False
    for raw in patterns:
        neg = raw.startswith("!")
        pat = raw[1:] if neg else raw
        dir_only = pat.endswith("/")
        pat = pat.strip("/")
        anchored = "/" in pat or raw.lstrip("!").startswith("/")
        pat = pat.replace("**/", "*").replace("/**", "/*")
        for i in range(1, len(parts) + 1):
            if dir_only and i == len(parts):
                continue
            sub = "/".join(parts[:i]) if anchored else parts[i - 1]
            if fnmatch.fnmatchcase(sub, pat):
                verdict = not neg
                break
    return verdict


# --- the instance ---------------------------------------------------------------------------------------

def imds_reader(endpoint: str, timeout_s: float = 2.0) -> Callable[[str], str | None]:
    """A reader of IMDSv2 text (``/latest/meta-data/instance-id``): None when not published."""
    def read(path: str) -> str | None:
        try:
            put = urllib.request.Request(f"{endpoint}/latest/api/token", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
            with urllib.request.urlopen(put, timeout=timeout_s) as resp:
                token = resp.read(4096).decode()
            get = urllib.request.Request(f"{endpoint}{path}", headers={"X-aws-ec2-metadata-token": token})
            with urllib.request.urlopen(get, timeout=timeout_s) as resp:
                return resp.read(4096).decode().strip()
        except (urllib.error.URLError, OSError, ValueError, UnicodeDecodeError):
            return None
    return read


def gpu_count() -> int:
    """GPUs on this instance (``nvidia-smi -L``), 0 without it."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def find_python(spec_python: str | None) -> str:
    for cand in ((spec_python,) if spec_python else ()) + PYTHONS:
        if os.access(cand, os.X_OK):
            return cand
    return "python3"


def job_env(spec: dict[str, Any], run_dir: str, workdir: str, ip: str, gpus: int, resume: bool,
            python: str, secrets: dict[str, str] | None = None, rank: int = 0,
            ips: list[str] | None = None) -> dict[str, str]:
    """The job's environment (pure): the task's envs, its ``secrets`` (name -> value), then ours,
    as engine.node_env gives it for node ``rank`` of ``ips`` (default: node 0 of one, at ``ip``; a
    test compares the two)."""
    ips = ips or [ip]
    run_id = spec["run_id"]
    limit = spec["gpus_limit"] if spec["gpus_limit"] and spec["gpus_limit"] < gpus else None
    gpus = limit or gpus
    ckpt = f"{workdir}/{spec['checkpoint_dir'].rstrip('/')}" if spec["checkpoint_dir"] else f"{run_dir}/checkpoints"
    ours = {
        "EC2GPU_RUN_ID": run_id, "EC2GPU_OUTPUT_DIR": f"{run_dir}/out", "EC2GPU_CHECKPOINT_DIR": ckpt,
        "EC2GPU_RESUME": "1" if resume else "0", "EC2GPU_NODE_RANK": str(rank), "EC2GPU_NUM_NODES": str(len(ips)),
        "EC2GPU_HEAD_IP": ips[0], "EC2GPU_NODE_IP": ips[rank], "EC2GPU_GPUS_PER_NODE": str(gpus),
        "EC2GPU_PROGRESS_FILE": f"{run_dir}/{PROGRESS_FILE}", "EC2GPU_WORKDIR": workdir, "EC2GPU_PYTHON": python,
        "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": str(len(ips)), "SKYPILOT_NODE_IPS": "\n".join(ips),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus), "SKYPILOT_TASK_ID": f"ec2gpu-{run_id}_{spec['name']}",
    }
    if limit:
        ours["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(limit))
    return {**spec["envs"], **(secrets or {}), **ours}


def mask(data: bytes, values: list[str]) -> bytes:
    """``data`` with each of ``values`` replaced by MASK, longest first: agent.mask_bytes, the one rule."""
    return agent.mask_bytes(data, values)


def read_secrets(ssm: Any, run_id: str, names: list[str]) -> dict[str, str]:
    """The values of the run's secrets ``names`` from SSM Parameter Store (GetParameters, 10 a
    call, decrypted): name -> value. Refused when one is missing (InvalidParameters: deleted, or
    never made) or is not a string of at most MAX_SECRET_BYTES without a NUL (hostile input: anyone
    with ssm:PutParameter on the path could write it). Raises botocore's errors as SSM answers."""
    full = {f"{SECRET_ROOT}{run_id}/{n}": n for n in names}
    got: dict[str, str] = {}
    missing: list[str] = []
    keys = list(full)
    for i in range(0, len(keys), 10):
        answer = ssm.get_parameters(Names=keys[i:i + 10], WithDecryption=True)
        missing += [full.get(str(k), str(k)[:200]) for k in answer.get("InvalidParameters", [])]
        for p in answer.get("Parameters", []):
            name, value = full.get(p.get("Name")), p.get("Value")
            if name is None:
                continue
            if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > MAX_SECRET_BYTES or "\0" in value:
                raise Refused(f"the secret {name} is not a string of at most {MAX_SECRET_BYTES} bytes")
            got[name] = value
    missing += [n for n in names if n not in got and n not in missing]
    if missing:
        raise Refused(f"secret(s) {', '.join(sorted(missing))} not found in SSM Parameter Store under "
                      f"{SECRET_ROOT}{run_id}/ (deleted, or the instance role may not read them)")
    return got


# --- S3 -------------------------------------------------------------------------------------------------

def _code(exc: BaseException) -> str:
    """A botocore ClientError's code ('NoSuchKey', '404'), '' for other errors."""
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


class Store:
    """The run's prefix ``runs/<user>/<run_id>/`` in ``bucket`` (aws/runstore.prefix): every key is
    built here from a relative path checked by safe_rel."""

    def __init__(self, s3: Any, bucket: str, user: str, run_id: str):
        self.s3, self.bucket, self.prefix = s3, bucket, f"runs/{check_user(user)}/{check_run_id(run_id)}/"

    def key(self, rel: str) -> str:
        if safe_rel(rel) is None:
            raise Refused(f"not a key inside the run: {rel[:200]!r}")
        return self.prefix + rel

    @property
    def conditional(self) -> bool:
        """Whether this machine's botocore can write conditionally (PutObject's IfMatch and
        IfNoneMatch, in its models since late 2024): an older one writes unconditionally."""
        shape = self.s3.meta.service_model.operation_model("PutObject").input_shape
        return "IfMatch" in shape.members and "IfNoneMatch" in shape.members

    def get_tagged(self, rel: str, limit: int, sha256: str | None = None) -> tuple[bytes | None, str | None]:
        """(the object's first ``limit`` + 1 bytes, its ETag), (None, None) when there is none.
        Raises Refused when ``sha256`` is given and the object is over ``limit`` bytes (its hash
        could only fail on the bytes read: said as what it is), or its bytes have another (lowercase hex)."""
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None, None
            raise
        data = bytes(got["Body"].read(limit + 1))
        if sha256 is not None and len(data) > limit:
            raise Refused(f"{rel} is too large: over {limit:,} bytes, more than the agent reads")
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise Refused(f"{rel} is not the one this run was launched with (another sha256 than its launch template "
                          "says): rewritten in S3 after launch")
        return data, got.get("ETag")

    def get_bytes(self, rel: str, limit: int) -> bytes | None:
        return self.get_tagged(rel, limit)[0]

    def get_json(self, rel: str, limit: int, sha256: str | None = None) -> object:
        return self.get_json_tagged(rel, limit, sha256)[0]

    def get_json_tagged(self, rel: str, limit: int, sha256: str | None = None) -> tuple[object, str | None]:
        """(the JSON object at ``rel`` or None, its ETag or None). Raises Refused (over ``limit``
        bytes, not JSON, not of ``sha256``: get_tagged)."""
        data, etag = self.get_tagged(rel, limit, sha256)
        if data is None:
            return None, None
        if len(data) > limit:
            raise Refused(f"{rel}: over {limit} bytes")
        try:
            return bounded_json.loads(data, max_bytes=limit), etag
        except bounded_json.Refused as exc:
            raise Refused(f"{rel}: {exc}") from None

    def put_json(self, rel: str, obj: object, *, if_match: str | None = None, if_absent: bool = False) -> str | None:
        """Write ``obj`` at ``rel``; returns its new ETag. ``if_match``: only over the object of that
        ETag; ``if_absent``: only where there is none (S3 conditional writes). Raises Conflict when the
        condition does not hold."""
        cond: dict[str, str] = {}
        if if_match is not None:
            cond["IfMatch"] = if_match
        elif if_absent:
            cond["IfNoneMatch"] = "*"
        try:
            put = self.s3.put_object(Bucket=self.bucket, Key=self.key(rel), Body=json.dumps(obj, indent=1).encode(),
                                     ContentType="application/json", **cond)
        except Exception as exc:
            if cond and _code(exc) in CONFLICT_CODES:
                raise Conflict(f"{rel} changed ({_code(exc)})") from None
            raise
        return put.get("ETag") if isinstance(put, dict) else None

    def exists(self, rel: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=self.key(rel))
            return True
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404", "NotFound"):
                return False
            raise

    def listing(self, rel_dir: str, limit: int = MAX_TRANSFER_FILES) -> dict[str, int]:
        """{path under ``rel_dir``: size} of the objects there, at most ``limit``; keys that are not
        plain relative paths are left out."""
        base = self.key(rel_dir) + "/"
        found: dict[str, int] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            for o in page.get("Contents", []):
                rel = o["Key"][len(base):]
                if safe_rel(rel) is not None and len(found) < limit:
                    found[rel] = int(o.get("Size", 0))
        return found


class Mirror:
    """A local directory kept in S3 under ``rel_dir`` (checkpoints/, outputs/): what was sent (or
    found there) is remembered as path -> (size, mtime_ns), so each push sends only what changed."""

    def __init__(self, store: Store, rel_dir: str, local: str):
        self.store, self.rel_dir, self.local = store, rel_dir, local
        self.sent: dict[str, tuple[int, int]] = {}

    def pull(self) -> int:
        """Download every object under the prefix into the directory; returns the file count."""
        os.makedirs(self.local, exist_ok=True)
        count = 0
        for rel in self.store.listing(self.rel_dir):
            path = os.path.join(self.local, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.islink(path):
                os.remove(path)
            self.store.s3.download_file(self.store.bucket, self.store.key(f"{self.rel_dir}/{rel}"), path)
            st = os.stat(path)
            self.sent[rel] = (st.st_size, st.st_mtime_ns)
            count += 1
        return count

    def files(self) -> dict[str, os.stat_result]:
        found: dict[str, os.stat_result] = {}
        for dirpath, dirs, names in os.walk(self.local):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
            for name in names:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                rel = os.path.relpath(path, self.local).replace(os.sep, "/")
                if stat.S_ISREG(st.st_mode) and safe_rel(rel) is not None and len(found) < MAX_TRANSFER_FILES:
                    found[rel] = st
        return found

    def push(self, settled_s: float = 0.0, now: float | None = None, want: Callable[[str], bool] = lambda rel: True,
             delete: bool = True) -> int:
        """Upload the files new or changed since the last push (with ``settled_s``: not hidden
        ones, nor those modified in the last ``settled_s`` seconds: still being written); delete
        in S3 those sent before that are gone here. Returns the files sent."""
        now = time.time() if now is None else now
        files = self.files()
        sent = 0
        for rel, st in sorted(files.items()):
            if not want(rel) or self.sent.get(rel) == (st.st_size, st.st_mtime_ns):
                continue
            if settled_s and (os.path.basename(rel).startswith(".") or now - st.st_mtime < settled_s):
                continue
            self.store.s3.upload_file(os.path.join(self.local, *rel.split("/")), self.store.bucket,
                                      self.store.key(f"{self.rel_dir}/{rel}"))
            self.sent[rel] = (st.st_size, st.st_mtime_ns)
            sent += 1
        if delete:
            for rel in [r for r in self.sent if r not in files]:
                self.store.s3.delete_object(Bucket=self.store.bucket, Key=self.store.key(f"{self.rel_dir}/{rel}"))
                del self.sent[rel]
        return sent


# --- the run --------------------------------------------------------------------------------------------

class Detached:
    """One launch of a detached run on this instance (module docstring). Everything from outside
    is injectable: ``s3`` and ``asg`` (boto3 clients), ``clock`` (POSIX seconds), ``sleep``,
    ``imds`` (path -> text or None), ``gpus`` (-> GPU count)."""

    def __init__(self, *, bucket: str, user: str, run_id: str, home: str, s3: Any, asg: Any, ssm: Any = None,
                 s3_for: Callable[[str], Any] | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 imds: Callable[[str], str | None] | None = None, imds_endpoint: str = agent.IMDS,
                 gpus: Callable[[], int] = gpu_count, every_s: float = 60.0, poll_s: float = 5.0,
                 agent_poll_s: float = 5.0, stop_grace_s: float = 90.0, settled_s: float = 5.0,
                 spec_sha256: str | None = None,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)):
        self.run_id = check_run_id(run_id)
        self.spec_sha256 = spec_sha256  # spec.json's, from the user data (main: --spec-sha256); None: not checked
        self.store = Store(s3, bucket, user, run_id)
        self.asg, self.ssm, self.clock, self.sleep, self.log = asg, ssm, clock, sleep, log
        self.secrets: dict[str, str] = {}  # name -> value, read at this launch (read_secrets); never written
        self.s3_for = s3_for or (lambda region: s3)  # a file_mounts bucket's region -> an S3 client there
        self.write_backs: list[dict[str, Any]] = []  # the MOUNT-mode file_mounts (s3files' records)
        self.imds_endpoint = imds_endpoint.rstrip("/")
        self.imds = imds or imds_reader(self.imds_endpoint)
        self.gpus = gpus
        self.every_s, self.poll_s, self.agent_poll_s = every_s, poll_s, agent_poll_s
        self.stop_grace_s, self.settled_s = stop_grace_s, settled_s
        self.home = os.path.abspath(home)
        self.run_dir = os.path.join(self.home, "ec2gpu", "runs", run_id)  # remote/jobs.run_dir's
        self.group = GROUP_PREFIX + run_id
        self.status: dict[str, Any] = new_status(run_id, self.group, clock())
        self.launch = 0
        self.log_sent: tuple[int, int] | None = None
        self.proc: subprocess.Popen | None = None  # the agent, while it runs
        self.key = b""  # the key the running agent signs with
        #: status.json's ETag as this launch last read or wrote it: each write is conditional on it
        #: (None: there was none), so a write by another launch in between is never lost under ours
        self.etag: str | None = None
        self.conditional = self.store.conditional
        # several nodes (agent/gang.py): this instance's record, the generation it runs in
        self.several = False
        self.writer = True  # this launch writes status.json, checkpoints and outputs (several: the head only)
        self.iid = ""
        self.node: dict[str, Any] = {}
        self.node_lock = threading.Lock()
        self.beat_stop = threading.Event()
        self.generation = 0
        self.gang: dict[str, Any] | None = None
        self.records: dict[str, dict[str, Any]] = {}
        self.next_nodes_read = 0.0
        self.log_base = b""  # several: the run's log before this instance became the head
        self.stale_s = gang.STALE_S
        self.unhealthy: set[str] = set()  # members set Unhealthy by this instance, or given up on (replace_silent)
        self.unhealthy_tries: dict[str, int] = {}
        self.peer_failed = False  # the job was stopped because a member's failed (watch)
        self.handed_on = 0  # the generation whose checkpoints and record this head last handed on (settle)
        self.errors_in_row = 0  # generations not begun for an error of S3 or the disk, in a row
        self.s3_clock = (datetime.now(timezone.utc), time.monotonic())  # S3's Date, when (s3_now)

    # -- the record
    def now(self) -> str:
        return iso(self.clock())

    def check_superseded(self) -> None:
        """Superseded when status.json records a later launch than this one, or an end this launch
        did not write (`ec2gpu cancel` records "cancelled" itself when the agent does not answer in
        time): an end recorded is never overwritten. An error reading it is said, not raised: the
        next check reads it again."""
        try:
            there = self.store.get_json("status.json", MAX_STATUS_BYTES)
        except Exception as exc:
            self.log(f"status.json not read: {type(exc).__name__}: {exc}"[:500])
            return
        self.raise_if_superseded(there)

    def raise_if_superseded(self, there: object, ends: bool = True) -> None:
        """Superseded when the status.json read (``there``) records a later launch, the same launch
        number taken by another instance (two launches that read the record at once: the first
        to write it has it), or (with ``ends``) an end this launch did not write."""
        if not isinstance(there, dict):
            return
        if self.several:  # a newer generation's head writes the record now
            gen = there.get("generation")
            if isinstance(gen, int) and gen > self.generation:
                raise Superseded(f"generation {gen} is recorded; this head's is {self.generation}")
            if ends and there.get("state") in TERMINAL and self.status.get("state") not in TERMINAL:
                raise Superseded(f"the run is already recorded as {there['state']}")
            return
        launches = there.get("launches")
        if isinstance(launches, int) and launches > self.launch:
            raise Superseded(f"launch {launches} is recorded; this is launch {self.launch}")
        mine = self.status.get("instance_id")
        if launches == self.launch and there.get("instance_id") not in (None, mine) and mine != "unknown":
            raise Superseded(f"launch {launches} was taken by {str(there.get('instance_id'))[:64]!r} first")
        if ends and there.get("state") in TERMINAL and self.status.get("state") not in TERMINAL:
            raise Superseded(f"the run is already recorded as {there['state']}")

    def read_status_tagged(self) -> object:
        """status.json read again, its ETag kept for the next conditional write; one that is not a
        record (too large, not JSON) is None: written over."""
        data, self.etag = self.store.get_tagged("status.json", MAX_STATUS_BYTES)
        try:
            return bounded_json.loads(data, max_bytes=MAX_STATUS_BYTES) if data is not None else None
        except bounded_json.Refused:
            return None

    def save(self, check: bool = True) -> None:
        """status.json written whole; with ``check``, Superseded first when a later launch is recorded.

        The write is conditional on status.json being as this launch last read or wrote it: where
        another writer came in between (check_superseded read it, and a newer launch wrote before
        this write), S3 refuses it (Conflict); status.json is read again then, and this launch is
        Superseded by a later launch (even with ``check`` False: this launch's own end does not
        overwrite a newer launch's record, nor end its group), by an end it did not write (with
        ``check``), or else writes over it (an older launch's last heartbeat, a record that is not
        one), up to CONFLICT_TRIES times."""
        if check:
            self.check_superseded()
        self.status["heartbeat_at"] = self.now()
        if self.several:
            self.status.update(generation=self.generation, instances=self.instances_of(self.records))
        elif self.status["instances"]:
            self.status["instances"][-1]["last_seen_at"] = self.status["heartbeat_at"]
        body = {k: self.status[k] for k in STATUS_FIELDS + (("generation",) if self.several else ())}
        if not self.conditional:
            self.store.put_json("status.json", body)
            return
        for _ in range(CONFLICT_TRIES):
            try:
                self.etag = self.store.put_json("status.json", body, if_match=self.etag, if_absent=self.etag is None)
                return
            except Conflict as exc:
                self.log(f"status.json: {exc}; read again")
                self.raise_if_superseded(self.read_status_tagged(), ends=check)  # one not a record supersedes nothing
        raise Conflict(f"status.json changed under {CONFLICT_TRIES} writes in a row")

    def try_save(self, check: bool = True) -> None:
        try:
            self.save(check)
        except Superseded:
            raise
        except Exception as exc:  # S3 for a moment out of reach: the next write carries the record
            self.log(f"status.json not written: {type(exc).__name__}: {exc}"[:500])

    def end(self, state: str, reason: str | None) -> int:
        """The run's end: ``state`` recorded, then the group set to 0 (end_group). The record is
        written before the group goes, tried END_SAVE_TRIES times with backoff (2 s doubling) when
        S3 does not take it: a group at 0 under a record that still says "running" reads, to
        `ec2gpu status`, as a run that ended without its agent's word (failed). When S3 never takes
        it, the group is ended all the same (the record's last word is then the group's)."""
        self.status.update(state=state, reason=reason, ended_at=self.status["ended_at"] or self.now())
        delay = 2.0
        for attempt in range(END_SAVE_TRIES):
            try:
                self.save(check=False)
                break
            except Superseded:
                raise
            except Exception as exc:  # S3 out of reach for a moment: tried again, the group still up
                self.log(f"the end ({state}) not recorded yet: {type(exc).__name__}: {exc}"[:500])
                if attempt + 1 < END_SAVE_TRIES:
                    self.sleep(delay)
                    delay = min(delay * 2, 60.0)
        self.end_group()
        return 0

    def end_group(self) -> None:
        """UpdateAutoScalingGroup to 0/0/0 with the instance role's credentials, retried with
        backoff (2 s doubling to 60 s) until it is done; each failure recorded in status.json."""
        delay = 2.0
        while True:
            try:
                self.asg.update_auto_scaling_group(AutoScalingGroupName=self.group, MinSize=0, MaxSize=0,
                                                   DesiredCapacity=0)
            except Exception as exc:
                self.status["group_end_error"] = f"{self.now()} {type(exc).__name__}: {exc}"[:1000]
                self.log(f"the group is not ended yet: {self.status['group_end_error']}")
                self.try_save(check=False)
                self.sleep(delay)
                delay = min(delay * 2, 60.0)
                continue
            self.status.update(group_ended_at=self.now(), group_end_error=None)
            self.try_save(check=False)
            return

    # -- transfers
    def push_log(self) -> None:
        path = os.path.join(self.run_dir, "job.log")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        if self.log_sent == (st.st_size, st.st_mtime_ns):
            return
        values = list(self.secrets.values())
        base = self.log_base[-LOG_MAX:] if self.writer else b""
        with open(path, "rb") as f:
            if len(base) + st.st_size > LOG_MAX:  # its last LOG_MAX bytes, from a line's start: a secret
                # the cut would halve is never sent in part
                f.seek(max(0, st.st_size - LOG_MAX))
                data = (base + f.read(LOG_MAX))[-LOG_MAX:]
                data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
            else:
                data = base + f.read(LOG_MAX)
            data = mask(data, values)
        # several nodes: the head's is the run's log; each other's is its own (logs/nodes/ID.log)
        key = "logs/job.log" if self.writer else f"logs/nodes/{self.iid}.log"
        self.store.s3.put_object(Bucket=self.store.bucket, Key=self.store.key(key), Body=data,
                                 ContentType="text/plain")
        self.log_sent = (st.st_size, st.st_mtime_ns)

    def push(self, settled: bool) -> None:
        """Checkpoints (changed files), the MOUNT-mode file_mounts and the log to S3; errors said,
        not raised (the next push sends what this one could not)."""
        for what, step in (("checkpoints", lambda: self.ckpt.push(self.settled_s if settled else 0.0, self.clock())),
                           ("file_mounts", lambda: self.write_back(settled)), ("log", self.push_log)):
            try:
                step()
            except Exception as exc:
                self.log(f"{what} not uploaded: {type(exc).__name__}: {exc}"[:500])

    def write_back(self, settled: bool) -> None:
        """What the job wrote under each MOUNT-mode target, new or changed, to its bucket
        (agent/s3files._write_back; ``settled``: files still being written wait for the next)."""
        for m in self.write_backs:
            done = s3files._write_back(self.s3_for(m["region"]), m, self.settled_s if settled else 0)
            if done.get("files"):
                self.log(f"file_mounts: {done['files']} file(s) written back to s3://{m['bucket']}/{m['prefix']}")

    def place_mounts(self) -> None:
        """The task's file_mounts in place, once per instance (a marker in the run directory), before
        the setup: a local source from the run's prefix (a file, or an archive unpacked with the
        workdir's rules and copied over the target), an S3 one copied in by agent/s3files.py with
        the instance role. Refused for an archive that breaks the rules or is too large."""
        mounts = self.spec["mounts"]
        root = os.environ.get("EC2GPU_SANDBOX_ROOT", "")
        records = os.path.join(self.run_dir, "s3mounts")
        self.write_backs = [
            {"target": on_instance(m["target"], self.home, root), "bucket": m["bucket"], "prefix": m["prefix"],
             "region": m["region"], "record": os.path.join(records, f"{i}.json")}
            for i, m in enumerate(mounts) if m["kind"] == "s3" and m["write_back"]]
        marker = os.path.join(self.run_dir, "mounts.done")
        if not mounts or os.path.exists(marker):
            return
        for i, m in enumerate(mounts):
            path = on_instance(m["target"], self.home, root)
            if not root and m["target"].startswith("/") and os.environ.get("EC2GPU_SANDBOX_CONTROL"):
                raise Refused(f"file_mounts {m['target']}: this sandbox instance has no EC2GPU_SANDBOX_ROOT (a sandbox "
                              "started by an older ec2gpu): restart it")
            try:
                self._place(m, i, path, records)
            except Refused:
                raise
            except Exception as exc:  # S3 refused, a path not made: the run ends failed, saying which entry
                raise Refused(f"file_mounts {m['target']}: not put in place ({type(exc).__name__}: {exc})"[:1000]) \
                    from None
        with open(marker, "w"):
            pass

    def _place(self, m: dict[str, Any], i: int, path: str, records: str) -> None:
        """One file_mounts entry at ``path`` (place_mounts)."""
        if m["kind"] == "s3":
            if m["file"]:  # one object to the target path itself: its folder made first
                os.makedirs(os.path.dirname(path), exist_ok=True)
            done = s3files._copy_in(self.s3_for(m["region"]), {
                "target": path, "bucket": m["bucket"], "prefix": m["prefix"], "file": m["file"],
                "record": os.path.join(records, f"{i}.json")})
            self.log(f"file_mounts: {done['files']} object(s), {done['bytes']} bytes from s3://{m['bucket']}/"
                     f"{m['prefix']} to {m['target']}")
            return
        rel = m["key"][len(self.store.prefix):]
        head = self.store.s3.head_object(Bucket=self.store.bucket, Key=self.store.key(rel))
        if int(head.get("ContentLength", 0)) > MAX_ARCHIVE_BYTES:
            raise Refused(f"file_mounts {m['target']}: over {MAX_ARCHIVE_BYTES:,} bytes")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if m["is_file"]:
            self.store.s3.download_file(self.store.bucket, self.store.key(rel), path)
            return
        archive, unpacked = os.path.join(self.run_dir, "mount.tar.gz"), os.path.join(self.run_dir, "mount")
        shutil.rmtree(unpacked, ignore_errors=True)
        self.store.s3.download_file(self.store.bucket, self.store.key(rel), archive)
        try:
            extract_workdir(archive, unpacked)
            shutil.copytree(unpacked, path, symlinks=True, dirs_exist_ok=True)
        finally:
            os.remove(archive)
            shutil.rmtree(unpacked, ignore_errors=True)

    def push_outputs(self) -> None:
        outputs = Mirror(self.store, "outputs", self.out_dir)
        try:
            outputs.push(want=lambda rel: wanted(rel, self.spec["outputs"]), delete=False)
        except Exception as exc:
            self.log(f"outputs not uploaded: {type(exc).__name__}: {exc}"[:500])

    def finish(self, state: str, reason: str | None) -> int:
        """Outputs, checkpoints and log up, then the end."""
        self.push_outputs()
        self.push(settled=False)
        return self.end(state, reason)

    # -- the launch
    def cancelled(self) -> bool:
        try:
            return self.store.exists("cancel")
        except Exception as exc:
            self.log(f"cancel not checked: {type(exc).__name__}: {exc}"[:300])
            return False

    def execute(self) -> int:
        """This launch, start to end; returns this process's exit code (0: the run ended)."""
        try:
            return self._execute()
        except Superseded as exc:
            self.log(f"superseded: {exc}; this instance writes nothing more")
            return EXIT_SUPERSEDED
        except Exception as exc:  # a bug or S3 out of reach: the run ends rather than bill on
            if self.proc is not None and self.proc.poll() is None:
                self.stop(self.proc, self.key)
            self.log(f"detached agent error: {type(exc).__name__}: {exc}"[:1000])
            return self.end("failed", f"the detached agent failed: {type(exc).__name__}: {exc}"[:1000]) or 1

    def _execute(self) -> int:
        at = self.clock()
        there, self.etag = self.store.get_json_tagged("status.json", MAX_STATUS_BYTES)
        self.status = parse_status(there, self.run_id, self.group, at)
        if not self.conditional:
            self.log("this boto3 cannot write S3 objects conditionally: status.json is written without a check")
        self.launch = self.status["launches"] + 1
        instance_id = self.imds("/latest/meta-data/instance-id") or "unknown"
        instance_id = instance_id if re.fullmatch(r"[A-Za-z0-9-]{1,64}", instance_id) else "unknown"
        self.status.update(launches=self.launch, instance_id=instance_id)
        last = self.status["attempts"][-1] if self.status["attempts"] else None
        if last and last.get("outcome") == "running":  # its instance went away without a word
            last.update(outcome="lost", ended_at=self.status.get("heartbeat_at"))
            self.status["interruptions"] += 1
        self.status["instances"] = (self.status["instances"] + [
            {"launch": self.launch, "instance_id": instance_id, "started_at": iso(at), "last_seen_at": iso(at),
             "setup_exit_code": None, "setup_runs": 0, "resumed": False, "checkpoint_files": 0}])[-MAX_RECORDS:]
        try:
            self.spec = parse_spec(self.store.get_json("spec.json", MAX_SPEC_BYTES, self.spec_sha256), self.run_id,
                                   self.store.prefix)
        except Refused as exc:
            self.log(f"refused: {exc}")
            if self.status["state"] not in TERMINAL:
                self.status["state"] = "failed"
                self.status["reason"] = f"spec refused: {exc}"[:1000]
            self.end(self.status["state"], self.status["reason"])
            return EXIT_REFUSED
        if self.spec["nodes"] > 1:
            return self.run_several(instance_id, at)
        if self.status["state"] in TERMINAL:  # ended before; the group was not (or this launch is late)
            return self.end(self.status["state"], self.status["reason"])
        if self.cancelled():
            return self.end("cancelled", "cancelled before this launch ran anything")
        if self.launch > self.spec["max_launches"]:
            return self.end("failed", f"launch {self.launch} is beyond max_launches {self.spec['max_launches']}")
        if self.spec["limit_at"] is not None and at >= self.spec["limit_at"]:
            return self.end("failed", "the run's time limit passed before this launch")
        self.status["state"] = "starting"
        self.save()
        return self.prepare_and_run()

    def prepare_and_run(self) -> int:
        spec = self.spec
        refused = self.prepare_instance()
        if refused is not None:
            return self.end("failed", refused)
        ip = self.imds("/latest/meta-data/local-ipv4") or "127.0.0.1"
        ip = ip if re.fullmatch(r"[0-9a-fA-F.:]{1,64}", ip) else "127.0.0.1"
        python = find_python(spec["python"])
        env = job_env(spec, self.run_dir, self.workdir, ip, self.gpus(), False, python, self.secrets)
        self.out_dir, ckpt_dir = env["EC2GPU_OUTPUT_DIR"], env["EC2GPU_CHECKPOINT_DIR"]
        os.makedirs(self.out_dir, exist_ok=True)
        self.ckpt = Mirror(self.store, "checkpoints", ckpt_dir)
        self.pull_log()
        self.share_log(spec["log_reader"])
        found = self.ckpt.pull()
        self.status["instances"][-1].update(resumed=found > 0, checkpoint_files=found)
        resume = found > 0
        sky = os.path.join(self.home, "sky_workdir")  # SkyPilot's path, unless something real is there
        if not os.path.exists(sky) or os.path.islink(sky):
            try:
                if os.path.islink(sky):
                    os.remove(sky)
                os.symlink(self.workdir, sky)
            except OSError:
                pass
        setup_done = spec["setup"] is None
        while True:
            if self.cancelled():
                return self.finish("cancelled", "cancelled")
            env = job_env(spec, self.run_dir, self.workdir, ip, self.gpus(), resume, python, self.secrets)
            if not setup_done:
                code = self.run_setup(env)
                inst = self.status["instances"][-1]
                inst.update(setup_exit_code=code, setup_runs=inst["setup_runs"] + 1)
                if code == -1:
                    return self.finish("cancelled", "cancelled during the setup")
                if code != 0:
                    if self.status["restarts_on_errors"] < spec["max_restarts_on_errors"]:
                        self.status["restarts_on_errors"] += 1
                        self.log(f"the setup exited {code}: running it again")
                        self.try_save()
                        continue
                    self.status.update(exit_code=code, signal=None)
                    return self.finish("failed", f"the setup exited {code}")
                setup_done = True
            outcome, record = self.run_job(env)
            if outcome == "succeeded":
                return self.finish("succeeded", None)
            if outcome == "interrupted":
                self.push(settled=False)
                self.status.update(state="interrupted", reason="spot interruption: the group replaces the instance")
                self.status["interruptions"] += 1
                self.try_save()
                return EXIT_INTERRUPTED
            if outcome == "cancelled":
                return self.finish("cancelled", "cancelled")
            if outcome == "limit":
                return self.finish("failed", "the run's time limit: the job was stopped")
            if self.status["restarts_on_errors"] < spec["max_restarts_on_errors"]:
                self.status["restarts_on_errors"] += 1
                self.push(settled=False)
                self.try_save()
                resume = True
                continue
            how = f"signal {record.get('signal')}" if record.get("signal") else f"exit {record.get('exit_code')}"
            return self.finish("failed", f"the job failed ({how}) with {self.status['restarts_on_errors']} "
                                         f"restart(s) on errors used")

    def prepare_instance(self) -> str | None:
        """The run's directory, the workdir, the secrets and the file_mounts, once per instance;
        the refusal's words when one breaks the contract (the run then ends failed), else None."""
        os.makedirs(self.run_dir, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        self.workdir = os.path.join(self.run_dir, "workdir")
        try:
            self.get_workdir()
            if self.spec["secrets"]:
                self.secrets = read_secrets(self.ssm, self.run_id, self.spec["secrets"])
            self.place_mounts()
        except Refused as exc:
            self.log(f"refused: {exc}")
            return str(exc)[:1000]
        return None

    def get_workdir(self) -> None:
        """The workdir from S3, unpacked once per instance (a restart on errors keeps it)."""
        if os.path.isdir(self.workdir):
            return
        key = self.spec["workdir_key"]
        if key is None:
            os.makedirs(self.workdir)
            return
        rel = key[len(self.store.prefix):]
        head = self.store.s3.head_object(Bucket=self.store.bucket, Key=self.store.key(rel))
        if int(head.get("ContentLength", 0)) > MAX_ARCHIVE_BYTES:
            raise Refused(f"workdir archive: over {MAX_ARCHIVE_BYTES:,} bytes")
        archive = os.path.join(self.run_dir, "workdir.tar.gz")
        self.store.s3.download_file(self.store.bucket, self.store.key(rel), archive)
        try:
            if os.path.getsize(archive) > MAX_ARCHIVE_BYTES:
                raise Refused(f"workdir archive: over {MAX_ARCHIVE_BYTES:,} bytes")
            extract_workdir(archive, self.workdir)
        except (tarfile.TarError, EOFError, OSError) as exc:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise Refused(f"workdir archive: unreadable ({type(exc).__name__}: {exc})") from None
        finally:
            os.remove(archive)

    def pull_log(self) -> None:
        """The log of earlier launches, so this one's appends to it (not on a restart here)."""
        path = os.path.join(self.run_dir, "job.log")
        if os.path.exists(path):
            return
        try:
            data = self.store.get_bytes("logs/job.log", LOG_MAX)
        except Exception as exc:
            self.log(f"the earlier log not read: {type(exc).__name__}: {exc}"[:300])
            return
        if data:
            with open(path, "wb") as f:
                f.write(data[-LOG_MAX:])

    def share_log(self, reader: str | None) -> None:
        """Let ``reader`` (the SSH user) read job.log, live, over SSH: the log (made here if the
        earlier launches left none) gets ``reader``'s group and mode 0640, the run directory and the
        agent's home that group and mode 0710 (the group passes through by name and lists nothing;
        the job's environment file with its secrets and the agent's key stay 0600, root's; what the
        job made readable, its workdir and outputs, that group may read by name). Said, never
        raised, when it cannot be done (no such user; not root): the log is then read from S3 only."""
        if not reader:
            return
        import pwd
        path = os.path.join(self.run_dir, "job.log")
        try:
            gid = pwd.getpwnam(reader).pw_gid
            with open(path, "ab"):
                pass
            for p, mode in ((path, 0o640), (self.run_dir, 0o710), (self.home, 0o710)):
                os.chown(p, -1, gid)
                os.chmod(p, mode)
        except (KeyError, OSError) as exc:
            self.log(f"job.log not shared with {reader}: {type(exc).__name__}: {exc}"[:300])

    def run_setup(self, env: dict[str, str]) -> int:
        """The setup as engine.py runs it (bash -i, then a plain bash, SKYPILOT_SETUP_* too, under
        reaper.py: what it leaves running ends with it, before the job's key is made), its output
        appended to job.log; its exit code (124 after SETUP_TIMEOUT_S, -1 when cancelled)."""
        full = {**os.environ, **env, "HOME": self.home, "SKYPILOT_SETUP_NODE_RANK": env["SKYPILOT_NODE_RANK"],
                "SKYPILOT_SETUP_NODE_IPS": env["SKYPILOT_NODE_IPS"],
                "SKYPILOT_SETUP_NUM_GPUS_PER_NODE": env["SKYPILOT_NUM_GPUS_PER_NODE"]}
        if env.get("EC2GPU_PYTHON", "").startswith("/"):
            full["PATH"] = os.path.dirname(env["EC2GPU_PYTHON"]) + os.pathsep + full.get("PATH", "")
        with open(os.path.join(self.run_dir, "job.log"), "ab") as out:
            proc = subprocess.Popen([sys.executable, *agent.PYTHON_FLAGS,
                                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py"),
                                     "--grace", f"{self.stop_grace_s:g}", "--",
                                     "bash", "-c", INTERACTIVE, HANDOFF, PROLOGUE + self.spec["setup"], "setup"],
                                    cwd=self.workdir, env=full, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        deadline = self.clock() + SETUP_TIMEOUT_S
        next_push = self.clock() + self.every_s
        try:
            while proc.poll() is None:
                if self.cancelled():
                    self.end_setup(proc)
                    return -1
                if self.clock() >= deadline:
                    self.end_setup(proc)
                    return 124
                if self.clock() >= next_push:
                    if self.writer:
                        self.check_superseded()
                        self.push(settled=True)
                        self.try_save()
                    else:
                        self.push_own_log()
                    next_push = self.clock() + self.every_s
                self.sleep(self.poll_s)
        except BaseException:  # superseded, or this agent's own error: the setup does not outlive it
            self.end_setup(proc)
            raise
        code = proc.returncode  # the reaper's: it ended what the setup left before it did
        return code if code >= 0 else 128 - code

    def end_setup(self, proc: subprocess.Popen) -> None:
        """SIGTERM the setup's reaper: it ends the setup and all it left (SIGKILL after its grace,
        ``stop_grace_s``, then up to reaper.KILL_WAIT_S); SIGKILL it if it has not ended by then."""
        proc.terminate()
        try:
            proc.wait(self.stop_grace_s + 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def agent_record(self, key: bytes) -> dict[str, Any] | None:
        """RUN_DIR/status.json when agent.py signed it with ``key``, else None."""
        try:
            rec = bounded_json.read(os.path.join(self.run_dir, "status.json"), max_bytes=1024 * 1024)
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or not isinstance(rec.get("signature"), str):
            return None
        return rec if hmac.compare_digest(rec["signature"], agent.sign(rec, key)) else None

    def run_job(self, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
        """One attempt of the job under agent.py; (outcome, agent's record). Outcomes: succeeded,
        failed, interrupted, cancelled, limit."""
        spec = self.spec
        os.makedirs(env["EC2GPU_CHECKPOINT_DIR"], exist_ok=True)
        env_file, key_file = os.path.join(self.run_dir, "job.env.json"), os.path.join(self.run_dir, "agent.key")
        key = secrets.token_hex(32).encode()
        for path, text in ((env_file, json.dumps({**env, "HOME": self.home})), (key_file, key.decode())):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        status_path = os.path.join(self.run_dir, "status.json")
        if os.path.exists(status_path):
            os.remove(status_path)  # the last attempt's: this one's record is the agent's next
        limit = [] if spec["limit_at"] is None else ["--limit-at", f"{spec['limit_at']:.0f}",
                                                     "--limit-grace", f"{spec['limit_grace_s']:.0f}"]
        argv = [sys.executable, *agent.PYTHON_FLAGS, os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py"),
                "--dir", self.run_dir, "--env-file", env_file, "--key-file", key_file, *limit, "--",
                "bash", "-c", INTERACTIVE, HANDOFF, PROLOGUE + spec["run"], spec["name"], *spec["args"]]
        agent_env = {**os.environ, "HOME": self.home, "EC2GPU_IMDS_ENDPOINT": self.imds_endpoint,
                     "EC2GPU_SPOT_POLL_SECONDS": str(self.agent_poll_s),
                     "EC2GPU_STOP_GRACE_SECONDS": str(self.stop_grace_s)}
        self.status["attempt"] += 1
        attempt = {"attempt": self.status["attempt"], "launch": self.launch, "instance_id": self.status["instance_id"],
                   "started_at": self.now(), "ended_at": None, "outcome": "running", "exit_code": None, "signal": None,
                   "resume": env["EC2GPU_RESUME"] == "1", "notice": None, "rebalance": None}
        self.status["attempts"] = (self.status["attempts"] + [attempt])[-MAX_RECORDS:]
        self.status["state"] = "running"
        proc = self.proc = subprocess.Popen(argv, env=agent_env, stdin=subprocess.DEVNULL)
        self.key = key
        try:
            if self.writer:
                self.save()
            outcome = self.supervise(proc, key, attempt)
        except BaseException:  # superseded, or S3 refused the record: the job does not run on without its agent
            self.stop(proc, key)
            self.proc = None
            raise
        self.proc = None
        record = self.agent_record(key) or {}
        attempt.update(ended_at=self.now(), exit_code=record.get("exit_code"), signal=record.get("signal"))
        if outcome is None:
            state = record.get("state")
            outcome = ("limit" if record.get("limit") else state if state in ("succeeded", "interrupted")
                       else "failed")
            if not record:
                code = proc.returncode
                attempt["exit_code"] = code if code >= 0 else 128 - code
        attempt["outcome"] = outcome
        for k in ("notice", "rebalance"):
            attempt[k] = record.get(k) if isinstance(record.get(k), dict) else attempt[k]
        self.status.update(exit_code=attempt["exit_code"], signal=attempt["signal"])
        return outcome, {"exit_code": attempt["exit_code"], "signal": attempt["signal"]}

    def supervise(self, proc: subprocess.Popen, key: bytes, attempt: dict[str, Any]) -> str | None:
        """Watch the agent until it ends: the cancel object on every poll; checkpoints and log every
        ``every_s`` seconds (with the heartbeat), and at once on a spot notice or a rebalance
        recommendation. Returns "cancelled" when this agent stopped the job, "regroup" when it
        stopped it because its generation changed or lost a member (several nodes: ``watch``), else
        None (the agent's record decides). A node that is not the head sends only its own log."""
        next_push = self.clock() + self.every_s
        while proc.poll() is None:
            if self.cancelled():
                self.stop(proc, key)
                return "cancelled"
            why = self.watch() if self.several else None
            if why:
                self.log(f"{why}: the job is stopped, to start again with the next generation")
                self.stop(proc, key)
                return "regroup"
            rec = self.agent_record(key) or {}
            urgent = False
            for k in ("notice", "rebalance"):
                if isinstance(rec.get(k), dict) and attempt[k] is None:
                    attempt[k] = rec[k]
                    urgent = True
            if self.several and isinstance(rec.get("notice"), dict) and self.node.get("state") != "leaving":
                self.node_write(state="leaving")  # the others stop theirs now, not at the stale time
            if urgent or self.clock() >= next_push:
                if self.writer:
                    self.check_superseded()  # before anything is sent
                    self.push(settled=True)
                    self.try_save()  # checked again: the push may have taken a while
                else:
                    self.push_own_log()
                next_push = self.clock() + self.every_s
            self.sleep(self.poll_s)
        return None

    def stop(self, proc: subprocess.Popen, key: bytes) -> None:
        """SIGTERM to the job's process group (as agent.py forwards its own SIGTERM: sent to the
        group directly once the agent's record names it, so no start-up race leaves the job
        running without its agent; to the agent when its record never comes); SIGKILL to the
        group and the agent after stop_grace_s."""
        wait_until = time.monotonic() + 10
        pid = None
        while proc.poll() is None and time.monotonic() < wait_until:
            pid = (self.agent_record(key) or {}).get("pid")
            if isinstance(pid, int) and pid > 1:
                break
            time.sleep(0.05)
        try:
            if isinstance(pid, int) and pid > 1:
                os.killpg(pid, signal.SIGTERM)
            else:
                proc.send_signal(signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + self.stop_grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            if isinstance(pid, int) and pid > 1:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            proc.kill()
            proc.wait()

    # -- several nodes (agent/gang.py's rules)
    def node_write(self, **changes: Any) -> None:
        """This instance's record (nodes/ID.json) with ``changes``, written now (under the lock the
        heartbeat takes too, so an older body never lands after a newer one); errors said. A record
        that says "leaving" (a spot notice) stays so: this instance is never a member again."""
        with self.node_lock:
            if self.node.get("state") == "leaving":
                changes.pop("state", None)
            self.node.update(changes)
            try:
                self.store.put_json(f"nodes/{self.iid}.json", self.node)
            except Exception as exc:
                self.log(f"nodes/{self.iid}.json not written: {type(exc).__name__}: {exc}"[:500])

    def heartbeat(self) -> None:
        """A thread that writes this instance's record every gang.HEARTBEAT_S seconds while this
        process lives (through a long setup, download or job alike), until ``beat_stop``."""
        def beat() -> None:
            while not self.beat_stop.wait(gang.HEARTBEAT_S):
                self.node_write()
        threading.Thread(target=beat, name="heartbeat", daemon=True).start()

    def s3_now(self) -> datetime:
        """Now by S3's clock (the Date of its last listing answer, plus the time since): what the
        records' LastModified is compared with, so a skewed instance clock decides nothing."""
        at, then = self.s3_clock
        return at + timedelta(seconds=time.monotonic() - then)

    def read_nodes(self) -> dict[str, dict[str, Any]]:
        """The run's node records (gang.parse_node each; one listing, then a GET for each record S3
        wrote within the stale time). An older one is of an instance gone silent: its last record
        read here is kept (marked ``stale``), so a member that ended its job and then went counts
        by its end (gang.decide)."""
        base = self.store.key("nodes") + "/"
        found: dict[str, dict[str, Any]] = {}
        seen = 0
        for page in self.store.s3.get_paginator("list_objects_v2").paginate(Bucket=self.store.bucket, Prefix=base):
            date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            try:
                self.s3_clock = (email.utils.parsedate_to_datetime(date), time.monotonic())
            except (TypeError, ValueError):
                self.s3_clock = (datetime.now(timezone.utc), time.monotonic())
            now = self.s3_now()
            for o in page.get("Contents", []):
                seen += 1
                iid = o["Key"][len(base):].removesuffix(".json")
                if seen > gang.MAX_RECORDS or not o["Key"].endswith(".json") or not gang.IID_RE.fullmatch(iid):
                    continue
                modified = o["LastModified"]
                if (now - modified).total_seconds() > self.stale_s:
                    last = self.records.get(iid) or {"instance_id": iid, "ip": "0.0.0.0", "booted_at": "",
                                                     "state": "leaving", "generation": 0, "outcome": None,
                                                     "exit_code": None}
                    found[iid] = {**last, "modified": modified, "stale": True}
                    continue
                try:
                    rec = gang.parse_node(self.store.get_json(f"nodes/{iid}.json", gang.MAX_NODE_BYTES), iid, modified)
                except Refused:
                    rec = None
                if rec is not None:
                    found[iid] = rec
        self.records = found
        return found

    def read_gang(self) -> tuple[dict[str, Any] | None, str | None]:
        """(gang.json as gang.parse_gang reads it, its ETag); (None, ETag) for one that is not a
        generation (it is written over), (None, None) for none."""
        try:
            data, etag = self.store.get_json_tagged("gang.json", gang.MAX_GANG_BYTES)
        except Refused:
            data, etag = None, self.store.get_tagged("gang.json", 0)[1]
        return gang.parse_gang(data), etag

    def form(self, new: dict[str, Any], etag: str | None) -> bool:
        """Write generation ``new`` over the gang.json of ``etag`` (none: where there is none);
        False when another instance wrote one first (it is joined instead), or S3 did not answer."""
        try:
            self.store.put_json("gang.json", new, if_match=etag, if_absent=etag is None)
        except Conflict:
            return False
        except Exception as exc:
            self.log(f"generation {new['generation']} not formed: {type(exc).__name__}: {exc}"[:300])
            return False
        self.log(f"generation {new['generation']} formed ({new['reason']}): {', '.join(new['members'])}")
        return True

    def instances_of(self, records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """status.json's ``instances`` of a run of several nodes: one per node record, by boot time
        (the times the run's cost is settled from: runs/detached/costs.py)."""
        out = []
        for i, r in enumerate(sorted(records.values(), key=lambda r: (r["booted_at"], r["instance_id"]))):
            if r["ip"] == "0.0.0.0" and not r["booted_at"]:  # stale, never read: kept as the record had it
                old = [x for x in self.status["instances"] if x.get("instance_id") == r["instance_id"]]
                if old:
                    out.append({**old[-1], "launch": i + 1})
                continue
            out.append({"launch": i + 1, "instance_id": r["instance_id"], "started_at": r["booted_at"],
                        "last_seen_at": r["modified"].astimezone(timezone.utc).isoformat(timespec="seconds"),
                        "setup_exit_code": None, "setup_runs": 0, "resumed": False, "checkpoint_files": 0})
        return out[-MAX_RECORDS:]

    def end_several(self, state: str, reason: str | None) -> int:
        """The run's end from any of its nodes: status.json read again (this instance writes over
        the head's record only to end it), then ``end``."""
        there = self.read_status_tagged()
        self.status = parse_status(there, self.run_id, self.group, self.clock())
        self.generation = max(self.generation, self.status["generation"])
        if self.status["state"] in TERMINAL:
            self.end_group()
            return 0
        self.writer = True
        return self.end(state, reason)

    def watch(self) -> str | None:
        """While the job runs: why it must stop (its generation is no longer gang.json's, a member
        is no longer live, or a member's job failed in it: read every gang.HEARTBEAT_S seconds),
        else None. A gang.json that cannot be read is not a reason (S3 for a moment, or a hostile
        write: the members' records decide)."""
        try:
            g, _ = self.read_gang()
            if g is not None and g["generation"] != self.generation:
                return f"generation {g['generation']} replaced {self.generation}"
            if self.clock() >= self.next_nodes_read:
                self.next_nodes_read = self.clock() + gang.HEARTBEAT_S
                records = self.read_nodes()
                lost = [m for m in gang.lost_members(self.gang, records, self.s3_now(), self.stale_s)
                        if not gang.ended_in(records.get(m), self.generation)]  # one that ended counts by its end
                if lost:
                    return f"{', '.join(lost)} of generation {self.generation} is gone"
                failed = [m for m in (self.gang or {}).get("members", []) if records[m]["generation"] == self.generation
                          and records[m]["state"] == "ended" and records[m]["outcome"] == "failed"]
                if failed:
                    self.peer_failed = True
                    return f"the job failed on {', '.join(failed)}"
        except Exception as exc:  # S3 out of reach for a moment: the job goes on
            self.log(f"the generation not checked: {type(exc).__name__}: {exc}"[:300])
        return None

    def push_own_log(self) -> None:
        try:
            self.push_log()
        except Exception as exc:
            self.log(f"log not uploaded: {type(exc).__name__}: {exc}"[:300])

    def head_live(self, g: dict[str, Any] | None) -> bool:
        """Whether ``g``'s head (rank 0) is another instance whose record is live: its word (the
        run's end, with its outputs) is awaited rather than given here."""
        if g is None or g["members"][0] == self.iid:
            return False
        return gang.is_live(self.records.get(g["members"][0]), self.s3_now(), self.stale_s)

    def join(self, last: int, stopped: bool = False, word: dict[str, Any] | None = None) -> dict[str, Any] | int:
        """Wait for a generation after ``last`` that names this instance, forming it (gang.propose)
        when it is this instance's to form; returns it, or this process's exit code when the run
        ended (its record's end: the group is ended again, harmless), was cancelled or ran out of
        time. The end is the head's to give (with the outputs): recorded here only when this
        instance is the head of the latest generation, or that head has gone silent.
        ``stopped``: this instance stopped its job in ``last`` for a member that was lost; when
        that member is back and no one formed a generation since, the same members regroup.
        ``word``: this instance headed ``last`` and its job ended (its record, for ``settle``):
        while no one has formed a generation since, it keeps judging ``last`` (a member it took
        for lost may come back with its end)."""
        while True:
            try:
                self.status = parse_status(self.store.get_json("status.json", MAX_STATUS_BYTES), self.run_id,
                                           self.group, self.clock())
                if self.status["state"] in TERMINAL:
                    self.node_write(state="ended")
                    self.end_group()
                    return 0
                g, etag = self.read_gang()
                records = self.read_nodes()
                over = self.spec["limit_at"] is not None and self.clock() >= self.spec["limit_at"]
                if over or self.cancelled():
                    if not self.head_live(g):
                        self.writer = g is not None and g["members"][0] == self.iid
                        return self.finish_several("failed" if over else "cancelled",
                                                   "the run's time limit" if over else "cancelled")
                    self.sleep(self.poll_s)  # the head's word is awaited
                    continue
                if g is not None and g["generation"] > last and self.iid in g["members"]:
                    return g
                if word is not None and g is not None and g["generation"] == last and g["members"][0] == self.iid:
                    done = self.settle(g, word, wait=False)  # this head's word on it was never given
                    if done is not None:
                        return done
                self.replace_silent(g, records)
                now = self.s3_now()
                floor = max(last, self.status["generation"])  # a gang.json lost or written over: never numbered back
                new = gang.propose(g, records, self.spec["nodes"], now, self.stale_s, floor=floor)
                if new is None and stopped and (g is None or g["generation"] == last) and self.iid in (g or {}).get(
                        "members", []):
                    new = gang.propose(g, records, self.spec["nodes"], now, self.stale_s, restart="regroup", floor=floor)
                if new is not None and self.form(new, etag):
                    continue
            except (Refused, Conflict) as exc:
                self.log(f"waiting for the next generation: {exc}"[:300])
            except Exception as exc:  # S3 out of reach for a moment: tried again
                self.log(f"waiting for the next generation: {type(exc).__name__}: {exc}"[:300])
            self.sleep(self.poll_s)

    def replace_silent(self, g: dict[str, Any] | None, records: dict[str, dict[str, Any]]) -> None:
        """Each member of ``g`` whose record went stale (its agent silent: the instance may run on,
        and would hold the group's place until the deadline) set Unhealthy: the group terminates
        and replaces it (aws/iam.detached_policy's ReplaceOwnNodes). Refused (one already gone is
        not in the group): said, and asked again at the next looks, UNHEALTHY_TRIES times at most."""
        for iid in gang.lost_members(g, records, self.s3_now(), self.stale_s):
            rec = records.get(iid)
            if iid == self.iid or iid in self.unhealthy or (rec is not None and not rec.get("stale")):
                continue  # itself, asked already, or leaving by its own word (a spot notice: AWS ends it)
            try:
                self.asg.set_instance_health(InstanceId=iid, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False)
                self.unhealthy.add(iid)
                self.log(f"{iid} has been silent over {self.stale_s:.0f} s: set Unhealthy, the group replaces it")
            except Exception as exc:  # asked again at the next looks, UNHEALTHY_TRIES times in all
                self.log(f"{iid} not set Unhealthy: {type(exc).__name__}: {exc}"[:300])
                self.unhealthy_tries[iid] = self.unhealthy_tries.get(iid, 0) + 1
                if _code(exc) == "ValidationError" or self.unhealthy_tries[iid] >= UNHEALTHY_TRIES:
                    self.unhealthy.add(iid)  # not in the group (any more), or never taken: asked no more

    def finish_several(self, state: str, reason: str | None) -> int:
        """The end, by the head (outputs, checkpoints, log: finish) or by another node (end_several)."""
        return self.finish(state, reason) if self.writer else self.end_several(state, reason)

    def lead(self, g: dict[str, Any]) -> None:
        """This instance is generation ``g``'s head: status.json read again (the previous head's, if
        another), counted (an interruption, when ``g`` replaced a lost member), and written."""
        self.read_nodes()
        there = self.read_status_tagged()
        st = self.status = parse_status(there, self.run_id, self.group, self.clock())
        last = st["attempts"][-1] if st["attempts"] else None
        if g["reason"] == "interruption":
            st["interruptions"] += 1
        if last and last.get("outcome") == "running":  # its head went before it could say
            last.update(outcome="interrupted" if g["reason"] == "interruption" else "regroup",
                        ended_at=st.get("heartbeat_at"))
        if self.log_base == b"" and st.get("instance_id") not in (None, self.iid):  # the run's log so far
            try:
                self.log_base = self.store.get_bytes("logs/job.log", LOG_MAX) or b""
            except Exception as exc:
                self.log(f"the earlier log not read: {type(exc).__name__}: {exc}"[:300])
        self.launch = len(self.records)
        self.log_sent = None  # a worker's last upload was its own log's, not the run's
        st.update(launches=len(self.records), instance_id=self.iid, state="starting")
        self.save()

    def await_head(self, g: dict[str, Any]) -> bool:
        """A worker of generation ``g``: wait until its head has begun it (its record says so), so
        that the checkpoints the head uploaded when it stopped its last job are in S3 before this
        instance downloads them. False when ``g`` was replaced meanwhile, or its head went."""
        head = g["members"][0]
        while True:
            try:
                rec = gang.parse_node(self.store.get_json(f"nodes/{head}.json", gang.MAX_NODE_BYTES), head,
                                      self.s3_now())
                if rec is not None and rec["generation"] >= g["generation"] and rec["state"] != "leaving":
                    return True
                now_g, _ = self.read_gang()
                if now_g is not None and now_g["generation"] != g["generation"]:
                    return False
                if not gang.is_live(self.read_nodes().get(head), self.s3_now(), self.stale_s) or self.cancelled():
                    return False
            except Exception as exc:
                self.log(f"waiting for the head: {type(exc).__name__}: {exc}"[:300])
            self.sleep(self.poll_s)

    def run_several(self, instance_id: str, at: float) -> int:
        """This instance's part in a run of ``nodes`` instances (agent/gang.py): its record, then a
        job per generation it is a member of, until the run ends."""
        spec = self.spec
        self.several, self.writer = True, False
        self.iid = instance_id if instance_id != "unknown" else f"i-unknown-{secrets.token_hex(4)}"
        if self.status["state"] in TERMINAL:
            self.end_group()
            return 0
        if not self.conditional:  # gang.json could not be formed: fail now rather than wait to the deadline
            return self.end_several("failed", "this instance's boto3 cannot write S3 objects conditionally, "
                                              "which a run of several nodes needs (boto3 1.35.36 or later)")
        if self.cancelled():
            return self.end_several("cancelled", "cancelled before this launch ran anything")
        if spec["limit_at"] is not None and at >= spec["limit_at"]:
            return self.end_several("failed", "the run's time limit passed before this launch")
        refused = self.prepare_instance()
        if refused is not None:
            return self.end_several("failed", refused)
        ip = None
        for _ in range(IMDS_TRIES):
            ip = self.imds("/latest/meta-data/local-ipv4")
            if ip and gang.IP_RE.fullmatch(ip):
                break
            self.sleep(2.0)
        if not ip or not gang.IP_RE.fullmatch(ip):  # the others could not reach it: no member without one
            return self.end_several("failed", f"instance {self.iid} has no private address in its metadata")
        self.node = {"instance_id": self.iid, "ip": ip, "booted_at": iso(at), "state": "waiting", "generation": 0,
                     "outcome": None, "exit_code": None}
        self.node_write()
        self.heartbeat()
        try:
            return self._run_several(ip)
        finally:
            self.beat_stop.set()

    def _run_several(self, ip: str) -> int:
        spec = self.spec
        if len(self.read_nodes()) > spec["max_launches"]:
            return self.end_several("failed", f"launch {len(self.records)} is beyond max_launches "
                                              f"{spec['max_launches']}")
        python = find_python(spec["python"])
        env = job_env(spec, self.run_dir, self.workdir, ip, self.gpus(), False, python, self.secrets)
        self.out_dir = env["EC2GPU_OUTPUT_DIR"]
        os.makedirs(self.out_dir, exist_ok=True)
        self.ckpt = Mirror(self.store, "checkpoints", env["EC2GPU_CHECKPOINT_DIR"])
        self.share_log(spec["log_reader"])
        setup_done, last, stopped, word = spec["setup"] is None, 0, False, None
        while True:
            got = self.join(last, stopped, word)
            if isinstance(got, int):
                return got
            word = None
            g = self.gang = got
            self.generation = last = g["generation"]
            rank = g["members"].index(self.iid)
            self.writer, stopped, self.peer_failed = rank == 0, False, False
            if not self.writer and not self.await_head(g):
                stopped = True
                continue
            try:
                found = self.ckpt.pull()  # the head's latest, on every node
            except Exception as exc:
                self.log(f"checkpoints not downloaded: {type(exc).__name__}: {exc}"[:300])
                found = 0
            self.node_write(state="running", generation=last, outcome=None, exit_code=None)
            self.log(f"generation {last}: rank {rank} of {len(g['members'])} (head {g['ips'][0]})")
            try:
                if self.writer:
                    self.lead(g)
                env = job_env(spec, self.run_dir, self.workdir, ip, self.gpus(), found > 0, python, self.secrets,
                              rank=rank, ips=g["ips"])
                os.makedirs(env["EC2GPU_CHECKPOINT_DIR"], exist_ok=True)
                code = 0 if setup_done else self.run_setup(env)
                setup_done = code == 0
                if code == -1:
                    outcome, record = "cancelled", {}
                elif code != 0:  # a failed setup is the job's failure: the head decides on a restart
                    self.log(f"the setup exited {code}")
                    outcome, record = "failed", {"exit_code": code, "signal": None}
                else:
                    outcome, record = self.run_job(env)
            except Superseded as exc:  # a newer generation's head writes the record: this one joins it
                self.log(f"{exc}: waiting for the next generation")
                self.writer, stopped = False, True
                self.node_write(state="ended", outcome="stopped")
                continue
            except Exception as exc:  # S3 or the disk, for a moment: start again together, a few times
                if not isinstance(exc, (Refused, Conflict, OSError)) and not type(exc).__module__.startswith("botocore"):
                    raise
                self.errors_in_row += 1
                self.log(f"generation {last} not begun: {type(exc).__name__}: {exc}"[:300])
                if self.errors_in_row >= MAX_ERRORS_IN_ROW:
                    return self.end_several("failed", f"generation {last} could not begin, {self.errors_in_row} times "
                                                      f"in a row: {type(exc).__name__}: {exc}"[:1000])
                outcome, record = "regroup", {}
            else:
                self.errors_in_row = 0
            if outcome == "interrupted":  # a spot notice here: the group replaces this instance
                self.node_write(state="leaving", outcome="stopped")
                if self.writer:
                    self.push(settled=False)
                    self.status.update(state="interrupted", reason="spot interruption: the group replaces the instance")
                    self.try_save()
                else:
                    self.push_own_log()
                return EXIT_INTERRUPTED
            if outcome in ("cancelled", "limit"):
                self.node_write(state="ended", outcome="stopped")
                if self.writer:
                    return self.finish(*(("cancelled", "cancelled") if outcome == "cancelled" else
                                         ("failed", "the run's time limit: the job was stopped")))
                continue  # join waits for the head's word
            if outcome == "regroup" and not self.peer_failed:  # (a member lost, or an error above)
                self.node_write(state="ended", outcome="stopped")
                stopped = True
                if self.writer:
                    self.hand_on()
                continue
            if outcome == "regroup":  # stopped because a member's job failed: an end, for the head to judge
                outcome = "stopped"
            self.node_write(state="ended", outcome=outcome, exit_code=record.get("exit_code"))
            if not self.writer:
                self.push_own_log()
                continue
            word = dict(record) if outcome != "stopped" else {"exit_code": None, "signal": None}
            done = self.settle(g, word)
            if done is not None:
                return done

    def hand_on(self) -> None:
        """The head stopped its job to start again: the checkpoint the job wrote on SIGTERM and the
        record (the attempt "regroup") for the next generation, while this instance still heads the
        latest one (else a newer head owns them: it writes nothing, and is a worker from now on)."""
        try:
            now_g, _ = self.read_gang()
        except Exception as exc:
            self.log(f"gang.json not read: {type(exc).__name__}: {exc}"[:300])
            now_g = None
        if now_g is not None and now_g["generation"] != self.generation and now_g["members"][0] != self.iid:
            self.writer = False
            return
        try:
            self.check_superseded()
            self.push(settled=False)
            self.try_save()
        except Superseded:
            self.writer = False

    def settle(self, g: dict[str, Any], record: dict[str, Any], wait: bool = True) -> int | None:
        """The head, its own job ended in generation ``g`` (``record``: its exit code and signal):
        wait for every member's (gang.decide), then end the run (succeeded; failed with the
        restarts used up: its exit code) or go on (None: a member is lost and the checkpoints are
        up, or a restart was formed, or the others formed a generation). When the head's own job
        failed, the others get SETTLE_S seconds (at least the stale time: a member that died hard
        is lost, not failed) to end theirs, then the attempt failed. ``wait`` False: one look (from
        ``join``, where this head keeps judging ``g`` until a generation is formed)."""
        bound = max(SETTLE_S, self.stale_s + gang.HEARTBEAT_S)
        failed_by = record.setdefault("failed_by", self.clock() + bound) \
            if record.get("exit_code") != 0 or record.get("signal") else None
        while True:
            if self.cancelled():
                return self.finish("cancelled", "cancelled")
            if self.spec["limit_at"] is not None and self.clock() >= self.spec["limit_at"]:
                return self.finish("failed", "the run's time limit")
            word, etag = None, None
            try:
                now_g, etag = self.read_gang()
                if now_g is not None and now_g["generation"] != g["generation"]:
                    if now_g["members"][0] == self.iid:
                        self.hand_on()  # the others formed the next one: this head's last word goes first
                    self.writer = now_g["members"][0] == self.iid
                    return None
                word = gang.decide(g, self.read_nodes(), self.s3_now(), self.stale_s)
                if word is None and failed_by is not None and self.clock() >= failed_by:
                    word = "failed"
            except Exception as exc:
                self.log(f"the members' ends not read: {type(exc).__name__}: {exc}"[:300])
            if word == "succeeded":
                return self.finish("succeeded", None)
            if word == "lost":
                if self.handed_on != g["generation"]:
                    self.handed_on = g["generation"]
                    self.hand_on()
                return None
            if word == "failed":
                failed = []
                for i, m in enumerate(g["members"]):
                    r = self.records.get(m) or {}
                    ended = gang.ended_in(r or None, g["generation"])
                    if not ended or r.get("outcome") == "failed":
                        failed.append(f"rank {i} ({'exit ' + str(r.get('exit_code')) if ended else 'still running'})")
                where = ", ".join(failed) or "a rank"
                if self.status["restarts_on_errors"] >= self.spec["max_restarts_on_errors"]:
                    return self.finish("failed", f"the job failed on {where} with "
                                                 f"{self.status['restarts_on_errors']} restart(s) on errors used")
                new = gang.propose(g, self.records, self.spec["nodes"], self.s3_now(), self.stale_s,
                                   restart="restart", floor=g["generation"])
                if new is not None and new["reason"] == "restart" and self.form(new, etag):
                    self.status["restarts_on_errors"] += 1
                    self.log(f"the job failed on {where}: restart {self.status['restarts_on_errors']} of "
                             f"{self.spec['max_restarts_on_errors']}, all nodes together")
                    self.hand_on()
                    return None
                # not formed (S3 did not take it, or a member was lost meanwhile): looked at again
            if not wait:
                return None
            self.sleep(self.poll_s)


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
        check_run_id(args.run_id)
        check_user(args.user)
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
