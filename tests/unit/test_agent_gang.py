"""A detached run of several nodes (agent/gang.py's rules, agent/detached.py's several-node mode,
issue 30): the nodes agree on ranks through S3, run the job together with SkyPilot's environment,
and start again together after a failure; a member lost makes the next generation. S3 and Auto
Scaling from moto in process (test_agent_detached's fixtures), real short jobs through agent.py."""
import json
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from ec2gpu.agent import gang
from ec2gpu.wire import run_record

import test_agent_detached as base  # same folder (pytest prepend import mode)
from test_agent_detached import BUCKET, PREFIX, get, group_size, make, put_spec, status

moto, aws = base.moto, base.aws  # its fixtures: S3 and Auto Scaling from moto, once for the module

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)


def rec(iid, ip, booted="2026-11-27T11:00:00+00:00", age_s=1.0, **kw):
    return {"instance_id": iid, "ip": ip, "booted_at": booted, "state": "waiting", "generation": 0, "outcome": None,
            "exit_code": None, "modified": NOW - timedelta(seconds=age_s), **kw}


def test_the_first_generation_takes_the_first_booted_once_enough_are_live():
    records = {"i-b": rec("i-b", "10.0.0.2", "2026-11-27T11:00:05+00:00"), "i-a": rec("i-a", "10.0.0.1")}
    assert gang.propose(None, {"i-a": records["i-a"]}, 2, NOW) is None  # one of two: wait
    first = gang.propose(None, records, 2, NOW)
    assert (first["generation"], first["members"], first["ips"], first["reason"]) == (
        1, ["i-a", "i-b"], ["10.0.0.1", "10.0.0.2"], "start")
    assert gang.propose(first, records, 2, NOW) is None  # whole: nothing to form
    assert gang.parse_gang(json.loads(json.dumps(first))) == first


def test_a_lost_member_is_replaced_and_the_head_stays_the_head():
    g = {"generation": 3, "members": ["i-a", "i-b"], "ips": ["10.0.0.1", "10.0.0.2"], "reason": "start",
         "formed_at": ""}
    records = {"i-a": rec("i-a", "10.0.0.1"), "i-b": rec("i-b", "10.0.0.2", state="leaving"),
               "i-c": rec("i-c", "10.0.0.3", "2026-11-27T11:30:00+00:00")}
    assert gang.lost_members(g, records, NOW) == ["i-b"]
    new = gang.propose(g, records, 2, NOW)
    assert (new["generation"], new["members"], new["ips"], new["reason"]) == (
        4, ["i-a", "i-c"], ["10.0.0.1", "10.0.0.3"], "interruption")
    # the head lost, silently (its record older than the stale time): a worker heads the next one
    records = {"i-a": rec("i-a", "10.0.0.1", age_s=gang.STALE_S + 1), "i-b": rec("i-b", "10.0.0.2"),
               "i-c": rec("i-c", "10.0.0.3", "2026-11-27T11:30:00+00:00")}
    assert gang.propose(g, records, 2, NOW)["members"] == ["i-b", "i-c"]
    del records["i-c"]
    assert gang.propose(g, records, 2, NOW) is None  # the replacement is not up yet: wait for it
    assert gang.decide(g, records, NOW) == "lost"


def test_the_head_decides_once_every_member_has_ended():
    g = {"generation": 2, "members": ["i-a", "i-b"], "ips": ["10.0.0.1", "10.0.0.2"], "reason": "start",
         "formed_at": ""}
    ended = {"state": "ended", "generation": 2}
    records = {"i-a": rec("i-a", "10.0.0.1", outcome="succeeded", **ended), "i-b": rec("i-b", "10.0.0.2",
                                                                                       state="running", generation=2)}
    assert gang.decide(g, records, NOW) is None
    records["i-b"].update(outcome="succeeded", **ended)
    assert gang.decide(g, records, NOW) == "succeeded"
    records["i-b"].update(outcome="failed", exit_code=3)
    assert gang.decide(g, records, NOW) == "failed"
    records["i-b"].update(generation=1)  # its end is of an earlier generation: not yet of this one
    assert gang.decide(g, records, NOW) is None
    records["i-b"].update(generation=2, outcome="succeeded", age_s=gang.STALE_S + 5)
    assert gang.decide(g, records, NOW) == "succeeded"  # lost after its job succeeded: counted by its end
    records["i-b"].update(state="leaving", outcome="stopped", age_s=1.0)  # a spot notice stopped its job
    assert gang.decide(g, records, NOW) == "lost"
    records["i-b"].update(state="ended")  # stopped while it stayed (a peer failed): an end, not a success
    assert gang.decide(g, records, NOW) == "failed"
    again = gang.propose(g, records, 2, NOW, restart="restart")
    assert (again["generation"], again["members"], again["reason"]) == (3, ["i-a", "i-b"], "restart")


