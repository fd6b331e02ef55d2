"""An IAM policy document read as IAM reads it (pure): its statements, an action matched with IAM's
wildcards, a Resource pattern with its policy variables filled in.

The permissions boundary checks (iam_boundary.py) read the account's boundary with these, so that
what they say a role may do is what IAM would let it do: actions case-insensitive with ``*`` and
``?`` (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_action.html),
resources case-sensitive, ``${...}`` variables replaced
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html).
"""
from __future__ import annotations

import fnmatch
import re
from typing import Any


def statements(doc: object) -> list[dict[str, Any]]:
    """The statements of a policy document ``doc`` that are mappings (one statement, not in a list, too)."""
    got = doc.get("Statement") if isinstance(doc, dict) else None
    return [st for st in (got if isinstance(got, list) else [got]) if isinstance(st, dict)]


def listed(value: object) -> list[str]:
    """A policy element that is a string or a list of them (Action, Resource, ...), as a list of its strings."""
    if isinstance(value, str):
        return [value]
    return [a for a in value if isinstance(a, str)] if isinstance(value, list) else []


def names_action(st: dict[str, Any], action: str) -> bool:
    """Whether statement ``st`` covers ``action`` (lowercase) as IAM matches actions: ``*`` and
    ``?`` wildcards, case-insensitive; an Action names it, a NotAction covers what it does not name."""
    if "Action" in st:
        return any(fnmatch.fnmatchcase(action, a.lower()) for a in listed(st.get("Action")))
    return not any(fnmatch.fnmatchcase(action, a.lower()) for a in listed(st.get("NotAction")))


#: one piece of a Resource pattern: a policy variable ${...}, a * or ? wildcard, or any other character
_VARIABLE = re.compile(r"\$\{([^}]*)\}|(\*)|(\?)|(.)", re.DOTALL)


def arn_pattern(pattern: str, values: dict[str, str]) -> re.Pattern[str] | None:
    """A Resource pattern as IAM reads it, as a regular expression: its policy variables replaced
    from ``values`` (None when one has no value there: the pattern then matches nothing, as IAM's
    does: https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html), ``*``
    and ``?`` wildcards, case-sensitive (pure)."""
    out = []
    for m in _VARIABLE.finditer(pattern):
        var, star, qmark, char = m.groups()
        if var is not None:
            if var in ("*", "?", "$"):
                out.append(re.escape(var))
            elif var in values:
                out.append(re.escape(values[var]))
            else:
                return None
        else:
            out.append(".*" if star else "." if qmark else re.escape(char))
    return re.compile("".join(out), re.DOTALL)
