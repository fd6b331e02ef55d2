"""An OpenSSH client config for the running instances, so plain `ssh NAME`, scp, rsync and editors'
remote modes reach them with the right key and the pinned host key.

Written to $EC2GPU_HOME/ssh_config; the user adds `Include ~/.ec2gpu/ssh_config` to ~/.ssh/config
once. Host keys: each instance has its own known_hosts file (remote/ssh.py pins into it, under the
instance id); OpenSSH looks the key up under that id (HostKeyAlias), so a new address (a stop and
start) is still the same pinned host, and accepts only that key (StrictHostKeyChecking yes, never
"accept-new" nor "no"). An instance whose key is not pinned yet is pinned before its entry is
written (runs/standing/hosts.write_ssh_config), never trusted on first use by OpenSSH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Protocol, Sequence


@dataclass(frozen=True)
class HostEntry:
    """One instance as OpenSSH needs it."""

    aliases: tuple[str, ...]  # Name tag, instance id
    host: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path  # $EC2GPU_HOME/known_hosts/<instance-id>

    @property
    def host_key_alias(self) -> str:
        """The name the host key is pinned under: the known_hosts file's name, the instance id."""
        return self.known_hosts.name


#: OpenSSH's keep-alive: a probe after ALIVE_INTERVAL_S s of silence, the connection closed after
#: ALIVE_COUNT unanswered ones (ssh_config(5): ServerAliveInterval, ServerAliveCountMax)
ALIVE_INTERVAL_S, ALIVE_COUNT = 15, 3


def render(entries: list[HostEntry], include_path: Path) -> str:
    """The config text for ``entries`` (pure). Each entry insists on the key its known_hosts file
    pins under its instance id; OpenSSH refuses the host while none is pinned."""
    lines = [f"# Written by ec2gpu at {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC; ec2gpu rewrites it (edits "
             "here are lost).", f"# Use it with `Include {include_path}` in ~/.ssh/config, or `ssh -F {include_path} NAME`.", ""]
    for e in entries:
        lines += [f"Host {' '.join(e.aliases)}",
                  f"    HostName {e.host}", f"    Port {e.port}", f"    User {e.user}",
                  f"    IdentityFile {e.identity_file}", "    IdentitiesOnly yes",
                  f"    UserKnownHostsFile {e.known_hosts}", f"    HostKeyAlias {e.host_key_alias}",
                  "    CheckHostIP no", "    StrictHostKeyChecking yes",
                  # a reclaimed instance's packets vanish without a reset: rsync and ssh give up after
                  # 45 s of silence rather than when TCP does (many minutes); remote/tunnel.py does the same
                  f"    ServerAliveInterval {ALIVE_INTERVAL_S}", f"    ServerAliveCountMax {ALIVE_COUNT}", ""]
    return "\n".join(lines)


def write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 (it names private key files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Reachable(Protocol):
    """A node as a run's SSH config needs it (runs/execute/nodes.Node): its instance id, and the
    address and port its SSH answers on."""

    @property
    def instance_id(self) -> str: ...
    host: str
    port: int


def ssh_config_for(nodes: Iterable[Reachable], path: Path, user: str, key_path: Path, known_hosts: Path) -> Path:
    """Write a run's own SSH config (rsync's, the tunnels') to ``path``, 0600: one entry per node,
    named by its instance id, with the run's key ``key_path`` and the host key pinned in
    ``known_hosts``/<instance id> (remote/ssh.py). Returns ``path``. Raises OSError."""
    write(path, render([HostEntry((nd.instance_id,), nd.host, nd.port, user, key_path, known_hosts / nd.instance_id)
                        for nd in nodes], path))
    return path


def openssh(config: Path, host: str, words: Sequence[str] = ()) -> int:
    """Run OpenSSH (`ssh` on PATH) with ``config`` (this module's, which pins the host key under the
    instance id) to ``host`` on this process's terminal: an interactive shell with no ``words``, else
    the command they make (argv words, joined by OpenSSH with spaces). Returns ssh's exit status: the
    remote command's, 255 for OpenSSH's own failure (a host key that is not the pinned one)."""
    argv = [shutil.which("ssh") or "ssh", "-F", str(config), "-o", "LogLevel=ERROR", host, *words]
    return subprocess.call(argv)
