"""SSH connections (fabric over paramiko): bounded wait-for-SSH, per-instance host-key pinning.

Host keys are trusted on first use and pinned in a known_hosts file per instance
($EC2GPU_HOME/known_hosts/<instance-id>); a changed key is refused, never silently accepted.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path

import paramiko
from fabric import Connection
from invoke.exceptions import UnexpectedExit

from ..errors import RemoteError, WaitTimeout


class PinOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Accept an unknown host key once, write it to ``known_hosts`` and report it through ``log``."""

    def __init__(self, known_hosts: Path, log):
        self.known_hosts, self.log = known_hosts, log

    def missing_host_key(self, client, hostname, key):
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        client.get_host_keys().add(hostname, key.get_name(), key)
        client.save_host_keys(str(self.known_hosts))
        self.log(f"trusting host key {key.get_name()} SHA256:{_fingerprint(key)} of {hostname} on first use "
                 f"(pinned in {self.known_hosts})")


def _fingerprint(key) -> str:
    import base64
    import hashlib
    return base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def connect(host: str, port: int, user: str, key_path: Path, known_hosts: Path,
            log=lambda msg: None, timeout_s: float = 10.0) -> Connection:
    """Open a fabric Connection with only ``key_path`` (no agent, no other keys).

    Raises RemoteError on a host-key mismatch, paramiko/socket errors as they are.
    """
    conn = Connection(host=host, port=port, user=user, connect_timeout=timeout_s, connect_kwargs={
        "key_filename": str(key_path), "look_for_keys": False, "allow_agent": False,
        "banner_timeout": timeout_s, "auth_timeout": timeout_s})
    conn.client.get_host_keys().clear()
    if known_hosts.exists():
        conn.client.load_host_keys(str(known_hosts))
    conn.client.set_missing_host_key_policy(PinOnFirstUse(known_hosts, log))
    try:
        conn.open()
    except paramiko.BadHostKeyException as exc:
        raise RemoteError(f"host key of {host} changed: {exc}",
                          f"someone may be intercepting; if the instance was replaced, delete {known_hosts}")
    return conn


def wait_for_ssh(host: str, port: int, user: str, key_path: Path, known_hosts: Path,
                 timeout_s: float = 300.0, log=lambda msg: None) -> Connection:
    """Retry connecting (with backoff up to 5 s) until SSH answers and ``true`` runs.

    Raises WaitTimeout after ``timeout_s`` seconds with the last error in the message.
    """
    deadline, delay, last = time.monotonic() + timeout_s, 0.5, None
    while time.monotonic() < deadline:
        try:
            conn = connect(host, port, user, key_path, known_hosts, log)
            conn.run("true", hide=True, in_stream=False)
            return conn
        except RemoteError:
            raise
        except (OSError, socket.timeout, paramiko.SSHException, EOFError) as exc:
            last = exc
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 5.0)
    raise WaitTimeout(f"SSH to {user}@{host}:{port} did not answer in {timeout_s:.0f} s (last error: {last})",
                      "the instance may still be booting, or the security group does not admit your IP")


def run(conn: Connection, command: str, hide: bool = True, timeout_s: float | None = None) -> str:
    """Run ``command``; return its stdout. Raises RemoteError with the exit code and output tail."""
    try:
        return conn.run(command, hide=hide, in_stream=False, timeout=timeout_s).stdout
    except UnexpectedExit as exc:
        r = exc.result
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise RemoteError(f"`{command}` on {conn.host} exited {r.exited}", "its output is shown above",
                          command=command, host=conn.host, exit_status=r.exited, tail=tail)
