"""Decisions at their exact edges, pure (no sandbox, no AWS): each test here fails when one token
of the decision it guards changes (a threshold, a comparison, max for min), the mutants the fast
tier let through before (issue 29, item 14).

- the private-key sniff: a file of 64 KiB or less is read for a key header in its first 4096
  bytes (a token file: in its first 64 KiB); a bigger file is not read (remote/sync.py);
- the spot estimate: the dearest zone's current price, an upper bound, capped by --max-price,
  refused only below the cheapest zone (runs/plan/costs.py hourly_price, aws/pricing.py);
- the G/VT vCPU quota: in use + needed equal to the quota passes, one over is refused
  (aws/capacity.py check_quota);
- ``--since``: seconds to weeks back to the second, a unit required, no 30-day bound; a run
  started at the boundary counted, one second before it not (runs/settle/ledger.py parse_since, runs).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from ec2gpu.errors import CapacityError, UsageError

KIB = 1024
PEM = b"-----BEGIN OPENSSH PRIVATE KEY-----\n"


class _Pages:
    def __init__(self, pages):
        self.pages = pages

    def paginate(self, **kwargs):
        return iter(self.pages)


class FakeEC2:
    """An EC2 client with canned pages per paginator (describe_instance_types answers nothing, so
    a type's facts come from the catalog's table)."""

    def __init__(self, **pages):
        self.pages = {"describe_instance_types": [{"InstanceTypes": []}], **pages}

    def get_paginator(self, name):
        return _Pages(self.pages[name])


# --- the private-key sniff (ec2gpu/remote/sync.py _looks_like_private_key) ----------------------

def _file(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_key_file_of_exactly_64_kib_is_read_and_withheld_one_byte_more_is_not_read(tmp_path):
    """The size limit is 64 KiB inclusive: a PEM key padded to 65,536 bytes is a key; at 65,537
    bytes the file is not read (a dataset that happens to start like a key is not sniffed)."""
    from ec2gpu.remote import sync

    at = _file(tmp_path, "at.txt", PEM + b"x" * (64 * KIB - len(PEM)))
    over = _file(tmp_path, "over.txt", PEM + b"x" * (64 * KIB + 1 - len(PEM)))
    under = _file(tmp_path, "under.txt", PEM + b"x" * (64 * KIB - 1 - len(PEM)))
    assert at.stat().st_size == 64 * KIB and over.stat().st_size == 64 * KIB + 1
    assert sync._looks_like_private_key(at) is True
    assert sync._looks_like_private_key(under) is True
    assert sync._looks_like_private_key(over) is False
    assert sync.withheld(at) and not sync.withheld(over)
    m = sync.manifest(tmp_path)
    assert m.withheld == ["at.txt", "under.txt"] and m.files == ["over.txt"]
    assert sorted(sync.manifest(tmp_path, allow_secrets=True).files) == ["at.txt", "over.txt", "under.txt"]


def test_a_key_header_is_found_in_the_first_4096_bytes_and_not_after(tmp_path):
    """_SNIFF_BYTES: a header that ends at byte 4096 is found, one byte later it is not."""
    from ec2gpu.remote import sync

    header = b"PRIVATE KEY-----"
    inside = _file(tmp_path, "inside.txt", b"#" * (4096 - len(header)) + header + b"\n" * 100)
    after = _file(tmp_path, "after.txt", b"#" * (4097 - len(header)) + header + b"\n" * 100)
    assert sync._looks_like_private_key(inside) is True
    assert sync._looks_like_private_key(after) is False


@pytest.mark.parametrize("header", [b"-----BEGIN RSA PRIVATE KEY-----", b"-----BEGIN PGP PRIVATE KEY BLOCK-----",
                                    b"PuTTY-User-Key-File-3: ssh-ed25519"])
def test_each_key_header_is_a_key_and_a_near_miss_is_not(tmp_path, header):
    from ec2gpu.remote import sync

    assert sync._looks_like_private_key(_file(tmp_path, "k.txt", header + b"\n"))
    assert not sync._looks_like_private_key(_file(tmp_path, "p.txt", b"-----BEGIN PUBLIC KEY-----\n"))


def test_a_token_file_is_read_to_64_kib_not_only_its_first_4096_bytes(tmp_path):
    """.yarnrc.yml: its token line may come late in the file; still found at the 64 KiB edge."""
    from ec2gpu.remote import sync

    late = b"npmAuthToken: abc\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    near_end = _file(tmp_path / "a", ".yarnrc.yml", b"#" * (64 * KIB - len(late)) + late)
    clean = _file(tmp_path / "b", ".yarnrc.yml", b"nodeLinker: node-modules\n" + b"#" * 8000)
    assert near_end.stat().st_size == 64 * KIB
    assert sync._looks_like_private_key(near_end) is True
    assert sync._looks_like_private_key(clean) is False


# --- the spot estimate (ec2gpu/runs/plan/costs.py hourly_price) -------------------------------------

NOW = datetime(2026, 11, 20, 12, tzinfo=timezone.utc)


def _spot_aws(zones: dict[str, float], itype: str = "g4dn.xlarge", stale: dict[str, float] | None = None):
    """A session whose EC2 reports ``zones`` as the newest spot prices (``stale``: older entries,
    listed after the newest, that must not win)."""
    history = [{"InstanceType": itype, "AvailabilityZone": z, "Timestamp": NOW, "SpotPrice": f"{p:.4f}"}
               for z, p in zones.items()]
    history += [{"InstanceType": itype, "AvailabilityZone": z, "Timestamp": NOW - timedelta(hours=1),
                 "SpotPrice": f"{p:.4f}"} for z, p in (stale or {}).items()]
    return SimpleNamespace(ec2=FakeEC2(describe_spot_price_history=[{"SpotPriceHistory": history}]),
                           region="us-east-1")


ZONES = {"us-east-1a": 0.20, "us-east-1b": 0.35, "us-east-1c": 0.25}


def test_the_spot_estimate_is_the_dearest_zones_price_an_upper_bound(tmp_path):
    """The launch may land in any zone: the estimate takes the highest price (0.35), not the
    lowest (0.20) nor the first."""
    from ec2gpu.runs.plan import costs

    price = costs.hourly_price(_spot_aws(ZONES), tmp_path, "g4dn.xlarge", spot=True)
    assert price.usd_per_hour == pytest.approx(0.35)
    assert price.source == "spot now, highest of 3 zone(s)"
    assert price.usd_per_hour >= max(ZONES.values())


def test_the_spot_estimate_uses_each_zones_newest_price_not_an_older_higher_one(tmp_path):
    from ec2gpu.aws import pricing
    from ec2gpu.runs.plan import costs

    aws = _spot_aws(ZONES, stale={"us-east-1a": 0.90})
    assert pricing.current_spot_prices(aws.ec2, ["g4dn.xlarge"]) == {"g4dn.xlarge": ZONES}
    assert costs.hourly_price(aws, tmp_path, "g4dn.xlarge", spot=True).usd_per_hour == pytest.approx(0.35)


def test_on_demand_ignores_spot_prices_and_no_spot_price_falls_back_to_on_demand(tmp_path):
    from ec2gpu.runs.plan import costs

    assert costs.hourly_price(_spot_aws(ZONES), tmp_path, "g4dn.xlarge", spot=False).usd_per_hour == 0.526
    none = costs.hourly_price(_spot_aws({}), tmp_path, "g4dn.xlarge", spot=True)
    assert none.usd_per_hour == 0.526 and "on-demand price as the ceiling" in none.source


def test_max_price_caps_the_estimate_and_is_refused_only_below_the_cheapest_zone(tmp_path):
    """--max-price: at or above the dearest zone, the dearest price; between the zones, the cap
    itself; equal to the cheapest zone, still the cap (a launch there succeeds); below the cheapest
    zone, refused."""
    from ec2gpu.runs.plan import costs

    def price(cap):
        return costs.hourly_price(_spot_aws(ZONES), tmp_path, "g4dn.xlarge", spot=True, max_price=cap)

    assert price(1.00).usd_per_hour == pytest.approx(0.35)
    assert price(0.35).usd_per_hour == pytest.approx(0.35) and price(0.35).source.startswith("spot now")
    assert price(0.30).usd_per_hour == 0.30
    assert price(0.30).source == "--max-price (current spot 0.2000-0.3500 USD/h)"
    assert price(0.20).usd_per_hour == 0.20
    with pytest.raises(UsageError, match=r"below the spot price .* in every zone \(lowest 0\.2000"):
        price(0.1999)


# --- the G and VT vCPU quota (ec2gpu/aws/capacity.py check_quota) ------------------------------

class _Quotas:
    def __init__(self, value: float):
        self.value = value
        self.asked: list[tuple[str, str]] = []

    def get_service_quota(self, ServiceCode, QuotaCode):
        self.asked.append((ServiceCode, QuotaCode))
        return {"Quota": {"Value": self.value}}


def _running(*types: str, spot: bool = False) -> FakeEC2:
    """An EC2 client with these G/VT instances running (and a p3 and an other-market g4dn that do not
    count)."""
    other = {"InstanceType": "g4dn.xlarge", **({} if spot else {"InstanceLifecycle": "spot"})}
    instances = [{"InstanceType": t, **({"InstanceLifecycle": "spot"} if spot else {})} for t in types]
    instances += [{"InstanceType": "p3.2xlarge", **({"InstanceLifecycle": "spot"} if spot else {})}, other]
    return FakeEC2(describe_instances=[{"Reservations": [{"Instances": instances}]}])


@pytest.mark.parametrize("spot,code", [(False, "L-DB2E81BA"), (True, "L-3819A6DF")])
def test_the_quota_check_passes_at_exactly_the_limit_and_refuses_one_vcpu_over(spot, code):
    """g4dn.xlarge has 4 vCPUs. 8 in use (two g4dn.xlarge) + 4 needed = 12: a quota of 12 passes,
    a quota of 11 refuses. Instances of the other market and p-family ones are not counted."""
    from ec2gpu.aws import capacity

    ec2 = _running("g4dn.xlarge", "g4dn.xlarge", spot=spot)
    assert capacity.gvt_vcpus_in_use(ec2, spot) == 8
    quotas = _Quotas(12)
    assert capacity.check_quota(quotas, ec2, "g4dn.xlarge", spot) == {"quota": code, "value": 12, "in_use": 8,
                                                                      "needed": 4}
    assert quotas.asked == [("ec2", code)]
    with pytest.raises(CapacityError, match=r"needs 4 vCPUs, but the quota .* is 11 vCPUs and 8 are in use"):
        capacity.check_quota(_Quotas(11), ec2, "g4dn.xlarge", spot)


def test_the_quota_counts_every_instance_of_the_request():
    """count=3 of g4dn.xlarge needs 12 vCPUs: a quota of 12 with none in use passes, 11 refuses."""
    from ec2gpu.aws import capacity

    ec2 = _running()
    checked = capacity.check_quota(_Quotas(12), ec2, "g4dn.xlarge", False, count=3)
    assert checked is not None and checked["needed"] == 12
    with pytest.raises(CapacityError):
        capacity.check_quota(_Quotas(11), ec2, "g4dn.xlarge", False, count=3)


def test_a_p_family_type_is_not_checked_against_the_gvt_quota():
    from ec2gpu.aws import capacity

    quotas = _Quotas(0)
    assert capacity.check_quota(quotas, _running(), "p3.2xlarge", False) is None
    assert quotas.asked == []


# --- --since (ec2gpu/runs/settle/ledger.py parse_since, runs) -----------------------------------------

SINCE_NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text,back", [
    ("45s", timedelta(seconds=45)), ("1m", timedelta(minutes=1)), ("30m", timedelta(minutes=30)),
    ("1h", timedelta(hours=1)), ("12h", timedelta(hours=12)), ("1.5h", timedelta(minutes=90)),
    ("1d", timedelta(days=1)), ("30d", timedelta(days=30)), ("90d", timedelta(days=90)),
    ("1w", timedelta(days=7)), ("2w", timedelta(days=14)), (" 2W ", timedelta(days=14)), ("3 d", timedelta(days=3)),
    ("0h", timedelta(0)),
])
def test_since_takes_seconds_to_weeks_back_to_the_second(text, back):
    """The grammar of every duration (tasks/spec.minutes) with its unit required, and no 30-day
    bound: --since 90d is a quarter back."""
    from ec2gpu.runs.settle import ledger

    assert ledger.parse_since(text, SINCE_NOW) == SINCE_NOW - back


@pytest.mark.parametrize("text", ["2", "d", "-2d", "2dd", "2y", "1w2d", "soon", ""])
def test_since_refuses_what_is_neither_a_duration_nor_a_date(text):
    """A bare number is not a duration here (minutes? days?): the unit is required."""
    from ec2gpu.runs.settle import ledger

    with pytest.raises(UsageError, match="is not a duration or a date"):
        ledger.parse_since(text, SINCE_NOW)


def test_since_dates_are_utc_unless_they_say_otherwise():
    from ec2gpu.runs.settle import ledger

    assert ledger.parse_since("2026-11-01", SINCE_NOW) == datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert ledger.parse_since("2026-11-01T05:00:00+02:00", SINCE_NOW) == datetime(2026, 11, 1, 3, tzinfo=timezone.utc)


def test_runs_since_counts_a_run_started_at_the_boundary_and_not_one_second_before(tmp_path):
    from ec2gpu.runs.settle import ledger

    since = ledger.parse_since("2w", SINCE_NOW)
    for run_id, started in (("before", since - timedelta(seconds=1)), ("at", since),
                            ("after", since + timedelta(seconds=1))):
        ledger.record(tmp_path, {"run_id": run_id, "command": "c", "backend": "aws", "status": "completed",
                                 "started_at": started.isoformat()})
    assert [r["run_id"] for r in ledger.runs(tmp_path, since=since)] == ["after", "at"]
    assert [r["run_id"] for r in ledger.runs(tmp_path)] == ["after", "at", "before"]
