"""Price List API parsing and fetching (botocore Stubber, responses shaped like the real API's)."""
import json

import boto3
import pytest
from botocore.stub import Stubber

from ec2gpu.aws import catalog, pricing
from ec2gpu.errors import AwsError


def product(itype: str, usd: str, unit: str = "Hrs") -> str:
    """One GetProducts PriceList entry, as the real API returns it (a JSON string)."""
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "sku": f"SKU{itype}", "attributes": {
            "instanceType": itype, "regionCode": "eu-west-1", "location": "EU (Ireland)", "operatingSystem": "Linux",
            "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used", "instanceFamily": "GPU instance",
            "gpu": "1", "vcpu": "4", "memory": "16 GiB", "servicecode": "AmazonEC2"}},
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {f"SKU{itype}.JRTCKXETXF": {
                "priceDimensions": {f"SKU{itype}.JRTCKXETXF.6YS6EN2CT7": {
                    "unit": unit, "endRange": "Inf", "beginRange": "0", "appliesTo": [], "rateCode": "x",
                    "description": f"${usd} per On Demand Linux {itype} Instance Hour",
                    "pricePerUnit": {"USD": usd}}},
                "sku": f"SKU{itype}", "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
                "termAttributes": {}}},
            "Reserved": {f"SKU{itype}.4NA7Y494T4": {
                "priceDimensions": {"r": {"unit": "Hrs", "pricePerUnit": {"USD": "0.1"}}}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z"})


def test_parse_price_list_reads_on_demand_hourly_usd_and_ignores_reserved():
    prices = pricing.parse_price_list([product("g4dn.xlarge", "0.5870000000"), product("g5.xlarge", "1.1230000000"),
                                       product("g6.xlarge", "0.0000000000")])
    assert prices == {"g4dn.xlarge": 0.587, "g5.xlarge": 1.123}


def test_fetch_on_demand_pages_through_get_products_with_linux_shared_filters(tmp_path):
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    expected = {"ServiceCode": "AmazonEC2", "Filters": pricing.product_filters("eu-west-1"), "FormatVersion": "aws_v1"}
    with Stubber(client) as stub:
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [product("g4dn.xlarge", "0.587")],
                                           "NextToken": "page2"}, expected)
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [product("g5.xlarge", "1.123")]},
                          {**expected, "NextToken": "page2"})
        cache = pricing.refresh_cache(client, "eu-west-1", tmp_path)
        stub.assert_no_pending_responses()
    assert cache["prices"] == {"g4dn.xlarge": 0.587, "g5.xlarge": 1.123}
    fields = {f["Field"]: f["Value"] for f in expected["Filters"]}
    assert fields == {"regionCode": "eu-west-1", "operatingSystem": "Linux", "tenancy": "Shared",
                      "preInstalledSw": "NA", "capacitystatus": "Used", "instanceFamily": "GPU instance",
                      "marketoption": "OnDemand"}
    # the cache is what on_demand_price uses from now on, for a region the shipped table lacks
    price = catalog.on_demand_price("g4dn.xlarge", "eu-west-1", tmp_path)
    assert price.usd_per_hour == 0.587 and "Price List" in price.source
    assert catalog.on_demand_price("g6.xlarge", "eu-west-1", tmp_path).usd_per_hour is None


def test_price_list_refusal_is_an_aws_error_with_a_hint():
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        stub.add_client_error("get_products", "AccessDeniedException", "not allowed")
        with pytest.raises(AwsError) as info:
            pricing.fetch_on_demand(client, "eu-west-1")
    assert "AccessDeniedException" in info.value.message and "pricing:GetProducts" in info.value.hint


def test_shipped_table_covers_the_us_regions_and_retired_types_have_a_last_price():
    assert catalog.on_demand_price("g4dn.xlarge", "us-west-2").usd_per_hour == 0.526
    assert catalog.on_demand_price("g4dn.xlarge", "ap-south-1").usd_per_hour is None
    assert set(catalog.RETIRED_LAST_PRICE) == set(catalog.RETIRED)
