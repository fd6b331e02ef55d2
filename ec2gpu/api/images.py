"""Baked machine images as library functions: list_images (`ec2gpu image ls`) and remove_image
(`ec2gpu image rm`); `image bake` is api.tasks.bake.

Each function opens its own backend.Context (``region``; ``sandbox``: the local sandbox instead of
AWS, also EC2GPU_SANDBOX=1), returns plain data (what the CLI's ``--json`` prints) and raises the
ec2gpu.errors tree: UsageError, NoCredentials, AwsError.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from .. import backend
from ..runs.provision import bake

Log = Callable[[str], None]


def _quiet(text: str) -> None:
    """The default ``log``: says nothing."""


def list_images(*, region: Optional[str] = None, sandbox: bool = False) -> list[dict[str, Any]]:
    """The images `ec2gpu image bake` made in the region, newest first, with what is inside and
    what their snapshots cost; `ec2gpu image ls`. One dict each (runs/provision/bake.listing): name,
    image_id, state, created, task, setup_hash, base, base_image, run_id, torch, cuda, driver,
    snapshots (ids), snapshot_gib (GiB; the volume's size where EC2 reports no stored bytes, said
    by size_basis), usd_per_month (USD, None where the region's price is unknown),
    usd_per_gb_month (USD per GB-month of EBS snapshot storage, or None), price_source (where that
    price comes from, or how to get it). [] when there are none. Raises NoCredentials, AwsError."""
    with backend.Context(region, sandbox) as ctx:
        ctx.aws.check_credentials()
        return bake.listing(ctx.aws, ctx.settings.home)


def remove_image(image: str, *, region: Optional[str] = None, sandbox: bool = False, log: Log = _quiet) -> dict[str, Any]:
    """Deregister the baked image ``image`` (its name or AMI id) and delete its snapshots; `ec2gpu
    image rm`. Each step is said to ``log``. Returns {"image_id": str, "name": str or None,
    "snapshots": [snapshot ids deleted]}. Raises UsageError when ec2gpu made no image by that name
    or id in the region; NoCredentials, AwsError."""
    with backend.Context(region, sandbox, note=log) as ctx:
        ctx.aws.check_credentials()
        return bake.remove(ctx.aws, image, log=log)
