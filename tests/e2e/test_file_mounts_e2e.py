"""SkyPilot's file_mounts end to end in the sandbox (issue 28, item 9): a task with accelerators T4:1,
a local folder, an s3:// prefix, a MOUNT-mode output bucket, envs, SKYPILOT_TASK_ID, ~/sky_workdir
and a setup that appends an export to ~/.bashrc runs first time with no flag; the instance copies
from S3 with its own role (no keys of this machine), what the job wrote reaches the bucket, its
outputs come home, and nothing is left: no instance, group, key pair, role or process."""
import json
import os
import subprocess
import textwrap

import boto3
import pytest

from test_run_task import assert_nothing_left
from test_spot_recovery import drive

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False
SOURCE, OUTPUT = "test-sky-data", "test-sky-out"  # not ec2gpu-*: those are refused (issue 44)


def _client(service: str):
    return boto3.client(service, endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")


def test_a_task_with_local_and_s3_file_mounts_runs_first_time_and_leaves_nothing(sandbox_env, tmp_path):
    home, _ = sandbox_env
    s3 = _client("s3")
    s3.create_bucket(Bucket=SOURCE)
    s3.put_object(Bucket=SOURCE, Key="train/a.txt", Body=b"object a")
    s3.put_object(Bucket=SOURCE, Key="train/sub/b.txt", Body=b"object b")
    s3.put_object(Bucket=SOURCE, Key="trainee/c.txt", Body=b"not under train/")
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "x.txt").write_text("local x\n")
    (proj / "data" / ".env").write_text("TOKEN=never-sent\n")
    repo = tmp_path / "repo"  # SkyPilot's git workdir, cloned on the instance at a tag
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "hello.txt").write_text("v1 of the repo\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    subprocess.run([*git, "tag", "v1"], check=True)
    (repo / "hello.txt").write_text("v2, not asked for\n")
    subprocess.run([*git, "commit", "-qam", "v2"], check=True)
    (proj / "sky.yaml").write_text(textwrap.dedent(f"""\
        name: mounts
        resources:
          accelerators: T4:1
        workdir:
          url: file://{repo}
          ref: v1
        envs:
          GREETING: hello from envs
        file_mounts:
          ~/local-data: ./data
          ~/s3-data: s3://{SOURCE}/train
          /abs-data: s3://{SOURCE}/train/a.txt
          ~/results:
            name: {OUTPUT}
            mode: MOUNT
        setup: |
          echo 'export FROM_SETUP=written-by-setup' >> ~/.bashrc
        run: |
          echo "local: $(cat ~/local-data/x.txt); env file: $(ls ~/local-data/.env 2>/dev/null || echo absent)"
          echo "s3: $(cat ~/s3-data/a.txt), $(cat ~/s3-data/sub/b.txt); $(ls ~/s3-data | tr '\\n' ' ')"
          echo "absolute: $(cat "${{EC2GPU_SANDBOX_ROOT}}/abs-data")"
          echo "bashrc $FROM_SETUP; $GREETING; task $SKYPILOT_TASK_ID"
          echo "from git: $(cat ~/sky_workdir/hello.txt)"
          echo "keys here: ${{AWS_ACCESS_KEY_ID:-none}}"
          echo "written by the job" > ~/results/r.txt
          echo out > "$EC2GPU_OUTPUT_DIR/o.txt"
        """))
    code, stdout, err = drive(["run", "--sandbox", str(proj / "sky.yaml"), "--json", "--out", str(tmp_path / "r")], [])
    assert code == 0, err
    record = json.loads(stdout)
    flat = " ".join(err.split())
    assert "local: local x; env file: absent" in flat
    assert "s3: object a, object b; a.txt sub " in flat  # trainee/ is not under train/
    assert "absolute: object a" in flat
    assert f"bashrc written-by-setup; hello from envs; task ec2gpu-{record['run_id']}_mounts" in flat
    assert "from git: v1 of the repo" in flat and "keys here: none" in flat
    assert f"created s3://{OUTPUT}" in flat and "instance role ec2gpu-" in flat
    got = s3.get_object(Bucket=OUTPUT, Key="r.txt")["Body"].read()
    assert got == b"written by the job\n"
    assert (tmp_path / "r" / "outputs" / "o.txt").read_text() == "out\n"
    block = s3.get_public_access_block(Bucket=OUTPUT)["PublicAccessBlockConfiguration"]
    assert all(block.values())
    roles = _client("iam").list_roles(PathPrefix="/ec2gpu/")["Roles"]
    profiles = _client("iam").list_instance_profiles(PathPrefix="/ec2gpu/")["InstanceProfiles"]
    assert roles == [] and profiles == []
    assert_nothing_left(home, record)


def test_a_source_bucket_that_does_not_exist_is_refused_before_anything_is_created(sandbox_env, tmp_path):
    (tmp_path / "t.yaml").write_text("resources:\n  accelerators: T4:1\nfile_mounts:\n  /d: s3://no-such-bucket-here/x\n"
                                     "run: echo never\n")
    code, _, err = drive(["run", "--sandbox", str(tmp_path / "t.yaml")], [])
    assert code == 2 and "s3://no-such-bucket-here does not exist" in err
    ec2 = _client("ec2")
    live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]
    assert live == [] and "launched" not in err
