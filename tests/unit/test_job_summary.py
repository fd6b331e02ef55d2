"""A job's summary.json (and the bench's bench.json) is hostile input: bounded, masked, checked
against its schema, kept marked when it fails, and never able to break a later `ec2gpu runs`,
`runs show` or estimate, nor to feed an estimate a figure that cannot be (runs/job_summary.py)."""
import json
import os
import sqlite3
from pathlib import Path

import pytest

from ec2gpu import cli
from ec2gpu.runs.provision import bench, pipeline
from ec2gpu.runs.plan import costs
from ec2gpu.runs import job_summary
from ec2gpu.runs.execute import engine
from ec2gpu.runs.settle import ledger
from ec2gpu.runs.settle import record as run_record
from ec2gpu.tasks import load

SECRET = "s3cr3t-v4lue-4242"
T0 = "2026-11-20T10:00:00+00:00"


def _bench_summary(sps=20000.0, **row):
    """The bench's summary.json as train/bench.py's summary_of writes it."""
    return {"kind": "bench", "quick": False, "best_device": "cuda", "gpu": "T4", "gpu_count": 1,
            "models": {"cnn": {"cuda": {"samples_per_second": sps, "train_seconds": 3.0, "time_to_target_seconds": 2.5,
                                        "test_acc": 0.991, "epochs": 1, **row},
                               "cpu": {"samples_per_second": 900.0, "train_seconds": 66.6,
                                       "time_to_target_seconds": None, "test_acc": 0.99, "epochs": 1}}},
            "triad_gbs": {"cpu": 6.31, "cuda": 240.0}, "fp32_tflops": {"cpu": 0.017, "cuda": 4.1}}


TRAINER_SUMMARY = {  # train/mnist.py Trainer.summary, as one run on a CPU wrote it
    "status": "completed", "model": "cnn", "epochs": 1, "test_acc": 0.9871, "test_loss": 0.041,
    "train_seconds": 12.0042, "wall_seconds": 15.812, "time_to_target_seconds": None, "target_acc": 0.99,
    "samples_per_second": 4997.3, "device": "cpu", "world_size": 1, "params": 23466, "nodes": 1,
    "per_node": [{"node_rank": 0, "host": "ip-10-0-0-1", "ranks": 1, "samples_per_second": 4997.3}],
    "gpu_name": None, "torch_version": "2.9.0", "cuda_version": None, "amp_dtype": None, "seed": 0,
    "hparams": {"model": "cnn", "epochs": 1, "batch_size": 128, "lr": 0.1}, "data_md5": {"train": "f68b"},
    "resumed_from": None}


class _Gone:
    """An instance that is gone by the time its outputs are fetched: every call on its connection
    fails, so engine.download reports each part and reads only the summary.json already here."""

    def __getattr__(self, name):
        def gone(*_, **__):
            raise FileNotFoundError(name)
        return gone


def _job(schema="task", secrets=None, tmp_path=None):
    if schema in ("mnist", "bench"):
        return engine.builtin_job(schema, [])
    names = sorted(secrets or {})
    task = load.parse("run: x\nworkdir: null\nenvs: {" + ", ".join(f"{n}: null" for n in names) + "}\n"
                      f"secrets: [{', '.join(names)}]\n", "t.yaml", tmp_path)
    return engine.prepare(task, secrets or {})


