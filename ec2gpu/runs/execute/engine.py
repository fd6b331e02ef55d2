"""The steps of an attempt on its nodes: a task on N nodes (one instance is a cluster of one), for `ec2gpu run`,
`ec2gpu exec` and `ec2gpu train mnist` (the built-in task tasks/builtin/mnist.yaml) alike. Their order is
runs/execute/attempt.py's (the one lifecycle); the agent job's strategy is runs/execute/foreground.py.

An attempt, on every node at once: SSH (host key verified) -> the workdir up (rsync, else SFTP) ->
machine setup (ec2gpu/ami/setup-gpu.sh) and the task's ``setup`` (skipped when the same text
already ran on that instance) -> the job, started detached under the instance agent
(ec2gpu/agent/agent.py) -> its log followed live -> outputs home -> judged from the agent's
agent-record.json. Provisioning, replacement after a spot interruption (the job restarts with
EC2GPU_RESUME=1 and its checkpoint directory as last brought home), teardown, billing and the
ledger are the managed-run machinery of provision/pipeline.py, provision/resources.py and recover/recovery.py.

The job's environment (docs/tasks.md, "The job's contract"): the task's envs, and EC2GPU_RUN_ID,
EC2GPU_OUTPUT_DIR, EC2GPU_CHECKPOINT_DIR, EC2GPU_RESUME, EC2GPU_NODE_RANK, EC2GPU_NUM_NODES,
EC2GPU_HEAD_IP, EC2GPU_NODE_IP, EC2GPU_GPUS_PER_NODE, EC2GPU_WORKDIR, EC2GPU_PROGRESS_FILE (a progress
bar's source: runs/execute/nodes.ProgressReader), with SkyPilot's names for the same (SKYPILOT_NODE_RANK,
SKYPILOT_NUM_NODES, SKYPILOT_NODE_IPS, SKYPILOT_NUM_GPUS_PER_NODE, SKYPILOT_TASK_ID; the setup also
gets SKYPILOT_SETUP_NODE_RANK, SKYPILOT_SETUP_NODE_IPS, SKYPILOT_SETUP_NUM_GPUS_PER_NODE), and
~/sky_workdir a link to the workdir. Setup and run are started as SkyPilot starts them, with
~/.bashrc read first (INTERACTIVE).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, cast

from ... import words
from ...errors import LimitReached, RemoteError, UsageError
from ...inert import inert
from . import status
from .nodes import processes_per_node, record_steps
from .nodes import copy_log as copy_log  # re-exported: engine.copy_log (scripts/bench_big_log.py)
from ...wire.agent_record import as_number
from ...remote import files, mounts, sync
from ...tasks import builtin
from ...tasks.load import LoadedTask, check_env_name, env_values
from ...agent.agent import BESIDE, PYTHON_FLAGS
from ...wire import bounded_json
from ...wire.shell import HANDOFF, INTERACTIVE, PROLOGUE
from .. import job_summary  # hostile input (summary.json): bounded, masked, checked against the job's schema
from ..plan.limits import grace_seconds, stop_at
from ..job_summary import MASK as MASK  # re-exported: engine.MASK
from ..job_summary import mask_text
from ..job import TaskJob as TaskJob  # re-exported: engine.TaskJob (its home is runs/job.py, below every stage)
from ..job import node_env as node_env, workdir_of as workdir_of  # re-exported: the job's contract lives in runs/job.py

if TYPE_CHECKING:
    from ...remote.files import Limits
    from ...tasks.mounts import Mount
    from ...tasks.spec import Task
    from ..recover.recovery import DirCheckpoints
    from ..job_summary import Checked
    from .nodes import Node

AGENT = Path(__file__).resolve().parents[2] / "agent" / "agent.py"
#: the records' modules agent.py loads from beside it (agent.BESIDE: the JSON reader, its record's schema), from ec2gpu/wire/
AGENT_BESIDE = tuple(Path(bounded_json.__file__).resolve().parent / name for name in BESIDE)
REAPER = AGENT.with_name("reaper.py")  # runs the setup and ends all it leaves running
TAIL_LINES = 20  # log lines shown when a job fails




def prepare(loaded: LoadedTask, environ: Mapping[str, str], max_upload: int = sync.MAX_UPLOAD_BYTES,
            include_secrets: bool = False, extra_env: dict[str, str | None] | None = None) -> TaskJob:
    """Resolve the task's environment and list its workdir, before anything is created.

    ``extra_env`` (``--env K[=V]``) adds to the task's envs; a value of None comes from ``environ``.
    Raises UsageError for a variable that is null and unset here, a name in ``extra_env`` that is
    not an environment variable name, a workdir or a local file_mounts source over ``max_upload``
    (each on its own), or a local file_mounts file the secrets rules withhold (sync.NEVER_SEND).
    """
    task = loaded.task
    for k in extra_env or {}:
        check_env_name(k, "env")
    if extra_env:
        task = task.model_copy(update={"envs": {**task.envs, **extra_env}})
        loaded = dataclasses.replace(loaded, task=task)
    env = env_values(task, environ)
    manifest = None
    if loaded.workdir is not None:
        manifest = sync.manifest(loaded.workdir, allow_secrets=include_secrets)
        sync.check_size(manifest, max_upload)
    secrets = [env[k] for k in task.secrets if env.get(k)]
    job = TaskJob(loaded, env, manifest, include_secrets, sorted(secrets, key=len, reverse=True))
    job.mount_manifests = _mount_manifests(loaded.mounts, max_upload, include_secrets)
    return job


def _mount_manifests(mounts_: list[Mount], max_upload: int, include_secrets: bool) -> dict[str, sync.Manifest]:
    """target -> sync.Manifest of each local file_mounts directory (a file: checked, no manifest).
    Raises UsageError for a credentials file or a source above ``max_upload`` bytes."""
    out: dict[str, sync.Manifest] = {}
    for m in mounts_:
        if m.kind != "local":
            continue
        if m.is_file:
            if not include_secrets and sync.withheld(Path(m.source)):
                raise UsageError(f"file_mounts.{m.target}: {m.source} is a credentials file: not sent",
                                 "credentials reach a job through envs or --secret (--include-secrets sends it)")
            one = Path(m.source)
            sync.check_size(sync.Manifest(one.parent, [one.name], one.stat().st_size), max_upload,
                            f"file_mounts.{m.target}: {one}")
            continue
        out[m.target] = sync.manifest(Path(m.source), allow_secrets=include_secrets)
        sync.check_size(out[m.target], max_upload, f"file_mounts.{m.target}: {m.source}")
    return out


def builtin_job(name: str, args: list[str]) -> TaskJob:
    """The built-in task ``name`` (tasks/builtin/NAME.yaml) with ``args`` as its "$@"; its workdir
    is ec2gpu's trainer: ec2gpu/__init__.py and ec2gpu/train/*.py (torch and numpy only)."""
    package = Path(__file__).resolve().parents[2]
    shipped = ["ec2gpu/__init__.py"] + [f"ec2gpu/train/{p.name}" for p in sorted((package / "train").glob("*.py"))]
    manifest = sync.Manifest(package.parent, shipped, sum((package.parent / f).stat().st_size for f in shipped))
    return TaskJob(builtin.load(name), {}, manifest, args=list(args), builtin=name)


