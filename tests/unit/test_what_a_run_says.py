"""What a run says to the user from its first line to its last, and what `runs` says of it later
(issue 48, items 6, 7, 10, 13, 16): its id first, a cost line on every path, no `exit None`."""
from datetime import datetime, timezone

from ec2gpu import cli
from ec2gpu.runs.settle import ledger


def _row(run_id, **fields):
    return {"run_id": run_id, "command": "ec2gpu run -- python train.py", "backend": "sandbox", "status": "completed",
            "started_at": datetime.now(timezone.utc).isoformat(), **fields}


def test_runs_show_of_a_run_stopped_by_ctrl_c_says_why_it_has_no_exit_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    ledger.record(tmp_path, _row("r-int", status="interrupted"))
    ledger.record(tmp_path, _row("r-bad", status="failed", exit_status=3))
    assert cli.main(["runs", "show", "r-int"]) == 0
    said = capsys.readouterr().out
    assert "None" not in said and "interrupted (stopped by Ctrl-C or a signal before its job ended)" in said
    assert cli.main(["runs", "show", "r-bad"]) == 0
    assert "failed (exit 3)" in capsys.readouterr().out


def _failing_run(monkeypatch, tmp_path, attempts_made):
    """pipeline.run_job of a run in the sandbox whose attempt fails with the job's exit status 3,
    every AWS step stood in for; returns (the reporter, the error raised, the notes said before
    its attempt began)."""
    from types import SimpleNamespace

    import pytest

    from ec2gpu.aws import catalog
    from ec2gpu.errors import RemoteError
    from ec2gpu.runs.execute.reporter import Reporter
    from ec2gpu.runs.options import RunOptions
    from ec2gpu.runs.provision import pipeline
    ui, before = Reporter(), []

    def attempts(aws, settings, opts, run_id, ui_, prov, out, backend, record, pool_attempt=None):
        before.extend(ui.notes)
        record["attempts"] += attempts_made
        raise RemoteError("the job failed", exit_status=3)

    def bill(aws, settings, opts, prov, record, ui_):
        if record["attempts"]:
            record.update(billed_seconds=60.0, cost_usd=0.0088)
    est = SimpleNamespace(upper_bound=False, cost_usd=0.0088, as_dict=lambda: {})
    monkeypatch.setattr(pipeline, "check_options", lambda opts, ui: (opts, catalog.lookup("g4dn.xlarge")))
    monkeypatch.setattr(pipeline, "with_task", lambda opts, backend: opts)
    monkeypatch.setattr(pipeline, "check_estimate", lambda *a: est)
    monkeypatch.setattr(pipeline.capacity, "check_quota", lambda *a, **k: None)
    monkeypatch.setattr(pipeline, "_run_attempts", attempts)
    monkeypatch.setattr(pipeline, "_teardown_and_bill", bill)
    job = SimpleNamespace(builtin=None, name="train", history_key="train", mounts=[])
    opts = RunOptions(task=job, command="ec2gpu run -- python t.py", out=tmp_path / "out")
    aws = SimpleNamespace(check_credentials=lambda: None, region="us-east-1", client=lambda name: None, ec2=None)
    with pytest.raises(RemoteError) as failed:
        pipeline.run_job(aws, SimpleNamespace(home=tmp_path), opts, ui, SimpleNamespace(name="sandbox", is_sandbox=True))
    return ui, failed.value, before


def test_a_run_says_its_id_and_the_commands_that_follow_it_before_it_launches(monkeypatch, tmp_path):
    ui, error, before = _failing_run(monkeypatch, tmp_path, [])
    run_id = error.run_record["run_id"]
    assert before == [f"run {run_id}: from another terminal, ec2gpu logs {run_id} --sandbox --follow; once it "
                      f"ended, ec2gpu runs show {run_id}"]


