"""Hand-over links with temporary credentials in the sandbox (issue 51, item 2): the controller's
credentials are a role session of the sandbox's STS that lasts seconds, refreshed as botocore
refreshes an assumed role's (RefreshableCredentials). The sandbox's S3 refuses a URL once its
X-Amz-Expires has passed or the credentials that signed it have ended (sandbox/presigned.py), as
AWS does; the launch says so; the heartbeat's renewal gives URLs that work again; and a URL refused
that way reaches S3 through the instance role of a sandbox instance (its metadata service), as the
agent's fallback does (wire/handover_urls.put_or_role)."""
import os
import time
import urllib.error
import urllib.request

import boto3
import botocore.config
import pytest
from botocore.credentials import RefreshableCredentials

from ec2gpu.agent import agent
from ec2gpu.aws import iam, runstore, runstore_objects
from ec2gpu.aws.session import Aws
from ec2gpu.runs.recover import handover
from ec2gpu.settings import Settings
from ec2gpu.wire import bounded_json, handover_urls

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # no training
RUN = "20260102-030405-c0de"
SESSION_S = 5  # how long each of the controller's role sessions lasts


def _client(service: str):
    return boto3.client(service, endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")


def _session_aws() -> Aws:
    """The sandbox's clients, their credentials a role session of SESSION_S seconds that botocore
    refreshes as it refreshes an assumed role's (an SSO or assume-role profile on AWS)."""
    # AWS's shortest session is 900 s (botocore checks it: its validation is off for this client); moto takes seconds
    sts = boto3.client("sts", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1",
                       config=botocore.config.Config(parameter_validation=False))

    def fetch():
        got = sts.assume_role(RoleArn="arn:aws:iam::123456789012:role/laptop", RoleSessionName="laptop",
                              DurationSeconds=SESSION_S)["Credentials"]
        return {"access_key": got["AccessKeyId"], "secret_key": got["SecretAccessKey"], "token": got["SessionToken"],
                "expiry_time": got["Expiration"].isoformat()}
    aws = Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    aws._session._session._credentials = RefreshableCredentials.create_from_metadata(  # what botocore's providers give
        fetch(), refresh_using=fetch, method="assume-role")
    return aws


def _put(url: str, body: bytes = b"x") -> tuple[int, str]:
    """(HTTP status, S3 error code or "") of a PUT of ``body`` to ``url``."""
    req = urllib.request.Request(url, data=body, method="PUT", headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        return exc.code, text.split("<Code>", 1)[-1].split("</Code>", 1)[0] if "<Code>" in text else ""


def test_urls_die_with_the_controllers_session_are_renewed_and_fall_back_to_the_instance_role(sandbox_env):
    home, state = sandbox_env
    aws, said = _session_aws(), []
    plan = handover.prepare(aws, Settings(handover_wait_seconds=300), RUN, 60, said.append)
    assert plan is not None, said
    # the launch says the credentials end before the run's limit, in one line; the URLs last no longer than they do
    warned = [line for line in said if "credentials expire" in line]  # beside the run store's own lines
    assert len(warned) == 1 and warned[0].startswith("warning: these AWS credentials expire at"), said
    assert plan.expires_at is not None and plan.expires_at <= time.time() + SESSION_S + 1
    assert _put(plan.urls["log"]) == (200, "")
    # a URL asked for an hour, signed with the same session (what the controller did before): only the session's end
    s3 = aws.client("s3")
    long = runstore_objects.presign_puts(s3, plan.bucket, {"log": plan.keys["log"]}, 3600)["log"]
    sent: list[str] = []
    renewal = handover.Renewal(aws, plan, sent.append, said.append)
    time.sleep(SESSION_S + 1.5)
    assert _put(plan.urls["log"]) == (403, "AccessDenied")  # its X-Amz-Expires has passed
    assert _put(long) == (400, "ExpiredToken")  # its session has ended, whatever X-Amz-Expires says
    # the controller's heartbeat: botocore refreshes the session, the URLs are signed again and sent to the head
    assert renewal.renew() and len(sent) == 1 and renewal.plan.expires_at > plan.expires_at
    assert _put(renewal.plan.urls["log"]) == (200, "")

    # a lost controller: the URLs die; the agent signs them again with its instance role, which may write them
    ec2, iam_client, admin = _client("ec2"), _client("iam"), _client("s3")
    user = runstore.user_id(aws.check_credentials())
    policy = iam.handover_policy(plan.bucket, user, RUN)
    name = iam.create_run_role(iam_client, RUN, "test", policy, user=user, region="us-east-1")
    ami = ec2.describe_images(Owners=["898082745236"])["Images"][0]["ImageId"]
    [iid] = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
                                                        IamInstanceProfile={"Name": name})["Instances"]]
    try:
        time.sleep(SESSION_S + 1.5)
        dead = renewal.plan.urls["record"]
        assert _put(dead)[0] in (400, 403)
        assert handover_urls.put_or_role(agent.put, dead, f"{state['imds_url']}/{iid}", bounded_json.loads,
                                         data=b"handed over") is None
        got = admin.get_object(Bucket=plan.bucket, Key=plan.keys["record"])["Body"].read()
        assert got == b"handed over"
        # an instance with no role: refused, and said so
        [bare] = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, InstanceType="g4dn.xlarge", MinCount=1,
                                                             MaxCount=1)["Instances"]]
        try:
            assert handover_urls.put_or_role(agent.put, dead, f"{state['imds_url']}/{bare}", bounded_json.loads, data=b"x") == \
                "HTTP 403, and no instance role to sign it again"
        finally:
            ec2.terminate_instances(InstanceIds=[bare])
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
        iam.delete_run_role(iam_client, name)
        for key in plan.keys.values():
            admin.delete_object(Bucket=plan.bucket, Key=key)
