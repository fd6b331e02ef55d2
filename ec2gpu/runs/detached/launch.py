"""`ec2gpu run --detach`: put a run in its S3 store, hand it to an Auto Scaling group, return.

No process of ours watches the run afterwards. What this does, in order, each step only once the
one before it worked:

1. the checks of any run, before anything is made (runs/provision/pipeline: options, estimate and
   --budget, the vCPU quota), and the ones of a detached run (``check``: a limit, one node;
   secrets that fit a parameter; file_mounts from S3 checked as a run in the foreground checks
   them, runs/provision/resources.check_s3_access);
2. the run store (aws/runstore.ensure: bucket ``ec2gpu-ACCOUNT-REGION``, public access blocked,
   encrypted, TLS only, expiring); under ``runs/USER_ID/RUN_ID/`` (USER_ID: the caller's,
   aws/runstore.user_id): the workdir (``workdir.tar.gz``: the
   files remote/sync.manifest sends), the agent (AGENT_FILES: ``agent/detached.py`` and its modules, and
   its own boto3: ``agent/boto3.zip``, agent_runtime.py) and
   ``spec.json`` (runs/plan/detached_spec.spec_document: what the agent runs, checked as the agent
   checks it); each local file_mounts source as
   ``mounts/N.tar.gz`` (a directory, packed like the workdir) or ``mounts/N`` (a file);
3. the run's key pair (SSH, for `ec2gpu logs --follow` while an instance is up), its security group
   (SSH from this machine's /32 only) and its own instance role (aws/iam_detached.detached_policy: its own
   prefix and its own group, nothing else, and its own secrets when it has any; with S3
   file_mounts, read access to those prefixes and write access to the MOUNT-mode ones, as a run in
   the foreground's role has: aws/iam.s3_policy); buckets a MOUNT entry names that do not exist
   yet are made;
   the secrets (``--secret``, a task's ``secrets``) as SecureString parameters in SSM Parameter
   Store (aws/parameters.py, tagged with the caller's user id), never in S3 nor in the user data:
   spec.json names them only;
4. a launch template and an Auto Scaling group of ``--nodes`` instances (aws/groups.create; one node
   in any zone that offers its types, several in one zone, the first where the group finds
   capacity, and a cluster placement group: ``_group``), whose user data starts the agent
   (``boot_script``: no credentials in it; the role's come from IMDSv2), with the scheduled action
   that sets the group to 0 at the run's deadline, whoever is left;
5. the run's record ``state.json`` (state "pending": wire/run_record.py) and the ledger row (status "detached": no controller here
   to settle it, runs/recover/reconcile.py leaves it alone).

Whatever fails on the way removes what was made (aws/sweep.delete_run, the group first) before
the error is raised; the run's objects in S3 stay for the bucket's lifecycle rule to expire.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ... import words
from ...aws import (capacity, catalog, groups, iam, iam_boundary, iam_detached, instances, network, parameters,
                    placement, runstore, runstore_objects, runstore_records, storage, sweep)
from ...aws.session import Aws
from ...backend import Backend
from ...errors import UsageError
from ...settings import Settings
from ...wire import bounded_json
from ...wire.run_record import MAX_BYTES as RECORD_MAX_BYTES, VERSION as RECORD_VERSION
from . import agent_runtime
from ..execute import attempt as lifecycle
from ..options import RunOptions
from ..plan import checks
from ..plan.detached_spec import launches, mount_key, secret_env, spec_body, spec_document
from ..plan.costs import Estimate
from ..provision import pipeline
from ..provision import resources as provision
from ..settle import record as run_record

if TYPE_CHECKING:
    from ...remote.sync import Manifest
    from ..job import TaskJob
    from ..execute.reporter import ReporterLike

AGENT_DIR = Path(__file__).resolve().parents[2] / "agent"
WIRE_DIR = Path(bounded_json.__file__).resolve().parent
#: the instance-side files, uploaded under runs/USER_ID/RUN_ID/agent/ and fetched by ``boot_script``:
#: detached.py (what the boot script runs) and every module it imports, the agent's from AGENT_DIR and
#: the records' (WIRE_FILES) from ec2gpu/wire/ (agent_source)
WIRE_FILES = ("bounded_json.py", "names.py", "run_spec.py", "run_record.py", "agent_record.py", "shell.py", "unpack.py")
AGENT_FILES = ("detached.py", "context.py", "store.py", "prepare.py", "mirror.py", "attempt.py", "members.py",
               "several.py", "gang.py", "agent.py", "reaper.py", "s3files.py") + WIRE_FILES
def agent_source(name: str) -> Path:
    """The file on this machine of AGENT_FILES' ``name``: ec2gpu/wire/'s for WIRE_FILES, else agent/'s."""
    return WIRE_DIR / name if name in WIRE_FILES else AGENT_DIR / name


