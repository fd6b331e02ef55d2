"""A detached run's files and log from its S3 store, from any machine of the account: `ec2gpu fetch
RUN` and `ec2gpu logs RUN [--follow]` (issue 30).

What is under ``runs/USER_ID/RUN_ID/`` was written by the run's instance (its role may write its own
prefix), so keys and contents are hostile input, with the rules remote/files.py applies to what
comes home from an instance:

- a key's name below its directory (``outputs/``, ``checkpoints/``) must pass
  remote/files.check_name (relative, no ``..``, ``.`` or empty component, no NUL, Linux's length
  limits), have no backslash (a path separator elsewhere), and not be the directory of another key
  (``outputs/a`` beside ``outputs/a/b``: the file is skipped); its place on this machine
  (remote/files.local_target, checked again just before it is written) must lie inside the target
  with no symbolic link or special file on the way;
- what is brought home is capped per directory in count and bytes (remote/files.Limits: --max-download,
  --max-files, settings.download_limits); each object is read through the size it was listed
  with; at most runstore_objects.MAX_LISTED objects are looked at; the rest is named, never silently dropped;
- a file is written beside its place as a hidden ``.part`` file (O_NOFOLLOW) and renamed into it;
- names and the log are printed inert (ec2gpu.inert) by whoever shows them.

The job's log (``logs/job.log``) is uploaded whole by the agent every 60 s and at the end, at most
its last 64 MiB (agent/mirror.py), so `logs --follow` polls it (HeadObject) and reads only the new
bytes (Range GETs from the size already shown, IfMatch its ETag). When it stops is decided from
the run's record (state.json: its state, wire/run_record.FINAL_STATES) and the run's Auto Scaling
group, never from the log's text.

`logs --follow` reads the log live over SSH while the run's group has an instance in service and
this machine has the run's private key (the machine that started it): the agent lets the SSH user
read job.log in its run directory (``${EC2GPU_STATE_DIR:-/var/lib/ec2gpu}/detached/ec2gpu/runs/RUN``,
agent/prepare.share_log), the host key is checked against the console output as for any
instance, and the bytes shown are the store's (the instance's log masked over its bytes as the
agent masks the copy it uploads, with the run's secrets read from SSM Parameter Store with these
credentials: ``_Masker``), so when the instance goes (a spot interruption) or SSH drops,
following goes on from S3 at the same byte, and live again on the replacement. When the live view
got ahead of the store's last copy and the instance went without a word, the replacement's log
goes on from that copy, said (a few lines may show twice). Past 64 MiB (the store then keeps the
last 64 MiB only) it is S3's. Without the key, or without an instance in service, it is S3's.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ... import words
from ...agent.agent import mask_bytes  # the agent's own rule: the live log's bytes are the store's
from ...aws import groups, instances, network, parameters, runstore, runstore_objects, runstore_records
from ...aws.runstore import store
from ...aws.session import Aws
from ...errors import RemoteError, UsageError, WaitTimeout
from ...remote import files, jobs, ssh
from ...remote.files import write_small
from ...wire import run_record
from .. import job_summary
from ..execute import nodes

Note = Callable[[str], object]
#: ``write(chunk: bytes, final=False)``: where a log's bytes go as they come
Write = Callable[..., object]

#: bytes of job.log the agent keeps in the store, its last ones (agent/mirror.LOG_MAX)
AGENT_LOG_MAX = 64 << 20
#: bytes of job.log brought home or printed at first: its last ones
MAX_LOG_BYTES = AGENT_LOG_MAX
#: seconds between two looks at the log and the run's record with --follow
POLL_S = 5.0
#: with --follow, the group is looked at every this many polls (the run may end without its agent)
GROUP_EVERY = 6
#: bytes of what was shown kept, to find where to go on when the agent's copy of the log lost its
#: start (it keeps the last 64 MiB), and of the new object searched for them
TAIL_BYTES = 4096
SEARCH_BYTES = 8 << 20
#: the hint of a run id the caller's prefix does not hold (aws/runstore.py: each user's runs under runs/USER_ID/)
NOT_FOUND_HINT = ("check the run id and --region; only your own runs are looked for (under your AWS user id), and "
                  "not those started before ec2gpu kept them per user: docs/detached.md")


def status_of(aws: Aws, run_id: str) -> dict[str, Any] | None:
    """The detached run ``run_id``'s status record (runstore_records.get_status: validated) when the
    region's store holds one, else None (also for a value that is not a run id: a Name tag, an
    instance id). Raises NoCredentials, AwsError."""
    if not isinstance(run_id, str) or not runstore.RUN_ID.fullmatch(run_id):
        return None
    s3, bucket, user = store(aws)
    return runstore_records.get_status(s3, bucket, user, run_id)


# --- fetch ------------------------------------------------------------------------------------

def _name_problem(name: str) -> str | None:
    why = files.check_name(name)
    if why is None and "\\" in name:
        why = "backslash in the name"
    return why


def pull(s3: Any, bucket: str, key_prefix: str, root: Path, limits: files.Limits,
         warn: Note, what: str) -> tuple[list[str], files.Selection]:
    """Bring home the objects under ``key_prefix`` to ``root`` (made if need be), the module
    docstring's rules applied; ``what`` names the directory in what is said to ``warn`` (one line
    per kind of object not brought home). Returns (the names written, relative to ``root``, sorted;
    the selection: ``skipped`` (name, why) and ``left`` above the limits). Raises AwsError."""
    listed, more = runstore_objects.list_objects(s3, bucket, key_prefix)
    if more:
        warn(f"{what}: more than {runstore_objects.MAX_LISTED:,} objects under s3://{bucket}/{key_prefix}; "
             "only the first ones were looked at")
    names = [(key[len(key_prefix):], size) for key, size in listed if key.startswith(key_prefix)]
    dirs = {n.rsplit("/", i)[0] for n, _ in names for i in range(1, n.count("/") + 1)}
    sel, candidates = files.Selection(), []
    for name, size in names:
        why = _name_problem(name)
        if why is None and name in dirs:
            why = "also the directory of other objects"
        if why:
            sel.skipped.append((name, why))
        else:
            candidates.append(files.RemoteFile(name, size, 0.0))
    chosen = files.select(candidates, root, limits)
    sel.skipped += chosen.skipped
    sel.left = chosen.left
    written = []
    for f in chosen.files:
        why = _write(s3, bucket, key_prefix + f.name, root, f)
        if why:
            sel.skipped.append((f.name, why))
        else:
            sel.files.append(f)
            written.append(f.name)
    for line in sel.warnings(what, limits):
        warn(line)
    return sorted(written), sel


def _write(s3: Any, bucket: str, key: str, root: Path, f: files.RemoteFile) -> str | None:
    """Write the object ``key`` (listed as ``f``) to its place under ``root``; None once written,
    else why not (nothing left behind)."""
    root.mkdir(parents=True, exist_ok=True)
    target = files.local_target(root, f.name)
    if target is None:
        return "a link, a special file or outside the directory on this machine"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return "its directory cannot be made here (a file is in the way)"
    if files.local_target(root, f.name) is None:  # again, now that its directories exist
        return "a link, a special file or outside the directory on this machine"
    tmp = target.with_name(f".{target.name}.part")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            runstore_objects.download(s3, bucket, key, out, f.size)
        os.replace(tmp, target)
    except runstore_objects.TooLarge:
        tmp.unlink(missing_ok=True)
        return "larger than when it was listed"
    except FileNotFoundError:
        tmp.unlink(missing_ok=True)
        return "gone since it was listed"
    except IsADirectoryError:
        tmp.unlink(missing_ok=True)
        return "a directory is in the way on this machine"
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return None


def fetch(aws: Aws, run_id: str, out: Path, limits: files.Limits, note: Note,
          got: dict[str, Any] | None = None, schema: str = "task") -> dict[str, Any]:
    """Bring home what the detached run ``run_id`` has in its store: ``outputs/`` to
    ``out``/outputs and ``checkpoints/`` to ``out``/checkpoints (each at most ``limits``),
    ``logs/job.log`` (its last MAX_LOG_BYTES) and state.json (the validated record, ``got`` when
    already read) to ``out``. What is not brought home is said to ``note``. The job's
    outputs/summary.json, when it wrote one, is read as runs/job_summary.read_summary
    reads a run's (hostile input, checked against ``schema``: "mnist" for the built-in trainer; the
    run's secrets, read from SSM Parameter Store only then, masked in it as in any run's record;
    when they cannot be read its figures are kept out of "columns", said), and its test accuracy said.

    Returns {"outputs": [...], "checkpoints": [...], "files": [...] (names relative to their
    directory), "state": the record's state, "skipped": objects refused for their name or place,
    "left": objects above the limits, "columns": the ledger's fields from the summary
    (job_summary.columns: summary, summary_schema, test_acc ...; {} without one)}. Raises UsageError
    for a run the store does not hold, NoCredentials, AwsError, OSError (``out`` cannot be written)."""
    s3, bucket, user = store(aws)
    got = got or runstore_records.get_status(s3, bucket, user, run_id)
    if got is None:
        raise UsageError(f"no detached run {run_id} in s3://{bucket}/{runstore.user_prefix(user)} ({aws.region})",
                         NOT_FOUND_HINT)
    warn = lambda line: note(f"warning: {line}")  # noqa: E731
    out.mkdir(parents=True, exist_ok=True)
    outputs, o = pull(s3, bucket, runstore.outputs_prefix(user, run_id), out / "outputs", limits, warn, "outputs")
    checkpoints, c = pull(s3, bucket, runstore.checkpoints_prefix(user, run_id), out / "checkpoints", limits, warn,
                          "checkpoints")
    done: list[str] = []
    log = read_log(s3, bucket, user, run_id, MAX_LOG_BYTES)
    if log is not None and write_small(out, "job.log", log):
        done.append("job.log")
    if write_small(out, run_record.NAME, json.dumps(got, indent=2).encode()):
        done.append(run_record.NAME)
    state = got.get("state")
    if state not in run_record.FINAL_STATES:
        note(f"run {run_id} is {state}: its outputs reach s3://{bucket}/{runstore.outputs_prefix(user, run_id)} at "
             "its end")
    note(f"{words.count(len(outputs), 'output file')}, {words.count(len(checkpoints), 'checkpoint file')} and "
         f"{', '.join(done) or 'no log'} brought home from s3://{bucket}/{runstore.prefix(user, run_id)} to {out}")
    columns: dict[str, Any] = {}
    secrets = run_secrets(aws, s3, bucket, user, run_id) if "summary.json" in outputs else None
    if "summary.json" in outputs and secrets is None:
        note("warning: the run's secrets could not be read from SSM Parameter Store: its summary is kept out of "
             "the ledger")
    elif secrets is not None:
        checked = job_summary.read_summary(out / "outputs" / "summary.json", schema, root=out, secrets=secrets)
        columns = job_summary.columns(checked, schema) if checked is not None else {}
        if columns.get("test_acc") is not None:
            note(f"test accuracy {columns['test_acc']:.2%} (outputs/summary.json)")
    return {"outputs": outputs, "checkpoints": checkpoints, "files": done, "state": state,
            "skipped": len(o.skipped) + len(c.skipped), "left": len(o.left) + len(c.left), "columns": columns}


# --- logs -------------------------------------------------------------------------------------

def log_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/logs/job.log``: the job's log as the agent uploads it."""
    return runstore.logs_prefix(user, run_id) + "job.log"


