"""Instance setup: run ec2gpu/ami/setup-gpu.sh (idempotent, shipped as package data) and read what
the instance has; on an instance where the same script already ran, reuse what it found.

After a setup succeeds, $HOME/.ec2gpu/machine-setup.json on the instance keeps its result with the
script's sha256 and the machine it ran on (instance id and type, and the boot). The next setup
there (`ec2gpu exec` on a standing instance) reuses it instead of running the script again, unless
the script changed (a new ec2gpu), the instance is another one (an image baked with the file in
it), it rebooted (a stop and start: its type, kernel or driver may have changed since), or the
Python it found is gone; `rm ~/.ec2gpu/machine-setup.json` on the instance forces a new setup.
The file is the instance's: it is checked before it is used.
"""
from __future__ import annotations

import hashlib
import io
import json
import shlex
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from fabric import Connection

from ..errors import RemoteError
from ..wire import bounded_json
from . import ssh

SCRIPT = "setup-gpu.sh"
MARKER = ".ec2gpu/machine-setup.json"  # under $HOME on the instance
MAX_MARKER_BYTES = 64 * 1024  # a marker is a few hundred bytes; more is not ours


def script_path() -> Path:
    """The setup script inside the installed package (package data: a wheel carries it too)."""
    return Path(str(resources.files("ec2gpu") / "ami" / SCRIPT))


def script_digest() -> str:
    """The sha256 (hex) of the setup script this controller ships."""
    return hashlib.sha256(script_path().read_bytes()).hexdigest()


def setup(conn: Connection, run_dir: str, log: Callable[[str], None] = lambda line: None,
          machine: str | None = None) -> dict[str, Any]:
    """Make the instance behind ``conn`` ready and return its setup.json (also left in ``run_dir``).

    Keys: python (path of a Python with torch), torch_version, cuda_available, gpu_name,
    driver_version, gpu_count; and ``reused``: None when setup-gpu.sh ran now, else when it ran
    (UTC, ISO 8601) on this same ``machine`` (an opaque string naming the instance: its id and
    type) since its last boot, with the same script, whose result is reused (module docstring).
    With ``machine`` None nothing is reused. Raises RemoteError when the script fails.
    """
    digest = script_digest()
    home, boot, marker = _home_boot_and_marker(conn, run_dir)
    machine = f"{machine} boot {boot}" if machine else None  # a reboot (a stop and start) sets up again
    info = _reusable(conn, marker, digest, machine) if machine else None
    if info is not None:
        log(f"machine setup skipped: {SCRIPT} (sha256 {digest[:12]}) ran on this instance at {info['reused']}; "
            f"python {info['python']}, torch {info.get('torch_version')}")
        conn.put(io.BytesIO(json.dumps(info, indent=2).encode()), f"{run_dir}/setup.json")
        return info
    conn.put(str(script_path()), f"{run_dir}/{SCRIPT}")
    out = ssh.run(conn, f"bash {shlex.quote(run_dir)}/{SCRIPT} {shlex.quote(run_dir)}/setup.json", timeout_s=1800)
    for line in out.splitlines():
        log(line)
    try:  # the script's record, as the instance wrote it: the machine's Python is in it
        info = bounded_json.loads(ssh.run(conn, f"head -c {MAX_MARKER_BYTES + 1} {shlex.quote(run_dir)}/setup.json"),
                                  max_bytes=MAX_MARKER_BYTES)
    except bounded_json.Refused as exc:
        raise RemoteError(f"the machine setup's record ({run_dir}/setup.json) is refused: {exc}",
                          "see its output above", command=SCRIPT) from None
    if machine:  # replaced whole: a reader sees the old marker or the new one
        at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        path = f"{home}/{MARKER}"
        record = {"script_sha256": digest, "machine": machine, "at": at, "setup": info}
        conn.put(io.BytesIO(json.dumps(record).encode()), f"{path}.tmp")
        ssh.run(conn, f"mv {shlex.quote(path + '.tmp')} {shlex.quote(path)}")
    return {**info, "reused": None}


