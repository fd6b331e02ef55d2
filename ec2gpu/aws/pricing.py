"""Prices from AWS: on-demand from the Price List API, spot from the EC2 spot price history.

Price List API (service ``pricing``, action ``GetProducts``):
https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/using-price-list-query-api.html
Its endpoints live in us-east-1, eu-central-1 and ap-south-1 only; the products of every region are
served from each. One product per instance type matches Linux, shared tenancy, no pre-installed
software, capacitystatus "Used" and marketoption "OnDemand"; its ``terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`` is
the hourly price. Spot: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..errors import AwsError
from . import catalog
from .session import Client, describe

PRICING_API_REGION = "us-east-1"
SPOT_PRODUCT = "Linux/UNIX"  # ProductDescription of Linux spot prices in a VPC


def product_filters(region: str) -> list[dict[str, str]]:
    """GetProducts filters for Linux on-demand GPU instances in ``region`` (pure)."""
    # marketoption pins on-demand products: without it the Capacity Block products of P-family
    # types match too, and their prices are not on-demand prices
    terms = {"regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
             "capacitystatus": "Used", "instanceFamily": "GPU instance", "marketoption": "OnDemand"}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]


def parse_price_list(price_list: list[str]) -> dict[str, float]:
    """Instance type -> on-demand USD/h from GetProducts' ``PriceList`` (a list of JSON strings).

    Products without an hourly USD on-demand dimension are skipped; where several products of one
    type remain (a filter was loose), the highest price is kept so estimates are never low.
    """
    prices: dict[str, float] = {}
    for raw in price_list:
        product = json.loads(raw) if isinstance(raw, str) else raw
        itype = product.get("product", {}).get("attributes", {}).get("instanceType")
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if itype and usd is not None and dim.get("unit", "").lower().startswith("hr") and float(usd) > 0:
                    prices[itype] = max(prices.get(itype, 0.0), float(usd))
    return prices


def fetch_on_demand(pricing: Client, region: str) -> dict[str, float]:
    """Fetch the on-demand USD/h of every GPU instance type in ``region`` from the Price List API.

    ``pricing`` is a boto3 ``pricing`` client (region us-east-1). Raises AwsError when the API
    refuses (no pricing:GetProducts permission, or an emulator without the API).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    prices: dict[str, float] = {}
    try:
        pages = pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=product_filters(region), FormatVersion="aws_v1")
        for page in pages:
            prices.update(parse_price_list(page.get("PriceList", [])))
    except (ClientError, BotoCoreError) as exc:
        why = describe(exc) if isinstance(exc, ClientError) else str(exc)
        raise AwsError(f"the AWS Price List API did not answer: {why.splitlines()[0][:200]}",
                       "it needs the pricing:GetProducts permission; the sandbox has no Price List API, "
                       "so there the shipped table is used") from exc
    if not prices:
        raise AwsError(f"the Price List API returned no GPU instance prices for {region}",
                       "check the region name (e.g. us-east-1)")
    return prices


#: GetProducts filters of the EBS storage prices ``fetch_storage`` reads, by kind (catalog.ebs_price)
STORAGE_PRODUCTS = {"gp3": {"productFamily": "Storage", "volumeApiName": "gp3"},
                    "snapshot": {"productFamily": "Storage Snapshot"}}


def parse_storage_price(price_list: Sequence[str | dict[str, Any]], kind: str) -> float | None:
    """USD per GB-month of EBS ``kind`` from GetProducts' ``PriceList`` (pure): the "GB-Mo" dimension
    of the product; for "snapshot", the standard tier's (usage type ``[REGION-]EBS:SnapshotUsage``,
    not the archive tier's). None when no product has one."""
    found = []
    for raw in price_list:
        product = json.loads(raw) if isinstance(raw, str) else raw
        usage = product.get("product", {}).get("attributes", {}).get("usagetype", "")
        if kind == "snapshot" and usage.rpartition("-")[2] != "EBS:SnapshotUsage":
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is not None and dim.get("unit") == "GB-Mo" and float(usd) > 0:
                    found.append(float(usd))
    return max(found) if found else None  # never low, as parse_price_list


