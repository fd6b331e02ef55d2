"""`ec2gpu image bake|ls|rm`: machine images that already hold a task's setup, so its runs start sooner.

A bake is a run (provision/pipeline.py: estimate, provision, teardown in ``finally``, bill, ledger with task
"bake") whose attempt (runs/execute/attempt.py's lifecycle, with ImageBake as its strategy), instead of a
job, makes an image of its builder instance:

  SSH -> [bare Ubuntu: ami/install-cuda.sh, an EC2 reboot when the driver needs one, again]
  -> machine setup (ami/setup-gpu.sh) -> workdir up -> the task's setup -> pre-fetch (MNIST for the
  built-in task) -> ami/clean-for-image.sh -> CreateImage (image and snapshots tagged, ec2gpu:bake
  incomplete) -> the image_available waiter -> tagged complete -> the builder terminated.

Whatever stops it (an error, Ctrl-C) before the image is complete, teardown deregisters the image
and deletes its snapshots (provision.teardown, aws/baked.remove_incomplete). A run whose task has
the same bake key launches from the newest complete image (provision.choose_image): setup-gpu.sh
then trusts the baked setup.json ($HOME/.ec2gpu/baked-setup.json) and the task's setup finds its
marker ($HOME/.ec2gpu/setup-done/<hash>) and is skipped.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, cast

import shlex
import statistics
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ... import words
from ...aws import baked, catalog, images, instances, tags, types
from ...errors import RemoteError, UsageError, WaitTimeout
from ...remote import files, jobs, ssh
from ..execute import attempt as lifecycle
from ..job import BakePlan as BakePlan  # re-exported: bake.BakePlan (its home is runs/job.py)
from ..settle import ledger
from ..plan.costs import PHASE_GROUPS
from ..execute.engine import TAIL_LINES, _LineWriter, workdir_of
from ..plan.limits import schedule_shutdown_command

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...aws.session import Aws
    from ...backend import Backend
    from ...settings import Settings
    from ..job import TaskJob
    from ..execute.nodes import Node
    from ..execute.reporter import ReporterLike
    from ..recover.recovery import DirCheckpoints
    from ..options import BakeOptions
    from ..job import Provisioned

AMI_DIR = Path(__file__).resolve().parents[2] / "ami"
#: exit status of ami/install-cuda.sh: the driver is installed and loads after a reboot
REBOOT_NEEDED = 100
#: Minutes a bake is assumed to take before the ledger has one (an estimate's basis, said with it):
#: not measured on AWS (no account here). On the DLAMI, setup is checks and the task's own setup;
#: on bare Ubuntu the driver (apt, DKMS build) and torch's wheels come first. CreateImage of a
#: 100 GiB gp3 root takes several minutes (it snapshots the volume).
ASSUMED_MINUTES = {"dlami": 15.0, "ubuntu-24.04": 30.0}
#: Minutes after launch when a builder ends itself (`image bake --max-runtime`; user data's
#: `shutdown -h +M`, armed again after each driver reboot): its end should this command die. The
#: default is `run`'s and `launch`'s standing one; the least is 10: boot, setup and CreateImage's
#: snapshot take minutes, and a bake whose estimate is longer is refused before anything is made.
MAX_RUNTIME_MINUTES, MIN_MAX_RUNTIME_MINUTES = 120, 10


def builder_max_runtime(minutes: int | None) -> int:
    """The builder's --max-runtime in minutes (pure): ``minutes``, or MAX_RUNTIME_MINUTES for None.
    Raises UsageError below MIN_MAX_RUNTIME_MINUTES."""
    if minutes is None:
        return MAX_RUNTIME_MINUTES
    if minutes < MIN_MAX_RUNTIME_MINUTES:
        raise UsageError(f"--max-runtime {minutes}: a builder needs at least {MIN_MAX_RUNTIME_MINUTES} minutes "
                         "(boot, setup and the image's snapshot)", f"e.g. --max-runtime {MAX_RUNTIME_MINUTES}")
    return int(minutes)


def bake_key(job: TaskJob) -> str:
    """What a baked image is matched on (pure): sha256 of the built-in task's name (its pre-fetched
    data) and the task's setup text. Tag ec2gpu:setup-hash."""
    return baked.setup_key(job.builtin, job.task.setup)


