"""The refusals a run's options get before any AWS call: each flag's range and form, and the combinations a run
cannot do.

Each is one function, called by the run's plan (runs/plan/runplan.py: `--dry-run` and the real run alike, before
any backend is opened) and again, as a guard, by the layer that runs the options (runs/provision/pipeline.py's
check_options, runs/detached/launch.check) for the operations that are not planned here (`bench`, `image bake`,
`launch`). Pure: no AWS SDK is imported, nothing is created. Each raises UsageError: one line, a hint, exit 2.
They take values, not a run's options or task: this module imports nothing of runs/ (it sits below
the options, the plan and every layer that checks).
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

from ... import words
from ...aws import catalog, network, parameters, tags
from ...errors import UsageError
from ...wire import run_spec

#: the most instances a run launches together (tasks/spec.Task.nodes' range; `--nodes` in the CLI)
MAX_NODES = 64


def at_least(value: float | None, least: float, flag: str, hint: str) -> None:
    """Raise UsageError when ``value`` is given and below ``least`` (the CLI's typer ranges, for the Python API)."""
    if value is not None and value < least:
        raise UsageError(f"{flag} {value:g} is under {least:g}", hint)


def check_nodes(nodes: int | None) -> None:
    """Raise UsageError for a --nodes given outside 1 to MAX_NODES (the CLI's range, for the Python API)."""
    if nodes is not None and not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes {nodes} is out of range", f"give 1 to {MAX_NODES}")


def instance_types(value: str) -> list[str]:
    """``value`` (--instance-type: one type, or several in order of preference, comma-separated) as
    the catalog's names, in order. Raises UsageError for an empty entry, and as catalog.lookup does
    for a type ec2gpu cannot run (unknown, retired, no NVIDIA GPU)."""
    if any(not t.strip() for t in value.split(",")):
        raise UsageError(f"--instance-type {value!r} has an empty entry",
                         "name each type, e.g. --instance-type g4dn.xlarge,g5.xlarge")
    return [catalog.lookup(t.strip()).name for t in value.split(",")]


def check_spot_fallback(value: str | None) -> None:
    """Raise UsageError for a --spot-fallback other than None or "on-demand"."""
    if value not in (None, "on-demand"):
        raise UsageError(f"--spot-fallback {value!r} is not known", "the only fallback is on-demand")


def check_max_price(max_price: float | None, spot: bool) -> None:
    """Raise UsageError for a --max-price (USD/h) on an on-demand run: only a spot request takes one."""
    if max_price is not None and not spot:
        raise UsageError("--max-price applies to spot instances only", "add --spot, or drop --max-price")


def parse_checkpoint_uri(uri: str | None) -> tuple[str, str] | None:
    """'s3://bucket/prefix' -> (bucket, prefix); None for None. Raises UsageError otherwise."""
    if not uri:
        return None
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise UsageError(f"--checkpoint-uri {uri!r} is not an S3 URI", "use s3://BUCKET/PREFIX")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix.strip("/")


def check_launch(instance_type: str, *, spot: bool, name: str | None = None, spot_fallback: str | None = None,
                 max_price: float | None = None, checkpoint_uri: str | None = None, ssh_cidr: str | None = None,
                 warn: Callable[[str], None] = lambda text: None) -> list[str]:
    """Refuse what new instances cannot be launched with (UsageError: nothing created, no ledger
    row): ``instance_type`` (checks.instance_types), the Name tag ``name``, ``spot_fallback``,
    ``checkpoint_uri``, ``ssh_cidr`` (``warn`` is told when it lets more than a /24 reach port 22:
    aws/network.check_cidr) and ``max_price`` (USD/h) without ``spot``. Returns the instance types as
    the catalog's names, in order."""
    types = instance_types(instance_type)
    if name is not None:
        tags.check_name(name)
    check_spot_fallback(spot_fallback)
    parse_checkpoint_uri(checkpoint_uri)
    if ssh_cidr:
        network.check_cidr(ssh_cidr, warn)
    check_max_price(max_price, spot)
    return types


def secret_env(env: Mapping[str, str], secrets: Iterable[str]) -> dict[str, str]:
    """The task's ``secrets`` (names) that have a value in its resolved ``env`` (pure): name ->
    value, for SSM Parameter Store. A secret left empty stays in the spec's envs: it holds nothing."""
    return {k: env[k] for k in secrets if env.get(k)}


def check_detached(*, max_runtime_minutes: int | None, max_attempts: int | None, nodes: int, keep: bool,
                   secrets: Mapping[str, str]) -> None:
    """Refuse (UsageError, nothing created) what a detached run cannot do yet or must not do. A
    detached run needs a limit (the group's deadline is the net that holds when nothing else does)
    and launches at least one instance per node (``max_attempts``: instances in all); its
    ``secrets`` (secret_env) fit SSM parameters (aws/parameters.check_values: they go there, never
    into S3); --keep means nothing to it."""
    if max_runtime_minutes is None:
        raise UsageError("--detach needs a limit: nothing would end a detached run that never finishes",
                         "give --max-runtime (e.g. 8h), or drop --detach")
    if max_attempts is not None and max_attempts < nodes:
        raise UsageError(f"--max-attempts {max_attempts} is below --nodes {nodes}: a detached run counts "
                         "every instance it launches", f"give --max-attempts {nodes} or more")
    if max_attempts is not None and max_attempts > run_spec.MAX_LAUNCHES:
        raise UsageError(f"--max-attempts {max_attempts}: a detached run launches at most {run_spec.MAX_LAUNCHES:,} "
                         "instances in all (its agent refuses more)", f"give --max-attempts {run_spec.MAX_LAUNCHES} or fewer")
    parameters.check_values(dict(secrets))
    if keep:
        raise UsageError("--keep has no meaning with --detach: the group ends when the job does", "drop --keep")


def slots_per_node(types: list[str], per_job: int | None) -> int:
    """Elements one instance of the first of ``types`` runs at once (its GPUs // GPUs per element;
    1 with ``per_job`` None: an element takes a whole instance). Raises UsageError, before anything
    is created, when ``per_job`` is more GPUs than one of ``types`` has."""
    counts = {t: catalog.lookup(t).gpu_count for t in types}
    small = [t for t, n in counts.items() if per_job and n < per_job]
    if small:
        raise UsageError(f"--gpus-per-job {per_job}: {small[0]} has {words.count(counts[small[0]], 'GPU')}",
                         f"ask for at most {counts[small[0]]}, or a type with more (--gpu A10G:{per_job})")
    return max(1, counts[types[0]] // per_job) if per_job else 1
