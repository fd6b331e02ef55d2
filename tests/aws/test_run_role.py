"""The run's instance role (aws/iam.py) against the sandbox's moto server: made, found, removed
(also half-made, and by the sweeps of `cleanup`, `down` and the ended runs' leftovers)."""
import json
from dataclasses import replace

import botocore.exceptions
import pytest

from ec2gpu.aws import capacity, iam as roles, iam_boundary, iam_detached, instances, network, sweep

POLICY = roles.s3_policy([("data-bucket", "train/")], [("out-bucket", "runs/")])
USER = "AROAEXAMPLEROLEID0001:alice@example.com"  # who makes the role: its ec2gpu:user tag


def _gone(client, name: str) -> bool:
    for call in (lambda: client.get_role(RoleName=name), lambda: client.get_instance_profile(InstanceProfileName=name)):
        try:
            call()
            return False
        except botocore.exceptions.ClientError as exc:
            assert exc.response["Error"]["Code"] == "NoSuchEntity"
    return True


@pytest.fixture
def iam(aws):
    return aws.client("iam")


def test_create_makes_the_role_its_policy_and_profile_tagged(iam):
    name = roles.create_run_role(iam, "run-role-a", "alice", POLICY, user=USER, region="us-east-1")
    try:
        assert name == "ec2gpu-run-role-a"
        role = iam.get_role(RoleName=name)["Role"]
        assert role["Path"] == "/ec2gpu/"
        trust = role["AssumeRolePolicyDocument"]
        trust = json.loads(trust) if isinstance(trust, str) else trust
        assert trust == roles.TRUST
        tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name)["Tags"]}
        assert tags == {"ec2gpu:run": "run-role-a", "ec2gpu:owner": "alice", "Name": name,
                        "ec2gpu:region": "us-east-1", "ec2gpu:user": USER}
        assert iam.list_role_policies(RoleName=name)["PolicyNames"] == ["ec2gpu-s3"]
        doc = iam.get_role_policy(RoleName=name, PolicyName="ec2gpu-s3")["PolicyDocument"]
        assert (json.loads(doc) if isinstance(doc, str) else doc) == POLICY
        assert iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"] == []
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        assert profile["Path"] == "/ec2gpu/" and [r["RoleName"] for r in profile["Roles"]] == [name]
        assert {t["Key"]: t["Value"] for t in profile["Tags"]} == tags
    finally:
        roles.delete_run_role(iam, name)
    assert _gone(iam, name)


def test_find_by_run_owner_and_region(iam):
    a = roles.create_run_role(iam, "run-role-f1", "alice", POLICY, user=USER, region="us-east-1")
    b = roles.create_run_role(iam, "run-role-f2", "bob", POLICY, user=USER, region="eu-west-1")
    try:
        (found,) = roles.find_run_roles(iam, run_id="run-role-f1")
        assert {k: found[k] for k in ("name", "run_id", "owner", "region", "kind")} == {
            "name": a, "run_id": "run-role-f1", "owner": "alice", "region": "us-east-1", "kind": "role"}
        assert found["created"] is not None
        assert [r["name"] for r in roles.find_run_roles(iam, owner="bob") if r["name"] in (a, b)] == [b]
        assert [r["name"] for r in roles.find_run_roles(iam, owner="alice") if r["name"] in (a, b)] == [a]
        assert roles.find_run_roles(iam, run_id="run-role-f1", owner="bob") == []
        assert [r["name"] for r in roles.find_run_roles(iam, region="eu-west-1") if r["name"] in (a, b)] == [b]
        assert {r["name"] for r in roles.find_run_roles(iam)} >= {a, b}
    finally:
        roles.delete_run_role(iam, a)
        roles.delete_run_role(iam, b)
    assert roles.find_run_roles(iam, run_id="run-role-f1") == [] == roles.find_run_roles(iam, run_id="run-role-f2")


