"""aws/iam_detached.detached_policy: a detached run's instance role reaches its own run's prefix and ends its
own group, nothing else (issue 30, item 6). Shown three ways: the statements as written; an
independent IAM linter (parliament, as tests/unit/test_iam_policy_lint.py reads docs/iam-policy.json);
and requests evaluated against the policy, alone and under the permissions boundary
docs/iam-instance-boundary.json.

The evaluation is tests/iam_eval.py's (its docstring says what it does and leaves out).
"""
import json
from pathlib import Path

import pytest
from iam_eval import allowed
from iam_eval import condition_holds as _condition_holds
from iam_eval import decide as _decide

from ec2gpu.aws import groups, iam, iam_boundary, iam_detached
from ec2gpu.errors import UsageError

DOCS = Path(__file__).resolve().parents[2] / "docs"
ACCOUNT, OTHER_ACCOUNT, REGION = "123456789012", "210987654321", "us-east-1"
BUCKET = f"ec2gpu-{ACCOUNT}-{REGION}"
RUN, OTHER = "20261125-100000-ab12", "20261125-100001-cd34"
#: the run's maker: a role session's user id (aws:userid, STS's UserId), ':' and '@' in it; another user
USER, OTHER_USER = "AROAEXAMPLEROLEID0001:alice@example.com", "AIDAEXAMPLEUSERID0002"
GROUP = groups.name_of(RUN)
POLICY = iam_detached.detached_policy(BUCKET, RUN, GROUP, REGION, ACCOUNT, user=USER)
SECRETS_POLICY = iam_detached.detached_policy(BUCKET, RUN, GROUP, REGION, ACCOUNT, secrets=True, user=USER)


# --- the evaluator ---------------------------------------------------------------------------

