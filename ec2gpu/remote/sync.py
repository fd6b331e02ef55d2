"""The workdir up, the outputs home: which files go (ignore rules), and moving them (rsync, else SFTP).

Which files: inside a git repository, ``git ls-files --cached --others --exclude-standard`` (every
.gitignore, .git/info/exclude and the global excludes, as git reads them); elsewhere the
directory's own .gitignore read with pathspec. ``.ec2gpuignore`` (gitignore syntax) is applied on
top, adding to .gitignore, never replacing it. ``.git/``, ``.env*``, ``*.pem``, ``*.key`` and private
keys (SSH key file names, or a PEM "PRIVATE KEY" header) never go unless ``allow_secrets``; what
ec2gpu brought home on earlier runs (``runs/<run id>/``) never goes.

How: real ``rsync`` over the run's own SSH (an OpenSSH config with the run's key and the host key
pinned, StrictHostKeyChecking yes) when both sides have it, so a rerun sends only what changed;
otherwise one tar archive over SFTP, unpacked on the instance.
"""
from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from ..errors import RemoteError, UsageError

IGNORE_FILE = ".ec2gpuignore"
#: never sent unless --include-secrets: credentials and version-control internals
NEVER_SEND = [".git/", ".env", ".env.*", "*.pem", "*.key", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519",
              "*.p12", "*.pfx", ".aws/", ".ssh/"]
#: never sent: what ec2gpu itself brought home into the workdir on earlier runs (runs/<run id>/, the
#: default artifacts directory when a run starts in the project), matched by the run id's format
#: (runs/pipeline.new_run_id) so a project's own runs/ files still go
OWN_ARTIFACTS = ["/runs/[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]-[0-9][0-9][0-9][0-9][0-9][0-9]-[0-9a-f][0-9a-f]*/"]
_KEY_HEADER = b"PRIVATE KEY-----"
MAX_UPLOAD_BYTES = 1 << 30  # --max-upload default: 1 GiB


@dataclass
class Manifest:
    """The files of a workdir that will be sent: relative POSIX paths, their total size in bytes."""

    root: Path
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    withheld: list[str] = field(default_factory=list)  # secrets kept back (NEVER_SEND, key headers)


def _git_files(root: Path) -> list[str] | None:
    if not shutil.which("git"):
        return None
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True)
    if done.returncode != 0:
        return None  # not a repository
    return [f for f in done.stdout.decode(errors="surrogateescape").split("\0") if f]


def _walk(root: Path, spec: pathspec.PathSpec) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        dirnames[:] = [d for d in dirnames if not spec.match_file(prefix + d + "/")]
        out += [prefix + f for f in filenames if not spec.match_file(prefix + f)]
    return out


def _looks_like_private_key(path: Path) -> bool:
    try:
        if path.stat().st_size > 64 * 1024:
            return False
        with open(path, "rb") as f:
            return _KEY_HEADER in f.read(128)
    except OSError:
        return False


def manifest(root: Path, allow_secrets: bool = False) -> Manifest:
    """What to send from ``root`` under the rules above (sorted). Symbolic links and anything but
    regular files are left out."""
    root = Path(root).resolve()
    extra = [line for name in (IGNORE_FILE,) if (root / name).is_file()
             for line in (root / name).read_text().splitlines()]
    files = _git_files(root)
    if files is None:
        rules = (root / ".gitignore").read_text().splitlines() if (root / ".gitignore").is_file() else []
        files = _walk(root, pathspec.GitIgnoreSpec.from_lines(rules + [".git/"]))
    files = [f for f in files if not pathspec.GitIgnoreSpec.from_lines(extra + OWN_ARTIFACTS).match_file(f)]
    never = pathspec.GitIgnoreSpec.from_lines(NEVER_SEND)
    m = Manifest(root)
    for rel in sorted(set(files)):
        path = root / rel
        if not path.is_file() or path.is_symlink():
            continue
        if not allow_secrets and (never.match_file(rel) or _looks_like_private_key(path)):
            m.withheld.append(rel)
            continue
        m.files.append(rel)
        m.bytes += path.stat().st_size
    return m