def manifest_note(job: TaskJob) -> str | None:
    """What will be sent, in one line (None when the task syncs nothing)."""
    m = job.manifest
    if m is None:
        return None
    held = ""
    if m.withheld:
        held = f"; withheld (secrets): {', '.join(m.withheld[:5])}" + (" ..." if len(m.withheld) > 5 else "") + \
            " (--include-secrets sends them)"
    return f"workdir {m.root}: {len(m.files):,} files, {m.bytes:,} bytes to send{held}"


def setup_hash(task: Task) -> str:
    """What identifies a setup on an instance: the sha256 of its text (pure)."""
    return hashlib.sha256((task.setup or "").encode()).hexdigest()


def checkpoint_remote(job: TaskJob, run_dir: str) -> str:
    return node_env(job, "", run_dir, 0, ["-"], 0, False)["EC2GPU_CHECKPOINT_DIR"]


def upload_node(nd: Node, job: TaskJob, ssh_config: Path | None, run_id: str, addresses: list[str], resume: bool,
                checkpoints: DirCheckpoints | None, log: Callable[[str], None], rank: int | None = None) -> None:
    """Send the workdir, the agent and the job's environment (0600) to node ``nd``, and make its
    output and checkpoint directories; on a replacement, the checkpoint directory brought home.
    ``rank``: the node's place in ``addresses`` where it is not its index (a pool's replacement,
    whose index may follow one of a replacement that failed and has no address)."""
    from ...remote import ssh  # here: a dry run imports no paramiko (test_dry_run.py)
    workdir = workdir_of(nd.run_dir, job)
    if job.manifest is not None:
        how = sync.push(nd.conn, job.manifest, workdir, ssh_config, nd.instance_id)
        log(f"workdir: {len(job.manifest.files):,} files, {job.manifest.bytes:,} bytes sent by {how}")
    elif job.loaded.git:
        clone_workdir(nd.conn, job.loaded.git, workdir, log)
    else:
        files.make_dirs(nd.conn, workdir)
    gpus = processes_per_node(nd.info) if nd.info.get("cuda_available") else int(nd.info.get("gpu_count") or 0)
    env = node_env(job, run_id, nd.run_dir, nd.index if rank is None else rank, addresses, gpus, resume,
                   nd.info.get("python") or "python3",
                   instance_type=nd.instance.type if nd.instance else None)
    # both exist when the job starts: it may write "$EC2GPU_CHECKPOINT_DIR/state.txt" at once
    files.make_dirs(nd.conn, env["EC2GPU_OUTPUT_DIR"], env["EC2GPU_CHECKPOINT_DIR"])
    # SkyPilot's workdir path (sky/skylet/constants.py SKY_REMOTE_WORKDIR), unless something real is there
    ssh.execute(nd.conn, f'if [ ! -e "$HOME/sky_workdir" ] || [ -L "$HOME/sky_workdir" ]; then '
                         f'ln -sfn {shlex.quote(workdir)} "$HOME/sky_workdir"; fi')
    # a pool's worker ends its instance with it (pool/node.py); start_agent puts it again after the setup
    files.put_file(nd.conn, AGENT, f"{nd.run_dir}/agent.py")
    for path in AGENT_BESIDE:  # agent.py loads them by their path
        files.put_file(nd.conn, path, f"{nd.run_dir}/{path.name}")
    # the setup reads it (SkyPilot gives the setup the task's envs); the agent's key comes later (start_agent)
    files.write_private(nd.conn, f"{nd.run_dir}/job.env.json", json.dumps(env))
    # the names (never the values) of the secrets, so `ec2gpu logs` can mask job.log as it shows it
    files.write_text(nd.conn, f"{nd.run_dir}/secret_names.json", json.dumps(sorted(job.task.secrets)))
    if resume and checkpoints is not None and checkpoints.has_any():
        count = checkpoints.push(nd.conn, env["EC2GPU_CHECKPOINT_DIR"])
        log(f"pushed the checkpoint directory ({words.count(count, 'file')}); the job resumes with EC2GPU_RESUME=1")


