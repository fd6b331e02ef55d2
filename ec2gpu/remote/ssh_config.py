"""An OpenSSH client config for the running instances, so plain `ssh NAME`, scp, rsync and editors'
remote modes reach them with the right key and the pinned host key.

Written to $EC2GPU_HOME/ssh_config; the user adds `Include ~/.ec2gpu/ssh_config` to ~/.ssh/config
once. Host keys: each instance has its own known_hosts file (remote/ssh.py pins into it); where it
already holds the key, StrictHostKeyChecking is "yes", otherwise "accept-new" (trust on first use,
said in a comment), never "no".
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


@dataclass(frozen=True)
class HostEntry:
    """One instance as OpenSSH needs it."""

    aliases: tuple[str, ...]  # Name tag, instance id
    host: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path


def render(entries: list[HostEntry], include_path: Path) -> str:
    """The config text for ``entries`` (pure)."""
    lines = [f"# Written by `ec2gpu ssh-config` at {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC; rewritten "
             f"each time.", f"# Use it with `Include {include_path}` in ~/.ssh/config, or `ssh -F {include_path} NAME`.", ""]
    for e in entries:
        pinned = e.known_hosts.is_file() and e.known_hosts.stat().st_size > 0
        lines += [f"Host {' '.join(e.aliases)}",
                  f"    HostName {e.host}", f"    Port {e.port}", f"    User {e.user}",
                  f"    IdentityFile {e.identity_file}", "    IdentitiesOnly yes",
                  f"    UserKnownHostsFile {e.known_hosts}"]
        if pinned:
            lines.append("    StrictHostKeyChecking yes")
        else:
            lines += ["    # no host key pinned yet: the first connection pins it (trust on first use)",
                      "    StrictHostKeyChecking accept-new"]
        lines.append("")
    return "\n".join(lines)


def write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 (it names private key files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
