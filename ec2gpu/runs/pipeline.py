"""The whole job: launch -> wait -> SSH -> setup -> upload -> train -> download -> terminate.

Whatever happens after the first resource is created (an error, Ctrl-C, SIGTERM), ``finally``
tears down everything the run created unless the user asked to ``keep`` it.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..aws import catalog, images, instances, network, sweep
from ..aws.session import Aws
from ..errors import RemoteError, UsageError
from ..settings import Settings
from .costs import billed_seconds, cost_usd

PHASES = ("requesting", "waiting for running", "waiting for SSH", "setup", "upload", "training",
          "download", "terminating")
EXIT_SPOT_INTERRUPTED = 75  # the trainer's code after a spot interruption notice (train/spot.py)


@dataclass
class TrainOptions:
    """What `ec2gpu train mnist` was asked to do."""

    instance_type: str = "g4dn.xlarge"
    spot: bool = False
    model: str = "cnn"
    epochs: int | None = None  # None: the preset's
    seed: int = 0
    trainer_args: list[str] = field(default_factory=list)  # passed through to the trainer
    keep: bool = False
    out: Path | None = None  # default runs/<run-id>
    ssh_cidr: str | None = None
    ami: str | None = None
    name: str | None = None
    max_runtime_minutes: int = 120


class Reporter:
    """What the pipeline tells the user; the CLI renders it with rich, tests record it."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self.notes: list[str] = []

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - t0, 2)

    def log(self, line: str) -> None:
        """One line of the job's log."""

    def note(self, text: str) -> None:
        self.notes.append(text)


def new_run_id() -> str:
    """A sortable, unique run id: YYYYmmdd-HHMMSS-xxxx (UTC)."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


@dataclass
class Provisioned:
    """What a run created, so teardown removes exactly that."""

    run_id: str
    key_name: str | None = None
    key_path: Path | None = None
    security_group_id: str | None = None
    instances: list[dict] = field(default_factory=list)

    @property
    def instance_ids(self) -> list[str]:
        return [i["InstanceId"] for i in self.instances]


def provision(aws: Aws, settings: Settings, opts: TrainOptions, run_id: str, ui: Reporter,
              prov: Provisioned) -> None:
    """Create key pair, security group and instance (filling ``prov`` as it goes), wait running."""
    ec2 = aws.ec2
    name = opts.name or f"ec2gpu-{run_id}"
    cidr = network.ssh_cidr(opts.ssh_cidr)
    ami = images.resolve_ami(aws.client("ssm"), ec2, opts.ami)
    ui.note(f"AMI {ami['ImageId']} ({ami['Name']}) via {ami['source']}; SSH allowed from {cidr}")
    with ui.phase("requesting"):
        prov.key_name, prov.key_path = network.create_key_pair(ec2, run_id, settings.owner, settings.keys_dir)
        prov.security_group_id = network.create_security_group(ec2, run_id, settings.owner, cidr)
        spec = instances.LaunchSpec(
            run_id=run_id, owner=settings.owner, name=name, instance_type=opts.instance_type,
            image_id=ami["ImageId"], root_device_name=ami["RootDeviceName"], key_name=prov.key_name,
            security_group_id=prov.security_group_id, spot=opts.spot,
            root_volume_gib=settings.root_volume_gib, max_runtime_minutes=opts.max_runtime_minutes)
        prov.instances = instances.launch(aws.client("ec2", fail_fast=True), spec)
        ui.note(f"launched {', '.join(prov.instance_ids)} ({opts.instance_type}, "
                f"{'spot' if opts.spot else 'on-demand'})")
    with ui.phase("waiting for running"):
        prov.instances = instances.wait_running(ec2, prov.instance_ids)


def teardown(aws: Aws, settings: Settings, prov: Provisioned, ui: Reporter) -> dict:
    """Terminate the run's instances (waiting), delete its security group and key pair.

    A second Ctrl-C during teardown is answered with how to finish by hand. Returns what was removed.
    """
    def on_sigint(*_):
        ui.note("cleanup is under way; if you stop it, finish by hand with `ec2gpu down --all`")
    previous = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    removed: dict = {"instances": [], "security_groups": [], "key_pairs": []}
    try:
        with ui.phase("terminating"):
            ec2 = aws.ec2
            if prov.instance_ids:
                instances.terminate(ec2, prov.instance_ids)
                removed["instances"] = prov.instance_ids
            if prov.security_group_id:
                sweep.delete_security_group(ec2, prov.security_group_id)
                removed["security_groups"] = [prov.security_group_id]
            if prov.key_name:
                network.delete_key_pair(ec2, prov.key_name, settings.keys_dir)
                removed["key_pairs"] = [prov.key_name]
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    ui.note("removed: " + "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in removed.items() if v))
    return removed


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def ssh_target(instance: dict, resolver=None) -> tuple[str, int]:
    """(host, port) to reach ``instance``: the sandbox's resolver, else its public IP on port 22."""
    if resolver:
        return resolver(instance["InstanceId"])
    ip = instance.get("PublicIpAddress")
    if not ip:
        raise RemoteError(f"{instance['InstanceId']} has no public IP address",
                          "the default subnet must assign public IPs (MapPublicIpOnLaunch)")
    return ip, 22


