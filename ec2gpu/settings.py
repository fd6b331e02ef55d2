"""Settings: flags > EC2GPU_* environment > ec2gpu.toml > defaults, resolved into one object."""
from __future__ import annotations

import getpass
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

from .errors import UsageError

DEFAULT_REGION = "us-east-1"
DEFAULT_INSTANCE_TYPE = "g4dn.xlarge"  # cheapest NVIDIA T4 instance (catalog.py has the price)


@dataclass(frozen=True)
class Settings:
    """Everything the tool reads from its environment. Paths are absolute."""

    home: Path = field(default_factory=lambda: Path.home() / ".ec2gpu")  # keys, sandbox state
    region: str = DEFAULT_REGION
    instance_type: str = DEFAULT_INSTANCE_TYPE
    owner: str = field(default_factory=getpass.getuser)  # value of the ec2gpu:owner tag
    sandbox: bool = False  # use the local sandbox instead of AWS
    ssh_user: str = "ubuntu"  # login user of the Deep Learning AMI (Ubuntu)
    root_volume_gib: int = 100  # root EBS volume (gp3, encrypted); the DLAMI needs >= 75 GiB
    data_dir: str | None = None  # MNIST directory used on the instance, if it has one
    max_download_files: int = 10_000  # files one run brings home per directory (outputs, checkpoints): remote/files.py
    max_download_bytes: int = 4 << 30  # bytes one run brings home per directory, 4 GiB: remote/files.py
    limit_grace_seconds: int = 120  # a job gets SIGTERM this long before its run's --max-runtime: runs/limits.py

    @property
    def download_limits(self):
        """remote/files.Limits from max_download_files and max_download_bytes."""
        from .remote.files import Limits
        return Limits(self.max_download_files, self.max_download_bytes)

    @property
    def keys_dir(self) -> Path:
        return self.home / "keys"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"


#: environment variable -> field; .env.example documents each one.
ENV = {
    "EC2GPU_HOME": "home", "EC2GPU_REGION": "region", "EC2GPU_INSTANCE_TYPE": "instance_type",
    "EC2GPU_OWNER": "owner", "EC2GPU_SANDBOX": "sandbox", "EC2GPU_SSH_USER": "ssh_user",
    "EC2GPU_ROOT_VOLUME_GIB": "root_volume_gib", "EC2GPU_DATA_DIR": "data_dir",
    "EC2GPU_MAX_DOWNLOAD_FILES": "max_download_files", "EC2GPU_MAX_DOWNLOAD_BYTES": "max_download_bytes",
    "EC2GPU_LIMIT_GRACE_SECONDS": "limit_grace_seconds",
}


def _coerce(name: str, value):
    kind = {f.name: f.type for f in fields(Settings)}[name]
    try:
        if name == "home":
            return Path(value).expanduser().resolve()
        if kind == "bool":
            return str(value).lower() in ("1", "true", "yes", "on") if not isinstance(value, bool) else value
        if kind == "int":
            return int(value)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {value!r}", "fix it in ec2gpu.toml or the environment")
    return str(value)


def load(flags: dict | None = None, environ: Mapping[str, str] | None = None, config: Path | None = None) -> Settings:
    """Resolve settings. ``flags`` holds CLI values (None = not given).

    The config file is ``config``, else ./ec2gpu.toml, else $EC2GPU_HOME/config.toml (keys are
    field names). Raises UsageError for an unreadable file or a bad value.
    """
    environ = os.environ if environ is None else environ
    values: dict = {}
    home = Path(environ.get("EC2GPU_HOME", Path.home() / ".ec2gpu")).expanduser()
    for path in [config] if config else [Path("ec2gpu.toml"), home / "config.toml"]:
        if path and path.is_file():
            try:
                table = tomllib.loads(path.read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise UsageError(f"cannot read {path}: {exc}", "fix or remove the file")
            unknown = set(table) - {f.name for f in fields(Settings)}
            if unknown:
                raise UsageError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}",
                                 f"known: {', '.join(f.name for f in fields(Settings))}")
            values.update(table)
            break
    values.update({f: environ[e] for e, f in ENV.items() if environ.get(e) not in (None, "")})
    values.update({k: v for k, v in (flags or {}).items() if v is not None})
    if "AWS_REGION" in environ and "region" not in values:
        values["region"] = environ["AWS_REGION"]
    elif "AWS_DEFAULT_REGION" in environ and "region" not in values:
        values["region"] = environ["AWS_DEFAULT_REGION"]
    return Settings(**{k: _coerce(k, v) for k, v in values.items()})
