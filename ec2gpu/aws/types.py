"""Instance type facts from EC2 itself: GPUs, vCPUs, memory and placement strategies, read with
DescribeInstanceTypes (``GpuInfo``, ``VCpuInfo``, ``MemoryInfo``, ``PlacementGroupInfo``, ``InstanceStorageInfo``;
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypes.html). The
catalog's table (catalog.py) is kept as the fallback where the API cannot answer (no network, a
policy without ec2:DescribeInstanceTypes) and for prices, which the API does not give.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import botocore.exceptions

from . import catalog
from .session import Client, Item, Log
from .session import describe as describe_error

API = "DescribeInstanceTypes"
TABLE = "the catalog's table (offline fallback)"


@dataclass(frozen=True)
class Facts:
    """What the launch needs to know about one instance type; ``source`` says where it came from."""

    name: str
    gpu: str | None  # the GPU model, e.g. "A10G"; None for a type without GPUs
    gpu_count: int
    gpu_memory_gib: float  # per GPU
    vcpus: int
    memory_gib: float
    cluster_placement: bool  # may join a cluster placement group
    source: str
    # GB of instance-store NVMe (InstanceStorageInfo.TotalSizeInGB; 0 without: InstanceStorageSupported
    # false); None when not known (the catalog's table). Its data is lost on a stop:
    # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-store-lifetime.html
    instance_store_gb: int | None = None


def gpu_name(name: str | None, memory_mib: int | float) -> str | None:
    """The catalog's name for a GPU as DescribeInstanceTypes names it (pure): the API calls p4de's
    80 GB A100 "A100" like p4d's 40 GB one (GpuInfo.Gpus[].MemoryInfo.SizeInMiB 81920 against 40960);
    the catalog, like SkyPilot's AWS catalog, calls it "A100-80GB". Other names are the API's."""
    if name == "A100" and memory_mib >= 80 * 1024:
        return "A100-80GB"
    return name


def _from_api(t: Item) -> Facts:
    gpus = (t.get("GpuInfo") or {}).get("Gpus") or [{}]
    g = gpus[0]
    return Facts(t["InstanceType"], gpu_name(g.get("Name"), (g.get("MemoryInfo") or {}).get("SizeInMiB", 0)),
                 sum(x.get("Count", 0) for x in gpus if x),
                 round((g.get("MemoryInfo") or {}).get("SizeInMiB", 0) / 1024, 1),
                 t["VCpuInfo"]["DefaultVCpus"], round(t["MemoryInfo"]["SizeInMiB"] / 1024, 1),
                 "cluster" in (t.get("PlacementGroupInfo") or {}).get("SupportedStrategies", []), API,
                 int((t.get("InstanceStorageInfo") or {}).get("TotalSizeInGB") or 0)
                 if t.get("InstanceStorageSupported") else 0)


def from_table(t: catalog.InstanceType) -> Facts:
    """The catalog table's facts for ``t`` (pure); placement from the cluster families' list."""
    return Facts(t.name, t.gpu, t.gpu_count, t.gpu_memory_gib, t.vcpus, t.memory_gib, t.family in catalog.CLUSTER_FAMILIES,
                 TABLE)


#: What EC2 said about each type, per client: an instance type's facts do not change while a
#: command runs, and a run asks for them up to three times (quota, placement, the cluster).
_ANSWERED: weakref.WeakKeyDictionary[Client, dict[str, Facts]] = weakref.WeakKeyDictionary()


def describe(ec2: Client, names: list[str], log: Log = lambda msg: None) -> dict[str, Facts]:
    """Facts for ``names`` (instance type names) from DescribeInstanceTypes, one call per 100 and
    none for a type this client was already told about; a type the API does not answer for (or
    every type, when it fails: ``log`` says why) comes from the catalog's table when the table has
    it, else is left out. Never raises for an API error."""
    names = sorted(set(names))
    answered = _ANSWERED.setdefault(ec2, {})
    found: dict[str, Facts] = {n: answered[n] for n in names if n in answered}
    asked = [n for n in names if n not in answered]
    try:
        for i in range(0, len(asked), 100):
            for page in ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=asked[i:i + 100]):
                facts = {t["InstanceType"]: _from_api(t) for t in page["InstanceTypes"]}
                found.update(facts)
                answered.update(facts)
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        why = describe_error(exc) if isinstance(exc, botocore.exceptions.ClientError) else type(exc).__name__
        log(f"{API} did not answer ({why.splitlines()[0][:160]}); using {TABLE}")
    for n in names:
        if n not in found and n in catalog.CATALOG:
            found[n] = from_table(catalog.CATALOG[n])
    return found


def facts(ec2: Client, name: str, log: Log = lambda msg: None) -> Facts:
    """Facts for one catalog type (``describe``); the table's when the API leaves it out."""
    return describe(ec2, [name], log).get(name) or from_table(catalog.lookup(name))