def read_log(s3: Any, bucket: str, user: str, run_id: str, max_bytes: int = MAX_LOG_BYTES) -> bytes | None:
    """The last ``max_bytes`` bytes (at most) of the run's job.log in the store, or None when there
    is none yet. Raises AwsError."""
    head = runstore_objects.head_object(s3, bucket, log_key(user, run_id))
    if head is None:
        return None
    if head["size"] == 0:
        return b""
    start = max(0, head["size"] - max_bytes)
    return _read(s3, bucket, log_key(user, run_id), start, head["size"], head["etag"])


def _read(s3: Any, bucket: str, key: str, start: int, end: int, etag: str) -> bytes | None:
    """Bytes ``start`` to ``end`` (exclusive) of ``key`` in CHUNK_BYTES ranges, IfMatch ``etag``;
    None when it changed meanwhile."""
    out = bytearray()
    while start + len(out) < end:
        at = start + len(out)
        got = runstore_objects.read_range(s3, bucket, key, at, min(end, at + runstore_objects.CHUNK_BYTES) - 1, etag)
        if got is None:
            return None
        if not got:
            break
        out += got
    return bytes(out)


def _ended(aws: Aws, run_id: str) -> bool:
    """Whether the run's group is gone or at 0 with no instance (structured data: the run can
    end without its agent, at the group's deadline)."""
    found = groups.find_groups(aws.client("autoscaling"), run_id)
    if not found:
        return True
    g = found[0]
    return not g.get("DesiredCapacity") and not g.get("Instances")


