"""SkyPilot's task files, read as ec2gpu's: each field renamed, translated or warned about.

ec2gpu reads the common subset of SkyPilot's task YAML
(https://docs.skypilot.co/en/latest/reference/yaml-spec.html): ``name``, ``workdir`` (and its git
form ``{url, ref}``), ``setup``, ``run``, ``envs``, ``secrets``, ``num_nodes``,
``resources.accelerators`` (and its alias ``gpus``: ``T4:1``, ``{T4: 1}``, ``{A100:8}``, a set
``{H100:8, H200:8}`` tried cheapest first, a list ``[A100:8, H100:8]`` tried in order, SkyPilot's
memory form ``40GB+:1``), ``resources.any_of``/``ordered`` (candidates), ``resources.instance_type``,
``resources.use_spot``, ``resources.disk_size`` (SkyPilot's 256 GB when not given: DEFAULT_DISK_GIB),
``resources.cpus``/``memory`` (choose the type with
the GPU: resolve.Need), ``resources.infra``/``cloud``/``region``/``zone`` (AWS and its region:
infra.py), ``resources.image_id`` (an AMI, or one per region), ``resources.ports`` (forwarded over
SSH, not opened), ``resources.autostop`` (the idle rule), ``resources.job_recovery`` (ec2gpu's own
spot recovery, the differences warned). SkyPilot fields ec2gpu does not support are named in one
warning line, never silently dropped; anything else unknown is an error whose hint lists both
formats' names (load.py). ``from_skypilot`` gives load.py the data in ec2gpu's names, which the
Task model (spec.py) then validates; ``is_skypilot`` tells the two formats apart.
"""
from __future__ import annotations

import re
from typing import Any, cast

from ..aws import catalog
from ..errors import UsageError
from . import resolve
from .infra import INFRA_FLAG, OTHER_CLOUD_HINT, location, other_cloud
from .lines import Lines, Loc, Renamed, line_of, names_hint, refuse
from .spec import IDLE_FLOOR_MINUTES, MAX_MINUTES, MAX_PORTS, parse_gpu

#: SkyPilot fields with no ec2gpu meaning: warned about and ignored
SKYPILOT_UNSUPPORTED = {"volumes", "config", "service", "event_callback", "num_gpus", "docker",
                        "experimental", "pool", "inputs"}
SKYPILOT_UNSUPPORTED_RESOURCES = {"accelerator_args", "disk_tier", "network_tier", "priority", "volumes",
                                  "max_hourly_cost"}
#: SkyPilot resources fields that change nothing in an ec2gpu run, each with a warning (or a refusal)
#: of its own saying what ec2gpu does instead (infra.location, _recovery): the zone (chosen at launch),
#: the cloud (AWS runs it; another is refused), the recovery strategy (ec2gpu's own spot recovery)
SKYPILOT_UNSUPPORTED_RESOURCES_SAID = {"cloud", "zone", "job_recovery", "spot_recovery"}
#: SkyPilot name -> ec2gpu name (resources.accelerators and its candidates: _skypilot_resources, which
#: also puts the values of infra, image_id, ports and autostop in ec2gpu's form before they move)
SKYPILOT_RENAMES = {("num_nodes",): ("nodes",), ("resources", "use_spot"): ("resources", "spot"),
                    ("resources", "disk_size"): ("resources", "disk_gib"),
                    ("resources", "infra"): ("resources", "region"), ("resources", "image_id"): ("resources", "ami"),
                    ("resources", "ports"): ("ports",), ("resources", "autostop"): ("idle_timeout",)}
#: the shortest idle rule autostop becomes, minutes: an instance is idle until the controller's first
#: SSH connection, which comes after the boot, the console's host keys and the first sync
AUTOSTOP_DEFAULT_MINUTES = 5  # autostop: true (yaml-spec.html, resources.autostop: "default idle minutes (5)")
#: Every field SkyPilot's task YAML has (yaml-spec.html; sky/task.py, sky/resources.py), for the hint
#: on an unknown one: read and mapped, or named in the warning as dropped
SKYPILOT_FIELDS = ("name", "workdir", "num_nodes", "resources", "envs", "secrets", "setup", "run", "file_mounts",
                   "volumes", "config", "service", "pool", "event_callback", "inputs", "outputs")
SKYPILOT_RESOURCE_FIELDS = ("infra", "cloud", "region", "zone", "accelerators", "gpus", "accelerator_args", "cpus",
                            "memory", "instance_type", "use_spot", "job_recovery", "spot_recovery", "disk_size",
                            "disk_tier", "network_tier", "ports", "labels", "image_id", "autostop", "any_of", "ordered",
                            "priority", "volumes", "max_hourly_cost")
