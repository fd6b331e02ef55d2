"""`ec2gpu bench` end to end: in the sandbox (launch, measure, bring home, terminate; CPU only,
and it says so) and on this machine, each run recorded so the next estimate uses its figures."""
import json

import pytest

from ec2gpu import cli
from ec2gpu.runs.settle import ledger

from test_run_task import assert_nothing_left  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e


def test_bench_in_the_sandbox_brings_its_figures_home_leaves_nothing_and_feeds_the_next_estimate(
        sandbox_env, tmp_path, capsys):
    home, _ = sandbox_env
    code = cli.main(["bench", "--sandbox", "--quick", "--out", str(tmp_path / "b"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "without a GPU: the figures are its CPU's" in captured.err
    [result] = json.loads(captured.out)
    assert result["instance_type"] == "g4dn.xlarge" and result["status"] == "completed"
    b = result["bench"]
    assert b["devices"] == ["cpu"] and b["machine"]["gpus"] == [] and set(b["training"]["models"]) == {"dbn", "cnn"}
    for name in ("bench.json", "bench.png", "summary.json"):
        assert (tmp_path / "b" / "outputs" / name).is_file(), name
    assert result["usd_per_run"]["cnn"]["usd"] > 0 and result["usd_per_hour"] > 0
    row = ledger.get(home, result["run_id"])
    assert row["task"] == "bench" and row["status"] == "completed" and row["summary"]["kind"] == "bench"
    assert_nothing_left(home, row)

    # dbn: no other test trains it, so no earlier run of it in the shared sandbox's ledger comes
    # before the bench's figure, whichever tests ran before this one
    code = cli.main(["cost", "--sandbox", "--model", "dbn", "--instance-type", "g4dn.xlarge", "--json"])
    [est] = json.loads(capsys.readouterr().out)
    sps = b["training"]["models"]["dbn"]["cpu"]["samples_per_second"]
    assert code == 0 and f"measured: {sps:,.0f} samples/s for dbn on the CPU of g4dn.xlarge by bench " \
        f"{result['run_id']} (quick sizes)" in est["time_source"]


def test_a_retired_type_among_several_is_refused_before_anything_is_launched(sandbox_env, capsys):
    home, _ = sandbox_env
    before = len(ledger.runs(home, limit=1000))
    code = cli.main(["bench", "--sandbox", "--quick", "-t", "g4dn.xlarge,g2.2xlarge"])
    assert code == 2 and "g4dn" in capsys.readouterr().err  # g2 is retired: the hint offers g4dn
    assert len(ledger.runs(home, limit=1000)) == before  # not even g4dn.xlarge ran


def test_bench_local_measures_this_machine_and_records_it(tmp_path, monkeypatch, mnist_dir, capsys):
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    code = cli.main(["bench", "--local", "--quick", "--data-dir", str(mnist_dir), "--out", str(tmp_path / "l")])
    shown = capsys.readouterr().out
    assert code == 0
    for text in ("GPU none (CPU only)", "memory and compute", "the seed experiment", "USD per run: - (no price for local)"):
        assert text in shown, text
    assert (tmp_path / "l" / "outputs" / "bench.png").is_file()
    [row] = ledger.runs(tmp_path / "home")
    assert row["task"] == "bench" and row["backend"] == "local" and row["cost_usd"] == 0.0
