"""The run store of detached runs (aws/runstore.py), against moto's S3 in this process: the bucket's
name, its settings made, checked and set again, the key layout no run id can leave, status.json as
hostile input, the runs listed, and doctor's "run store" check."""
import io
import json
from types import SimpleNamespace

import boto3
import botocore.exceptions
import pytest
from moto import mock_aws

from ec2gpu import settings as settings_mod
from ec2gpu.aws import runstore, runstore_objects, runstore_records
from ec2gpu.errors import AwsError, UsageError
from ec2gpu.runs.plan import doctor
from ec2gpu.wire import run_record

ACCOUNT = "123456789012"  # moto's account: ExpectedBucketOwner matches it
BUCKET = f"ec2gpu-{ACCOUNT}-us-east-1"
RUN = "20260125-103000-1a2b"
USER = "AROAEXAMPLEROLEID0001:alice@example.com"  # the caller's user id (STS's UserId): a role session's


def _over_tls(self, action, resource):
    """moto's FakeBucket.get_permission for a request that came over TLS, as boto3's to S3 do: a
    statement that applies only when aws:SecureTransport is false does not apply. moto itself does
    not evaluate that condition (its bucket policies ignore Bool), so it would apply the TLS-deny
    statement to every object request (and so does the sandbox's moto: docs/security.md)."""
    from moto.iam.access_control import IAMPolicy, PermissionResult
    if self.policy is None:
        return PermissionResult.NEUTRAL
    policy = json.loads(self.policy)
    policy["Statement"] = [s for s in runstore._listed(policy["Statement"])
                           if (s.get("Condition") or {}).get("Bool") != {"aws:SecureTransport": "false"}]
    return IAMPolicy(json.dumps(policy)).is_action_permitted(action, resource)


@pytest.fixture
def s3(monkeypatch):
    from moto.s3.models import FakeBucket
    monkeypatch.setattr(FakeBucket, "get_permission", _over_tls)
    with mock_aws():
        yield boto3.client("s3", region_name="us-east-1")


def _lifecycle(s3, bucket=BUCKET):
    return s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]


def _policy(s3, bucket=BUCKET):
    return json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])


# --- names and keys ---------------------------------------------------------------------------

def test_the_bucket_is_named_after_the_account_and_region():
    assert runstore.bucket_name(ACCOUNT, "us-east-1") == "ec2gpu-123456789012-us-east-1"
    assert runstore.bucket_name(ACCOUNT, "ap-southeast-2") == "ec2gpu-123456789012-ap-southeast-2"
    assert runstore.bucket_name(ACCOUNT, "us-gov-west-1") == "ec2gpu-123456789012-us-gov-west-1"


@pytest.mark.parametrize("account, region", [
    ("12345678901", "us-east-1"), ("1234567890123", "us-east-1"), ("12345678901a", "us-east-1"),
    ("１２３４５６７８９０１２", "us-east-1"),  # digits of another script: \d would take them
    (ACCOUNT + "\n", "us-east-1"), ("", "us-east-1"), (123456789012, "us-east-1"),
    (ACCOUNT, "US-EAST-1"), (ACCOUNT, "useast1"), (ACCOUNT, "us-east-1\n"), (ACCOUNT, "us-east-1/x"),
    (ACCOUNT, "../us-east-1"), (ACCOUNT, "local"), (ACCOUNT, ""),
    (ACCOUNT, "ab-" + "c" * 40 + "-1"),  # the form of a region, but a name longer than S3's 63 characters
])
def test_a_bucket_name_from_anything_but_an_account_and_a_region_is_refused(account, region):
    with pytest.raises(UsageError):
        runstore.bucket_name(account, region)


def test_every_key_of_a_run_is_under_its_users_prefix():
    assert runstore.user_prefix(USER) == f"runs/{USER}/"
    assert runstore.prefix(USER, RUN) == f"runs/{USER}/{RUN}/"
    assert runstore.record_key(USER, RUN) == f"runs/{USER}/{RUN}/state.json"
    assert runstore.logs_prefix(USER, RUN) == f"runs/{USER}/{RUN}/logs/"
    assert runstore.outputs_prefix(USER, RUN) == f"runs/{USER}/{RUN}/outputs/"
    assert runstore.checkpoints_prefix(USER, RUN) == f"runs/{USER}/{RUN}/checkpoints/"
    assert runstore.workdir_key(USER, RUN) == f"runs/{USER}/{RUN}/workdir.tar.gz"
    assert runstore.cancel_key(USER, RUN) == f"runs/{USER}/{RUN}/cancel"
    assert runstore.spec_key(USER, RUN) == f"runs/{USER}/{RUN}/spec.json"
    assert runstore.agent_prefix(USER, RUN) == f"runs/{USER}/{RUN}/agent/"
    assert set(runstore.handover_keys(USER, RUN).values()) == {
        f"runs/{USER}/{RUN}/handover/{n}" for n in ("outputs.tar.gz", "job.log", "pool.tar.gz", "agent-record.json")}
    assert runstore.expire_rule(30)["Filter"] == {"Prefix": runstore.RUNS}  # every user's runs expire


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "..", f"{RUN}/../x", f"../{RUN}", f"{RUN}/", f"{RUN}\n",
                                 "20260125-103000-1A2B", "20260125-103000-1a2", "2026012-103000-1a2b",
                                 "20260125-103000-1a2b-x", "run-asg", None, 20260125])
@pytest.mark.parametrize("helper", [runstore.prefix, runstore.record_key, runstore.logs_prefix, runstore.outputs_prefix,
                                    runstore.checkpoints_prefix, runstore.workdir_key])
def test_a_key_helper_refuses_what_is_not_a_run_id(helper, bad):
    with pytest.raises(UsageError, match="is not a run id"):
        helper(USER, bad)


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "..", ".", "/", "*", "a*", "a?", "${aws:userid}", "a b", "a\n",
                                 "x" * 129, None, 7, "ＡＩＤＡ", "AROAX:a/b", "-x"])
