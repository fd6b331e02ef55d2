"""Detached runs in the sandbox (issue 30): `run --detach` returns at once; the Auto Scaling group's
instance runs the agent from its user data, the job's outputs and log reach S3, and the agent ends
the group; `status` follows it from the store and removes what the run made once it is over;
`cancel` stops a running one. Nothing of the run is left afterwards."""
import base64
import gzip
import json
import os
import signal
import time
from pathlib import Path

import boto3
import pytest

from ec2gpu import api, cli
from ec2gpu.aws import runstore, runstore_records, sweep
from ec2gpu.runs.settle import ledger
from ec2gpu.sandbox import control, sshd

from test_sandbox_train import processes_gone  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False


def _client(service):
    return boto3.client(service, endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")


def _task(tmp_path: Path, run: str, setup: bool = True) -> Path:
    """A task file in tmp_path/work (with data.txt): ``run`` as its run, and a setup that writes
    setup.txt (``setup``). Also used by test_detached_fetch_logs.py."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("from the workdir\n")
    task = work / "task.yaml"
    task.write_text("name: detached\nworkdir: .\n" + ("setup: echo setup ran > setup.txt\n" if setup else "")
                    + "run: |\n" + "".join(f"  {line}\n" for line in run.splitlines()))
    return task


def _wait(run_id: str, states: tuple[str, ...], timeout_s: float = 180.0) -> dict:
    deadline, got = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        got = api.status(run_id, sandbox=True).to_json()
        if got["state"] in states:
            return got
        time.sleep(2)
    raise AssertionError(f"{run_id} still {got.get('state')} after {timeout_s} s: {got}")


def _user() -> str:
    """The sandbox caller's user id (STS GetCallerIdentity's UserId, as aws/runstore.user_id reads it)."""
    return runstore.user_id(_client("sts").get_caller_identity())


def _prefix(run_id: str) -> str:
    """Where the run is kept: under the caller's own prefix, runs/USER_ID/RUN_ID/."""
    return runstore.prefix(_user(), run_id)


def _object(bucket: str, key: str) -> str:
    return _client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()


def _nothing_left(run_id: str, timeout_s: float = 120.0) -> dict:
    """Call `status` until it has removed everything of the run; return the last inventory."""
    deadline = time.monotonic() + timeout_s
    while True:
        api.status(run_id, sandbox=True)
        found = sweep.inventory(_client("ec2"), run_id, iam=_client("iam"), autoscaling=_client("autoscaling"),
                                ssm=_client("ssm"))
        if not any(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(2)


SECRET = "hf_detached-0123456789-token"


def test_a_detached_run_finishes_with_nobody_watching_and_leaves_nothing(sandbox_env, tmp_path, capsys, monkeypatch):
    """... with a --secret: it reaches the job from SSM Parameter Store, lies in no S3 object (the
    log masks it) nor in the launch template's user data, and its parameter goes with the run."""
    task = _task(tmp_path, 'cat data.txt setup.txt > "$EC2GPU_OUTPUT_DIR/result.txt"\necho "resume=$EC2GPU_RESUME"\n'
                           'echo "token $HF_TOKEN"; printf %s "$HF_TOKEN" | wc -c > "$EC2GPU_OUTPUT_DIR/token-bytes.txt"')
    monkeypatch.setenv("HF_TOKEN", SECRET)
    started = time.monotonic()
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "30m", "--json",
                     "--secret", "HF_TOKEN"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert time.monotonic() - started < 60  # it returns once the group is made, not when the job ends
    run_id, bucket = record["run_id"], record["bucket"]
    assert record["status"] == "detached" and record["group"] == f"ec2gpu-{run_id}"
    ec2, ssm = _client("ec2"), _client("ssm")
    (template,) = ec2.describe_launch_templates(
        Filters=[{"Name": "tag:ec2gpu:run", "Values": [run_id]}])["LaunchTemplates"]
    (version,) = ec2.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"])[
        "LaunchTemplateVersions"]
    assert SECRET not in base64.b64decode(version["LaunchTemplateData"]["UserData"]).decode()
    (param,) = [p for p in ssm.describe_parameters()["Parameters"] if run_id in p["Name"]]
    assert (param["Name"], param["Type"]) == (f"/ec2gpu/runs/{run_id}/HF_TOKEN", "SecureString")
    tags = ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId=param["Name"])["TagList"]
    assert {"Key": "ec2gpu:user", "Value": _user()} in tags  # the user policy lets its maker alone read it
    role_tags = _client("iam").list_role_tags(RoleName=f"ec2gpu-{run_id}")["Tags"]
    assert {"Key": "ec2gpu:user", "Value": _user()} in role_tags  # the boundary's prefix; only its maker passes it
    done = _wait(run_id, ("succeeded", "failed", "cancelled"))
    assert done["state"] == "succeeded" and done["exit_code"] == 0, f"{done.get('message')!r} {done}"
    prefix = _prefix(run_id)
    assert _object(bucket, prefix + "outputs/result.txt") == "from the workdir\nsetup ran\n"
    log = _object(bucket, prefix + "logs/job.log")
    assert "resume=0" in log and "token ****" in log
    assert _object(bucket, prefix + "outputs/token-bytes.txt").strip() == str(len(SECRET))
    for o in _client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
        body = _client("s3").get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        assert SECRET.encode() not in (gzip.decompress(body) if o["Key"].endswith(".gz") else body), o["Key"]
    left = _nothing_left(run_id)
    assert not any(left.values()), left
    assert not [p for p in ssm.describe_parameters()["Parameters"] if run_id in p["Name"]]
    assert ledger.get(sandbox_env[0], run_id)["status"] == "completed"  # its row here, settled by `status`
    state = control.read_state(sandbox_env[0])
    assert processes_gone([i for i in state["instances"]], timeout_s=30)


