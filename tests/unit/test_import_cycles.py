"""No import cycle between ec2gpu's modules, counting the imports inside functions (which hide a
cycle from Python's import machinery, not from a reader): issue 29, item 9. Imports under
``if TYPE_CHECKING:`` do not count. cli/'s registration is no cycle either: the command modules take
the app from cli/app.py and the helpers from cli/render.py, and cli/__init__ imports them (issue 45)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ec2gpu"
ALLOWED: set[frozenset[str]] = set()  # none left


def _graph() -> dict[str, set[str]]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        hidden = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                  for n in ast.walk(node)}
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in hidden or not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            if node.level:
                base = pkg.split(".") if pkg else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("ec2gpu"):
                mod = node.module.removeprefix("ec2gpu").lstrip(".")
            else:
                continue
            for a in node.names:
                target = f"{mod}.{a.name}".lstrip(".") if f"{mod}.{a.name}".lstrip(".") in mods else mod
                if target in mods and target != m:
                    graph[m].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_counting_the_imports_inside_functions():
    graph = _graph()
    # the graph sees them
    assert "aws.types" in graph["aws.placement"] and "runs.provision.resources" in graph["runs.provision.pipeline"]
    assert [sorted(c) for c in _cycles(graph) if c not in ALLOWED] == []


def test_a_cycle_is_found_when_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
