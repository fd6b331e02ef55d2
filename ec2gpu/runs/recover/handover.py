"""A run in the foreground that outlives its controller (issue 30, item 1).

The controller (this machine's `ec2gpu run` or `train`) brings a job's outputs home and ends its
instances. When it is lost before the job ends (the laptop closed or asleep, the network gone,
``kill -9``), the job still runs to its end under the instance's agent; before this, its outputs
then stayed on an instance that its idle rule terminated. Now the run hands over:

1. before the job starts, the controller asks S3 (no call: SigV4 signing here) for presigned PUT
   URLs, each for one key under ``runs/USER_ID/RUN_ID/handover/`` (USER_ID: the caller's) of the
   region's run store (aws/runstore.py: the bucket detached runs use, made on first need); the head node's agent gets
   them in a 0600 file it reads and deletes before the job starts (agent/agent.py: read_handover);
2. while the run goes on, the controller touches ``controller`` in each node's run directory
   (Heartbeat), and writes ``collected`` there once the outputs are home (runs/execute/attempt.mark);
3. an agent whose job has ended and whose heartbeat has been silent ``handover_wait_seconds``
   (setting, default 300) with no ``collected`` puts the outputs (one tar.gz), job.log (secrets
   masked), an array's element table and logs (pool/attempt.py) and its record (agent-record.json) through the URLs,
   then (the head, once all of it is in S3) ends its instance with ``shutdown -h now`` (the run's
   instances terminate on shutdown) unless the instances outlive the run (``--keep``);
4. `ec2gpu fetch RUN` brings them home from S3 (fetch); a controller that comes back (a laptop that
   slept) and finds its instance ended takes them from there too (adopt; an array's: pool/attempt.py),
   rather than run the job again.

The instance gets no AWS credentials: a presigned URL lets its holder write that one object, until
it expires (the run's --max-runtime plus the wait and an hour, at most 7 days), and no longer than
the credentials that signed it: temporary ones (SSO, an assumed role, an instance profile) end in
1-12 h, and their URLs with them, whatever ExpiresIn says
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-presigned-url.html). So (issue 51,
item 2) the URLs are signed for no longer than the credentials last (Aws.credentials_expire_at),
a launch whose credentials end before the run's limit says so (``expiry_warning``), the
controller signs them again on its heartbeat while it lives (``Renewal``: botocore refreshes the
credentials first) and sends them to the head, whose agent takes them when it hands over; and a
URL S3 refuses (400 ExpiredToken, 403) is signed again by the agent with the run's own instance
role when the instance has one (a task with S3 file_mounts; its policy has PutObject on this run's
``handover/`` prefix and nothing more: aws/iam.handover_policy).
"""
from __future__ import annotations

import json
import re
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ... import words
from ...aws import runstore, runstore_objects
from ...errors import Ec2GpuError, RemoteError
from ...inert import inert
from ...remote import files
from ...wire import agent_record, bounded_json
from ...wire.unpack import unpack as unpack_archive
from .. import element_table, job_summary

if TYPE_CHECKING:
    from ...aws.session import Aws
    from ...remote.files import Limits
    from ...settings import Settings

Log = Callable[[str], None]

#: the objects handed over are read at most this large: the agent's record and the log
MAX_STATUS_BYTES = 256 * 1024
MAX_LOG_BYTES = 64 << 20
ARCHIVE_SLACK_BYTES = 64 << 20  # the outputs archive may be this much larger than the download limit
EXPIRY_MARGIN_S = 3600
HEARTBEAT_S = 30.0  # the longest between two heartbeats of a live controller
#: URLs that stop working sooner than this are signed again on the heartbeat: botocore refreshes
#: temporary credentials once they are within 15 min of their end (its advisory refresh timeout,
#: botocore/credentials.py), so the URLs the agent holds last at least about that long while the
#: controller lives
RENEW_BEFORE_S = 20 * 60
#: the file the controller writes renewed URLs to in the head's run directory (agent/agent.py: RENEWED)
RENEWED = "handover-urls.json"


