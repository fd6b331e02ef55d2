"""S3 file_mounts checked before anything is made (aws/storage.py, runs/provision/resources.py), against the
sandbox's moto S3: missing sources refused, output buckets only listed to be made, one object told
from a folder by its key, and a run role IAM refuses stops the run before its key pair exists."""
from types import SimpleNamespace

import botocore.exceptions
import pytest

from ec2gpu.runs.options import RunOptions
from ec2gpu.aws import storage
from ec2gpu.errors import UsageError
from ec2gpu.runs.provision import resources as provision
from ec2gpu.tasks.mounts import Mount

BUCKET = "ec2gpu-test-storage"
#: two people's AWS user ids (STS UserId: aws/runstore.user_id) who log in as the same local name
ALICE, BOB = "AROAEXAMPLEROLEID0001:alice@example.com", "AIDAEXAMPLEUSERID0002"


@pytest.fixture
def s3(sandbox_env):
    import os

    import boto3
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    for key in ("a.txt", "a.txt.bak", "data", "data/x.txt", "train/b.txt"):
        client.put_object(Bucket=BUCKET, Key=key, Body=key.encode())
    return client


def _s3(target: str, prefix: str, bucket: str = BUCKET, create: bool = False) -> Mount:
    return Mount(target, "s3", f"s3://{bucket}/{prefix}", "MOUNT" if create else "COPY", bucket, prefix,
                 write_back=create, create=create)


def test_a_missing_source_is_refused_and_a_missing_output_bucket_is_only_listed(s3):
    regions, missing = storage.check_buckets(s3, [_s3("/d", "train/"), _s3("/o", "", "ec2gpu-test-new-out", True)],
                                             "us-east-1", ALICE)
    assert regions == {BUCKET: "us-east-1", "ec2gpu-test-new-out": "us-east-1"} and missing == ["ec2gpu-test-new-out"]
    assert "ec2gpu-test-new-out" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]  # made later, by provision
    with pytest.raises(UsageError, match="s3://ec2gpu-test-absent does not exist"):
        storage.check_buckets(s3, [_s3("/d", "x", "ec2gpu-test-absent")], "us-east-1", ALICE)


def test_an_existing_named_bucket_is_the_tasks_own_only_when_ec2gpu_made_it_for_this_user(s3):
    """`name: B, mode: MOUNT` writes back to B without --allow-write-bucket only when B is missing
    (made for the run) or carries ec2gpu:user = this caller's AWS user id (made by ec2gpu for them
    before); another's bucket, reached by naming it, needs the flag (the entry's write_allowed), as
    a source does. The login name decides nothing: ubuntu on one machine is ubuntu on another."""
    from dataclasses import replace
    theirs, mine = "team-shared-results-44", "alice-results-44"
    s3.create_bucket(Bucket=theirs)
    s3.put_bucket_tagging(Bucket=theirs, Tagging={"TagSet": [{"Key": "ec2gpu:owner", "Value": "bob"}]})
    storage.create_private_bucket(s3, mine, "us-east-1", "ubuntu", ALICE)
    assert {"Key": "ec2gpu:user", "Value": ALICE} in s3.get_bucket_tagging(Bucket=mine)["TagSet"]
    untagged = "untagged-results-44"
    s3.create_bucket(Bucket=untagged)
    for bucket in (theirs, untagged):
        with pytest.raises(UsageError) as err:
            storage.check_buckets(s3, [_s3("/out", "", bucket, True)], "us-east-1", ALICE)
        assert err.value.message.startswith(f"file_mounts./out: s3://{bucket} exists and is not a bucket ec2gpu made "
                                            f"for you (no ec2gpu:user tag of your AWS user id {ALICE})")
        assert err.value.hint.startswith(f"give --allow-write-bucket {bucket}")
        allowed = replace(_s3("/out", "", bucket, True), write_allowed=True)
        assert storage.check_buckets(s3, [allowed], "us-east-1", ALICE) == ({bucket: "us-east-1"}, [])
        copy = replace(_s3("/in", "", bucket, True), mode="COPY", write_back=False)  # read only: no flag
        assert storage.check_buckets(s3, [copy], "us-east-1", ALICE) == ({bucket: "us-east-1"}, [])
    assert storage.check_buckets(s3, [_s3("/out", "", mine, True)], "us-east-1", ALICE) == ({mine: "us-east-1"}, [])
    with pytest.raises(UsageError, match=f"no ec2gpu:user tag of your AWS user id {BOB}"):
        storage.check_buckets(s3, [_s3("/out", "", mine, True)], "us-east-1", BOB)
    # a source entry of the task's own named bucket is held to the same rule
    source = Mount("/logs", "s3", f"s3://{theirs}/logs", "MOUNT", theirs, "logs", write_back=True)
    with pytest.raises(UsageError, match=f"s3://{theirs} exists and is not a bucket ec2gpu made for you"):
        storage.check_buckets(s3, [source, _s3("/out", "", theirs, True)], "us-east-1", ALICE)


