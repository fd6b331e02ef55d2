"""api/tasks.py's typed API (issue 45, item 5): ``api.run(task, options)`` takes one RunFlags, the
type of `ec2gpu run`'s flags, and its keyword arguments are a convenience that sets RunFlags' fields of
the same names; the CLI builds that RunFlags and prints, with --json, exactly the record the API
returned."""
import dataclasses
import json

import pytest

from ec2gpu import api, cli
from ec2gpu.api import tasks
from ec2gpu.errors import UsageError
from ec2gpu.runs.plan import dryrun

TASK = "name: t\nworkdir: null\nresources:\n  accelerators: T4:1\nrun: python train.py\n"


def test_run_takes_its_flags_as_one_runflags_and_keywords_set_the_same_fields(no_aws):
    (no_aws / "t.yaml").write_text(TASK)
    typed = api.run("t.yaml", api.RunFlags(gpu="L4", spot=True, budget=5.0, ports=(6006,)), dry_run=True)
    keywords = api.run("t.yaml", gpu="L4", spot=True, budget=5.0, ports=[6006], dry_run=True)
    assert isinstance(typed, api.RunPlan) and typed.flags == keywords.flags and keywords.flags.ports == (6006,)
    assert dryrun.plan(typed) == dryrun.plan(keywords)
    assert typed.spot and all(t.startswith("g6") for t in typed.instance_types)  # L4: g6, the flag over the file
    over = api.run("t.yaml", api.RunFlags(gpu="L4", spot=True), spot=False, dry_run=True)  # a keyword wins
    assert (over.flags.gpu, over.flags.spot, over.spot) == ("L4", False, False)


def test_a_keyword_that_is_no_runflags_field_is_still_refused_before_the_task_is_read(no_aws):
    with pytest.raises(TypeError, match="'gpus'"):
        api.run("no-such-file.yaml", gpus="T4", dry_run=True)  # not "no such task file": nothing was read


def test_with_flags_sets_fields_over_the_options_and_keeps_sequences_as_tuples():
    base = api.RunFlags(gpu="T4", secrets=("A",))
    got = tasks.with_flags(base, {"secrets": ["B", "C"], "allow_write_buckets": ["b"], "ports": [8080], "nodes": 2})
    assert got == dataclasses.replace(base, secrets=("B", "C"), allow_write_buckets=("b",), ports=(8080,), nodes=2)
    assert base.secrets == ("A",) and tasks.with_flags(base, {}) == base


def test_the_cli_hands_run_one_runflags_and_prints_its_record_as_json_unchanged(no_aws, capsys, monkeypatch):
    record = {"run_id": "20261125-041200-ab12", "status": "completed", "cost_usd": 0.5, "artifacts": "runs/x",
              "market": "on-demand", "instance_type": "g4dn.xlarge", "phases": {"setup": 1.5}}
    seen = {}

    def run(task, *, options, reporter, on_warning, dry_run):
        seen.update(task=task, options=options, dry_run=dry_run)
        return api.RunResult(dict(record))
    monkeypatch.setattr(api, "run", run)
    assert cli.main(["run", "t.yaml", "--gpu", "T4", "--secret", "K", "--port", "6006", "--max-upload", "2KiB",
                     "--no-baked", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == record
    o = seen["options"]
    assert isinstance(o, api.RunFlags) and seen["task"] == "t.yaml" and seen["dry_run"] is False
    assert (o.gpu, o.secrets, o.ports, o.max_upload, o.baked) == ("T4", ("K",), (6006,), 2048, False)


def test_status_prints_with_json_the_document_the_api_returned(no_aws, capsys, monkeypatch):
    doc = {"run_id": "20261125-041200-ab12", "state": "running", "group": None, "removed": {}}
    monkeypatch.setattr(api, "status", lambda run_id, **kw: api.RunStatus(dict(doc, run_id=run_id)))
    assert cli.main(["status", "20261125-041200-ab12", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc


def test_a_command_whose_program_is_a_file_of_the_workdir_named_bare_is_refused_with_the_command_that_works(tmp_path):
    """`ec2gpu run train.py` launched an instance whose job ended in "command not found" (issue 48 item 9):
    bash looks a bare name up on PATH, not in the workdir. Refused before anything is made, with the fix."""
    from ec2gpu.api.tasks import load_task
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "go.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "go.sh").chmod(0o755)
    (tmp_path / "notes").write_text("x\n")
    for command, fix in ((["train.py", "--epochs", "3"], "ec2gpu run -- python train.py --epochs 3"),
                         (["go.sh"], "ec2gpu run -- ./go.sh"), (["notes"], "ec2gpu run -- bash notes")):
        with pytest.raises(UsageError) as exc:
            load_task(command=command, workdir=str(tmp_path))
        assert exc.value.message.startswith(f"{command[0]} is a file of the workdir, not a program")
        assert fix in exc.value.hint
    for fine in (["python", "train.py"], ["./go.sh"], ["echo", "hi"], ["./missing.sh"]):
        assert load_task(command=fine, workdir=str(tmp_path)).task.run.startswith(fine[0])
