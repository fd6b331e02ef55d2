"""Instance roles in the sandbox: which role an instance has, and that role's temporary credentials.

On EC2 an instance launched with ``IamInstanceProfile`` gets the credentials of the profile's role
from its metadata service (imds.py), session name = the instance id
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/iam-roles-for-amazon-ec2.html). Here:

- ``install()`` patches moto's RunInstances so every instance of the reservation is associated
  with the profile (moto 5.2.5 associates only the first; EC2 gives it to all MinCount of them);
- ``role_of(instance_id)`` is the ARN of the role in the profile associated with the instance,
  None when there is none, or when the role was removed from the profile or the profile deleted
  (EC2's metadata service then answers 404);
- ``mint(instance_id, role_arn)`` assumes that role in moto's STS (ASIA... keys, one hour), refusing
  a role whose trust policy does not let ec2.amazonaws.com assume it, as EC2 refuses it
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_iam-ec2.html).

moto does not enforce IAM policies by default, so the credentials reach every sandbox service.
"""
from __future__ import annotations

import json
from datetime import timezone

#: seconds the credentials of an instance role last (EC2's last up to 6 h and are rotated;
#: an hour is what botocore's refresh needs to be exercised without waiting for it)
DURATION_S = 3600

#: variables that hand an AWS SDK credentials or steer it to another source of them than the
#: instance's own metadata service: an instance never gets them from this machine
#: (https://docs.aws.amazon.com/sdkref/latest/guide/environment-variables.html)
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                   "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
                   "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                   "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN")


def install() -> None:
    """Patch moto's RunInstances response so each instance it launches gets the instance profile
    (call in the daemon after importing moto)."""
    from moto.ec2.responses.instances import InstanceResponse

    original = InstanceResponse.run_instances

    def run_instances(self):
        result = original(self)
        name, arn = self._get_param("IamInstanceProfile.Name"), self._get_param("IamInstanceProfile.Arn")
        if name or arn:
            for inst in result.result.instances:  # type: ignore[attr-defined]  # moto's handler associated instances[0] only
                if inst.id not in self.ec2_backend.iam_instance_profile_associations:
                    self.ec2_backend.associate_iam_instance_profile(
                        instance_id=inst.id, iam_instance_profile_name=name, iam_instance_profile_arn=arn)
        return result

    InstanceResponse.run_instances = run_instances


def _association(instance_id: str):
    """(moto's IamInstanceProfileAssociation, its account, its region) for ``instance_id``, or
    (None, None, None)."""
    from moto.ec2.models import ec2_backends

    for account in list(ec2_backends.keys()):
        for region in list(ec2_backends[account].keys()):
            found = ec2_backends[account][region].iam_instance_profile_associations.get(instance_id)
            if found is not None:
                return found, account, region
    return None, None, None


def role_of(instance_id: str) -> str | None:
    """ARN of the role of ``instance_id``'s instance profile, or None: no profile, a profile with no
    role (RemoveRoleFromInstanceProfile), or a profile or role deleted since."""
    from moto.iam.models import iam_backends
    from moto.utilities.utils import get_partition

    association, account, region = _association(instance_id)
    profile = None if association is None else association.iam_instance_profile
    if profile is None:
        return None
    iam = iam_backends[account][get_partition(region)]
    if iam.instance_profiles.get(profile.name) is not profile:
        return None  # deleted (and perhaps created again: a new profile, not the one associated)
    # mypy takes the `is not` checks above and below for Optional narrowing: both are the objects registered
    for role in list(profile.roles):  # type: ignore[union-attr]
        if iam.roles.get(role.id) is role:
            return role.arn  # type: ignore[union-attr]
    return None


def trusts_ec2(policy_document: str) -> bool:
    """Whether a role's trust policy lets EC2 assume it: a statement that allows sts:AssumeRole to
    the service principal ec2.amazonaws.com (what an instance role needs; pure)."""
    try:
        policy = json.loads(policy_document)
    except (TypeError, ValueError):
        return False
    statements = policy.get("Statement", []) if isinstance(policy, dict) else []
    for s in statements if isinstance(statements, list) else [statements]:
        actions = s.get("Action", [])
        services = (s.get("Principal") or {}).get("Service", []) if isinstance(s.get("Principal"), dict) else []
        actions = [actions] if isinstance(actions, str) else actions
        services = [services] if isinstance(services, str) else services
        if s.get("Effect") == "Allow" and "ec2.amazonaws.com" in services and \
                any(a in ("sts:AssumeRole", "sts:*", "*") for a in actions):
            return True
    return False


def mint(instance_id: str, role_arn: str) -> dict:
    """Temporary credentials of ``role_arn`` for ``instance_id``, from moto's STS AssumeRole:
    {"AccessKeyId": "ASIA...", "SecretAccessKey", "Token", "Expiration": datetime (UTC)}, valid
    DURATION_S seconds. Raises PermissionError when the role's trust policy does not allow EC2,
    LookupError when the role is gone."""
    from moto.iam.models import iam_backends
    from moto.sts.models import sts_backends
    from moto.utilities.utils import get_partition

    association, account, region = _association(instance_id)
    if association is None:
        raise LookupError(f"{instance_id} has no instance profile")
    partition = get_partition(region)
    try:
        role = iam_backends[account][partition].get_role_by_arn(role_arn)
    except Exception as exc:  # moto's NotFoundException
        raise LookupError(f"role {role_arn} not found") from exc
    if not trusts_ec2(role.assume_role_policy_document):
        raise PermissionError(f"EC2 cannot assume the role {role.name}.")
    assumed = sts_backends[account][partition].assume_role(
        region_name=region, role_session_name=instance_id, role_arn=role_arn,
        policy=None, duration=DURATION_S, external_id=None)  # type: ignore[arg-type]  # moto's own defaults
    return {"AccessKeyId": assumed.access_key_id, "SecretAccessKey": assumed.secret_access_key,
            "Token": assumed.session_token,
            "Expiration": assumed.expiration.replace(tzinfo=timezone.utc)}  # moto's is naive UTC