@dataclass(frozen=True)
class Handover:
    """Where a run's agent puts what its lost controller did not collect: ``urls`` ({"outputs",
    "log", "pool", "record": presigned PUT URL}) of ``keys`` (the same names: their keys), in
    ``bucket``; the agent waits ``wait_s`` seconds (s). The URLs stop working at ``expires_at``
    (POSIX s: their ExpiresIn or their credentials' end, whichever is first) and are wanted until
    ``wanted_until`` (POSIX s: the run's limit, the wait and an hour); None: not known."""
    bucket: str
    urls: dict[str, str]
    wait_s: int
    keys: dict[str, str] = field(default_factory=dict)
    expires_at: float | None = None
    wanted_until: float | None = None

    def document(self, head: bool, shutdown: bool, secret_names: list[str], pool: bool = False) -> str:
        """The agent's handover file (JSON): the URLs on the head node only (its outputs are the
        run's), "pool" among them for an array's driver only (``pool``), ``shutdown`` (end the
        instance after), the names of the secrets to mask in what it puts."""
        urls = {k: v for k, v in self.urls.items() if pool or k != "pool"} if head else {}
        return json.dumps({"urls": urls, "wait_s": self.wait_s, "shutdown": shutdown,
                           "secret_names": sorted(secret_names)})


class HandedOver(Exception):
    """The controller leaves a run on purpose (an array's `--detach`): its run is handed over to its
    head's agent, which hands the results over to S3 without waiting for it (pool/attempt.py). Not
    an error: the pipeline leaves the run's instances and resources to end themselves
    (runs/provision/pipeline.run_job)."""


def prepare(aws: Aws, settings: Settings, run_id: str, max_runtime_minutes: int | None, log: Log,
            s3: Any = None, account: str | None = None, wait_s: int | None = None) -> Handover | None:
    """The run's Handover: the run store made if need be (runstore.ensure) and the URLs signed,
    lasting the run's --max-runtime (minutes; 7 days without one) plus the wait and an hour, and no
    longer than this machine's credentials (sign). The wait is ``handover_wait_seconds``, or
    ``wait_s`` (0: at once, for a run its controller leaves on purpose). Credentials that end
    before the run's limit are said to ``log`` in one line (expiry_warning). None with a wait of 0
    from the setting, or when the store cannot be used (said to ``log`` as a warning: the run goes
    on as before, its outputs safe as long as this command lives). Never raises."""
    if wait_s is None and settings.handover_wait_seconds <= 0:
        return None
    wait = settings.handover_wait_seconds if wait_s is None else wait_s
    try:
        s3 = s3 or aws.client("s3")
        account = account or aws.check_credentials()["Account"]
        user = runstore.user_id(aws.check_credentials())
        bucket = runstore.ensure(s3, account, aws.region, settings.owner, settings.run_store_expire_days, log=log)
        now = time.time()
        lasts = (max_runtime_minutes * 60 if max_runtime_minutes else runstore_objects.PRESIGN_MAX_S) + wait + EXPIRY_MARGIN_S
        plan = sign(aws, s3, Handover(bucket, {}, wait, runstore.handover_keys(user, run_id), None, now + lasts), now)
    except Exception as exc:  # noqa: BLE001 - the run goes on without it, whatever went wrong
        why = exc.message if isinstance(exc, Ec2GpuError) else type(exc).__name__
        log(f"warning: no run store for this run ({why}): if this command is lost before the job ends, "
            "its outputs stay on the instance until it ends itself (`ec2gpu fetch` while it runs)")
        return None
    try:
        ends = aws.credentials_expire_at()  # just refreshed by sign: no AWS call
    except Exception:  # noqa: BLE001 - sign had them a moment ago; nothing to say then
        ends = None
    said = expiry_warning(ends.timestamp() if ends else None,
                          now + max_runtime_minutes * 60 if max_runtime_minutes else None, now)
    if said:
        log(said)
    return plan


def sign(aws: Aws, s3: Any, plan: Handover, now: float) -> Handover:
    """``plan`` with its URLs signed now (``now``: POSIX s) for the objects of its ``keys``, lasting
    until its ``wanted_until`` and no longer than the credentials that sign them (read first:
    Aws.credentials_expire_at, which refreshes them when near their end), and its ``expires_at``
    set to when they stop working. Raises botocore's errors (credentials that cannot be had)."""
    ends = aws.credentials_expire_at()
    credentials_end = ends.timestamp() if ends is not None else None
    wanted = (plan.wanted_until or now + runstore_objects.PRESIGN_MAX_S) - now
    lasts = runstore_objects.presign_seconds(wanted, credentials_end, now)
    urls = runstore_objects.presign_puts(s3, plan.bucket, plan.keys, lasts, credentials_end, now)
    return replace(plan, urls=urls, expires_at=now + lasts)


