"""Task files: YAML -> Task, with errors that name the file, the line and the field.

Two formats are read: ec2gpu's own (spec.py, docs/tasks.md) and the common subset of SkyPilot's
task YAML (https://docs.skypilot.co/en/latest/reference/yaml-spec.html), which skypilot.py puts in
ec2gpu's names first (its fields, and what each becomes, are listed there). ``parse`` reads the
YAML, tells the formats apart, validates the Task model (spec.py) and the local directories the
task sends; every error says ``FILE:LINE: FIELD`` (lines.py), in the file's own names.

YAML is read as SkyPilot reads it, and stricter: ``envs`` values YAML types as booleans or numbers
become the text Python's ``str`` makes of them, as SkyPilot's ``Task.from_yaml_config`` does
(``false`` -> ``False``, ``3`` -> ``3``, ``1.0`` -> ``1.0``); a key given twice in one mapping is
refused at its line (PyYAML would keep the last silently); several YAML documents (SkyPilot's
pipelines and job groups) are refused as such: ec2gpu runs one task per file.

A task file is untrusted input: it is read at most MAX_TASK_BYTES, composed once by a loader that
refuses YAML bombs (_BoundedLoader), and the directory it asks to send goes through
``check_local_source`` (never the home directory or a credentials directory; outside the task
file's own directory only with --workdir-outside).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, cast

import yaml
from pydantic import ValidationError

from ..aws import catalog
from .. import settings
from ..errors import UsageError
from . import mounts, resolve
from .tools import with_tools
from .infra import aws_infra as aws_infra  # api/tasks.py reads it here too
from .infra import zone_note as zone_note  # api/tasks.py reads it here (a re-export)
from .lines import DOCS, Lines, Loc, Renamed, in_words, line_of, names_hint
from .mounts import Mount, check_flag
from .skypilot import SKYPILOT_FIELDS, SKYPILOT_RESOURCE_FIELDS, from_skypilot, git_workdir, is_skypilot
from .spec import ENV_NAME_RE, Resources, Task
from .spec import MAX_PORTS as MAX_PORTS  # api/tasks.py reads it here (a re-export)

MAX_TASK_BYTES = 1 << 20  # a task file holds at most 1 MiB
MAX_ALIASES = 100  # alias uses (*name) in one task file
MAX_DEPTH = 64  # nesting levels of mappings and sequences
MAX_NODES = 100_000  # values in a task file once its aliases are expanded
#: characters of one integer in a task file: no field takes a longer one (disk sizes, ports, counts), and
#: Python refuses to read one of over 4,300 digits (sys.get_int_max_str_digits, CVE-2020-10735)
MAX_INT_CHARS = 100
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



@dataclass
class LoadedTask:
    """A validated task and where it came from. ``workdir`` is absolute (None: nothing to sync)."""

    task: Task
    path: Path | None
    workdir: Path | None
    warnings: list[str] = field(default_factory=list)
    skypilot: bool = False
    mounts: list[Mount] = field(default_factory=list)  # file_mounts made ready: tasks/mounts.Mount, in the file's order
    git: dict[str, str | None] | None = None  # SkyPilot's git workdir {url, ref}: cloned on each instance (engine.upload_node)
    #: uv, conda: the tools the task calls that the image may lack, installed on first use by the lines
    #: its setup starts with (tasks/tools.py), whichever way the task came (a file, a Task, a command)
    tools: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        setup, self.tools = with_tools(self.task.setup, self.task.run)
        if setup != self.task.setup:
            self.task = self.task.model_copy(update={"setup": setup})


class _TooComplex(yaml.MarkedYAMLError):  # type: ignore[misc]  # yaml has no type information here
    """A task file past MAX_ALIASES, MAX_DEPTH or MAX_NODES (its mark gives the line)."""


class _BoundedLoader(yaml.SafeLoader):  # type: ignore[misc]  # yaml has no type information here
    """yaml's SafeLoader refusing YAML bombs while it composes: more than MAX_ALIASES alias uses,
    nesting deeper than MAX_DEPTH, more than MAX_NODES values once aliases are expanded ("billion
    laughs"), an alias inside its own anchor. Raises _TooComplex at the node that crosses a bound."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = self.depth = self.expanded = 0
        self.weights: dict[Any, int] = {}  # node -> how many values it stands for, expanded

    def refuse(self, event: Any, problem: str) -> _TooComplex:
        return _TooComplex(problem=problem, problem_mark=event.start_mark)

    def construct_yaml_int(self, node: Any) -> Any:
        """An integer of at most MAX_INT_CHARS characters (yaml's own rules otherwise)."""
        if len(str(node.value)) > MAX_INT_CHARS:
            exc = _TooComplex(problem=f"a number of {len(str(node.value)):,} characters: no field takes one that long",
                              problem_mark=node.start_mark)
            exc.hint = "give a number a field can take, or quote it ('...') where the value is text"
            raise exc
        return super().construct_yaml_int(node)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise self.refuse(event, f"more than {MAX_ALIASES} aliases (*name)")
            if node not in self.weights:
                raise self.refuse(event, f"the alias *{event.anchor} is inside its own anchor (a loop)")
            self.expanded += self.weights[node]
        else:
            self.depth, self.expanded, before = self.depth + 1, self.expanded + 1, self.expanded
            if self.depth > MAX_DEPTH:
                raise self.refuse(event, f"nested deeper than {MAX_DEPTH} levels")
            node = super().compose_node(parent, index)
            self.depth, self.weights[node] = self.depth - 1, self.expanded - before
        if self.expanded > MAX_NODES:
            raise self.refuse(event, f"more than {MAX_NODES:,} values once its aliases are expanded")
        return node


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _compose(text: str, source: str) -> tuple[Lines, Any]:
    """(line map (_lines), data) of the YAML ``text``: composed once (_BoundedLoader), the data
    built from that same node.

    Raises UsageError "SOURCE:LINE: ..." for text that is not YAML or crosses a bound.
    """
    loader = _BoundedLoader(text)
    try:
        nodes = []
        while loader.check_node():  # every document, so several are refused as what they are
            node = loader.get_node()
            if node is not None and node.tag != "tag:yaml.org,2002:null":  # an empty document: nothing
                nodes.append(node)
        if len(nodes) > 1:
            raise UsageError(f"{source}:{nodes[1].start_mark.line + 1}: {len(nodes)} YAML documents (---): a SkyPilot "
                             "pipeline or job group; ec2gpu runs one task per file",
                             "put each task in a file of its own and run them one after another "
                             "(ec2gpu run a.yaml && ec2gpu run b.yaml)")
        node = nodes[0] if nodes else None
        _refuse_duplicate_keys(node, source)
        lines = _lines(node) if node is not None else {}  # before construction merges `<<:` keys in place
        return lines, (loader.construct_document(node) if node is not None else None)
    except _TooComplex as exc:
        raise UsageError(f"{source}:{exc.problem_mark.line + 1}: refused: {exc.problem}",
                         getattr(exc, "hint", None)
                         or "write the task out plainly: a task file needs few aliases and little nesting")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = min(mark.line + 1 if mark else 1, max(1, len(text.rstrip().splitlines())))  # not past the end
        raise UsageError(f"{source}:{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}",
                         "check the indentation and quoting on that line")
    finally:
        loader.dispose()


def _refuse_duplicate_keys(node: Any, source: str, path: Loc = (), seen: set[int] | None = None) -> None:
    """Raise UsageError "SOURCE:LINE: PATH: KEY given twice (first at line N)" for a key written twice
    in one mapping of the composed ``node`` (YAML 1.2 requires unique keys; PyYAML, and so SkyPilot,
    keeps the last silently). Keys merged in with ``<<:`` may repeat: overriding them is the point."""
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                where = ".".join(str(p) for p in path + (key.value,))
                if key.value in first:
                    raise UsageError(f"{source}:{key.start_mark.line + 1}: {where}: given twice (first at line "
                                     f"{first[key.value]})", "keep one: YAML keeps only the last, silently")
                first[key.value] = key.start_mark.line + 1
            _refuse_duplicate_keys(value, source, path + (key.value if isinstance(key, yaml.ScalarNode) else "?",),
                                   seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, source, path + (i,), seen)


def _lines(node: Any, path: Loc = (), out: Lines | None = None, seen: set[Any] | None = None) -> Lines:
    """{field path: 1-based line} for every mapping key and sequence item of a composed YAML node.
    A node met again (through an alias) is not descended into again: paths below it take its line."""
    out = {} if out is None else out
    seen = set() if seen is None else seen
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


def _stringify_envs(data: dict[str, Any]) -> None:
    """Environment values are text: a value YAML types as a boolean or a number becomes what
    Python's ``str`` makes of it, as SkyPilot does (sky/task.py, Task.from_yaml_config: ``str(v)``
    for every value that is not null): ``false`` -> ``False``, ``3`` -> ``3``, ``1.0`` -> ``1.0``.
    A null value stays null (taken from this machine). Keys are made text the same way."""
    envs = data.get("envs")
    if isinstance(envs, dict):
        data["envs"] = {str(k): (v if v is None or isinstance(v, str) else str(v)) for k, v in envs.items()}


def _check_size(size: int, source: str) -> None:
    """Refuse (UsageError) a task file of more than MAX_TASK_BYTES (``size`` in bytes, or more)."""
    if size > MAX_TASK_BYTES:
        raise UsageError(f"{source}:1: refused: a task file holds at most {MAX_TASK_BYTES // 1024} KiB",
                         "keep data out of the task file: fetch it in setup, or send it in the workdir")


def parse(text: str, source: str = "<task>", base: Path | None = None, allow_outside: bool = False,
          overrides: dict[str, Any] | None = None, infra: str | None = None,
          envs: Mapping[str, str | None] | None = None, environ: Mapping[str, str] = os.environ,
          allow_write: Iterable[str] = ()) -> LoadedTask:
    """Validate the YAML ``text`` of a task; ``base`` is the directory relative paths start from
    (default: the current one); its workdir may lie outside ``base`` only with ``allow_outside``.
    ``overrides``: resources fields the command line sets ({"allow_larger": True}, {"gpu": "T4",
    ...}), put in place before the resources are checked; where they choose the instance type
    (gpu, instance_type) the file's own request is not checked: the flag's is, by its caller.
    ``infra``: the --infra flag ('aws', 'aws/REGION[/ZONE]'; aws_infra checks it): a SkyPilot file
    naming another cloud then runs on AWS, with a warning, instead of being refused (the flag's
    region, if any, is applied by api.run, which wins over the file's). ``envs``: the --env values
    ({name: value, or None: from ``environ``}); with the file's envs they fill ``$VAR``/``${VAR}`` in
    file_mounts and workdir, as SkyPilot fills them (fill_env). ``allow_write``: the buckets
    --allow-write-bucket names, which a MOUNT-mode file_mounts entry may write back to besides the
    task's own (tasks/mounts.check_write).

    Raises UsageError (exit 2) with "SOURCE:LINE: FIELD: what is wrong" and a hint: also for a text
    over MAX_TASK_BYTES, a YAML bomb (_BoundedLoader), a workdir ``check_local_source`` refuses, a
    file_mounts source in one of ec2gpu's own buckets (ec2gpu-*) and a MOUNT of another bucket
    that ``allow_write`` does not name.
    """
    allowed = check_flag(tuple(allow_write))
    _check_size(len(text), source)  # characters first: a huge text is never encoded
    _check_size(len(text.encode("utf-8", "surrogatepass")), source)
    lines, data = _compose(text, source)
    if not isinstance(data, dict):
        raise UsageError(f"{source}:1: a task file is a YAML mapping (name:, run:, ...)", DOCS)
    warnings: list[str] = []
    skypilot = is_skypilot(data)
    renamed: Renamed = {}
    git = None
    if isinstance(data.get("workdir"), dict):  # SkyPilot's git form: {url, ref}, cloned on each instance
        git = git_workdir(data["workdir"], source, lines)
        data["workdir"] = None
    if "workdir" not in data:
        if skypilot:  # SkyPilot sends nothing without a workdir (its yaml-spec: "workdir ... optional")
            data["workdir"] = None
        else:
            warnings.append(f"{source}:1: no workdir: in the file, so its directory is sent (a SkyPilot task sends "
                            "nothing without one): write workdir: . to keep this, workdir: null to send nothing")
    if infra is not None:
        aws_infra(infra)
    if skypilot:
        data, renamed = from_skypilot(data, warnings, source, lines, infra)
    _stringify_envs(data)
    fill_env(data, envs or {}, environ)
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, source, lines, renamed, skypilot)
    workdir = None if task.workdir is None else _workdir(task.workdir, base or Path.cwd(), allow_outside,
                                                          f"{source}:{line_of(lines, ('workdir',))}: workdir")
    file_mounts = _file_mounts(task, base or Path.cwd(), allow_outside, source, lines, warnings, allowed)
    if overrides:
        task = task.model_copy(update={"resources": task.resources.model_copy(update=overrides)})
    if overrides and ({"gpu", "instance_type"} & set(overrides)):
        return LoadedTask(task, None, workdir, warnings, skypilot, file_mounts, git)
    warnings += _check_resources(task, source, lines, renamed)
    what = "accelerators or instance_type" if skypilot else "gpu or instance_type"
    if _default_type_only(task.resources):
        warnings.append(f"{source}:{line_of(lines, ('resources',))}: no {what}: ec2gpu, a GPU tool, runs on "
                        f"its default GPU type ({settings.DEFAULT_INSTANCE_TYPE} unless EC2GPU_INSTANCE_TYPE says "
                        "otherwise) where SkyPilot would choose a CPU instance: name one to choose")
    elif _by_need_only(task.resources):
        choice = resolve.plan(task.resources).choices[0]
        t = catalog.CATALOG[cast(str, choice.instance_type)]  # by_need names the type it chose
        warnings.append(f"{source}:{line_of(lines, ('resources',))}: no {what}: ec2gpu, a GPU tool, runs GPU "
                        f"instances only: {choice.asked} chose the cheapest GPU type meeting them, {t.name} "
                        f"({t.gpu_count} x {t.gpu}, "
                        f"{t.vcpus} vCPUs, {t.memory_gib:g} GiB, {t.on_demand_usd_h:.2f} USD/h), where SkyPilot "
                        "would choose a CPU instance: name a GPU to choose")
    return LoadedTask(task, None, workdir, warnings, skypilot, file_mounts, git)