def _finish(tmp_path, data, schema="task", secrets=None, run_id="r1", task=None, home=None):
    """What a run does with the summary.json an instance sent: engine.download reads it (the rest
    of the instance is gone), pipeline._with_summary puts it in the record, run.json and the ledger
    row are written. ``secrets``: {name: value} of the task's secrets. Returns the record."""
    from types import SimpleNamespace
    out = tmp_path / run_id
    (out / "outputs").mkdir(parents=True)
    (out / "outputs" / "summary.json").write_bytes(data if isinstance(data, bytes) else data.encode())
    node = SimpleNamespace(index=0, conn=_Gone(), run_dir="/home/ubuntu/ec2gpu/runs/" + run_id, instance_id="i-1",
                           status=None, watch=SimpleNamespace(checkpoints=SimpleNamespace(sync=lambda *_, **__: 0)))
    notes = []
    summary = engine.download([node], _job(schema, secrets, tmp_path), out, None, notes.append) or {}
    record = run_record.new(run_id, "ec2gpu run t.yaml", "sandbox", out, status="completed",
                            task=task or {"mnist": "mnist", "bench": "bench"}.get(schema, "t"),
                            model="cnn" if schema == "mnist" else None, epochs=1 if schema == "mnist" else None,
                            instance_type="g4dn.xlarge", gpu="T4", market="on-demand",
                            phases={"requesting": 1.0, "running": 40.0, "terminating": 3.0})
    pipeline._with_summary(record, summary)
    (out / "run.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    ledger.record(home or tmp_path / "home", record)
    return record


BAD = [  # (schema, what the job wrote, part of why it is refused)
    ("task", b"[1, 2, 3]", "not a JSON object but a list"),
    ("task", b'"test_acc"', "not a JSON object but a string"),
    ("task", b"5", "not a JSON object but a number"),
    ("task", b"{not json", "not JSON"),
    ("task", b'{"loss": NaN}', "not JSON: NaN"),
    ("task", b'{"loss": 1e999}', "not JSON"),
    ("task", b'{"a":' * 40 + b"1" + b"}" * 40, "nested deeper than 32"),
    ("task", b"[" * 30000 + b"]" * 30000, "nested deeper than 32"),
    ("task", b'{"a": "' + b"x" * (64 * 1024) + b'"}', "larger than 65,536 bytes"),
    ("task", b'{"a": "\xff\xfe"}', "not UTF-8"),
    ("task", b'{"k": "\\ud800"}', "lone surrogate"),
    ("mnist", b'{"test_acc": "x"}', "test_acc"),
    ("mnist", b'{"test_acc": 1.5}', "test_acc"),
    ("mnist", b'{"test_acc": true}', "test_acc"),
    ("mnist", b'{"test_acc": [1]}', "test_acc"),
    ("mnist", b'{"test_acc": 0.9, "epochs": -1}', "epochs"),
    ("mnist", b'{"test_acc": 0.9, "epochs": 2.5}', "epochs"),
    ("mnist", b'{"test_acc": 0.9, "train_seconds": -3}', "train_seconds"),
    ("mnist", b'{"test_acc": 0.9, "train_seconds": "12"}', "train_seconds"),
    ("mnist", b'{"test_acc": 0.9, "wall_seconds": 1e300}', "wall_seconds"),
    ("mnist", b'{"test_acc": 0.9, "samples_per_second": -1}', "samples_per_second"),
    ("mnist", b'{"test_acc": 0.9, "samples_per_second": 1e30}', "samples_per_second"),
    ("mnist", b'{"test_acc": 100000000000000000000000000000000}', "test_acc"),
    ("bench", json.dumps(_bench_summary(sps=-1)).encode(), "samples_per_second"),
    ("bench", json.dumps(_bench_summary(sps=1e12)).encode(), "samples_per_second"),
    ("bench", json.dumps(_bench_summary(sps="fast")).encode(), "samples_per_second"),
    ("bench", json.dumps({**_bench_summary(), "best_device": "tpu"}).encode(), "best_device"),
    ("bench", json.dumps({**_bench_summary(), "models": [1, 2]}).encode(), "models"),
]


@pytest.mark.parametrize("schema, data, why", BAD, ids=[f"{s}-{w}-{i}" for i, (s, _, w) in enumerate(BAD)])
def test_a_bad_summary_is_stored_marked_and_runs_show_and_estimates_go_on(tmp_path, monkeypatch, capsys, schema, data,
                                                                           why):
    record = _finish(tmp_path, data, schema)
    assert record["summary_schema"] == "invalid" and why in record["summary"]["invalid"], record["summary"]
    assert set(record["summary"]) == {"invalid", "raw"} and len(record["summary"]["raw"]) <= job_summary.RAW_CHARS
    assert all(record.get(k) is None for k in ("test_acc", "train_seconds", "samples_per_second"))
    assert json.loads((tmp_path / "r1" / "run.json").read_text())["summary"] == record["summary"]
    [row] = ledger.runs(tmp_path / "home")
    assert row["summary"] == record["summary"] and row["summary_schema"] == "invalid"
    history = [row]
    default = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, [])
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, history)
    assert e.train_seconds == default.train_seconds and e.time_source.startswith("default for T4")
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    assert cli.main(["runs"]) == 0 and cli.main(["runs", "--json"]) == 0 and cli.main(["runs", "show", "r1"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_what_the_trainer_and_the_bench_write_passes_their_schemas_with_its_figures(tmp_path):
    record = _finish(tmp_path, json.dumps(TRAINER_SUMMARY), "mnist")
    assert record["summary_schema"] == "mnist" and record["summary"] == TRAINER_SUMMARY
    assert (record["test_acc"], record["epochs"], record["train_seconds"], record["samples_per_second"]) == \
        (0.9871, 1, 12.0042, 4997.3)
    from ec2gpu.train import bench as instance
    report = {"quick": True, "machine": {"cpu": "AMD EPYC", "vcpus": 2, "ram_bytes": 25276502016, "gpus": [],
                                         "driver": None, "cuda": None, "torch": "2.9.0", "python": "3.11.7"},
              "devices": ["cpu"], "bandwidth": {"cpu": {"elements": 4194304, "copy_gbs": 4.2, "triad_gbs": 6.31}},
              "compute": {"cpu": {"n": 512, "fp32_tflops": 0.017}}, "peaks_source": "GPU_PEAKS",
              "training": {"models": {"cnn": {"cpu": {"train_seconds": 6.39, "samples_per_second": 921.5,
                                                      "test_acc": 0.93, "epochs": 1, "target_acc": 0.99,
                                                      "time_to_target_seconds": None, "batch_size": 128}}},
                           "batch": {"cpu": {"64": {"train_seconds": 4.48, "samples_per_second": 1328.7, "test_acc": 0.1,
                                                    "epochs": 1, "target_acc": 0.96, "time_to_target_seconds": None,
                                                    "batch_size": 64}}}}}
    record = _finish(tmp_path, json.dumps(instance.summary_of(report)), "bench", run_id="r2")
    assert record["summary_schema"] == "bench" and record["summary"]["models"]["cnn"]["cpu"]["samples_per_second"] == 921.5
    (tmp_path / "r2" / "outputs" / "bench.json").write_text(json.dumps(report))
    result = bench._result(record)
    assert result["bench"] == report and "bench_invalid" not in result
    assert result["usd_per_run"]["cnn"]["usd"] is None  # no price in this record
    assert bench.usd_per_run(record["summary"], 3.6)["cnn"] == {"seconds": 6.39, "basis": "whole run (target not reached)",
                                                                 "usd": 0.00639}


@pytest.mark.parametrize("bad", ["not json", "[]", json.dumps({"quick": True, "devices": ["tpu"]}),
                                 json.dumps({"quick": True, "machine": {"cpu": "x"}, "devices": ["cpu"]})])
def test_a_bench_json_that_is_not_the_bench_report_is_refused_and_says_why(tmp_path, bad):
    record = _finish(tmp_path, json.dumps(_bench_summary()), "bench")
    (tmp_path / "r1" / "outputs" / "bench.json").write_text(bad)
    result = bench._result(record)
    assert result["bench"] is None and result["bench_invalid"].startswith("bench.json: ")


def test_a_user_task_keeps_its_own_summary_and_only_valid_figures_reach_the_ledger(tmp_path):
    record = _finish(tmp_path, json.dumps({"test_acc": "x", "loss": 0.1, "note": "mine"}), "task")
    assert record["summary_schema"] == "task" and record["summary"] == {"test_acc": "x", "loss": 0.1, "note": "mine"}
    assert record["test_acc"] is None
    record = _finish(tmp_path, json.dumps({"test_acc": 0.97, "epochs": 3}), "task", run_id="r2")
    assert (record["test_acc"], record["epochs"]) == (0.97, 3)


def _old_ledger(home, rows: list[dict]) -> None:
    """A ledger as ec2gpu before these checks wrote it (schema version 6): the summary as
    json.dumps made it, the trainer's columns copied from it unchecked."""
    home.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(ledger.path_in(home))
    for i, sql in enumerate(ledger.MIGRATIONS[:6], start=1):
        db.execute(sql)
        db.execute(f"PRAGMA user_version = {i}")
    for r in rows:
        r = {"command": "ec2gpu run t.yaml", "backend": "sandbox", "status": "completed", "started_at": T0,
             "instance_type": "g4dn.xlarge", "gpu": "T4", "market": "on-demand", **r}
        r = {k: json.dumps(v, default=str) if k in ledger.JSON_COLUMNS else v for k, v in r.items()}
        db.execute(f"INSERT INTO runs ({', '.join(r)}) VALUES ({', '.join('?' * len(r))})", list(r.values()))
    db.commit()
    db.close()


POISONED = [  # rows an older ec2gpu stored from hostile summaries
    {"run_id": "p-list", "task": "t", "summary": [1, 2, 3]},
    {"run_id": "p-acc", "task": "t", "summary": {"test_acc": "x"}, "test_acc": "x", "exit_status": 0},
    {"run_id": "p-mnist", "task": "mnist", "model": "cnn", "epochs": "2", "test_acc": "x", "train_seconds": "x",
     "samples_per_second": -1, "summary": {"test_acc": "x", "epochs": "2", "train_seconds": "x"},
     "phases": {"running": 40.0}},
    {"run_id": "p-bench", "task": "bench", "summary": _bench_summary(sps=-1), "phases": {"running": 30.0}},
    {"run_id": "p-bench-big", "task": "bench", "summary": _bench_summary(sps=1e12)},
    {"run_id": "p-bench-shape", "task": "bench", "summary": {"kind": "bench", "best_device": ["cuda"], "models": 5}},
    {"run_id": "p-nan", "task": "t", "summary": {"loss": float("nan")}},
    {"run_id": "p-deep", "task": "t", "summary": json.loads("[" * 200 + "]" * 200)},
    {"run_id": "p-string", "task": "t", "summary": "just text"},
    {"run_id": "p-exit", "task": "t", "status": "failed", "exit_status": "x; rm -rf ~"},
]


def test_rows_poisoned_by_an_older_version_break_neither_runs_nor_runs_show_nor_estimates(tmp_path, monkeypatch,
                                                                                          capsys):
    home = tmp_path / "home"
    _old_ledger(home, [{**r, "started_at": f"2026-11-20T10:{i:02d}:00+00:00"} for i, r in enumerate(POISONED)])
    monkeypatch.setenv("EC2GPU_HOME", str(home))
    assert cli.main(["runs"]) == 0, capsys.readouterr().err
    assert "p-list" in capsys.readouterr().out
    assert cli.main(["runs", "--json"]) == 0, capsys.readouterr().err
    listed = json.loads(capsys.readouterr().out)
    assert {r["run_id"] for r in listed} == {r["run_id"] for r in POISONED}
    for r in POISONED:
        assert cli.main(["runs", "show", r["run_id"]]) == 0, (r["run_id"], capsys.readouterr().err)
        assert cli.main(["runs", "show", r["run_id"], "--json"]) == 0, (r["run_id"], capsys.readouterr().err)
    assert "Traceback" not in capsys.readouterr().err
    rows = {r["run_id"]: r for r in ledger.runs(home)}
    assert rows["p-list"]["summary"] == {"invalid": "not a JSON object but a list", "raw": "[1, 2, 3]"}
    assert rows["p-string"]["summary_schema"] == "invalid" and rows["p-nan"]["summary_schema"] == "invalid"
    assert rows["p-deep"]["summary_schema"] == "invalid"
    assert rows["p-acc"]["test_acc"] is None and rows["p-acc"]["summary"] == {"test_acc": "x"}
    assert rows["p-mnist"]["train_seconds"] is None and rows["p-mnist"]["samples_per_second"] is None
    assert rows["p-exit"]["exit_status"] is None
    # the estimates: the poisoned mnist run and benches count for nothing, so the defaults stand
    default = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, [])
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, list(rows.values()))
    assert e.train_seconds == default.train_seconds and e.time_source.startswith("default for T4"), e.time_source
    assert costs.bench_speed(list(rows.values()), "g4dn.xlarge", "T4", "cnn") is None


