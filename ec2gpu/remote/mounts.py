"""A task's file_mounts on an instance (tasks/mounts.py says what each entry means): local sources
sent like the workdir (rsync, else SFTP), S3 sources copied in by the instance itself with its
own role (agent/s3files.py), and MOUNT-mode buckets written back (every minute while the job runs: recovery.InstanceWatch,
and when it ends).

Paths on the instance: an absolute target is made (with ``sudo -n`` where the user cannot, as on
the Deep Learning AMI, whose user is ``ubuntu``) and given to the SSH user; a sandbox instance
places it under its own root directory (EC2GPU_SANDBOX_ROOT; mounts.on_instance). The controller
decides from the script's JSON records, never from its text.
"""
from __future__ import annotations

import io
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Optional, Protocol, Sequence

from ..errors import RemoteError
from ..inert import inert
from ..words import count
from ..wire import bounded_json
from . import sync

if TYPE_CHECKING:
    from fabric import Connection
    from .sync import Manifest


class Mount(Protocol):
    """A file_mounts entry as this module reads it: tasks/mounts.Mount is one (remote/ imports no task
    module: the task side says what an entry means, this side puts it in place)."""

    @property
    def target(self) -> str: ...
    @property
    def kind(self) -> str: ...  # "local" or "s3"
    @property
    def source(self) -> str: ...
    @property
    def bucket(self) -> Optional[str]: ...
    @property
    def prefix(self) -> str: ...
    @property
    def write_back(self) -> bool: ...
    @property
    def is_file(self) -> bool: ...

    def on_instance(self, home: str, root: str = "") -> str: ...


S3FILES = Path(__file__).resolve().parents[1] / "agent" / "s3files.py"
MAX_RECORD_LINE = 2000  # bytes of one JSON line read back from s3files.py


def instance_paths(conn: Connection) -> tuple[str, str]:
    """(home, sandbox root or "") on the instance behind ``conn``. Raises RemoteError if unreadable."""
    got = conn.run('printf "%s\\n%s\\n%s\\n" "$HOME" "${EC2GPU_SANDBOX_ROOT:-}" "${EC2GPU_IMDS_ENDPOINT:+sandbox}"',
                   hide=True, warn=True, in_stream=False)
    lines = got.stdout.split("\n") if got.ok else []
    if len(lines) < 3 or not lines[0].startswith("/"):
        raise RemoteError("could not read the instance's home directory", "check the instance's SSH user",
                          command="file_mounts")
    if lines[2] == "sandbox" and not lines[1].startswith("/"):  # never this machine's own /
        raise RemoteError("file_mounts: this sandbox instance has no EC2GPU_SANDBOX_ROOT (a sandbox started by an "
                          "older ec2gpu)", "restart it: ec2gpu sandbox down && ec2gpu sandbox up", command="file_mounts")
    return lines[0], lines[1] if lines[1].startswith("/") else ""


def _writable(conn: Connection, path: str, is_file: bool) -> None:
    """Make ``path`` (a directory, or an empty file when ``is_file``) for the SSH user: created with
    ``sudo -n`` where the user may not, and then given to the user; an existing path is used as it
    is when the user may write it, and refused otherwise (never taken from its owner)."""
    p = shlex.quote(path)
    make = (f"mkdir -p \"$(dirname {p})\" && touch {p}" if is_file else f"mkdir -p {p}")
    got = conn.run(f"if [ -e {p} ]; then [ -w {p} ]; else {{ {make}; }} 2>/dev/null || "
                   f"{{ sudo -n sh -c {shlex.quote(make)} && sudo -n chown \"$(id -u):$(id -g)\" {p}; }}; fi",
                   hide=True, warn=True, in_stream=False)
    if not got.ok:
        raise RemoteError(f"file_mounts: {path} cannot be made or written by the instance's user (exit {got.exited})",
                          "choose a target under ~, or a new path the instance may create", command="file_mounts",
                          exit_status=got.exited)


