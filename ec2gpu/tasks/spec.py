"""The task: what `ec2gpu run` runs (the user's code) and what `ec2gpu train mnist` runs (a built-in).

A task file is YAML (docs/tasks.md); this pydantic model is its one definition, and
``task.schema.json`` beside this file is generated from it (``python -m ec2gpu.tasks.spec`` writes
it; a test checks it is current), for editors and other tools.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Optional, Self, Union, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..aws.tags import MAX_LABELS, MAX_TAGS, NAME_RE, check_label
from . import arrays
from .mounts import Storage, check_target

SCHEMA_PATH = Path(__file__).with_name("task.schema.json")
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: an EC2 instance type name, FAMILY.SIZE: g4dn.xlarge, p6-b200.48xlarge, u-6tb1.metal (the names
#: DescribeInstanceTypes lists: https://docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html)
EC2_TYPE_RE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")
#: an AWS region (us-east-1, eu-central-2, us-gov-west-1) and an AMI id (ami- and 8 or 17 hex digits:
#: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html)
REGION_RE = re.compile(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]+")
AMI_RE = re.compile(r"ami-[0-9a-f]{8}([0-9a-f]{9})?")
IDLE_FLOOR_MINUTES = 10  # the shortest idle rule: boot, console host keys and the first SSH come first
MAX_MINUTES = 30 * 1440  # the longest duration a task or flag may give (max_runtime, idle_timeout, --expect)
#: the most a setup or run text may hold, bytes: each is one argument of bash on the instance, and
#: Linux refuses one over MAX_ARG_STRLEN (32 pages, 128 KiB: execve(2), "Limits on size of arguments")
MAX_SCRIPT_BYTES = 100 * 1024
MAX_FILE_MOUNTS = 32  # entries in one task's file_mounts
MAX_PORTS = 64  # ports forwarded from one task (each is an SSH forward held while the job runs)
#: the one duration grammar of every flag and field (--max-runtime, --expect, --since, --idle,
#: max_runtime, idle_timeout, autostop): a number and a unit, s m h d w (case ignored)
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])?\s*", re.IGNORECASE)
_UNIT_MINUTES = {"s": 1 / 60, "m": 1, "h": 60, "d": 1440, "w": 7 * 1440}


def minutes(value: Union[int, float, str], default_unit: str | None = "m",
            max_minutes: float | None = MAX_MINUTES) -> float:
    """A duration in minutes from 90, '90m', '2h', '45s', '1d', '2w' (pure). A bare number is in
    ``default_unit`` (minutes; None: a unit is required, as for --since).

    Raises ValueError for anything else, or above ``max_minutes`` (30 days; None: no bound).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool) and default_unit:
        got = float(value) * _UNIT_MINUTES[default_unit]
    else:
        m = _DURATION.fullmatch(str(value)[:64])
        if not m or (m.group(2) is None and not default_unit):
            units = "90m, 2h, 45s, 1d, 2w"
            raise ValueError(f"{str(value)[:64]!r} is not a duration: use "
                             + (f"minutes (90) or a unit ({units})" if default_unit else f"a number and a unit ({units})"))
        # a missing unit without default_unit is refused just above
        got = float(m.group(1)) * _UNIT_MINUTES[(m.group(2) or cast(str, default_unit)).lower()]
    if not math.isfinite(got) or (max_minutes is not None and got > max_minutes):
        raise ValueError(f"{str(value)[:64]!r}: a duration is finite and at most {max_minutes:,.0f} minutes (30 days)")
    return got


def size_bytes(value: Union[int, str]) -> int:
    """A size in bytes from 2048, '500MB', '10G', '4GiB' (pure), by pydantic's ByteSize: K, M, G, T
    (and KB, MB...) are powers of 10, KiB, MiB, GiB, TiB powers of 2, case-insensitive
    (https://docs.pydantic.dev/latest/api/types/#pydantic.types.ByteSize).
    Raises ValueError for anything else, or for a negative size."""
    from pydantic import ByteSize, TypeAdapter, ValidationError
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    text = value.strip() if isinstance(value, str) else value
    try:
        if isinstance(text, str) and not re.fullmatch(r"\d+(\.\d+)?\s*[A-Za-z]{0,3}", text[:64]):
            raise ValueError  # ByteSize reads '1.5.2G' as 1 byte: only a whole number and a unit go to it
        got = int(TypeAdapter(ByteSize).validate_python(text))
    except (ValueError, ValidationError):
        raise ValueError(f"{str(value)[:64]!r} is not a size: use bytes (2048) or a unit (500MB, 10G, 4GiB)") from None
    if got < 0:
        raise ValueError(f"{str(value)[:64]!r}: a size is not negative")
    return got


