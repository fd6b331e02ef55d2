"""An instance that ends before it is running (issue 51, item 10, the launch phase): a spot
instance reclaimed at launch, a volume limit, an internal error. EC2's waiter fails on it; what
ended is read from the waiter's last DescribeInstances (state and StateReason code, never its
text): a pool goes on with the others, any other run launches the attempt again elsewhere, and an
instance that never ran is billed nothing (EC2 bills from running)."""
from datetime import datetime, timezone
from types import SimpleNamespace

import botocore.exceptions
import pytest

from ec2gpu.aws import instances
from ec2gpu.aws.instances import Instance
from ec2gpu.runs.execute import engine
from ec2gpu.runs.options import PoolOptions, RunOptions
from ec2gpu.runs.provision import pipeline, resources
from ec2gpu.runs.recover import recovery
from ec2gpu.tasks import load

T0 = datetime(2026, 11, 29, 7, 0, tzinfo=timezone.utc)


class _UI:
    def __init__(self):
        self.notes: list[str] = []

    def phase(self, name):
        from contextlib import nullcontext
        return nullcontext()

    def note(self, text):
        self.notes.append(text)


def _described(states: dict[str, str]) -> dict:
    return {"Reservations": [{"Instances": [
        {"InstanceId": i, "State": {"Name": st},
         **({"StateReason": {"Code": "Server.SpotInstanceTermination", "Message": "Spot instance termination"}}
            if st == "terminated" else {})} for i, st in states.items()]}]}


class _Ec2:
    """instance_running's waiter failing as EC2's does once one instance is terminated."""

    def __init__(self, states):
        self.meta = SimpleNamespace(events=SimpleNamespace(register=lambda *a: None, unregister=lambda *a: None))
        self.states = states

    def get_waiter(self, name):
        states = self.states

        class Waiter:
            def wait(self, **_):
                raise botocore.exceptions.WaiterError(name, "terminal failure state", _described(states))
        return Waiter()


def test_an_instance_that_ends_before_running_is_named_with_its_state_reason_code():
    with pytest.raises(instances.EndedBeforeRunning) as got:
        instances.wait_running(_Ec2({"i-1": "running", "i-2": "terminated"}), ["i-1", "i-2"])
    assert got.value.ended == {"i-2": ("terminated", "Server.SpotInstanceTermination")}
    assert got.value.message == "instance i-2 (terminated: Server.SpotInstanceTermination) ended before running"


def _inst(k: int, zone: str = "us-east-1a") -> Instance:
    return Instance(id=f"i-{k}", type="g4dn.xlarge", state="running", public_ip=None, private_ip=None,
                    zone=zone, launched_at=T0, market="spot")


def test_a_pool_goes_on_with_the_instances_that_did_not_end_and_a_run_does_not(monkeypatch):
    calls = []

    def wait_running(ec2, ids):
        calls.append(list(ids))
        if "i-2" in ids:
            raise instances.EndedBeforeRunning("instance i-2 (terminated) ended before running", "",
                                               {"i-2": ("terminated", "Server.SpotInstanceTermination")})
        return [_inst(int(i[-1])) for i in ids]
    monkeypatch.setattr(instances, "wait_running", wait_running)
    ui = _UI()
    got = resources._running(None, ["i-1", "i-2", "i-3"], True, ui)
    assert sorted(got) == ["i-1", "i-3"] and calls == [["i-1", "i-2", "i-3"], ["i-1", "i-3"]]
    assert "the pool goes on with 2 of 3 instances" in ui.notes[0]
    with pytest.raises(instances.EndedBeforeRunning):  # a run's node: the attempt is launched again
        resources._running(None, ["i-1", "i-2"], False, ui)
    with pytest.raises(instances.EndedBeforeRunning):  # a pool with none left
        resources._running(None, ["i-2"], True, ui)


