"""Bucket policies that refuse plain HTTP, in a sandbox whose S3 speaks plain HTTP on loopback.

The run store's bucket policy denies every request without TLS (``aws:SecureTransport`` false:
aws/runstore.tls_deny_statement; https://docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html).
On AWS every boto3 request to S3 is HTTPS, so the statement never applies to ec2gpu's own calls.
moto does not evaluate a policy's conditions: it would apply that Deny to every object request,
and the sandbox's endpoint is ``http://127.0.0.1`` besides. Here (in the daemon only) a request is
taken to have come over TLS, as it would on AWS: a statement that applies only when
``aws:SecureTransport`` is false does not apply, and every other statement is evaluated as moto does.
"""
from __future__ import annotations

import json
from typing import Any

INSECURE = {"Bool": {"aws:SecureTransport": "false"}}


def over_tls(policy: dict[str, Any]) -> dict[str, Any]:
    """``policy`` less the statements that apply only to requests without TLS (pure)."""
    statements = policy.get("Statement", [])
    if isinstance(statements, dict):
        statements = [statements]
    return {**policy, "Statement": [s for s in statements if s.get("Condition") != INSECURE]}


def install() -> None:
    """Patch moto's FakeBucket.get_permission (after moto is imported) to evaluate ``over_tls``."""
    from moto.iam.access_control import IAMPolicy, PermissionResult
    from moto.s3.models import FakeBucket

    def get_permission(self, action: str, resource: str) -> Any:
        if self.policy is None:
            return PermissionResult.NEUTRAL
        raw = self.policy.decode() if isinstance(self.policy, bytes) else self.policy
        return IAMPolicy(json.dumps(over_tls(json.loads(raw)))).is_action_permitted(action, resource)

    FakeBucket.get_permission = get_permission
