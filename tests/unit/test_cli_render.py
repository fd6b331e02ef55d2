"""Every command's --json goes through the one renderer (cli/render.render_json)."""
from __future__ import annotations

import ast
import datetime
import inspect
import json
from pathlib import Path

import ec2gpu.cli as cli
from ec2gpu.cli import render

CLI = Path(cli.__file__).parent


def test_render_json_prints_one_indented_document_and_strings_what_json_cannot_hold(capsys):
    when = datetime.datetime(2026, 11, 22, 17, 0, tzinfo=datetime.timezone.utc)
    render.render_json({"run_id": "r1", "started_at": when, "out": Path("/tmp/r1"), "usd": 0.0138})
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
    lines, first = inspect.getsourcelines(render.render_json)
    inside = {f"render.py:{n}" for n in range(first, first + len(lines))}
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


def _console(monkeypatch, module, name="out", width=80):
    import io

    from rich.console import Console
    buf = io.StringIO()
    monkeypatch.setattr(module, name, Console(file=buf, width=width, force_terminal=False))
    return buf


def test_the_run_table_says_1_epoch_rounds_its_seconds_and_names_this_machine_once(monkeypatch):
    buf = _console(monkeypatch, render)
    record = {"run_id": "20261122-170000-abcd", "market": "local", "instance_type": "local", "task": "mnist",
              "test_acc": 0.991, "phases": {"running": 137.5573}, "artifacts": "/tmp/r",
              "summary": {"epochs": 1, "model": "cnn", "device": "cpu", "train_seconds": 12.0, "wall_seconds": 15.84}}
    render._print_record(record, as_json=False)
    shown = " ".join(buf.getvalue().split())
    assert "1 epoch of cnn on cpu: 12.00 s training, 15.8 s wall" in shown and "1 epochs" not in shown
    assert "instance this machine" in shown and "local local" not in shown
    assert "137.6 s" in shown and "137.5573" not in shown and "None" not in shown


def test_ls_at_80_columns_keeps_each_instance_id_whole_on_one_line(monkeypatch):
    import contextlib

    import ec2gpu.api.instances as ops
    import ec2gpu.cli.instances as cli_instances
    from ec2gpu.runs.standing import hosts as standing
    buf = _console(monkeypatch, cli_instances)
    row = {"name": "a-rather-long-instance-name-for-a-standing-box", "run_id": "", "instance_id": "i-0123456789abcdef0",
           "instance_type": "g4dn.xlarge", "market": "spot", "zone": "us-east-1a", "state": "running",
           "public_ip": None, "private_ip": None, "idle_rule": "down 3600", "age_seconds": 4000,
           "running_intervals": 1, "intervals_recorded": True, "first_launched_at": "2026-11-22T17:00:00+00:00",
           "usd_per_hour": 0.526, "price_source": "table", "so_far": {}, "cost_so_far_usd": 0.5844, "cluster": None,
           "node": None, "launched_at": "2026-11-22T17:00:00+00:00", "unsafe_tags": [], "idle_seconds": None,
           "busy": None}  # runs/standing/hosts.listing's row of a running instance (api/instances.InstanceRow's fields)

    class Ctx:
        aws, settings = None, None
    monkeypatch.setattr(ops, "_context", lambda *a, **k: contextlib.nullcontext(Ctx()))
    monkeypatch.setattr(ops, "settle", lambda ctx, **k: None)
    monkeypatch.setattr(cli_instances, "_idle_cell", lambda r: "down after 60m")
    monkeypatch.setattr(standing, "listing", lambda aws, settings: [dict(row), {**row, "instance_id": "i-0fedcba9876543210"}])
    cli_instances.ls(region=None, sandbox=False, as_json=False)
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    for iid in ("i-0123456789abcdef0", "i-0fedcba9876543210"):
        assert any(iid in line for line in lines), buf.getvalue()



def test_ls_json_prints_each_listing_row_as_the_layer_made_it_a_stopped_ones_disk_alone(monkeypatch, capsys):
    """`ls --json` prints api/instances.InstanceRow records as the dicts list_instances returned before they
    were typed: the same keys in the same order, the disk's two for a stopped instance alone."""
    import contextlib
    import json

    import ec2gpu.api.instances as ops
    import ec2gpu.cli.instances as cli_instances
    from ec2gpu.runs.standing import hosts as standing
    running = {"name": "dev", "run_id": "r1", "instance_id": "i-1", "cluster": None, "node": None,
               "instance_type": "g4dn.xlarge", "market": "on-demand", "state": "running", "public_ip": "1.2.3.4",
               "private_ip": "10.0.0.1", "zone": "us-east-1a", "launched_at": "2026-11-22T17:00:00+00:00",
               "idle_rule": "down 3600", "unsafe_tags": [], "age_seconds": 60, "running_intervals": 1,
               "intervals_recorded": True, "first_launched_at": "2026-11-22T17:00:00+00:00", "usd_per_hour": 0.526,
               "price_source": "table", "so_far": {"cost_usd": 0.01}, "cost_so_far_usd": 0.01, "idle_seconds": 30,
               "busy": None}
    stopped = {**{k: v for k, v in running.items() if k not in ("idle_seconds", "busy")}, "instance_id": "i-2",
               "state": "stopped", "usd_per_hour": None, "disk_gib": 100, "disk_usd_per_month": 8.0,
               "idle_seconds": None, "busy": None}

    class Ctx:
        aws, settings = None, None
    monkeypatch.setattr(ops, "_context", lambda *a, **k: contextlib.nullcontext(Ctx()))
    monkeypatch.setattr(ops, "settle", lambda ctx, **k: None)
    monkeypatch.setattr(standing, "listing", lambda aws, settings: [dict(running), dict(stopped)])
    cli_instances.ls(region=None, sandbox=False, as_json=True)
    printed = json.loads(capsys.readouterr().out)
    assert printed == [running, stopped] and [list(r) for r in printed] == [list(running), list(stopped)]

