"""The CLI's one error boundary, ``main``: an exception becomes one line, a hint and an exit code.

An Ec2GpuError says its own message, hint and exit code (ec2gpu.errors); a botocore error the layers
below did not map becomes an AwsError (exit 3); anything else is a bug, said in one line (exit 1).
Every message is printed inert, never as markup (render.error). ``--debug`` anywhere on the line,
or EC2GPU_DEBUG=1, shows the traceback instead. Ctrl-C and SIGTERM end a command with exit 130.
"""
from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, NoReturn

from ..errors import Ec2GpuError, ExitCode, NoCredentials
from . import render
from .app import app

DEBUG = False


def _click_errors(name: str) -> tuple[Any, ...]:  # exception classes, found by name
    """click's exception class ``name``, from click and from the copy typer >= 0.2x vendors as
    ``typer._click`` (a usage error raised by typer is not a ``click.ClickException``)."""
    import importlib
    found = []
    for module in ("click.exceptions", "typer._click.exceptions"):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _aws_error(exc: Exception) -> Ec2GpuError | None:
    """An AwsError (exit 3) for a botocore error (its code, message and operation), else None."""
    if "botocore" not in sys.modules:  # nothing AWS ran: not an AWS error (and no import for it)
        return None
    from ..aws.session import BotoCoreError, ClientError, NoCredentialsError
    from ..errors import AwsError
    if isinstance(exc, NoCredentialsError):
        return _no_credentials(NoCredentials())
    if isinstance(exc, ClientError):
        e = exc.response.get("Error", {})
        code, op = e.get("Code", "?"), getattr(exc, "operation_name", "?")
        hint = ("these credentials lack the permission: see docs/iam-policy.json"
                if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure")
                else "AWS's own words are above; `ec2gpu doctor` checks every precondition")
        return AwsError(f"AWS refused {op}: {code}: {e.get('Message', '')}", hint + "; anything the run made is "
                        "removed by its teardown, or by `ec2gpu cleanup`")
    if isinstance(exc, BotoCoreError):
        return AwsError(f"AWS could not be reached or asked: {exc}",
                        "check the network and credentials (`ec2gpu doctor`); `ec2gpu cleanup` removes what a "
                        "run may have left")
    return None


def _no_credentials(exc: NoCredentials) -> NoCredentials:
    """``exc``, its hint naming the sandbox when one runs in this EC2GPU_HOME (the user most
    likely meant it: `sandbox up` was run, then a command without --sandbox)."""
    from ..sandbox import control
    from ..settings import load
    try:
        state = control.read_state(load().home)
    except Exception:  # noqa: BLE001 - unreadable settings or state: the plain hint is still right
        state = None
    if state:
        exc.hint = (f"a sandbox is running here (pid {state['pid']}): add --sandbox, or point this shell at it with "
                    "`eval \"$(ec2gpu sandbox env)\"`; for AWS itself, run `aws configure` or set AWS_PROFILE")
    return exc


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code. The only place exceptions become messages."""
    global DEBUG
    argv = list(sys.argv[1:] if argv is None else argv)
    DEBUG = "--debug" in argv or os.environ.get("EC2GPU_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    import signal

    received: list[str] = []  # the signals that interrupted this command: what the message says

    def on_signal(signum: int, _frame: FrameType | None) -> NoReturn:
        received.append("Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name)
        raise KeyboardInterrupt  # SIGTERM takes Ctrl-C's path: clean up, exit 130
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # without standalone mode, click/typer *return* the code of typer.Exit, and 130 for Ctrl-C:
        # only a signal seen here makes a 130 an interruption (`logs --follow` passes on a job's 130)
        code = app(args=argv, prog_name="ec2gpu", standalone_mode=False)
        if code == ExitCode.CTRL_C and received:
            raise KeyboardInterrupt
        return code if isinstance(code, int) else 0
    except Ec2GpuError as exc:
        if DEBUG:
            raise
        if isinstance(exc, NoCredentials):
            exc = _no_credentials(exc)
        # messages, tails and hints quote task files, instances and AWS: inert, never markup
        render.error(exc.message, exc.hint, getattr(exc, "tail", ""))
        return int(exc.exit_code)
    except _click_errors("Exit") as exc:
        return int(exc.exit_code)  # click's Exit holds an int
    except (*_click_errors("Abort"), KeyboardInterrupt):
        render.say(render.err, interrupted_message(received))
        return ExitCode.CTRL_C
    except _click_errors("NoArgsIsHelpError") as exc:  # `ec2gpu`, `ec2gpu image`: the help, on stdout as --help's
        print(exc.format_message())
        return ExitCode.USAGE
    except _click_errors("ClickException") as exc:
        exc.show()
        return ExitCode.USAGE
    except Exception as exc:  # the one boundary: an AWS error the layers below did not map, or a bug
        if DEBUG:
            raise
        aws = _aws_error(exc)
        if aws is not None:
            render.error(aws.message, aws.hint)
            return int(aws.exit_code)
        render.error(f"{type(exc).__name__}: {exc}", "run again with --debug for the traceback")
        return ExitCode.ERROR
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def interrupted_message(received: list[str]) -> str:
    """The last line of an interrupted command (pure): which signal stopped it, and nothing it did
    not do. What a command removed on its way out (a run's teardown) it says itself, above."""
    return f"interrupted by {received[0]}" if received else "interrupted"


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
