"""An archive from elsewhere, unpacked in one pass within count and byte limits (hostile input):
ec2gpu's one unpacker, on every side.

Every tar that ec2gpu opens for reading goes through ``unpack``: on this machine a lost
controller's hand-over (the outputs, an array's table and logs: runs/recover/handover.py); on a
pool's head the element outputs its driver receives (pool/driver.py; shipped beside it as
ec2gpu_unpack.py: pool/ray_nodes.SHIPPED); on a detached run's instance the workdir from S3
(agent/prepare.extract_workdir, which refuses the whole archive when one member is not written;
shipped beside the agent: runs/detached/launch.WIRE_FILES). So: the standard library only, and no
import of the package. The name checks it makes (``check_name``, ``local_target``) are here for
that reason; remote/files.py, which checks every name that comes home over SFTP or from S3 with
them, imports them from here. Whoever made the archive (a job, an instance, whoever can write the
run store's hand-over keys or the run's workdir object) chooses its names, kinds, sizes and how
well it compresses, so:

- the archive is read once, front to back (tarfile's stream mode): nothing is decompressed twice,
  and a member is never skipped by decompressing it: the first regular file over the limits (one
  more than ``max_files``, or more than ``max_bytes`` written in all) ends the reading there, what
  was written before it is kept, and it is named (``Unpacked.left``);
- the decompressed bytes are counted as they are read, whatever the members are: at most
  ``max_bytes`` plus MEMBER_OVERHEAD_BYTES per member the limits allow plus INPUT_SLACK_BYTES (so
  a gzip bomb inside a refused member cannot burn CPU), and at most HEADER_BYTES for one member's
  headers (PAX and GNU long-name records are read whole into memory by tarfile, and each record
  takes at least two blocks, so a member has at most HEADER_BYTES / 1,024 of them: tarfile reads
  each with one more level of recursion, and 900 of them raised RecursionError);
- what tarfile cannot make sense of (a broken header, a bad number in a PAX sparse record: ValueError
  there; RecursionError) ends the reading, said in one line (``Unpacked.unread``), as a cut one does;
- regular files only are written (directories made as their paths need): a link, a device or
  FIFO, a name that ``check_name`` refuses (absolute, ``..``, ``.`` or empty component,
  NUL, over Linux's length limits) or with a backslash, a member tarfile's "data" filter refuses
  (``tarfile.data_filter``, where this Python has it: 3.12, and 3.11.4 on), or whose place on this
  machine is not inside the target (``local_target``: no link or special file on the way) is
  refused and named (``Unpacked.refused``); after MAX_PASSED_OVER members not written (refused
  ones and directories) the rest is not read;
- a file is written beside its place under a new name of its own (``.ec2gpu-<random>.part``, made
  with O_EXCL and O_NOFOLLOW, mode 0644, or with ``modes`` its member's permission bits less
  setuid, setgid and sticky, plus the owner's read and write: never a member's name, nor one too
  long for a name of up to NAME_MAX) and renamed into it once whole; one cut short (a truncated
  archive) is removed.
"""
from __future__ import annotations

import gzip
import io
import os
import secrets
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Union, cast

MAX_NAME_BYTES = 4096  # PATH_MAX on Linux (limits.h)
MAX_COMPONENT_BYTES = 255  # NAME_MAX on Linux (limits.h)
MAX_LISTED = 100_000  # entries looked at in one listing: bounds the controller's memory, not the files brought home
MAX_PASSED_OVER = 1000  # members not written (refused, directories) before the rest is left unread
#: the most read for one member's headers: its own and its PAX and GNU long-name records (at most
#: 64 of them: tarfile reads each one with one more level of recursion); a PAX record with a path
#: and a link of PATH_MAX (4,096 bytes) each takes about 9 KiB
HEADER_BYTES = 64 << 10
MEMBER_OVERHEAD_BYTES = 8192  # per member beyond its data: a header, a PAX record with a PATH_MAX name, padding
INPUT_SLACK_BYTES = 1 << 20  # beyond the members' bytes: the archive's end and tarfile's read-ahead
CHUNK_BYTES = 1 << 20
PART_PREFIX, PART_SUFFIX = ".ec2gpu-", ".part"  # a file being written: PART_PREFIX + 16 hex digits + PART_SUFFIX

Source = Union[str, "os.PathLike[str]", IO[bytes]]