class LiveLog(Protocol):
    """The job's log on the run's instance, read over SSH (``live_log``)."""

    instance_id: str

    def read(self, offset: int, limit: int) -> bytes: ...

    def close(self) -> None: ...


#: seconds between two tries of the live log when none was had (no instance in service yet)
LIVE_EVERY_S = 20.0
#: with the live log, seconds between two reads of the run's record
LIVE_STATUS_S = 5.0


class _Shown:
    """What has been written of the log (its bytes as the store has them): ``count`` (the S3 offset
    to go on from), ``tail`` (the last TAIL_BYTES, to find the place again) and ``skip`` (bytes of
    a live read from the log's start already shown, passed over)."""

    def __init__(self, write: Write, count: int = 0, tail: bytes = b""):
        self.write, self.count, self.tail, self.skip = write, count, tail, 0

    def emit(self, data: bytes) -> None:
        if self.skip:
            cut = min(self.skip, len(data))
            data, self.skip = data[cut:], self.skip - cut
        if data:
            self.write(data)
            self.count += len(data)
            self.tail = (self.tail + data)[-TAIL_BYTES:]


class _Masker:
    """Bytes masked as the agent masks the copy it uploads (agent/agent.mask_bytes: each secret value,
    longest first, replaced by ****, over the bytes as they are: no line splitting, no decoding),
    fed in pieces: the last bytes that could be the start of a secret are held back until the next
    piece (or ``flush``), so a value cut between two reads is masked whole and the bytes written
    are the store's, byte for byte."""

    def __init__(self, secrets: list[str], out: Callable[[bytes], None]):
        self.secrets = secrets
        self.values = [v.encode("utf-8", "surrogateescape") for v in secrets if v]
        self.hold = max((len(v) for v in self.values), default=1) - 1
        self.out, self.pending = out, b""

    def feed(self, data: bytes) -> None:
        self.pending += data
        cut = len(self.pending) - self.hold
        moved = True
        while moved and cut > 0:  # never cut through a value: cut before it
            moved = False
            for v in self.values:
                at = self.pending.find(v, max(0, cut - len(v) + 1))
                if 0 <= at < cut < at + len(v):
                    cut, moved = at, True
        if cut > 0:
            self.out(mask_bytes(self.pending[:cut], self.secrets))
            self.pending = self.pending[cut:]

    def flush(self) -> None:
        if self.pending:
            self.out(mask_bytes(self.pending, self.secrets))
            self.pending = b""


