"""The sandbox's cloud-init: each instance runs its user data the way EC2 delivers it.

EC2 takes ``UserData`` base64-encoded on the wire (boto3 encodes it for RunInstances itself) and
hands the instance the bytes decoded once; cloud-init runs them as a script only when they start
with ``#!`` (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html). So a script that
was encoded twice reaches the instance as base64 text and is never run: here too, and the
instance's ``cloud-init-output.log`` says so.

The script runs once per instance (cloud-init's per-instance scripts), as the instance's own user,
in its environment: HOME is its home, and ``sbin/`` comes first on PATH with stand-ins for
``shutdown``, ``poweroff`` and ``halt`` (guest.py). They ask the daemon to end the instance as its
InstanceInitiatedShutdownBehavior says, so ``shutdown -h +N`` in user data is the
``--max-runtime`` safety net, end to end. It gets none of the daemon's own AWS_* variables (the
controller's keys, profile, endpoint, region): as on EC2, an AWS SDK in user data has the instance's
settings only, and its role's credentials from the metadata service (roles.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: the commands an instance's OS uses to stop itself, each a stand-in calling guest.py
SHUTDOWN_COMMANDS = ("shutdown", "poweroff", "halt")


def decoded_user_data(inst) -> str | None:
    """The user data of moto's Instance ``inst`` as the instance receives it (decoded once), or None."""
    data = getattr(inst, "user_data", None)
    if not data:
        return None
    try:
        return data.decode()
    except (ValueError, UnicodeDecodeError):
        return None


def install_shims(directory: Path, python: str = sys.executable) -> Path:
    """Write the instance's ``sbin/`` (shutdown, poweroff, halt); return it, for the front of PATH."""
    sbin = directory / "sbin"
    sbin.mkdir(parents=True, exist_ok=True)
    for name in SHUTDOWN_COMMANDS:
        path = sbin / name
        path.write_text(f'#!/bin/sh\nexec "{python}" -m ec2gpu.sandbox.guest {name} "$@"\n')
        path.chmod(0o755)
    return sbin


def run_user_data(directory: Path, text: str | None, env: dict[str, str]) -> subprocess.Popen | None:
    """Run ``text`` as cloud-init would, detached, with its output in ``cloud-init-output.log``.

    Returns the process, or None when there is nothing to run (no user data, or data that is not
    a ``#!`` script; the log then says why). The process carries the instance's environment
    (``env``), so stopping the instance stops it too, over the daemon's own less its AWS_* variables.
    """
    log = directory / "cloud-init-output.log"
    if not text:
        log.write_text("cloud-init: no user data\n")
        return None
    script = directory / "user-data"
    script.write_text(text)
    if not text.startswith("#!"):
        log.write_text(f"cloud-init: user data is not a script (it starts with {text[:16]!r}, not '#!'): "
                       "not run. Was it base64-encoded twice?\n")
        return None
    sbin = Path(env.get("PATH", "").split(":")[0])
    if not all((sbin / name).is_file() for name in SHUTDOWN_COMMANDS):
        # never let an instance's `shutdown` reach this machine's own
        raise RuntimeError(f"the instance's PATH must start with its shutdown stand-ins (install_shims), not {sbin}")
    script.chmod(0o700)
    full_env = {**daemon_env(), **env}
    with open(log, "ab") as out:
        return subprocess.Popen([str(script)], cwd=env.get("HOME", str(directory)), env=full_env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)


def daemon_env() -> dict[str, str]:
    """The daemon's environment less every AWS_* variable: the controller's credentials (the
    daemon is started with the caller's environment), profile, endpoint and region are not the
    instance's (the security rule: no AWS credentials copied to instances)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