class LineSplitter:
    """Turn a byte stream into whole lines for ``emit``."""

    def __init__(self, emit):
        self.emit, self.buf = emit, b""

    def __call__(self, chunk: bytes) -> None:
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self.emit(line.decode(errors="replace"))

    def flush(self) -> None:
        if self.buf:
            self.emit(self.buf.decode(errors="replace"))
            self.buf = b""


def trainer_argv(python: str, opts: TrainOptions, out_dir: str) -> list[str]:
    """The trainer's command line (pure)."""
    argv = [python, "-m", "ec2gpu.train.mnist", "--model", opts.model, "--out", out_dir, "--seed", str(opts.seed)]
    if opts.epochs:
        argv += ["--epochs", str(opts.epochs)]
    return argv + list(opts.trainer_args)


def run_remote(conn, run_id: str, opts: TrainOptions, ui: Reporter, local_out: Path) -> dict:
    """Setup, upload, train (log followed live) and download on an open connection.

    Returns the trainer's summary.json. Raises RemoteError when the trainer fails (after
    fetching what it wrote, so train.log is on disk).
    """
    from ..remote import jobs, setup

    run_dir = jobs.remote_run_dir(conn, run_id)
    with ui.phase("setup"):
        info = setup.setup(conn, run_dir, log=ui.note)
    with ui.phase("upload"):
        size = jobs.push_code(conn, run_dir)
        ui.note(f"uploaded the trainer ({size:,} bytes) to {conn.host}:{run_dir}")
    with ui.phase("training"):
        jobs.start(conn, run_dir, trainer_argv(info["python"], opts, f"{run_dir}/out"))
        lines = LineSplitter(ui.log)
        status, _ = jobs.follow(conn, run_dir, "out/train.log", lines)
        lines.flush()
    with ui.phase("download"):
        jobs.fetch(conn, f"{run_dir}/out", local_out)
        (local_out / "console.log").write_bytes(jobs.read_from(conn, f"{run_dir}/console.log", 0))
    if status == EXIT_SPOT_INTERRUPTED:
        raise RemoteError("the spot instance received an interruption notice; the trainer checkpointed and stopped",
                          f"the checkpoint is in {local_out}; run again, or use on-demand", exit_status=status)
    if status != 0:
        raise RemoteError(f"the trainer on {conn.host} exited {status}", f"see {local_out / 'console.log'}",
                          command="python -m ec2gpu.train.mnist", host=conn.host, exit_status=status,
                          tail=jobs.tail(conn, f"{run_dir}/console.log"))
    return json.loads((local_out / "summary.json").read_text())


