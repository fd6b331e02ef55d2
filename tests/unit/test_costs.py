"""Billing rules, spot price changes, the estimate, and instance termination times (pure)."""
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from ec2gpu.aws import instances
from ec2gpu.runs.plan import costs
from ec2gpu.aws.instances import Instance
from ec2gpu.errors import UsageError
from fakes import FakeEC2, _run  # same folder (pytest prepend import mode)

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=timezone.utc)


def test_per_second_billing_with_a_60_second_minimum():
    assert costs.billed_seconds(T0, T0 + timedelta(seconds=12)) == 60
    assert costs.billed_seconds(T0, T0 + timedelta(seconds=60)) == 60
    assert costs.billed_seconds(T0, T0 + timedelta(seconds=61.5)) == 61.5
    assert costs.cost_usd(3600, 0.526) == pytest.approx(0.526)
    assert costs.cost_usd(90, 0.526) == pytest.approx(0.526 * 90 / 3600)


def test_spot_cost_follows_a_price_change_during_the_run():
    history = [(T0 - timedelta(hours=3), 0.20), (T0 + timedelta(minutes=30), 0.40), (T0 + timedelta(hours=5), 9.9)]
    # 30 min at 0.20 + 30 min at 0.40; the entry after the run does not count
    assert costs.spot_cost_usd(history, T0, T0 + timedelta(hours=1)) == pytest.approx(0.10 + 0.20)
    assert costs.price_at(history, T0) == 0.20
    assert costs.price_at(history, T0 + timedelta(minutes=30)) == 0.40


def test_spot_cost_minimum_is_60_seconds_at_the_launch_price():
    history = [(T0 - timedelta(hours=1), 0.36), (T0 + timedelta(seconds=20), 3.6)]
    assert costs.spot_cost_usd(history, T0, T0 + timedelta(seconds=30)) == pytest.approx(60 * 0.36 / 3600)


def test_price_before_the_first_entry_is_the_first_and_empty_history_is_an_error():
    assert costs.price_at([(T0, 0.5)], T0 - timedelta(days=1)) == 0.5
    with pytest.raises(ValueError):
        costs.price_at([], T0)


def test_estimate_uses_defaults_without_history_and_says_so():
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, [])
    d = costs.DEFAULT_PHASE_SECONDS
    train = costs.DEFAULT_TRAINER_STARTUP_SECONDS + 2 * costs.DEFAULT_EPOCH_SECONDS_T4["cnn"]
    assert e.train_seconds == pytest.approx(train)
    assert e.billed_seconds == pytest.approx(d["boot"] + d["setup"] + d["teardown"] + train)
    assert e.cost_usd == pytest.approx(e.billed_seconds * 0.526 / 3600, abs=1e-4)
    assert e.time_source.startswith("default for T4")


def test_estimate_uses_the_ledger_when_it_has_runs_of_the_same_model_and_gpu():
    run = {"instance_type": "g4dn.xlarge", "gpu": "T4", "model": "cnn", "epochs": 2, "train_seconds": 4.0,
           "phases": {"requesting": 1, "waiting for running": 5, "waiting for SSH": 4, "setup": 2, "upload": 1,
                      "running": 10.0, "download": 1, "terminating": 3}}
    other = {**run, "model": "mlp", "train_seconds": 400.0}
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 4, [other, run])
    assert (e.boot_seconds, e.setup_seconds, e.teardown_seconds) == (10, 3, 4)
    assert e.train_seconds == pytest.approx(6.0 + 4 * 2.0)  # start-up 10-4 s, then 2 s per epoch
    assert e.billed_seconds == 60  # 31 s of run, billed as the minimum
    assert e.time_source.startswith("ledger (1 earlier run of cnn on T4)")


def test_estimate_without_a_price_has_no_cost():
    assert costs.estimate("g5.xlarge", "A10G", "on-demand", None, "none", "cnn", 1, []).cost_usd is None


@pytest.mark.parametrize("reason, expected", [
    ("User initiated (2026-11-21 10:02:03 GMT)", datetime(2026, 11, 21, 10, 2, 3, tzinfo=timezone.utc)),
    ("User initiated (2026-11-21 10:02:03 UTC)", datetime(2026, 11, 21, 10, 2, 3, tzinfo=timezone.utc)),
    ("", None),
])
def test_termination_time_comes_from_state_transition_reason(reason, expected):
    described = {"InstanceId": "i-1", "InstanceType": "g4dn.xlarge", "LaunchTime": datetime.now(timezone.utc),
                 "StateTransitionReason": reason}
    assert instances.Instance.of(described).transitioned_at == expected