def _home_boot_and_marker(conn: Connection, run_dir: str) -> tuple[str, str, str]:
    """($HOME on the instance, its boot id (Linux's, new at every boot; '' without one), the
    marker's text or ''), in one round trip, ``run_dir`` made on the way, mode 0700: the job's
    environment (its secrets) and the agent's key there are the user's alone (SFTP paths are then
    absolute: its start directory need not be $HOME)."""
    out = ssh.run(conn, f"mkdir -p {shlex.quote(run_dir)} \"$HOME\"/.ec2gpu && chmod 700 {shlex.quote(run_dir)} && "
                        "printf '%s\\n' \"$HOME\" && "
                        "{ head -c 64 /proc/sys/kernel/random/boot_id 2>/dev/null || echo; } && "
                        f"{{ head -c {MAX_MARKER_BYTES + 1} \"$HOME\"/{MARKER} 2>/dev/null || true; }}")
    home, _, rest = out.partition("\n")
    boot, _, marker = rest.partition("\n")
    return home, boot.strip(), marker


def _reusable(conn: Connection, text: str, digest: str, machine: str) -> dict[str, Any] | None:
    """The setup result the marker ``text`` keeps, with ``reused`` its time, when it was made by
    the script ``digest`` on ``machine`` and its Python is still there; else None (no marker,
    another script or machine, a malformed file)."""
    try:
        marker = bounded_json.loads(text, max_bytes=MAX_MARKER_BYTES) if text.strip() else None
    except bounded_json.Refused:
        return None
    if not isinstance(marker, dict) or marker.get("script_sha256") != digest or marker.get("machine") != machine:
        return None
    info, at = marker.get("setup"), marker.get("at")
    if not (isinstance(info, dict) and isinstance(info.get("python"), str) and isinstance(at, str)
            and isinstance(info.get("cuda_available"), bool) and type(info.get("gpu_count")) is int):
        return None
    if not conn.run(f"test -x {shlex.quote(info['python'])}", hide=True, warn=True, in_stream=False).ok:
        return None
    return {**info, "reused": at[:40]}


def has_module(conn: Connection, python: str, module: str) -> bool:
    """Whether ``python`` (a path on the instance) imports ``module`` (a dotted name, shell-safe)
    there: `python -c 'import module'` exits 0. Raises the connection's errors."""
    ok: bool = conn.run(f"{shlex.quote(python)} -c 'import {module}'", warn=True, hide=True).ok
    return ok


#: a task's setup that ran on the instance leaves $HOME/.ec2gpu/setup-done/<key> (runs/execute/engine.setup_hash)
TASK_MARKERS = ".ec2gpu/setup-done"


def _task_marker(key: str) -> str:
    return f'"$HOME/{TASK_MARKERS}/{key}"'  # quoted for the shell (shellcheck SC2086)


def task_setup_done(conn: Connection, key: str) -> str:
    """What the marker of the task setup ``key`` (a hex digest) says on the instance: when it ran
    (UTC, ISO 8601), and the image it was baked into when it was (runs/provision/bake.keep_setup), stripped;
    '' when that setup has not run there. Raises the connection's errors."""
    done = conn.run(f"cat {_task_marker(key)} 2>/dev/null", hide=True, warn=True, in_stream=False)
    return done.stdout.strip() if done.ok else ""


def mark_task_setup_done(conn: Connection, key: str) -> None:
    """Leave the marker of the task setup ``key`` (a hex digest) on the instance, holding the time
    now (UTC, ISO 8601). Raises invoke's UnexpectedExit when it cannot be written, and the
    connection's errors."""
    conn.run(f'mkdir -p "$HOME/{TASK_MARKERS}" && date -u +%Y-%m-%dT%H:%M:%SZ > {_task_marker(key)}', hide=True,
             in_stream=False)
