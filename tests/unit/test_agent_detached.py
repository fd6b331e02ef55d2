"""The instance side of a detached run (agent/detached.py, issue 30): S3 and Auto Scaling from moto
in process, real short jobs through agent.py, a fake metadata service for the spot notice."""
import http.server
import io
import json
import os
import tarfile
import threading
import time
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from ec2gpu.agent import agent, attempt, detached, mirror, prepare, store
from ec2gpu.wire import names, run_record, run_spec

RUN_ID = "20261125-101500-abcd"
GROUP = f"ec2gpu-{RUN_ID}"
BUCKET = "ec2gpu-123456789012-us-east-1"
USER = "AROAEXAMPLEROLEID0001:alice@example.com"  # whoever started the run: a role session's user id
PREFIX = f"runs/{USER}/{RUN_ID}/"
NO_IMDS = "http://127.0.0.1:9"  # nothing listens: the agent sees no notice


@pytest.fixture(scope="module")
def moto():
    """S3 and Auto Scaling in process, once for the module (a fresh start costs about a second):
    the bucket, a launch template and the run's group of one."""
    with pytest.MonkeyPatch.context() as mp:
        for k in list(os.environ):
            if k.startswith("AWS_"):
                mp.delenv(k)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        with mock_aws():
            s3 = boto3.client("s3", region_name="us-east-1")
            s3.create_bucket(Bucket=BUCKET)
            ec2 = boto3.client("ec2", region_name="us-east-1")
            asg = boto3.client("autoscaling", region_name="us-east-1")
            ec2.create_launch_template(LaunchTemplateName=GROUP, LaunchTemplateData={"ImageId": "ami-03cf127a",
                                                                                     "InstanceType": "t3.micro"})
            asg.create_auto_scaling_group(AutoScalingGroupName=GROUP, MinSize=0, MaxSize=1, DesiredCapacity=1,
                                          LaunchTemplate={"LaunchTemplateName": GROUP, "Version": "$Latest"},
                                          AvailabilityZones=["us-east-1a"])
            yield SimpleNamespace(s3=s3, asg=asg, ssm=boto3.client("ssm", region_name="us-east-1"))


@pytest.fixture
def aws(moto):
    """An empty bucket and the run's group at 0/1/1 again."""
    for o in moto.s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        moto.s3.delete_object(Bucket=BUCKET, Key=o["Key"])
    moto.asg.update_auto_scaling_group(AutoScalingGroupName=GROUP, MinSize=0, MaxSize=1, DesiredCapacity=1)
    names = [p["Name"] for p in moto.ssm.describe_parameters()["Parameters"]]
    if names:
        moto.ssm.delete_parameters(Names=names)
    return moto


def put_spec(aws, **fields):
    spec = {"version": 1, "run_id": RUN_ID, "name": "job", "setup": None, "run": "true", "envs": {"GREETING": "hi"},
            "workdir_key": None, "max_restarts_on_errors": 0, "max_launches": 5, "group": GROUP, "nodes": 1, **fields}
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "spec.json", Body=json.dumps(spec).encode())


def put_json(aws, rel, obj):
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + rel, Body=json.dumps(obj).encode())