@pytest.mark.parametrize("sps", [-1, 0, 1e12, float("inf"), "20000", True, None])
def test_a_bench_figure_that_cannot_be_never_changes_an_estimate(tmp_path, sps):
    base = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, [])
    # as an older version stored it (no summary_schema) ...
    old = {"run_id": "b-old", "task": "bench", "instance_type": "g4dn.xlarge", "gpu": "T4", "status": "completed",
           "summary": _bench_summary(sps=sps)}
    assert costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, [old]).train_seconds == \
        base.train_seconds
    # ... and as a bench run stores it now: refused when it came home, so never a figure
    data = json.dumps(_bench_summary(sps=sps)).replace("Infinity", "1e999").encode()
    _finish(tmp_path, data, "bench")
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, ledger.runs(tmp_path / "home"))
    assert e.train_seconds == base.train_seconds and e.time_source.startswith(base.time_source)


def test_only_the_built_in_bench_feeds_an_estimate_not_a_users_task_named_bench(tmp_path):
    home = tmp_path / "home"
    _finish(tmp_path, json.dumps(_bench_summary(sps=60000.0)), "task", run_id="mine", task="bench", home=home)
    base = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, [])
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, ledger.runs(home))
    assert e.train_seconds == base.train_seconds
    _finish(tmp_path, json.dumps(_bench_summary(sps=60000.0)), "bench", run_id="real", home=home)
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, ledger.runs(home))
    assert "by bench real" in e.time_source and e.train_seconds == pytest.approx(30 + 2 * 1.0)


