"""Teardown is best-effort per resource: a step that fails is reported with `ec2gpu cleanup` and
the others still run, the ledger row is always finished, and the error that ended the run is the
one the user sees."""
import json

import pytest

from ec2gpu import cli
from ec2gpu.aws import instances, network, sweep
from ec2gpu.runs.settle import ledger

from test_sandbox_train import leftovers, sandbox_settles  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # a user project, not the built-in trainer


def boom(*_, **__):
    raise RuntimeError("injected teardown failure")


@pytest.mark.parametrize("step, target, left, job_fails", [
    # the group stays with its instances (EC2 refuses to delete a group in use); the key pair goes
    ("instances", (instances, "terminate"), (True, True, False), False),
    ("instances", (instances, "terminate"), (True, True, False), True),
    ("security group", (sweep, "delete_security_group"), (False, True, False), False),
    ("key pair", (network, "delete_key_pair"), (False, False, True), False),
])
def test_a_failed_teardown_step_is_reported_the_others_run_and_the_ledger_is_finished(
        sandbox_env, tmp_path, monkeypatch, capsys, step, target, left, job_fails):
    home, _ = sandbox_env
    monkeypatch.chdir(tmp_path)
    with pytest.MonkeyPatch.context() as inject:
        inject.setattr(*target, boom)
        code = cli.main(["run", "--sandbox", "--expect", "1m", "--out", str(tmp_path / "r"), "--",
                         "bash", "-c", "exit 4" if job_fails else "true"])
    err = " ".join(capsys.readouterr().err.split())
    # the error that ended the run wins; a clean run whose teardown failed is an AWS error (3)
    assert code == (5 if job_fails else 3), err
    assert ("exited 4" in err) == job_fails and "Traceback" not in err
    assert f"could not remove the {step}" in err and "ec2gpu cleanup" in err
    found = leftovers(home)
    assert tuple(bool(x) for x in found) == left, found  # only what that step (and its dependents) holds
    said = err[err.index("may still exist"):]  # one line names every id that is left
    assert all(x in said for x in found[0] + found[1] + found[2]), (found, said)
    row = ledger.runs(home, limit=1)[0]
    assert row["status"] == ("failed" if job_fails else "completed") and row["ended_at"]
    assert json.loads((tmp_path / "r" / "run.json").read_text())["teardown_failed"]
    assert cli.main(["cleanup", "--sandbox"]) == 0
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)


def test_a_raw_aws_error_is_one_line_exit_3_and_what_was_made_is_removed(sandbox_env, tmp_path, monkeypatch, capsys):
    from botocore.awsrequest import AWSResponse

    from ec2gpu.aws.session import Aws
    home, _ = sandbox_env
    monkeypatch.chdir(tmp_path)
    original = Aws.client

    def refuse(**_):
        return AWSResponse("https://ec2.amazonaws.com/", 403, {}, None), {
            "Error": {"Code": "UnauthorizedOperation", "Message": "You are not authorized to perform this operation."},
            "ResponseMetadata": {"HTTPStatusCode": 403}}

    def client(self, service, fail_fast=False):
        c = original(self, service, fail_fast)
        if service == "ec2" and not getattr(c, "_refusing", False):
            c.meta.events.register("before-call.ec2.CreateSecurityGroup", refuse)
            c._refusing = True
        return c
    monkeypatch.setattr(Aws, "client", client)
    assert cli.main(["run", "--sandbox", "--expect", "1m", "--", "true"]) == 3
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert line.startswith("error: AWS refused CreateSecurityGroup: UnauthorizedOperation") and "Traceback" not in err
    assert "docs/iam-policy.json" in " ".join(err.split())
    assert leftovers(home) == ([], [], [])  # the key pair made before it was removed


def test_an_unknown_ami_is_exit_3_and_creates_nothing(sandbox_env, tmp_path, monkeypatch, capsys):
    home, _ = sandbox_env
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--sandbox", "--expect", "1m", "--ami", "ami-00000000", "--", "true"]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert "ami-00000000" in err and "Traceback" not in err
    assert leftovers(home) == ([], [], [])


def test_what_an_instance_that_ended_itself_left_goes_with_the_next_ls_said_in_one_line(sandbox_env, capsys):
    """Issue 27, item 15: an instance that ends itself (its OS shuts down, as --max-runtime and the
    idle rule make it do: the sandbox's `shutdown`) leaves its security group, key pair and key
    file; the next command that lists instances removes them and says so, once."""
    import time

    import boto3
    home, state = sandbox_env
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
    assert cli.main(["launch", "--sandbox", "--name", "gone", "--no-idle", "--max-runtime", "30", "--json"]) == 0
    [inst] = json.loads(capsys.readouterr().out)
    key_file = home / "keys" / f"ec2gpu-{inst['run_id']}.pem"
    cli.main(["ssh", "gone", "--sandbox", "--", "shutdown -h now"])  # the session ends with the instance

    def state_of() -> str:
        return ec2.describe_instances(InstanceIds=[inst["instance_id"]])["Reservations"][0]["Instances"][0]["State"][
            "Name"]
    deadline = time.monotonic() + 30
    while state_of() != "terminated" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert state_of() == "terminated" and key_file.exists() and leftovers(home)[1:] != ([], [])
    capsys.readouterr()
    assert cli.main(["ls", "--sandbox"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "left behind" in line]
    assert len(said) == 1 and f"run {inst['run_id']} (ended itself): security group sg-" in said[0], said
    assert f"key pair ec2gpu-{inst['run_id']}" in said[0] and f"key file {key_file}" in said[0]
    assert leftovers(home) == ([], [], []) and not key_file.exists()
    assert cli.main(["ls", "--sandbox"]) == 0
    assert "left behind" not in capsys.readouterr().err  # said once: nothing is left
    row = ledger.get(home, inst["run_id"])  # and its bill is settled
    assert row["status"] == "ended" and row["attempts"][0]["ended"] == "ended itself" and row["cost_usd"] > 0