def mounts_node(nd: Node, job: TaskJob, ssh_config: Path | None, log: Callable[[str], None]) -> None:
    """Put the task's file_mounts on node ``nd`` (remote/mounts.place), before its setup."""
    mounts.place(nd.conn, job.mounts, job.mount_manifests, nd.run_dir, str(nd.info.get("python") or "python3"),
                 lambda bucket: job.bucket_regions.get(bucket) or "us-east-1", ssh_config, nd.instance_id, log,
                 job.s3_files)


def clone_workdir(conn: Any, git: dict[str, Any], workdir: str, log: Callable[[str], None]) -> None:
    """SkyPilot's git workdir: a fresh clone of ``git["url"]`` at ``git["ref"]`` (None: its default
    branch) in ``workdir`` on the instance, by the instance (git-clone(1); credentials for a private
    repository are not sent: a public one, or one the instance may read). Raises RemoteError with
    git's last lines when it fails."""
    from ...remote import ssh  # here: a dry run imports no paramiko (test_dry_run.py)
    w, url = shlex.quote(workdir), shlex.quote(git["url"])
    checkout = f" && git -C {w} checkout --quiet {shlex.quote(git['ref'])} --" if git.get("ref") else ""
    # no prompt can wait for an answer: none for a password (https), none for a host key (ssh)
    got = ssh.attempt(conn, f"rm -rf {w} && export GIT_TERMINAL_PROMPT=0 GIT_SSH_COMMAND='ssh -o BatchMode=yes' && "
                            f"git clone --quiet -- {url} {w}{checkout} && "
                            f"git -C {w} rev-parse HEAD", timeout_s=1800)
    if not got.ok:
        raise RemoteError(f"workdir: git clone of {git['url']} failed on the instance (exit {got.exited})",
                          "check the URL and ref; a private repository needs access from the instance",
                          command="git clone", exit_status=got.exited,
                          tail=inert("\n".join((got.stdout + got.stderr).strip().splitlines()[-TAIL_LINES:])))
    log(f"workdir: {git['url']} cloned at {git.get('ref') or 'its default branch'} "
        f"(commit {got.stdout.strip().splitlines()[-1][:12]})")


