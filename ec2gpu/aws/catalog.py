"""GPU instance types: GPU model and count, vCPUs, memory, on-demand price; retired types.

Specifications: https://aws.amazon.com/ec2/instance-types/ (accelerated computing tab).
On-demand prices: USD per hour, Linux, shared tenancy, from
https://aws.amazon.com/ec2/pricing/on-demand/ as transcribed on PRICES_AS_OF for us-east-1; the
same list prices apply in us-east-2 and us-west-2 (SHIPPED_PRICE_REGIONS). For any other region, or
to replace the shipped table, ``ec2gpu prices --refresh`` fetches the AWS Price List API
(aws/pricing.py) and caches the result; ``on_demand_price`` prefers that cache.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import RetiredInstanceType, UsageError

PRICES_AS_OF = "2025-06 (us-east-1, Linux on-demand; P4d/P5 after the 2025-06-05 cut)"
PRICE_REGION = "us-east-1"
SHIPPED_PRICE_REGIONS = ("us-east-1", "us-east-2", "us-west-2")  # same Linux on-demand list prices
#: EBS storage, USD per GB-month, by region: "gp3" (an instance's root volume, billed from launch to
#: termination, stopped or not) and "snapshot" (standard tier, per GB stored: a baked image's), from
#: https://aws.amazon.com/ebs/pricing/ as transcribed in EBS_PRICES_AS_OF, for the regions whose
#: instance prices are shipped too; `ec2gpu prices --refresh` reads any region's from the Price List
#: API (aws/pricing.fetch_storage). Billed per second, 60 s minimum, a month being 30 days (the
#: page's own example: "$0.08 per GB-month * 2,000 GB * 43,200 seconds / (86,400 seconds/day * 30-day month)").
EBS_PRICES_AS_OF = "2026-11"
EBS_USD_PER_GB_MONTH: dict[str, dict[str, float]] = {
    region: {"gp3": 0.08, "snapshot": 0.05} for region in ("us-east-1", "us-east-2", "us-west-2")}
EBS_GP3_USD_PER_GB_MONTH = EBS_USD_PER_GB_MONTH["us-east-1"]["gp3"]  # us-east-1's, for the docs and tests
EBS_MONTH_SECONDS = 30 * 86400  # the month EBS prorates a GB-month over (the example above)
#: Public IPv4 address, USD per address-hour, every region, in use or idle, since 2024-02-01
#: (https://aws.amazon.com/vpc/pricing/, "Public IPv4 Address" tab). Each instance ec2gpu launches
#: holds one while it runs: a default subnet gives every instance one
#: (https://docs.aws.amazon.com/vpc/latest/userguide/default-vpc.html), and ec2gpu reaches the
#: instance over SSH at it; a stop or a termination releases it.
PUBLIC_IPV4_USD_PER_HOUR = 0.005
BILLING_MINIMUM_SECONDS = 60  # per-second billing, 60 s minimum: https://aws.amazon.com/ec2/pricing/


@dataclass(frozen=True)
class InstanceType:
    """One GPU instance type. ``on_demand_usd_h`` is USD/h in PRICE_REGION."""

    name: str
    gpu: str
    gpu_count: int
    gpu_memory_gib: int  # per GPU
    vcpus: int
    memory_gib: float
    on_demand_usd_h: float

    @property
    def family(self) -> str:
        return self.name.split(".")[0]


def _t(name, gpu, count, gmem, vcpus, mem, price):
    return InstanceType(name, gpu, count, gmem, vcpus, mem, price)


CATALOG: dict[str, InstanceType] = {t.name: t for t in [
    _t("g4dn.xlarge", "T4", 1, 16, 4, 16, 0.526),
    _t("g4dn.2xlarge", "T4", 1, 16, 8, 32, 0.752),
    _t("g4dn.4xlarge", "T4", 1, 16, 16, 64, 1.204),
    _t("g4dn.8xlarge", "T4", 1, 16, 32, 128, 2.176),
    _t("g4dn.12xlarge", "T4", 4, 16, 48, 192, 3.912),
    _t("g4dn.16xlarge", "T4", 1, 16, 64, 256, 4.352),
    _t("g5.xlarge", "A10G", 1, 24, 4, 16, 1.006),
    _t("g5.2xlarge", "A10G", 1, 24, 8, 32, 1.212),
    _t("g5.4xlarge", "A10G", 1, 24, 16, 64, 1.624),
    _t("g5.8xlarge", "A10G", 1, 24, 32, 128, 2.448),
    _t("g5.12xlarge", "A10G", 4, 24, 48, 192, 5.672),
    _t("g5.16xlarge", "A10G", 1, 24, 64, 256, 4.096),
    _t("g5.24xlarge", "A10G", 4, 24, 96, 384, 8.144),
    _t("g5.48xlarge", "A10G", 8, 24, 192, 768, 16.288),
    _t("g6.xlarge", "L4", 1, 24, 4, 16, 0.8048),
    _t("g6.2xlarge", "L4", 1, 24, 8, 32, 0.9776),
    _t("g6.4xlarge", "L4", 1, 24, 16, 64, 1.3232),
    _t("g6.8xlarge", "L4", 1, 24, 32, 128, 2.0144),
    _t("g6.12xlarge", "L4", 4, 24, 48, 192, 4.6016),
    _t("g6.16xlarge", "L4", 1, 24, 64, 256, 3.3968),
    _t("g6.24xlarge", "L4", 4, 24, 96, 384, 6.6752),
    _t("g6.48xlarge", "L4", 8, 24, 192, 768, 13.3504),
    # P4d and P5 after AWS's price cut of June 2025 ("up to 45% price reduction for Amazon EC2
    # NVIDIA GPU-accelerated instances", What's New, 2025-06-05: P4 -33%, P5 -44%, on-demand);
    # before it they were 32.7726 and 98.32 USD/h. `ec2gpu prices --refresh` reads the current list.
    _t("p4d.24xlarge", "A100", 8, 40, 96, 1152, 21.96),
    _t("p5.48xlarge", "H100", 8, 80, 192, 2048, 55.04),
]}

#: Last known on-demand price of the retired types, USD/h, us-east-1 (AWS's previous-generation
#: price list: g2.2xlarge $0.65/h, g2.8xlarge $2.60/h, p2.xlarge $0.90/h; p3 as this catalog listed
#: it, transcribed on PRICES_AS_OF).
RETIRED_LAST_PRICE: dict[str, float] = {"g2.2xlarge": 0.65, "g2.8xlarge": 2.60, "p2.xlarge": 0.90,
                                        "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48}

#: Why p3 (NVIDIA V100, Volta, compute capability 7.0) is no longer offered here, though EC2 still
#: sells it: the image every run boots, the newest Ubuntu 24.04 PyTorch DLAMI, does not list P3
#: among its supported instances (DLAMI release notes, "Deep Learning OSS Nvidia Driver AMI GPU
#: PyTorch 2.9 (Ubuntu 24.04)": G4dn, G5, G6, Gr6, G6e, P4, P4de, P5, P5e, P5en, P6-B200), and
#: PyTorch's CUDA wheels leave sm_70 out: the CUDA 13 builds from the start, the CUDA 12.8 builds from
#: PyTorch 2.11 (PyTorch RELEASE.md, "PyTorch CUDA Support Matrix"; "Dropping Volta support from
#: CUDA-12.8 binaries for release 2.11", dev-discuss.pytorch.org, 2026-01); only the CUDA 12.6
#: builds still carry it. The replacements have the same GPU count and more memory per GPU (A10G 24 GiB).
VOLTA = ("NVIDIA V100, Volta sm_70: left out of current PyTorch CUDA wheels, and not among the Ubuntu 24.04 "
         "PyTorch DLAMI's supported instances")

#: Retired instance type -> (why, suggested replacement). g2 (NVIDIA GRID K520, Kepler) is no
#: longer offered and current NVIDIA drivers and CUDA 12 no longer support Kepler GPUs; p3: VOLTA.
RETIRED: dict[str, tuple[str, str]] = {
    "g2.2xlarge": ("retired by AWS (NVIDIA GRID K520, Kepler: unsupported by current drivers and CUDA)", "g4dn.xlarge"),
    "g2.8xlarge": ("retired by AWS (4x NVIDIA GRID K520, Kepler: unsupported by current drivers and CUDA)", "g4dn.12xlarge"),
    "p2.xlarge": ("retired by AWS (NVIDIA K80, Kepler: unsupported by current drivers and CUDA)", "g4dn.xlarge"),
    "p3.2xlarge": (f"no longer offered by ec2gpu ({VOLTA})", "g5.xlarge"),
    "p3.8xlarge": (f"no longer offered by ec2gpu (4x {VOLTA})", "g5.12xlarge"),
    "p3.16xlarge": (f"no longer offered by ec2gpu (8x {VOLTA})", "g5.48xlarge"),
}
#: GPU models of the retired types only (the `--gpu` of `ec2gpu prices` and a task's resources.gpu
#: still name them, to be told why)
RETIRED_GPUS = {"K520": "g2", "K80": "p2", "V100": "p3"}


def lookup(name: str) -> InstanceType:
    """Return the catalog entry for ``name``.

    Raises RetiredInstanceType for g2/p2/p3 (with why and the replacement) and UsageError for an
    unknown or non-GPU type.
    """
    name = name.strip().lower()
    if name in RETIRED:
        why, instead = RETIRED[name]
        raise RetiredInstanceType(f"{name} is {why}", f"use --instance-type {instead}")
    if name in CATALOG:
        return CATALOG[name]
    family = name.split(".")[0]
    known = sorted({t.family for t in CATALOG.values()})
    if "." in name and family not in known and family[:1] not in ("g", "p"):
        raise UsageError(f"{name} has no NVIDIA GPU", f"choose a GPU instance type, e.g. g4dn.xlarge ({', '.join(known)})")
    raise UsageError(f"unknown GPU instance type {name!r}",
                     f"known families: {', '.join(known)}; e.g. g4dn.xlarge (T4), g5.xlarge (A10G), g6.xlarge (L4)")


def refuse_retired_gpu(gpu: str) -> None:
    """Raise RetiredInstanceType when ``gpu`` (a GPU model and count, e.g. "V100:4") is only on
    retired types, saying why and what to ask for instead; return otherwise."""
    model, _, count = gpu.strip().upper().partition(":")
    family = RETIRED_GPUS.get(model)
    if family:
        why, instead = next(r for n, r in RETIRED.items() if n.startswith(family + "."))
        raise RetiredInstanceType(f"{model} GPUs are on {family} instances only, {why}",
                                  f"ask for gpu: {CATALOG[instead].gpu}{':' + count if count else ''} instead")


@dataclass(frozen=True)
class Price:
    """An hourly price and where it came from. ``usd_per_hour`` is None when unknown."""

    usd_per_hour: float | None
    source: str


def price_cache_path(home: Path, region: str) -> Path:
    """Where ``ec2gpu prices --refresh`` caches a region's on-demand prices (JSON)."""
    return home / "prices" / f"{region}.json"


