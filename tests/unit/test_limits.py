"""A run's instance-side limit (issue 28.1-2): a first run starts with no flag and a long limit said
with the most it can cost; later runs follow the task's history; the job gets SIGTERM before the
limit and the run says the limit ended it."""
import json
import sys
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from ec2gpu.agent import agent
from ec2gpu.wire import agent_record
from ec2gpu.aws.instances import Instance
from ec2gpu.errors import LimitReached, UsageError
from ec2gpu.runs.plan import costs, limits
from ec2gpu.runs.execute import engine
from ec2gpu.runs.settle import ledger
from ec2gpu.runs.options import RunOptions
from ec2gpu.runs.provision import pipeline
from fakes import T0, _run  # same folder (pytest prepend import mode)


def _row(run_id, task, phases, state="completed", backend="sandbox"):
    return {"run_id": run_id, "command": "ec2gpu run", "backend": backend, "status": state, "task": task,
            "started_at": datetime.now(timezone.utc).isoformat(), "phases": phases}


def test_a_value_given_wins_and_none_removes_the_limit(tmp_path):
    assert limits.for_task(tmp_path, "t", "sandbox", "2h", 30) == limits.Limit(120, "--max-runtime")
    assert limits.for_task(tmp_path, "t", "sandbox", None, "45m") == limits.Limit(45, "the task's max_runtime")
    assert limits.for_task(tmp_path, "t", "sandbox", "none", 30).minutes is None
    assert limits.for_task(tmp_path, "t", "sandbox", None, "off").minutes is None
    with pytest.raises(UsageError, match="--max-runtime"):
        limits.parse("soon")
    with pytest.raises(UsageError, match="at least 1 minute"):
        limits.parse("10s")


def test_a_first_run_gets_a_long_limit_and_later_runs_follow_the_longest_one(tmp_path):
    first = limits.for_task(tmp_path, "finetune", "sandbox")
    assert first.minutes == limits.FIRST_RUN_MINUTES == 1440 and "has not run before" in first.source
    assert first.words() == "24 h"
    ledger.record(tmp_path, _row("r1", "finetune", {"setup": 60.0, "running": 600.0}))
    ledger.record(tmp_path, _row("r2", "finetune", {"setup": 60.0, "running": 1740.0}))  # 30 min: the longest
    ledger.record(tmp_path, _row("r3", "finetune", {"running": 9000.0}, state="failed"))  # not a completed run
    ledger.record(tmp_path, _row("r4", "other", {"running": 9000.0}))
    ledger.record(tmp_path, _row("r5", "finetune", {"running": 9000.0}, backend="aws"))
    later = limits.for_task(tmp_path, "finetune", "sandbox")
    assert later.minutes == 90 and "r2" in later.source and "30.0 min" in later.source
    ledger.record(tmp_path, _row("r6", "quick", {"running": 30.0}))
    assert limits.for_task(tmp_path, "quick", "sandbox").minutes == limits.MIN_MINUTES


def test_the_job_is_stopped_a_grace_period_and_the_nologin_window_before_the_instance_ends():
    launched = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
    instance = Instance("i-1", "g4dn.xlarge", "running", launched)
    at = limits.stop_at(instance, 60, 120)
    # SIGTERM, 120 s of grace, then 5 min for the outputs before the shutdown closes logins
    assert at == launched.timestamp() + 3600 - 120 - limits.NOLOGIN_SECONDS
    assert limits.grace_seconds(1, 120) == 15  # at most a quarter of the limit ...
    assert limits.lead_seconds(1, 120) == 30  # ... and SIGTERM at most half the limit before its end
    assert limits.stop_at(instance, None) is None and limits.stop_at(None, 60) is None
    nd = SimpleNamespace(info={"python": "/usr/bin/python3"}, run_dir="/r", instance=instance)
    job = SimpleNamespace(task=SimpleNamespace(run="python train.py"), name="t", args=[])
    argv = engine.job_argv(nd, job, 60, 120)
    assert argv[argv.index("--limit-at") + 1] == f"{at:.0f}" and argv[argv.index("--limit-grace") + 1] == "120"
    assert "--limit-at" not in engine.job_argv(nd, job, None)