def setup_node(nd: Node, job: TaskJob, log: Callable[[str], None]) -> None:
    """Run the task's setup on node ``nd`` unless the same setup text already ran on that instance,
    under agent/reaper.py: once the setup's shell has ended, so has every process it left running
    (its group, its session, and what left them: ``setsid``, a double fork), before anything else
    is sent (start_agent).

    Raises RemoteError (with the setup's last lines) when it fails.
    """
    from ...remote import setup, ssh  # here: a dry run imports no paramiko (test_dry_run.py)
    task = job.task
    if not task.setup:
        return
    said = setup.task_setup_done(nd.conn, setup_hash(task))
    if said:
        log(f"setup skipped: it ran at {said}" if "baked into image" in said else
            f"setup unchanged since it ran on this instance at {said}: skipped")
        return
    python = str(nd.info.get("python") or "python3")
    # the job's environment, then SkyPilot's setup names (cloud_vm_ray_backend.py, _setup), then PROLOGUE
    script = (f"_ec2gpu_env=\"$({shlex.quote(python)} -c {shlex.quote(_EXPORTS)} "
              f"{shlex.quote(nd.run_dir)}/job.env.json)\" || exit 1; eval \"$_ec2gpu_env\"; unset _ec2gpu_env; "
              'export SKYPILOT_SETUP_NODE_RANK="$SKYPILOT_NODE_RANK" SKYPILOT_SETUP_NODE_IPS="$SKYPILOT_NODE_IPS" '
              'SKYPILOT_SETUP_NUM_GPUS_PER_NODE="$SKYPILOT_NUM_GPUS_PER_NODE"; '
              f"{PROLOGUE}{task.setup}")
    out = _LineWriter(lambda line: log(mask_text(line, job.secret_values)))
    files.put_file(nd.conn, REAPER, f"{nd.run_dir}/reaper.py")
    result = ssh.attempt(nd.conn, f"{shlex.join(agent_command(python, nd.run_dir, 'reaper.py'))} -- "
                                  f"bash -c {shlex.quote(INTERACTIVE)} {shlex.quote(HANDOFF)} {shlex.quote(script)} setup",
                         timeout_s=3600, stream=out)
    out.flush()
    if not result.ok:
        tail = "\n".join(mask_text(result.stdout + result.stderr, job.secret_values).strip().splitlines()[-TAIL_LINES:])
        raise RemoteError(f"the task's setup on node {nd.index} ({nd.instance_id}) exited {result.exited}",
                          "fix the setup (its output is shown above); nothing else ran", command="setup",
                          host=nd.host, exit_status=result.exited, tail=tail)
    setup.mark_task_setup_done(nd.conn, setup_hash(task))


#: prints `export K=V` lines from a JSON file (the job's environment, secrets included, without
#: putting them on a command line), each value quoted; exits 1, printing nothing, when a name is
#: not an environment variable name (prepare checks them; this holds whatever reaches the file)
_EXPORTS = ("import json,re,shlex,sys;e=json.load(open(sys.argv[1]));"
            "bad=[k for k in e if not re.fullmatch('[A-Za-z_][A-Za-z0-9_]*',k)];"
            "sys.exit('not an environment variable name: %r'%bad[0]) if bad else "
            "print(''.join(f'export {k}={shlex.quote(v)};' for k,v in e.items()))")


class _LineWriter(io.TextIOBase):
    """A text stream that hands whole lines to ``emit`` (fabric's out_stream)."""

    def __init__(self, emit: Callable[[str], object]) -> None:
        self.emit, self.buf = emit, ""

    def write(self, s: str) -> int:
        self.buf += s
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            self.emit(line)
        return len(s)

    def flush(self) -> None:
        if self.buf:
            self.emit(self.buf)
            self.buf = ""


