"""`ec2gpu image bake|ls|rm`: machine images that already hold a task's setup (runs/provision/bake.py)."""
from __future__ import annotations

import sys
from typing import List, Optional

import typer

from .app import JSON, REGION, SANDBOX, _sandbox_flag, image_app
from .render import RichReporter, _print_record, err, note, out, render_json, say, table, table_row, warn
from .tasks import ALLOW_WRITE_BUCKET


@image_app.command("bake")
def bake_cmd(
    task: str = typer.Argument(..., help="A task file (task.yaml), or mnist for the built-in job."),
    instance_type: Optional[str] = typer.Option(None, "--instance-type", "-t", help="The builder's type (default: "
                                                "the task's, else g4dn.xlarge); the image runs on every type."),
    base: str = typer.Option("dlami", "--from", help="dlami (the PyTorch Deep Learning AMI: driver and torch "
                             "inside) or ubuntu-24.04 (Canonical's image: the NVIDIA driver and torch installed)."),
    name: Optional[str] = typer.Option(None, "--name", help="The image's name: letters, digits, '.', '_' and '-', "
                                       "63 at most (default <task>-<UTC time>, e.g. quickstart-20261122-184950)."),
    spot: bool = typer.Option(False, "--spot", help="Build on a spot instance."),
    ssh_cidr: Optional[str] = typer.Option(None, "--ssh-cidr", help="CIDR allowed to SSH (default: your public IP/32)."),
    ami: Optional[str] = typer.Option(None, "--ami", help="Start from this AMI instead of --from's."),
    workdir_outside: bool = typer.Option(False, "--workdir-outside", help="Bake in a task file's workdir even when it "
                                         "lies outside the task file's directory (never your home or credentials)."),
    allow_write_bucket: List[str] = ALLOW_WRITE_BUCKET,
    max_runtime: Optional[int] = typer.Option(None, "--max-runtime", min=10, help="Minutes after its launch when the "
                                              "builder terminates itself, even if this command died (user data's "
                                              "`shutdown -h +M`, armed again after each driver reboot); at least "
                                              "10, default 120. A bake whose estimate is longer is refused."),
    region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
) -> None:
    """Make an image holding a task's setup; its runs then launch from it and skip that setup.

    A builder instance runs the machine setup, the task's setup and (for mnist) the data download,
    is cleaned of keys, histories and credentials, and imaged (CreateImage); the image and its
    snapshots are tagged with the setup's hash, torch, CUDA and driver versions, and the builder is
    terminated. Ctrl-C or an error leaves no builder, no half-made image and no snapshot; should
    this command die, the builder still ends itself after --max-runtime minutes."""
    from .. import api
    record = api.bake(task, base=base, name=name, instance_type=instance_type, spot=spot, ssh_cidr=ssh_cidr, ami=ami,
                      region=region, sandbox=_sandbox_flag(sandbox), reporter=RichReporter(err),
                      on_warning=warn, as_typed=" ".join(["ec2gpu", *sys.argv[1:]]), workdir_outside=workdir_outside,
                      max_runtime=max_runtime, allow_write_buckets=allow_write_bucket)
    _print_record(record.to_json(), as_json)


@image_app.command("ls")
def ls_cmd(region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """List the baked images of the region: what is inside, snapshot GiB and USD per month.

    USD per month: the snapshots' stored GiB at the region's EBS snapshot price (the cache
    `ec2gpu prices --refresh --region R` writes, else the shipped table); unknown where neither
    has the region's."""
    from rich import box

    from ..api import images
    from ..settings import load
    rows = images.list_images(region=region, sandbox=_sandbox_flag(sandbox))
    if as_json:
        render_json(rows)
        return
    if not rows:
        say(out, "no baked images here; make one with `ec2gpu image bake task.yaml`")
        return
    where = load({"region": region}).region  # the region the listing's Context used
    t = table(title=f"baked images in {where}", box=box.SIMPLE_HEAD)
    for col in ("name", "image", "created", "GiB", "$/month"):
        if col in ("name", "image"):  # what a user copies (`image rm`): never cut, never wrapped
            key = "name" if col == "name" else "image_id"
            t.add_column(col, no_wrap=True, min_width=max(len(getattr(r, key) or "") for r in rows))
        else:
            t.add_column(col, no_wrap=True, justify="right" if col in ("GiB", "$/month") else "left")
    for r in rows:  # names and tags of images in the account (the task's name from its file): never markup
        table_row(t, r.name, r.image_id, (r.created or "")[:10], f"{r.snapshot_gib:g}",
                  "unknown" if r.usd_per_month is None else f"{r.usd_per_month:.2f}")
    say(out, t)
    for r in rows:  # what is inside, a line each (it would crowd the table's columns)
        inside = ", ".join([f"task {r.task} from {r.base}", f"torch {r.torch or '-'}"]
                           + [f"{k} {v}" for k, v in (("CUDA", r.cuda), ("driver", r.driver)) if v])
        say(out, f"{r.name}: {inside}")
    if any(r.size_basis != "stored bytes" for r in rows):
        say(out, "GiB: the snapshot's volume size where EC2 does not report its stored bytes (an upper bound)", "dim")
    say(out, snapshot_price_words(where, rows[0].usd_per_gb_month, rows[0].price_source), "dim")


def snapshot_price_words(region: str, usd_per_gb_month: float | None, source: str) -> str:
    """The line under `image ls`'s table (pure): the EBS snapshot price (standard tier, USD per
    GB-month) its $/month column uses in ``region`` and its ``source`` (aws/catalog.ebs_price), or
    that the price is unknown there and how to get it."""
    if usd_per_gb_month is None:
        return f"$/month: unknown in {region}: {source}"
    return f"$/month: snapshot storage at {usd_per_gb_month:g} USD per GB-month (EBS standard tier, {region}; {source})"


@image_app.command("rm")
def rm_cmd(image: str = typer.Argument(..., help="The image's name or AMI id (see `ec2gpu image ls`)."),
           region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Deregister a baked image and delete its snapshots."""
    from ..api import images
    done = images.remove_image(image, region=region, sandbox=_sandbox_flag(sandbox), log=note)
    if as_json:
        render_json(done)
    else:
        say(out, f"removed image {done.image_id} ({done.name}) and snapshots "
            f"{', '.join(done.snapshots) or '-'}")
