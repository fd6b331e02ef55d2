"""`ec2gpu logs`: a run's job log, from its instance while it stands (followed by byte offset
through dropped connections), else from the artifacts brought home."""
from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ...agent.agent import MAX_ENV_BYTES
from ...aws import sweep, tags
from ...errors import RemoteError, UsageError
from ...remote import jobs, ssh, sync
from ...wire import agent_record, bounded_json
from ...words import count
from .. import element_table
from ..job_summary import mask_text
from ..settle import ledger
from . import status
from .nodes import connect_verified, copy_log

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...backend import Context
    from ...remote.files import Limits


def finished(home: Path, name: str) -> dict[str, Any] | None:
    """The ledger's row for run ``name`` (an id or a unique prefix) once it is over, else None: its
    log is then on this machine and needs no AWS."""
    try:
        row = ledger.get(home, name)
    except UsageError:
        return None
    return None if row["status"] == "running" else row


def exit_status_of(row: dict[str, Any]) -> int:
    """What `logs --follow` exits with for a finished run (pure): the job's exit status, 0 for a
    completed run, 1 when the run ended before its job did (interrupted, teardown, AWS)."""
    if row["status"] == "completed":
        return 0
    return int(row.get("exit_status") or 1)


def run_id_on(home: Path, inst: Instance) -> str:
    """The newest run on instance ``inst``: the ledger's newest row that lists it (an `ec2gpu exec`
    on a standing instance has its own run id), else the run id of its tag."""
    for row in ledger.runs(home, limit=200):
        if inst.id in (row.get("instance_ids") or []):
            run_id: str = row["run_id"]
            return run_id
    return inst.tags.get(tags.RUN, "")


def saved_log(home: Path, name: str) -> Path:
    """The job log a finished run brought home (job.log, or node 0's of a cluster run).

    Raises UsageError when the ledger has no such run or its artifacts hold no log.
    """
    try:
        artifacts = Path(ledger.get(home, name).get("artifacts") or "")
    except UsageError as exc:
        raise UsageError(f"no running instance named {name!r}, and {exc.message}", "see `ec2gpu ls` and `ec2gpu runs`")
    path = next((p for p in (artifacts / "job.log", artifacts / "job-node-0.log") if p.is_file()), None)
    if path is None:
        raise UsageError(f"run {name!r} has no instance left and no log at {artifacts / 'job.log'}",
                         "its artifacts were moved or never downloaded")
    return path


class NotEnded(Exception):
    """Element_log's answer for an element whose log is not home yet while its run goes on:
    ``row``, the run's ledger row (stream_element reads the log from its worker)."""

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__(row["run_id"])
        self.row = row


def element_log(home: Path, row: dict[str, Any] | None, name: str, index: int) -> tuple[Path, int | None]:
    """(the log of element ``index`` of the array run ``row`` (the ledger's row of run ``name``,
    None when it is not over), its exit status from the run's pool.json where known). While the
    run goes on (on this machine), an element that has ended has its log here already (the run
    brings finished elements' outputs and logs home every 10 s), its exit status unknown yet.
    Raises NotEnded for an element of a run that goes on whose log is not home yet; UsageError: a
    run not known, no such element or no log of it."""
    if row is None:
        try:
            running = ledger.get(home, name)
        except UsageError:
            running = None
        if running is None:
            raise UsageError(f"run {name!r} is not known here: --index reads an element's log as the run that "
                             "runs the array brought it home", "see `ec2gpu runs`")
        path = Path(running.get("artifacts") or "") / "logs" / f"{index}.log"
        if not 0 <= index < 10_000:
            raise UsageError(f"--index {index}: an element's index is 0 to 9,999", "e.g. --index 17")
        if not path.is_file():
            raise NotEnded(running)
        return path, None
    if not 0 <= index < 10_000:
        raise UsageError(f"--index {index}: an element's index is 0 to 9,999", "e.g. --index 17")
    artifacts = Path(row.get("artifacts") or "")
    path = artifacts / "logs" / f"{index}.log"
    if not path.is_file():
        raise UsageError(f"run {row['run_id']} has no log of element {index} at {path}",
                         "is it an array's run, with that index? its table: runs/RUN/pool.json")
    exit_status = None
    try:
        elements = bounded_json.loads((artifacts / "pool.json").read_bytes(), max_bytes=element_table.MAX_TABLE_BYTES)["elements"]
        got = [e.get("exit_status") for e in elements if e.get("index") == index]
        exit_status = got[0] if got and isinstance(got[0], int) and not isinstance(got[0], bool) else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return path, exit_status