def test_max_price_goes_into_the_spot_options_only_for_spot():
    spec = instances.LaunchSpec(run_id="r", owner="o", name="n", instance_type="g4dn.xlarge", image_id="ami-1",
                                root_device_name="/dev/sda1", key_name="k", security_group_id="sg-1", spot=True,
                                max_price=0.2)
    assert instances.run_request(spec)["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "0.2000"
    on_demand = instances.LaunchSpec(**{**spec.__dict__, "spot": False})
    assert "InstanceMarketOptions" not in instances.run_request(on_demand)


# --- beside compute: the public IPv4 address and the root volume; standing instances' running intervals

class _Aws:
    """What costs.compute_cost reads of an Aws for an on-demand instance: its region."""
    region = "us-east-1"
    ec2 = None


def described(state: str, launched: datetime, reason_at: datetime | None = None, spot: bool = False) -> Instance:
    """A DescribeInstances entry as EC2 gives one (times in StateTransitionReason, GMT)."""
    return Instance.of({"InstanceId": "i-1", "InstanceType": "g4dn.xlarge", "LaunchTime": launched,
                        "State": {"Name": state}, "Placement": {"AvailabilityZone": "us-east-1a"},
                        **({"InstanceLifecycle": "spot"} if spot else {}),
                        "StateTransitionReason": f"User initiated ({reason_at:%Y-%m-%d %H:%M:%S} GMT)" if reason_at else ""})


def test_the_public_ipv4_address_and_the_gp3_root_volume_are_billed_beside_compute(tmp_path):
    from ec2gpu.aws import catalog
    # https://aws.amazon.com/vpc/pricing/: 0.005 USD per public IPv4 address-hour, since 2024-02-01
    parts = costs.address_and_disk("us-east-1", tmp_path, 3600, 43_200, 2000)
    assert parts["public_ipv4_usd"] == pytest.approx(0.005, abs=1e-6)
    # https://aws.amazon.com/ebs/pricing/'s example: 0.08 USD/GB-month x 2,000 GB x 43,200 s / (86,400 s x 30 days)
    assert parts["ebs_usd"] == pytest.approx(0.08 * 2000 * 43_200 / (86_400 * 30), abs=1e-6)
    assert costs.address_and_disk("us-east-1", tmp_path, 5, 5, 100)["ebs_usd"] == pytest.approx(
        100 * 0.08 * 60 / catalog.EBS_MONTH_SECONDS, abs=1e-6)  # 60 s minimum
    assert costs.address_and_disk("eu-west-1", tmp_path, 5, 5, 100)["ebs_usd"] is None  # no price known there
    assert costs.with_total({"compute_usd": 1.0, "public_ipv4_usd": 0.5, "ebs_usd": None})["cost_usd"] == 1.5
    assert costs.with_total({"compute_usd": None, "public_ipv4_usd": 0.5, "ebs_usd": 0.1})["cost_usd"] is None


def test_ebs_prices_are_regional_with_their_source_and_a_refreshed_cache_wins(tmp_path):
    import json

    from ec2gpu.aws import catalog
    gp3 = catalog.ebs_price("gp3", "us-west-2", tmp_path)
    assert gp3.usd_per_gb_month == 0.08 and "ebs/pricing" in gp3.source and catalog.EBS_PRICES_AS_OF in gp3.source
    assert catalog.ebs_price("snapshot", "us-east-2").usd_per_gb_month == 0.05
    assert catalog.ebs_price("gp3", "eu-central-1", tmp_path).usd_per_gb_month is None
    path = catalog.price_cache_path(tmp_path, "eu-central-1")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"fetched_at": "2026-11-20T00:00:00+00:00", "prices": {},
                                "storage": {"gp3": 0.0952, "snapshot": 0.054}}))
    got = catalog.ebs_price("gp3", "eu-central-1", tmp_path)
    assert got.usd_per_gb_month == 0.0952 and "Price List" in got.source


