"""The sandbox's simulated spot market.

moto answers DescribeSpotPriceHistory with 0.00001 USD/h dated 2006 for every type, which makes
spot look free. In the sandbox daemon this module replaces that answer with a simulated market:
the spot price of a type in a zone is a fixed fraction of the catalog's on-demand price (zone a:
30 %, b: 32 %, c: 35 %, others 38 %; typical of GPU spot discounts), in effect since the sandbox
started. It is simulated, the commands that show it say so, and real AWS is never affected.
"""
from __future__ import annotations

from datetime import datetime, timezone

#: zone letter -> spot price as a fraction of the on-demand price (simulated)
ZONE_FRACTION = {"a": 0.30, "b": 0.32, "c": 0.35}
OTHER_ZONE_FRACTION = 0.38


def spot_price(instance_type: str, zone: str) -> float | None:
    """The simulated spot USD/h of ``instance_type`` in ``zone``, None for a non-GPU type."""
    from ..aws import catalog

    itype = catalog.CATALOG.get(instance_type)
    if itype is None:
        return None
    return round(itype.on_demand_usd_h * ZONE_FRACTION.get(zone[-1:], OTHER_ZONE_FRACTION), 4)


def install(since: datetime | None = None) -> None:
    """Patch moto's DescribeSpotPriceHistory response (call in the daemon after importing moto)."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.spot_instances import SpotInstances

    stamp = (since or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def describe_spot_price_history(self) -> ActionResult:
        types = self._get_param("InstanceTypes", [])
        zone = self._get_param("AvailabilityZone")
        history = []
        for o in self.ec2_backend.describe_spot_price_history(types, self._filters_from_querystring()):
            price = spot_price(o["InstanceType"], o["Location"])
            if price is not None and (not zone or o["Location"] == zone):
                history.append({"InstanceType": o["InstanceType"], "ProductDescription": "Linux/UNIX",
                                "SpotPrice": f"{price:.6f}", "AvailabilityZone": o["Location"], "Timestamp": stamp})
        return ActionResult({"SpotPriceHistory": history})

    SpotInstances.describe_spot_price_history = describe_spot_price_history


SPOT_ROLE_PATH = "/aws-service-role/spot.amazonaws.com/"
SPOT_TRUST = ('{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
              '"Principal": {"Service": "spot.amazonaws.com"}, "Action": "sts:AssumeRole"}]}')


def install_spot_role() -> None:
    """Patch moto's RunInstances so the first spot request creates the service-linked role
    AWSServiceRoleForEC2Spot, as EC2 does for a caller that may create it
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/service-linked-roles-spot-instance-requests.html);
    moto creates none, so `ec2gpu doctor --spot` would otherwise never see it."""
    from moto.ec2.models.instances import InstanceBackend
    from moto.iam.models import iam_backends

    from ..aws.capacity import SPOT_ROLE

    original = InstanceBackend.run_instances

    def run_instances(self, *args, **kwargs):
        reservation = original(self, *args, **kwargs)
        if kwargs.get("instance_market_options"):
            iam = iam_backends[self.account_id]["aws"]
            if all(r.name != SPOT_ROLE for r in list(iam.roles.values())):
                iam.create_role(SPOT_ROLE, SPOT_TRUST, SPOT_ROLE_PATH, None,
                                "Default EC2 Spot Service Linked Role", [], None, linked_service="spot.amazonaws.com")
        return reservation

    InstanceBackend.run_instances = run_instances