def check_name(name: str) -> str | None:
    """Why ``name`` (a path relative to a directory, as an instance gave it) may not be written
    under that directory on this machine, or None when it may (pure).

    Refused: empty, absolute, a ``.``, ``..`` or empty component, a NUL or backslash-free but
    over-long name (over 4096 bytes, or a component over 255: Linux's PATH_MAX and NAME_MAX).
    Control characters are allowed in a name (Linux allows them); they are made visible wherever
    the name is printed.
    """
    if not name:
        return "empty name"
    if "\0" in name:
        return "NUL in the name"
    if name.startswith("/"):
        return "absolute name"
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_NAME_BYTES:
        return "name too long"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "'..', '.' or empty component"
    if any(len(p.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES for p in parts):
        return "component too long"
    return None


def local_target(root: Path, name: str) -> Path | None:
    """Where ``name`` (checked by ``check_name``) goes under ``root`` on this machine, or None when
    that place is unsafe: a component on the way that exists and is a symbolic link or not a
    directory, a final path that exists and is not a regular file (a link, a directory, a FIFO, a
    device), or a resolved path outside ``root``. Creates nothing."""
    root = Path(root)
    path = root
    for part in PurePosixPath(name).parts[:-1]:
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            break  # created as a directory when the file is written
        if not stat.S_ISDIR(st.st_mode):  # a symbolic link (lstat does not follow it) or a file
            return None
    target = root / name
    try:
        st = os.lstat(target)
        if not stat.S_ISREG(st.st_mode):
            return None
    except FileNotFoundError:
        pass
    except OSError:  # e.g. a component that is a file: ENOTDIR
        return None
    real_root = root.resolve()
    if not target.resolve().is_relative_to(real_root):
        return None
    return target


@dataclass
class Unpacked:
    """What ``unpack`` did: ``names`` written (relative to the target, sorted), ``files`` written (a
    name written twice counts twice), ``bytes`` written in all; ``refused``: (name, why) of each
    member not written for its kind, name or place; ``left``: (name, size in bytes) of the first
    member over the limits, where the reading stopped, or None; ``unread``: why the rest of the
    archive was not read (words), or None when it was read to its end; ``max_files``,
    ``max_bytes``: the limits it was unpacked with."""

    max_files: int
    max_bytes: int
    names: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)
    left: tuple[str, int] | None = None
    unread: str | None = None

    def warnings(self, what: str, hint: str) -> list[str]:
        """One line per kind of thing not unpacked (names made inert by whoever prints them; a few
        named): ``what`` names the archive, ``hint`` says where the rest stays and how to have it."""
        out = []
        if self.refused:
            named = ", ".join(f"{n[:200]!r} ({why})" for n, why in self.refused[:5])
            out.append(f"{what}: {len(self.refused)} member(s) refused, their kinds, names or places are unsafe: "
                       f"{named}" + (" ..." if len(self.refused) > 5 else ""))
        if self.left is not None:
            name, size = self.left
            out.append(f"{what}: not read past {name[:200]!r} ({size:,} bytes), its first member above the limit of "
                       f"{self.max_files:,} files and {self.max_bytes:,} bytes ({len(self.names):,} file(s), "
                       f"{self.bytes:,} bytes unpacked before it); {hint}")
        elif self.unread is not None:
            out.append(f"{what}: {self.unread} ({len(self.names):,} file(s), {self.bytes:,} bytes unpacked); {hint}")
        return out


class _Over(Exception):
    """More decompressed bytes than the bound asked for."""


class _Counted(io.RawIOBase):
    """A readable stream over ``raw`` (decompressed bytes) that gives at most ``limit`` bytes in
    all (changed between reads), then raises _Over."""

    def __init__(self, raw: IO[bytes], limit: int) -> None:
        super().__init__()
        self.raw, self.limit, self.count = raw, limit, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        room = self.limit - self.count
        if room <= 0:
            raise _Over(f"not read past its first {self.limit:,} bytes once decompressed")
        data = self.raw.read(room if size is None or size < 0 else min(size, room))
        self.count += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


def _decompressed(f: IO[bytes]) -> IO[bytes]:
    """``f`` (seekable, at its start) as its tar's bytes: gunzipped when it starts with gzip's magic."""
    magic = f.read(2)
    f.seek(0)
    return cast(IO[bytes], gzip.GzipFile(fileobj=f, mode="rb")) if magic == b"\x1f\x8b" else f


def unpack(source: Source, target: str | os.PathLike[str], *, max_files: int, max_bytes: int,
           modes: bool = False) -> Unpacked:
    """Unpack the tar ``source`` (a path or a seekable binary file; gzipped or not; hostile) into
    the directory ``target`` (made if need be) by the module docstring's rules: at most
    ``max_files`` files and ``max_bytes`` bytes (bytes) written, reading stopped at the first
    member over them and at most ``max_bytes`` plus MEMBER_OVERHEAD_BYTES per member allowed plus
    INPUT_SLACK_BYTES decompressed; with ``modes``, each file keeps its member's permission bits
    (a workdir's executables), setuid, setgid and sticky dropped. Never raises for what the archive holds (a broken or truncated
    one ends the reading, said in ``Unpacked.unread``); raises OSError when ``source`` cannot be
    opened or ``target`` made."""
    got = Unpacked(max_files, max_bytes)
    root = Path(target)
    root.mkdir(parents=True, exist_ok=True)
    bound = max_bytes + (max_files + MAX_PASSED_OVER + 1) * MEMBER_OVERHEAD_BYTES + INPUT_SLACK_BYTES
    own = not hasattr(source, "read")
    f: IO[bytes] = open(source, "rb") if own else source  # type: ignore[arg-type,assignment]
    try:
        stream = _Counted(_decompressed(f), bound)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            _members(tar, stream, root, bound, got, modes)
    except _Over as exc:
        got.unread = str(exc)
    except (tarfile.TarError, EOFError, zlib.error, ValueError, RecursionError) as exc:
        # ValueError: tarfile's own, for a number it cannot read in a PAX record (GNU.sparse.map,
        # GNU.sparse.size, a sparse 1.0 map); RecursionError: too many extended headers in a row
        got.unread = f"could not be read whole: broken or cut short ({type(exc).__name__})"
    except OSError as exc:  # gzip's BadGzipFile among them, or this machine's disk
        got.unread = f"could not be read whole ({type(exc).__name__}: {exc.strerror or 'broken or cut short'})"
    finally:
        if own:
            f.close()
    got.names.sort()
    return got


