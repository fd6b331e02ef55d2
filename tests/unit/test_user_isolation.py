"""Two users of one account, both held by docs/iam-policy.json (issue 44, item 6): what ec2gpu does
for a user's own runs is allowed, and nothing of another user's run-store objects, secrets or run
roles is: not read, written, listed, deleted, retagged or passed to an instance.

Requests are evaluated as AWS would see them (tests/iam_eval.py: the policy's ``${aws:userid}`` is
the caller's STS UserId, aws/runstore.user_id) and the policy is read by parliament too
(tests/unit/test_iam_policy_lint.py). What each request stands for is in its label; the ones
ec2gpu makes are the ones a sandbox session records (tests/e2e/test_iam_policy.py checks those
against the same policy with the sandbox's own user id).
"""
import json
from pathlib import Path

import pytest
from iam_eval import allowed

from ec2gpu.aws import iam, iam_boundary, parameters, runstore

POLICY = json.loads((Path(__file__).resolve().parents[2] / "docs" / "iam-policy.json").read_text())
ACCOUNT, REGION = "123456789012", "us-east-1"
BUCKET = runstore.bucket_name(ACCOUNT, REGION)
RUN = "20261201-090000-a1b2"
#: alice signs in through a role (SSO, or assume-role): her user id is the role's id and her session's name;
#: bob is an IAM user. A third, carol, is another session of alice's role: her own user id.
ALICE = "AROAEXAMPLEROLEID0001:alice@example.com"
BOB = "AIDAEXAMPLEUSERID0002"
CAROL = "AROAEXAMPLEROLEID0001:carol@example.com"
THEM = (BOB, CAROL)


def _as(user: str, action: str, resource: str, **context: str) -> tuple:
    """``user``'s request: its context holds what IAM fills in for the caller, and ``context``."""
    return action, resource, {"aws:userid": user, "aws:PrincipalAccount": ACCOUNT, **context}


def obj(user: str, action: str, key: str, owner: str = ACCOUNT) -> tuple:
    return _as(user, action, f"arn:aws:s3:::{BUCKET}/{key}", **{"s3:ResourceAccount": owner})


def listing(user: str, prefix: str | None) -> tuple:
    extra = {} if prefix is None else {"s3:prefix": prefix}
    return _as(user, "s3:ListBucket", f"arn:aws:s3:::{BUCKET}", **{"s3:ResourceAccount": ACCOUNT, **extra})


def _tags(tagged: str | None, older: bool, prefixes: tuple[str, ...] = ("aws",)) -> dict[str, str]:
    """The resource's tags as condition keys: ec2gpu:user = ``tagged`` (None: none); ``older``: the
    ec2gpu:run and ec2gpu:owner tags alone, as ec2gpu tagged a run's secrets and role before it
    tagged them ec2gpu:user (with ``tagged`` None). A resource not made yet has no tags at all."""
    tags = ({"ec2gpu:run": RUN, "ec2gpu:owner": "alice"} if older else {}) | (
        {"ec2gpu:user": tagged} if tagged else {})
    return {f"{p}:ResourceTag/{k}": v for p in prefixes for k, v in tags.items()}


def secret(user: str, action: str, tagged: str | None, name: str = "HF_TOKEN", older: bool = False,
           **context: str) -> tuple:
    """``action`` on run RUN's secret parameter, tagged ec2gpu:user = ``tagged`` (None: not yet made,
    or, with ``older``, made before ec2gpu tagged secrets with their user)."""
    return _as(user, action, f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{parameters.name_of(RUN, name)}",
               **_tags(tagged, older), **context)


def role(user: str, action: str, tagged: str | None, older: bool = False, **context: str) -> tuple:
    """``action`` on run RUN's role, tagged ec2gpu:user = ``tagged`` (None: not yet made, or with
    ``older``, made before ec2gpu tagged roles with their user)."""
    return _as(user, action, f"arn:aws:iam::{ACCOUNT}:role/ec2gpu/{iam.role_name(RUN)}",
               **_tags(tagged, older, ("aws", "iam")), **context)


def profile(user: str, action: str, tagged: str | None, older: bool = False, **context: str) -> tuple:
    """``action`` on run RUN's instance profile (its role's name), tagged as ``role``'s."""
    return _as(user, action, f"arn:aws:iam::{ACCOUNT}:instance-profile/ec2gpu/{iam.role_name(RUN)}",
               **_tags(tagged, older), **context)