def check(opts: RunOptions) -> TaskJob:
    """Refuse (UsageError, nothing created) what a detached run cannot do yet or must not do
    (runs/plan/checks.check_detached: a limit, at least one launch per node, secrets that fit SSM
    parameters, no --keep); return its task. A planned run (runs/plan/runplan.py) was refused the
    same way before its backend was opened."""
    job = opts.task
    if job is None:
        raise UsageError("--detach runs a task", "give a task file or a command")
    checks.check_detached(max_runtime_minutes=opts.max_runtime_minutes, max_attempts=opts.max_attempts,
                          nodes=opts.nodes, keep=opts.keep, secrets=secret_env(job))
    return job


#: Pythons that may have boto3, first found first: the Deep Learning AMI's PyTorch environments
#: (agent/attempt.PYTHONS), then the image's python3. The one found fetches the agent (any boto3 can
#: GetObject) and makes the agent's venv; the agent runs on its own boto3 there (agent_runtime.py)
BOOT_PYTHONS = ("/opt/pytorch/bin/python3", "/opt/conda/envs/pytorch/bin/python3", "python3")
#: every object the boot script fetches from the run's agent/ prefix and checks against its sha256:
#: the agent's files, then its own boto3 (agent_runtime.RUNTIME, unpacked into the venv)
BOOT_FILES = AGENT_FILES + (agent_runtime.RUNTIME,)
#: the most bytes the boot script reads of one agent file (the largest, agent.py, is ~30 KB)
MAX_AGENT_BYTES = 4 * 1024 * 1024
#: the boot script's exit status when a fetched file is not the one the run was launched with
EXIT_TAMPERED = 3
_SHA256 = re.compile(r"[0-9a-f]{64}")


def agent_files(directory: Path | None = None) -> dict[str, bytes]:
    """{name: its bytes} of each of BOOT_FILES as uploaded: AGENT_FILES' (agent_source, or in
    ``directory``), each read once, then the agent's boto3 (agent_runtime.bundle): ``_upload`` hashes
    and uploads these same bytes, so an ec2gpu upgraded between the two never makes a run refuse its
    own agent. Raises OSError for a file that cannot be read."""
    files = {name: (directory / name if directory else agent_source(name)).read_bytes() for name in AGENT_FILES}
    return {**files, agent_runtime.RUNTIME: agent_runtime.bundle()}


def agent_hashes(directory: Path | None = None) -> dict[str, str]:
    """{name: sha256 of its bytes, lowercase hex} of ``agent_files`` (BOOT_FILES): what ``boot_script``
    checks the fetched agent and its boto3 against. Raises OSError for a file that cannot be read."""
    return {name: hashlib.sha256(data).hexdigest() for name, data in agent_files(directory).items()}


