"""A detached run's start (runs/detached/launch.start) and a run's hand-over (runs/recover/handover.prepare)
against moto in this process, up to the Auto Scaling group: what they say of the run store, the
agent hashes the user data holds, and a spec.json the agent would not read refused before anything
is made."""
import hashlib
import json
import os
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from ec2gpu import settings as settings_mod
from ec2gpu.agent import store as agent_store
from ec2gpu.wire import names, run_spec
from ec2gpu.aws import groups, runstore
from ec2gpu.aws.session import Aws
from ec2gpu.errors import UsageError
from ec2gpu.runs.detached import launch
from ec2gpu.runs.execute import engine
from ec2gpu.runs.execute.reporter import Reporter
from ec2gpu.runs.options import RunOptions
from ec2gpu.runs.plan import detached_spec
from ec2gpu.runs.recover import handover
from ec2gpu.tasks import load


class Grouped(Exception):
    """Raised where the group would be made (start then removes what it made: not here, moto ends with the test)."""


def _over_tls(self, action, resource):
    """moto's bucket policy check for a request over TLS, as boto3's to S3 are (sandbox/tls.py): the
    run store's TLS-deny statement does not apply; moto itself would apply it to every request."""
    from moto.iam.access_control import IAMPolicy, PermissionResult

    from ec2gpu.sandbox import tls
    if self.policy is None:
        return PermissionResult.NEUTRAL
    return IAMPolicy(json.dumps(tls.over_tls(json.loads(self.policy)))).is_action_permitted(action, resource)


@pytest.fixture
def aws(monkeypatch, tmp_path):
    from moto.s3.models import FakeBucket
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(FakeBucket, "get_permission", _over_tls)
    from ec2gpu.sandbox import ebskeys
    ebskeys.install()  # GetEbsDefaultKmsKeyId, as the sandbox's daemon answers it (moto has none)
    with mock_aws():
        yield Aws("us-east-1")


@pytest.fixture
def started(aws, monkeypatch):
    """launch.start with what is not the run store's or the role's stubbed (estimate, quota, SSH
    address, image) and the group's creation caught: returns a function that starts ``opts`` and
    gives (the Reporter, the LaunchSpec the group would have launched)."""
    from ec2gpu.runs.provision import pipeline
    from ec2gpu.runs.provision import resources as provision
    est = SimpleNamespace(upper_bound=False, cost_usd=0.1, as_dict=lambda: {})
    monkeypatch.setattr(pipeline, "check_estimate", lambda *a, **k: est)
    monkeypatch.setattr(launch.capacity, "check_quota", lambda *a, **k: None)
    monkeypatch.setattr(launch.network, "ssh_cidr", lambda *a, **k: "127.0.0.1/32")
    monkeypatch.setattr(provision, "choose_image", lambda aws, opts: {"ImageId": "ami-03cf127a", "Name": "x",
                                                                      "RootDeviceName": "/dev/xvda"})
    caught = {}

    def create(ec2, autoscaling, spec, *a, **k):
        caught["spec"] = spec
        raise Grouped

    monkeypatch.setattr(groups, "create", create)
    monkeypatch.setattr(launch.sweep, "delete_run", lambda *a, **k: None)  # moto has no DescribePlacementGroups

    def start(opts: RunOptions):
        ui = Reporter()
        with pytest.raises(Grouped):
            launch.start(aws, settings_mod.load({}), opts, ui, SimpleNamespace(name="aws", is_sandbox=False))
        return ui, caught["spec"]
    return start


def _opts(tmp_path, env: dict | None = None) -> RunOptions:
    job = engine.TaskJob(load.parse("name: mine\nrun: python train.py\n"), env or {"A": "1"}, None)
    return RunOptions(task=job, max_runtime_minutes=30, out=tmp_path / "out")


def test_a_detached_start_says_that_it_made_the_run_store(started, aws, tmp_path):
    """The first detached run of an account and region makes the run store and says so in its
    output (runstore.ensure's lines reach the run's reporter: docs/detached.md)."""
    ui, _ = started(_opts(tmp_path))
    bucket = runstore.bucket_name(aws.check_credentials()["Account"], "us-east-1")
    assert f"run store: created s3://{bucket} in us-east-1" in ui.notes


def test_a_runs_hand_over_says_that_it_made_the_run_store(aws):
    """A run in the foreground that prepares a hand-over makes the run store the same way, and its
    log hears the same line (and, for credentials that may not set the bucket's settings, the
    "not set" line: runstore.ensure, tests/aws/test_runstore.py)."""
    said = []
    got = handover.prepare(aws, settings_mod.load({}), "20261201-090000-a1b2", 30, said.append, wait_s=60)
    assert got is not None
    assert f"run store: created s3://{got.bucket} in us-east-1" in said


