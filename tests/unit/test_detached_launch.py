"""A detached run's launch, the parts without AWS (runs/detached/launch.py): what it refuses, its
boot script, its spec and its workdir archive."""
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ec2gpu.aws import instances
from ec2gpu.errors import UsageError
from ec2gpu.remote import sync
from ec2gpu.runs.detached import launch
from ec2gpu.runs.execute import engine
from ec2gpu.runs.options import RunOptions
from ec2gpu.runs.plan import detached_spec
from ec2gpu.tasks import load
from ec2gpu.wire import run_record, run_spec

RUN = "20261125-103000-1a2b"
USER = "AROAEXAMPLEROLEID0001:alice@example.com"  # who starts the run: a role session's user id
BUCKET = "ec2gpu-123456789012-us-east-1"
SPEC_SHA = "5" * 64


def _boot(run_id=RUN, group=f"ec2gpu-{RUN}", hashes=None, spec_sha=SPEC_SHA, user=USER):
    return launch.boot_script(BUCKET, user, run_id, "us-east-1", group,
                              launch.agent_hashes() if hashes is None else hashes, spec_sha)


def _job(text="name: mine\nrun: python train.py\n", **kw):
    return engine.TaskJob(load.parse(text), {"A": "1"}, None, **kw)


@pytest.mark.parametrize("opts, words", [
    (dict(max_runtime_minutes=None), "needs a limit"),
    (dict(nodes=2, max_attempts=1), "--max-attempts 1 is below --nodes 2"),
    (dict(keep=True), "--keep"),
])
def test_a_detached_run_needs_a_limit_and_an_instance_per_node(opts, words):
    with pytest.raises(UsageError, match=words):
        launch.check(RunOptions(task=_job(), **opts))
    assert launch.check(RunOptions(task=_job())).name == "mine"
    assert launch.check(RunOptions(task=_job(), nodes=2, max_attempts=2)).name == "mine"


def test_a_detached_run_carries_no_secret_too_large_for_a_parameter():
    with pytest.raises(UsageError, match="4,096 bytes at most"):
        launch.check(RunOptions(task=_secret_job("x" * 4097)))
    assert launch.check(RunOptions(task=_secret_job("x" * 4096))).name == "s"
    with pytest.raises(UsageError, match="runs a task"):
        launch.check(RunOptions())


def test_the_boot_script_fetches_the_agent_with_the_role_and_starts_it_holding_no_secret(tmp_path):
    boot = _boot()
    assert f'"runs/{USER}/{RUN}/agent/"' in boot  # each file's key: this prefix and its name, with its sha256
    assert '"detached.py": "' in boot and '"agent.py": "' in boot
    assert f"--bucket {BUCKET} --user {USER} --run-id {RUN} --region us-east-1" in boot
    assert "AWS_ACCESS_KEY_ID" not in boot and "aws_secret" not in boot.lower()
    assert boot.count("seq 30") == 1  # tried again while the new role reaches EC2 (IAM is eventually consistent)
    data = instances.user_data(None, None, boot)
    assert data.startswith("#!/bin/bash\n") and "shutdown" not in data  # the group's deadline ends it, not a shutdown
    script = tmp_path / "user-data"
    script.write_text(data)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if shutil.which("shellcheck"):
        got = subprocess.run(["shellcheck", "-s", "bash", "-S", "warning", str(script)], capture_output=True, text=True)
        assert got.returncode == 0, got.stdout
    with pytest.raises(UsageError):
        _boot("../other", "ec2gpu-x")
    for user in ("../other", "a b", "x;reboot", "AROAX:a,b"):  # nothing a shell or a key would read otherwise
        with pytest.raises(UsageError):
            _boot(user=user)