def _members(tar: tarfile.TarFile, stream: _Counted, root: Path, bound: int, got: Unpacked, modes: bool) -> None:
    """Read ``tar``'s members in order into ``got``: each written, refused, or where the reading stops."""
    top, passed, seen = root.resolve(), 0, set()
    data_filter = getattr(tarfile, "data_filter", None)
    while True:
        # tar.offset: where the next header starts (the last member's data ends); a member's data
        # not read is skipped by next(), within this bound too
        stream.limit = min(bound, tar.offset + HEADER_BYTES)
        try:
            m = tar.next()
        except _Over:
            if stream.limit < bound:
                raise _Over(f"not read past a member whose headers are over {HEADER_BYTES:,} bytes") from None
            raise
        stream.limit = bound
        if m is None:
            return
        tar.members = []  # type: ignore[attr-defined]  # tarfile keeps every header it read
        why = "a directory" if m.isdir() else _refused(m, top, data_filter)
        if tar.offset > bound or why is None and (got.files >= got.max_files or got.bytes + m.size > got.max_bytes):
            got.left = (m.name, m.size)  # over the limits (its data would take the reading past its bound)
            return
        why = why or _write(tar, m, top, (m.mode & 0o777) | 0o600 if modes else None)
        if why is None:  # a name written twice counts twice
            got.files, got.bytes = got.files + 1, got.bytes + m.size
            if m.name not in seen:
                seen.add(m.name)
                got.names.append(m.name)
            continue
        if not m.isdir():
            got.refused.append((m.name, why))
        passed += 1
        if passed > MAX_PASSED_OVER:
            got.unread = f"not read past its first {MAX_PASSED_OVER:,} members that are no file to unpack"
            return


def _refused(m: tarfile.TarInfo, top: Path, data_filter: Any) -> str | None:
    """Why member ``m`` (not a directory) is not written under ``top``, or None (creates nothing)."""
    if not m.isreg():
        return "not a plain file"
    why = check_name(m.name) or ("a backslash in the name" if "\\" in m.name else None)
    if why is None and data_filter is not None:
        try:
            data_filter(m, str(top))
        except tarfile.TarError as exc:  # FilterError: tarfile's "data" filter
            why = f"refused by tarfile's data filter ({type(exc).__name__})"
    if why is None and local_target(top, m.name) is None:
        why = "a link, a special file or outside the directory on this machine"
    return why


def _write(tar: tarfile.TarFile, m: tarfile.TarInfo, top: Path, mode: int | None = None) -> str | None:
    """Write regular member ``m`` (checked) to its place under ``top`` (with permission bits ``mode``;
    None: _new_part's): None once written whole, else why not (nothing left behind). Raises what
    reading the archive raises."""
    try:
        (top / m.name).parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return "its directory cannot be made here (a file is in the way)"
    target = local_target(top, m.name)  # again, now that its directories exist
    source = tar.extractfile(m)
    if target is None or source is None:
        return "a link, a special file or outside the directory on this machine"
    try:
        fd, part = _new_part(target.parent)
    except OSError as exc:  # a directory this machine does not let us write, a full one
        return f"cannot be written here ({exc.strerror})"
    try:
        with os.fdopen(fd, "wb") as out, source:
            if mode is not None:
                os.fchmod(out.fileno(), mode)  # not through the name: the descriptor is the file made
            left = m.size
            while left > 0:
                chunk = source.read(min(left, CHUNK_BYTES))
                if not chunk:
                    raise EOFError("a member cut short")
                out.write(chunk)
                left -= len(chunk)
        os.replace(part, target)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return None


def _new_part(parent: Path) -> tuple[int, Path]:
    """A new file in ``parent`` to write a member into (its descriptor, its path): a name of its own
    (PART_PREFIX, 64 random bits, PART_SUFFIX), never one there already (O_EXCL, O_NOFOLLOW), mode
    0644 less the umask. Raises OSError (FileExistsError after 8 names taken, which 64 random bits
    make all but impossible)."""
    # not tempfile.mkstemp: its files are 0600, and a file brought home has the umask's mode as any other
    for _ in range(8):
        part = parent / f"{PART_PREFIX}{secrets.token_hex(8)}{PART_SUFFIX}"
        try:
            return os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), part
        except FileExistsError:
            continue
    raise FileExistsError(f"no new file name in {parent}")