@pytest.mark.parametrize("data", [
    {"instance_id": "i-other", "ip": "10.0.0.1"}, {"instance_id": "i-a", "ip": "10.0.0.1; rm -rf /"},
    {"instance_id": "i-a"}, [], "x",
])
def test_a_hostile_node_record_is_none(data):
    assert gang.parse_node(data, "i-a", NOW) is None


def test_a_hostile_node_record_is_read_inert():
    got = gang.parse_node({"instance_id": "i-a", "ip": "10.0.0.1", "state": "root", "generation": -4,
                           "outcome": "$(x)", "exit_code": 10 ** 12, "booted_at": "yesterday"}, "i-a", NOW)
    assert got == rec("i-a", "10.0.0.1", booted="", age_s=0.0)


@pytest.mark.parametrize("data", [
    {"generation": 0, "members": ["i-a"], "ips": ["10.0.0.1"]},
    {"generation": 1, "members": ["i-a", "i-a"], "ips": ["10.0.0.1", "10.0.0.1"]},
    {"generation": 1, "members": ["i-a", "i-b"], "ips": ["10.0.0.1"]},
    {"generation": 1, "members": ["../i-a"], "ips": ["10.0.0.1"]},
    {"generation": 1, "members": ["i-a"], "ips": ["`id`"]},
    {"generation": True, "members": ["i-a"], "ips": ["10.0.0.1"]},
])
def test_a_hostile_generation_is_none(data):
    assert gang.parse_gang(data) is None


def node(aws, tmp_path, name, ip, **kw):
    run = make(aws, tmp_path / name, instance_id=name, **kw)
    run.ctx.log = lambda line: print(name, line)
    run.ctx.imds = {"/latest/meta-data/instance-id": name, "/latest/meta-data/local-ipv4": ip}.get
    return run


def two_nodes(aws, tmp_path):
    """i-0a (10.0.0.1) and i-0b (10.0.0.2): the run's two instances."""
    return node(aws, tmp_path, "i-0a", "10.0.0.1"), node(aws, tmp_path, "i-0b", "10.0.0.2")


