"""A spot instance reclaimed before its job runs (issue 51, item 10): in the sandbox, an array
whose third worker got its notice in the machine setup stopped everything ("stopped setup",
`setup-gpu.sh ... exited -1`, every instance removed). Which phase, which node and what now are
decided from structured data (EC2's state for the node, the exception its step raised): a pool's
worker is dropped and the pool goes on (a replacement follows while elements wait); a run's node,
any node of a several-node run and a pool's head end the attempt as Interrupted, which the run's
recovery relaunches. Each phase is tried here; tests/e2e/test_reclaimed_before_the_job.py is the user's case."""
from contextlib import contextmanager
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from ec2gpu.aws import instances
from ec2gpu.errors import Interrupted, RemoteError, UsageError, WaitTimeout
from ec2gpu.pool import attempt as pool_attempt
from ec2gpu.pool import follow, ray_nodes
from ec2gpu.runs.execute import attempt as lifecycle
from ec2gpu.runs.execute import engine
from ec2gpu.runs.execute import nodes as N
from ec2gpu.runs.recover import recovery

RECLAIMED = "Server.SpotInstanceTermination: Spot instance termination"


class Ec2:
    """DescribeInstances as EC2 answers it: each instance running until the test reclaims it."""

    def __init__(self):
        self.gone: set[str] = set()
        self.asked = 0

    def describe_instances(self, InstanceIds):
        self.asked += 1
        return {"Reservations": [{"Instances": [
            {"InstanceId": i, "InstanceType": "g4dn.xlarge", "LaunchTime": datetime(2026, 11, 29, tzinfo=timezone.utc),
             "State": {"Name": "terminated" if i in self.gone else "running"},
             **({"StateReason": {"Code": "Server.SpotInstanceTermination", "Message": RECLAIMED}}
                if i in self.gone else {})} for i in InstanceIds]}]}


class _UI:
    def __init__(self):
        self.notes: list[str] = []

    @contextmanager
    def phase(self, name):
        yield

    def note(self, text):
        self.notes.append(text)

    def log(self, line):
        pass


class _Conn:
    def close(self):
        pass


#: the steps a node goes through before its job runs, as on_nodes names them, and the function of
#: each that the tests replace (open: nodes.open_node; the others: the engine's and the pool's)
PHASES = {"wait for SSH": "open_node", "machine setup": "prepare_node", "upload": "upload_node",
          "file_mounts": "mounts_node", "task setup": "setup_node"}
POOL_PHASES = {**PHASES,
               "Ray start": "check_ray", "Ray start (its Ray launched)": "launch_ray",
               "Ray start (its Ray awaited)": "wait_ready"}


@pytest.fixture
def world(monkeypatch, tmp_path):
    """Every node step replaced by a record of its call; ``reclaim[(step, index)]`` makes that
    step on that node fail as a reclaimed instance makes it (EC2 says terminated, the step's SSH
    channel closed: exit -1, or its connection: OSError); ``fail[(step, index)]`` makes it fail
    on an instance that keeps running (the step's own failure)."""
    ec2, seen, reclaim, fail, ended = Ec2(), [], {}, {}, []

    def step(name, nd):
        seen.append(f"{name} {nd.index}")
        how = reclaim.get((name, nd.index))
        if how is not None:
            ec2.gone.add(nd.instance_id)
            raise how
        if (name, nd.index) in fail:
            raise fail[(name, nd.index)]

    def open_node(nd, aws, settings, prov, run_id, backend, log):
        nd.watch = recovery.InstanceWatch(ec2, nd.instance_id, recovery.NoCheckpoints(), log)
        nd.host, nd.conn, nd.run_dir = f"127.0.0.{nd.index + 2}", _Conn(), f"/runs/{nd.index}"
        step("open_node", nd)
    monkeypatch.setattr(N, "open_node", open_node)
    monkeypatch.setattr(N, "prepare_node", lambda nd, say: step("prepare_node", nd))
    monkeypatch.setattr(engine, "upload_node", lambda nd, job, config, run_id, addresses, resume, ckpt, say, rank=None:
                        step("upload_node", nd))
    monkeypatch.setattr(engine, "mounts_node", lambda nd, job, config, say: step("mounts_node", nd))
    monkeypatch.setattr(engine, "setup_node", lambda nd, job, say: step("setup_node", nd))
    monkeypatch.setattr(ray_nodes, "ray_version", lambda: "2.60.0")
    monkeypatch.setattr(ray_nodes, "check_ray", lambda nd, want, log: step("check_ray", nd))
    monkeypatch.setattr(ray_nodes, "launch_ray", lambda nd, role, address, job, token: step("launch_ray", nd))

    def wait_ready(nd, timeout_s, required=True):
        step("wait_ready", nd)
        return "6379" if nd.index == 0 else "up"
    monkeypatch.setattr(ray_nodes, "wait_ready", wait_ready)
    monkeypatch.setattr(ray_nodes, "node_gpus", lambda nd, job: 1)
    monkeypatch.setattr(instances, "terminate", lambda ec2_, ids, wait=True: ended.extend(ids))
    monkeypatch.setattr(recovery, "LOST_CONFIRM_S", 0.2)  # EC2 says it at once here
    return SimpleNamespace(ec2=ec2, seen=seen, reclaim=reclaim, fail=fail, ended=ended, tmp=tmp_path)


