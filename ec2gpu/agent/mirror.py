"""What a detached run's agent keeps in S3 for the run to outlive its instance, under the run's prefix:

- ``checkpoints/...`` a mirror of EC2GPU_CHECKPOINT_DIR: downloaded at the start (then the job
  gets EC2GPU_RESUME=1), files new or changed uploaded every ``--every`` seconds, at once on a spot
  notice or rebalance recommendation, and at the end; a file the job deleted is deleted there too
  (``Mirror``). While the job runs each file goes up from a copy taken when it held still
  (``consistent_copy``: its size and mtime the same after the copy as before it), however often the
  job rewrites it; hidden files (an atomic rename's temporary) wait for the end (docs/tasks.md,
  "Checkpoints");
- ``outputs/...`` EC2GPU_OUTPUT_DIR (the ``outputs`` globs of it, else all: ``wanted``), at the end;
- ``logs/job.log`` the job's log (the setup's output too), whole, at most LOG_MAX bytes (its last
  ones), every ``--every`` seconds and at the end, each secret's value masked; a replacement
  instance starts its log from it, so it covers the whole run. With several nodes the head's is the
  run's log and each other node uploads its own to ``logs/nodes/<instance_id>.log``;
- the MOUNT-mode file_mounts written back to their buckets (agent/s3files.py) with the checkpoints.

Standard library and boto3 only: shipped beside detached.py.
"""
from __future__ import annotations

import fnmatch
import importlib
import os
import shutil
import stat
import tempfile
import time
from typing import Any, Callable

if __package__:  # in the package (tests, the controller)
    from ..wire import names
    from . import agent, s3files, store
else:  # on the instance: beside this file (runs/detached/launch.AGENT_FILES)
    names = importlib.import_module("names")
    agent = importlib.import_module("agent")
    s3files = importlib.import_module("s3files")
    store = importlib.import_module("store")

LOG_MAX = 64 * 1024 ** 2  # bytes of job.log kept in S3 (the last ones)
#: Linux stamps a file's mtime from its coarse clock, which moves one tick (1/CONFIG_HZ s: 10 ms at
#: HZ=100, the slowest it is built with) at a time: a write within the tick of the mtime read before a
#: copy leaves the mtime as it was, so a file modified less than this long ago is copied only once it
#: is that old and has not changed meanwhile
MTIME_TICK_S = 0.01
COPY_TRIES = 3  # copies of one file in one push while the job runs; one that changed during each waits for the next
COPY_CHUNK = 1 << 20  # bytes read at a time


def consistent_copy(path: str, copy: Any, tries: int = COPY_TRIES) -> os.stat_result | None:
    """Copy the regular file ``path`` into ``copy`` (a file object open for binary writing, written
    over at each try) so that what it holds is one version of the file, however the job rewrites
    it: copied, then kept only when the file's version_of (size, mtime ns, inode) after the copy is
    the one before it and as many bytes came. A file replaced by a rename during the copy was not
    changed: the copy is of the version that was opened, whole (the next push sends the new one).
    A file last modified within MTIME_TICK_S is copied once it is that old and unchanged (a write in
    the same clock tick would not move its mtime): one rewritten in place more often than that is
    not copied while the job runs (one written by a rename is, however often). Returns the stat of
    the version copied; None when the file changed during each of ``tries`` tries, is gone, or is
    not a regular file (a link is never followed)."""
    for _ in range(tries):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # gone, or a link put there since it was listed
            return None
        with os.fdopen(fd, "rb") as src:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                return None
            young = before.st_mtime + MTIME_TICK_S - time.time()
            if young > 0:
                time.sleep(young)
                if version_of(os.fstat(fd)) != version_of(before):  # still being written
                    continue
            copy.seek(0)
            copy.truncate()
            shutil.copyfileobj(src, copy, COPY_CHUNK)
            copy.flush()
            after = os.fstat(fd)
        if version_of(after) == version_of(before) and copy.tell() == before.st_size:
            return before
    return None


def version_of(st: os.stat_result) -> tuple[int, int, int]:
    """What tells one version of a file from another: (size, mtime ns, inode); the inode moves with
    an atomic rename even within one mtime tick."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def wanted(rel: str, patterns: list[str]) -> bool:
    """Whether ``rel`` (a file under EC2GPU_OUTPUT_DIR) is one of ``patterns``: every file when
    there are none; else the last pattern that matches decides ('!' excludes). A pattern without a
    '/' matches a name at any depth, one with a '/' the path from the top; 'dir/' a directory and
    all under it. Approximates gitignore with fnmatch ('*' also crosses '/'), as remote/sync.pull
    reads the task's outputs."""
    if not patterns:
        return True
    parts = rel.split("/")
    verdict = False
    for raw in patterns:
        neg = raw.startswith("!")
        pat = raw[1:] if neg else raw
        dir_only = pat.endswith("/")
        pat = pat.strip("/")
        anchored = "/" in pat or raw.lstrip("!").startswith("/")
        pat = pat.replace("**/", "*").replace("/**", "/*")
        for i in range(1, len(parts) + 1):
            if dir_only and i == len(parts):
                continue
            sub = "/".join(parts[:i]) if anchored else parts[i - 1]
            if fnmatch.fnmatchcase(sub, pat):
                verdict = not neg
                break
    return verdict


