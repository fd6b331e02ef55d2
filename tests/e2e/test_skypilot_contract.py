"""A SkyPilot user's task file runs first time with no flag and finds what SkyPilot gives a job
(issue 28, item 8): SkyPilot's own examples/env_check.yaml on two nodes, and a task whose setup
appends an export to ~/.bashrc, reads SKYPILOT_TASK_ID and ~/sky_workdir, and brings outputs home."""
import json
import textwrap

import pytest

from test_run_task import assert_nothing_left, project  # noqa: F401 - project: a fixture
from test_spot_recovery import drive

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False

#: SkyPilot's examples/env_check.yaml as it is at commit 93a24d4 (Apache-2.0), unchanged
ENV_CHECK = """\
num_nodes: 2

setup: |
  echo "here"
  echo "export TEST_VAR=test" >> ~/.bashrc
  [[ -v CUDA_VISIBLE_DEVICES ]] && exit 1 || exit 0
  export CUDA_VISIBLE_DEVICES=1
  [[ -v CUDA_VISIBLE_DEVICES ]] && exit 0 || exit 1

run: |
  if [[ -z "${TEST_VAR}" ]]; then
    echo "TEST_VAR is not set"
    exit 1
  else
    echo "TEST_VAR is set to ${TEST_VAR}"
  fi

  if [[ -z "$SKYPILOT_NODE_RANK" ]]; then
    echo "SKYPILOT_NODE_RANK is not set"
    exit 1
  else
    echo "SKYPILOT_NODE_RANK is set to ${SKYPILOT_NODE_RANK}"
  fi

  if [[ -z "$SKYPILOT_NODE_IPS" ]]; then
    echo "SKYPILOT_NODE_IPS is not set"
    exit 1
  else
    echo "SKYPILOT_NODE_IPS is set to ${SKYPILOT_NODE_IPS}"
    echo "${SKYPILOT_NODE_IPS}"
    echo "${SKYPILOT_NODE_IPS}" | wc -l | grep 2 || exit 1
  fi
  worker_addr=`echo "$SKYPILOT_NODE_IPS" | sed -n 2p`
  echo Worker IP: $worker_addr

  if [[ -z "$SKYPILOT_TASK_ID" ]]; then
    echo "SKYPILOT_TASK_ID is not set"
    exit 1
  else
    echo "SKYPILOT_TASK_ID is set to ${SKYPILOT_TASK_ID}"
  fi
"""


def test_skypilots_env_check_passes_on_two_nodes_with_no_flag(sandbox_env, tmp_path):
    home, _ = sandbox_env
    (tmp_path / "env_check.yaml").write_text(ENV_CHECK)
    code, stdout, err = drive(["run", "--sandbox", str(tmp_path / "env_check.yaml"), "--json",
                               "--out", str(tmp_path / "r")], [])
    assert code == 0, err
    record = json.loads(stdout)
    flat = " ".join(err.split())
    for node in (0, 1):
        assert f"node {node} | TEST_VAR is set to test" in flat
        assert f"node {node} | SKYPILOT_NODE_RANK is set to {node}" in flat
    assert f"SKYPILOT_TASK_ID is set to ec2gpu-{record['run_id']}_env_check" in flat
    assert "job control" not in flat and "Inappropriate ioctl" not in flat
    assert_nothing_left(home, record)


def test_a_skypilot_task_finds_its_bashrc_task_id_and_sky_workdir_and_brings_outputs_home(
        sandbox_env, project, tmp_path):  # noqa: F811 - project: the fixture imported above
    home, _ = sandbox_env
    (project / "sky.yaml").write_text(textwrap.dedent("""\
        name: contract
        resources:
          accelerators: T4:1
        workdir: .
        envs:
          EPOCHS: 2
          SECONDS_PER_EPOCH: 0
          GREETING: hello from envs
        setup: |
          echo 'export FROM_SETUP=written-by-setup' >> ~/.bashrc
          echo "setup rank $SKYPILOT_SETUP_NODE_RANK of ips $SKYPILOT_SETUP_NODE_IPS"
        run: |
          echo "bashrc $FROM_SETUP; $GREETING; task $SKYPILOT_TASK_ID"
          test -f ~/sky_workdir/train.py && echo "sky_workdir has train.py"
          test "$(cd ~/sky_workdir && pwd -P)" = "$(pwd -P)" && echo "sky_workdir is the workdir"
          python3 train.py
        outputs: ["summary.json"]
        """))
    code, stdout, err = drive(["run", "--sandbox", str(project / "sky.yaml"), "--json",
                               "--out", str(tmp_path / "r")], [])
    assert code == 0, err
    record = json.loads(stdout)
    flat = " ".join(err.split())
    assert "setup rank 0 of ips" in flat
    assert f"bashrc written-by-setup; hello from envs; task ec2gpu-{record['run_id']}_contract" in flat
    assert "sky_workdir has train.py" in flat and "sky_workdir is the workdir" in flat
    assert json.loads((tmp_path / "r" / "outputs" / "summary.json").read_text())["epochs"] == 2
    assert_nothing_left(home, record)