def _attempt(world, nodes: int):
    settings = SimpleNamespace(home=world.tmp, ssh_user="ubuntu")
    job = SimpleNamespace(task=SimpleNamespace(setup="pip install x", secrets={}, resources=None), mounts=["m"],
                          secret_values=())
    backend = SimpleNamespace(private_address=lambda inst: f"10.0.0.{inst.id[-1]}")
    fleet = [SimpleNamespace(id=f"i-{k}", type="g4dn.xlarge", launched_at=datetime(2026, 11, 29, tzinfo=timezone.utc),
                             zone="us-east-1a") for k in range(nodes)]
    return lifecycle.new(SimpleNamespace(ec2=world.ec2), settings, "r1", _UI(), SimpleNamespace(key_path=world.tmp / "k"),
                         backend, job, fleet, world.tmp / "out", 1)


class _Run(lifecycle.Strategy[str]):
    """A run's attempt (ForegroundJob's lost: Strategy's), its job a record."""

    def __init__(self, seen):
        self.seen = seen

    def run(self, a):
        self.seen.append("run")

    def collect(self, a):
        return "summary"


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("phase", list(PHASES))
def test_a_runs_node_reclaimed_in_any_phase_before_its_job_relaunches_the_attempt(world, phase, nodes):
    lost = nodes - 1  # the single node, or the second of a several-node run
    world.reclaim[(PHASES[phase], lost)] = RemoteError("`bash setup-gpu.sh` exited -1", exit_status=-1) \
        if phase != "wait for SSH" else WaitTimeout("SSH did not answer")
    a = _attempt(world, nodes)
    with pytest.raises(Interrupted) as got:
        lifecycle.drive(a, _Run(world.seen))
    # the run's recovery (runs/provision/pipeline.py) launches the attempt again on Interrupted
    assert got.value.reason == f"node {lost} (i-{lost}) lost in the {phase}: EC2 reports the instance terminated " \
                               f"({RECLAIMED})", got.value.reason
    assert "run" not in world.seen  # no later step: the attempt ended in that phase


@pytest.mark.parametrize("pool", [False, True])
def test_a_step_that_fails_on_a_running_instance_fails_as_it_did_even_beside_a_lost_node(world, pool):
    world.fail[("setup_node", 1)] = err = RemoteError("`pip install x` exited 1", exit_status=1)
    world.reclaim[("setup_node", 2)] = OSError("Socket is closed")  # lost meanwhile: the failure still fails
    a, _, driver = _pool(world) if pool else (_attempt(world, 3), None, _Run(world.seen))
    with pytest.raises(RemoteError) as got:
        lifecycle.drive(a, driver)
    assert got.value is err and "run" not in world.seen and world.ec2.asked >= 1


def _pool(world, nodes=3):
    a = _attempt(world, nodes)
    opts = SimpleNamespace(gpus_per_job=None, detach=False, task=a.job, elements=(), max_retries=0)
    pool = follow.Pool(list(a.nodes), members={nd.instance_id: nd for nd in a.nodes})
    return a, pool, pool_attempt.PoolDriver(opts, pool, {}, {}, [], shutdown=True)


def _until_the_driver(a, driver):
    """PoolDriver's steps up to the driver's start: open, machine setup, upload, setup and Ray."""
    driver.open(a)
    driver.prepare(a)
    driver.upload(a)
    driver.setup(a)


