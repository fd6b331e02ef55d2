"""What comes home from an instance: names checked, listed without a shell, transfers bounded.

Everything an instance says is hostile input (docs/security.md): a job, or a compromised instance,
chooses its file names, sizes and contents, and can replace the shell functions that a command
run over SSH would call (``~/.bashrc`` is read by sshd's non-interactive commands). So:

- files are listed over SFTP (``listdir_attr``: the server's lstat of each entry; no shell, no
  ``find``), regular files only, symbolic links never followed on the instance's side;
- every name is checked before it touches this machine (``check_name``, wire/unpack.py's: the
  rules the one unpacker applies to an archive's members, on every side): relative, no ``..`` or
  empty component, no NUL, within Linux's length limits; and the place it would be written
  (``local_target``, wire/unpack.py's too) must lie inside its directory with no symbolic link or special file on the
  way (this machine's side: only the user can have made one there, ec2gpu never does);
- what is brought home is capped in count and bytes (``Limits``), the rest named, never silently
  dropped; each file is read through a size bound, so a file that grows after it was listed (or a
  sparse one) stops at the bound.

A name that fails a check is skipped and reported once (``Selection.skipped``).

What goes up is here too: directories made, files and text put on the instance (``make_dirs``,
``put_file``, ``write_text``, ``write_private``: mode 0600 before any byte, ``put_tree``).
"""
from __future__ import annotations

import io
import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

# the name rules and the listing bound are the one unpacker's (shipped stdlib-only to a pool's head
# and a detached run's instance): re-exported, every caller's files.check_name is that one
from ..words import count
from ..wire.unpack import MAX_COMPONENT_BYTES as MAX_COMPONENT_BYTES, MAX_LISTED as MAX_LISTED
from ..wire.unpack import MAX_NAME_BYTES as MAX_NAME_BYTES, check_name as check_name, local_target as local_target

if TYPE_CHECKING:
    from fabric import Connection

MAX_DEPTH = 32  # directory levels walked below the listed directory
DEFAULT_MAX_FILES = 10_000  # files brought home from one directory (EC2GPU_MAX_DOWNLOAD_FILES)
DEFAULT_MAX_BYTES = 4 << 30  # bytes brought home from one directory: 4 GiB (EC2GPU_MAX_DOWNLOAD_BYTES)


@dataclass(frozen=True)
class Limits:
    """How much one pull may write on this machine: ``files`` files and ``bytes`` bytes at most."""

    files: int = DEFAULT_MAX_FILES
    bytes: int = DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class RemoteFile:
    """A regular file on the instance: its name relative to the listed directory (POSIX), its size
    in bytes and its modification time (s since the epoch), as the SFTP server reported them."""

    name: str
    size: int
    mtime: float


@dataclass
class Selection:
    """What a pull brings home (``files``), what it skipped for its name or place (``skipped``:
    (name, reason)) and what it left on the instance above its limits (``left``)."""

    files: list[RemoteFile] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    left: list[RemoteFile] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def warnings(self, what: str, limits: Limits) -> list[str]:
        """One line per kind of file not brought home, naming a few of them (inert: see ec2gpu.inert)."""
        out = []
        if self.skipped:
            named = ", ".join(f"{n!r} ({why})" for n, why in self.skipped[:5])
            out.append(f"{what}: {count(len(self.skipped), 'file')} not brought home, their names or places are unsafe: "
                       f"{named}" + (" ..." if len(self.skipped) > 5 else ""))
        if self.left:
            size = sum(f.size for f in self.left)
            out.append(f"{what}: {count(len(self.left), 'file')}, {size:,} bytes, not brought home: above the limit of "
                       f"{limits.files:,} files and {limits.bytes:,} bytes (first left: {self.left[0].name!r}); raise "
                       "EC2GPU_MAX_DOWNLOAD_FILES / EC2GPU_MAX_DOWNLOAD_BYTES (or ec2gpu.toml) for the next run; from "
                       "an instance that still stands, `ec2gpu fetch RUN --max-download SIZE --max-files N` brings them")
        return out


def listing(sftp: Any, remote_dir: str, hidden: bool = True, max_entries: int = MAX_LISTED,
            links: list[str] | None = None) -> list[RemoteFile]:
    """The regular files under ``remote_dir`` on the instance, recursively, sorted by name, through
    SFTP's READDIR (paramiko ``listdir_attr``): entries are the server's lstat, so a symbolic link
    is neither listed nor followed. ``hidden`` False leaves out names with a component starting
    with '.' (a file being written, by the atomic-rename convention). A missing ``remote_dir``
    lists nothing. At most ``max_entries`` entries are looked at and ``MAX_DEPTH`` levels walked
    (memory stays bounded whatever the instance holds). The symbolic links met are appended to
    ``links`` (their names) when it is given, so a caller can say what it did not bring. Raises the
    connection's errors."""
    out: list[RemoteFile] = []
    seen = 0
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        try:
            entries = sftp.listdir_attr(f"{remote_dir}/{rel}" if rel else remote_dir)
        except (FileNotFoundError, PermissionError):
            continue
        except OSError as exc:  # NotADirectoryError and other SFTP status errors: not a directory we can list
            if getattr(exc, "errno", None) is None and type(exc) is not OSError:
                raise
            continue
        for e in entries:
            seen += 1
            if seen > max_entries:
                return sorted(out, key=lambda f: f.name)
            name = f"{rel}/{e.filename}" if rel else e.filename
            if not hidden and e.filename.startswith("."):
                continue
            mode = e.st_mode or 0
            if stat.S_ISDIR(mode) and depth < MAX_DEPTH and check_name(name) is None:
                stack.append((name, depth + 1))
            elif stat.S_ISREG(mode):
                out.append(RemoteFile(name, int(e.st_size or 0), float(e.st_mtime or 0)))
            elif stat.S_ISLNK(mode) and links is not None:
                links.append(name)
    return sorted(out, key=lambda f: f.name)