def archive(members):
    """A workdir.tar.gz of ``members``: (name, text) for a file, or a TarInfo (links, devices)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                data = m[1].encode()
                info = tarfile.TarInfo(m[0])
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def get(aws, rel):
    try:
        return aws.s3.get_object(Bucket=BUCKET, Key=PREFIX + rel)["Body"].read().decode()
    except aws.s3.exceptions.NoSuchKey:
        return None


def status(aws):
    return json.loads(get(aws, "state.json"))


def group_size(aws):
    (g,) = aws.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    return g["MinSize"], g["MaxSize"], g["DesiredCapacity"]


def make(aws, home, instance_id="i-0aaa", endpoint=NO_IMDS, s3=None, **kw):
    meta = {"/latest/meta-data/instance-id": instance_id, "/latest/meta-data/local-ipv4": "10.0.0.5"}
    opts = dict(every_s=0.2, poll_s=0.05, agent_poll_s=0.05, stop_grace_s=3.0, settled_s=0.0)
    return detached.Detached(bucket=BUCKET, user=USER, run_id=RUN_ID, home=str(home), s3=s3 or aws.s3, asg=aws.asg,
                             ssm=aws.ssm,
                             imds=meta.get,
                             imds_endpoint=endpoint, gpus=lambda: 0, log=lambda line: None, **{**opts, **kw})


def run_dir(home):
    return home / "ec2gpu" / "runs" / RUN_ID


def test_success_uploads_outputs_log_checkpoints_and_status_and_ends_the_group(aws, tmp_path):
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "workdir.tar.gz",
                      Body=archive([("data.txt", "from the workdir\n"), ("sub/tool.sh", "echo tool\n")]))
    put_spec(aws, workdir_key=PREFIX + "workdir.tar.gz", outputs=["*.txt", "!skip.txt"],
             setup='echo "setup in $PWD rank=$SKYPILOT_SETUP_NODE_RANK"',
             run='cat data.txt; bash sub/tool.sh; echo "$GREETING $EC2GPU_RUN_ID $SKYPILOT_NUM_NODES '
                 '$EC2GPU_RESUME $SKYPILOT_TASK_ID" > "$EC2GPU_OUTPUT_DIR/result.txt"; '
                 'echo x > "$EC2GPU_OUTPUT_DIR/skip.txt"; echo x > "$EC2GPU_OUTPUT_DIR/model.bin"; '
                 'echo 7 > "$EC2GPU_CHECKPOINT_DIR/step.txt"')
    assert group_size(aws) == (0, 1, 1)
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert (st["state"], st["exit_code"], st["launches"], st["attempt"], st["restarts"]) == (
        "succeeded", 0, 1, 1, 0)
    assert st["instance_id"] == "i-0aaa" and st["ended_at"] and st["group_ended_at"] and st["group_end_error"] is None
    assert st["instances"][0]["setup_exit_code"] == 0 and st["instances"][0]["resumed"] is False
    assert [a["outcome"] for a in st["attempts"]] == ["succeeded"] and st["attempts"][0]["instance_id"] == "i-0aaa"
    assert set(st) == set(run_record.FIELDS)
    assert get(aws, "outputs/result.txt") == f"hi {RUN_ID} 1 0 ec2gpu-{RUN_ID}_job\n"
    assert get(aws, "outputs/skip.txt") is None and get(aws, "outputs/model.bin") is None  # the globs
    assert get(aws, "checkpoints/step.txt") == "7\n"
    log = get(aws, "logs/job.log")
    workdir = run_dir(tmp_path / "home") / "workdir"
    assert f"setup in {workdir} rank=0" in log and "from the workdir\ntool\n" in log
    assert group_size(aws) == (0, 0, 0)


def test_a_failing_job_restarts_up_to_the_limit_then_ends_failed(aws, tmp_path):
    put_spec(aws, max_restarts_on_errors=2,
             run='n=$(cat "$EC2GPU_CHECKPOINT_DIR/n" 2>/dev/null || echo 0); echo $((n+1)) > "$EC2GPU_CHECKPOINT_DIR/n"; '
                 'echo "try $n resume=$EC2GPU_RESUME"; exit 3')
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert (st["state"], st["exit_code"], st["attempt"], st["restarts"], st["interruptions"]) == (
        "failed", 3, 3, 2, 0)
    assert [(a["outcome"], a["exit_code"], a["resume"]) for a in st["attempts"]] == [
        ("failed", 3, False), ("failed", 3, True), ("failed", 3, True)]
    assert "try 0 resume=0\ntry 1 resume=1\ntry 2 resume=1\n" in get(aws, "logs/job.log")
    assert get(aws, "checkpoints/n") == "3\n" and group_size(aws) == (0, 0, 0)


def test_a_job_that_fails_once_then_succeeds_uses_one_restart(aws, tmp_path):
    put_spec(aws, max_restarts_on_errors=3,
             run='[ -e "$EC2GPU_CHECKPOINT_DIR/once" ] && exit 0; touch "$EC2GPU_CHECKPOINT_DIR/once"; exit 1')
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert (st["state"], st["attempt"], st["restarts"]) == ("succeeded", 2, 1)
    assert group_size(aws) == (0, 0, 0)


def test_a_failed_setup_is_a_user_code_failure(aws, tmp_path):
    put_spec(aws, setup="echo bad setup; exit 4", run=f"touch {tmp_path}/ran")
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert (st["state"], st["exit_code"], st["attempt"]) == ("failed", 4, 0) and "setup exited 4" in st["message"]
    assert st["instances"][0]["setup_exit_code"] == 4 and not (tmp_path / "ran").exists()
    assert "bad setup" in get(aws, "logs/job.log") and group_size(aws) == (0, 0, 0)


def test_what_the_setup_leaves_running_ends_before_the_job_starts(aws, tmp_path):
    """Issue 44.4: a process the setup left behind in a session of its own (`setsid nohup`) lived
    on beside the job, where it could read the key the agent signs with. Now it ends with the setup."""
    pid = tmp_path / "pid"
    put_spec(aws, setup=f"setsid nohup bash -c 'echo $$ > {pid}; exec sleep 300' > /dev/null 2>&1 < /dev/null & "
                        f"while [ ! -s {pid} ]; do sleep 0.05; done",
             run=f'kill -0 "$(cat {pid})" 2>/dev/null && echo "it still runs"; echo "the job ran"')
    assert make(aws, tmp_path / "home").execute() == 0
    log = get(aws, "logs/job.log")
    assert "the job ran" in log and "it still runs" not in log and status(aws)["state"] == "succeeded"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid.read_text()), 0)


def test_a_replacement_launch_resumes_from_the_checkpoints_and_the_earlier_log(aws, tmp_path):
    put_spec(aws, run='echo "resume=$EC2GPU_RESUME $(cat "$EC2GPU_CHECKPOINT_DIR/sub/state.txt")"')
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "checkpoints/sub/state.txt", Body=b"step 41")
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "logs/job.log", Body=b"the first instance's lines\n")
    # the first instance vanished while its job ran (no notice recorded)
    put_json(aws, "state.json", {"state": "running", "launches": 1, "attempt": 1, "restarts": 0,
                                  "interruptions": 0, "attempts": [{"attempt": 1, "outcome": "running"}]})
    assert make(aws, tmp_path / "home", instance_id="i-0bbb").execute() == 0
    st = status(aws)
    assert (st["state"], st["launches"], st["attempt"], st["interruptions"]) == ("succeeded", 2, 2, 1)
    assert [a["outcome"] for a in st["attempts"]] == ["lost", "succeeded"] and st["attempts"][1]["resume"] is True
    assert st["instances"][-1]["resumed"] is True and st["instances"][-1]["checkpoint_files"] == 1
    assert get(aws, "logs/job.log") == "the first instance's lines\nresume=1 step 41\n"


class Spy:
    """An S3 client that notes each upload (its key, and what ``noted()`` said then)."""

    def __init__(self, s3, noted):
        self.s3, self.noted, self.uploads = s3, noted, []

    def upload_file(self, path, bucket, key, *a, **kw):
        self.uploads.append((key[len(PREFIX):], self.noted()))
        return self.s3.upload_file(path, bucket, key, *a, **kw)

    def upload_fileobj(self, f, bucket, key, *a, **kw):  # while the job runs: a checkpoint's consistent copy
        self.uploads.append((key[len(PREFIX):], self.noted()))
        return self.s3.upload_fileobj(f, bucket, key, *a, **kw)

    def __getattr__(self, name):
        return getattr(self.s3, name)


class Imds(http.server.BaseHTTPRequestHandler):
    """IMDSv2 publishing a spot notice and a rebalance recommendation once ``ready()`` says so."""

    ready = staticmethod(lambda: False)

    def do_PUT(self):
        self._send(200, b"token")

    def do_GET(self):
        items = {agent.SPOT_ACTION: '{"action": "terminate", "time": "2026-11-25T10:02:00Z"}',
                 agent.REBALANCE: '{"noticeTime": "2026-11-25T10:00:00Z"}'} if self.ready() else {}
        body = items.get(self.path)
        self._send(404, b"") if body is None else self._send(200, body.encode())

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


def test_a_spot_notice_uploads_at_once_and_leaves_the_group_to_replace_the_instance(aws, tmp_path):
    first = tmp_path / "first"
    step = run_dir(first) / "checkpoints" / "step.txt"
    handler = type("I", (Imds,), {"ready": staticmethod(step.exists)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    put_spec(aws, run='if [ "$EC2GPU_RESUME" = 1 ]; then echo "resumed: $(cat "$EC2GPU_CHECKPOINT_DIR/final.txt")"; '
                      'exit 0; fi; trap \'sleep 1; echo saved-on-term > "$EC2GPU_CHECKPOINT_DIR/final.txt"; exit 143\' TERM; '
                      'echo started; echo 1 > "$EC2GPU_CHECKPOINT_DIR/step.txt"; for i in $(seq 200); do sleep 0.1; done')
    final = run_dir(first) / "checkpoints" / "final.txt"
    spy = Spy(aws.s3, final.exists)  # the job takes 1 s to write final.txt after the SIGTERM
    try:  # every_s: no periodic upload in this test, only the notice's
        code = make(aws, first, endpoint=f"http://127.0.0.1:{server.server_address[1]}", every_s=1000, s3=spy).execute()
    finally:
        server.shutdown()
    assert code == detached.EXIT_INTERRUPTED
    st = status(aws)
    assert (st["state"], st["interruptions"], st["restarts"], st["ended_at"]) == ("interrupted", 1, 0, None)
    (a,) = st["attempts"]
    assert a["outcome"] == "interrupted" and a["notice"]["action"] == "terminate" and a["exit_code"] == 143
    assert a["rebalance"]["notice_time"] == "2026-11-25T10:00:00Z"
    assert get(aws, "checkpoints/step.txt") == "1\n" and get(aws, "checkpoints/final.txt") == "saved-on-term\n"
    # step.txt went up at once, while the job was still checkpointing in its 2-minute window
    assert spy.uploads[0] == ("checkpoints/step.txt", False) and ("checkpoints/final.txt", True) in spy.uploads
    assert "started" in get(aws, "logs/job.log")
    assert group_size(aws) == (0, 1, 1) and st["group_ended_at"] is None  # AWS replaces the instance
    # the replacement: the checkpoint the job wrote on SIGTERM, then the end
    assert make(aws, tmp_path / "second", instance_id="i-0ccc").execute() == 0
    st = status(aws)
    assert (st["state"], st["launches"], st["interruptions"], st["restarts"]) == ("succeeded", 2, 1, 0)
    assert [i["instance_id"] for i in st["instances"]] == ["i-0aaa", "i-0ccc"]
    assert "resumed: saved-on-term" in get(aws, "logs/job.log") and group_size(aws) == (0, 0, 0)


def test_the_time_limit_stops_the_job_which_is_not_restarted_and_a_launch_after_it_runs_nothing(aws, tmp_path):
    put_spec(aws, max_restarts_on_errors=2, limit_at=time.time() + 1, limit_grace_s=30,
             run='trap \'echo stopped-at-limit; exit 143\' TERM; for i in $(seq 200); do sleep 0.1; done')
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert (st["state"], st["attempt"], st["restarts"]) == ("failed", 1, 0) and "time limit" in st["message"]
    assert st["attempts"][0]["outcome"] == "limit" and "stopped-at-limit" in get(aws, "logs/job.log")
    assert group_size(aws) == (0, 0, 0)
    aws.s3.delete_object(Bucket=BUCKET, Key=PREFIX + "state.json")
    put_spec(aws, limit_at=time.time() - 1, run=f"touch {tmp_path}/ran")
    assert make(aws, tmp_path / "again").execute() == 0
    assert status(aws)["state"] == "failed" and not (tmp_path / "ran").exists()


def test_a_record_the_job_forges_in_the_run_directory_is_not_believed(aws, tmp_path):
    """The agent signs its record (agent-record.json) with a key this agent gave it: a job that writes
    a notice (or a pid to kill) there is not believed."""
    forged = json.dumps({"state": "interrupted", "pid": 1, "notice": {"action": "terminate"}})
    put_spec(aws, run=f"echo '{forged}' > \"${{EC2GPU_OUTPUT_DIR%/out}}/agent-record.json\"; sleep 0.5; echo done")
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert st["state"] == "succeeded" and st["attempts"][0]["notice"] is None and st["interruptions"] == 0


def test_a_launch_beyond_max_launches_ends_the_group_without_running(aws, tmp_path):
    put_spec(aws, max_launches=3, run=f"touch {tmp_path}/ran")
    put_json(aws, "state.json", {"state": "interrupted", "launches": 3, "attempt": 3, "interruptions": 3})
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert (st["state"], st["launches"], st["attempt"]) == ("failed", 4, 3) and "max_launches 3" in st["message"]
    assert not (tmp_path / "ran").exists() and group_size(aws) == (0, 0, 0)


@pytest.mark.parametrize("before", [{"state": "succeeded", "launches": 1, "message": None}, "cancel"])
def test_a_finished_or_cancelled_run_ends_the_group_without_running(aws, tmp_path, before):
    put_spec(aws, run=f"touch {tmp_path}/ran")
    if before == "cancel":
        put_json(aws, "cancel", {})
    else:
        put_json(aws, "state.json", before)
    assert make(aws, tmp_path / "home").execute() == 0
    assert status(aws)["state"] == ("cancelled" if before == "cancel" else "succeeded")
    assert not (tmp_path / "ran").exists() and group_size(aws) == (0, 0, 0)


def test_a_cancel_object_stops_the_job_and_ends_cancelled(aws, tmp_path):
    home = tmp_path / "home"
    put_spec(aws, run='trap \'echo got-term; exit 143\' TERM; echo partial > "$EC2GPU_OUTPUT_DIR/partial.txt"; '
                      'for i in $(seq 200); do sleep 0.1; done')
    marker = run_dir(home) / "out" / "partial.txt"

    def cancel_when_running():
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        put_json(aws, "cancel", {"by": "test"})
    threading.Thread(target=cancel_when_running, daemon=True).start()
    start = time.monotonic()
    assert make(aws, home).execute() == 0
    assert time.monotonic() - start < 15
    st = status(aws)
    assert st["state"] == "cancelled" and [a["outcome"] for a in st["attempts"]] == ["cancelled"]
    assert get(aws, "outputs/partial.txt") == "partial\n" and "got-term" in get(aws, "logs/job.log")
    assert group_size(aws) == (0, 0, 0)


def test_a_later_launch_supersedes_this_one_which_stops_its_job_and_writes_nothing_more(aws, tmp_path):
    """Capacity Rebalancing starts the replacement before it ends the old instance: the old one
    must not go on writing the run's prefix (the newer launch writes its record on each heartbeat,
    as this test's thread does)."""
    home = tmp_path / "home"
    put_spec(aws, run='echo 1 > "$EC2GPU_CHECKPOINT_DIR/a"; for i in $(seq 200); do sleep 0.1; done')
    newer = {"state": "running", "launches": 2, "instance_id": "i-0new"}
    done = threading.Event()

    def newer_launch():
        deadline = time.monotonic() + 20
        while get(aws, "checkpoints/a") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        while not done.is_set() and time.monotonic() < deadline:
            put_json(aws, "state.json", newer)
            time.sleep(0.1)
    thread = threading.Thread(target=newer_launch, daemon=True)
    thread.start()
    start = time.monotonic()
    try:
        assert make(aws, home).execute() == detached.EXIT_SUPERSEDED
    finally:
        done.set()
        thread.join()
    assert time.monotonic() - start < 15  # the job was stopped, not run out
    assert status(aws) == newer and group_size(aws) == (0, 1, 1)