@pytest.mark.parametrize("phase", list(POOL_PHASES))
def test_a_pools_worker_reclaimed_in_any_phase_before_the_driver_is_dropped_and_the_pool_goes_on(world, phase):
    world.reclaim[(POOL_PHASES[phase], 2)] = OSError("Socket is closed")
    a, pool, driver = _pool(world)
    _until_the_driver(a, driver)
    # the others went on through every step, Ray up on the head and node 1 only
    assert [nd.index for nd in a.nodes] == [0, 1] and a.addresses == ["10.0.0.0", "10.0.0.1"]
    assert sorted(driver.addresses) == [0, 1] and driver.address == "10.0.0.0:6379"
    after = world.seen[world.seen.index(f"{POOL_PHASES[phase]} 2") + 1:]
    assert not [s for s in after if s.endswith(" 2")], after  # nothing more on the lost worker
    assert {"launch_ray 0", "launch_ray 1", "wait_ready 1"} <= set(world.seen)
    # counted lost, so the pool's follow launches a replacement while elements wait (follow._grow)
    assert pool.lost == ["i-2"] and "i-2" not in pool.members and "i-2" in pool.left_at
    assert world.ended == ["i-2"] and [nd.index for nd in pool.nodes] == [0, 1, 2]  # its index and cost kept
    words = phase.split(" (")[0]
    assert any(n.startswith(f"pool: worker node 2 (i-2) lost in the {words}: EC2 reports the instance terminated")
               for n in a.ui.notes), a.ui.notes


@pytest.mark.parametrize("phase", ["machine setup", "task setup", "Ray start"])
def test_a_pools_head_reclaimed_before_the_driver_relaunches_the_attempt(world, phase):
    world.reclaim[(POOL_PHASES[phase], 0)] = EOFError()
    a, pool, driver = _pool(world)
    with pytest.raises(Interrupted, match=rf"node 0 \(i-0\) lost in the {phase}"):
        _until_the_driver(a, driver)
    assert pool.lost == [] and world.ended == []


@pytest.mark.parametrize("losses, pool, what", [
    ([2], True, recovery.DROP), ([1, 2], True, recovery.DROP), ([0], True, recovery.RELAUNCH),
    ([0, 2], True, recovery.RELAUNCH), ([0], False, recovery.RELAUNCH), ([1], False, recovery.RELAUNCH),
])
def test_what_an_attempt_does_follows_whose_node_was_lost(losses, pool, what):
    got = [recovery.Loss(k, f"i-{k}", "machine setup", "EC2 reports the instance terminated") for k in losses]
    assert recovery.after_loss(got, pool) == what


@pytest.mark.parametrize("exc, wait", [
    (RemoteError("`setup-gpu.sh` exited -1", exit_status=-1), recovery.LOST_CONFIRM_S),
    (RemoteError("host key", exit_status=None), recovery.LOST_CONFIRM_S),
    (RemoteError("`pip install` exited 1", exit_status=1), 0.0),
    (OSError("Socket is closed"), recovery.LOST_CONFIRM_S), (EOFError(), recovery.LOST_CONFIRM_S),
    (WaitTimeout("no SSH"), recovery.LOST_CONFIRM_S),
    (UsageError("bad flag"), None), (ValueError("a bug"), None),
])
def test_only_what_a_reclaimed_instance_raises_is_asked_about_and_a_dropped_connection_longest(exc, wait):
    assert recovery.confirm_wait_s(exc) == wait


def test_a_lost_instance_is_what_ec2_says_asked_again_while_it_lags():
    ec2 = Ec2()
    watch = recovery.InstanceWatch(ec2, "i-2", recovery.NoCheckpoints(), print)

    class Lagging(Ec2):  # running twice more after the connection dropped, then terminated
        def describe_instances(self, InstanceIds):
            if self.asked >= 2:
                self.gone.add("i-2")
            return super().describe_instances(InstanceIds)
    watch.ec2 = lagging = Lagging()
    got = recovery.lost(watch, OSError("Socket is closed"), wait_s=1.0, every_s=0.01)
    assert isinstance(got, Interrupted) and got.reason == f"EC2 reports the instance terminated ({RECLAIMED})"
    assert lagging.asked == 3
    # a running instance is not lost; what no instance explains is not asked about
    watch.ec2 = ec2
    assert recovery.lost(watch, RemoteError("`pip install` exited 1", exit_status=1)) is None and ec2.asked == 1
    assert recovery.lost(watch, ValueError("a bug")) is None and ec2.asked == 1
    unreachable = Interrupted("SSH unreachable for 120 s")
    assert recovery.lost(watch, unreachable) is unreachable and ec2.asked == 1


