"""A detached run's secrets (``--secret``, a task's ``secrets``) in SSM Parameter Store.

A detached run's instances are launched by its Auto Scaling group, with nobody watching (issue 30,
item 8), so a secret cannot reach them over SSH as it does in a run in the foreground, and it must
not lie in S3 (the run's prefix holds its spec, workdir and log) or in the launch template's user
data (anyone who may describe launch templates reads it). Each secret is a ``SecureString``
parameter of its own, ``/ec2gpu/runs/RUN_ID/NAME`` (NAME: the environment variable), encrypted with
the account's AWS managed key ``aws/ssm``, and tagged at creation with the run (``ec2gpu:run``) and
the user id of whoever made it (``ec2gpu:user``: STS's UserId, the value of ``${aws:userid}``,
aws/runstore.user_id). The agent reads them at each launch into the job's environment and nowhere
else, and the sweep (aws/sweep.py) deletes them with the run's other resources.

Who may read them (GetParameters with decryption):

- the run's instance role: its own run's only (``ssm:GetParameters`` on
  ``parameter/ec2gpu/runs/RUN_ID/*`` and only parameters tagged with its own ``ec2gpu:user``:
  aws/iam_detached.detached_policy; the permissions boundary docs/iam-instance-boundary.json holds every run
  role to the same through the role's own tags);
- the user who made them, and no other user held by docs/iam-policy.json: that policy allows
  ``ssm:PutParameter`` only with the tag ``ec2gpu:user`` = ``${aws:userid}``, and GetParameters,
  DeleteParameters and AddTagsToResource only on parameters so tagged (AddTagsToResource also on
  one with no tags yet, as SSM authorises the Tags of a PutParameter, but never on one of a run from
  before this tag: ``ec2gpu:run`` without ``ec2gpu:user``, which the policy denies; tag-based access: a
  parameter name cannot hold a role session's user id, ``AROA...:NAME``, whose ":" SSM refuses in a
  name: https://docs.aws.amazon.com/systems-manager/latest/userguide/sysman-paramstore-su-create.html#sysman-parameter-name-constraints);
- and whoever the account's own policies allow: an administrator, or any principal with
  ``ssm:GetParameters`` on them. The AWS managed key lets every principal of the account decrypt
  through SSM (https://docs.aws.amazon.com/systems-manager/latest/userguide/ps-restrict-decryption.html),
  so KMS keeps no one out: what does is the IAM policies' resources and tags.

Condition keys: ``aws:RequestTag/${TagKey}`` on PutParameter and AddTagsToResource,
``aws:ResourceTag/${TagKey}`` on GetParameters, DeleteParameters and AddTagsToResource (the Service
Authorization Reference for Systems Manager:
https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html).

Why Parameter Store: standard parameters cost nothing to store (Secrets Manager bills each secret
per month), its ARNs carry the parameter's path so a role is scoped to one run by resource, and it
is in every region.

Limits (https://docs.aws.amazon.com/systems-manager/latest/userguide/parameter-store-advanced-parameters.html):
a standard parameter's value is 4 KB at most (MAX_VALUE_BYTES), its name 1011 characters; a value
must not be empty (empty secrets stay in the spec's envs: they hold nothing).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable

from ..errors import UsageError
from . import tags

if TYPE_CHECKING:  # a name only: a run's plan checks its secrets here without the AWS SDK (runs/plan/checks.py)
    from .session import Client

#: the path every run's parameters live under; a run's own: ROOT + RUN_ID + "/"
ROOT = "/ec2gpu/runs/"
#: who may read a detached run's secrets, as the messages that name them say it (the module docstring)
READERS = ("only this run's instance role and you may read them, and whoever your account's own policies allow "
           "(an administrator): docs/security.md")
#: a standard parameter's value, in bytes (the page in the module docstring)
MAX_VALUE_BYTES = 4096
#: GetParameters and DeleteParameters take 10 names a call (the SSM API reference)
BATCH = 10
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_NAME = re.compile(r"/ec2gpu/runs/(\d{8}-\d{6}-[0-9a-f]{4})/([A-Za-z_][A-Za-z0-9_]{0,127})")


def name_of(run_id: str, env_name: str) -> str:
    """The parameter that holds ``env_name``'s value for run ``run_id`` (pure). Raises UsageError
    for a run id or an environment variable name that is not one (so nothing leaves the run's path)."""
    # here, not at the top: iam_detached loads botocore (through aws/iam), and a dry run imports this module
    # (test_dry_run's test_a_dry_run_imports_no_aws_sdk)
    from .iam_detached import check_run_id
    check_run_id(run_id)
    if not _ENV_NAME.fullmatch(env_name):
        raise UsageError(f"{env_name[:80]!r} is not an environment variable name",
                         "a secret's name is letters, digits and _, not starting with a digit")
    return f"{ROOT}{run_id}/{env_name}"


def check_values(values: dict[str, str]) -> None:
    """Raise UsageError (nothing made yet) when a value is over MAX_VALUE_BYTES (UTF-8) or a name is
    not an environment variable's."""
    for k, v in values.items():
        if not _ENV_NAME.fullmatch(k):
            raise UsageError(f"the secret {k[:80]!r} is not an environment variable name", "rename it")
        size = len(v.encode())
        if size > MAX_VALUE_BYTES:
            raise UsageError(f"the secret {k} is {size:,} bytes; a detached run carries secrets of "
                             f"{MAX_VALUE_BYTES:,} bytes at most (an SSM standard parameter)",
                             "keep a larger secret in AWS Secrets Manager and read it from the job, or drop --detach")


def put(ssm: Client, run_id: str, owner: str, user: str, values: dict[str, str]) -> list[str]:
    """Store each of ``values`` (env name -> non-empty value) as a SecureString parameter of run
    ``run_id``, tagged with the run, ``owner`` (tags.tag_value) and ``user`` (the caller's user id,
    aws/runstore.user_id: docs/iam-policy.json lets the caller read and delete only parameters
    tagged with it); return the parameter names, in ``values``' order. Raises UsageError
    (check_values, name_of, a bad user id) before any is stored, and botocore's ClientError as SSM
    answers (ParameterAlreadyExists for a run id used before: never overwritten)."""
    from .runstore import check_user_id  # botocore: not at the top, as name_of's import says
    check_values(values)
    names = [name_of(run_id, k) for k in values]
    # the owner as SSM takes a tag value (ValidationException for DOMAIN\user), as the run store's
    parameter_tags = [{"Key": tags.RUN, "Value": run_id}, {"Key": tags.OWNER, "Value": tags.tag_value(owner)},
                      {"Key": tags.USER, "Value": check_user_id(user)}]
    for name, value in zip(names, values.values(), strict=True):
        ssm.put_parameter(Name=name, Value=value, Type="SecureString", Tier="Standard", Tags=parameter_tags,
                          Description="ec2gpu: a detached run's secret, read by its instance role")
    return names


def read(ssm: Client, run_id: str, names: list[str]) -> dict[str, str]:
    """The values of run ``run_id``'s secrets ``names`` (GetParameters, decrypted, BATCH a call):
    env name -> value, those SSM holds (a missing one is left out). Raises UsageError for a name
    that is not one (name_of), botocore's ClientError as SSM answers."""
    full = {name_of(run_id, n): n for n in names}
    keys = list(full)
    out: dict[str, str] = {}
    for i in range(0, len(keys), BATCH):
        for p in ssm.get_parameters(Names=keys[i:i + BATCH], WithDecryption=True).get("Parameters", []):
            if p.get("Name") in full and isinstance(p.get("Value"), str):
                out[full[p["Name"]]] = p["Value"]
    return out


def find(ssm: Client, run_id: str | None = None, user: str | None = None) -> list[dict[str, Any]]:
    """The runs' secret parameters (one run's with ``run_id``; with ``user``, only those tagged
    ``ec2gpu:user`` = ``user``, the ones that user may delete: ``put``): [{"id": parameter name,
    "run_id", "name": the environment variable}], read from their names (a parameter elsewhere, or
    whose name is not ROOT/RUN_ID/NAME, is never listed). Raises botocore's ClientError."""
    path = ROOT.rstrip("/") if run_id is None else f"{ROOT}{run_id}"
    option = "Recursive" if run_id is None else "OneLevel"
    filters = [{"Key": "Path", "Option": option, "Values": [path]}]
    if user is not None:  # DescribeParameters' tag:KEY filter (the SSM API reference, ParameterStringFilter)
        filters.append({"Key": f"tag:{tags.USER}", "Option": "Equals", "Values": [user]})
    out = []
    for page in ssm.get_paginator("describe_parameters").paginate(ParameterFilters=filters):
        for p in page.get("Parameters", []):
            m = _NAME.fullmatch(str(p.get("Name", "")))
            if m and (run_id is None or m.group(1) == run_id):
                out.append({"id": m.group(0), "run_id": m.group(1), "name": m.group(2)})
    return out


def delete(ssm: Client, names: list[str], log: Callable[[str], None] = lambda msg: None) -> list[str]:
    """Delete the parameters ``names`` (BATCH a call); return those deleted or already gone.
    Raises botocore's ClientError."""
    done = []
    for i in range(0, len(names), BATCH):
        batch = names[i:i + BATCH]
        log(f"deleting secret parameter(s) {', '.join(batch)}")
        got = ssm.delete_parameters(Names=batch)
        done += list(got.get("DeletedParameters", [])) + list(got.get("InvalidParameters", []))
    return done
