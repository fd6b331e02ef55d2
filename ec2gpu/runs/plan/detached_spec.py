"""What a detached run's agent runs: spec.json, made and checked here, before anything is opened.

The plan (runs/plan/runplan.py) builds the spec of a detached run with placeholder ids of the
longest form the real ones can take (``check``), so that a spec the agent would refuse, or one over
the MAX_SPEC_BYTES it reads, is refused with the plan's other refusals: in a dry run as in a real
one, before the credentials are checked. runs/detached/launch.py builds the real one with the
caller's user id, the run's id and its deadline (``spec_document``, ``spec_body``) and uploads it.

Pure: no AWS SDK, no network; the run store's key names come from wire/names.py, as the agent's do.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ...tasks import mounts as file_mounts
from ...wire import names, run_spec
from . import checks, limits

if TYPE_CHECKING:
    from ..job import TaskJob
    from ..options import RunOptions

#: instances a detached run may launch in all (first plus replacements) when --max-attempts is not
#: given: a spot run rides out several interruptions; an on-demand one gets one replacement
#: (an instance AWS retired, a failed status check)
DEFAULT_LAUNCHES = {True: 10, False: 2}
#: the most bytes of spec.json the agent reads
MAX_SPEC_BYTES = run_spec.MAX_BYTES
#: ``check``'s stand-ins: a user id of the longest form names.USER_ID takes (128 characters), a run
#: id of the one length run ids have; a spec that fits with these fits with the real ones
PLACEHOLDER_USER = "A" * 128
PLACEHOLDER_RUN_ID = "00000000-000000-0000"


def launches(opts: RunOptions) -> int:
    """The instances the run may launch in all: --max-attempts, else DEFAULT_LAUNCHES per node."""
    return opts.max_attempts or DEFAULT_LAUNCHES[opts.spot] * opts.nodes


def secret_env(job: TaskJob) -> dict[str, str]:
    """The task's secrets that have a value (pure): name -> value, for SSM Parameter Store
    (runs/plan/checks.secret_env)."""
    return checks.secret_env(job.env, job.task.secrets)


def mount_key(user: str, run_id: str, index: int, is_file: bool) -> str:
    """Where the local file_mounts source number ``index`` is uploaded (pure):
    ``runs/USER_ID/RUN_ID/mounts/N`` for a file, ``.../mounts/N.tar.gz`` for a directory."""
    return f"{names.run_prefix(user, run_id)}{names.MOUNTS}{index}" + ("" if is_file else ".tar.gz")


def spec_body(spec: dict[str, Any]) -> bytes:
    """spec.json's bytes as uploaded (pure): launch.boot_script hands their sha256 to the agent.
    Raises UsageError when they are over MAX_SPEC_BYTES, which the agent would refuse on the
    instance after everything was made, naming the fields that make it large."""
    body = json.dumps(spec, indent=2, sort_keys=True).encode()
    if len(body) <= MAX_SPEC_BYTES:
        return body
    sizes = sorted(((len(json.dumps(v)), k) for k, v in spec.items()), reverse=True)[:3]
    envs: dict[str, Any] = spec["envs"] if isinstance(spec.get("envs"), dict) else {}
    largest = sorted(envs, key=lambda k: -len(json.dumps(envs[k])))[:3]
    raise UsageError(f"the run's spec would be {len(body):,} bytes, over the {MAX_SPEC_BYTES:,} a detached run's "
                     "agent reads: " + ", ".join(f"{k} {n:,} bytes" for n, k in sizes)
                     + (f" (largest environment variables: {', '.join(largest)})"
                        if largest and "envs" in [k for _, k in sizes] else ""),
                     "keep large values out of envs, the command and the setup: put them in a file of the workdir")


def spec_document(job: TaskJob, opts: RunOptions, user: str, run_id: str, group: str, deadline: datetime,
                  max_launches: int, log_reader: str | None = None) -> dict[str, Any]:
    """spec.json (pure): what the agent on each instance of the run runs, checked by the schema the
    agent reads it with (wire/run_spec.py: its docstring has the fields). ``deadline``: when the group's scheduled action sets
    it to 0 (UTC); the job gets SIGTERM ``limits.lead_seconds`` before it (its grace to checkpoint,
    then the time its outputs, log and status take to reach S3 and the agent to end the group:
    the same lead a run in the foreground gets before its instance's shutdown), SIGKILL after its
    grace (runs/plan/limits.py). The secrets' values are not in it: ``secrets`` names them, and
    the agent reads each from its parameter (aws/parameters.name_of). ``log_reader``: the SSH user,
    who may read the job's log on the instance (`ec2gpu logs --follow`, live). Raises UsageError for
    a spec the agent would refuse on the instance (run_spec.parse), before anything is made."""
    minutes = max(1, opts.max_runtime_minutes or 0)
    grace, lead = limits.grace_seconds(minutes), limits.lead_seconds(minutes)
    secret = secret_env(job)
    prefix = names.run_prefix(user, run_id)
    doc = {
        "version": 1, "run_id": run_id, "name": job.name, "group": group,
        "setup": job.task.setup, "run": job.task.run, "args": list(job.args),
        "envs": {k: v for k, v in job.env.items() if k not in secret}, "secrets": sorted(secret),
        "workdir_key": prefix + names.WORKDIR,
        "outputs": list(job.task.outputs), "checkpoint_dir": job.task.checkpoint_dir,
        "max_restarts_on_errors": job.task.resources.max_restarts_on_errors, "max_launches": max_launches,
        "nodes": opts.nodes,
        "limit_at": deadline.timestamp() - lead, "limit_grace_s": grace, "spot": opts.spot,
        "mounts": mounts_document(job, user, run_id), "log_reader": log_reader,
    }
    try:
        run_spec.parse(doc, run_id, prefix)
    except names.Refused as exc:
        raise UsageError(f"a detached run's agent would refuse this run: {exc}",
                         "fix the task file or the flags named (docs/detached.md has what a detached run takes)") from None
    return doc


def mounts_document(job: TaskJob, user: str, run_id: str) -> list[dict[str, Any]]:
    """spec.json's ``mounts`` (pure): one entry per file_mounts entry, in order, its target in
    tasks/mounts.normal_target's spelling (``~/x`` or ``/x``): a local source as the key it is
    uploaded to (``mount_key``); an S3 one as its bucket, prefix and the bucket's region
    (resources.check_s3_access finds it; us-east-1 until then), ``file`` when the prefix is one
    object, and ``write_back`` for the MOUNT modes."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(job.mounts):
        target = file_mounts.normal_target(m.target)
        if m.kind == "local":
            out.append({"target": target, "kind": "local", "key": mount_key(user, run_id, i, m.is_file),
                        "is_file": m.is_file})
        else:
            out.append({"target": target, "kind": "s3", "bucket": m.bucket, "prefix": m.prefix,
                        "region": job.bucket_regions.get(m.bucket or "") or "us-east-1",
                        "file": m.target in job.s3_files, "write_back": m.write_back})
    return out


def check(job: TaskJob, opts: RunOptions, ssh_user: str | None) -> None:
    """Refuse (UsageError) the detached run of ``job`` as ``opts`` ask when its spec, made with
    PLACEHOLDER_USER and PLACEHOLDER_RUN_ID, is one the agent would refuse or is over
    MAX_SPEC_BYTES: the plan's check, before any backend is opened. The real spec is made again
    by the launch with the real ids (no longer than these), so what passes here passes there."""
    run_id = PLACEHOLDER_RUN_ID
    deadline = datetime.now(timezone.utc) + timedelta(minutes=opts.max_runtime_minutes or 0)
    spec_body(spec_document(job, opts, PLACEHOLDER_USER, run_id, names.GROUP_PREFIX + run_id, deadline,
                            launches(opts), ssh_user))
