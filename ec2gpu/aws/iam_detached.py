"""A detached run's instance role: its own run's prefix of the run bucket and its own Auto Scaling
group, nothing else (issue 30, item 6).

``detached_policy`` is the role's inline policy, built by a pure function from one statement
builder per grant, each citing what it allows and why; aws/iam.create_run_role makes the role with
it (``combined`` with the file_mounts policy, aws/iam.s3_policy, when the run has S3 file_mounts).
The permissions boundary docs/iam-instance-boundary.json holds every run role to the same, through
the role's own ``ec2gpu:run`` and ``ec2gpu:user`` tags (iam_boundary.py; docs/security.md, "A
detached run's instance reaches only its own run").
"""
from __future__ import annotations

import re
from typing import Any, Callable

import botocore.exceptions

from ..errors import UsageError
from ..wire import bounded_json
from . import iam_match, runstore
from .iam import check_bucket
from .session import error_code
from .tags import RUN, USER

#: run ids as runs/provision/pipeline.new_run_id makes them: YYYYmmdd-HHMMSS-xxxx (UTC; 4 lowercase hex)
_RUN_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{4}")
#: AWS region names (us-east-1, ap-southeast-2, us-gov-west-1): lowercase words and a number
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
#: AWS account ids: 12 digits
_ACCOUNT = re.compile(r"[0-9]{12}")
#: a detached run's group and launch template are named GROUP_PREFIX + RUN_ID (aws/groups.PREFIX and
#: name_of; not imported, so that groups.py may import this module; tests/unit/test_detached_policy.py
#: checks that the two agree)
GROUP_PREFIX = "ec2gpu-"


def run_prefix(user: str, run_id: str) -> str:
    """The key prefix of run ``run_id`` of the user ``user`` in the run bucket,
    ``runs/USER_ID/RUN_ID/`` (aws/runstore.prefix, pure). Raises UsageError for a run id not of the
    form new_run_id makes (``check_run_id``) or a user id not of aws/runstore.USER_ID's."""
    return runstore.prefix(user, check_run_id(run_id))