def place(conn: Connection, mounts_: Sequence[Mount], manifests: dict[str, Manifest], run_dir: str, python: str,
          region_of: Callable[[str], str], ssh_config: Path | None, host_alias: str, log: Callable[[str], None],
          s3_files: AbstractSet[str] = frozenset()) -> None:
    """Put every entry of ``mounts_`` (tasks/mounts.Mount) on the instance behind ``conn``, in order.

    ``manifests``: target -> sync.Manifest of a local directory source (engine.prepare made them,
    the size limit and secrets rules applied); ``region_of(bucket)`` -> the bucket's region;
    ``python`` runs agent/s3files.py there; ``s3_files``: the targets of S3 entries whose prefix is
    one object (storage.single_objects), made as files. Raises RemoteError naming the entry that failed.
    """
    if not mounts_:
        return
    home, root = instance_paths(conn)
    s3: list[dict[str, Any]] = []
    for m in mounts_:
        path = m.on_instance(home, root)
        _writable(conn, path, m.is_file or m.target in s3_files)
        if m.kind == "local" and m.is_file:
            conn.put(m.source, path)
            log(f"file_mounts: {m.source} sent to {m.target}")
        elif m.kind == "local":
            man = manifests[m.target]
            how = sync.push(conn, man, path, ssh_config, host_alias)
            log(f"file_mounts: {m.source}: {count(len(man.files), 'file')}, {man.bytes:,} bytes sent to {m.target} by {how}")
        else:
            s3.append({"target": path, "bucket": m.bucket, "prefix": m.prefix, "region": region_of(m.bucket or ""),
                       "file": m.target in s3_files,
                       "write_back": m.write_back, "record": f"{run_dir}/s3mounts/{len(s3)}.json", "shown": m.target})
    if s3:
        conn.put(io.BytesIO(json.dumps(s3).encode()), f"{run_dir}/s3mounts.json")
        conn.put(str(S3FILES), f"{run_dir}/s3files.py")
        conn.put(bounded_json.__file__, f"{run_dir}/bounded_json.py")  # s3files.py imports it
        for rec in _s3files(conn, python, run_dir, "in"):
            shown = next((x["shown"] for x in s3 if x["target"] == rec.get("target")), "?")
            log(f"file_mounts: {rec.get('files')} object(s), {rec.get('bytes')} bytes copied from S3 to {shown} "
                "by the instance's role" + (f"; {count(rec['skipped'], 'key')} skipped (outside the target)"
                                            if rec.get("skipped") else ""))


def write_back(conn: Connection, run_dir: str, python: str, log: Callable[[str], None], settled_s: float = 0,
               timeout_s: float = 6 * 3600) -> None:
    """Upload what the job wrote under each MOUNT-mode target to its bucket (agent/s3files.py out);
    nothing when the run has none. ``settled_s`` > 0 (while the job runs): leave out hidden files
    and files modified in the last ``settled_s`` seconds (still being written; the write-back at
    the end sends them). ``timeout_s`` bounds the upload. Raises RemoteError when an upload fails
    or the command times out."""
    if not conn.run(f"test -f {shlex.quote(run_dir)}/s3mounts.json", hide=True, warn=True, in_stream=False).ok:
        return
    for rec in _s3files(conn, python, run_dir, "out", [f"--settled={settled_s:g}"] if settled_s else [], timeout_s):
        if rec.get("files"):
            log(f"file_mounts: {count(int(rec['files']), 'file')}, {rec.get('bytes')} bytes written back from "
                f"{inert(str(rec.get('target'))[:200])}")


def _s3files(conn: Connection, python: str, run_dir: str, direction: str, flags: Sequence[str] = (),
             timeout_s: float = 6 * 3600) -> list[dict[str, Any]]:
    """Run s3files.py ``direction`` (with ``flags``) and return its JSON records; RemoteError on its
    error record, a failed exit, or when it runs past ``timeout_s``."""
    from invoke.exceptions import CommandTimedOut
    d = shlex.quote(run_dir)
    try:
        got = conn.run(f"{shlex.quote(python)} {d}/s3files.py {direction} {' '.join(flags)} {d}/s3mounts.json",
                       hide=True, warn=True, in_stream=False, timeout=timeout_s)
    except CommandTimedOut:
        raise RemoteError(f"file_mounts: the S3 copy {'in' if direction == 'in' else 'back'} ran past {timeout_s:g} s",
                          "it is tried again", command="file_mounts") from None
    records = []
    for line in got.stdout.splitlines()[-1000:]:
        try:
            rec = bounded_json.loads(line, max_bytes=MAX_RECORD_LINE)
        except bounded_json.Refused:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    bad = next((r for r in records if "error" in r), None)
    if not got.ok or bad:
        what = inert(str((bad or {}).get("error") or f"exit {got.exited}")[:300])
        raise RemoteError(f"file_mounts: the S3 copy {'in' if direction == 'in' else 'back'} failed on the instance: "
                          f"{what}", "check the bucket and prefix exist and hold what the task expects",
                          command="file_mounts", exit_status=got.exited)
    return records