def start_agent(nd: Node, argv: list[str], handover: str | None = None) -> int:
    """Start the agent on node ``nd`` (``argv``: job_argv's, or the pool's driver under the agent)
    and return its process id. Called once the task's setup has ended, and all it left running
    (setup_node): agent.py and the JSON reader it imports are put again (the setup may have changed
    the copies there), and the agent's key (new: ``nd.agent_key``, runs/execute/status.py) and ``handover`` (Handover.document's
    JSON, or None) are written, 0600, by the command that starts the agent (remote/jobs.start), which
    reads and deletes them before the job starts. Raises RemoteError, the connection's errors."""
    from ...remote import jobs, ssh  # here: a dry run imports no paramiko (test_dry_run.py)
    # never written through a link left there; the JSON reader too: agent.py imports it by its path, and Python
    # would take a .pyc the setup planted in __pycache__ for it (an unchecked hash-based one whatever the source)
    d = shlex.quote(nd.run_dir)
    ssh.run(nd.conn, f"rm -f {d}/agent.py {' '.join(f'{d}/{p.name}' for p in AGENT_BESIDE)} && rm -rf {d}/__pycache__")
    files.put_file(nd.conn, AGENT, f"{nd.run_dir}/agent.py")
    for path in AGENT_BESIDE:
        files.put_file(nd.conn, path, f"{nd.run_dir}/{path.name}")
    nd.agent_key = status.new_key()
    private = {"agent.key": nd.agent_key, **({"handover.json": handover} if handover is not None else {})}
    return jobs.start(nd.conn, nd.run_dir, argv, private=private)


def agent_command(python: str, run_dir: str, script: str = "agent.py") -> list[str]:
    """``python -I -S -B RUN_DIR/SCRIPT`` (pure): how the agent (and the reaper) start, with neither
    the script's directory (the run directory, which the setup can write: a json.py or hmac.py
    there) nor any site-packages on sys.path, and no bytecode written (agent.PYTHON_FLAGS)."""
    return [python, *PYTHON_FLAGS, f"{run_dir}/{script}"]


def job_argv(nd: Node, job: TaskJob, limit_minutes: int | None = None, grace_s: float = 120.0,
             handover: bool = False) -> list[str]:
    """The agent's command line on node ``nd`` (pure apart from the node's facts): the task's run
    script in an interactive bash (INTERACTIVE), $0 the task's name, "$@" the job's args; the agent signs its
    record (agent-record.json) with the key start_agent leaves in agent.key (runs/execute/status.py). With the run's
    ``limit_minutes`` (--max-runtime) the agent gives the job SIGTERM ``grace_s`` seconds (at most
    half the limit) before the instance ends itself (runs/plan/limits.py). ``handover``: start_agent
    leaves RUN_DIR/handover.json (runs/recover/handover.py), which the agent reads and deletes."""
    python = nd.info.get("python") or "python3"
    at = stop_at(nd.instance, limit_minutes, grace_s)
    limit = [] if at is None else ["--limit-at", f"{at:.0f}",
                                   # stop_at is None without a limit
                                   "--limit-grace", f"{grace_seconds(cast(int, limit_minutes), grace_s):.0f}"]
    return [*agent_command(python, nd.run_dir), "--dir", nd.run_dir, "--env-file", f"{nd.run_dir}/job.env.json",
            "--key-file", f"{nd.run_dir}/agent.key", *limit,
            *(["--handover-file", f"{nd.run_dir}/handover.json"] if handover else []), "--", "bash", "-c", INTERACTIVE, HANDOFF,
            PROLOGUE + job.task.run, job.name, *job.args]


