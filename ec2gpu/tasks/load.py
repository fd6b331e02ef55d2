"""Task files: YAML -> Task, with errors that name the file, the line and the field.

Two formats are read: ec2gpu's own (spec.py, docs/tasks.md) and the common subset of SkyPilot's
task YAML (https://docs.skypilot.co/en/latest/reference/yaml-spec.html): ``name``, ``workdir``,
``setup``, ``run``, ``envs``, ``secrets``, ``num_nodes``, ``resources.accelerators`` (``T4:1`` or
``{T4: 1}``), ``resources.instance_type``, ``resources.use_spot``, ``resources.disk_size``.
SkyPilot fields ec2gpu does not support are named in one warning line, never silently dropped;
anything else unknown is an error.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..errors import UsageError
from .spec import Task

#: SkyPilot fields with no ec2gpu meaning: warned about and ignored
SKYPILOT_UNSUPPORTED = {"file_mounts", "volumes", "config", "service", "event_callback", "num_gpus", "docker",
                        "experimental", "pool"}
SKYPILOT_UNSUPPORTED_RESOURCES = {"cloud", "infra", "region", "zone", "accelerator_args", "cpus", "memory",
                                  "job_recovery", "disk_tier", "network_tier", "ports", "labels", "any_of",
                                  "ordered", "image_id", "autostop", "priority"}
#: SkyPilot name -> ec2gpu name
SKYPILOT_RENAMES = {("num_nodes",): ("nodes",), ("resources", "use_spot"): ("resources", "spot"),
                    ("resources", "disk_size"): ("resources", "disk_gib"),
                    ("resources", "accelerators"): ("resources", "gpu")}
DOCS = "see docs/tasks.md for every field"


@dataclass
class LoadedTask:
    """A validated task and where it came from. ``workdir`` is absolute (None: nothing to sync)."""

    task: Task
    path: Path | None
    workdir: Path | None
    warnings: list[str] = field(default_factory=list)
    skypilot: bool = False


def _lines(node, path=(), out=None) -> dict[tuple, int]:
    """{field path: 1-based line} for every mapping key and sequence item of a composed YAML node."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = path + (key.value,)
            out[sub] = key.start_mark.line + 1
            _lines(value, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, path + (i,), out)
    return out


def _line_of(lines: dict, loc: tuple) -> int:
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def _from_skypilot(data: dict, warnings: list[str]) -> tuple[dict, dict]:
    """SkyPilot's names -> ours; unsupported fields dropped and named. Returns (data, {ours: theirs})."""
    data, renamed = dict(data), {}
    dropped = sorted(k for k in data if k in SKYPILOT_UNSUPPORTED)
    for k in dropped:
        data.pop(k)
    res = data.get("resources")
    if isinstance(res, dict):
        res = data["resources"] = dict(res)
        gone = sorted(k for k in res if k in SKYPILOT_UNSUPPORTED_RESOURCES)
        for k in gone:
            res.pop(k)
        dropped += [f"resources.{k}" for k in gone]
        acc = res.get("accelerators")
        if isinstance(acc, dict) and len(acc) == 1:
            (model, count), = acc.items()
            res["accelerators"] = f"{model}:{count}"
    for theirs, ours in SKYPILOT_RENAMES.items():
        src = data if len(theirs) == 1 else data.get(theirs[0])
        if isinstance(src, dict) and theirs[-1] in src:
            src[ours[-1]] = src.pop(theirs[-1])
            renamed[ours] = theirs
    if isinstance(data.get("secrets"), dict):  # SkyPilot: a map like envs, values hidden
        secrets = data.pop("secrets")
        data["envs"] = {**(data.get("envs") or {}), **secrets}
        data["secrets"] = list(secrets)
    if dropped:
        warnings.append(f"ignored SkyPilot field(s) ec2gpu does not support: {', '.join(dropped)}")
    return data, renamed


def _is_skypilot(data: dict) -> bool:
    res = data.get("resources") if isinstance(data.get("resources"), dict) else {}
    return ("num_nodes" in data or any(k in data for k in SKYPILOT_UNSUPPORTED) or isinstance(data.get("secrets"), dict)
            or any(k in res for k in ("accelerators", "use_spot", "disk_size", *SKYPILOT_UNSUPPORTED_RESOURCES)))


