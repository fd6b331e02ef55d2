"""What the CLI prints is plain text (issue 29): an error, a hint, a warning, a note, a table cell or
title holding ``[/]`` or ``[bold]`` prints those characters as they are (rich markup would raise a
MarkupError for ``[/]``, or eat ``[bold]``), through the one helper, ``cli/render.say``. And `ec2gpu --help`
is click's plain help, built without rich or the AWS SDK."""
from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ec2gpu
import ec2gpu.cli as cli
from ec2gpu.cli import render
from ec2gpu.errors import UsageError

CLI = Path(cli.__file__).parent
MESSAGE = "[/]the message [bold]as typed[/bold]"
HINT = "[/]the hint [bold]as typed"
WARNING = "[/]the warning [bold]as typed"
NOTE = "[/]the note [bold]as typed"


def shown(text: str) -> str:
    """``text`` with its runs of whitespace as one space: rich wraps long lines at 80 columns."""
    return " ".join(text.split())


# the error boundary

@pytest.mark.parametrize("task", ["[/]x.yaml", "[bold]x.yaml", "[red]x[/red].yaml"])
def test_run_names_a_missing_task_file_exactly_as_given(no_aws, capsys, task):
    assert cli.main(["run", task]) == 2
    got = capsys.readouterr()
    assert f"error: {task}: no such task file" in shown(got.err)
    assert "Traceback" not in got.err and "MarkupError" not in got.err


def test_an_error_and_its_hint_print_their_brackets_as_typed(no_aws, capsys, monkeypatch):
    from ec2gpu.sandbox import control

    def down(home):
        raise UsageError(MESSAGE, HINT)
    monkeypatch.setattr(control, "down", down)
    assert cli.main(["sandbox", "down"]) == 2
    err = shown(capsys.readouterr().err)
    assert f"error: {MESSAGE}" in err and f"hint: {HINT}" in err


def test_an_error_and_its_hint_are_one_line_each_however_long(no_aws, capsys, monkeypatch):
    # stderr to a file or a pipe: rich's width is 80, and it folded a long path mid-word, so the
    # hint's `mv` command came out broken in two
    from ec2gpu.sandbox import control
    path = "/tmp/" + "d" * 90 + "/ledger.sqlite"

    def down(home):
        raise UsageError(f"the ledger {path} cannot be used", f"set it aside with `mv {path} {path}.bad`")
    monkeypatch.setattr(control, "down", down)
    assert cli.main(["sandbox", "down"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"error: the ledger {path} cannot be used", f"hint: set it aside with `mv {path} {path}.bad`"]


def test_an_unexpected_exception_prints_its_words_as_typed(no_aws, capsys, monkeypatch):
    from ec2gpu.sandbox import control

    def down(home):
        raise RuntimeError(MESSAGE)
    monkeypatch.setattr(control, "down", down)
    assert cli.main(["sandbox", "down"]) == 1
    err = shown(capsys.readouterr().err)
    assert f"error: RuntimeError: {MESSAGE}" in err and "hint: run again with --debug" in err


# warnings and notes relayed from the layers below

def test_a_warning_and_a_note_of_a_run_and_its_table_print_their_brackets_as_typed(no_aws, capsys, monkeypatch):
    from ec2gpu import api

    def run(task_file, *, reporter, on_warning, **kw):
        on_warning(WARNING)
        reporter.note(NOTE)
        return api.RunResult({"run_id": "r1", "market": "local", "instance_type": "local", "task": "[bold]proj",
                              "exit_status": 0, "summary": {"msg": "[/]summary [bold]x"}, "phases": {},
                              "artifacts": "[/]runs/[bold]r1"})
    monkeypatch.setattr(api, "run", run)
    assert cli.main(["run", "t.yaml"]) == 0
    got = capsys.readouterr()
    err, out = shown(got.err), shown(got.out)
    assert f"warning: {WARNING}" in err and NOTE in err
    assert "task [bold]proj: exit 0" in out and "[/]summary [bold]x" in out and "artifacts [/]runs/[bold]r1" in out


def test_a_note_a_lower_layer_says_through_its_callback_prints_as_typed(no_aws, capsys, monkeypatch):
    from ec2gpu.aws import network

    def check_cidr(explicit, warn):
        warn(NOTE)
        raise UsageError("stop here")
    monkeypatch.setattr(network, "check_cidr", check_cidr)
    assert cli.main(["launch", "--ssh-cidr", "203.0.113.7/32"]) == 2
    err = shown(capsys.readouterr().err)
    assert NOTE in err and "error: stop here" in err


# the helpers

def _console(width: int = 200):
    from rich.console import Console
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=True, color_system="truecolor"), buf


def test_say_prints_text_labels_and_styles_without_reading_markup():
    console, buf = _console()
    render.say(console, MESSAGE)
    render.say(console, HINT, "yellow")
    render.say(console, WARNING, label="warning:", label_style="yellow")
    render.say(console, "a\x1b]0;title\x07b")
    from rich.text import Text
    plain_text = Text.from_ansi(buf.getvalue()).plain  # rich's own colours taken away
    assert plain_text.splitlines() == [MESSAGE, HINT, f"warning: {WARNING}", r"a\x1b]0;title\x07b"]
    assert "\x1b[1m" not in buf.getvalue()  # no [bold] was applied


