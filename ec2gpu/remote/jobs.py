"""Jobs on an instance: start one detached from SSH, follow its log, fetch results.

The job runs under ``setsid nohup`` so a dropped SSH connection (or a dead controller) does not
stop it. It writes its exit status to ``exit_status`` when it ends; the controller reads files,
never parses log lines. The log is followed by byte offset over SFTP, so a reconnect resumes
exactly where it stopped.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import socket
import time

import paramiko
from typing import Callable, cast
from fabric import Connection

from ..errors import RemoteError, WaitTimeout
from . import ssh

READ_TIMEOUT_S = 30.0  # seconds without an answer before a read counts as a dropped connection


def remote_run_dir(conn: Connection, run_id: str) -> str:
    """$HOME/ec2gpu/runs/<run_id> on the instance (absolute)."""
    home = ssh.run(conn, "printf %s \"$HOME\"").strip()
    return f"{home}/ec2gpu/runs/{run_id}"


def job_script(run_dir: str, argv: list[str], env: dict[str, str] | None = None) -> str:
    """The job.sh that runs ``argv`` in ``run_dir`` and records its exit status there (pure).

    Raises ValueError for a key of ``env`` that is not an environment variable name (it would be
    shell text in `export NAME=...`; values are quoted)."""
    bad = [k for k in (env or {}) if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if bad:
        raise ValueError(f"not an environment variable name: {bad[0]!r}")
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
    d = shlex.quote(run_dir)
    # `|| exit` (shellcheck SC2164): a failed cd must not run the job elsewhere, and the exit status
    # goes to an absolute path, so it can never be written anywhere the controller does not look
    return (f"cd {d} || exit 1; {exports}"
            f"{shlex.join(argv)}; echo $? > {d}/exit_status.tmp; mv {d}/exit_status.tmp {d}/exit_status\n")


def start(conn: Connection, run_dir: str, argv: list[str], env: dict[str, str] | None = None,
          private: dict[str, str] | None = None) -> int:
    """Start ``argv`` in ``run_dir`` detached from the SSH session; return its process id.

    stdout/stderr go to ``run_dir``/console.log, the exit status to ``run_dir``/exit_status.
    ``private`` ({file name in ``run_dir``: one line of text}: the agent's key, the hand-over's URLs)
    is written by the command that starts it, mode 0600 from the start, what was there under those
    names (a link, a pipe) removed first; the text goes on that command's stdin, never on a command
    line. Raises ValueError for a name that is not a plain file name or a text with a newline,
    RemoteError when the instance does not answer with a process id.
    """
    private = private or {}
    bad = [k for k, v in private.items() if not re.fullmatch(r"[A-Za-z0-9._-]+", k) or k in (".", "..") or "\n" in v]
    if bad:
        raise ValueError(f"not a file name, or a text of more than one line: {bad[0]!r}")
    d = shlex.quote(run_dir)
    names = " ".join(shlex.quote(k) for k in private)
    # nothing left there (a link the setup made, say) is written through: what this command and job.sh write
    ssh.run(conn, f"cd {d} && rm -f -- job.sh console.log exit_status exit_status.tmp {names}")
    conn.put(io.BytesIO(job_script(run_dir, argv, env).encode()), f"{run_dir}/job.sh")
    # each line read by the shell's builtins (no process holds it in its arguments), written under umask 077
    write = "".join(f'IFS= read -r _ec2gpu_line && printf %s "$_ec2gpu_line" > {shlex.quote(k)} && ' for k in private)
    write = f"( umask 077 && {write}: ) || exit 1; " if private else ""
    # not `cd X && setsid ... &`: that backgrounds a subshell that keeps the session's stdout open,
    # and the SSH command (so this call) would then last as long as the job
    out = ssh.run(conn, f"cd {d} || exit 1; {write}setsid nohup bash job.sh > console.log 2>&1 < /dev/null "
                        "& echo $!", stdin="".join(v + "\n" for v in private.values()) if private else None)
    last = (out.strip().splitlines() or [""])[-1].strip()
    if not last.isdigit() or len(last) > 9:  # the instance's words (its shell may print anything): checked
        raise RemoteError(f"starting the job on {conn.host} gave no process id (got {last[:80]!r})",
                          "look at the instance's ~/.bashrc and ~/.profile: they print or change commands")
    return int(last)


CHUNK_BYTES = 1 << 20  # at most this much of a remote file is read (and held) at once: 1 MiB
PREFETCH_FROM = 64 * 1024  # reads larger than this are prefetched (paramiko SFTPFile.prefetch)
EXIT_STATUS_RE = re.compile(rb"^\s*(-?[0-9]{1,9})\s*$")


def read_from(conn: Connection, path: str, offset: int, limit: int = CHUNK_BYTES) -> bytes:
    """Up to ``limit`` bytes of remote ``path`` from ``offset`` (b'' if it does not exist yet).
    A file may be any size (the job writes it): read it in chunks (``drain``), never whole."""
    sftp = conn.sftp()
    sftp.get_channel().settimeout(READ_TIMEOUT_S)  # a silent network drop raises instead of hanging
    try:
        with sftp.open(path, "rb") as f:
            f.seek(offset)
            if limit <= PREFETCH_FROM:  # a record (exit_status, agent-record.json): one read, no stat round trip
                return cast(bytes, f.read(limit))
            end = min(int(f.stat().st_size or 0), offset + limit)
            if end - offset > PREFETCH_FROM:  # many 32 KiB requests in flight at once, not one round trip each
                f.prefetch(end, max_concurrent_requests=64)
                return cast(bytes, f.read(end - offset))
            return cast(bytes, f.read(limit))
    except FileNotFoundError:
        return b""


def drain(conn: Connection, path: str, cursor: "LogCursor", limit: int | None = None) -> None:
    """Deliver remote ``path`` from ``cursor.offset`` to its current end, one chunk at a time
    (memory stays at CHUNK_BYTES); with ``limit``, stop once the cursor is at ``limit`` bytes."""
    while limit is None or cursor.offset < limit:
        want = CHUNK_BYTES if limit is None else min(CHUNK_BYTES, limit - cursor.offset)
        chunk = read_from(conn, path, cursor.offset, want)
        cursor.deliver(chunk)
        if len(chunk) < want:
            return


def size_of(conn: Connection, path: str) -> int:
    """The size in bytes of remote ``path`` (0 if it does not exist)."""
    try:
        return int(conn.sftp().stat(path).st_size or 0)
    except FileNotFoundError:
        return 0


def exit_status(conn: Connection, run_dir: str) -> int | None:
    """The job's exit status, or None while it is still running. The file is the instance's
    (hostile input): anything but a small integer there reads as 255, an unknown failure, and the
    controller then judges from the agent's status record (runs/execute/engine.py)."""
    data = read_from(conn, f"{run_dir}/exit_status", 0, 64)
    if not data.strip():
        return None
    m = EXIT_STATUS_RE.match(data)
    return int(m.group(1)) if m else 255


