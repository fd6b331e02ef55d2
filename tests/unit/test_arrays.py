"""Arrays and sweeps in a task (tasks/arrays.py, tasks/spec.py): the --array grammar, grids and
lists of parameter sets, the elements a run gets, and what a task file may not say."""
import pytest
from pydantic import ValidationError

from ec2gpu.tasks import arrays
from ec2gpu.tasks.load import parse
from ec2gpu.tasks.spec import Task


@pytest.mark.parametrize("spec, want", [
    (100, (None, 100)), ("100", (None, 100)), ("0-3", ([0, 1, 2, 3], 4)), ("3,7,12", ([3, 7, 12], 13)),
    ("0-2, 9", ([0, 1, 2, 9], 10)), ("5-5", ([5], 6)), ("2,2,1", ([1, 2], 3)), (1, (None, 1)),
    (10_000, (None, 10_000)), ("9999", (None, 9999)),
])
def test_the_array_grammar(spec, want):
    assert arrays.parse_array(spec) == want


@pytest.mark.parametrize("spec, says", [
    (0, "1 to 10,000"), (10_001, "1 to 10,000"), ("5-2", "runs backwards"), ("1,,2", "not an index"),
    ("a", "not an index"), ("-1", "not an index"), ("0-10000", "indices run 0 to 9,999"), (True, "not true/false"),
])
def test_a_bad_array_says_what_is_wrong(spec, says):
    with pytest.raises(ValueError, match=says):
        arrays.parse_array(spec)


def test_a_grid_is_every_combination_the_last_name_varying_fastest():
    sets = arrays.sweep_sets({"lr": [1e-3, 3e-4], "seed": [0, 1, 2]})
    assert sets == [{"lr": lr, "seed": s} for lr in ("0.001", "0.0003") for s in "012"]
    assert arrays.sweep_sets({"flag": [True, False], "name": ["a b"]}) == [
        {"flag": "true", "name": "a b"}, {"flag": "false", "name": "a b"}]


def test_a_list_of_sets_is_taken_as_it_is():
    assert arrays.sweep_sets([{"lr": 0.1}, {"lr": 0.2, "wd": 0}]) == [{"lr": "0.1"}, {"lr": "0.2", "wd": "0"}]


@pytest.mark.parametrize("sweep, says", [
    ({}, "empty sweep"), ({"lr": []}, "list of values"), ({"lr": "0.1"}, "list of values"),
    ({"1x": [1]}, "not a parameter name"), ({"a-b": [1]}, "not a parameter name"),
    ({"EC2GPU_ARRAY_INDEX": [1]}, "set by ec2gpu"), ({"cuda_visible_devices": [0]}, "set by ec2gpu"),
    ({"lr": [[1]]}, "not a value"), ({"lr": ["x" * 1025]}, "at most 1024"),
    ({"a": list(range(101)), "b": list(range(100))}, "10,100 combinations"), ([], "a mapping of lists"),
    ([{}], "sweep\\[0\\]"), ("lr", "a mapping of lists"),
])
def test_a_bad_sweep_is_refused(sweep, says):
    with pytest.raises(ValueError, match=says):
        arrays.sweep_sets(sweep)


def test_the_elements_of_a_task_and_a_flag():
    assert arrays.elements(None, None) == []
    assert [e.index for e in arrays.elements(4)] == [0, 1, 2, 3] and arrays.elements(4)[0].size == 4
    # the flag wins, and a selection keeps the task's size (a rerun of some)
    picked = arrays.elements(100, None, "3,7")
    assert [(e.index, e.size) for e in picked] == [(3, 100), (7, 100)]
    swept = arrays.elements(None, {"lr": [1, 2], "seed": [0, 1, 2]}, "6")
    assert len(swept) == 6  # a count equal to the sweep's size: all of it
    swept = arrays.elements(None, {"lr": [1, 2], "seed": [0, 1, 2]}, "1,5")
    assert [(e.index, dict(e.params)) for e in swept] == [(1, {"lr": "1", "seed": "1"}), (5, {"lr": "2", "seed": "2"})]
    assert swept[0].env() == {"lr": "1", "seed": "1", "EC2GPU_ARRAY_INDEX": "1", "EC2GPU_ARRAY_SIZE": "6"}
    with pytest.raises(ValueError, match="past the array's end"):
        arrays.elements(None, {"lr": [1, 2]}, "0,2")
    with pytest.raises(ValueError, match="array 3 but the sweep has 2"):
        arrays.elements(3, {"lr": [1, 2]})


def test_the_built_in_trainer_takes_a_sweep_as_flags():
    e = arrays.elements(None, {"lr": [0.1], "batch_size": [64]})[0].with_flags()
    assert e.args == ("--lr", "0.1", "--batch-size", "64") and e.as_dict()["args"] == list(e.args)


def test_describe():
    assert arrays.describe(arrays.elements(12)) == "12 elements (0-11)"
    assert arrays.describe(arrays.elements(100, None, "3,7,12")) == "3 of 100 elements (3, 7, 12)"
    assert arrays.describe([]) == "no array"


def test_a_task_file_with_an_array_or_a_sweep(tmp_path):
    loaded = parse("run: echo $EC2GPU_ARRAY_INDEX\narray: 0-9\nmax_workers: 3\ngpus_per_job: 1\nmax_retries: 0\n",
                   base=tmp_path)
    task = loaded.task
    assert task.is_array and task.array == "0-9" and task.max_workers == 3 and task.max_retries == 0
    assert not Task(run="x").is_array
    assert Task(run="x", sweep=[{"a": 1}]).is_array


@pytest.mark.parametrize("fields, says", [
    ({"array": "9-1"}, "runs backwards"), ({"sweep": {"lr": []}}, "list of values"),
    ({"array": 3, "sweep": {"lr": [1]}}, "sweep has 1"), ({"array": 4, "nodes": 2}, "one instance"),
    ({"array": 4, "max_workers": 0}, "greater than or equal to 1"), ({"array": 4, "max_retries": 11}, "less than"),
])
def test_a_task_refuses_an_array_it_cannot_run(fields, says):
    with pytest.raises(ValidationError, match=says):
        Task(run="x", **fields)