def test_the_agent_gives_the_job_sigterm_at_the_limit_and_records_it(tmp_path):
    trap = "trap 'echo checkpointed; exit 0' TERM; while :; do sleep 0.1; done"
    started = time.monotonic()
    code = agent.run(str(tmp_path), ["bash", "-c", trap], "http://127.0.0.1:9", poll_s=0.1, grace_s=2.0,
                     limit=(time.time() + 1.0, 30.0))
    st = json.loads((tmp_path / "agent-record.json").read_text())
    assert time.monotonic() - started < 10  # the job ended on its SIGTERM, long before the grace ran out
    assert (tmp_path / "job.log").read_text().endswith("checkpointed\n")  # (bash reports the killed sleep)
    assert st["state"] == "failed" and st["limit"]["stopped_at"] and st["limit"]["ends_at"]  # exit 0 is not success
    assert code == 0 and agent_record.parse((tmp_path / "agent-record.json").read_bytes(), None)["limit"] == st["limit"]


def test_a_job_deaf_to_sigterm_is_killed_before_the_instance_ends(tmp_path):
    agent.run(str(tmp_path), [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(60)"], "http://127.0.0.1:9", poll_s=0.1, grace_s=2.0,
              limit=(time.time() + 0.5, 6.0))  # ends at +6.5 s: SIGKILL 5 s before, at +1.5 s at the latest
    st = json.loads((tmp_path / "agent-record.json").read_text())
    assert st["signal"] == 9 and st["limit"] and st["state"] == "failed"


def test_the_run_says_the_limit_ended_the_job_and_how_to_raise_it():
    record = agent_record.parse(json.dumps({"state": "failed", "exit_code": 143, "limit": {
        "ends_at": "2026-11-24T14:00:00+00:00", "stopped_at": "2026-11-24T13:58:00+00:00"}}).encode(), None)

    class Watch:
        def check(self):
            return None
    nd = SimpleNamespace(index=0, result=143, status=record, watch=Watch(), conn=None, run_dir="/r",
                         instance_id="i-1", host="h")
    job = SimpleNamespace(task=SimpleNamespace(run="x"), secret_values=[])
    from ec2gpu.remote import jobs
    orig, jobs.tail = jobs.tail, lambda conn, path, lines=20: "step 900"
    try:
        with pytest.raises(LimitReached) as exc:
            engine.judge([nd], job)
    finally:
        jobs.tail = orig
    assert exc.value.exit_code == 5 and "--max-runtime ended the job" in exc.value.message
    assert "13:58" in exc.value.message and "--max-runtime 8h" in exc.value.hint and exc.value.tail == "step 900"


class _Ui:
    def __init__(self):
        self.notes = []

    def note(self, text):
        self.notes.append(text)


def _first_run(monkeypatch, tmp_path, **opts):
    from ec2gpu.tasks import load
    monkeypatch.setattr(costs, "estimate_job", lambda aws, home, itype, spot, job_s, source, backend, mp=None:
                        costs._priced(costs.Estimate(itype, "on-demand", 0.526, "shipped table", 60, 30, job_s, 20,
                                                     source)))
    job = engine.TaskJob(load.parse("name: fresh\nrun: python train.py\n"), {}, None)
    o = RunOptions(task=job, instance_type="g4dn.xlarge", **opts)
    settings = SimpleNamespace(home=tmp_path)
    ui = _Ui()
    return pipeline.check_estimate(None, settings, o, "sandbox", ui), ui


def test_a_first_run_starts_and_says_its_price_and_the_most_it_can_cost(monkeypatch, tmp_path):
    est, ui = _first_run(monkeypatch, tmp_path, max_runtime_minutes=1440, limit_source="first run")
    said = " ".join(ui.notes)
    assert est.upper_bound and est.cost_usd == round(0.526 * 24, 4)
    assert "has not run on g4dn.xlarge before" in said and "0.5260 USD/h" in said and "at most $12.62" in said
    assert "max runtime: 24 h (first run)" in said and "SIGTERM" in said


def test_a_budget_is_compared_with_the_most_a_first_run_can_cost(monkeypatch, tmp_path):
    with pytest.raises(UsageError, match=r"up to \$12.62") as exc:
        _first_run(monkeypatch, tmp_path, max_runtime_minutes=1440, limit_source="x", budget_usd=5.0)
    assert "--expect" in exc.value.hint and "--max-runtime" in exc.value.hint
    est, _ = _first_run(monkeypatch, tmp_path, max_runtime_minutes=60, limit_source="x", budget_usd=5.0)
    assert est.cost_usd == 0.526
    with pytest.raises(UsageError, match="without bound"):
        _first_run(monkeypatch, tmp_path, max_runtime_minutes=None, limit_source="--max-runtime", budget_usd=5.0)
    est, ui = _first_run(monkeypatch, tmp_path, max_runtime_minutes=None, limit_source="--max-runtime", nodes=2)
    assert est.cost_usd is None and "nothing bounds its cost" in " ".join(ui.notes) and "idle" in ui.notes[-1]


def test_a_task_file_may_say_no_limit():
    from ec2gpu.tasks import load
    assert load.parse("run: x\nmax_runtime: none\n").task.max_runtime_minutes is None
    assert load.parse("run: x\nmax_runtime: 2h\n").task.max_runtime_minutes == 120
    with pytest.raises(UsageError, match="max_runtime"):
        load.parse("run: x\nmax_runtime: soon\n")


# --- runs/plan/limits.py -----------------------------------------------------------------------------
# A mutmut run over this module with the fast tier (issue 29, item 14) left these mutants alive;
# each test fails when the one token it pins changes (a limit, a bill, an estimate, a quota).

def test_max_runtime_is_at_least_one_whole_minute_rounded_up():
    from ec2gpu.runs.plan import limits

    assert limits.parse("1m") == (True, 1)
    assert limits.parse(1) == (True, 1)
    assert limits.parse("90s") == (True, 2)  # 1.5 min: never fewer than asked
    assert limits.parse("60s") == (True, 1)
    with pytest.raises(UsageError, match="at least 1 minute"):
        limits.parse("59s")
    with pytest.raises(UsageError) as refused:
        limits.parse("soon")
    assert refused.value.hint == "e.g. --max-runtime 90m, 4h, or none (no limit)"


@pytest.mark.parametrize("minutes,said", [(59, "59 min"), (60, "60 min"), (90, "90 min"), (120, "2 h"),
                                          (121, "121 min"), (150, "150 min"), (180, "3 h"), (None, "no limit")])
def test_a_limit_is_said_in_hours_from_two_whole_hours(minutes, said):
    from ec2gpu.runs.plan import limits

    assert limits.Limit(minutes, "x").words() == said


def test_the_longest_run_counts_any_positive_time_and_never_an_empty_one(tmp_path):
    from ec2gpu.runs.settle import ledger
    from ec2gpu.runs.plan import limits

    ledger.record(tmp_path, _run("empty", "t", {}))
    assert limits.longest_run(tmp_path, "t", "aws") is None
    ledger.record(tmp_path, _run("short", "t", {"running": 0.5}))
    ledger.record(tmp_path, _run("failed", "t", {"running": 9999.0}, status="failed"))
    assert limits.longest_run(tmp_path, "t", "aws") == (0.5, "short")


def test_the_grace_is_never_negative_and_the_stop_time_follows_the_grace_setting():
    from ec2gpu.runs.plan import limits

    assert limits.grace_seconds(60, 0) == 0.0 and limits.grace_seconds(60, -5) == 0.0
    inst = Instance("i-1", "g4dn.xlarge", "running", T0)
    # 60 min limit, 30 s of grace: SIGTERM 30 s + 300 s (nologin) before the end
    assert limits.stop_at(inst, 60, 30) == T0.timestamp() + 3600 - 330
    assert limits.stop_at(inst, 60) == T0.timestamp() + 3600 - 420


def test_refusals_carry_their_hint():
    from ec2gpu.runs.plan import limits

    with pytest.raises(UsageError) as short:
        limits.parse("59s")
    assert short.value.hint == "e.g. --max-runtime 90m, 4h, or none (no limit)"


def test_an_unreadable_ledger_gives_no_history_rather_than_stopping_the_run(tmp_path):
    from ec2gpu.runs.settle import ledger
    from ec2gpu.runs.plan import limits

    ledger.path_in(tmp_path).write_bytes(b"this is not a database" * 100)
    assert limits.longest_run(tmp_path, "t", "aws") is None
    assert limits.for_task(tmp_path, "t", "aws").minutes == limits.FIRST_RUN_MINUTES


def test_the_longest_run_looks_back_500_runs(tmp_path):
    from ec2gpu.runs.settle import ledger
    from ec2gpu.runs.plan import limits

    ledger.record(tmp_path, {**_run("oldest", "t", {"running": 9000.0}), "started_at": (T0 - timedelta(days=1)).isoformat()})
    for i in range(500):
        ledger.record(tmp_path, {**_run(f"r{i:03}", "t", {"running": 10.0 + i}),
                                 "started_at": (T0 + timedelta(seconds=i)).isoformat()})
    assert limits.longest_run(tmp_path, "t", "aws") == (509.0, "r499")


def _command_job(tmp_path, command):
    """The TaskJob of `ec2gpu run -- COMMAND` in directory ``tmp_path`` (api/tasks.load_task's)."""
    from ec2gpu.api.tasks import load_task
    (tmp_path / "train.py").write_text("print(1)\n")
    return engine.TaskJob(load_task(command=command, workdir=str(tmp_path)), {}, None)


def test_two_commands_run_in_one_directory_keep_histories_of_their_own(tmp_path):
    """Issue 48 item 8: a 20 s smoke test does not give the next long training run there a
    60-minute limit, nor its mean to the training run's estimate."""
    smoke = _command_job(tmp_path, ["python", "train.py", "--smoke"])
    train = _command_job(tmp_path, ["python", "train.py", "--epochs", "50"])
    assert smoke.name == train.name and smoke.history_key != train.history_key
    assert smoke.history_key.endswith("python train.py --smoke")
    ledger.record(tmp_path, {**_row("r1", smoke.name, {"running": 20.0}), "task_key": smoke.history_key,
                             "instance_type": "g4dn.xlarge"})
    assert limits.for_task(tmp_path, smoke.history_key, "sandbox").minutes == limits.MIN_MINUTES
    assert limits.for_task(tmp_path, train.history_key, "sandbox").minutes == limits.FIRST_RUN_MINUTES
    assert costs.estimate_minutes(tmp_path, train, "g4dn.xlarge", None, "sandbox")[0] is None
    assert costs.estimate_minutes(tmp_path, smoke, "g4dn.xlarge", None, "sandbox")[0] == pytest.approx(20 / 60)


def test_rows_written_before_the_history_key_are_read_by_their_task_name_as_before(tmp_path):
    """The ledger is a user's file that exists today: a row without task_key (migration 9) counts
    for its task's name, which a task file's (and a built-in job's) history key still is."""
    ledger.record(tmp_path, _row("r1", "finetune", {"setup": 60.0, "running": 1740.0}))
    assert ledger.get(tmp_path, "r1")["task_key"] is None
    assert limits.for_task(tmp_path, "finetune", "sandbox").minutes == 90
    (tmp_path / "task.yaml").write_text("name: finetune\nrun: python train.py\n")
    from ec2gpu.api.tasks import load_task
    assert engine.TaskJob(load_task(tmp_path / "task.yaml"), {}, None).history_key == "finetune"
