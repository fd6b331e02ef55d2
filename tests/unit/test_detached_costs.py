"""The cost of a detached run (runs/detached/costs.py, pure) and status.json's launches read as
hostile input (aws/runstore_records.launches): issue 30, item 2."""
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ec2gpu import api
from ec2gpu.aws import runstore, runstore_records
from ec2gpu.aws.instances import Instance
from ec2gpu.errors import UsageError
from ec2gpu.runs.detached import costs
from ec2gpu.wire import run_record

RUN = "20261125-100000-abcd"
T0 = datetime(2026, 11, 25, 10, 0, 0, tzinfo=timezone.utc)
OD = {"g4dn.xlarge": (0.526, "shipped table"), "g5.xlarge": (1.006, "shipped table")}


def _iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def _launch(iid: str, start: float, seen: float | None, n: int = 1) -> dict:
    return {"launch": n, "instance_id": iid, "started_at": _iso(start), "last_seen_at": None if seen is None else _iso(seen)}


def _prices(**kw) -> costs.Prices:
    return costs.Prices(kw.pop("on_demand", OD), **kw)


OD_FACTS = costs.Facts("g4dn.xlarge", "on-demand", None, "this machine's ledger (the run's first type)")


# --- cost ----------------------------------------------------------------------------------------

def test_a_launch_shorter_than_a_minute_pays_60_seconds():
    got = costs.cost([_launch("i-0123456789abcdef0", 0, 20)], _prices(), facts=OD_FACTS)
    [one] = got["per_instance"]
    assert one["billed_seconds"] == 60.0 and got["billed_seconds"] == 60.0
    assert one["compute_usd"] == pytest.approx(60 * 0.526 / 3600, abs=1e-6)
    assert one["times_source"] == "agent" and one["type_source"] == OD_FACTS.source
    assert got["cost_usd"] == pytest.approx(one["compute_usd"] + one["public_ipv4_usd"], abs=1e-6)  # no volume given
    assert got["upper_bound"] is False and got["unknown"] == [] and got["running"] is False