#: the root volume of a SkyPilot task file that names no disk_size, GiB: SkyPilot's default
#: (sky/resources.py, _DEFAULT_DISK_SIZE_GB = 256), where ec2gpu's own default is smaller (settings.py)
DEFAULT_DISK_GIB = 256
#: SkyPilot's alias in resources and in each candidate (sky/resources.py, RESOURCE_CONFIG_ALIASES)
SKYPILOT_ALIASES = {"gpus": "accelerators"}


def from_skypilot(data: dict[str, Any], warnings: list[str], source: str = "<task>", lines: Lines | None = None,
                  infra: str | None = None) -> tuple[dict[str, Any], Renamed]:
    """SkyPilot's names -> ours; unsupported fields dropped and named in one warning; ``infra``: the
    --infra flag (another cloud in the file is then replaced by AWS, with a warning). Returns (data,
    {our field path: the file's}). Raises UsageError (with the line) for what cannot be mapped."""
    lines = lines or {}
    data = dict(data)
    renamed: Renamed = {}
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
    res = data.setdefault("resources", {})
    if isinstance(res, dict) and res.get("disk_gib") is None:  # the disk SkyPilot would give the task
        res["disk_gib"] = DEFAULT_DISK_GIB
    if isinstance(data.get("secrets"), dict):  # SkyPilot: a map like envs, values hidden
        secrets = data.pop("secrets")
        envs = data.get("envs") or {}
        if not isinstance(envs, dict):
            raise refuse(source, lines, ("envs",), f"{str(envs)[:40]!r} is not a mapping of names to values",
                         "e.g. envs: {EPOCHS: 3, HF_TOKEN: null}")
        data["envs"] = {**envs, **secrets}
        data["secrets"] = list(secrets)
    if dropped:
        warnings.append(f"ignored SkyPilot field(s) ec2gpu does not support: {', '.join(dropped)}")
    return data, renamed


def _alias(res: dict[str, Any], source: str, lines: Lines, loc: Loc) -> dict[str, Any]:
    """``res`` with SkyPilot's aliases (gpus -> accelerators) replaced; both given: refused, as SkyPilot does."""
    res = dict(res)
    for alias, name in SKYPILOT_ALIASES.items():
        if alias in res:
            if name in res:
                raise refuse(source, lines, loc + (alias,), f"both {alias} and {name}: {alias} is SkyPilot's other "
                             f"name for {name}", "keep one of them")
            res[name] = res.pop(alias)
    return res


