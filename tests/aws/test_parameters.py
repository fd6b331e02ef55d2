"""A detached run's secrets in SSM Parameter Store (aws/parameters.py), against the sandbox's moto
server: stored as SecureString under the run's own path, found by the sweep and removed with the
run, never another run's."""
import pytest

from ec2gpu.aws import parameters, sweep
from ec2gpu.errors import UsageError

RUN, OTHER = "20261127-120000-aa11", "20261127-120001-bb22"
#: who made them: a role session's user id (AROA...:NAME, as STS's UserId gives it), and another user
USER, OTHER_USER = "AROAEXAMPLEROLEID0001:alice@example.com", "AIDAEXAMPLEUSERID0002"


def test_secrets_are_stored_found_and_removed_with_their_run_only(aws, tmp_path):
    ssm = aws.client("ssm")
    names = parameters.put(ssm, RUN, "alice", USER, {"HF_TOKEN": "t0ken", "DB_PASSWORD": "pw"})
    parameters.put(ssm, OTHER, "alice", USER, {"HF_TOKEN": "other"})
    ssm.put_parameter(Name="/ec2gpu/runs/not-a-run/X", Value="v", Type="String")  # not ours: never listed
    try:
        assert names == [f"/ec2gpu/runs/{RUN}/HF_TOKEN", f"/ec2gpu/runs/{RUN}/DB_PASSWORD"]
        got = ssm.get_parameters(Names=names, WithDecryption=True)["Parameters"]
        assert {p["Name"]: (p["Type"], p["Value"]) for p in got} == {
            names[0]: ("SecureString", "t0ken"), names[1]: ("SecureString", "pw")}
        tags = ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId=names[0])["TagList"]
        assert {t["Key"]: t["Value"] for t in tags} == {"ec2gpu:run": RUN, "ec2gpu:owner": "alice", "ec2gpu:user": USER}
        assert sorted(r["id"] for r in parameters.find(ssm, RUN)) == sorted(names)
        assert parameters.read(ssm, RUN, ["HF_TOKEN", "NOT_THERE"]) == {"HF_TOKEN": "t0ken"}  # a missing one left out
        assert {r["run_id"] for r in parameters.find(ssm)} == {RUN, OTHER}
        found = sweep.inventory(aws.ec2, RUN, ssm=ssm, user=USER)
        assert sorted(r["id"] for r in found["secret_parameters"]) == sorted(names)
        removed = sweep.delete_run(aws.ec2, RUN, tmp_path, ssm=ssm, user=USER)
        assert sorted(removed["secret_parameters"]) == sorted(names) and removed["left"] == []
        assert parameters.find(ssm, RUN) == [] and [r["run_id"] for r in parameters.find(ssm)] == [OTHER]
        with pytest.raises(ssm.exceptions.ParameterAlreadyExists):  # a run's secret is never overwritten
            parameters.put(ssm, OTHER, "alice", USER, {"HF_TOKEN": "again"})
    finally:
        ssm.delete_parameters(Names=[f"/ec2gpu/runs/{OTHER}/HF_TOKEN", "/ec2gpu/runs/not-a-run/X"])


def test_a_sweep_without_an_ssm_client_leaves_them_and_says_so(aws, tmp_path):
    ssm = aws.client("ssm")
    (name,) = parameters.put(ssm, RUN, "alice", USER, {"HF_TOKEN": "t0ken"})
    try:
        assert "secret_parameters" not in sweep.inventory(aws.ec2, RUN)
        removed = sweep.delete_everything(aws.ec2, {"secret_parameters": [{"id": name}]}, tmp_path)
        assert removed["left"] == [f"{name} (no ssm client given)"] and parameters.find(ssm, RUN)
    finally:
        parameters.delete(ssm, [name])


@pytest.mark.parametrize("values, words", [
    ({"HF_TOKEN": "x" * 4097}, "4,097 bytes"),
    ({"HF_TOKEN": "é" * 2049}, "4,098 bytes"),  # bytes, not characters
    ({"A/../B": "x"}, "not an environment variable name"),
])
def test_what_a_parameter_cannot_hold_is_refused_before_anything_is_stored(aws, values, words):
    ssm = aws.client("ssm")
    with pytest.raises(UsageError, match=words):
        parameters.put(ssm, RUN, "alice", USER, {"OK": "fine", **values})
    assert parameters.find(ssm, RUN) == []


def test_a_sweep_finds_and_removes_only_the_callers_own_secrets(aws, tmp_path):
    """docs/iam-policy.json lets a user delete only the secrets tagged with their own user id: the
    sweep of one user (`cleanup`, `down`, `cancel`) finds only those, so it never asks SSM to delete
    another's (which AWS would refuse, and with it the rest of the batch)."""
    ssm = aws.client("ssm")
    mine = parameters.put(ssm, RUN, "alice", USER, {"HF_TOKEN": "mine"})
    theirs = parameters.put(ssm, OTHER, "bob", OTHER_USER, {"HF_TOKEN": "theirs"})
    try:
        assert [r["id"] for r in parameters.find(ssm, user=USER)] == mine
        assert [r["id"] for r in parameters.find(ssm, user=OTHER_USER)] == theirs
        assert parameters.find(ssm, OTHER, USER) == [] and len(parameters.find(ssm)) == 2  # None: every run's
        assert [r["id"] for r in sweep.inventory(aws.ec2, ssm=ssm, user=USER)["secret_parameters"]] == mine
        removed = sweep.delete_run(aws.ec2, OTHER, tmp_path, ssm=ssm, user=USER)
        assert removed.get("secret_parameters", []) == [] and removed["left"] == []
        assert [r["id"] for r in parameters.find(ssm)] == [*mine, *theirs]  # another user's: still there
    finally:
        ssm.delete_parameters(Names=mine + theirs)


def test_a_user_id_no_tag_holds_is_refused_before_anything_is_stored(aws):
    ssm = aws.client("ssm")
    for bad in ("AROAEXAMPLEROLEID0001:a,b", "a/b", ""):
        with pytest.raises(UsageError):
            parameters.put(ssm, RUN, "alice", bad, {"HF_TOKEN": "t0ken"})
    assert parameters.find(ssm, RUN) == []


@pytest.mark.parametrize("run_id, name", [("../x", "A"), (RUN, "A/B"), (RUN, "1A"), ("*", "A")])
def test_a_name_never_leaves_the_runs_path(run_id, name):
    with pytest.raises(UsageError):
        parameters.name_of(run_id, name)


def test_a_secrets_owner_tag_is_a_value_ssm_takes_whatever_the_login_name(aws):
    """SSM's TagValue allows letters, digits, spaces and _ . : / = + - @ (botocore's model): a login
    name such as CORP\\alice is tagged as the run store tags it (tags.tag_value), never as it is."""
    ssm = aws.client("ssm")
    (name,) = parameters.put(ssm, RUN, "CORP\\o'brien", USER, {"HF_TOKEN": "t0ken"})
    try:
        got = ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId=name)["TagList"]
        assert {"Key": "ec2gpu:owner", "Value": "CORP_o_brien"} in got
        assert {"Key": "ec2gpu:user", "Value": USER} in got
    finally:
        parameters.delete(ssm, [name])