def test_delete_removes_everything_and_again_is_a_no_op(iam):
    name = roles.create_run_role(iam, "run-role-d", "alice", POLICY, user=USER)
    # what another hand may have added: a managed policy attached, a second inline one
    arn = iam.create_policy(PolicyName="ec2gpu-test-extra", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject",
                                                 "Resource": "arn:aws:s3:::x-bucket/*"}]}))["Policy"]["Arn"]
    try:
        iam.attach_role_policy(RoleName=name, PolicyArn=arn)
        iam.put_role_policy(RoleName=name, PolicyName="extra", PolicyDocument=json.dumps(POLICY))
        roles.delete_run_role(iam, name)
        assert _gone(iam, name)
        roles.delete_run_role(iam, name)  # already gone: success
        roles.delete_run_role(iam, "ec2gpu-never-made")
    finally:
        iam.delete_policy(PolicyArn=arn)


def test_an_orphan_profile_is_found_and_removed(iam):
    name = roles.create_run_role(iam, "run-role-o", "alice", POLICY, user=USER, region="us-east-1")
    iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name)
    iam.delete_role_policy(RoleName=name, PolicyName="ec2gpu-s3")
    iam.delete_role(RoleName=name)  # the role gone, its profile left behind
    (found,) = roles.find_run_roles(iam, run_id="run-role-o")
    assert (found["name"], found["kind"], found["owner"], found["region"]) == (name, "instance_profile", "alice",
                                                                               "us-east-1")
    roles.delete_run_role(iam, name)
    assert _gone(iam, name) and roles.find_run_roles(iam, run_id="run-role-o") == []


class _FailingAt:
    """An IAM client whose ``operation`` raises (a ClientError ``code``), the rest passed through."""

    def __init__(self, client, operation: str, code: str = "ServiceFailure"):
        self.client, self.operation, self.code = client, operation, code

    def __getattr__(self, attr):
        if attr == self.operation:
            def fail(*_, **__):
                raise botocore.exceptions.ClientError({"Error": {"Code": self.code, "Message": "injected"}}, attr)
            return fail
        return getattr(self.client, attr)


@pytest.mark.parametrize("operation", ["put_role_policy", "create_instance_profile", "add_role_to_instance_profile",
                                       "get_waiter"])
def test_a_failure_half_way_removes_what_was_made_and_raises(iam, operation):
    with pytest.raises(botocore.exceptions.ClientError, match="injected"):
        roles.create_run_role(_FailingAt(iam, operation), "run-role-h", "alice", POLICY, user=USER, sleep=lambda s: None)
    assert _gone(iam, "ec2gpu-run-role-h")


def test_a_role_that_already_exists_is_neither_taken_nor_removed(iam):
    name = roles.create_run_role(iam, "run-role-x", "alice", POLICY, user=USER)
    try:
        with pytest.raises(botocore.exceptions.ClientError) as err:
            roles.create_run_role(iam, "run-role-x", "mallory", POLICY, user=USER)
        assert err.value.response["Error"]["Code"] == "EntityAlreadyExists"
        assert iam.get_role(RoleName=name)["Role"]["RoleName"] == name
        assert [r["RoleName"] for r in iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]] \
            == [name]
    finally:
        roles.delete_run_role(iam, name)


def test_a_role_outside_the_tools_path_is_never_removed(iam):
    iam.create_role(RoleName="ec2gpu-not-ours", Path="/", AssumeRolePolicyDocument=json.dumps(roles.TRUST))
    try:
        with pytest.raises(ValueError, match="not ec2gpu's"):
            roles.delete_run_role(iam, "ec2gpu-not-ours")
        assert iam.get_role(RoleName="ec2gpu-not-ours")["Role"]["Path"] == "/"
        assert all(r["name"] != "ec2gpu-not-ours" for r in roles.find_run_roles(iam))
    finally:
        iam.delete_role(RoleName="ec2gpu-not-ours")