def test_a_secret_the_job_writes_into_summary_json_is_masked_everywhere_ec2gpu_keeps_or_shows_it(
        tmp_path, monkeypatch, capsys):
    secrets = {"T": SECRET, "N": "98765"}
    written = {"token": SECRET, f"key-{SECRET}": {"deep": [f"x{SECRET}y", {"n": 9876543}], "ok": 1},
               "number": 98765, "loss": 0.5}
    record = _finish(tmp_path, json.dumps(written), "task", secrets)
    assert record["summary"] == {"token": "****", "key-****": {"deep": ["x****y", {"n": "****"}], "ok": 1},
                                 "number": "****", "loss": 0.5}
    # an invalid one keeps its start as text: masked too
    _finish(tmp_path, f"[\"{SECRET}\", 98765]", "task", secrets, run_id="r2")
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    assert cli.main(["runs"]) == 0 and cli.main(["runs", "--json"]) == 0
    assert cli.main(["runs", "show", "r1"]) == 0 and cli.main(["runs", "show", "r2", "--json"]) == 0
    shown = capsys.readouterr()
    for where in (shown.out, shown.err, (tmp_path / "r1" / "run.json").read_text(), (tmp_path / "r2" / "run.json").read_text(),
                  ledger.path_in(tmp_path / "home").read_bytes().decode(errors="replace")):
        assert SECRET not in where and "98765" not in where
    assert "****" in shown.out