def test_the_evaluator_itself():
    p = {"Statement": [{"Effect": "Allow", "Action": ["s3:Get*"], "Resource": "arn:aws:s3:::b/a${*}/${k}/*",
                        "Condition": {"StringLike": {"s3:prefix": ["x/*", "y"]}}},
                       {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/a*/v/no"}]}
    ctx = {"k": "v", "s3:prefix": "x/1"}
    assert allowed(p, ("S3:getobject", "arn:aws:s3:::b/a*/v/f", ctx))
    assert not allowed(p, ("s3:GetObject", "arn:aws:s3:::b/ab/v/f", ctx))  # ${*} is a literal star
    assert not allowed(p, ("s3:GetObject", "arn:aws:s3:::b/a*/w/f", ctx))  # the variable is v
    assert not allowed(p, ("s3:GetObject", "arn:aws:s3:::b/a*/v/f", {"k": "v"}))  # no s3:prefix: refused
    assert allowed(p, ("s3:GetObject", "arn:aws:s3:::b/a*/v/f", {"k": "v", "s3:prefix": "y"}))
    assert not allowed(p, ("s3:GetObject", "arn:aws:s3:::b/a*/v/f", {"k": "v", "s3:prefix": "y/1"}))
    assert not allowed(p, ("s3:GetObject", "arn:aws:s3:::b/a*/v/f", {"s3:prefix": "x/1"}))  # no value for ${k}
    assert _decide(p, "s3:GetObject", "arn:aws:s3:::b/a*/v/no", ctx) == "Deny"
    assert not allowed(p, ("s3:PutObject", "arn:aws:s3:::b/a*/v/f", ctx))
    with pytest.raises(AssertionError, match="does not know"):
        _condition_holds({"DateGreaterThan": {"aws:CurrentTime": "2020-01-01"}}, {"aws:CurrentTime": "x"})


# --- requests as AWS would see them -----------------------------------------------------------

def _principal(run: str = RUN, account: str = ACCOUNT, user: str = USER) -> dict:
    """The request context of the run role's session on its instance: its tags are the principal's
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html#condition-keys-principaltag),
    and the instance it was delivered to is ec2:SourceInstanceARN (present for an EC2 role session only)."""
    return {"aws:PrincipalTag/ec2gpu:run": run, "aws:PrincipalTag/ec2gpu:user": user, "aws:PrincipalAccount": account,
            "ec2:SourceInstanceARN": f"arn:aws:ec2:{REGION}:{account}:instance/i-0123456789abcdef0"}


def s3(action: str, key: str | None = None, *, bucket: str = BUCKET, prefix: str | None = None,
       owner: str = ACCOUNT, run: str = RUN, user: str = USER) -> tuple:
    resource = f"arn:aws:s3:::{bucket}" + (f"/{key}" if key is not None else "")
    context = {**_principal(run, user=user), "s3:ResourceAccount": owner}
    if prefix is not None:
        context["s3:prefix"] = prefix
    return action, resource, context


def group(action: str, name: str = GROUP, *, tag: str | None = RUN, region: str = REGION, account: str = ACCOUNT,
          sizes: tuple[int, int] | None = None, run: str = RUN) -> tuple:
    resource = (f"arn:aws:autoscaling:{region}:{account}:autoScalingGroup:"
                f"0c2e4a6d-1111-2222-3333-444455556666:autoScalingGroupName/{name}")
    context = _principal(run)
    if tag is not None:
        context["autoscaling:ResourceTag/ec2gpu:run"] = context["aws:ResourceTag/ec2gpu:run"] = tag
    if sizes is not None:
        context["autoscaling:MinSize"], context["autoscaling:MaxSize"] = str(sizes[0]), str(sizes[1])
    return action, resource, context


ALLOWED = {
    "PutObject runs/RUN/outputs/x": s3("s3:PutObject", f"runs/{USER}/{RUN}/outputs/x"),
    "GetObject runs/RUN/checkpoints/latest.pt": s3("s3:GetObject", f"runs/{USER}/{RUN}/checkpoints/latest.pt"),
    "AbortMultipartUpload runs/RUN/outputs/big": s3("s3:AbortMultipartUpload", f"runs/{USER}/{RUN}/outputs/big"),
    "DeleteObject runs/RUN/checkpoints/old.pt (the job pruned it)": s3("s3:DeleteObject",
                                                                      f"runs/{USER}/{RUN}/checkpoints/old.pt"),
    "ListBucket prefix runs/RUN/": s3("s3:ListBucket", prefix=f"runs/{USER}/{RUN}/"),
    "ListBucket prefix runs/RUN/outputs/": s3("s3:ListBucket", prefix=f"runs/{USER}/{RUN}/outputs/"),
    "UpdateAutoScalingGroup its group to 0 (groups.end)": group("autoscaling:UpdateAutoScalingGroup", sizes=(0, 0)),
    "SetDesiredCapacity on its group": group("autoscaling:SetDesiredCapacity"),
}

REFUSED = {
    "GetObject runs/OTHER/x": s3("s3:GetObject", f"runs/{USER}/{OTHER}/x"),
    "PutObject runs/OTHER/x": s3("s3:PutObject", f"runs/{USER}/{OTHER}/x"),
    "GetObject runs/RUN-more/x (a longer id)": s3("s3:GetObject", f"runs/{USER}/{RUN}-more/x"),
    "GetObject runs/RUN (no slash)": s3("s3:GetObject", f"runs/{USER}/{RUN}"),
    "GetObject outside runs/": s3("s3:GetObject", f"ledger/{RUN}/x"),
    "DeleteObject runs/RUN/x": s3("s3:DeleteObject", f"runs/{USER}/{RUN}/x"),
    "DeleteObject runs/RUN/status.json": s3("s3:DeleteObject", f"runs/{USER}/{RUN}/status.json"),
    "DeleteObject runs/OTHER/checkpoints/x": s3("s3:DeleteObject", f"runs/{USER}/{OTHER}/checkpoints/x"),
    "GetObject of the same run id under another user": s3("s3:GetObject", f"runs/{OTHER_USER}/{RUN}/x"),
    "PutObject of the same run id under another user": s3("s3:PutObject", f"runs/{OTHER_USER}/{RUN}/agent/detached.py"),
    "GetObject runs/RUN/x (the layout before the user id)": s3("s3:GetObject", f"runs/{RUN}/x"),
    "ListBucket prefix runs/USER/ (every run of the user)": s3("s3:ListBucket", prefix=f"runs/{USER}/"),
    "ListBucket prefix runs/OTHER_USER/RUN/": s3("s3:ListBucket", prefix=f"runs/{OTHER_USER}/{RUN}/"),
    "ListBucket without a prefix": s3("s3:ListBucket"),
    "ListBucket prefix ''": s3("s3:ListBucket", prefix=""),
    "ListBucket prefix runs/": s3("s3:ListBucket", prefix="runs/"),
    "ListBucket prefix runs/OTHER/": s3("s3:ListBucket", prefix=f"runs/{USER}/{OTHER}/"),
    "ListBucket prefix runs/2026 (a partial id)": s3("s3:ListBucket", prefix="runs/2026"),
    "ListBucket prefix runs/RUN (no slash: runs/RUN-more too)": s3("s3:ListBucket", prefix=f"runs/{USER}/{RUN}"),
    "GetObject in another bucket": s3("s3:GetObject", f"runs/{USER}/{RUN}/x",
                                      bucket="ec2gpu-123456789012-eu-west-1"),
    "ListBucket another bucket": s3("s3:ListBucket", bucket="other-bucket", prefix=f"runs/{USER}/{RUN}/"),
    "PutObject in a bucket of that name owned by another account":
        s3("s3:PutObject", f"runs/{USER}/{RUN}/outputs/x", owner=OTHER_ACCOUNT),
    "GetBucketLocation": s3("s3:GetBucketLocation"),
    "SetDesiredCapacity on another run's group": group("autoscaling:SetDesiredCapacity", groups.name_of(OTHER),
                                                       tag=OTHER),
    "SetDesiredCapacity on another group tagged as this run": group("autoscaling:SetDesiredCapacity", "web-asg"),
    "SetDesiredCapacity on its name without the run's tag": group("autoscaling:SetDesiredCapacity", tag=None),
    "SetDesiredCapacity on its name with another run's tag": group("autoscaling:SetDesiredCapacity", tag=OTHER),
    "SetDesiredCapacity on its name in another region": group("autoscaling:SetDesiredCapacity", region="eu-west-1"),
    "SetDesiredCapacity on its name in another account": group("autoscaling:SetDesiredCapacity",
                                                               account=OTHER_ACCOUNT),
    "UpdateAutoScalingGroup growing it": group("autoscaling:UpdateAutoScalingGroup", sizes=(0, 8)),
    "UpdateAutoScalingGroup with no sizes (another setting)": group("autoscaling:UpdateAutoScalingGroup"),
    "UpdateAutoScalingGroup another run's group to 0": group("autoscaling:UpdateAutoScalingGroup",
                                                             groups.name_of(OTHER), tag=OTHER, sizes=(0, 0)),
    "DeleteAutoScalingGroup its group": group("autoscaling:DeleteAutoScalingGroup"),
    "PutScheduledUpdateGroupAction its group": group("autoscaling:PutScheduledUpdateGroupAction"),
    "DescribeAutoScalingGroups": ("autoscaling:DescribeAutoScalingGroups", "*", _principal()),
}


def _boundary() -> dict:
    return json.loads((DOCS / "iam-instance-boundary.json").read_text())


@pytest.mark.parametrize("what", list(ALLOWED))
def test_what_the_role_may_do_is_allowed_alone_and_under_the_boundary(what):
    assert allowed(POLICY, ALLOWED[what])
    assert allowed(POLICY, ALLOWED[what], _boundary())


@pytest.mark.parametrize("what", list(REFUSED))
def test_everything_else_is_refused(what):
    assert not allowed(POLICY, REFUSED[what])


WIDE = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "autoscaling:*"],
                                                "Resource": "*"}]}
