"""scripts/skypilot_tally.py: SkyPilot task files sorted into clean, warned, refused and crash, by
ec2gpu's own loader; a crash is reported, never hidden. Small inline task texts, no network."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ec2gpu.tasks.spec import Resources

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "skypilot_tally.py"


@pytest.fixture(scope="module")
def tally():
    spec = importlib.util.spec_from_file_location("skypilot_tally", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["skypilot_tally"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("skypilot_tally", None)


def test_a_plain_skypilot_task_runs_as_skypilot_runs_it(tally, tmp_path):
    text = "resources:\n  accelerators: T4:1\nworkdir: .\nsetup: pip install -r requirements.txt\nrun: python train.py\n"
    r = tally.classify(text, "train.yaml", tmp_path)
    assert (r.outcome, r.text, r.reasons) == ("clean", "", [])
    assert not [n for n in r.notes if n.startswith("silent")]
    assert 0 < r.seconds < 1


def test_a_dropped_field_is_warned_and_named(tally, tmp_path):
    text = "workdir: .\nresources:\n  accelerators: T4:1\nservice:\n  replicas: 2\nrun: ls /data\n"
    r = tally.classify(text, "serve.yaml", tmp_path)
    assert r.outcome == "warned"
    assert "service" in r.text
    assert any(k.endswith(": service") for k in r.reasons)  # one reason per field named


def test_hardware_ec2_does_not_sell_is_refused_with_the_line(tally, tmp_path):
    text = "resources:\n  accelerators: MI300:8\nrun: rocm-smi\n"
    r = tally.classify(text, "amd.yaml", tmp_path)
    assert r.outcome == "refused"
    assert r.text.startswith("amd.yaml:2: ") and "MI300" in r.text
    assert r.reasons and not r.reasons[0].startswith("amd.yaml")  # grouped without the file:line


def test_a_loader_crash_is_reported_as_a_crash_with_where_it_was_raised(tally, tmp_path, monkeypatch):
    from ec2gpu.tasks import load

    def broken(text, source="<task>", base=None, allow_outside=False):
        return {}["no such key"]

    monkeypatch.setattr(load, "parse", broken)
    r = tally.classify("run: 'true'\n", "any.yaml", tmp_path)
    assert r.outcome == "crash"
    assert r.text.startswith("KeyError")
    assert r.where.startswith("test_skypilot_tally.py:")
    assert tally.tally([r])["counts"]["crash"] == 1


def test_the_rules_are_read_from_the_skypilot_tables_of_the_loader(tally):
    """Each field's treatment comes from tasks/skypilot.py's SKYPILOT_* tables: a rename, an alias,
    a warned field; the tables themselves are listed under the rules."""
    assert tally.treatment("num_nodes") == "read (as ec2gpu's nodes)"
    assert tally.treatment("resources.use_spot") == "read (as ec2gpu's resources.spot)"
    assert tally.treatment("resources.gpus") == "read (SkyPilot's other name for resources.accelerators)"
    assert tally.treatment("service") == tally.treatment("resources.disk_tier") == "warned, ignored"
    assert tally.treatment("resources.no_such_field") == "refused (unknown field)"
    rules = tally.rules_markdown({"num_nodes": 1})
    assert "`ec2gpu/tasks/skypilot.py` (its `SKYPILOT_*` tables)" in rules
    assert "- `SKYPILOT_RENAMES`: `num_nodes` → `nodes`" in rules and "- `SKYPILOT_UNSUPPORTED`: `config`" in rules


def test_an_env_value_spelled_unlike_skypilot_is_a_silent_difference(tally, tmp_path):
    loaded = SimpleNamespace(workdir=tmp_path, task=SimpleNamespace(
        envs={"USE_BF16": "false", "EPOCHS": "3"}, resources=Resources(instance_type="g5.xlarge")))
    notes = tally.silent_differences(loaded, "workdir: .\nenvs:\n  USE_BF16: false\n  EPOCHS: 3\nrun: x\n")
    assert notes == ["silent (envs): envs.USE_BF16 is 'false', SkyPilot sets 'False'"]


@pytest.mark.parametrize("text, is_task", [
    ("resources:\n  accelerators: A100:8\nrun: python train.py\n", True),
    ("name: pipeline\n---\nname: train\nrun: python train.py\n", True),  # a pipeline: several documents
    ("apiVersion: v1\nkind: Service\nspec:\n  ports: []\n", False),  # a Kubernetes manifest
    ("version: '3'\nservices:\n  web:\n    image: nginx\n", False),  # docker-compose
    ("admin_policy: my_policy.Policy\n", False),  # SkyPilot's config, not a task
    ("setup: [unclosed\nrun: python train.py\n", True),  # not YAML, still a task by its keys
])
def test_which_yaml_files_are_task_files(tally, text, is_task):
    assert tally.is_task_file(text) is is_task


def test_git_dir_is_materialized_and_write_replaces_only_the_generated_sections(tally, tmp_path, monkeypatch):
    for k in [k for k in os.environ if k.startswith(("AWS_", "EC2GPU_"))]:
        monkeypatch.delenv(k)
    for k in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.setenv(k, "")  # restored after the test; main() sets them
    repo = tmp_path / "sky"
    (repo / "examples" / "app" / "code").mkdir(parents=True)
    (repo / "examples" / "app" / "code" / "train.py").write_text("print('hi')\n")
    (repo / "examples" / "app" / "task.yaml").write_text("workdir: code\nresources:\n  cpus: 4+\nrun: python train.py\n")
    (repo / "examples" / "app" / "values.yaml").write_text("replicas: 2\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    doc = tmp_path / "skypilot.md"
    doc.write_text("intro\n<!-- skypilot_tally:rules:start -->\nold\n<!-- skypilot_tally:rules:end -->\nmiddle\n"
                   "<!-- skypilot_tally:tally:start -->\nold\n<!-- skypilot_tally:tally:end -->\nend\n")

    assert tally.main(["--git-dir", str(repo / ".git"), "--write", str(doc), "--json"]) == 0

    text = doc.read_text()
    assert text.startswith("intro\n") and "\nmiddle\n" in text and text.endswith("end\n") and "old" not in text
    assert "| `examples/app/task.yaml` | warned |" in text  # workdir `code` found: the tree was written out
    assert "`resources.cpus` | 1 | read (ec2gpu's field of that name)" in text