@pytest.mark.parametrize("helper", [runstore.prefix, runstore.record_key, runstore.logs_prefix, runstore.outputs_prefix,
                                    runstore.checkpoints_prefix, runstore.workdir_key])
def test_a_key_helper_refuses_what_is_not_a_user_id(helper, bad):
    """A user id never leaves its prefix nor matches more than itself in an IAM pattern: no "/",
    "*", "?", "$", "..", space or character of another script."""
    with pytest.raises(UsageError, match="is not an AWS user id"):
        helper(bad, RUN)


@pytest.mark.parametrize("user", ["AIDAEXAMPLEUSERID0001", "AROAEXAMPLEROLEID0001:alice@example.com",
                                  "AROAEXAMPLEROLEID0001:i-0123456789abcdef0", "123456789012:bob", "123456789012",
                                  "AROAX:a+b=c.d_e-f@g"])
def test_every_form_of_aws_userid_is_a_user_id(user):
    """An IAM user's, a role session's (the role id, ':' and the session name: [\\w+=,.@-]), a
    federated user's (account:name), the root user's (the account id)."""
    assert runstore.user_id({"UserId": user}) == user
    assert runstore.prefix(user, RUN) == f"runs/{user}/{RUN}/"


def test_a_role_session_name_with_a_comma_is_refused_saying_so():
    """',' is a session name's character that no tag value holds (the role and the secrets carry the id)."""
    with pytest.raises(UsageError, match="holds a ','") as err:
        runstore.user_id({"UserId": "AROAEXAMPLEROLEID0001:a,b"})
    assert "session name" in err.value.hint
    with pytest.raises(UsageError, match="is not an AWS user id"):
        runstore.user_id({"Account": ACCOUNT})  # no UserId


def test_the_run_id_format_is_the_one_runs_are_given():
    from ec2gpu.runs.provision.pipeline import new_run_id
    assert runstore.check_run_id(new_run_id()) and runstore.prefix(USER, new_run_id()).startswith(f"runs/{USER}/20")


# --- the bucket's settings --------------------------------------------------------------------

def test_the_tls_deny_statement_denies_every_s3_action_on_the_bucket_and_its_objects_without_tls():
    assert runstore.tls_deny_statement("b-1") == {
        "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": ["arn:aws:s3:::b-1", "arn:aws:s3:::b-1/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
    assert runstore.tls_deny_statement("b-1", "cn-north-1")["Resource"][0] == "arn:aws-cn:s3:::b-1"
    assert runstore.tls_deny_statement("b-1", "us-gov-west-1")["Resource"][1] == "arn:aws-us-gov:s3:::b-1/*"
    mine = {"Sid": "Mine", "Effect": "Deny", "Principal": "*", "Action": "s3:DeleteBucket", "Resource": "arn:aws:s3:::b-1"}
    old = {**runstore.tls_deny_statement("b-1"), "Condition": {}}
    policy = runstore.bucket_policy("b-1", current={"Statement": [mine, old]})
    assert policy["Version"] == "2012-10-17" and policy["Statement"] == [mine, runstore.tls_deny_statement("b-1")]
    assert runstore.bucket_policy("b-1", current={"Statement": mine})["Statement"][0] == mine  # one statement, no list


def test_the_tls_deny_statement_denies_plain_http_requests_and_not_those_over_tls():
    from moto.iam.access_control import IAMPolicy, PermissionResult
    from moto.s3.models import FakeBucket
    policy = json.dumps(runstore.bucket_policy("b-1")).encode()
    bucket = SimpleNamespace(policy=policy)
    plain_http = FakeBucket.get_permission  # moto's own: it treats every request as one the condition matches
    assert plain_http(bucket, "s3:GetObject", "arn:aws:s3:::b-1/runs/x") == PermissionResult.DENIED
    assert plain_http(bucket, "s3:PutObject", "arn:aws:s3:::b-1/x") == PermissionResult.DENIED
    assert plain_http(bucket, "s3:GetObject", "arn:aws:s3:::other/x") == PermissionResult.NEUTRAL
    assert _over_tls(bucket, "s3:GetObject", "arn:aws:s3:::b-1/runs/x") == PermissionResult.NEUTRAL
    assert IAMPolicy(policy.decode()).is_action_permitted("s3:DeleteBucket", "arn:aws:s3:::b-1") == PermissionResult.DENIED


@pytest.mark.parametrize("change", [
    {"Effect": "Allow"}, {"Principal": {"AWS": "arn:aws:iam::123456789012:root"}}, {"Action": "s3:GetObject"},
    {"Resource": ["arn:aws:s3:::b-1"]}, {"Resource": ["arn:aws:s3:::other", "arn:aws:s3:::other/*"]},
    {"Condition": {"Bool": {"aws:SecureTransport": "true"}}}, {"Condition": {}},
])
def test_a_statement_that_leaves_some_plain_http_request_allowed_is_not_the_tls_deny(change):
    good = runstore.tls_deny_statement("b-1")
    assert runstore._denies_plain_http(good, "b-1")
    assert runstore._denies_plain_http({**good, "Principal": {"AWS": ["*"]}, "Action": ["s3:*"]}, "b-1")
    assert not runstore._denies_plain_http({**good, **change}, "b-1")


def test_the_lifecycle_rule_expires_runs_and_aborts_incomplete_uploads_and_keeps_the_users_rules():
    assert runstore.expire_rule(30) == {
        "ID": "ec2gpu-runs-expire", "Filter": {"Prefix": "runs/"}, "Status": "Enabled", "Expiration": {"Days": 30},
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}
    mine = {"ID": "mine", "Filter": {"Prefix": "tmp/"}, "Status": "Enabled", "Expiration": {"Days": 1}}
    assert runstore.lifecycle(7, [mine, runstore.expire_rule(30)])["Rules"] == [mine, runstore.expire_rule(7)]
    for bad in (0, -1, True, 1.5, "30"):
        with pytest.raises(UsageError, match="at least 1"):
            runstore.expire_rule(bad)


def test_ensure_makes_the_bucket_with_every_setting(s3):
    said = []
    assert runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30, log=said.append) == BUCKET
    assert s3.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True}
    rules = s3.get_bucket_encryption(Bucket=BUCKET)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert _policy(s3)["Statement"] == [runstore.tls_deny_statement(BUCKET)]
    assert _lifecycle(s3) == [runstore.expire_rule(30)]
    assert {"Key": "ec2gpu:owner", "Value": "alice"} in s3.get_bucket_tagging(Bucket=BUCKET)["TagSet"]
    assert said[0] == f"run store: created s3://{BUCKET} in us-east-1" and len(said) == 6
    assert runstore.check(s3, BUCKET, 30) == []