class Interleaved:
    """The S3 client, with another writer's write of state.json (``write``) made once, just before
    this agent's first write of state.json that ``when(number, record)`` picks (its number from 1,
    the record it writes): after its check read the record, before its own write lands."""

    def __init__(self, s3, when, write):
        self.s3, self.when, self.write, self.puts = s3, when, write, 0

    def __getattr__(self, name):
        return getattr(self.s3, name)

    def put_object(self, **kw):
        if kw["Key"] == PREFIX + "state.json":
            self.puts += 1
            if self.write and self.when(self.puts, json.loads(kw["Body"])):
                self.write, write = None, self.write
                write()
        return self.s3.put_object(**kw)


def nth(n):
    return lambda number, record: number == n


def in_state(state):
    return lambda number, record: record["state"] == state


def test_a_newer_launchs_record_written_between_the_check_and_the_write_is_not_lost(aws, tmp_path):
    """Without a conditional write the older launch wrote over the newer one's record and ran on."""
    put_spec(aws, run="for i in $(seq 200); do sleep 0.1; done")
    newer = {"state": "running", "launches": 2, "instance_id": "i-0new"}
    s3 = Interleaved(aws.s3, nth(3), lambda: put_json(aws, "state.json", newer))
    start = time.monotonic()
    assert make(aws, tmp_path / "home", s3=s3).execute() == detached.EXIT_SUPERSEDED
    assert s3.puts >= 3 and time.monotonic() - start < 15  # stopped, not run out
    assert status(aws) == newer and group_size(aws) == (0, 1, 1)