#: seconds between looks at a running element's log (and at the head's record of it) with --follow
ELEMENT_POLL_S = 1.0
#: secret_names.json: the names of at most 100 secrets (wire/run_spec.MAX_SECRETS), each an environment variable's
MAX_NAMES_BYTES = 64 * 1024


def running_element(record: bytes | None, index: int) -> tuple[str | None, Any]:
    """(the address of the node that runs element ``index`` now, or None; the element's exit status
    once it has ended, else None) from the bytes of the pool driver's table.json on the head
    (ec2gpu/pool/driver.py: hostile input, read as such: pure, never raises)."""
    try:
        data = bounded_json.loads(record or b"{}", max_bytes=element_table.MAX_STATUS_BYTES)
        element = next(e for e in data.get("elements", []) if isinstance(e, dict) and e.get("index") == index)
    except (ValueError, TypeError, AttributeError, StopIteration, RecursionError):
        return None, None
    code = element.get("exit_status")
    code = code if isinstance(code, int) and not isinstance(code, bool) and -(2 ** 31) <= code < 2 ** 31 else None
    nodes = element.get("nodes")
    if element.get("status") != "running" or not isinstance(nodes, list) or not nodes:
        return None, code
    try:
        return str(ipaddress.ip_address(str(nodes[-1])[:64])), None
    except ValueError:
        return None, None


def stream_element(ctx: Context, row: dict[str, Any], index: int, follow: bool, write: Callable[[bytes], object],
                   note: Callable[[str], None]) -> tuple[int | None, str]:
    """Write the log of element ``index`` of the array run ``row`` (its ledger row; the run goes on)
    from the worker that runs it now, found through the driver's record on the head, to ``write``
    (bytes, its secrets masked line by line), as it is or, with ``follow``, until the head's record
    says the element ended; return (its exit status: None without ``follow``; the instance id).
    Host keys are checked against the console output. Raises UsageError when the run has no head
    running, or the element is not running (queued, or ended: its log comes home within 10 s).
    RemoteError when an instance cannot be reached."""
    run_id = row["run_id"]
    head = head_instance(ctx.aws.ec2, row)
    if head is None:
        raise UsageError(f"run {run_id} has no running instance", "see `ec2gpu runs` and `ec2gpu status RUN`")
    hconn, _ = _open(ctx, head, note)
    try:
        head_dir = jobs.remote_run_dir(hconn, run_id)

        def look() -> tuple[str | None, Any]:
            try:
                return running_element(jobs.read_from(hconn, f"{head_dir}/pool/{element_table.TABLE}", 0,
                                                      element_table.MAX_STATUS_BYTES + 1), index)
            except jobs.CONNECTION_ERRORS as exc:
                raise RemoteError(f"{head.id}: the connection to the pool's head was lost ({type(exc).__name__})",
                                  f"run `ec2gpu logs {run_id} --index {index}` again") from None
        address, _ = look()
        if address is None:
            raise UsageError(f"element {index} of run {run_id} is not running (queued, or ended: an ended element's "
                             "log comes home within 10 s of its end)",
                             f"ec2gpu status {run_id} shows the elements; try again in a moment")
        ids = set(row.get("instance_ids") or [])
        inst = next((i for i in sweep.find_instances(ctx.aws.ec2, states=["running"])
                     if i.id in ids and ctx.backend.private_address(i) == address), None)
        if inst is None:
            raise UsageError(f"element {index} runs on {address}, which is not one of run {run_id}'s running "
                             "instances", "try again in a moment: its node may have just been replaced")
        conn, _ = _open(ctx, inst, note) if inst.id != head.id else (hconn, None)
        splitter = None
        try:
            run_dir = jobs.remote_run_dir(conn, run_id)
            secrets = secret_values(conn, run_dir, note)
            splitter = jobs.LineSplitter(lambda line: write((mask_text(line, secrets) + "\n").encode()))
            cursor, path = jobs.LogCursor(splitter), f"{run_dir}/elements/{index}/job.log"
            jobs.drain(conn, path, cursor)
            code = None
            while follow:
                time.sleep(ELEMENT_POLL_S)
                now_at, code = look()
                jobs.drain(conn, path, cursor)
                if now_at != address:  # it ended (code: its exit status), or went back to the queue
                    break
        except jobs.CONNECTION_ERRORS as exc:
            raise RemoteError(f"{inst.id}: the connection was lost while reading element {index}'s log "
                              f"({type(exc).__name__})", f"run `ec2gpu logs {run_id} --index {index}` again") from None
        finally:
            if splitter:
                splitter.flush()
            if conn is not hconn:
                conn.close()
    finally:
        hconn.close()
    return code, inst.id