def _accelerators(value: Any, source: str, lines: Lines, loc: Loc) -> tuple[list[str], str]:
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
        raise refuse(source, lines, loc, f"{value!r} is not an accelerator request",
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
            model, count = parse_gpu(item)
        except ValueError as exc:
            raise refuse(source, lines, loc, str(exc), "e.g. A100:8")
        request = f"{model}:{count or 1}"  # SkyPilot: a name alone is a count of 1
        if request not in requests:
            requests.append(request)
    if not requests:
        raise refuse(source, lines, loc, f"{value!r}: no GPU EC2 sells matches it",
                     f"GPUs EC2 sells: {', '.join(catalog.gpus())}")
    return requests, ("one" if len(requests) == 1 else kind)


_DISK = re.compile(r"\s*(\d+)\s*(gb|gib|g|tb|tib|t)?\s*", re.I)


def _disk_gib(value: str, source: str, lines: Lines, loc: Loc) -> int:
    """SkyPilot's ``disk_size`` written with a unit ('1024GB', '1TB', '256') -> GiB. SkyPilot passes
    its GB figure to EC2 as the volume's size, which EC2 reads in GiB (RunInstances
    BlockDeviceMapping Ebs.VolumeSize), so 1 GB here is 1 GiB, and 1 TB is 1,024 GiB."""
    m = _DISK.fullmatch(value)
    if not m:
        raise refuse(source, lines, loc, f"{value[:40]!r} is not a disk size", "a whole number of GiB: 256, 256GB or 1TB")
    return int(m.group(1)) * (1024 if (m.group(2) or "g").lower().startswith("t") else 1)


def _image(value: Any, source: str, lines: Lines, loc: tuple[str, ...], warnings: list[str],
           replaced: bool) -> str | dict[str, str] | None:
    """SkyPilot's ``image_id`` -> ec2gpu's ``ami`` (an AMI id, or {region: AMI id}), or None where the
    default image runs, with a warning (SkyPilot's own image tags, ``skypilot:gpu-ubuntu-2004``; another
    cloud's image when --infra aws replaced that cloud: ``replaced``). Per
    https://docs.skypilot.co/en/latest/reference/yaml-spec.html (resources.image_id, AWS).

    Raises UsageError at the field's line for ``docker:IMAGE`` (a container: not supported yet) and
    for anything that is not an AMI id."""
    values = list(value.values()) if isinstance(value, dict) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise refuse(source, lines, loc, f"{value!r} is not an image id", "e.g. image_id: ami-0123456789abcdef0, or "
                     "{us-east-1: ami-..., us-west-2: ami-...}")
    values = [v.strip() for v in values]
    docker = next((v for v in values if v.lower().startswith("docker:")), None)
    if docker:
        raise refuse(source, lines, loc, f"{docker[:80]}: running the job in a container is not supported yet",
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
    raise refuse(source, lines, loc, f"{str(value)[:80]}: not an AMI id (ami-...); another cloud's image, or a "
                 "container (docker:... is not supported yet)?",
                 "give an AMI id of the run's region, or drop image_id")


def _ports(value: Any, source: str, lines: Lines, loc: tuple[str, ...], warnings: list[str]) -> list[int]:
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
            raise refuse(source, lines, loc, f"{item!r} is not a port or a range of ports", "e.g. 8080, 10022-10040 "
                         "or [8080, 8081]")
        if last - first + 1 + len(ports) > MAX_PORTS:
            raise refuse(source, lines, loc, f"more than {MAX_PORTS} ports: ec2gpu forwards each one over SSH",
                         "name the ports the job serves on (e.g. [8000, 8265])")
        ports += [p for p in range(first, last + 1) if p not in ports]
    shown = ", ".join(str(p) for p in ports[:8]) + (f" and {len(ports) - 8} more" if len(ports) > 8 else "")
    warnings.append(f"{'.'.join(loc)}: {shown}: forwarded from node 0 to 127.0.0.1 on this machine over SSH while the "
                    "job runs (http://127.0.0.1:PORT here), not opened to the internet as SkyPilot opens them: the "
                    "security group opens SSH alone")
    return ports


_AUTOSTOP_UNITS = {"m": 1, "h": 60, "d": 1440, "w": 10080}  # yaml-spec.html, resources.autostop: <num><unit>
_AUTOSTOP_KEYS = ("idle_minutes", "down", "wait_for", "hook", "hook_timeout")


def _autostop_minutes(value: Any, source: str, lines: Lines, loc: Loc) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhdw])?\s*", str(value).lower()) if not isinstance(value, bool) else None
    if not m:
        raise refuse(source, lines, loc, f"{value!r} is not an idle time", "minutes (10), or 10m, 2h, 1d, 1w")
    got = float(m.group(1)) * _AUTOSTOP_UNITS[m.group(2) or "m"]
    if not got <= MAX_MINUTES:  # inf and NaN too
        raise refuse(source, lines, loc, f"{str(value)[:40]!r}: at most {MAX_MINUTES:,} minutes (30 days)",
                     "minutes (10), or 10m, 2h, 1d, 1w")
    return got