def boot_script(bucket: str, user: str, run_id: str, region: str, group: str, hashes: Mapping[str, str],
                spec_sha256: str) -> str:
    """The user data lines that start the agent of a detached run (pure): the first of
    BOOT_PYTHONS that imports boto3 makes a venv (``python -m venv --without-pip``: no pip, no
    network, not the image's site-packages) and fetches the agent and its own boto3
    (agent_runtime.RUNTIME, unpacked into the venv) from the run's prefix with the instance role's
    credentials, tried for up to 5 min (a new role reaches EC2 a little later: IAM is eventually
    consistent), then runs detached.py with the venv's Python (``-E -s``: neither PYTHONPATH nor the
    user's site can put another boto3 first) in the background, its log in the state directory.
    Where no Python has boto3, the venv cannot be made, the fetch keeps failing or the venv's boto3
    does not import, the instance ends its own group (the AWS CLI, with the role's credentials)
    rather than idle, billed, until the deadline.

    ``hashes`` ({name: sha256 hex}, one per BOOT_FILES: ``agent_hashes``) are written into the
    script, so the launch template's user data, which only the user's credentials can change,
    says what code the run is, its boto3 included: each file fetched (at most MAX_AGENT_BYTES, the
    boto3 zip agent_runtime.MAX_BYTES) is checked against its hash before any is written where it
    could run. A file that differs (rewritten in S3 after
    launch, by anyone who can write the run's prefix, the run's own job included) is refused:
    none is kept or run, the run's record says why (state "failed"), the group is ended, and the
    script exits EXIT_TAMPERED without trying again. ``spec_sha256`` (of ``spec_body``) goes to
    the agent, which refuses a spec.json with other bytes the same way (agent/detached.py: the
    controller writes it once, before launch, and nothing rewrites it).
    It holds no secret: the bucket, the user id (whose prefix holds the run), the run id, the
    region, the group's name and the hashes only.

    Raises ValueError when ``hashes`` does not name each of BOOT_FILES with a sha256, or
    ``spec_sha256`` is not one; UsageError for a bad user or run id."""
    if set(hashes) != set(BOOT_FILES) or not all(_SHA256.fullmatch(str(h)) for h in hashes.values()):
        raise ValueError(f"boot_script: hashes must give a sha256 for each of {', '.join(BOOT_FILES)}")
    if not _SHA256.fullmatch(str(spec_sha256)):
        raise ValueError("boot_script: spec_sha256 is not a sha256 (64 lowercase hex digits)")
    q = shlex.quote
    fetch_py = _fetch_script(bucket, user, run_id, region, group, hashes)
    purelib = q('import sysconfig; print(sysconfig.get_paths()["purelib"])')
    return "\n".join([
        f'dir={instances.STATE_DIR}/detached',
        'mkdir -p "$dir" && chmod 700 "$dir"',
        'py=""',
        f'for p in {" ".join(BOOT_PYTHONS)}; do',
        '  if command -v "$p" >/dev/null && "$p" -c "import boto3" 2>/dev/null; then py="$p"; break; fi',
        "done",
        'venv="$dir/venv"; site=""',  # the agent's own Python and boto3, never the image's
        'if [ -n "$py" ] && "$py" -m venv --without-pip --clear "$venv" >>"$dir/boot.log" 2>&1; then',
        f'  site=$("$venv/bin/python3" -E -s -c {purelib} 2>>"$dir/boot.log")',
        "fi",
        "ok=0",
        'if [ -z "$py" ]; then echo "ec2gpu: no Python with boto3 on this image" >>"$dir/boot.log"; '
        'elif [ -z "$site" ]; then echo "ec2gpu: $py could not make the agent\'s venv $venv" >>"$dir/boot.log"; fi',
        'for _ in $(seq 30); do',
        '  [ -n "$site" ] || break',
        f'  "$py" -c {q(fetch_py)} "$dir" "$site" 2>>"$dir/boot.log"; rc=$?',
        '  if [ "$rc" = 0 ]; then ok=1; break; fi',
        f'  if [ "$rc" = {EXIT_TAMPERED} ]; then ok={EXIT_TAMPERED}; break; fi',
        "  sleep 10",
        "done",
        'if [ "$ok" = 1 ] && ! "$venv/bin/python3" -E -s -c "import boto3" 2>>"$dir/boot.log"; then',
        '  echo "ec2gpu: the agent\'s own boto3 does not import in $venv" >>"$dir/boot.log"; ok=0',
        "fi",
        'if [ "$ok" = 1 ]; then',
        f'  nohup "$venv/bin/python3" -E -s "$dir/detached.py" --bucket {q(bucket)} --user {q(user)} --run-id {q(run_id)} '
        f'--region {q(region)} --spec-sha256 {q(spec_sha256)} --home "$dir" >>"$dir/detached.log" 2>&1 </dev/null &',
        "else",
        f'  if [ "$ok" = {EXIT_TAMPERED} ]; then',
        '    echo "ec2gpu: the agent in S3 is not the one this run was launched with: none of it ran" >>"$dir/boot.log"',
        "  else",
        '    echo "ec2gpu: the agent could not be fetched: ending the group" >>"$dir/boot.log"',
        "  fi",
        f"  aws autoscaling update-auto-scaling-group --region {q(region)} --auto-scaling-group-name {q(group)} "
        '--min-size 0 --max-size 0 --desired-capacity 0 >>"$dir/boot.log" 2>&1',
        "fi",
    ])


