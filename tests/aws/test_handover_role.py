"""A run in the foreground whose task has S3 file_mounts gets a role that may also write its own
hand-over objects (issue 51, item 2: the agent signs a refused hand-over URL again with it), and
only those of the run store; without a hand-over, it gets the file_mounts policy alone
(runs/provision/resources._instance_role, against the sandbox's IAM)."""
import json
from types import SimpleNamespace

import pytest

from ec2gpu.aws import iam, runstore
from ec2gpu.runs.job import Provisioned
from ec2gpu.runs.provision import resources
from ec2gpu.settings import Settings

POLICY = iam.s3_policy([("data-bucket", "train/")], [])
RUN = "20260103-040506-beef"


@pytest.mark.parametrize("wait_s", [300, 0])
def test_a_foreground_run_role_may_write_its_own_hand_over_objects_and_no_others(aws, monkeypatch, wait_s):
    job = SimpleNamespace(mounts=[SimpleNamespace(kind="s3", url="s3://data-bucket/train/", write_back=False)],
                          role_policy=POLICY, role_boundary=None, buckets_to_make=[])
    monkeypatch.setattr(resources, "_job", lambda opts: job)
    monkeypatch.setattr(resources, "_bake", lambda opts: None)
    prov, said = Provisioned(RUN), []
    ui = SimpleNamespace(note=said.append)
    resources._instance_role(aws, Settings(handover_wait_seconds=wait_s), SimpleNamespace(), RUN, prov, ui)
    client = aws.client("iam")
    try:
        doc = client.get_role_policy(RoleName=prov.instance_profile, PolicyName=iam.POLICY_NAME)["PolicyDocument"]
        doc = json.loads(doc) if isinstance(doc, str) else doc
        identity = aws.check_credentials()
        bucket = runstore.bucket_name(identity["Account"], aws.region)
        prefix = runstore.prefix(runstore.user_id(identity), RUN)
        if wait_s:
            assert doc["Statement"] == POLICY["Statement"] + [
                {"Sid": "HandOver", "Effect": "Allow", "Action": ["s3:AbortMultipartUpload", "s3:PutObject"],
                 "Resource": f"arn:aws:s3:::{bucket}/{prefix}handover/*"}]
            assert "writes its own hand-over objects in the run store" in said[-1]
        else:
            assert doc == POLICY and "hand-over" not in said[-1]
    finally:
        iam.delete_run_role(client, prov.instance_profile)