def test_billing_is_per_second_and_launches_add_up():
    launches = [_launch("i-00000001", 0, 125, 1), _launch("i-00000002", 200, 3800.5, 2)]
    got = costs.cost(launches, _prices(gp3_usd_per_gb_month=0.08, volume_gib=100), facts=OD_FACTS)
    first, second = got["per_instance"]
    assert (first["billed_seconds"], second["billed_seconds"]) == (125.0, 3600.5)
    assert got["billed_seconds"] == 3725.5
    assert second["compute_usd"] == pytest.approx(3600.5 * 0.526 / 3600, abs=1e-6)
    assert second["ebs_usd"] == pytest.approx(100 * 0.08 * 3600.5 / (30 * 86400), abs=1e-6)
    assert got["compute_usd"] == pytest.approx(first["compute_usd"] + second["compute_usd"], abs=1e-6)
    assert got["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in got["per_instance"]), abs=1e-6)
    assert got["times_source"] == {"instance": 0, "agent": 2}


def test_a_missing_price_gives_no_cost_and_says_why():
    got = costs.cost([_launch("i-00000001", 0, 100)], _prices(on_demand={}), facts=OD_FACTS)
    assert got["cost_usd"] is None and got["billed_seconds"] == 100.0
    assert got["unknown"] and "no on-demand price for g4dn.xlarge" in got["unknown"][0]
    unknown_type = costs.cost([_launch("i-00000001", 0, 100)], _prices(), facts=None)
    assert unknown_type["cost_usd"] is None and "instance type is not known" in unknown_type["unknown"][0]
    assert costs.cost([], _prices()) | {"per_instance": None} == {
        "billed_seconds": 0, "cost_usd": 0, "compute_usd": 0, "public_ipv4_usd": 0, "ebs_usd": 0,
        "per_instance": None, "price_source": None, "times_source": {"instance": 0, "agent": 0},
        "upper_bound": False, "running": False, "unknown": []}


def test_the_instances_own_times_and_type_win_over_the_agents():
    """The agent starts after the boot and writes its last heartbeat before the end: EC2's LaunchTime
    and termination time are the bill while DescribeInstances lists the instance."""
    inst = Instance(id="i-00000001", type="g5.xlarge", state="terminated", launched_at=T0 - timedelta(seconds=90),
                    market="on-demand", zone="us-east-1b", transitioned_at=T0 + timedelta(seconds=400))
    got = costs.cost([_launch("i-00000001", 0, 300), _launch("i-00000002", 500, 700, 2)], _prices(),
                     instances={"i-00000001": inst}, facts=OD_FACTS)
    listed, gone = got["per_instance"]
    assert listed["times_source"] == "instance" and listed["billed_seconds"] == 490.0
    assert listed["from"] == inst.launched_at.isoformat() and listed["to"] == inst.transitioned_at.isoformat()
    assert listed["instance_type"] == "g5.xlarge" and listed["type_source"] == "DescribeInstances"
    assert listed["compute_usd"] == pytest.approx(490 * 1.006 / 3600, abs=1e-6)
    assert gone["times_source"] == "agent" and gone["billed_seconds"] == 200.0 and gone["instance_type"] == "g4dn.xlarge"
    assert got["times_source"] == {"instance": 1, "agent": 1}


def test_a_running_instance_is_billed_to_now():
    inst = Instance(id="i-00000001", type="g4dn.xlarge", state="running", launched_at=T0)
    got = costs.cost([_launch("i-00000001", 30, 60)], _prices(now=T0 + timedelta(seconds=1000)),
                     instances={"i-00000001": inst})
    assert got["running"] is True and got["billed_seconds"] == 1000.0


def test_spot_pays_its_zones_price_history_and_without_it_the_on_demand_ceiling():
    inst = Instance(id="i-00000001", type="g4dn.xlarge", state="terminated", launched_at=T0, market="spot",
                    zone="us-east-1a", transitioned_at=T0 + timedelta(seconds=600))
    history = [(T0 - timedelta(hours=1), 0.2), (T0 + timedelta(seconds=300), 0.3)]
    got = costs.cost([_launch("i-00000001", 10, 500)], _prices(spot={("g4dn.xlarge", "us-east-1a"): history}),
                     instances={"i-00000001": inst})
    assert got["cost_usd"] - got["public_ipv4_usd"] == pytest.approx((300 * 0.2 + 300 * 0.3) / 3600, abs=1e-6)
    assert got["upper_bound"] is False and "spot price history of us-east-1a" in got["price_source"]
    ceiling = costs.cost([_launch("i-00000001", 0, 600)], _prices(),
                         facts=costs.Facts("g4dn.xlarge", "spot", None, "ledger"))
    assert ceiling["upper_bound"] is True and "spot's ceiling" in ceiling["price_source"]
    assert ceiling["compute_usd"] == pytest.approx(600 * 0.526 / 3600, abs=1e-6)


@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_a_detached_instance_is_billed_exactly_as_a_foreground_one(tmp_path, market):
    """One costs module (issue 45 item 2): an instance of a detached run, with the same times and
    prices, gets the very bill runs/plan/costs.actual_cost gives a foreground run's instance: its
    compute (spot price history or on-demand), its address and its volume, and their words."""
    from types import SimpleNamespace

    from ec2gpu.aws import catalog
    from ec2gpu.runs.plan import costs as plan
    ended = T0 + timedelta(seconds=3725)
    inst = Instance(id="i-00000001", type="g4dn.xlarge", state="terminated", launched_at=T0, market=market,
                    zone="us-east-1a", transitioned_at=ended)
    history = [(T0 - timedelta(hours=1), 0.2), (T0 + timedelta(seconds=300), 0.3)]

    class Ec2:  # DescribeSpotPriceHistory of that zone, for actual_cost
        def get_paginator(self, name):
            return self

        def paginate(self, **kw):
            return [{"SpotPriceHistory": [{"InstanceType": "g4dn.xlarge", "AvailabilityZone": "us-east-1a",
                                           "Timestamp": ts, "SpotPrice": str(usd)} for ts, usd in history]}]
    foreground = plan.actual_cost(SimpleNamespace(ec2=Ec2(), region="us-east-1"), tmp_path, inst, ended,
                                  volume_gib=100)
    od = catalog.on_demand_price("g4dn.xlarge", "us-east-1", tmp_path)
    prices = costs.Prices({"g4dn.xlarge": (od.usd_per_hour, od.source)}, {("g4dn.xlarge", "us-east-1a"): history},
                          catalog.ebs_price("gp3", "us-east-1", tmp_path).usd_per_gb_month, 100, ended)
    [detached] = costs.cost([_launch("i-00000001", 10, 3700)], prices, instances={"i-00000001": inst})["per_instance"]
    same = ("billed_seconds", "usd_per_hour", "compute_usd", "public_ipv4_usd", "ebs_usd", "cost_usd")
    assert {k: detached[k] for k in same} == {k: foreground[k] for k in same}
    assert detached["price_source"] == ("on-demand " if market == "on-demand" else "") + foreground["price_source"]


def test_a_group_of_several_types_bills_the_dearest_as_an_upper_bound():
    group = {"AutoScalingGroupName": f"ec2gpu-{RUN}", "MixedInstancesPolicy": {
        "LaunchTemplate": {"Overrides": [{"InstanceType": "g4dn.xlarge"}, {"InstanceType": "g5.xlarge"}]},
        "InstancesDistribution": {"OnDemandBaseCapacity": 0, "OnDemandPercentageAboveBaseCapacity": 0}}}
    facts = costs.group_facts(group)
    assert facts.type is None and facts.types == ("g4dn.xlarge", "g5.xlarge") and facts.market == "spot"
    got = costs.cost([_launch("i-00000001", 0, 3600)], _prices(), facts=facts)
    assert got["upper_bound"] is True and got["compute_usd"] == pytest.approx(1.006, abs=1e-6)
    one = costs.group_facts({"MixedInstancesPolicy": {"LaunchTemplate": {"Overrides": [{"InstanceType": "g5.xlarge"}]},
                                                      "InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 100}}})
    assert (one.type, one.market, one.types) == ("g5.xlarge", "on-demand", ())
    assert costs.group_facts({}) is None
    assert costs.ledger_facts({"instance_type": "g4dn.xlarge", "market": "spot"}).market == "spot"
    assert costs.ledger_facts({"instance_type": None}) is None and costs.ledger_facts(None) is None


# --- runstore_records.launches: hostile input -------------------------------------------------------------

def _status(instances, **more) -> bytes:
    return json.dumps({"run_id": RUN, "state": "succeeded", "instances": instances, **more}).encode()


def test_launches_keeps_what_the_agent_wrote_normalised():
    data = _status([{"launch": 1, "instance_id": "i-0123456789abcdef0", "started_at": "2026-11-25T10:00:00Z",
                     "last_seen_at": "2026-11-25T10:05:00+00:00", "setup_runs": 1, "resumed": False}])
    assert runstore_records.launches(data, RUN) == [{"launch": 1, "instance_id": "i-0123456789abcdef0",
                                             "started_at": "2026-11-25T10:00:00+00:00",
                                             "last_seen_at": "2026-11-25T10:05:00+00:00"}]
    assert runstore_records.launches(json.loads(data), RUN) == runstore_records.launches(data, RUN)  # a parsed record too


@pytest.mark.parametrize("entry", [
    "i-00000001", None, 7, [],
    {"instance_id": "i-../../etc", "started_at": "2026-11-25T10:00:00Z"},
    {"instance_id": "I-00000001", "started_at": "2026-11-25T10:00:00Z"},
    {"instance_id": "i-00000001\n", "started_at": "2026-11-25T10:00:00Z"},
    {"instance_id": "i-00000001", "started_at": "2026-13-45T10:00:00Z"},
    {"instance_id": "i-00000001", "started_at": "0001-01-01T00:00:00Z"},
    {"instance_id": "i-00000001", "started_at": 1764064800},
    {"instance_id": "i-00000001"},
])
def test_launches_drops_an_entry_without_an_instance_id_or_a_valid_start(entry):
    good = {"instance_id": "i-0000000f", "started_at": "2026-11-25T10:00:00Z"}
    assert [e["instance_id"] for e in runstore_records.launches(_status([entry, good]), RUN)] == ["i-0000000f"]


def test_launches_bounds_each_field_and_the_count():
    got = runstore_records.launches(_status([
        {"launch": True, "instance_id": "i-00000001", "started_at": "2026-11-25T10:00:00Z", "last_seen_at": "soon"},
        {"launch": 10 ** 12, "instance_id": "i-00000002", "started_at": "2026-11-25T10:00:00Z",
         "last_seen_at": "2026-11-25T09:00:00Z"},  # before its start
    ]), RUN)
    assert [(e["launch"], e["last_seen_at"]) for e in got] == [(None, None), (None, None)]
    many = [{"launch": n, "instance_id": f"i-{n:08x}", "started_at": "2026-11-25T10:00:00Z"} for n in range(1, 1501)]
    kept = runstore_records.launches(_status(many), RUN)
    # the newest MAX_LAUNCHES: the record's one bound on its entries (run_record.MAX_ENTRIES, what the agent keeps)
    assert len(kept) == runstore_records.MAX_LAUNCHES and kept[0]["launch"] == 1501 - runstore_records.MAX_LAUNCHES


def test_launches_merges_one_instance_recorded_twice():
    got = runstore_records.launches(_status([
        {"launch": 1, "instance_id": "i-00000001", "started_at": "2026-11-25T10:00:00Z", "last_seen_at": "2026-11-25T10:01:00Z"},
        {"launch": 2, "instance_id": "i-00000001", "started_at": "2026-11-25T09:59:00Z", "last_seen_at": "2026-11-25T10:09:00Z"},
    ]), RUN)
    assert got == [{"launch": 1, "instance_id": "i-00000001", "started_at": "2026-11-25T09:59:00+00:00",
                    "last_seen_at": "2026-11-25T10:09:00+00:00"}]


@pytest.mark.parametrize("data", [
    b"not json", b"[1, 2]", b'"text"', b"{" * 100_000, json.dumps({"run_id": "20200101-000000-0000", "instances": [
        {"instance_id": "i-00000001", "started_at": "2026-11-25T10:00:00Z"}]}).encode(),
    json.dumps({"run_id": RUN, "instances": {"i-00000001": {}}}).encode(),
    b" " * (run_record.MAX_BYTES + 1),
])
def test_launches_of_a_record_that_is_not_this_runs_object_are_none(data):
    assert runstore_records.launches(data, RUN) == []


# --- the API refuses before it opens a backend ----------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    ({"remote": True, "limit": 0}, "--limit 0"), ({"limit": -3}, "--limit -3"),
    ({"region": "us-east-2"}, "--region applies to --remote only"),
])
def test_list_runs_refuses_a_bad_limit_or_a_region_without_remote(no_backend, kwargs, words):
    with pytest.raises(UsageError, match=words):
        api.costs.list_runs(**kwargs)


@pytest.mark.parametrize("group, expected", [
    (None, ((), None)), ({"MixedInstancesPolicy": "x"}, ((), None)),
    ({"MixedInstancesPolicy": {"LaunchTemplate": {"Overrides": [{"InstanceType": "../x"}, "g5.xlarge", {}]}}},
     ((), None)),
    ({"MixedInstancesPolicy": {"LaunchTemplate": {"Overrides": [{"InstanceType": "g5.xlarge"}] * 3},
                               "InstancesDistribution": []}}, (("g5.xlarge",), "on-demand")),
    ({"MixedInstancesPolicy": {"LaunchTemplate": {"Overrides": [{"InstanceType": "g6.xlarge"}]},
                               "InstancesDistribution": {"OnDemandBaseCapacity": 1,
                                                         "OnDemandPercentageAboveBaseCapacity": 0}}},
     (("g6.xlarge",), "on-demand")),
])
def test_group_launches_reads_only_what_it_understands(group, expected):
    assert runstore_records.group_launches(group) == expected


def test_an_instance_of_the_run_that_status_json_does_not_record_is_billed_too():
    """status.json written over (or an agent that never wrote): what EC2 lists of the run still costs."""
    recorded = Instance(id="i-00000001", type="g4dn.xlarge", state="terminated", launched_at=T0,
                        transitioned_at=T0 + timedelta(seconds=100))
    silent = Instance(id="i-00000002", type="g4dn.xlarge", state="terminated", launched_at=T0,
                      transitioned_at=T0 + timedelta(seconds=300))
    launches = [_launch("i-00000001", 10, 90)]
    extra = costs.unrecorded(launches, [recorded, silent])
    assert [(e["instance_id"], e["in_status"]) for e in extra] == [("i-00000002", False)]
    got = costs.cost(launches + extra, _prices(), instances={i.id: i for i in (recorded, silent)})
    assert [(r["instance_id"], r["in_status"], r["billed_seconds"]) for r in got["per_instance"]] == [
        ("i-00000001", True, 100.0), ("i-00000002", False, 300.0)]


def test_runs_remote_renders_the_store_and_says_what_is_unknown(monkeypatch, capsys):
    from ec2gpu import cli
    from ec2gpu.api import costs as ops

    def rows(**_):  # list_runs(remote=True)'s record
        return ops.RemoteRunList(bucket="ec2gpu-123456789012-us-east-1", region="us-east-1", in_store=3, limit=50,
                                 since=None, runs=[
                    {"run_id": RUN, "state": "running", "attempt": 2, "interruptions": 1,
                     "started_at": "2026-11-25T10:00:00+00:00", "ended_at": None, "cost_usd": 0.1234,
                     "upper_bound": True, "cost": {"running": True, "unknown": []}, "in_ledger": True,
                     "ledger_status": "detached"},
                    {"run_id": "20261125-090000-0000", "state": "unreadable", "attempt": None, "interruptions": None,
                     "started_at": None, "ended_at": None, "cost_usd": None, "upper_bound": False,
                     "cost": {"running": False, "unknown": ["i-00000001: no on-demand price\x1b[31m"]},
                     "in_ledger": False, "ledger_status": None}])
    monkeypatch.setattr(ops, "list_runs", rows)
    assert cli.main(["runs", "--remote"]) == 0
    shown = capsys.readouterr().out
    assert "0.1234 max so far" in shown and "detached" in shown and "2 of the 3 runs in the store" in shown
    assert "cost unknown: i-00000001: no on-demand price" in shown and "\x1b[31m" not in shown
    assert cli.main(["runs", "--remote", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in body["runs"]] == [RUN, "20261125-090000-0000"] and set(body["runs"][0]) == set(ops.REMOTE_KEYS)


class _S3:
    """A run store of one bucket: put_object and get_object on a dict (S3's answers' shapes)."""

    def __init__(self):
        self.objects = {}

    def put_object(self, Bucket, Key, Body, **kw):
        self.objects[Key] = Body

    def get_object(self, Bucket, Key, **kw):
        import io
        import botocore.exceptions
        if Key not in self.objects:
            raise botocore.exceptions.ClientError({"Error": {"Code": "NoSuchKey"}}, "GetObject")
        return {"Body": io.BytesIO(self.objects[Key])}


def test_a_runs_instances_outlive_ec2s_memory_in_its_settled_json_and_keep_its_cost_exact():
    """Issue 30: EC2 forgets a terminated instance after about an hour; the first reader that sees
    the run over and every instance terminated keeps what EC2 said, so the cost stays exact."""
    s3, bucket, user = _S3(), "ec2gpu-123456789012-us-east-1", "AIDAEXAMPLEUSERID0001"
    spot = Instance("i-0aaaaaaaaaaaaaaa1", "g5.xlarge", "terminated", T0, market="spot", zone="us-east-1b",
                    transitioned_at=T0 + timedelta(seconds=600), tags={"ec2gpu:run": RUN})
    launches = {RUN: [_launch(spot.id, 30, 300)]}
    assert costs.settle((s3, bucket, user), launches, {spot.id: spot}, final=()) == {}
    assert s3.objects == {}  # not over yet: nothing kept
    costs.settle((s3, bucket, user), launches, {spot.id: spot}, final={RUN})
    assert runstore_records.get_settled(s3, bucket, user, RUN) == [{
        "instance_id": spot.id, "instance_type": "g5.xlarge", "market": "spot", "zone": "us-east-1b",
        "launched_at": T0.isoformat(), "terminated_at": (T0 + timedelta(seconds=600)).isoformat()}]
    # an hour later EC2 lists nothing: the instance comes from settled.json, its own times and type
    kept = costs.settle((s3, bucket, user), launches, {}, final={RUN})
    history = [(T0 - timedelta(hours=1), 0.4)]
    got = costs.cost(launches[RUN], _prices(spot={("g5.xlarge", "us-east-1b"): history}), kept)
    [row] = got["per_instance"]
    assert row["billed_seconds"] == 600.0 and row["times_source"] == costs.INSTANCE_TIMES and row["market"] == "spot"
    assert "settled.json" in row["type_source"] and row["compute_usd"] == round(0.4 * 600 / 3600, 6)
    # what the run's role could have written there is read as hostile input
    key = runstore.prefix(user, RUN) + runstore_records.SETTLED
    for bad in ({"run_id": "20261125-100000-ffff", "instances": [{}]}, {"run_id": RUN, "instances": [
            {"instance_id": spot.id, "instance_type": "g5.xlarge; rm", "market": "spot", "zone": "us-east-1b",
             "launched_at": T0.isoformat(), "terminated_at": T0.isoformat()},
            {"instance_id": spot.id, "instance_type": "g5.xlarge", "market": "spot", "zone": "us-east-1b",
             "launched_at": T0.isoformat(), "terminated_at": (T0 - timedelta(seconds=1)).isoformat()}]}):
        s3.objects[key] = json.dumps(bad).encode()
        assert runstore_records.get_settled(s3, bucket, user, RUN) == []
    s3.objects[key] = b"x" * (runstore_records.MAX_SETTLED_BYTES + 1)
    assert runstore_records.get_settled(s3, bucket, user, RUN) == []


def test_status_json_naming_another_runs_instance_bills_it_to_neither_twice(monkeypatch):
    """Issue 44.7: the run's own job can write its status.json, and named another run's instance
    there, which was then billed to this run too; now only instances EC2 lists under this run's tag
    (or does not list at all) are billed here, and the others are named."""
    from types import SimpleNamespace

    from ec2gpu.aws import groups, sweep
    other = "20261125-090000-0000"
    mine = Instance(id="i-00000001", type="g4dn.xlarge", state="terminated", launched_at=T0,
                    transitioned_at=T0 + timedelta(seconds=100), tags={"ec2gpu:run": RUN})
    theirs = Instance(id="i-00000002", type="g5.xlarge", state="terminated", launched_at=T0,
                      transitioned_at=T0 + timedelta(seconds=3600), tags={"ec2gpu:run": other})
    kept, refused = costs.own_launches([_launch(mine.id, 0, 90), _launch(theirs.id, 0, 3500),
                                        _launch("i-00000003", 0, 60)], RUN, {i.id: i for i in (mine, theirs)})
    assert [k["instance_id"] for k in kept] == [mine.id, "i-00000003"] and refused == [theirs.id]
    monkeypatch.setattr(sweep, "find_instances", lambda ec2, run_id, states=None: [mine, theirs])
    monkeypatch.setattr(groups, "find_groups", lambda client: [])
    aws = SimpleNamespace(ec2=None, region="us-east-1", client=lambda name: None)
    got = costs.gather(aws, Path("/nonexistent"), {RUN: [_launch(mine.id, 0, 90), _launch(theirs.id, 0, 3500)],
                                                   other: [_launch(theirs.id, 0, 3500)]}, {}, None)
    assert [r["instance_id"] for r in got[RUN]["per_instance"]] == [mine.id] and got[RUN]["not_this_runs"] == [theirs.id]
    assert [r["instance_id"] for r in got[other]["per_instance"]] == [theirs.id] and got[other]["not_this_runs"] == []
    assert got[RUN]["billed_seconds"] == 100.0 and got[other]["billed_seconds"] == 3600.0


def test_a_final_runs_launch_that_neither_ec2_nor_its_settled_json_names_is_not_billed(monkeypatch):
    """Review of issue 44 (round 3): once EC2 forgot another run's instance (an hour after it ended),
    a status.json naming it billed it here by the agent's times. A final run's settled.json names
    every instance of the run at its end: a launch it lacks, which EC2 no longer lists either, is
    not this run's. Without a settled.json (nobody looked within the hour) the agent's times stand."""
    from types import SimpleNamespace

    from ec2gpu.aws import groups, sweep
    s3, bucket, user = _S3(), "ec2gpu-123456789012-us-east-1", "AIDAEXAMPLEUSERID0001"
    mine = Instance(id="i-00000001", type="g4dn.xlarge", state="terminated", launched_at=T0, zone="us-east-1a",
                    transitioned_at=T0 + timedelta(seconds=100), tags={"ec2gpu:run": RUN})
    costs.settle((s3, bucket, user), {RUN: [_launch(mine.id, 0, 90)]}, {mine.id: mine}, final={RUN})  # the run's end
    monkeypatch.setattr(sweep, "find_instances", lambda ec2, run_id, states=None: [])  # an hour on: EC2 forgot both
    monkeypatch.setattr(groups, "find_groups", lambda client: [])
    aws = SimpleNamespace(ec2=None, region="us-east-1", client=lambda name: None)
    later = "20261125-110000-abcd"  # a final run that was never settled
    launches = {RUN: [_launch(mine.id, 0, 90), _launch("i-00000002", 0, 3500)], later: [_launch("i-00000003", 0, 60)]}
    rows = {r: {"instance_type": "g4dn.xlarge", "market": "on-demand"} for r in launches}
    got = costs.gather(aws, Path("/nonexistent"), launches, rows, None, store=(s3, bucket, user), final={RUN, later})
    assert [r["instance_id"] for r in got[RUN]["per_instance"]] == [mine.id] and got[RUN]["billed_seconds"] == 100.0
    assert got[RUN]["not_this_runs"] == ["i-00000002"]
    assert [r["instance_id"] for r in got[later]["per_instance"]] == ["i-00000003"] and got[later]["not_this_runs"] == []