WIDE_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["*"], "Resource": "*"}]}


#: what the boundary leaves to the inline policy: it is one document for every run role of the account,
#: so it names no bucket, region or account of a run. Any ec2gpu-* bucket of the account (the run's
#: prefix in it only), GetBucketLocation (file_mounts roles need it), and a group of the run's name and
#: tag in any region and account (Auto Scaling has no resource-based policies: a role acts on its own
#: account's groups only, https://docs.aws.amazon.com/autoscaling/ec2/userguide/control-access-using-iam.html)
_INLINE_ONLY = ("GetBucketLocation", "another bucket", "another region", "another account")


@pytest.mark.parametrize("what", [w for w in REFUSED if not any(x in w for x in _INLINE_ONLY)])
def test_the_boundary_alone_refuses_another_runs_data_and_groups_whatever_the_inline_policy(what):
    """A role whose inline policy allowed everything (s3:*, autoscaling:* on *) is still held by
    the boundary to its own run, through its own ec2gpu:run tag (``${aws:PrincipalTag/ec2gpu:run}``)."""
    assert not allowed(WIDE, REFUSED[what], _boundary())
    assert allowed(WIDE, ALLOWED["PutObject runs/RUN/outputs/x"], _boundary())
    # the same requests from another run's role: that role's tag decides, not the request's keys
    assert not allowed(WIDE, s3("s3:GetObject", f"runs/{USER}/{RUN}/x", run=OTHER), _boundary())
    # nor another user's role tagged with this run's id (which that user may make: a run id is no secret)
    assert not allowed(WIDE, s3("s3:GetObject", f"runs/{USER}/{RUN}/x", user=OTHER_USER), _boundary())
    assert not allowed(WIDE, s3("s3:ListBucket", prefix=f"runs/{USER}/{RUN}/", user=OTHER_USER), _boundary())
    assert not allowed(WIDE, group("autoscaling:SetDesiredCapacity", run=OTHER), _boundary())
    # a role without the tag reaches no run's data or group
    _, resource, context = ALLOWED["GetObject runs/RUN/checkpoints/latest.pt"]
    for tag in ("aws:PrincipalTag/ec2gpu:run", "aws:PrincipalTag/ec2gpu:user"):
        untagged = {k: v for k, v in context.items() if k != tag}
        assert not allowed(WIDE, ("s3:GetObject", resource, untagged), _boundary())