def test_the_progress_reader_shows_each_new_well_formed_progress_once_and_skips_the_rest(monkeypatch):
    from ec2gpu.remote import jobs
    from ec2gpu.runs.execute import nodes
    contents = iter([b'{"done": 10, "total": 469, "label": "epoch 1/1", "rate": 5000, "rate_unit": "samples/s"}',
                     b'{"done": 10, "total": 469, "label": "epoch 1/1", "rate": 5000, "rate_unit": "samples/s"}',
                     b'{"done": 2', b"", b'["not", "a", "dict"]', b'{"done": 469, "total": 469, "eta_s": 0}'])
    monkeypatch.setattr(jobs, "read_from", lambda conn, path, offset, limit=None: next(contents))
    shown = []
    reader = nodes.ProgressReader("/home/u/ec2gpu/runs/r1", shown.append, every_s=0.0)
    for _ in range(6):
        reader(object())
    assert [p["done"] for p in shown] == [10, 469]  # the repeat, the partial write and the non-dict are skipped
    reader(None)  # no connection (SSH dropped): nothing, no error
    assert len(shown) == 2


def test_without_a_terminal_a_long_phase_says_where_it_is_every_so_often():
    """Issue 48 item 15: with output piped (CI) rich's bar prints nothing; a line with the phase,
    its seconds and the job's progress comes whenever nothing was printed for every_s seconds."""
    import io

    from ec2gpu.cli import render
    now = [100.0]
    buf = io.StringIO()
    ui = render.RichReporter(render.LazyConsole(file=buf, force_terminal=False, width=200), clock=lambda: now[0],
                             every_s=30)
    with ui.phase("running"):
        now[0] += 10
        ui.progress({"total": 60000, "done": 6000, "label": "epoch 1", "rate": 2000.0, "eta_s": 27})
        assert buf.getvalue() == ""  # 10 s of silence: nothing yet
        now[0] += 25
        ui.tick()
        assert buf.getvalue() == "running: 35 s, 6,000/60,000  epoch 1  2,000 /s  ETA 0:27\n"
        ui.tick()  # said just now: not again
        now[0] += 20
        ui.log("a line of the job's")  # a line printed is news enough
        now[0] += 20
        ui.tick()
        assert buf.getvalue().count("running:") == 1
        now[0] += 15
        ui.progress({"total": 60000, "done": 12000, "label": "epoch 1"})
        assert buf.getvalue().splitlines()[-1] == "running: 90 s, 12,000/60,000  epoch 1"
    assert buf.getvalue().splitlines()[-1].startswith("done running")
    now[0] += 100
    ui.tick()  # no phase under way: nothing to say
    assert buf.getvalue().splitlines()[-1].startswith("done running")


def test_on_a_terminal_the_bar_says_the_progress_and_no_line_is_added():
    import io

    from ec2gpu.cli import render
    now = [0.0]
    buf = io.StringIO()
    ui = render.RichReporter(render.LazyConsole(file=buf, force_terminal=True, width=120), clock=lambda: now[0],
                             every_s=30)
    with ui.phase("running"):
        now[0] += 100
        ui.progress({"total": 10, "done": 3, "label": "epoch 1"})
        ui.tick()
    assert "running: " not in buf.getvalue()


def test_no_line_of_a_printed_table_ends_in_the_spaces_that_pad_it(monkeypatch, capsys):
    """Issue 48 item 16: a table's lines were padded to its width, a copied line ending in spaces."""
    from ec2gpu.cli import render
    monkeypatch.setenv("COLUMNS", "120")
    t = render.table("run id", "status", title="runs")
    render.table_row(t, "r-1", "a much longer status")
    render.table_row(t, "r-22222", "ok")
    render.say(render.LazyConsole(), t)
    lines = capsys.readouterr().out.splitlines()
    assert any("r-22222" in line for line in lines) and all(line == line.rstrip() for line in lines)
