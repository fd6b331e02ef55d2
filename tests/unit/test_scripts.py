"""The scripts that measure the README's and docs' figures still run against the package: every
`from ec2gpu... import ...` they hold resolves, also in the Python source they hand to a child
process as a string (issue 44.7: scripts/bench_big_log.py imported `ec2gpu.runs.engine`, gone since
runs/ was split, so docs/security.md's big-log figure could not be measured again)."""
import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


def _imports(source: str) -> list[tuple[str, str]]:
    """(module, name) of each `from ec2gpu... import name` in ``source`` and in every string literal
    of it that parses as Python holding such an import."""
    found, tree = [], ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ec2gpu"):
            found += [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("ec2gpu")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                found += _imports(node.value)
            except SyntaxError:
                continue
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_ec2gpu_import_of_a_script_resolves(script):
    missing = []
    for module, name in _imports(script.read_text()):
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{module}: {exc}")
            continue
        if name and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script.name}: {missing}"