def test_cleanup_and_down_find_and_remove_a_runs_role_with_its_instance(aws, iam, spec, tmp_path):
    """The role of a run in this region, its instance launched with the profile: inventory lists
    it, delete_run (`down`) terminates the instance and then removes the role and profile."""
    run = spec.run_id
    name = roles.create_run_role(iam, run, "alice", POLICY, user=USER, region="us-east-1")
    (inst,), _ = capacity.launch_with_fallback(aws.client("ec2", fail_fast=True),
                                                replace(spec, instance_profile=name), [spec.instance_type])
    (desc,) = instances.wait_running(aws.ec2, [inst.id], timeout_s=30)
    (raw,) = aws.ec2.describe_instances(InstanceIds=[desc.id])["Reservations"][0]["Instances"]
    assert raw["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/ec2gpu/{name}")
    found = sweep.inventory(aws.ec2, iam=iam)
    assert [r for r in found["instance_roles"] if r["run_id"] == run] == [
        {"id": name, "run_id": run, "name": name, "owner": "alice", "kind": "role"}]
    assert "instance_roles" not in sweep.inventory(aws.ec2, run)  # no IAM client: roles are skipped
    removed = sweep.delete_run(aws.ec2, run, tmp_path, iam=iam)
    assert removed["instances"] == [inst.id] and removed["instance_roles"] == [name]
    assert _gone(iam, name) and sweep.inventory(aws.ec2, run, iam=iam)["instance_roles"] == []


def test_a_region_sweep_takes_only_its_regions_roles(aws, iam, tmp_path):
    """IAM is global: `cleanup` in one region leaves the role of a run tagged with another, and an
    untagged role whose run holds nothing in this region; `down RUN` takes the run's role wherever."""
    there = roles.create_run_role(iam, "run-role-w", "alice", POLICY, user=USER, region="eu-west-1")
    untagged = roles.create_run_role(iam, "run-role-u", "alice", POLICY, user=USER)
    try:
        listed = {r["id"] for r in sweep.inventory(aws.ec2, iam=iam)["instance_roles"]}
        assert there not in listed and untagged not in listed
        gid = network.create_security_group(aws.ec2, "run-role-u", "alice", "127.0.0.1/32")  # the run is here
        try:
            assert untagged in {r["id"] for r in sweep.inventory(aws.ec2, iam=iam)["instance_roles"]}
        finally:
            sweep.delete_security_group(aws.ec2, gid)
        assert sweep.delete_run(aws.ec2, "run-role-w", tmp_path, iam=iam)["instance_roles"] == [there]
    finally:
        roles.delete_run_role(iam, there)
        roles.delete_run_role(iam, untagged)


def test_the_role_of_an_ended_run_is_among_its_leftovers_and_removed(aws, iam, tmp_path, monkeypatch):
    """A run that left only its role (its instances no longer listed; the role dates the run as a
    key pair does): ended_leftovers finds it, remove_leftovers removes it; without an IAM client
    neither looks at roles."""
    name = roles.create_run_role(iam, "run-role-e", "alice", POLICY, user=USER, region="us-east-1")
    try:
        assert "run-role-e" not in sweep.ended_leftovers(aws.ec2, iam=iam)  # made a moment ago: may launch yet
        monkeypatch.setattr(sweep, "UNLISTED_AFTER_S", 0)
        found = sweep.ended_leftovers(aws.ec2, iam=iam)
        assert found["run-role-e"] == {"why": "no instance listed any more", "security_groups": [], "key_pairs": [],
                                       "placement_groups": [], "instance_roles": [name]}
        assert "run-role-e" not in sweep.ended_leftovers(aws.ec2)
        assert "run-role-e" not in sweep.ended_leftovers(aws.ec2, keep={"run-role-e"}, iam=iam)
        done = sweep.remove_leftovers(aws.ec2, {"run-role-e": found["run-role-e"]}, tmp_path, iam=iam)
        assert done["run-role-e"]["instance_roles"] == [name] and done["run-role-e"]["left"] == []
        assert _gone(iam, name) and "run-role-e" not in sweep.ended_leftovers(aws.ec2, iam=iam)
    finally:
        roles.delete_run_role(iam, name)


