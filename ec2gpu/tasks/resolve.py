"""From a task's resources to instance types: GPU requests with exact counts, candidate lists
(``any_of``: cheapest first; ``ordered``: in order), and how many GPUs the job may use on each type.

The rules (docs/tasks.md, "GPUs"):

- ``MODEL:N`` asks for exactly N GPUs of MODEL per node: the cheapest catalog type with exactly N.
  Where EC2 sells none (no 1 x A100 type; no 2 x L4 type) it is refused, naming what EC2 does sell
  for that GPU and the nearest types with N GPUs, unless ``resources.allow_larger``: then the
  cheapest type with more, and the job sees only N of them (runs/job.node_env sets
  CUDA_VISIBLE_DEVICES and SKYPILOT_NUM_GPUS_PER_NODE from ``gpus_asked``). SkyPilot, limited to AWS,
  finds no resources for such a request either.
- ``MODEL`` with no count (ec2gpu's own ``resources.gpu`` and ``--gpu`` only; the loader writes
  SkyPilot's ``accelerators: MODEL`` as ``MODEL:1``, SkyPilot's meaning) asks for that GPU in any
  count: the cheapest type that has it, all of its GPUs the job's.
- A candidate EC2 cannot run (a GPU it does not sell, a count no type has, a type without an
  on-demand price) is skipped for the next one, and the loader's warning names it; when none is
  left the task is refused with each candidate's reason.
- ``cpus`` and ``memory`` (SkyPilot's forms, ``Need``) choose the type together with the GPU, as
  SkyPilot's catalog does (sky/catalog/common.py, ``_filter_with_cpus``/``_filter_with_mem``, applied
  to the types with the accelerator asked): among the types the GPU request allows, the cheapest
  meeting them; none does: refused naming what that GPU's types offer. With no GPU and no type
  asked they choose among the catalog's GPU types (ec2gpu runs GPU instances only; SkyPilot would
  choose a CPU instance). With an instance type, the type must meet them (SkyPilot refuses a
  mismatch too: sky/resources.py, ``_try_validate_cpus_mem``).

Prices order the choices: the shipped table's us-east-1 on-demand list prices (aws/catalog.py, its
sources there); everything here is pure apart from reading that table.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import cast

from ..aws import catalog
from ..errors import UsageError
from .spec import Candidate, Resources, parse_cpus, parse_gpu, parse_memory

DEFAULT = "the configured default instance type"
#: SkyPilot's memory form of an accelerator request (sky/resources.py, _parse_accelerators_from_str):
#: "40GB+", "24GB:2", "nvidia:80GB+:8"
_MEMORY = re.compile(r"^[0-9]+[GgMmTt][Bb]\+?$")


@dataclass(frozen=True)
class Choice:
    """One instance type to try, and what the task asked of it."""

    instance_type: str | None  # None: the configured default (the caller's ``default``)
    asked: str  # the request as written: "A100:1", "g5.xlarge", DEFAULT
    gpus_asked: int | None = None  # GPUs per node the job is to use; None: all the type has
    larger: bool = False  # a type with more GPUs than asked, taken because of allow_larger


@dataclass
class Plan:
    """The choices in the order they are tried, and the candidates passed over (with why)."""

    choices: list[Choice]
    skipped: list[str] = field(default_factory=list)  # "H100-MEGA:8: why"

    def notes(self) -> list[str]:
        """Warnings for the user: each larger type taken and each candidate skipped (pure)."""
        out = []
        for c in self.choices:
            if c.larger:
                assert c.instance_type is not None and c.gpus_asked is not None  # choose names both for a larger one
                t = catalog.CATALOG[c.instance_type]
                out.append(f"{c.asked}: no EC2 instance type has exactly {c.gpus_asked} x {t.gpu}; allow_larger: "
                           f"{t.name} ({t.gpu_count} x {t.gpu}, {_usd(t)} for the whole instance), the job sees "
                           f"{c.gpus_asked}: CUDA_VISIBLE_DEVICES={visible_devices(c.gpus_asked)}, "
                           f"SKYPILOT_NUM_GPUS_PER_NODE={c.gpus_asked}")
        if self.skipped:
            out.append("candidates skipped (EC2 cannot run them): " + "; ".join(self.skipped))
        return out


def visible_devices(n: int) -> str:
    """CUDA_VISIBLE_DEVICES for the first ``n`` GPUs: 3 -> '0,1,2' (pure)."""
    return ",".join(str(i) for i in range(n))


def memory_request(text: str) -> list[str] | None:
    """SkyPilot's memory form of an accelerator request -> the catalog GPUs that fit, as 'MODEL:N'
    requests, or None when ``text`` is not that form (pure). '24GB' -> ['L4:1', 'A10G:1'];
    '80GB+:8' -> every GPU with 80 GB or more, 8 of them; 'nvidia:40GB+:1'; another maker -> [].
    GB as the catalog's per-GPU memory (datasheet GB), T = 1024 G, M = 1/1024 G."""
    parts = str(text).strip().split(":")
    maker = count = None
    if len(parts) == 3 and _MEMORY.fullmatch(parts[1]):
        maker, memory, count = parts
    elif len(parts) == 2 and _MEMORY.fullmatch(parts[0]):
        memory, count = parts
    elif len(parts) == 2 and _MEMORY.fullmatch(parts[1]):
        maker, memory = parts
    elif len(parts) == 1 and _MEMORY.fullmatch(parts[0]):
        memory = parts[0]
    else:
        return None
    plus = memory.endswith("+")
    size = int(memory.rstrip("+")[:-2]) * {"G": 1, "T": 1024, "M": 1 / 1024}[memory.rstrip("+")[-2].upper()]
    if maker is not None and maker.strip().lower() != "nvidia":
        return []
    fit = [g for g in catalog.gpus() if (catalog.offers(g)[0].gpu_memory_gib >= size if plus
                                         else catalog.offers(g)[0].gpu_memory_gib == size)]
    return [f"{g}:{(count or '1').strip()}" for g in fit]


