"""The task: what `ec2gpu run` runs (the user's code) and what `ec2gpu train mnist` runs (a built-in).

A task file is YAML (docs/tasks.md); this pydantic model is its one definition, and
``task.schema.json`` beside this file is generated from it (``python -m ec2gpu.tasks.spec`` writes
it; a test checks it is current), for editors and other tools.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Annotated, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..aws.tags import NAME_RE

SCHEMA_PATH = Path(__file__).with_name("task.schema.json")
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")


def minutes(value: Union[int, float, str]) -> float:
    """A duration in minutes from 90, '90m', '2h', '45s', '1d' (a bare number is minutes) (pure).

    Raises ValueError for anything else.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration: use minutes (90) or a unit (90m, 2h, 45s)")
    return float(m.group(1)) * {"s": 1 / 60, "m": 1, "h": 60, "d": 1440}[m.group(2) or "m"]


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


class Resources(BaseModel):
    """What each node needs. ``instance_type`` wins over ``gpu``; neither: the configured default."""

    model_config = ConfigDict(extra="forbid")

    instance_type: Optional[Union[str, list[str]]] = Field(
        None, description="one instance type, or several in order of preference (g4dn.xlarge, [g5.xlarge, g6.xlarge])")
    gpu: Optional[str] = Field(None, description="a GPU model and count, e.g. T4, A10G:4: the cheapest catalog "
                                                 "instance type with at least that many")
    spot: bool = Field(False, description="spot instead of on-demand; a lost instance is replaced and the job resumes")
    max_price: Optional[float] = Field(None, gt=0, description="spot only: the highest USD/h to pay")
    disk_gib: Optional[int] = Field(None, ge=8, le=16384, description="root volume size, GiB (gp3, encrypted)")

    @field_validator("instance_type")
    @classmethod
    def _types(cls, v):
        names = [v] if isinstance(v, str) else v
        if names is not None and (not names or any(not n.strip() for n in names)):
            raise ValueError("an instance type is empty: name one, e.g. g4dn.xlarge")
        return v

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v):
        if v is not None and not re.match(r"^[A-Za-z0-9]+(:[1-9][0-9]*)?$", v):
            raise ValueError(f"{v!r} is not a GPU: use a model and an optional count, e.g. T4 or A10G:4")
        return v

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
    max_runtime: Optional[Union[int, float, str]] = Field(None, description="minutes (90) or 90m, 2h: the instance "
                                                                            "terminates itself after that")
    budget: Optional[float] = Field(None, gt=0, description="USD: refuse a run whose estimate is above it")
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=list, description="ports of node 0 forwarded to 127.0.0.1 here over SSH while the job runs "
                                          "(TensorBoard: [6006]); nothing is opened in the security group")

    @field_validator("envs")
    @classmethod
    def _env_names(cls, v):
        for k in v:
            if not re.fullmatch(ENV_NAME_RE, k):  # fullmatch: `$` alone lets "A\n" through
                raise ValueError(f"{k!r} is not an environment variable name (letters, digits, _)")
        return v

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint_dir(cls, v):
        return v if v is None else inside_path(v, "the workdir")

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, v):
        for glob in v:
            inside_path(glob.removeprefix("!"), "$EC2GPU_OUTPUT_DIR", allow_dot=True)
        return v

    @field_validator("max_runtime")
    @classmethod
    def _duration(cls, v):
        if v is not None and minutes(v) < 1:
            raise ValueError("at least 1 minute (shutdown counts whole minutes)")
        if v is not None:
            minutes(v)
        return v

    @model_validator(mode="after")
    def _secrets_are_envs(self):
        missing = [s for s in self.secrets if s not in self.envs]
        if missing:
            raise ValueError(f"secrets {', '.join(missing)} are not in envs: list each one in envs too "
                             "(null takes it from this machine)")
        return self

    @property
    def max_runtime_minutes(self) -> Optional[int]:
        return None if self.max_runtime is None else max(1, round(minutes(self.max_runtime)))


def json_schema() -> dict:
    """The task file's JSON Schema (draft 2020-12), from the model."""
    schema = Task.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ec2gpu task"
    return schema


if __name__ == "__main__":  # python -m ec2gpu.tasks.spec: rewrite task.schema.json
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2) + "\n")
    print(f"wrote {SCHEMA_PATH}", file=sys.stderr)