def test_a_failed_run_says_what_it_cost_and_its_error_carries_its_record(monkeypatch, tmp_path):
    ui, error, _ = _failing_run(monkeypatch, tmp_path, [{"attempt": 1, "instance_id": "i-1", "ended": "running"}])
    run_id = error.run_record["run_id"]
    assert ui.notes[-1] == f"run {run_id} failed: $0.0088 for 60 s billed (1 instance); ec2gpu runs show {run_id}"
    assert error.run_record["status"] == "failed" and error.run_record["exit_status"] == 3
    assert ledger.get(tmp_path, run_id)["cost_usd"] == 0.0088


def test_a_run_that_failed_before_any_launch_says_nothing_was_billed(monkeypatch, tmp_path):
    ui, error, _ = _failing_run(monkeypatch, tmp_path, [])
    assert ui.notes[-1] == f"run {error.run_record['run_id']} failed: no instance was launched, nothing billed"


def test_a_failed_array_prints_its_element_table_before_its_error(monkeypatch, capsys):
    import pytest

    from ec2gpu.cli.tasks import failed_array_table
    from ec2gpu.errors import RemoteError
    monkeypatch.setenv("COLUMNS", "200")
    error = RemoteError("1 element of the array failed")
    error.run_record = {"run_id": "r-1", "pool": {"gpus_per_job": 1, "instances_over_time": [], "elements": [
        {"index": 0, "status": "succeeded", "attempts": 1, "node": "10.0.0.1", "seconds": 12.0, "exit_status": 0,
         "cost_usd": 0.0044},
        {"index": 1, "status": "failed", "attempts": 3, "node": "10.0.0.2", "seconds": 2.0, "exit_status": 1,
         "cost_usd": 0.0044}]}}
    with pytest.raises(RemoteError), failed_array_table(as_json=False):
        raise error
    table = capsys.readouterr().out
    assert "array: 2 elements" in table and "failed" in table and "0.0044" in table


def test_status_of_a_run_in_the_foreground_points_to_runs_show_and_logs_without_asking_aws(tmp_path, monkeypatch,
                                                                                          capsys):
    from ec2gpu.api import tasks
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setattr(tasks.backend, "Context", None)  # no AWS, no sandbox: the ledger answers
    run_id = "20261120-100000-abcd"
    ledger.record(tmp_path, _row(run_id, status="running", controller={"host": "h", "pid": 1, "started": 1.0}))
    assert cli.main(["status", run_id]) == 2
    err = capsys.readouterr().err
    assert "runs in the foreground" in err and f"ec2gpu runs show {run_id}" in err
    assert f"ec2gpu logs {run_id} --sandbox --follow" in err


SWEEP = {"gpus_per_job": 1, "instances_over_time": [{"instances": 2, "seconds": 0}], "elements": [
    {"index": 0, "status": "succeeded", "attempts": 1, "node": "10.0.0.1", "seconds": 30.0, "exit_status": 0,
     "params": {"lr": "0.1"}, "test_accuracy": 0.9605},
    {"index": 1, "status": "succeeded", "attempts": 1, "node": "10.0.0.2", "seconds": 30.0, "exit_status": 0,
     "params": {"lr": "0.05"}, "test_accuracy": 0.9712},
    {"index": 2, "status": "failed", "attempts": 3, "node": "10.0.0.2", "seconds": 3.0, "exit_status": 1,
     "params": {"lr": "9"}, "test_accuracy": None}]}


def test_a_sweeps_tables_give_accuracy_in_percent_and_its_best_element_never_a_dash(monkeypatch, capsys, tmp_path):
    from ec2gpu.cli import render, tasks
    from ec2gpu.cli.render import _print_record
    from ec2gpu.cli.tasks import _print_pool
    wide = render.LazyConsole(width=200)  # a console made earlier in this process keeps its own width
    monkeypatch.setattr(render, "out", wide)
    monkeypatch.setattr(tasks, "out", wide)
    _print_pool(SWEEP)
    _print_record({"run_id": "r-1", "task": "mnist", "instance_id": "i-1", "instance_type": "g4dn.xlarge",
                   "market": "on-demand", "artifacts": str(tmp_path), "pool": SWEEP, "test_acc": 0.9712}, False)
    said = capsys.readouterr().out
    assert "96.05%" in said and "0.9605" not in said
    assert "best test accuracy  97.12% (element 1)" in said and "test accuracy -" not in said
    assert "elements            3 elements: 1 failed, 2 succeeded" in said


