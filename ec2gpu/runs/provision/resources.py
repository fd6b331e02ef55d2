"""What a run creates on AWS and how it goes: the key pair, security group, placement group and
instances of a run (``provision``), their removal on every exit path (``teardown``, best-effort per
resource), an interrupted attempt's instances ended, and each instance billed from its own times.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Mapping, Sequence, cast

from ... import words
from ...aws import baked, capacity, iam, iam_boundary, images, instances, network, placement, runstore, storage, sweep
from ...aws.session import Aws, ClientError, error_code
from ...errors import UsageError
from ...settings import Settings
from ...tasks import mounts
from ..plan import costs
from ..options import LaunchOptions, PoolOptions, RunOptions
from ..job import Provisioned as Provisioned  # re-exported: resources.Provisioned (its home is runs/job.py)

if TYPE_CHECKING:  # annotations only
    from ...aws.instances import Instance
    from ..job import BakePlan, TaskJob
    from ..execute.reporter import ReporterLike


def provision(aws: Aws, settings: Settings, opts: LaunchOptions, run_id: str, ui: ReporterLike,
              prov: Provisioned, avoid_zones: Sequence[str] = ()) -> list[Instance]:
    """Create the key pair and security group (once per run) and launch an instance, filling
    ``prov`` as it goes; wait until it runs and return its description(s).

    ``avoid_zones`` are tried last (where an earlier attempt was interrupted).
    """
    ec2 = aws.ec2
    name = opts.name or f"ec2gpu-{run_id}"
    if prov.key_name is None:
        cidr = network.ssh_cidr(opts.ssh_cidr, aws.checkip_url)
        prov.ami = choose_image(aws, opts)
        ui.note(f"AMI {prov.ami['ImageId']} ({prov.ami['Name']}): {prov.ami['why']}, via {prov.ami['source']}; "
                f"SSH allowed from {cidr}")
    ami = prov.ami
    with ui.phase("requesting"):
        if prov.key_name is None:
            _instance_role(aws, settings, opts, run_id, prov, ui)  # first: the one step IAM may refuse
            prov.key_name, prov.key_path = network.create_key_pair(ec2, run_id, settings.owner, settings.keys_dir)
            prov.security_group_id = network.create_security_group(ec2, run_id, settings.owner, cidr)
            if opts.forms_cluster:
                network.allow_within_group(ec2, prov.security_group_id)
                how = "no placement group (independent jobs)"
                if opts.needs_placement_group:
                    prov.placement_group, how = placement.create(ec2, run_id, settings.owner, name,
                                                                 opts.instance_types[0])
                ui.note(f"{words.count(opts.nodes, 'node')}: one security group that also admits its own members; {how}")
        # the AMI and the security group are chosen and made with the key pair, at the first attempt
        assert ami is not None and prov.security_group_id is not None
        spec = instances.LaunchSpec(
            run_id=run_id, owner=settings.owner, name=name, instance_type=opts.instance_types[0],
            image_id=ami["ImageId"], root_device_name=ami["RootDeviceName"], key_name=prov.key_name,
            security_group_id=prov.security_group_id, spot=opts.spot,
            root_volume_gib=settings.root_volume_gib, max_runtime_minutes=opts.max_runtime_minutes,
            max_price=opts.max_price if opts.spot else None, count=opts.nodes,
            min_count=1 if _pool(opts) else None,  # a pool starts with what EC2 has, and grows (pool/grow.py)
            # a cluster placement group lives in one zone: a replacement elsewhere goes without it
            placement_group=None if avoid_zones else prov.placement_group, cluster=name if opts.forms_cluster else None,
            idle=opts.idle, instance_profile=prov.instance_profile, labels=_labels(opts))
        new, attempts = capacity.launch_with_fallback(
            aws.client("ec2", fail_fast=True), spec, opts.instance_types, opts.spot_fallback == "on-demand",
            log=ui.note, avoid_zones=tuple(avoid_zones), profile_created_at=prov.profile_created_at)
        if opts.nodes > 1:
            new = instances.tag_nodes(ec2, new, name)
        prov.instances += new
        ids = [i.id for i in new]
        got = attempts[-1]
        ui.note(f"launched {', '.join(ids)} ({got.instance_type}, {got.market}, {got.zone or 'any zone'}"
                f"{', after ' + words.count(len(attempts) - 1, 'refusal') if len(attempts) > 1 else ''})"
                + (f": {len(ids)} of the {opts.nodes} asked for (EC2 had no more); the pool grows as capacity comes"
                   if len(ids) < opts.nodes else ""))
    with ui.phase("waiting for running"):
        running = _running(ec2, ids, _pool(opts), ui)
        prov.instances = [running.get(i.id, i) for i in prov.instances]
    return [running[i] for i in ids if i in running]


def _running(ec2: Any, ids: list[str], pool: bool, ui: ReporterLike) -> dict[str, instances.Instance]:
    """{id: instance} of ``ids`` once running (instances.wait_running). An array's pool goes on with
    those of its instances that did not end before running (a spot instance reclaimed at launch:
    EC2 billed nothing for it; the pool grows as capacity comes, pool/grow.py); any other run
    raises instances.EndedBeforeRunning, and its attempt is launched again (pipeline._run_attempts)."""
    try:
        return {i.id: i for i in instances.wait_running(ec2, ids)}
    except instances.EndedBeforeRunning as exc:
        left = [i for i in ids if i not in exc.ended]
        if not pool or not left:
            raise
        ui.note(f"{exc.message}: the pool goes on with {len(left)} of {len(ids)} instances and grows as capacity comes")
        return _running(ec2, left, pool, ui)


def _labels(opts: LaunchOptions) -> tuple[tuple[str, str], ...]:
    """The task's labels (SkyPilot's resources.labels), as (key, value) pairs for the instance tags."""
    job = _job(opts)
    return tuple(sorted(job.task.resources.labels.items())) if job is not None else ()


def _pool(opts: LaunchOptions) -> bool:
    """Whether ``opts`` runs an array or a sweep over a pool (PoolOptions)."""
    return isinstance(opts, PoolOptions)


def _job(opts: LaunchOptions) -> TaskJob | None:
    """The task ``opts`` runs (RunOptions), None for instances alone (`ec2gpu launch`, notebook)."""
    return opts.task if isinstance(opts, RunOptions) else None


def _bake(opts: LaunchOptions) -> BakePlan | None:
    """The image ``opts`` makes (BakeOptions), else None."""
    return opts.bake if isinstance(opts, RunOptions) else None


def check_s3_access(aws: Aws, job: TaskJob) -> None:
    """Before anything is created, for a task whose file_mounts read or write S3 (``job``: an
    engine.TaskJob): check its buckets and sources (aws/storage.py: a ``name:`` bucket that exists
    is the task's own only when ec2gpu made it for the caller's AWS user id), build its run role's policy
    (aws/iam.s3_policy) and find the account's permissions boundary; fill ``job.bucket_regions``,
    ``buckets_to_make``, ``s3_files``, ``role_policy`` and ``role_boundary`` for ``provision``.

    Raises UsageError for a source that does not exist or may not be read, a write-back the user
    did not allow (tasks/mounts.check_write, again here for a job not loaded from a file), for a
    policy IAM would refuse (one of ec2gpu's own buckets, over its 10,240 characters) and for a
    caller's user id no tag can hold (aws/runstore.user_id); AwsError for other AWS errors.
    """
    user = runstore.user_id(aws.check_credentials())  # the role is tagged with it (iam.run_tags), the buckets too
    s3 = [m for m in job.mounts if m.kind == "s3"]
    own = mounts.own_buckets(job.mounts)
    for m in s3:
        try:
            mounts.refuse_own(cast(str, m.bucket))
            mounts.check_write(m, own, frozenset(cast(str, w.bucket) for w in s3 if w.write_allowed))
        except UsageError as exc:
            raise UsageError(f"file_mounts.{m.target}: {exc.message}", exc.hint) from None
    # an S3 entry always names its bucket (tasks/mounts.Mount: None is for local sources)
    reads = [(cast(str, m.bucket), m.prefix) for m in s3]
    writes = [(cast(str, m.bucket), m.prefix) for m in s3 if m.write_back]
    job.role_policy = _s3_policy(reads, writes)
    client = aws.client("s3")
    job.bucket_regions, job.buckets_to_make = storage.check_buckets(client, job.mounts, aws.region, user)
    keys = storage.bucket_keys(client, [b for b in job.bucket_regions if b not in job.buckets_to_make])
    if keys:  # SSE-KMS buckets: the role uses their keys through S3 (issue 51 item 6)
        job.role_policy = _s3_policy(reads, writes, keys)
    job.s3_files = storage.single_objects(client, job.mounts)
    job.role_boundary = iam_boundary.boundary_arn(aws.client("iam"), aws.check_credentials()["Account"],
                                                    aws.region)


def _s3_policy(reads: list[tuple[str, str]], writes: list[tuple[str, str]],
               keys: dict[str, str] | None = None) -> dict[str, Any]:
    """aws/iam.s3_policy, its ValueError as the UsageError of a task's file_mounts."""
    try:
        return iam.s3_policy(reads, writes, keys)
    except ValueError as exc:
        raise UsageError(f"file_mounts: {exc}", "name fewer S3 prefixes, or one prefix that holds them") from None


def _instance_role(aws: Aws, settings: Settings, opts: LaunchOptions, run_id: str, prov: Provisioned, ui: ReporterLike) -> None:
    """Give the run its own instance role when its task copies from or writes to S3 (file_mounts):
    read access to exactly those prefixes, write access to the MOUNT-mode ones (``check_s3_access``
    built the policy); then make the output buckets that do not exist yet. Raises UsageError when
    IAM refuses the role for want of the permissions boundary (nothing made), botocore's
    ClientError otherwise."""
    job = _job(opts)
    s3 = [m for m in getattr(job, "mounts", []) if m.kind == "s3"]
    if not s3 or _bake(opts) is not None or getattr(job, "role_policy", None) is None:  # an image bake runs the setup only
        return
    assert job is not None and job.role_policy is not None  # returned above otherwise (getattr of None)
    client, boundary = aws.client("iam"), job.role_boundary
    user, policy = runstore.user_id(aws.check_credentials()), job.role_policy
    if settings.handover_wait_seconds > 0 or getattr(opts, "detach", False):  # its agent's fallback (runs/recover/handover.py)
        with contextlib.suppress(ValueError, UsageError):  # over IAM's size, or no run store's name: the links alone
            policy = iam.combined(policy, iam.handover_policy(
                runstore.bucket_name(aws.check_credentials()["Account"], aws.region), user, run_id))
    prov.instance_profile = iam.role_name(run_id)  # set first: teardown removes whatever part of it was made
    try:
        iam.create_run_role(client, run_id, settings.owner, policy, user=user, region=aws.region, boundary=boundary)
    except ClientError as exc:
        if error_code(exc) in iam.REFUSED and exc.operation_name == "CreateRole":
            prov.instance_profile = None  # refused at its first call: nothing was made
            if boundary is None:
                raise UsageError("file_mounts from S3 need an instance role, and these credentials may create one "
                                 f"only under the permissions boundary {iam_boundary.BOUNDARY_NAME}, which this account does "
                                 f"not have", f"an administrator creates it once: {iam_boundary.BOUNDARY_COMMAND}") from None
        raise
    prov.profile_created_at = time.time()
    under = f" (under the boundary {iam_boundary.BOUNDARY_NAME})" if boundary else ""
    ui.note(f"instance role {prov.instance_profile}{under}"
            ": reads " + ", ".join(sorted({m.url for m in s3}))
            + ("; writes " + ", ".join(sorted({m.url for m in s3 if m.write_back})) if any(m.write_back for m in s3)
               else "") + ("; writes its own hand-over objects in the run store" if policy is not job.role_policy else "")
            + " (nothing else; removed with the run)")
    storage.make_buckets(aws.client("s3"), job.buckets_to_make, aws.region, settings.owner,
                         runstore.user_id(aws.check_credentials()), ui.note)


def choose_image(aws: Aws, opts: LaunchOptions) -> dict[str, Any]:
    """The image to launch (as images.resolve_ami returns it): a bake's base image; else ``--ami``;
    else the newest complete image baked for this task's setup in the region (found by its
    ec2gpu:setup-hash tag) unless ``opts.baked`` is off; else the Deep Learning AMI."""
    ssm, ec2 = aws.client("ssm"), aws.ec2
    plan, job = _bake(opts), _job(opts)
    if plan is not None:
        return images.resolve_base(ssm, ec2, plan.base, opts.ami)
    if not opts.ami and opts.baked and job is not None:
        found = baked.newest_for(ec2, baked.setup_key(job.builtin, job.task.setup))
        if found:
            tg = {t["Key"]: t["Value"] for t in found.get("Tags", [])}
            return {"ImageId": found["ImageId"], "Name": found.get("Name", ""),
                    "RootDeviceName": found.get("RootDeviceName", "/dev/sda1"), "baked": True,
                    "source": f"tag {baked.SETUP_HASH}={tg.get(baked.SETUP_HASH, '')[:12]}...",
                    "why": f"image baked for this task's setup on {found.get('CreationDate', '?')[:10]} "
                           f"(torch {tg.get(baked.VERSIONS['torch_version'], '?')}; --no-baked boots the DLAMI)"}
    return images.resolve_ami(ssm, ec2, opts.ami)


def teardown(aws: Aws, settings: Settings, prov: Provisioned, ui: ReporterLike) -> dict[str, list[str]]:
    """Remove what the run made, kind by kind through the registry of aws/sweep.py (``KINDS``):
    terminate its instances (waiting), then delete its security group, key pair, placement group,
    a bake's incomplete image and snapshots, and its instance role; each resource tried on its own,
    best-effort. Never raises (an exception here would hide the error that ended the run): what
    fails is reported with the `ec2gpu cleanup` command and listed under "failed". A security group
    is left while its instances may still exist (EC2 refuses to delete a group in use), and the
    key pair with it (it dates the run for the next command's sweep). A second Ctrl-C is answered
    with how to finish by hand.

    Returns {"instances", "security_groups", "key_pairs", "placement_groups", "images", "snapshots",
    "instance_roles": ids removed, "failed": ["ID (why)", ...]}.
    """
    def on_sigint(*_: object) -> None:
        ui.note("cleanup is under way; if you stop it, finish by hand with `ec2gpu cleanup`")
    previous = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    kinds = ("instances", "security_groups", "key_pairs", "placement_groups", "images", "snapshots", "instance_roles")
    removed: dict[str, list[str]] = {k: [] for k in kinds}
    removed["failed"] = []
    try:
        with ui.phase("terminating"):
            live = [i for i in prov.instance_ids if i not in prov.ended]
            found: dict[str, Sequence[str | None]] = {
                "instances": live, "security_groups": [prov.security_group_id], "key_pairs": [prov.key_name],
                "placement_groups": [prov.placement_group], "instance_roles": [prov.instance_profile]}
            rows = {k: [{"id": x, "run_id": prov.run_id} for x in ids if x] for k, ids in found.items()}
            iam_client = aws.client("iam") if prov.instance_profile else None
            try:
                if prov.bake:  # an image not yet complete, and snapshots no image holds: never kept
                    for kind in ("images", "snapshots"):
                        rows[kind] = sweep.KIND[kind].find(sweep.Clients(aws.ec2), prov.run_id, ui.note)
            except Exception as exc:  # noqa: BLE001 - listed, and the rest (the role too) is still removed
                removed["failed"].append(f"images of the bake ({type(exc).__name__}: {exc})"[:300])
            def failed(label: str, ids: list[str], why: str) -> None:
                ui.note(f"could not remove the {label} {', '.join(ids)} ({why}); finish with `ec2gpu cleanup "
                        f"--region {aws.region}` (it finds everything by the ec2gpu:run tag {prov.run_id})")
            # a bake says what it takes back (the image and its snapshots), as `image rm` does
            done = sweep.delete_everything(aws.ec2, rows, settings.keys_dir, iam=iam_client, on_failure=failed,
                                           log=ui.note if prov.bake else (lambda line: None))
            for k in kinds:
                removed[k] = done.get(k, [])
            removed["failed"] += done["left"]
            prov.ended.update(i for i in live if i in removed["instances"])
            removed["instances"] = [i for i in prov.instance_ids if i in prov.ended]
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    done_words = "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in removed.items() if v and k != "failed")
    if done_words:
        ui.note("removed: " + done_words)
    left = leftovers(prov, removed)
    if left:
        ui.note(f"may still exist (and bill, for instances): {left}; `ec2gpu cleanup --region {aws.region}` removes "
                f"them once AWS answers (they carry the ec2gpu:run tag {prov.run_id})")
    return removed


def leftovers(prov: Provisioned, removed: Mapping[str, list[str]]) -> str:
    """What the run created that teardown did not remove, by kind and id (pure): '' when nothing."""
    kinds = [("instances", [i for i in prov.instance_ids if i not in removed["instances"]]),
             ("security group", [prov.security_group_id] if prov.security_group_id and not removed["security_groups"]
              else []),
             ("key pair", [prov.key_name] if prov.key_name and not removed["key_pairs"] else []),
             ("placement group", [prov.placement_group] if prov.placement_group and not removed["placement_groups"]
              else []),
             ("instance role", [prov.instance_profile] if prov.instance_profile and not removed.get("instance_roles")
              else [])]
    return "; ".join(f"{kind} {', '.join(ids)}" for kind, ids in kinds if ids)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def end_instances(aws: Aws, prov: Provisioned, instance_ids: list[str], ui: ReporterLike) -> None:
    """Make sure an interrupted attempt's instances are terminated (EC2 may have done it already)."""
    with ui.phase("terminating"):
        states = {i.id: i.state for i in instances.describe_instances(aws.ec2, instance_ids)}
        live = [i for i in instance_ids if states.get(i) not in ("shutting-down", "terminated")]
        if live:  # those EC2 is terminating already keep EC2's own reason and time
            instances.terminate(aws.ec2, live, wait=False)
        instances.wait_terminated(aws.ec2, instance_ids)
        prov.ended.update(instance_ids)


def bill(aws: Aws, settings: Settings, attempts: list[dict[str, Any]], prov: Provisioned, ui: ReporterLike) -> None:
    """Add billed seconds and cost to each attempt row, from its (terminated) instance's own launch
    and termination times (one DescribeInstances for all of them)."""
    if not attempts:
        return
    ended = datetime.now(timezone.utc)
    ids = [a["instance_id"] for a in attempts]
    try:
        described = {i.id: i for i in instances.describe_instances(aws.ec2, ids)}
    except Exception as exc:  # the bill is still computable from what launch returned
        ui.note(f"could not read the termination times of {', '.join(ids)} ({exc}); using this machine's clock")
        described = {i.id: i for i in prov.instances}
    for att in attempts:
        start = datetime.fromisoformat(att["billing_started_at"]) if att.get("billing_started_at") else None
        att.update(costs.actual_cost(aws, settings.home, described[att["instance_id"]], ended, start,
                                     settings.root_volume_gib))
