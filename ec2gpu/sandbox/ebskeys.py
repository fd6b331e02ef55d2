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


#: where the sandbox keeps the key ModifyEbsDefaultKmsKeyId named, on moto's EC2 backend of the
#: account and region (a new backend, a new account: the AWS managed key again)
_NAMED = "ec2gpu_default_kms_key_id"


def install() -> None:
    """Give moto's EC2 the action (call after importing moto: the daemon, or a test's mock_aws; a
    second call changes nothing). moto itself makes a key aliased aws/ebs for the first encrypted
    volume and keeps it as the default (a customer managed one, by its KeyManager): the answer is
    the key ModifyEbsDefaultKmsKeyId named, else AWS_MANAGED."""
    from moto.core.responses import ActionResult
    from moto.ec2.models.elastic_block_store import EBSBackend
    from moto.ec2.responses import EC2Response

    if hasattr(EC2Response, "get_ebs_default_kms_key_id"):
        return
    modify = EBSBackend.modify_ebs_default_kms_key_id

    def modify_ebs_default_kms_key_id(self: EBSBackend, kms_key_id: str) -> str:
        arn = modify(self, kms_key_id)
        setattr(self, _NAMED, arn if kms_key_id else None)  # none named: ResetEbsDefaultKmsKeyId's AWS managed key
        return arn

    def get_ebs_default_kms_key_id(self: EC2Response) -> ActionResult:
        return ActionResult({"KmsKeyId": getattr(self.ec2_backend, _NAMED, None) or AWS_MANAGED})

    setattr(EBSBackend, modify_ebs_default_kms_key_id.__name__, modify_ebs_default_kms_key_id)
    setattr(EC2Response, get_ebs_default_kms_key_id.__name__, get_ebs_default_kms_key_id)