def plan(job: TaskJob, base: str, name: str | None, home: Path, backend: str, instance_type: str, sandbox: bool,
         data_dir: str | None = None) -> BakePlan:
    """The bake of ``job`` from ``base``; its name defaults to <task>-<UTC time> (AMI names are unique
    per account and region), made a name CreateImage accepts (aws/baked.ami_name).
    The expected minutes: the mean of past completed bakes' own phases on ``instance_type``
    (ledger, ``bake_seconds``), else ASSUMED_MINUTES. Raises UsageError for an unknown base or a bad name."""
    if base not in images.BASES:
        raise UsageError(f"--from {base!r} is not known", f"use one of: {', '.join(images.BASES)}")
    key = bake_key(job)
    name = tags.check_name(name) if name else baked.ami_name(job.name, datetime.now(timezone.utc))
    past = [r for r in ledger.runs(home, backend=backend, limit=200, tolerant=True)
            if r.get("task") == "bake" and r.get("instance_type") == instance_type and r["status"] == "completed"]
    if past:  # the bake's own phases (driver, cleaning, imaging, waiting for image): the estimate adds
        # boot, setup and teardown from the ledger itself (costs.PHASE_GROUPS)
        minutes = statistics.mean(bake_seconds(r.get("phases") or {}) for r in past) / 60
        source = f"mean of {words.count(len(past), 'past bake')} on {instance_type} (ledger)"
    else:
        minutes, source = ASSUMED_MINUTES[base], f"assumed {ASSUMED_MINUTES[base]:g} min for a bake from {base}"
    return BakePlan(name, base, key, minutes, source, data_dir=data_dir, image_delay_s=1.0 if sandbox else 15.0)


def bake_seconds(phases: dict[str, float]) -> float:
    """A bake's seconds besides the boot, setup and teardown an estimate counts anyway (pure)."""
    counted = {name for group in PHASE_GROUPS.values() for name in group}
    return sum(secs for name, secs in phases.items() if name not in counted)


def bake_attempt(aws: Aws, settings: Settings, opts: BakeOptions, run_id: str, ui: ReporterLike, prov: Provisioned,
                 instances_: list[Instance], local_out: Path, backend: Backend, n: int,
                 checkpoints: DirCheckpoints) -> dict[str, Any]:
    """The attempt of a bake on its builder (pipeline._run_attempts calls it for ``opts.bake``);
    returns the bake's summary: the image's id, name, key, base, versions and snapshots. Raises
    RemoteError when the driver install, the setup or the cleaning fails, AwsError or WaitTimeout
    when the image does not become available: teardown then removes the half-made image."""
    job = cast("TaskJob", opts.task)  # a bake (_run_attempts); train set the task
    a = lifecycle.new(aws, settings, run_id, ui, prov, backend, job, instances_[:1], local_out, n)
    return lifecycle.drive(a, ImageBake(opts))


class ImageBake(lifecycle.Strategy[dict[str, Any]]):
    """The bake as an attempt's strategy (runs/execute/attempt.Strategy): the NVIDIA driver first
    on bare Ubuntu, the workdir without file_mounts, the task's setup and the pre-fetch kept in
    the image, then an image of the builder instead of a job."""

    places_mounts = False  # an image holds the task's setup, not its data

    def __init__(self, opts: BakeOptions) -> None:
        self.opts, self.bp = opts, opts.plan
        self.summary: dict[str, Any] = {}

    def opened(self, a: lifecycle.Attempt) -> None:
        """The driver on a bare Ubuntu builder (reboots included), before the run's SSH config is
        written (a sandbox instance's sshd moves on a reboot)."""
        if self.bp.base == "ubuntu-24.04":
            nd = a.nodes[0]
            with a.ui.phase("driver"):
                install_driver(a.aws, nd, a.backend, a.ui.note,
                               ends_at=max_runtime_deadline(nd.instance, self.opts.max_runtime_minutes))

    def setup(self, a: lifecycle.Attempt) -> None:
        nd = a.nodes[0]
        with a.ui.phase("setup"):
            lifecycle.task_setup(a)
            prefetch(nd, a.job, self.bp, a.ui.note)
            keep_setup(nd, self.bp.name, a.ui.note)

    def watched(self, a: lifecycle.Attempt) -> list[Node]:
        return []  # a bake has no hand-over

    def run(self, a: lifecycle.Attempt) -> None:
        with a.ui.phase("cleaning"):
            run_script(a.nodes[0], "clean-for-image.sh", [], a.ui.note)
        self.summary = make_image(a.aws, a.settings, a.nodes[0], a.job, self.bp, a.prov, a.run_id, a.ui)

    def collect(self, a: lifecycle.Attempt) -> dict[str, Any]:
        return self.summary


