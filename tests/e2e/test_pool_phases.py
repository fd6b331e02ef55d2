"""A pool's spot worker lost before the array runs (issue 51, item 10): in the sandbox, a
12-element array over 3 spot workers whose third worker gets its interruption notice in the
machine setup drops that worker, launches a replacement while elements wait, and runs every
element; nothing is left behind. Which phase decides what (drop a worker, relaunch the attempt)
is proved phase by phase in tests/unit/test_lost_in_phase.py; this is the user's case end to end."""

import pytest

from ec2gpu.sandbox import control

from test_pool import _nodes, _run_array  # same folder (pytest prepend import mode)
from test_spot_recovery import assert_nothing_left

pytestmark = [pytest.mark.e2e, pytest.mark.alone]  # three Ray nodes: as test_pool.py, by itself
NEEDS_MNIST = False


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