_MEMORY_SUFFIX = {"plus": "+", "x": "x", "exact": ""}


def _n(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Need:
    """What a task asks of each node besides its GPUs: vCPUs and memory (GiB), SkyPilot's way."""

    cpus: float | None = None
    cpus_at_least: bool = False
    memory_gib: float | None = None
    memory_kind: str = "exact"  # "exact" | "plus" (at least) | "x" (at least that many GiB per vCPU)

    def fits(self, t: catalog.InstanceType) -> bool:
        """Whether the type ``t`` meets this need (pure)."""
        if self.cpus is not None and not (t.vcpus >= self.cpus if self.cpus_at_least else t.vcpus == self.cpus):
            return False
        if self.memory_gib is None:
            return True
        if self.memory_kind == "plus":
            return t.memory_gib >= self.memory_gib
        if self.memory_kind == "x":
            return t.memory_gib >= t.vcpus * self.memory_gib
        return t.memory_gib == self.memory_gib

    def words(self) -> str:
        """'cpus: 8+, memory: 64+' as the task wrote it, in GiB (pure)."""
        out = []
        if self.cpus is not None:
            out.append(f"cpus: {_n(self.cpus)}{'+' * self.cpus_at_least}")
        if self.memory_gib is not None:
            out.append(f"memory: {_n(self.memory_gib)}{_MEMORY_SUFFIX[self.memory_kind]}")
        return ", ".join(out)

    def meaning(self) -> str:
        """'at least 8 vCPUs and exactly 64 GiB of memory' (pure)."""
        out = []
        if self.cpus is not None:
            out.append(f"{'at least' if self.cpus_at_least else 'exactly'} {_n(self.cpus)} vCPU"
                       + "s" * (self.cpus != 1))
        if self.memory_gib is not None:
            out.append({"plus": f"at least {_n(self.memory_gib)} GiB of memory",
                        "x": f"at least {_n(self.memory_gib)} GiB of memory per vCPU",
                        "exact": f"exactly {_n(self.memory_gib)} GiB of memory"}[self.memory_kind])
        return " and ".join(out)


def need_of(resources: object) -> Need | None:
    """The Need of ``resources`` (a spec.Resources, or anything with ``cpus``/``memory``), None when
    it asks for neither (pure). Raises ValueError for a malformed value."""
    cpus, memory = getattr(resources, "cpus", None), getattr(resources, "memory", None)
    if cpus is None and memory is None:
        return None
    c, plus = parse_cpus(cpus) if cpus is not None else (None, False)
    m, kind = parse_memory(memory) if memory is not None else (None, "exact")
    return Need(c, plus, m, kind)


def _sizes(types: list[catalog.InstanceType], most: int = 6) -> str:
    """'g4dn.xlarge 4 vCPUs 16 GiB 0.53 USD/h, ...' for at most ``most`` types, cheapest first (pure)."""
    shown = [f"{t.name} {t.vcpus} vCPUs {_n(t.memory_gib)} GiB {_usd(t)}" for t in types[:most]]
    return ", ".join(shown) + (f" and {len(types) - most} more" if len(types) > most else "")


def _no_fit(what: str, types: list[catalog.InstanceType], need: Need) -> UsageError:
    """The refusal when none of ``types`` (``what``: '1 x T4', "ec2gpu's GPU types") meets ``need``."""
    types = sorted(types, key=lambda t: (t.on_demand_usd_h, t.name))
    vcpus = sorted({t.vcpus for t in types})
    memory = sorted({t.memory_gib for t in types})
    return UsageError(f"no EC2 instance type with {what} has {need.words()} ({need.meaning()}): they offer "
                      f"{_n(vcpus[0])}-{_n(vcpus[-1])} vCPUs and {_n(memory[0])}-{_n(memory[-1])} GiB: {_sizes(types)}",
                      "write cpus: N+ or memory: N+ for at least N (cpus: N alone means exactly N, as in SkyPilot), "
                      "or ask for one of those sizes")


def _usd(t: catalog.InstanceType) -> str:
    return f"{t.on_demand_usd_h:.2f} USD/h"


def choose(gpu: str, allow_larger: bool = False, need: Need | None = None) -> Choice:
    """The instance type for the GPU request ``gpu`` ('A100:8', 'a10g:4', 'T4'): the cheapest catalog
    type with exactly the count asked, or with the GPU in any count when none is given; with
    ``allow_larger``, where no type has exactly that many, the cheapest with more; of those, only
    the types meeting ``need`` (cpus/memory) (pure).

    Raises UsageError for a malformed request, a GPU ec2gpu cannot run (catalog.canonical_gpu: why,
    and what to ask for instead), a count no type has: one line naming what EC2 sells for that
    GPU (count, type, USD/h) and the cheapest types with that many GPUs of at least its memory; and
    types with that count none of which meets ``need``: one line naming their vCPUs and memory.
    """
    try:
        model, count = parse_gpu(gpu)
    except ValueError as exc:
        raise UsageError(str(exc), "e.g. T4, A10G:4, H100:8")
    if count is not None:
        catalog.refuse_retired_gpu(f"{model}:{count}")  # V100, K80: why, and what to ask for with that count
    name = catalog.canonical_gpu(model, count)
    offers = catalog.offers(name)
    fits = (lambda t: True) if need is None else need.fits
    if count is None:
        fit = [t for t in offers if fits(t)]
        if not fit:
            raise _no_fit(name, offers, cast(Need, need))  # need None fits every type
        return Choice(fit[0].name, gpu)
    exact = [t for t in offers if t.gpu_count == count]
    if exact:
        fit = [t for t in exact if fits(t)]
        if not fit:
            raise _no_fit(f"{count} x {name}", exact, cast(Need, need))
        return Choice(fit[0].name, gpu, count)
    more = [t for t in offers if t.gpu_count > count]
    if allow_larger and more:
        fit = [t for t in more if fits(t)]
        if not fit:
            raise _no_fit(f"more than {count} x {name}", more, cast(Need, need))
        return Choice(fit[0].name, gpu, count, larger=True)
    raise UsageError(_no_exact(name, count, offers), _no_exact_hint(name, count, offers, more))


def _no_exact(name: str, count: int, offers: list[catalog.InstanceType]) -> str:
    """'no EC2 instance type has exactly 1 x A100: AWS sells A100 as 8 x A100 (p4d.24xlarge, 21.96
    USD/h); with exactly 1 GPU of at least 40 GiB: L40S ...' (pure)."""
    cheapest: dict[int, catalog.InstanceType] = {}
    for t in offers:
        cheapest.setdefault(t.gpu_count, t)
    sold = ", ".join(f"{n} x {name} ({t.name}, {_usd(t)})" for n, t in sorted(cheapest.items()))
    near = _nearest(name, count)
    gpus = f"{count} GPU{'s' * (count > 1)}"
    memory = offers[0].gpu_memory_gib
    if not near:
        alternatives = f"no EC2 GPU type has exactly {gpus}"
    elif near[0].gpu_memory_gib >= memory:
        alternatives = f"with exactly {gpus} of at least {memory} GiB: " + _listed(near)
    else:
        alternatives = (f"none with exactly {gpus} has {memory} GiB or more; the most memory with {gpus}: "
                        + _listed(near))
    return f"no EC2 instance type has exactly {count} x {name}: AWS sells {name} as {sold}; {alternatives}"


def _nearest(name: str, count: int) -> list[catalog.InstanceType]:
    """The cheapest type of each other GPU with exactly ``count`` GPUs, at most 3: those with at
    least ``name``'s memory per GPU, cheapest first; where none has, the most memory first (pure)."""
    memory = catalog.offers(name)[0].gpu_memory_gib
    best: dict[str, catalog.InstanceType] = {}
    for t in sorted(catalog.CATALOG.values(), key=lambda t: (t.on_demand_usd_h, t.name)):
        if t.gpu_count == count and t.gpu != name:
            best.setdefault(t.gpu, t)
    enough = [t for t in best.values() if t.gpu_memory_gib >= memory]
    return enough[:3] if enough else sorted(best.values(), key=lambda t: -t.gpu_memory_gib)[:2]


def _listed(types: list[catalog.InstanceType]) -> str:
    return ", ".join(f"{t.gpu} {t.gpu_memory_gib} GiB ({t.name}, {_usd(t)})" for t in types)


def _no_exact_hint(name: str, count: int, offers: list[catalog.InstanceType], more: list[catalog.InstanceType]) -> str:
    counts = sorted({t.gpu_count for t in offers})
    if not more:
        nodes = math.ceil(count / counts[-1])
        return (f"one instance has at most {counts[-1]} x {name}: ask for {name}:{counts[-1]} per node "
                f"with {nodes} nodes (num_nodes, or nodes in ec2gpu's format)")
    t = more[0]
    others = ", or one of those" if _nearest(name, count) else ""
    return (f"ask for {' or '.join(f'{name}:{n}' for n in counts)}{others}; or set resources.allow_larger: "
            f"true to run on {t.name} with {count} of its {t.gpu_count} GPUs visible to the job (the whole "
            f"instance is billed)")


def instance_type_for_gpu(gpu: str, allow_larger: bool = False, need: Need | None = None) -> str:
    """The instance type ``choose`` picks for ``gpu``: 'T4' -> 'g4dn.xlarge', 'A10G:4' ->
    'g5.12xlarge', 'H100:1' -> 'p5.4xlarge'; with ``need`` (cpus/memory) the cheapest meeting it
    (pure). Raises as ``choose`` does."""
    return cast(str, choose(gpu, allow_larger, need).instance_type)  # choose always names a type


def _entries(resources: Resources) -> tuple[str, list[Candidate | None]]:
    """("ordered" | "any_of" | "", the candidates): the resources themselves are the one candidate
    when they list none."""
    if resources.ordered:
        return "ordered", list(resources.ordered)
    if resources.any_of:
        return "any_of", list(resources.any_of)
    return "", [None]


def _need(resources: Resources) -> Need | None:
    try:
        return need_of(resources)
    except ValueError as exc:  # the model checks these first; a caller's own object may not have
        raise UsageError(str(exc), "e.g. cpus: 8+, memory: 32+")


def _check_type(name: str, need: Need | None) -> None:
    """Refuse (UsageError) the type ``name`` as catalog.lookup does (no NVIDIA GPU, unknown,
    retired: before anything is created, as `run` would at launch), and a catalog type that does
    not meet ``need``."""
    catalog.lookup(name)
    t = catalog.CATALOG.get(name.strip().lower())
    if need is not None and t is not None and not need.fits(t):
        raise UsageError(f"{t.name} has {t.vcpus} vCPUs and {_n(t.memory_gib)} GiB, not {need.words()} "
                         f"({need.meaning()})", "drop instance_type to let cpus/memory choose the type, or change "
                         "cpus/memory (SkyPilot refuses this mismatch too)")


def by_need(need: Need) -> Choice:
    """With no GPU and no type asked: the cheapest catalog GPU type meeting ``need`` (pure); ec2gpu
    runs GPU instances only, where SkyPilot would choose a CPU instance. Raises UsageError naming
    what the catalog's types offer when none meets it."""
    types = sorted(catalog.CATALOG.values(), key=lambda t: (t.on_demand_usd_h, t.name))
    fit = [t for t in types if need.fits(t)]
    if not fit:
        raise _no_fit("a GPU in ec2gpu's catalog", types, need)
    return Choice(fit[0].name, need.words())


def _base(resources: Resources) -> list[Choice]:
    """The choices of the resources' own fields: ``instance_type`` (one or a list, as given), else
    ``gpu``, else the cheapest catalog type meeting ``cpus``/``memory``, else the configured default."""
    need = _need(resources)
    if resources.instance_types:
        for t in resources.instance_types:
            _check_type(t, need)
        return [Choice(t.strip(), t.strip()) for t in resources.instance_types]
    if resources.gpu:
        return [choose(resources.gpu, resources.allow_larger, need)]
    if need is not None:
        return [by_need(need)]
    return [Choice(None, DEFAULT)]


def _entry(entry: Candidate | None, resources: Resources) -> list[Choice]:
    """The choices of one candidate: its instance type (which must be a catalog type with an
    on-demand price), else its GPU request, else the resources' own fields."""
    if entry is None:
        return _base(resources)
    if entry.instance_type:
        name = entry.instance_type.strip()
        catalog.lookup(name)
        _check_type(name, _need(resources))
        return [Choice(name, name)]
    if entry.gpu:
        return [choose(entry.gpu, resources.allow_larger, _need(resources))]
    return _base(resources)


def _price(choice: Choice) -> float:
    t = catalog.CATALOG.get(choice.instance_type or "")
    return t.on_demand_usd_h if t else math.inf


def plan(resources: Resources) -> Plan:
    """The instance types ``resources`` (a spec.Resources) ask for, in the order to try them:
    ``ordered`` candidates in order; ``any_of`` candidates cheapest first (us-east-1 list price; the
    configured default, whose price is not known here, last); else the resources' own
    ``instance_type``, ``gpu`` or the configured default. A type met twice is tried once.

    Raises UsageError: the one candidate's reason when there is one, else every candidate's.
    """
    how, entries = _entries(resources)
    choices, skipped = [], []
    for i, entry in enumerate(entries):
        try:
            choices += _entry(entry, resources)
        except UsageError as exc:
            if not how:
                raise
            assert entry is not None  # a candidate list (how) holds candidates, never None
            asked = entry.instance_type or entry.gpu or f"{how}[{i}]"
            skipped.append(f"{asked}: {exc.message}")
    if not choices:
        raise UsageError(f"no candidate in resources.{how} can run on EC2: " + "; ".join(skipped),
                         "add a candidate EC2 sells (T4, L4, A10G, L40S, A100, A100-80GB, H100, H200, B200), "
                         "or change the count of one")
    if how == "any_of":
        choices.sort(key=_price)  # stable: equal prices keep the file's order
    seen, unique = set(), []
    for c in choices:
        if c.instance_type not in seen:
            seen.add(c.instance_type)
            unique.append(c)
    return Plan(unique, skipped)


def instance_types(resources: Resources, default: str) -> list[str]:
    """The types to try, in order (``plan``), the configured ``default`` (one type, or several
    comma-separated) standing where the task asks for no GPU and no type (pure apart from the
    catalog). Raises as ``plan`` does."""
    out: list[str] = []
    for c in plan(resources).choices:
        names = [c.instance_type] if c.instance_type else [t.strip() for t in default.split(",") if t.strip()]
        out += [n for n in names if n not in out]
    return out


def gpus_asked(resources: Resources, instance_type: str | None, gpus_on_node: int) -> int | None:
    """How many of the ``gpus_on_node`` GPUs of a node of ``instance_type`` the job may use, where
    that is fewer than all (pure): only a type taken because of ``allow_larger`` has more than the
    task asked; None otherwise. Without ``instance_type`` (a caller that does not know it), the
    larger choices with ``gpus_on_node`` GPUs decide, when they agree."""
    if not getattr(resources, "allow_larger", False):
        return None
    try:
        choices = [c for c in plan(resources).choices if c.larger]
    except UsageError:
        return None
    if instance_type is not None:
        choices = [c for c in choices if c.instance_type == instance_type]
    else:
        choices = [c for c in choices if catalog.CATALOG[cast(str, c.instance_type)].gpu_count == gpus_on_node]
    asked = {cast(int, c.gpus_asked) for c in choices}  # a larger choice names its type and count (choose)
    if len(asked) == 1 and 0 < (n := asked.pop()) < gpus_on_node:
        return n
    return None