def test_the_price_list_gives_the_snapshot_price_of_the_standard_tier_not_the_archive_tier():
    import json

    from ec2gpu.aws import pricing

    def storage(usage: str, usd: str) -> str:
        return json.dumps({"product": {"productFamily": "Storage Snapshot", "attributes": {"usagetype": usage}},
                           "terms": {"OnDemand": {"t": {"priceDimensions": {"d": {
                               "unit": "GB-Mo", "pricePerUnit": {"USD": usd}}}}}}})
    listed = [storage("EUC1-EBS:SnapshotArchiveStorage", "0.0135"), storage("EUC1-EBS:SnapshotUsage", "0.054")]
    assert pricing.parse_storage_price(listed, "snapshot") == 0.054
    assert pricing.parse_storage_price([storage("EBS:SnapshotUsage", "0.05")], "snapshot") == 0.05
    assert pricing.parse_storage_price([], "gp3") is None


def test_intervals_follow_a_stop_and_a_start_and_each_start_pays_its_own_minute():
    from ec2gpu.runs.plan import intervals
    l1, s1, l2 = T0, T0 + timedelta(seconds=20), T0 + timedelta(hours=1)
    ivs = intervals.observe([], described("running", l1), l1, billing_start=l1 + timedelta(seconds=3))
    assert ivs == [{"launch": l1.isoformat(), "from": (l1 + timedelta(seconds=3)).isoformat(), "to": None}]
    ivs = intervals.observe(ivs, described("stopped", l1, s1), T0 + timedelta(minutes=5))  # dated by EC2, not now
    assert ivs[0]["to"] == s1.isoformat()
    ivs = intervals.observe(ivs, described("running", l2), l2 + timedelta(seconds=30))  # LaunchTime set again
    now = l2 + timedelta(seconds=30)
    assert len(ivs) == 2 and ivs[1]["to"] is None
    assert intervals.running_seconds(ivs, now) == 17 + 30  # not the hour it was stopped
    so_far = intervals.so_far(ivs, now, 0.526, "us-east-1", None, 100, l1)
    assert so_far["billed_seconds"] == 120  # two starts, a 60 s minimum each (not 60: one interval)
    assert so_far["compute_usd"] == pytest.approx(120 * 0.526 / 3600, abs=1e-6)
    assert so_far["public_ipv4_usd"] == pytest.approx(47 * 0.005 / 3600, abs=1e-6)
    # the volume is billed while stopped too
    assert so_far["ebs_usd"] == pytest.approx(100 * 0.08 * (now - l1).total_seconds() / (30 * 86400), abs=1e-6)
    parts = so_far["compute_usd"] + so_far["public_ipv4_usd"] + so_far["ebs_usd"]
    assert so_far["cost_usd"] == pytest.approx(parts, abs=1e-6)


def test_an_unseen_stop_closes_at_the_next_start_and_a_stopped_instance_terminated_keeps_its_stop():
    from ec2gpu.runs.plan import intervals
    l1, s1, l2 = T0, T0 + timedelta(minutes=2), T0 + timedelta(hours=1)
    ivs = intervals.observe([], described("running", l1), l1)
    after_restart = intervals.observe(ivs, described("running", l2), l2)  # stopped and started, never seen stopped
    assert after_restart[0]["to"] == l2.isoformat() and after_restart[0]["to_source"] == "next start"
    stopped = intervals.observe(ivs, described("stopped", l1, s1), l2)
    gone = intervals.observe(stopped, described("terminated", l1, l2), l2)  # `down` while stopped
    assert gone == stopped and gone[0]["to"] == s1.isoformat()  # compute ended at the stop


def test_a_terminated_standing_instance_is_billed_over_every_interval(tmp_path):
    from ec2gpu.runs.plan import intervals
    l1, s1, l2, t2 = T0, T0 + timedelta(seconds=100), T0 + timedelta(hours=2), T0 + timedelta(hours=2, seconds=10)
    att = {"launched_at": l1.isoformat(), "volume_gib": 100,
           "intervals": intervals.observe(intervals.observe([], described("running", l1), l1),
                                          described("stopped", l1, s1), s1)}
    bill = intervals.bill(_Aws(), tmp_path, att, described("terminated", l2, t2), t2 + timedelta(minutes=1))
    assert bill["billed_seconds"] == 100 + 60 and len(bill["intervals"]) == 2
    assert bill["compute_usd"] == pytest.approx(160 * 0.526 / 3600, abs=1e-6)
    assert bill["public_ipv4_usd"] == pytest.approx(110 * 0.005 / 3600, abs=1e-6)
    assert bill["ebs_usd"] == pytest.approx(100 * 0.08 * (t2 - l1).total_seconds() / (30 * 86400), abs=1e-6)
    assert bill["cost_usd"] == pytest.approx(bill["compute_usd"] + bill["public_ipv4_usd"] + bill["ebs_usd"], abs=1e-6)
    assert bill["terminated_at"] == t2.isoformat() and bill["launched_at"] == l1.isoformat()


