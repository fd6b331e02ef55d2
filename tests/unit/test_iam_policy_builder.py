"""aws/iam.py's pure parts: the run role's S3 policy, the names and tags, and when a launch waits
for a just-made instance profile."""
import json

import pytest

from ec2gpu.aws import iam
from ec2gpu.aws.tags import tag_value
from ec2gpu.errors import UsageError


def test_reads_and_writes_give_exactly_these_statements():
    policy = iam.s3_policy([("data-bucket", "imagenet/train/")], [("out-bucket", "runs/r1/")])
    assert policy == {"Version": "2012-10-17", "Statement": [
        {"Sid": "Read", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": ["arn:aws:s3:::data-bucket/imagenet/train/*", "arn:aws:s3:::out-bucket/runs/r1/*"]},
        {"Sid": "Write", "Effect": "Allow", "Action": ["s3:AbortMultipartUpload", "s3:PutObject"],
         "Resource": ["arn:aws:s3:::out-bucket/runs/r1/*"]},
        {"Sid": "List1", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::data-bucket",
         "Condition": {"StringLike": {"s3:prefix": ["imagenet/train/*"]}}},
        {"Sid": "List2", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::out-bucket",
         "Condition": {"StringLike": {"s3:prefix": ["runs/r1/*"]}}},
        {"Sid": "Locate", "Effect": "Allow", "Action": ["s3:GetBucketLocation"],
         "Resource": ["arn:aws:s3:::data-bucket", "arn:aws:s3:::out-bucket"]},
    ]}


def test_nothing_beyond_the_named_buckets_and_no_star_resource():
    policy = iam.s3_policy([("data-bucket", "a/"), ("other.bucket", "")], [("out-bucket", "o/")])
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert actions == {"s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListBucket",
                       "s3:GetBucketLocation"}
    resources = [r for s in policy["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str)
                                                          else s["Resource"])]
    assert "*" not in resources and all(r.startswith(("arn:aws:s3:::data-bucket", "arn:aws:s3:::other.bucket",
                                                      "arn:aws:s3:::out-bucket")) for r in resources)
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])


def test_a_read_only_entry_gives_no_put_object():
    policy = iam.s3_policy([("data-bucket", "x/")], [])
    assert not any(a in ("s3:PutObject", "s3:AbortMultipartUpload") for s in policy["Statement"] for a in s["Action"])
    assert [s["Sid"] for s in policy["Statement"]] == ["Read", "List1", "Locate"]
    # a read of one bucket and a write of another: the read bucket is never written
    both = iam.s3_policy([("data-bucket", "x/")], [("out-bucket", "y/")])
    (write,) = [s for s in both["Statement"] if s["Sid"] == "Write"]
    assert write["Resource"] == ["arn:aws:s3:::out-bucket/y/*"]


def test_an_empty_prefix_is_the_whole_bucket_and_lists_without_a_condition():
    policy = iam.s3_policy([("data-bucket", "")], [])
    read, listing, _ = policy["Statement"]
    assert read["Resource"] == ["arn:aws:s3:::data-bucket/*"]
    assert listing == {"Sid": "List1", "Effect": "Allow", "Action": ["s3:ListBucket"],
                       "Resource": "arn:aws:s3:::data-bucket"}


def test_duplicates_merge_and_a_covered_prefix_is_dropped():
    policy = iam.s3_policy([("b-1", "a/"), ("b-1", "a/"), ("b-1", "a/deeper/"), ("b-1", "c/")],
                           [("b-1", "c/"), ("b-1", "c/")])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["Read"]["Resource"] == ["arn:aws:s3:::b-1/a/*", "arn:aws:s3:::b-1/c/*"]
    assert by_sid["Write"]["Resource"] == ["arn:aws:s3:::b-1/c/*"]
    assert by_sid["List1"]["Condition"] == {"StringLike": {"s3:prefix": ["a/*", "c/*"]}}
    assert "List2" not in by_sid and by_sid["Locate"]["Resource"] == ["arn:aws:s3:::b-1"]
    # a write entry alone still reads and lists its prefix (a MOUNT-mode target is copied down first)
    only = iam.s3_policy([], [("b-1", "w/")])
    assert {s["Sid"] for s in only["Statement"]} == {"Read", "Write", "List1", "Locate"}


def test_wildcards_and_variables_in_a_prefix_are_matched_literally():
    policy = iam.s3_policy([("b-1", "a*b?c${aws:username}/")], [])
    read, listing, _ = policy["Statement"]
    assert read["Resource"] == ["arn:aws:s3:::b-1/a${*}b${?}c${$}{aws:username}/*"]
    assert listing["Condition"]["StringLike"]["s3:prefix"] == ["a${*}b${?}c${$}{aws:username}/*"]


@pytest.mark.parametrize("bucket", ["ab", "x" * 64, "Data-Bucket", "data_bucket", "-data", "data-", "a..b",
                                    "192.168.5.4", "xn--abc", "sthree-abc", "amzn-s3-demo-x", "abc-s3alias",
                                    "abc--ol-s3", "abc.mrap", "abc--x-s3", "abc--table-s3", "a/b", "", None])
def test_a_bucket_name_s3_refuses_is_refused(bucket):
    with pytest.raises(ValueError, match="not an S3 bucket name"):
        iam.s3_policy([(bucket, "x/")], [])
    with pytest.raises(ValueError, match="not an S3 bucket name"):
        iam.s3_policy([("good-bucket", "")], [(bucket, "x/")])


def test_good_bucket_names_pass_and_nothing_to_allow_is_refused():
    for bucket in ("abc", "a" * 63, "my.data-bucket.2", "1bucket"):
        assert iam.check_bucket(bucket) == bucket
    with pytest.raises(ValueError, match="no bucket"):
        iam.s3_policy([], [])


def test_a_policy_over_iams_size_limit_is_refused():
    many = [("data-bucket", f"prefix-{i:04d}-" + "x" * 40 + "/") for i in range(300)]
    with pytest.raises(ValueError, match="10240"):
        iam.s3_policy(many, [])


def test_role_names_and_tags_are_what_iam_accepts():
    assert iam.role_name("20261124-101500-ab12") == "ec2gpu-20261124-101500-ab12"
    for bad in ("", "x" * 58, "has space", "semi;colon"):
        with pytest.raises(ValueError, match="cannot name an IAM role"):
            iam.role_name(bad)
    user = "AROAEXAMPLEROLEID0001:alice@example.com"  # a role session's user id: ':' and '@' kept as they are
    tags = iam.run_tags("r-1", "DOMAIN\\alice!", "ec2gpu-r-1", "eu-west-1", user=user)
    assert tags == [{"Key": "ec2gpu:run", "Value": "r-1"}, {"Key": "ec2gpu:owner", "Value": "DOMAIN_alice_"},
                    {"Key": "Name", "Value": "ec2gpu-r-1"}, {"Key": "ec2gpu:region", "Value": "eu-west-1"},
                    {"Key": "ec2gpu:user", "Value": user}]
    assert [t["Key"] for t in iam.run_tags("r-1", "alice", "n", user="AIDAEXAMPLE")] == [
        "ec2gpu:run", "ec2gpu:owner", "Name", "ec2gpu:user"]
    # the boundary reads the tag as the user's prefix: a value IAM would refuse (or ec2gpu would have to
    # rewrite) is refused before anything is made, never changed
    for bad in ("AROAX:a,b", "a/b", "*", "", "x" * 200):
        with pytest.raises(UsageError):
            iam.run_tags("r-1", "alice", "n", user=bad)
    assert tag_value("alice@example.com") == "alice@example.com" and len(tag_value("x" * 300)) == 256


def test_the_trust_policy_lets_ec2_alone_assume_the_role():
    from ec2gpu.sandbox import roles
    assert iam.TRUST["Statement"] == [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                       "Action": "sts:AssumeRole"}]
    assert roles.trusts_ec2(json.dumps(iam.TRUST))


def test_a_prefix_without_a_slash_grants_its_object_and_folder_never_its_siblings():
    from ec2gpu.aws import iam
    doc = iam.s3_policy([], [("shared", "team")])
    resources = [r for st in doc["Statement"] if st["Sid"] in ("Read", "Write") for r in st["Resource"]]
    assert set(resources) == {"arn:aws:s3:::shared/team", "arn:aws:s3:::shared/team/*"}
    listing = next(st for st in doc["Statement"] if st["Sid"] == "List1")
    assert listing["Condition"]["StringLike"]["s3:prefix"] == ["team", "team/*"]
    assert iam.s3_policy([("bkt", "team"), ("bkt", "teamwork")], [])["Statement"][0]["Resource"] == [
        "arn:aws:s3:::bkt/team", "arn:aws:s3:::bkt/team/*", "arn:aws:s3:::bkt/teamwork", "arn:aws:s3:::bkt/teamwork/*"]


# --- a MOUNT entry's role writes its own prefix and nothing wider (issue 44, item 2) -------------------------

def _req(action, bucket, key=None, prefix=None):
    context = {"aws:PrincipalAccount": "123456789012"}
    if prefix is not None:
        context["s3:prefix"] = prefix
    return action, f"arn:aws:s3:::{bucket}" + (f"/{key}" if key is not None else ""), context


@pytest.mark.parametrize("prefix, inside, outside", [
    ("team-a/out/", ["team-a/out/x.pt", "team-a/out/deep/y"],
     ["team-a/outx", "team-a/out", "team-a/other/x", "team-a/x", "x", "team-b/out/x"]),
    ("team-a/out", ["team-a/out", "team-a/out/x.pt"], ["team-a/outside/x", "team-a/out-b/x", "team-a/x", "x"]),
])
def test_a_mount_entrys_role_may_write_its_own_prefix_only(prefix, inside, outside):
    """Evaluated as IAM would (tests/unit/test_detached_policy.py's evaluator): PutObject and
    AbortMultipartUpload under the MOUNT entry's exact prefix, never a sibling, the bucket's other
    keys, the COPY entry's bucket or another bucket; ListBucket only on the entries' own prefixes."""
    from test_detached_policy import allowed  # same folder (pytest prepend import mode)
    policy = iam.s3_policy([("data-bucket", "ds/")], [("shared", prefix)])
    for action in ("s3:PutObject", "s3:AbortMultipartUpload"):
        for key in inside:
            assert allowed(policy, _req(action, "shared", key)), key
        for key in outside:
            assert not allowed(policy, _req(action, "shared", key)), key
        assert not allowed(policy, _req(action, "data-bucket", "ds/x"))  # a COPY entry is read only
        assert not allowed(policy, _req(action, "other-bucket", inside[0]))
    assert allowed(policy, _req("s3:GetObject", "data-bucket", "ds/a")) and allowed(policy, _req("s3:GetObject",
                                                                                                 "shared", inside[0]))
    assert not allowed(policy, _req("s3:GetObject", "data-bucket", "other/a"))
    assert not allowed(policy, _req("s3:DeleteObject", "shared", inside[0]))
    assert allowed(policy, _req("s3:ListBucket", "shared", prefix=inside[-1]))
    for wider in ("", "team-a/", "team-", "t"):
        assert not allowed(policy, _req("s3:ListBucket", "shared", prefix=wider)), wider
    assert not allowed(policy, _req("s3:ListBucket", "shared"))  # no prefix: the whole bucket


def test_no_file_mounts_role_reaches_ec2gpus_own_buckets():
    """Whatever reaches s3_policy, the run store (ec2gpu-ACCOUNT-REGION: every run's outputs and
    every detached run's agent code) and any ec2gpu-* bucket are refused, read or write."""
    for bucket in ("ec2gpu-123456789012-us-east-1", "ec2gpu-other"):
        with pytest.raises(ValueError, match="is ec2gpu's own bucket"):
            iam.s3_policy([(bucket, "")], [])
        with pytest.raises(ValueError, match="is ec2gpu's own bucket"):
            iam.s3_policy([("data-bucket", "x/")], [(bucket, "runs/")])


def test_a_role_uses_an_sse_kms_buckets_key_only_through_s3_for_that_buckets_objects():
    """Issue 51 item 6: a file_mounts bucket whose default encryption names a KMS key gives
    AccessDenied on the instance unless the run role may use that key: kms:Decrypt to read,
    kms:GenerateDataKey too to write; only through S3 (kms:ViaService) and for that bucket's objects
    (S3's encryption context), under the shipped boundary as well."""
    from pathlib import Path

    from iam_eval import allowed
    read_key = "arn:aws:kms:us-east-1:111122223333:key/0b7c1c4e-1111-4a0e-9e0a-0123456789ab"
    policy = iam.s3_policy([("team-data", "in/"), ("team-out", "")], [("team-out", "")],
                           keys={"team-data": read_key, "team-out": "mrk-1234abcd", "elsewhere": "alias/x"})
    sids = [s["Sid"] for s in policy["Statement"]]
    assert sids[-2:] == ["ReadKeys", "WriteKeys"]  # a key of a bucket the role never reaches gives nothing
    boundary_text = (Path(__file__).resolve().parents[2] / "docs" / "iam-instance-boundary.json").read_text()

    def request(action, key, obj, via="s3.us-east-1.amazonaws.com"):
        context = {"kms:EncryptionContext:aws:s3:arn": obj, **({"kms:ViaService": via} if via else {})}
        return action, key, context

    def ok(req, bucket):
        boundary = json.loads(boundary_text.replace("YOUR-FILE-MOUNTS-BUCKET", bucket))
        return allowed(policy, req) and allowed(policy, req, boundary)
    out_key = "arn:aws:kms:eu-west-1:111122223333:key/mrk-1234abcd"
    assert ok(request("kms:Decrypt", read_key, "arn:aws:s3:::team-data/in/x.csv"), "team-data")
    assert ok(request("kms:Decrypt", read_key, "arn:aws:s3:::team-data"), "team-data")  # S3 Bucket Keys
    assert ok(request("kms:GenerateDataKey", out_key, "arn:aws:s3:::team-out/model.pt"), "team-out")
    assert not allowed(policy, request("kms:GenerateDataKey", read_key, "arn:aws:s3:::team-data/in/x"))
    assert not allowed(policy, request("kms:Decrypt", read_key, "arn:aws:s3:::team-data/in/x", via=None))  # KMS itself
    assert not allowed(policy, request("kms:Decrypt", read_key, "arn:aws:s3:::other-bucket/x"))
    assert not allowed(policy, request("kms:Decrypt", "arn:aws:kms:us-east-1:111122223333:key/another",
                                       "arn:aws:s3:::team-data/in/x"))
    by_alias = iam.s3_policy([("team-data", "")], [], keys={"team-data": "arn:aws:kms:us-east-1:111122223333:alias/data"})
    (alias,) = [s for s in by_alias["Statement"] if s["Sid"] == "ReadKeysByAlias"]
    assert alias["Condition"]["ForAnyValue:StringEquals"] == {"kms:ResourceAliases": ["alias/data"]}
    assert alias["Action"] == ["kms:Decrypt"] and "kms:ViaService" in alias["Condition"]["StringLike"]
    assert [s["Sid"] for s in iam.s3_policy([("team-data", "")], [])["Statement"]][-1] == "Locate"  # no key: none
    with pytest.raises(ValueError, match="is not a KMS key"):
        iam.s3_policy([("team-data", "")], [], keys={"team-data": "key with spaces"})