def test_ensure_outside_us_east_1_makes_the_bucket_in_that_region(s3):
    eu = boto3.client("s3", region_name="eu-west-1")
    bucket = runstore.ensure(eu, ACCOUNT, "eu-west-1", "alice", 30)
    assert bucket == f"ec2gpu-{ACCOUNT}-eu-west-1"
    assert eu.get_bucket_location(Bucket=bucket)["LocationConstraint"] == "eu-west-1"
    assert runstore.check(eu, bucket) == []


def test_ensure_again_changes_nothing_keeps_the_users_own_settings_and_sets_a_changed_expiry(s3):
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=runstore.record_key(USER, RUN), Body=b"{}")
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30)
    mine = {"Sid": "Mine", "Effect": "Deny", "Principal": "*", "Action": "s3:DeleteBucket",
            "Resource": f"arn:aws:s3:::{BUCKET}"}
    s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        mine, runstore.tls_deny_statement(BUCKET)]}))
    tmp_rule = {"ID": "mine", "Filter": {"Prefix": "tmp/"}, "Status": "Enabled", "Expiration": {"Days": 2}}
    s3.put_bucket_lifecycle_configuration(Bucket=BUCKET, LifecycleConfiguration={"Rules": [
        tmp_rule, runstore.expire_rule(30)]})
    said = []
    assert runstore.ensure(s3, ACCOUNT, "us-east-1", "bob", 30, log=said.append) == BUCKET
    assert said == []  # nothing differed: nothing was set again, not even the owner
    assert {"Key": "ec2gpu:owner", "Value": "alice"} in s3.get_bucket_tagging(Bucket=BUCKET)["TagSet"]

    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 7, log=said.append)
    assert said == [f"run store: s3://{BUCKET}: lifecycle: runs/ expire after 7 days, incomplete uploads aborted after 1"]
    assert _lifecycle(s3) == [tmp_rule, runstore.expire_rule(7)]
    assert runstore.check(s3, BUCKET, 7) == [] and runstore.check(s3, BUCKET, 30) == [
        "runs/ expire after 7 days, not the 30 that run_store_expire_days asks for"]
    assert _policy(s3)["Statement"][0] == mine  # the user's statement stays
    assert s3.get_object(Bucket=BUCKET, Key=runstore.record_key(USER, RUN))["Body"].read() == b"{}"  # data stays


def test_ensure_sets_again_what_was_removed_or_changed(s3):
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30)
    s3.delete_bucket_policy(Bucket=BUCKET)
    s3.put_public_access_block(Bucket=BUCKET, PublicAccessBlockConfiguration={
        **runstore.PUBLIC_ACCESS_BLOCK, "RestrictPublicBuckets": False})
    s3.put_bucket_encryption(Bucket=BUCKET, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]})
    s3.delete_bucket_lifecycle(Bucket=BUCKET)
    assert len(runstore.check(s3, BUCKET)) == 4
    said = []
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30, log=said.append)
    assert len(said) == 4 and runstore.check(s3, BUCKET, 30) == []


class _Refusing:
    """An S3 client that answers GetBucketLocation with ``head`` and CreateBucket with ``create`` (error codes)."""

    def __init__(self, head, create=None):
        self.head, self.create, self.created = head, create, []

    def get_bucket_location(self, **kw):
        raise botocore.exceptions.ClientError({"Error": {"Code": self.head, "Message": ""}}, "GetBucketLocation")

    def create_bucket(self, **kw):
        self.created.append(kw)
        raise botocore.exceptions.ClientError({"Error": {"Code": self.create, "Message": ""}}, "CreateBucket")


class _UserPolicy:
    """moto's S3 client as docs/iam-policy.json lets a user call it on the run store: no bucket
    policy, lifecycle, encryption or Block Public Access writes (403), the rest as it is."""

    REFUSED = ("put_bucket_policy", "put_bucket_lifecycle_configuration", "put_bucket_encryption",
               "put_public_access_block")

    def __init__(self, s3):
        self.s3, self.refused = s3, []

    def __getattr__(self, name):
        if name not in self.REFUSED:
            return getattr(self.s3, name)

        def refuse(**kw):
            self.refused.append(name)
            raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": ""}}, name)
        return refuse


def test_a_user_who_may_not_change_the_buckets_settings_still_gets_the_store_and_is_told_what_is_missing(s3):
    """Whoever may set the run store's bucket policy may grant themselves every user's runs, and
    whoever may set its lifecycle may expire them: docs/iam-policy.json gives a user neither. The
    bucket is made, what may be set is, and one line says what was not and who sets it."""
    said = []
    user = _UserPolicy(s3)
    assert runstore.ensure(user, ACCOUNT, "us-east-1", "alice", 30, log=said.append) == BUCKET
    assert "put_bucket_policy" in user.refused and "put_bucket_lifecycle_configuration" in user.refused
    assert said[0] == f"run store: created s3://{BUCKET} in us-east-1" and len(said) == 3
    assert said[1] == f"run store: s3://{BUCKET}: tagged ec2gpu:owner"
    assert said[2].startswith(f"run store: s3://{BUCKET}: not set, these credentials may not: ")
    assert "bucket policy: requests without TLS denied" in said[2] and "lifecycle: runs/ expire" in said[2]
    assert "an administrator" in said[2] and "ec2gpu doctor" in said[2]
    problems = runstore.check(s3, BUCKET, 30)
    assert any("TLS" in p for p in problems) and any("lifecycle" in p for p in problems)
    runstore_records.put_status(user, BUCKET, USER, RUN, {"state": "pending"})  # the run's own objects: as before
    assert runstore_records.get_status(user, BUCKET, USER, RUN)["state"] == "pending"
    said.clear()
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30, log=said.append)  # an administrator's credentials
    assert runstore.check(s3, BUCKET, 30) == [] and not any("not set" in line for line in said)


