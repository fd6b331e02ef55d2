"""Every command's --json goes through the one renderer (cli.render_json)."""
from __future__ import annotations

import ast
import datetime
import inspect
import json
from pathlib import Path

import ec2gpu.cli as cli

CLI = Path(cli.__file__).parent


def test_render_json_prints_one_indented_document_and_strings_what_json_cannot_hold(capsys):
    when = datetime.datetime(2026, 11, 22, 17, 0, tzinfo=datetime.timezone.utc)
    cli.render_json({"run_id": "r1", "started_at": when, "out": Path("/tmp/r1"), "usd": 0.0138})
    text = capsys.readouterr().out
    assert json.loads(text) == {"run_id": "r1", "started_at": "2026-11-22 17:00:00+00:00", "out": "/tmp/r1",
                                "usd": 0.0138}
    assert text.startswith('{\n  "run_id"')


def test_no_command_prints_json_by_itself():
    """A print(json.dumps(...)) anywhere in cli/ other than render_json is a second renderer."""
    offenders = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print" and node.args
                    and isinstance(node.args[0], ast.Call) and ast.unparse(node.args[0].func) == "json.dumps"):
                offenders.append(f"{path.name}:{node.lineno}")
    lines, first = inspect.getsourcelines(cli.render_json)
    inside = {f"__init__.py:{n}" for n in range(first, first + len(lines))}
    assert [o for o in offenders if o not in inside] == []
    assert len(offenders) == 1  # render_json's own


def test_each_command_says_what_it_does_in_one_line_for_the_root_help():
    """`ec2gpu --help` shows each command's first paragraph: one sentence, not a wrapped block."""
    long = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    "command" in ast.unparse(d) for d in node.decorator_list):
                first = (ast.get_docstring(node) or "").split("\n\n")[0]
                if "\n" in first or not first:
                    long.append(f"{path.name}:{node.name}")
    assert long == []
