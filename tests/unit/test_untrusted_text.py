"""A hostile job, task file or instance prints nothing the user's terminal acts on: text from them goes
through ec2gpu.inert (control characters made visible) and is never read as rich markup."""
from __future__ import annotations

import ast
import io
import re
from pathlib import Path

import pytest
from rich.console import Console

import ec2gpu.cli as cli
from ec2gpu.cli import render
from ec2gpu.inert import inert

CLI = Path(cli.__file__).parent

CLEAR = "\x1b[2J"
TITLE = "\x1b]0;pwned\x07"
CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"
LINK = "\x1b]8;;https://evil\x1b\\link\x1b]8;;\x1b\\"
HOSTILE = f"{CLEAR}{TITLE}{CLIPBOARD}{LINK}[/oops][link=https://evil]click[/link]\u202egnp.exe"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colours, on a terminal
#: what rich itself writes on a terminal: colours, and for a live progress bar the cursor hidden and
#: shown, the line erased, the cursor moved up, a carriage return (none of them is in HOSTILE)
RICH_OWN = re.compile(r"\x1b\[(?:[0-9;]*[mKA]|\?25[lh])|\r")
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def raw_controls(shown: str) -> list[str]:
    """The control characters in ``shown`` other than rich's own (and tab, newline)."""
    return RAW.findall(RICH_OWN.sub("", shown))


@pytest.fixture
def terminal(monkeypatch):
    """(out, err): what the CLI printed, each on a colour terminal (where rich would make a link)."""
    import ec2gpu.cli.access
    import ec2gpu.cli.bench
    import ec2gpu.cli.costs
    import ec2gpu.cli.images
    import ec2gpu.cli.instances
    import ec2gpu.cli.tasks
    import ec2gpu.cli.train  # noqa: F401

    bufs = {"out": io.StringIO(), "err": io.StringIO()}
    consoles = {k: Console(file=b, force_terminal=True, color_system="truecolor", width=200) for k, b in bufs.items()}
    for module in (render, cli.access, cli.bench, cli.costs, cli.images, cli.instances, cli.tasks, cli.train):
        for name, console in consoles.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, console)
    return bufs["out"], bufs["err"]


# the helper

def test_inert_shows_every_control_and_invisible_character_as_its_escape():
    assert inert(CLEAR + TITLE) == r"\x1b[2J\x1b]0;pwned\x07"
    assert inert(CLIPBOARD) == r"\x1b]52;c;ZXZpbA==\x07"
    assert inert("\x9b2J \x9d0;t\x9c \x7f \x00") == r"\x9b2J \x9d0;t\x9c \x7f \x00"  # C1 CSI/OSC/ST, DEL, NUL
    assert inert("a\u202egnp.exe\u200b\u2066\ufeff") == r"a\u202egnp.exe\u200b\u2066\ufeff"
    assert inert("half \ud800 a surrogate") == r"half \ud800 a surrogate"
    assert raw_controls(inert(HOSTILE)) == []


def test_inert_keeps_text_tabs_newlines_and_markup_like_brackets_and_drops_line_end_carriage_returns():
    plain = "epoch 1/3\tloss 0.25 [bold]x[/] caf\u00e9 \u4e2d\u6587 \U0001f680"
    assert inert(plain) is plain
    assert inert("line 1\r\nline 2\r") == "line 1\nline 2"
    assert inert("10%\r20%") == r"10%\x0d20%"  # a CR that would overwrite the line is shown


# the CLI

def _hostile_ledger(home: Path, artifacts: Path | None = None) -> str:
    from ec2gpu.runs.settle import ledger
    rid = "20261122-170000-beef"
    ledger.record(home, {"run_id": rid, "command": "ec2gpu run task.yaml", "backend": "sandbox", "status": "completed",
                         "exit_status": 0, "started_at": "2026-11-22T17:00:00+00:00", "task": "proj",
                         "instance_type": "g4dn.xlarge", "market": "on-demand", "artifacts": str(artifacts or home),
                         "summary": {"msg": HOSTILE, HOSTILE: 1, "loss": 0.25}})
    return rid


def test_runs_and_runs_show_print_a_hostile_summary_inert_and_exit_0(terminal, tmp_path, monkeypatch):
    out, err = terminal
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    rid = _hostile_ledger(tmp_path)
    assert cli.main(["runs"]) == 0, err.getvalue()
    assert cli.main(["runs", "show", rid]) == 0, err.getvalue()
    shown = out.getvalue()
    assert raw_controls(shown) == [] and raw_controls(err.getvalue()) == []
    assert "\x1b]8" not in shown and "https://evil" in shown  # the link's text shown, no link made
    assert r"\x1b]52;c;ZXZpbA==\x07" in SGR.sub("", shown)  # `runs`: the summary's value, made visible
    assert "[/oops][link=https://evil]click[/link]" in SGR.sub("", shown)


