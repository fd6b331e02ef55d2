"""`ec2gpu logs RUN --follow` of a run on an instance: it ends as soon as EC2 reports the instance
gone (a foreground run's controller ended it) instead of reconnecting for 120 s, with the run's exit
status from the ledger, and says so without suggesting `ec2gpu down` (issue 48, items 1 and 11)."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from ec2gpu import cli
from ec2gpu.remote import jobs

RUN = "20261120-100000-abcd"
IID = "i-0123456789abcdef0"


class _EC2:
    """DescribeInstances answering ``state`` for the instance, counting the questions."""

    def __init__(self, state):
        self.state, self.asked = state, 0

    def describe_instances(self, InstanceIds):
        self.asked += 1
        return {"Reservations": [{"Instances": [{
            "InstanceId": InstanceIds[0], "InstanceType": "g4dn.xlarge", "State": {"Name": self.state},
            "StateReason": {"Message": "Client.UserInitiatedShutdown"}, "LaunchTime": "2026-11-20T10:00:00Z",
            "Placement": {"AvailabilityZone": "us-east-1a"}, "Tags": []}]}]}


def _dropped(monkeypatch, ec2, tmp_path, ledger_rows):
    """``logs.stream`` against an instance whose SSH connection drops at once and never comes back."""
    from ec2gpu.runs.execute import logs
    from ec2gpu.runs.settle import ledger

    def read_from(conn, path, offset, limit=jobs.CHUNK_BYTES):
        if conn.up:
            conn.up = False
            return b'{"state": "running"}' if path.endswith("agent-record.json") else b""
        raise OSError("connection reset")

    def reconnect():
        raise OSError("connection refused")
    conn = SimpleNamespace(up=True, close=lambda: None)
    monkeypatch.setattr(jobs, "read_from", read_from)
    monkeypatch.setattr(jobs, "remote_run_dir", lambda conn, run_id: f"/home/u/ec2gpu/runs/{run_id}")
    monkeypatch.setattr(logs, "run_id_on", lambda home, inst: RUN)
    monkeypatch.setattr(logs, "_open", lambda ctx, inst, note: (conn, reconnect))
    monkeypatch.setattr(logs, "secret_values", lambda conn, run_dir, note: [])
    monkeypatch.setattr(logs, "LEDGER_POLL_S", 0.01)
    monkeypatch.setattr(ledger, "get", lambda home, name: ledger_rows.pop(0) if len(ledger_rows) > 1 else ledger_rows[0])
    return logs, SimpleNamespace(settings=SimpleNamespace(home=tmp_path), aws=SimpleNamespace(ec2=ec2))


def test_follow_ends_at_once_when_ec2_reports_the_instance_terminated_with_the_ledgers_exit_status(
        monkeypatch, tmp_path):
    ec2 = _EC2("terminated")
    rows = [{"run_id": RUN, "status": "running"}, {"run_id": RUN, "status": "failed", "exit_status": 3}]
    logs, ctx = _dropped(monkeypatch, ec2, tmp_path, rows)
    said = []
    status, run_id, ended = logs.stream(ctx, SimpleNamespace(id=IID), True, lambda b: None, said.append)
    assert (status, run_id) == (3, RUN)  # the ledger's, once the controller recorded the end
    assert ended.startswith("EC2 reports the instance terminated") and ec2.asked == 1
    assert not any("reconnected" in s for s in said)


def test_follow_goes_on_reconnecting_while_ec2_reports_the_instance_running(monkeypatch, tmp_path):
    ec2 = _EC2("running")
    logs, ctx = _dropped(monkeypatch, ec2, tmp_path, [{"run_id": RUN, "status": "running"}])
    monkeypatch.setattr(jobs, "follow_reconnecting", _bounded(jobs.follow_reconnecting))
    with pytest.raises(Exception, match="unreachable"):
        logs.stream(ctx, SimpleNamespace(id=IID), True, lambda b: None, lambda m: None)
    assert ec2.asked >= 1


def _bounded(follow_reconnecting):
    """follow_reconnecting with a 1 s bound on the wait for SSH (120 s in the shipped program)."""
    def bounded(*args, **kwargs):
        return follow_reconnecting(*args, **{**kwargs, "unreachable_s": 1.0})
    return bounded


def test_the_end_of_a_follow_whose_instance_was_removed_suggests_runs_show_not_down(monkeypatch, tmp_path, capsys):
    from ec2gpu.api import access
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    shown = access.LogShown(exit_status=3, run_id=RUN, instance_id=IID, source="instance",
                            state="EC2 reports the instance terminated")
    monkeypatch.setattr(access, "logs", lambda *a, **k: shown)
    assert cli.main(["logs", RUN, "--follow"]) == 3
    err = capsys.readouterr().err
    assert f"ec2gpu runs show {RUN}" in err and "ec2gpu down" not in err and "terminated" in err
    standing = access.LogShown(exit_status=0, run_id=RUN, instance_id=IID, source="instance")
    monkeypatch.setattr(access, "logs", lambda *a, **k: standing)
    assert cli.main(["logs", RUN, "--follow"]) == 0
    assert f"ec2gpu down {RUN}" in capsys.readouterr().err  # a standing instance: down is the next step


def test_the_wait_for_the_ledger_is_bounded_and_a_run_not_known_here_is_not_waited_for(monkeypatch, tmp_path):
    from ec2gpu.errors import UsageError
    from ec2gpu.runs.execute import logs
    from ec2gpu.runs.settle import ledger
    slept = []
    monkeypatch.setattr(ledger, "get", lambda home, name: {"run_id": RUN, "status": "running"})
    assert logs.ended_status(Path("/x"), RUN, wait_s=3, sleep=slept.append) is None
    assert sum(slept) <= 4 * logs.LEDGER_POLL_S

    def unknown(home, name):
        raise UsageError("no run")
    monkeypatch.setattr(ledger, "get", unknown)
    slept.clear()
    assert logs.ended_status(Path("/x"), RUN, sleep=slept.append) is None and slept == []


def test_once_the_job_ended_its_instance_is_said_to_be_its_controllers_or_gone_or_standing(monkeypatch, tmp_path):
    """Issue 48 item 11: the end of a follow suggested `ec2gpu down` for an instance its run's
    controller was about to end, or had ended."""
    import os

    import psutil

    from ec2gpu.runs.execute import logs
    from ec2gpu.runs.recover import recovery
    from ec2gpu.runs.settle import ledger
    me = {"host": __import__("socket").gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}
    watch = lambda state: recovery.InstanceWatch(_EC2(state), IID, recovery.NoCheckpoints(), lambda m: None)  # noqa: E731
    monkeypatch.setattr(ledger, "get", lambda home, name: {"run_id": RUN, "status": "running", "controller": me})
    assert logs.what_ends(tmp_path, RUN, watch("running")) == logs.CONTROLLER_ENDS  # this process runs it
    monkeypatch.setattr(ledger, "get", lambda home, name: {"run_id": RUN, "status": "completed", "controller": me})
    assert logs.what_ends(tmp_path, RUN, watch("shutting-down")).startswith("EC2 reports the instance shutting-down")
    assert logs.what_ends(tmp_path, RUN, watch("running")) is None  # it stands (--keep, exec): `down` removes it
