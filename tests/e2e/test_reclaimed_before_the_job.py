"""Spot instances reclaimed before their job runs (issue 51, item 10), in the sandbox, as a user
meets it: a 12-element array over 3 spot workers whose third worker gets its interruption notice
in the machine setup drops that worker, launches a replacement while elements wait, and runs
every element; the second node of a two-node run reclaimed in the machine setup relaunches the
attempt (both nodes), which finishes. Nothing is left behind. Which phase decides
what is proved phase by phase in tests/unit/test_lost_in_phase.py."""
import json
import re

import pytest

from ec2gpu.sandbox import control

from test_pool import _nodes, _run_array  # same folder (pytest prepend import mode)
from test_spot_recovery import assert_nothing_left, drive

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False

TASK = """\
name: reclaimed-early
workdir: .
num_nodes: {nodes}
setup: echo "setup on $EC2GPU_NODE_RANK"
run: echo "ran on node $EC2GPU_NODE_RANK of $EC2GPU_NUM_NODES"
resources:
  instance_type: g4dn.xlarge
max_runtime: 30m
"""


@pytest.mark.parametrize("nodes", [2])  # a single node is one case of it (tests/unit/test_lost_in_phase.py has both)
def test_a_runs_node_reclaimed_in_the_machine_setup_is_replaced_and_the_run_finishes(sandbox_env, tmp_path, nodes):
    home, _ = sandbox_env
    seen: dict = {}

    def interrupt(_line, lines):  # the machine setup has begun on every node: the last one is reclaimed
        seen["lost"] = re.findall(r"i-[0-9a-f]+", [line for line in lines if line.startswith("launched ")][-1])[-1]
        control.interrupt(home, seen["lost"], 1.0)

    (tmp_path / "task.yaml").write_text(TASK.format(nodes=nodes))
    code, stdout, err = drive(["run", str(tmp_path / "task.yaml"), "--sandbox", "--spot", "--out",
                               str(tmp_path / "run"), "--json"], [("done waiting for SSH", interrupt)], timeout_s=240)
    assert code == 0, err
    record, said = json.loads(stdout), " ".join(err.split())
    lost = next(a["node"] or 0 for a in record["attempts"] if a["instance_id"] == seen["lost"])
    assert f"node {lost} ({seen['lost']}) lost in the machine setup: EC2 reports the instance terminated" in said, err
    # the whole attempt was launched again (every node), and the second one ran the job
    assert record["status"] == "completed" and "attempt 2 of 3" in err, err
    assert sorted(a["attempt"] for a in record["attempts"]) == [1] * nodes + [2] * nodes, record["attempts"]
    assert_nothing_left(home, record)


@pytest.mark.alone  # three Ray nodes: as test_pool.py, by itself
def test_an_array_whose_worker_is_interrupted_in_the_machine_setup_runs_every_element(sandbox_env, tmp_path):
    home, state = sandbox_env
    seen: dict = {}

    def interrupt(_line, lines):  # the machine setup has begun on every node
        seen["worker"] = _nodes(state, lines)["2"]
        control.interrupt(home, seen["worker"], 2.0)

    record, err = _run_array(tmp_path, [("done waiting for SSH", interrupt)], each=5, last=5)
    pool, said = record["pool"], " ".join(err.split())
    assert record["status"] == "completed" and seen["worker"] in pool["lost"], err
    assert f"pool: worker node 2 ({seen['worker']}) lost in the machine setup: EC2 reports the instance" in said
    # dropped, not the whole attempt relaunched: one attempt, and a replacement for the worker joined
    assert {a["attempt"] for a in record["attempts"]} == {1} and "attempt 2 of" not in err, err
    assert any(r["for"] == seen["worker"] and r["joined"] for r in pool["replacements"]), pool["replacements"]
    assert_nothing_left(home, record)