def run_script(nd: Node, script: str, args: list[str], log: Callable[[str], None], ok: tuple[int, ...] = (0,)) -> int:
    """Upload ami/SCRIPT to the node's run directory and run it, its lines to ``log``; its exit
    status when in ``ok``, else RemoteError with its last lines."""
    files.make_dirs(nd.conn, nd.run_dir)
    files.put_file(nd.conn, AMI_DIR / script, f"{nd.run_dir}/{script}")
    out = _LineWriter(log)
    result = ssh.attempt(nd.conn, " ".join(["bash", shlex.quote(f"{nd.run_dir}/{script}"), *map(shlex.quote, args)]),
                         timeout_s=3600, stream=out)
    out.flush()
    if result.exited not in ok:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-TAIL_LINES:])
        raise RemoteError(f"{script} on {nd.instance_id} exited {result.exited}", "its output is shown above",
                          command=script, host=nd.host, exit_status=result.exited, tail=tail)
    return result.exited


def install_driver(aws: Aws, nd: Node, backend: Backend, log: Callable[[str], None], reboots: int = 2,
                   ends_at: datetime | None = None) -> None:
    """ami/install-cuda.sh on a bare Ubuntu builder, told how many GPUs its instance type has
    (DescribeInstanceTypes, else the catalog: it fails rather than bake an image without a driver
    when none is seen; a sandbox instance is this machine, whose GPUs are not its type's, so 0);
    when it asks for a reboot (exit 100), reboot the instance through EC2 and run it again,
    ``reboots`` times at most; ``ends_at`` (UTC) is when the builder's --max-runtime ends it, armed
    again after each reboot. Raises RemoteError."""
    itype = nd.instance.type
    gpus = 0 if backend.is_sandbox else types.facts(aws.ec2, itype, log).gpu_count
    for k in range(reboots + 1):
        if run_script(nd, "install-cuda.sh", [itype, str(gpus)], log, ok=(0, REBOOT_NEEDED)) == 0:
            return
        if k == reboots:
            break
        reboot(aws, nd, backend, log, ends_at=ends_at)
    raise RemoteError(f"the NVIDIA driver still does not load on {nd.instance_id} after {words.count(reboots, 'reboot')}",
                      "bake --from dlami (the Deep Learning AMI has the driver), or check the driver for this GPU")


def reboot(aws: Aws, nd: Node, backend: Backend, log: Callable[[str], None], timeout_s: float = 900.0, every_s: float = 5.0,
           ends_at: datetime | None = None) -> None:
    """Reboot the node's instance (EC2 RebootInstances) and wait until SSH answers from a new boot
    (its boot id changed), the host key still the one pinned. A reboot forgets the --max-runtime
    shutdown (systemd keeps a scheduled shutdown in /run, a tmpfs): with ``ends_at`` (UTC) it is
    armed again for the time left, by a cloud-init per-boot script on the instance itself (so a
    controller that dies during the reboot still leaves a builder that ends itself; not on a sandbox
    instance, whose system is this machine's) and over SSH once the instance is back. Raises
    WaitTimeout."""
    before = ssh.boot_id(nd.conn)
    if ends_at is not None and not backend.is_sandbox:
        install_per_boot_script(nd, ends_at)
    instances.reboot(aws.ec2, [nd.instance_id])
    log(f"rebooting {nd.instance_id} (EC2 RebootInstances) so the NVIDIA driver loads")
    nd.close()
    nd.conn = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(every_s if not backend.is_sandbox else 0.5)
        try:
            nd.host, nd.port = backend.ssh_target(nd.instance)  # the sandbox's sshd moves on a reboot
            conn = nd.connect()
            if ssh.boot_id(conn) != before:
                nd.conn = conn
                log(f"{nd.instance_id} is back from its reboot")
                if ends_at is not None:
                    rearm_max_runtime(nd, ends_at, log)
                return
            conn.close()
        except (*jobs.CONNECTION_ERRORS, LookupError):
            continue
    raise WaitTimeout(f"{nd.instance_id} did not come back within {timeout_s:.0f} s of its reboot",
                      "see its console: aws ec2 get-console-output --instance-id " + nd.instance_id)


