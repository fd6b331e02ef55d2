"""Task files: YAML -> Task, with errors that name the file, the line and the field.

Two formats are read: ec2gpu's own (spec.py, docs/tasks.md) and the common subset of SkyPilot's
task YAML (https://docs.skypilot.co/en/latest/reference/yaml-spec.html): ``name``, ``workdir``,
``setup``, ``run``, ``envs``, ``secrets``, ``num_nodes``, ``resources.accelerators`` (``T4:1`` or
``{T4: 1}``), ``resources.instance_type``, ``resources.use_spot``, ``resources.disk_size``.
SkyPilot fields ec2gpu does not support are named in one warning line, never silently dropped;
anything else unknown is an error.

A task file is untrusted input: it is read at most MAX_TASK_BYTES, composed once by a loader that
refuses YAML bombs (_BoundedLoader), and the directory it asks to send goes through
``check_local_source`` (never the home directory or a credentials directory; outside the task
file's own directory only with --workdir-outside).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..errors import UsageError
from .spec import ENV_NAME_RE, Task

MAX_TASK_BYTES = 1 << 20  # a task file holds at most 1 MiB
MAX_ALIASES = 100  # alias uses (*name) in one task file
MAX_DEPTH = 64  # nesting levels of mappings and sequences
MAX_NODES = 100_000  # values in a task file once its aliases are expanded
OUTSIDE_FLAG = "--workdir-outside"
#: directories under the home directory that hold credentials, as each tool documents them: a
#: directory inside one, or holding one, is never sent (not even with --workdir-outside)
CREDENTIAL_DIRS = (
    ".aws", ".ssh", ".gnupg",  # AWS CLI config/credentials; OpenSSH keys; GnuPG's keyrings
    ".kube", ".docker",  # kubectl's kubeconfig; docker login's config.json
    ".config/gcloud", ".azure", ".config/gh",  # gcloud, az and gh credentials
    ".password-store", ".local/share/keyrings", "Library/Keychains",  # pass; GNOME keyring; macOS keychains
    ".terraform.d",  # terraform login's credentials.tfrc.json
    ".mozilla", ".config/google-chrome", ".config/chromium",  # browser cookies and saved logins
    ".ec2gpu",  # ec2gpu's own run keys (settings.home's default)
)

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


class _TooComplex(yaml.MarkedYAMLError):
    """A task file past MAX_ALIASES, MAX_DEPTH or MAX_NODES (its mark gives the line)."""


class _BoundedLoader(yaml.SafeLoader):
    """yaml's SafeLoader refusing YAML bombs while it composes: more than MAX_ALIASES alias uses,
    nesting deeper than MAX_DEPTH, more than MAX_NODES values once aliases are expanded ("billion
    laughs"), an alias inside its own anchor. Raises _TooComplex at the node that crosses a bound."""

    def __init__(self, stream):
        super().__init__(stream)
        self.aliases = self.depth = self.expanded = 0
        self.weights: dict = {}  # node -> how many values it stands for, expanded

    def _refuse(self, event, problem: str):
        return _TooComplex(problem=problem, problem_mark=event.start_mark)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise self._refuse(event, f"more than {MAX_ALIASES} aliases (*name)")
            if node not in self.weights:
                raise self._refuse(event, f"the alias *{event.anchor} is inside its own anchor (a loop)")
            self.expanded += self.weights[node]
        else:
            self.depth, self.expanded, before = self.depth + 1, self.expanded + 1, self.expanded
            if self.depth > MAX_DEPTH:
                raise self._refuse(event, f"nested deeper than {MAX_DEPTH} levels")
            node = super().compose_node(parent, index)
            self.depth, self.weights[node] = self.depth - 1, self.expanded - before
        if self.expanded > MAX_NODES:
            raise self._refuse(event, f"more than {MAX_NODES:,} values once its aliases are expanded")
        return node


def _compose(text: str, source: str):
    """(line map (_lines), data) of the YAML ``text``: composed once (_BoundedLoader), the data
    built from that same node.

    Raises UsageError "SOURCE:LINE: ..." for text that is not YAML or crosses a bound.
    """
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        lines = _lines(node) if node is not None else {}  # before construction merges `<<:` keys in place
        return lines, (loader.construct_document(node) if node is not None else None)
    except _TooComplex as exc:
        raise UsageError(f"{source}:{exc.problem_mark.line + 1}: refused: {exc.problem}",
                         "write the task out plainly: a task file needs few aliases and little nesting")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = min(mark.line + 1 if mark else 1, max(1, len(text.rstrip().splitlines())))  # not past the end
        raise UsageError(f"{source}:{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}",
                         "check the indentation and quoting on that line")
    finally:
        loader.dispose()


def _lines(node, path=(), out=None, seen=None) -> dict[tuple, int]:
    """{field path: 1-based line} for every mapping key and sequence item of a composed YAML node.
    A node met again (through an alias) is not descended into again: paths below it take its line."""
    out, seen = ({}, set()) if out is None else (out, seen)
    out.setdefault(path, node.start_mark.line + 1)
    if node in seen:
        return out
    seen.add(node)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = path + (key.value if isinstance(key, yaml.ScalarNode) else "?",)  # "?": a list or map as key
            out[sub] = key.start_mark.line + 1
            _lines(value, sub, out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, path + (i,), out, seen)
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


def _check_size(size: int, source: str) -> None:
    """Refuse (UsageError) a task file of more than MAX_TASK_BYTES (``size`` in bytes, or more)."""
    if size > MAX_TASK_BYTES:
        raise UsageError(f"{source}:1: refused: a task file holds at most {MAX_TASK_BYTES // 1024} KiB",
                         "keep data out of the task file: fetch it in setup, or send it in the workdir")


def parse(text: str, source: str = "<task>", base: Path | None = None, allow_outside: bool = False) -> LoadedTask:
    """Validate the YAML ``text`` of a task; ``base`` is the directory relative paths start from
    (default: the current one); its workdir may lie outside ``base`` only with ``allow_outside``.

    Raises UsageError (exit 2) with "SOURCE:LINE: FIELD: what is wrong" and a hint: also for a text
    over MAX_TASK_BYTES, a YAML bomb (_BoundedLoader) and a workdir ``check_local_source`` refuses.
    """
    _check_size(len(text), source)  # characters first: a huge text is never encoded
    _check_size(len(text.encode("utf-8", "surrogatepass")), source)
    lines, data = _compose(text, source)
    if not isinstance(data, dict):
        raise UsageError(f"{source}:1: a task file is a YAML mapping (name:, run:, ...)", DOCS)
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
    workdir = None if task.workdir is None else _workdir(task.workdir, base or Path.cwd(), allow_outside,
                                                          f"{source}:{_line_of(lines, ('workdir',))}: workdir")
    _check_gpu(task, source, lines, renamed)
    return LoadedTask(task, None, workdir, warnings, skypilot)


def _workdir(value: str, base: Path, allow_outside: bool, where: str) -> Path:
    """The task's workdir ``value`` resolved against ``base``, checked (``check_local_source``) and
    present. Raises UsageError starting with ``where`` ("FILE:LINE: workdir")."""
    try:
        workdir = check_local_source(base / value, base, allow_outside)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.message}", exc.hint)
    if not workdir.is_dir():
        raise UsageError(f"{where}: {workdir} is not a directory",
                         "workdir is relative to the task file's directory; null syncs nothing")
    return workdir