# --- the spot estimate (ec2gpu/runs/plan/costs.py hourly_price) -------------------------------------
# The dearest zone's current price, an upper bound, capped by --max-price, refused only below
# the cheapest zone (runs/plan/costs.py hourly_price, aws/pricing.py).

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
    assert price.source == "spot now, highest of 3 zones"
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


# --- runs/plan/costs.py: the estimate ------------------------------------------------------------------
# A mutmut run over this module with the fast tier (issue 29, item 14) left these mutants alive;
# each test fails when the one token it pins changes (a limit, a bill, an estimate, a quota).

def _estimate(gpu, model, epochs=10, history=()):
    from ec2gpu.runs.plan import costs
    return costs.estimate("g5.xlarge", gpu, "on-demand", 1.0, "test", model, epochs, list(history))


def test_a_faster_gpu_takes_fewer_seconds_per_epoch_and_unknowns_take_the_t4_defaults():
    """Defaults: 30 s start-up + epochs x DEFAULT_EPOCH_SECONDS_T4[model] / GPU_SPEEDUP[gpu];
    a GPU not in the table counts as a T4 (1.0), a model not in it as 2.0 s an epoch."""
    assert _estimate("A10G", "cnn").train_seconds == 30 + 10 * 2.0 / 2.0
    assert _estimate("H100", "mlp").train_seconds == round(30 + 10 * 1.5 / 4.0, 1)
    assert _estimate("Z9", "cnn").train_seconds == 30 + 10 * 2.0
    assert _estimate("T4", "nosuchmodel").train_seconds == 30 + 10 * 2.0
    est = _estimate("A10G", "cnn")
    assert (est.boot_seconds, est.setup_seconds, est.teardown_seconds) == (150.0, 45.0, 75.0)
    assert est.billed_seconds == 150 + 45 + 40 + 75 and est.cost_usd == round(310 / 3600, 4)


def _trained(run_id, running, train_seconds, epochs, key="running", **extra):
    return {"run_id": run_id, "gpu": "A10G", "model": "cnn", "instance_type": "g5.xlarge",
            "phases": {key: running}, "train_seconds": train_seconds, "epochs": epochs, **extra}


def test_an_older_runs_training_phase_counts_as_its_job_and_startup_is_never_negative():
    # before the one engine the job's phase was "training": 100 s, of which 80 s of 4 epochs trained
    est = _estimate("A10G", "cnn", 10, [_trained("old", 100.0, 80.0, 4, key="training")])
    assert est.train_seconds == 20 + 10 * 20 and est.time_source.startswith("ledger (1 earlier run")
    # a job that reported more training than its phase: start-up 0, not below and not above
    est = _estimate("A10G", "cnn", 10, [_trained("odd", 50.0, 80.0, 4)])
    assert est.train_seconds == 0 + 10 * 20


def test_the_epoch_time_is_the_median_of_the_five_newest_runs_only():
    epochs_s = [10.0, 10.0, 10.0, 30.0, 30.0, 30.0]
    newest_first = [_trained(f"r{i}", 30.0 + e, e, 1) for i, e in enumerate(epochs_s)]  # start-up 30 s each
    # epoch seconds of the five newest: 10, 10, 10, 30, 30 -> 10; with the sixth (30) it would be 20
    assert _estimate("A10G", "cnn", 1, newest_first).train_seconds == 30 + 10


def test_phases_are_medians_of_the_five_newest_runs_of_the_type_and_a_missing_phase_counts_zero():
    from ec2gpu.runs.plan import costs

    rows = [{"instance_type": "g5.xlarge", "phases": {"requesting": b, "setup": 10.0}} for b in (5, 5, 5, 50, 50, 50)]
    boot, setup, teardown, same = costs._phase_seconds(rows, "g5.xlarge")
    assert (boot, setup, teardown, len(same)) == (5, 10.0, 0.0, 5)


def test_the_estimate_rounds_times_to_a_tenth_and_cost_to_four_digits():
    from ec2gpu.runs.plan import costs

    est = costs._priced(costs.Estimate("g5.xlarge", "spot", 1.2345, "x", 100.04, 20.03, 400.02, 61.04, "x"))
    assert est.billed_seconds == 581.1 and est.cost_usd == 0.1993


T0_BILL = datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)  # time zero of the bills below (T0 is another day)


# --- runs/plan/costs.py: the bill ---------------------------------------------------------------------

