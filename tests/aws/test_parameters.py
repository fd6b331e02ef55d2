"""A detached run's secrets in SSM Parameter Store (aws/parameters.py), against the sandbox's moto
server: stored as SecureString under the run's own path, found by the sweep and removed with the
run, never another run's."""
import pytest

from ec2gpu.aws import parameters, sweep
from ec2gpu.errors import UsageError

RUN, OTHER = "20261127-120000-aa11", "20261127-120001-bb22"


def test_secrets_are_stored_found_and_removed_with_their_run_only(aws, tmp_path):
    ssm = aws.client("ssm")
    names = parameters.put(ssm, RUN, "alice", {"HF_TOKEN": "t0ken", "DB_PASSWORD": "pw"})
    parameters.put(ssm, OTHER, "alice", {"HF_TOKEN": "other"})
    ssm.put_parameter(Name="/ec2gpu/runs/not-a-run/X", Value="v", Type="String")  # not ours: never listed
    try:
        assert names == [f"/ec2gpu/runs/{RUN}/HF_TOKEN", f"/ec2gpu/runs/{RUN}/DB_PASSWORD"]
        got = ssm.get_parameters(Names=names, WithDecryption=True)["Parameters"]
        assert {p["Name"]: (p["Type"], p["Value"]) for p in got} == {
            names[0]: ("SecureString", "t0ken"), names[1]: ("SecureString", "pw")}
        tags = ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId=names[0])["TagList"]
        assert {t["Key"]: t["Value"] for t in tags} == {"ec2gpu:run": RUN, "ec2gpu:owner": "alice"}
        assert sorted(r["id"] for r in parameters.find(ssm, RUN)) == sorted(names)
        assert parameters.read(ssm, RUN, ["HF_TOKEN", "NOT_THERE"]) == {"HF_TOKEN": "t0ken"}  # a missing one left out
        assert {r["run_id"] for r in parameters.find(ssm)} == {RUN, OTHER}
        found = sweep.inventory(aws.ec2, RUN, ssm=ssm)
        assert sorted(r["id"] for r in found["secret_parameters"]) == sorted(names)
        removed = sweep.delete_run(aws.ec2, RUN, tmp_path, ssm=ssm)
        assert sorted(removed["secret_parameters"]) == sorted(names) and removed["left"] == []
        assert parameters.find(ssm, RUN) == [] and [r["run_id"] for r in parameters.find(ssm)] == [OTHER]
        with pytest.raises(ssm.exceptions.ParameterAlreadyExists):  # a run's secret is never overwritten
            parameters.put(ssm, OTHER, "alice", {"HF_TOKEN": "again"})
    finally:
        ssm.delete_parameters(Names=[f"/ec2gpu/runs/{OTHER}/HF_TOKEN", "/ec2gpu/runs/not-a-run/X"])


def test_a_sweep_without_an_ssm_client_leaves_them_and_says_so(aws, tmp_path):
    ssm = aws.client("ssm")
    (name,) = parameters.put(ssm, RUN, "alice", {"HF_TOKEN": "t0ken"})
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
        parameters.put(ssm, RUN, "alice", {"OK": "fine", **values})
    assert parameters.find(ssm, RUN) == []


@pytest.mark.parametrize("run_id, name", [("../x", "A"), (RUN, "A/B"), (RUN, "1A"), ("*", "A")])
def test_a_name_never_leaves_the_runs_path(run_id, name):
    with pytest.raises(UsageError):
        parameters.name_of(run_id, name)