def run_nodes(*runs):
    """Each node's execute() in a thread, as on its own instance; their exit codes."""
    codes = {}
    threads = [threading.Thread(target=lambda i=i, r=r: codes.__setitem__(i, r.execute())) for i, r in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return [codes.get(i) for i in range(len(runs))]


def test_two_nodes_run_the_job_together_with_ranks_and_the_heads_address(aws, tmp_path):
    put_spec(aws, nodes=2, setup='echo "setup rank $SKYPILOT_SETUP_NODE_RANK"',
             run='echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES head $EC2GPU_HEAD_IP ips '
                 '$(echo $SKYPILOT_NODE_IPS) me $EC2GPU_NODE_IP" > "$EC2GPU_OUTPUT_DIR/rank-$SKYPILOT_NODE_RANK.txt"; '
                 'cat "$EC2GPU_OUTPUT_DIR/rank-$SKYPILOT_NODE_RANK.txt"')
    a, b = two_nodes(aws, tmp_path)
    assert run_nodes(a, b) == [0, 0]
    st = status(aws)
    g = json.loads(get(aws, "gang.json"))
    head = g["members"][0]
    ips = " ".join(g["ips"])
    assert (st["state"], st["attempt"], st["launches"], st["generation"], st["instance_id"]) == (
        "succeeded", 1, 2, 1, head)
    assert sorted(i["instance_id"] for i in st["instances"]) == ["i-0a", "i-0b"]
    assert get(aws, "outputs/rank-0.txt") == f"rank 0 of 2 head {g['ips'][0]} ips {ips} me {g['ips'][0]}\n"
    assert get(aws, "outputs/rank-1.txt") is None  # the run's outputs are the head's, as in the foreground
    worker = g["members"][1]
    assert f"rank 1 of 2 head {g['ips'][0]} ips {ips} me {g['ips'][1]}" in get(aws, f"logs/nodes/{worker}.log")
    assert "setup rank 0" in get(aws, "logs/job.log")
    assert group_size(aws) == (0, 0, 0)


def test_a_failure_on_one_rank_restarts_both_together(aws, tmp_path):
    put_spec(aws, nodes=2, max_restarts_on_errors=1,
             run='echo "gen rank $SKYPILOT_NODE_RANK resume=$EC2GPU_RESUME"; '
                 '[ "$SKYPILOT_NODE_RANK" = 0 ] && { date > "$EC2GPU_CHECKPOINT_DIR/step"; exit 0; }; '
                 '[ -e "$HOME/failed-once" ] && exit 0; touch "$HOME/failed-once"; exit 3')
    a, b = two_nodes(aws, tmp_path)
    assert run_nodes(a, b) == [0, 0]
    st = status(aws)
    assert (st["state"], st["attempt"], st["restarts"], st["generation"]) == ("succeeded", 2, 1, 2)
    assert json.loads(get(aws, "gang.json"))["reason"] == "restart"
    assert [a["resume"] for a in st["attempts"]] == [False, True]  # the head's checkpoint, on every node
    worker = json.loads(get(aws, "gang.json"))["members"][1]
    assert "resume=1" in get(aws, f"logs/nodes/{worker}.log")


def test_a_failure_beyond_the_restarts_ends_the_run_failed_naming_the_rank(aws, tmp_path):
    put_spec(aws, nodes=2, run='[ "$SKYPILOT_NODE_RANK" = 1 ] && exit 5; exit 0')
    a, b = two_nodes(aws, tmp_path)
    assert run_nodes(a, b) == [0, 0]
    st = status(aws)
    assert st["state"] == "failed" and "rank 1 (exit 5)" in st["message"] and group_size(aws) == (0, 0, 0)


def test_cancel_stops_every_node_and_the_head_records_it(aws, tmp_path):
    put_spec(aws, nodes=2, run='echo "started $SKYPILOT_NODE_RANK"; sleep 60')
    a, b = two_nodes(aws, tmp_path)
    threading.Timer(3.0, lambda: aws.s3.put_object(Bucket=BUCKET, Key=PREFIX + "cancel", Body=b"")).start()
    started = time.monotonic()
    assert run_nodes(a, b) == [0, 0]
    assert time.monotonic() - started < 40  # neither job ran its 60 s
    st = status(aws)
    assert (st["state"], st["message"]) == ("cancelled", "cancelled") and group_size(aws) == (0, 0, 0)
    assert "started 0" in get(aws, "logs/job.log")


def test_a_node_beyond_the_launch_cap_ends_the_run(aws, tmp_path):
    put_spec(aws, nodes=2, max_launches=2)
    for iid in ("i-old1", "i-old2"):  # two launches before, gone
        aws.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}nodes/{iid}.json",
                          Body=json.dumps({"instance_id": iid, "ip": "10.0.0.9"}).encode())
    assert node(aws, tmp_path, "i-0c", "10.0.0.3").execute() == 0
    st = status(aws)
    assert st["state"] == "failed" and "beyond max_launches 2" in st["message"] and group_size(aws) == (0, 0, 0)
    assert set(st) == set(run_record.FIELDS)  # one field list, whatever the number of nodes