class _NotSeenYet:
    """moto's S3 client as S3 answers a moment after CreateBucket: the first ``times`` calls that
    configure the bucket (Get/Put of its settings) answer NoSuchBucket, as bucket configurations
    are eventually consistent (aws/consistency.py)."""

    def __init__(self, s3, times: int):
        self.s3, self.left, self.refused = s3, times, []

    def __getattr__(self, name):
        method = getattr(self.s3, name)
        if not name.startswith(("put_bucket", "get_bucket", "put_public", "get_public")) or \
                name == "get_bucket_location":
            return method

        def call(**kw):
            if self.left > 0:
                self.left -= 1
                self.refused.append(name)
                raise botocore.exceptions.ClientError({"Error": {"Code": "NoSuchBucket", "Message": ""}}, name)
            return method(**kw)
        return call


def test_a_new_stores_settings_are_made_while_s3_does_not_see_the_new_bucket_yet(s3):
    slow = _NotSeenYet(s3, 2)
    assert runstore.ensure(slow, ACCOUNT, "us-east-1", "alice", 30) == BUCKET
    assert len(slow.refused) == 2 and runstore.check(s3, BUCKET, 30) == []


def test_a_name_another_account_took_is_refused_with_what_to_do():
    with pytest.raises(UsageError, match="taken by another AWS account") as err:
        runstore.ensure(_Refusing("404", "BucketAlreadyExists"), ACCOUNT, "us-east-1", "alice", 30)
    assert "detached runs cannot use it" in err.value.hint
    with pytest.raises(UsageError, match="not this account's") as err:  # ExpectedBucketOwner's 403
        runstore.ensure(_Refusing("403"), ACCOUNT, "us-east-1", "alice", 30)
    assert "s3:GetBucketLocation" in err.value.hint
    with pytest.raises(AwsError, match="could not create"):
        runstore.ensure(_Refusing("404", "InternalError"), ACCOUNT, "us-east-1", "alice", 30)
    with pytest.raises(AwsError, match="GetBucketLocation failed"):
        runstore.ensure(_Refusing("InternalError"), ACCOUNT, "us-east-1", "alice", 30)


def test_every_request_on_the_bucket_names_its_expected_owner(s3):
    sent = []
    s3.meta.events.register("before-parameter-build.s3", lambda params, model, **_: sent.append(
        (model.name, params.get("ExpectedBucketOwner"))))
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30)
    runstore_records.put_status(s3, BUCKET, USER, RUN, {"state": "running"})
    runstore_records.get_status(s3, BUCKET, USER, RUN)
    runstore_records.list_runs(s3, BUCKET, USER)
    runstore.check(s3, BUCKET)
    assert {name for name, owner in sent if owner != ACCOUNT} == {"CreateBucket"}  # CreateBucket takes none
    assert {"GetBucketLocation", "PutBucketPolicy", "PutObject", "GetObject", "ListObjectsV2"} <= {n for n, _ in sent}
    assert "HeadBucket" not in {n for n, _ in sent}  # s3:ListBucket: granted to a user under their own prefix only


def test_check_names_each_setting_a_bucket_made_by_hand_lacks(s3):
    s3.create_bucket(Bucket=BUCKET)
    assert runstore.check(s3, BUCKET) == [
        "Block Public Access is not set on the bucket",
        "no default encryption",
        "no bucket policy: requests without TLS are not denied",
        "no lifecycle configuration: run data under runs/ never expires and incomplete multipart uploads are kept "
        "(and billed)"]
    assert runstore.check(s3, "ec2gpu-123456789012-eu-north-1") == [
        "s3://ec2gpu-123456789012-eu-north-1 does not exist"]


def test_check_names_each_setting_that_is_there_but_wrong(s3):
    s3.create_bucket(Bucket=BUCKET)
    s3.put_public_access_block(Bucket=BUCKET, PublicAccessBlockConfiguration={
        **runstore.PUBLIC_ACCESS_BLOCK, "BlockPublicPolicy": False, "IgnorePublicAcls": False})
    s3.put_bucket_encryption(Bucket=BUCKET, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]})
    s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {**runstore.tls_deny_statement(BUCKET), "Condition": {"Bool": {"aws:SecureTransport": "true"}}}]}))
    s3.put_bucket_lifecycle_configuration(Bucket=BUCKET, LifecycleConfiguration={"Rules": [
        {"ID": "other", "Filter": {"Prefix": "other/"}, "Status": "Enabled", "Expiration": {"Days": 3},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]})
    assert runstore.check(s3, BUCKET) == [
        "Block Public Access: IgnorePublicAcls is off", "Block Public Access: BlockPublicPolicy is off",
        "default encryption is aws:kms, not SSE-S3 (AES256): a run's instance role has no KMS permission",
        "the bucket policy does not deny requests without TLS (aws:SecureTransport false)",
        "no lifecycle rule expires what is under runs/: run data is kept (and billed) forever",
        "no lifecycle rule aborts incomplete multipart uploads: their parts are kept (and billed) unseen"]


@pytest.mark.parametrize("rule, problem", [
    ({"Expiration": {"Days": 30}}, "aborts incomplete multipart uploads"),
    ({"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}, "expires what is under runs/"),
    ({"Expiration": {"Days": 30}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}, "Status": "Disabled"},
     "expires what is under runs/"),
])
def test_a_lifecycle_rule_lacking_expiry_or_abort_or_disabled_is_named(s3, rule, problem):
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_lifecycle_configuration(Bucket=BUCKET, LifecycleConfiguration={"Rules": [
        {"ID": "r", "Filter": {"Prefix": "runs/"}, "Status": "Enabled", **rule}]})
    assert any(problem in p for p in runstore.check(s3, BUCKET))


def test_a_lifecycle_rule_for_the_whole_bucket_covers_runs(s3):
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30)
    s3.put_bucket_lifecycle_configuration(Bucket=BUCKET, LifecycleConfiguration={"Rules": [
        {"ID": "all", "Filter": {"Prefix": ""}, "Status": "Enabled", "Expiration": {"Days": 30},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 3}}]})
    assert runstore.check(s3, BUCKET, 30) == []


