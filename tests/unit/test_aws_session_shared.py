"""One botocore data loader per process (aws/session.py): service models are parsed once, while each
Aws still resolves its own credentials (the sandbox's keys never leak into an AWS session)."""
from ec2gpu.aws.session import Aws


def test_every_aws_shares_one_loader_but_not_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s1")
    a = Aws("us-east-1", endpoint_url="http://127.0.0.1:9")
    a.client("ec2")  # credentials are resolved with the first client
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second")
    b = Aws("us-west-2", endpoint_url="http://127.0.0.1:9")
    loader = a._session._session.get_component("data_loader")
    assert loader is b._session._session.get_component("data_loader")
    assert len(loader.search_paths) == len(set(loader.search_paths))  # boto3's folder not added per Aws
    assert a.client("ec2")._request_signer._credentials.access_key == "first"
    assert b.client("ec2")._request_signer._credentials.access_key == "second"
    assert b.client("ec2").meta.region_name == "us-west-2"


def test_the_caller_identity_is_asked_of_sts_once_per_aws_and_again_after_a_failure():
    import botocore.exceptions
    import pytest

    from ec2gpu.errors import AwsError
    calls = []

    class Sts:
        def get_caller_identity(self):
            calls.append(1)
            if len(calls) == 1:
                raise botocore.exceptions.ClientError({"Error": {"Code": "ExpiredToken", "Message": "x"}},
                                                      "GetCallerIdentity")
            return {"Account": "123456789012"}
    aws = Aws("us-east-1", endpoint_url="http://127.0.0.1:9")
    aws._clients[("sts", False)] = Sts()
    with pytest.raises(AwsError):
        aws.check_credentials()
    assert aws.check_credentials() == aws.check_credentials() == {"Account": "123456789012"} and len(calls) == 2