#: cloud-init runs the scripts in this directory at every boot (its scripts_per_boot module, in
#: Ubuntu's default cloud_final_modules: https://docs.cloud-init.io/en/latest/reference/modules.html);
#: clean-for-image.sh deletes it (by this path) and `cloud-init clean` the rest of /var/lib/cloud,
#: so no image holds it; and it acts only on the instance it was written for.
PER_BOOT_SCRIPT = "/var/lib/cloud/scripts/per-boot/ec2gpu-max-runtime.sh"
INSTANCE_ID_FILE = "/var/lib/cloud/data/instance-id"  # cloud-init's record of the instance it booted on
SHUTDOWN_MESSAGE = "ec2gpu: max runtime reached"


def max_runtime_deadline(instance: Instance, minutes: int | None) -> datetime | None:
    """When the instance's --max-runtime ends it (pure): its LaunchTime plus ``minutes``, UTC; user
    data's `shutdown -h +M` ran a little after launch, so this is never later than that. None
    without a max runtime or a LaunchTime. A reboot keeps LaunchTime (a stop and start would not)."""
    launched = instance.launched_at
    if not minutes or not isinstance(launched, datetime):
        return None
    return launched + timedelta(minutes=int(minutes))


def minutes_left(deadline: datetime, now: datetime) -> int:
    """Whole minutes from ``now`` to ``deadline``, rounded down (pure): `shutdown +M` counts whole
    minutes, and rounding down never ends the instance later than the deadline; 0 once it passed."""
    return max(0, int((deadline - now).total_seconds() // 60))


def rearm_max_runtime(nd: Node, deadline: datetime, log: Callable[[str], None]) -> int:
    """Schedule the node's --max-runtime shutdown again, for the minutes left until ``deadline``
    (the deadline stays; a reboot does not give a fresh full period); the minutes scheduled."""
    now = datetime.now(timezone.utc)
    left = minutes_left(deadline, now)
    ssh.execute(nd.conn, schedule_shutdown_command(left))
    log(f"{nd.instance_id}: its --max-runtime shutdown armed again for {now + timedelta(minutes=left):%H:%M} UTC "
        f"({left} min left; a reboot forgets it)")
    return left


def per_boot_script(instance_id: str, deadline: datetime, id_file: str = INSTANCE_ID_FILE) -> str:
    """The cloud-init per-boot script that arms the builder's --max-runtime shutdown at every boot
    for the minutes left until ``deadline`` (pure); on any other instance (``id_file`` names
    another) it does nothing."""
    epoch = int(deadline.timestamp())
    return "\n".join([
        "#!/bin/sh",
        f"# ec2gpu: {instance_id}'s --max-runtime, armed again at each boot (a reboot forgets shutdown +M)",
        f'[ "$(cat {shlex.quote(id_file)} 2>/dev/null)" = {shlex.quote(instance_id)} ] || exit 0',
        f"left=$(( ({epoch} - $(date +%s)) / 60 ))",
        f"""if [ "$left" -gt 0 ]; then shutdown -h "+$left" '{SHUTDOWN_MESSAGE}'; """
        f"else shutdown -h now '{SHUTDOWN_MESSAGE}'; fi", ""])


def per_boot_install_command(source: str, path: str = PER_BOOT_SCRIPT) -> str:
    """The shell line that installs the file ``source`` (on the instance) at ``path``, mode 755, as
    root or through passwordless sudo (pure)."""
    return ('r() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }; '
            f"r install -D -m 755 {shlex.quote(source)} {shlex.quote(path)}")


def install_per_boot_script(nd: Node, deadline: datetime) -> None:
    """Put per_boot_script on the node's instance at PER_BOOT_SCRIPT (through its run directory)."""
    source = f"{nd.run_dir}/ec2gpu-max-runtime.sh"
    files.make_dirs(nd.conn, nd.run_dir)
    files.write_text(nd.conn, source, per_boot_script(nd.instance_id, deadline))
    ssh.execute(nd.conn, per_boot_install_command(source))


def prefetch(nd: Node, job: TaskJob, bp: BakePlan, log: Callable[[str], None]) -> None:
    """Put what the task declares it reads into the image: MNIST (checked) for the built-in task."""
    if job.builtin != "mnist":
        return
    python = shlex.quote(str(nd.info.get("python") or "python3"))
    src = f" --data-dir {shlex.quote(bp.data_dir)}" if bp.data_dir else ""
    done = ssh.attempt(nd.conn, f"cd {shlex.quote(workdir_of(nd.run_dir, job))} && {python} -m ec2gpu.train.data "
                                f"--prefetch{src}", timeout_s=1800)
    if not done.ok:
        raise RemoteError(f"pre-fetching MNIST on {nd.instance_id} failed", "see its error below", command="prefetch",
                          host=nd.host, exit_status=done.exited, tail=(done.stdout + done.stderr)[-2000:])
    log(done.stdout.strip())


def keep_setup(nd: Node, name: str, log: Callable[[str], None]) -> None:
    """Keep what setup-gpu.sh found as $HOME/.ec2gpu/baked-setup.json: on an instance of the image,
    the machine setup reads it instead of importing torch again (ami/setup-gpu.sh). The task's
    setup markers say which image holds them (engine.setup_node shows it when it skips)."""
    ssh.execute(nd.conn, keep_setup_command(nd.run_dir, name))
    log(f"machine setup kept for the image: python {nd.info.get('python')}, torch {nd.info.get('torch_version')}")


def keep_setup_command(run_dir: str, name: str) -> str:
    """keep_setup's shell line (pure; shellcheck reads it in tests/unit/test_requests.py)."""
    return (f'mkdir -p "$HOME/.ec2gpu/setup-done" && cp {shlex.quote(run_dir)}/setup.json '
            '"$HOME/.ec2gpu/baked-setup.json" && for m in "$HOME"/.ec2gpu/setup-done/*; do [ -f "$m" ] && '
            f"""printf '%s, baked into image %s\\n' "$(head -n 1 "$m")" {shlex.quote(name)} > "$m"; done; true""")


def make_image(aws: Aws, settings: Settings, nd: Node, job: TaskJob, bp: BakePlan, prov: Provisioned, run_id: str,
               ui: ReporterLike) -> dict[str, Any]:
    """CreateImage of the builder, wait until available, tag it complete; the bake's summary."""
    ec2 = aws.ec2
    base = prov.ami or {}
    tag_list = baked.image_tags(run_id, settings.owner, bp.name, bp.key, job.name, bp.base, base.get("ImageId", ""),
                                nd.info)
    with ui.phase("imaging"):
        image_id = baked.create(ec2, nd.instance_id, bp.name,
                                f"ec2gpu bake of task {job.name} from {bp.base} ({base.get('Name', '')})", tag_list)
        ui.note(f"CreateImage: {image_id} ({bp.name}); it is removed again unless it completes")
    with ui.phase("waiting for image"):
        image = baked.wait_available(ec2, image_id, bp.image_timeout_s, bp.image_delay_s)
    baked.mark_complete(ec2, image)  # from here on the image is kept, whatever happens
    ui.note(f"image {image_id} available and tagged complete: runs of task {job.name} with this setup launch from it")
    return {"image_id": image_id, "name": bp.name, "task": job.name, "setup_hash": bp.key, "base": bp.base,
            "base_image": base.get("ImageId"), "snapshots": baked.snapshot_ids(image),
            **{k: nd.info.get(k) for k in ("python", "torch_version", "cuda_version", "driver_version")}}


def listing(aws: Aws, home: Path | None = None) -> list[dict[str, Any]]:
    """`ec2gpu image ls`: aws.baked.listing of the region, its snapshots priced at the region's EBS
    snapshot price (aws/catalog.ebs_price: ``home``'s refreshed price cache, else the shipped
    table); each row also has "usd_per_gb_month" (None, and "usd_per_month" None, where the
    region's price is not known) and "price_source" (where the price comes from, or how to get it)."""
    price = catalog.ebs_price("snapshot", aws.region, home)
    return [{**row, "usd_per_gb_month": price.usd_per_gb_month, "price_source": price.source}
            for row in baked.listing(aws.ec2, price.usd_per_gb_month)]


def remove(aws: Aws, ref: str, log: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """`ec2gpu image rm NAME|AMI_ID`: deregister the image and delete its snapshots; what was
    removed. Raises UsageError when the tool made no image by that name or id here."""
    image = baked.find(aws.ec2, ref)
    if image is None:
        raise UsageError(f"no image of ec2gpu's named {ref!r} in {aws.region}", "see `ec2gpu image ls`")
    snaps = baked.delete(aws.ec2, image, log)
    return {"image_id": image["ImageId"], "name": image.get("Name"), "snapshots": snaps}