def _open(ctx: Context, inst: Instance, note: Callable[[str], None]) -> tuple[Any, Callable[[], Any]]:
    """(an SSH connection to ``inst``, a function that opens another): the run's key, the host key
    pinned (checked against the console output first if it is not yet). Raises RemoteError or
    WaitTimeout when it does not answer in 60 s, UsageError without the private key."""

    conn, host, port, known, key = connect_verified(ctx.aws, ctx.settings, ctx.backend, inst, log=note, timeout_s=60)
    return conn, lambda: ssh.connect(host, port, ctx.settings.ssh_user, key, known, note)


#: how long `logs --follow` waits, once the instance it followed is gone, for the ledger to record
#: the run's end (its controller writes it after its teardown and bill), polled every LEDGER_POLL_S
ENDED_WAIT_S = 30.0
LEDGER_POLL_S = 1.0


def stream(ctx: Context, inst: Instance, follow: bool, write: Callable[[bytes], object],
           note: Callable[[str], None]) -> tuple[int | None, str, str | None]:
    """Write the job log of the run on instance ``inst`` (a DescribeInstances dict) to ``write``
    (bytes), as it is now or, with ``follow``, to the job's end; return (the job's exit status, or
    None without ``follow``; the run id; None while the instance stands for the user to remove,
    else what ends it: why EC2 ended it, or its run's controller (``what_ends``)).

    With ``follow``, EC2 is asked about the instance every recovery.STATE_EVERY_S seconds, and at
    once whenever SSH drops (recovery.InstanceWatch): once EC2 reports it shutting down, stopping,
    stopped or terminated (a foreground run's controller ended it), the follow ends at once instead
    of reconnecting for 120 s, and the exit status is the ledger's (``ended_status``). EC2 says so at
    once: "When you terminate an instance, it enters the shutting-down state and then the terminated
    state" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instance-state-changes.html);
    the sandbox's DescribeInstances answers the same (moto). The host key is checked against the
    console output.

    Raises RemoteError when the instance stays unreachable, UsageError without its private key or
    when no job has run there.
    """
    from ..recover import recovery  # here: the watch's module imports boto3's errors

    run_id, iid = run_id_on(ctx.settings.home, inst), inst.id
    conn, reconnect = _open(ctx, inst, note)
    run_dir = jobs.remote_run_dir(conn, run_id)
    exit_status, ended = None, None
    splitter = None
    try:
        if not jobs.read_from(conn, f"{run_dir}/{agent_record.NAME}", 0):
            raise UsageError(f"no job has run on {iid} yet (run {run_id})",
                             "start one there with `ec2gpu exec NAME TASK.yaml` (or `-- CMD`)")
        secrets = secret_values(conn, run_dir, note)
        if secrets:  # masked line by line, as the run showed it; else byte for byte
            splitter = jobs.LineSplitter(lambda line: write((mask_text(line, secrets) + "\n").encode()))
        cursor = jobs.LogCursor(splitter or write)
        if follow:
            watch = recovery.InstanceWatch(ctx.aws.ec2, iid, recovery.NoCheckpoints(), note)
            try:
                exit_status, conn = jobs.follow_reconnecting(
                    reconnect, run_dir,
                    "job.log", cursor, conn=conn, log=note, on_poll=watch)
            except jobs.Unreachable as exc:
                raise RemoteError(f"{iid}: {exc}", "see `ec2gpu ls`; the instance may have been terminated")
            except recovery.Interrupted as gone:
                ended = gone.reason
                exit_status = ended_status(ctx.settings.home, run_id)
            else:  # the job ended: whether the instance stands for the user to remove
                ended = what_ends(ctx.settings.home, run_id, watch)
        else:
            jobs.drain(conn, f"{run_dir}/job.log", cursor)
    finally:
        if splitter:
            splitter.flush()
        conn.close()
    return exit_status, run_id, ended


#: what ``what_ends`` says of an instance whose run's controller, alive on this machine, ends it
CONTROLLER_ENDS = "its run's controller brings the outputs home and ends it"


def what_ends(home: Path, run_id: str, watch: Any) -> str | None:
    """Once a followed job ended: what ends its instance (None: nothing, it stands for `ec2gpu
    down`): its run's controller while the ledger says the run goes on under a live one on this
    machine (runs/recover/reconcile.controller_gone), else why EC2 reports it gone (``watch``, a
    recovery.InstanceWatch, asked now: a controller that was quicker has ended it)."""
    from ..recover import reconcile, recovery
    try:
        row = ledger.get(home, run_id)
    except UsageError:
        row = None
    if row is not None and row["status"] == "running" and row.get("controller") and not reconcile.controller_gone(row):
        return CONTROLLER_ENDS
    try:
        watch.check()
    except recovery.Interrupted as gone:
        return gone.reason
    return None