def _stringify_envs(data: dict) -> None:
    """YAML reads `EPOCHS: 3` as a number; environment values are text."""
    envs = data.get("envs")
    if isinstance(envs, dict):
        data["envs"] = {k: (v if v is None or isinstance(v, str) else
                            str(v).lower() if isinstance(v, bool) else str(v)) for k, v in envs.items()}


def parse(text: str, source: str = "<task>", base: Path | None = None) -> LoadedTask:
    """Validate the YAML ``text`` of a task; ``base`` is the directory relative paths start from.

    Raises UsageError (exit 2) with "SOURCE:LINE: FIELD: what is wrong" and a hint.
    """
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = min(mark.line + 1 if mark else 1, max(1, len(text.rstrip().splitlines())))  # not past the end
        raise UsageError(f"{source}:{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}",
                         "check the indentation and quoting on that line")
    if not isinstance(data, dict):
        raise UsageError(f"{source}:1: a task file is a YAML mapping (name:, run:, ...)", DOCS)
    lines = _lines(node) if node is not None else {}
    warnings: list[str] = []
    skypilot = _is_skypilot(data)
    renamed: dict = {}
    if skypilot:
        data, renamed = _from_skypilot(data, warnings)
    _stringify_envs(data)
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, source, lines, renamed)
    base = base or Path.cwd()
    workdir = None if task.workdir is None else (base / task.workdir).resolve()
    if workdir is not None and not workdir.is_dir():
        raise UsageError(f"{source}:{_line_of(lines, ('workdir',))}: workdir: {workdir} is not a directory",
                         "workdir is relative to the task file's directory; null syncs nothing")
    _check_gpu(task, source, lines, renamed)
    return LoadedTask(task, None, workdir, warnings, skypilot)


def _first_error(exc: ValidationError, source: str, lines: dict, renamed: dict) -> UsageError:
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    ours = next((o for o in renamed if loc[:len(o)] == o), None)
    shown = renamed[ours] + loc[len(ours):] if ours else loc  # the file's own names (num_nodes, not nodes)
    name = ".".join(str(p) for p in shown) or "task"
    line = _line_of(lines, shown)
    if err["type"] == "extra_forbidden":
        parent = Task.model_fields if len(loc) == 1 else Task.model_fields["resources"].annotation.model_fields
        return UsageError(f"{source}:{line}: {name}: unknown field",
                          f"known fields here: {', '.join(parent)}; {DOCS}")
    if err["type"] == "missing":
        return UsageError(f"{source}:{line}: {name}: missing", f"add `{loc[-1]}:`; {DOCS}")
    msg = err["msg"].removeprefix("Value error, ")
    return UsageError(f"{source}:{line}: {name}: {msg}", DOCS)


def _check_gpu(task: Task, source: str, lines: dict, renamed: dict) -> None:
    from . import resolve
    gpu = task.resources.gpu
    if gpu and not task.resources.instance_types:
        try:
            resolve.instance_type_for_gpu(gpu)
        except UsageError as exc:
            loc = renamed.get(("resources", "gpu"), ("resources", "gpu"))
            raise UsageError(f"{source}:{_line_of(lines, loc)}: {'.'.join(loc)}: {exc.message}", exc.hint)


def load(path: str | Path) -> LoadedTask:
    """Read and validate the task file at ``path``; relative paths in it start at its directory.

    Raises UsageError for a missing or unreadable file and for every problem ``parse`` finds.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such task file", "give the path of a YAML task file (examples/ has some)")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot be read: {exc}", "give the path of a readable YAML task file")
    loaded = parse(text, str(path), path.resolve().parent)
    loaded.path = path.resolve()
    return loaded


def env_values(task: Task, environ=os.environ) -> dict[str, str]:
    """The task's environment: its envs, a null value taken from ``environ``.

    Raises UsageError naming a variable that is null in the task and unset here.
    """
    out = {}
    for k, v in task.envs.items():
        if v is None:
            if k not in environ:
                raise UsageError(f"envs: {k} is null (taken from this machine) but not set here",
                                 f"export {k}=... before running, or give it a value in the task file")
            v = environ[k]
        out[k] = v
    return out