def check_local_source(path: str | Path, task_dir: str | Path | None = None, allow_outside: bool = False) -> Path:
    """``path`` resolved (links followed), when this machine may send it to an instance.

    Every local directory that goes up passes here: a task's workdir, the directory of
    ``ec2gpu run -- CMD``, and SkyPilot ``file_mounts`` sources when they are supported (they must
    come through this function). Pure apart from resolving links and reading $HOME (Path.home()).

    Raises UsageError (no file:line: the caller adds where it came from) when ``path`` is the home
    directory or holds it (``/``, ``/home``), lies inside or holds one of CREDENTIAL_DIRS (even with
    ``allow_outside``), or, given ``task_dir``, lies outside ``task_dir`` without ``allow_outside``.
    """
    path, home = Path(path).resolve(), Path.home().resolve()
    hint = "send your project's own directory (credentials reach a job through envs or --secret, never as files)"
    if home.is_relative_to(path):
        what = "your home directory" if path == home else f"a directory holding your home directory {home}"
        raise UsageError(f"{path} is {what}, with your credentials in it: refused", hint)
    for name in CREDENTIAL_DIRS:
        creds = (home / name).resolve()
        if path.is_relative_to(creds) or creds.is_relative_to(path):
            how = "is inside" if path.is_relative_to(creds) else "holds"
            raise UsageError(f"{path} {how} {creds}, a directory of credentials: refused", hint)
    if task_dir is not None and not allow_outside and not path.is_relative_to(Path(task_dir).resolve()):
        raise UsageError(f"{path} is outside {Path(task_dir).resolve()}, the task file's directory",
                         f"pass {OUTSIDE_FLAG} to send it anyway, or move the task file into that directory")
    return path


def check_env_name(name: str, what: str = "--env") -> str:
    """``name`` when it is an environment variable name (spec.ENV_NAME_RE: letters, digits, _,
    not starting with a digit) (pure). Raises UsageError naming ``what``, the flag it came from."""
    if not re.fullmatch(ENV_NAME_RE, name):
        raise UsageError(f"{what} {name!r}: not an environment variable name (letters, digits and _, "
                         "not starting with a digit)", "e.g. --env EPOCHS=3, --env WANDB_API_KEY, --secret HF_TOKEN")
    return name


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


def load(path: str | Path, allow_outside: bool = False) -> LoadedTask:
    """Read (UTF-8, at most MAX_TASK_BYTES) and validate the task file at ``path``; relative paths
    in it start at its directory, and its workdir may lie outside that only with ``allow_outside``.

    Raises UsageError for a missing, unreadable or oversize file and for every problem ``parse`` finds.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TASK_BYTES + 1)  # never more: the size is checked before it is all read
        _check_size(len(raw), str(path))
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such task file", "give the path of a YAML task file (examples/ has some)")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot be read: {exc}", "give the path of a readable YAML task file")
    loaded = parse(text, str(path), path.resolve().parent, allow_outside)
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
