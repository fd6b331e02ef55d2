"""Baked machine images as library functions: list_images (`ec2gpu image ls`) and remove_image
(`ec2gpu image rm`); `image bake` is api.tasks.bake.

Each function opens its own backend.Context (``region``; ``sandbox``: the local sandbox instead of
AWS, also EC2GPU_SANDBOX=1), returns typed records (their ``to_json()`` is what the CLI's ``--json`` prints) and raises the
ec2gpu.errors tree: UsageError, NoCredentials, AwsError.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from .. import backend

# runs/provision/bake loads boto3 and fabric: imported inside the functions that reach AWS, since `ec2gpu run
# --dry-run` imports api/ and loads neither (tests/unit/test_dry_run.py::test_a_dry_run_imports_no_aws_sdk).

Log = Callable[[str], None]


def _quiet(text: str) -> None:
    """The default ``log``: says nothing."""


@dataclass(frozen=True)
class ImageRow:
    """One image `ec2gpu image bake` made (runs/provision/bake.listing, from its tags and EC2's
    answers: an account's, shown inert). ``created``: ISO 8601 (EC2's CreationDate); ``torch``,
    ``cuda``, ``driver``: the versions the bake found; ``snapshot_gib``: GiB stored (the volume's
    size where EC2 reports no stored bytes: ``size_basis`` says which); ``usd_per_month``: USD,
    None where the region's price is unknown; ``usd_per_gb_month``: the region's EBS snapshot price
    (USD per GB-month, standard tier: https://aws.amazon.com/ebs/pricing/) or None;
    ``price_source``: where that price comes from, or how to get it."""
    name: Optional[str]
    image_id: str
    state: Optional[str]
    created: Optional[str]
    task: Optional[str]
    setup_hash: Optional[str]
    base: Optional[str]
    base_image: Optional[str]
    run_id: Optional[str]
    torch: Optional[str]
    cuda: Optional[str]
    driver: Optional[str]
    snapshots: list[str]
    snapshot_gib: float
    size_basis: str
    usd_per_month: Optional[float]
    usd_per_gb_month: Optional[float]
    price_source: str

    def to_json(self) -> dict[str, Any]:
        """Every field, in this order (bake.listing's row)."""
        return asdict(self)


@dataclass(frozen=True)
class RemovedImage:
    """What `remove_image` removed: the image ``image_id`` (``name``: its Name, None without one)
    and its ``snapshots`` (ids deleted)."""
    image_id: str
    name: Optional[str]
    snapshots: list[str]

    def to_json(self) -> dict[str, Any]:
        """{"image_id", "name", "snapshots"}."""
        return asdict(self)


def list_images(*, region: Optional[str] = None, sandbox: bool = False) -> list[ImageRow]:
    """The images `ec2gpu image bake` made in the region, newest first, with what is inside and
    what their snapshots cost; `ec2gpu image ls`. One ImageRow each (runs/provision/bake.listing): name,
    image_id, state, created, task, setup_hash, base, base_image, run_id, torch, cuda, driver,
    snapshots (ids), snapshot_gib (GiB; the volume's size where EC2 reports no stored bytes, said
    by size_basis), usd_per_month (USD, None where the region's price is unknown),
    usd_per_gb_month (USD per GB-month of EBS snapshot storage, or None), price_source (where that
    price comes from, or how to get it). [] when there are none. Raises NoCredentials, AwsError."""
    from ..runs.provision import bake
    with backend.Context(region, sandbox) as ctx:
        ctx.aws.check_credentials()
        return [ImageRow(**row) for row in bake.listing(ctx.aws, ctx.settings.home)]


def remove_image(image: str, *, region: Optional[str] = None, sandbox: bool = False,
                 log: Log = _quiet) -> RemovedImage:
    """Deregister the baked image ``image`` (its name or AMI id) and delete its snapshots; `ec2gpu
    image rm`. Each step is said to ``log``. Returns a RemovedImage (image_id, name: str or None,
    snapshots: the snapshot ids deleted). Raises UsageError when ec2gpu made no image by that name
    or id in the region; NoCredentials, AwsError."""
    from ..runs.provision import bake
    with backend.Context(region, sandbox, note=log) as ctx:
        ctx.aws.check_credentials()
        return RemovedImage(**bake.remove(ctx.aws, image, log=log))
