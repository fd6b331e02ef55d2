"""Where a field is in a task file: its path, its line, and the refusal that names both.

Every error about a task file says ``FILE:LINE: FIELD: what is wrong`` and a hint (docs/tasks.md).
load.py maps each field to its line as it composes the YAML (load._lines); the SkyPilot translation
(skypilot.py, infra.py) and the task's validation (load.py) refuse through ``refuse`` and
``line_of`` here, so both formats' errors read alike. Pure.
"""
from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping

from ..aws.tags import NAME_RE
from .. import errors
from ..errors import UsageError

DOCS = "see docs/tasks.md for every field"
#: a field's place in a task file, its keys and list indexes: ("resources", "any_of", 0, "gpu")
Loc = tuple[str | int, ...]
#: {field path: 1-based line} of a task file (load._lines)
Lines = dict[Loc, int]
#: {our field path: the file's (SkyPilot's)}, ("nodes",): ("num_nodes",)
Renamed = dict[tuple[str, ...], tuple[str, ...]]


#: what a field's pattern allows, in words: pydantic's own message quotes the regular expression
PATTERN_WORDS = {NAME_RE: "letters, digits, `.`, `_` and `-`, starting with a letter or a digit, "
                          "at most 63 characters"}


def in_words(err: Mapping[str, Any]) -> str:
    """errors.in_words with the task file's patterns named in words (PATTERN_WORDS) (pure)."""
    return errors.in_words(err, PATTERN_WORDS)


def line_of(lines: Lines, loc: Loc) -> int:
    """The line of the field at ``loc``, else of the nearest field holding it, else 1 (pure)."""
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def refuse(source: str, lines: Lines, loc: Loc, what: str, hint: str = DOCS) -> UsageError:
    """UsageError "SOURCE:LINE: a.b[0].c: WHAT" for the field at ``loc``."""
    name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return UsageError(f"{source}:{line_of(lines, loc)}: {name}: {what}", hint)


def names_hint(name: str | int, ours: Iterable[str], theirs: Iterable[str]) -> str:
    """The hint on an unknown field ``name``: the closest known name, then ec2gpu's and SkyPilot's
    names at that level (pure)."""
    close = difflib.get_close_matches(str(name), list(ours) + list(theirs), 1, 0.7)
    return ((f"did you mean {close[0]}? " if close else "") + f"ec2gpu's fields here: {', '.join(ours)}; "
            f"SkyPilot's (read, mapped or warned about): {', '.join(theirs)}; {DOCS}")