def _follow_live(src: LiveLog, shown: _Shown, secrets: list[str], is_final: Callable[[], bool], poll_s: float,
                 sleep: Callable[[float], None], clock: Callable[[], float] = time.monotonic) -> bool:
    """Write the live log of ``src`` from where ``shown`` is, masked as the agent masks the store's
    copy (``_Masker``), until ``is_final()`` (read every LIVE_STATUS_S; the log is then drained and
    its held bytes written: True), or the connection fails or the log passes AGENT_LOG_MAX (the
    store's copy then lost its start, so its offsets are no longer the instance's: False; held
    bytes are dropped, S3 has them). The instance's log holds what the store holds (its earlier
    launches' part came from there, masked), so the first ``shown.count`` bytes are passed over."""
    masker = _Masker(secrets, shown.emit)
    offset, done = 0, False
    shown.skip = shown.count
    next_status = clock()
    try:
        while True:
            final = False
            if clock() >= next_status:
                final, next_status = is_final(), clock() + LIVE_STATUS_S
            while True:  # to the file's current end, a chunk at a time
                chunk = src.read(offset, jobs.CHUNK_BYTES)
                offset += len(chunk)
                if offset >= AGENT_LOG_MAX:
                    return False
                masker.feed(chunk)
                if len(chunk) < jobs.CHUNK_BYTES:
                    break
            if final:
                masker.flush()
                done = True
                return True
            sleep(poll_s)
    except jobs.CONNECTION_ERRORS:
        return False
    finally:
        if not done:
            masker.pending = b""
        shown.skip = 0
        src.close()