def check_size(m: Manifest, max_bytes: int = MAX_UPLOAD_BYTES) -> None:
    """Refuse (UsageError) a workdir above ``max_bytes``, naming its largest files."""
    if m.bytes <= max_bytes:
        return
    largest = sorted(m.files, key=lambda f: (m.root / f).stat().st_size, reverse=True)[:3]
    raise UsageError(f"the workdir {m.root} holds {m.bytes / 1e6:,.0f} MB in {len(m.files):,} files, above "
                     f"--max-upload {max_bytes / 1e6:,.0f} MB (largest: {', '.join(largest)})",
                     f"list data and outputs in .gitignore or {IGNORE_FILE} (and fetch data on the instance "
                     "in setup), or raise --max-upload")


def rsync_available(conn) -> bool:
    """Whether this machine and the instance both have rsync."""
    if not shutil.which("rsync"):
        return False
    return conn.run("command -v rsync", hide=True, warn=True, in_stream=False).ok


def _rsync(ssh_config: Path, src: str, dst: str, files: list[str], what: str) -> None:
    """rsync exactly ``files`` (relative to ``src``) to ``dst`` over ``ssh -F ssh_config``."""
    args = ["-a", "--from0", "--files-from=-", "-e", f"ssh -F {shlex.quote(str(ssh_config))}", src, dst]
    done = subprocess.run(["rsync", *args], input="\0".join(files).encode(), capture_output=True)
    if done.returncode != 0:
        raise RemoteError(f"rsync ({what}) exited {done.returncode}", "its message is shown above",
                          command="rsync " + " ".join(shlex.quote(a) for a in args), exit_status=done.returncode,
                          tail="\n".join(done.stderr.decode(errors="replace").strip().splitlines()[-10:]))


def push(conn, m: Manifest, remote_dir: str, ssh_config: Path | None, host_alias: str) -> str:
    """Send the manifest's files to ``remote_dir``; return how ("rsync" or "sftp").

    rsync runs as ``rsync -a --files-from=- -e 'ssh -F SSH_CONFIG' ROOT/ HOST_ALIAS:REMOTE_DIR/`` (only
    what changed moves); without rsync on either side, one tar.gz over SFTP is unpacked there.
    Raises RemoteError when the transfer fails.
    """
    conn.run(f"mkdir -p {shlex.quote(remote_dir)}", hide=True, in_stream=False)
    if ssh_config is not None and rsync_available(conn):
        _rsync(ssh_config, f"{m.root}/", f"{host_alias}:{remote_dir}/", m.files, "workdir up")
        return "rsync"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in m.files:
            tar.add(m.root / rel, arcname=rel, recursive=False)
    buf.seek(0)
    archive = f"{remote_dir}/.ec2gpu-workdir.tar.gz"
    conn.put(buf, archive)
    conn.run(f"tar -xzf {shlex.quote(archive)} -C {shlex.quote(remote_dir)} && rm -f {shlex.quote(archive)}",
             hide=True, in_stream=False)
    return "sftp"


def pull(conn, remote_dir: str, local_dir: Path, patterns: list[str], ssh_config: Path | None,
         host_alias: str) -> tuple[list[str], str]:
    """Bring ``remote_dir`` (recursively) home to ``local_dir``: every file, or those matching
    ``patterns`` (gitignore-style globs, relative to ``remote_dir``). Returns (files, "rsync"|"sftp")."""
    local_dir.mkdir(parents=True, exist_ok=True)
    listing = conn.run(f"cd {shlex.quote(remote_dir)} 2>/dev/null && find . -type f -printf '%P\\0' || true",
                       hide=True, in_stream=False).stdout
    files = sorted(f for f in listing.split("\0") if f)
    if patterns:
        spec = pathspec.GitIgnoreSpec.from_lines(patterns)
        files = [f for f in files if spec.match_file(f)]
    if not files:
        return [], "none"
    if ssh_config is not None and rsync_available(conn):
        _rsync(ssh_config, f"{host_alias}:{remote_dir}/", f"{local_dir}/", files, "outputs home")
        return files, "rsync"
    sftp = conn.sftp()
    for rel in files:
        target = local_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        sftp.get(f"{remote_dir}/{rel}", str(target))
    return files, "sftp"