def _fetch_script(bucket: str, user: str, run_id: str, region: str, group: str, hashes: Mapping[str, str]) -> str:
    """The Python that ``boot_script`` runs to fetch the agent (pure): every file of BOOT_FILES read
    into memory and checked against ``hashes`` before any is written (AGENT_FILES into ``sys.argv[1]``,
    the boto3 zip unpacked into the venv's site-packages, ``sys.argv[2]``); a file that differs ends
    the run failed, its group ended, exit EXIT_TAMPERED."""
    want = {name: hashes[name] for name in BOOT_FILES}  # each file's key: A + its name (one prefix, said once)
    rt, limits = agent_runtime.RUNTIME, {agent_runtime.RUNTIME: agent_runtime.MAX_BYTES}
    return (  # double quotes only: the script goes into single ones
        "import datetime, hashlib, io, json, os, sys, zipfile, boto3\n"
        f"B, G, R, RUN = {json.dumps(bucket)}, {json.dumps(group)}, {json.dumps(region)}, {json.dumps(run_id)}\n"
        f"STATUS, A = {json.dumps(runstore.record_key(user, run_id))}, {json.dumps(runstore.agent_prefix(user, run_id))}\n"
        "s3 = boto3.client(\"s3\", region_name=R)\n"
        "def refuse(name):\n"
        "    msg = (\"the agent code in S3 is not the code this run was launched with (\" + name + \" has another \"\n"
        "           \"sha256 than its launch template says): refused, none of it ran\")\n"
        "    print(\"ec2gpu: \" + msg, file=sys.stderr)\n"
        "    try:\n"  # the record as it is (its launches and attempts: the run's cost), with this end
        f"        st = json.loads(s3.get_object(Bucket=B, Key=STATUS)[\"Body\"].read({RECORD_MAX_BYTES}))\n"
        "    except Exception:\n"  # none, too large, not JSON or nested too deep: a new record
        "        st = {}\n"
        "    st = st if isinstance(st, dict) and st.get(\"run_id\") == RUN else {\"run_id\": RUN}\n"
        "    try:\n"
        "        if st.get(\"state\") not in (\"succeeded\", \"failed\", \"cancelled\"):\n"
        "            at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec=\"seconds\")\n"
        f"            st.update(state=\"failed\", message=msg, ended_at=at, version={RECORD_VERSION})\n"
        "            s3.put_object(Bucket=B, Key=STATUS, Body=json.dumps(st).encode(), ContentType=\"application/json\")\n"
        "        boto3.client(\"autoscaling\", region_name=R).update_auto_scaling_group(\n"
        "            AutoScalingGroupName=G, MinSize=0, MaxSize=0, DesiredCapacity=0)\n"
        "    except Exception as exc:\n"  # said; the shell ends the group with the AWS CLI too
        "        print(\"ec2gpu: \" + type(exc).__name__ + \": \" + str(exc)[:300], file=sys.stderr)\n"
        f"    sys.exit({EXIT_TAMPERED})\n"
        "got = {}\n"
        f"for name, sha in {json.dumps(want)}.items():\n"
        f"    most = {json.dumps(limits)}.get(name, {MAX_AGENT_BYTES})\n"
        "    got[name] = s3.get_object(Bucket=B, Key=A + name)[\"Body\"].read(most + 1)\n"
        "    if hashlib.sha256(got[name]).hexdigest() != sha:\n"
        "        refuse(name)\n"
        f"zipfile.ZipFile(io.BytesIO(got.pop({json.dumps(rt)}))).extractall(sys.argv[2])\n"  # once every file is the launched one
        "for name, body in got.items():\n"
        "    with open(os.path.join(sys.argv[1], name), \"wb\") as f:\n"
        "        f.write(body)\n")


def pack(manifest: Manifest, path: Path) -> int:
    """Write the files of ``manifest`` (remote/sync.manifest: regular files, ignore rules applied,
    secrets withheld) to ``path`` as a gzipped tar, each a plain file owned by nobody in
    particular (uid/gid 0, mode 0644 or 0755); return its size in bytes."""
    def plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755 if info.mode & 0o100 else 0o644
        return info
    with tarfile.open(path, "w:gz") as tar:
        for rel in manifest.files:
            tar.add(manifest.root / rel, arcname=rel, recursive=False, filter=plain)
    return path.stat().st_size