def test_check_raises_for_an_error_that_is_not_a_missing_setting():
    class Denying:
        def get_bucket_location(self, **kw):
            return {}

        def get_public_access_block(self, **kw):
            raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": ""}}, "Get")
    with pytest.raises(AwsError, match=r"GetPublicAccessBlock failed \(AccessDenied\)"):
        runstore.check(Denying(), BUCKET)


# --- status.json ------------------------------------------------------------------------------

def test_a_status_record_goes_up_and_comes_back_validated(s3):
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30)
    assert runstore_records.get_status(s3, BUCKET, USER, RUN) is None  # no object
    assert runstore_records.get_status(s3, "ec2gpu-123456789012-eu-north-1", USER, RUN) is None  # no bucket
    record = {"state": "running", "attempt": 2, "interruptions": 1, "restarts": 0, "instance_id": "i-0123456789abcdef0",
              "instance_type": "g5.xlarge", "market": "spot", "started_at": "2026-01-25T10:30:00Z",
              "updated_at": "2026-01-25T11:00:00.5+00:00", "message": "resumed from step 300"}
    runstore_records.put_status(s3, BUCKET, USER, RUN, record)
    stored = s3.get_object(Bucket=BUCKET, Key=f"runs/{USER}/{RUN}/state.json")
    assert stored["ContentType"] == "application/json" and json.loads(stored["Body"].read())["run_id"] == RUN
    got = runstore_records.get_status(s3, BUCKET, USER, RUN)
    assert got == {**record, "run_id": RUN, "exit_code": None, "signal": None, "ended_at": None, "problem": None,
                   "launches": None}


class _NoListBucketForTheKey:
    """moto's S3 client as S3 answers a caller whose s3:ListBucket does not cover the key asked for
    (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html, "Permissions"): a GetObject
    or HeadObject of a missing key is 403 AccessDenied, not 404. ``refused``: keys whose reads are
    refused though they are there; ``no_listing``: ListObjectsV2 refused too."""

    def __init__(self, s3, refused=(), no_listing=False):
        self.s3, self.refused, self.no_listing = s3, set(refused), no_listing

    def __getattr__(self, name):
        return getattr(self.s3, name)

    def _deny(self, op):
        raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied" if op == "GetObject" else "403",
                                                         "Message": "Access Denied"}}, op)

    def _read(self, op, call, **kw):
        if kw["Key"] in self.refused:
            self._deny(op)
        try:
            return call(**kw)
        except botocore.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
                self._deny(op)
            raise

    def get_object(self, **kw):
        return self._read("GetObject", self.s3.get_object, **kw)

    def head_object(self, **kw):
        return self._read("HeadObject", self.s3.head_object, **kw)

    def list_objects_v2(self, **kw):
        if self.no_listing:
            self._deny("ListObjectsV2")
        return self.s3.list_objects_v2(**kw)


def test_a_missing_object_is_absent_though_s3_answers_403_for_want_of_list_bucket(s3):
    """On AWS the user policy's s3:ListBucket is prefix-scoped, and S3 may answer a missing key 403:
    status.json before the agent wrote it, settled.json, a hand-over object not there yet, a log
    gone. Each read says "not there" as it does for a 404, by listing the key (runstore_objects.missing);
    an object that is there but refused, or a 403 whose listing is refused too, stays an error."""
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30)
    user = _NoListBucketForTheKey(s3)
    key = runstore.record_key(USER, RUN)
    assert runstore_records.get_status(user, BUCKET, USER, RUN) is None
    assert runstore_records.get_settled(user, BUCKET, USER, RUN) == []
    assert runstore_objects.read_head(user, BUCKET, runstore.handover_keys(USER, RUN)["record"], 10) is None
    assert runstore_objects.head_object(user, BUCKET, key) is None
    assert runstore_objects.read_range(user, BUCKET, key, 0, 9) is None
    with pytest.raises(FileNotFoundError):
        runstore_objects.download(user, BUCKET, key, io.BytesIO(), 100)
    # a longer key beside it is not it
    s3.put_object(Bucket=BUCKET, Key=key + ".bak", Body=b"{}")
    assert runstore_objects.head_object(user, BUCKET, key) is None
    runstore_records.put_status(s3, BUCKET, USER, RUN, {"state": "running"})
    assert runstore_records.get_status(user, BUCKET, USER, RUN)["state"] == "running"
    with pytest.raises(AwsError, match="GetObject failed \\(AccessDenied\\)"):
        runstore_records.get_status(_NoListBucketForTheKey(s3, refused={key}), BUCKET, USER, RUN)
    with pytest.raises(AwsError, match="HeadObject failed \\(403\\)"):
        runstore_objects.head_object(_NoListBucketForTheKey(s3, refused={key}), BUCKET, key)
    with pytest.raises(AwsError, match="GetObject failed \\(AccessDenied\\)"):
        runstore_records.get_settled(_NoListBucketForTheKey(s3, no_listing=True), BUCKET, USER, RUN)


def _read(s3, body: bytes):
    s3.put_object(Bucket=BUCKET, Key=runstore.record_key(USER, RUN), Body=body)
    return runstore_records.get_status(s3, BUCKET, USER, RUN)