def test_the_user_data_holds_the_hashes_of_exactly_the_uploaded_bytes(started, aws, tmp_path, monkeypatch):
    """start hands _upload's hashes to boot_script: the user data's sha256 of each agent file and of
    spec.json are those of the objects in S3, even when the files on this machine change between
    two reads of them (ec2gpu upgraded while a run starts): each is read once, hashed and uploaded."""
    reads = {name: 0 for name in launch.AGENT_FILES}

    def agent_source(name):  # each read of a file finds another version of it
        reads[name] += 1
        path = tmp_path / "agent" / f"{name}.{reads[name]}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(f"# {name}, version {reads[name]}\n".encode())
        return path

    monkeypatch.setattr(launch, "agent_source", agent_source)
    _, spec = started(_opts(tmp_path))
    user = runstore.user_id(aws.check_credentials())
    bucket = runstore.bucket_name(aws.check_credentials()["Account"], "us-east-1")
    run_id = spec.run_id
    s3 = boto3.client("s3", region_name="us-east-1")

    def sha(key: str) -> str:
        return hashlib.sha256(s3.get_object(Bucket=bucket, Key=key)["Body"].read()).hexdigest()
    uploaded = {name: sha(runstore.agent_prefix(user, run_id) + name) for name in launch.BOOT_FILES}
    assert spec.boot == launch.boot_script(bucket, user, run_id, "us-east-1", groups.name_of(run_id), uploaded,
                                           sha(runstore.spec_key(user, run_id)))
    assert all(n == 1 for n in reads.values()), reads


def test_a_spec_over_what_the_agent_reads_is_refused_before_anything_is_made(started, aws, tmp_path):
    """The agent reads at most run_spec.MAX_BYTES (wire/run_spec.py) of spec.json, and a larger one would end the run on the
    instance after the bucket, role and group were made: refused at once instead, naming what
    makes it large; no bucket, role or key pair exists after."""
    assert detached_spec.MAX_SPEC_BYTES == run_spec.MAX_BYTES
    with pytest.raises(UsageError) as err:
        started(_opts(tmp_path, {"BIG": "x" * (1024 * 1024), "A": "1"}))
    assert "over the 1,048,576 a detached run's agent reads: envs 1,048,5" in err.value.message
    assert "(largest environment variables: BIG, A)" in err.value.message and err.value.hint
    assert boto3.client("s3", region_name="us-east-1").list_buckets()["Buckets"] == []
    assert boto3.client("iam", region_name="us-east-1").list_roles()["Roles"] == []
    assert boto3.client("ec2", region_name="us-east-1").describe_key_pairs()["KeyPairs"] == []


@pytest.mark.parametrize("group", ["interrupted", "made"])
def test_a_hand_off_stopped_before_its_group_removes_what_it_made_and_one_handed_over_removes_nothing(
        started, aws, tmp_path, monkeypatch, group):
    """The hand-off's close (launch.DetachedJob.close, on every way out of the lifecycle): Ctrl-C
    while the role, key pair and security group are being made, before the group exists, removes
    what the run made (aws/sweep.delete_run with its run id) and lets the interrupt go on; once
    the group is made the run is the agent's, and nothing is removed: the record comes back."""
    swept: list[str] = []

    def make_group(*a, **k):  # the group's step: create, SuspendProcesses, its zone found
        if group == "interrupted":
            raise KeyboardInterrupt
    monkeypatch.setattr(launch, "_group", make_group)
    monkeypatch.setattr(launch.sweep, "delete_run", lambda ec2, run_id, *a, **k: swept.append(run_id))
    ui = Reporter()
    if group == "interrupted":
        with pytest.raises(KeyboardInterrupt):
            launch.start(aws, settings_mod.load({}), _opts(tmp_path), ui, SimpleNamespace(name="aws", is_sandbox=False))
        assert len(swept) == 1 and f"removing what run {swept[0]} made" in ui.notes
    else:
        record = launch.start(aws, settings_mod.load({}), _opts(tmp_path), ui,
                              SimpleNamespace(name="aws", is_sandbox=False))
        assert record["status"] == "detached" and record["group"] == groups.name_of(record["run_id"])
        assert record["task_key"] == _opts(tmp_path).task.history_key  # its history: the task's own (issue 48 item 8)
        assert swept == [] and not any(n.startswith("removing what run") for n in ui.notes)