def start(aws: Aws, settings: Settings, opts: RunOptions, ui: ReporterLike, backend: Backend) -> run_record.RunRecord:
    """Start ``opts``' task as a detached run (the module docstring's steps); return its run
    record (status "detached", "bucket", "group", "deadline") once the group is made. The checks
    of any run come first (step 1), then the hand-off is an attempt of the one lifecycle
    (runs/execute/attempt.drive) with DetachedJob as its strategy. Raises UsageError before
    anything is made (``check``, the estimate and --budget, a bad option, the permissions
    boundary); CapacityError for the quota; AwsError and botocore's ClientError as AWS answers,
    after removing what was made."""
    opts, itype = pipeline.check_options(opts, ui)
    opts = pipeline.with_task(opts, backend)  # `train mnist --detach`: the built-in task and its data
    job = check(opts)
    account = aws.check_credentials()["Account"]
    user = runstore.user_id(aws.check_credentials())  # refused here, before anything is made
    est = pipeline.check_estimate(aws, settings, opts, backend.name, ui)
    capacity.check_quota(aws.client("service-quotas"), aws.ec2, itype.name, opts.spot, count=opts.nodes, log=ui.note)
    run_id = pipeline.new_run_id()
    secret = secret_env(job)
    if any(m.kind == "s3" for m in job.mounts):  # before anything is made: sources there, buckets readable
        provision.check_s3_access(aws, job)
    a = Handoff(aws, settings, opts, ui, backend, job, itype, est, account, user, run_id, secret)
    return lifecycle.drive(a, DetachedJob())


@dataclass
class Handoff:
    """A detached run's hand-off as the lifecycle sees it: what ``start`` checked before anything
    is made, then what each step learns (the launches and the spec's bytes, checked, in prepare;
    the bucket, the deadline, the spec with it and the hashes of what was put there in upload)."""

    aws: Aws
    settings: Settings
    opts: RunOptions
    ui: ReporterLike
    backend: Backend
    job: TaskJob
    itype: catalog.InstanceType
    est: Estimate
    account: str
    user: str  # the caller's user id (aws/runstore.user_id), whose prefix holds the run
    run_id: str
    secret: dict[str, str]  # secret_env: name -> value, for SSM Parameter Store
    boundary: str | None = None
    limit_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    launches: int = 0
    spec: bytes = b""
    bucket: str = ""
    hashes: dict[str, str] = field(default_factory=dict)
    spec_sha256: str = ""

    @property
    def group(self) -> str:
        return groups.name_of(self.run_id)


