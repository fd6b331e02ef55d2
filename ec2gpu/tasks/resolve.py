"""From a task's resources to instance types: a GPU model and count -> the cheapest catalog type."""
from __future__ import annotations

from ..aws import catalog
from ..errors import UsageError


def instance_type_for_gpu(gpu: str) -> str:
    """The cheapest catalog instance type (us-east-1 on-demand list price) with at least the GPUs
    ``gpu`` asks for: 'T4' -> g4dn.xlarge, 'A10G:4' -> g5.12xlarge (pure).

    Raises UsageError naming the GPUs the catalog has when none fits.
    """
    model, _, count = gpu.partition(":")
    need = int(count or 1)
    fits = [t for t in catalog.CATALOG.values() if t.gpu.lower() == model.lower() and t.gpu_count >= need]
    if not fits:
        catalog.refuse_retired_gpu(gpu)  # V100, K80, K520: why, and what instead
        have = sorted({f"{t.gpu}:{t.gpu_count}" for t in catalog.CATALOG.values()})
        raise UsageError(f"no instance type in the catalog has {need} x {model}",
                         f"GPUs with the most per instance: {', '.join(have)}")
    return min(fits, key=lambda t: (t.on_demand_usd_h, t.name)).name


def instance_types(resources, default: str) -> list[str]:
    """The types to try, in order: ``instance_type`` (one or a list), else the one ``gpu`` picks,
    else ``default`` (pure apart from the catalog)."""
    if resources.instance_types:
        return [t.strip() for t in resources.instance_types]
    if resources.gpu:
        return [instance_type_for_gpu(resources.gpu)]
    return [t.strip() for t in default.split(",") if t.strip()]
