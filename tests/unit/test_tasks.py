"""Task files: the model, the SkyPilot subset, GPU -> instance type, the shipped JSON Schema."""
import json

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.runs import engine
from ec2gpu.tasks import load, resolve, spec


def test_the_shipped_json_schema_is_the_models():
    assert json.loads(spec.SCHEMA_PATH.read_text()) == spec.json_schema(), \
        "regenerate it: python -m ec2gpu.tasks.spec"


def test_a_skypilot_task_maps_onto_ours_and_names_what_it_drops():
    got = load.parse("name: s\nnum_nodes: 2\nresources:\n  accelerators: {A10G: 4}\n  use_spot: true\n"
                     "  disk_size: 200\n  region: us-west-2\nfile_mounts: {/d: s3://b}\nsecrets: {TOKEN: null}\n"
                     "run: echo\n", "s.yaml")
    t = got.task
    assert got.skypilot and (t.nodes, t.resources.gpu, t.resources.spot, t.resources.disk_gib) == (2, "A10G:4", True, 200)
    assert t.envs == {"TOKEN": None} and t.secrets == ["TOKEN"]
    assert got.warnings == ["ignored SkyPilot field(s) ec2gpu does not support: file_mounts, resources.region"]


def test_our_own_format_is_not_taken_for_skypilot_and_numbers_in_envs_are_text():
    got = load.parse("run: echo\nenvs: {EPOCHS: 3, FLAG: true}\n", "t.yaml")
    assert not got.skypilot and got.task.envs == {"EPOCHS": "3", "FLAG": "true"}


def test_a_gpu_picks_the_cheapest_type_that_has_enough():
    assert resolve.instance_type_for_gpu("T4") == "g4dn.xlarge"
    assert resolve.instance_type_for_gpu("A10G:4") == "g5.12xlarge"
    assert resolve.instance_type_for_gpu("l4:8") == "g6.48xlarge"
    with pytest.raises(UsageError, match="no instance type"):
        resolve.instance_type_for_gpu("H100:16")


def test_durations_and_empty_instance_types():
    assert spec.minutes("2h") == 120 and spec.minutes(90) == 90 and spec.minutes("45s") == 0.75
    with pytest.raises(UsageError, match="resources.instance_type: .*empty"):
        load.parse("run: x\nresources: {instance_type: [g5.xlarge, '']}\n", "t.yaml")


def test_a_null_env_comes_from_this_machine_or_is_refused_by_name():
    task = load.parse("run: x\nenvs: {A: '1', B: null}\n", "t.yaml").task
    assert load.env_values(task, {"B": "2"}) == {"A": "1", "B": "2"}
    with pytest.raises(UsageError, match="envs: B is null"):
        load.env_values(task, {})


def test_the_job_environment_has_ours_and_skypilots_names(tmp_path):
    task = load.parse("name: t\nworkdir: null\nrun: x\nenvs: {A: '1'}\ncheckpoint_dir: ckpt\n", "t.yaml", tmp_path)
    job = engine.prepare(task, {})
    env = engine.node_env(job, "r1", "/home/u/ec2gpu/runs/r1", 1, ["10.0.0.1", "10.0.0.2"], 4, resume=True)
    assert env["A"] == "1" and env["EC2GPU_RESUME"] == "1" and env["EC2GPU_NODE_RANK"] == env["SKYPILOT_NODE_RANK"] == "1"
    assert env["EC2GPU_HEAD_IP"] == "10.0.0.1" and env["SKYPILOT_NODE_IPS"] == "10.0.0.1\n10.0.0.2"
    assert env["EC2GPU_CHECKPOINT_DIR"] == "/home/u/ec2gpu/workdirs/t/ckpt"
    assert env["EC2GPU_OUTPUT_DIR"] == "/home/u/ec2gpu/runs/r1/out" and env["SKYPILOT_NUM_GPUS_PER_NODE"] == "4"


def test_secret_values_are_masked(tmp_path):
    task = load.parse("run: x\nworkdir: null\nenvs: {T: null}\nsecrets: [T]\n", "t.yaml", tmp_path)
    job = engine.prepare(task, {"T": "abc123"})
    assert job.mask("token=abc123!") == "token=****!"