class DetachedJob(lifecycle.Lifecycle[Handoff, run_record.RunRecord]):
    """The detached hand-off as a strategy of the one lifecycle (runs/execute/attempt.py says what
    each mode supplies): nothing to open here, and the setup is the agent's on the instance.
    prepare: the boundary and the spec (step 1's last checks); upload: the run store (step 2);
    run: the role, secrets, network and the group (steps 3-4), the agent owns the run from there;
    collect: the run's record (step 5); close: what was made removed, when the group was not."""

    def __init__(self) -> None:
        self.made = False  # something of the run's exists in AWS (its objects in S3 aside)
        self.handed = False  # the group exists: the run is the agent's

    def prepare(self, a: Handoff) -> None:
        """The account's permissions boundary checked, the run store's lifecycle against the run's
        limit (aws/runstore.check_keeps), the account's default key for EBS against Auto Scaling's
        role (aws/iam_detached.check_ebs_key), and the spec.json bytes (spec_body; the agent's own checks
        applied) with a deadline from now, all before anything is made: ``upload`` takes the
        deadline again once the run's files are in S3."""
        opts = a.opts
        a.boundary = check_boundary(a.aws, a.run_id, a.account, a.ui, secrets=bool(a.secret),
                                    extra=a.job.role_policy, several=opts.nodes > 1)
        runstore.check_keeps(a.aws.client("s3"), runstore.bucket_name(a.account, a.aws.region),
                             a.settings.run_store_expire_days, opts.max_runtime_minutes or 0)
        iam_detached.check_ebs_key(a.aws.ec2, a.aws.client("kms"), a.account, a.aws.region, a.ui.note)
        a.launches = launches(opts)
        a.spec = _spec_from_now(a)

    def upload(self, a: Handoff) -> None:
        """The run store made if need be; the workdir, the local file_mounts, the agent and the spec
        under the run's prefix (``_upload``). The deadline (the group's scheduled end, the spec's
        limit_at) is taken once the rest is in S3, just before the spec goes: a slow upload of a
        large workdir no longer comes out of the job's limit, nor leaves the scheduled action's
        StartTime behind the time the group is made (PutScheduledUpdateGroupAction refuses a
        StartTime in the past: https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-scheduled-scaling.html)."""
        with a.ui.phase("upload"):
            a.bucket = runstore.ensure(a.aws.client("s3"), a.account, a.aws.region, a.settings.owner,
                                       a.settings.run_store_expire_days, log=a.ui.note)
            a.hashes, a.spec_sha256 = _upload(a.aws.client("s3"), a.bucket, a.user, a.run_id, a.job,
                                              lambda: _spec_from_now(a))
            a.ui.note(f"run store s3://{a.bucket}/{runstore.prefix(a.user, a.run_id)}: workdir, agent and spec")

    def run(self, a: Handoff) -> None:
        """The run's role, its buckets to make, its secrets, key pair and security group, then its
        record "pending" and the Auto Scaling group whose instance's agent runs the job (the
        "requesting" phase). This controller follows nothing: the agent owns the run from here."""
        aws, settings, opts, job = a.aws, a.settings, a.opts, a.job
        with a.ui.phase("requesting"):
            choices = groups.zones(aws.ec2, opts.instance_types)  # before anything is made
            self.made = True
            profile = _role(aws, settings, a.user, a.run_id, a.bucket, a.account, a.boundary, bool(a.secret),
                            job.role_policy, several=opts.nodes > 1)
            made_at = time.time()  # EC2 sees the new profile (and the security group made next) a while later
            if job.buckets_to_make:
                storage.make_buckets(aws.client("s3"), job.buckets_to_make, aws.region, settings.owner, a.user,
                                     a.ui.note)
            if a.secret:
                stored = parameters.put(aws.client("ssm"), a.run_id, settings.owner, a.user, a.secret)
                a.ui.note(f"{words.count(len(stored), 'secret')} in SSM Parameter Store under {parameters.ROOT}{a.run_id}/ "
                          f"(SecureString; {parameters.READERS})")
            spec = _launch_spec(a, profile)
            # before the group: its first instance's agent writes the next record, never under this one
            runstore_records.put_status(aws.client("s3"), a.bucket, a.user, a.run_id,
                                        {"run_id": a.run_id, "state": "pending", "attempt": 0, "updated_at": _now()})
            _group(a, spec, choices, made_at)
            self.handed = True

    def collect(self, a: Handoff) -> run_record.RunRecord:
        """The run's record (status "detached", its bucket, group and deadline), in the ledger."""
        opts, job, est = a.opts, a.job, a.est
        a.ui.note(f"Auto Scaling group {a.group}: {opts.nodes} {'spot' if opts.spot else 'on-demand'} instance(s) of "
                  f"{', '.join(opts.instance_types)}; it goes to 0 at {a.limit_at:%Y-%m-%d %H:%M} UTC at the latest")
        out = Path(opts.out or Path("runs") / a.run_id).resolve()
        mnist, (model, epochs) = job.builtin == "mnist", pipeline.preset(opts)
        record = run_record.new(a.run_id, opts.command, a.backend.name, out, status="detached", task=job.name,
                                task_key=job.history_key,
                                model=model if mnist else None, epochs=epochs if mnist else None,
                                instance_type=a.itype.name, gpu=a.itype.gpu,
                                market="spot" if opts.spot else "on-demand", region=a.aws.region,
                                estimated_cost_usd=None if est.upper_bound else est.cost_usd, estimate=est.as_dict())
        record.update({"bucket": a.bucket, "group": a.group, "deadline": a.limit_at.isoformat()})
        pipeline._ledger(a.settings, record, a.ui)
        return record

    def close(self, a: Handoff) -> None:
        """What the run made in AWS removed (aws/sweep.delete_run, the group first) when the
        hand-off stopped before its group was made (an error, Ctrl-C); its objects in S3 stay for
        the bucket's lifecycle rule."""
        if self.made and not self.handed:
            a.ui.note(f"removing what run {a.run_id} made")
            sweep.delete_run(a.aws.ec2, a.run_id, a.settings.keys_dir, log=a.ui.note, iam=a.aws.client("iam"),
                             autoscaling=a.aws.client("autoscaling"), ssm=a.aws.client("ssm"), user=a.user)


def _spec_from_now(a: Handoff) -> bytes:
    """spec.json's bytes (spec_body of spec_document) with the run's deadline taken now: its limit
    from this moment (``a.limit_at``, which the group's scheduled action and the run's record get
    too; ``a.spec``). Raises UsageError for a spec the agent would refuse."""
    a.limit_at = datetime.now(timezone.utc) + timedelta(minutes=a.opts.max_runtime_minutes or 0)
    a.spec = spec_body(spec_document(a.job, a.opts, a.user, a.run_id, a.group, a.limit_at, a.launches,
                                     a.settings.ssh_user))
    return a.spec


