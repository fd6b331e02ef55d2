"""Ctrl-C (SIGINT) in every phase of `ec2gpu train mnist --sandbox` leaves nothing behind."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ec2gpu.runs.settle import ledger

from test_sandbox_train import leftovers, processes_gone, sandbox_settles  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
EC2GPU = str(Path(sys.executable).parent / "ec2gpu")


PAUSE = str(Path(__file__).with_name("pause_in_phase.py"))  # the CLI with a pause at the end of one phase


def run_and_interrupt(env: dict, trigger: str, timeout_s: float = 120, sig=signal.SIGINT,
                      pause_in: str | None = None, argv: list[str] | None = None) -> tuple[int, str]:
    """Start `ec2gpu ARGV` (default: a sandbox train run), pausing at the end of phase ``pause_in``,
    and send ``sig`` once ``trigger`` appears on its stderr; (code, stderr)."""
    argv = argv or ["train", "mnist", "--sandbox", "--trainer-arg=--train-subset=4096"]  # what is tested is the cleanup
    command = [EC2GPU, *argv] if pause_in is None else [sys.executable, PAUSE, pause_in, *argv]
    # a shell without job control starts background jobs with SIGINT ignored, and Python then never
    # turns it into KeyboardInterrupt: give the child the default disposition, as a terminal would
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines, sent, deadline = [], False, time.monotonic() + timeout_s
    try:
        for line in proc.stderr:
            lines.append(line)
            if not sent and trigger in line:
                proc.send_signal(sig)
                sent = True
            if time.monotonic() > deadline:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sent, f"never saw {trigger!r}:\n{''.join(lines)}"
    return code, "".join(lines)


@pytest.mark.parametrize("phase, sig", [(p, signal.SIGINT) for p in (
    "requesting", "waiting for running", "waiting for SSH", "setup", "upload", "running", "download")] + [
    ("setup", signal.SIGTERM)])
def test_sigint_in_each_phase_cleans_up_and_exits_130(sandbox_env, phase, sig):
    home, _ = sandbox_env
    if phase == "running":  # a real interrupt while the trainer runs: at its first log line (a whole epoch of
        # 60,000 images, so the job is still running when the stop reaches it on an idle machine too)
        code, err = run_and_interrupt(dict(os.environ), "| ", sig=sig,
                                      argv=["train", "mnist", "--sandbox", "--trainer-arg=--train-subset=60000"])
    else:
        code, err = run_and_interrupt(dict(os.environ), f"pausing in phase {phase}", sig=sig, pause_in=phase)
    assert code == 130, err
    assert f"stopped {phase}" in err and "Traceback" not in err
    assert "removed: instances" in err
    assert leftovers(home) == ([], [], [])
    run = ledger.runs(home, limit=1)[0]
    assert run["status"] == "interrupted" and run["billed_seconds"] >= 60
    assert not (home / "keys" / f"ec2gpu-{run['run_id']}.pem").exists()
    assert processes_gone(run["instance_ids"])
    assert sandbox_settles(home)  # no sshd of a terminated instance is left alive
    if phase == "running":  # the job's log and its agent's record came home before the teardown
        art = Path(run["artifacts"])
        assert "training cnn" in (art / "attempt-1-node-0.log").read_text()  # streamed, written through
        assert "training cnn" in (art / "job.log").read_text()
        st = json.loads((art / "agent-record.json").read_text())
        assert st["state"] == "failed" and st["exit_code"] == 143  # the job was asked to stop (SIGTERM) first
        shown = subprocess.run([EC2GPU, "logs", run["run_id"]], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "training cnn" in shown.stdout, shown.stderr


def test_a_controller_killed_with_sigkill_leaves_a_run_that_runs_and_down_settle(sandbox_env):
    import json
    home, _ = sandbox_env
    code, err = run_and_interrupt(dict(os.environ), "| ", sig=signal.SIGKILL)  # no cleanup can run
    assert code == -signal.SIGKILL, err
    row = ledger.runs(home)[0]
    # every byte the controller received is in the streamed log: it is written through, unbuffered
    assert "training cnn" in (Path(row["artifacts"]) / "attempt-1-node-0.log").read_text()
    assert row["status"] == "running" and row["attempts"]  # the instance it launched is still billing
    shown = subprocess.run([EC2GPU, "runs", "--json"], capture_output=True, text=True, check=True).stdout
    listed = next(r for r in json.loads(shown) if r["run_id"] == row["run_id"])
    assert listed["controller_gone"] is True and listed["status"] == "running"
    said = subprocess.run([EC2GPU, "runs"], capture_output=True, text=True, check=True).stdout
    assert f"ec2gpu down {row['run_id']}" in " ".join(said.split())
    fetched = subprocess.run([EC2GPU, "fetch", row["run_id"], "--sandbox", "--json", "--out", str(Path(row["artifacts"]) / "f")],
                             capture_output=True, text=True)
    assert fetched.returncode == 0, fetched.stderr
    assert {"job.log", "agent-record.json"} <= set(json.loads(fetched.stdout)["files"])  # never job.env.json
    done = subprocess.run([EC2GPU, "down", row["run_id"], "--sandbox"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert "settled as controller-lost" in said and "brought home to" in said
    # what the job had written came home before the instance went (down fetches first)
    assert "training cnn" in (Path(row["artifacts"]) / "job.log").read_text()
    settled = ledger.get(home, row["run_id"])
    assert settled["status"] == "controller-lost" and settled["billed_seconds"] >= 60 and settled["cost_usd"] > 0
    assert settled["attempts"][0]["terminated_at"] == settled["terminated_at"] and settled["ended_at"]
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)
    assert processes_gone(settled["instance_ids"])


def test_the_aws_endpoint_lost_mid_run_says_what_may_still_exist_exit_3_and_writes_what_is_known(tmp_path, mnist_dir):
    import json

    from ec2gpu.sandbox import control
    home = tmp_path / "home"
    state = control.up(home)  # a sandbox of its own: this test stops it under the run
    env = {**os.environ, "EC2GPU_HOME": str(home), "EC2GPU_DATA_DIR": str(mnist_dir), **control.env_vars(state)}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("impatient_watch.py")), "2", "train", "mnist",
                             "--sandbox", "--out", str(tmp_path / "r")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "| " in line and "training" in line:
                control.down(home)  # AWS and the instance both out of reach, as when the network goes
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        control.down(home)
    err = " ".join("".join(lines).split())
    assert code == 3, err
    assert "EC2 did not answer for the state of" in err and "Traceback" not in err
    launched = re.search(r"launched (i-[0-9a-f]+)", err).group(1)
    left = err[err.index("may still exist"):]
    assert launched in left and "security group sg-" in left and "key pair ec2gpu-" in left
    assert "ec2gpu cleanup --region us-east-1" in left
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["status"] == "failed" and record["teardown_failed"]
    from ec2gpu.runs.settle import ledger
    assert ledger.get(home, record["run_id"])["status"] == "failed"  # not left "running"


def test_a_controller_lost_mid_job_leaves_the_outputs_in_s3_and_an_instance_that_ends_itself(sandbox_env, tmp_path):
    """Issue 30, item 1: `kill -9` on the controller while its job runs; the job runs to its end,
    its agent waits for the controller (EC2GPU_HANDOVER_WAIT_SECONDS), puts the outputs, log and
    record in S3 through the URLs it was given, and shuts its instance down (terminate); `fetch`
    brings them home and `down` leaves nothing."""
    import boto3
    home, _ = sandbox_env
    env = {**os.environ, "EC2GPU_HANDOVER_WAIT_SECONDS": "2", "SECRET_TOKEN": "tok-4242"}
    job = ("sleep 4; echo 0.993 > \"$EC2GPU_OUTPUT_DIR/accuracy.txt\"; mkdir -p \"$EC2GPU_OUTPUT_DIR/sub\"; "
           "echo deep > \"$EC2GPU_OUTPUT_DIR/sub/x.txt\"; echo \"token $SECRET_TOKEN done\"")
    code, err = run_and_interrupt(env, "job started on", sig=signal.SIGKILL,
                                  argv=["run", "--sandbox", "--secret", "SECRET_TOKEN", "--expect", "1m",
                                        "--out", str(tmp_path / "r"), "--", "bash", "-c", job])
    assert code == -signal.SIGKILL, err
    row = ledger.runs(home, limit=1)[0]
    assert row["status"] == "running"
    ec2 = boto3.client("ec2", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    deadline, state = time.monotonic() + 90, None
    while time.monotonic() < deadline:  # nobody ends it but the instance itself
        state = ec2.describe_instances(InstanceIds=row["instance_ids"][:1])["Reservations"][0]["Instances"][0]["State"]
        if state["Name"] in ("shutting-down", "terminated"):
            break
        time.sleep(1)
    assert state and state["Name"] in ("shutting-down", "terminated"), state
    fetched = subprocess.run([EC2GPU, "fetch", row["run_id"], "--sandbox", "--json", "--out", str(tmp_path / "f")],
                             capture_output=True, text=True, timeout=120)
    assert fetched.returncode == 0, fetched.stderr
    got = json.loads(fetched.stdout)
    assert got["source"] == "s3-handover" and got["state"] == "succeeded" and got["handover"] == "uploaded"
    assert got["outputs"] == ["accuracy.txt", "sub/x.txt"]
    assert (tmp_path / "f" / "outputs" / "accuracy.txt").read_text() == "0.993\n"
    log = (tmp_path / "f" / "job.log").read_text()
    assert "token **** done" in log and "tok-4242" not in log  # masked on the instance, before S3
    remote = subprocess.run([EC2GPU, "runs", "--remote", "--sandbox", "--json"], capture_output=True, text=True,
                            timeout=120)
    listed = next(r for r in json.loads(remote.stdout)["runs"] if r["run_id"] == row["run_id"])
    assert "handed its outputs over" in listed["problem"]
    done = subprocess.run([EC2GPU, "down", row["run_id"], "--sandbox"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)
    assert processes_gone(row["instance_ids"])


def test_a_controller_asleep_past_the_wait_takes_what_its_instance_handed_over_and_does_not_run_it_again(
        sandbox_env, tmp_path):
    """A laptop that sleeps (SIGSTOP) while the job ends: the agent hears no heartbeat, hands over
    and ends its instance; the controller, woken (SIGCONT), finds the instance gone and takes the
    outputs from S3 rather than run the job again."""
    home, state = sandbox_env
    env = {**os.environ, "EC2GPU_HANDOVER_WAIT_SECONDS": "3"}
    job = "sleep 3; echo slept > \"$EC2GPU_OUTPUT_DIR/woke.txt\"; echo job done"
    code, out, err = _asleep_until_its_instance_ended(
        state, home, env, "job started on",
        ["run", "--sandbox", "--expect", "1m", "--json", "--out", str(tmp_path / "r"), "--", "bash", "-c", job])
    assert code == 0, err
    record = json.loads(out)
    assert record["status"] == "completed" and len(record["attempts"]) == 1, record  # not run again
    assert "while this command was away" in " ".join(err.split())
    assert (tmp_path / "r" / "outputs" / "woke.txt").read_text() == "slept\n"
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)


def _asleep_until_its_instance_ended(state: dict, home: Path, env: dict, trigger: str, argv: list[str]
                                     ) -> tuple[int, str, str]:
    """`ec2gpu ARGV`, stopped (SIGSTOP: a laptop asleep, no heartbeat, nothing collected) once
    ``trigger`` is on its stderr, and woken (SIGCONT) once its run's first instance has ended
    itself; (exit code, stdout, stderr)."""
    import boto3
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
    proc = subprocess.Popen([EC2GPU, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if trigger in line:
                proc.send_signal(signal.SIGSTOP)
                break
        row = ledger.runs(home, limit=1)[0]
        assert _ended_by_itself(ec2, row["instance_ids"][0]) in ("shutting-down", "terminated"), "".join(lines)
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    return proc.returncode, out, "".join(lines) + err


def _array_task(work: Path, name: str, workers: int = 1) -> Path:
    """A 4-element array over ``workers`` instances (one: Ray's head and its worker at once): each
    element sleeps 2 s, says a secret's value in its log, and writes its index."""
    work.mkdir()
    (work / "task.yaml").write_text(f"name: {name}\nworkdir: .\nrun: |\n  sleep 2\n  echo \"token $TOKEN\"\n"
                                    '  echo "$EC2GPU_ARRAY_INDEX" > "$EC2GPU_OUTPUT_DIR/index.txt"\n'
                                    f"array: 4\nmax_workers: {workers}\nresources:\n  instance_type: g4dn.xlarge\n"
                                    "max_runtime: 30m\nenvs:\n  TOKEN: null\nsecrets: [TOKEN]\n")
    return work / "task.yaml"


def _ended_by_itself(ec2, instance_id: str, within_s: float = 120) -> str | None:
    """The instance's state once it is shutting down or terminated (nobody ends it but itself,
    once it handed over), or its last state after ``within_s``."""
    deadline, got = time.monotonic() + within_s, None
    while time.monotonic() < deadline:
        got = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]
        if got in ("shutting-down", "terminated"):
            break
        time.sleep(1)
    return got