def test_the_run_table_shows_a_hostile_summary_inert(terminal):
    out, _ = terminal
    base = {"run_id": "r1", "market": "local", "instance_type": "local", "phases": {}, "artifacts": f"/tmp/{HOSTILE}"}
    render._print_record({**base, "task": "proj", "exit_status": 0, "summary": {"msg": HOSTILE}}, as_json=False)
    render._print_record({**base, "task": "mnist", "test_acc": 0.99,
                       "summary": {"epochs": 1, "model": HOSTILE, "device": "cuda", "gpu_name": HOSTILE}},
                      as_json=False)
    render._print_record({**base, "task": "bake", "summary": {"image_id": "ami-1", "name": HOSTILE, "task": "t"}},
                      as_json=False)
    shown = out.getvalue()
    assert raw_controls(shown) == [] and "\x1b]8" not in shown
    assert "[/oops]" in shown and r"\x1b]0;pwned\x07" in SGR.sub("", shown)


def _task(tmp_path: Path, text: str) -> str:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("yaml, said", [
    # an unknown field named with a closing tag and a window-title sequence (YAML's "\e" is ESC, "\a" BEL)
    ('name: t\nrun: echo hi\n"[/x]\\e]0;pwned\\a": 1\n', r"task.yaml:3: [/x]\x1b]0;pwned\x07: unknown field"),
    # a value holding a link (no ':', which would make it a count): the error quotes it
    ('name: t\nrun: echo hi\nresources:\n  gpu: "[link=evil.example]x[/link]"\n',
     "task.yaml:4: resources.gpu: '[link=evil.example]x[/link]' is not a GPU"),
], ids=["closing-tag-and-title", "link"])
def test_a_task_file_value_that_looks_like_markup_or_escapes_gives_a_plain_error_line_exit_2(terminal, tmp_path,
                                                                                          monkeypatch, yaml, said):
    _, err = terminal
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    assert cli.main(["run", _task(tmp_path, yaml)]) == 2
    shown = err.getvalue()
    assert "Traceback" not in shown and "MarkupError" not in shown
    assert raw_controls(shown) == [] and "\x1b]8" not in shown
    plain = " ".join(SGR.sub("", shown).split())  # one line, however rich wrapped it
    assert plain.startswith("error: ") and f"/{said}" in plain


def test_an_error_tail_and_hint_from_the_instance_are_inert_and_stay_multi_line(terminal, monkeypatch):
    from ec2gpu.errors import RemoteError
    _, err = terminal

    def fail(*_, **__):
        raise RemoteError(f"the job failed: {HOSTILE}", f"hint {TITLE}[/x]", command="job", host="h", exit_status=3,
                          tail=f"line 1 {CLEAR}\nline 2 [/oops]")
    monkeypatch.setattr("ec2gpu.api.run", fail)
    assert cli.main(["run", "--", "true"]) == 5
    shown = err.getvalue()
    assert raw_controls(shown) == [] and "\x1b]8" not in shown
    plain = SGR.sub("", shown)
    assert "line 1 \\x1b[2J\nline 2 [/oops]" in plain and "hint \\x1b]0;pwned\\x07[/x]" in plain


def test_an_unexpected_exception_naming_instance_text_is_inert(terminal, monkeypatch):
    _, err = terminal

    def fail(*_, **__):
        raise RuntimeError(HOSTILE)
    monkeypatch.setattr("ec2gpu.api.run", fail)
    assert cli.main(["run", "--", "true"]) == 1
    assert raw_controls(err.getvalue()) == [] and "RuntimeError" in err.getvalue()


def test_the_live_log_and_its_notes_print_no_control_sequence(terminal):
    _, err = terminal
    ui = render.RichReporter(render.err)
    ui.log(f"epoch 1 {HOSTILE}")
    ui.note(f"node 0: {HOSTILE}")
    shown = err.getvalue()
    assert raw_controls(shown) == [] and "\x1b]8" not in shown
    assert SGR.sub("", shown).splitlines() == [f"| epoch 1 {inert(HOSTILE)}", f"node 0: {inert(HOSTILE)}"]
    assert ui.notes == [f"node 0: {HOSTILE}"]  # the record keeps what was said; only the screen is made safe


def test_the_progress_bar_shows_the_jobs_label_inert_and_never_as_markup(terminal):
    _, err = terminal
    ui = render.RichReporter(render.err)
    with ui.phase("running"):
        ui.progress({"done": 1, "total": 2, "label": f"{TITLE}[/oops]", "rate": 5.0, "rate_unit": CLEAR, "eta_s": 3})
    shown = err.getvalue()
    assert raw_controls(shown) == [] and "\x1b]8" not in shown
    assert r"\x1b]0;pwned\x07[/oops]  5 \x1b[2J  ETA 0:03" in SGR.sub("", shown)


def test_notes_and_warnings_relayed_from_lower_layers_print_no_control_sequence(terminal):
    _, err = terminal
    render.note(HOSTILE)
    render.note(HOSTILE, "yellow")
    render.warn(HOSTILE)
    cli.tasks._warn(HOSTILE)
    shown = err.getvalue()
    assert raw_controls(shown) == [] and "\x1b]8" not in shown
    assert SGR.sub("", shown).splitlines() == [inert(HOSTILE)] * 2 + [f"warning: {inert(HOSTILE)}"] * 2


