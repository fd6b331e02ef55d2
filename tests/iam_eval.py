"""A minimal evaluator of IAM's identity-policy logic, for the tests that prove what a policy allows
(tests/unit/test_detached_policy.py: a detached run's role and the permissions boundary;
tests/unit/test_user_isolation.py: two users under docs/iam-policy.json). Imported as ``iam_eval``:
pytest puts tests/ on sys.path for tests/conftest.py.

No IAM policy simulator runs offline: moto has no SimulatePrincipalPolicy, and the evaluator moto
uses for its own IAM auth mode (moto/iam/access_control.py) knows StringEquals only and lets any
other condition operator pass (moto/iam/policy_conditions.py: "If the evaluation operation is not
supported, ignore condition evaluation"), so it would allow ListBucket on any prefix. What this one
does (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html):
an explicit Deny wins, else an Allow, else refused; Action patterns case-insensitive, Resource
patterns case-sensitive, ``*`` and ``?`` wildcards; policy variables ``${key}`` (``${aws:userid}``,
``${aws:PrincipalTag/ec2gpu:user}``, ``${aws:PrincipalAccount}`` ...) from the request context, in
Resources and condition values alike, and the fixed ``${*}``, ``${?}``, ``${$}``; a statement
whose variable has no value in the request matches nothing
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html, "Policy
variables with no value"); condition operators StringEquals, StringLike, ArnLike, ArnEquals,
NumericEquals, Bool and Null, each with ``...IfExists`` (a key the request lacks then holds), several
values of one key ORed, several keys and operators ANDed, and a key the request lacks failing every
operator but Null and the IfExists ones
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html);
a permissions boundary allows only what both it and the identity policy allow
(https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html). It leaves out
what these policies do not use (NotAction, NotResource, ForAnyValue/ForAllValues, other operators:
an unknown operator fails the test rather than passing).
"""
import re

_TOKEN = re.compile(r"\$\{([^}]*)\}|(\*)|(\?)|(.)", re.DOTALL)
#: the operators known, by how they compare: wildcards or not
_STRING = {"StringEquals": False, "StringLike": True, "ArnEquals": False, "ArnLike": True}


def _pattern(text: str, context: dict, wildcards: bool) -> re.Pattern | None:
    """``text`` as a regular expression: its policy variables replaced from ``context`` (None when
    one is missing: the statement cannot match), ``*``/``?`` wildcards when ``wildcards``."""
    out = []
    for m in _TOKEN.finditer(text):
        var, star, qmark, char = m.groups()
        if var is not None:
            if var in ("*", "?", "$"):
                out.append(re.escape(var))
            elif var in context:
                out.append(re.escape(context[var]))
            else:
                return None
        elif star:
            out.append(".*" if wildcards else re.escape(star))
        elif qmark:
            out.append("." if wildcards else re.escape(qmark))
        else:
            out.append(re.escape(char))
    return re.compile("".join(out), re.DOTALL)


def matches(patterns, value: str, context: dict, *, wildcards: bool = True, ignore_case: bool = False) -> bool:
    for p in [patterns] if isinstance(patterns, str) else patterns:
        rx = _pattern(p.lower() if ignore_case else p, context, wildcards)
        if rx is not None and rx.fullmatch(value.lower() if ignore_case else value):
            return True
    return False


def condition_holds(condition: dict, context: dict) -> bool:
    for operator, keys in condition.items():
        base = operator.removesuffix("IfExists")
        for key, expected in keys.items():
            expected = [expected] if isinstance(expected, str) else expected
            present = key in context
            if base == "Null":
                (want,) = expected
                if (want == "true") != (not present):
                    return False
                continue
            if not present:
                if operator.endswith("IfExists"):
                    continue
                return False
            actual = context[key]
            if base in _STRING:
                ok = matches(expected, actual, context, wildcards=_STRING[base])
            elif base == "NumericEquals":
                ok = any(float(actual) == float(v) for v in expected)
            elif base == "Bool":
                ok = any(str(actual).lower() == str(v).lower() for v in expected)
            else:
                raise AssertionError(f"the evaluator does not know {operator}")
            if not ok:
                return False
    return True


def decide(policy: dict, action: str, resource: str, context: dict) -> str:
    """"Deny", "Allow" or "None" (no statement matched: implicitly refused)."""
    verdicts = set()
    for s in policy["Statement"]:
        if (matches(s["Action"], action, context, ignore_case=True) and matches(s["Resource"], resource, context)
                and condition_holds(s.get("Condition", {}), context)):
            verdicts.add(s["Effect"])
    return "Deny" if "Deny" in verdicts else "Allow" if "Allow" in verdicts else "None"


def allowed(policy: dict, request: tuple, boundary: dict | None = None) -> bool:
    """Whether ``request`` (action, resource ARN, request context) is allowed by ``policy``, and
    by ``boundary`` too when given."""
    action, resource, context = request
    if decide(policy, action, resource, context) != "Allow":
        return False
    return boundary is None or decide(boundary, action, resource, context) == "Allow"