def _group(a: Handoff, spec: instances.LaunchSpec, choices: list[tuple[str, str, list[str]]], made_at: float) -> None:
    """The run's Auto Scaling group (aws/groups.create), AZRebalance suspended. One node may launch in
    any zone of ``choices`` (AWS picks); several share one, the first where the group finds capacity
    (aws/groups.find_zone), in the run's cluster placement group when it has one: NCCL across zones
    is slow, billed per GB and without EFA. ``made_at`` (time.time()): when the run's instance
    profile was made; the group waits while AWS does not see it yet (aws/consistency.when_visible)."""
    autoscaling = a.aws.client("autoscaling")
    if a.opts.nodes == 1:
        groups.create(a.aws.ec2, autoscaling, spec, a.opts.instance_types, [c[1] for c in choices], 1, a.limit_at,
                      made_at=made_at, log=a.ui.note)
    else:
        _, subnet, types = choices[0]
        groups.create(a.aws.ec2, autoscaling, spec, types, [subnet], a.opts.nodes, a.limit_at, made_at=made_at,
                      log=a.ui.note)
    autoscaling.suspend_processes(**groups.suspend_request(a.run_id))
    if a.opts.nodes > 1:
        zone = groups.find_zone(autoscaling, spec, choices, log=a.ui.note)
        a.ui.note(f"the {a.opts.nodes} nodes launch in {zone}"
                  + (f", placement group {spec.placement_group}" if spec.placement_group else ""))


def _launch_spec(a: Handoff, profile: str) -> instances.LaunchSpec:
    """The group's launch template's spec (inside the "requesting" phase): the run's key pair and
    security group made (SSH from ``opts.ssh_cidr``, else this machine's /32; the nodes reach
    each other when there are several, in a cluster placement group where the type supports one:
    aws/placement.create), its image, its instance profile ``profile`` and the boot script that
    starts the agent (``boot_script``)."""
    aws, settings, opts = a.aws, a.settings, a.opts
    name = opts.name or f"ec2gpu-{a.run_id}"
    cidr = network.ssh_cidr(opts.ssh_cidr, aws.checkip_url)
    key_name, _ = network.create_key_pair(aws.ec2, a.run_id, settings.owner, settings.keys_dir)
    sg = network.create_security_group(aws.ec2, a.run_id, settings.owner, cidr)
    group = None
    if opts.nodes > 1:  # the nodes reach each other (torchrun, NCCL), and nothing else does
        network.allow_within_group(aws.ec2, sg)
        group, how = placement.create(aws.ec2, a.run_id, settings.owner, name, opts.instance_types[0])
        a.ui.note(how)
    ami = provision.choose_image(aws, opts)
    return instances.LaunchSpec(
        run_id=a.run_id, owner=settings.owner, name=name,
        instance_type=opts.instance_types[0], image_id=ami["ImageId"], root_device_name=ami["RootDeviceName"],
        key_name=key_name, security_group_id=sg, spot=opts.spot, root_volume_gib=settings.root_volume_gib,
        max_runtime_minutes=None,  # a shutdown would only be replaced: the group's deadline ends it
        max_price=opts.max_price if opts.spot else None, instance_profile=profile, placement_group=group,
        boot=boot_script(a.bucket, a.user, a.run_id, aws.region, a.group, a.hashes, a.spec_sha256))


def _upload(s3: Any, bucket: str, user: str, run_id: str, job: TaskJob,
            spec: Callable[[], bytes]) -> tuple[dict[str, str], str]:
    """The run's workdir, local file_mounts, agent and spec under its prefix; spec.json's bytes are
    ``spec()``'s (spec_body), asked for once the rest is up, and put last (an agent that finds it
    finds the rest). Returns ({name: sha256} of the agent files' bytes as uploaded, the sha256 of
    the spec's), for ``boot_script``: the hashes of exactly the bytes put, each file read once
    (agent_files)."""
    with tempfile.TemporaryDirectory(prefix="ec2gpu-detach-") as tmp:
        archive = Path(tmp) / "workdir.tar.gz"
        if job.manifest is not None:
            pack(job.manifest, archive)
        else:
            with tarfile.open(archive, "w:gz"):
                pass
        runstore_objects.put_file(s3, bucket, runstore.workdir_key(user, run_id), archive)
    for i, m in enumerate(job.mounts):  # local file_mounts sources, where mounts_document says
        if m.kind != "local":
            continue
        key = mount_key(user, run_id, i, m.is_file)
        if m.is_file:
            runstore_objects.put_file(s3, bucket, key, Path(m.source))
            continue
        with tempfile.TemporaryDirectory(prefix="ec2gpu-detach-") as tmp:
            archive = Path(tmp) / "mount.tar.gz"
            pack(job.mount_manifests[m.target], archive)
            runstore_objects.put_file(s3, bucket, key, archive)
    hashes = {}
    for name, data in agent_files().items():
        hashes[name] = hashlib.sha256(data).hexdigest()
        runstore_objects.put_bytes(s3, bucket, runstore.agent_prefix(user, run_id) + name, data)
    body = spec()
    runstore_objects.put_bytes(s3, bucket, runstore.spec_key(user, run_id), body, "application/json")
    return hashes, hashlib.sha256(body).hexdigest()


