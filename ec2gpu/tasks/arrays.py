"""Arrays and sweeps: a task's ``run`` once per index (pure; the pool that runs them is ec2gpu/pool/).

An array of size N runs the task's ``run`` N times, element k with ``EC2GPU_ARRAY_INDEX=k`` and
``EC2GPU_ARRAY_SIZE=N``: AWS Batch's array jobs (``AWS_BATCH_JOB_ARRAY_INDEX``, sizes 2 to 10,000:
https://docs.aws.amazon.com/batch/latest/userguide/array_jobs.html). A sweep (a grid of
parameter lists, or a list of parameter sets) is an array whose element k also gets the k-th
parameter set as environment variables.

The grammar of ``--array`` and of a task's ``array:`` (docs/pool.md):
``100`` is 100 elements, indices 0..99; ``0-99`` the same; ``3,7,12`` those indices (a rerun of
some); ``0-9,20`` both. A selection keeps the array's size: ``--array 3,7`` of a sweep of 12
gives EC2GPU_ARRAY_SIZE=12.
"""
from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

from ..errors import UsageError

#: the most elements of one array: AWS Batch's limit (array_jobs.html: "between 2 and 10,000")
MAX_ELEMENTS = 10_000
MAX_PARAMS = 32  # parameters of one sweep element
MAX_VALUE_CHARS = 1024  # one parameter value, as the environment variable's text
#: names an element's parameters may not take: ours and SkyPilot's, set by the pool
RESERVED_PREFIXES = ("EC2GPU_", "SKYPILOT_", "AWS_", "CUDA_VISIBLE_DEVICES", "RAY_")
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PART = re.compile(r"\s*(\d{1,6})\s*(?:-\s*(\d{1,6})\s*)?")

Scalar = Union[bool, int, float, str]


@dataclass(frozen=True)
class Element:
    """One element of an array: its ``index`` (0-based), the array's ``size``, and its sweep
    parameters (name -> the environment variable's text; empty for a plain array)."""

    index: int
    size: int
    params: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()  # more arguments of the run script ("$@"): the built-in trainer's flags

    def with_flags(self) -> Element:
        """This element with its parameters also given as flags (``--lr 0.1``; ``batch_size`` as
        ``--batch-size``): how the built-in trainer takes a sweep (pure)."""
        flags = tuple(x for k, v in self.params.items() for x in (f"--{k.replace('_', '-')}", v))
        return Element(self.index, self.size, self.params, self.args + flags)

    def env(self) -> dict[str, str]:
        """The element's own environment variables (pure): its parameters, then its index and size."""
        return {**self.params, "EC2GPU_ARRAY_INDEX": str(self.index), "EC2GPU_ARRAY_SIZE": str(self.size)}

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "size": self.size, "params": dict(self.params), "args": list(self.args)}


def parse_array(spec: Union[int, str]) -> tuple[list[int] | None, int]:
    """``--array``'s or ``array:``'s value -> (the indices selected, or None for all; the size it
    implies, 0 when it names indices only). ``100`` -> (None, 100); ``0-99`` -> (0..99, 100);
    ``3,7,12`` -> ([3, 7, 12], 13). Raises ValueError with what is wrong (an empty part, a range
    that runs backwards, more than MAX_ELEMENTS, a size below 1)."""
    if isinstance(spec, bool):
        raise ValueError("give a count (100) or indices (0-99, 3,7,12), not true/false")
    if isinstance(spec, int):
        if not 1 <= spec <= MAX_ELEMENTS:
            raise ValueError(f"{spec}: an array has 1 to {MAX_ELEMENTS:,} elements")
        return None, spec
    text = str(spec).strip()
    if re.fullmatch(r"\d{1,6}", text):
        return parse_array(int(text))
    picked: set[int] = set()
    for part in text.split(","):
        m = _PART.fullmatch(part)
        if not m:
            raise ValueError(f"{part.strip()!r} in {text!r} is not an index or a range: give 100, 0-99 or 3,7,12")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            raise ValueError(f"{lo}-{hi} runs backwards: give {hi}-{lo}")
        if hi >= MAX_ELEMENTS:
            raise ValueError(f"index {hi}: indices run 0 to {MAX_ELEMENTS - 1:,}")
        picked.update(range(lo, hi + 1))
    indices = sorted(picked)
    return indices, indices[-1] + 1