def ended_status(home: Path, run_id: str, wait_s: float = ENDED_WAIT_S,
                 sleep: Callable[[float], object] = time.sleep) -> int | None:
    """The exit status of run ``run_id`` once the ledger says it is over (exit_status_of), waiting
    up to ``wait_s`` seconds (polled every LEDGER_POLL_S) for its controller to record its end;
    None when it does not (its controller is gone, or elsewhere), or at once for a run this
    machine's ledger does not know."""
    for _ in range(max(1, int(wait_s / LEDGER_POLL_S) + 1)):
        try:
            row = ledger.get(home, run_id)
        except UsageError:  # not this machine's run: nothing here will record its end
            return None
        if row["status"] != "running":
            return exit_status_of(row)
        sleep(LEDGER_POLL_S)
    return None


def secret_values(conn: Any, run_dir: str, note: Callable[[str], None] = lambda m: None) -> list[str]:
    """The values of the run's secrets (names in secret_names.json, values in the 0600
    job.env.json), longest first; [] for a run without secrets. A file the reader refuses
    (bounded_json) is said to ``note``: the log is then not masked."""

    def read(name: str, limit: int, empty: bytes) -> Any:
        return bounded_json.loads(jobs.read_from(conn, f"{run_dir}/{name}", 0, limit + 1) or empty, max_bytes=limit)
    what = "secret_names.json"
    try:  # the instance's files: anything but the shapes ec2gpu wrote counts as no secrets to mask
        names = read(what, MAX_NAMES_BYTES, b"[]")
        what = "job.env.json"
        env = read(what, MAX_ENV_BYTES, b"{}") if names else {}
    except bounded_json.Refused as exc:
        note(f"warning: the run's {what} on the instance is refused ({exc}): its secrets are not masked in the log")
        return []
    if not isinstance(names, list) or not isinstance(env, dict):
        return []
    return sorted((env[k] for k in names if isinstance(k, str) and isinstance(env.get(k), str) and env[k]),
                  key=len, reverse=True)


def head_instance(ec2: Any, row: dict[str, Any]) -> Instance | None:
    """The running instance of ledger row ``row`` whose job's files count (node 0 of its newest
    attempt: the first of its ``instance_ids`` still running), or None."""
    ids = row.get("instance_ids") or []
    live = {i.id: i for i in sweep.find_instances(ec2, states=["running"]) if i.id in ids}
    return next((live[i] for i in ids if i in live), None)


def fetch(ctx: Context, inst: Instance, run_id: str, out: Path, note: Callable[[str], None],
          limits: Limits | None = None) -> dict[str, list[str]]:
    """Bring home what the job of run ``run_id`` wrote on instance ``inst`` so far, as a finished run
    would have: its output directory to ``out``/outputs, its checkpoint directory (the default one,
    in the run's directory) to ``out``/checkpoints (each at most ``limits``, remote/files.Limits;
    default: the settings'), and job.log (secrets masked, its last nodes.MAX_LOG_BYTES) and the
    agent's status record (validated: runs/execute/status.py) to ``out``. For a run whose controller died,
    before `down` terminates the instance. The host key is checked against the console output.
    Names and contents are the instance's: checked as a run checks them (remote/files.py), what is
    not brought home is said through ``note``. Returns {"outputs": [...], "checkpoints": [...],
    "files": [...]} (paths relative to their directory).

    Raises RemoteError when the instance cannot be reached, UsageError without its private key.
    """

    iid = inst.id
    limits = limits or ctx.settings.download_limits
    conn, _ = _open(ctx, inst, note)
    warn = lambda line: note(f"warning: {line}")  # noqa: E731
    try:
        run_dir = jobs.remote_run_dir(conn, run_id)
        got = {"outputs": sync.pull(conn, f"{run_dir}/out", out / "outputs", [], None, iid, limits, warn)[0],
               "checkpoints": sync.pull(conn, f"{run_dir}/checkpoints", out / "checkpoints", [], None, iid, limits,
                                        warn)[0],
               "files": []}
        secrets = secret_values(conn, run_dir, note)
        if jobs.size_of(conn, f"{run_dir}/job.log"):  # never job.env.json: it holds the secrets' values
            copy_log(conn, f"{run_dir}/job.log", out / "job.log", lambda line: mask_text(line, secrets))
            got["files"].append("job.log")
        record = status.read(conn, run_dir, None)  # the key died with the controller: validated, not verified
        if record is not None:
            (out / agent_record.NAME).write_text(json.dumps(record, indent=2))
            got["files"].append(agent_record.NAME)
    finally:
        conn.close()
    note(f"{iid}: {count(len(got['outputs']), 'output file')}, {count(len(got['checkpoints']), 'checkpoint file')} and "
         f"{', '.join(got['files']) or 'no log'} brought home to {out}")
    return got
