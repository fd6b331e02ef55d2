"""The Ec2GpuError tree: every error a user can meet, with a message, a hint and an exit code.

Only the CLI turns these into output (one line + hint, or a traceback with --debug).
"""
from __future__ import annotations

import reprlib
from enum import IntEnum
from typing import Any, Mapping


class ExitCode(IntEnum):
    """Process exit codes of the ``ec2gpu`` command."""

    SUCCESS = 0
    ERROR = 1
    USAGE = 2  # bad flag, unknown instance type, unreadable data dir
    AWS = 3  # credentials, permissions, API errors; state the tool cannot read (the ledger)
    CAPACITY = 4  # no capacity / quota for the requested instance types
    REMOTE = 5  # the instance, SSH or the job on it failed
    TIMEOUT = 6  # a wait ran past its bound
    # 75 (EX_TEMPFAIL, "try again later"): a spot interruption ended the run (every attempt allowed was
    # interrupted). The instance side mirrors it: train/spot.py and agent/agent.py exit 75 on a notice
    # (they run on the instance without this package, so they repeat the number).
    SPOT_INTERRUPTED = 75
    CTRL_C = 130


class Ec2GpuError(Exception):
    """Base class: ``message`` says what is wrong, ``hint`` how to fix it."""

    exit_code = ExitCode.ERROR

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint


class UsageError(Ec2GpuError):
    """The user asked for something that cannot work (flag value, instance type, path)."""

    exit_code = ExitCode.USAGE


class RetiredInstanceType(UsageError):
    """The instance type was retired by AWS (g2: Kepler K520)."""


class AwsError(Ec2GpuError):
    """Credentials, region, permissions or an AWS API call failed."""

    exit_code = ExitCode.AWS


class NoCredentials(AwsError):
    """boto3 found no AWS credentials (botocore's NoCredentialsError). The CLI adds to the hint
    when a sandbox is running, since that is usually what the user meant."""

    HINT = ("run `aws configure`, set AWS_PROFILE, or export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
            "or try everything locally with --sandbox")

    def __init__(self, message: str = "no AWS credentials found", hint: str = HINT):
        super().__init__(message, hint)


class LedgerError(Ec2GpuError):
    """The ledger (an SQLite file in EC2GPU_HOME) cannot be read or written: corrupt, not a
    database, or unreadable. A run goes on without it; `ec2gpu runs` stops with this."""

    exit_code = ExitCode.AWS


class SpotRoleMissing(AwsError):
    """The account's first spot request needs the service-linked role AWSServiceRoleForEC2Spot,
    and the caller may not create it (AuthFailure.ServiceLinkedRoleCreationNotPermitted)."""


class CapacityError(Ec2GpuError):
    """No capacity for the requested instance types in the tried availability zones."""

    exit_code = ExitCode.CAPACITY


class RemoteError(Ec2GpuError):
    """A command on the instance failed: what ran, where, how it ended, the last lines of output."""

    exit_code = ExitCode.REMOTE

    def __init__(self, message: str, hint: str = "", *, command: str = "", host: str = "",
                 exit_status: int | None = None, tail: str = ""):
        super().__init__(message, hint)
        self.command, self.host, self.exit_status, self.tail = command, host, exit_status, tail


class LimitReached(RemoteError):
    """The run's --max-runtime came before the job's end: the agent gave the job SIGTERM (and a
    grace period to checkpoint) before its instance ended itself (runs/plan/limits.py). Exit 5."""


class Interrupted(Ec2GpuError):
    """An attempt's instance was lost (spot notice, EC2 terminated it, SSH unreachable too long);
    ``reason`` says how. Inside a managed run it means "replace the instance and resume"; one that
    reaches the user (a standing cluster's run, say) exits 75."""

    exit_code = ExitCode.SPOT_INTERRUPTED

    def __init__(self, reason: str, hint: str = "run again; with --spot a lost instance is replaced and the job resumes"):
        super().__init__(reason, hint)
        self.reason = reason


class AttemptsExhausted(Ec2GpuError):
    """Every attempt allowed by --max-attempts was interrupted."""

    exit_code = ExitCode.SPOT_INTERRUPTED


class WaitTimeout(Ec2GpuError):
    """A bounded wait (instance running, SSH, job) ran out."""

    exit_code = ExitCode.TIMEOUT


class SandboxError(Ec2GpuError):
    """The local sandbox (moto server, sshd) could not be started or reached."""

    exit_code = ExitCode.ERROR


#: pydantic's error types (https://docs.pydantic.dev/latest/errors/validation_errors/) -> what the field
#: takes, in words; {…} are the error's ``ctx`` values
_TAKES = {
    "int_parsing": "a whole number", "int_type": "a whole number", "int_from_float": "a whole number",
    "float_parsing": "a number", "float_type": "a number", "bool_parsing": "true or false",
    "bool_type": "true or false", "string_type": "text", "list_type": "a list (- item lines)",
    "dict_type": "a mapping (key: value lines)", "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "greater_than": "a number above {gt}", "greater_than_equal": "a number of at least {ge}",
    "less_than": "a number below {lt}", "less_than_equal": "a number of at most {le}",
    "literal_error": "one of {expected}", "enum": "one of {expected}",
    "string_too_short": "at least {min_length} character(s)", "string_too_long": "at most {max_length} characters",
    "too_short": "at least {min_length} item(s)", "too_long": "at most {max_length} items",
}


def in_words(err: Mapping[str, Any], patterns: Mapping[str, str] | None = None) -> str:
    """What pydantic's error ``err`` (one item of ``ValidationError.errors()``) says, in the user's
    words: the value given and what the field takes, never a regular expression or pydantic's
    phrasing (issue 48 item 12); a message of ours (a validator's ValueError) as it is (pure).
    ``patterns``: {a field's regular expression: what it allows, in words}."""
    kind, ctx = err["type"], err.get("ctx") or {}
    given = reprlib.repr(err.get("input"))  # bounded: a task file's value can be long
    if kind == "string_pattern_mismatch":
        return f"{given}: should be {(patterns or {}).get(ctx.get('pattern', ''), 'other characters')}"
    if kind in _TAKES:
        return f"{given}: should be {_TAKES[kind].format(**ctx)}"
    return str(err["msg"]).removeprefix("Value error, ")
