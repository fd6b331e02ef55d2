"""No import cycle between ec2gpu's modules, counting every import: at module level, inside functions
(which hide a cycle from Python's import machinery, not from a reader) and under ``if TYPE_CHECKING:``
(which hides it from the interpreter, not from the design): issue 29, item 9 and issue 45, item 3.
The graph is scripts/structure_figures.py's (the one that prints the figures), so the figure and the
test count the same imports. cli/'s registration is no cycle either: the command modules take the
app from cli/app.py and the helpers from cli/render.py, and cli/__init__ imports them (issue 45)."""
import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED: set[frozenset[str]] = set()  # none left


def _figures():
    spec = importlib.util.spec_from_file_location("structure_figures", ROOT / "scripts" / "structure_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graph() -> dict[str, set[str]]:
    """Module (``runs.execute.engine``) -> the package's modules it imports, every import counted."""
    figures = _figures()
    mods = figures.modules()
    out: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        out[m] = {target for target, _ in figures.imports(m, p, mods, ast.parse(p.read_text()))}
    return out


def test_no_import_cycle_counting_every_import():
    g = graph()
    # the graph sees them: a module-level import, one inside a function, one under TYPE_CHECKING
    assert "aws.types" in g["aws.placement"] and "runs.provision.resources" in g["runs.provision.pipeline"]
    assert "runs.recover.handover" in g["runs.execute.attempt"]  # inside a function
    assert "runs.job" in g["runs.options"]  # under TYPE_CHECKING
    assert [c for c in _figures().cycles(g) if frozenset(c) not in ALLOWED] == []


def test_a_cycle_is_found_when_there_is_one():
    assert _figures().cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_cycle_through_type_checking_or_a_function_is_one():
    """The import kinds the old test skipped: ``if TYPE_CHECKING:`` and an import inside a function."""
    figures = _figures()
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n"
              "def f():\n    from .c import Y\n")
    mods = {"pkg.a": Path("a.py"), "pkg.b": Path("b.py"), "pkg.c": Path("c.py")}
    assert {t for t, _ in figures.imports("pkg.a", Path("pkg/a.py"), mods, ast.parse(source))} == {"pkg.b", "pkg.c"}