#: the words that remove a run's limit (--max-runtime none)
OFF_WORDS = ("none", "off", "never")


def max_runtime(value: Union[int, float, str, None]) -> tuple[bool, Optional[int]]:
    """(given, minutes) of a ``--max-runtime`` or ``max_runtime`` value (pure): None -> (False,
    None); 'none'/'off'/'never' -> (True, None); 90, '90m', '2h' -> (True, 90 / 120), whole
    minutes, at least 1, never fewer than asked. Raises ValueError for anything else."""
    if value is None:
        return False, None
    if isinstance(value, str) and value.strip().lower() in OFF_WORDS:
        return True, None
    got = minutes(value)
    if got < 1:
        raise ValueError(f"{str(value)[:64]!r}: at least 1 minute (shutdown counts whole minutes)")
    return True, max(1, math.ceil(got))


def inside_path(value: str, base: str, allow_dot: bool = False) -> str:
    """``value`` when it is a relative path that stays inside ``base`` (pure): not empty, not
    absolute (``/``, ``~``), no ``..`` component, not ``.`` alone unless ``allow_dot``.

    Raises ValueError saying which rule it breaks, relative to ``base`` (e.g. "the workdir").
    """
    parts = PurePosixPath(value.replace("\\", "/")).parts
    if not value.strip():
        raise ValueError(f"empty: give a path relative to {base}")
    if value.startswith(("/", "~", "\\")):
        raise ValueError(f"{value!r} is absolute: give a path relative to {base}")
    if ".." in parts:
        raise ValueError(f"{value!r} goes up with '..': it must stay inside {base}")
    if not allow_dot and not [p for p in parts if p != "."]:
        raise ValueError(f"{value!r} is {base} itself: name a directory below it, e.g. checkpoints")
    return value


#: a GPU request as written: MODEL, or MODEL:COUNT (parse_gpu)
_GPU = re.compile(r"^\s*([^:]+?)\s*(?::\s*([^:]*?)\s*)?$")


def parse_gpu(text: str) -> tuple[str, int | None]:
    """A GPU request -> (model as written, count or None): 'A10G:4' -> ('A10G', 4), 'T4' -> ('T4', None).

    Raises ValueError for an empty model, more than one ':', or a count that is not a whole number
    of at least 1 (a fractional count, SkyPilot's way to share one GPU between jobs on a cluster, is
    named as such).
    """
    m = _GPU.match(str(text))
    if not m or not m.group(1):
        raise ValueError(f"{text!r} is not a GPU: use a model and an optional count, e.g. T4 or A10G:4")
    model, count = m.group(1), m.group(2)
    if count is None:
        return model, None
    if re.fullmatch(r"[0-9]*\.[0-9]+", count) and float(count) > 0:
        raise ValueError(f"{text!r}: a fractional count shares one GPU between jobs on a SkyPilot cluster; "
                         f"ec2gpu gives each run whole GPUs: ask for {model}:1")
    if not re.fullmatch(r"[0-9]+", count) or int(count) < 1:
        raise ValueError(f"{text!r}: the count is a whole number of GPUs per node, at least 1 (e.g. {model}:1)")
    return model, int(count)


#: SkyPilot's memory units (sky/skylet/constants.py, MEMORY_SIZE_UNITS: binary, GB = 2**30 bytes),
#: in GiB; a number without a unit is GB (GiB), as SkyPilot reads it
_MEMORY_UNITS = {"kb": 2 ** -20, "ki": 2 ** -20, "mb": 2 ** -10, "mi": 2 ** -10, "gb": 1, "gi": 1, "tb": 1024,
                 "ti": 1024, "pb": 1024 ** 2, "pi": 1024 ** 2}
_NUMBER = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)$")


def parse_cpus(value: int | float | str) -> tuple[float, bool]:
    """SkyPilot's ``cpus`` -> (vCPUs, at least?) (pure): 8 or '8' -> (8.0, False), exactly 8 vCPUs;
    '8+' -> (8.0, True), at least 8 (https://docs.skypilot.co/en/latest/reference/yaml-spec.html,
    resources.cpus; sky/resources.py ``_set_cpus``). Raises ValueError for anything else or <= 0."""
    text = str(value).strip()
    plus = text.endswith("+")
    number = text[:-1].strip() if plus else text
    if isinstance(value, bool) or not _NUMBER.fullmatch(number) or float(number) <= 0:
        raise ValueError(f"{value!r} is not a vCPU count: a number (exactly that many) or a number and + (at least), "
                         "e.g. 8 or 8+")
    return float(number), plus