def test_of_two_launches_that_read_the_record_at_once_the_first_to_write_takes_the_number(aws, tmp_path):
    put_spec(aws, run="for i in $(seq 200); do sleep 0.1; done")
    other = {"state": "starting", "launches": 1, "instance_id": "i-0other"}
    s3 = Interleaved(aws.s3, nth(1), lambda: put_json(aws, "state.json", other))
    assert make(aws, tmp_path / "home", s3=s3).execute() == detached.EXIT_SUPERSEDED
    assert status(aws) == other and not run_dir(tmp_path / "home").exists()  # prepared nothing, ran nothing


def test_an_older_launchs_late_heartbeat_is_written_over_and_the_run_goes_on(aws, tmp_path):
    put_json(aws, "state.json", {"state": "running", "launches": 1, "instance_id": "i-0old"})
    put_spec(aws, run="sleep 1")
    late = {"state": "running", "launches": 1, "instance_id": "i-0old", "updated_at": "late"}
    s3 = Interleaved(aws.s3, nth(2), lambda: put_json(aws, "state.json", late))
    assert make(aws, tmp_path / "home", s3=s3).execute() == 0
    st = status(aws)
    assert st["state"] == "succeeded" and st["launches"] == 2 and st["instance_id"] == "i-0aaa"


def test_an_older_launchs_own_end_neither_overwrites_a_newer_launch_nor_ends_its_group(aws, tmp_path):
    put_spec(aws, run="exit 3")  # fails; no restarts: the launch ends the run "failed" (a write without the check)
    newer = {"state": "running", "launches": 2, "instance_id": "i-0new"}
    s3 = Interleaved(aws.s3, in_state("failed"), lambda: put_json(aws, "state.json", newer))
    assert make(aws, tmp_path / "home", s3=s3).execute() == detached.EXIT_SUPERSEDED
    assert status(aws) == newer and group_size(aws) == (0, 1, 1)


def test_a_record_that_is_not_one_written_in_between_is_written_over(aws, tmp_path):
    put_spec(aws, run="sleep 1")
    s3 = Interleaved(aws.s3, in_state("running"), lambda: aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "state.json",
                                                                            Body=b"{not json"))
    assert make(aws, tmp_path / "home", s3=s3).execute() == 0
    assert status(aws)["state"] == "succeeded"


def test_the_agent_and_the_run_store_take_the_same_s3_answers_for_a_conditional_write_that_failed():
    from ec2gpu.aws import runstore_objects
    assert store.CONFLICT_CODES == runstore_objects.CONFLICT_CODES


def test_the_agent_keys_the_run_under_the_same_prefix_as_the_run_store():
    """The agent ships alone, with wire/names.py: the run store keys every run by the same module."""
    from ec2gpu.aws import runstore
    assert runstore.USER_ID is names.USER_ID and runstore.RUN_ID is names.RUN_ID
    assert store.Store(None, BUCKET, USER, RUN_ID).prefix == runstore.prefix(USER, RUN_ID) == PREFIX


@pytest.mark.parametrize("bad", ["a/b", "../x", "*", "", "AROAX:a,b", "x" * 200, ".."])
def test_a_user_id_that_is_not_one_is_refused_before_any_key_is_made(aws, tmp_path, bad):
    with pytest.raises(detached.Refused):
        detached.Detached(bucket=BUCKET, user=bad, run_id=RUN_ID, home=str(tmp_path), s3=aws.s3, asg=aws.asg)
    assert detached.main(["--bucket", BUCKET, "--user", bad, "--run-id", RUN_ID, "--region", "us-east-1"]) == \
        detached.EXIT_REFUSED
    assert aws.s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


