"""Billing rules, spot price changes, the estimate, and instance termination times (pure)."""
from datetime import datetime, timedelta, timezone

import pytest

from ec2gpu.aws import instances
from ec2gpu.runs import costs

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
    assert e.time_source.startswith("ledger (1 earlier run(s) of cnn on T4)")


def test_estimate_without_a_price_has_no_cost():
    assert costs.estimate("g5.xlarge", "A10G", "on-demand", None, "none", "cnn", 1, []).cost_usd is None


@pytest.mark.parametrize("reason, expected", [
    ("User initiated (2026-11-21 10:02:03 GMT)", datetime(2026, 11, 21, 10, 2, 3, tzinfo=timezone.utc)),
    ("User initiated (2026-11-21 10:02:03 UTC)", datetime(2026, 11, 21, 10, 2, 3, tzinfo=timezone.utc)),
    ("", None),
])
def test_termination_time_comes_from_state_transition_reason(reason, expected):
    assert instances.transition_time({"StateTransitionReason": reason}) == expected


def test_max_price_goes_into_the_spot_options_only_for_spot():
    spec = instances.LaunchSpec(run_id="r", owner="o", name="n", instance_type="g4dn.xlarge", image_id="ami-1",
                                root_device_name="/dev/sda1", key_name="k", security_group_id="sg-1", spot=True,
                                max_price=0.2)
    assert instances.run_request(spec)["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "0.2000"
    on_demand = instances.LaunchSpec(**{**spec.__dict__, "spot": False})
    assert "InstanceMarketOptions" not in instances.run_request(on_demand)