#: the condition key IAM fills in for CreateRole and PutRolePolicy: the boundary ec2gpu gives every run role
UNDER_THE_BOUNDARY = {"iam:PermissionsBoundary": f"arn:aws:iam::{ACCOUNT}:policy/ec2gpu/{iam_boundary.BOUNDARY_NAME}"}


def alices(key: str) -> str:
    return runstore.prefix(ALICE, RUN) + key


#: what ec2gpu asks for alice's own run (launch, status, logs, fetch, cancel, runs --remote, cleanup)
OWN = {
    "upload the workdir": obj(ALICE, "s3:PutObject", alices("workdir.tar.gz")),
    "upload the agent": obj(ALICE, "s3:PutObject", alices("agent/detached.py")),
    "abort a multipart upload": obj(ALICE, "s3:AbortMultipartUpload", alices("workdir.tar.gz")),
    "write status.json and cancel": obj(ALICE, "s3:PutObject", alices("cancel")),
    "read status.json (HeadObject too)": obj(ALICE, "s3:GetObject", alices("status.json")),
    "read the log": obj(ALICE, "s3:GetObject", alices("logs/job.log")),
    "fetch the outputs": obj(ALICE, "s3:GetObject", alices("outputs/model.pt")),
    "delete an object of her run": obj(ALICE, "s3:DeleteObject", alices("outputs/model.pt")),
    "list her runs (runs --remote)": listing(ALICE, runstore.user_prefix(ALICE)),
    "list her run's outputs (fetch)": listing(ALICE, runstore.outputs_prefix(ALICE, RUN)),
    "see that the bucket exists (GetBucketLocation)": _as(ALICE, "s3:GetBucketLocation", f"arn:aws:s3:::{BUCKET}",
                                                           **{"s3:ResourceAccount": ACCOUNT}),
    "store a secret, tagged with her id": secret(ALICE, "ssm:PutParameter", None,
                                                 **{"aws:RequestTag/ec2gpu:user": ALICE}),
    "tag it so while storing it": secret(ALICE, "ssm:AddTagsToResource", None, **{"aws:RequestTag/ec2gpu:user": ALICE}),
    "read her secret (logs --follow masks it)": secret(ALICE, "ssm:GetParameters", ALICE),
    "delete her secret (cleanup)": secret(ALICE, "ssm:DeleteParameters", ALICE),
    "make her run's role, tagged with her id": role(ALICE, "iam:CreateRole", None, **UNDER_THE_BOUNDARY,
                                                    **{"aws:RequestTag/ec2gpu:user": ALICE}),
    # CreateRole with Tags is authorised as iam:TagRole too, on a role that has no tags yet
    "tag it so while making it": role(ALICE, "iam:TagRole", None, **{"aws:RequestTag/ec2gpu:user": ALICE}),
    "tag her own role again with her id": role(ALICE, "iam:TagRole", ALICE, **{"aws:RequestTag/ec2gpu:user": ALICE}),
    "give her role its policy, under the boundary": role(ALICE, "iam:PutRolePolicy", ALICE, **UNDER_THE_BOUNDARY),
    "make its instance profile, tagged with her id": profile(ALICE, "iam:CreateInstanceProfile", None,
                                                             **{"aws:RequestTag/ec2gpu:user": ALICE}),
    "tag the profile so while making it": profile(ALICE, "iam:TagInstanceProfile", None,
                                                  **{"aws:RequestTag/ec2gpu:user": ALICE}),
    "put her role in its profile": profile(ALICE, "iam:AddRoleToInstanceProfile", ALICE),
    "pass it to her run's instances": role(ALICE, "iam:PassRole", ALICE, **{"iam:PassedToService": "ec2.amazonaws.com"}),
    "take her role out of its profile (teardown)": profile(ALICE, "iam:RemoveRoleFromInstanceProfile", ALICE),
    "delete her profile": profile(ALICE, "iam:DeleteInstanceProfile", ALICE),
    "delete her role's policy": role(ALICE, "iam:DeleteRolePolicy", ALICE, **UNDER_THE_BOUNDARY),
    "delete her role": role(ALICE, "iam:DeleteRole", ALICE),
}