def test_the_boundary_allows_nothing_by_tag_to_a_session_that_is_not_an_instances():
    """Tags a session is given when assumed override the role's own
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/id_session-tags.html), and a user may make a
    role under the boundary with a trust policy of their own: a session assumed with the tags of
    another user's run would have that run's ``${aws:PrincipalTag/...}``. The boundary's statements
    that read the role's tags apply only to an EC2 instance's role session (``ec2:SourceInstanceARN``
    present), whose tags are the role's."""
    for request in (ALLOWED["PutObject runs/RUN/outputs/x"], ALLOWED["ListBucket prefix runs/RUN/"],
                    ALLOWED["SetDesiredCapacity on its group"], secret("HF_TOKEN")):
        action, resource, context = request
        assert allowed(WIDE_ALL, request, _boundary())
        assumed = {k: v for k, v in context.items() if k != "ec2:SourceInstanceARN"}
        assert not allowed(WIDE_ALL, (action, resource, assumed), _boundary()), action


def test_the_boundary_still_lets_file_mounts_roles_reach_their_bucket():
    ctx = _principal()
    assert allowed(WIDE, ("s3:GetObject", "arn:aws:s3:::YOUR-FILE-MOUNTS-BUCKET/data/x", ctx), _boundary())
    assert allowed(WIDE, ("s3:ListBucket", "arn:aws:s3:::YOUR-FILE-MOUNTS-BUCKET", ctx), _boundary())
    assert not allowed(WIDE, ("s3:DeleteObject", "arn:aws:s3:::YOUR-FILE-MOUNTS-BUCKET/data/x", ctx), _boundary())


@pytest.mark.parametrize("bucket", ["*", "ec2gpu-*", "ec2gpu-*/runs", "*-*"])
def test_a_boundary_whose_file_mounts_bucket_reaches_the_run_store_is_found(bucket):
    """The boundary's file_mounts statements name what an administrator writes for
    YOUR-FILE-MOUNTS-BUCKET. Written ``*`` (or ``ec2gpu-*``), a role of another user's run, with
    any inline policy, reads and rewrites this user's runs, agent code included; IAM has no one
    statement that denies "ec2gpu-*/runs/* but the role's own run" (a statement has a Resource or a
    NotResource, not both), so ec2gpu refuses such a boundary before a detached run makes anything
    (aws/iam_boundary.reaches_other_runs, launch.check_boundary: tests/aws/test_run_role.py). Both the
    evaluator and reaches_other_runs say so, and neither of the shipped boundary."""
    text = (DOCS / "iam-instance-boundary.json").read_text()
    wide = json.loads(text.replace("YOUR-FILE-MOUNTS-BUCKET", bucket))
    theirs = s3("s3:PutObject", f"runs/{USER}/{RUN}/agent/detached.py", run=OTHER, user=OTHER_USER)
    assert allowed(WIDE, theirs, wide) and not allowed(WIDE, theirs, _boundary())
    assert iam_boundary.reaches_other_runs(wide, OTHER_USER, OTHER, ACCOUNT) == [
        "RunRolesMayOnlyReadAndWriteObjectsOfTheFileMountsBuckets"]
    assert iam_boundary.reaches_other_runs(_boundary(), OTHER_USER, OTHER, ACCOUNT) == []
    assert iam_boundary.reaches_other_runs(json.loads(text.replace("YOUR-FILE-MOUNTS-BUCKET", "team-data")), USER, RUN,
                                  ACCOUNT) == []


