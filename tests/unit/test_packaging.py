"""What pyproject.toml promises: every third-party package ec2gpu imports is declared (in the core
dependencies, or in the extra of the subpackage that imports it), a bound on each, the sandbox
without its extra is one line and exit 2, and the wheel carries LICENSE and py.typed."""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path
from typing import Mapping

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ec2gpu"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

# The subpackages that may import what only an extra installs (besides the core dependencies).
SUBPACKAGE_EXTRAS = {"train": "train", "sandbox": "sandbox", "pool": "pool"}
# Modules outside those subpackages that import an extra's package behind a check that it is
# installed (importlib.util.find_spec, a UsageError otherwise): (file, module) -> extra.
GUARDED = {("runs/provision/local.py", "torch"): "train"}


def _name(requirement: str) -> str:
    """The canonical distribution name of a requirement string ("moto[server]>=5,<6" -> "moto")."""
    return _canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(requirements: list[str]) -> set[str]:
    return {_name(r) for r in requirements}


def _imports(path: Path) -> set[str]:
    """The top-level names of the absolute imports in ``path``: module level, function-local and
    under ``if TYPE_CHECKING`` alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _third_party_imports() -> dict[tuple[str, str], str]:
    """(file relative to ec2gpu/, top-level module) for each third-party import of ec2gpu."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for module in _imports(path):
            if module not in sys.stdlib_module_names and module not in ("ec2gpu", "__future__"):
                out[(rel, module)] = module
    return out


@functools.cache
def _providers() -> Mapping[str, list[str]]:
    """{top-level module: its distributions}, read once: each call walks every installed distribution."""
    return importlib.metadata.packages_distributions()


def _distributions(module: str) -> set[str]:
    """The distributions that provide ``module`` (one not installed: assumed to be its own name)."""
    dists = _providers().get(module) or [module]
    return {_canonical(d) for d in dists}


def test_the_walk_finds_what_ec2gpu_imports():
    """The walk itself: imports at module level and inside functions (tenacity, moto) are seen."""
    found = _third_party_imports()
    assert ("aws/network.py", "cryptography") in found
    assert ("remote/ssh.py", "paramiko") in found
    assert ("sandbox/control.py", "tenacity") in found  # function-local
    assert ("sandbox/server.py", "moto") in found  # function-local
    assert not any(m in ("os", "json", "ec2gpu") for _, m in found)


def test_every_third_party_import_is_declared():
    core = _declared(PROJECT["dependencies"])
    extras = {name: _declared(reqs) for name, reqs in PROJECT["optional-dependencies"].items()}
    undeclared = []
    for (rel, module) in sorted(_third_party_imports()):
        allowed = set(core)
        top = rel.split("/")[0]
        if top in SUBPACKAGE_EXTRAS:
            allowed |= extras[SUBPACKAGE_EXTRAS[top]]
        if (rel, module) in GUARDED:
            allowed |= extras[GUARDED[(rel, module)]]
        dists = _distributions(module)
        if not dists & allowed:
            where = f"the {SUBPACKAGE_EXTRAS[top]!r} extra or " if top in SUBPACKAGE_EXTRAS else ""
            undeclared.append(f"ec2gpu/{rel} imports {module} ({', '.join(sorted(dists))}), "
                              f"not in {where}[project] dependencies")
    assert not undeclared, "\n".join(undeclared)


def test_every_requirement_is_bounded_both_ways():
    """A lower bound the code was checked with (scripts/check_lower_bounds.sh) and an upper bound
    below the next major version: CI never ran what lies beyond it."""
    reqs = PROJECT["dependencies"] + [r for extra in PROJECT["optional-dependencies"].values() for r in extra]
    loose = [r for r in reqs if ">=" not in r or "<" not in r.replace("<=", "")]
    assert not loose, f"requirements without a lower and an upper bound: {loose}"


def test_the_installed_versions_are_inside_the_bounds():
    """The bounds include what this environment (the one the tests ran in) has installed."""
    outside = []
    for req in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["sandbox"]:
        name = _name(req)
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        have = _release(version)
        for op, bound in re.findall(r"(>=|<)\s*([0-9][0-9.]*)", req):
            want = _release(bound)
            if (op == ">=" and have < want) or (op == "<" and have >= want):
                outside.append(f"{name} {version} is outside {req}")
    assert not outside, "\n".join(outside)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.match(r"[0-9]+(?:\.[0-9]+)*", version).group(0).split("."))


def test_the_sandbox_has_its_own_extra_and_the_tests_install_it():
    extras = PROJECT["optional-dependencies"]
    assert {"moto", "werkzeug"} <= _declared(extras["sandbox"])
    assert "moto" not in _declared(PROJECT["dependencies"])
    assert any("moto[server]" in r.replace(" ", "") for r in extras["sandbox"])
    install = re.search(r"pip install .*-e \"\.\[([a-z,]+)\]\"", (ROOT / "Makefile").read_text())
    assert install and {"train", "dev", "sandbox"} <= set(install.group(1).split(","))


def test_the_wheel_carries_license_and_py_typed(tmp_path):
    """A wheel built from a copy of the sources (building writes into the source tree) holds the
    MIT LICENSE, py.typed, the sandbox's bind shim source, and the dependencies and extras of pyproject.toml."""
    import shutil
    import subprocess
    import zipfile

    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src / "ec2gpu", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "dist").glob("ec2gpu-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = whl.read(metadata).decode()
        assert "ec2gpu/py.typed" in names
        assert "ec2gpu/sandbox/bindshim.c" in names  # the sandbox builds it (sandbox/bindshim.py)
        (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert whl.read(license_file).decode().startswith("MIT License")
    assert "License-Expression: MIT" in meta
    assert "Provides-Extra: sandbox" in meta and 'extra == "sandbox"' in meta
    assert "Requires-Dist: cryptography" in meta and "Requires-Dist: paramiko" in meta


@pytest.fixture
def without_moto(monkeypatch):
    """``import moto`` fails, as after `pip install ec2gpu` without the sandbox extra."""
    monkeypatch.setitem(sys.modules, "moto", None)
    with pytest.raises(ImportError):
        import moto  # noqa: F401


def test_the_sandbox_without_moto_is_a_usage_error(without_moto, tmp_path, monkeypatch):
    from ec2gpu.errors import ExitCode, UsageError
    from ec2gpu.sandbox import control

    started = []
    monkeypatch.setattr(control.subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("started"))
    with pytest.raises(UsageError) as caught:
        control.up(tmp_path / "home")
    assert caught.value.message == "the sandbox needs moto: pip install 'ec2gpu[sandbox]'"
    assert caught.value.exit_code == ExitCode.USAGE == 2
    with pytest.raises(UsageError):
        with control.session(tmp_path / "home"):  # every --sandbox run
            pass
    assert not started


def test_sandbox_up_without_moto_says_one_line_and_exits_2(without_moto, tmp_path, monkeypatch, capsys):
    from ec2gpu import cli
    from ec2gpu.sandbox import control

    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EC2GPU_DEBUG", raising=False)
    monkeypatch.setattr(control.subprocess, "Popen", lambda *a, **k: pytest.fail("the daemon was started"))
    assert cli.main(["sandbox", "up"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: the sandbox needs moto: pip install 'ec2gpu[sandbox]'"], err
    assert "Traceback" not in err
