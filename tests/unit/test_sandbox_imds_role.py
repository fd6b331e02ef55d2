"""The sandbox's metadata service gives an instance its role's credentials as EC2's does (imds.py):
the role's name, then its temporary credentials, both behind the IMDSv2 token; 404 without a role;
what botocore's own InstanceMetadataFetcher reads, through AWS_EC2_METADATA_SERVICE_ENDPOINT."""
import http.server
import json
import threading
from datetime import datetime, timedelta, timezone

import pytest

from ec2gpu.sandbox import cloudinit, imds, roles

ROLE_ARN = "arn:aws:iam::123456789012:role/ec2gpu/run-role"
CRED_PATH = "/latest/meta-data/iam/security-credentials/"


def _minter(expires_in_s: float = 3600):
    minted = []

    def mint(instance_id, role_arn):
        minted.append((instance_id, role_arn))
        return {"AccessKeyId": f"ASIA{len(minted):016d}", "SecretAccessKey": "s" * 40, "Token": "t" * 60,
                "Expiration": datetime.now(timezone.utc) + timedelta(seconds=expires_in_s)}
    return mint, minted


def _get(meta, path, token, **hooks):
    headers = {"X-aws-ec2-metadata-token": token} if token else {}
    return imds.handle(meta, "GET", path, headers, b"", lambda iid: None, **hooks)