def test_reaches_other_runs_reads_resources_as_iam_does():
    def one(**statement) -> dict:
        return {"Statement": [{"Sid": "S", "Effect": "Allow", "Action": ["s3:GetObject"], **statement}]}
    assert iam_boundary.reaches_other_runs(one(Resource="arn:aws:s3:::ec2gpu-?*/*"), USER, RUN, ACCOUNT) == ["S"]
    assert iam_boundary.reaches_other_runs(one(NotResource="arn:aws:s3:::data/*"), USER, RUN, ACCOUNT) == ["S"]
    assert iam_boundary.reaches_other_runs(one(NotResource="arn:aws:s3:::ec2gpu-*"), USER, RUN, ACCOUNT) == []
    assert iam_boundary.reaches_other_runs(one(Resource="arn:aws:s3:::ec2gpu-*"), USER, RUN, ACCOUNT) == ["S"]  # * spans "/"
    assert iam_boundary.reaches_other_runs(one(Resource="arn:aws:s3:::ec2gpu-*/runs/${aws:userid}/*"), USER, RUN, ACCOUNT) == []
    assert iam_boundary.reaches_other_runs(one(Resource="arn:aws:s3:::EC2GPU-*/*"), USER, RUN, ACCOUNT) == []  # case counts
    assert iam_boundary.reaches_other_runs({"Statement": [{"Effect": "Allow", "NotAction": ["iam:*"], "Resource": "*"},
                                                 {"Effect": "Deny", "Action": "*", "Resource": "*"}]},
                                  USER, RUN, ACCOUNT) == ["statement 1"]
    assert iam_boundary.reaches_other_runs(None, USER, RUN, ACCOUNT) == []


def test_what_the_boundary_allows_the_users_own_policy_allows():
    """Making a run role is no way around the user's policy: every request of a detached run the
    boundary lets through, docs/iam-policy.json allows the user too (with the user's own account as
    aws:PrincipalAccount, and as aws:userid the id the role is tagged with: its maker's)."""
    user = json.loads((DOCS / "iam-policy.json").read_text())
    for what, (action, resource, context) in {**ALLOWED, **REFUSED}.items():
        if allowed(WIDE, (action, resource, context), _boundary()):
            assert allowed(user, (action, resource, {**context, "aws:userid": USER})), what


