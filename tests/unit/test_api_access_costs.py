"""The money and access commands as library functions, without the CLI (issue 29, item 7): bad input
is refused before a backend is opened, and the ledger-only ones (show_run, list_runs, logs of a
finished run) and an on-demand estimate need no AWS at all."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ec2gpu.api import access, costs
from ec2gpu.errors import NoCredentials, UsageError
from ec2gpu.runs.settle import ledger
from datetime import datetime, timezone
from ec2gpu.aws.instances import Instance


def _instance(iid: str, tags: dict | None = None) -> Instance:
    return Instance(iid, "g4dn.xlarge", "running", datetime.now(timezone.utc), tags=tags or {})


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh EC2GPU_HOME, outside any sandbox."""
    for k in ("EC2GPU_SANDBOX", "AWS_ENDPOINT_URL", "EC2GPU_REGION"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("call, words", [
    (lambda: costs.prices(gpu="Z80"), "unknown GPU model"),
    (lambda: costs.prices(refresh=True, sandbox=True), "no AWS Price List API"),
    (lambda: costs.estimate(model="resnet"), "unknown model"),
    (lambda: costs.estimate(max_price=0.5), "spot instances only"),
    (lambda: costs.estimate(spot=True, max_price=-1.0), "negative"),
    (lambda: costs.estimate(epochs=0), "under 1"),
    (lambda: costs.estimate(" , "), "no instance type given"),
    (lambda: costs.estimate([]), "no instance type given"),
    (lambda: costs.estimate(["g4dn.xlarge", "g2.2xlarge"]), "retired"),
    (lambda: costs.list_runs(since="lately"), "not a duration"),
    (lambda: access.fetch("r1", max_download="lots"), "--max-download: 'lots' is not a size"),
    (lambda: access.fetch("r1", max_download=-1), "--max-download: '-1' is not a size"),
    (lambda: access.fetch("r1", max_files=-1), "--max-files"),
    (lambda: access.tunnel("dev", 0), "not a port"),
    (lambda: access.tunnel("dev", 8888, local_port=70000), "--local-port 70000 is not a port"),
    (lambda: access.notebook(name="dev\nProxyCommand x"), "not a safe name"),
    (lambda: access.notebook(local_port=0), "--local-port"),
    (lambda: access.notebook(no_idle=True), "--max-runtime"),
    (lambda: access.notebook(idle_stop="30m", spot=True), "spot"),
    (lambda: access.notebook(ssh_cidr="not-a-cidr"), "CIDR"),
    (lambda: access.notebook(instance_type="t3.micro"), "no NVIDIA GPU"),
    (lambda: access.notebook(max_runtime=0), "--max-runtime 0"),
])
def test_bad_input_is_refused_before_any_backend_is_opened(no_backend, home, call, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        call()


@pytest.mark.parametrize("given, size", [("500M", 500 * 10**6), ("2GiB", 2 << 30), ("10g", 10 * 10**9),
                                         ("2048", 2048), (4096, 4096), ("1.5k", 1500)])
def test_a_download_limit_is_bytes_or_a_byte_size(given, size):
    assert access._size(given, "--max-download") == size


@pytest.mark.parametrize("given", ["-1", -1, "x", "1.5.2G"])
def test_a_download_limit_that_is_not_a_size_is_refused_naming_the_flag(given):
    with pytest.raises(UsageError, match="--max-download"):
        access._size(given, "--max-download")


def _row(run_id: str, **fields) -> dict:
    return {"run_id": run_id, "command": "ec2gpu run task.yaml", "backend": "aws", "status": "completed",
            "exit_status": 0, "started_at": "2026-11-20T12:00:00+00:00", "task": "proj", "instance_type": "g4dn.xlarge",
            "market": "on-demand", "billed_seconds": 100.0, "cost_usd": 0.25, "estimated_cost_usd": 0.3,
            "attempts": [{"attempt": 1, "instance_id": "i-1", "billed_seconds": 100.0}], **fields}


def test_show_run_returns_the_ledger_row_by_a_prefix_and_refuses_an_unknown_id(no_backend, home):
    ledger.record(home, _row("20261120-120000-abcd", summary={"loss": 0.25}))
    row = costs.show_run("20261120-1200")
    assert row["run_id"] == "20261120-120000-abcd" and row["summary"] == {"loss": 0.25} and row["cost_usd"] == 0.25
    assert row["attempts"] == [{"attempt": 1, "instance_id": "i-1", "billed_seconds": 100.0}]
    with pytest.raises(UsageError, match="no run"):
        costs.show_run("19990101")


def test_list_runs_adds_up_aws_and_sandbox_apart_filters_by_since_and_the_sandbox(no_backend, home):
    ledger.record(home, _row("r-old", started_at="2020-01-01T00:00:00+00:00"))
    ledger.record(home, _row("r-aws"))
    ledger.record(home, _row("r-sb", backend="sandbox", cost_usd=1.0, started_at="2026-11-21T12:00:00+00:00"))
    listed = costs.list_runs()
    assert [r["run_id"] for r in listed.runs] == ["r-sb", "r-aws", "r-old"]  # newest first
    assert listed.since is None and all(r["controller_gone"] is False for r in listed.runs)
    assert listed.total == {"runs": 2, "billed_seconds": 200.0, "cost_usd": 0.5, "estimated_cost_usd": 0.6}
    assert listed.sandbox_total["runs"] == 1 and listed.sandbox_total["cost_usd"] == 1.0
    assert set(costs.RUN_KEYS) <= set(listed.runs[0]) and listed.runs[0]["attempts"]  # every column
    recent = costs.list_runs(since="2026-11-01")
    assert [r["run_id"] for r in recent.runs] == ["r-sb", "r-aws"]
    assert recent.since == "2026-11-01T00:00:00+00:00" and recent.total["runs"] == 1
    assert [r["run_id"] for r in costs.list_runs(sandbox=True).runs] == ["r-sb"]


def test_list_runs_says_once_that_aws_cannot_be_reached_and_lists_the_ledger_as_it_is(home, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ledger.record(home, _row("r-lost", status="running", cost_usd=None, region="eu-west-1",
                             controller={"host": socket.gethostname(), "pid": dead.pid, "started": 1.0}))
    opened = []

    def no_credentials(region, sandbox, persistent=False, log=None):
        opened.append((region, sandbox))
        raise NoCredentials()
    monkeypatch.setattr(costs, "_context", no_credentials)
    warned, said = [], []
    listed = costs.list_runs(log=said.append, warn=warned.append)
    assert opened == [("eu-west-1", False)]  # the open row's own region, on AWS
    assert len(warned) == 1 and warned[0].startswith("could not bring the ledger's open rows up to date from AWS "
                                                     "(NoCredentials") and warned[0].endswith("listed as they are")
    [row] = listed.runs
    assert row["run_id"] == "r-lost" and row["controller_gone"] is True and row["status"] == "running"
    # the sandbox's runs alone: a sandbox that is not up is not started (nor asked) for them
    opened.clear()
    assert costs.list_runs(sandbox=True, warn=warned.append).runs == [] and opened == []


def _fake_context(home, backend="aws"):
    """backend.Context's stand-in for an on-demand estimate: a region, a home, a backend name; no AWS."""
    ctx = SimpleNamespace(aws=SimpleNamespace(region="us-east-1"), settings=SimpleNamespace(home=home),
                          backend=SimpleNamespace(name=backend, is_sandbox=backend == "sandbox"))
    return lambda *a, **k: contextlib.nullcontext(ctx)


def test_an_on_demand_estimate_prices_each_type_from_the_table_and_names_its_backend(home, monkeypatch):
    monkeypatch.setattr(costs, "_context", _fake_context(home))
    ests = costs.estimate(["g4dn.xlarge", "G5.XLARGE"], model="mlp", epochs=2)
    assert [e.instance_type for e in ests.estimates] == ["g4dn.xlarge", "g5.xlarge"]
    g4 = ests.estimates[0]
    assert g4.market == "on-demand" and g4.usd_per_hour == 0.526 and ests.backend == "aws"
    assert g4.billed_seconds >= 60 and g4.cost_usd == pytest.approx(g4.billed_seconds * 0.526 / 3600, abs=1e-4)
    assert ests.to_json()[0] == {**g4.as_dict(), "backend": "aws"}  # --json: each estimate names its backend
    assert costs.estimate("g4dn.xlarge", model="mlp", epochs=2).estimates == [g4]  # a comma-separated str: the same
    longer = costs.estimate("g4dn.xlarge", model="mlp", epochs=20).estimates[0]
    assert longer.train_seconds > g4.train_seconds



def test_cost_and_runs_json_print_the_records_as_the_documents_they_were(home, monkeypatch, capsys):
    """`cost --json` and `runs --since --json` print the api's records (CostEstimates, RunList) as the
    dicts those functions returned before they were typed: same keys, same order, same values."""
    import json

    from ec2gpu import cli
    monkeypatch.setattr(costs, "_context", _fake_context(home))
    assert cli.main(["cost", "-t", "g4dn.xlarge", "--model", "mlp", "--epochs", "2", "--json"]) == 0
    [printed] = json.loads(capsys.readouterr().out)
    assert list(printed) == ["instance_type", "market", "usd_per_hour", "price_source", "boot_seconds", "setup_seconds",
                             "train_seconds", "teardown_seconds", "time_source", "billed_seconds", "cost_usd",
                             "upper_bound", "backend"]
    assert printed["instance_type"] == "g4dn.xlarge" and printed["usd_per_hour"] == 0.526 and printed["backend"] == "aws"
    ledger.record(home, _row("r-aws"))
    assert cli.main(["runs", "--since", "2026-11-01", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert list(listed) == ["runs", "total", "sandbox_total", "since"] and listed["since"] == "2026-11-01T00:00:00+00:00"
    assert [r["run_id"] for r in listed["runs"]] == ["r-aws"] and list(listed["runs"][0]) == list(costs.RUN_KEYS)
    assert listed["total"] == {"runs": 1, "billed_seconds": 100.0, "cost_usd": 0.25, "estimated_cost_usd": 0.3}

def test_logs_of_a_finished_run_come_from_its_artifacts_without_aws(no_backend, home, tmp_path):
    artifacts = tmp_path / "runs" / "r-done"
    artifacts.mkdir(parents=True)
    (artifacts / "job.log").write_bytes(b"epoch 1\n\xff\x1b[2Jdone\n")
    ledger.record(home, _row("r-done", artifacts=str(artifacts)))
    ledger.record(home, _row("r-failed", status="failed", exit_status=3, artifacts=str(artifacts)))
    shown = access.logs("r-done")
    assert shown.to_json() == {"exit_status": 0, "run_id": "r-done", "instance_id": None, "source": "saved",
                     "log": "epoch 1\n\ufffd\x1b[2Jdone\n"}  # the job's text: making it inert is the caller's
    chunks = []
    shown = access.logs("r-fail", write=lambda chunk, final=False: chunks.append((chunk, final)))
    assert shown.to_json() == {"exit_status": 3, "run_id": "r-failed", "instance_id": None, "source": "saved"}
    assert chunks == [(b"epoch 1\n\xff\x1b[2Jdone\n", True)]


def test_fetch_brings_home_to_the_runs_artifacts_with_the_limits_asked(home, tmp_path, monkeypatch):
    from ec2gpu.remote.files import Limits
    from ec2gpu.runs.execute import logs as run_logs
    ctx = SimpleNamespace(aws=SimpleNamespace(ec2="ec2"), settings=SimpleNamespace(home=home, download_limits=Limits()))
    monkeypatch.setattr(access, "_context", lambda *a, **k: contextlib.nullcontext(ctx))
    ledger.record(home, _row("r-live", status="running", artifacts=str(tmp_path / "a"), instance_ids=["i-1"]))
    monkeypatch.setattr(run_logs, "head_instance", lambda ec2, row: None)
    with pytest.raises(UsageError, match="run r-live has no running instance to fetch from"):
        access.fetch("r-li")
    calls = []

    def fetch(ctx_, inst, run_id, out, note, limits):
        calls.append((inst.id, run_id, out, limits))
        note("brought home")
        return {"outputs": ["o.txt"], "checkpoints": [], "files": ["job.log"]}
    monkeypatch.setattr(run_logs, "head_instance", lambda ec2, row: _instance(row["instance_ids"][0]))
    monkeypatch.setattr(run_logs, "fetch", fetch)
    said = []
    got = access.fetch("r-li", max_download="1M", max_files=7, log=said.append)
    assert got.to_json() == {"run_id": "r-live", "out": str(tmp_path / "a"), "outputs": ["o.txt"], "checkpoints": [],
                   "files": ["job.log"]}
    assert calls == [("i-1", "r-live", tmp_path / "a", Limits(files=7, bytes=10**6))] and said == ["brought home"]
    got = access.fetch("r-live", out=tmp_path / "elsewhere")  # the settings' limits
    assert got.out == str(tmp_path / "elsewhere") and calls[-1][3] == Limits()


def test_notebook_serves_on_the_types_asked_and_down_on_exit_removes_its_run(home, monkeypatch):
    from ec2gpu.aws import sweep
    from ec2gpu.runs.standing import notebook as nb
    ctx = SimpleNamespace(aws=SimpleNamespace(ec2="ec2", client=lambda name: f"{name} client"),
                          settings=SimpleNamespace(home=home, instance_type="g4dn.xlarge", keys_dir=home / "keys"),
                          backend=SimpleNamespace(name="aws"))
    monkeypatch.setattr(access, "_context", lambda *a, **k: contextlib.nullcontext(ctx))
    served, removed = [], []
    info = {"instance_id": "i-1", "name": "nb", "url": "http://127.0.0.1:9999/lab?token=t", "local_port": 9999,
            "port": 8888, "token": "t"}

    def serve(aws, settings, backend, opts, ui, show_url, local_port):
        assert type(opts).__name__ == "LaunchOptions"  # instances alone: no job fields
        served.append((opts.instance_type, opts.spot, opts.idle, opts.max_runtime_minutes, local_port))
        show_url(info)
        return dict(info)
    monkeypatch.setattr(nb, "serve", serve)
    monkeypatch.setattr(sweep, "find_instances", lambda ec2, states: [
        _instance("i-1", {"ec2gpu:run": "run-nb"})])
    monkeypatch.setattr(sweep, "delete_run", lambda ec2, run_id, keys, log, iam: removed.append((run_id, iam)) or
                        {"instances": ["i-1"]})
    shown = []
    kept = access.notebook(idle_down="30m", local_port=9999, on_ready=shown.append)
    assert kept.to_json() == {**info, "terminated": False} and shown == [info] and removed == []
    assert served[-1][:2] == ("g4dn.xlarge", False) and served[-1][2].action == "down"
    assert served[-1][2].seconds == 1800 and served[-1][3:] == (120, 9999)
    gone = access.notebook(instance_type="g5.xlarge,g6.xlarge", max_runtime=30, down_on_exit=True)
    assert gone.to_json() == {**info, "terminated": True, "removed": {"instances": ["i-1"]}}
    assert removed == [("run-nb", "iam client")] and served[-1][0] == "g5.xlarge,g6.xlarge" and served[-1][3] == 30