def test_an_instance_with_a_role_gets_its_name_then_its_credentials_behind_the_token():
    meta = imds.Metadata(terminate=lambda iid: None)
    mint, minted = _minter()
    hooks = {"role_of": {"i-role": ROLE_ARN}.get, "mint": mint}
    token = meta.new_token()
    for path in (CRED_PATH, CRED_PATH + "run-role"):
        assert _get(meta, f"/i-role{path}", None, **hooks)[0] == 401  # IMDSv2: no token, nothing
        assert _get(meta, f"/i-role{path}", "forged", **hooks)[0] == 401
    assert _get(meta, f"/i-role{CRED_PATH}", token, **hooks) == (200, "text/plain", "run-role")  # the name, no path
    assert _get(meta, f"/i-role{CRED_PATH.rstrip('/')}", token, **hooks)[2] == "run-role"
    code, _, body = _get(meta, f"/i-role{CRED_PATH}run-role", token, **hooks)
    creds = json.loads(body)
    assert code == 200 and creds["Code"] == "Success" and creds["Type"] == "AWS-HMAC"
    assert creds["AccessKeyId"].startswith("ASIA") and creds["SecretAccessKey"] and creds["Token"]
    expires = datetime.strptime(creds["Expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert timedelta(minutes=59) < expires - datetime.now(timezone.utc) <= timedelta(hours=1)  # botocore's format
    datetime.strptime(creds["LastUpdated"], "%Y-%m-%dT%H:%M:%SZ")
    assert json.loads(_get(meta, f"/i-role{CRED_PATH}run-role", token, **hooks)[2]) == creds  # held, not re-minted
    assert minted == [("i-role", ROLE_ARN)]  # the instance id is the session name (roles.mint)
    assert _get(meta, f"/i-role{CRED_PATH}other-role", token, **hooks)[0] == 404


def test_no_role_is_404_and_credentials_near_their_end_are_replaced():
    meta = imds.Metadata(terminate=lambda iid: None)
    token = meta.new_token()
    mint, minted = _minter(expires_in_s=imds.ROTATE_BEFORE_S - 60)
    hooks = {"role_of": {"i-role": ROLE_ARN}.get, "mint": mint}
    for path in (CRED_PATH, CRED_PATH + "run-role"):
        assert _get(meta, f"/i-none{path}", token, **hooks)[0] == 404  # boto3 then finds no credentials
        assert _get(meta, f"/i-none{path}", token)[0] == 404  # the default hooks: nobody has a role
    first = json.loads(_get(meta, f"/i-role{CRED_PATH}run-role", token, **hooks)[2])
    second = json.loads(_get(meta, f"/i-role{CRED_PATH}run-role", token, **hooks)[2])
    assert first["AccessKeyId"] != second["AccessKeyId"] and len(minted) == 2


def test_a_role_ec2_may_not_assume_answers_as_ec2_does():
    meta = imds.Metadata(terminate=lambda iid: None)

    def refuse(instance_id, role_arn):
        raise PermissionError("EC2 cannot assume the role run-role.")
    code, _, body = _get(meta, f"/i-role{CRED_PATH}run-role", meta.new_token(), role_of=lambda i: ROLE_ARN, mint=refuse)
    answer = json.loads(body)
    assert code == 200 and answer["Code"] == "AssumeRoleUnauthorizedAccess" and "run-role" in answer["Message"]
    assert "AccessKeyId" not in answer


def test_the_availability_zone_is_the_instances():
    meta = imds.Metadata(terminate=lambda iid: None)
    token = meta.new_token()
    zone_of = {"i-a": "us-east-1b"}.get
    for path in ("/latest/meta-data/placement/availability-zone", "/latest/meta-data/placement/availability-zone/"):
        assert _get(meta, f"/i-a{path}", token, zone_of=zone_of) == (200, "text/plain", "us-east-1b")
        assert _get(meta, f"/i-a{path}", None, zone_of=zone_of)[0] == 401
    assert _get(meta, "/i-gone/latest/meta-data/placement/availability-zone", token, zone_of=zone_of)[0] == 404


@pytest.fixture
def metadata_server():
    """The daemon's HTTP handler (server.Http) on loopback, with hooks of the test's own."""
    from ec2gpu.sandbox import server

    mint, minted = _minter()
    handler = type("Handler", (server.Http,), {
        "meta": imds.Metadata(terminate=lambda iid: None), "role_of": staticmethod({"i-role": ROLE_ARN}.get),
        "mint": staticmethod(mint), "zone_of": staticmethod(lambda iid: "us-east-1a")})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_botocore_reads_the_role_credentials_at_the_instances_endpoint(metadata_server):
    from botocore.utils import InstanceMetadataFetcher, InstanceMetadataRegionFetcher

    # what the instance's AWS_EC2_METADATA_SERVICE_ENDPOINT holds (server.Sandbox._boot): botocore joins
    # "latest/api/token" and "latest/meta-data/..." onto it
    config = {"ec2_metadata_service_endpoint": f"{metadata_server}/i-role/"}
    got = InstanceMetadataFetcher(config=config, env={}).retrieve_iam_role_credentials()
    assert got["role_name"] == "run-role" and got["access_key"].startswith("ASIA") and got["token"]
    none = {"ec2_metadata_service_endpoint": f"{metadata_server}/i-none/"}
    assert InstanceMetadataFetcher(config=none, env={}).retrieve_iam_role_credentials() == {}
    assert InstanceMetadataRegionFetcher(config=config, env={}).retrieve_region() == "us-east-1"


def test_a_trust_policy_must_let_ec2_assume_the_role():
    def doc(**statement):
        return json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                                   **statement}]})
    assert roles.trusts_ec2(doc(Principal={"Service": "ec2.amazonaws.com"}))
    assert roles.trusts_ec2(doc(Principal={"Service": ["lambda.amazonaws.com", "ec2.amazonaws.com"]}))
    assert not roles.trusts_ec2(doc(Principal={"Service": "lambda.amazonaws.com"}))
    assert not roles.trusts_ec2(doc(Principal={"Service": "ec2.amazonaws.com"}, Effect="Deny"))
    assert not roles.trusts_ec2(doc(Principal={"AWS": "arn:aws:iam::123456789012:root"}))
    assert not roles.trusts_ec2("not json")


def test_user_data_gets_none_of_the_daemons_aws_variables(tmp_path, monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "AKIAREAL", "AWS_SECRET_ACCESS_KEY": "real", "AWS_SESSION_TOKEN": "real",
                 "AWS_PROFILE": "prod", "AWS_SHARED_CREDENTIALS_FILE": "/x", "AWS_CONFIG_FILE": "/y"}.items():
        monkeypatch.setenv(k, v)
    sbin = cloudinit.install_shims(tmp_path)
    env = {"PATH": f"{sbin}:/usr/bin:/bin", "HOME": str(tmp_path), "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1"}
    proc = cloudinit.run_user_data(tmp_path, "#!/bin/sh\nenv > \"$HOME/env.txt\"\n", env)
    assert proc.wait(10) == 0
    names = {line.split("=", 1)[0] for line in (tmp_path / "env.txt").read_text().splitlines()}
    assert {n for n in names if n.startswith("AWS_")} == {"AWS_ENDPOINT_URL_S3"}  # the instance's own only
    assert "PATH" in names and "HOME" in names