class Mirror:
    """A local directory kept in S3 under ``rel_dir`` (checkpoints/, outputs/): what was sent (or
    found there) is remembered as path -> version_of (size, mtime_ns, inode), so each push sends
    only what changed."""

    def __init__(self, runs: Any, rel_dir: str, local: str):
        self.store, self.rel_dir, self.local = runs, rel_dir, local
        self.sent: dict[str, tuple[int, int, int]] = {}
        self.unsteady: list[str] = []  # the last running push's files that changed during each copy

    def pull(self) -> int:
        """Download every object under the prefix into the directory; returns the file count."""
        os.makedirs(self.local, exist_ok=True)
        count = 0
        for rel in self.store.listing(self.rel_dir):
            path = os.path.join(self.local, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.islink(path):
                os.remove(path)
            self.store.s3.download_file(self.store.bucket, self.store.key(f"{self.rel_dir}/{rel}"), path)
            self.sent[rel] = version_of(os.stat(path))
            count += 1
        return count

    def files(self) -> dict[str, os.stat_result]:
        found: dict[str, os.stat_result] = {}
        for dirpath, dirs, names_ in os.walk(self.local):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
            for name in names_:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                rel = os.path.relpath(path, self.local).replace(os.sep, "/")
                if stat.S_ISREG(st.st_mode) and names.safe_rel(rel) is not None and len(found) < store.MAX_TRANSFER_FILES:
                    found[rel] = st
        return found

    def push(self, running: bool = False, want: Callable[[str], bool] = lambda rel: True, delete: bool = True,
             copies: str | None = None) -> int:
        """Upload the files new or changed since the last push; delete in S3 those sent before that
        are gone here. With ``running`` (the job may be writing them): hidden files are left out,
        and each file goes up from a consistent_copy made in the directory ``copies`` (one file at a
        time, removed after), so S3 never holds a half-written one ("updates to a single key are
        atomic": https://docs.aws.amazon.com/AmazonS3/latest/userguide/Welcome.html#ConsistencyModel); a file that
        changed during each copy is said and waits for the next push. Returns the files sent."""
        files = self.files()
        sent, self.unsteady = 0, []
        for rel, st in sorted(files.items()):
            if not want(rel) or self.sent.get(rel) == version_of(st):
                continue
            path, key = os.path.join(self.local, *rel.split("/")), self.store.key(f"{self.rel_dir}/{rel}")
            if not running:
                self.store.s3.upload_file(path, self.store.bucket, key)
            elif os.path.basename(rel).startswith("."):
                continue
            else:
                with tempfile.TemporaryFile(dir=copies) as copy:
                    got = consistent_copy(path, copy)
                    if got is None:
                        self.unsteady.append(rel)
                        continue
                    copy.seek(0)
                    self.store.s3.upload_fileobj(copy, self.store.bucket, key)
                st = got
            self.sent[rel] = version_of(st)
            sent += 1
        if delete:
            for rel in [r for r in self.sent if r not in files]:
                self.store.s3.delete_object(Bucket=self.store.bucket, Key=self.store.key(f"{self.rel_dir}/{rel}"))
                del self.sent[rel]
        return sent


class Uploads:
    """This launch's uploads (module docstring), from the context ``ctx`` (context.Context).
    ``writer``: this launch sends the run's log, checkpoints and outputs (several nodes: the head
    only; another node sends its own log); ``iid``: this instance's id (its own log's name);
    ``log_base``: several nodes, the run's log before this instance became the head."""

    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.writer = True
        self.iid = ""
        self.log_base = b""
        self.log_sent: tuple[int, int] | None = None
        self.ckpt: Mirror | None = None
        self.out_dir = ""
        self.outputs: list[str] = []
        self.write_backs: list[dict[str, Any]] = []  # the MOUNT-mode file_mounts (s3files' records)

    def start(self, out_dir: str, ckpt_dir: str, outputs: list[str]) -> None:
        """The job's output and checkpoint directories (made here), and the outputs' globs."""
        self.out_dir, self.outputs = out_dir, outputs
        os.makedirs(out_dir, exist_ok=True)
        self.ckpt = Mirror(self.ctx.store, "checkpoints", ckpt_dir)

    def pull_log(self) -> None:
        """The log of earlier launches, so this one's appends to it (not on a restart here)."""
        path = os.path.join(self.ctx.run_dir, "job.log")
        if os.path.exists(path):
            return
        try:
            data = self.ctx.store.get_bytes("logs/job.log", LOG_MAX)
        except Exception as exc:
            self.ctx.log(f"the earlier log not read: {type(exc).__name__}: {exc}"[:300])
            return
        if data:
            with open(path, "wb") as f:
                f.write(data[-LOG_MAX:])

    def push_log(self) -> None:
        """job.log (its last LOG_MAX bytes, from a line's start, each secret masked) to S3, when it changed."""
        path = os.path.join(self.ctx.run_dir, "job.log")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        if self.log_sent == (st.st_size, st.st_mtime_ns):
            return
        base = self.log_base[-LOG_MAX:] if self.writer else b""
        with open(path, "rb") as f:
            if len(base) + st.st_size > LOG_MAX:  # its last LOG_MAX bytes, from a line's start: a secret
                # the cut would halve is never sent in part
                f.seek(max(0, st.st_size - LOG_MAX))
                data = (base + f.read(LOG_MAX))[-LOG_MAX:]
                data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
            else:
                data = base + f.read(LOG_MAX)
            data = agent.mask_bytes(data, list(self.ctx.secrets.values()))
        # several nodes: the head's is the run's log; each other's is its own (logs/nodes/ID.log)
        key = "logs/job.log" if self.writer else f"logs/nodes/{self.iid}.log"
        store = self.ctx.store
        store.s3.put_object(Bucket=store.bucket, Key=store.key(key), Body=data, ContentType="text/plain")
        self.log_sent = (st.st_size, st.st_mtime_ns)

    def push_own_log(self) -> None:
        """push_log, its errors said, not raised."""
        try:
            self.push_log()
        except Exception as exc:
            self.ctx.log(f"log not uploaded: {type(exc).__name__}: {exc}"[:300])

    def push(self, settled: bool) -> None:
        """Checkpoints (changed files), the MOUNT-mode file_mounts and the log to S3; errors said,
        not raised (the next push sends what this one could not). ``settled`` (the job may be
        running): checkpoints from consistent copies, file_mounts' files once settled_s old."""
        steps: tuple[tuple[str, Callable[[], object]], ...] = (
            ("checkpoints", lambda: self.push_checkpoints(running=settled)),
            ("file_mounts", lambda: self.write_back(settled)), ("log", self.push_log))
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                self.ctx.log(f"{what} not uploaded: {type(exc).__name__}: {exc}"[:500])

    def push_checkpoints(self, running: bool) -> None:
        """The checkpoint directory's changes to S3 (Mirror.push; ``running``: from consistent copies,
        made in the run's directory), the files that changed during each copy said."""
        if self.ckpt is None:
            return
        self.ckpt.push(running=running, copies=self.ctx.run_dir)
        if self.ckpt.unsteady:
            self.ctx.log(f"checkpoints changed during each of {COPY_TRIES} copies, left for the next upload: "
                         f"{', '.join(self.ckpt.unsteady)}"[:500])

    def write_back(self, settled: bool) -> None:
        """What the job wrote under each MOUNT-mode target, new or changed, to its bucket
        (agent/s3files._write_back; ``settled``: files still being written wait for the next)."""
        for m in self.write_backs:
            done = s3files._write_back(self.ctx.s3_in(m["region"]), m, self.ctx.settled_s if settled else 0)
            if done.get("files"):
                self.ctx.log(f"file_mounts: {done['files']} file(s) written back to s3://{m['bucket']}/{m['prefix']}")

    def push_outputs(self) -> None:
        """EC2GPU_OUTPUT_DIR's files of the outputs' globs to outputs/; errors said, not raised."""
        outputs = Mirror(self.ctx.store, "outputs", self.out_dir)
        try:
            outputs.push(want=lambda rel: wanted(rel, self.outputs), delete=False)
        except Exception as exc:
            self.ctx.log(f"outputs not uploaded: {type(exc).__name__}: {exc}"[:500])

    def tick(self, lease: Any) -> None:
        """While the job or its setup runs, every ``every_s`` seconds and at once on a notice: the
        writer checks it is not superseded (before anything is sent), sends the checkpoints,
        file_mounts and log and writes the record (``lease``: store.Lease); another node sends its
        own log. Raises Superseded."""
        if self.writer:
            lease.check_superseded()
            self.push(settled=True)
            lease.try_save()  # checked again: the push may have taken a while
        else:
            self.push_own_log()

    def finish(self, lease: Any, state: str, message: str | None) -> int:
        """Outputs, checkpoints and log up, then the run's end (``lease.end``). Returns 0."""
        self.push_outputs()
        self.push(settled=False)
        return int(lease.end(state, message))