def test_an_array_whose_controller_is_lost_hands_its_outputs_over_to_s3(sandbox_env, tmp_path):
    """Issue 31, item 6: `kill -9` on the controller while an array runs over two instances; the
    driver finishes every element and, the controller silent (EC2GPU_HANDOVER_WAIT_SECONDS), lets
    its idle worker end its instance; the head's agent puts every element's outputs, its log and
    the element table in S3 through the URLs it was given (the secret masked) and ends its
    instance; `fetch` brings outputs/<index>/, logs/<index>.log and pool.json home, `logs --index`
    reads one; `down` leaves nothing."""
    import boto3
    home, state = sandbox_env
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
    task = _array_task(tmp_path / "work", "lost-array", workers=2)
    env = {**os.environ, "EC2GPU_HANDOVER_WAIT_SECONDS": "2", "TOKEN": "s3cr3t-t0ken"}
    code, err = run_and_interrupt(env, "element(s) submitted", sig=signal.SIGKILL, timeout_s=180,
                                  argv=["run", str(task), "--sandbox", "--out", str(tmp_path / "r")])
    assert code == -signal.SIGKILL, err
    row = ledger.runs(home, limit=1)[0]
    assert len(row["instance_ids"]) == 2
    assert _ended_by_itself(ec2, row["instance_ids"][0]) in ("shutting-down", "terminated")
    assert _ended_by_itself(ec2, row["instance_ids"][1]) in ("shutting-down", "terminated")  # the worker too
    shown = subprocess.run([EC2GPU, "status", row["run_id"], "--sandbox", "--json"], capture_output=True, text=True,
                           timeout=60)  # before `fetch`: the counts the head handed over
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["array"]["counts"]["done"] == 4, shown.stdout
    fetched = subprocess.run([EC2GPU, "fetch", row["run_id"], "--sandbox", "--json"],  # to the run's own folder
                             capture_output=True, text=True, timeout=120)
    assert fetched.returncode == 0, fetched.stderr
    got = json.loads(fetched.stdout)
    assert got["source"] == "s3-handover" and got["array"]["counts"]["done"] == 4, got
    r = tmp_path / "r"
    for k in range(4):
        assert (r / "outputs" / str(k) / "index.txt").read_text() == f"{k}\n"
        assert (r / "logs" / f"{k}.log").read_text().strip().endswith("token ****")  # masked on the instance
    assert [e["attempts"] for e in json.loads((r / "pool.json").read_text())["elements"]] == [1] * 4
    assert "no element waits" in (r / "job.log").read_text()  # the driver let its worker go (driver._release)
    done = subprocess.run([EC2GPU, "down", row["run_id"], "--sandbox"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    one = subprocess.run([EC2GPU, "logs", row["run_id"], "--index", "2", "--sandbox"], capture_output=True, text=True,
                         timeout=60)
    assert one.returncode == 0 and "token ****" in one.stdout, one.stderr
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)
    assert processes_gone(row["instance_ids"])


def test_an_array_whose_controller_slept_takes_what_its_head_handed_over_and_runs_nothing_again(
        sandbox_env, tmp_path):
    """A laptop that sleeps (SIGSTOP) while an array runs: the driver finishes every element, the
    head's agent hears no heartbeat, hands the outputs, logs and element table over to S3 and ends
    its instance; the controller, woken (SIGCONT), finds its head gone and takes the results from
    S3: every element's outputs and log home, the table in its record, one attempt."""
    home, state = sandbox_env
    task = _array_task(tmp_path / "work", "asleep-array")
    env = {**os.environ, "EC2GPU_HANDOVER_WAIT_SECONDS": "3", "TOKEN": "s3cr3t-t0ken"}
    code, out, err = _asleep_until_its_instance_ended(
        state, home, env, "element(s) submitted", ["run", str(task), "--sandbox", "--json", "--out", str(tmp_path / "r")])
    assert code == 0, err
    record = json.loads(out)
    assert record["status"] == "completed" and len(record["attempts"]) == 1, record  # no element run again
    assert [(e["index"], e["status"], e["attempts"]) for e in record["pool"]["elements"]] == \
        [(k, "succeeded", 1) for k in range(4)]
    assert "while this command was away" in " ".join(err.split()) and "s3cr3t" not in err + out
    r = tmp_path / "r"
    for k in range(4):
        assert (r / "outputs" / str(k) / "index.txt").read_text() == f"{k}\n"
        assert "token ****" in (r / "logs" / f"{k}.log").read_text()
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)
    assert processes_gone(record["instance_ids"])