def _text(value: Any, where: str) -> str:
    """A parameter value as its environment variable's text (pure): true/false, numbers as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, (int, float, str)):
        raise ValueError(f"{where}: {type(value).__name__} is not a value a parameter takes (a number, a string, "
                         "true or false)")
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) > MAX_VALUE_CHARS or "\0" in text:
        raise ValueError(f"{where}: a value is at most {MAX_VALUE_CHARS} characters, without NUL")
    return text


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not PARAM_NAME_RE.fullmatch(name):
        raise ValueError(f"{name!r} is not a parameter name: it becomes an environment variable (letters, digits, _)")
    if name.upper().startswith(RESERVED_PREFIXES):
        raise ValueError(f"{name!r}: names starting {', '.join(RESERVED_PREFIXES)} are set by ec2gpu")
    return name


def sweep_sets(sweep: Union[Mapping[str, Sequence[Scalar]], Sequence[Mapping[str, Scalar]]]) -> list[dict[str, str]]:
    """A task's ``sweep:`` -> its parameter sets in order (pure). A mapping is a grid: every
    combination of its lists, the last name varying fastest (``lr: [1e-3, 3e-4], seed: [0, 1, 2]``
    -> 6 sets); a list is taken as it is. Raises ValueError for an empty sweep, a name that is not
    an environment variable name or is one of ours, a value that is not a scalar, more than
    MAX_ELEMENTS sets."""
    if isinstance(sweep, Mapping):
        if not sweep:
            raise ValueError("an empty sweep: give at least one parameter and its values")
        names = [_check_name(n) for n in sweep]
        lists = []
        for n in names:
            values = sweep[n]
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise ValueError(f"sweep.{n}: give a list of values, e.g. {n}: [1, 2]")
            lists.append([_text(v, f"sweep.{n}") for v in values])
        count = 1
        for values_ in lists:
            count *= len(values_)
        if count > MAX_ELEMENTS:
            raise ValueError(f"the grid has {count:,} combinations: at most {MAX_ELEMENTS:,}")
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*lists)]
    if not isinstance(sweep, list) or not sweep:  # YAML's sequences are lists
        raise ValueError("give a mapping of lists (a grid) or a list of parameter sets")
    if len(sweep) > MAX_ELEMENTS:
        raise ValueError(f"{len(sweep):,} parameter sets: at most {MAX_ELEMENTS:,}")
    sets = []
    for k, one in enumerate(sweep):
        if not isinstance(one, Mapping) or not one:
            raise ValueError(f"sweep[{k}]: give a mapping of parameter names to values")
        if len(one) > MAX_PARAMS:
            raise ValueError(f"sweep[{k}]: at most {MAX_PARAMS} parameters")
        sets.append({_check_name(n): _text(v, f"sweep[{k}].{n}") for n, v in one.items()})
    return sets


def elements(array: Union[int, str, None], sweep: Any = None, flag: Union[int, str, None] = None) -> list[Element]:
    """The elements to run (pure): the task's ``array`` and ``sweep``, then the ``--array`` flag,
    which wins over ``array:`` (a selection, to rerun some). [] when neither the task nor the flag
    asks for an array. Raises ValueError: a selection past the array's end, or an ``array`` size
    other than the sweep's."""
    sets = sweep_sets(sweep) if sweep is not None else None
    chosen = flag if flag is not None else array
    if chosen is None and sets is None:
        return []
    picked, implied = parse_array(chosen) if chosen is not None else (None, 0)
    if sets is not None:
        size = len(sets)
        if picked is None and implied != size and chosen is not None:
            raise ValueError(f"array {implied} but the sweep has {size} parameter sets: drop array:, or select "
                             f"indices (0-{size - 1})")
    else:
        size = implied if array is None or flag is None else max(implied, parse_array(array)[1])
    indices = picked if picked is not None else list(range(size))
    late = [i for i in indices if i >= size]
    if late:
        raise ValueError(f"index {late[0]} is past the array's end (size {size}: indices 0-{size - 1})")
    return [Element(i, size, sets[i] if sets is not None else {}) for i in indices]


def describe(elements_: Sequence[Element]) -> str:
    """``12 elements (0-11)`` / ``3 of 100 elements (3, 7, 12)`` (pure), for the plan and the notes."""
    if not elements_:
        return "no array"
    size, idx = elements_[0].size, [e.index for e in elements_]
    shown = f"{idx[0]}-{idx[-1]}" if idx == list(range(idx[0], idx[-1] + 1)) else ", ".join(map(str, idx[:8])) + (
        ", ..." if len(idx) > 8 else "")
    return (f"{len(idx)} element{'s' if len(idx) != 1 else ''} ({shown})" if len(idx) == size else
            f"{len(idx)} of {size} elements ({shown})")


#: the ranges of the pool's flags (and the task's fields): --workers, --gpus-per-job, --max-retries
FLAG_RANGES = {"--workers": (1, 64, "e.g. --workers 3"), "--gpus-per-job": (1, 64, "e.g. --gpus-per-job 1"),
               "--max-retries": (0, 10, "e.g. --max-retries 2")}


def check_flags(**given: int | None) -> None:
    """Each pool flag given (``workers=``, ``gpus_per_job=``, ``max_retries=``; None: not given) in
    its range (FLAG_RANGES). Raises UsageError naming the flag, its range and an example."""
    for key, value in given.items():
        flag = "--" + key.replace("_", "-")
        low, high, example = FLAG_RANGES[flag]
        if value is not None and not low <= value <= high:
            raise UsageError(f"{flag} {value}: {low} to {high}", example)

