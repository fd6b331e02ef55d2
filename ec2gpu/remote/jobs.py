"""Jobs on an instance: start one detached from SSH, follow its log, fetch results.

The job runs under ``setsid nohup`` so a dropped SSH connection (or a dead controller) does not
stop it. It writes its exit status to ``exit_status`` when it ends; the controller reads files,
never parses log lines. The log is followed by byte offset over SFTP, so a reconnect resumes
exactly where it stopped.
"""
from __future__ import annotations

import contextlib
import io
import shlex
import socket
import stat
import time
from pathlib import Path

import paramiko
from fabric import Connection

from ..errors import WaitTimeout
from . import ssh

READ_TIMEOUT_S = 30.0  # seconds without an answer before a read counts as a dropped connection


def remote_run_dir(conn: Connection, run_id: str) -> str:
    """$HOME/ec2gpu/runs/<run_id> on the instance (absolute)."""
    home = ssh.run(conn, "printf %s \"$HOME\"").strip()
    return f"{home}/ec2gpu/runs/{run_id}"


def job_script(run_dir: str, argv: list[str], env: dict[str, str] | None = None) -> str:
    """The job.sh that runs ``argv`` in ``run_dir`` and records its exit status there (pure)."""
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
    d = shlex.quote(run_dir)
    # `|| exit` (shellcheck SC2164): a failed cd must not run the job elsewhere, and the exit status
    # goes to an absolute path, so it can never be written anywhere the controller does not look
    return (f"cd {d} || exit 1; {exports}"
            f"{shlex.join(argv)}; echo $? > {d}/exit_status.tmp; mv {d}/exit_status.tmp {d}/exit_status\n")


def start(conn: Connection, run_dir: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Start ``argv`` in ``run_dir`` detached from the SSH session; return its process id.

    stdout/stderr go to ``run_dir``/console.log, the exit status to ``run_dir``/exit_status.
    """
    conn.put(io.BytesIO(job_script(run_dir, argv, env).encode()), f"{run_dir}/job.sh")
    ssh.run(conn, f"rm -f {run_dir}/exit_status")
    # not `cd X && setsid ... &`: that backgrounds a subshell that keeps the session's stdout open,
    # and the SSH command (so this call) would then last as long as the job
    out = ssh.run(conn, f"cd {shlex.quote(run_dir)} || exit 1; setsid nohup bash job.sh > console.log 2>&1 < /dev/null "
                        "& echo $!")
    return int(out.strip().splitlines()[-1])


def read_from(conn: Connection, path: str, offset: int) -> bytes:
    """Bytes of remote ``path`` from ``offset`` to its current end (b'' if it does not exist yet)."""
    sftp = conn.sftp()
    sftp.get_channel().settimeout(READ_TIMEOUT_S)  # a silent network drop raises instead of hanging
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


class LogCursor:
    """How far a remote log has been delivered: ``offset`` bytes, every one exactly once."""

    def __init__(self, on_bytes, offset: int = 0):
        self.on_bytes, self.offset = on_bytes, offset

    def deliver(self, chunk: bytes) -> None:
        if chunk:
            self.on_bytes(chunk)
            self.offset += len(chunk)


def follow(conn: Connection, run_dir: str, log_name: str, cursor: LogCursor, poll_s: float = 0.5,
           timeout_s: float | None = None, on_poll=None) -> int:
    """Stream ``log_name`` through ``cursor`` until the job ends; return its exit status.

    ``on_poll(conn)`` runs after every poll (it may raise to stop following). Raises WaitTimeout
    after ``timeout_s`` seconds (the job keeps running on the instance), and the connection's
    errors (OSError, EOFError, paramiko.SSHException) as they come: ``cursor.offset`` then says
    where to resume.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    path = f"{run_dir}/{log_name}"
    while True:
        status = exit_status(conn, run_dir)
        cursor.deliver(read_from(conn, path, cursor.offset))  # after the status: nothing written is missed
        if status is not None:
            return status
        if on_poll:
            on_poll(conn)
        if deadline and time.monotonic() > deadline:
            raise WaitTimeout(f"the job in {run_dir} did not end in {timeout_s:.0f} s",
                              "it is still running on the instance")
        time.sleep(poll_s)


#: what a dropped connection raises from paramiko/fabric
CONNECTION_ERRORS = (OSError, EOFError, socket.timeout, paramiko.SSHException)


class Unreachable(Exception):
    """SSH stayed unreachable longer than the bound given to ``follow_reconnecting``."""


def follow_reconnecting(connect, run_dir: str, log_name: str, cursor: LogCursor, *, conn: Connection | None = None,
                        unreachable_s: float = 120.0, on_poll=None, log=lambda msg: None,
                        poll_s: float = 0.5) -> tuple[int, Connection]:
    """``follow`` that survives dropped connections: reconnect with backoff (0.5 s doubling to 8 s,
    tenacity) through ``connect()`` and resume at ``cursor.offset``, so no byte is missed or repeated.

    ``on_poll(conn)`` also runs while disconnected, with ``conn`` None (to check the instance's
    state, say). Returns (exit status, the open connection). Raises Unreachable once no connection
    succeeded for ``unreachable_s`` seconds; whatever ``on_poll`` raises.
    """
    import tenacity

    def reconnect(lost_since: float) -> Connection:
        def on_failure(state: tenacity.RetryCallState) -> None:  # before each backoff sleep
            if on_poll:
                on_poll(None)  # may raise (the instance is gone): that ends the wait
        try:
            return tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(CONNECTION_ERRORS), before_sleep=on_failure,
                wait=tenacity.wait_exponential(multiplier=0.5, max=8.0),  # 0.5, 1, 2, 4, 8, 8, ... s
                stop=tenacity.stop_before_delay(max(0.0, lost_since + unreachable_s - time.monotonic())))(connect)
        except tenacity.RetryError as exc:
            raise Unreachable(f"SSH unreachable for {time.monotonic() - lost_since:.0f} s "
                              f"(last error: {exc.last_attempt.exception()})") from None

    if conn is None:
        conn = reconnect(time.monotonic())
    while True:
        try:
            return follow(conn, run_dir, log_name, cursor, poll_s=poll_s, on_poll=on_poll), conn
        except CONNECTION_ERRORS as exc:
            with contextlib.suppress(Exception):
                conn.close()
            lost_since = time.monotonic()
            log(f"SSH connection lost ({type(exc).__name__}: {exc}); the job keeps running, reconnecting")
            if on_poll:
                on_poll(None)
            conn = reconnect(lost_since)
            log(f"reconnected after {time.monotonic() - lost_since:.1f} s; the log resumes at byte {cursor.offset:,}")


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


class LineSplitter:
    """Turn a byte stream into whole lines for ``emit``."""

    def __init__(self, emit):
        self.emit, self.buf = emit, b""

    def __call__(self, chunk: bytes) -> None:
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self.emit(line.decode(errors="replace"))

    def flush(self) -> None:
        if self.buf:
            self.emit(self.buf.decode(errors="replace"))
            self.buf = b""