def test_an_end_recorded_by_cancel_is_never_overwritten_by_a_running_agent(aws, tmp_path):
    """`ec2gpu cancel` records "cancelled" itself when the agent does not answer in time: an agent
    still running (busy, or slow) stops and writes nothing more, so the run's end stands."""
    home = tmp_path / "home"
    put_spec(aws, run='echo 1 > "$EC2GPU_CHECKPOINT_DIR/a"; for i in $(seq 200); do sleep 0.1; done')
    ended = {"state": "cancelled", "launches": 1, "message": "cancelled: the group was ended by `ec2gpu cancel`"}
    done = threading.Event()

    def cancel_without_the_agent():
        deadline = time.monotonic() + 20
        while get(aws, "checkpoints/a") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        put_json(aws, "state.json", ended)
        done.set()
    thread = threading.Thread(target=cancel_without_the_agent, daemon=True)
    thread.start()
    start = time.monotonic()
    try:
        assert make(aws, home).execute() == detached.EXIT_SUPERSEDED
    finally:
        thread.join()
    assert done.is_set() and time.monotonic() - start < 15 and status(aws) == ended


@pytest.mark.parametrize("member", [
    ("../evil", "x"), ("/tmp/ec2gpu-detached-evil", "x"), ("a/../../evil", "x"),
    link("out", "/etc"), link("up", "../.."), link("deep/up", "../../.."),
    link("hard", "/etc/passwd", tarfile.LNKTYPE),
    # lexically inside, really outside: d -> . makes d/d/.. the parent of the workdir
    [link("d", "."), link("x", "d/d/..")],
    [("f", "ok"), link("x", "f"), link("y", "x/../../..")],
])
def test_a_hostile_workdir_archive_is_refused_and_nothing_is_written(tmp_path, member):
    members = member if isinstance(member, list) else [member]
    path = tmp_path / "w.tar.gz"
    path.write_bytes(archive(members))
    dest = tmp_path / "box" / "workdir"
    dest.parent.mkdir()
    with pytest.raises(detached.Refused):
        prepare.extract_workdir(str(path), str(dest))
    assert not dest.exists() and os.listdir(dest.parent) == [] and not (tmp_path / "evil").exists()


def test_devices_too_many_members_and_too_many_bytes_are_refused(tmp_path):
    dev = tarfile.TarInfo("null")
    dev.type = tarfile.CHRTYPE
    for members, kw in (([dev], {}), ([("a", "1"), ("b", "2")], {"max_members": 1}),
                        ([("a", "12345")], {"max_bytes": 4}), ([("a", "1"), ("a", "2")], {})):
        path = tmp_path / "w.tar.gz"
        path.write_bytes(archive(members))
        with pytest.raises(detached.Refused):
            prepare.extract_workdir(str(path), str(tmp_path / "wd"), **kw)
        assert not (tmp_path / "wd").exists()


def test_a_fair_archive_is_unpacked_with_its_modes_and_one_link_refuses_it_whole(tmp_path):
    """The workdir `run --detach` packs (launch.pack) holds regular files, modes kept (an executable
    stays one; setuid dropped); it never holds a link (remote/sync.manifest leaves them out), so the
    one unpacker's rule applies on the instance as on this machine: a link, even one inside, is
    refused, and with it the whole archive (issue 45 item 2: one unpacker)."""
    setuid = tarfile.TarInfo("run.sh")
    setuid.size, setuid.mode = 3, 0o4755
    plain = tarfile.TarInfo("sub/data.txt")
    plain.size, plain.mode = 2, 0o644

    def packed(*links):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.addfile(setuid, io.BytesIO(b"hi\n"))
            tar.addfile(plain, io.BytesIO(b"ok"))
            for link_member in links:
                tar.addfile(link_member)
        path = tmp_path / "w.tar.gz"
        path.write_bytes(buf.getvalue())
        return str(path)
    assert prepare.extract_workdir(packed(), str(tmp_path / "wd")) == 2
    assert (tmp_path / "wd" / "run.sh").read_text() == "hi\n" and (tmp_path / "wd" / "sub" / "data.txt").read_text() == "ok"
    assert (tmp_path / "wd" / "run.sh").stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "wd" / "sub" / "data.txt").stat().st_mode & 0o7777 == 0o644
    for inside in (link("sub/up", "../run.sh"), link("copy", "run.sh", tarfile.LNKTYPE)):
        with pytest.raises(detached.Refused, match="refused"):
            prepare.extract_workdir(packed(inside), str(tmp_path / "wd2"))
        assert not (tmp_path / "wd2").exists()


def test_a_hostile_archive_in_a_run_ends_it_failed_without_running(aws, tmp_path):
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "workdir.tar.gz", Body=archive([("../escape", "x")]))
    put_spec(aws, workdir_key=PREFIX + "workdir.tar.gz", run=f"touch {tmp_path}/ran")
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert st["state"] == "failed" and "workdir archive" in st["message"] and st["attempt"] == 0
    assert not (tmp_path / "ran").exists() and not (tmp_path / "home" / "ec2gpu" / "runs" / "escape").exists()
    assert group_size(aws) == (0, 0, 0)


@pytest.mark.parametrize("bad", ["2026/../x", "../20261125-101500-abcd", "20261125-101500-abcd/x", "", "x" * 40])
def test_a_run_id_that_is_not_one_is_refused_before_any_key_is_made(aws, tmp_path, bad):
    with pytest.raises(detached.Refused):
        detached.Detached(bucket=BUCKET, user=USER, run_id=bad, home=str(tmp_path), s3=aws.s3, asg=aws.asg)
    assert detached.main(["--bucket", BUCKET, "--user", USER, "--run-id", bad, "--region", "us-east-1"]) == \
        detached.EXIT_REFUSED
    assert aws.s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