def test_an_instance_that_cannot_fetch_its_agent_ends_its_own_group_rather_than_idle(tmp_path):
    """No Python with boto3 on the image: the boot script says so and ends the run's group with the
    AWS CLI (the role may), instead of an instance that bills, idle, until the deadline."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text("#!/bin/sh\nexit 1\n")  # no boto3
    (bin_ / "aws").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/aws-calls\n')
    for f in ("python3", "aws"):
        (bin_ / f).chmod(0o755)
    script = tmp_path / "boot.sh"
    script.write_text(instances.user_data(None, None, _boot()))
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "EC2GPU_STATE_DIR": str(tmp_path / "state")}
    assert subprocess.run(["bash", str(script)], env=env, timeout=30).returncode == 0
    assert (tmp_path / "aws-calls").read_text().split() == [
        "autoscaling", "update-auto-scaling-group", "--region", "us-east-1", "--auto-scaling-group-name",
        f"ec2gpu-{RUN}", "--min-size", "0", "--max-size", "0", "--desired-capacity", "0"]
    assert "no Python with boto3" in (tmp_path / "state" / "detached" / "boot.log").read_text()
    assert not (tmp_path / "state" / "detached" / "detached.log").exists()  # no agent started


def _secret_job(value="hunter2"):
    text = "name: s\nrun: 'true'\nenvs: {HF_TOKEN: null, EMPTY: null, PLAIN: p}\nsecrets: [HF_TOKEN, EMPTY]\n"
    return engine.TaskJob(load.parse(text), {"HF_TOKEN": value, "EMPTY": "", "PLAIN": "p"}, None,
                          secret_values=[value])


def test_the_spec_names_the_secrets_and_holds_none_of_their_values():
    """A secret's value goes to SSM Parameter Store (aws/parameters.py), never into spec.json (S3):
    the spec names it, and keeps only what is not secret (an empty secret holds nothing)."""
    job = _secret_job()
    assert detached_spec.secret_env(job) == {"HF_TOKEN": "hunter2"}
    spec = detached_spec.spec_document(job, RunOptions(task=job, max_runtime_minutes=60), USER, RUN, f"ec2gpu-{RUN}",
                                datetime(2026, 11, 25, 18, 0, tzinfo=timezone.utc), 2)
    assert spec["secrets"] == ["HF_TOKEN"] and spec["envs"] == {"EMPTY": "", "PLAIN": "p"}
    assert "hunter2" not in repr(spec)


def test_the_spec_lists_the_file_mounts_as_the_agent_reads_them(tmp_path):
    """Local sources by the key they are uploaded to, S3 ones by bucket, prefix and region, targets
    in one spelling; the agent's own check takes the list as it is."""
    (tmp_path / "data").mkdir()
    (tmp_path / "cfg.txt").write_text("c")
    text = ("name: m\nrun: 'true'\nfile_mounts:\n  ~/data/: ./data\n  /etc/app/cfg.txt: ./cfg.txt\n"
            "  /ds: s3://some-bucket/ds\n  out: {name: out-bucket, mode: MOUNT}\n")
    job = engine.TaskJob(load.parse(text, base=tmp_path), {}, None)
    job.bucket_regions = {"some-bucket": "eu-west-1", "out-bucket": "us-east-1"}
    job.s3_files = set()
    doc = detached_spec.mounts_document(job, USER, RUN)
    assert doc == [
        {"target": "~/data", "kind": "local", "key": f"runs/{USER}/{RUN}/mounts/0.tar.gz", "is_file": False},
        {"target": "/etc/app/cfg.txt", "kind": "local", "key": f"runs/{USER}/{RUN}/mounts/1", "is_file": True},
        {"target": "/ds", "kind": "s3", "bucket": "some-bucket", "prefix": "ds", "region": "eu-west-1",
         "file": False, "write_back": False},
        {"target": "~/out", "kind": "s3", "bucket": "out-bucket", "prefix": "", "region": "us-east-1",
         "file": False, "write_back": True}]
    assert run_spec.parse_mounts(doc, f"runs/{USER}/{RUN}/") == doc