def _file_mounts(task: Task, base: Path, allow_outside: bool, source: str, lines: Lines,
                 warnings: list[str], allowed: frozenset[str] = frozenset()) -> list[Mount]:
    """The task's file_mounts made ready (tasks/mounts.parse), each local source checked like a
    workdir (check_local_source: credentials refused; outside the task file's directory only with
    --workdir-outside), none in ec2gpu's own buckets, and a MOUNT entry only of the task's own
    buckets or of ``allowed`` (--allow-write-bucket: mounts.check_write). Raises UsageError at the
    entry's line."""
    out = []
    for target, value in task.file_mounts.items():
        where = f"{source}:{line_of(lines, ('file_mounts', target))}: file_mounts.{target}"
        text = json.dumps([target, value if isinstance(value, str) else value.model_dump()])
        unset = [n for n in dict.fromkeys(_VAR.findall(text)) if n in task.envs]
        if unset:  # fill_env filled every one it could: the rest are null here, or secrets
            what = "a secret (never put in a path)" if unset[0] in task.secrets else "null in envs and not set here"
            raise UsageError(f"{where}: uses ${unset[0]}, which is {what}",
                             f"give it a value: export {unset[0]}=... or --env {unset[0]}=..., as SkyPilot's --env")
        try:
            out.append(mounts.entry(target, value, base, lambda p: check_local_source(p, base, allow_outside), warnings))
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}", "see docs/tasks.md, file_mounts")
        except UsageError as exc:
            raise UsageError(f"{where}: {exc.message}", exc.hint)
    seen: dict[str, str] = {}
    for m in out:
        key = mounts.normal_target(m.target)
        if key in seen:
            raise UsageError(f"{source}:{line_of(lines, ('file_mounts', m.target))}: file_mounts: {m.target!r} and "
                             f"{seen[key]!r} are the same place on the instance", "give each its own path")
        seen[key] = m.target
    own = mounts.own_buckets(out)
    for i, m in enumerate(out):
        try:
            out[i] = mounts.check_write(m, own, allowed)
        except UsageError as exc:
            raise UsageError(f"{source}:{line_of(lines, ('file_mounts', m.target))}: file_mounts.{m.target}: "
                             f"{exc.message}", exc.hint) from None
    unused = sorted(allowed - {m.bucket for m in out if m.write_back})
    if unused:
        warnings.append(f"{mounts.WRITE_FLAG} {', '.join(unused)}: no MOUNT-mode file_mounts entry of the task "
                        "writes there; nothing is allowed by it")
    for m in out:  # what another entry puts under a written-back target would be uploaded to its bucket
        inside = next((w for w in out if w.write_back and w is not m and
                       mounts.normal_target(m.target).startswith(mounts.normal_target(w.target).rstrip("/") + "/")), None)
        if inside is not None:
            raise UsageError(f"{source}:{line_of(lines, ('file_mounts', m.target))}: file_mounts: {m.target!r} is "
                             f"inside {inside.target!r}, which is written back to s3://{inside.bucket}: its files "
                             f"would be uploaded there", "give it a path of its own, outside the MOUNT target")
    if any(m.write_back for m in out):
        warnings.append(f"{source}:{line_of(lines, ('file_mounts',))}: file_mounts in mode MOUNT/MOUNT_CACHED are "
                        "copied in before setup, and what the job writes there is written back to the bucket every "
                        "minute and when it ends (an array's: as each instance leaves its pool) (SkyPilot mounts "
                        "them with FUSE; ec2gpu does not)")
    return out


