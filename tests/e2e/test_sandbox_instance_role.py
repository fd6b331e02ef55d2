"""An instance in the sandbox gets its instance role's credentials from its metadata service, as on
EC2 (sandbox/roles.py, sandbox/imds.py): plain boto3 in an SSH session, with no credentials in its
environment or files, lists a bucket of the emulated S3 on each of two instances launched by one
RunInstances call with an instance profile, and finds no credentials at all on an instance without
one. The credential paths want the IMDSv2 token; a profile whose role was removed gives 404."""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest

from ec2gpu.aws import network
from ec2gpu.sandbox import control, roles

from test_sandbox_train import processes_gone  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # no training
NAME, BUCKET = "ec2gpu-test-instance-role", "ec2gpu-test-instance-role"
TRUST = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
#: what runs on the instance: plain boto3, its own defaults; one line of JSON, whatever happens
PROBE = f"""
import json, os
out = {{"aws_vars": sorted(k for k in os.environ if k.startswith("AWS_"))}}
try:
    import boto3
    s3 = boto3.client("s3")
    out["keys"] = [o["Key"] for o in s3.list_objects_v2(Bucket="{BUCKET}").get("Contents", [])]
    out["method"] = boto3.Session().get_credentials().method
    out["key_id"] = boto3.Session().get_credentials().access_key
except Exception as exc:
    out["error"] = type(exc).__name__
print(json.dumps(out))
"""


def _client(service: str):
    return boto3.client(service, endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")


def _ssh(home, iid: str, key_file, tmp_path, stdin: str) -> dict:
    """Run ``python3 -`` with ``stdin`` on the instance over OpenSSH, its host key pinned from the
    sandbox's instance directory (no trust on first use); the JSON line it prints."""
    host, port = control.resolver(home)(iid, 30)
    pub = (control.state_dir(home) / "instances" / iid / "ssh_host_ed25519_key.pub").read_text().split()
    known = tmp_path / f"known_hosts-{iid}"
    known.write_text(f"[{host}]:{port} {pub[0]} {pub[1]}\n")
    done = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(key_file), "-p", str(port), "-o", "BatchMode=yes",
                           "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
                           host, "python3", "-"], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _imds(state, iid: str, path: str, token: str | None = None) -> tuple[int, str]:
    """(status, body) of GET ``path`` on ``iid``'s metadata service, with ``token`` if given."""
    req = urllib.request.Request(f"{state['imds_url']}/{iid}{path}",
                                 headers={"X-aws-ec2-metadata-token": token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _token(state, iid: str) -> str:
    req = urllib.request.Request(f"{state['imds_url']}/{iid}/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode()


def _user_data_result(home, iid: str, timeout_s: float = 30) -> dict:
    path = control.state_dir(home) / "instances" / iid / "home" / "user-data.json"
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.2)
    return json.loads(path.read_text())


def test_instances_with_a_profile_reach_s3_with_their_role_and_one_without_finds_no_credentials(sandbox_env, tmp_path):
    home, state = sandbox_env
    ec2, iam, s3 = _client("ec2"), _client("iam"), _client("s3")
    private, public = network.generate_key()
    key_file = tmp_path / "key"
    network.write_private_key(key_file, private)
    ec2.import_key_pair(KeyName=NAME, PublicKeyMaterial=public.encode())
    role_arn = iam.create_role(RoleName=NAME, AssumeRolePolicyDocument=TRUST)["Role"]["Arn"]
    iam.create_instance_profile(InstanceProfileName=NAME)
    iam.add_role_to_instance_profile(InstanceProfileName=NAME, RoleName=NAME)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="a.txt", Body=b"a")
    ami = ec2.describe_images(Owners=["898082745236"])["Images"][0]["ImageId"]
    launch = {"ImageId": ami, "InstanceType": "g4dn.xlarge", "KeyName": NAME}
    user_data = f"#!/bin/sh\npython3 - > \"$HOME/user-data.json\" <<'EOF'\n{PROBE}\nEOF\n"
    ids = []
    try:
        with_role = [i["InstanceId"] for i in ec2.run_instances(
            **launch, MinCount=2, MaxCount=2, IamInstanceProfile={"Name": NAME}, UserData=user_data)["Instances"]]
        ids += with_role
        [without] = [i["InstanceId"] for i in ec2.run_instances(**launch, MinCount=1, MaxCount=1)["Instances"]]
        ids.append(without)
        associated = ec2.describe_iam_instance_profile_associations()["IamInstanceProfileAssociations"]
        assert sorted(a["InstanceId"] for a in associated if a["State"] == "associated") == sorted(with_role)

        with ThreadPoolExecutor(3) as pool:
            got = dict(zip(ids, pool.map(lambda i: _ssh(home, i, key_file, tmp_path, PROBE), ids), strict=True))
        for iid in with_role:  # (a) both instances of the one call: the role's temporary keys, from IMDS
            assert got[iid].get("keys") == ["a.txt"], got[iid]
            assert got[iid]["method"] == "iam-role" and got[iid]["key_id"].startswith("ASIA")
        assert got[with_role[0]]["key_id"] != got[with_role[1]]["key_id"]  # a session per instance
        assert got[without] == {"aws_vars": got[without]["aws_vars"], "error": "NoCredentialsError"}  # (b)
        for iid in ids:  # (d) the SDK's endpoints only: never a key, a profile or a credentials file
            assert not set(got[iid]["aws_vars"]) & set(roles.CREDENTIAL_VARS), got[iid]
            assert set(got[iid]["aws_vars"]) == {"AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_ENDPOINT_URL_S3",
                                                 "AWS_ENDPOINT_URL_AUTO_SCALING",  # a detached run ends its group
                                                 "AWS_ENDPOINT_URL_SSM"}  # and reads its secrets
        for iid in with_role:  # user data (cloud-init) has the role too, and none of the daemon's AWS variables
            ran = _user_data_result(home, iid)
            assert ran.get("keys") == ["a.txt"] and ran["method"] == "iam-role", ran
            assert not set(ran["aws_vars"]) & set(roles.CREDENTIAL_VARS)

        creds = "/latest/meta-data/iam/security-credentials/"
        token = _token(state, with_role[0])
        for path in (creds, creds + NAME):  # (c) IMDSv2: no token, nothing
            assert _imds(state, with_role[0], path)[0] == 401
        assert _imds(state, with_role[0], creds, token) == (200, NAME)
        answer = json.loads(_imds(state, with_role[0], creds + NAME, token)[1])
        assert answer["Code"] == "Success" and answer["AccessKeyId"] == got[with_role[0]]["key_id"]
        assert _imds(state, without, creds, _token(state, without))[0] == 404
        assert role_arn.endswith(f"/{NAME}")
        iam.remove_role_from_instance_profile(InstanceProfileName=NAME, RoleName=NAME)
        assert _imds(state, with_role[0], creds, token)[0] == 404  # as on EC2: the profile has no role now
        assert _imds(state, with_role[0], creds + NAME, token)[0] == 404
    finally:
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
        ec2.delete_key_pair(KeyName=NAME)
        profile = iam.get_instance_profile(InstanceProfileName=NAME)["InstanceProfile"]
        if any(r["RoleName"] == NAME for r in profile["Roles"]):
            iam.remove_role_from_instance_profile(InstanceProfileName=NAME, RoleName=NAME)
        iam.delete_instance_profile(InstanceProfileName=NAME)
        iam.delete_role(RoleName=NAME)
        for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=o["Key"])
        s3.delete_bucket(Bucket=BUCKET)
    assert processes_gone(ids)  # their sshds and sessions stopped with them