def test_the_agent_refuses_a_spec_over_what_it_reads_as_too_large(aws):
    """On the instance a spec.json over the bound (written there by other means) is refused for its
    size, not as a rewritten one: its hash is never taken of the bytes read short of its end."""
    s3 = boto3.client("s3", region_name="us-east-1")
    bucket, user, run_id = "ec2gpu-123456789012-us-east-1", "AIDAEXAMPLEUSERID0002", "20261201-090000-a1b2"
    s3.create_bucket(Bucket=bucket)
    body = b"{" + b" " * run_spec.MAX_BYTES + b"}"
    s3.put_object(Bucket=bucket, Key=runstore.spec_key(user, run_id), Body=body)
    store = agent_store.Store(s3, bucket, user, run_id)
    with pytest.raises(names.Refused, match=r"^spec.json is too large: over 1,048,576 bytes"):
        store.get_json("spec.json", run_spec.MAX_BYTES, hashlib.sha256(body).hexdigest())


def test_the_deadline_is_taken_once_the_runs_files_are_in_s3(started, aws, tmp_path, monkeypatch):
    """Issue 51 item 8: a slow upload of the workdir no longer comes out of the job's limit, nor
    leaves the group's scheduled end behind: the group's deadline and spec.json's limit_at are
    taken after the workdir, the file_mounts and the agent are in S3, just before the spec goes."""
    import time
    from datetime import datetime, timedelta, timezone

    from ec2gpu.runs.plan import limits
    put_file, uploaded = launch.runstore_objects.put_file, []

    def slow_put_file(s3, bucket, key, path, *a, **k):
        time.sleep(2.0)  # a large workdir on a slow link
        got = put_file(s3, bucket, key, path, *a, **k)
        uploaded.append(datetime.now(timezone.utc))
        return got
    monkeypatch.setattr(launch.runstore_objects, "put_file", slow_put_file)
    made = []

    def create(ec2, autoscaling, spec, types, subnets, size, deadline, **_):  # the deadline; the creation caught
        made.append((spec.run_id, deadline))
        raise Grouped
    monkeypatch.setattr(groups, "create", create)
    with pytest.raises(Grouped):
        launch.start(aws, settings_mod.load({}), _opts(tmp_path), Reporter(), SimpleNamespace(name="aws", is_sandbox=False))
    ((run_id, deadline),) = made
    assert uploaded and deadline >= uploaded[-1] + timedelta(minutes=30)
    user = runstore.user_id(aws.check_credentials())
    bucket = runstore.bucket_name(aws.check_credentials()["Account"], "us-east-1")
    body = boto3.client("s3", region_name="us-east-1").get_object(
        Bucket=bucket, Key=runstore.spec_key(user, run_id))["Body"].read()
    assert json.loads(body)["limit_at"] == deadline.timestamp() - limits.lead_seconds(30)


@pytest.mark.parametrize("rule_days, setting, source", [(7, 30, "lifecycle rule expires them after 7 days"),
                                                        (None, 5, "run_store_expire_days expires them after 5 days")])
def test_a_run_that_outlasts_its_files_in_the_run_store_is_refused_before_anything_is_made(
        started, aws, tmp_path, monkeypatch, rule_days, setting, source):
    """Issue 51 item 8: every instance of a detached run (a spot replacement days in too) fetches its
    agent, spec and workdir from the run store, whose lifecycle rule expires them: a limit longer
    than the bucket's rule (anyone's) or run_store_expire_days is refused before anything is made,
    with the --max-runtime that fits; a limit that fits starts."""
    s3 = boto3.client("s3", region_name="us-east-1")
    bucket = runstore.bucket_name(aws.check_credentials()["Account"], "us-east-1")
    if rule_days:
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
            {"ID": "admins", "Filter": {"Prefix": ""}, "Status": "Enabled", "Expiration": {"Days": rule_days}}]})
    days = rule_days or setting
    settings = settings_mod.load({"run_store_expire_days": setting})
    opts = RunOptions(task=_opts(tmp_path).task, max_runtime_minutes=days * 1440, out=tmp_path / "out")
    with pytest.raises(UsageError) as err:
        launch.start(aws, settings, opts, Reporter(), SimpleNamespace(name="aws", is_sandbox=False))
    assert f"a detached run's limit of {days}d outlasts its files in the run store" in err.value.message
    assert source in err.value.message and f"give --max-runtime {days * 24 - 1}h or less" in err.value.hint
    assert boto3.client("iam", region_name="us-east-1").list_roles()["Roles"] == []
    assert boto3.client("ec2", region_name="us-east-1").describe_key_pairs()["KeyPairs"] == []
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ([bucket] if rule_days else [])
    monkeypatch.setattr(launch.sweep, "delete_run", lambda *a, **k: None)
    with pytest.raises(Grouped):  # the longest that fits starts (the group's creation is caught)
        launch.start(aws, settings, RunOptions(task=opts.task, max_runtime_minutes=days * 1440 - 60,
                                               out=tmp_path / "out"),
                     Reporter(), SimpleNamespace(name="aws", is_sandbox=False))


