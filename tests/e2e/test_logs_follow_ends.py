"""`ec2gpu logs RUN --follow` of a run in the foreground, from another terminal, in the sandbox: the
run says its id and that command first; once EC2 ends the instance under the follow, the follow ends
within seconds with the run's end, never "reconnecting" for 120 s; and the end of a follow never
suggests `ec2gpu down` for an instance its run's controller ends (issue 48, items 1, 10, 11)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from ec2gpu.runs.settle import ledger

from test_sandbox_train import leftovers, sandbox_settles  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
EC2GPU = str(Path(sys.executable).parent / "ec2gpu")


def _followed(home, tmp_path, stop):
    """Start `ec2gpu run --sandbox -- bash tick.sh`, follow it from another process once it ticks,
    call ``stop(run process, run id)``; return (the follower's exit status, stdout, stderr as one
    line, seconds from the run's end to the follower's, run id, the run's stderr)."""
    (tmp_path / "tick.sh").write_text("for i in $(seq 600); do echo tick $i; sleep 1; done\n")
    run = subprocess.Popen([EC2GPU, "run", "--sandbox", "--", "bash", "tick.sh"], cwd=tmp_path, env=dict(os.environ),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    follower, lines = None, []
    try:
        for line in run.stderr:
            lines.append(line)
            if line.startswith("| tick 2"):
                break
        run_id = ledger.runs(home, limit=1)[0]["run_id"]
        follower = subprocess.Popen([EC2GPU, "logs", run_id, "--sandbox", "--follow"], env=dict(os.environ),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(5)  # it follows the job's log
        stop(run, run_id)
        lines += run.stderr.readlines()
        run.wait(timeout=180)
        ended = time.monotonic()
        out, err = follower.communicate(timeout=90)  # before the fix: 120 s of "reconnecting"
        return (follower.returncode, out, " ".join(err.decode().split()), time.monotonic() - ended, run_id,
                "".join(lines))
    finally:
        for proc in (run, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_follow_ends_soon_after_ec2_ends_the_instance_with_the_runs_end(sandbox_env, tmp_path):
    home, _ = sandbox_env

    def terminate(run, run_id):  # another terminal's `aws ec2 terminate-instances`: the job never ends by itself
        boto3.client("ec2").terminate_instances(InstanceIds=ledger.get(home, run_id)["instance_ids"])
    code, out, err, waited, run_id, said = _followed(home, tmp_path, terminate)
    # its first lines: the run's id and the command that follows it from another terminal
    assert f"run {run_id}: from another terminal, ec2gpu logs {run_id} --sandbox --follow" in " ".join(said.split())
    assert said.index(f"run {run_id}:") < said.index("done requesting")
    row = ledger.get(home, run_id)
    assert row["status"] == "failed" and row["exit_status"] is None
    assert code == 1 and b"tick 1" in out and waited < 45, (waited, err)  # the ledger's end: no exit status
    assert "EC2 reports the instance" in err and f"ec2gpu runs show {run_id}" in err and "ec2gpu down" not in err
    assert "reconnected" not in err
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)


def test_the_end_of_a_follow_leaves_the_instance_to_its_runs_controller_and_never_says_down(sandbox_env, tmp_path):
    home, _ = sandbox_env
    code, out, err, waited, run_id, _ = _followed(home, tmp_path, lambda run, run_id: run.send_signal(signal.SIGINT))
    # Ctrl-C stops the job with SIGTERM (143), and the follow reads that, unless the instance was gone
    # first (the run, interrupted, has no exit status: 1): either way it ends at once and says so
    assert code in (143, 1) and b"tick 1" in out and waited < 45, (waited, err)
    assert ("ended with exit status 143; its run's controller" in err if code == 143 else
            "EC2 reports the instance" in err) and f"ec2gpu runs show {run_id}" in err, err
    assert "ec2gpu down" not in err
    assert ledger.get(home, run_id)["status"] == "interrupted"
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)