def test_credentials_that_may_not_list_roles_skip_them(aws, iam):
    said = []
    refusing = _FailingAt(iam, "get_paginator", "AccessDenied")
    found = sweep.inventory(aws.ec2, log=said.append, iam=refusing)
    assert found["instance_roles"] == [] and any("instance roles not listed (AccessDenied)" in m for m in said)
    with pytest.raises(botocore.exceptions.ClientError):
        sweep.inventory(aws.ec2, iam=_FailingAt(iam, "get_paginator", "ServiceFailure"))


def test_ctrl_c_half_way_removes_what_was_made_too(iam):
    class Interrupted(_FailingAt):
        def __getattr__(self, attr):
            if attr == "get_waiter":
                def stop(*_, **__):
                    raise KeyboardInterrupt
                return stop
            return getattr(self.client, attr)
    with pytest.raises(KeyboardInterrupt):
        roles.create_run_role(Interrupted(iam, ""), "run-role-c", "alice", POLICY, user=USER)
    assert _gone(iam, "ec2gpu-run-role-c")


def test_the_accounts_permissions_boundary_is_found_and_given_to_the_role(aws, iam):
    """With docs/iam-policy.json, CreateRole is allowed only under the boundary (no escalation
    through CreateRole + PutRolePolicy + PassRole): the role gets it when the account has it."""
    from pathlib import Path
    account = aws.check_credentials()["Account"]
    assert iam_boundary.boundary_arn(iam, account, aws.region) is None
    doc = (Path(__file__).resolve().parents[2] / "docs" / "iam-instance-boundary.json").read_text()
    arn = iam.create_policy(PolicyName=iam_boundary.BOUNDARY_NAME, Path="/ec2gpu/", PolicyDocument=doc)["Policy"]["Arn"]
    try:
        assert iam_boundary.boundary_arn(iam, account, aws.region) == arn
        name = roles.create_run_role(iam, "run-role-b", "alice", POLICY, user=USER, boundary=arn)
        try:
            assert iam.get_role(RoleName=name)["Role"]["PermissionsBoundary"]["PermissionsBoundaryArn"] == arn
        finally:
            roles.delete_run_role(iam, name)
    finally:
        iam.delete_policy(PolicyArn=arn)
    allowed = {a for s in json.loads(doc)["Statement"] for a in s["Action"]}
    assert allowed == {"s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListBucket",
                       "s3:GetBucketLocation", "autoscaling:UpdateAutoScalingGroup", "autoscaling:SetDesiredCapacity",
                       "s3:DeleteObject",  # a detached run's own checkpoints/ only
                       "ssm:GetParameters",  # a detached run's own secrets only
                       "autoscaling:SetInstanceHealth",  # a run of several nodes': its own group's instances
                       "kms:Decrypt", "kms:GenerateDataKey"}  # SSE-KMS file_mounts buckets' keys, through S3 only


RUN = "20261125-100000-ab12"


def test_a_detached_runs_role_takes_its_policy_under_the_boundary(aws, iam):
    """create_run_role takes detached_policy as it is (alone, or combined with a file_mounts policy),
    IAM (moto) accepts it and the boundary, and the role carries the ec2gpu:run tag the boundary's
    ``${aws:PrincipalTag/ec2gpu:run}`` reads. moto does not enforce either: the scoping is shown by
    tests/unit/test_detached_policy.py's evaluation."""
    from pathlib import Path
    from ec2gpu.aws import groups
    account = aws.check_credentials()["Account"]
    policy = iam_detached.detached_policy(f"ec2gpu-{account}-us-east-1", RUN, groups.name_of(RUN), "us-east-1", account,
                                   user=USER)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "iam-instance-boundary.json").read_text()
    arn = iam.create_policy(PolicyName=iam_boundary.BOUNDARY_NAME, Path="/ec2gpu/", PolicyDocument=doc)["Policy"]["Arn"]
    try:
        for inline in (policy, roles.combined(policy, POLICY)):
            name = roles.create_run_role(iam, RUN, "alice", inline, user=USER, region="us-east-1", boundary=arn)
            try:
                got = iam.get_role_policy(RoleName=name, PolicyName=roles.POLICY_NAME)["PolicyDocument"]
                assert (json.loads(got) if isinstance(got, str) else got) == inline
                role = iam.get_role(RoleName=name)["Role"]
                assert role["PermissionsBoundary"]["PermissionsBoundaryArn"] == arn
                tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name)["Tags"]}
                assert tags["ec2gpu:run"] == RUN and tags["ec2gpu:user"] == USER  # the boundary reads both
            finally:
                roles.delete_run_role(iam, name)
            assert _gone(iam, name)
    finally:
        iam.delete_policy(PolicyArn=arn)


