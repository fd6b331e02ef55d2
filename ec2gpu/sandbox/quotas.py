"""The G and VT vCPU quotas in the sandbox, as Service Quotas gives them to an account.

moto's Service Quotas knows the VPC's quotas only, and answers ``NoSuchResourceException`` for
EC2's, so every sandbox run said it could not read the quota. Here GetServiceQuota answers for the
two quotas a run checks (aws/capacity.QUOTA_CODES) with the fields Service Quotas gives
(https://docs.aws.amazon.com/servicequotas/2019-06-24/apireference/API_GetServiceQuota.html; the
usage metric's dimensions as the console shows them for these quotas), for an account whose G and VT
quotas were raised to VCPUS; every other code is moto's answer.
"""
from __future__ import annotations

from typing import Any

from ..aws.capacity import QUOTA_CODES

VCPUS = 256.0  # the sandbox account's G and VT quotas (vCPUs): room for every array the tests run
#: the usage metric's Class dimension per market (AWS/Usage ResourceCount, as the console shows)
_CLASS = {"on-demand": "G/OnDemand", "spot": "G/Spot"}


def quota(code: str, region: str, account: str) -> dict[str, Any] | None:
    """Service Quotas' Quota for the G and VT quota ``code`` of ``account`` in ``region``, or None
    for another code (pure)."""
    for market, (known, name) in QUOTA_CODES.items():
        if code == known:
            return {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                    "QuotaArn": f"arn:aws:servicequotas:{region}:{account}:ec2/{code}", "QuotaCode": code,
                    "QuotaName": name, "Value": VCPUS, "Unit": "None", "Adjustable": True, "GlobalQuota": False,
                    "UsageMetric": {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
                                    "MetricDimensions": {"Class": _CLASS[market], "Resource": "vCPU",
                                                         "Service": "EC2", "Type": "Resource"},
                                    "MetricStatisticRecommendation": "Maximum"},
                    "QuotaAppliedAtLevel": "ACCOUNT"}
    return None


def install() -> None:
    """Patch moto's Service Quotas backend (call in the daemon after importing moto)."""
    from moto.servicequotas.models import ServiceQuotasBackend

    original = ServiceQuotasBackend.get_service_quota

    def get_service_quota(self, service_code: str, quota_code: str) -> dict[str, Any]:
        got = quota(quota_code, self.region_name, self.account_id) if service_code == "ec2" else None
        return got if got is not None else original(self, service_code, quota_code)

    ServiceQuotasBackend.get_service_quota = get_service_quota