class RecordingGroup:
    """The Auto Scaling client, with SetInstanceHealth calls recorded (moto's group has no such
    instance: the sandbox test replaces one for real, tests/e2e/test_sandbox_autoscaling.py)."""

    def __init__(self, real):
        self.real, self.unhealthy = real, []

    def set_instance_health(self, **kw):
        self.unhealthy.append((kw["InstanceId"], kw["HealthStatus"], kw["ShouldRespectGracePeriod"]))

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_silent_member_is_set_unhealthy_and_the_next_generation_runs_without_it(aws, tmp_path, monkeypatch):
    """Generation 1 names i-dead, whose record stopped (its agent died, its instance ran on): once
    its record is stale, a node sets it Unhealthy (the group replaces it) and the next generation
    forms with the live nodes."""
    monkeypatch.setattr(gang, "HEARTBEAT_S", 0.2)  # the live nodes' records stay fresh under a 3 s stale time
    put_spec(aws, nodes=2, run='echo "rank $SKYPILOT_NODE_RANK of $(echo $SKYPILOT_NODE_IPS)"')
    aws.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}nodes/i-dead.json",
                      Body=json.dumps({"instance_id": "i-dead", "ip": "10.0.0.9", "state": "running",
                                       "generation": 1}).encode())
    aws.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}gang.json", Body=json.dumps(
        {"generation": 1, "members": ["i-0a", "i-dead"], "ips": ["10.0.0.1", "10.0.0.9"], "reason": "start"}).encode())
    time.sleep(3.5)  # i-dead's record is stale; a live node's is, only if a loaded machine starves its heartbeat 3 s
    a, c = node(aws, tmp_path, "i-0a", "10.0.0.1"), node(aws, tmp_path, "i-0c", "10.0.0.3")
    groups = RecordingGroup(aws.asg)
    for run in (a, c):
        run.ctx.stale_s, run.ctx.asg = 3.0, groups
    assert run_nodes(a, c) == [0, 0]
    assert set(groups.unhealthy) == {("i-dead", "Unhealthy", False)}  # by either node (or both), never a live one
    g = json.loads(get(aws, "gang.json"))
    assert (g["generation"], g["members"], g["reason"]) == (2, ["i-0a", "i-0c"], "interruption")
    st = status(aws)
    assert (st["state"], st["interruptions"], st["generation"]) == ("succeeded", 1, 2)
    assert "rank 0 of 10.0.0.1 10.0.0.3" in get(aws, "logs/job.log")


def test_a_member_silent_for_a_moment_makes_the_same_members_regroup(aws, tmp_path, monkeypatch):
    """The worker's record goes stale (its writes fail for a while), then comes back: every member
    stopped its job, and once the gang is whole again the same members form the next generation
    (reason "regroup", no interruption counted) rather than wait for one that no one forms."""
    monkeypatch.setattr(gang, "HEARTBEAT_S", 0.2)
    put_spec(aws, nodes=2, run='echo "gen $SKYPILOT_NODE_RANK"; sleep 5')
    a, b = two_nodes(aws, tmp_path)
    groups = RecordingGroup(aws.asg)
    for run in (a, b):
        run.ctx.stale_s, run.ctx.asg = 1.5, groups
    silent = threading.Event()
    real = b.members.node_write
    b.members.node_write = lambda **kw: None if silent.is_set() else real(**kw)

    def pause():
        deadline = time.monotonic() + 30
        while not (get(aws, "gang.json") and json.loads(get(aws, "state.json") or "{}").get("state") == "running"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.0)
        silent.set()
        time.sleep(2.5)
        silent.clear()
    threading.Thread(target=pause, daemon=True).start()
    started = time.monotonic()
    assert run_nodes(a, b) == [0, 0]
    assert time.monotonic() - started < 60
    st = status(aws)
    g = json.loads(get(aws, "gang.json"))
    assert (st["state"], st["interruptions"], g["generation"], g["reason"]) == ("succeeded", 0, 2, "regroup"), (st, g)
    assert [x["outcome"] for x in st["attempts"]] == ["regroup", "succeeded"]


def test_a_failure_on_a_worker_stops_the_heads_job_at_once(aws, tmp_path, monkeypatch):
    monkeypatch.setattr(gang, "HEARTBEAT_S", 0.2)
    put_spec(aws, nodes=2, run='[ "$SKYPILOT_NODE_RANK" = 1 ] && exit 5; sleep 60')
    a, b = two_nodes(aws, tmp_path)
    started = time.monotonic()
    assert run_nodes(a, b) == [0, 0]
    assert time.monotonic() - started < 30  # not the head's 60 s, nor SETTLE_S after it
    st = status(aws)
    assert st["state"] == "failed" and "rank 1 (exit 5)" in st["message"] and "rank 0" not in st["message"], st