def read_price_cache(home: Path | None, region: str) -> dict | None:
    """The cached Price List result for ``region``: {"fetched_at", "source", "prices": {type: USD/h}}."""
    if home is None:
        return None
    path = price_cache_path(home, region)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def on_demand_price(name: str, region: str, home: Path | None = None) -> Price:
    """USD/h of ``name`` on-demand in ``region``: the refreshed cache, else the shipped table.

    Returns Price(None, ...) when neither knows the region; raises like ``lookup`` for bad names.
    """
    itype = lookup(name)
    cache = read_price_cache(home, region)
    if cache and itype.name in cache.get("prices", {}):
        return Price(float(cache["prices"][itype.name]), f"AWS Price List API, fetched {cache['fetched_at'][:10]}")
    if region in SHIPPED_PRICE_REGIONS:
        return Price(itype.on_demand_usd_h, f"shipped table, {PRICES_AS_OF}")
    return Price(None, f"no shipped price for {region}; run `ec2gpu prices --refresh --region {region}`")


@dataclass(frozen=True)
class StoragePrice:
    """An EBS price, USD per GB-month (None when unknown), and where it came from."""

    usd_per_gb_month: float | None
    source: str


def ebs_price(kind: str, region: str, home: Path | None = None) -> StoragePrice:
    """USD per GB-month of EBS ``kind`` ("gp3" or "snapshot") in ``region``: the refreshed cache
    (``ec2gpu prices --refresh``), else the shipped table (EBS_USD_PER_GB_MONTH), else unknown."""
    cache = read_price_cache(home, region) or {}
    cached = (cache.get("storage") or {}).get(kind)
    if isinstance(cached, (int, float)) and cached > 0:
        return StoragePrice(float(cached), f"AWS Price List API, fetched {str(cache.get('fetched_at', '?'))[:10]}")
    if kind in EBS_USD_PER_GB_MONTH.get(region, {}):
        return StoragePrice(EBS_USD_PER_GB_MONTH[region][kind],
                            f"shipped table ({region}, https://aws.amazon.com/ebs/pricing/, {EBS_PRICES_AS_OF})")
    return StoragePrice(None, f"no shipped EBS price for {region}; run `ec2gpu prices --refresh --region {region}`")