def expiry_warning(credentials_end: float | None, limit_at: float | None, now: float) -> str | None:
    """The one line a launch says when the credentials that sign the hand-over's URLs end
    (``credentials_end``, POSIX s; None: they do not) before the run's limit (``limit_at``, POSIX s;
    None: no --max-runtime, so any end may come first), else None (pure)."""
    if credentials_end is None or (limit_at is not None and credentials_end >= limit_at):
        return None
    expires_at = credentials_end
    def hhmm(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M UTC")
    limit = "no --max-runtime" if limit_at is None else f"its --max-runtime ends at {hhmm(limit_at)}"
    return (f"warning: these AWS credentials expire at {hhmm(expires_at)} (in {max(0, round((expires_at - now) / 60))} "
            f"min) and this run may outlive them ({limit}): if this command is lost after then, the links its instance "
            "hands the outputs over to S3 with die with them (an instance role, a task with S3 file_mounts, still "
            "hands them over); keep this command running, or use credentials that last the run (a longer SSO or role "
            "session)")


class Renewal:
    """The hand-over's URLs signed again before they stop working (``renew``, on each heartbeat),
    and the new ones given to ``deliver`` (the head's agent takes them: urls_command), while the
    controller lives. ``log`` gets one warning when they cannot be renewed."""

    def __init__(self, aws: Aws, plan: Handover, deliver: Callable[[str], object], log: Log,
                 before_s: float = RENEW_BEFORE_S) -> None:
        self.aws, self.plan, self._deliver, self._log, self._before_s = aws, plan, deliver, log, before_s
        self._warned = False

    def renew(self, now: float | None = None) -> bool:
        """When the URLs stop working within ``before_s`` seconds of ``now`` (POSIX s) and are wanted
        longer: sign them again (sign: botocore refreshes the credentials first) and, when the new
        ones last longer, deliver them (a JSON object {"urls": {...}}) and keep them. Whether new
        URLs were delivered. Never raises: a failure (credentials that cannot be refreshed, an
        SSH write that fails) is said once and tried again at the next heartbeat."""
        now = time.time() if now is None else now
        plan = self.plan
        if plan.expires_at is None or plan.expires_at - now > self._before_s or \
                (plan.wanted_until is not None and plan.expires_at >= plan.wanted_until):
            return False
        try:
            fresh = sign(self.aws, self.aws.client("s3"), plan, now)
            if fresh.expires_at is None or fresh.expires_at <= plan.expires_at + 1:
                return False  # the same credentials' end: nothing gained
            self._deliver(json.dumps({"urls": fresh.urls}))
        except Exception as exc:  # noqa: BLE001 - said once; the heartbeat goes on
            if not self._warned:
                why = exc.message if isinstance(exc, Ec2GpuError) else type(exc).__name__
                self._log(f"warning: the hand-over links could not be renewed ({why}): if this command is lost "
                          "after they stop working, the outputs stay on the instance; `aws sso login` (or new "
                          "credentials) lets the next heartbeat renew them")
                self._warned = True
            return False
        self.plan = fresh
        return True


def urls_command(run_dir: str) -> str:
    """The shell command that writes its standard input (the renewed URLs) to RENEWED in
    ``run_dir`` on an instance: 0600 from the start (mktemp), whole or not at all (a rename), never
    through a link left under that name (the rename replaces it)."""
    import shlex
    d = shlex.quote(run_dir)
    return (f't=$(mktemp {d}/.{RENEWED}.XXXXXX) && {{ cat > "$t" && mv -f "$t" {d}/{RENEWED}; }} '
            f'|| {{ rm -f "$t"; exit 1; }}')


def start(aws: Aws, settings: Settings, run_id: str, max_runtime_minutes: int | None, log: Log,
          wait_s: int | None = None) -> Future[Handover | None]:
    """``prepare`` in a thread of its own, beside provisioning (its S3 calls are off the run's path):
    the caller takes ``.result()`` before the job starts. The S3 client and the account are had
    here, on the caller's thread (the clients' cache is not shared across threads while it fills)."""
    done: Future[Handover | None] = Future()
    if wait_s is None and settings.handover_wait_seconds <= 0:
        done.set_result(None)
        return done
    try:
        s3, account = aws.client("s3"), aws.check_credentials()["Account"]
    except Exception:  # noqa: BLE001 - prepare says why, on this thread
        done.set_result(prepare(aws, settings, run_id, max_runtime_minutes, log, wait_s=wait_s))
        return done
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="handover")
    try:
        return pool.submit(prepare, aws, settings, run_id, max_runtime_minutes, log, s3, account, wait_s)
    finally:
        pool.shutdown(wait=False)