def judge(nodes: list[Node], job: TaskJob) -> None:
    """The attempt's outcome from the agents' records (agent-record.json): return when every node's job
    succeeded; raise recovery.Interrupted for a lost node or a spot notice, RemoteError (exit 5,
    with the exit code and the last log lines) for a job that failed."""
    from ...remote import jobs  # here: a dry run imports no paramiko (test_dry_run.py)
    from ..recover import recovery  # here: a dry run imports no boto3 (test_dry_run.py)

    for nd in nodes:
        if isinstance(nd.result, recovery.Interrupted):
            raise recovery.Interrupted(f"node {nd.index} ({nd.instance_id}): {nd.result.reason}")
    for nd in nodes:
        if isinstance(nd.result, BaseException):
            raise nd.result
    for nd in nodes:  # a node EC2 took away explains every other failure
        try:
            nd.watch.check()
        except recovery.Interrupted as why:
            raise recovery.Interrupted(f"node {nd.index} ({nd.instance_id}): {why.reason}")
    statuses = {nd.index: nd.status for nd in nodes}
    for nd in nodes:
        said = statuses[nd.index] or {}
        if said.get("state") == "interrupted":
            raise recovery.Interrupted(f"node {nd.index} ({nd.instance_id}): spot interruption notice at "
                                       f"{(said.get('notice') or {}).get('time', '?')}; the job was stopped")
    bad = [nd for nd in nodes if (statuses[nd.index] or {}).get("state") != "succeeded" and nd.result != "stopped"]
    if not bad:
        return
    limited = next((nd for nd in bad if (statuses[nd.index] or {}).get("limit")), None)
    if limited is not None:
        lim = (statuses[limited.index] or {})["limit"]  # not None: it was found by its limit
        raise LimitReached(f"the run's --max-runtime ended the job on node {limited.index} ({limited.instance_id}): "
                           f"it had SIGTERM at {lim.get('stopped_at')} to checkpoint, and the instance ends itself at "
                           f"{lim.get('ends_at')}",
                           "raise the limit: --max-runtime 8h (or max_runtime: in the task file); --max-runtime none "
                           "removes it. Outputs were brought home and every instance is terminated",
                           command=job.task.run, host=limited.host, exit_status=124,
                           tail=mask_text(jobs.tail(limited.conn, f"{limited.run_dir}/job.log", TAIL_LINES), job.secret_values))
    first = root_cause_node(bad, statuses)
    st = statuses[first.index]
    if st is None:
        how = "did not start (no record from the agent)"
        tail = jobs.tail(first.conn, f"{first.run_dir}/console.log", TAIL_LINES)
    elif st.get("problem"):  # unreadable, or not written by the agent: the job's own word is not taken
        how = f"ended, and its agent's record cannot be believed ({st['problem']})"
        tail = jobs.tail(first.conn, f"{first.run_dir}/job.log", TAIL_LINES)
    elif st["state"] not in ("succeeded", "failed"):
        how = f"ended while its agent's record still says {st['state']!r} (the agent was killed, or something " \
              "else wrote its exit status)"
        tail = jobs.tail(first.conn, f"{first.run_dir}/job.log", TAIL_LINES)
    else:
        how = f"exited {st['exit_code']}" if st.get("exit_code") is not None else f"was killed by signal {st.get('signal')}"
        how += worker_failure(st.get("error"))
        tail = jobs.tail(first.conn, f"{first.run_dir}/job.log", TAIL_LINES)
    others = [f"node {nd.index}" for nd in bad if nd is not first]
    raise RemoteError(f"the job on node {first.index} ({first.instance_id}) {how}"
                      + (f"; then {', '.join(others)} failed too" if others else ""),
                      "its last lines are above; outputs were brought home and every instance is terminated",
                      command=job.task.run, host=first.host,
                      exit_status=(st or {}).get("exit_code") or 1, tail=mask_text(tail, job.secret_values))


def root_cause_node(bad: list[Node], statuses: dict[int, dict[str, Any] | None]) -> Node:
    """Of the nodes whose job failed, the one that failed first (pure): a node whose worker was
    killed by a signal (its peers' collectives then fail), else the earliest torchelastic error
    (its record's ``error``), else the first node that failed without one; node order breaks ties."""
    def key(nd: Node) -> tuple[int, float, int]:
        err = (statuses.get(nd.index) or {}).get("error") or {}
        code, stamp = err.get("exit_code"), err.get("timestamp")
        killed = isinstance(code, int) and code < 0
        stamp = as_number(stamp)  # the instance's text: a number or None, never a ValueError
        return (0 if killed else 1 if stamp is not None else 2, stamp or 0.0, nd.index)
    return min(bad, key=key)