def test_cancel_stops_a_detached_run_and_removes_what_it_made(sandbox_env, tmp_path, capsys):
    task = _task(tmp_path, 'echo started\nsleep 600')
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "30m", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    _wait(run_id, ("running",))
    assert cli.main(["cancel", run_id, "--sandbox", "--wait", "60", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["state"] == "cancelled" and got["removed"]["auto_scaling_groups"] == [f"ec2gpu-{run_id}"]
    assert got["waited_s"] < 60  # the agent answered: it stopped the job and saved what it had
    assert "started" in _object(got["bucket"], _prefix(run_id) + "logs/job.log")
    left = _nothing_left(run_id)
    assert not any(left.values()), left


def test_status_of_an_unknown_run_is_one_clear_line(sandbox_env, capsys):
    assert cli.main(["status", "20261125-000000-0000", "--sandbox"]) == 2
    assert "no detached run 20261125-000000-0000" in capsys.readouterr().err
    assert cli.main(["status", "../etc", "--sandbox"]) == 2
    assert "is not a run id" in capsys.readouterr().err


def test_with_its_agent_killed_a_detached_run_still_ends_at_its_deadline(sandbox_env, tmp_path, capsys):
    """The net that holds without the agent and without the controller: the group's scheduled
    action sets it to 0 at the deadline (--max-runtime 1: one minute), and nothing replaces the
    instance."""
    task = _task(tmp_path, "sleep 600")
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "1", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    run_id, started = record["run_id"], time.monotonic()
    got = _wait(run_id, ("running",))
    agents = [p for p in sshd.instance_processes(got["instance_id"])
              if any("detached.py" in part for part in _cmdline(p))]
    assert agents, "the agent runs on the instance"
    for pid in agents:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        group = api.status(run_id, sandbox=True).group
        if group and group["desired"] == 0 and not group["instances"]:
            break
        time.sleep(3)
    assert group["desired"] == 0 and not group["instances"], group
    assert time.monotonic() - started >= 40  # at the deadline, not before (the run's limit is 60 s from launch)
    assert processes_gone([got["instance_id"]], timeout_s=30)
    ended = api.status(run_id, sandbox=True).to_json()  # the next look at it records its end and removes what it made
    assert ended["state"] == "failed" and "without its agent" in ended["message"], ended
    left = _nothing_left(run_id)
    assert not any(left.values()), left


def _cmdline(pid: int) -> list[str]:
    import psutil
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def test_a_spot_interruption_is_ridden_out_by_a_replacement_that_resumes_from_the_checkpoint(
        sandbox_env, tmp_path, capsys, monkeypatch):
    """Issue 30's point: with nobody watching, AWS interrupts the spot instance; its agent saves the
    checkpoint to S3 within the notice; the group launches a replacement, whose agent downloads
    it, reads the run's secret again and restarts the job with EC2GPU_RESUME=1; the run succeeds
    with one interruption survived."""
    monkeypatch.setenv("RESUME_TOKEN", "resume-secret-42")
    task = _task(tmp_path, 'if [ "$EC2GPU_RESUME" = 1 ] && [ -f "$EC2GPU_CHECKPOINT_DIR/step" ]; then\n'
                           '  echo "resumed from step $(cat "$EC2GPU_CHECKPOINT_DIR/step") with $RESUME_TOKEN"\n'
                           '  cp "$EC2GPU_CHECKPOINT_DIR/step" "$EC2GPU_OUTPUT_DIR/resumed-from"\n'
                           '  printf %s "$RESUME_TOKEN" | wc -c > "$EC2GPU_OUTPUT_DIR/token-bytes"\n'
                           '  exit 0\n'
                           'fi\n'
                           'echo 7 > "$EC2GPU_CHECKPOINT_DIR/step"\n'
                           'echo "first attempt"\n'
                           'sleep 600')
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--spot", "--max-runtime", "30m", "--json",
                     "--secret", "RESUME_TOKEN"]) == 0
    record = json.loads(capsys.readouterr().out)
    run_id, bucket = record["run_id"], record["bucket"]
    first = _wait(run_id, ("running",))
    time.sleep(3)  # the job has written its checkpoint (not yet uploaded: the agent sends it every 60 s or at a notice)
    api.sandbox_interrupt(first["instance_id"], notice_seconds=10)
    done = _wait(run_id, ("succeeded", "failed", "cancelled"), timeout_s=240)
    assert done["state"] == "succeeded" and done["interruptions"] == 1 and done["launches"] == 2, \
        f"{done.get('message')!r} {done}"
    assert done["instance_id"] != first["instance_id"]  # the group's replacement finished it
    # its cost: both instances, each from its own times (EC2 still lists them), at the prices that applied
    assert done["cost_usd"] > 0 and [r["instance_id"] for r in done["cost"]["per_instance"]] == [
        first["instance_id"], done["instance_id"]], done.get("cost")
    assert cli.main(["status", run_id, "--sandbox"]) == 0
    said = capsys.readouterr().out
    assert "1 spot interruption survived" in said and "cost $" in said and "billed" in said, said
    prefix = _prefix(run_id)
    assert _object(bucket, prefix + "outputs/resumed-from") == "7\n"
    log = _object(bucket, prefix + "logs/job.log")
    assert log.index("first attempt") < log.index("resumed from step 7 with ****")  # one log across both instances
    assert _object(bucket, prefix + "outputs/token-bytes").strip() == "16"  # the replacement read the secret too
    left = _nothing_left(run_id)
    assert not any(left.values()), left
    # both instances as EC2 described them at the end, kept for when it no longer lists them
    kept = runstore_records.get_settled(_client("s3"), bucket, _user(), run_id)
    assert [r["instance_id"] for r in kept] == [first["instance_id"], done["instance_id"]], kept
    # this machine's ledger (`ec2gpu runs`) has the run's end and its whole cost
    row = ledger.get(sandbox_env[0], run_id)
    assert row["status"] == "completed" and row["cost_usd"] == api.status(run_id, sandbox=True).cost_usd > 0, row