@pytest.mark.parametrize("fields", [
    {"run_id": f"{RUN_ID}/../20261125-101500-ffff"}, {"run_id": "20261125-101500-ffff"},
    {"group": "ec2gpu-20261125-101500-ffff"}, {"workdir_key": "runs/20261125-101500-ffff/workdir.tar.gz"},
    {"workdir_key": f"runs/{RUN_ID}/workdir.tar.gz"},  # the layout before the user id: outside the run's prefix
    {"workdir_key": f"runs/AIDAEXAMPLEUSERID0002/{RUN_ID}/workdir.tar.gz"},  # the same run id, another user's
    {"workdir_key": f"{PREFIX}../../other/workdir.tar.gz"}, {"checkpoint_dir": "../up"}, {"outputs": ["../*"]},
    {"envs": {"A=B": "x"}}, {"nodes": 0}, {"nodes": 65}, {"max_launches": True}, {"name": "a/b"}, {"run": 5},
    {"limit_at": float("nan")}, {"max_launches": 0}, {"secrets": "HF_TOKEN"}, {"secrets": ["A=B"]},
    {"secrets": ["../x"]}, {"secrets": ["A", "A"]}, {"secrets": [7]}, {"mounts": "x"},
    {"mounts": [{"target": "/etc/../x", "kind": "local", "key": f"{PREFIX}mounts/0", "is_file": True}]},
    {"mounts": [{"target": "~/x;rm", "kind": "local", "key": f"{PREFIX}mounts/0", "is_file": True}]},
    {"mounts": [{"target": "~", "kind": "local", "key": f"{PREFIX}mounts/0", "is_file": True}]},
    {"mounts": [{"target": "~/x", "kind": "local", "key": "runs/20261125-101500-ffff/mounts/0", "is_file": True}]},
    {"mounts": [{"target": "~/x", "kind": "local", "key": f"runs/AIDAEXAMPLEUSERID0002/{RUN_ID}/mounts/0",
                 "is_file": True}]},
    {"mounts": [{"target": "~/d", "kind": "s3", "bucket": "data", "prefix": "p/", "region": "us-east-1"},
                {"target": "~/x", "kind": "local", "key": "p/mounts/0", "is_file": True}]},  # not the S3 mount's prefix
    {"mounts": [{"target": "~/x", "kind": "local", "key": f"{PREFIX}workdir.tar.gz", "is_file": True}]},
    {"mounts": [{"target": "~/x", "kind": "s3", "bucket": "Bad_Bucket", "prefix": "", "region": "us-east-1"}]},
    {"mounts": [{"target": "~/x", "kind": "s3", "bucket": "data", "prefix": "", "region": "us east"}]},
    {"mounts": [{"target": "~/x", "kind": "gs", "bucket": "data", "prefix": "", "region": "us-east-1"}]},
])
def test_a_hostile_spec_is_refused_and_the_run_ends_failed(aws, tmp_path, fields):
    put_spec(aws, run=f"touch {tmp_path}/ran")
    spec = json.loads(get(aws, "spec.json"))
    put_json(aws, "spec.json", {**spec, **fields})
    assert make(aws, tmp_path / "home").execute() == detached.EXIT_REFUSED
    st = status(aws)
    assert st["state"] == "failed" and st["message"].startswith("spec refused") and st["group"] == GROUP
    assert not (tmp_path / "ran").exists() and group_size(aws) == (0, 0, 0)


def test_a_spec_rewritten_after_launch_is_refused_and_the_run_ends_failed(aws, tmp_path):
    """The user data hands the agent spec.json's sha256 (runs/detached/launch.boot_script): a
    spec.json with other bytes (rewritten in S3 after launch) is refused, nothing of it runs, and
    the run ends failed with that reason; the launched bytes pass."""
    import hashlib
    put_spec(aws, run=f"touch {tmp_path}/ran")
    launched = get(aws, "spec.json").encode()
    sha = hashlib.sha256(launched).hexdigest()
    put_json(aws, "spec.json", {**json.loads(launched), "run": f"touch {tmp_path}/rewritten-ran"})
    assert make(aws, tmp_path / "home", spec_sha256=sha).execute() == detached.EXIT_REFUSED
    st = status(aws)
    assert st["state"] == "failed" and st["message"].startswith("spec refused: spec.json is not the one this run was "
                                                               "launched with")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "rewritten-ran").exists()
    assert group_size(aws) == (0, 0, 0)
    aws.s3.delete_object(Bucket=BUCKET, Key=PREFIX + "state.json")
    aws.asg.update_auto_scaling_group(AutoScalingGroupName=GROUP, MinSize=0, MaxSize=1, DesiredCapacity=1)
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "spec.json", Body=launched)
    assert make(aws, tmp_path / "home2", spec_sha256=sha).execute() == 0
    assert status(aws)["state"] == "succeeded" and (tmp_path / "ran").exists()
    assert detached.main(["--bucket", BUCKET, "--user", USER, "--run-id", RUN_ID, "--region", "us-east-1",
                          "--spec-sha256", "not-a-hash"]) == detached.EXIT_REFUSED


SECRET = "hunter2-the-token-0123456789"


def test_the_secrets_reach_the_setup_and_the_job_from_parameter_store_and_no_s3_object_holds_them(aws, tmp_path):
    """spec.json names the secret; the agent reads its value from the run's SecureString parameter
    (aws/parameters.py) into the setup's and the job's environment; the log it uploads has the
    value masked, and neither state.json nor any other object of the run holds it."""
    aws.ssm.put_parameter(Name=f"/ec2gpu/runs/{RUN_ID}/HF_TOKEN", Value=SECRET, Type="SecureString")
    put_spec(aws, secrets=["HF_TOKEN"], setup='echo "setup sees $HF_TOKEN"',
             run='echo "job sees $HF_TOKEN and $GREETING"; printf %s "$HF_TOKEN" > "$EC2GPU_OUTPUT_DIR/token.txt"')
    assert make(aws, tmp_path / "home").execute() == 0
    assert status(aws)["state"] == "succeeded"
    assert get(aws, "outputs/token.txt") == SECRET  # the job had it (its outputs are its own to write)
    log = get(aws, "logs/job.log")
    assert "setup sees ****" in log and "job sees **** and hi" in log and SECRET not in log
    for o in aws.s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]:
        if not o["Key"].endswith("outputs/token.txt"):
            assert SECRET not in get(aws, o["Key"][len(PREFIX):]), o["Key"]


def test_a_missing_secret_ends_the_run_failed_before_the_setup(aws, tmp_path):
    put_spec(aws, secrets=["HF_TOKEN"], setup=f"touch {tmp_path}/setup-ran", run=f"touch {tmp_path}/ran")
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert st["state"] == "failed" and "HF_TOKEN not found in SSM Parameter Store" in st["message"]
    assert not (tmp_path / "setup-ran").exists() and not (tmp_path / "ran").exists() and group_size(aws) == (0, 0, 0)


def test_the_agent_reads_secrets_where_the_controller_puts_them_and_masks_as_the_controller_does():
    from ec2gpu.aws import parameters
    from ec2gpu.runs import job_summary
    assert parameters.name_of(RUN_ID, "X") == f"{prepare.SECRET_ROOT}{RUN_ID}/X"
    assert agent.MASK == job_summary.MASK
    assert agent.mask_bytes(b"a hunter2 b hunter", ["hunter", "hunter2"]) == b"a **** b ****"