def test_runs_lists_an_arrays_result_and_a_sweeps_best_accuracy(tmp_path, monkeypatch, capsys):
    from ec2gpu.runs import element_table
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")
    assert element_table.best_accuracy(SWEEP["elements"]) == (0.9712, 1)
    ledger.record(tmp_path, _row("r-sweep", task="mnist", test_acc=0.9712, exit_status=0,
                                 element_seconds={"count": 2, "mean_seconds": 30.0}))
    ledger.record(tmp_path, _row("r-array", task="render", exit_status=0,
                                 element_seconds={"count": 4, "mean_seconds": 12.0}))
    from ec2gpu.cli.costs import _result  # the table's result column (a console made earlier keeps its width)
    assert cli.main(["runs"]) == 0
    assert _result(ledger.get(tmp_path, "r-sweep")) == "best acc 97.12%"
    assert _result(ledger.get(tmp_path, "r-array")) == "4 elements succeeded, 12 s each"


def test_runs_says_its_total_without_since(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")
    ledger.record(tmp_path, _row("r-aws", backend="aws", billed_seconds=60.0, cost_usd=0.0088,
                                 estimated_cost_usd=0.01))
    ledger.record(tmp_path, _row("r-sandbox", cost_usd=0.5, billed_seconds=60.0))
    assert cli.main(["runs"]) == 0
    said = capsys.readouterr().out
    assert "total on AWS in the ledger: 1 run, 60 s billed, $0.0088 (estimated $0.0100)" in said
    assert "not counted: 1 sandbox run, whose bills are simulated ($0.5000)" in said
    assert cli.main(["runs", "--limit", "1"]) == 0
    assert "total on AWS in the 1 run listed: " in capsys.readouterr().out


def test_launch_through_the_api_says_what_it_does_to_its_log(monkeypatch):
    """Issue 48 item 16: `launch(log=print)` printed nothing (its notes went to a silent reporter)."""
    import contextlib
    from types import SimpleNamespace

    from ec2gpu.api import instances

    def launch(aws, settings, opts, ui, backend):
        ui.note("launching g4dn.xlarge")
        return []
    monkeypatch.setattr(instances, "_context", lambda *a, **k: contextlib.nullcontext(
        SimpleNamespace(aws=None, settings=SimpleNamespace(instance_type="g4dn.xlarge"), backend=None)))
    monkeypatch.setattr(instances.standing, "launch", launch)
    said = []
    assert instances.launch(instance_type="g4dn.xlarge", log=said.append) == []
    assert said == ["launching g4dn.xlarge"]


def test_a_sweeps_record_and_ledger_row_take_its_best_elements_accuracy(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from ec2gpu.runs.execute.reporter import Reporter
    from ec2gpu.runs.provision import pipeline
    monkeypatch.setattr(pipeline, "_teardown_and_bill", lambda *a: None)
    record = {**_row("r-sweep", task="mnist", exit_status=0), "attempts": [], "pool": {
        "elements": [dict(e) for e in SWEEP["elements"]]}}
    prov = SimpleNamespace(instances=[], instance_ids=[])
    pipeline._end_run(None, SimpleNamespace(home=tmp_path), SimpleNamespace(spot=False), prov, record, Reporter(),
                      tmp_path / "out", None)
    assert record["test_acc"] == 0.9712 and ledger.get(tmp_path, "r-sweep")["test_acc"] == 0.9712