def test_summary_json_that_is_a_link_a_fifo_or_leads_outside_the_run_is_not_read(tmp_path, monkeypatch):
    private = tmp_path / "private.txt"
    private.write_text('{"aws_secret_access_key": "PRIVATE-ON-THIS-MACHINE"}')
    real_write = Path.write_bytes

    def as_planted(path, data):  # the instance's outputs as a link to a file of this machine, then a FIFO
        if path.name == "summary.json" and data == b"link":
            return path.symlink_to(private)
        if path.name == "summary.json" and data == b"fifo":
            return os.mkfifo(path)  # a plain read would block forever
        return real_write(path, data)
    monkeypatch.setattr(Path, "write_bytes", as_planted)
    record = _finish(tmp_path, b"link", "task", run_id="link")
    assert "PRIVATE" not in (tmp_path / "link" / "run.json").read_text()
    assert "PRIVATE" not in ledger.path_in(tmp_path / "home").read_bytes().decode(errors="replace")
    assert record["summary_schema"] == "invalid" and "symbolic link" in record["summary"]["invalid"]
    record = _finish(tmp_path, b"fifo", "task", run_id="fifo")
    assert record["summary_schema"] == "invalid" and "not a regular file" in record["summary"]["invalid"]
    linked = tmp_path / "linked"  # the outputs directory itself a link out of the run's directory
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "summary.json").write_text('{"a": 1}')
    linked.mkdir()
    (linked / "outputs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    got = job_summary.read_summary(linked / "outputs" / "summary.json", "task", root=linked)
    assert got.schema == "invalid" and "out of the run's directory" in got["invalid"]
    assert job_summary.read_summary(linked / "nothing.json", "task", root=linked) is None


def test_the_raw_text_of_an_invalid_summary_is_bounded_and_inert():
    text = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J" + "\u202e" + "x" * 10_000
    got = job_summary.accept(text.encode(), "task")
    assert got.schema == "invalid" and len(got["raw"]) == job_summary.RAW_CHARS
    assert all(c.isprintable() for c in got["raw"] + got["invalid"]) and got["raw"].startswith("\\x1b]52;")


def test_the_ledger_checks_what_it_is_given_whoever_calls_it(tmp_path):
    ledger.record(tmp_path, {"run_id": "r1", "command": "c", "backend": "aws", "status": "completed",
                             "started_at": T0, "summary": [1, 2, 3], "test_acc": "x", "epochs": 10 ** 30,
                             "exit_status": [1]})
    [row] = ledger.runs(tmp_path)
    assert row["summary_schema"] == "invalid" and row["summary"]["raw"] == "[1, 2, 3]"
    assert (row["test_acc"], row["epochs"], row["exit_status"]) == (None, None, None)


def test_the_physical_bound_on_samples_per_second_is_what_its_comment_says():
    # 8 H100 at 989.4 dense bf16 TFLOP/s over 6 FLOPs per weight of the mlp (668,672 weights)
    assert job_summary.SMALLEST_PRESET_TRAIN_FLOPS == 6 * 668_672
    assert 1.9e9 < job_summary.MAX_SAMPLES_PER_SECOND < 2.0e9
    assert job_summary.figure("samples_per_second", 1e12) is None
    assert job_summary.figure("samples_per_second", 5e4) == 5e4
