"""Jobs on an instance: push the code, start it detached from SSH, follow its log, fetch results.

The job runs under ``setsid nohup`` so a dropped SSH connection (or a dead controller) does not
stop it. It writes its exit status to ``exit_status`` when it ends; the controller reads files,
never parses log lines. The log is followed by byte offset over SFTP, so a reconnect resumes
exactly where it stopped.
"""
from __future__ import annotations

import io
import shlex
import stat
import tarfile
import time
from pathlib import Path

from fabric import Connection

from ..errors import WaitTimeout
from . import ssh

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # .../ec2gpu


def remote_run_dir(conn: Connection, run_id: str) -> str:
    """$HOME/ec2gpu/runs/<run_id> on the instance (absolute)."""
    home = ssh.run(conn, "printf %s \"$HOME\"").strip()
    return f"{home}/ec2gpu/runs/{run_id}"


def code_archive() -> bytes:
    """A tar.gz of the trainer: ec2gpu/__init__.py and ec2gpu/train/*.py (no boto3, no fabric)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(PACKAGE_ROOT / "__init__.py", arcname="ec2gpu/__init__.py")
        for path in sorted((PACKAGE_ROOT / "train").glob("*.py")):
            tar.add(path, arcname=f"ec2gpu/train/{path.name}")
    return buf.getvalue()


def push_code(conn: Connection, run_dir: str) -> int:
    """Upload and unpack the trainer into ``run_dir``/code; return the archive size in bytes."""
    blob = code_archive()
    ssh.run(conn, f"mkdir -p {run_dir}/code")
    conn.put(io.BytesIO(blob), f"{run_dir}/code.tar.gz")
    ssh.run(conn, f"tar -xzf {run_dir}/code.tar.gz -C {run_dir}/code")
    return len(blob)


def start(conn: Connection, run_dir: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Start ``argv`` in ``run_dir`` detached from the SSH session; return its process id.

    stdout/stderr go to ``run_dir``/console.log, the exit status to ``run_dir``/exit_status.
    """
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
    script = (f"cd {shlex.quote(run_dir)}; export PYTHONPATH={shlex.quote(run_dir + '/code')}; {exports}"
              f"{shlex.join(argv)}; echo $? > exit_status.tmp; mv exit_status.tmp exit_status\n")
    conn.put(io.BytesIO(script.encode()), f"{run_dir}/job.sh")
    ssh.run(conn, f"rm -f {run_dir}/exit_status")
    out = ssh.run(conn, f"cd {run_dir} && setsid nohup bash job.sh > console.log 2>&1 < /dev/null & echo $!")
    return int(out.strip().splitlines()[-1])


def read_from(conn: Connection, path: str, offset: int) -> bytes:
    """Bytes of remote ``path`` from ``offset`` to its current end (b'' if it does not exist yet)."""
    sftp = conn.sftp()
    try:
        with sftp.open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


def exit_status(conn: Connection, run_dir: str) -> int | None:
    """The job's exit status, or None while it is still running."""
    data = read_from(conn, f"{run_dir}/exit_status", 0).strip()
    return int(data) if data else None


def follow(conn: Connection, run_dir: str, log_name: str, on_bytes, offset: int = 0,
           poll_s: float = 0.5, timeout_s: float | None = None) -> tuple[int, int]:
    """Stream ``log_name`` to ``on_bytes(chunk)`` until the job ends; return (exit status, offset).

    Raises WaitTimeout after ``timeout_s`` seconds (the job keeps running on the instance).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    path = f"{run_dir}/{log_name}"
    while True:
        status = exit_status(conn, run_dir)
        chunk = read_from(conn, path, offset)  # after the status: nothing written is missed
        if chunk:
            on_bytes(chunk)
            offset += len(chunk)
        if status is not None:
            return status, offset
        if deadline and time.monotonic() > deadline:
            raise WaitTimeout(f"the job in {run_dir} did not end in {timeout_s:.0f} s",
                              "it is still running on the instance")
        time.sleep(poll_s)


def fetch(conn: Connection, remote_dir: str, local_dir: Path) -> list[Path]:
    """Download every regular file of ``remote_dir`` (not recursive) into ``local_dir``."""
    local_dir.mkdir(parents=True, exist_ok=True)
    sftp = conn.sftp()
    got = []
    for entry in sftp.listdir_attr(remote_dir):
        if stat.S_ISREG(entry.st_mode) and not entry.filename.startswith("."):
            target = local_dir / entry.filename
            conn.get(f"{remote_dir}/{entry.filename}", str(target))
            got.append(target)
    return got


def tail(conn: Connection, path: str, lines: int = 20) -> str:
    """The last ``lines`` lines of remote ``path`` ('' if absent)."""
    text = read_from(conn, path, 0).decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])