def mark_command(run_dir: str, what: str) -> str:
    """The shell command that writes the controller's mark ``what`` ("controller": its heartbeat,
    or "collected") in ``run_dir`` on an instance (agent/agent.py: HEARTBEAT, COLLECTED); with
    "collected", the renewed URLs (RENEWED) go first: nothing is left to hand over."""
    import shlex
    if what not in ("controller", "collected"):
        raise ValueError(what)
    done = f"touch {shlex.quote(run_dir + '/' + what)}"
    return f"rm -f {shlex.quote(run_dir + '/' + RENEWED)} && {done}" if what == "collected" else done


def heartbeat_every(wait_s: float) -> float:
    """Seconds between the controller's heartbeats: a third of the agents' ``wait_s``, at most
    HEARTBEAT_S, at least 1 (pure)."""
    return max(1.0, min(HEARTBEAT_S, wait_s / 3))


class Heartbeat:
    """While the controller lives: ``beat()`` (touch each node's heartbeat file, attempt.mark), then
    ``renew()`` when given (Renewal.renew: the URLs signed again before they stop working), every
    heartbeat_every(``wait_s``) seconds in a daemon thread, from ``start()`` to ``stop()``."""

    def __init__(self, beat: Callable[[], None], wait_s: float, renew: Callable[[], object] | None = None) -> None:
        import threading
        self._beat, self._every, self._renew = beat, heartbeat_every(wait_s), renew
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._beat()
            if self._renew is not None:
                self._renew()

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()


# --- ec2gpu fetch RUN ---------------------------------------------------------------------------

def fetch(aws: Aws, run_id: str, out: Path, limits: Limits, note: Log,
          submitted: list[dict[str, Any]] | None = None, schema: str = "task") -> dict[str, Any] | None:
    """Bring home what the agent of run ``run_id`` handed over (module docstring), or None when the
    run store holds nothing of it: the outputs archive unpacked to ``out``/outputs (hostile input:
    regular files and directories only, each name checked as remote/files.check_name checks an
    instance's, none outside, at most ``limits``), job.log and agent-record.json to ``out``; an array's
    element table to ``out``/pool.json and its element logs to ``out``/logs/INDEX.log (fetch_pool;
    ``submitted``: the array's elements, when known, that the table is checked against; each
    element's test accuracy read from its summary.json, checked against ``schema``).

    Returns {"outputs": [names], "files": ["agent-record.json", "job.log", "pool.json"...], "state": the
    record's state or None, "handover": the record's, "skipped": members refused, "left": 1 when the
    reading stopped at a member above the limits (what follows it is not read), else 0, "array":
    the element table as runs/element_table.parse_status gives it, None for a run that is no array or
    whose table was not handed over or not accepted}. Raises AwsError (S3), UsageError (a bad run
    id), OSError (``out`` not writable)."""
    s3, bucket, user = runstore.store(aws)  # the caller's own prefix: runs/USER_ID/RUN_ID/handover/
    keys = runstore.handover_keys(user, run_id)
    record_bytes = runstore_objects.read_head(s3, bucket, keys["record"], MAX_STATUS_BYTES + 1)
    if record_bytes is None:
        return None
    record = _record(record_bytes)
    out.mkdir(parents=True, exist_ok=True)
    log_bytes = runstore_objects.read_head(s3, bucket, keys["log"], MAX_LOG_BYTES)
    done = [name for name, data in ((agent_record.NAME, json.dumps(record, indent=2).encode()), ("job.log", log_bytes))
            if data is not None and files.write_small(out, name, data)]
    names: list[str] = []
    skipped = left = 0
    with tempfile.TemporaryDirectory(prefix="ec2gpu-handover-") as tmp:
        got = download_unpack(s3, bucket, keys["outputs"], Path(tmp), out / "outputs", limits, note,
                              "the outputs archive")
        if got is not None:
            names, skipped, left = got
    used = sum((out / "outputs" / n).stat().st_size for n in names)  # the array's table and logs get the rest
    rest = replace(limits, files=max(0, limits.files - len(names)), bytes=max(0, limits.bytes - used))
    array = fetch_pool(s3, bucket, keys["pool"], out, rest, note, submitted, schema)
    if array is not None:
        done.append("pool.json")
    note(f"{words.count(len(names), 'output file')} and {', '.join(done)} brought home from "
         f"s3://{bucket}/{runstore.prefix(user, run_id)}{runstore.HANDOVER} to {out} (its instance handed them over: "
         "the controller was gone when the job ended)")
    if record.get("problem"):  # the record refused (agent_record.parse): nothing of it is taken
        note(f"warning: the handed-over {agent_record.NAME} is not accepted ({record['problem']})")
    elif record.get("state"):
        code = record.get("exit_code")
        note(f"the job {record['state']}" + ("" if code is None else f" (exit status {code})")
             + f"; its agent's hand-over: {record.get('handover') or 'not said'}")
    if array is not None:
        c = array["counts"]
        note(f"the array: {words.count(c['done'], 'element')} succeeded, {c['failed']} failed, {c['running'] + c['queued']} not "
             f"ended (its table: {out / 'pool.json'}; each element's log: {out / 'logs'}/INDEX.log)")
    return {"outputs": names, "files": done, "state": record.get("state"), "handover": record.get("handover"),
            "skipped": skipped, "left": left, "array": array}