def parse_memory(value: int | float | str) -> tuple[float, str]:
    """SkyPilot's ``memory`` -> (GiB, "exact" | "plus" | "x") (pure): 32 -> (32.0, "exact"), exactly
    32 GiB; '64+' -> at least 64 GiB; '64GB', '1TB+', '512MB' with a unit (KB, MB, GB, TB, PB, binary,
    case ignored; GB when none); '4x' -> at least 4 GiB per vCPU (resources_utils.parse_memory_resource
    and catalog/common.py ``_filter_with_mem``). Raises ValueError for anything else or <= 0."""
    text = str(value).strip().lower()
    kind = "plus" if text.endswith("+") else "x" if text.endswith("x") else "exact"
    text = text[:-1].strip() if kind != "exact" else text
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp][bi])?", text)
    if isinstance(value, bool) or not m or float(m.group(1)) <= 0:
        raise ValueError(f"{value!r} is not a memory size: GiB (32: exactly; 32+: at least), or with a unit "
                         "(64GB, 1TB+)")
    return float(m.group(1)) * _MEMORY_UNITS[m.group(2) or "gb"], kind


def _gpu_request(v: Optional[str]) -> Optional[str]:
    """``v`` when it is a GPU request parse_gpu accepts (the model is checked against the
    catalog when the task loads, so the refusal can say why)."""
    if v is not None:
        parse_gpu(v)
    return v


class Candidate(BaseModel):
    """One entry of ``resources.any_of`` or ``resources.ordered``: a GPU request or an instance
    type; an entry with neither stands for the resources' own ``gpu``/``instance_type``."""

    model_config = ConfigDict(extra="forbid")

    gpu: Optional[str] = Field(None, description="a GPU model and count per node, e.g. H100:8 (exact, as "
                                                 "resources.gpu)")
    instance_type: Optional[str] = Field(None, description="an instance type, e.g. p5.48xlarge (wins over gpu)")

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: Optional[str]) -> Optional[str]:
        return _gpu_request(v)