@pytest.mark.parametrize("follow", [False, True])
def test_logs_of_a_finished_run_prints_its_log_inert(capsysbinary, tmp_path, monkeypatch, follow):
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    artifacts = tmp_path / "r"
    artifacts.mkdir()
    (artifacts / "job.log").write_bytes(f"epoch 1/2\n{HOSTILE}\r\ndone \xff\n".encode() + b"bad utf-8 \xff\n")
    rid = _hostile_ledger(tmp_path, artifacts)
    assert cli.main(["logs", rid] + (["--follow"] if follow else [])) == 0
    shown = capsysbinary.readouterr().out.decode(errors="replace")
    assert raw_controls(shown) == []
    assert shown.startswith("epoch 1/2\n\\x1b[2J\\x1b]0;pwned\\x07") and "[/oops]" in shown
    assert shown.endswith("done \u00ff\nbad utf-8 \ufffd\n")


def test_no_cli_lambda_relays_a_lower_layers_text_into_markup():
    """``log=lambda m: err.print(f"[dim]{m}[/]")`` reads a note (which may quote an instance) as
    markup and prints its escapes raw: such relays go through cli.note / cli.warn."""
    offenders = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Lambda):
                continue
            params = {a.arg for a in node.args.args}
            for call in ast.walk(node.body):
                if (isinstance(call, ast.Call) and ast.unparse(call.func).endswith(".print") and call.args
                        and isinstance(call.args[0], ast.JoinedStr)
                        and any(isinstance(n, ast.Name) and n.id in params for n in ast.walk(call.args[0]))):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_ls_shows_a_hostile_name_tag_inert(terminal, monkeypatch):
    """Tags are set by ec2gpu, but anyone with the account's rights can change them."""
    import contextlib

    import ec2gpu.api.instances as ops
    import ec2gpu.cli.instances as cli_instances
    from ec2gpu.runs.standing import hosts as standing
    out, _ = terminal
    row = {"name": HOSTILE, "run_id": "", "instance_id": "i-0123456789abcdef0", "instance_type": "g4dn.xlarge",
           "market": "on-demand", "zone": "us-east-1a", "state": "running", "public_ip": None, "private_ip": None,
           "idle_rule": None, "age_seconds": 60, "running_intervals": 1, "intervals_recorded": True,
           "first_launched_at": "2026-11-22T17:00:00+00:00", "usd_per_hour": 0.526, "price_source": "table",
           "so_far": {}, "cost_so_far_usd": 0.01, "cluster": HOSTILE, "node": 0,
           "launched_at": "2026-11-22T17:00:00+00:00", "unsafe_tags": [], "idle_seconds": None,
           "busy": None}  # runs/standing/hosts.listing's row (api/instances.InstanceRow's fields)

    class Ctx:
        aws, settings = None, None
    monkeypatch.setattr(ops, "_context", lambda *a, **k: contextlib.nullcontext(Ctx()))
    monkeypatch.setattr(ops, "settle", lambda ctx, **k: None)
    monkeypatch.setattr(cli_instances, "_idle_cell", lambda r: "-")
    monkeypatch.setattr(standing, "listing", lambda aws, settings: [row])
    cli_instances.ls(region=None, sandbox=False, as_json=False)
    shown = out.getvalue()
    assert raw_controls(shown) == [] and "\x1b]8" not in shown and "i-0123456789abcdef0" in shown


def test_a_bench_json_that_describes_its_machine_with_escapes_and_markup_is_shown_inert(terminal):
    import ec2gpu.cli.bench as cli_bench
    out, _ = terminal
    machine = {"cpu": HOSTILE, "vcpus": 4, "ram_bytes": 16 << 30, "gpus": [{"name": HOSTILE, "memory_bytes": 16 << 30}],
               "torch": HOSTILE, "cuda": "12.4", "driver": HOSTILE}
    run = {"fp32_tflops": 1.0}
    r = {"instance_type": "g4dn.xlarge", "artifacts": "/tmp/r", "usd_per_hour": None,
         "bench": {"machine": machine, "quick": True, "devices": ["cpu"], "bandwidth": {"cpu": {}},
                   "compute": {"cpu": run}, "against_peak": {},
                   "training": {"models": {HOSTILE: {"cpu": {"batch_size": HOSTILE, "train_seconds": 1.0,
                                                              "samples_per_second": 10.0, "test_acc": 0.9,
                                                              "time_to_target_seconds": None}}},
                                "batch": {"cpu": {HOSTILE: {"train_seconds": 1.0, "samples_per_second": 10.0}}}}}}
    cli_bench._show(r)
    cli_bench._show({"instance_type": "g4dn.xlarge", "error": HOSTILE})
    shown = out.getvalue()
    assert raw_controls(shown) == [] and "\x1b]8" not in shown and "[/oops]" in shown
