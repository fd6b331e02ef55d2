"""Reaching an instance, as library functions: ssh, ssh_config, logs, fetch, tunnel, notebook.

Each function opens its own backend.Context (``region``; ``sandbox``: the local sandbox instead of
AWS, also EC2GPU_SANDBOX=1), returns a typed record (its ``to_json()`` is what the CLI's ``--json`` prints) and raises the
ec2gpu.errors tree: UsageError for bad input before anything is opened or created, NoCredentials,
AwsError, RemoteError (an instance that cannot be reached, or whose host key is not the one its
console printed), WaitTimeout. ``log(text)`` is told what happens on the way (default: nothing);
``warn(text)`` what the user should look at (default: ``log``). Both may quote an instance or a
tag: whoever shows them makes them inert (ec2gpu.inert).

OpenSSH (ssh, tunnel, notebook) runs with the config these functions write ($EC2GPU_HOME/ssh_config)
and the instance's host key pinned under its instance id, verified against its console output
first where it is not pinned yet: it refuses any other key.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from .. import settings as settings_mod
from ..aws import network, runstore, sweep, tags
from ..backend import Context
from ..errors import AwsError, LedgerError, UsageError
from ..remote import ssh as remote_ssh
from ..remote import tunnel as port_forward
from ..remote.files import Limits
from ..remote.ssh_config import HostEntry, openssh
from ..runs.detached import fetch as detached
from ..runs.execute import logs as run_logs
from ..runs.execute.reporter import Reporter, ReporterLike
from ..runs.options import LaunchOptions
from ..runs.recover import handover
from ..runs.settle import ledger
from ..runs.standing import hosts as standing
from ..runs.standing import notebook as jupyter
from ..tasks.spec import size_bytes
from .instances import Log, _context, _quiet, _types, find, idle_rule

if TYPE_CHECKING:
    from ..aws.instances import Instance

#: ``write(chunk, final=False)``: where ``logs`` sends a job log's bytes as they come (``final``: its end).
Write = Callable[..., None]


# ---- what these functions return (the CLI's ``--json`` prints each one's ``to_json()``) ----------

@dataclass(frozen=True)
class SshConfig:
    """What `ssh_config` wrote: ``path`` ($EC2GPU_HOME/ssh_config), ``hosts`` (the first alias of
    each entry), ``skipped`` ({instance id: why it was left out}; the reason may quote an
    instance's console: shown inert)."""
    path: str
    hosts: list[str]
    skipped: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document: {"path", "hosts", "skipped"}."""
        return {"path": self.path, "hosts": self.hosts, "skipped": self.skipped}


@dataclass(frozen=True)
class LogShown:
    """What `logs` read. ``source``: "saved" (brought home), "s3" (a detached run's store) or
    "instance" (its running instance); ``instance_id`` None but for "instance"; ``exit_status``
    the job's where known, else None; ``state`` a detached run's record's state (source "s3"),
    or for source "instance" what ends the instance once its job ended (why EC2 ended it, or its
    run's controller; None while it stands for `down`: runs/execute/logs.stream); ``log`` the
    log as text (UTF-8, an undecodable byte as U+FFFD) when no ``write`` was given, else None."""
    exit_status: Optional[int]
    run_id: str
    instance_id: Optional[str]
    source: str
    state: Optional[str] = None
    log: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """{"exit_status", "run_id", "instance_id", "source"}, "state" for source "s3", "log" when collected."""
        shown: dict[str, Any] = {"exit_status": self.exit_status, "run_id": self.run_id,
                                 "instance_id": self.instance_id, "source": self.source}
        if self.source == "s3" or self.state is not None:
            shown["state"] = self.state
        if self.log is not None:
            shown["log"] = self.log
        return shown


#: The keys of each kind of `fetch` (its ``source``), in the order ``--json`` has always printed them.
FETCHED_KEYS = {
    None: ("run_id", "out", "outputs", "checkpoints", "files"),
    "s3": ("run_id", "out", "source", "outputs", "checkpoints", "files", "state", "skipped", "left", "columns"),
    "s3-handover": ("run_id", "out", "source", "checkpoints", "outputs", "files", "state", "handover", "skipped",
                    "left", "array"),
}


@dataclass(frozen=True)
class Fetched:
    """What `fetch` brought home. ``out``: the absolute directory; ``outputs``, ``checkpoints``,
    ``files``: paths relative to their directory. ``source``: None (from the running instance),
    "s3" (a detached run's store) or "s3-handover" (what a lost controller's instance handed
    over); for those, ``state`` (the record's), ``skipped`` (how many objects were refused for
    their name or place) and ``left`` (how many were above the limits; for "s3-handover" 1 when the
    reading stopped at a member above them, else 0);
    "s3" alone: ``columns`` (the ledger's fields from its summary.json, {} without one);
    "s3-handover" alone: ``handover`` (how it went) and ``array`` (an array's element table, or None)."""
    run_id: str
    out: str
    outputs: list[str]
    checkpoints: list[str]
    files: list[str]
    source: Optional[str] = None
    state: Optional[str] = None
    skipped: int = 0
    left: int = 0
    columns: dict[str, Any] = field(default_factory=dict)
    handover: Optional[str] = None
    array: Optional[list[dict[str, Any]]] = None

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document: FETCHED_KEYS[source] of these fields."""
        return {key: getattr(self, key) for key in FETCHED_KEYS[self.source]}


@dataclass(frozen=True)
class Tunnel:
    """The forward `tunnel` held: instance ``port`` (on its 127.0.0.1) at ``local_port`` here, ``url``
    http://127.0.0.1:LOCAL_PORT; ``name`` as asked."""
    instance_id: str
    name: str
    port: int
    local_port: int
    url: str

    def to_json(self) -> dict[str, Any]:
        """{"instance_id", "name", "port", "local_port", "url"}."""
        return asdict(self)


@dataclass(frozen=True)
class Notebook:
    """A notebook `notebook` served: on ``instance_id`` (``name``: its Name tag, else its id),
    JupyterLab's ``port`` there forwarded to ``local_port`` here, ``url`` with its ``token``; the
    four None when it was interrupted before the URL. ``terminated``: whether --down-on-exit removed
    the instance, ``removed`` then what went ({kind: [ids]}; None otherwise)."""
    instance_id: str
    name: str
    local_port: Optional[int] = None
    port: Optional[int] = None
    token: Optional[str] = None
    url: Optional[str] = None
    terminated: bool = False
    removed: Optional[dict[str, list[str]]] = None

    @classmethod
    def of(cls, info: dict[str, Any]) -> Notebook:
        """The record of runs/standing/notebook.serve's ``info``."""
        return cls(instance_id=info["instance_id"], name=info["name"], local_port=info.get("local_port"),
                   port=info.get("port"), token=info.get("token"), url=info.get("url"))

    def to_json(self) -> dict[str, Any]:
        """{"instance_id", "name", "local_port", "port", "token", "url"} (the last four once the URL was
        shown), "terminated", and "removed" when it was."""
        shown: dict[str, Any] = {"instance_id": self.instance_id, "name": self.name}
        if self.url is not None:
            shown.update(local_port=self.local_port, port=self.port, token=self.token, url=self.url)
        shown["terminated"] = self.terminated
        if self.removed is not None:
            shown["removed"] = self.removed
        return shown


def _port(value: Optional[int], flag: str) -> None:
    """Raise UsageError when ``value`` (given) is not a TCP port (1 to 65535)."""
    if value is not None and not (isinstance(value, int) and 1 <= value <= 65535):
        raise UsageError(f"{flag} {value!r} is not a port", "give 1 to 65535")


def _size(value: Union[int, str], flag: str) -> int:
    """Bytes of ``value``: an int, or a size as text ('500MB', '10G', '2GiB', '2048'; tasks.spec.size_bytes:
    pydantic's ByteSize). Raises UsageError naming ``flag`` for anything else, or a negative size."""
    try:
        return size_bytes(value)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}", "use e.g. 500MB or 2GiB") from None


def _pin_host_key(ctx: Context, inst: Instance, log: Log) -> None:
    """Before OpenSSH connects (StrictHostKeyChecking yes, HostKeyAlias): pin the instance's host
    key under its instance id, verified against its console output, when it is not pinned yet.
    Raises RemoteError, WaitTimeout."""
    if not remote_ssh.pin_under_alias(ctx.settings.home / "known_hosts" / inst.id, inst.id, log):
        standing.pin_host_key(ctx.aws, ctx.settings, ctx.backend, inst, log=log).close()


def _write_ssh_config(ctx: Context, warn: Log, log: Log, pin: bool = False) -> tuple[Path, list[HostEntry], dict[str, str]]:
    """runs/standing/hosts.write_ssh_config for ``ctx``: (path, entries, {instance id: why it was left out})."""
    return standing.write_ssh_config(ctx.aws, ctx.settings, ctx.backend, warn, pin=pin, log=log)


def ssh(name: str, command: Union[str, Sequence[str]] = (), *, region: Optional[str] = None, sandbox: bool = False,
        log: Log = _quiet, warn: Optional[Log] = None) -> int:
    """Run OpenSSH on the running instance ``name`` (a Name tag, instance id, run id or cluster:
    its first instance); `ec2gpu ssh`. With no ``command``, an interactive shell on this process's
    terminal; else ``command`` (argv words, joined by OpenSSH with spaces as it does; a str is one
    command line) runs there. Writes $EC2GPU_HOME/ssh_config first (a Name tag not safe in it is
    left out and said to ``warn``). Returns ssh's exit status: the remote command's, 255 for
    OpenSSH's own failure (a host key that is not the pinned one). Raises UsageError (no such
    running instance), NoCredentials, AwsError, RemoteError and WaitTimeout (its host key could not
    be pinned)."""

    words = [command] if isinstance(command, str) else list(command)
    with _context(region, sandbox, log=log) as ctx:
        inst = find(ctx, name)[0]
        _pin_host_key(ctx, inst, log)
        config, _, _ = _write_ssh_config(ctx, warn or log, log)
        return openssh(config, inst.id, words)


def ssh_config(*, region: Optional[str] = None, sandbox: bool = False, log: Log = _quiet,
               warn: Optional[Log] = None) -> SshConfig:
    """Write $EC2GPU_HOME/ssh_config so plain `ssh NAME`, scp and editors reach the running
    instances; `ec2gpu ssh-config`. Each entry insists on the instance's pinned host key (under its
    instance id); an instance not pinned yet is pinned first, checked against its console output,
    or left out with the reason. Returns an SshConfig (path, hosts: the first alias of each entry,
    skipped: {instance id: why it was left out}). Raises NoCredentials, AwsError."""
    with _context(region, sandbox, log=log) as ctx:
        path, entries, skipped = _write_ssh_config(ctx, warn or log, log, pin=True)
    return SshConfig(path=str(path), hosts=[e.aliases[0] for e in entries], skipped=skipped)


def logs(name: str, *, follow: bool = False, write: Optional[Write] = None, region: Optional[str] = None,
         sandbox: bool = False, log: Log = _quiet, index: Optional[int] = None) -> LogShown:
    """A run's job log; `ec2gpu logs`. ``name``: a run id (or a unique prefix), Name tag or instance id.

    A run that is over: its job.log as it was brought home (this machine's files alone, no AWS).
    A detached run (`run --detach`; one the region's run store holds, from any machine of the
    account): its job.log from S3 (runs/detached/fetch.show_log: its last 64 MiB), as the agent
    last uploaded it (every 60 s and at the end) or, with ``follow``, polled every 5 s, only the
    new bytes written, until the run's record's state is final or the run's group has ended; read live
    over SSH instead while the run has an instance in service and this machine has its private
    key (the one that started it), its secrets masked as in S3. Else the
    log on its running instance, as it is now or, with ``follow``, until the job ends,
    reconnecting when SSH drops (no line missed or repeated). ``write(chunk: bytes, final=False)``
    gets the log's bytes as they come, raw (the job's; a terminal needs them made inert), and
    ``final=True`` once at its end; without ``write`` they are collected and returned as its log
    (text, UTF-8, an undecodable byte as U+FFFD).

    ``index``: an array's or a sweep's element (ec2gpu/pool/): its own log, as it came home with
    the run (logs/INDEX.log of its artifacts: an array's run that is over, or one this machine
    runs, whose ended elements' logs come home every 10 s), exit_status its own (None while the
    run goes on); an element still running (of a run this machine runs), from the worker that runs
    it, found through the pool's record on its head (runs/execute/logs.stream_element: source
    "instance"; with ``follow`` until it ends, exit_status then its own).

    Returns a LogShown (exit_status, run_id, instance_id, source, state, log): source is "saved" (brought home;
    instance_id None), "s3" (a detached run; instance_id None, and state: its record's (state.json)
    state) or "instance"; exit_status is the job's exit status where known: a finished run's
    (runs/execute/logs.exit_status_of: 0 completed, else its job's, 1 when the run ended before its
    job), a detached run's once its state is final (0 succeeded, else its job's exit code, 1 when
    it has none), the followed job's; None for a log read without ``follow``, or one brought
    home by a run that did not end. Raises UsageError (no such run or running instance, no log
    brought home, no job has run there yet, its private key is not here), NoCredentials,
    AwsError, RemoteError (the instance stays unreachable)."""

    collected = bytearray()
    emit: Write = write or (lambda chunk, final=False: collected.extend(chunk))
    shown = _read_log(name, follow, emit, region, sandbox, log, index)
    return shown if write is not None else replace(shown, log=collected.decode("utf-8", errors="replace"))


def _saved_log(home: Path, run_id: str, emit: Write, exit_status: Optional[int]) -> LogShown:
    """The job.log run ``run_id`` brought home (this machine's files alone), all of it to ``emit``."""
    emit(run_logs.saved_log(home, run_id).read_bytes(), final=True)
    return LogShown(exit_status=exit_status, run_id=run_id, instance_id=None, source="saved")


def _read_log(name: str, follow: bool, emit: Write, region: Optional[str], sandbox: bool, log: Log,
              index: Optional[int]) -> LogShown:
    """`logs` but what it collects: the log's bytes to ``emit``, from wherever the run's is (see logs)."""
    home = settings_mod.load({"region": region}).home
    row = run_logs.finished(home, name)
    if index is not None:
        return _element_log(home, row, name, index, follow, emit, region, sandbox, log)
    if row is not None and not _maybe_detached(row):  # over: the log is on this machine, no AWS needed
        return _saved_log(home, row["run_id"], emit, run_logs.exit_status_of(row))
    with _context(region, sandbox, log=log) as ctx:
        known = row if row is not None else _ledger_row(home, name)
        run_id = known["run_id"] if known is not None else name
        if _detached_status(ctx, run_id, known, log) is not None:
            said: set[str] = set()
            shown = detached.show_log(ctx.aws, run_id, emit, log, follow=follow,
                                      live=lambda: detached.live_log(ctx.aws, ctx.settings, ctx.backend, run_id, log,
                                                                     said))
            return LogShown(exit_status=shown["exit_status"], run_id=run_id, instance_id=None, source="s3",
                            state=shown["state"])
        if row is not None:  # over, not detached: the log as it was brought home
            return _saved_log(home, row["run_id"], emit, run_logs.exit_status_of(row))
        try:
            inst: Optional[Instance] = find(ctx, name)[0]
        except UsageError:
            inst = None
        if inst is None:  # over: the log as it was brought home
            emit(run_logs.saved_log(ctx.settings.home, name).read_bytes(), final=True)
            return LogShown(exit_status=None, run_id=ledger.get(ctx.settings.home, name)["run_id"], instance_id=None,
                            source="saved")
        try:
            status, run_id, ended = run_logs.stream(ctx, inst, follow, emit, note=log)
        finally:
            emit(b"", final=True)
    return LogShown(exit_status=status, run_id=run_id, instance_id=inst.id, source="instance", state=ended)


def _element_log(home: Path, row: Optional[dict[str, Any]], name: str, index: int, follow: bool, emit: Write,
                 region: Optional[str], sandbox: bool, log: Log) -> LogShown:
    """`logs --index`: an array's element's log, as the run brought it home (this machine's files)
    once it ended, else from the worker that runs it now (runs/execute/logs.stream_element)."""
    try:
        path, status = run_logs.element_log(home, row, name, index)
    except run_logs.NotEnded as running:  # from the worker that runs it now
        with _context(region, sandbox, log=log) as ctx:
            try:
                status, iid = run_logs.stream_element(ctx, running.row, index, follow, emit, note=log)
            finally:
                emit(b"", final=True)
        return LogShown(exit_status=status, run_id=running.row["run_id"], instance_id=iid, source="instance")
    emit(path.read_bytes(), final=True)
    return LogShown(exit_status=status, run_id=row["run_id"] if row else name, instance_id=None, source="saved")


def _ledger_row(home: Path, name: str) -> Optional[dict[str, Any]]:
    """The ledger's row of run ``name`` (an id or a unique prefix), or None (none, several, no ledger)."""
    try:
        return ledger.get(home, name)
    except (UsageError, LedgerError):
        return None


def _maybe_detached(row: Optional[dict[str, Any]], name: str = "") -> bool:
    """Whether the run of the ledger's ``row`` (None: not in this machine's ledger; ``name`` then)
    may be a detached one, so the run store is asked: its id has the form of one
    (aws/runstore.RUN_ID) and no controller process is recorded (`run --detach` records none;
    every run in the foreground does since ledger migration 6)."""
    run_id = row["run_id"] if row is not None else name
    return (row is None or row.get("controller") is None) and bool(
        isinstance(run_id, str) and runstore.RUN_ID.fullmatch(run_id))


def _detached_status(ctx: Context, run_id: str, row: Optional[dict[str, Any]], log: Log) -> Optional[dict[str, Any]]:
    """The status record of the detached run ``run_id`` when the region's run store holds one
    (runs/detached/fetch.status_of), else None; not asked for a ``row`` of a run in the
    foreground. An S3 error (these credentials may not read the store) is said to ``log``, then
    None: the run is looked for as one in the foreground is."""
    if not _maybe_detached(row, run_id):
        return None
    try:
        return detached.status_of(ctx.aws, run_id)
    except (AwsError, UsageError) as exc:  # UsageError: a user id no run store prefix is made of (runstore.user_id)
        log(f"the run store could not be read ({exc.message}); looking for run {run_id} as one in the foreground")
        return None


def fetch(run_id: str, *, out: Union[str, Path, None] = None, max_download: Union[int, str, None] = None,
          max_files: Optional[int] = None, region: Optional[str] = None, sandbox: bool = False,
          log: Log = _quiet) -> Fetched:
    """Bring home what a run's job has written so far, from its running instance or, for a
    detached run, from its S3 store; `ec2gpu fetch`.

    Outputs to ``out``/outputs, checkpoints to ``out``/checkpoints, job.log (secrets masked) and
    the agent's record (agent-record.json; a detached run's: state.json)
    to ``out`` (default: the run's artifacts directory, else runs/RUN_ID), as a
    finished run would have: for a run whose controller died, before `ec2gpu down RUN`; or what a
    run left on a standing instance above its download limits. A detached run (`run --detach`:
    one the region's run store holds under your user id, from any machine) has them from
    ``runs/USER_ID/RUN_ID/`` in S3 instead (runs/detached/fetch.fetch: keys checked as hostile names, none
    written outside ``out``; its job.log as the agent uploaded it, its secrets masked by the agent;
    its summary.json read as any run's, and its figures, test accuracy among them, put in this
    machine's ledger row when it has one). ``max_download``: bytes brought home per directory (an int, or '500MB', '2GiB':
    tasks.spec.size_bytes; default EC2GPU_MAX_DOWNLOAD_BYTES, else 4 GiB); ``max_files``: files per
    directory (default EC2GPU_MAX_DOWNLOAD_FILES, else 10000). What is not brought home is said to
    ``log``. Returns a Fetched: run_id (the full id), out (absolute path), outputs, checkpoints,
    files (paths relative to their directory); a detached run's also has source "s3", state (its
    record's, state.json), skipped (objects refused for their name or place), left (objects above
    the limits) and columns (from its summary.json: summary, summary_schema, test_acc ...; {}
    without one). A run in the foreground whose controller was lost and whose instance is gone has
    what its agent handed over to ``runs/USER_ID/RUN_ID/handover/`` in S3
    (runs/recover/handover.fetch): source "s3-handover", state, handover (how the hand-over
    went), skipped, left, array (an array's element table, also written as ``out``/pool.json,
    its element logs as ``out``/logs/INDEX.log; None for a run that is no array). ``region``:
    default, the run's own where this machine's ledger has it, else the configured one. Raises
    UsageError (a bad limit; no such run; no running instance to fetch from), NoCredentials,
    AwsError, RemoteError."""
    size = None if max_download is None else _size(max_download, "--max-download")
    if max_files is not None and (isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 0):
        raise UsageError(f"--max-files {max_files!r} is not a count", "give 0 or more")
    known = _ledger_row(settings_mod.load({"region": region, "sandbox": sandbox or None}).home, run_id)
    with _context(region or (known or {}).get("region"), sandbox, log=log) as ctx:  # the run's own region
        limits = ctx.settings.download_limits
        if size is not None:
            limits = replace(limits, bytes=size)
        if max_files is not None:
            limits = replace(limits, files=max_files)
        try:
            row: Optional[dict[str, Any]] = ledger.get(ctx.settings.home, run_id)
        except UsageError as exc:
            row, missing = None, exc
        full = row["run_id"] if row is not None else run_id
        where = Path(out or (row or {}).get("artifacts") or Path("runs") / full).resolve()
        got = _detached_status(ctx, full, row, log)
        if got is not None:
            return _fetch_detached(ctx, full, row, where, limits, got, log)
        head = None if row is None else run_logs.head_instance(ctx.aws.ec2, row)
        if head is None and (row is None or row.get("status") in ("running", "controller-lost")):
            handed = _fetch_handed_over(ctx, full, row, where, limits, log)
            if handed is not None:
                return handed
        if row is None:
            raise missing
        if head is None:
            raise UsageError(f"run {row['run_id']} has no running instance to fetch from, and its instance handed "
                             "nothing over to S3",
                             f"what it brought home is in {row.get('artifacts') or 'runs/' + row['run_id']}")
        pulled = run_logs.fetch(ctx, head, row["run_id"], where, log, limits)
    return Fetched(run_id=row["run_id"], out=str(where), outputs=pulled["outputs"], checkpoints=pulled["checkpoints"],
                   files=pulled["files"])


def _schema(row: Optional[dict[str, Any]]) -> str:
    """The summary.json schema a run's job writes: "mnist" for the built-in `train mnist`'s, else "task"."""
    return "mnist" if row is not None and row.get("task") == "mnist" and row.get("model") is not None else "task"


def _fetch_detached(ctx: Context, run_id: str, row: Optional[dict[str, Any]], where: Path, limits: Limits,
                    got: dict[str, Any], log: Log) -> Fetched:
    """`fetch` of detached run ``run_id`` (``got``: its status record) from its S3 store into
    ``where`` (runs/detached/fetch.fetch); its summary figures put in this machine's ledger ``row``."""
    done = detached.fetch(ctx.aws, run_id, where, limits, log, got, schema=_schema(row))
    if row is not None and done["columns"].get("summary") is not None:  # `runs` shows its test accuracy
        _record_columns(ctx, row, done["columns"], log)
    return Fetched(run_id=run_id, out=str(where), source="s3", outputs=done["outputs"],
                   checkpoints=done["checkpoints"], files=done["files"], state=done["state"], skipped=done["skipped"],
                   left=done["left"], columns=done["columns"])


def _fetch_handed_over(ctx: Context, run_id: str, row: Optional[dict[str, Any]], where: Path, limits: Limits,
                       log: Log) -> Optional[Fetched]:
    """`fetch` of a run whose controller was lost and whose instance is gone: what its agent handed
    over to S3 (runs/recover/handover.fetch), into ``where``; None when it handed nothing over, or
    the run store cannot be read with these credentials (said to ``log``)."""
    try:
        handed = handover.fetch(ctx.aws, run_id, where, limits, log, schema=_schema(row)) \
            if runstore.RUN_ID.fullmatch(run_id) else None
    except AwsError as exc:  # these credentials may not read the run store: said, then as before
        log(f"the run store could not be read ({exc.message})")
        return None
    if handed is None:
        return None
    return Fetched(run_id=run_id, out=str(where), source="s3-handover", checkpoints=[], outputs=handed["outputs"],
                   files=handed["files"], state=handed["state"], handover=handed["handover"],
                   skipped=handed["skipped"], left=handed["left"], array=handed["array"])


def _record_columns(ctx: Context, row: dict[str, Any], columns: dict[str, Any], log: Log) -> None:
    """Put a detached run's summary figures (job_summary.columns) in this machine's ledger row; a
    ledger problem is said, never raised (the files are home either way)."""
    try:
        ledger.record(ctx.settings.home, {**row, **columns})
    except LedgerError as exc:
        log(f"warning: {exc.message}; the files are home")


def tunnel(name: str, port: int, *, local_port: Optional[int] = None, region: Optional[str] = None,
           sandbox: bool = False, log: Log = _quiet, warn: Optional[Log] = None,
           on_ready: Optional[Callable[[str], None]] = None) -> Tunnel:
    """Forward ``port`` of the running instance ``name`` (a server on its 127.0.0.1 is enough) to
    127.0.0.1 here over SSH, until KeyboardInterrupt (Ctrl-C; SIGHUP too, in the main thread);
    `ec2gpu tunnel`. ``local_port``: the port here (default: ``port`` when free, else any free one).
    Nothing is opened in the security group; if SSH drops, it reconnects (said to ``log``).
    ``on_ready(url)`` is called once the port here is chosen, before forwarding starts. The
    interrupt is caught: returns a Tunnel (instance_id, name, port, local_port, url) then, the
    forward's ssh ended. Raises UsageError (a port out of 1 to 65535; ``local_port`` in use here;
    no such running instance), NoCredentials, AwsError, RemoteError (the forward ends by itself),
    WaitTimeout."""

    _port(port, "port")
    _port(local_port, "--local-port")
    with _context(region, sandbox, log=log) as ctx, port_forward.hangup_interrupts():
        inst = find(ctx, name)[0]
        _pin_host_key(ctx, inst, log)
        config, _, _ = _write_ssh_config(ctx, warn or log, log)
        here = port_forward.free_local_port(local_port or port)
        if local_port and here != local_port:
            raise UsageError(f"--local-port {local_port} is in use on this machine", "choose another, or leave it out")
        info = Tunnel(instance_id=inst.id, name=name, port=port, local_port=here, url=f"http://127.0.0.1:{here}")
        if on_ready is not None:
            on_ready(info.url)
        try:  # its ssh ends with this call, however it ends
            port_forward.forward_until_interrupted(port_forward.argv(config, inst.id, port, here), here, log,
                                         refresh=lambda: _write_ssh_config(ctx, warn or log, log))
        except KeyboardInterrupt:
            pass
    return info


def notebook(*, instance_type: Optional[str] = None, spot: bool = False, name: Optional[str] = None,
             local_port: Optional[int] = None, down_on_exit: bool = False, idle_stop: Optional[str] = None,
             idle_down: Optional[str] = None, no_idle: bool = False, max_runtime: Optional[int] = None,
             ssh_cidr: Optional[str] = None, ami: Optional[str] = None, region: Optional[str] = None,
             sandbox: bool = False, reporter: Optional[ReporterLike] = None,
             on_ready: Optional[Callable[[dict[str, Any]], None]] = None, log: Log = _quiet) -> Notebook:
    """JupyterLab on an instance at a local URL, until KeyboardInterrupt (Ctrl-C; SIGTERM where the
    caller makes it one, SIGHUP in the main thread); `ec2gpu notebook`.

    The running instance ``name`` is used, else a new standing one is launched (as `launch`:
    ``instance_type`` (default: the configured one), ``spot``, ``name``, ``ssh_cidr``, ``ami``,
    ``max_runtime`` minutes (default 120), the idle rule of ``idle_stop``/``idle_down``/``no_idle``:
    api.instances.idle_rule). JupyterLab starts in its torch Python on its 127.0.0.1 with a random
    token (or the one already running there is reused) and is forwarded over SSH to
    ``local_port`` here (default: a free one), reconnecting if SSH drops (runs/standing/notebook.serve).
    ``on_ready(info)`` is called once it answers, info: {"instance_id", "name", "url",
    "local_port", "port" (on the instance), "token"}. ``reporter``: a runs.execute.reporter.Reporter for
    the phases (default: silent). An interrupt before the URL on an instance launched for the
    notebook removes it and is raised again. After the interrupt the instance stays with its idle
    rule, or with ``down_on_exit`` it and what its run made are removed (said to ``log``).

    Returns a Notebook: info's fields (only instance_id and name when interrupted before the URL),
    terminated: whether ``down_on_exit`` removed the instance, and with it removed: {kind: [ids]}.
    Raises UsageError (a bad name, type, port, CIDR or idle rule, before anything is created; a
    stopped ``name``), NoCredentials, AwsError, CapacityError, RemoteError, WaitTimeout."""
    if name is not None:
        tags.check_name(name)
    _port(local_port, "--local-port")
    if max_runtime is not None and max_runtime < 1:
        raise UsageError(f"--max-runtime {max_runtime} is under 1 minute", "give the minutes it may live, e.g. 120")
    if ssh_cidr is not None:
        network.check_cidr(ssh_cidr)  # refused here; a wide one is warned of at launch
    idle = idle_rule(idle_stop, idle_down, no_idle, max_runtime, spot)
    types = None if instance_type is None else _types(instance_type)
    reporter = reporter or Reporter(log)
    with _context(region, sandbox, True, log) as ctx, port_forward.hangup_interrupts():
        opts = LaunchOptions(instance_type=",".join(types or _types(ctx.settings.instance_type)),
                             spot=spot, name=name, ssh_cidr=ssh_cidr, ami=ami,
                             max_runtime_minutes=max_runtime or 120, idle=idle)
        info = jupyter.serve(ctx.aws, ctx.settings, ctx.backend, opts, reporter, on_ready or (lambda info: None),
                             local_port)
        done = Notebook.of(info)
        if down_on_exit:
            inst = sweep.find_instances(ctx.aws.ec2, states=["pending", "running", "stopping", "stopped"])
            run_id = next((i.tags.get(tags.RUN) for i in inst if i.id == info["instance_id"]),
                          None)
            if run_id:
                removed = sweep.delete_run(ctx.aws.ec2, run_id, ctx.settings.keys_dir, log=log,
                                           iam=ctx.aws.client("iam"))
                done = replace(done, terminated=True, removed=removed)
    return done
