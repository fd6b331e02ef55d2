"""The sandbox takes a request to have come over TLS (sandbox/tls.py), as boto3's to S3 do on AWS."""
import json

import boto3
import pytest
from moto import mock_aws

from ec2gpu.aws import runstore
from ec2gpu.sandbox import tls

BUCKET = "ec2gpu-123456789012-us-east-1"


def test_only_the_statements_for_requests_without_tls_are_left_out():
    other = {"Sid": "Other", "Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject", "Resource": "*"}
    policy = runstore.bucket_policy(BUCKET)
    policy["Statement"].append(other)
    assert tls.over_tls(policy)["Statement"] == [other]
    single = {"Version": "2012-10-17", "Statement": runstore.tls_deny_statement(BUCKET)}
    assert tls.over_tls(single)["Statement"] == []


@pytest.fixture
def tls_sandbox(monkeypatch):
    from moto.s3.models import FakeBucket
    monkeypatch.setattr(FakeBucket, "get_permission", FakeBucket.get_permission)  # undone after the test
    tls.install()
    with mock_aws():
        yield boto3.client("s3", region_name="us-east-1")


def test_a_tls_only_bucket_lets_the_sandboxs_requests_in_and_its_other_denials_hold(tls_sandbox):
    s3 = tls_sandbox
    s3.create_bucket(Bucket=BUCKET)
    policy = runstore.bucket_policy(BUCKET)
    policy["Statement"].append({"Sid": "NoDelete", "Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject",
                                "Resource": f"arn:aws:s3:::{BUCKET}/*"})
    s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(policy))
    s3.put_object(Bucket=BUCKET, Key="runs/x", Body=b"1")
    assert s3.get_object(Bucket=BUCKET, Key="runs/x")["Body"].read() == b"1"
    from moto.iam.access_control import PermissionResult
    from moto.s3.models import s3_backends
    bucket = s3_backends["123456789012"]["aws"].get_bucket(BUCKET)
    assert bucket.get_permission("s3:DeleteObject", f"arn:aws:s3:::{BUCKET}/runs/x") == PermissionResult.DENIED