def test_the_spec_says_what_the_agent_runs_and_until_when():
    at = datetime(2026, 11, 25, 18, 0, tzinfo=timezone.utc)
    job = _job("name: mine\nsetup: pip install x\nrun: python train.py\noutputs: ['*.pt']\n")
    spec = detached_spec.spec_document(job, RunOptions(task=job, spot=True, max_runtime_minutes=60), USER, RUN,
                                f"ec2gpu-{RUN}",
                                at, 10)
    assert (spec["run_id"], spec["name"], spec["group"]) == (RUN, "mine", f"ec2gpu-{RUN}")
    assert (spec["setup"], spec["run"], spec["envs"], spec["outputs"]) == ("pip install x", "python train.py",
                                                                           {"A": "1"}, ["*.pt"])
    # the job's SIGTERM comes its grace (2 min) and the upload's time (5 min) before the group's deadline
    assert spec["limit_at"] == at.timestamp() - 420 and spec["limit_grace_s"] == 120
    assert spec["max_launches"] == 10 and spec["spot"] is True
    assert spec["workdir_key"] == f"runs/{USER}/{RUN}/workdir.tar.gz" and spec["nodes"] == 1 and spec["secrets"] == []


def test_the_workdir_archive_holds_the_manifest_files_alone_as_plain_files(tmp_path):
    root = tmp_path / "work"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print(1)\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o750)
    (root / "pkg" / "m.py").write_text("x = 1\n")
    (root / ".env").write_text("TOKEN=hunter2\n")  # withheld by the manifest's rules
    (root / "link").symlink_to("/etc/passwd")  # never sent
    size = launch.pack(sync.manifest(root), tmp_path / "w.tar.gz")
    with tarfile.open(tmp_path / "w.tar.gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert size == (tmp_path / "w.tar.gz").stat().st_size
    assert set(members) == {"train.py", "run.sh", "pkg/m.py"}
    assert all(m.isfile() and m.uid == 0 and m.uname == "" for m in members.values())
    assert (members["run.sh"].mode, members["train.py"].mode) == (0o755, 0o644)


@pytest.mark.parametrize("call", ["run", "train"])
def test_a_detached_run_keeps_running_a_sandbox_its_command_starts(monkeypatch, tmp_path, call):
    """A sandbox that `run --detach --sandbox` or `train mnist --detach --sandbox` starts must
    outlive the command (as a kept instance's does): stopped with it, it would take the run along."""
    from ec2gpu import backend
    from ec2gpu.api import tasks, train

    class Opened(Exception):
        pass

    seen = {}

    def context(region, sandbox, persistent=False, note=None):
        seen.update(sandbox=sandbox, persistent=persistent)
        raise Opened

    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EC2GPU_DATA_DIR", str(tmp_path))  # the sandbox's MNIST: the plan checks it is there
    monkeypatch.setattr(backend, "Context", context)
    with pytest.raises(Opened):
        if call == "run":
            tasks.run(command=["true"], workdir=tmp_path, detach=True, max_runtime=10, sandbox=True)
        else:
            train.train_mnist(detach=True, sandbox=True)
    assert seen == {"sandbox": True, "persistent": True}


@pytest.mark.parametrize("backend, flag", [("sandbox", " --sandbox"), ("aws", "")])
def test_the_detached_start_says_the_command_that_follows_it(capsys, backend, flag):
    from ec2gpu.cli import tasks
    tasks._print_detached({"run_id": "20261127-120000-ab12", "group": "ec2gpu-20261127-120000-ab12", "bucket": "b",
                           "deadline": "2026-11-27T14:00:00+00:00", "backend": backend}, False)
    said = " ".join(capsys.readouterr().out.split())
    assert f"follow it: ec2gpu status 20261127-120000-ab12{flag} (logs" in said


# --- the agent's code checked on the instance before it runs (issue 44, item 2) ----------------------------

FAKE_BOTO3 = '''"""boto3 for the boot script's test: S3 is a directory (FAKE_S3/BUCKET/KEY), Auto Scaling a log."""
import json, os


class _Body:
    def __init__(self, data):
        self.data = data

    def read(self, n=-1):
        return self.data if n is None or n < 0 else self.data[:n]


class _Client:
    def get_object(self, Bucket, Key):
        path = os.path.join(os.environ["FAKE_S3"], Bucket, Key)
        if not os.path.isfile(path):
            raise RuntimeError("NoSuchKey " + Key)
        with open(path, "rb") as f:
            return {"Body": _Body(f.read())}

    def put_object(self, Bucket, Key, Body, **kw):
        path = os.path.join(os.environ["FAKE_S3"], Bucket, Key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(Body)

    def update_auto_scaling_group(self, **kw):
        with open(os.environ["FAKE_CALLS"], "a") as f:
            f.write(json.dumps(kw) + "\\n")


def client(name, region_name=None):
    return _Client()
'''


def _instance(tmp_path, files: dict) -> tuple[dict, callable]:
    """A fake image for the boot script: python3 with the fake boto3 above, an `aws` CLI that logs,
    and S3 holding ``files`` (name -> bytes) under the run's agent/ prefix; returns the env and a
    function running the user data (bash, as cloud-init would) and returning the state directory."""
    lib, bin_, store = tmp_path / "lib" / "boto3", tmp_path / "bin", tmp_path / "s3" / BUCKET
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(FAKE_BOTO3)
    bin_.mkdir()
    (bin_ / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_ / "aws").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/aws-calls\n')
    for f in ("python3", "aws"):
        (bin_ / f).chmod(0o755)
    (store / "runs" / USER / RUN / "agent").mkdir(parents=True)
    for name, body in files.items():
        (store / "runs" / USER / RUN / "agent" / name).write_bytes(body)
    (store / "runs" / USER / RUN / "state.json").write_text(json.dumps({"run_id": RUN, "state": "pending", "attempt": 0,
                                                                  "launches": 2, "updated_at": "x"}))
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "EC2GPU_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(lib.parent),
           "FAKE_S3": str(tmp_path / "s3"), "FAKE_CALLS": str(tmp_path / "asg-calls")}

    def boot(hashes: dict) -> Path:
        script = tmp_path / "boot.sh"
        script.write_text(instances.user_data(None, None, _boot(hashes=hashes)))
        assert subprocess.run(["bash", str(script)], env=env, timeout=60).returncode == 0
        return tmp_path / "state" / "detached"
    return env, boot


