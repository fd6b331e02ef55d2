"""EC2's GetEbsDefaultKmsKeyId in the sandbox (moto has ModifyEbsDefaultKmsKeyId, not this).

EC2 answers the KMS key that encrypts a new volume when none is named
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GetEbsDefaultKmsKeyId.html):
``alias/aws/ebs``, the AWS managed key, until ModifyEbsDefaultKmsKeyId names another, then that
key's ARN. A detached run checks it before anything is made (aws/iam_detached.check_ebs_key): Auto
Scaling's service-linked role may use the AWS managed key, a customer managed one only with a grant.
"""
from __future__ import annotations

#: what GetEbsDefaultKmsKeyId answers in an account that never changed its default key
AWS_MANAGED = "alias/aws/ebs"


def install() -> None:
    """Give moto's EC2 the action (call after importing moto: the daemon, or a test's mock_aws)."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses import EC2Response

    def get_ebs_default_kms_key_id(self):  # moto's backend keeps "" until ModifyEbsDefaultKmsKeyId
        return ActionResult({"KmsKeyId": getattr(self.ec2_backend, "default_kms_key_id", "") or AWS_MANAGED})

    setattr(EC2Response, get_ebs_default_kms_key_id.__name__, get_ebs_default_kms_key_id)
