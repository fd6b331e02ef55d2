"""One frozen options type per operation (runs/options.py): what each carries, and who reads what."""
import dataclasses
from types import SimpleNamespace

import pytest

from ec2gpu.runs.execute import engine
from ec2gpu.runs.options import BakeOptions, BenchOptions, LaunchOptions, RunOptions, TrainOptions
from ec2gpu.runs.provision import pipeline, resources


def test_options_are_frozen_and_keyword_only():
    opts = RunOptions(spot=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.spot = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        LaunchOptions("g5.xlarge")  # type: ignore[misc]
    assert dataclasses.replace(opts, spot=False).spot is False and opts.spot is True


def test_each_operation_carries_only_its_own_fields():
    launch = {f.name for f in dataclasses.fields(LaunchOptions)}
    run = {f.name for f in dataclasses.fields(RunOptions)} - launch
    assert {"task", "out", "keep", "budget_usd", "checkpoint_uri", "max_attempts"} <= run
    assert not launch & {"task", "out", "model", "epochs", "quick", "plan", "budget_usd"}
    assert {f.name for f in dataclasses.fields(TrainOptions)} - launch - run == {"model", "epochs", "seed",
                                                                                   "trainer_args"}
    assert {f.name for f in dataclasses.fields(BenchOptions)} - launch - run == {"quick", "data_dir"}
    assert {f.name for f in dataclasses.fields(BakeOptions)} - launch - run == {"plan"}
    # each names its own command in the ledger, and bench keeps its shorter limit
    assert (RunOptions().command, TrainOptions().command, BenchOptions().command) == \
        ("ec2gpu run", "ec2gpu train mnist", "ec2gpu bench")
    assert (LaunchOptions().max_runtime_minutes, BenchOptions().max_runtime_minutes) == (120, 60)


def test_a_bake_needs_its_plan_and_only_a_bake_has_one():
    with pytest.raises(TypeError):
        BakeOptions()  # type: ignore[call-arg]
    plan = SimpleNamespace(base="dlami", minutes=10)
    assert BakeOptions(plan=plan).bake is plan  # type: ignore[arg-type]
    assert RunOptions().bake is None and TrainOptions().bake is None


def test_attempts_default_to_three_with_spot_and_one_without():
    assert (RunOptions().attempts_allowed, RunOptions(spot=True).attempts_allowed) == (1, 3)
    assert RunOptions(spot=True, max_attempts=5).attempts_allowed == 5


def test_provisioning_reads_a_task_and_a_bake_only_where_the_options_have_them():
    job = engine.builtin_job("bench", [])
    assert resources._job(LaunchOptions()) is None and resources._bake(LaunchOptions()) is None
    assert resources._job(RunOptions(task=job)) is job
    plan = SimpleNamespace(base="dlami")
    assert resources._bake(BakeOptions(task=job, plan=plan)) is plan  # type: ignore[arg-type]
    assert resources._labels(LaunchOptions()) == ()


def test_the_built_in_trainer_is_the_task_of_train_options_alone():
    job = pipeline.builtin_task(TrainOptions(model="lenet", epochs=2))
    assert job.builtin == "mnist" and job.args[:4] == ["--model", "lenet", "--seed", "0"]
    assert pipeline.preset(TrainOptions(model="lenet", epochs=2)) == ("lenet", 2)
    assert pipeline.preset(RunOptions()) == ("cnn", None)  # a built-in task run without trainer flags
    with pytest.raises(ValueError, match="RunOptions without a task"):
        pipeline.builtin_task(RunOptions())