def _agent(tmp_path) -> dict:
    """Stand-in agent files: detached.py writes a marker where it ran; the others are inert."""
    marker = tmp_path / "agent-ran"
    files = {name: f"# {name}\n".encode() for name in launch.AGENT_FILES}
    files["detached.py"] = f"open({str(marker)!r}, 'w').write('ran')\n".encode()
    return files


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_launched_agent_is_fetched_checked_and_started(tmp_path):
    files = _agent(tmp_path)
    _, boot = _instance(tmp_path, files)
    state = boot({name: _sha(body) for name, body in files.items()})
    deadline = time.monotonic() + 20
    while not (tmp_path / "agent-ran").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "agent-ran").exists()  # started in the background (nohup ... &)
    assert {p.name: p.read_bytes() for p in state.iterdir() if p.suffix == ".py"} == files
    assert not (tmp_path / "asg-calls").exists() and not (tmp_path / "aws-calls").exists()


@pytest.mark.parametrize("rewritten", launch.AGENT_FILES)
def test_an_agent_file_rewritten_in_s3_is_refused_and_none_of_it_runs(tmp_path, rewritten):
    """The launch template's user data holds each agent file's sha256; a file in S3 with another
    (rewritten after launch: by anyone who may write the run's prefix, the job included) is
    refused before any is written: nothing runs, state.json says why (failed, its launches
    kept), the group is ended, and no try follows (the fetch is not retried for 5 min)."""
    files = _agent(tmp_path)
    hashes = {name: _sha(body) for name, body in files.items()}
    files[rewritten] = f"open({str(tmp_path / 'rewritten-ran')!r}, 'w').write('pwned')\n".encode()
    _, boot = _instance(tmp_path, files)
    started = time.monotonic()
    state = boot(hashes)
    assert time.monotonic() - started < 30  # refused at once, not tried again every 10 s
    time.sleep(0.5)
    assert not (tmp_path / "agent-ran").exists() and not (tmp_path / "rewritten-ran").exists()
    assert not [p for p in state.iterdir() if p.suffix == ".py"]  # none of the files was written
    st = json.loads((tmp_path / "s3" / BUCKET / "runs" / USER / RUN / "state.json").read_text())
    assert st["state"] == "failed" and st["launches"] == 2 and st["ended_at"]
    assert "reason" not in st and st["message"] == (  # the record's one vocabulary (wire/run_record.py)
        f"the agent code in S3 is not the code this run was launched with ({rewritten} has another sha256 than its "
        "launch template says): refused, none of it ran")
    assert run_record.view(json.dumps(st).encode(), RUN)["message"] == st["message"]  # as `status` reads it
    assert [json.loads(line) for line in (tmp_path / "asg-calls").read_text().splitlines()] == [
        {"AutoScalingGroupName": f"ec2gpu-{RUN}", "MinSize": 0, "MaxSize": 0, "DesiredCapacity": 0}]
    assert "none of it ran" in (state / "boot.log").read_text()