class _SpotHistory:
    """describe_spot_price_history over canned entries, filtered as EC2 filters them."""

    def __init__(self, entries):
        self.entries, self.asked = entries, []

    def get_paginator(self, name):
        assert name == "describe_spot_price_history"
        return self

    def paginate(self, InstanceTypes, ProductDescriptions, StartTime, AvailabilityZone=None, EndTime=None):
        self.asked.append((tuple(InstanceTypes), AvailabilityZone))
        rows = [h for h in self.entries if h["InstanceType"] in InstanceTypes
                and AvailabilityZone in (None, h["AvailabilityZone"]) and (EndTime is None or h["Timestamp"] <= EndTime)]
        return [{"SpotPriceHistory": rows}]


def _spot(itype, zone, ts, usd):
    return {"InstanceType": itype, "AvailabilityZone": zone, "Timestamp": ts, "SpotPrice": str(usd)}


def _instance(spot=False, zone="us-east-1b", itype="g4dn.xlarge", ended=T0_BILL + timedelta(hours=1)):
    return Instance.of({"InstanceId": "i-1", "InstanceType": itype, "LaunchTime": T0_BILL,
                        "Placement": {"AvailabilityZone": zone},
                        "StateTransitionReason": f"User initiated ({ended:%Y-%m-%d %H:%M:%S} GMT)",
                        **({"InstanceLifecycle": "spot"} if spot else {})})


def test_a_spot_bill_follows_its_own_zones_price_history(tmp_path):
    from ec2gpu.runs.plan import costs

    ec2 = _SpotHistory([_spot("g4dn.xlarge", "us-east-1b", T0_BILL - timedelta(hours=2), 0.30),
                        _spot("g4dn.xlarge", "us-east-1b", T0_BILL + timedelta(minutes=30), 0.50),
                        _spot("g4dn.xlarge", "us-east-1b", T0_BILL + timedelta(hours=3), 5.00),  # after the end
                        _spot("g4dn.xlarge", "us-east-1a", T0_BILL, 9.00),
                        _spot("g5.xlarge", "us-east-1b", T0_BILL, 7.00)])
    aws = SimpleNamespace(ec2=ec2, region="us-east-1")
    got = costs.compute_cost(aws, tmp_path, _instance(spot=True), T0_BILL, T0_BILL + timedelta(hours=1))
    assert got == {"usd_per_hour": 0.4, "compute_usd": 0.4,
                   "price_source": "spot price history of us-east-1b (2 prices in effect)"}
    assert ec2.asked == [(("g4dn.xlarge",), "us-east-1b")]


def test_billing_starts_when_the_instance_ran_not_when_it_was_launched(tmp_path):
    from ec2gpu.runs.plan import costs

    aws = SimpleNamespace(ec2=None, region="us-east-1")
    ran = T0_BILL + timedelta(minutes=10)
    row = costs.actual_cost(aws, tmp_path, _instance(), T0_BILL + timedelta(hours=5), billing_start=ran)
    assert row["billing_started_at"] == ran.isoformat() and row["billed_seconds"] == 3000.0
    assert row["compute_usd"] == round(3000 * 0.526 / 3600, 6)
    early = costs.actual_cost(aws, tmp_path, _instance(), T0_BILL + timedelta(hours=5),
                              billing_start=T0_BILL - timedelta(hours=1))
    assert early["billing_started_at"] == T0_BILL.isoformat() and early["billed_seconds"] == 3600.0
    assert costs.actual_cost(aws, tmp_path, _instance(), T0_BILL)["billed_seconds"] == 3600.0


def _refreshed_prices(home: Path, region="us-east-1", storage=None, **prices):
    import json

    from ec2gpu.aws import catalog

    path = catalog.price_cache_path(home, region)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fetched_at": "2026-11-01T00:00:00+00:00", "source": "test", "prices": prices,
                                **({"storage": storage} if storage else {})}))


def test_on_demand_prices_come_from_the_refreshed_cache_in_the_home(tmp_path):
    from ec2gpu.runs.plan import costs

    _refreshed_prices(tmp_path, **{"g4dn.xlarge": 0.9})
    aws = SimpleNamespace(ec2=None, region="us-east-1")
    price = costs.hourly_price(aws, tmp_path, "g4dn.xlarge", spot=False)
    assert price.usd_per_hour == 0.9 and price.source == "AWS Price List API, fetched 2026-11-01"
    assert costs.compute_cost(aws, tmp_path, _instance(), T0_BILL, T0_BILL + timedelta(hours=1))["usd_per_hour"] == 0.9


