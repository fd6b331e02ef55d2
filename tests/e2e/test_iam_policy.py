"""Least privilege, proven: every AWS operation a sandbox session calls is allowed by docs/iam-policy.json,
and every request on the run store and the secrets is allowed with its own resource and conditions
(the caller's own prefix and tags: tests/iam_eval.py evaluates it as AWS would)."""
import fnmatch
import json
from pathlib import Path

import pytest
from iam_eval import allowed

from ec2gpu import cli
from ec2gpu.aws.session import Aws
from ec2gpu.runs.provision import bake

pytestmark = pytest.mark.e2e
POLICY = Path(__file__).resolve().parents[2] / "docs" / "iam-policy.json"


def allowed_actions() -> list[str]:
    statements = json.loads(POLICY.read_text())["Statement"]
    return [a for s in statements if s["Effect"] == "Allow" for a in s["Action"]]


#: S3 operations whose IAM action has another name (the Service Authorization Reference for Amazon S3:
#: https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html, and each
#: operation's "Permissions" in the S3 API reference)
S3_ACTIONS = {
    "s3:HeadBucket": "s3:ListBucket", "s3:ListObjectsV2": "s3:ListBucket", "s3:HeadObject": "s3:GetObject",
    "s3:GetPublicAccessBlock": "s3:GetBucketPublicAccessBlock",
    "s3:PutPublicAccessBlock": "s3:PutBucketPublicAccessBlock",
    "s3:GetBucketEncryption": "s3:GetEncryptionConfiguration", "s3:PutBucketEncryption": "s3:PutEncryptionConfiguration",
    "s3:GetBucketLifecycleConfiguration": "s3:GetLifecycleConfiguration",
    "s3:PutBucketLifecycleConfiguration": "s3:PutLifecycleConfiguration",
    "s3:CreateMultipartUpload": "s3:PutObject", "s3:UploadPart": "s3:PutObject", "s3:CompleteMultipartUpload": "s3:PutObject",
}
#: what a session makes that docs/iam-policy.json leaves to an administrator: the run store's bucket
#: settings, since whoever may set its bucket policy may grant themselves every user's runs and whoever
#: may set its lifecycle may expire them (aws/runstore.ensure: a user's refused ones are said, not fatal;
#: the sandbox's one user sets them)
ADMIN_ONLY = {"s3:PutBucketPolicy", "s3:PutLifecycleConfiguration", "s3:PutEncryptionConfiguration",
              "s3:PutBucketPublicAccessBlock"}


