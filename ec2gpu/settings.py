"""Settings: flags > EC2GPU_* environment > ec2gpu.toml > AWS_REGION/AWS_DEFAULT_REGION > defaults,
resolved and validated into one frozen object by pydantic-settings
(https://docs.pydantic.dev/latest/concepts/pydantic_settings/)."""
from __future__ import annotations

import contextvars
import getpass
import os
import reprlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pydantic import ByteSize, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict,
                               TomlConfigSettingsSource)

from .errors import UsageError, in_words

if TYPE_CHECKING:  # imported where it is used: `import ec2gpu.settings` stays light for the CLI
    from .remote.files import Limits

DEFAULT_REGION = "us-east-1"
DEFAULT_INSTANCE_TYPE = "g4dn.xlarge"  # cheapest NVIDIA T4 instance (catalog.py has the price)

#: The config file ``load`` reads (None: none): its sources are chosen per call, and pydantic-settings
#: asks the class for them (settings_customise_sources), so the file travels in this variable.
_CONFIG_FILE: contextvars.ContextVar[Optional[Path]] = contextvars.ContextVar("ec2gpu_config_file", default=None)


class _AwsRegion(PydanticBaseSettingsSource):
    """The AWS SDKs' region variables, below ec2gpu's own (EC2GPU_REGION, the config file): AWS_REGION,
    else AWS_DEFAULT_REGION (https://docs.aws.amazon.com/sdkref/latest/guide/feature-region.html)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # the interface's (value, key, is complex); __call__ does the work
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return {"region": region} if region else {}


class Settings(BaseSettings):
    """Everything the tool reads from its environment. Paths are absolute. Each field's variable is
    EC2GPU_<NAME> (.env.example documents each); the config file's keys are the field names."""

    model_config = SettingsConfigDict(env_prefix="EC2GPU_", frozen=True, extra="forbid", env_ignore_empty=True)

    home: Path = Field(default_factory=lambda: Path.home() / ".ec2gpu")  # keys, sandbox state
    region: str = DEFAULT_REGION
    instance_type: str = DEFAULT_INSTANCE_TYPE
    owner: str = Field(default_factory=getpass.getuser)  # value of the ec2gpu:owner tag
    sandbox: bool = False  # use the local sandbox instead of AWS
    ssh_user: str = "ubuntu"  # login user of the Deep Learning AMI (Ubuntu)
    # root EBS volume (gp3, encrypted); the DLAMI needs >= 75 GiB; gp3's range is 1 to 16,384 GiB
    # (https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html)
    root_volume_gib: int = Field(100, ge=1, le=16_384)
    data_dir: Optional[str] = None  # MNIST directory used on the instance, if it has one
    max_download_files: int = Field(10_000, ge=0)  # files one run brings home per directory: remote/files.py
    # bytes one run brings home per directory: 4 GiB; also '4GiB', '500MB' (pydantic's ByteSize)
    max_download_bytes: ByteSize = Field(ByteSize(4 << 30), ge=0)
    limit_grace_seconds: int = Field(120, ge=0)  # a job gets SIGTERM this long before its --max-runtime: runs/plan/limits.py
    # days a detached run's objects are kept in the run store (aws/runstore.py's lifecycle rule; S3's minimum is 1)
    run_store_expire_days: int = Field(30, ge=1)
    # seconds the controller's heartbeat may be silent, once the job has ended, before the instance's
    # agent puts the outputs in the run store itself and ends the instance (agent/agent.py; 0: off)
    handover_wait_seconds: int = Field(300, ge=0, le=86_400)

    @field_validator("home")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return Path(value).expanduser().resolve()

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (the constructor's arguments), then EC2GPU_*, then the config file ``load`` chose,
        then AWS_REGION/AWS_DEFAULT_REGION; no .env file is read."""
        config = _CONFIG_FILE.get()
        toml = (TomlConfigSettingsSource(settings_cls, toml_file=config),) if config else ()
        return (init_settings, env_settings, *toml, _AwsRegion(settings_cls))

    @property
    def download_limits(self) -> Limits:
        """remote/files.Limits from max_download_files and max_download_bytes."""
        from .remote.files import Limits
        return Limits(self.max_download_files, int(self.max_download_bytes))

    @property
    def keys_dir(self) -> Path:
        return self.home / "keys"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"


def private_home(home: Path) -> Path:
    """``home`` (the tool's home: keys, known hosts, the ledger, runs' records, the sandbox's state)
    made if missing, 0700 either way: readable by this user alone, whatever the umask (a home made
    by an older version, 0755 under the usual umask 022, is narrowed). Returns ``home``. Raises
    UsageError when it cannot be made here, or is another user's (root aside: it may narrow any),
    and OSError for what else the file system refuses."""
    hint = "set EC2GPU_HOME to a directory of your own"
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except PermissionError:
        raise UsageError(f"the tool's home {home} cannot be made here (permission denied)", hint) from None
    st = home.stat()
    # another user's home would be theirs to read (keys, the ledger), and chmod refuses it (EPERM)
    mine = getattr(os, "geteuid", lambda: None)() in (None, 0, st.st_uid)
    if mine and st.st_mode & 0o077:
        try:
            home.chmod(0o700)
        except PermissionError:
            mine = False
    if not mine:
        raise UsageError(f"the tool's home {home} is not yours to make private (mode {st.st_mode & 0o7777:04o}, "
                         f"owner {_user_name(st.st_uid)})", hint)
    return home


def _user_name(uid: int) -> str:
    """The login name of user id ``uid``, else the id itself (pwd: POSIX only)."""
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def config_file(config: Path | None = None) -> Optional[Path]:
    """The config file settings are read from: ``config``, else ./ec2gpu.toml, else
    $EC2GPU_HOME/config.toml, the first that exists (None: none does)."""
    home = Path(os.environ.get("EC2GPU_HOME") or Path.home() / ".ec2gpu").expanduser()
    for path in [config] if config else [Path("ec2gpu.toml"), home / "config.toml"]:
        if path and path.is_file():
            return path
    return None


def load(flags: dict[str, Any] | None = None, config: Path | None = None) -> Settings:
    """Resolve settings from ``flags`` (CLI values; None = not given), the environment and the config
    file (config_file). Raises UsageError for an unreadable file, an unknown key or a bad value,
    naming the setting and where it is set."""
    import tomllib
    path = config_file(config)
    token = _CONFIG_FILE.set(path)
    try:
        return Settings(**{k: v for k, v in (flags or {}).items() if v is not None})
    except ValidationError as exc:
        raise _usage_error(exc, path) from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", "fix or remove the file") from None
    finally:
        _CONFIG_FILE.reset(token)


def _usage_error(exc: ValidationError, path: Optional[Path]) -> UsageError:
    """One line for pydantic's first complaint: the setting, what is wrong, where to fix it."""
    err = exc.errors()[0]
    name = ".".join(str(p) for p in err["loc"]) or "settings"
    where = f"{path}, " if path else ""
    if err["type"] == "extra_forbidden":
        known = ", ".join(Settings.model_fields)
        return UsageError(f"{path or 'settings'}: unknown setting {name}", f"known: {known}")
    said, given = in_words(err), reprlib.repr(err.get("input"))
    said = said if said.startswith(given) else f"{given}: {said}"  # a validator's own words: the value first too
    return UsageError(f"setting {name}: {said}",
                      f"fix it in {where}EC2GPU_{name.upper()} or the flag")