def worker_failure(error: dict[str, Any] | None) -> str:
    """' (a worker died of SIGKILL)' or ' (rank 3 failed: ValueError: ...)' from the agent record's
    ``error`` (pure); '' without one."""
    if not error:
        return ""
    code = error.get("exit_code")
    if isinstance(code, int) and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f" (a worker died of {name})"
    first = (error.get("message") or "").strip().splitlines()[:1]
    rank = f"rank {error['rank']}" if error.get("rank") is not None else "a worker"
    return f" ({rank} failed" + (f": {first[0][:200]}" if first else f" with exit code {code}") + ")"


def download(nodes: list[Node], job: TaskJob, local_out: Path, ssh_config: Path | None, log: Callable[[str], None],
             limits: Limits | None = None) -> Checked | None:
    """Bring node 0's checkpoint directory (once more, whatever the job wrote as it stopped) and
    its outputs (the task's ``outputs`` globs, else all of $EC2GPU_OUTPUT_DIR, to
    ``local_out``/outputs, at most ``limits``: remote/files.Limits) and every node's job.log
    (masked, its last nodes.MAX_LOG_BYTES) and status record (the copy snapshot_statuses read)
    home; return the job's summary.json when it wrote one (checked: runs/job_summary.py). Each
    part is tried on its own: a hostile or broken one is reported through ``log`` and the others
    still come home. Raises the connection's errors, and RemoteError for a transfer that failed
    once every other part came home."""
    from ...remote import jobs  # here: a dry run imports no paramiko (test_dry_run.py)
    head = nodes[0]
    steps: list[tuple[str, Callable[[], object]]] = [
        ("checkpoints", lambda: head.watch.checkpoints.sync(head.conn, force=True)),  # first: replacements resume from it
        *[(f"file_mounts of node {nd.index} (written back)", _write_back(nd, log))
          for nd in nodes if any(m.write_back for m in job.mounts)],
        ("outputs", lambda: _outputs_home(head, job, local_out, ssh_config, log, limits or files.Limits())),
        *record_steps(nodes, lambda line: mask_text(line, job.secret_values), local_out)]
    failed = None  # the first transfer that failed: raised once every other part came home
    for what, step in steps:
        try:
            step()
        except (RemoteError, ValueError, UnicodeError, OSError) as exc:
            if isinstance(exc, jobs.CONNECTION_ERRORS) and not isinstance(exc, (FileNotFoundError, PermissionError)):
                raise  # the connection is gone: the caller asks EC2 why
            log(f"warning: {what} not brought home: {type(exc).__name__}: {exc}")
            if isinstance(exc, RemoteError):  # a transfer that failed (rsync's exit): the run fails, as before
                failed = failed or exc
    summary = job_summary.read_summary(local_out / "outputs" / "summary.json", job_summary.schema_of(job),
                                       job.secret_values, root=local_out)
    if summary is not None and summary.schema == "invalid":
        log(f"warning: outputs/summary.json not accepted ({summary['invalid']}); recorded as invalid, its start kept "
            "as text")
    if failed is not None:
        raise failed
    return summary


def _write_back(nd: Node, log: Callable[[str], None]) -> Callable[[], None]:
    """fn(): node ``nd``'s MOUNT-mode file_mounts written back in full (the job has ended)."""
    return lambda: mounts.write_back(nd.conn, nd.run_dir, str(nd.info.get("python") or "python3"), log)


def _write_back_on(nd: Node, log: Callable[[str], None]) -> Callable[[Any], None]:
    """fn(conn): node ``nd``'s MOUNT-mode file_mounts written back over ``conn`` (the watch's) while
    the job runs: settled files only, bounded in time (recovery.WRITE_BACK_*)."""
    from ..recover import recovery  # here: a dry run imports no boto3 (test_dry_run.py)
    return lambda conn: mounts.write_back(conn, nd.run_dir, str(nd.info.get("python") or "python3"), log,
                                          settled_s=recovery.WRITE_BACK_SETTLED_S,
                                          timeout_s=recovery.WRITE_BACK_TIMEOUT_S)


def _outputs_home(head: Node, job: TaskJob, local_out: Path, ssh_config: Path | None, log: Callable[[str], None],
                  limits: Limits) -> None:
    names, how = sync.pull(head.conn, f"{head.run_dir}/out", local_out / "outputs", job.task.outputs, ssh_config,
                           head.instance_id, limits, warn=lambda line: log(f"warning: {line}"))
    log(f"outputs: {words.count(len(names), 'file')} brought home" + (f" by {how}" if names else "")
        + f" to {local_out / 'outputs'}")