#: a variable in a file_mounts or workdir value, as SkyPilot finds them (sky/task.py, _fill_in_env_vars)
_VAR = re.compile(r"\$\{?\b([a-zA-Z_][a-zA-Z0-9_]*)\b\}?")


def fill_env(data: dict[str, Any], envs: Mapping[str, str | None], environ: Mapping[str, str] = os.environ) -> None:
    """Fill ``$VAR`` and ``${VAR}`` in ``data``'s file_mounts (targets, sources, storage names) and
    its workdir with the task's envs, as SkyPilot does (sky/task.py, _fill_in_env_vars: each name in
    envs is replaced, any other is left as it is). ``envs`` (--env) win over the file's; a null value
    is taken from ``environ``, as for the job. Secrets and AWS credential variables are never filled
    in (a path is shown in plans and messages). Changes ``data`` in place (pure otherwise)."""
    file_envs = cast(dict[str, Any], data.get("envs")) if isinstance(data.get("envs"), dict) else {}
    secrets = set(data.get("secrets") or []) if isinstance(data.get("secrets"), list) else set()
    values = {}
    for k, v in {**file_envs, **envs}.items():
        v = environ.get(k) if v is None else v
        if v is not None and k not in secrets and str(k).upper() not in AWS_CREDENTIAL_VARS:
            values[str(k)] = str(v)
    if not values:
        return

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return _VAR.sub(lambda m: values.get(m.group(1), m.group(0)), value)
        if isinstance(value, dict):
            return {fill(k): fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value
    for key in ("file_mounts", "workdir"):
        if data.get(key) is not None:
            data[key] = fill(data[key])


def _by_need_only(resources: Resources) -> bool:
    """Whether no GPU and no type is asked, and cpus/memory chose the type (resolve.by_need) (pure)."""
    need = resolve.need_of(resources)
    try:
        return need is not None and all(c.asked == need.words() for c in resolve.plan(resources).choices)
    except UsageError:
        return False


def _default_type_only(resources: Resources) -> bool:
    """Whether ``resources`` leave the instance type to the configured default (pure)."""
    try:
        return all(c.instance_type is None for c in resolve.plan(resources).choices)
    except UsageError:
        return False


def _workdir(value: str, base: Path, allow_outside: bool, where: str) -> Path:
    """The task's workdir ``value`` resolved against ``base``, checked (``check_local_source``) and
    present. Raises UsageError starting with ``where`` ("FILE:LINE: workdir")."""
    try:  # '~/project' is this machine's home, as SkyPilot reads it (then outside the task's directory)
        workdir = check_local_source(base / Path(value).expanduser(), base, allow_outside)
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


def _first_error(exc: ValidationError, source: str, lines: Lines, renamed: Renamed,
                 skypilot: bool = False) -> UsageError:
    errors = exc.errors()
    # an unknown field first: `runn:` is a misspelt `run:`, and "run: missing" would hide it
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(err["loc"])
    ours = next((o for o in renamed if loc[:len(o)] == o), None)
    shown = renamed[ours] + loc[len(ours):] if ours else loc  # the file's own names (num_nodes, not nodes)
    name = ".".join(str(p) for p in shown) or "task"
    line = line_of(lines, shown)
    if err["type"] == "extra_forbidden":
        parent: Iterable[str]
        theirs: tuple[str, ...]
        if len(loc) == 1:
            parent, theirs = Task.model_fields, SKYPILOT_FIELDS
        elif len(loc) == 2:
            parent, theirs = cast(Any, Task.model_fields["resources"].annotation).model_fields, SKYPILOT_RESOURCE_FIELDS
        else:  # a candidate of resources.any_of / ordered
            parent, theirs = ("gpu", "instance_type"), SKYPILOT_RESOURCE_FIELDS
        return UsageError(f"{source}:{line}: {name}: unknown field", names_hint(loc[-1], parent, theirs))
    if err["type"] == "missing":
        return UsageError(f"{source}:{line}: {name}: missing", f"add `{loc[-1]}:`; {DOCS}")
    msg = in_words(err)
    if skypilot and isinstance(err.get("input"), (dict, list)) and err["type"].endswith("_type"):
        msg = f"{err['input']!r} is not what ec2gpu reads here ({msg})"
    return UsageError(f"{source}:{line}: {name}: {msg}", DOCS)


def _check_resources(task: Task, source: str, lines: Lines, renamed: Renamed) -> list[str]:
    """The instance types the task's resources ask for (resolve.plan), checked before anything is
    created; returns the warnings to show (a larger type taken, candidates skipped). Raises
    UsageError at the line of the field that asks for what EC2 cannot run."""
    res = task.resources
    field_ = ("ordered" if res.ordered else "any_of" if res.any_of else "gpu" if res.gpu else "instance_type"
              if res.instance_types else "cpus" if res.cpus is not None else "memory" if res.memory is not None
              else "gpu")
    loc = renamed.get(("resources", field_), ("resources", field_))
    name = ".".join(loc)
    try:
        plan = resolve.plan(res)
    except UsageError as exc:
        raise UsageError(f"{source}:{line_of(lines, loc)}: {name}: {exc.message}", exc.hint)
    return [f"{name}: {note}" for note in plan.notes()]


def load(path: str | Path, allow_outside: bool = False, overrides: dict[str, Any] | None = None,
         infra: str | None = None, envs: Mapping[str, str | None] | None = None,
         allow_write: Iterable[str] = ()) -> LoadedTask:
    """Read (UTF-8, at most MAX_TASK_BYTES) and validate the task file at ``path``; relative paths
    in it start at its directory, and its workdir may lie outside that only with ``allow_outside``;
    ``overrides``, ``infra``, ``envs`` and ``allow_write`` as for ``parse``.

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
    loaded = parse(text, str(path), path.resolve().parent, allow_outside, overrides, infra, envs,
                   allow_write=allow_write)
    loaded.path = path.resolve()
    return loaded


#: botocore's credential variables (botocore/credentials.py, EnvProvider: ACCESS_KEY, SECRET_KEY,
#: TOKENS): never taken from this machine for a job, whatever a task file or --env asks
AWS_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def from_this_machine(task: Task) -> list[str]:
    """The names of the task's variables whose values come from this machine's environment (a null
    value), in the task's order (pure): said before anything is sent."""
    return [k for k, v in task.envs.items() if v is None]


def env_values(task: Task, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The task's environment: its envs, a null value taken from ``environ``.

    Raises UsageError naming a variable that is null in the task and unset here, and one of
    AWS_CREDENTIAL_VARS asked from here: a task file is untrusted, and no AWS credential of this
    machine ever goes to an instance (a job that needs AWS gets it from an instance role).
    """
    out = {}
    for k, v in task.envs.items():
        if v is None and k.upper() in AWS_CREDENTIAL_VARS:
            raise UsageError(f"envs: {k} would copy this machine's AWS credentials to the instance: ec2gpu never "
                             "does", "drop it from envs/secrets and --env; a job that needs AWS should use an "
                             "instance role (docs/security.md)")
        if v is None:
            if k not in environ:
                raise UsageError(f"envs: {k} is null (taken from this machine) but not set here",
                                 f"export {k}=... before running, or give it a value in the task file")
            v = environ[k]
        out[k] = v
    return out