#: an element's log as the driver names it (RUN_DIR/pool/logs/INDEX.log; ec2gpu/pool/driver.py)
ELEMENT_LOG = re.compile(r"logs/(0|[1-9][0-9]{0,3})\.log")


def fetch_pool(s3: Any, bucket: str, key: str, out: Path, limits: Limits, note: Log,
               submitted: list[dict[str, Any]] | None, schema: str = "task") -> dict[str, Any] | None:
    """An array's hand-over at ``key`` (the tar.gz of its driver's RUN_DIR/pool; hostile): unpacked
    within ``limits`` in a directory of its own under ``out``, its table.json checked
    (runs/element_table.parse_status against ``submitted``, or each record's own parameters), each
    element's test accuracy added from the outputs already home (element_table.accuracies), and written
    as ``out``/pool.json, each element log (logs/INDEX.log, nothing else) moved to ``out``/logs,
    never through a link. Returns the checked table, or None when there is no such object or the
    table is not accepted (said to ``note``). Raises AwsError, OSError (``out`` not writable)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".handover-pool-", dir=out) as tmp:
        got = download_unpack(s3, bucket, key, Path(tmp), Path(tmp) / "pool", limits, note,
                              "the array's table and logs")
        if got is None:
            return None
        names = got[0]
        status = None
        table = Path(tmp) / "pool" / element_table.TABLE
        if element_table.TABLE in names and table.stat().st_size <= element_table.MAX_STATUS_BYTES:
            try:
                status = element_table.parse_status(table.read_bytes(), submitted)
            except element_table.BadStatus as exc:
                note(f"warning: the array's table handed over is not accepted ({inert(str(exc))})")
        if status is not None:
            element_table.accuracies(status, out, schema)
            if not files.write_small(out, "pool.json", json.dumps(status, indent=2).encode()):
                note(f"warning: the array's table not written: {out / 'pool.json'} is a link or not a file")
                status = None
        for name in names:
            if ELEMENT_LOG.fullmatch(name) and (dest := files.local_target(out, name)) is not None:
                dest.parent.mkdir(parents=True, exist_ok=True)
                if files.local_target(out, name) is not None:  # the directory just made is one
                    (Path(tmp) / "pool" / name).replace(dest)
    return status


def adopt(aws: Aws, run_id: str, out: Path, job: Any, limits: Limits, note: Log) -> dict[str, Any] | None:
    """What this run's instance handed over while this controller was away (a laptop that slept, a
    network gone longer than the wait), once the attempt was seen to end: brought home to ``out``
    as ``fetch`` does, and the job's summary.json (checked as any run's: job_summary.read_summary
    against the TaskJob ``job``'s schema; {} without one) when the job succeeded. None when the
    instance handed over no ended job (an interruption like any other: the run goes on), or the
    store cannot be read. Raises RemoteError when the handed-over job failed (its exit status)."""
    try:
        if not ended(aws, run_id):
            return None
        got = fetch(aws, run_id, out, limits, note)
    except Ec2GpuError:
        return None
    if got is None:
        return None
    note("the instance ended itself after handing its outputs over to S3 while this command was away: they are "
         "home, and the job is not run again")
    record = bounded_json.loads((out / agent_record.NAME).read_bytes(), max_bytes=MAX_STATUS_BYTES)  # fetch's checked copy
    if got["state"] != "succeeded":
        code = record.get("exit_code")
        raise RemoteError(f"the job exited {code if code is not None else 'with an error'} (handed over by its "
                          "instance while this command was away)", f"its log: {out / 'job.log'}",
                          command="job", exit_status=code if isinstance(code, int) else None)
    summary = job_summary.read_summary(out / "outputs" / "summary.json", job_summary.schema_of(job),
                                       job.secret_values, root=out)
    return summary or {}


def ended(aws: Aws, run_id: str) -> bool:
    """Whether the agent of run ``run_id`` handed over a job that ended (its record in S3 says
    succeeded or failed): what a controller back from sleep takes rather than run it again.
    Raises AwsError (S3), NoCredentials."""
    got = handed(aws, run_id)
    return got is not None and got["state"] in ("succeeded", "failed")


def handed(aws: Aws, run_id: str) -> dict[str, Any] | None:
    """The record the agent of run ``run_id`` handed over (_record: "state", "handover", "array"
    ...), or None when there is none. Raises AwsError (S3), NoCredentials."""
    s3, bucket, user = runstore.store(aws)
    data = runstore_objects.read_head(s3, bucket, runstore.handover_keys(user, run_id)["record"], MAX_STATUS_BYTES + 1)
    return _record(data) if data is not None else None


def _record(data: bytes) -> dict[str, Any]:
    """The handed-over agent's record (hostile: written by the instance) as wire/agent_record.parse
    checks an agent's, without its signature (the key died with the controller), and its
    ``handover`` as bounded text."""
    got = agent_record.parse(data[:MAX_STATUS_BYTES + 1], None) or {}
    try:
        raw = bounded_json.loads(data, max_bytes=MAX_STATUS_BYTES)
    except bounded_json.Refused:  # said by agent_record.parse, as the record's problem
        raw = {}
    said = raw.get("handover") if isinstance(raw, dict) else None
    counts = raw.get("array") if isinstance(raw, dict) else None  # an array's (agent.array_counts)
    array = element_table.counts_of(counts) if isinstance(counts, dict) else None
    return {**got, "handover": inert(said[:300]) if isinstance(said, str) else None, "array": array,
            "handover_at": inert(raw["handover_at"][:40]) if isinstance(raw, dict)
            and isinstance(raw.get("handover_at"), str) else None, "signature_checked": False}


def download_unpack(s3: Any, bucket: str, key: str, tmp: Path, root: Path, limits: Limits, note: Log,
                    what: str) -> tuple[list[str], int, int] | None:
    """The tar.gz at ``key`` downloaded into the directory ``tmp`` (at most the download limit plus
    ARCHIVE_SLACK_BYTES: gzip never grows data by more than a little) and unpacked into ``root``
    (unpack's rules and result); None when there is no such object, or it is larger (said to
    ``note``: it stays in S3). Raises AwsError."""
    archive = tmp / key.rsplit("/", 1)[-1]
    cap = limits.bytes + ARCHIVE_SLACK_BYTES
    size = runstore_objects.download_head(s3, bucket, key, archive, cap)
    if size is None:
        return None
    if size > cap:
        note(f"warning: {what} is larger than the download limit ({limits.bytes:,} bytes): left in "
             f"s3://{bucket}/{key} (--max-download)")
        return None
    return unpack(archive, root, limits, note, what, f"s3://{bucket}/{key}")


def unpack(archive: Path, root: Path, limits: Limits, note: Log, what: str = "the outputs archive",
           where: str = "S3") -> tuple[list[str], int, int]:
    """Unpack the tar.gz file ``archive`` (hostile) into ``root`` with wire/unpack.unpack's rules
    (regular files only, each name and place checked, tarfile's data filter, in one pass that stops
    at the first member over ``limits`` and after ``limits.bytes`` and a little more decompressed);
    what was not unpacked is said to ``note`` in one line per kind (``where``: where the archive
    stays). Returns (the names written, sorted; members refused; 1 when the reading stopped at a
    member over the limits, else 0: what follows it is not read)."""
    got = unpack_archive(archive, root, max_files=limits.files, max_bytes=limits.bytes)
    hint = (f"it stays in {where}: `ec2gpu fetch RUN --max-download SIZE --max-files N` brings it "
            "(EC2GPU_MAX_DOWNLOAD_FILES / EC2GPU_MAX_DOWNLOAD_BYTES)")
    for line in got.warnings(what, hint):
        note(f"warning: {line}")
    return got.names, len(got.refused), int(got.left is not None)