def check_run_id(run_id: str) -> str:
    """``run_id`` if it has the form runs/provision/pipeline.new_run_id makes, YYYYmmdd-HHMMSS-xxxx
    (UTC date and time, 4 lowercase hex digits: ASCII only, nothing else), else UsageError. What
    such an id cannot hold is the point: no ``*``, ``?``, ``$``, ``/`` or ``..``, so a prefix or
    group name made from it is one run's and matches nothing else in an IAM pattern."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise UsageError(f"{str(run_id)[:80]!r} is not a run id",
                         "a run id is YYYYmmdd-HHMMSS-xxxx (UTC, 4 lowercase hex digits), as `ec2gpu runs` lists them")
    return run_id


def detached_policy(bucket: str, run_id: str, group_name: str, region: str, account_id: str,
                    secrets: bool = False, several: bool = False, *, user: str) -> dict[str, Any]:
    """The inline policy of a detached run's instance role (pure): the agent may read and write
    its own run's objects, list its own run's prefix, and end its own Auto Scaling group; nothing
    else (issue 30, item 6). Give it to ``create_run_role`` as ``policy`` (with a file_mounts
    policy too: ``combined(detached_policy(...), s3_policy(...))``).

    ``bucket``: the run bucket (``ec2gpu-ACCOUNT-REGION``); ``run_id``: YYYYmmdd-HHMMSS-xxxx;
    ``group_name``: the run's group, which must be ``ec2gpu-RUN_ID`` (aws/groups.name_of);
    ``region``: the group's region (e.g. us-east-1); ``account_id``: 12 digits; ``user``: the
    user id of whoever starts the run (aws/runstore.user_id), whose prefix ``runs/USER_ID/`` holds it.

    Returns {"Version": "2012-10-17", "Statement": [...]} with, in order (each builder says what
    its statements allow, and why): "RunObjects", "PruneOwnCheckpoints" and "ListRunPrefix"
    (``_run_object_statements``); "EndOwnGroup", "LowerOwnGroup" and, with ``several`` (a run of
    several nodes: agent/gang.py), "ReplaceOwnNodes" (``_own_group_statements``); with ``secrets``
    (the run carries --secret values: aws/parameters.py), "ReadOwnSecrets"
    (``_own_secrets_statement``).

    Actions, resource types and condition keys: the Service Authorization Reference for Amazon S3
    (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html; the
    s3:prefix key: https://docs.aws.amazon.com/AmazonS3/latest/userguide/amazon-s3-policy-keys.html)
    and for Amazon EC2 Auto Scaling
    (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2autoscaling.html:
    the autoScalingGroup resource type and its ARN; autoscaling:ResourceTag/${TagKey},
    autoscaling:MinSize and autoscaling:MaxSize on UpdateAutoScalingGroup; SetInstanceHealth on
    autoScalingGroup, with autoscaling:ResourceTag/${TagKey}).
    autoscaling:DescribeAutoScalingGroups is left out: it has no resource-level permissions (that
    reference lists no resource type for it, so it could only be granted on ``*``), and it would
    show every group of the account and region, their tags (other runs' ids and owners),
    instances, templates and subnets. The agent needs none of that: its group's name is
    ``ec2gpu-RUN_ID``, which it knows.

    Raises UsageError (with a hint) for a bucket name S3 does not allow (``check_bucket``), a run id
    not of the form above (``check_run_id``), a user id not of aws/runstore.USER_ID's, a group name
    other than ``ec2gpu-RUN_ID``, a region or an account id that is not one: so no ``*``, ``?``,
    ``$``, ``/`` or another prefix can reach a Resource or a condition value.
    """
    try:
        check_bucket(bucket)
    except ValueError as exc:
        raise UsageError(str(exc), "the run bucket is ec2gpu-ACCOUNT-REGION (`ec2gpu doctor` checks it)") from None
    prefix = run_prefix(user, run_id)
    _check_group_region_account(run_id, group_name, region, account_id)
    arn = f"arn:{runstore.partition(region)}"  # aws-cn, aws-us-gov: their ARNs say so
    group = f"{arn}:autoscaling:{region}:{account_id}:autoScalingGroup:*:autoScalingGroupName/{group_name}"
    statements = _run_object_statements(arn, bucket, prefix, account_id) + _own_group_statements(group, run_id, several)
    if secrets:
        statements.append(_own_secrets_statement(arn, region, account_id, run_id, user))
    return {"Version": "2012-10-17", "Statement": statements}


def _check_group_region_account(run_id: str, group_name: str, region: str, account_id: str) -> None:
    """Raise UsageError for a group name other than ``ec2gpu-RUN_ID``, a region or an account id
    that is not one (pure)."""
    if group_name != f"{GROUP_PREFIX}{run_id}":
        raise UsageError(f"{str(group_name)[:80]!r} is not the group of run {run_id}",
                         f"a detached run's group is named {GROUP_PREFIX}{run_id} (aws/groups.name_of)")
    if not isinstance(region, str) or not _REGION.fullmatch(region):
        raise UsageError(f"{str(region)[:40]!r} is not an AWS region", "e.g. --region us-east-1")
    if not isinstance(account_id, str) or not _ACCOUNT.fullmatch(account_id):
        raise UsageError(f"{str(account_id)[:40]!r} is not an AWS account id", "12 digits, as sts get-caller-identity says")


def _run_object_statements(arn: str, bucket: str, prefix: str, account_id: str) -> list[dict[str, Any]]:
    """The run's own objects (pure; ``arn``: "arn:PARTITION", ``prefix``: ``runs/USER_ID/RUN_ID/``):

    - "RunObjects": s3:AbortMultipartUpload, s3:GetObject, s3:PutObject on
      ``arn:aws:s3:::BUCKET/runs/USER_ID/RUN_ID/*`` only. PutObject also covers a multipart upload's
      Create/UploadPart/Complete, and HeadObject is authorised as GetObject. The agent replaces a
      file (state.json, the log) by putting the same key again, which S3 overwrites. No
      s3:GetBucketLocation: the agent's client is made for the run's region, which is the
      bucket's (its name says so).
    - "PruneOwnCheckpoints": s3:DeleteObject on ``arn:aws:s3:::BUCKET/runs/USER_ID/RUN_ID/checkpoints/*``
      only (same account condition): the agent mirrors the job's checkpoint directory, so a
      checkpoint the job removed (it keeps its last N) goes from S3 too, and a replacement does
      not download every checkpoint ever written. Nothing else of the run may be deleted by it:
      its spec, workdir, log, outputs and status stay until the user or the lifecycle rule
      removes them.
    - "ListRunPrefix": s3:ListBucket on ``arn:aws:s3:::BUCKET`` only when the request's
      ``s3:prefix`` is ``runs/USER_ID/RUN_ID/`` or under it (StringLike; a listing with no
      prefix, or with ``runs/``, the user's ``runs/USER_ID/`` or another run's prefix, has no match
      and is refused).
    - Each also requires ``s3:ResourceAccount`` = ``account_id``: a bucket of that name in another
      account (one made first by someone else: bucket names are global and this one is
      predictable) is refused rather than written to.
    """
    in_account = {"s3:ResourceAccount": account_id}
    return [
        {"Sid": "RunObjects", "Effect": "Allow", "Action": ["s3:AbortMultipartUpload", "s3:GetObject", "s3:PutObject"],
         "Resource": f"{arn}:s3:::{bucket}/{prefix}*", "Condition": {"StringEquals": in_account}},
        {"Sid": "PruneOwnCheckpoints", "Effect": "Allow", "Action": ["s3:DeleteObject"],
         "Resource": f"{arn}:s3:::{bucket}/{prefix}checkpoints/*", "Condition": {"StringEquals": in_account}},
        {"Sid": "ListRunPrefix", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"{arn}:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}, "StringEquals": in_account}},
    ]


def _own_group_statements(group: str, run_id: str, several: bool) -> list[dict[str, Any]]:
    """The run's own Auto Scaling group ``group`` (its ARN) (pure):

    - "EndOwnGroup": autoscaling:UpdateAutoScalingGroup on the group's ARN
      ``arn:aws:autoscaling:REGION:ACCOUNT:autoScalingGroup:*:autoScalingGroupName/GROUP`` (the
      ``*`` is the group's id, which AWS assigns) AND only when the group carries the tag
      ``ec2gpu:run`` = RUN_ID (``autoscaling:ResourceTag/ec2gpu:run``) AND only when the request
      sets MinSize and MaxSize to 0 (``autoscaling:MinSize``/``autoscaling:MaxSize``, NumericEquals):
      the role can end its group (aws/groups.end), never grow it or change what it launches.
    - "LowerOwnGroup": autoscaling:SetDesiredCapacity on the same group, same tag. The group's
      MaxSize bounds it (the run's size, or 0 once ended), which only the user's credentials and
      the deadline action set.
    - With ``several`` (a run of several nodes: agent/gang.py), "ReplaceOwnNodes":
      autoscaling:SetInstanceHealth on the same group, same tag: a node whose agent has gone
      silent while its instance runs is set Unhealthy by another, and the group terminates and
      replaces it ("Amazon EC2 Auto Scaling terminates and replaces the unhealthy instance":
      https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_SetInstanceHealth.html). Any
      instance of its own group only; the launch cap and the deadline still bound the launches.
    """
    tagged = {f"autoscaling:ResourceTag/{RUN}": run_id}
    statements: list[dict[str, Any]] = [
        {"Sid": "EndOwnGroup", "Effect": "Allow", "Action": ["autoscaling:UpdateAutoScalingGroup"], "Resource": group,
         "Condition": {"StringEquals": tagged,
                       "NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}}},
        {"Sid": "LowerOwnGroup", "Effect": "Allow", "Action": ["autoscaling:SetDesiredCapacity"], "Resource": group,
         "Condition": {"StringEquals": tagged}},
    ]
    if several:
        statements.append({"Sid": "ReplaceOwnNodes", "Effect": "Allow", "Action": ["autoscaling:SetInstanceHealth"],
                           "Resource": group, "Condition": {"StringEquals": tagged}})
    return statements


def _own_secrets_statement(arn: str, region: str, account_id: str, run_id: str, user: str) -> dict[str, Any]:
    """"ReadOwnSecrets" (pure): ssm:GetParameters on
    ``arn:aws:ssm:REGION:ACCOUNT:parameter/ec2gpu/runs/RUN_ID/*`` only (a parameter's ARN is its path:
    https://docs.aws.amazon.com/systems-manager/latest/userguide/sysman-paramstore-access.html),
    and only those tagged ``ec2gpu:user`` = USER_ID (``aws:ResourceTag``: aws/parameters.put tags
    them so; another user could make a parameter under this run's path, never with this tag).
    No kms:Decrypt: the parameters use the AWS managed key aws/ssm, whose key policy lets every
    principal of the account decrypt through SSM; the resource and the tag are what scope the role."""
    return {"Sid": "ReadOwnSecrets", "Effect": "Allow", "Action": ["ssm:GetParameters"],
            "Resource": f"{arn}:ssm:{region}:{account_id}:parameter/ec2gpu/runs/{run_id}/*",
            "Condition": {"StringEquals": {f"aws:ResourceTag/{USER}": user}}}


# --- the account's default key for EBS, as Auto Scaling's service-linked role meets it ------------

#: the AWS managed key for EBS: what GetEbsDefaultKmsKeyId answers in an account that never named
#: another (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GetEbsDefaultKmsKeyId.html)
EBS_AWS_MANAGED = "alias/aws/ebs"
#: Auto Scaling's service-linked role (under the account's ARN), which launches a detached run's
#: instances and creates their encrypted volumes: it may use the AWS managed key, a customer managed
#: one only where that key's policy lets it (kms:Encrypt, Decrypt, ReEncrypt*, GenerateDataKey*,
#: DescribeKey, and kms:CreateGrant for AWS resources) or a grant does; else each launch fails with
#: Client.InternalError (https://docs.aws.amazon.com/autoscaling/ec2/userguide/key-policy-requirements-EBS-encryption.html)
AUTOSCALING_ROLE = "role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
#: the operations of a grant that lets that role use a key (the page above, cross-account example)
AUTOSCALING_GRANT = ("Encrypt", "Decrypt", "ReEncryptFrom", "ReEncryptTo", "GenerateDataKey",
                     "GenerateDataKeyWithoutPlaintext", "DescribeKey", "CreateGrant")
_REFUSED = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})
#: a key policy is 32 KB at most (https://docs.aws.amazon.com/kms/latest/developerguide/resource-limits.html)
MAX_KEY_POLICY_BYTES = 32 * 1024


def autoscaling_role_arn(account_id: str, region: str) -> str:
    """The ARN of Auto Scaling's service-linked role in ``account_id``, in ``region``'s partition (pure)."""
    return f"arn:{runstore.partition(region)}:iam::{account_id}:{AUTOSCALING_ROLE}"


def key_lets(policy: dict[str, Any] | None, grants: list[dict[str, Any]] | None, role: str) -> bool | None:
    """Whether a KMS key lets ``role`` (an ARN) launch volumes with it (pure): Allow statements of
    the key's ``policy`` (its document as GetKeyPolicy answers) whose Principal names ``role`` (or
    is ``*``) give it kms:Decrypt and kms:CreateGrant, in one statement or two (AWS's page puts
    CreateGrant in a second one, under kms:GrantIsForAWSResource, which Auto Scaling's use meets:
    conditions are not read), or one of its ``grants`` (ListGrants') to ``role`` holds CreateGrant
    and Decrypt. None when neither could be read."""
    if policy is None and grants is None:
        return None
    given: set[str] = set()
    for st in iam_match.statements(policy or {}):
        principal = st.get("Principal")
        names = ["*"] if principal == "*" else iam_match.listed(principal.get("AWS")) if isinstance(principal, dict) else []
        if st.get("Effect") == "Allow" and ("*" in names or role in names):
            given |= {a for a in ("kms:decrypt", "kms:creategrant") if iam_match.names_action(st, a)}
    if given == {"kms:decrypt", "kms:creategrant"}:
        return True
    return any(g.get("GranteePrincipal") == role and {"CreateGrant", "Decrypt"} <= set(g.get("Operations") or [])
               for g in grants or [] if isinstance(g, dict))


def check_ebs_key(ec2: Any, kms: Any, account_id: str, region: str, log: Callable[[str], None]) -> None:
    """Before a detached run makes anything: the account's default key for EBS encryption
    (GetEbsDefaultKmsKeyId), which encrypts its instances' volumes (aws/instances.run_request names
    none), is the AWS managed one, or a customer managed one that Auto Scaling's service-linked role
    may use (key_lets: its key policy, GetKeyPolicy, or a grant, ListGrants). Raises UsageError,
    with the grant that is needed, when the key's policy and grants were read and let it not (each
    launch would fail with Client.InternalError and the run end); ``log`` hears a warning naming the
    grant when these credentials may not read them. Raises botocore's ClientError for other errors."""
    def read(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) in _REFUSED:
                return None
            raise
    got = read(lambda: ec2.get_ebs_default_kms_key_id())
    key = str((got or {}).get("KmsKeyId") or "")
    if got is not None and (key == EBS_AWS_MANAGED or key.endswith(":" + EBS_AWS_MANAGED)):
        return
    meta = read(lambda: kms.describe_key(KeyId=key)["KeyMetadata"]) if key else None
    if meta is not None and meta.get("KeyManager") == "AWS":
        return
    arn, role = str((meta or {}).get("Arn") or key), autoscaling_role_arn(account_id, region)
    raw = read(lambda: kms.get_key_policy(KeyId=arn, PolicyName="default")["Policy"]) if key else None
    try:
        policy = bounded_json.loads(raw, max_bytes=MAX_KEY_POLICY_BYTES) if isinstance(raw, str) else None
    except ValueError:
        policy = None
    grants = read(lambda: kms.list_grants(KeyId=arn).get("Grants", [])) if key else None
    lets = key_lets(policy if isinstance(policy, dict) else None, grants, role)
    if lets:
        return
    grant = (f"aws kms create-grant --region {region} --key-id {arn or 'KEY'} --grantee-principal {role} "
             f"--operations {' '.join(AUTOSCALING_GRANT)}")
    page = "https://docs.aws.amazon.com/autoscaling/ec2/userguide/key-policy-requirements-EBS-encryption.html"
    if lets is None:
        what = (f"the key policy and grants of {arn}, the account's default key for EBS encryption," if key else
                "the account's default key for EBS encryption (ec2:GetEbsDefaultKmsKeyId)")
        log(f"warning: could not read {what} here: if it is a customer managed key that Auto Scaling's service-linked "
            f"role may not use, every launch fails (Client.InternalError); its administrator lets it: {grant} ({page})")
        return
    raise UsageError(f"the account's default key for EBS encryption, {arn}, is a customer managed key that Auto Scaling's "
                     f"service-linked role may not use (neither its key policy nor a grant lets {role}): every launch "
                     "of a detached run would fail (Client.InternalError)",
                     f"the key's administrator gives it once: {grant} (or the key policy statements of {page}); "
                     "or run in the foreground (no --detach: your own credentials launch the instance)")