def test_a_colleagues_bucket_under_the_same_login_name_is_not_the_tasks_own(s3):
    """Two people who both log in as ubuntu: a bucket ec2gpu made for Bob (ec2gpu:owner ubuntu)
    is not Alice's for a task that names it, nor is one ec2gpu made before it tagged buckets with
    their user (ec2gpu:owner alone): each needs --allow-write-bucket, which the refusal's hint says."""
    colleagues, older = "colleagues-results-44", "older-results-44"
    storage.create_private_bucket(s3, colleagues, "us-east-1", "ubuntu", BOB)
    s3.create_bucket(Bucket=older)
    s3.put_bucket_tagging(Bucket=older, Tagging={"TagSet": [{"Key": "ec2gpu:owner", "Value": "ubuntu"}]})
    for bucket in (colleagues, older):
        with pytest.raises(UsageError) as err:
            storage.check_buckets(s3, [_s3("/out", "", bucket, True)], "us-east-1", ALICE)
        assert "is not a bucket ec2gpu made for you" in err.value.message
        assert f"--allow-write-bucket {bucket}" in err.value.hint and "before it tagged buckets" in err.value.hint


def test_one_object_is_told_from_a_folder_by_its_key_not_by_its_neighbours(s3):
    files = storage.single_objects(s3, [_s3("/a", "a.txt"), _s3("/data", "data"), _s3("/t", "train"),
                                        _s3("/t2", "train/"), _s3("/all", "")])
    assert files == {"/a"}  # a.txt beside a.txt.bak is a file; data beside data/x.txt a folder
    with pytest.raises(UsageError, match="holds no object"):
        storage.single_objects(s3, [_s3("/n", "nothing-here")])


def test_a_run_role_iam_refuses_stops_the_run_before_its_key_pair(monkeypatch, tmp_path):
    """Credentials under docs/iam-policy.json may create a role only with the boundary: without it
    in the account, the refusal is one line and comes before the key pair and security group."""
    made = []

    class Refusing:
        def create_role(self, **kw):
            raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "CreateRole")

    monkeypatch.setattr(provision.network, "ssh_cidr", lambda cidr, url=None: "127.0.0.1/32")
    monkeypatch.setattr(provision, "choose_image", lambda aws, opts: {"ImageId": "ami-1", "Name": "x", "why": "",
                                                                       "source": "", "RootDeviceName": "/dev/xvda"})
    monkeypatch.setattr(provision.network, "create_key_pair", lambda *a: made.append("key pair"))
    monkeypatch.setattr(provision.network, "create_security_group", lambda *a: made.append("security group"))
    job = SimpleNamespace(mounts=[_s3("/d", "train/")], role_policy={"Version": "2012-10-17", "Statement": []},
                          role_boundary=None, buckets_to_make=["ec2gpu-test-never-made"])
    opts = RunOptions(task=job)  # the task: a stand-in with what the role step reads
    aws = SimpleNamespace(ec2=None, region="us-east-1", client=lambda name: Refusing(), checkip_url=None,
                          check_credentials=lambda: {"Account": "123456789012", "UserId": "AIDAEXAMPLEUSERID0001"})
    prov = provision.Provisioned("run-refused")
    ui = SimpleNamespace(note=lambda line: None, phase=lambda name: _Null())
    with pytest.raises(UsageError, match="permissions boundary ec2gpu-instance-boundary"):
        provision.provision(aws, SimpleNamespace(owner="alice", keys_dir=tmp_path, handover_wait_seconds=300), opts,
                            "run-refused", ui, prov)
    assert made == [] and prov.instance_profile is None and prov.key_name is None


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_file_mounts_buckets_owner_tag_is_a_value_s3_takes_whatever_the_login_name(s3):
    """S3 answers InvalidTag for a tag value outside letters, digits, spaces and _ . : / = + - @: the
    bucket ec2gpu makes is tagged with the login name as the run store tags it (tags.tag_value)."""
    bucket = "corp-results-51"
    storage.create_private_bucket(s3, bucket, "us-east-1", "CORP\\o'brien", ALICE)
    assert {"Key": "ec2gpu:owner", "Value": "CORP_o_brien"} in s3.get_bucket_tagging(Bucket=bucket)["TagSet"]