@pytest.mark.parametrize("body, problem", [
    (b" " * (1024 * 1024) + b'{"state": "running"}', "more than 1,048,576"),
    (b"[1, 2]", "not a JSON object"), (b'"running"', "not a JSON object"), (b"null", "not a JSON object"),
    (b"{nope", "not JSON"), (b"\xff\xfe", "not JSON"), (b"[" * 1_100_000, "more than"),
    (b"[" * 60_000, "nested deeper than 64 levels"),  # deep enough for RecursionError, small enough to be read
    (b'{"state": "owned"}', "no known state"), (b'{"run_id": "20260125-103000-ffff", "state": "succeeded"}',
                                                 "names another run"),
])
def test_a_status_object_that_is_not_a_record_is_refused_and_nothing_of_it_taken(s3, body, problem):
    s3.create_bucket(Bucket=BUCKET)
    got = _read(s3, body)
    assert got["state"] == "unreadable" and problem in got["problem"] and got["run_id"] == RUN
    assert set(got) == set(run_record.VIEW_FIELDS) and all(got[k] is None for k in got if k not in ("state", "problem",
                                                                                                "run_id"))


def test_validate_status_refuses_oversize_bytes_itself():
    got = run_record.view(b'{"state": "running"}' + b" " * (1024 * 1024), RUN)
    assert got["state"] == "unreadable" and "more than 1,048,576 bytes" in got["problem"]
    assert run_record.view(b'{"state": "running"}' + b" " * 1000, RUN)["state"] == "running"


def test_an_oversize_status_object_is_refused_without_being_read():
    body = SimpleNamespace(read=lambda n=None: pytest.fail("an oversize object was read"), close=lambda: None)
    client = SimpleNamespace(get_object=lambda **kw: {"Body": body, "ContentLength": 10 << 30})
    got = runstore_records.get_status(client, BUCKET, USER, RUN)
    assert got["state"] == "unreadable" and "10,737,418,240 bytes" in got["problem"]


OLD_AGENTS = {"version": 1, "run_id": RUN, "state": "running", "restarts_on_errors": 2, "launches": 3, "reason": "why",
              "created_at": "2026-11-25T10:00:00+00:00", "heartbeat_at": "2026-11-25T10:05:00+00:00"}


def test_a_previous_releases_record_is_read_in_this_releases_vocabulary():
    """An agent of the previous release (a run launched before the upgrade) writes status.json with
    its names: for one release it is read, once, through run_record.upgrade, into the one vocabulary."""
    got = run_record.view(json.dumps(OLD_AGENTS).encode(), RUN)
    assert (got["state"], got["restarts"], got["launches"], got["message"]) == ("running", 2, 3, "why")
    assert (got["started_at"], got["updated_at"]) == ("2026-11-25T10:00:00+00:00", "2026-11-25T10:05:00+00:00")
    assert "interrupted" not in run_record.FINAL_STATES  # a replacement resumes an interrupted run
    # a record of this release is read by its own names only: an old name there is no field of it
    assert run_record.view(json.dumps({**OLD_AGENTS, "version": run_record.VERSION}).encode(), RUN)["message"] is None


def test_a_run_started_by_the_previous_release_is_followed_and_ended_under_its_old_name(s3):
    """Its agent writes runs/USER/RUN/status.json: `status` reads it there while there is no state.json,
    and an end the controller records goes where the agent reads it, in this release's vocabulary."""
    s3.create_bucket(Bucket=BUCKET)
    old = runstore.legacy_record_key(USER, RUN)
    assert old == f"runs/{USER}/{RUN}/status.json"
    s3.put_object(Bucket=BUCKET, Key=old, Body=json.dumps(OLD_AGENTS).encode())
    assert runstore_records.get_status(s3, BUCKET, USER, RUN)["message"] == "why"
    assert runstore_records.get_status_bytes(s3, BUCKET, USER, RUN) == json.dumps(OLD_AGENTS).encode()
    assert runstore_records.end_status(s3, BUCKET, USER, RUN, "cancelled", "cancelled by you", "2026-11-25T11:00:00Z")
    raw = json.loads(s3.get_object(Bucket=BUCKET, Key=old)["Body"].read())
    assert (raw["version"], raw["state"], raw["message"], raw["restarts"]) == (run_record.VERSION, "cancelled",
                                                                               "cancelled by you", 2)
    assert "reason" not in raw and "restarts_on_errors" not in raw
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=runstore.record_key(USER, RUN)).get("KeyCount") == 0
    # a record under this release's name wins
    runstore_records.put_status(s3, BUCKET, USER, RUN, {"state": "running"})
    assert runstore_records.get_status(s3, BUCKET, USER, RUN)["state"] == "running"


def test_each_field_of_a_status_record_is_checked_and_unknown_ones_dropped(s3):
    s3.create_bucket(Bucket=BUCKET)
    got = _read(s3, json.dumps({
        "state": "failed", "attempt": -1, "restarts": True, "interruptions": 10 ** 9, "instance_id": "i-x; rm -rf /",
        "instance_type": "g5.xlarge\n", "market": "reserved", "exit_code": 1.5, "signal": 99999,
        "started_at": "yesterday", "ended_at": "2026-01-25T10:30:00Z\x1b[2J", "message": "m" * 10_000,
        "secret": "s3cr3t", "__proto__": {}}).encode())
    assert got == {"run_id": RUN, "state": "failed", "attempt": None, "restarts": None, "interruptions": None,
                   "launches": None, "instance_id": None, "instance_type": None, "market": None, "exit_code": None,
                   "signal": None,
                   "started_at": None, "updated_at": None, "ended_at": None, "message": "m" * 2000, "problem": None}


def test_put_status_refuses_what_get_status_would_not_take(s3):
    s3.create_bucket(Bucket=BUCKET)
    for bad, why in (({"state": "owned"}, "no known state"), ({"state": "running", "message": "x" * 1_100_000}, "more than"),
                     ({"state": "running", "x": object()}, "not JSON"), ({"state": "running", "x": float("nan")}, "not JSON"),
                     (["running"], "a dict")):
        with pytest.raises(ValueError, match=why):
            runstore_records.put_status(s3, BUCKET, USER, RUN, bad)
    with pytest.raises(UsageError, match="is not a run id"):
        runstore_records.put_status(s3, BUCKET, USER, "../x", {"state": "running"})
    with pytest.raises(UsageError, match="is not a run id"):
        runstore_records.get_status(s3, BUCKET, USER, "a/b")
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