def test_the_spot_estimate_asks_for_its_own_type_only(tmp_path):
    from ec2gpu.runs.plan import costs

    ec2 = _SpotHistory([_spot("g4dn.xlarge", "us-east-1a", T0_BILL, 0.2), _spot("g5.xlarge", "us-east-1a", T0_BILL, 5.0)])
    price = costs.hourly_price(SimpleNamespace(ec2=ec2, region="us-east-1"), tmp_path, "g4dn.xlarge", spot=True)
    assert price.usd_per_hour == 0.2 and ec2.asked == [(("g4dn.xlarge",), None)]


def test_the_address_is_billed_while_running_and_never_below_zero(tmp_path):
    from ec2gpu.runs.plan import costs

    got = costs.address_and_disk("us-east-1", tmp_path, -10.0, 3600.0, None)
    assert got["public_ipv4_usd"] == 0.0 and got["ebs_usd"] is None


# --- runs/plan/costs.py: the refreshed cache in the bill, a refusal's hint, the expected minutes ----------
def test_the_actual_bill_uses_the_refreshed_compute_and_disk_prices_and_none_when_unknown(tmp_path):
    from ec2gpu.runs.plan import costs

    _refreshed_prices(tmp_path, storage={"gp3": 0.5}, **{"g4dn.xlarge": 0.9})
    aws = SimpleNamespace(ec2=None, region="us-east-1")
    row = costs.actual_cost(aws, tmp_path, _instance(), T0_BILL, volume_gib=100)
    assert row["usd_per_hour"] == 0.9 and row["compute_usd"] == 0.9
    assert row["ebs_price_source"] == "gp3 AWS Price List API, fetched 2026-11-01"
    unknown = costs.actual_cost(SimpleNamespace(ec2=None, region="xx-nowhere-1"), tmp_path, _instance(), T0_BILL)
    assert unknown["compute_usd"] is None and unknown["cost_usd"] is None


def test_a_max_price_below_every_zone_says_how_to_go_on(tmp_path):
    from ec2gpu.runs.plan import costs

    ec2 = _SpotHistory([_spot("g4dn.xlarge", "us-east-1a", T0_BILL, 0.2)])
    with pytest.raises(UsageError) as low:
        costs.hourly_price(SimpleNamespace(ec2=ec2, region="us-east-1"), tmp_path, "g4dn.xlarge", True, 0.1)
    assert low.value.hint == "raise --max-price, or see `ec2gpu prices`"


def test_the_expected_minutes_are_the_mean_of_this_tasks_completed_runs_on_this_type(tmp_path):
    from ec2gpu.runs.plan import costs
    from ec2gpu.runs.settle import ledger

    job = SimpleNamespace(name="t", history_key="t")
    assert costs.estimate_minutes(tmp_path, job, "g5.xlarge", None, "aws") == (
        None, "task t has not run on g5.xlarge before")
    assert costs.estimate_minutes(tmp_path, job, "g5.xlarge", 12.0, "aws") == (12.0, "--expect")
    rows = [("a", "t", "g5.xlarge", "completed", 600.0), ("b", "t", "g5.xlarge", "completed", 1200.0),
            ("c", "t", "g5.xlarge", "failed", 6000.0), ("d", "t", "g4dn.xlarge", "completed", 6000.0),
            ("e", "u", "g5.xlarge", "completed", 6000.0), ("f", "t", "g5.xlarge", "completed", None)]
    for run_id, task, itype, status, running in rows:
        ledger.record(tmp_path, {**_run(run_id, task, {"running": running} if running else {"setup": 5.0}, status),
                                 "instance_type": itype})
    ledger.record(tmp_path, {**_run("g", "t", {"running": 6000.0}), "instance_type": "g5.xlarge", "backend": "sandbox"})
    assert costs.estimate_minutes(tmp_path, job, "g5.xlarge", 99.0, "aws") == (
        15.0, "mean of 2 past runs of task t on g5.xlarge (ledger)")


def test_an_unreadable_ledger_leaves_the_expected_minutes_to_expect(tmp_path):
    from ec2gpu.runs.plan import costs
    from ec2gpu.runs.settle import ledger

    ledger.path_in(tmp_path).write_bytes(b"this is not a database" * 100)
    job = SimpleNamespace(name="t", history_key="t")
    assert costs.estimate_minutes(tmp_path, job, "g5.xlarge", 12.0, "aws") == (12.0, "--expect")