def test_an_instance_reclaimed_while_it_boots_is_not_waited_for_over_ssh(monkeypatch, tmp_path):
    """The open: while the console's host key fingerprints are awaited (minutes on EC2), EC2 is
    asked about the instance at each look, so a reclaimed one ends the wait at once."""
    from ec2gpu.remote import ssh

    ec2, looked, tried = Ec2(), [], []
    ec2.gone.add("i-2")
    monkeypatch.setattr(instances, "host_key_fingerprints", lambda ec2_, iid: looked.append(iid) or [])
    monkeypatch.setattr(ssh, "connect", lambda *a, **k: tried.append(a))
    watch = recovery.InstanceWatch(ec2, "i-2", recovery.NoCheckpoints(), print)
    inst = SimpleNamespace(id="i-2", key_name="k")
    settings = SimpleNamespace(home=tmp_path, ssh_user="ubuntu", keys_dir=tmp_path)
    backend = SimpleNamespace(ssh_target=lambda i: ("127.0.0.4", 22))
    with pytest.raises(Interrupted, match="terminated"):
        N.connect_verified(SimpleNamespace(ec2=ec2), settings, backend, inst, tmp_path / "k", timeout_s=30,
                           gone=watch.check)
    assert looked == [] and tried == [] and ec2.asked == 1


def test_a_step_held_by_a_reclaimed_instance_ends_when_ec2_says_it_is_gone_not_when_tcp_gives_up(world, monkeypatch):
    """A reclaimed instance's packets may vanish without a reset: its step would wait for TCP
    (many minutes). EC2 is asked while the steps run; the gone node's connection is closed, its
    step fails at once, and the pool drops it."""
    import threading

    class Held(_Conn):  # what runs on it returns only once its connection is closed
        def __init__(self):
            self.closed = threading.Event()

        def close(self):
            self.closed.set()

    def prepare(nd, say):
        world.seen.append(f"prepare_node {nd.index}")
        if nd.index == 2:
            world.ec2.gone.add(nd.instance_id)  # reclaimed: nothing comes back on its connection
            nd.conn = held = Held()
            if not held.closed.wait(30):
                raise AssertionError("never closed")
            raise EOFError()
    monkeypatch.setattr(N, "prepare_node", prepare)
    monkeypatch.setattr(recovery, "STATE_EVERY_S", 0.05)
    a, pool, driver = _pool(world)
    driver.open(a)
    driver.prepare(a)
    assert [nd.index for nd in a.nodes] == [0, 1] and pool.lost == ["i-2"]


def test_ec2_not_answering_while_steps_run_stops_no_step():
    import botocore.exceptions

    class Silent:
        def describe_instances(self, **kw):
            raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://x")
    ec2 = Ec2()
    ec2.gone.add("i-2")
    assert recovery.gone_now(Silent(), ["i-1", "i-2"]) == {}
    assert recovery.gone_now(ec2, ["i-1", "i-2"]) == {"i-2": f"EC2 reports the instance terminated ({RECLAIMED})"}


def test_a_worker_dropped_before_the_driver_is_owed_a_replacement_at_a_new_index_away_from_its_zone(world, monkeypatch):
    from ec2gpu.pool import grow

    world.reclaim[("prepare_node", 2)] = OSError("Socket is closed")
    a, pool, driver = _pool(world)
    a.nodes[2].instance.zone = "us-east-1c"
    _until_the_driver(a, driver)
    started = []
    monkeypatch.setattr(grow, "start", lambda ctx, lost, zone, index, addresses, ui: started.append(
        (lost, zone, index, addresses)) or grow.Replacement(lost, index))
    ctx = SimpleNamespace(opts=SimpleNamespace(nodes=3), settings=None)
    follow._grow(a.aws, pool, {"counts": {"queued": 5, "running": 2}}, ctx, driver.addresses, a.ui)
    # the lost worker's replacement: the next index (2 is kept by the lost one's tags), its zone last
    assert started == [("i-2", "us-east-1c", 3, ["10.0.0.0", "10.0.0.1"])]