# --- list_runs --------------------------------------------------------------------------------

def test_list_runs_names_each_of_the_users_runs_once_and_skips_what_is_not_one_of_them(s3):
    s3.create_bucket(Bucket=BUCKET)
    assert runstore_records.list_runs(s3, BUCKET, USER) == []
    mine = f"runs/{USER}/"
    for key in (f"{mine}{RUN}/status.json", f"{mine}{RUN}/logs/job.log", f"{mine}20260124-090000-0000/workdir.tar.gz",
                f"{mine}junk/status.json", f"{mine}../x", f"{mine}20260125-103000-1A2B/status.json", f"{mine}loose.txt",
                f"other/{RUN}-2/status.json", f"{mine}{RUN}x/status.json", f"{mine}/status.json",
                # another user's runs, and one of the layout before the user id: not the caller's
                "runs/AIDAEXAMPLEUSERID0002/20260126-000000-0000/status.json", "runs/20260127-000000-0000/status.json",
                f"runs/{USER}x/20260128-000000-0000/status.json"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"{}")
    assert runstore_records.list_runs(s3, BUCKET, USER) == ["20260124-090000-0000", RUN]
    assert runstore_records.list_runs(s3, BUCKET, "AIDAEXAMPLEUSERID0002") == ["20260126-000000-0000"]
    assert runstore_records.list_runs(s3, "ec2gpu-123456789012-eu-north-1", USER) == []  # no bucket: no runs


def test_list_runs_reads_every_page():
    asked = []

    class Paginator:
        def paginate(self, **kw):
            asked.append(kw)
            return iter([{"CommonPrefixes": [{"Prefix": f"runs/{USER}/20260101-000000-0001/"}]}, {},
                         {"CommonPrefixes": [{"Prefix": f"runs/{USER}/20260101-000000-0002/"},
                                             {"Prefix": f"runs/{USER}/x/"}]}])
    client = SimpleNamespace(get_paginator=lambda name: Paginator() if name == "list_objects_v2" else None)
    assert runstore_records.list_runs(client, BUCKET, USER) == ["20260101-000000-0001", "20260101-000000-0002"]
    assert asked == [{"Bucket": BUCKET, "Prefix": f"runs/{USER}/", "Delimiter": "/", "ExpectedBucketOwner": ACCOUNT}]


# --- the setting and doctor's check -----------------------------------------------------------