def train(aws: Aws, settings: Settings, opts: TrainOptions, ui: Reporter, resolver=None) -> dict:
    """Run ``opts`` on a new instance end to end; return the run record (also saved as run.json).

    Raises UsageError before creating anything for a bad instance type; AwsError, CapacityError,
    RemoteError, WaitTimeout as they happen (after teardown); KeyboardInterrupt after teardown.
    """
    from ..remote import ssh

    itype = catalog.lookup(opts.instance_type)
    aws.check_credentials()
    run_id = new_run_id()
    out = Path(opts.out or Path("runs") / run_id).resolve()
    prov = Provisioned(run_id)
    record = {"run_id": run_id, "instance_type": itype.name, "market": "spot" if opts.spot else "on-demand",
              "region": aws.region, "artifacts": str(out), "status": "failed"}
    conn = None
    try:
        provision(aws, settings, opts, run_id, ui, prov)
        instance = prov.instances[0]
        record.update(instance_id=instance["InstanceId"], zone=instance["Placement"]["AvailabilityZone"],
                      launched_at=instance["LaunchTime"].isoformat())
        with ui.phase("waiting for SSH"):
            host, port = ssh_target(instance, resolver)
            conn = ssh.wait_for_ssh(host, port, settings.ssh_user, prov.key_path,
                                    settings.home / "known_hosts" / instance["InstanceId"], log=ui.note)
        summary = run_remote(conn, run_id, opts, ui, out)
        record.update(status="completed", test_acc=summary["test_acc"], summary=summary)
        return record
    finally:
        if conn is not None:
            conn.close()
        if opts.keep and prov.instances:
            ui.note(f"--keep: {', '.join(prov.instance_ids)} keeps running (and billing) until "
                    f"`ec2gpu down {opts.name or 'ec2gpu-' + run_id}` or {opts.max_runtime_minutes} min pass")
        elif prov.key_name or prov.security_group_id or prov.instances:
            teardown(aws, settings, prov, ui)
            if prov.instances:
                ended = datetime.now(timezone.utc)
                seconds = billed_seconds(prov.instances[0]["LaunchTime"], ended)
                record.update(ended_at=ended.isoformat(), billed_seconds=round(seconds, 1),
                              usd_per_hour=itype.on_demand_usd_h, price_note=f"on-demand list price, {catalog.PRICES_AS_OF}",
                              cost_usd=round(cost_usd(seconds, itype.on_demand_usd_h), 4))
        record["phases"] = dict(ui.phases)
        if out.exists() or record["status"] == "completed":
            out.mkdir(parents=True, exist_ok=True)
            (out / "run.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


def train_local(opts: TrainOptions, ui: Reporter, data_dir: str | None = None) -> dict:
    """Run the same trainer on this machine (needs torch); return its summary.json.

    Raises UsageError when torch is missing, RemoteError when the trainer fails.
    """
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError("--local needs PyTorch on this machine", "pip install 'ec2gpu[train]' (or make demo)")
    run_id = new_run_id()
    out = Path(opts.out or Path("runs") / run_id).resolve()
    argv = trainer_argv(sys.executable, opts, str(out))
    if data_dir:
        argv += ["--data-dir", data_dir]
    with ui.phase("training"):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        for raw in proc.stdout:
            ui.log(raw.decode(errors="replace").rstrip("\n"))
        status = proc.wait()
    if status != 0:
        raise RemoteError(f"the trainer exited {status}", f"see {out / 'train.log'}", exit_status=status)
    summary = json.loads((out / "summary.json").read_text())
    return {"run_id": run_id, "status": "completed", "instance_type": "local", "market": "local",
            "artifacts": str(out), "test_acc": summary["test_acc"], "summary": summary,
            "phases": dict(ui.phases)}


def as_json(record: dict) -> str:
    return json.dumps(record, indent=2, default=str)

