"""The scripts that measure the README's and docs' figures still run against the package: every
`from ec2gpu... import ...` they hold resolves, and so does every `alias.attr` of what they import
(`nodes.copy_log`), also in the Python source they hand to a child process as a string (issue 44.7:
scripts/bench_big_log.py imported `ec2gpu.runs.engine`, gone since runs/ was split, so
docs/security.md's big-log figure could not be measured again)."""
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


def _sources(source: str) -> list[ast.Module]:
    """``source`` parsed, and every string literal in it that parses as Python importing ec2gpu (a
    child process's source), each its own namespace."""
    tree = ast.parse(source)
    found = [tree]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "ec2gpu" in node.value:
            try:
                found += _sources(node.value)
            except SyntaxError:
                continue
    return found


def _attributes(source: str) -> list[tuple[str, str, str]]:
    """(module, name, attribute) of each ``alias.attribute`` read in ``source`` (and its embedded
    sources) where ``alias`` is bound by an ec2gpu import of that source: ``from ec2gpu.m import
    name [as alias]`` gives (ec2gpu.m, name, attribute); ``import ec2gpu.m as alias`` (ec2gpu.m, "", attribute)."""
    found = []
    for tree in _sources(source):
        bound: dict[str, tuple[str, str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ec2gpu"):
                bound.update({a.asname or a.name: (node.module or "", a.name) for a in node.names})
            elif isinstance(node, ast.Import):
                bound.update({a.asname: (a.name, "") for a in node.names if a.name.startswith("ec2gpu") and a.asname})
        found += [(*bound[n.value.id], n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                  and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name) and n.value.id in bound]
    return sorted(set(found))


def _resolve(module: str, name: str):
    """The object ``from module import name`` binds (``import module`` without a name)."""
    mod = importlib.import_module(module)
    if not name:
        return mod
    return getattr(mod, name) if hasattr(mod, name) else importlib.import_module(f"{module}.{name}")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_attribute_a_script_reads_of_an_ec2gpu_import_exists(script):
    """Review of issue 44 (round 3): the imports resolved, but `nodes.copy_log` (an attribute read
    after the import) was not checked: a function renamed or moved would pass here and fail in use."""
    missing = []
    for module, name, attr in _attributes(script.read_text()):
        try:
            if not hasattr(_resolve(module, name), attr):
                missing.append(f"{module}{'.' + name if name else ''}.{attr}")
        except ImportError as exc:
            missing.append(f"{module}: {exc}")
    assert not missing, f"{script.name}: {missing}"


def test_the_attribute_check_finds_a_missing_one_in_the_script_and_in_its_childs_source():
    child = "from ec2gpu.runs.execute import nodes as N\nN.copy_logs()\n"
    source = f"from ec2gpu.runs.execute import nodes\nnodes.copy_log\nnodes.gone = 1\nCHILD = {child!r}\n"
    assert _attributes(source) == [("ec2gpu.runs.execute", "nodes", "copy_log"),
                                   ("ec2gpu.runs.execute", "nodes", "copy_logs")]
    assert hasattr(_resolve("ec2gpu.runs.execute", "nodes"), "copy_log")
    assert not hasattr(_resolve("ec2gpu.runs.execute", "nodes"), "copy_logs")