def live_log(aws: Aws, settings: Any, backend: Any, run_id: str, note: Note,
             said: set[str] | None = None) -> LiveLog | None:
    """The job's log on the run's instance in service, over SSH (the host key checked against its
    console output), or None: no instance in service, its private key not on this machine (said
    once: ``said`` keeps what was), or SSH not answering in 30 s (said)."""
    group = groups.summary(aws.client("autoscaling"), run_id)
    ids = [i["id"] for i in (group or {}).get("instances", []) if i.get("state") == "InService" and i.get("id")]
    if not ids:
        return None
    found = [i for i in instances.describe_instances(aws.ec2, ids[:1]) if i.state == "running"]
    if not found:
        return None
    inst = found[0]
    if not network.private_key_path(settings.keys_dir, inst.key_name or "").exists():
        if said is not None and "key" not in said:
            said.add("key")
            note("the run's private key is not on this machine (only on the one that started it): its log comes "
                 "from S3, uploaded every minute")
        return None
    try:
        conn, *_ = nodes.connect_verified(aws, settings, backend, inst, log=lambda msg: None, timeout_s=30)
    except (RemoteError, WaitTimeout, UsageError) as exc:
        note(f"the live log of {inst.id} is not reachable ({exc}); following S3")
        return None
    try:
        state_dir = ssh.run(conn, 'printf %s "${EC2GPU_STATE_DIR:-/var/lib/ec2gpu}"').strip()
    except (RemoteError, *jobs.CONNECTION_ERRORS) as exc:
        conn.close()
        note(f"the live log of {inst.id} is not reachable ({type(exc).__name__}); following S3")
        return None
    if not state_dir.startswith("/") or "\n" in state_dir:  # the instance's words: checked
        conn.close()
        return None
    path = f"{state_dir}/detached/ec2gpu/runs/{runstore.check_run_id(run_id)}/job.log"

    class _Live:
        instance_id = inst.id

        def read(self, offset: int, limit: int) -> bytes:
            return jobs.read_from(conn, path, offset, limit)

        def close(self) -> None:
            conn.close()
    return _Live()


def run_secrets(aws: Aws, s3: Any, bucket: str, user: str, run_id: str) -> list[str] | None:
    """The values of the run's secrets (spec.json's ``secrets``, from SSM Parameter Store with these
    credentials: docs/iam-policy.json lets a user read the secrets they made, no other's), to mask
    its live log as the agent masks the copy in S3; [] without any; None when they cannot be had
    (then the log is not read live)."""
    try:
        names = runstore_records.secret_names(s3, bucket, user, run_id)
        if not names:
            return []
        got = parameters.read(aws.client("ssm"), run_id, names)
        return list(got.values()) if len(got) == len(names) else None
    except Exception:  # noqa: BLE001 - no live log then; S3's is masked by the agent
        return None


