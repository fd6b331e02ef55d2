"""GPU instance types: GPU model and count, vCPUs, memory, on-demand price; retired types; GPU names.

Specifications: https://aws.amazon.com/ec2/instance-types/ (accelerated computing tab).
On-demand prices: USD per hour, Linux, shared tenancy, from
https://aws.amazon.com/ec2/pricing/on-demand/ as transcribed on PRICES_AS_OF for us-east-1 (the
rows added in 2026-11: from the AWS Price List API as SkyPilot's catalog lists it, PRICE_SOURCES);
the same list prices apply in us-east-2 and us-west-2 (SHIPPED_PRICE_REGIONS). For any other
region, or to replace the shipped table, ``ec2gpu prices --refresh`` fetches the AWS Price List API
(aws/pricing.py) and caches the result; ``on_demand_price`` prefers that cache.

GPU names: the catalog's (T4, A10G, L4, L40S, A100, A100-80GB, H100, H200, B200), other tools'
names for them (GPU_ALIASES), and the GPUs a task may name that ec2gpu cannot run, each with why
(NOT_SOLD, RETIRED_GPUS): ``canonical_gpu``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

#: families whose instances may join a cluster placement group (the offline fallback of
#: DescribeInstanceTypes' PlacementGroupInfo: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html)
CLUSTER_FAMILIES = ("g4dn", "g5", "g6", "g6e", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200")


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


def _t(name: str, gpu: str, count: int, gmem: int, vcpus: int, mem: float, price: float) -> InstanceType:
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
    # Added 2026-11 (NEW_TYPES_SOURCE): L40S (g6e), A100 80 GB (p4de), 1 x H100 (p5.4xlarge), H200
    # (p5en) and B200 (p6-b200). GPU memory is the datasheet's per-GPU figure, as above (the API's
    # MemoryInfo.SizeInMiB is a little less: L40S 45,776 MiB, B200 183,359 MiB).
    _t("g6e.xlarge", "L40S", 1, 48, 4, 32, 1.861),
    _t("g6e.2xlarge", "L40S", 1, 48, 8, 64, 2.24208),
    _t("g6e.4xlarge", "L40S", 1, 48, 16, 128, 3.00424),
    _t("g6e.8xlarge", "L40S", 1, 48, 32, 256, 4.52856),
    _t("g6e.12xlarge", "L40S", 4, 48, 48, 384, 10.49264),
    _t("g6e.16xlarge", "L40S", 1, 48, 64, 512, 7.57719),
    _t("g6e.24xlarge", "L40S", 4, 48, 96, 768, 15.06559),
    _t("g6e.48xlarge", "L40S", 8, 48, 192, 1536, 30.13118),
    _t("p4de.24xlarge", "A100-80GB", 8, 80, 96, 1152, 27.44705),
    _t("p5.4xlarge", "H100", 1, 80, 16, 256, 6.88),
    _t("p5en.48xlarge", "H200", 8, 141, 192, 2048, 63.296),
    _t("p6-b200.48xlarge", "B200", 8, 180, 192, 2048, 113.9328),
]}

#: Where the rows added in 2026-11 come from: SkyPilot's AWS catalog, which SkyPilot builds from the
#: AWS Price List API (us-east-1, Linux, shared tenancy, on-demand "Price" column), file
#: catalogs/v8/aws/vms.csv of https://github.com/skypilot-org/skypilot-catalog at commit
#: 00148f2af3672e2229b4f7bf8157d5a3f36e3c35, read 2026-11-24; vCPUs, memory and GPUs from the same
#: rows (DescribeInstanceTypes' GpuInfo). The same rows give the same price in us-east-2 and
#: us-west-2 (SHIPPED_PRICE_REGIONS) wherever the type is offered there (p4de is not in us-east-2).
#: The older rows were checked against it then too (g4dn.xlarge 0.526, g6.xlarge 0.8048,
#: p4d.24xlarge 21.957642, p5.48xlarge 55.04).
NEW_TYPES_SOURCE = "2026-11, AWS Price List API via SkyPilot's catalog (us-east-1, Linux on-demand)"
PRICE_SOURCES: dict[str, str] = {n: NEW_TYPES_SOURCE for n in (
    "g6e.xlarge", "g6e.2xlarge", "g6e.4xlarge", "g6e.8xlarge", "g6e.12xlarge", "g6e.16xlarge", "g6e.24xlarge",
    "g6e.48xlarge", "p4de.24xlarge", "p5.4xlarge", "p5en.48xlarge", "p6-b200.48xlarge")}

#: GPU instance types EC2 sells that have no on-demand price to run them at: the same catalog has no
#: Price for p5e.48xlarge (8 x H200) in any region: AWS sells it through EC2 Capacity Blocks for ML,
#: reserved ahead for a fixed term (https://aws.amazon.com/ec2/capacityblocks/), which ec2gpu does
#: not buy. H200 runs on p5en.48xlarge instead.
NOT_ON_DEMAND: dict[str, tuple[str, str]] = {
    "p5e.48xlarge": ("sold through EC2 Capacity Blocks for ML only (the price list has no on-demand price for it)",
                     "p5en.48xlarge"),
}

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

#: Other names for the GPUs the catalog has, upper-cased -> the catalog's name. Names are matched
#: without regard to case, as SkyPilot matches them (sky/utils/accelerator_registry.py lower-cases
#: both sides), so "A10g" is the A10G. SkyPilot calls p4de's GPU "A100-80GB" (its AWS catalog's
#: AcceleratorName); RunPod-style names add the form factor, which on EC2 is always SXM for these:
#: p4d/p4de carry A100 SXM4, p5 H100 SXM5, p5en H200 SXM (https://aws.amazon.com/ec2/instance-types/p5/,
#: .../p4/).
GPU_ALIASES: dict[str, str] = {
    "A100-40GB": "A100", "A100-SXM4-40GB": "A100",
    "A100-80GB-SXM": "A100-80GB", "A100-SXM4-80GB": "A100-80GB",
    "H100-SXM": "H100", "H100-SXM5": "H100", "H100-80GB": "H100",
    "H200-SXM": "H200", "H200-141GB": "H200",
}

_AMD = ("AMD Instinct: EC2 sells no instance with it (its AMD GPUs are g4ad's Radeon Pro V520)", None)
_NEURON = ("an AWS chip (inf1, inf2, trn1, trn2 instances) programmed with the Neuron SDK, not CUDA; "
           "ec2gpu runs NVIDIA GPU instances", None)
_NOT_DLAMI = ("sold by EC2 (p6-b300, p6e-gb200), but on instances the Ubuntu 24.04 PyTorch DLAMI does not list "
              "as supported (the comment on VOLTA), so ec2gpu does not offer it", "B200")
#: GPUs a task may name that EC2 does not sell, or sells only on instances ec2gpu does not run,
#: upper-cased -> (why, the catalog GPU to ask for instead: the closest in memory, or None). A task
#: asking for one is refused saying why; in a list of candidates it is skipped for the next one
#: (tasks/resolve.py). Names as SkyPilot's `sky show-gpus -a` lists them (docs.skypilot.co,
#: "GPUs and Accelerators") and as other providers spell them.
NOT_SOLD: dict[str, tuple[str, str | None]] = {
    # GCP's a3-megagpu-8g: 8 x H100 whose multi-node jobs use GCP's GPUDirect-TCPXO NCCL plugin; the
    # part is EC2's p5.48xlarge's, with EFA instead, so the task's network setup would not carry over.
    "H100-MEGA": ("GCP's a3-megagpu-8g (8 x H100 with GCP's GPUDirect-TCPXO networking, which its NCCL setup "
                  "needs); EC2's 8 x H100 is p5.48xlarge, with EFA", "H100"),
    "A10": ("the A10 is Azure's and Lambda's; EC2 sells its variant, the A10G (g5)", "A10G"),
    "L40": ("EC2 sells the L40S (g6e), not the L40", "L40S"),
    "A40": ("a card EC2 does not sell", "L40S"),
    "A6000": ("a workstation card EC2 does not sell", "L40S"),
    "RTXA6000": ("a workstation card EC2 does not sell", "L40S"),
    "RTX6000": ("a workstation card EC2 does not sell", "L40S"),
    "A5000": ("a workstation card EC2 does not sell", "A10G"),
    "A4000": ("a workstation card EC2 does not sell", "T4"),
    "RTX4090": ("a consumer card EC2 does not sell", "L4"),
    "RTX3090": ("a consumer card EC2 does not sell", "L4"),
    "RTX3080": ("a consumer card EC2 does not sell", "T4"),
    "P100": ("a Pascal card EC2 does not sell", "T4"),
    "P4": ("a Pascal card EC2 does not sell", "T4"),
    "GH200": ("NVIDIA Grace Hopper (an arm64 CPU with an H100): no EC2 instance type has it", "H100"),
    "T4G": ("g5g's: a T4G beside a Graviton (arm64) CPU, and ec2gpu's images are x86_64", "T4"),
    "M60": ("g3's (Maxwell, 2015): not offered by ec2gpu", "T4"),
    "V100-32GB": (f"p3dn.24xlarge's: {VOLTA}", "L40S"),
    "RADEON PRO V520": ("g4ad's AMD GPU: no CUDA", None),
    "GAUDI HL-205": ("dl1's Habana Gaudi: no CUDA", None),
    "B300": _NOT_DLAMI, "GB200": _NOT_DLAMI,
    **{k: _AMD for k in ("MI300", "MI300X", "MI325X", "MI250", "MI250X", "MI210", "MI100")},
    **{k: _NEURON for k in ("INFERENTIA", "INFERENTIA2", "TRAINIUM", "TRAINIUM2")},
}


def lookup(name: str) -> InstanceType:
    """Return the catalog entry for ``name``.

    Raises RetiredInstanceType for g2/p2/p3 (with why and the replacement) and UsageError for a
    type without an on-demand price (NOT_ON_DEMAND) and for an unknown or non-GPU type.
    """
    name = name.strip().lower()
    if name in RETIRED:
        why, instead = RETIRED[name]
        raise RetiredInstanceType(f"{name} is {why}", f"use --instance-type {instead}")
    if name in NOT_ON_DEMAND:
        why, instead = NOT_ON_DEMAND[name]
        raise UsageError(f"{name} is {why}", f"use --instance-type {instead}")
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


def gpus() -> list[str]:
    """The catalog's GPU models, cheapest instance type first: ['T4', 'L4', 'A10G', ...] (pure)."""
    return list(dict.fromkeys(t.gpu for t in sorted(CATALOG.values(), key=lambda t: (t.on_demand_usd_h, t.name))))


