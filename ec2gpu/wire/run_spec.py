"""A detached run's spec.json: what its agent runs, one schema for the controller that writes it
(runs/plan/detached_spec.spec_document checks its document here before anything is made) and the agent
that reads it back from S3 (agent/detached.py: hostile input, anyone holding the run's role may
have rewritten the object; the agent also checks its sha256 against the launch template's).

Standard library only: shipped flat beside the detached agent (runs/detached/launch.AGENT_FILES),
which imports it as ``run_spec``; the controller imports ``ec2gpu.wire.run_spec``.

spec.json (JSON object; unknown fields are ignored, a field of the wrong type refuses the spec):
``version`` 1; ``run_id`` (must equal the agent's --run-id); ``name`` (the task's, [A-Za-z0-9._-],
1-128); ``setup`` (shell or null: run once per instance, before the job); ``run`` (shell, required);
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
``ec2gpu-<run_id>``, aws/groups.name_of); ``nodes`` (1-MAX_NODES: the group's size; above 1 the nodes
run the job together, agent/gang.py, and ``max_launches`` counts every node's launches); ``limit_at``
(POSIX seconds or null: the job gets SIGTERM then, agent.py --limit-at, and is not restarted);
``limit_grace_s`` (seconds from limit_at to the instance's end, default 120);
``gpus_limit`` (int or null: the GPUs the job may use when
the instance has more, resources.allow_larger); ``python`` (absolute path or null: EC2GPU_PYTHON;
null: the Deep Learning AMI's PyTorch Python when there, else python3); ``mounts`` (list, default []:
the task's file_mounts, runs/plan/detached_spec.mounts_document: each ``target`` ``~/PATH`` or
``/PATH`` (no ``..``; an absolute one under EC2GPU_SANDBOX_ROOT in the sandbox) and ``kind``
"local" (``key`` under ``runs/<user>/<run_id>/``, ``is_file``: the file itself, else a gzipped tar unpacked
with the workdir's rules) or "s3" (``bucket``, ``prefix``, ``region``, ``file``, ``write_back``:
copied in by agent/s3files.py with the instance role; the MOUNT modes' written back with the
checkpoints every ``--every`` seconds, on a spot notice and at the end). They are put in place
once per instance, before the setup; ``log_reader`` (a user name or null: the SSH user, whom the
agent lets read job.log, and nothing else of the run's directory, so `ec2gpu logs RUN --follow`
reads it live over SSH: agent/prepare.share_log).
"""
from __future__ import annotations

import importlib
import math
import re
from typing import Any

if __package__:  # in the package (the controller, the tests)
    from . import names
else:  # on the instance: names.py beside this file (runs/detached/launch.AGENT_FILES)
    names = importlib.import_module("names")

NAME = "spec.json"  # its key under the run's prefix (aws/runstore.spec_key)
VERSION = 1
MAX_BYTES = 1024 * 1024  # the most of spec.json the agent reads; the controller refuses a larger one
MAX_SCRIPT_BYTES = 100 * 1024  # tasks/spec.MAX_SCRIPT_BYTES
MAX_SECRETS = 100  # names in ``secrets``
MAX_NODES = 64  # cli --nodes' maximum
MAX_MOUNTS = 100
MAX_LAUNCHES = 1000  # max_launches; runs/plan/checks.check_detached refuses a larger --max-attempts
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a file_mounts target as the controller writes it (tasks/mounts.TARGET_RE, normal_target's spelling)
TARGET_RE = re.compile(r"(~/|/)[A-Za-z0-9._+@,=/-]{0,1022}")
BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # tasks/mounts.BUCKET_RE
READER_RE = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,31}")  # a POSIX user name, as useradd takes it
PYTHON_RE = re.compile(r"[A-Za-z0-9._/+-]{1,512}")
Refused = names.Refused


def _getter(data: dict[str, Any]) -> Any:
    """get(name, kinds, default, required): ``data``'s field of one of ``kinds``, else Refused."""
    def get(name: str, kinds: tuple[type, ...], default: Any = None, required: bool = False) -> Any:
        v = data.get(name, default)
        if v is None and not required:
            return None
        if not isinstance(v, kinds) or isinstance(v, bool) and bool not in kinds:
            raise Refused(f"spec.json: {name} is {type(v).__name__}, not {'/'.join(k.__name__ for k in kinds)}")
        return v
    return get


def parse(data: object, run_id: str, prefix: str) -> dict[str, Any]:
    """spec.json checked (module docstring) -> a dict with every field, defaults filled; every key
    it names must lie under ``prefix`` (the run's, names.run_prefix). Refused for anything else."""
    if not isinstance(data, dict):
        raise Refused("spec.json is not a JSON object")
    get = _getter(data)
    if names.check_run_id(data.get("run_id")) != run_id:
        raise Refused(f"spec.json is for run {data.get('run_id')!r}, not {run_id}")
    name = get("name", (str,), required=True)
    if not NAME_RE.fullmatch(name):
        raise Refused(f"spec.json: name {name[:80]!r} is not [A-Za-z0-9._-]{{1,128}}")
    run, setup = _scripts(get)
    args = get("args", (list,), [])
    envs = get("envs", (dict,), {})
    if not all(isinstance(a, str) and "\0" not in a for a in args):
        raise Refused("spec.json: args must be strings")
    for k, v in envs.items():
        if not ENV_NAME_RE.fullmatch(k) or not isinstance(v, str) or "\0" in v:
            raise Refused(f"spec.json: envs: {k[:80]!r} is not NAME: string")
    workdir_key = get("workdir_key", (str,))
    if workdir_key is not None and (not workdir_key.startswith(prefix) or names.safe_rel(workdir_key) is None):
        raise Refused(f"spec.json: workdir_key {workdir_key[:120]!r} is not under {prefix}")
    outputs = get("outputs", (list,), [])
    if not all(isinstance(g, str) and names.safe_rel(g.removeprefix("!").strip("/") or "x") is not None
               for g in outputs):
        raise Refused("spec.json: outputs must be relative globs inside $EC2GPU_OUTPUT_DIR")
    checkpoint_dir = get("checkpoint_dir", (str,))
    if checkpoint_dir is not None and names.safe_rel(checkpoint_dir.rstrip("/")) is None:
        raise Refused("spec.json: checkpoint_dir must be a relative path inside the workdir")
    reader = data.get("log_reader")  # a convenience (`logs --follow`, live): one that is not a user name is none
    return {"run_id": run_id, "name": name, "setup": setup, "run": run, "args": list(args), "envs": dict(envs),
            "workdir_key": workdir_key, "outputs": list(outputs), "checkpoint_dir": checkpoint_dir,
            **_limits(get, run_id), "secrets": _secret_names(get), "mounts": parse_mounts(get("mounts", (list,), []),
                                                                                         prefix),
            "log_reader": reader if isinstance(reader, str) and READER_RE.fullmatch(reader) else None}