class LogCursor:
    """How far a remote log has been delivered: ``offset`` bytes, every one exactly once."""

    def __init__(self, on_bytes: Callable[[bytes], object], offset: int = 0) -> None:
        self.on_bytes, self.offset = on_bytes, offset

    def deliver(self, chunk: bytes) -> None:
        if chunk:
            self.on_bytes(chunk)
            self.offset += len(chunk)


def follow(conn: Connection, run_dir: str, log_name: str, cursor: LogCursor, poll_s: float = 0.5,
           timeout_s: float | None = None, on_poll: Callable[[Connection | None], object] | None = None) -> int:
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
        if status is not None:  # read after the status: nothing written is missed
            drain(conn, path, cursor, limit=size_of(conn, path))  # its size now: a writer left behind cannot hold us
            return status
        chunk = read_from(conn, path, cursor.offset)
        cursor.deliver(chunk)
        if on_poll:
            on_poll(conn)
        if deadline and time.monotonic() > deadline:
            raise WaitTimeout(f"the job in {run_dir} did not end in {timeout_s:.0f} s",
                              "it is still running on the instance")
        if len(chunk) < CHUNK_BYTES:  # a full chunk: more is waiting, read on at once
            time.sleep(poll_s)


#: what a dropped connection raises from paramiko/fabric
CONNECTION_ERRORS = (OSError, EOFError, socket.timeout, paramiko.SSHException)


class Unreachable(Exception):
    """SSH stayed unreachable longer than the bound given to ``follow_reconnecting``."""


def follow_reconnecting(connect: Callable[[], Connection], run_dir: str, log_name: str, cursor: LogCursor, *,
                        conn: Connection | None = None,
                        unreachable_s: float = 120.0, on_poll: Callable[[Connection | None], object] | None = None,
                        log: Callable[[str], None] = lambda msg: None,
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


TAIL_BYTES = 64 * 1024  # a failed job's last lines come from at most its log's last 64 KiB


def tail(conn: Connection, path: str, lines: int = 20) -> str:
    """The last ``lines`` lines of remote ``path`` ('' if absent), from its last TAIL_BYTES bytes."""
    start = max(0, size_of(conn, path) - TAIL_BYTES)
    text = read_from(conn, path, start, TAIL_BYTES).decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


class LineSplitter:
    """Turn a byte stream into whole lines for ``emit``; a line longer than ``max_line`` bytes
    (a job that prints no newline) is emitted in pieces of that size, so memory stays bounded."""

    def __init__(self, emit: Callable[[str], object], max_line: int = 64 * 1024) -> None:
        self.emit, self.buf, self.max_line = emit, b"", max_line

    def __call__(self, chunk: bytes) -> None:
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        while len(self.buf) > self.max_line:
            lines.append(self.buf[:self.max_line])
            self.buf = self.buf[self.max_line:]
        for line in lines:
            self.emit(line.decode(errors="replace"))

    def flush(self) -> None:
        if self.buf:
            self.emit(self.buf.decode(errors="replace"))
            self.buf = b""