def _compact(name: str) -> str:
    """``name`` upper-cased without spaces, '-' or '_' ('RTX 4090', 'rtx-4090' -> 'RTX4090') (pure)."""
    return "".join(c for c in name.upper() if c not in " -_")


def canonical_gpu(name: str, count: int | None = None) -> str:
    """The catalog's name for the GPU ``name`` (pure): matched without regard to case, spaces, '-'
    or '_', through GPU_ALIASES ('a10g' -> 'A10G', 'H100-SXM' -> 'H100', 'A100-80GB-SXM' -> 'A100-80GB').

    Raises UsageError saying why for a GPU in NOT_SOLD or a TPU (hint: what to ask for instead),
    RetiredInstanceType for one only on retired types (V100, K80, K520: refuse_retired_gpu), and
    UsageError naming the catalog's GPUs for any other name. ``count`` (GPUs per node) goes into the
    hint's suggestion ("ask for H100:8 instead").
    """
    key = _compact(name)
    known = {_compact(g): g for g in gpus()} | {_compact(a): g for a, g in GPU_ALIASES.items()}
    if key in known:
        return known[key]
    refuse_retired_gpu(key)
    not_sold = {_compact(k): v for k, v in NOT_SOLD.items()}
    if key in not_sold:
        why, instead = not_sold[key]
        raise UsageError(f"{name} is not a GPU ec2gpu can run: {why}",
                         f"ask for {instead}{f':{count}' if count else ''} instead" if instead
                         else f"GPUs EC2 sells: {', '.join(gpus())}")
    if key.startswith("TPU"):
        raise UsageError(f"{name} is a Google Cloud TPU: EC2 has none", f"GPUs EC2 sells: {', '.join(gpus())}")
    raise UsageError(f"{name!r} is not a GPU EC2 sells", f"GPUs EC2 sells, by ec2gpu's names: {', '.join(gpus())}")


def offers(gpu: str) -> list[InstanceType]:
    """The catalog's types with the GPU ``gpu`` (its catalog name), cheapest first (pure)."""
    return sorted((t for t in CATALOG.values() if t.gpu == gpu), key=lambda t: (t.on_demand_usd_h, t.name))


@dataclass(frozen=True)
class Price:
    """An hourly price and where it came from. ``usd_per_hour`` is None when unknown."""

    usd_per_hour: float | None
    source: str


def price_cache_path(home: Path, region: str) -> Path:
    """Where ``ec2gpu prices --refresh`` caches a region's on-demand prices (JSON)."""
    return home / "prices" / f"{region}.json"


def read_price_cache(home: Path | None, region: str) -> dict[str, Any] | None:
    """The cached Price List result for ``region``: {"fetched_at", "source", "prices": {type: USD/h}}."""
    if home is None:
        return None
    path = price_cache_path(home, region)
    try:
        cache: dict[str, Any] = json.loads(path.read_text())
        return cache
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
        return Price(itype.on_demand_usd_h, f"shipped table, {PRICE_SOURCES.get(itype.name, PRICES_AS_OF)}")
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