@dataclass
class _LogRead:
    """Where ``show_log`` is: ``got`` the run's last record read; ``shown`` bytes written (the
    store's offset to go on from), ``etag`` of the store's copy they came from ("": read it again),
    ``tail`` their last TAIL_BYTES; ``ahead``: after a live read, (what S3 had shown before it, its
    tail) until S3's copy is checked again; ``retries``: reads of a copy replaced while read."""

    got: dict[str, Any]
    shown: int = 0
    etag: str = ""
    tail: bytes = b""
    ahead: tuple[int, bytes] | None = None
    retries: int = 0


def show_log(aws: Aws, run_id: str, write: Write, note: Note, follow: bool = False, poll_s: float = POLL_S,
             sleep: Callable[[float], None] = time.sleep, max_bytes: int = MAX_LOG_BYTES,
             live: Callable[[], LiveLog | None] | None = None,
             clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Write the detached run ``run_id``'s job.log from its store to ``write`` (raw bytes; its last
    ``max_bytes`` when longer), then ``write(b"", final=True)``. With ``follow``: poll every
    ``poll_s`` seconds and write only the bytes added since, until the record's state is final
    (the log is then whole: the agent uploads it before the final record) or the run's group
    has ended without one (its log is then all there will be). ``live()``: the log on the run's
    instance (``live_log``), tried with ``follow`` while the run is not over, at most every
    LIVE_EVERY_S seconds: while it answers, the log is read from it every second (masked as the
    agent masks S3's copy), and from S3 again, at the same byte, once it does not.

    Returns {"state": the last state seen, "exit_status": for a final state (0 succeeded, else the
    job's exit code, 1 when it has none or 0), else None}. Raises UsageError for a run the store
    does not hold, NoCredentials, AwsError."""
    s3, bucket, user = store(aws)
    key = log_key(user, run_id)
    got = runstore_records.get_status(s3, bucket, user, run_id)
    if got is None:
        raise UsageError(f"no detached run {run_id} in s3://{bucket}/{runstore.user_prefix(user)} ({aws.region})",
                         NOT_FOUND_HINT)
    st, polls, next_live = _LogRead(got), 0, clock()
    secrets: list[str] | None = None
    try:
        while True:
            final = st.got.get("state") in run_record.FINAL_STATES  # read before the log: the log is then whole
            if _from_store(s3, bucket, key, run_id, st, write, note, max_bytes):
                continue  # replaced while read: read it again
            if not follow or final:
                break
            if live is not None and clock() >= next_live and st.shown < AGENT_LOG_MAX and (src := live()) is not None:
                secrets = run_secrets(aws, s3, bucket, user, run_id) if secrets is None else secrets
                if secrets is None:
                    src.close()
                    live = None
                    note("the run's secrets could not be read to mask its live log: following S3")
                    continue
                _from_live(src, st, secrets, write, note, lambda: runstore_records.get_status(s3, bucket, user, run_id),
                           min(poll_s, 1.0), sleep, clock)
                next_live = clock() + LIVE_EVERY_S
                continue
            if live is not None and clock() >= next_live:
                next_live = clock() + LIVE_EVERY_S
            polls += 1
            if polls % GROUP_EVERY == 0 and _ended(aws, run_id):
                st.got = runstore_records.get_status(s3, bucket, user, run_id) or st.got  # its last word, if any
                if st.got.get("state") not in run_record.FINAL_STATES:
                    note(f"run {run_id}: its group has ended and its record still says {st.got.get('state')}")
                    break
                continue
            sleep(poll_s)
            st.got = runstore_records.get_status(s3, bucket, user, run_id) or st.got
    finally:
        write(b"", final=True)
    if not st.etag:
        note(f"run {run_id} has no job.log in s3://{bucket}/{runstore.logs_prefix(user, run_id)} yet: its agent uploads "
             "it every 60 s once the job runs, and at its end")
    return _outcome(st.got)


def _from_store(s3: Any, bucket: str, key: str, run_id: str, st: _LogRead, write: Write, note: Note,
                max_bytes: int) -> bool:
    """Write what the store's copy of the log (``key``) holds past ``st.shown`` (at first its last
    ``max_bytes``), ``st`` moved on; True when the copy was replaced while read and should be read
    again now (up to 3 times)."""
    head = runstore_objects.head_object(s3, bucket, key)
    if head is None or head["etag"] == st.etag:
        return False
    if st.ahead is not None and head["size"] <= st.shown:
        st.etag = head["etag"]  # behind what the live log showed: the agent's next upload catches up
        return False
    if st.ahead is not None:  # the store's copy goes on from what the live log showed, or not
        if st.tail and _read(s3, bucket, key, st.shown - len(st.tail), st.shown, head["etag"]) != st.tail:
            note("the lines shown live after the store's last copy went with the instance; the log goes "
                 "on from that copy (some lines may show twice)")
            st.shown, st.tail = st.ahead
        st.ahead = None
    if st.shown == 0:
        start = max(0, head["size"] - max_bytes)
        if start:
            note(f"job.log of {run_id}: its first {start:,} bytes not shown (the last {max_bytes:,} are)")
    else:
        start = _where(s3, bucket, key, head, st.shown, st.tail, note)
    data = _read(s3, bucket, key, start, head["size"], head["etag"]) if head["size"] > start else b""
    if data is None and st.retries < 3:
        st.retries += 1
        return True
    if data is not None:
        if data:
            write(data)
        st.shown, st.etag, st.tail = head["size"], head["etag"], (st.tail + data)[-TAIL_BYTES:]
    return False


def _from_live(src: LiveLog, st: _LogRead, secrets: list[str], write: Write, note: Note,
               status: Callable[[], dict[str, Any] | None], poll_s: float, sleep: Callable[[float], None],
               clock: Callable[[], float]) -> None:
    """Write the live log of ``src`` from ``st.shown`` (``_follow_live``) until it stops, reading the
    run's record with ``status()`` (None: none) into ``st.got``; then ``st`` says to read S3's copy
    again from the same byte, and what the live log showed beyond it (``st.ahead``)."""
    note(f"following job.log live on {src.instance_id} over SSH")
    seen = _Shown(write, st.shown, st.tail)

    def is_final() -> bool:
        now = status()
        st.got = now or st.got
        return now is not None and now.get("state") in run_record.FINAL_STATES
    if not _follow_live(src, seen, secrets, is_final, poll_s, sleep, clock):
        note(f"the live log of {src.instance_id} stopped (SSH, or past {AGENT_LOG_MAX >> 20} MiB): following S3")
    if seen.count > st.shown:
        st.ahead = (st.shown, st.tail)
    st.shown, st.tail, st.etag = seen.count, seen.tail, ""  # S3 again, from the same byte


def _outcome(got: dict[str, Any]) -> dict[str, Any]:
    """``show_log``'s answer from the run's last record ``got``: {"state", "exit_status" (for a final
    state: 0 succeeded, else the job's exit code, 1 when it has none or 0; else None)}."""
    state = got.get("state")
    exit_status = None
    if state in run_record.FINAL_STATES:
        code = got.get("exit_code")
        exit_status = 0 if state == "succeeded" else (code if isinstance(code, int) and code else 1)
    return {"state": state, "exit_status": exit_status}


def _where(s3: Any, bucket: str, key: str, head: dict[str, Any], shown: int, tail: bytes, note: Note) -> int:
    """Where the new bytes of a replaced log object start: ``shown`` while it grew; else (the
    agent's copy lost its start: it keeps its last 64 MiB) just after the last bytes shown
    (``tail``), searched in its last SEARCH_BYTES; else its current end, the gap said to ``note``."""
    size = int(head["size"])
    if shown < size < AGENT_LOG_MAX:  # it grew, its start kept
        return shown
    lo = max(0, size - SEARCH_BYTES)
    window = _read(s3, bucket, key, lo, size, head["etag"]) if size > lo else b""
    at = (window or b"").rfind(tail) if tail else -1
    if at >= 0:
        return lo + at + len(tail)
    note(f"job.log of {key}: the store's copy lost its start and what was shown is not in its last "
         f"{SEARCH_BYTES:,} bytes: some lines may be missing here")
    return size