def _customer_key(policy: dict | None = None) -> str:
    """A customer managed KMS key made the account's default for EBS encryption; its ARN."""
    kms = boto3.client("kms", region_name="us-east-1")
    key = kms.create_key(**({"Policy": json.dumps(policy)} if policy else {}))["KeyMetadata"]
    boto3.client("ec2", region_name="us-east-1").modify_ebs_default_kms_key_id(KmsKeyId=key["KeyId"])
    return key["Arn"]


@pytest.mark.parametrize("given", ["nothing", "grant", "key policy", "aws's two statements"])
def test_a_customer_managed_ebs_key_auto_scaling_may_not_use_is_refused_before_anything_is_made(
        started, aws, tmp_path, given):
    """Issue 51 item 6: Auto Scaling's service-linked role launches a detached run's encrypted volumes
    with the account's default EBS key; a customer managed key lets it only through its key policy
    or a grant (else every launch fails, Client.InternalError). Without either the run is refused
    before anything is made, with the grant that is needed; with one it starts."""
    from ec2gpu.aws import iam_detached
    role = iam_detached.autoscaling_role_arn("123456789012", "us-east-1")
    policy = {"Version": "2012-10-17", "Statement": [
        {"Sid": "Admins", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "kms:*",
         "Resource": "*"}]}
    if given == "key policy":  # the two statements of AWS's page, as one
        policy["Statement"].append({"Sid": "AutoScaling", "Effect": "Allow", "Principal": {"AWS": [role]},
                                    "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                                               "kms:DescribeKey", "kms:CreateGrant"], "Resource": "*"})
    if given == "aws's two statements":  # the page's example: CreateGrant apart, for AWS resources only
        policy["Statement"] += [
            {"Sid": "Use", "Effect": "Allow", "Principal": {"AWS": role}, "Resource": "*",
             "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]},
            {"Sid": "Attach", "Effect": "Allow", "Principal": {"AWS": role}, "Action": "kms:CreateGrant", "Resource": "*",
             "Condition": {"Bool": {"kms:GrantIsForAWSResource": True}}}]
    arn = _customer_key(policy)
    if given == "grant":
        boto3.client("kms", region_name="us-east-1").create_grant(
            KeyId=arn, GranteePrincipal=role, Operations=list(iam_detached.AUTOSCALING_GRANT))
    if given != "nothing":
        started(_opts(tmp_path))  # the group is reached
        return
    with pytest.raises(UsageError) as err:
        launch.start(aws, settings_mod.load({}), _opts(tmp_path), Reporter(), SimpleNamespace(name="aws", is_sandbox=False))
    assert f"the account's default key for EBS encryption, {arn}, is a customer managed key" in err.value.message
    assert f"aws kms create-grant --region us-east-1 --key-id {arn} --grantee-principal {role}" in err.value.hint
    assert boto3.client("iam", region_name="us-east-1").list_roles()["Roles"] == []
    assert boto3.client("ec2", region_name="us-east-1").describe_key_pairs()["KeyPairs"] == []


def test_the_aws_managed_ebs_key_needs_no_grant_and_an_unreadable_key_is_said(started, aws, tmp_path, monkeypatch):
    """The AWS managed key (alias/aws/ebs, a new account's) needs nothing; a key whose policy and
    grants these credentials may not read is a warning naming the grant, not a refusal."""
    ui, _ = started(_opts(tmp_path))
    assert not any("default key for EBS" in n for n in ui.notes)
    _customer_key()
    import botocore.client
    from botocore.exceptions import ClientError
    real = botocore.client.BaseClient._make_api_call

    def call(self, name, params):  # these credentials may not read the key's policy and grants
        if name in ("GetKeyPolicy", "ListGrants"):
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, name)
        return real(self, name, params)
    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", call)
    ui, _ = started(_opts(tmp_path))
    assert any(n.startswith("warning: could not read the key policy and grants of arn:aws:kms:us-east-1:")
               and "aws kms create-grant" in n for n in ui.notes), ui.notes


def test_rules_these_credentials_may_not_read_leave_the_setting_to_decide():
    """A user without s3:GetLifecycleConfiguration on the run store is not refused for it: the run's
    limit is held to run_store_expire_days alone (runstore.check_keeps)."""
    from botocore.exceptions import ClientError

    class Refusing:
        def get_bucket_lifecycle_configuration(self, **kw):
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "GetBucketLifecycleConfiguration")
    runstore.check_keeps(Refusing(), "ec2gpu-123456789012-us-east-1", 30, 29 * 1440)
    with pytest.raises(UsageError, match="run_store_expire_days expires them after 3 days"):
        runstore.check_keeps(Refusing(), "ec2gpu-123456789012-us-east-1", 3, 3 * 1440)
