"""Ctrl-C and SIGTERM in every phase of `ec2gpu exec` on a standing instance (issue 27, "done
when"): a true message, exit 130, the run's local log complete once the job ran, no job process
left on the instance (listed by pid), and the standing instance still running (exec leaves it so)."""
import json
import os
import signal
import textwrap
from pathlib import Path

import psutil
import pytest

from ec2gpu import cli
from ec2gpu.runs.settle import ledger

from test_interrupts import run_and_interrupt  # same folder (pytest prepend import mode)
from test_sandbox_train import leftovers

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # a shell job


@pytest.fixture(scope="module")
def standing(sandbox_home, tmp_path_factory):
    """One standing sandbox instance named `ix` for the module, and a task that prints then sleeps."""
    from ec2gpu.sandbox import control
    home, state = sandbox_home
    saved = {k: os.environ.get(k) for k in ("EC2GPU_HOME", *control.env_vars(state))}
    os.environ.update({"EC2GPU_HOME": str(home), **control.env_vars(state)})
    proj = tmp_path_factory.mktemp("exec-proj")
    (proj / "task.yaml").write_text(textwrap.dedent("""\
        name: ix
        workdir: .
        run: |
          echo "job began"
          sleep 60
        """))
    assert cli.main(["launch", "--sandbox", "--name", "ix", "--max-runtime", "30"]) == 0
    yield home, proj / "task.yaml"
    cli.main(["down", "ix", "--sandbox"])
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _job_processes(run_id: str) -> list[int]:
    """Pids of processes whose command line names the run (its agent, its job's shell)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(run_id in part for part in (p.info["cmdline"] or [])):
            found.append(p.info["pid"])
    return found


@pytest.mark.parametrize("phase, sig", [("waiting for SSH", signal.SIGINT), ("setup", signal.SIGTERM),
                                        ("upload", signal.SIGINT), ("running", signal.SIGTERM),
                                        ("download", signal.SIGINT)])
def test_ctrl_c_or_sigterm_in_each_phase_of_exec_says_so_and_leaves_no_job_behind(standing, phase, sig):
    home, task = standing
    argv = ["exec", "ix", str(task), "--sandbox"]
    if phase == "running":  # a real interrupt while the job runs: at its first log line
        code, err = run_and_interrupt(dict(os.environ), "| job began", sig=sig, argv=argv)
    else:
        code, err = run_and_interrupt(dict(os.environ), f"pausing in phase {phase}", sig=sig, pause_in=phase,
                                      argv=argv)
    said = " ".join(err.split())
    assert code == 130, err
    assert f"stopped {phase}" in said and "Traceback" not in err
    assert ("interrupted by Ctrl-C" if sig == signal.SIGINT else "interrupted by SIGTERM") in said
    assert "removed: instances" not in said  # exec created no instance and removes none
    run = ledger.runs(home, limit=1)[0]
    assert run["status"] == "interrupted"
    assert _job_processes(run["run_id"]) == []
    if phase == "running":  # the job's log and its agent's record came home
        art = Path(run["artifacts"])
        assert "job began" in (art / "attempt-1-node-0.log").read_text()
        assert "job began" in (art / "job.log").read_text()
        assert json.loads((art / "agent-record.json").read_text())["state"] == "failed"
    instances, _, _ = leftovers(home)
    assert len(instances) == 1  # the standing instance, still running: nothing else