def _resources(doc: dict, sids: set[str] | None = None) -> set[str]:
    out = set()
    for s in doc["Statement"]:
        if sids is None or s["Sid"] in sids:
            out |= {s["Resource"]} if isinstance(s["Resource"], str) else set(s["Resource"])
    return out


def test_the_boundary_reaches_no_bucket_the_users_own_policy_does_not():
    """A run role is the user's way to S3 from the instance: under the boundary it can reach only
    the buckets the user's own policy names for file_mounts and the ec2gpu-* run buckets (only its
    own run's prefix there), and end only ec2gpu-* groups, never `*` (else CreateRole +
    PutRolePolicy would lift the user's limits). Request by request:
    tests/unit/test_detached_policy.py::test_what_the_boundary_allows_the_users_own_policy_allows."""
    from pathlib import Path
    docs = Path(__file__).resolve().parents[2] / "docs"
    boundary = json.loads((docs / "iam-instance-boundary.json").read_text())
    user = json.loads((docs / "iam-policy.json").read_text())
    reach = _resources(boundary)
    assert "*" not in reach and all(r.startswith(("arn:aws:s3:::", "arn:aws:autoscaling:", "arn:aws:ssm:", "arn:aws:kms:"))
                                    for r in reach)
    # a file_mounts bucket's KMS key (issue 51 item 6): any key, but only through S3 and only for the
    # objects of the buckets the user's policy names for file_mounts (S3's encryption context)
    keys = "RunRolesMayUseTheFileMountsBucketsKeysOnlyThroughS3ForThoseBuckets"
    (kms,) = [s for s in boundary["Statement"] if s["Sid"] == keys]
    assert kms["Resource"] == "arn:aws:kms:*:*:key/*" and kms["Condition"] == {"StringLike": {
        "kms:ViaService": "s3.*.amazonaws.com",
        "kms:EncryptionContext:aws:s3:arn": sorted(_resources(user, {"FileMountsObjects",
                                                                     "FileMountsBucketsCheckedOrCreated"}))}}
    boundary["Statement"].remove(kms)
    file_mounts = {"RunRolesMayOnlyReadAndWriteObjectsOfTheFileMountsBuckets", "RunRolesMayListTheFileMountsBuckets"}
    assert _resources(boundary, file_mounts) == _resources(user, {"FileMountsObjects",
                                                                  "FileMountsBucketsCheckedOrCreated"})
    run = "runs/${aws:PrincipalTag/ec2gpu:user}/${aws:PrincipalTag/ec2gpu:run}"
    assert _resources(boundary, {s["Sid"] for s in boundary["Statement"]} - file_mounts) == {
        f"arn:aws:s3:::ec2gpu-*/{run}/*", "arn:aws:s3:::ec2gpu-*", f"arn:aws:s3:::ec2gpu-*/{run}/checkpoints/*",
        "arn:aws:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/ec2gpu-*",
        "arn:aws:ssm:*:*:parameter/ec2gpu/runs/${aws:PrincipalTag/ec2gpu:run}/*"}
    assert _resources(user, {"RunDataOnlyUnderYourOwnPrefixInYourAccountsBuckets", "RunBucketCheckedOnlyInYourAccount",
                             "ListOnlyYourOwnRunsInYourAccountsBuckets", "ChangeAndDeleteOnlyEc2gpuGroups"}) == {
        "arn:aws:s3:::ec2gpu-*/runs/${aws:userid}/*", "arn:aws:s3:::ec2gpu-*",
        "arn:aws:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/ec2gpu-*"}


