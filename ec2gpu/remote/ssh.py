"""SSH connections (fabric over paramiko): bounded wait-for-SSH, per-instance host-key pinning.

Host keys are pinned in a known_hosts file per instance ($EC2GPU_HOME/known_hosts/<instance-id>),
under the instance id (the file's name), not under an address: the key belongs to the instance,
and its address changes (a stop and start, a tunnel refresh). OpenSSH looks them up the same way
(`HostKeyAlias <instance-id>` in remote/ssh_config.py's entries). A key a file pins under another
name (an address: written before keys were pinned under the instance id) is still the instance's
key, and is pinned under the instance id too at the next connection or ssh_config.

An unknown key is checked against the fingerprints the instance printed to its console
(cloud-init, read through the EC2 API: out of band) and refused if it is not among them; only when
the console has none yet is it trusted on first use, and the user is told. A changed key is always
refused.
"""
from __future__ import annotations

import io
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko
from typing import Any, Callable
from fabric import Connection
from invoke.exceptions import UnexpectedExit

from ..errors import RemoteError, WaitTimeout


# paramiko ships no type information (mypy.ini: ignore_missing_imports), so its policy class is Any
class PinOnFirstUse(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    """For an instance with no pinned key: accept its host key if it matches ``expected``
    fingerprints (or, with none, on first use), pin it in ``known_hosts`` under ``alias`` (the
    instance id) and report it through ``log``. A key that ``expected`` does not list raises
    RemoteError."""

    def __init__(self, known_hosts: Path, log: Callable[[str], None], expected: list[str] | None = None,
                 alias: str | None = None) -> None:
        self.known_hosts, self.log, self.expected = known_hosts, log, list(expected or [])
        self.alias = alias or known_hosts.name

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        fp = key.fingerprint  # "SHA256:...", as ssh-keygen -l prints it
        pinned = pinned_keys(self.known_hosts, self.alias)
        if pinned.get(key.get_name()) == key:  # pinned since this client last connected (fabric reopens it)
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        if pinned:  # pinned already: a key of another type is not the instance's
            raise RemoteError(f"host key {key.get_name()} {fp} of {hostname} is not the one pinned for this "
                              f"instance in {self.known_hosts}",
                              "someone may be intercepting the connection; nothing was sent. If the instance was "
                              f"replaced, delete {self.known_hosts}")
        if self.expected and fp not in self.expected:
            raise RemoteError(f"host key {key.get_name()} {fp} of {hostname} is not one the instance printed to its "
                              f"console ({', '.join(self.expected)})",
                              "someone may be intercepting the connection; nothing was sent. Run `ec2gpu cleanup`")
        _append(self.known_hosts, self.alias, [key])
        client.get_host_keys().add(hostname, key.get_name(), key)  # a reopened connection finds it
        how = "verified against the console output" if self.expected else \
            "trusted on first use (the console output had no fingerprints yet)"
        self.log(f"host key {key.get_name()} {fp} of {hostname} {how}; pinned in {self.known_hosts}")


def pinned_keys(known_hosts: Path, alias: str | None = None) -> dict[str, paramiko.PKey]:
    """The host keys ``known_hosts`` pins for its instance, by key type ("ssh-ed25519"): those under
    ``alias`` (default: the file's name, the instance id) when it has any, else those under any
    name (a file written when keys were pinned under addresses: each was one of the instance's);
    the first of each type. Empty when the file does not exist or pins nothing."""
    if not known_hosts.is_file():
        return {}
    pinned = paramiko.HostKeys(str(known_hosts))
    under_alias = pinned.lookup(alias or known_hosts.name)
    keys: dict[str, paramiko.PKey] = {}
    for held in [under_alias] if under_alias else [pinned[name] for name in pinned.keys()]:
        for kind, key in held.items():
            keys.setdefault(kind, key)
    return keys


def pin_under_alias(known_hosts: Path, alias: str | None = None, log: Callable[[str], None] = lambda msg: None) -> bool:
    """Make sure the keys ``known_hosts`` pins are pinned under ``alias`` (default: the file's name,
    the instance id), so OpenSSH's `HostKeyAlias` lookup finds them: a file that holds them only
    under an earlier address gets a line per key under the alias (no key is added: each is already
    the instance's). Returns whether the file pins any key (False: nothing pinned yet)."""
    keys = pinned_keys(known_hosts, alias)
    if not keys:
        return False
    alias = alias or known_hosts.name
    held = paramiko.HostKeys(str(known_hosts)).lookup(alias) or {}
    missing = [k for k in keys.values() if k.get_name() not in held]
    if missing:
        _append(known_hosts, alias, missing)
        log(f"host key {', '.join(k.get_name() + ' ' + k.fingerprint for k in missing)}, pinned for this instance "
            f"at an earlier address, now pinned under {alias} in {known_hosts}")
    return True


def _append(known_hosts: Path, alias: str, keys: list[paramiko.PKey]) -> None:
    """Add a known_hosts line under ``alias`` for each of ``keys`` (OpenSSH's format)."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    held = known_hosts.read_text() if known_hosts.is_file() else ""
    with open(known_hosts, "a") as f:
        f.write("" if not held or held.endswith("\n") else "\n")  # a hand-edited file's last line
        f.writelines(f"{alias} {k.get_name()} {k.get_base64()}\n" for k in keys)


def connect(host: str, port: int, user: str, key_path: Path, known_hosts: Path,
            log: Callable[[str], None] = lambda msg: None, timeout_s: float = 10.0, expected: list[str] | None = None,
            alias: str | None = None) -> Connection:
    """Open a fabric Connection with only ``key_path`` (no agent, no other keys), accepting only the
    host key ``known_hosts`` pins for the instance (``alias``, default the file's name: its
    instance id), whatever address it answers at; with none pinned, see PinOnFirstUse.

    Raises RemoteError on a host-key mismatch, paramiko/socket errors as they are.
    """
    alias = alias or known_hosts.name
    conn = Connection(host=host, port=port, user=user, connect_timeout=timeout_s, connect_kwargs={
        "key_filename": str(key_path), "look_for_keys": False, "allow_agent": False,
        "banner_timeout": timeout_s, "auth_timeout": timeout_s})
    conn.client.get_host_keys().clear()
    # paramiko has no HostKeyAlias: the instance's keys go under the name it looks up for this
    # address (SSHClient.connect: "host" on port 22, else "[host]:port"), in memory only
    lookup = host if port == 22 else f"[{host}]:{port}"
    pinned = pinned_keys(known_hosts, alias)
    for kind, key in pinned.items():
        conn.client.get_host_keys().add(lookup, kind, key)
    conn.client.set_missing_host_key_policy(PinOnFirstUse(known_hosts, log, expected, alias))
    try:
        conn.open()
        conn.transport.set_keepalive(15)  # notice a dead peer within seconds, not at the next read
    except paramiko.BadHostKeyException as exc:
        raise RemoteError(f"host key {exc.key.get_name()} {exc.key.fingerprint} of {host}:{port} is not the one "
                          f"pinned for this instance ({alias}) in {known_hosts}",
                          "someone may be intercepting the connection; nothing was sent. If the instance was "
                          f"replaced, delete {known_hosts}") from None
    if pinned:
        pin_under_alias(known_hosts, alias, log)
    return conn


#: how long to wait for the console's host key fingerprints before trusting on first use (s).
#: cloud-init prints them in its final stage (keys_to_console), after sshd already answers; on EC2
#: that is typically within a minute or two of boot.
FINGERPRINT_WAIT_S = 180.0


def _pinned(known_hosts: Path) -> bool:
    return bool(pinned_keys(known_hosts))


def wait_for_ssh(host: str, port: int, user: str, key_path: Path, known_hosts: Path,
                 timeout_s: float = 300.0, log: Callable[[str], None] = lambda msg: None,
                 fingerprints: Callable[[], list[str]] | None = None,
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


def run(conn: Connection, command: str, hide: bool = True, timeout_s: float | None = None,
        stdin: str | None = None) -> str:
    """Run ``command``; return its stdout. With ``stdin`` (text), that is sent to its standard input,
    then end of file, and its stdout and stderr are returned together (``with_input``). Raises
    RemoteError with the exit code and output tail (never ``stdin``)."""
    if stdin is not None:
        return with_input(conn, command, stdin, timeout_s or STDIN_TIMEOUT_S)
    try:
        out: str = conn.run(command, hide=hide, in_stream=False, timeout=timeout_s).stdout
        return out
    except UnexpectedExit as exc:
        r = exc.result
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise RemoteError(f"`{command}` on {conn.host} exited {r.exited}", "its output is shown above",
                          command=command, host=conn.host, exit_status=r.exited, tail=tail)


STDIN_TIMEOUT_S = 120.0  # a command given input: the whole exchange (s)
MAX_OUTPUT_BYTES = 1 << 20  # of such a command's output, kept (its last bytes)


def with_input(conn: Connection, command: str, text: str, timeout_s: float = STDIN_TIMEOUT_S) -> str:
    """Run ``command`` on a channel of its own with ``text`` on its standard input, then end of file;
    return its stdout and stderr together (their last MAX_OUTPUT_BYTES). Not invoke's ``in_stream``:
    that writes from a thread of its own, which loses the race with a command that has already read
    what it needed and ended ("Socket is closed"). Raises RemoteError for a non-zero exit, and the
    connection's errors (socket.timeout after ``timeout_s`` s with no progress)."""
    conn.open()  # a no-op when it is open
    transport = conn.client.get_transport()
    if transport is None:
        raise paramiko.SSHException(f"no SSH transport to {conn.host}")
    chan = transport.open_session(timeout=timeout_s)
    try:
        chan.settimeout(timeout_s)
        chan.set_combine_stderr(True)
        chan.exec_command(command)
        try:
            chan.sendall(text.encode())
            chan.shutdown_write()
        except OSError:  # it ended without reading it all: its exit status says how it went
            pass
        out = b""
        while True:
            chunk = chan.recv(65536)
            if not chunk:
                break
            out = (out + chunk)[-MAX_OUTPUT_BYTES:]
        if not chan.status_event.wait(timeout_s):
            raise socket.timeout(f"`{command}` on {conn.host} gave no exit status in {timeout_s:.0f} s")
        code = chan.exit_status
    finally:
        chan.close()
    said = out.decode(errors="replace")
    if code != 0:
        raise RemoteError(f"`{command}` on {conn.host} exited {code}", "its output is shown above",
                          command=command, host=conn.host, exit_status=code,
                          tail="\n".join(said.strip().splitlines()[-15:]))
    return said


def execute(conn: Connection, command: str) -> str:
    """Run ``command`` (a shell line; output hidden, no stdin, no time limit) and return its stdout.

    Unlike ``run``, a non-zero exit raises invoke's UnexpectedExit as it is (not RemoteError); the
    connection's errors (paramiko, socket) propagate."""
    out: str = conn.run(command, hide=True, in_stream=False).stdout
    return out


@dataclass(frozen=True)
class Exit:
    """How a command ended on the instance: its exit status and its whole stdout and stderr (text)."""

    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """Whether it exited 0."""
        return self.exited == 0


def attempt(conn: Connection, command: str, timeout_s: float | None = None, stream: io.TextIOBase | None = None) -> Exit:
    """Run ``command`` (a shell line; output hidden, no stdin) and return how it ended, whatever its
    exit status. ``stream`` (a text stream: a line writer) gets its stdout and stderr as they come;
    the caller flushes it. Raises invoke's CommandTimedOut after ``timeout_s`` seconds (None: no
    limit), and the connection's errors (paramiko, socket)."""
    more: dict[str, Any] = {} if stream is None else {"out_stream": stream, "err_stream": stream}
    if timeout_s is not None:
        more["timeout"] = timeout_s
    got = conn.run(command, hide=True, warn=True, in_stream=False, **more)
    return Exit(got.exited, got.stdout, got.stderr)


def boot_id(conn: Connection) -> str:
    """The kernel's id of the instance's current boot (a UUID, new at every boot; a sandbox instance
    keeps its own in $EC2GPU_BOOT_ID_FILE). Raises invoke's UnexpectedExit when it cannot be read,
    and the connection's errors."""
    out: str = conn.run('cat "${EC2GPU_BOOT_ID_FILE:-/proc/sys/kernel/random/boot_id}"', hide=True,
                        in_stream=False).stdout
    return out.strip()