class Requests:
    """The run store's and the secrets' requests of a session, as AWS authorises them: (action,
    resource ARN, the request's condition keys), from each call's parameters (botocore's
    before-parameter-build). ``tags``: the ec2gpu:user tag each secret and run role was made with;
    a role passed to EC2 (an instance profile at RunInstances, or in a launch template that a group
    launches) is an iam:PassRole of that role."""

    #: the calls that change or remove a run role or its instance profile: (the resource's kind, the
    #: parameter that names it); each is authorised with that resource's tags
    ROLE_CHANGES = {"PutRolePolicy": ("role", "RoleName"), "DeleteRolePolicy": ("role", "RoleName"),
                    "DetachRolePolicy": ("role", "RoleName"), "DeleteRole": ("role", "RoleName"),
                    "AddRoleToInstanceProfile": ("instance-profile", "InstanceProfileName"),
                    "RemoveRoleFromInstanceProfile": ("instance-profile", "InstanceProfileName"),
                    "DeleteInstanceProfile": ("instance-profile", "InstanceProfileName")}

    def __init__(self, account: str, region: str):
        self.account, self.region, self.seen, self.tags, self.made = account, region, [], {}, {}

    def __call__(self, service: str, model, params, **_) -> None:
        name, bucket, key = model.name, params.get("Bucket", ""), params.get("Key")
        if service == "s3" and bucket.startswith("ec2gpu-"):
            action = S3_ACTIONS.get(f"s3:{name}", f"s3:{name}")
            context = {"s3:ResourceAccount": params.get("ExpectedBucketOwner", self.account)}
            if "Prefix" in params:
                context["s3:prefix"] = params["Prefix"]
            self.seen.append((action, f"arn:aws:s3:::{bucket}" + (f"/{key}" if key is not None else ""), context))
        elif service == "ssm" and name in ("PutParameter", "GetParameters", "DeleteParameters"):
            for parameter in params.get("Names") or [params["Name"]]:
                if not parameter.startswith("/ec2gpu/"):
                    continue
                arn = f"arn:aws:ssm:{self.region}:{self.account}:parameter{parameter}"
                if name == "PutParameter":
                    tag = {t["Key"]: t["Value"] for t in params.get("Tags", [])}.get("ec2gpu:user")
                    self.tags[parameter] = tag
                    request = {} if tag is None else {"aws:RequestTag/ec2gpu:user": tag}
                    self.seen += [("ssm:PutParameter", arn, request), ("ssm:AddTagsToResource", arn, request)]
                else:
                    tag = self.tags.get(parameter)
                    self.seen.append((f"ssm:{name}", arn, {} if tag is None else {"aws:ResourceTag/ec2gpu:user": tag}))
        elif service == "iam" and name in ("CreateRole", "CreateInstanceProfile"):
            kind, key = ("role", "RoleName") if name == "CreateRole" else ("instance-profile", "InstanceProfileName")
            tag = {t["Key"]: t["Value"] for t in params.get("Tags", [])}.get("ec2gpu:user")
            arn = f"arn:aws:iam::{self.account}:{kind}{params.get('Path', '/')}{params[key]}"
            request = ({"iam:PermissionsBoundary": params.get("PermissionsBoundary", "")} if kind == "role" else {}) | (
                {} if tag is None else {"aws:RequestTag/ec2gpu:user": tag})
            # made with Tags: authorised as the Tag* action too, on a resource with no tags yet
            tagging = "iam:TagRole" if kind == "role" else "iam:TagInstanceProfile"
            self.seen += [(f"iam:{name}", arn, request), (tagging, arn, request)]
            self.tags[params[key]] = tag
            self.made[(kind, params[key])] = arn
        elif service == "iam" and name in self.ROLE_CHANGES:
            kind, key = self.ROLE_CHANGES[name]
            arn = self.made.get((kind, params[key]))
            if arn is not None:  # made in this session: its tag is known
                tag = self.tags.get(params[key])
                self.seen.append((f"iam:{name}", arn, {} if tag is None else {"aws:ResourceTag/ec2gpu:user": tag}))
        elif service == "ec2" and name in ("RunInstances", "CreateLaunchTemplate"):
            profile = (params.get("LaunchTemplateData", params).get("IamInstanceProfile") or {}).get("Name")
            if profile:  # the tool's profile has its role's name (aws/iam.create_run_role)
                tag = self.tags.get(profile)
                self.seen.append(("iam:PassRole", f"arn:aws:iam::{self.account}:role/ec2gpu/{profile}",
                                  {"iam:PassedToService": "ec2.amazonaws.com"}
                                  | ({} if tag is None else {"aws:ResourceTag/ec2gpu:user": tag})))