def test_an_array_run_detached_returns_once_its_driver_runs_and_its_pool_ends_itself(sandbox_env, tmp_path):
    """`run --detach` of an array: the command returns once the driver runs on the pool's head;
    with nobody watching, the driver lets its idle worker go, the head's agent puts the results in
    S3 at once and ends its instance; `status` says so with the driver's counts, `fetch` brings
    the results home, and `ls` settles the run and removes what it left."""
    import boto3
    home, state = sandbox_env
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
    task = _array_task(tmp_path / "work", "detached-array", workers=2)
    env = {**os.environ, "TOKEN": "s3cr3t-t0ken"}
    got = subprocess.run([EC2GPU, "run", str(task), "--sandbox", "--detach", "--json", "--out", str(tmp_path / "r")],
                         env=env, capture_output=True, text=True, timeout=180)
    assert got.returncode == 0, got.stderr
    record = json.loads(got.stdout)
    assert record["detached"] is True and record["status"] == "running" and len(record["instance_ids"]) == 2, record
    for iid in record["instance_ids"]:  # nobody ends them but themselves
        assert _ended_by_itself(ec2, iid) in ("shutting-down", "terminated"), iid
    shown = subprocess.run([EC2GPU, "status", record["run_id"], "--sandbox", "--json"], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["detached"] and status["handover"]["state"] == "succeeded", status
    assert status["array"]["counts"]["done"] == 4, status
    fetched = subprocess.run([EC2GPU, "fetch", record["run_id"], "--sandbox", "--json"], capture_output=True,
                             text=True, timeout=120)
    assert fetched.returncode == 0 and json.loads(fetched.stdout)["array"]["counts"]["done"] == 4, fetched.stderr
    for k in range(4):
        assert (tmp_path / "r" / "outputs" / str(k) / "index.txt").read_text() == f"{k}\n"
        assert "token ****" in (tmp_path / "r" / "logs" / f"{k}.log").read_text()
    listed = subprocess.run([EC2GPU, "ls", "--sandbox"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)
    assert processes_gone(record["instance_ids"])