def fetch_storage(pricing: Client, region: str) -> dict[str, float]:
    """EBS gp3 and snapshot USD per GB-month in ``region`` from the Price List API: {kind: USD},
    the kinds it found. Raises AwsError as ``fetch_on_demand``."""
    from botocore.exceptions import BotoCoreError, ClientError

    out = {}
    for kind, terms in STORAGE_PRODUCTS.items():
        filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in {"regionCode": region, **terms}.items()]
        try:
            pages = pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters,
                                                                  FormatVersion="aws_v1")
            usd = parse_storage_price([p for page in pages for p in page.get("PriceList", [])], kind)
        except (ClientError, BotoCoreError) as exc:
            raise AwsError(f"the AWS Price List API did not answer for EBS {kind}: {str(exc).splitlines()[0][:200]}",
                           "it needs the pricing:GetProducts permission") from exc
        if usd is not None:
            out[kind] = usd
    return out


def refresh_storage(pricing: Client, region: str, home: Path) -> dict[str, float]:
    """Fetch ``region``'s EBS gp3 and snapshot prices (``fetch_storage``) into its cache, which
    ``refresh_cache`` wrote first (``catalog.ebs_price`` reads them there); return them."""
    path = catalog.price_cache_path(home, region)
    cache = catalog.read_price_cache(home, region) or {"region": region, "prices": {},
                                                        "fetched_at": datetime.now(timezone.utc).isoformat()}
    storage = cache["storage"] = fetch_storage(pricing, region)
    _write(path, cache)
    return storage


def _write(path: Path, cache: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(cache, indent=2) + "\n")
    tmp.replace(path)


def refresh_cache(pricing: Client, region: str, home: Path) -> dict[str, Any]:
    """Fetch ``region``'s prices and write them to the cache ``catalog.on_demand_price`` reads."""
    prices = fetch_on_demand(pricing, region)
    cache = {"region": region, "fetched_at": datetime.now(timezone.utc).isoformat(),
             "source": "AWS Price List API (pricing:GetProducts)", "prices": dict(sorted(prices.items()))}
    _write(catalog.price_cache_path(home, region), cache)
    return cache


def current_spot_prices(ec2: Client, instance_types: list[str]) -> dict[str, dict[str, float]]:
    """Instance type -> {availability zone: current spot USD/h} (the newest entry per zone)."""
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=instance_types, ProductDescriptions=[SPOT_PRODUCT],
        StartTime=datetime.now(timezone.utc))
    for page in pages:
        for h in page.get("SpotPriceHistory", []):
            key, ts = (h["InstanceType"], h["AvailabilityZone"]), h["Timestamp"]
            if key not in newest or ts > newest[key][0]:
                newest[key] = (ts, float(h["SpotPrice"]))
    out: dict[str, dict[str, float]] = {}
    for (itype, zone), (_, price) in sorted(newest.items()):
        out.setdefault(itype, {})[zone] = price
    return out


def spot_price_history(ec2: Client, instance_type: str, zone: str, start: datetime,
                       end: datetime) -> list[tuple[datetime, float]]:
    """[(timestamp, USD/h)] for ``instance_type`` in ``zone`` that applied between ``start`` and ``end``.

    AWS also returns the entry in effect at ``start``; one day of look-back covers an API that
    does not. Sorted by time.
    """
    rows = []
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=[instance_type], ProductDescriptions=[SPOT_PRODUCT], AvailabilityZone=zone,
        StartTime=start - timedelta(days=1), EndTime=end)
    for page in pages:
        rows += [(h["Timestamp"], float(h["SpotPrice"])) for h in page.get("SpotPriceHistory", [])
                 if h.get("AvailabilityZone", zone) == zone]
    return sorted(rows)