def test_a_tables_title_and_cells_print_their_brackets_as_typed():
    console, buf = _console()
    t = render.table("name", "value", title="[/]title [bold]t")
    render.table_row(t, "[bold]cell", None)
    render.table_row(t, render.plain("[/]styled", "dim"), 3)
    render.say(console, t)
    from rich.text import Text
    text = Text.from_ansi(buf.getvalue()).plain
    assert "[/]title [bold]t" in text and "[bold]cell" in text and "[/]styled" in text and "None" not in text


def test_a_run_shows_its_live_progress_on_the_lazy_console_and_phase_names_as_typed():
    """The CLI's consoles are made on first use (cli/render.LazyConsole); rich's live display needs the
    Console itself (a context manager), which RichReporter takes from it."""
    import re
    buf = io.StringIO()
    ui = render.RichReporter(render.LazyConsole(file=buf, force_terminal=True, width=120))
    with ui.phase("[/]setup"):
        ui.progress({"total": 10, "done": 3, "label": "[bold]step", "rate": 5.0, "eta_s": 70})
        ui.log("[/]a log line")
        ui.note(NOTE)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # rich's colours and cursor moves
    assert "| [/]a log line" in text and NOTE in text and "[bold]step" in text
    assert "done [/]setup" in text
    console = render.LazyConsole(file=io.StringIO())
    with console:  # a context manager, as a Console is
        console.print("x")
    assert console.file.getvalue() == "x\n"


def _calls_outside(name_of_call, allowed: str) -> list[str]:
    """Calls in ec2gpu/cli that ``name_of_call(call)`` picks, made outside the function ``allowed``."""
    found = []

    class Visit(ast.NodeVisitor):
        def __init__(self, path):
            self.path, self.stack = path, []

        def visit_FunctionDef(self, node):
            self.stack.append(node.name)
            self.generic_visit(node)
            self.stack.pop()

        def visit_Call(self, node):
            if name_of_call(node) and allowed not in self.stack:
                found.append(f"{self.path.name}:{node.lineno}")
            self.generic_visit(node)

    for path in sorted(CLI.glob("*.py")):
        Visit(path).visit(ast.parse(path.read_text()))
    return found


def test_every_rich_print_table_and_row_of_the_cli_goes_through_its_one_helper():
    """A console's print outside ``say``, a rich Table outside ``table`` or a row added outside
    ``table_row`` could read a quoted value as markup."""
    def attr(name):
        return lambda call: isinstance(call.func, ast.Attribute) and call.func.attr == name
    assert _calls_outside(attr("print"), "say") == []
    assert _calls_outside(attr("add_row"), "table_row") == []
    assert _calls_outside(lambda c: getattr(c.func, "id", getattr(c.func, "attr", None)) == "Table", "table") == []


# --help

def test_root_help_lists_each_command_whole_in_registration_order(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: ec2gpu [OPTIONS] COMMAND [ARGS]...")
    commands = out.split("Commands:\n", 1)[1]
    assert commands.split()[0] == "run"  # your own job first, not click's alphabetical order
    assert "..." not in commands  # no first sentence cut short
    assert ("Run your own job on new GPU instances: send the workdir, set up, run, bring outputs home, "
            "terminate.") in shown(commands)
    assert "╭" not in out and "│" not in out


def test_run_help_is_plain_text_with_the_flags_and_no_type_after_on_off_flags(capsys):
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: ec2gpu run [OPTIONS]")
    assert "--spot / --on-demand" in out and "--gpu" in out and "--dry-run" in out
    assert "<bool>" not in out and "BOOLEAN" not in out
    assert "╭" not in out and "│" not in out


def test_no_command_prints_the_help_on_stdout(capsys):
    rc = cli.main([])
    got = capsys.readouterr()
    assert got.out.startswith("Usage: ec2gpu [OPTIONS] COMMAND [ARGS]...") and got.err == ""
    assert rc in (0, 2)  # click 8.2 and later: 2, as for a missing command; click 8.1: 0


def test_help_imports_neither_rich_nor_the_aws_sdk_nor_the_task_parsers(tmp_path):
    """What `ec2gpu --help` imports beyond typer itself (older typer imports rich on import)."""
    root = Path(ec2gpu.__file__).resolve().parents[1]
    code = ("import json, sys, typer\nbefore = set(sys.modules)\nfrom ec2gpu import cli\nrc = cli.main(['--help'])\n"
            "heavy = ('rich', 'boto3', 'botocore', 'yaml', 'pydantic', 'fabric', 'paramiko', 'markdown_it', 'pygments')\n"
            "print(json.dumps([rc, sorted(m for m in set(sys.modules) - before if m.split('.')[0] in heavy)]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert json.loads(got.stdout.strip().splitlines()[-1]) == [0, []], got.stdout + got.stderr