class Resources(BaseModel):
    """What each node needs. ``any_of``/``ordered`` (candidates) win over ``instance_type``, which
    wins over ``gpu``; none of them: the configured default. tasks/resolve.py turns them into the
    instance types to try, in order."""

    model_config = ConfigDict(extra="forbid")

    instance_type: Optional[Union[str, list[str]]] = Field(
        None, description="one instance type, or several in order of preference (g4dn.xlarge, [g5.xlarge, g6.xlarge])")
    gpu: Optional[str] = Field(None, description="a GPU model and count per node, e.g. A10G:4: exactly that many (no "
                                                 "type has exactly that many: refused, unless allow_larger); a model "
                                                 "alone (T4): the cheapest type with that GPU, all of its GPUs")
    allow_larger: bool = Field(False, description="where no instance type has exactly the GPU count asked, take the "
                                                  "cheapest with more: the job sees only the count asked "
                                                  "(CUDA_VISIBLE_DEVICES, SKYPILOT_NUM_GPUS_PER_NODE) and the whole "
                                                  "instance is billed")
    any_of: list[Candidate] = Field(default_factory=list, description="candidates (gpu or instance_type each), tried "
                                                                      "cheapest first; one EC2 cannot run is skipped")
    ordered: list[Candidate] = Field(default_factory=list, description="candidates (gpu or instance_type each), tried "
                                                                       "in this order; one EC2 cannot run is skipped")
    spot: bool = Field(False, description="spot instead of on-demand; a lost instance is replaced and the job resumes")
    max_price: Optional[float] = Field(None, gt=0, description="spot only: the highest USD/h to pay")
    disk_gib: Optional[int] = Field(None, ge=8, le=16384, description="root volume size, GiB (gp3, encrypted)")
    cpus: Optional[Union[int, float, str]] = Field(
        None, description="vCPUs per node, SkyPilot's form: 8 (exactly 8), 8+ (at least 8); chooses the instance "
                          "type together with the GPU (the cheapest that meets it)")
    memory: Optional[Union[int, float, str]] = Field(
        None, description="memory per node in GiB, SkyPilot's form: 64 (exactly), 64+ (at least), or with a unit "
                          "(64GB, 1TB+); chooses the instance type together with the GPU")
    region: Optional[str] = Field(None, description="the AWS region to run in, e.g. us-west-2 (--region and --infra "
                                                    "win; default: EC2GPU_REGION, AWS_REGION, us-east-1)")
    ami: Optional[Union[str, dict[str, str]]] = Field(
        None, description="the AMI to boot (ami-...), or one per region ({us-east-1: ami-..., us-west-2: ami-...}: "
                          "a region without one is refused); --ami wins. Default: the image baked for the setup, "
                          "else the PyTorch Deep Learning AMI")

    max_restarts_on_errors: int = Field(0, ge=0, le=100, description="a detached run (--detach) restarts its job "
                                        "this many times after it exits non-zero, from its last checkpoint "
                                        "(SkyPilot's job_recovery.max_restarts_on_errors); spot interruptions do "
                                        "not count")
    labels: dict[str, str] = Field(default_factory=dict, description="SkyPilot's labels: EC2 tags on each instance "
                                                                      "and its volume (key: value)")

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, v: Any) -> Any:
        return {str(k): "" if x is None else str(x) for k, x in v.items()} if isinstance(v, dict) else v

    @field_validator("labels")
    @classmethod
    def _label_tags(cls, v: dict[str, str]) -> dict[str, str]:
        for k, x in v.items():
            check_label(k, x)
        if len(v) > MAX_LABELS:
            raise ValueError(f"{len(v)} labels: at most {MAX_LABELS} (EC2 allows {MAX_TAGS} tags, "
                             f"ec2gpu keeps {MAX_TAGS - MAX_LABELS} of them)")
        return v

    @field_validator("cpus", "memory")
    @classmethod
    def _cpus_memory(cls, v: Union[int, float, str, None], info: ValidationInfo) -> Union[int, float, str, None]:
        if v is not None:
            (parse_cpus if info.field_name == "cpus" else parse_memory)(v)
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not REGION_RE.fullmatch(v.strip()):
            raise ValueError(f"{v[:40]!r} is not an AWS region (e.g. us-east-1, us-west-2, eu-central-1)")
        return v if v is None else v.strip()

    @field_validator("ami")
    @classmethod
    def _ami(cls, v: Union[str, dict[str, str], None]) -> Union[str, dict[str, str], None]:
        for region, ami in ({"": v} if isinstance(v, str) else v or {}).items():
            if region and not REGION_RE.fullmatch(str(region)):
                raise ValueError(f"{str(region)[:40]!r} is not an AWS region: give {{region: ami-...}} pairs")
            if not AMI_RE.fullmatch(str(ami).strip()):
                raise ValueError(f"{str(ami)[:60]!r} is not an AMI id (ami- and 8 or 17 hex digits)")
        return v

    def ami_for(self, region: str) -> Optional[str]:
        """The AMI ``ami`` names for ``region`` (None: none asked). Raises ValueError when ``ami`` is
        a per-region map without ``region``."""
        if self.ami is None or isinstance(self.ami, str):
            return self.ami
        if region not in self.ami:
            raise ValueError(f"resources.ami has no AMI for {region}: it names {', '.join(self.ami)}")
        return self.ami[region]

    @field_validator("instance_type")
    @classmethod
    def _types(cls, v: Union[str, list[str], None]) -> Union[str, list[str], None]:
        names = [v] if isinstance(v, str) else v
        if names is not None and (not names or any(not n.strip() for n in names)):
            raise ValueError("an instance type is empty: name one, e.g. g4dn.xlarge")
        for n in names or []:
            if not EC2_TYPE_RE.fullmatch(n.strip()):
                raise ValueError(f"{n.strip()[:60]!r} is not an EC2 instance type name (FAMILY.SIZE, e.g. g5.xlarge): "
                                 "another cloud's? name an EC2 type, or ask for a GPU (accelerators: L4:1)")
        return v

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: Optional[str]) -> Optional[str]:
        return _gpu_request(v)

    @model_validator(mode="after")
    def _one_candidate_list(self) -> Self:
        if self.any_of and self.ordered:
            raise ValueError("any_of and ordered together: give one list of candidates (SkyPilot refuses both too)")
        return self

    @property
    def instance_types(self) -> list[str]:
        t = self.instance_type
        return [] if t is None else [t] if isinstance(t, str) else list(t)


