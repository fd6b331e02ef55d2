"""What a detached run's agent keeps in S3 for the run to outlive its instance, under the run's prefix:

- ``checkpoints/...`` a mirror of EC2GPU_CHECKPOINT_DIR: downloaded at the start (then the job
  gets EC2GPU_RESUME=1), files new or changed uploaded every ``--every`` seconds, at once on a spot
  notice or rebalance recommendation, and at the end; a file the job deleted is deleted there too
  (``Mirror``);
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
import stat
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
    found there) is remembered as path -> (size, mtime_ns), so each push sends only what changed."""

    def __init__(self, runs: Any, rel_dir: str, local: str):
        self.store, self.rel_dir, self.local = runs, rel_dir, local
        self.sent: dict[str, tuple[int, int]] = {}

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
            st = os.stat(path)
            self.sent[rel] = (st.st_size, st.st_mtime_ns)
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

    def push(self, settled_s: float = 0.0, now: float | None = None, want: Callable[[str], bool] = lambda rel: True,
             delete: bool = True) -> int:
        """Upload the files new or changed since the last push (with ``settled_s``: not hidden
        ones, nor those modified in the last ``settled_s`` seconds: still being written); delete
        in S3 those sent before that are gone here. Returns the files sent."""
        now = time.time() if now is None else now
        files = self.files()
        sent = 0
        for rel, st in sorted(files.items()):
            if not want(rel) or self.sent.get(rel) == (st.st_size, st.st_mtime_ns):
                continue
            if settled_s and (os.path.basename(rel).startswith(".") or now - st.st_mtime < settled_s):
                continue
            self.store.s3.upload_file(os.path.join(self.local, *rel.split("/")), self.store.bucket,
                                      self.store.key(f"{self.rel_dir}/{rel}"))
            self.sent[rel] = (st.st_size, st.st_mtime_ns)
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
        not raised (the next push sends what this one could not)."""
        ckpt = self.ckpt
        steps: tuple[tuple[str, Callable[[], object]], ...] = (
            ("checkpoints", lambda: ckpt and ckpt.push(self.ctx.settled_s if settled else 0.0, self.ctx.clock())),
            ("file_mounts", lambda: self.write_back(settled)), ("log", self.push_log))
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                self.ctx.log(f"{what} not uploaded: {type(exc).__name__}: {exc}"[:500])

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