def test_the_statements_are_exactly_these():
    prefix = f"runs/{USER}/{RUN}/"
    arn = f"arn:aws:autoscaling:us-east-1:{ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/ec2gpu-{RUN}"
    assert POLICY == {"Version": "2012-10-17", "Statement": [
        {"Sid": "RunObjects", "Effect": "Allow", "Action": ["s3:AbortMultipartUpload", "s3:GetObject", "s3:PutObject"],
         "Resource": f"arn:aws:s3:::{BUCKET}/{prefix}*", "Condition": {"StringEquals": {"s3:ResourceAccount": ACCOUNT}}},
        {"Sid": "PruneOwnCheckpoints", "Effect": "Allow", "Action": ["s3:DeleteObject"],
         "Resource": f"arn:aws:s3:::{BUCKET}/{prefix}checkpoints/*",
         "Condition": {"StringEquals": {"s3:ResourceAccount": ACCOUNT}}},
        {"Sid": "ListRunPrefix", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{BUCKET}",
         "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]},
                       "StringEquals": {"s3:ResourceAccount": ACCOUNT}}},
        {"Sid": "EndOwnGroup", "Effect": "Allow", "Action": ["autoscaling:UpdateAutoScalingGroup"], "Resource": arn,
         "Condition": {"StringEquals": {"autoscaling:ResourceTag/ec2gpu:run": RUN},
                       "NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}}},
        {"Sid": "LowerOwnGroup", "Effect": "Allow", "Action": ["autoscaling:SetDesiredCapacity"], "Resource": arn,
         "Condition": {"StringEquals": {"autoscaling:ResourceTag/ec2gpu:run": RUN}}},
    ]}
    text = json.dumps(POLICY)
    assert text.count("s3:DeleteObject") == 1 and "Describe" not in text and '"*"' not in text
    assert all(s["Effect"] == "Allow" for s in POLICY["Statement"])


def test_the_group_is_named_as_aws_groups_names_it():
    assert iam_detached.GROUP_PREFIX + RUN == groups.name_of(RUN) and iam_detached.run_prefix(USER, RUN) == f"runs/{USER}/{RUN}/"


@pytest.mark.parametrize("run_id", ["x*", "../", "*", "", "20261125-100000-ab1*", "20261125-100000-AB12",
                                    "20261125-100000-ab12/", "20261125-100000-ab12\n", "20261125-100000-ab12/../x",
                                    "2026112๕-100000-ab12", "20261125-100000-ab12${*}", "runs/20261125-100000-ab12",
                                    None, 20261125])
def test_a_run_id_that_is_not_one_is_refused(run_id):
    with pytest.raises(UsageError) as err:
        iam_detached.detached_policy(BUCKET, run_id, f"ec2gpu-{run_id}", REGION, ACCOUNT, user=USER)
    assert err.value.hint


@pytest.mark.parametrize("bucket", ["ec2gpu-*", "ec2gpu-?", "ec2gpu-${aws:username}", "a/b", "Ec2gpu-x", "", "*",
                                    "ec2gpu-123456789012-us-east-1/runs", None])
def test_a_bucket_that_is_not_a_bucket_name_is_refused(bucket):
    with pytest.raises(UsageError) as err:
        iam_detached.detached_policy(bucket, RUN, GROUP, REGION, ACCOUNT, user=USER)
    assert "bucket" in err.value.message and err.value.hint


@pytest.mark.parametrize("name", ["ec2gpu-*", f"ec2gpu-{OTHER}", f"{GROUP}*", "*", "", f"x{GROUP}", f"{GROUP}/x",
                                  None])
def test_a_group_other_than_the_runs_own_is_refused(name):
    with pytest.raises(UsageError, match="is not the group of run"):
        iam_detached.detached_policy(BUCKET, RUN, name, REGION, ACCOUNT, user=USER)


@pytest.mark.parametrize(("region", "account"), [("us-east-1*", ACCOUNT), ("*", ACCOUNT), ("", ACCOUNT),
                                                 ("us-east-1:x", ACCOUNT), (REGION, "*"), (REGION, "12345678901"),
                                                 (REGION, "12345678901a"), (REGION, "1234567890123"), (REGION, None)])
def test_a_region_or_account_that_is_not_one_is_refused(region, account):
    with pytest.raises(UsageError):
        iam_detached.detached_policy(BUCKET, RUN, GROUP, region, account, user=USER)


def test_other_regions_and_partition_free_names_are_taken():
    for region in ("eu-west-1", "ap-southeast-2", "us-gov-west-1", "il-central-1"):
        (statement,) = [s for s in iam_detached.detached_policy(BUCKET, RUN, GROUP, region, ACCOUNT, user=USER)["Statement"]
                        if s["Sid"] == "LowerOwnGroup"]
        part = "aws-us-gov" if region.startswith("us-gov-") else "aws"
        assert statement["Resource"].startswith(f"arn:{part}:autoscaling:{region}:{ACCOUNT}:autoScalingGroup:*:")


def test_combined_with_a_file_mounts_policy_keeps_both_and_refuses_repeated_ids():
    both = iam.combined(POLICY, iam.s3_policy([("data-bucket", "train/")], []))
    assert [s["Sid"] for s in both["Statement"]] == ["RunObjects", "PruneOwnCheckpoints", "ListRunPrefix", "EndOwnGroup",
                                                     "LowerOwnGroup", "Read", "List1", "Locate"]
    assert allowed(both, s3("s3:GetObject", "train/x", bucket="data-bucket"))
    assert not allowed(both, s3("s3:GetObject", f"runs/{USER}/{OTHER}/x"))
    with pytest.raises(ValueError, match="repeat"):
        iam.combined(POLICY, POLICY)
    with pytest.raises(ValueError, match="no policy"):
        iam.combined()
    huge = {"Statement": [{"Sid": "Big", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": [f"arn:aws:s3:::b-1/{n:05d}/*" for n in range(600)]}]}
    with pytest.raises(ValueError, match="10240"):
        iam.combined(POLICY, huge)


# --- the linter (parliament), as for docs/iam-policy.json -------------------------------------

def _above_low(text: str) -> list[tuple[str, str]]:
    from parliament import analyze_policy_string, enhance_finding

    findings = [enhance_finding(f) for f in analyze_policy_string(text).findings]
    return [(f.issue, json.dumps(f.detail, default=str)) for f in findings if f.severity not in ("LOW", "INFO", "MUTE")]


def test_parliament_finds_nothing_in_the_detached_policy():
    """Of an IAM user's run (a user id of letters and digits), nothing at all. A role session's user
    id holds a colon (``AROA...:NAME``), which S3 keys and IAM object ARNs allow (an ARN's resource
    is all that follows its fifth colon: https://docs.aws.amazon.com/IAM/latest/UserGuide/reference-arns.html);
    parliament splits the ARN at it and reports the object statements' format, and nothing else."""
    from parliament import analyze_policy_string

    for secrets, several in ((False, False), (True, False), (False, True)):
        policy = iam_detached.detached_policy(BUCKET, RUN, GROUP, REGION, ACCOUNT, secrets, several, user=OTHER_USER)
        assert analyze_policy_string(json.dumps(policy)).findings == []
    for region in ("eu-west-1", "ap-northeast-1"):
        assert _above_low(json.dumps(iam_detached.detached_policy(f"ec2gpu-{ACCOUNT}-{region}", OTHER, groups.name_of(OTHER),
                                                         region, ACCOUNT, user=OTHER_USER))) == []
    objects = ("RESOURCE_MISMATCH", json.dumps([{"action": a, "required_format": "arn:*:s3:::*/*"}
                                                for a in ("s3:AbortMultipartUpload", "s3:GetObject", "s3:PutObject")]))
    prune = ("RESOURCE_MISMATCH", json.dumps([{"action": "s3:DeleteObject", "required_format": "arn:*:s3:::*/*"}]))
    assert _above_low(json.dumps(SECRETS_POLICY)) == [objects, prune]
    assert _above_low(json.dumps(SECRETS_POLICY).replace(USER, USER.replace(":", "_"))) == []


def test_parliament_finds_nothing_above_low_in_the_boundary_but_one_known_false_positive():
    """parliament strips policy variables from a Resource with the pattern ``\\$\\{aws.[\\w/]+\\}``
    (parliament/__init__.py, strip_var_from_arn), which stops at the colon of the tag key
    ``ec2gpu:run`` (and ``ec2gpu:user``): it then sees a colon in the object key and reports the
    object ARN as the wrong format. IAM allows ``:`` in tag keys and a tag key in ``${aws:PrincipalTag/...}``
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html)."""
    false_positive = ("RESOURCE_MISMATCH", json.dumps(
        [{"action": a, "required_format": "arn:*:s3:::*/*"}
         for a in ("s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload")]))
    prune = ("RESOURCE_MISMATCH", json.dumps([{"action": "s3:DeleteObject", "required_format": "arn:*:s3:::*/*"}]))
    secrets = ("RESOURCE_MISMATCH", json.dumps([{"action": "ssm:GetParameters",
                                                 "required_format": "arn:*:ssm:*:*:parameter/*"}]))
    assert _above_low((DOCS / "iam-instance-boundary.json").read_text()) == [false_positive, prune, secrets]
    # the same statement with a colon-free tag key passes: the finding is the colon, nothing else
    text = (DOCS / "iam-instance-boundary.json").read_text().replace("PrincipalTag/ec2gpu:", "PrincipalTag/")
    assert _above_low(text) == []


@pytest.mark.parametrize("region, partition", [("cn-north-1", "aws-cn"), ("us-gov-west-1", "aws-us-gov"),
                                               ("eu-west-1", "aws")])
def test_every_arn_is_in_the_regions_partition(region, partition):
    policy = iam_detached.detached_policy(f"ec2gpu-{ACCOUNT}-{region}", RUN, f"ec2gpu-{RUN}", region, ACCOUNT, secrets=True,
                                 user=USER)
    assert all(s["Resource"].startswith(f"arn:{partition}:") for s in policy["Statement"])


# --- a run with secrets (aws/parameters.py) ------------------------------------------------------

def secret(name: str, *, run_path: str = RUN, region: str = REGION, account: str = ACCOUNT, run: str = RUN,
           user: str = USER, tagged: str | None = USER) -> tuple:
    """GetParameters of a run's secret by the role of run ``run`` made by ``user``; the parameter
    tagged ec2gpu:user = ``tagged`` (aws/parameters.put tags it with its maker; None: untagged)."""
    context = {**_principal(run, user=user), **({"aws:ResourceTag/ec2gpu:user": tagged} if tagged else {})}
    return "ssm:GetParameters", f"arn:aws:ssm:{region}:{account}:parameter/ec2gpu/runs/{run_path}/{name}", context


SECRET_REFUSED = {
    "another run's secret": secret("HF_TOKEN", run_path=OTHER),
    "a secret of a longer run id": secret("HF_TOKEN", run_path=f"{RUN}-more"),
    "a parameter outside ec2gpu's path": ("ssm:GetParameters", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/prod/db",
                                          _principal()),
    "the run's secret in another region": secret("HF_TOKEN", region="eu-west-1"),
    "the run's secret in another account": secret("HF_TOKEN", account=OTHER_ACCOUNT),
    "GetParametersByPath on the run's path": ("ssm:GetParametersByPath",
                                              f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/ec2gpu/runs/{RUN}", _principal()),
    "PutParameter on the run's secret": ("ssm:PutParameter", secret("HF_TOKEN")[1], _principal()),
    "DeleteParameters on the run's secret": ("ssm:DeleteParameters", secret("HF_TOKEN")[1], _principal()),
    "DescribeParameters": ("ssm:DescribeParameters", "*", _principal()),
    "a parameter under the run's path that another user made": secret("HF_TOKEN", tagged=OTHER_USER),
    "an untagged parameter under the run's path": secret("HF_TOKEN", tagged=None),
}


def test_a_run_with_secrets_reads_its_own_and_nothing_else():
    """With ``secrets`` the role reads its own run's parameters (alone and under the boundary),
    no other run's, no other path's, and cannot write, delete or list any; without, it reads none."""
    assert allowed(SECRETS_POLICY, secret("HF_TOKEN"))
    assert allowed(SECRETS_POLICY, secret("HF_TOKEN"), _boundary())
    assert not allowed(POLICY, secret("HF_TOKEN"))  # a run without secrets: no statement for them
    for what, request in SECRET_REFUSED.items():
        assert not allowed(SECRETS_POLICY, request), what
    for what in ALLOWED:  # the rest of the policy is the same
        assert allowed(SECRETS_POLICY, ALLOWED[what])
    for what in REFUSED:
        assert not allowed(SECRETS_POLICY, REFUSED[what])
    assert SECRETS_POLICY["Statement"][:-1] == POLICY["Statement"]
    assert SECRETS_POLICY["Statement"][-1] == {
        "Sid": "ReadOwnSecrets", "Effect": "Allow", "Action": ["ssm:GetParameters"],
        "Resource": f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/ec2gpu/runs/{RUN}/*",
        "Condition": {"StringEquals": {"aws:ResourceTag/ec2gpu:user": USER}}}


def test_the_boundary_holds_a_role_to_its_own_runs_secrets_whatever_the_inline_policy():
    wide = {"Statement": [{"Effect": "Allow", "Action": ["ssm:*"], "Resource": "*"}]}
    assert allowed(wide, secret("HF_TOKEN"), _boundary())
    assert not allowed(wide, secret("HF_TOKEN", run=OTHER), _boundary())  # another run's role
    # another user's role, tagged with this run's id: the parameter's tag is not its user's
    assert not allowed(wide, secret("HF_TOKEN", user=OTHER_USER), _boundary())
    for what in ("another run's secret", "a secret of a longer run id", "a parameter outside ec2gpu's path",
                 "GetParametersByPath on the run's path", "PutParameter on the run's secret",
                 "DeleteParameters on the run's secret", "DescribeParameters",
                 "a parameter under the run's path that another user made", "an untagged parameter under the run's path"):
        assert not allowed(wide, SECRET_REFUSED[what], _boundary()), what
    user = json.loads((DOCS / "iam-policy.json").read_text())
    action, resource, context = secret("HF_TOKEN")
    assert allowed(user, (action, resource, {**context, "aws:userid": USER}))  # the role's maker may read it too


def test_a_run_of_several_nodes_may_set_its_own_groups_instances_unhealthy_and_nothing_more():
    """agent/gang.py: a node whose agent went silent while its instance runs is set Unhealthy by
    another, and the group replaces it. A run of one node gets no such statement."""
    several = iam_detached.detached_policy(BUCKET, RUN, GROUP, REGION, ACCOUNT, several=True, user=USER)
    mine = group("autoscaling:SetInstanceHealth")
    assert allowed(several, mine) and allowed(several, mine, _boundary())
    assert not allowed(POLICY, mine)
    for other in (group("autoscaling:SetInstanceHealth", groups.name_of(OTHER), tag=OTHER),
                  group("autoscaling:SetInstanceHealth", tag=None), group("autoscaling:SetInstanceHealth", "web-asg")):
        assert not allowed(several, other)
    assert not allowed(WIDE, group("autoscaling:SetInstanceHealth", run=OTHER), _boundary())
    assert [s for s in several["Statement"] if s["Sid"] not in [t["Sid"] for t in POLICY["Statement"]]] == [
        {"Sid": "ReplaceOwnNodes", "Effect": "Allow", "Action": ["autoscaling:SetInstanceHealth"],
         "Resource": f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/{GROUP}",
         "Condition": {"StringEquals": {"autoscaling:ResourceTag/ec2gpu:run": RUN}}}]


@pytest.mark.parametrize("region, partition", [("cn-northwest-1", "aws-cn"), ("us-gov-east-1", "aws-us-gov"),
                                               ("us-isob-east-1", "aws-iso-b"), ("ap-south-2", "aws"),
                                               ("local", "aws")])
def test_the_boundary_is_looked_up_in_the_regions_partition(region, partition):
    """GetPolicy refuses an arn:aws: ARN in China or GovCloud: the boundary's ARN takes the region's
    partition from botocore's partition data (runstore.partition), the sandbox's "local" is aws."""
    class Iam:
        asked: list[str] = []

        def get_policy(self, PolicyArn):
            self.asked.append(PolicyArn)
            return {"Policy": {"Arn": PolicyArn}}

    iam = Iam()
    arn = iam_boundary.boundary_arn(iam, ACCOUNT, region)
    assert arn == iam.asked[0] == f"arn:{partition}:iam::{ACCOUNT}:policy/ec2gpu/ec2gpu-instance-boundary"