def test_every_operation_of_launch_train_and_cleanup_is_in_the_policy(sandbox_env, torchrun_port, monkeypatch, capsys, tmp_path):
    called: set[str] = set()
    original = Aws.client
    import os

    import boto3

    from ec2gpu.aws import iam as roles
    from ec2gpu.aws import iam_boundary
    identity = boto3.client("sts", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1").get_caller_identity()
    requests = Requests(identity["Account"], "us-east-1")

    def client(self, service, fail_fast=False):
        c = original(self, service, fail_fast)
        if not getattr(c, "_recording", False):
            prefix = c.meta.service_model.signing_name  # the IAM service prefix (ec2, sts, servicequotas, ...)
            c.meta.events.register("before-call", lambda model, **_: called.add(f"{prefix}:{model.name}"))
            c.meta.events.register("before-parameter-build", lambda model, params, p=prefix, **_: requests(p, model, params))
            # DeregisterImage with DeleteAssociatedSnapshots deletes snapshots as ec2:DeleteSnapshot
            # (a snapshot the caller may not delete comes back as ReturnCode missing-permissions)
            c.meta.events.register("before-parameter-build.ec2.DeregisterImage", lambda params, **_: called.add(
                "ec2:DeleteSnapshot") if params.get("DeleteAssociatedSnapshots") else None)
            c._recording = True
        return c
    monkeypatch.setattr(Aws, "client", client)
    task = tmp_path / "task.yaml"
    task.write_text("name: iam\nworkdir: .\nsetup: 'true'\nrun: 'true'\n")
    (tmp_path / "ami").mkdir()  # a driver install that asks for one reboot (no GPU here): RebootInstances too
    (tmp_path / "ami" / "install-cuda.sh").write_text('[ -f "$HOME/b" ] && exit 0; touch "$HOME/b"; exit 100\n')
    (tmp_path / "ami" / "clean-for-image.sh").write_text((bake.AMI_DIR / "clean-for-image.sh").read_text())
    monkeypatch.setattr(bake, "AMI_DIR", tmp_path / "ami")
    for argv in (["prices", "--sandbox"], ["cost", "--sandbox", "--spot"],
                 ["train", "mnist", "--sandbox", "--trainer-arg=--train-subset=2000"],
                 ["train", "mnist", "--sandbox", "--nodes", "2", "--trainer-arg=--train-subset=2000"],
                 ["run", "--sandbox", "--expect", "1m", "--workdir", str(tmp_path), "--", "true"],
                 ["launch", "--sandbox", "--spot", "--name", "iam"], ["doctor", "--sandbox", "--spot"],
                 ["exec", "iam", "--sandbox", "--workdir", str(tmp_path), "--", "true"],
                 ["ls", "--sandbox"], ["ssh-config", "--sandbox"],
                 ["launch", "--sandbox", "--name", "iamd"], ["stop", "iamd", "--sandbox"], ["ls", "--sandbox"],
                 ["start", "iamd", "--sandbox"], ["down", "iamd", "--sandbox"],
                 ["launch", "--sandbox", "--nodes", "2", "--name", "iamc"], ["scale", "iamc", "3", "--sandbox"],
                 ["scale", "iamc", "1", "--sandbox"], ["down", "iamc", "--sandbox"],
                 ["image", "bake", str(task), "--sandbox", "--from", "ubuntu-24.04", "--name", "iam-image"],
                 ["image", "ls", "--sandbox"], ["image", "rm", "iam-image", "--sandbox"],
                 ["cleanup", "--sandbox", "--dry-run"], ["cleanup", "--sandbox"], ["down", "--all", "--sandbox"]):
        assert cli.main(argv) == 0, argv
    capsys.readouterr()
    # a detached run (issue 30): its store, role, template, group and secret; followed and cancelled
    monkeypatch.setenv("IAM_SECRET", "s3cret")
    assert cli.main(["run", "--sandbox", "--detach", "--max-runtime", "10m", "--json", "--workdir", str(tmp_path),
                     "--secret", "IAM_SECRET", "--", "sleep", "60"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    for argv in (["status", run_id, "--sandbox"], ["runs", "--remote", "--sandbox"],
                 ["cancel", run_id, "--sandbox", "--wait", "0"],
                 ["doctor", "--sandbox"]):
        assert cli.main(argv) == 0, argv
    capsys.readouterr()
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:GetConsoleOutput", "sts:GetCallerIdentity",
            "ec2:CreatePlacementGroup", "ec2:CreateTags", "ec2:DescribePlacementGroups", "iam:GetRole",
            "ssm:GetParametersByPath", "ec2:StopInstances", "ec2:StartInstances", "ec2:DescribeVolumes", "ec2:CreateImage",
            "ec2:DeregisterImage", "ec2:DeleteSnapshot", "ec2:DescribeSnapshots", "ec2:RebootInstances",
            "ssm:GetParameter", "autoscaling:CreateAutoScalingGroup", "autoscaling:DeleteAutoScalingGroup",
            "ec2:CreateLaunchTemplate", "s3:PutObject", "iam:CreateRole", "ssm:PutParameter",
            "ssm:DescribeParameters", "ssm:DeleteParameters"} <= called  # the bucket may exist already
    patterns = allowed_actions()
    actions = {S3_ACTIONS.get(a, a) for a in called}
    missing = sorted(a for a in actions - ADMIN_ONLY if not any(fnmatch.fnmatchcase(a, p) for p in patterns))
    assert not missing, f"called but not allowed by {POLICY.name}: {missing}"
    # each run-store, secret and run-role request with its own resource and conditions, as this caller
    # (${aws:userid}: STS's UserId) makes it: its own prefix, its secrets and roles tagged with its own id
    policy = json.loads(POLICY.read_text())
    caller = {"aws:userid": identity["UserId"], "aws:PrincipalAccount": identity["Account"]}
    assert {a for a, _, _ in requests.seen} >= {"s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation",
                                                "ssm:PutParameter", "ssm:DeleteParameters", "iam:CreateRole",
                                                "iam:PassRole", "iam:PutRolePolicy", "iam:CreateInstanceProfile",
                                                "iam:AddRoleToInstanceProfile", "iam:DeleteRole",
                                                "iam:DeleteInstanceProfile"}
    boundary = f"arn:aws:iam::{identity['Account']}:policy{roles.PATH}{iam_boundary.BOUNDARY_NAME}"
    under = ("iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy")  # IAM fills in the role's boundary
    refused = sorted({(a, r, json.dumps(c)) for a, r, c in requests.seen if a not in ADMIN_ONLY and not allowed(
        policy, (a, r, {**caller, **c, **({"iam:PermissionsBoundary": boundary} if a in under else {})}))})
    assert not refused, f"made but refused by {POLICY.name}: {refused[:10]}"
