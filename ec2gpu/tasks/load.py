"""Task files: YAML -> Task, with errors that name the file, the line and the field.

Two formats are read: ec2gpu's own (spec.py, docs/tasks.md) and the common subset of SkyPilot's
task YAML (https://docs.skypilot.co/en/latest/reference/yaml-spec.html): ``name``, ``workdir``,
``setup``, ``run``, ``envs``, ``secrets``, ``num_nodes``, ``resources.accelerators`` (and its alias
``gpus``: ``T4:1``, ``{T4: 1}``, ``{A100:8}``, a set ``{H100:8, H200:8}`` tried cheapest first, a
list ``[A100:8, H100:8]`` tried in order, SkyPilot's memory form ``40GB+:1``),
``resources.any_of``/``ordered`` (candidates), ``resources.instance_type``, ``resources.use_spot``,
``resources.disk_size``, ``resources.cpus``/``memory`` (choose the type with the GPU: resolve.Need),
``resources.infra``/``cloud``/``region``/``zone`` (AWS and its region; another cloud refused unless
``--infra aws``), ``resources.image_id`` (an AMI, or one per region), ``resources.ports`` (forwarded
over SSH, not opened), ``resources.autostop`` (the idle rule), ``resources.job_recovery`` (ec2gpu's
own spot recovery, the differences warned). SkyPilot fields ec2gpu does not support are named in
one warning line, never silently dropped; anything else unknown is an error whose hint lists both
formats' names. The fields' meanings: https://docs.skypilot.co/en/latest/reference/yaml-spec.html.

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

import difflib
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
from . import resolve
from .mounts import Mount, check_flag
from .spec import ENV_NAME_RE, IDLE_FLOOR_MINUTES, MAX_MINUTES, Resources, Task

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

#: SkyPilot fields with no ec2gpu meaning: warned about and ignored
SKYPILOT_UNSUPPORTED = {"volumes", "config", "service", "event_callback", "num_gpus", "docker",
                        "experimental", "pool", "inputs"}
SKYPILOT_UNSUPPORTED_RESOURCES = {"accelerator_args", "disk_tier", "network_tier", "priority", "volumes",
                                  "max_hourly_cost"}
#: SkyPilot resources fields that change nothing in an ec2gpu run, each with a warning (or a refusal)
#: of its own saying what ec2gpu does instead (_location, _recovery): the zone (chosen at launch),
#: the cloud (AWS runs it; another is refused), the recovery strategy (ec2gpu's own spot recovery)
SKYPILOT_UNSUPPORTED_RESOURCES_SAID = {"cloud", "zone", "job_recovery", "spot_recovery"}
#: SkyPilot name -> ec2gpu name (resources.accelerators and its candidates: _skypilot_resources, which
#: also puts the values of infra, image_id, ports and autostop in ec2gpu's form before they move)
SKYPILOT_RENAMES = {("num_nodes",): ("nodes",), ("resources", "use_spot"): ("resources", "spot"),
                    ("resources", "disk_size"): ("resources", "disk_gib"),
                    ("resources", "infra"): ("resources", "region"), ("resources", "image_id"): ("resources", "ami"),
                    ("resources", "ports"): ("ports",), ("resources", "autostop"): ("idle_timeout",)}
#: --infra: SkyPilot's flag that overrides the task's infra (``sky launch --infra aws``)
INFRA_FLAG = "--infra"
OTHER_CLOUD_HINT = (f"ec2gpu runs on AWS: pass {INFRA_FLAG} aws (SkyPilot's own override flag) to run it there, "
                    f"or {INFRA_FLAG} aws/REGION")
#: the shortest idle rule autostop becomes, minutes: an instance is idle until the controller's first
#: SSH connection, which comes after the boot, the console's host keys and the first sync
AUTOSTOP_DEFAULT_MINUTES = 5  # autostop: true (yaml-spec.html, resources.autostop: "default idle minutes (5)")
MAX_PORTS = 64  # ports forwarded from one task (each is an SSH forward held while the job runs)
#: Every field SkyPilot's task YAML has (yaml-spec.html; sky/task.py, sky/resources.py), for the hint
#: on an unknown one: read and mapped, or named in the warning as dropped
SKYPILOT_FIELDS = ("name", "workdir", "num_nodes", "resources", "envs", "secrets", "setup", "run", "file_mounts",
                   "volumes", "config", "service", "pool", "event_callback", "inputs", "outputs")
SKYPILOT_RESOURCE_FIELDS = ("infra", "cloud", "region", "zone", "accelerators", "gpus", "accelerator_args", "cpus",
                            "memory", "instance_type", "use_spot", "job_recovery", "spot_recovery", "disk_size",
                            "disk_tier", "network_tier", "ports", "labels", "image_id", "autostop", "any_of", "ordered",
                            "priority", "volumes", "max_hourly_cost")
#: SkyPilot's alias in resources and in each candidate (sky/resources.py, RESOURCE_CONFIG_ALIASES)
SKYPILOT_ALIASES = {"gpus": "accelerators"}
DOCS = "see docs/tasks.md for every field"
#: a field's place in a task file, its keys and list indexes: ("resources", "any_of", 0, "gpu")
_Loc = tuple[str | int, ...]
#: {field path: 1-based line} of a task file (_lines)
_Lines = dict[_Loc, int]
#: {our field path: the file's (SkyPilot's)}, ("nodes",): ("num_nodes",)
_Renamed = dict[tuple[str, ...], tuple[str, ...]]


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

    def _refuse(self, event: Any, problem: str) -> _TooComplex:
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


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _compose(text: str, source: str) -> tuple[_Lines, Any]:
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


def _refuse_duplicate_keys(node: Any, source: str, path: _Loc = (), seen: set[int] | None = None) -> None:
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


def _lines(node: Any, path: _Loc = (), out: _Lines | None = None, seen: set[Any] | None = None) -> _Lines:
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


def _line_of(lines: _Lines, loc: _Loc) -> int:
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def _from_skypilot(data: dict[str, Any], warnings: list[str], source: str = "<task>", lines: _Lines | None = None,
                   infra: str | None = None) -> tuple[dict[str, Any], _Renamed]:
    """SkyPilot's names -> ours; unsupported fields dropped and named in one warning; ``infra``: the
    --infra flag (another cloud in the file is then replaced by AWS, with a warning). Returns (data,
    {our field path: the file's}). Raises UsageError (with the line) for what cannot be mapped."""
    lines = lines or {}
    data = dict(data)
    renamed: _Renamed = {}
    dropped = sorted(k for k in data if k in SKYPILOT_UNSUPPORTED)
    for k in dropped:
        data.pop(k)
    if isinstance(data.get("outputs"), dict):  # sky/task.py: {cloud path: estimated GB}, the optimizer's egress hint
        data.pop("outputs")
        dropped.append("outputs (SkyPilot's legacy {bucket: size in GB}: a size hint for its optimizer's egress cost, "
                       "which moves no data)")
    if isinstance(data.get("resources"), dict):
        data["resources"], res_renamed = _skypilot_resources(data["resources"], source, lines, warnings, dropped,
                                                             infra)
        renamed.update(res_renamed)
    for theirs, ours in SKYPILOT_RENAMES.items():
        src = data if len(theirs) == 1 else data.get(theirs[0])
        if not (isinstance(src, dict) and theirs[-1] in src):
            continue
        value = src.pop(theirs[-1])
        if value is None:  # SkyPilot's null: not asked
            continue
        dest = data if len(ours) == 1 else data.setdefault(ours[0], {})
        if ours[-1] in dest and isinstance(dest[ours[-1]], list) and isinstance(value, list):  # ports in both
            value = list(dict.fromkeys(dest[ours[-1]] + value))
        dest[ours[-1]] = value
        renamed[ours] = theirs
    if isinstance(data.get("secrets"), dict):  # SkyPilot: a map like envs, values hidden
        secrets = data.pop("secrets")
        envs = data.get("envs") or {}
        if not isinstance(envs, dict):
            raise _refuse(source, lines, ("envs",), f"{str(envs)[:40]!r} is not a mapping of names to values",
                          "e.g. envs: {EPOCHS: 3, HF_TOKEN: null}")
        data["envs"] = {**envs, **secrets}
        data["secrets"] = list(secrets)
    if dropped:
        warnings.append(f"ignored SkyPilot field(s) ec2gpu does not support: {', '.join(dropped)}")
    return data, renamed


def _refuse(source: str, lines: _Lines, loc: _Loc, what: str, hint: str = DOCS) -> UsageError:
    """UsageError "SOURCE:LINE: a.b[0].c: WHAT" for the field at ``loc``."""
    name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return UsageError(f"{source}:{_line_of(lines, loc)}: {name}: {what}", hint)


def _alias(res: dict[str, Any], source: str, lines: _Lines, loc: _Loc) -> dict[str, Any]:
    """``res`` with SkyPilot's aliases (gpus -> accelerators) replaced; both given: refused, as SkyPilot does."""
    res = dict(res)
    for alias, name in SKYPILOT_ALIASES.items():
        if alias in res:
            if name in res:
                raise _refuse(source, lines, loc + (alias,), f"both {alias} and {name}: {alias} is SkyPilot's other "
                              f"name for {name}", "keep one of them")
            res[name] = res.pop(alias)
    return res


def _accelerators(value: Any, source: str, lines: _Lines, loc: _Loc) -> tuple[list[str], str]:
    """SkyPilot's ``accelerators`` -> (GPU requests 'MODEL:N', "one" | "set" | "list"), as
    sky/resources.py reads it: a string (a count of 1 when none is given); a mapping {A100: 8}, or
    {A100:8} (YAML reads a flow map without a space as {'A100:8': None}); a mapping of several, a set
    (tried cheapest first); a list (tried in order). SkyPilot's memory form ('40GB+:1') stands for
    every catalog GPU with that memory: a set. Raises UsageError at the field's line."""
    if isinstance(value, str):
        items, kind = [value], "one"
    elif isinstance(value, dict):
        items = [f"{k}:{v}" if v is not None else str(k) for k, v in value.items()]
        kind = "one" if len(items) == 1 else "set"
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items, kind = list(value), "one" if len(value) == 1 else "list"
    else:
        raise _refuse(source, lines, loc, f"{value!r} is not an accelerator request",
                      "e.g. accelerators: A100:8, {A100: 8}, {H100:8, H200:8} (cheapest first) or [A100:8, H100:8] "
                      "(in order)")
    requests: list[str] = []
    for item in items:
        by_memory = resolve.memory_request(item)
        if by_memory is not None:
            requests += [r for r in by_memory if r not in requests]
            kind = "set" if kind == "one" else kind
            continue
        try:
            model, count = resolve.parse_gpu(item)
        except ValueError as exc:
            raise _refuse(source, lines, loc, str(exc), "e.g. A100:8")
        request = f"{model}:{count or 1}"  # SkyPilot: a name alone is a count of 1
        if request not in requests:
            requests.append(request)
    if not requests:
        raise _refuse(source, lines, loc, f"{value!r}: no GPU EC2 sells matches it",
                      f"GPUs EC2 sells: {', '.join(catalog.gpus())}")
    return requests, ("one" if len(requests) == 1 else kind)


_DISK = re.compile(r"\s*(\d+)\s*(gb|gib|g|tb|tib|t)?\s*", re.I)


def _disk_gib(value: str, source: str, lines: _Lines, loc: _Loc) -> int:
    """SkyPilot's ``disk_size`` written with a unit ('1024GB', '1TB', '256') -> GiB. SkyPilot passes
    its GB figure to EC2 as the volume's size, which EC2 reads in GiB (RunInstances
    BlockDeviceMapping Ebs.VolumeSize), so 1 GB here is 1 GiB, and 1 TB is 1,024 GiB."""
    m = _DISK.fullmatch(value)
    if not m:
        raise _refuse(source, lines, loc, f"{value[:40]!r} is not a disk size", "a whole number of GiB: 256, 256GB or 1TB")
    return int(m.group(1)) * (1024 if (m.group(2) or "g").lower().startswith("t") else 1)


def _other_cloud(entry: dict[str, Any]) -> str | None:
    """"infra: gcp/us-central1" when the candidate ``entry`` names a cloud other than AWS, else None."""
    for k in ("infra", "cloud"):
        v = entry.get(k)
        if isinstance(v, str) and v.strip() and v.strip().split("/")[0].lower() not in ("aws", "*"):
            return f"{k}: {v}"
    return None


def parse_infra(text: str) -> tuple[str, str | None, str | None]:
    """SkyPilot's ``infra`` 'CLOUD[/REGION[/ZONE]]' -> (cloud, region, zone) (pure): the cloud
    lower-cased ('k8s' is 'kubernetes'; '*' any), a '*' or missing part None
    (https://docs.skypilot.co/en/latest/reference/yaml-spec.html, resources.infra;
    sky/utils/infra_utils.py). 'aws/us-west-2/us-west-2a' -> ('aws', 'us-west-2', 'us-west-2a');
    'k8s/my-context' -> ('kubernetes', 'my-context', None)."""
    parts = [p.strip() for p in str(text).strip().split("/")]
    cloud = {"k8s": "kubernetes"}.get(parts[0].lower(), parts[0].lower())
    region = parts[1] if len(parts) > 1 and parts[1] not in ("", "*") else None
    zone = "/".join(parts[2:]) if len(parts) > 2 and parts[2] not in ("", "*") else None
    return cloud, region, zone


def _region_of_zone(zone: str) -> str | None:
    """'us-west-2a' -> 'us-west-2'; a Local Zone 'us-east-1-bos-1a' -> 'us-east-1' (pure); None when
    ``zone`` does not start with a region."""
    m = re.match(r"([a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-[0-9]+)(?=[a-z]|-)", zone)
    return m.group(1) if m else None


def zone_note(zone: str, region: str | None) -> str:
    """The warning for a zone asked (pure): ec2gpu chooses it at launch."""
    return (f"zone {zone}: ec2gpu chooses the availability zone at launch (any zone of {region or 'the region'} "
            "with capacity, the next one on InsufficientInstanceCapacity), so the run may start in another zone")


def aws_infra(value: str, what: str = INFRA_FLAG) -> tuple[str | None, str | None]:
    """The --infra flag's 'aws', 'aws/REGION' or 'aws/REGION/ZONE' -> (region, zone), each None
    where not given (pure). Raises UsageError for another cloud, a region that is not an AWS one,
    or a zone outside the region."""
    from .spec import REGION_RE
    cloud, region, zone = parse_infra(value)
    if cloud != "aws":
        raise UsageError(f"{what} {value}: ec2gpu runs on AWS only", "give aws, aws/REGION or aws/REGION/ZONE, "
                         "e.g. --infra aws/us-west-2")
    if region is not None and not REGION_RE.fullmatch(region):
        raise UsageError(f"{what} {value}: {region!r} is not an AWS region", "e.g. aws/us-east-1, aws/us-west-2")
    if zone is not None and _region_of_zone(zone) != region:
        raise UsageError(f"{what} {value}: {zone!r} is not a zone of {region}", f"e.g. aws/{region}/{region}a")
    return region, zone


def _location(res: dict[str, Any], source: str, lines: _Lines, warnings: list[str], infra: str | None) -> str | None:
    """SkyPilot's ``infra`` or ``cloud``/``region``/``zone`` of ``res`` (taken out of it) -> the AWS
    region to run in (None: the configured one). The zone is warned about: ec2gpu chooses it at
    launch. ``infra``: the --infra flag: the file's cloud, if another, is replaced by AWS and its
    region and zone dropped, each with a warning; an AWS region in the file is kept unless the flag
    names one (api.run: the flag's wins).

    Raises UsageError at the field's line for another cloud without the flag, ``infra`` given with
    ``cloud``/``region``/``zone`` (SkyPilot refuses that too: sky/resources.py), a zone outside the region."""
    loc = ("resources",)
    given = {k: res.pop(k) for k in ("infra", "cloud", "region", "zone") if res.get(k) is not None}
    for unasked in [k for k in ("infra", "cloud", "region", "zone") if k in res]:
        res.pop(unasked)  # null: not asked
    if not given:
        return None
    for k, v in given.items():
        if not isinstance(v, str) or not v.strip():
            raise _refuse(source, lines, loc + (k,), f"{v!r} is not a {k}", "e.g. infra: aws/us-east-1")
    if "infra" in given and len(given) > 1:
        other = next(k for k in given if k != "infra")
        raise _refuse(source, lines, loc + (other,), f"infra and {other} together: SkyPilot refuses both too",
                      "write infra: aws/REGION/ZONE alone")
    if "infra" in given:
        field_, (cloud, region, zone) = "infra", parse_infra(given["infra"])
    else:
        field_ = "cloud" if "cloud" in given else "region" if "region" in given else "zone"
        cloud, region, zone = (given.get("cloud") or "*").strip().lower(), given.get("region"), given.get("zone")
        cloud = {"k8s": "kubernetes"}.get(cloud, cloud)
    written = given[field_]
    if cloud not in ("aws", "*"):
        if infra is None:
            raise _refuse(source, lines, loc + (field_,), f"{written}: another cloud than AWS", OTHER_CLOUD_HINT)
        warnings.append(f"resources.{field_}: {written} replaced by {INFRA_FLAG} {infra}: the task runs on AWS"
                        + (f" (the other cloud's {'region ' + region if region else ''}"
                           f"{' and ' if region and zone else ''}{'zone ' + zone if zone else ''} dropped)"
                           if region or zone else ""))
        return None
    from .spec import REGION_RE
    if region is not None and not REGION_RE.fullmatch(region.strip()):
        if infra is not None:
            warnings.append(f"resources.{field_}: {written}: {region!r} is not an AWS region: dropped for "
                            f"{INFRA_FLAG} {infra}")
            return None
        raise _refuse(source, lines, loc + (field_,), f"{written}: {region!r} is not an AWS region (another cloud's?)",
                      OTHER_CLOUD_HINT)
    if zone is not None:
        region = region or _region_of_zone(zone.strip())
        if region is None or _region_of_zone(zone.strip()) != region:
            raise _refuse(source, lines, loc + (("zone" if "zone" in given else field_),),
                          f"{zone!r} is not an availability zone of {region or 'an AWS region'}",
                          "e.g. infra: aws/us-west-2/us-west-2a")
        warnings.append(f"resources.{'zone' if 'zone' in given else field_}: {zone_note(zone.strip(), region)}")
    return region.strip() if region else None


def _image(value: Any, source: str, lines: _Lines, loc: tuple[str, ...], warnings: list[str],
           replaced: bool) -> str | dict[str, str] | None:
    """SkyPilot's ``image_id`` -> ec2gpu's ``ami`` (an AMI id, or {region: AMI id}), or None where the
    default image runs, with a warning (SkyPilot's own image tags, ``skypilot:gpu-ubuntu-2004``; another
    cloud's image when --infra aws replaced that cloud: ``replaced``). Per
    https://docs.skypilot.co/en/latest/reference/yaml-spec.html (resources.image_id, AWS).

    Raises UsageError at the field's line for ``docker:IMAGE`` (a container: not supported yet) and
    for anything that is not an AMI id."""
    values = list(value.values()) if isinstance(value, dict) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise _refuse(source, lines, loc, f"{value!r} is not an image id", "e.g. image_id: ami-0123456789abcdef0, or "
                      "{us-east-1: ami-..., us-west-2: ami-...}")
    values = [v.strip() for v in values]
    docker = next((v for v in values if v.lower().startswith("docker:")), None)
    if docker:
        raise _refuse(source, lines, loc, f"{docker[:80]}: running the job in a container is not supported yet",
                      "drop image_id and install in setup what the image holds; or start the container in run "
                      "(docker run --gpus all ...: the Deep Learning AMI has Docker and the NVIDIA container toolkit)")
    if all(v.lower().startswith("skypilot:") for v in values):
        warnings.append(f"{'.'.join(loc)}: {', '.join(dict.fromkeys(values))} is SkyPilot's own image tag: ec2gpu "
                        "boots its default image instead (the image baked for this setup, else the PyTorch Deep "
                        "Learning AMI, Ubuntu 24.04)")
        return None
    if all(v.lower().startswith("ami-") for v in values):
        return {str(k): v.strip() for k, v in value.items()} if isinstance(value, dict) else values[0]
    if replaced:
        warnings.append(f"{'.'.join(loc)}: {str(value)[:80]} is the other cloud's image: dropped for {INFRA_FLAG} aws "
                        "(ec2gpu boots its default image)")
        return None
    raise _refuse(source, lines, loc, f"{str(value)[:80]}: not an AMI id (ami-...); another cloud's image, or a "
                  "container (docker:... is not supported yet)?",
                  "give an AMI id of the run's region, or drop image_id")


def _ports(value: Any, source: str, lines: _Lines, loc: tuple[str, ...], warnings: list[str]) -> list[int]:
    """SkyPilot's ``ports`` (8080, '8080', '10022-10040', or a list of those) -> ec2gpu's top-level
    ``ports``: each forwarded from node 0 to 127.0.0.1 here over SSH while the job runs, never
    opened in the security group, where SkyPilot opens them to the internet
    (https://docs.skypilot.co/en/latest/reference/yaml-spec.html, resources.ports); said in a warning.
    Raises UsageError for a value that is not a port or range, or more than MAX_PORTS ports."""
    items = value if isinstance(value, list) else [value]
    ports: list[int] = []
    for item in items:
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(item)) if not isinstance(item, bool) else None
        first, last = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (0, 0)
        if not m or not 1 <= first <= last <= 65535:
            raise _refuse(source, lines, loc, f"{item!r} is not a port or a range of ports", "e.g. 8080, 10022-10040 "
                          "or [8080, 8081]")
        if last - first + 1 + len(ports) > MAX_PORTS:
            raise _refuse(source, lines, loc, f"more than {MAX_PORTS} ports: ec2gpu forwards each one over SSH",
                          "name the ports the job serves on (e.g. [8000, 8265])")
        ports += [p for p in range(first, last + 1) if p not in ports]
    shown = ", ".join(str(p) for p in ports[:8]) + (f" and {len(ports) - 8} more" if len(ports) > 8 else "")
    warnings.append(f"{'.'.join(loc)}: {shown}: forwarded from node 0 to 127.0.0.1 on this machine over SSH while the "
                    "job runs (http://127.0.0.1:PORT here), not opened to the internet as SkyPilot opens them: the "
                    "security group opens SSH alone")
    return ports


_AUTOSTOP_UNITS = {"m": 1, "h": 60, "d": 1440, "w": 10080}  # yaml-spec.html, resources.autostop: <num><unit>
_AUTOSTOP_KEYS = ("idle_minutes", "down", "wait_for", "hook", "hook_timeout")


def _autostop_minutes(value: Any, source: str, lines: _Lines, loc: _Loc) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhdw])?\s*", str(value).lower()) if not isinstance(value, bool) else None
    if not m:
        raise _refuse(source, lines, loc, f"{value!r} is not an idle time", "minutes (10), or 10m, 2h, 1d, 1w")
    got = float(m.group(1)) * _AUTOSTOP_UNITS[m.group(2) or "m"]
    if not got <= MAX_MINUTES:  # inf and NaN too
        raise _refuse(source, lines, loc, f"{str(value)[:40]!r}: at most {MAX_MINUTES:,} minutes (30 days)",
                      "minutes (10), or 10m, 2h, 1d, 1w")
    return got