def links_words(where: str, links: list[str]) -> str:
    """The line that says the symbolic links a pull from ``where`` did not bring home (pure)."""
    named = ", ".join(repr(n) for n in sorted(links)[:5]) + (" ..." if len(links) > 5 else "")
    return (f"{where}: {count(len(links), 'symbolic link')} not brought home (a link is never followed: write the "
            f"file itself there): {named}")


def select(files: list[RemoteFile], root: Path, limits: Limits, wanted: Callable[[str], bool] | None = None) -> Selection:
    """Of ``files`` (a listing), those ``wanted(name)`` accepts (all when None), with safe names and
    places under ``root``, in name order, until ``limits`` is reached (pure apart from looking at
    ``root``). A file bigger than the byte limit on its own is left, the next ones still taken."""
    sel = Selection()
    for f in files:
        if wanted is not None and not wanted(f.name):
            continue
        why = check_name(f.name)
        if why is None and local_target(root, f.name) is None:
            why = "a link, a special file or outside the directory on this machine"
        if why:
            sel.skipped.append((f.name, why))
        elif len(sel.files) >= limits.files or sel.bytes + f.size > limits.bytes:
            sel.left.append(f)
        else:
            sel.files.append(f)
    return sel


class TooBig(Exception):
    """A file grew past the bound it was read with."""


def get_bounded(sftp: Any, remote_path: str, target: Path, max_bytes: int) -> int:
    """Copy ``remote_path`` to ``target`` (written beside it as a hidden .part file, then renamed
    into place, mode 0644 at most), reading at most ``max_bytes`` bytes; return the bytes written.
    Raises TooBig (nothing left behind) when the file holds more, FileNotFoundError when it is gone,
    and the connection's errors."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.part")
    written: int = 0

    def bound(done: int, _total: int) -> None:
        if done > max_bytes:
            raise TooBig(f"{remote_path} holds more than {max_bytes:,} bytes")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            written = sftp.getfo(remote_path, f, callback=bound, prefetch=True)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return written


# Transfers to the instance: ``conn`` is a fabric Connection (remote/ssh.connect). A shell command
# that fails raises invoke's UnexpectedExit; the connection's errors (paramiko, socket, SFTP's
# OSError) propagate.

def make_dirs(conn: Connection, *paths: str) -> None:
    """Make the directories ``paths`` on the instance, and their parents (`mkdir -p`, one command)."""
    conn.run(f"mkdir -p {' '.join(shlex.quote(p) for p in paths)}", hide=True, in_stream=False)


def put_file(conn: Connection, local: str | os.PathLike[str], remote: str) -> None:
    """Copy the file ``local`` (on this machine) to the path ``remote`` on the instance (SFTP; its
    directory must exist), replacing what is there."""
    conn.put(str(local), remote)


def write_text(conn: Connection, path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to the file ``path`` on the instance (SFTP; its directory must exist),
    replacing what is there."""
    conn.put(io.BytesIO(text.encode()), path)


def write_private(conn: Connection, path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` on the instance, mode 0600 before any byte is in it (the
    file is made empty under `umask 077` first, then written over SFTP)."""
    conn.run(f"umask 077 && : > {shlex.quote(path)}", hide=True, in_stream=False)
    conn.put(io.BytesIO(text.encode()), path)


def put_tree(conn: Connection, local_root: Path, paths: list[Path], remote_dir: str) -> None:
    """Copy ``paths`` (files under ``local_root`` on this machine) to the same relative places
    under ``remote_dir`` on the instance over SFTP, making ``remote_dir`` and every file's directory
    first, in one command."""
    rels = [path.relative_to(local_root).as_posix() for path in paths]
    dirs = sorted({f"{remote_dir}/{rel.rsplit('/', 1)[0]}" for rel in rels if "/" in rel})
    make_dirs(conn, remote_dir, *dirs)
    sftp = conn.sftp()
    for path, rel in zip(paths, rels, strict=True):
        sftp.put(str(path), f"{remote_dir}/{rel}")


def list_files(conn: Connection, remote_dir: str, hidden: bool = True) -> list[RemoteFile]:
    """``listing`` of ``remote_dir`` over the connection's SFTP session (no shell)."""
    return listing(conn.sftp(), remote_dir, hidden=hidden)


def pull_bounded(conn: Connection, remote_path: str, target: Path, max_bytes: int) -> int:
    """``get_bounded`` over the connection's SFTP session: ``remote_path`` to ``target``, at most
    ``max_bytes`` bytes; the bytes written. Raises TooBig, FileNotFoundError as it does."""
    return get_bounded(conn.sftp(), remote_path, target, max_bytes)


def write_small(root: Path, name: str, data: bytes) -> bool:
    """Write ``data`` to ``root``/``name`` unless a link or special file is there; whether it was."""
    target = local_target(root, name)
    if target is None:
        return False
    tmp = target.with_name(f".{name}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
    return True


# --- logs -------------------------------------------------------------------------------------