def test_the_expiry_setting_is_30_days_by_default_and_at_least_1(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.delenv("EC2GPU_RUN_STORE_EXPIRE_DAYS", raising=False)
    assert settings_mod.load().run_store_expire_days == 30
    monkeypatch.setenv("EC2GPU_RUN_STORE_EXPIRE_DAYS", "7")
    assert settings_mod.load().run_store_expire_days == 7
    with pytest.raises(UsageError, match="run_store_expire_days"):
        settings_mod.load({"run_store_expire_days": 0})


def _aws(s3):
    return SimpleNamespace(region="us-east-1", check_credentials=lambda: {"Account": ACCOUNT, "UserId": USER},
                           client=lambda name: s3 if name == "s3" else pytest.fail(name))


def test_doctor_says_the_run_store_is_not_made_yet_and_does_not_make_it(s3):
    check = doctor._run("run store", lambda: doctor.run_store(_aws(s3), SimpleNamespace(run_store_expire_days=30)))
    assert (check.ok, check.detail) == (True, f"s3://{BUCKET} not created yet (made on the first detached run)")
    assert s3.list_buckets()["Buckets"] == []


def test_doctor_passes_a_run_store_ensure_made(s3):
    runstore.ensure(s3, ACCOUNT, "us-east-1", "alice", 30)
    check = doctor._run("run store", lambda: doctor.run_store(_aws(s3), SimpleNamespace(run_store_expire_days=30)))
    assert check.ok is True and check.detail == (f"s3://{BUCKET}: public access blocked, SSE-S3, TLS only, runs/ "
                                                 "expire after 30 days")


def test_doctor_fails_a_run_store_that_lacks_a_setting_and_says_how_it_is_fixed(s3):
    s3.create_bucket(Bucket=BUCKET)
    s3.put_public_access_block(Bucket=BUCKET, PublicAccessBlockConfiguration=runstore.PUBLIC_ACCESS_BLOCK)
    check = doctor._run("run store", lambda: doctor.run_store(_aws(s3), SimpleNamespace(run_store_expire_days=30)))
    assert check.ok is False and check.detail.startswith(f"s3://{BUCKET}: no default encryption; no bucket policy")
    assert "lifecycle" in check.detail and "Block Public Access" not in check.detail
    assert "runstore.ensure" in check.fix
    assert doctor.exit_code([doctor.Check("credentials", True, ""), check]) == 1


def test_doctor_fails_a_run_store_name_it_may_not_read():
    check = doctor._run("run store", lambda: doctor.run_store(_aws(_Refusing("403")),
                                                              SimpleNamespace(run_store_expire_days=30)))
    assert check.ok is False and "not this account's" in check.detail and "s3:GetBucketLocation" in check.fix


def test_doctor_runs_the_run_store_check(monkeypatch):
    """run_checks lists it (the other checks stubbed: each is tested where it lives)."""
    seen = []
    monkeypatch.setattr(doctor, "_run", lambda name, fn: seen.append(name) or doctor.Check(name, True, ""))
    aws = SimpleNamespace(ec2=None, region="us-east-1", checkip_url=None, client=lambda name: None,
                          check_credentials=lambda: {"Arn": "arn"})
    doctor.run_checks(aws, SimpleNamespace(home=None, keys_dir=None), "g4dn.xlarge", False, False)
    assert "run store" in seen


def test_an_end_recorded_for_the_agent_keeps_its_launches_and_attempts(s3):
    s3.create_bucket(Bucket=BUCKET)
    launch = {"launch": 1, "instance_id": "i-0123456789abcdef0", "started_at": "2026-11-25T10:00:00+00:00"}
    runstore_records.put_status(s3, BUCKET, USER, RUN, {"state": "running", "launches": 1, "instances": [launch],
                                                        "attempts": [{"attempt": 1}]})
    runstore_records.end_status(s3, BUCKET, USER, RUN, "cancelled", "cancelled by you", "2026-11-25T11:00:00+00:00")
    raw = json.loads(s3.get_object(Bucket=BUCKET, Key=runstore.record_key(USER, RUN))["Body"].read())
    # written through the one validator: each entry with every field, None where none was written
    assert [{k: v for k, v in e.items() if v is not None} for e in raw["instances"]] == [launch]
    assert [{k: v for k, v in e.items() if v is not None} for e in raw["attempts"]] == [{"attempt": 1}]
    assert raw["launches"] == 1
    got = runstore_records.get_status(s3, BUCKET, USER, RUN)
    assert (got["state"], got["message"], got["ended_at"]) == ("cancelled", "cancelled by you",
                                                               "2026-11-25T11:00:00+00:00")
    with pytest.raises(ValueError):
        runstore_records.end_status(s3, BUCKET, USER, RUN, "running", "no", "2026-11-25T11:00:00+00:00")
    s3.put_object(Bucket=BUCKET, Key=runstore.record_key(USER, RUN), Body=b"[not a record")
    runstore_records.end_status(s3, BUCKET, USER, RUN, "failed", "why", "2026-11-25T11:00:00+00:00")  # replaced by a new one
    assert runstore_records.get_status(s3, BUCKET, USER, RUN)["state"] == "failed"


class _AgentWritesFirst:
    """The S3 client, with the agent's change of status.json (``write(s3)``) made just before the
    controller's first write of it lands: after end_status read the record, before it wrote."""

    def __init__(self, s3, write):
        self.s3, self.write, self.done = s3, write, False

    def __getattr__(self, name):
        return getattr(self.s3, name)

    def put_object(self, **kw):
        if not self.done and kw.get("Key") == runstore.record_key(USER, RUN):
            self.done = True
            self.write(self.s3)
        return self.s3.put_object(**kw)


def test_an_end_the_agent_records_while_cancel_writes_its_own_stands(s3):
    """Without a conditional write, `ec2gpu cancel` wrote "cancelled" over the agent's "succeeded"."""
    s3.create_bucket(Bucket=BUCKET)
    runstore_records.put_status(s3, BUCKET, USER, RUN, {"state": "running", "launches": 1})
    succeeded = {"state": "succeeded", "launches": 1, "exit_code": 0, "ended_at": "2026-11-25T10:59:59+00:00"}
    agent = _AgentWritesFirst(s3, lambda c: runstore_records.put_status(c, BUCKET, USER, RUN, succeeded))
    assert runstore_records.end_status(agent, BUCKET, USER, RUN, "cancelled", "cancelled by you",
                                       "2026-11-25T11:00:00+00:00") is False
    got = runstore_records.get_status(s3, BUCKET, USER, RUN)
    assert (got["state"], got["exit_code"]) == ("succeeded", 0)
    # an end already there stands as well; a record still running is ended
    assert runstore_records.end_status(s3, BUCKET, USER, RUN, "failed", "why", "2026-11-25T11:00:00+00:00") is False
    runstore_records.put_status(s3, BUCKET, USER, RUN, {"state": "running", "launches": 2})
    assert runstore_records.end_status(s3, BUCKET, USER, RUN, "failed", "why", "2026-11-25T11:00:00+00:00") is True
    assert runstore_records.get_status(s3, BUCKET, USER, RUN)["state"] == "failed"


def test_an_end_written_over_a_record_deleted_since_it_was_read_is_written_anew(s3):
    """IfMatch on an object deleted since: S3 answers NoSuchKey, taken as a conflict: read again, none."""
    s3.create_bucket(Bucket=BUCKET)
    runstore_records.put_status(s3, BUCKET, USER, RUN, {"state": "running", "launches": 1})
    gone = _AgentWritesFirst(s3, lambda c: c.delete_object(Bucket=BUCKET, Key=runstore.record_key(USER, RUN)))
    assert runstore_records.end_status(gone, BUCKET, USER, RUN, "failed", "why", "2026-11-25T11:00:00+00:00") is True
    assert runstore_records.get_status(s3, BUCKET, USER, RUN)["state"] == "failed"


# --- whose runs: the caller's user id ----------------------------------------------------------

def test_the_user_id_is_stss_userid_as_the_policy_variable_reads_it_for_a_user_and_a_role_session(monkeypatch):
    """aws/runstore.user_id takes GetCallerIdentity's UserId as it is: an IAM user's unique id, a role
    session's role id and session name. That value is ``${aws:userid}`` in the caller's requests
    (https://docs.aws.amazon.com/STS/latest/APIReference/API_GetCallerIdentity.html), so the prefix
    made from it is the one docs/iam-policy.json lets the caller reach (tests/unit/test_user_isolation.py)."""
    from ec2gpu.aws.session import Aws
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    with mock_aws():
        iam = boto3.client("iam", region_name="us-east-1")
        made = iam.create_user(UserName="bob")["User"]
        key = iam.create_access_key(UserName="bob")["AccessKey"]
        bob = Aws("us-east-1", credentials=(key["AccessKeyId"], key["SecretAccessKey"], None))
        assert runstore.user_id(bob.check_credentials()) == made["UserId"]  # AIDA... on AWS; moto makes its own
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                         "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}}]}
        dev = iam.create_role(RoleName="dev", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
        creds = boto3.client("sts", region_name="us-east-1").assume_role(
            RoleArn=dev["Arn"], RoleSessionName="alice@example.com")["Credentials"]
        alice = Aws("us-east-1", credentials=(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"]))
        user = runstore.user_id(alice.check_credentials())
        assert user == f"{dev['RoleId']}:alice@example.com"
        assert runstore.prefix(user, RUN) == f"runs/{dev['RoleId']}:alice@example.com/{RUN}/"
