"""SSH connections (fabric over paramiko): bounded wait-for-SSH, per-instance host-key pinning.

Host keys are pinned in a known_hosts file per instance ($EC2GPU_HOME/known_hosts/<instance-id>).
An unknown key is checked against the fingerprints the instance printed to its console (cloud-init,
read through the EC2 API: out of band) and refused if it is not among them; only when the console
has none yet is it trusted on first use, and the user is told. A changed key is always refused.
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
    """Accept an unknown host key if it matches ``expected`` fingerprints (or, with none, on first
    use), write it to ``known_hosts`` and report it through ``log``. A key that ``expected`` does
    not list raises RemoteError."""

    def __init__(self, known_hosts: Path, log, expected: list[str] | None = None):
        self.known_hosts, self.log, self.expected = known_hosts, log, list(expected or [])

    def missing_host_key(self, client, hostname, key):
        fp = key.fingerprint  # "SHA256:...", as ssh-keygen -l prints it
        pinned = pinned_keys(self.known_hosts)
        if pinned:  # the instance is known at another address (a stopped and started one has a new IP)
            if (key.get_name(), key.get_base64()) not in pinned:
                raise RemoteError(f"host key {key.get_name()} {fp} of {hostname} is not the one pinned for this "
                                  f"instance in {self.known_hosts}",
                                  "someone may be intercepting the connection; nothing was sent. If the instance was "
                                  f"replaced, delete {self.known_hosts}")
            client.get_host_keys().add(hostname, key.get_name(), key)
            client.save_host_keys(str(self.known_hosts))
            self.log(f"host key {key.get_name()} {fp} of {hostname} is the one pinned for this instance at its "
                     f"earlier address; pinned at this one too in {self.known_hosts}")
            return
        if self.expected and fp not in self.expected:
            raise RemoteError(f"host key {key.get_name()} {fp} of {hostname} is not one the instance printed to its "
                              f"console ({', '.join(self.expected)})",
                              "someone may be intercepting the connection; nothing was sent. Run `ec2gpu cleanup`")
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        client.get_host_keys().add(hostname, key.get_name(), key)
        client.save_host_keys(str(self.known_hosts))
        how = "verified against the console output" if self.expected else \
            "trusted on first use (the console output had no fingerprints yet)"
        self.log(f"host key {key.get_name()} {fp} of {hostname} {how}; pinned in {self.known_hosts}")


def pinned_keys(known_hosts: Path) -> set[tuple[str, str]]:
    """(key type, base64) of every key ``known_hosts`` pins, whatever address it is under; empty
    when the file does not exist yet."""
    if not known_hosts.is_file():
        return set()
    keys = paramiko.HostKeys(str(known_hosts))
    return {(k.get_name(), k.get_base64()) for host in keys.keys() for k in keys[host].values()}


def connect(host: str, port: int, user: str, key_path: Path, known_hosts: Path,
            log=lambda msg: None, timeout_s: float = 10.0, expected: list[str] | None = None) -> Connection:
    """Open a fabric Connection with only ``key_path`` (no agent, no other keys).

    Raises RemoteError on a host-key mismatch, paramiko/socket errors as they are.
    """
    conn = Connection(host=host, port=port, user=user, connect_timeout=timeout_s, connect_kwargs={
        "key_filename": str(key_path), "look_for_keys": False, "allow_agent": False,
        "banner_timeout": timeout_s, "auth_timeout": timeout_s})
    conn.client.get_host_keys().clear()
    if known_hosts.exists():
        conn.client.load_host_keys(str(known_hosts))
    conn.client.set_missing_host_key_policy(PinOnFirstUse(known_hosts, log, expected))
    try:
        conn.open()
        conn.transport.set_keepalive(15)  # notice a dead peer within seconds, not at the next read
    except paramiko.BadHostKeyException as exc:
        raise RemoteError(f"host key of {host} changed: {exc}",
                          f"someone may be intercepting; if the instance was replaced, delete {known_hosts}")
    return conn


#: how long to wait for the console's host key fingerprints before trusting on first use (s).
#: cloud-init prints them in its final stage (keys_to_console), after sshd already answers; on EC2
#: that is typically within a minute or two of boot.
FINGERPRINT_WAIT_S = 180.0


def _pinned(known_hosts: Path) -> bool:
    return known_hosts.is_file() and known_hosts.stat().st_size > 0


def wait_for_ssh(host: str, port: int, user: str, key_path: Path, known_hosts: Path,
                 timeout_s: float = 300.0, log=lambda msg: None, fingerprints=None,
                 fingerprint_wait_s: float = FINGERPRINT_WAIT_S) -> Connection:
    """Retry connecting (with backoff up to 5 s) until SSH answers and ``true`` runs.

    ``fingerprints()`` returns the host key fingerprints the instance published (its console
    output). Unless ``known_hosts`` already pins a key, no connection is made before it has some,
    for up to ``fingerprint_wait_s`` seconds; only then is the key trusted on first use, and
    ``log`` says which happened. Raises WaitTimeout after ``timeout_s`` seconds with the last error
    in the message, RemoteError for a host key that does not match.
    """
    import tenacity

    start = time.monotonic()
    backoff = tenacity.wait_exponential(multiplier=0.5, max=5.0)  # 0.5, 1, 2, 4, 5, 5, ... s
    expected: list[str] = []
    if fingerprints and not _pinned(known_hosts):
        expected = fingerprints()
        if not expected:
            log(f"waiting for {host}'s console to show its host key fingerprints (cloud-init prints them "
                f"once booted; up to {fingerprint_wait_s:.0f} s) so the key can be verified, not trusted")
            expected = tenacity.Retrying(
                retry=tenacity.retry_if_result(lambda got: not got), wait=backoff,
                stop=tenacity.stop_before_delay(min(fingerprint_wait_s, timeout_s)),
                retry_error_callback=lambda state: [])(fingerprints)
            if not expected:
                log(f"no host key fingerprints on {host}'s console after {fingerprint_wait_s:.0f} s")

    def attempt() -> Connection:
        conn = connect(host, port, user, key_path, known_hosts, log, expected=expected)
        conn.run("true", hide=True, in_stream=False)
        return conn

    try:  # RemoteError (a host key that does not match) is not retried
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((OSError, socket.timeout, paramiko.SSHException, EOFError)),
            wait=backoff, stop=tenacity.stop_before_delay(max(0.0, start + timeout_s - time.monotonic())))(attempt)
    except tenacity.RetryError as exc:
        last = exc.last_attempt.exception()
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