def test_a_boundary_from_an_older_ec2gpu_is_refused_before_a_detached_run_makes_anything(aws, iam):
    """The shipped boundary allows every action of a detached run's role; one that predates the
    detached runs (no Auto Scaling) is named with what it lacks and the command that updates it,
    before any bucket, role or group exists; a newer version set as default passes."""
    from pathlib import Path
    from types import SimpleNamespace
    from ec2gpu.aws import groups
    from ec2gpu.errors import UsageError
    from ec2gpu.runs.detached import launch
    account = aws.check_credentials()["Account"]
    policy = iam_detached.detached_policy(f"ec2gpu-{account}-us-east-1", RUN, groups.name_of(RUN), "us-east-1", account,
                                   user=USER)
    doc = json.loads((Path(__file__).resolve().parents[2] / "docs" / "iam-instance-boundary.json").read_text())
    old = {**doc, "Statement": [s for s in doc["Statement"] if not s["Action"][0].startswith("autoscaling:")]}
    arn = iam.create_policy(PolicyName=iam_boundary.BOUNDARY_NAME, Path="/ec2gpu/",
                            PolicyDocument=json.dumps(old))["Policy"]["Arn"]
    ui = SimpleNamespace(notes=[], note=lambda text: ui.notes.append(text))
    try:
        assert iam_boundary.boundary_gaps(iam, arn, policy) == ["autoscaling:SetDesiredCapacity",
                                                          "autoscaling:UpdateAutoScalingGroup"]
        with pytest.raises(UsageError, match="does not allow autoscaling:SetDesiredCapacity") as refused:
            launch.check_boundary(aws, RUN, account, ui)
        assert f"create-policy-version --policy-arn {arn}" in refused.value.hint
        assert iam.list_roles(PathPrefix="/ec2gpu/")["Roles"] == []  # nothing made
        # a boundary from before runs of several nodes: one node still runs, several are refused
        no_health = {**doc, "Statement": [s for s in doc["Statement"]
                                          if s["Action"] != ["autoscaling:SetInstanceHealth"]]}
        iam.create_policy_version(PolicyArn=arn, PolicyDocument=json.dumps(no_health), SetAsDefault=True)
        assert launch.check_boundary(aws, RUN, account, ui) == arn
        with pytest.raises(UsageError, match="does not allow autoscaling:SetInstanceHealth"):
            launch.check_boundary(aws, RUN, account, ui, several=True)
        # the boundary from before the run store's per-user prefix: every action, the old prefix
        before = json.loads(json.dumps(doc).replace("${aws:PrincipalTag/ec2gpu:user}/", ""))
        iam.create_policy_version(PolicyArn=arn, PolicyDocument=json.dumps(before), SetAsDefault=True)
        assert iam_boundary.boundary_gaps(iam, arn, policy) == [
            "s3:PutObject under runs/${aws:PrincipalTag/ec2gpu:user}/ (the run store's per-user prefix)"]
        with pytest.raises(UsageError, match="per-user prefix"):
            launch.check_boundary(aws, RUN, account, ui)
        iam.create_policy_version(PolicyArn=arn, PolicyDocument=json.dumps(doc), SetAsDefault=True)
        for v in iam.list_policy_versions(PolicyArn=arn)["Versions"]:  # IAM keeps 5 versions at most
            if not v["IsDefaultVersion"]:
                iam.delete_policy_version(PolicyArn=arn, VersionId=v["VersionId"])
        assert iam_boundary.boundary_gaps(iam, arn, policy) == []
        assert launch.check_boundary(aws, RUN, account, ui) == arn
        assert launch.check_boundary(aws, RUN, account, ui, several=True) == arn
        wide = {**doc, "Statement": [{"Effect": "Allow", "Action": ["s3:*", "AutoScaling:Set*", "autoscaling:Update*"],
                                      "Resource": "*"}]}
        iam.create_policy_version(PolicyArn=arn, PolicyDocument=json.dumps(wide), SetAsDefault=True)
        assert iam_boundary.boundary_gaps(iam, arn, policy) == []  # wildcards match as IAM's do, in any case
        for statements, gaps in (
                ([{"Effect": "Allow", "NotAction": ["iam:*"], "Resource": "*"}], []),  # all but IAM
                ([{"Effect": "Allow", "Action": "*", "Resource": "*"},
                  {"Effect": "Deny", "Action": "autoscaling:SetDesiredCapacity", "Resource": "*"}],
                 ["autoscaling:SetDesiredCapacity"])):
            iam.create_policy_version(PolicyArn=arn, PolicyDocument=json.dumps({**doc, "Statement": statements}),
                                      SetAsDefault=True)
            assert iam_boundary.boundary_gaps(iam, arn, policy) == gaps
            for v in iam.list_policy_versions(PolicyArn=arn)["Versions"]:
                if not v["IsDefaultVersion"]:
                    iam.delete_policy_version(PolicyArn=arn, VersionId=v["VersionId"])
    finally:
        for v in iam.list_policy_versions(PolicyArn=arn)["Versions"]:
            if not v["IsDefaultVersion"]:
                iam.delete_policy_version(PolicyArn=arn, VersionId=v["VersionId"])
        iam.delete_policy(PolicyArn=arn)