def test_file_mounts_are_in_place_before_the_setup_and_mount_mode_ones_are_written_back(aws, tmp_path, monkeypatch):
    """A local directory (an archive in the run's prefix), a local file, an S3 prefix copied in with
    the role, an S3 MOUNT-mode target whose new files reach their bucket by the end, and an
    absolute target placed under the sandbox instance's own root."""
    root = tmp_path / "root"
    monkeypatch.setenv("EC2GPU_SANDBOX_ROOT", str(root))
    data = "ec2gpu-test-mount-data"
    aws.s3.create_bucket(Bucket=data)
    for key, body in (("ds/a.txt", "from s3 a\n"), ("ds/sub/b.txt", "from s3 b\n"), ("database/no.txt", "x"),
                      ("one.csv", "one object\n")):
        aws.s3.put_object(Bucket=data, Key=key, Body=body.encode())
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "mounts/0.tar.gz", Body=archive([("x.txt", "local dir\n")]))
    aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "mounts/1", Body=b"local file\n")
    mounts = [{"target": "~/local", "kind": "local", "key": PREFIX + "mounts/0.tar.gz", "is_file": False},
              {"target": "/etc/app/cfg.txt", "kind": "local", "key": PREFIX + "mounts/1", "is_file": True},
              {"target": "~/data", "kind": "s3", "bucket": data, "prefix": "ds", "region": "us-east-1",
               "file": False, "write_back": False},
              {"target": "~/results", "kind": "s3", "bucket": data, "prefix": "results/", "region": "us-east-1",
               "file": False, "write_back": True},
              {"target": "~/deep/er/one.csv", "kind": "s3", "bucket": data, "prefix": "one.csv", "region": "us-east-1",
               "file": True, "write_back": False}]  # one object, into folders not there yet
    put_spec(aws, mounts=mounts, setup=f'cat ~/local/x.txt > {tmp_path}/setup-saw',
             run=f'cat ~/local/x.txt {root}/etc/app/cfg.txt ~/data/a.txt ~/data/sub/b.txt ~/deep/er/one.csv; '
                 'ls ~/data; echo result > ~/results/r.txt')
    assert make(aws, tmp_path / "home").execute() == 0
    assert status(aws)["state"] == "succeeded", status(aws)
    assert (tmp_path / "setup-saw").read_text() == "local dir\n"
    log = get(aws, "logs/job.log")
    assert "local dir\nlocal file\nfrom s3 a\nfrom s3 b\none object\n" in log and "database" not in log
    assert not (tmp_path / "etc").exists()  # an absolute target never on this machine's own /
    got = aws.s3.get_object(Bucket=data, Key="results/r.txt")["Body"].read()
    assert got == b"result\n"


@pytest.mark.parametrize("reader", ["me", "no-such-user-here"])
def test_the_log_is_shared_with_the_ssh_users_group_and_nothing_else_of_the_run(aws, tmp_path, reader):
    """job.log 0640 and the run's directory and the agent's home 0710, in the SSH user's group, so
    `logs --follow` reads it live; the job's environment file stays 0600. A user the instance does
    not have is said, and the run goes on."""
    import getpass
    import grp
    import pwd
    import stat as st_
    user = getpass.getuser() if reader == "me" else reader
    put_spec(aws, log_reader=user, run="echo hello")
    lines = []
    run = make(aws, tmp_path / "home")
    run.ctx.log = lines.append
    assert run.execute() == 0 and status(aws)["state"] == "succeeded"
    rd = run_dir(tmp_path / "home")
    mode = lambda p: st_.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(rd / "job.env.json") == 0o600
    if reader == "me":
        gid = pwd.getpwnam(user).pw_gid
        assert (mode(rd / "job.log"), mode(rd), mode(tmp_path / "home")) == (0o640, 0o710, 0o710)
        assert os.stat(rd / "job.log").st_gid == gid == os.stat(rd).st_gid, grp.getgrgid(gid)
    else:
        assert mode(rd) == 0o700 and any("not shared with no-such-user-here" in line for line in lines)


def test_a_mount_that_cannot_be_put_in_place_ends_the_run_failed_naming_it(aws, tmp_path):
    put_spec(aws, mounts=[{"target": "~/data", "kind": "s3", "bucket": "ec2gpu-no-such-bucket", "prefix": "x",
                           "region": "us-east-1", "file": False, "write_back": False}], run=f"touch {tmp_path}/ran")
    assert make(aws, tmp_path / "home").execute() == 0
    st = status(aws)
    assert st["state"] == "failed" and st["message"].startswith("file_mounts ~/data: not put in place"), st
    assert not (tmp_path / "ran").exists() and group_size(aws) == (0, 0, 0)


@pytest.mark.parametrize("reader, kept", [("First.Last", "First.Last"), ("ubuntu", "ubuntu"), ("root; rm", None),
                                          ("-o", None), (7, None), ("x" * 40, None)])
def test_a_log_reader_that_is_no_user_name_is_none_and_the_run_goes_on(reader, kept):
    spec = run_spec.parse({"run_id": RUN_ID, "name": "job", "run": "true", "log_reader": reader}, RUN_ID, PREFIX)
    assert spec["log_reader"] == kept


def test_the_log_cut_to_its_last_bytes_starts_at_a_line_and_never_sends_half_a_secret(aws, tmp_path, monkeypatch):
    monkeypatch.setattr(mirror, "LOG_MAX", 25)
    run = make(aws, tmp_path / "home")
    run.ctx.secrets = {"T": "hunter2-secret"}
    os.makedirs(run.ctx.run_dir)
    with open(os.path.join(run.ctx.run_dir, "job.log"), "wb") as f:
        f.write(b"x" * 20 + b" hunter2-secret tail\nlast line\n")  # the last 25 bytes begin inside the secret
    run.uploads.push_log()
    assert get(aws, "logs/job.log") == "last line\n"


def test_the_agent_places_targets_as_the_controller_does():
    from ec2gpu.tasks import mounts
    for target in ("~/x", "x", "/data", "/a/./b/c.txt", "~/d/e/"):  # the spec holds normal_target's spelling
        for root in ("", "/sandbox/root"):
            sent = mounts.normal_target(target)
            assert run_spec.TARGET_RE.fullmatch(sent)
            assert run_spec.on_instance(sent, "/home/u", root) == mounts.on_instance(target, "/home/u", root)


