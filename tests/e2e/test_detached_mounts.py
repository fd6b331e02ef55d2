"""A detached run with file_mounts in the sandbox (issue 30): a local directory (sent through the
run's prefix), an S3 prefix copied in by the instance role, and a MOUNT-mode prefix whose new files
reach their bucket, with nobody watching; nothing of the run is left."""
import json
from pathlib import Path

import pytest

from ec2gpu import cli
from ec2gpu.aws import iam

from test_detached_run import _client, _nothing_left, _object, _prefix, _wait  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False
DATA = "e2e-detached-mounts"  # not ec2gpu-*: those are refused (issue 44)


def test_a_detached_run_has_its_file_mounts_and_writes_back_its_mount_mode_ones(sandbox_env, tmp_path: Path, capsys):
    s3 = _client("s3")
    s3.create_bucket(Bucket=DATA)
    s3.put_object(Bucket=DATA, Key="ds/a.txt", Body=b"from s3\n")
    s3.put_object(Bucket=DATA, Key="results/keep.txt", Body=b"kept\n")
    work = tmp_path / "work"
    (work / "local").mkdir(parents=True)
    (work / "local" / "x.txt").write_text("from here\n")
    task = work / "task.yaml"
    task.write_text(f"name: mounts\nworkdir: .\nfile_mounts:\n  ~/local: ./local\n  /ds: s3://{DATA}/ds\n"
                    f"  ~/results:\n    source: s3://{DATA}/results\n    mode: MOUNT\n"
                    "run: |\n"
                    '  cat ~/local/x.txt "${EC2GPU_SANDBOX_ROOT:-}/ds/a.txt" ~/results/keep.txt '
                    '> "$EC2GPU_OUTPUT_DIR/seen.txt"\n'
                    "  echo written > ~/results/new.txt\n")
    assert cli.main(["run", str(task), "--sandbox", "--detach", "--max-runtime", "30m", "--json",
                     "--allow-write-bucket", DATA]) == 0
    record = json.loads(capsys.readouterr().out)
    run_id, bucket = record["run_id"], record["bucket"]
    # the run's role: its own run, and its file_mounts' prefixes (read; write for the MOUNT one) beside it
    got = _client("iam").get_role_policy(RoleName=iam.role_name(run_id), PolicyName=iam.POLICY_NAME)
    sids = [st["Sid"] for st in got["PolicyDocument"]["Statement"]]
    assert {"RunObjects", "EndOwnGroup", "Read", "Write"} <= set(sids), sids
    text = json.dumps(got["PolicyDocument"])
    assert f"arn:aws:s3:::{DATA}/ds" in text and f"arn:aws:s3:::{DATA}/results" in text
    done = _wait(run_id, ("succeeded", "failed", "cancelled"))
    assert done["state"] == "succeeded", f"{done.get('message')!r} exit {done.get('exit_code')} {done}"
    prefix = _prefix(run_id)
    assert _object(bucket, prefix + "outputs/seen.txt") == "from here\nfrom s3\nkept\n"
    assert s3.get_object(Bucket=DATA, Key="results/new.txt")["Body"].read() == b"written\n"
    left = _nothing_left(run_id)
    assert not any(left.values()), left