def test_an_sse_kms_buckets_key_reaches_the_run_roles_policy(s3, tmp_path):
    """Issue 51 item 6: the controller's own check of a file_mounts bucket passes with its user's
    credentials, but its instance gets AccessDenied on objects encrypted with the bucket's KMS key
    unless the run role may use it: check_s3_access reads each bucket's default encryption
    (GetBucketEncryption) and gives the role kms:Decrypt on the key of a bucket it reads, and
    kms:GenerateDataKey too on one it writes; SSE-S3 buckets and the AWS managed aws/s3 need none."""
    import os

    import boto3
    from ec2gpu.aws.session import Aws
    from ec2gpu.runs.execute import engine
    from ec2gpu.tasks import load
    kms = boto3.client("kms", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    key = kms.create_key()["KeyMetadata"]["Arn"]
    for bucket, rule in (("kms-data-51", {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}),
                         ("aws-managed-51", {"SSEAlgorithm": "aws:kms"}), ("sse-s3-51", {"SSEAlgorithm": "AES256"})):
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": rule}]})
        s3.put_object(Bucket=bucket, Key="in/x.csv", Body=b"1")
    assert storage.bucket_keys(s3, ["kms-data-51", "aws-managed-51", "sse-s3-51", BUCKET]) == {"kms-data-51": key}
    (tmp_path / "t.yaml").write_text("file_mounts:\n  /data: s3://kms-data-51/in/\n  /plain: s3://sse-s3-51/in/\n"
                                     "  /managed: s3://aws-managed-51/in/\nrun: x\n")
    job = engine.TaskJob(load.load(tmp_path / "t.yaml"), {}, None)
    provision.check_s3_access(Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"]), job)
    (keys,) = [s for s in job.role_policy["Statement"] if s["Sid"].endswith("Keys")]
    assert keys["Sid"] == "ReadKeys" and keys["Resource"] == [key] and keys["Action"] == ["kms:Decrypt"]
    assert keys["Condition"]["StringLike"]["kms:EncryptionContext:aws:s3:arn"] == [
        "arn:aws:s3:::kms-data-51", "arn:aws:s3:::kms-data-51/*"]


def test_a_new_output_bucket_is_made_private_while_s3_does_not_see_it_yet(s3):
    """S3 answers NoSuchBucket to the first configuration calls after CreateBucket for a moment
    (aws/consistency.py): they are tried again, and the bucket ends private, encrypted and tagged."""
    bucket, left = "ec2gpu-test-storage-new", {"n": 2}

    def not_seen_yet(request, **_):
        if left["n"] <= 0:
            return None
        left["n"] -= 1
        from botocore.awsrequest import AWSResponse
        body = b"<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>"
        return AWSResponse(request.url, 404, {}, _Raw(body))
    s3.meta.events.register("before-send.s3.PutPublicAccessBlock", not_seen_yet)
    try:
        storage.create_private_bucket(s3, bucket, "us-east-1", "alice", ALICE)
        assert left["n"] == 0
        assert all(s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"].values())
        assert s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
        assert {"Key": "ec2gpu:user", "Value": ALICE} in s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    finally:
        s3.meta.events.unregister("before-send.s3.PutPublicAccessBlock", not_seen_yet)
        s3.delete_bucket(Bucket=bucket)


class _Raw:
    """The body of a canned HTTP response, as botocore reads it (AWSResponse.raw.stream())."""

    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body