def _autostop(value: Any, source: str, lines: _Lines, loc: tuple[str, ...], warnings: list[str]) -> int | None:
    """SkyPilot's ``autostop`` (true: 5 min; false; minutes or 10m/2h/1d/1w; {idle_minutes, down,
    wait_for, hook, hook_timeout}: https://docs.skypilot.co/en/latest/reference/yaml-spec.html,
    resources.autostop) -> ec2gpu's ``idle_timeout`` in whole minutes, at least IDLE_FLOOR_MINUTES
    (None: none asked), each difference warned: an ec2gpu run terminates its instances when the job
    ends anyway, so the idle rule is the net for a run whose controller is gone; it terminates (a
    run's instance is never kept stopped); a hook is not run. Raises UsageError for another form."""
    where = ".".join(loc)
    notes = []
    if value is False:
        warnings.append(f"{where}: false: an ec2gpu run still terminates its instances when the job ends "
                        "(SkyPilot would keep the cluster up)")
        return None
    if isinstance(value, dict):
        unknown = [k for k in value if k not in _AUTOSTOP_KEYS]
        if unknown:
            raise _refuse(source, lines, loc + (unknown[0],), "unknown field",
                          f"autostop's fields: {', '.join(_AUTOSTOP_KEYS)}")
        idle = value.get("idle_minutes")
        minutes_ = AUTOSTOP_DEFAULT_MINUTES if idle is None else _autostop_minutes(idle, source, lines,
                                                                                   loc + ("idle_minutes",))
        if value.get("down") is False or "down" not in value:
            notes.append("terminated, not stopped (a run's instance is never kept)")
        if value.get("hook"):
            notes.append("its hook is not run")
        if value.get("wait_for") not in (None, "jobs_and_ssh"):
            notes.append(f"wait_for {value['wait_for']} is read as jobs_and_ssh (a busy GPU counts too)")
    elif value is True:
        minutes_ = AUTOSTOP_DEFAULT_MINUTES
        notes.append("terminated, not stopped (a run's instance is never kept)")
    else:
        minutes_ = _autostop_minutes(value, source, lines, loc)
        notes.append("terminated, not stopped (a run's instance is never kept)")
    chosen = max(IDLE_FLOOR_MINUTES, int(-(-minutes_ // 1)))
    if chosen > minutes_:
        notes.append(f"{IDLE_FLOOR_MINUTES} min at least, so a booting instance is not ended before the controller "
                     "connects")
    warnings.append(f"{where}: an ec2gpu run terminates its instances when the job ends (SkyPilot keeps the cluster "
                    f"until it has been idle {minutes_:g} min); as the net for a run whose controller is gone, an "
                    f"instance with no job, SSH connection or busy GPU for {chosen} min terminates itself "
                    "(idle_timeout)"
                    + "".join(f"; {n}" for n in notes))
    return chosen


def _recovery(key: str, value: Any, spot: Any, warnings: list[str], source: str, lines: _Lines) -> int | None:
    """SkyPilot's ``job_recovery`` / ``spot_recovery`` (FAILOVER, EAGER_NEXT_REGION, none, or
    {strategy, max_restarts_on_errors, recover_on_exit_codes}: yaml-spec.html, resources.job_recovery;
    applied by SkyPilot to managed jobs, ``sky jobs launch``) -> a warning saying what ec2gpu's own
    spot recovery does instead (runs/recover/recovery.py): a lost spot instance is replaced in the same region,
    another zone first, up to --max-attempts instances (3 with spot). Returns max_restarts_on_errors
    (None when not given): restarts on the job's own errors, which a detached run (--detach,
    agent/detached.py) makes; they are not mapped to --max-attempts, which counts lost instances."""
    loc = ("resources", key)
    if isinstance(value, dict):
        unknown = [k for k in value if k not in ("strategy", "max_restarts_on_errors", "recover_on_exit_codes")]
        if unknown:
            raise _refuse(source, lines, loc + (unknown[0],), "unknown field",
                          "job_recovery's fields: strategy, max_restarts_on_errors, recover_on_exit_codes")
        strategy, restarts = value.get("strategy"), value.get("max_restarts_on_errors")
        codes = value.get("recover_on_exit_codes")
    elif isinstance(value, str) or value is None:
        strategy, restarts, codes = value, None, None
    else:
        raise _refuse(source, lines, loc, f"{value!r} is not a recovery strategy",
                      "e.g. FAILOVER, EAGER_NEXT_REGION, or {strategy: FAILOVER, max_restarts_on_errors: 3}")
    strategy = str(strategy or "EAGER_NEXT_REGION").upper()  # SkyPilot's default
    said = [f"resources.{key}: {strategy}: ec2gpu's own spot recovery applies instead: a lost spot instance is "
            "replaced in the same region, another zone first, up to --max-attempts instances (3 with spot)"]
    if strategy == "EAGER_NEXT_REGION":
        said.append("it does not move to another region")
    if strategy == "NONE":
        said.append("pass --max-attempts 1 for no replacement")
    if restarts is not None and (isinstance(restarts, bool) or not isinstance(restarts, int) or not 0 <= restarts <= 100):
        raise _refuse(source, lines, loc + ("max_restarts_on_errors",), f"{restarts!r} is not a count of restarts",
                      "give a whole number from 0 to 100")
    if restarts:
        said.append(f"a job that exits non-zero is restarted up to {restarts} times in a detached run (--detach) "
                    "only: a run you follow ends with its job")
    if codes:
        said.append(f"exit codes are not recovered on (recover_on_exit_codes: {codes})")
    if not spot:
        said.append("this task runs on-demand, where ec2gpu replaces nothing")
    warnings.append("; ".join(said))
    return restarts


def _skypilot_resources(res: dict[str, Any], source: str, lines: _Lines, warnings: list[str], dropped: list[str],
                        infra: str | None = None) -> tuple[dict[str, Any], _Renamed]:
    """SkyPilot's ``resources`` -> ours (the caller renames use_spot, disk_size, image_id, ports and
    autostop): ``accelerators`` becomes ``gpu`` (one request), ``any_of`` (a set: cheapest first) or
    ``ordered`` (a list: in order); SkyPilot's ``any_of``/``ordered`` become ours, each candidate's
    accelerators kept (a candidate without them inherits the resources' own, as SkyPilot merges them)
    and a candidate on another cloud skipped with a warning (kept on AWS with ``infra``, the --infra
    flag); ``use_spot`` of the candidates becomes the run's (where they differ, warned: ordered, the
    first one's; any_of, spot if one asks for it); ``cpus``/``memory`` stay (ours too); the location
    becomes ``region`` (_location), ``image_id`` an AMI (_image), ``ports`` ec2gpu's forwarded ports
    (_ports), ``autostop`` the idle rule (_autostop), ``job_recovery`` a warning (_recovery).
    Unsupported fields are added to ``dropped``. Returns (resources, {our path: the file's})."""
    loc = ("resources",)
    res = _alias(res, source, lines, loc)
    renamed: _Renamed = {}
    if isinstance(res.get("disk_size"), str):
        res["disk_size"] = _disk_gib(res["disk_size"], source, lines, loc + ("disk_size",))
    written_location = next((k for k in ("infra", "cloud", "region", "zone") if res.get(k) is not None), None)
    other_cloud = bool(res.get("infra") or res.get("cloud")) and _other_cloud(res) is not None
    region = _location(res, source, lines, warnings, infra)
    if region:
        res["region"] = region
        if written_location != "region":
            renamed[("resources", "region")] = ("resources", cast(str, written_location))  # the region came from it
    if res.get("image_id") is not None:
        res["image_id"] = _image(res["image_id"], source, lines, loc + ("image_id",), warnings,
                                 other_cloud and infra is not None)
    if res.get("ports") is not None:
        res["ports"] = _ports(res["ports"], source, lines, loc + ("ports",), warnings)
    if "autostop" in res:
        res["autostop"] = None if res["autostop"] is None else _autostop(res["autostop"], source, lines,
                                                                         loc + ("autostop",), warnings)
    key: str | None
    for key in ("job_recovery", "spot_recovery"):
        if key in res:
            value = res.pop(key)
            if value is not None:
                restarts = _recovery(key, value, res.get("use_spot"), warnings, source, lines)
                if restarts is not None:
                    res["max_restarts_on_errors"] = restarts
    gone = sorted(k for k in res if k in SKYPILOT_UNSUPPORTED_RESOURCES)
    for k in gone:
        res.pop(k)
    dropped += [f"resources.{k}" for k in gone]
    base: list[str]
    base, kind = ([], "none")
    if "accelerators" in res:
        base, kind = _accelerators(res.pop("accelerators"), source, lines, loc + ("accelerators",))
    key = next((k for k in ("any_of", "ordered") if k in res), None)
    if key and "any_of" in res and "ordered" in res:
        raise _refuse(source, lines, loc + ("ordered",), "any_of and ordered together: SkyPilot refuses both too",
                      "keep one list of candidates")
    if key and len(base) > 1 and (key == "ordered" or kind == "list"):
        raise _refuse(source, lines, loc + ("accelerators",), f"several accelerators with {key}: SkyPilot refuses "
                      "this too", "list the accelerators in the candidates instead")
    if key:
        entries = res.pop(key)
        if not isinstance(entries, list) or not entries:
            raise _refuse(source, lines, loc + (key,), "a list of candidates (mappings of accelerators, "
                          "instance_type, use_spot, ...)",
                          "e.g. any_of: [{accelerators: H100:8}, {accelerators: H200:8}]")
        res[key], spots, elsewhere = _skypilot_candidates(entries, key, base, res.get("use_spot"), source, lines,
                                                          dropped, infra)
        if elsewhere and infra is None:
            warnings.append(f"resources.{key}: candidates on another cloud skipped: {'; '.join(elsewhere)}")
        elif elsewhere:
            warnings.append(f"resources.{key}: candidates on another cloud run on AWS ({INFRA_FLAG} {infra}): "
                            f"{'; '.join(elsewhere)}")
        if not res[key]:
            raise _refuse(source, lines, loc + (key,), "every candidate names another cloud than AWS: "
                          + "; ".join(elsewhere), OTHER_CLOUD_HINT)
        # one market per run: ordered, the first candidate's; any_of, spot if one asks for it (spot is the
        # cheaper market, and any_of is tried cheapest first)
        spot = bool(spots[0]) if key == "ordered" else any(bool(s) for s in spots)
        if len({bool(s) for s in spots}) > 1:
            warnings.append(f"resources.{key}: the candidates differ in use_spot; ec2gpu runs a run on one market: "
                            f"{'spot' if spot else 'on-demand'}, as "
                            + ("the first one asks" if key == "ordered" else "one asks (the cheaper market)")
                            + " (--spot-fallback on-demand adds on-demand after spot)")
        if any(s is not None for s in spots):
            res["use_spot"] = spot
    elif kind == "one":
        res["gpu"] = base[0]
        renamed[("resources", "gpu")] = ("resources", "accelerators")
    elif kind in ("set", "list"):
        key = "any_of" if kind == "set" else "ordered"
        res[key] = [{"gpu": r} for r in base]
        renamed[("resources", key)] = ("resources", "accelerators")
    return res, renamed


def _skypilot_candidates(entries: list[Any], key: str, base: list[str], base_spot: Any, source: str, lines: _Lines,
                         dropped: list[str], infra: str | None = None) -> tuple[list[dict[str, Any]], list[Any], list[str]]:
    """SkyPilot's candidates -> (ours, the use_spot of each kept one, the ones on other clouds: kept,
    on AWS, with ``infra`` (the --infra flag), else skipped). A candidate's own location, image,
    cpus, memory, ... are dropped (named in ``dropped``): a run has one region and one image."""
    ours, spots, elsewhere = [], [], []
    for i, entry in enumerate(entries):
        at = ("resources", key, i)
        if not isinstance(entry, dict):
            raise _refuse(source, lines, at, f"{entry!r}: a candidate is a mapping (accelerators:, instance_type:, "
                          "use_spot:, ...)")
        entry = _alias(entry, source, lines, at)
        unknown = [k for k in entry if k not in SKYPILOT_RESOURCE_FIELDS + ("gpu",)]
        if unknown:
            raise _refuse(source, lines, at + (unknown[0],), "unknown field", _names_hint(
                unknown[0], ("gpu", "instance_type"), SKYPILOT_RESOURCE_FIELDS))
        if entry.get("any_of") is not None or entry.get("ordered") is not None:
            raise _refuse(source, lines, at, "a candidate cannot hold candidates (SkyPilot refuses this too)")
        cloud = _other_cloud(entry)
        if cloud:
            elsewhere.append(f"[{i}] {cloud}")
            if infra is None:
                continue
        spots.append(entry.get("use_spot", base_spot))
        if entry.get("instance_type"):
            ours.append({"instance_type": entry["instance_type"]})
        elif entry.get("accelerators") is not None:
            requests, _ = _accelerators(entry["accelerators"], source, lines, at + ("accelerators",))
            ours += [{"gpu": r} for r in requests]
        elif entry.get("gpu") is not None:
            ours.append({"gpu": entry["gpu"]})
        else:
            ours += [{"gpu": r} for r in base] or [{}]
        dropped += [f"resources.{key}[{i}].{k}" for k in entry
                    if k not in ("accelerators", "gpu", "instance_type", "use_spot", "infra", "cloud")]
        if "/" in str(entry.get("infra") or "") and not cloud:  # aws/REGION: AWS runs it; the region is dropped
            dropped.append(f"resources.{key}[{i}].infra")
    return ours, spots, elsewhere


#: fields of ec2gpu's own format SkyPilot does not have: a file using one is read as ec2gpu's
_OURS = ("nodes", "checkpoint_dir", "max_runtime", "budget", "ports", "idle_timeout", "array", "sweep", "max_workers",
         "gpus_per_job")
_OURS_RESOURCES = ("gpu", "spot", "disk_gib", "allow_larger", "max_price", "ami")


def _is_skypilot(data: dict[str, Any]) -> bool:
    """Whether ``data`` is a SkyPilot task: it uses a field only SkyPilot has. ``cpus``, ``memory`` and
    ``region``, which both formats have, count as SkyPilot's unless a field only ec2gpu has is there."""
    res = cast(dict[str, Any], data.get("resources")) if isinstance(data.get("resources"), dict) else {}
    candidates = [e for k in ("any_of", "ordered") if isinstance(res.get(k), list)
                  for e in res[k] if isinstance(e, dict)]
    theirs = ("accelerators", "use_spot", "disk_size", "infra", "image_id", "autostop", *SKYPILOT_ALIASES,
              *SKYPILOT_UNSUPPORTED_RESOURCES, *SKYPILOT_UNSUPPORTED_RESOURCES_SAID)
    mounts = cast(dict[str, Any], data.get("file_mounts")) if isinstance(data.get("file_mounts"), dict) else {}
    if ("num_nodes" in data or any(k in data for k in SKYPILOT_UNSUPPORTED) or isinstance(data.get("secrets"), dict)
            or isinstance(data.get("outputs"), dict) or any(k in res for k in theirs)
            or isinstance(data.get("workdir"), dict)  # SkyPilot's git workdir {url, ref}
            or any(isinstance(v, dict) for v in mounts.values())  # SkyPilot's storage entries
            or any(k in e for e in candidates for k in theirs)):
        return True
    ours = any(k in data for k in _OURS) or any(k in res for k in _OURS_RESOURCES)
    return not ours and any(k in res for k in ("cpus", "memory", "region", "ports"))


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
    skypilot = _is_skypilot(data)
    renamed: _Renamed = {}
    git = None
    if isinstance(data.get("workdir"), dict):  # SkyPilot's git form: {url, ref}, cloned on each instance
        git = _git_workdir(data["workdir"], source, lines)
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
        data, renamed = _from_skypilot(data, warnings, source, lines, infra)
    _stringify_envs(data)
    fill_env(data, envs or {}, environ)
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, source, lines, renamed, skypilot)
    workdir = None if task.workdir is None else _workdir(task.workdir, base or Path.cwd(), allow_outside,
                                                          f"{source}:{_line_of(lines, ('workdir',))}: workdir")
    file_mounts = _file_mounts(task, base or Path.cwd(), allow_outside, source, lines, warnings, allowed)
    if overrides:
        task = task.model_copy(update={"resources": task.resources.model_copy(update=overrides)})
    if overrides and ({"gpu", "instance_type"} & set(overrides)):
        return LoadedTask(task, None, workdir, warnings, skypilot, file_mounts, git)
    warnings += _check_resources(task, source, lines, renamed)
    what = "accelerators or instance_type" if skypilot else "gpu or instance_type"
    if _default_type_only(task.resources):
        warnings.append(f"{source}:{_line_of(lines, ('resources',))}: no {what}: ec2gpu, a GPU tool, runs on "
                        f"its default GPU type ({settings.DEFAULT_INSTANCE_TYPE} unless EC2GPU_INSTANCE_TYPE says "
                        "otherwise) where SkyPilot would choose a CPU instance: name one to choose")
    elif _by_need_only(task.resources):
        choice = resolve.plan(task.resources).choices[0]
        t = catalog.CATALOG[cast(str, choice.instance_type)]  # by_need names the type it chose
        warnings.append(f"{source}:{_line_of(lines, ('resources',))}: no {what}: ec2gpu, a GPU tool, runs GPU "
                        f"instances only: {choice.asked} chose the cheapest GPU type meeting them, {t.name} "
                        f"({t.gpu_count} x {t.gpu}, "
                        f"{t.vcpus} vCPUs, {t.memory_gib:g} GiB, {t.on_demand_usd_h:.2f} USD/h), where SkyPilot "
                        "would choose a CPU instance: name a GPU to choose")
    return LoadedTask(task, None, workdir, warnings, skypilot, file_mounts, git)


def _file_mounts(task: Task, base: Path, allow_outside: bool, source: str, lines: _Lines,
                 warnings: list[str], allowed: frozenset[str] = frozenset()) -> list[Mount]:
    """The task's file_mounts made ready (tasks/mounts.parse), each local source checked like a
    workdir (check_local_source: credentials refused; outside the task file's directory only with
    --workdir-outside), none in ec2gpu's own buckets, and a MOUNT entry only of the task's own
    buckets or of ``allowed`` (--allow-write-bucket: mounts.check_write). Raises UsageError at the
    entry's line."""
    from . import mounts
    out = []
    for target, value in task.file_mounts.items():
        where = f"{source}:{_line_of(lines, ('file_mounts', target))}: file_mounts.{target}"
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
            raise UsageError(f"{source}:{_line_of(lines, ('file_mounts', m.target))}: file_mounts: {m.target!r} and "
                             f"{seen[key]!r} are the same place on the instance", "give each its own path")
        seen[key] = m.target
    own = mounts.own_buckets(out)
    for i, m in enumerate(out):
        try:
            out[i] = mounts.check_write(m, own, allowed)
        except UsageError as exc:
            raise UsageError(f"{source}:{_line_of(lines, ('file_mounts', m.target))}: file_mounts.{m.target}: "
                             f"{exc.message}", exc.hint) from None
    unused = sorted(allowed - {m.bucket for m in out if m.write_back})
    if unused:
        warnings.append(f"{mounts.WRITE_FLAG} {', '.join(unused)}: no MOUNT-mode file_mounts entry of the task "
                        "writes there; nothing is allowed by it")
    for m in out:  # what another entry puts under a written-back target would be uploaded to its bucket
        inside = next((w for w in out if w.write_back and w is not m and
                       mounts.normal_target(m.target).startswith(mounts.normal_target(w.target).rstrip("/") + "/")), None)
        if inside is not None:
            raise UsageError(f"{source}:{_line_of(lines, ('file_mounts', m.target))}: file_mounts: {m.target!r} is "
                             f"inside {inside.target!r}, which is written back to s3://{inside.bucket}: its files "
                             f"would be uploaded there", "give it a path of its own, outside the MOUNT target")
    if any(m.write_back for m in out):
        warnings.append(f"{source}:{_line_of(lines, ('file_mounts',))}: file_mounts in mode MOUNT/MOUNT_CACHED are "
                        "copied in before setup, and what the job writes there is written back to the bucket every "
                        "minute and when it ends (an array's: as each instance leaves its pool) (SkyPilot mounts "
                        "them with FUSE; ec2gpu does not)")
    return out


#: a git repository URL a workdir may name: https://, http://, ssh://, git://, file:// or scp-like
#: user@host:path (git-clone(1), "GIT URLS"); never an option (a leading -)
#: a git URL whose host (and user) begins with a letter or digit: nothing git or ssh could read as an
#: option (git refuses "-" hosts since 2.14.1, CVE-2017-1000117; this refuses them before the instance)
_GIT_URL = re.compile(r"((https?|ssh|git)://([A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9\[][^\s]*|file:///[^\s]+"
                      r"|[A-Za-z0-9_][A-Za-z0-9_.-]*@[A-Za-z0-9][A-Za-z0-9.-]*:[^\s]+)")
_GIT_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}")  # a branch, tag or commit (git-check-ref-format(1))


def _git_workdir(value: dict[Any, Any], source: str, lines: _Lines) -> dict[str, str | None]:
    """SkyPilot's ``workdir: {url, ref}`` checked (pure): {"url", "ref" (None: the default branch)}.
    Raises UsageError at its line for another key, a URL that is not a git URL, a bad ref."""
    where = f"{source}:{_line_of(lines, ('workdir',))}: workdir"
    extra = sorted(set(map(str, value)) - {"url", "ref"})
    if extra:
        raise UsageError(f"{where}: unknown field {extra[0]!r} in the git form", "give url: and ref: only")
    url, ref = value.get("url"), value.get("ref")
    if not isinstance(url, str) or not _GIT_URL.fullmatch(url) or len(url) > 2000:
        raise UsageError(f"{where}.url: {str(url)[:80]!r} is not a git repository URL",
                         "e.g. https://github.com/OWNER/REPO.git or git@github.com:OWNER/REPO.git")
    if ref is not None and (not _GIT_REF.fullmatch(str(ref)) or ".." in str(ref)):
        raise UsageError(f"{where}.ref: {str(ref)[:80]!r} is not a branch, tag or commit", "e.g. main, v1.2, 1a2b3c4")
    return {"url": url, "ref": None if ref is None else str(ref)}


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


def _names_hint(name: str | int, ours: Iterable[str], theirs: Iterable[str]) -> str:
    """The hint on an unknown field ``name``: the closest known name, then ec2gpu's and SkyPilot's
    names at that level (pure)."""
    close = difflib.get_close_matches(str(name), list(ours) + list(theirs), 1, 0.7)
    return ((f"did you mean {close[0]}? " if close else "") + f"ec2gpu's fields here: {', '.join(ours)}; "
            f"SkyPilot's (read, mapped or warned about): {', '.join(theirs)}; {DOCS}")


def _first_error(exc: ValidationError, source: str, lines: _Lines, renamed: _Renamed,
                 skypilot: bool = False) -> UsageError:
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    ours = next((o for o in renamed if loc[:len(o)] == o), None)
    shown = renamed[ours] + loc[len(ours):] if ours else loc  # the file's own names (num_nodes, not nodes)
    name = ".".join(str(p) for p in shown) or "task"
    line = _line_of(lines, shown)
    if err["type"] == "extra_forbidden":
        parent: Iterable[str]
        theirs: tuple[str, ...]
        if len(loc) == 1:
            parent, theirs = Task.model_fields, SKYPILOT_FIELDS
        elif len(loc) == 2:
            parent, theirs = cast(Any, Task.model_fields["resources"].annotation).model_fields, SKYPILOT_RESOURCE_FIELDS
        else:  # a candidate of resources.any_of / ordered
            parent, theirs = ("gpu", "instance_type"), SKYPILOT_RESOURCE_FIELDS
        return UsageError(f"{source}:{line}: {name}: unknown field", _names_hint(loc[-1], parent, theirs))
    if err["type"] == "missing":
        return UsageError(f"{source}:{line}: {name}: missing", f"add `{loc[-1]}:`; {DOCS}")
    msg = err["msg"].removeprefix("Value error, ")
    if skypilot and isinstance(err.get("input"), (dict, list)) and msg.startswith("Input should be a valid"):
        msg = f"{err['input']!r} is not what ec2gpu reads here ({msg[0].lower() + msg[1:]})"
    return UsageError(f"{source}:{line}: {name}: {msg}", DOCS)


def _check_resources(task: Task, source: str, lines: _Lines, renamed: _Renamed) -> list[str]:
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
        raise UsageError(f"{source}:{_line_of(lines, loc)}: {name}: {exc.message}", exc.hint)
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
