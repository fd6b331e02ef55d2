"""Every command is one library function (issue 29, item 7): `import ec2gpu` gives a function for
each command the CLI has, and docs/api.md is what scripts/api_docs.py writes from them."""
import ast
import dataclasses
import importlib.util
import inspect
from pathlib import Path

import ec2gpu
from ec2gpu import api

ROOT = Path(__file__).resolve().parents[2]
_FLAGS = {f.name for f in dataclasses.fields(api.RunFlags)}
#: what the keyword arguments of a function with **keywords set: api.run's RunFlags' fields, train_mnist's
#: RunFlags' and Trainer's (and --unreachable-after's name)
KEYWORDS = {"run": _FLAGS,
            "train_mnist": _FLAGS | {f.name for f in dataclasses.fields(api.Trainer)} | {"unreachable_after"}}


def _script():
    spec = importlib.util.spec_from_file_location("api_docs", ROOT / "scripts" / "api_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli_commands() -> set[str]:
    """Every command line the CLI takes ('ls', 'image bake', 'runs show', 'runs'), from click's tree."""
    import typer

    from ec2gpu.cli import app  # importing ec2gpu.cli registers every command

    def walk(cmd, prefix):
        found = set()
        for name, sub in cmd.commands.items():
            path = f"{prefix} {name}".strip()
            if hasattr(sub, "commands"):  # a group (typer vendors its own click)
                found |= walk(sub, path)
                if sub.invoke_without_command:  # `ec2gpu runs` lists, as `ec2gpu runs show ID` shows one
                    found.add(path)
            else:
                found.add(path)
        return found
    return walk(typer.main.get_command(app), "")


def test_each_cli_command_has_its_library_function_and_import_ec2gpu_gives_it():
    assert _cli_commands() == set(api.COMMANDS)
    for fn in api.COMMANDS.values():
        assert callable(getattr(ec2gpu, fn)), fn
        assert getattr(ec2gpu, fn) is getattr(api, fn)
        assert (inspect.getdoc(getattr(api, fn)) or "").strip(), f"{fn} has no docstring"
    assert set(api.COMMANDS.values()) <= set(dir(ec2gpu))


def test_docs_api_md_is_what_the_script_writes_with_an_example_per_command():
    script = _script()
    assert set(script.EXAMPLES) >= set(api.COMMANDS.values())
    for fn, example in script.EXAMPLES.items():  # each is Python, and calls its function with names it takes
        calls = [n for n in ast.walk(ast.parse(example)) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == fn]
        assert calls, f"the example of {fn} does not call it"
        params = set(inspect.signature(getattr(api, fn)).parameters) | KEYWORDS.get(fn, set())
        for call in calls:
            assert {k.arg for k in call.keywords} <= set(params), f"{fn}'s example passes what it does not take"
    assert (ROOT / "docs" / "api.md").read_text() == script.render(), "run scripts/api_docs.py"