def test_the_hashes_come_from_the_agent_files_tuple_and_each_is_required(tmp_path, monkeypatch):
    hashes = launch.agent_hashes()
    assert list(hashes) == list(launch.AGENT_FILES)
    assert all(h == _sha(launch.agent_source(n).read_bytes()) for n, h in hashes.items())
    boot = _boot()
    assert all(f'"{h}"' in boot for h in hashes.values()) and f"--spec-sha256 {SPEC_SHA}" in boot
    with pytest.raises(ValueError, match="a sha256 for each of"):
        _boot(hashes={n: h for n, h in hashes.items() if n != "gang.py"})
    with pytest.raises(ValueError, match="a sha256 for each of"):
        _boot(hashes={**hashes, "agent.py": "not-a-hash"})
    with pytest.raises(ValueError, match="spec_sha256"):
        _boot(spec_sha="x")
    # a file added to AGENT_FILES is hashed and checked with the others, with no list to update
    (tmp_path / "extra.py").write_text("x = 1\n")
    for name in launch.AGENT_FILES:
        (tmp_path / name).write_bytes(launch.agent_source(name).read_bytes())
    monkeypatch.setattr(launch, "AGENT_FILES", (*launch.AGENT_FILES, "extra.py"))
    more = launch.agent_hashes(tmp_path)
    assert more["extra.py"] == _sha(b"x = 1\n")
    assert f'"extra.py": "{more["extra.py"]}"' in _boot(hashes=more)  # fetched as the agent's prefix + its name
    with pytest.raises(ValueError):
        _boot(hashes=hashes)  # without the new file's


def test_the_user_data_stays_well_under_ec2s_limit():
    """EC2 takes 16 KB of user data before base64
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html)."""
    assert len(instances.user_data(None, None, _boot()).encode()) < 8 * 1024


def test_what_is_said_of_the_secrets_names_everyone_who_may_read_them():
    """Issue 44, item 6: "only this run's instance role may read them" was not true. The line a
    detached launch prints (parameters.READERS) names the run's role, the user who made them and
    whoever the account's own policies allow; no message says the role alone."""
    import inspect

    from ec2gpu.aws import parameters
    assert "instance role" in parameters.READERS and "you" in parameters.READERS
    assert "administrator" in parameters.READERS and "account's own policies" in parameters.READERS
    source = inspect.getsource(launch) + inspect.getsource(parameters)
    assert "parameters.READERS" in inspect.getsource(launch.DetachedJob.run)  # the hand-off's step that puts them
    assert "only this run's instance role may read" not in source.replace("\n", " ")
