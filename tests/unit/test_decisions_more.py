"""More decisions at their edges, pure: the survivors of a mutmut run over aws/capacity.py,
runs/plan/costs.py, runs/plan/limits.py and tasks/mounts.py with the fast tier (issue 29, item 14) that
change what ec2gpu decides (a limit, a bill, an estimate, a quota, what is copied where), each
pinned here by a test that fails when that one token changes.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import botocore.exceptions
import pytest

from ec2gpu.aws.instances import Instance
from ec2gpu.errors import UsageError

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)


# --- runs/plan/limits.py -----------------------------------------------------------------------------

def test_max_runtime_is_at_least_one_whole_minute_rounded_up():
    from ec2gpu.runs.plan import limits

    assert limits.parse("1m") == (True, 1)
    assert limits.parse(1) == (True, 1)
    assert limits.parse("90s") == (True, 2)  # 1.5 min: never fewer than asked
    assert limits.parse("60s") == (True, 1)
    with pytest.raises(UsageError, match="at least 1 minute"):
        limits.parse("59s")
    with pytest.raises(UsageError) as refused:
        limits.parse("soon")
    assert refused.value.hint == "e.g. --max-runtime 90m, 4h, or none (no limit)"


@pytest.mark.parametrize("minutes,said", [(59, "59 min"), (60, "60 min"), (90, "90 min"), (120, "2 h"),
                                          (121, "121 min"), (150, "150 min"), (180, "3 h"), (None, "no limit")])
def test_a_limit_is_said_in_hours_from_two_whole_hours(minutes, said):
    from ec2gpu.runs.plan import limits

    assert limits.Limit(minutes, "x").words() == said


def _run(run_id, task, phases, status="completed"):
    return {"run_id": run_id, "command": "run", "backend": "aws", "status": status, "task": task,
            "started_at": T0.isoformat(), "phases": phases}


def test_the_longest_run_counts_any_positive_time_and_never_an_empty_one(tmp_path):
    from ec2gpu.runs.settle import ledger
    from ec2gpu.runs.plan import limits

    ledger.record(tmp_path, _run("empty", "t", {}))
    assert limits.longest_run(tmp_path, "t", "aws") is None
    ledger.record(tmp_path, _run("short", "t", {"running": 0.5}))
    ledger.record(tmp_path, _run("failed", "t", {"running": 9999.0}, status="failed"))
    assert limits.longest_run(tmp_path, "t", "aws") == (0.5, "short")


def test_the_grace_is_never_negative_and_the_stop_time_follows_the_grace_setting():
    from ec2gpu.runs.plan import limits

    assert limits.grace_seconds(60, 0) == 0.0 and limits.grace_seconds(60, -5) == 0.0
    inst = Instance("i-1", "g4dn.xlarge", "running", T0)
    # 60 min limit, 30 s of grace: SIGTERM 30 s + 300 s (nologin) before the end
    assert limits.stop_at(inst, 60, 30) == T0.timestamp() + 3600 - 330
    assert limits.stop_at(inst, 60) == T0.timestamp() + 3600 - 420


# --- runs/plan/costs.py: the estimate ------------------------------------------------------------------

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


def _instance(spot=False, zone="us-east-1b", itype="g4dn.xlarge", ended=T0 + timedelta(hours=1)):
    return Instance.of({"InstanceId": "i-1", "InstanceType": itype, "LaunchTime": T0,
                        "Placement": {"AvailabilityZone": zone},
                        "StateTransitionReason": f"User initiated ({ended:%Y-%m-%d %H:%M:%S} GMT)",
                        **({"InstanceLifecycle": "spot"} if spot else {})})


def test_a_spot_bill_follows_its_own_zones_price_history(tmp_path):
    from ec2gpu.runs.plan import costs

    ec2 = _SpotHistory([_spot("g4dn.xlarge", "us-east-1b", T0 - timedelta(hours=2), 0.30),
                        _spot("g4dn.xlarge", "us-east-1b", T0 + timedelta(minutes=30), 0.50),
                        _spot("g4dn.xlarge", "us-east-1b", T0 + timedelta(hours=3), 5.00),  # after the end
                        _spot("g4dn.xlarge", "us-east-1a", T0, 9.00),
                        _spot("g5.xlarge", "us-east-1b", T0, 7.00)])
    aws = SimpleNamespace(ec2=ec2, region="us-east-1")
    got = costs.compute_cost(aws, tmp_path, _instance(spot=True), T0, T0 + timedelta(hours=1))
    assert got == {"usd_per_hour": 0.4, "compute_usd": 0.4,
                   "price_source": "spot price history of us-east-1b (2 price(s) in effect)"}
    assert ec2.asked == [(("g4dn.xlarge",), "us-east-1b")]


def test_billing_starts_when_the_instance_ran_not_when_it_was_launched(tmp_path):
    from ec2gpu.runs.plan import costs

    aws = SimpleNamespace(ec2=None, region="us-east-1")
    ran = T0 + timedelta(minutes=10)
    row = costs.actual_cost(aws, tmp_path, _instance(), T0 + timedelta(hours=5), billing_start=ran)
    assert row["billing_started_at"] == ran.isoformat() and row["billed_seconds"] == 3000.0
    assert row["compute_usd"] == round(3000 * 0.526 / 3600, 6)
    early = costs.actual_cost(aws, tmp_path, _instance(), T0 + timedelta(hours=5), billing_start=T0 - timedelta(hours=1))
    assert early["billing_started_at"] == T0.isoformat() and early["billed_seconds"] == 3600.0
    assert costs.actual_cost(aws, tmp_path, _instance(), T0)["billed_seconds"] == 3600.0


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
    assert costs.compute_cost(aws, tmp_path, _instance(), T0, T0 + timedelta(hours=1))["usd_per_hour"] == 0.9


def test_the_spot_estimate_asks_for_its_own_type_only(tmp_path):
    from ec2gpu.runs.plan import costs

    ec2 = _SpotHistory([_spot("g4dn.xlarge", "us-east-1a", T0, 0.2), _spot("g5.xlarge", "us-east-1a", T0, 5.0)])
    price = costs.hourly_price(SimpleNamespace(ec2=ec2, region="us-east-1"), tmp_path, "g4dn.xlarge", spot=True)
    assert price.usd_per_hour == 0.2 and ec2.asked == [(("g4dn.xlarge",), None)]


def test_the_address_is_billed_while_running_and_never_below_zero(tmp_path):
    from ec2gpu.runs.plan import costs

    got = costs.address_and_disk("us-east-1", tmp_path, -10.0, 3600.0, None)
    assert got["public_ipv4_usd"] == 0.0 and got["ebs_usd"] is None


# --- aws/capacity.py ----------------------------------------------------------------------------

class _Described:
    """describe_instances honouring its instance-state-name filter; describe_instance_types answers nothing."""

    def __init__(self, instances):
        self.instances = instances

    def get_paginator(self, name):
        return SimpleNamespace(paginate=lambda **kw: self._pages(name, kw))

    def _pages(self, name, kw):
        if name == "describe_instance_types":
            return [{"InstanceTypes": []}]
        (f,) = kw["Filters"]
        assert f["Name"] == "instance-state-name"
        return [{"Reservations": [{"Instances": [i for i in self.instances if i["State"]["Name"] in f["Values"]]}]}]


def test_vcpus_in_use_count_pending_and_running_only_and_an_unknown_type_by_its_cpu_options():
    from ec2gpu.aws import capacity

    ec2 = _Described([{"InstanceType": "g4dn.xlarge", "State": {"Name": "pending"}},
                      {"InstanceType": "g4dn.xlarge", "State": {"Name": "running"}},
                      {"InstanceType": "g4dn.xlarge", "State": {"Name": "stopped"}},
                      {"InstanceType": "g99.new", "State": {"Name": "running"},
                       "CpuOptions": {"CoreCount": 3, "ThreadsPerCore": 2}},
                      {"InstanceType": "g98.new", "State": {"Name": "running"}}])
    assert capacity.gvt_vcpus_in_use(ec2, False) == 4 + 4 + 3 * 2 + 1


def test_an_unreadable_quota_is_said_and_not_checked():
    from ec2gpu.aws import capacity

    class Quotas:
        def get_service_quota(self, **kw):
            raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}},
                                                  "GetServiceQuota")
    said: list[str] = []
    assert capacity.check_quota(Quotas(), _Described([]), "g4dn.xlarge", False, log=said.append) is None
    assert len(said) == 1 and said[0].startswith("could not read the vCPU quota L-DB2E81BA (")
    assert said[0].endswith("); not checked") and "AccessDenied" in said[0]


# --- tasks/mounts.py ----------------------------------------------------------------------------

def _entry(target, value, base=Path("/nowhere"), warnings=None):
    from ec2gpu.tasks import mounts
    return mounts.entry(target, value, base, lambda p: p, [] if warnings is None else warnings)


@pytest.mark.parametrize("target", ["/", "~", "../up", "a b", "~other/x"])
def test_every_kind_of_entry_checks_its_target(target):
    for value in ("s3://my-bucket/x", {"name": "my-bucket"}):
        with pytest.raises(ValueError):
            _entry(target, value)


def test_a_plain_s3_url_is_copied_once_and_never_written_back():
    from ec2gpu.tasks.mounts import Mount

    assert _entry("/data", "s3://my-bucket/ds/") == Mount("/data", "s3", "s3://my-bucket/ds/", "COPY", "my-bucket",
                                                          "ds/")


@pytest.mark.parametrize("mode,back", [("COPY", False), ("MOUNT", True), ("MOUNT_CACHED", True)])
def test_a_storage_entry_writes_back_only_in_a_mount_mode(mode, back):
    from ec2gpu.tasks.mounts import Mount

    assert _entry("/out", {"name": "my-bucket", "mode": mode}) == Mount(
        "/out", "s3", "s3://my-bucket", mode, "my-bucket", "", write_back=back, create=True)
    assert _entry("/in", {"source": "s3://my-bucket/p", "mode": mode, "store": "S3"}) == Mount(
        "/in", "s3", "s3://my-bucket/p", mode, "my-bucket", "p", write_back=back)


def test_a_storage_entry_in_another_store_is_refused():
    for store in ("gcs", "azure", "r2"):
        with pytest.raises(ValueError, match=f"store '{store}': ec2gpu reaches S3 only"):
            _entry("/d", {"source": "s3://my-bucket/p", "store": store})
    assert _entry("/d", {"source": "s3://my-bucket/p", "store": "s3"}).bucket == "my-bucket"


def test_a_storage_entry_with_a_local_source_is_sent_from_the_task_files_directory(tmp_path):
    from ec2gpu.tasks.mounts import Mount

    (tmp_path / "data").mkdir()
    (tmp_path / "w.bin").write_bytes(b"x")
    warnings: list[str] = []
    assert _entry("/d", {"source": "data", "name": "my-bucket"}, tmp_path, warnings) == Mount(
        "/d", "local", str(tmp_path / "data"))
    assert warnings == ["file_mounts./d: the local source is sent to the instance; no bucket my-bucket is made"]
    assert _entry("~/w", "w.bin", tmp_path) == Mount("~/w", "local", str(tmp_path / "w.bin"), is_file=True)


@pytest.mark.parametrize("value", ["", "   ", 3, None])
def test_an_empty_or_non_text_source_is_refused(value):
    with pytest.raises(ValueError, match="give a local path, s3://BUCKET/PREFIX, or a storage entry"):
        _entry("/d", value)


@pytest.mark.parametrize("source,said", [
    ("https://acct.blob.core.windows.net/c/x", "is in Azure Blob Storage: ec2gpu copies from S3 only"),
    ("HTTP://acct.blob.core.windows.net/c/x", "is in Azure Blob Storage: ec2gpu copies from S3 only"),
    ("https://example.com/data.tar", "https:// is not a store ec2gpu reads"),
    ("ftp://example.com/data", "ftp:// is not a store ec2gpu reads"),
    ("gs://bucket/x", "is in Google Cloud Storage"),
])
def test_other_stores_are_refused_by_name(source, said):
    with pytest.raises(ValueError, match=said.replace("/", "/").replace(".", r"\.")):
        _entry("/d", source)


# --- more edges: hints, the refreshed cache in the bill, the role, the ledger that cannot be read ----

def test_the_actual_bill_uses_the_refreshed_compute_and_disk_prices_and_none_when_unknown(tmp_path):
    from ec2gpu.runs.plan import costs

    _refreshed_prices(tmp_path, storage={"gp3": 0.5}, **{"g4dn.xlarge": 0.9})
    aws = SimpleNamespace(ec2=None, region="us-east-1")
    row = costs.actual_cost(aws, tmp_path, _instance(), T0, volume_gib=100)
    assert row["usd_per_hour"] == 0.9 and row["compute_usd"] == 0.9
    assert row["ebs_price_source"] == "gp3 AWS Price List API, fetched 2026-11-01"
    unknown = costs.actual_cost(SimpleNamespace(ec2=None, region="xx-nowhere-1"), tmp_path, _instance(), T0)
    assert unknown["compute_usd"] is None and unknown["cost_usd"] is None


def test_refusals_carry_their_hint():
    from ec2gpu.runs.plan import limits

    with pytest.raises(UsageError) as short:
        limits.parse("59s")
    assert short.value.hint == "e.g. --max-runtime 90m, 4h, or none (no limit)"


def test_a_max_price_below_every_zone_says_how_to_go_on(tmp_path):
    from ec2gpu.runs.plan import costs

    ec2 = _SpotHistory([_spot("g4dn.xlarge", "us-east-1a", T0, 0.2)])
    with pytest.raises(UsageError) as low:
        costs.hourly_price(SimpleNamespace(ec2=ec2, region="us-east-1"), tmp_path, "g4dn.xlarge", True, 0.1)
    assert low.value.hint == "raise --max-price, or see `ec2gpu prices`"


def test_a_quota_refusal_says_how_to_raise_it():
    from ec2gpu.aws import capacity
    from ec2gpu.errors import CapacityError

    class Quotas:
        def get_service_quota(self, **kw):
            return {"Quota": {"Value": 0}}
    for spot, market in ((False, "on-demand"), (True, "spot")):
        with pytest.raises(CapacityError) as refused:
            capacity.check_quota(Quotas(), _Described([]), "g4dn.xlarge", spot)
        assert refused.value.hint == capacity.quota_hint(market) and refused.value.hint


def test_the_spot_role_is_there_missing_or_unknown():
    from ec2gpu.aws import capacity

    class Iam:
        def __init__(self, code=None):
            self.code = code

        def get_role(self, RoleName):
            assert RoleName == "AWSServiceRoleForEC2Spot"
            if self.code:
                raise botocore.exceptions.ClientError({"Error": {"Code": self.code, "Message": "x"}}, "GetRole")
            return {"Role": {"RoleName": RoleName}}
    assert capacity.spot_role_exists(Iam()) is True
    assert capacity.spot_role_exists(Iam("NoSuchEntity")) is False
    assert capacity.spot_role_exists(Iam("AccessDenied")) is None


def test_an_unreadable_ledger_gives_no_history_rather_than_stopping_the_run(tmp_path):
    from ec2gpu.runs.settle import ledger
    from ec2gpu.runs.plan import limits

    ledger.path_in(tmp_path).write_bytes(b"this is not a database" * 100)
    assert limits.longest_run(tmp_path, "t", "aws") is None
    assert limits.for_task(tmp_path, "t", "aws").minutes == limits.FIRST_RUN_MINUTES


def test_the_longest_run_looks_back_500_runs(tmp_path):
    from ec2gpu.runs.settle import ledger
    from ec2gpu.runs.plan import limits

    ledger.record(tmp_path, {**_run("oldest", "t", {"running": 9000.0}), "started_at": (T0 - timedelta(days=1)).isoformat()})
    for i in range(500):
        ledger.record(tmp_path, {**_run(f"r{i:03}", "t", {"running": 10.0 + i}),
                                 "started_at": (T0 + timedelta(seconds=i)).isoformat()})
    assert limits.longest_run(tmp_path, "t", "aws") == (509.0, "r499")


def test_the_expected_minutes_are_the_mean_of_this_tasks_completed_runs_on_this_type(tmp_path):
    from ec2gpu.runs.plan import costs
    from ec2gpu.runs.settle import ledger

    job = SimpleNamespace(name="t")
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
        15.0, "mean of 2 past run(s) of task t on g5.xlarge (ledger)")


@pytest.mark.parametrize("target,ok", [("/" + "a" * 1023, True), ("/" + "a" * 1024, False), ("/d\x7f", False),
                                       ("/d\x1f", False), ("/d e", False)])
def test_a_target_is_at_most_1024_characters_of_the_allowed_ones(target, ok):
    from ec2gpu.tasks import mounts

    if ok:
        assert mounts.check_target(target) == target
    else:
        with pytest.raises(ValueError):
            mounts.check_target(target)
    if len(target) > 1024:
        with pytest.raises(ValueError, match="is not a path"):
            mounts.check_target(target)


def test_paths_on_the_instance_join_without_doubled_slashes():
    from ec2gpu.tasks import mounts

    assert mounts.parse_s3("s3://my-bucket//p/q") == ("my-bucket", "p/q")
    assert mounts.on_instance("~/x", "/home/u/") == "/home/u/x"
    assert mounts.on_instance("/data", "/home/u", root="/sandbox/i-1/") == "/sandbox/i-1/data"
    assert mounts.on_instance("/data", "/home/u") == "/data"


def test_an_unreadable_ledger_leaves_the_expected_minutes_to_expect(tmp_path):
    from ec2gpu.runs.plan import costs
    from ec2gpu.runs.settle import ledger

    ledger.path_in(tmp_path).write_bytes(b"this is not a database" * 100)
    assert costs.estimate_minutes(tmp_path, SimpleNamespace(name="t"), "g5.xlarge", 12.0, "aws") == (12.0, "--expect")