def _autostop(value: Any, source: str, lines: Lines, loc: tuple[str, ...], warnings: list[str]) -> int | None:
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
            raise refuse(source, lines, loc + (unknown[0],), "unknown field",
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


def _recovery(key: str, value: Any, spot: Any, warnings: list[str], source: str, lines: Lines) -> int | None:
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
            raise refuse(source, lines, loc + (unknown[0],), "unknown field",
                         "job_recovery's fields: strategy, max_restarts_on_errors, recover_on_exit_codes")
        strategy, restarts = value.get("strategy"), value.get("max_restarts_on_errors")
        codes = value.get("recover_on_exit_codes")
    elif isinstance(value, str) or value is None:
        strategy, restarts, codes = value, None, None
    else:
        raise refuse(source, lines, loc, f"{value!r} is not a recovery strategy",
                     "e.g. FAILOVER, EAGER_NEXT_REGION, or {strategy: FAILOVER, max_restarts_on_errors: 3}")
    strategy = str(strategy or "EAGER_NEXT_REGION").upper()  # SkyPilot's default
    said = [f"resources.{key}: {strategy}: ec2gpu's own spot recovery applies instead: a lost spot instance is "
            "replaced in the same region, another zone first, up to --max-attempts instances (3 with spot)"]
    if strategy == "EAGER_NEXT_REGION":
        said.append("it does not move to another region")
    if strategy == "NONE":
        said.append("pass --max-attempts 1 for no replacement")
    if restarts is not None and (isinstance(restarts, bool) or not isinstance(restarts, int) or not 0 <= restarts <= 100):
        raise refuse(source, lines, loc + ("max_restarts_on_errors",), f"{restarts!r} is not a count of restarts",
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


def _skypilot_resources(res: dict[str, Any], source: str, lines: Lines, warnings: list[str], dropped: list[str],
                        infra: str | None = None) -> tuple[dict[str, Any], Renamed]:
    """SkyPilot's ``resources`` -> ours (the caller renames use_spot, disk_size, image_id, ports and
    autostop): ``accelerators`` becomes ``gpu`` (one request), ``any_of`` (a set: cheapest first) or
    ``ordered`` (a list: in order); SkyPilot's ``any_of``/``ordered`` become ours, each candidate's
    accelerators kept (a candidate without them inherits the resources' own, as SkyPilot merges them)
    and a candidate on another cloud skipped with a warning (kept on AWS with ``infra``, the --infra
    flag); ``use_spot`` of the candidates becomes the run's (where they differ, warned: ordered, the
    first one's; any_of, spot if one asks for it); ``cpus``/``memory`` stay (ours too); the location
    becomes ``region`` (infra.location), ``image_id`` an AMI (_image), ``ports`` ec2gpu's forwarded
    ports (_ports), ``autostop`` the idle rule (_autostop), ``job_recovery`` a warning (_recovery).
    Unsupported fields are added to ``dropped``. Returns (resources, {our path: the file's})."""
    loc = ("resources",)
    res = _alias(res, source, lines, loc)
    if isinstance(res.get("disk_size"), str):
        res["disk_size"] = _disk_gib(res["disk_size"], source, lines, loc + ("disk_size",))
    renamed = _region_and_image(res, source, lines, warnings, infra)
    if res.get("ports") is not None:
        res["ports"] = _ports(res["ports"], source, lines, loc + ("ports",), warnings)
    if "autostop" in res:
        res["autostop"] = None if res["autostop"] is None else _autostop(res["autostop"], source, lines,
                                                                         loc + ("autostop",), warnings)
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
    renamed.update(_gpu_requests(res, source, lines, warnings, dropped, infra))
    return res, renamed


def _region_and_image(res: dict[str, Any], source: str, lines: Lines, warnings: list[str],
                      infra: str | None) -> Renamed:
    """The location of ``res`` (infra, cloud, region, zone) made its ``region`` (infra.location), and
    its ``image_id`` an AMI or nothing (_image: another cloud's image is dropped where ``infra``, the
    --infra flag, replaced that cloud), in place. Returns {("resources", "region"): the file's field}
    when the region came from another field than ``region``."""
    renamed: Renamed = {}
    written = next((k for k in ("infra", "cloud", "region", "zone") if res.get(k) is not None), None)
    elsewhere = bool(res.get("infra") or res.get("cloud")) and other_cloud(res) is not None
    region = location(res, source, lines, warnings, infra)
    if region:
        res["region"] = region
        if written != "region":
            renamed[("resources", "region")] = ("resources", cast(str, written))  # the region came from it
    if res.get("image_id") is not None:
        res["image_id"] = _image(res["image_id"], source, lines, ("resources", "image_id"), warnings,
                                 elsewhere and infra is not None)
    return renamed


def _gpu_requests(res: dict[str, Any], source: str, lines: Lines, warnings: list[str], dropped: list[str],
                  infra: str | None) -> Renamed:
    """The ``accelerators`` of ``res`` and its ``any_of``/``ordered`` candidates, in place, as
    ec2gpu's ``gpu``, ``any_of`` (a set) or ``ordered`` (a list) (_skypilot_resources says how).
    Returns {our path: ("resources", "accelerators")} for what the accelerators became."""
    loc = ("resources",)
    base: list[str]
    base, kind = ([], "none")
    if "accelerators" in res:
        base, kind = _accelerators(res.pop("accelerators"), source, lines, loc + ("accelerators",))
    key = next((k for k in ("any_of", "ordered") if k in res), None)
    if key and "any_of" in res and "ordered" in res:
        raise refuse(source, lines, loc + ("ordered",), "any_of and ordered together: SkyPilot refuses both too",
                     "keep one list of candidates")
    if key and len(base) > 1 and (key == "ordered" or kind == "list"):
        raise refuse(source, lines, loc + ("accelerators",), f"several accelerators with {key}: SkyPilot refuses "
                     "this too", "list the accelerators in the candidates instead")
    if key:
        _candidates(res, key, base, source, lines, warnings, dropped, infra)
    elif kind == "one":
        res["gpu"] = base[0]
        return {("resources", "gpu"): ("resources", "accelerators")}
    elif kind in ("set", "list"):
        key = "any_of" if kind == "set" else "ordered"
        res[key] = [{"gpu": r} for r in base]
        return {("resources", key): ("resources", "accelerators")}
    return {}


def _candidates(res: dict[str, Any], key: str, base: list[str], source: str, lines: Lines, warnings: list[str],
                dropped: list[str], infra: str | None) -> None:
    """SkyPilot's candidates ``res[key]`` (``key``: any_of or ordered) made ours, in place
    (_skypilot_candidates), the others on another cloud warned about, and their ``use_spot`` made
    the run's one market. Raises UsageError at the field's line for no list, or no AWS candidate."""
    entries = res.pop(key)
    if not isinstance(entries, list) or not entries:
        raise refuse(source, lines, ("resources", key), "a list of candidates (mappings of accelerators, "
                     "instance_type, use_spot, ...)", "e.g. any_of: [{accelerators: H100:8}, {accelerators: H200:8}]")
    res[key], spots, elsewhere = _skypilot_candidates(entries, key, base, res.get("use_spot"), source, lines,
                                                      dropped, infra)
    if elsewhere and infra is None:
        warnings.append(f"resources.{key}: candidates on another cloud skipped: {'; '.join(elsewhere)}")
    elif elsewhere:
        warnings.append(f"resources.{key}: candidates on another cloud run on AWS ({INFRA_FLAG} {infra}): "
                        f"{'; '.join(elsewhere)}")
    if not res[key]:
        raise refuse(source, lines, ("resources", key), "every candidate names another cloud than AWS: "
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


def _skypilot_candidates(entries: list[Any], key: str, base: list[str], base_spot: Any, source: str, lines: Lines,
                         dropped: list[str], infra: str | None = None) -> tuple[list[dict[str, Any]], list[Any], list[str]]:
    """SkyPilot's candidates -> (ours, the use_spot of each kept one, the ones on other clouds: kept,
    on AWS, with ``infra`` (the --infra flag), else skipped). A candidate's own location, image,
    cpus, memory, ... are dropped (named in ``dropped``): a run has one region and one image."""
    ours, spots, elsewhere = [], [], []
    for i, entry in enumerate(entries):
        at = ("resources", key, i)
        if not isinstance(entry, dict):
            raise refuse(source, lines, at, f"{entry!r}: a candidate is a mapping (accelerators:, instance_type:, "
                         "use_spot:, ...)")
        entry = _alias(entry, source, lines, at)
        unknown = [k for k in entry if k not in SKYPILOT_RESOURCE_FIELDS + ("gpu",)]
        if unknown:
            raise refuse(source, lines, at + (unknown[0],), "unknown field", names_hint(
                unknown[0], ("gpu", "instance_type"), SKYPILOT_RESOURCE_FIELDS))
        if entry.get("any_of") is not None or entry.get("ordered") is not None:
            raise refuse(source, lines, at, "a candidate cannot hold candidates (SkyPilot refuses this too)")
        cloud = other_cloud(entry)
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


def is_skypilot(data: dict[str, Any]) -> bool:
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


#: a git repository URL a workdir may name: https://, http://, ssh://, git://, file:// or scp-like
#: user@host:path (git-clone(1), "GIT URLS"); never an option (a leading -)
#: a git URL whose host (and user) begins with a letter or digit: nothing git or ssh could read as an
#: option (git refuses "-" hosts since 2.14.1, CVE-2017-1000117; this refuses them before the instance)
_GIT_URL = re.compile(r"((https?|ssh|git)://([A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9\[][^\s]*|file:///[^\s]+"
                      r"|[A-Za-z0-9_][A-Za-z0-9_.-]*@[A-Za-z0-9][A-Za-z0-9.-]*:[^\s]+)")
_GIT_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}")  # a branch, tag or commit (git-check-ref-format(1))


def git_workdir(value: dict[Any, Any], source: str, lines: Lines) -> dict[str, str | None]:
    """SkyPilot's ``workdir: {url, ref}`` checked (pure): {"url", "ref" (None: the default branch)}.
    Raises UsageError at its line for another key, a URL that is not a git URL, a bad ref."""
    where = f"{source}:{line_of(lines, ('workdir',))}: workdir"
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