class Task(BaseModel):
    """One job: its files (``workdir``), one-time ``setup``, the ``run`` command, and its needs."""

    model_config = ConfigDict(extra="forbid")

    name: Optional[str] = Field(None, pattern=NAME_RE, description="names the run (letters, digits, . _ -)")
    workdir: Optional[str] = Field(".", description="the directory synced to each node, relative to the task "
                                                   "file; null: nothing is synced")
    setup: Optional[str] = Field(None, description="shell, run once per instance for each distinct text")
    run: str = Field(..., min_length=1, description="shell, run in the synced workdir on every node")
    envs: dict[str, Optional[str]] = Field(default_factory=dict,
                                           description="environment of setup and run; null: taken from this machine")
    secrets: list[str] = Field(default_factory=list, description="names in envs whose values are never written "
                                                                 "to logs, run.json, the ledger or the terminal")
    resources: Resources = Field(default_factory=Resources)
    nodes: int = Field(1, ge=1, le=64, description="instances running the job together")
    outputs: list[str] = Field(default_factory=list, description="globs, relative to $EC2GPU_OUTPUT_DIR, to bring "
                                                                 "home; empty: all of it")
    checkpoint_dir: Optional[str] = Field(None, description="where the job writes checkpoints, relative to the "
                                                            "workdir (default: $EC2GPU_CHECKPOINT_DIR); brought home "
                                                            "while it runs and given to a replacement instance")
    max_runtime: Optional[Union[int, float, str]] = Field(None, description="minutes (90) or 90m, 2h: the instances "
                                                                            "terminate themselves after that (the job "
                                                                            "gets SIGTERM first); none: no limit. "
                                                                            "Default: 3 x the task's longest run, "
                                                                            "24 h for its first")
    budget: Optional[float] = Field(None, gt=0, description="USD: refuse a run whose estimate is above it")
    idle_timeout: Optional[Union[int, float, str]] = Field(
        None, description="minutes (30) or 30m, 2h: an instance with no job, SSH connection or busy GPU that long "
                          "terminates itself (the idle rule; SkyPilot's resources.autostop). Default: none, or 30 "
                          "min with max_runtime: none")
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=list, description="ports of node 0 forwarded to 127.0.0.1 here over SSH while the job runs "
                                          "(TensorBoard: [6006]); nothing is opened in the security group")
    array: Optional[Union[int, str]] = Field(
        None, description="run `run` once per index over a pool (ec2gpu/pool): 100 (indices 0-99), 0-99, or 3,7,12 "
                          "(a rerun of some); each element gets EC2GPU_ARRAY_INDEX and EC2GPU_ARRAY_SIZE "
                          "(AWS Batch's AWS_BATCH_JOB_ARRAY_INDEX)")
    sweep: Optional[Union[dict[str, list[Union[bool, int, float, str]]], list[dict[str, Union[bool, int, float, str]]]]] = \
        Field(None, description="parameter sets, each an element of an array with its parameters as environment "
                                "variables: a grid ({lr: [0.001, 0.0003], seed: [0, 1, 2]}: 6 sets) or a list of "
                                "sets")
    max_workers: int = Field(1, ge=1, le=64, description="an array's pool: instances at most (--workers); it starts "
                                                         "with what the elements need and shrinks as the queue drains")
    gpus_per_job: Optional[int] = Field(None, ge=1, le=64, description="an array's elements: GPUs each (Ray's num_gpus; "
                                                                       "CUDA_VISIBLE_DEVICES set per element). "
                                                                       "Default: the task's GPU count")
    max_retries: int = Field(2, ge=0, le=10, description="an array's elements: times one whose run exits non-zero "
                                                         "is run again (--max-retries); one on a lost instance is "
                                                         "always run again, and that is not counted")
    file_mounts: dict[str, Union[str, Storage]] = Field(
        default_factory=dict, description="SkyPilot's file_mounts: {path on the instance: a local path (sent like the "
                                          "workdir), s3://BUCKET/PREFIX (copied by the instance's own role), or "
                                          "{source:, name:, mode: COPY|MOUNT}}; see tasks/mounts.py")

    @field_validator("envs")
    @classmethod
    def _env_names(cls, v: dict[str, Optional[str]]) -> dict[str, Optional[str]]:
        for k in v:
            if not re.fullmatch(ENV_NAME_RE, k):  # fullmatch: `$` alone lets "A\n" through
                raise ValueError(f"{k!r} is not an environment variable name (letters, digits, _)")
        return v

    @field_validator("setup", "run")
    @classmethod
    def _one_argument(cls, v: Optional[str], info: ValidationInfo) -> Optional[str]:
        size = len((v or "").encode("utf-8", "surrogatepass"))
        if size > MAX_SCRIPT_BYTES:
            raise ValueError(f"{size:,} bytes: a {info.field_name} reaches the instance as one argument of bash, at "
                             f"most {MAX_SCRIPT_BYTES // 1024} KiB (Linux's MAX_ARG_STRLEN is 128 KiB): put the script "
                             "in the workdir and call it")
        return v

    @field_validator("file_mounts")
    @classmethod
    def _file_mounts(cls, v: dict[str, Union[str, Storage]]) -> dict[str, Union[str, Storage]]:
        if len(v) > MAX_FILE_MOUNTS:
            raise ValueError(f"{len(v)} entries: at most {MAX_FILE_MOUNTS}")
        for target in v:
            check_target(target)
        return v

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint_dir(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else inside_path(v, "the workdir")

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, v: list[str]) -> list[str]:
        for glob in v:
            inside_path(glob.removeprefix("!"), "$EC2GPU_OUTPUT_DIR", allow_dot=True)
        return v

    @field_validator("idle_timeout")
    @classmethod
    def _idle(cls, v: Union[int, float, str, None]) -> Union[int, float, str, None]:
        if v is not None and minutes(v) < IDLE_FLOOR_MINUTES:
            raise ValueError(f"at least {IDLE_FLOOR_MINUTES} minutes: a booting instance is idle until the controller "
                             "connects")
        return v

    @field_validator("max_runtime")
    @classmethod
    def _duration(cls, v: Union[int, float, str, None]) -> Union[int, float, str, None]:
        if isinstance(v, str) and v.strip().lower() in ("none", "off", "never"):
            return v
        if v is not None and minutes(v) < 1:
            raise ValueError("at least 1 minute (shutdown counts whole minutes)")
        if v is not None:
            minutes(v)
        return v

    @field_validator("array")
    @classmethod
    def _array(cls, v: Union[int, str, None]) -> Union[int, str, None]:
        if v is not None:
            arrays.parse_array(v)
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: Any) -> Any:
        if v is not None:
            arrays.sweep_sets(v)
        return v

    @model_validator(mode="after")
    def _array_fits(self) -> Self:
        if self.array is None and self.sweep is None:
            return self
        arrays.elements(self.array, self.sweep)
        if self.nodes > 1:
            raise ValueError("an array or a sweep runs each element on one instance: drop nodes (or num_nodes), "
                             "or run one job over several instances without array/sweep")
        return self

    @property
    def is_array(self) -> bool:
        """Whether the task asks for an array or a sweep (run over a pool, ec2gpu/pool/)."""
        return self.array is not None or self.sweep is not None

    @model_validator(mode="after")
    def _secrets_are_envs(self) -> Self:
        missing = [s for s in self.secrets if s not in self.envs]
        if missing:
            raise ValueError(f"secrets {', '.join(missing)} are not in envs: list each one in envs too "
                             "(null takes it from this machine)")
        return self

    @property
    def max_runtime_minutes(self) -> Optional[int]:
        """Whole minutes of ``max_runtime`` (None: not set, or none)."""
        return max_runtime(self.max_runtime)[1]