def test_the_end_is_recorded_before_the_group_goes_even_when_s3_refuses_it_at_first(aws, tmp_path):
    """A group at 0 under a record still "running" reads as a run that ended without its agent:
    the final record is tried again (with backoff) until S3 takes it, and only then is the group ended."""
    put_spec(aws, run="echo done")
    refused, seen_at_end, sleeps = [], [], []

    class FlakyS3:
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def put_object(self, **kw):
            if kw["Key"].endswith("state.json") and b'"succeeded"' in kw["Body"] and len(refused) < 2:
                refused.append(kw["Key"])
                raise ConnectionError("S3 did not answer")
            return self.real.put_object(**kw)

    class WatchedAsg:
        def update_auto_scaling_group(self, **kw):
            seen_at_end.append(status(aws)["state"])
            return aws.asg.update_auto_scaling_group(**kw)

    run = make(aws, tmp_path / "home", s3=FlakyS3(aws.s3))
    run.ctx.asg, run.ctx.sleep = WatchedAsg(), sleeps.append
    assert run.execute() == 0
    assert len(refused) == 2 and [x for x in sleeps if x >= 1] == [2.0, 4.0]  # the backoff (polls are 0.05 s)
    assert seen_at_end == ["succeeded"] and status(aws)["state"] == "succeeded" and group_size(aws) == (0, 0, 0)


def test_ending_the_group_is_retried_until_it_works_and_each_failure_is_recorded(aws, tmp_path):
    put_spec(aws)
    calls, sleeps, seen = [], [], []

    class Flaky:
        def update_auto_scaling_group(self, **kw):
            calls.append(kw)
            if len(calls) <= 3:
                raise RuntimeError("throttled")
            return aws.asg.update_auto_scaling_group(**kw)

    run = make(aws, tmp_path / "home")
    run.ctx.asg = Flaky()
    run.ctx.sleep = lambda s: (sleeps.append(s), seen.append(status(aws)["group_end_error"]))
    assert run.execute() == 0
    assert calls[-1] == {"AutoScalingGroupName": GROUP, "MinSize": 0, "MaxSize": 0, "DesiredCapacity": 0}
    assert len(calls) == 4 and sleeps[-3:] == [2.0, 4.0, 8.0] and all("throttled" in e for e in seen[-3:])
    st = status(aws)
    assert st["group_end_error"] is None and st["group_ended_at"] and group_size(aws) == (0, 0, 0)


def test_the_job_environment_is_the_engines_and_so_are_its_shell_words():
    from ec2gpu.aws import groups
    from ec2gpu.runs.execute import engine, nodes
    from ec2gpu.tasks.spec import Resources
    spec = run_spec.parse({"run_id": RUN_ID, "name": "job", "run": "true", "envs": {"A": "1"},
                                "checkpoint_dir": "ckpt"}, RUN_ID, PREFIX)
    job = SimpleNamespace(name="job", env={"A": "1"}, task=SimpleNamespace(checkpoint_dir="ckpt", resources=Resources()))
    rd = "/h/ec2gpu/runs/" + RUN_ID
    ours = attempt.job_env(spec, rd, "/h/ec2gpu/workdirs/job", "10.0.0.5", 4, True, "/opt/pytorch/bin/python")
    theirs = engine.node_env(job, RUN_ID, rd, 0, ["10.0.0.5"], 4, True, "/opt/pytorch/bin/python")
    assert ours == theirs
    # the shell words are one module's (wire/shell.py, shipped beside the agent): no copy to keep equal
    from ec2gpu.wire import shell
    assert (attempt.INTERACTIVE, attempt.HANDOFF, attempt.PROLOGUE) == (engine.INTERACTIVE, engine.HANDOFF,
                                                                          engine.PROLOGUE)
    assert all(getattr(m, w) is getattr(shell, w) for m in (attempt, engine) for w in ("INTERACTIVE", "HANDOFF", "PROLOGUE"))
    from ec2gpu.runs.detached import launch
    assert "shell.py" in launch.AGENT_FILES
    assert attempt.PROGRESS_FILE == nodes.PROGRESS_FILE and names.GROUP_PREFIX + RUN_ID == groups.name_of(RUN_ID)
    with_secret = attempt.job_env(spec, rd, "/h/ec2gpu/workdirs/job", "10.0.0.5", 4, True,
                                   "/opt/pytorch/bin/python", {"HF_TOKEN": "t"})
    assert with_secret == {**theirs, "HF_TOKEN": "t"}
    limited = attempt.job_env({**spec, "gpus_limit": 1}, rd, "/w", "10.0.0.5", 8, False, "python3")
    assert (limited["CUDA_VISIBLE_DEVICES"], limited["EC2GPU_GPUS_PER_NODE"]) == ("0", "1")


def test_output_globs_read_as_the_tasks_outputs():
    w = mirror.wanted
    assert w("a/b.txt", []) and w("a/b.txt", ["*.txt"]) and not w("a/b.txt", ["*.txt", "!b.txt"])
    assert w("model/x.pt", ["model/"]) and not w("model", ["model/"]) and w("x/y/z.pt", ["**/*.pt"])
    assert w("top.txt", ["/top.txt"]) and not w("sub/top.txt", ["/top.txt"])


def test_the_only_credentials_are_the_instance_roles(monkeypatch, tmp_path):
    """Keys in the environment or in ~/.aws (a file anyone sent) are never used: the metadata
    service's role credentials only."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFROMTHEENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = AKIAFROMAFILE\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", NO_IMDS + "/")
    monkeypatch.setenv("AWS_METADATA_SERVICE_NUM_ATTEMPTS", "1")
    session = detached.role_session("us-east-1")
    resolver = session._session.get_component("credential_provider")
    assert [p.METHOD for p in resolver.providers] == ["iam-role"]
    assert session.get_credentials() is None  # no metadata service here: none, not the keys above


def test_a_run_of_several_nodes_on_a_boto3_without_conditional_writes_ends_naming_the_botocore_it_needs(
        aws, tmp_path, monkeypatch):
    """Issue 51 item 5: the message named boto3 1.35.36, which has PutObject's IfNoneMatch but not its
    IfMatch (botocore's CHANGELOG: 1.35.69). The agent runs on its own boto3 (runs/detached/agent_runtime.py),
    so this is a guard: it names the least botocore that has both."""
    from ec2gpu.agent import store
    put_spec(aws, nodes=2, max_launches=4)
    monkeypatch.setattr(store.Store, "conditional", property(lambda self: False))
    make(aws, tmp_path / "home").execute()
    st = status(aws)
    assert st["state"] == "failed" and "botocore 1.35.69 or later" in st["message"], st
    assert store.MIN_CONDITIONAL_BOTOCORE == "1.35.69"