def test_an_agent_rewritten_in_s3_after_launch_is_refused_on_the_instance_and_none_of_it_runs(
        sandbox_env, tmp_path, capsys, monkeypatch):
    """Issue 44, item 2: whoever may write the run's prefix (another run's file_mounts once, the
    job itself through its role) rewrites agent/detached.py after the controller uploaded it and
    before the instance fetches it. The launch template's user data holds each agent file's
    sha256: the instance refuses the file, none of it runs (the rewritten code would write a
    marker), the run ends failed saying so, and nothing of the run is left."""
    from ec2gpu.runs.detached import launch
    marker, uploaded = tmp_path / "rewritten-agent-ran", launch._upload

    def upload_then_rewrite(s3, bucket, user, run_id, job, spec):
        got = uploaded(s3, bucket, user, run_id, job, spec)
        s3.put_object(Bucket=bucket, Key=runstore.agent_prefix(user, run_id) + "detached.py",
                      Body=f"open({str(marker)!r}, 'w').write('ran')\n".encode())
        return got
    monkeypatch.setattr(launch, "_upload", upload_then_rewrite)
    task = _task(tmp_path, 'touch "$EC2GPU_OUTPUT_DIR/job-ran"')
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "30m", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    deadline, got = time.monotonic() + 180, {}
    while time.monotonic() < deadline:
        assert not marker.exists(), "the rewritten agent ran"
        got = api.status(run_id, sandbox=True).to_json()
        if got["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(2)
    assert got["state"] == "failed", got
    assert got["message"] == ("the agent code in S3 is not the code this run was launched with (detached.py has "
                              "another sha256 than its launch template says): refused, none of it ran"), got
    left = _nothing_left(run_id)
    assert not any(left.values()), left
    assert not marker.exists() and not (tmp_path / "work" / "job-ran").exists()
    assert cli.main(["status", run_id, "--sandbox"]) == 0
    assert "refused, none of it ran" in " ".join(capsys.readouterr().out.split())