#: the order of plain types in an ``anyOf``: Python caches ``Union[int, float, str]`` as whichever
#: spelling of it was made first in the process (an imported library's may be ``Union[str, int,
#: float]``), so pydantic's order would depend on what was imported before
_TYPE_ORDER = ("integer", "number", "string", "boolean", "array", "object", "null")


def _canonical(node: Any) -> Any:
    """``node`` with every ``anyOf`` of plain types in _TYPE_ORDER (pure)."""
    if isinstance(node, list):
        return [_canonical(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _canonical(v) for k, v in node.items()}
    options = out.get("anyOf")
    if isinstance(options, list) and all(isinstance(o, dict) and set(o) == {"type"} and o["type"] in _TYPE_ORDER
                                         for o in options):
        out["anyOf"] = sorted(options, key=lambda o: _TYPE_ORDER.index(o["type"]))
    return out


def json_schema() -> dict[str, Any]:
    """The task file's JSON Schema (draft 2020-12), from the model, the same whatever was imported first."""
    schema: dict[str, Any] = _canonical(Task.model_json_schema())
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ec2gpu task"
    return schema


if __name__ == "__main__":  # python -m ec2gpu.tasks.spec: rewrite task.schema.json
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2) + "\n")
    print(f"wrote {SCHEMA_PATH}", file=sys.stderr)