def _scripts(get: Any) -> tuple[str, str | None]:
    """spec.json's ``run`` and ``setup``: each at most MAX_SCRIPT_BYTES without a NUL, run not empty."""
    run = get("run", (str,), required=True)
    setup = get("setup", (str,))
    for what, script in (("run", run), ("setup", setup or "")):
        if len(script.encode("utf-8", "surrogatepass")) > MAX_SCRIPT_BYTES or "\0" in script:
            raise Refused(f"spec.json: {what} is over {MAX_SCRIPT_BYTES} bytes or has a NUL")
    if not run.strip():
        raise Refused("spec.json: run is empty")
    return run, setup


def _limits(get: Any, run_id: str) -> dict[str, Any]:
    """spec.json's bounds on the run: restarts, launches, group, nodes, time limit, GPUs, Python."""
    restarts = get("max_restarts_on_errors", (int,), 0)
    launches = get("max_launches", (int,), 10)
    if not 0 <= restarts <= 1000 or not 1 <= launches <= MAX_LAUNCHES:
        raise Refused(f"spec.json: max_restarts_on_errors must be 0-1000 and max_launches 1-{MAX_LAUNCHES}")
    group = get("group", (str,), names.GROUP_PREFIX + run_id)
    if group != names.GROUP_PREFIX + run_id:
        raise Refused(f"spec.json: group {group[:120]!r} is not this run's ({names.GROUP_PREFIX}{run_id})")
    nodes = get("nodes", (int,), 1)
    if not 1 <= nodes <= MAX_NODES:
        raise Refused(f"spec.json: nodes must be 1-{MAX_NODES}")
    limit_at = get("limit_at", (int, float))
    grace = get("limit_grace_s", (int, float), 120.0)
    if limit_at is not None and not math.isfinite(limit_at) or not (math.isfinite(grace) and 0 <= grace <= 86400):
        raise Refused("spec.json: limit_at must be a finite time and limit_grace_s 0-86400 seconds")
    gpus_limit = get("gpus_limit", (int,))
    if gpus_limit is not None and gpus_limit < 1:
        raise Refused("spec.json: gpus_limit must be at least 1")
    python = get("python", (str,))
    if python is not None and (not python.startswith("/") or not PYTHON_RE.fullmatch(python)):
        raise Refused("spec.json: python must be an absolute path")
    return {"max_restarts_on_errors": restarts, "max_launches": launches, "group": group, "nodes": nodes,
            "limit_at": None if limit_at is None else float(limit_at), "limit_grace_s": float(grace),
            "gpus_limit": gpus_limit, "python": python}


def _secret_names(get: Any) -> list[str]:
    names_ = get("secrets", (list,), [])
    if (len(names_) > MAX_SECRETS or len(set(map(str, names_))) != len(names_)
            or not all(isinstance(n, str) and len(n) <= 128 and ENV_NAME_RE.fullmatch(n) for n in names_)):
        raise Refused(f"spec.json: secrets must be at most {MAX_SECRETS} distinct environment variable names")
    return list(names_)


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
            out.append({"target": target, "kind": kind, **_local_mount(m, run_prefix)})
        elif kind == "s3":
            out.append({"target": target, "kind": kind, **_s3_mount(m)})
        else:
            raise Refused(f"spec.json: mount kind {str(kind)[:40]!r} is not local or s3")
    return out


def _local_mount(m: dict[str, Any], run_prefix: str) -> dict[str, Any]:
    key, is_file = m.get("key"), m.get("is_file")
    if not isinstance(key, str) or not key.startswith(f"{run_prefix}mounts/") or names.safe_rel(key) is None:
        raise Refused(f"spec.json: mount key {str(key)[:120]!r} is not under {run_prefix}mounts/")
    if not isinstance(is_file, bool):
        raise Refused("spec.json: a local mount's is_file must be true or false")
    return {"key": key, "is_file": is_file}


def _s3_mount(m: dict[str, Any]) -> dict[str, Any]:
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
    return {"bucket": bucket, "prefix": prefix, "region": region, "file": flags[0], "write_back": flags[1]}


def on_instance(target: str, home: str, root: str = "") -> str:
    """The absolute path of ``target`` (``~/x`` or ``/x``) on this instance (pure):
    tasks/mounts.on_instance's rule (a test compares them)."""
    if target.startswith("~/"):
        return f"{home.rstrip('/')}/{target[2:]}"
    return f"{root.rstrip('/')}{target}" if root else target