@pytest.mark.parametrize("bucket", ["*", "ec2gpu-*"])
def test_a_boundary_that_gives_every_run_role_every_users_runs_is_refused_before_anything_is_made(aws, iam, bucket):
    """docs/iam-instance-boundary.json with `*` (or ec2gpu-*) where YOUR-FILE-MOUNTS-BUCKET stands
    lets a role of any run of the account, whatever its inline policy, read and rewrite every user's
    runs: IAM cannot deny it back in one statement, so a detached run refuses it, naming the
    statement and the command that updates the boundary, before anything is made; the boundary
    with a bucket named passes."""
    from pathlib import Path
    from types import SimpleNamespace

    from ec2gpu.errors import UsageError
    from ec2gpu.runs.detached import launch
    account = aws.check_credentials()["Account"]
    text = (Path(__file__).resolve().parents[2] / "docs" / "iam-instance-boundary.json").read_text()
    arn = iam.create_policy(PolicyName=iam_boundary.BOUNDARY_NAME, Path="/ec2gpu/",
                            PolicyDocument=text.replace("YOUR-FILE-MOUNTS-BUCKET", bucket))["Policy"]["Arn"]
    ui = SimpleNamespace(notes=[], note=lambda text: ui.notes.append(text))
    try:
        with pytest.raises(UsageError, match="lets every run role of the account read and rewrite every user's") as err:
            launch.check_boundary(aws, RUN, account, ui)
        assert "RunRolesMayOnlyReadAndWriteObjectsOfTheFileMountsBuckets" in err.value.message
        assert f"create-policy-version --policy-arn {arn}" in err.value.hint and "never * or ec2gpu-*" in err.value.hint
        assert iam.list_roles(PathPrefix="/ec2gpu/")["Roles"] == []  # nothing made
        iam.create_policy_version(PolicyArn=arn, PolicyDocument=text.replace("YOUR-FILE-MOUNTS-BUCKET", "team-data"),
                                  SetAsDefault=True)
        assert launch.check_boundary(aws, RUN, account, ui) == arn
    finally:
        for v in iam.list_policy_versions(PolicyArn=arn)["Versions"]:
            if not v["IsDefaultVersion"]:
                iam.delete_policy_version(PolicyArn=arn, VersionId=v["VersionId"])
        iam.delete_policy(PolicyArn=arn)
