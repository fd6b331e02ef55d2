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