def test_a_run_whose_node_ended_before_running_is_launched_again_elsewhere_and_that_node_costs_nothing(
        monkeypatch, tmp_path):
    job = engine.TaskJob(load.parse("name: t\nrun: python train.py\n"), {}, None)
    opts = RunOptions(task=job, spot=True, nodes=2, max_attempts=3, out=tmp_path)
    prov = resources.Provisioned(run_id="r1")
    launches, ended, billed = [], [], []

    def provision(aws, settings, o, run_id, ui, p, avoid_zones=()):
        launches.append(list(avoid_zones))
        if len(launches) == 1:
            p.instances += [_inst(1, "us-east-1a"), _inst(2, "us-east-1a")]
            raise instances.EndedBeforeRunning("instance i-2 (terminated: Server.SpotInstanceTermination) ended "
                                               "before running", "", {"i-2": ("terminated",
                                                                              "Server.SpotInstanceTermination")})
        p.instances += [_inst(3, "us-east-1b"), _inst(4, "us-east-1b")]
        return p.instances[-2:]

    def end_instances(aws, p, ids, ui):
        ended.extend(ids)
        p.ended.update(ids)
    monkeypatch.setattr(pipeline.provision, "provision", provision)
    monkeypatch.setattr(pipeline.provision, "end_instances", end_instances)
    monkeypatch.setattr(pipeline.provision, "bill", lambda aws, s, rows, p, ui: billed.extend(
        r.update(cost_usd=0.01) or r["instance_id"] for r in rows))
    monkeypatch.setattr(pipeline.handover, "start", lambda *a, **k: None)
    monkeypatch.setattr(pipeline, "_ledger", lambda *a: None)
    monkeypatch.setattr(pipeline.foreground, "run_attempt", lambda aws, s, o, run_id, ui, p, nodes, *a, **k:
                        {"ran_on": [n.id for n in nodes]})
    record = {"attempts": []}
    ui = _UI()
    got = pipeline._run_attempts(SimpleNamespace(), SimpleNamespace(home=tmp_path), opts, "r1", ui, prov, tmp_path,
                                 SimpleNamespace(name="aws"), record)
    assert got == {"ran_on": ["i-3", "i-4"]}
    assert launches == [[], ["us-east-1a"]]  # the second launch tries the zone it ended in last
    assert ended == ["i-1", "i-2"]  # the other node of that launch ended too
    first = [a for a in record["attempts"] if a["attempt"] == 1]
    assert [(a["instance_id"], a["ended"]) for a in first] == [
        ("i-1", "another node of its launch ended before running"),
        ("i-2", "ended before running (terminated: Server.SpotInstanceTermination)")]
    assert billed == ["i-1"] and first[1]["cost_usd"] == 0.0 and first[1]["billed_seconds"] == 0.0
    assert "attempt 1: instance i-2 (terminated: Server.SpotInstanceTermination) ended before running" in ui.notes


def test_an_array_whose_every_instance_ended_before_running_is_launched_again(monkeypatch, tmp_path):
    """No instance of a pool's launch ran: nothing to go on with, the attempt is launched again."""
    assert issubclass(instances.EndedBeforeRunning, instances.AwsError)
    job = engine.TaskJob(load.parse("name: t\nrun: python train.py\n"), {}, None)
    opts = PoolOptions(task=job, spot=True, nodes=1, max_attempts=1, out=tmp_path, elements=())
    with pytest.raises(recovery.AttemptsExhausted) as got:
        prov = resources.Provisioned(run_id="r1")

        def provision(aws, settings, o, run_id, ui, p, avoid_zones=()):
            p.instances += [_inst(1)]
            raise instances.EndedBeforeRunning("instance i-1 (terminated) ended before running", "",
                                               {"i-1": ("terminated", None)})
        monkeypatch.setattr(pipeline.provision, "provision", provision)
        monkeypatch.setattr(pipeline.provision, "end_instances", lambda aws, p, ids, ui: p.ended.update(ids))
        monkeypatch.setattr(pipeline.provision, "bill", lambda *a: None)
        monkeypatch.setattr(pipeline.handover, "start", lambda *a, **k: None)
        monkeypatch.setattr(pipeline, "_ledger", lambda *a: None)
        pipeline._run_attempts(SimpleNamespace(), SimpleNamespace(home=tmp_path), opts, "r1", _UI(), prov, tmp_path,
                               SimpleNamespace(name="aws"), {"attempts": []}, pool_attempt=lambda *a, **k: {})
    assert "ended before running (terminated)" in got.value.message