def theirs(them: str) -> dict[str, tuple]:
    """What ``them`` could try on alice's run with docs/iam-policy.json's permissions."""
    return {
        "read her status.json": obj(them, "s3:GetObject", alices("status.json")),
        "read her outputs": obj(them, "s3:GetObject", alices("outputs/model.pt")),
        "read her workdir": obj(them, "s3:GetObject", alices("workdir.tar.gz")),
        "rewrite her agent, which her replacements run as root": obj(them, "s3:PutObject", alices("agent/detached.py")),
        "rewrite her spec.json": obj(them, "s3:PutObject", alices("spec.json")),
        "cancel her run": obj(them, "s3:PutObject", alices("cancel")),
        "delete her outputs": obj(them, "s3:DeleteObject", alices("outputs/model.pt")),
        "abort her uploads": obj(them, "s3:AbortMultipartUpload", alices("workdir.tar.gz")),
        "list her runs": listing(them, runstore.user_prefix(ALICE)),
        "list her run": listing(them, runstore.prefix(ALICE, RUN)),
        "list every user's runs": listing(them, runstore.RUNS),
        "list the bucket from its root": listing(them, ""),
        "list the bucket without a prefix (or HeadBucket)": listing(them, None),
        "list a prefix of which hers is a longer one": listing(them, runstore.RUNS + ALICE.split(":")[0]),
        "read a run of the layout before the user id": obj(them, "s3:GetObject", f"runs/{RUN}/outputs/model.pt"),
        "set the bucket policy (grants itself her runs)": _as(them, "s3:PutBucketPolicy", f"arn:aws:s3:::{BUCKET}",
                                                              **{"s3:ResourceAccount": ACCOUNT}),
        "set the lifecycle (expires her runs)": _as(them, "s3:PutLifecycleConfiguration", f"arn:aws:s3:::{BUCKET}",
                                                    **{"s3:ResourceAccount": ACCOUNT}),
        "read her secret": secret(them, "ssm:GetParameters", ALICE),
        "read her secret one at a time": secret(them, "ssm:GetParameter", ALICE),
        "read her run's secrets by path": _as(them, "ssm:GetParametersByPath",
                                              f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/ec2gpu/runs/{RUN}"),
        "read her secret's history": secret(them, "ssm:GetParameterHistory", ALICE),
        "delete her secret": secret(them, "ssm:DeleteParameters", ALICE),
        "retag her secret as theirs, then read it": secret(them, "ssm:AddTagsToResource", ALICE,
                                                           **{"aws:RequestTag/ec2gpu:user": them}),
        "remove her secret's tag": secret(them, "ssm:RemoveTagsFromResource", ALICE),
        "overwrite her secret (no tags: SSM takes none with Overwrite)": secret(
            them, "ssm:PutParameter", ALICE, **{"ssm:Overwrite": "true"}),
        "overwrite her secret, tagged as theirs": secret(
            them, "ssm:PutParameter", ALICE, **{"ssm:Overwrite": "true", "aws:RequestTag/ec2gpu:user": them}),
        "store a secret tagged as hers": secret(them, "ssm:PutParameter", None, name="X",
                                                **{"aws:RequestTag/ec2gpu:user": ALICE}),
        "pass her run's role to an instance of theirs": role(them, "iam:PassRole", ALICE,
                                                             **{"iam:PassedToService": "ec2.amazonaws.com"}),
        "make a role tagged as hers": _as(
            them, "iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/ec2gpu/x",
            **{**UNDER_THE_BOUNDARY, "aws:RequestTag/ec2gpu:user": ALICE}),
        "retag a role as hers": role(them, "iam:TagRole", them, **{"aws:RequestTag/ec2gpu:user": ALICE}),
        "claim an older secret of hers (tagged before ec2gpu:user) as theirs": secret(
            them, "ssm:AddTagsToResource", None, older=True, **{"aws:RequestTag/ec2gpu:user": them}),
        "retag her role as theirs, to pass it": role(them, "iam:TagRole", ALICE, **{"aws:RequestTag/ec2gpu:user": them}),
        "claim an older role of hers (tagged before ec2gpu:user) as theirs": role(
            them, "iam:TagRole", None, older=True, **{"aws:RequestTag/ec2gpu:user": them}),
        "put a policy on her role (under the boundary)": role(them, "iam:PutRolePolicy", ALICE, **UNDER_THE_BOUNDARY),
        "delete her role's policy": role(them, "iam:DeleteRolePolicy", ALICE, **UNDER_THE_BOUNDARY),
        "detach a policy from her role": role(them, "iam:DetachRolePolicy", ALICE, **UNDER_THE_BOUNDARY),
        "delete her role": role(them, "iam:DeleteRole", ALICE),
        "take her role out of its profile (her replacements start without credentials)": profile(
            them, "iam:RemoveRoleFromInstanceProfile", ALICE),
        "put their role in her profile": profile(them, "iam:AddRoleToInstanceProfile", ALICE),
        "delete her profile": profile(them, "iam:DeleteInstanceProfile", ALICE),
        "retag her profile as theirs": profile(them, "iam:TagInstanceProfile", ALICE,
                                               **{"aws:RequestTag/ec2gpu:user": them}),
        "claim an older profile of hers as theirs": profile(them, "iam:TagInstanceProfile", None, older=True,
                                                            **{"aws:RequestTag/ec2gpu:user": them}),
        "make a profile tagged as hers": profile(them, "iam:CreateInstanceProfile", None,
                                                 **{"aws:RequestTag/ec2gpu:user": ALICE}),
    }


@pytest.mark.parametrize("what", list(OWN))
def test_a_user_may_do_what_ec2gpu_does_for_her_own_runs(what):
    assert allowed(POLICY, OWN[what])


@pytest.mark.parametrize("them", THEM, ids=["an IAM user", "another session of her role"])
@pytest.mark.parametrize("what", list(theirs(BOB)))
def test_another_user_of_the_account_reaches_nothing_of_hers(them, what):
    assert not allowed(POLICY, theirs(them)[what])


@pytest.mark.parametrize("them", THEM, ids=["an IAM user", "another session of her role"])
def test_the_same_requests_for_their_own_run_are_allowed(them):
    """The refusals above are about whose run it is, not what is asked: the other user's own run,
    secret and role get the same requests allowed (those ec2gpu makes; never a bucket policy)."""
    def own(key: str) -> str:
        return runstore.prefix(them, RUN) + key
    for request in (obj(them, "s3:GetObject", own("outputs/model.pt")), obj(them, "s3:PutObject", own("agent/x.py")),
                    obj(them, "s3:DeleteObject", own("outputs/model.pt")), listing(them, runstore.user_prefix(them)),
                    secret(them, "ssm:GetParameters", them), secret(them, "ssm:DeleteParameters", them),
                    secret(them, "ssm:PutParameter", None, **{"aws:RequestTag/ec2gpu:user": them}),
                    role(them, "iam:PassRole", them, **{"iam:PassedToService": "ec2.amazonaws.com"})):
        assert allowed(POLICY, request), request


def test_an_untagged_older_secret_cannot_be_claimed():
    """A secret ec2gpu stored before it tagged secrets with their user carries ec2gpu:run and
    ec2gpu:owner only. Reading it takes the caller's own ec2gpu:user tag, so tagging it would be
    reading it: another user may not add that tag (nor may its owner: an administrator deletes such
    parameters, docs/detached.md), while tagging a new secret as it is stored, which SSM authorises
    as ssm:AddTagsToResource on a parameter with no tags yet, still works."""
    claim = secret(BOB, "ssm:AddTagsToResource", None, older=True, **{"aws:RequestTag/ec2gpu:user": BOB})
    assert not allowed(POLICY, claim)
    assert not allowed(POLICY, secret(ALICE, "ssm:AddTagsToResource", None, older=True,
                                      **{"aws:RequestTag/ec2gpu:user": ALICE}))
    assert allowed(POLICY, secret(BOB, "ssm:GetParameters", BOB))  # what the claim would have given him
    assert not allowed(POLICY, secret(BOB, "ssm:GetParameters", None, older=True))
    assert allowed(POLICY, secret(BOB, "ssm:AddTagsToResource", None, name="NEW", **{"aws:RequestTag/ec2gpu:user": BOB}))


def test_retagging_her_role_as_his_then_passing_it_is_refused():
    """The role is passed only when tagged with the caller's id, so the tag must be the owner's to
    change: Bob may not retag Alice's role (nor an older role of hers with no ec2gpu:user tag), and
    it stays hers, which he may not pass."""
    assert not allowed(POLICY, role(BOB, "iam:TagRole", ALICE, **{"aws:RequestTag/ec2gpu:user": BOB}))
    assert not allowed(POLICY, role(BOB, "iam:TagRole", None, older=True, **{"aws:RequestTag/ec2gpu:user": BOB}))
    assert not allowed(POLICY, role(BOB, "iam:PassRole", ALICE, **{"iam:PassedToService": "ec2.amazonaws.com"}))
    assert allowed(POLICY, role(BOB, "iam:PassRole", BOB, **{"iam:PassedToService": "ec2.amazonaws.com"}))
    # the same for the instance profile that carries the role to her instances
    assert not allowed(POLICY, profile(BOB, "iam:TagInstanceProfile", ALICE, **{"aws:RequestTag/ec2gpu:user": BOB}))


def test_putting_or_deleting_a_policy_on_her_role_is_refused():
    """Another user may not change what her run's role may do (a policy of his under the
    boundary), nor end it: its policy, the role, its instance profile, or the role's place in it,
    which her group's replacement instances launch with. Each is allowed on his own role."""
    for them in THEM:
        for action in ("iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:DetachRolePolicy", "iam:DeleteRole"):
            assert not allowed(POLICY, role(them, action, ALICE, **UNDER_THE_BOUNDARY)), action
            assert allowed(POLICY, role(them, action, them, **UNDER_THE_BOUNDARY)), action
        for action in ("iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"):
            assert not allowed(POLICY, profile(them, action, ALICE)), action
            assert allowed(POLICY, profile(them, action, them)), action


def test_what_ec2gpu_makes_for_a_user_is_named_as_the_policy_names_it():
    """The key prefix the controller computes is the one ``runs/${aws:userid}/`` gives, the tags the
    role and the secrets get carry the same id, and both come from STS's UserId as it is."""
    identity = {"UserId": ALICE, "Account": ACCOUNT, "Arn": f"arn:aws:sts::{ACCOUNT}:assumed-role/dev/alice@example.com"}
    user = runstore.user_id(identity)
    assert user == ALICE and runstore.user_prefix(user) == "runs/${aws:userid}/".replace("${aws:userid}", ALICE)
    assert {"Key": "ec2gpu:user", "Value": ALICE} in iam.run_tags(RUN, "alice", iam.role_name(RUN), user=user)
    statements = {s["Sid"]: s for s in POLICY["Statement"]}
    assert statements["RunDataOnlyUnderYourOwnPrefixInYourAccountsBuckets"]["Resource"] == \
        "arn:aws:s3:::ec2gpu-*/runs/${aws:userid}/*"
    assert "s3:ListBucket" not in statements["RunBucketCheckedOnlyInYourAccount"]["Action"]


def test_no_statement_gives_a_user_the_run_store_or_the_secrets_wider_than_their_own():
    """Read from the document, not from requests: every statement on ec2gpu-* objects or
    /ec2gpu/runs/ parameters names ``${aws:userid}`` (in its resource or its conditions), and none
    gives a bucket-setting write that would reach every user's objects (PutBucketPolicy,
    PutLifecycleConfiguration, PutEncryptionConfiguration, PutBucketPublicAccessBlock, PutBucketAcl)."""
    for s in POLICY["Statement"]:
        resources = [s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"]
        text = json.dumps(s)
        if s["Effect"] == "Allow" and any(r.startswith(("arn:aws:s3:::ec2gpu-*/", "arn:aws:ssm:*:*:parameter/ec2gpu/"))
                                          for r in resources):
            assert "${aws:userid}" in text, s["Sid"]
        if s["Effect"] == "Allow" and "arn:aws:s3:::ec2gpu-*" in resources:
            assert not {"s3:PutBucketPolicy", "s3:PutLifecycleConfiguration", "s3:PutEncryptionConfiguration",
                        "s3:PutBucketPublicAccessBlock", "s3:PutBucketAcl", "s3:*"} & set(s["Action"]), s["Sid"]


def test_a_star_for_the_file_mounts_bucket_gives_every_user_every_run_which_no_statement_can_take_back():
    """The limit docs/security.md states: with ``*`` (or ``ec2gpu-*``) written where the policy says
    YOUR-FILE-MOUNTS-BUCKET, its file_mounts statements allow every object of the account's run
    store. IAM could take that back only with "ec2gpu-*/runs/* but runs/${aws:userid}/*" in one Deny,
    and a statement has a Resource or a NotResource, not both
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_grammar.html). What ec2gpu
    can read it checks: the boundary (tests/aws/test_run_role.py, refused before a detached run)."""
    text = json.dumps(POLICY)
    for bucket in ("*", "ec2gpu-*"):
        wide = json.loads(text.replace("YOUR-FILE-MOUNTS-BUCKET", bucket))
        assert allowed(wide, obj(BOB, "s3:GetObject", alices("outputs/model.pt")))
    assert not allowed(json.loads(text.replace("YOUR-FILE-MOUNTS-BUCKET", "team-data")),
                       obj(BOB, "s3:GetObject", alices("outputs/model.pt")))
