"""What a run costs: per-second billing with a 60-second minimum, at the catalog's hourly price.

Billing rules: https://aws.amazon.com/ec2/pricing/ (Linux instances are billed per second,
with a minimum of 60 seconds, from the running state to termination).
"""
from __future__ import annotations

from datetime import datetime

from ..aws.catalog import BILLING_MINIMUM_SECONDS


def billed_seconds(launched_at: datetime, ended_at: datetime) -> float:
    """Seconds billed for one instance: (ended - launched), at least 60 s."""
    return max(float(BILLING_MINIMUM_SECONDS), (ended_at - launched_at).total_seconds())


def cost_usd(seconds: float, usd_per_hour: float) -> float:
    """USD for ``seconds`` billed at ``usd_per_hour`` (seconds already include the minimum)."""
    return seconds * usd_per_hour / 3600.0