def check_boundary(aws: Aws, run_id: str, account: str, ui: ReporterLike, secrets: bool = False,
                   extra: dict[str, Any] | None = None, several: bool = False) -> str | None:
    """The account's permissions boundary for run roles (aws/iam_boundary.boundary_arn; None without
    one), checked before anything is made: a boundary from an older ec2gpu that lacks an action the
    run's role needs (aws/iam_boundary.boundary_gaps; reading its own secrets too with ``secrets``,
    and the actions of ``extra``, a file_mounts policy: aws/iam.s3_policy) would
    leave the agent unable to save its outputs, end its own group or start the job, so the group
    would run (and bill) to its deadline. So is a boundary that lets every run role of the account
    reach every user's runs (aws/iam_boundary.reaches_other_runs: ``*`` or ``ec2gpu-*`` where
    YOUR-FILE-MOUNTS-BUCKET stands), which no IAM statement can take back. Raises UsageError then,
    with the command that updates it; a boundary these credentials may not read is said, not refused."""
    client = aws.client("iam")
    boundary = iam_boundary.boundary_arn(client, account, aws.region)
    if boundary is None:
        return None
    user = runstore.user_id(aws.check_credentials())
    policy = role_policy("ec2gpu-bucket", user, run_id, aws.region, account, secrets, extra, several)
    document = iam_boundary.boundary_document(client, boundary)
    update = (f"update it: aws iam create-policy-version --policy-arn {boundary} --policy-document "
              "file://docs/iam-instance-boundary.json --set-as-default (your file_mounts buckets in place "
              "of YOUR-FILE-MOUNTS-BUCKET")
    gaps = None if document is None else iam_boundary.gaps_in(document, policy)
    wide = iam_boundary.reaches_other_runs(document, user, run_id, account)
    if gaps is None:
        ui.note(f"warning: the permissions boundary {boundary} could not be read (iam:GetPolicyVersion); "
                "a detached run needs the one in docs/iam-instance-boundary.json")
    elif gaps:
        raise UsageError(f"the account's permissions boundary {iam_boundary.BOUNDARY_NAME} does not allow "
                         f"{', '.join(gaps)}, which a detached run's instance role needs (it predates this ec2gpu)",
                         update + ")")
    elif wide:
        raise UsageError(f"the account's permissions boundary {iam_boundary.BOUNDARY_NAME} lets every run role of the account "
                         f"read and rewrite every user's detached runs ({', '.join(wide)} reaches ec2gpu-*/runs/*): "
                         "its file_mounts buckets are `*` or ec2gpu-*", update + ", never * or ec2gpu-*)")
    return boundary


def role_policy(bucket: str, user: str, run_id: str, region: str, account: str, secrets: bool,
                mounts_policy: dict[str, Any] | None, several: bool = False) -> dict[str, Any]:
    """The run role's inline policy (pure): aws/iam_detached.detached_policy (its own secrets too with
    ``secrets``), with ``mounts_policy``'s statements (its file_mounts: aws/iam.s3_policy) when it
    has one. Raises UsageError as detached_policy and combined do."""
    policy = iam_detached.detached_policy(bucket, run_id, groups.name_of(run_id), region, account, secrets, several, user=user)
    return policy if mounts_policy is None else iam.combined(policy, mounts_policy)


def _role(aws: Aws, settings: Settings, user: str, run_id: str, bucket: str, account: str,
          boundary: str | None, secrets: bool, mounts_policy: dict[str, Any] | None, several: bool = False) -> str:
    """The run's own instance role and profile (aws/iam_detached.detached_policy, with its own secrets'
    parameters when ``secrets``, and ``mounts_policy``'s statements: its file_mounts' prefixes,
    aws/iam.s3_policy) under ``boundary``; its name."""
    client = aws.client("iam")
    policy = role_policy(bucket, user, run_id, aws.region, account, secrets, mounts_policy, several)
    return iam.create_run_role(client, run_id, settings.owner, policy, user=user, region=aws.region,
                               boundary=boundary)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()
