"""runs/execute/attempt.py: the one attempt lifecycle every mode goes through (issue 45, item 2):
its steps in order, what a strategy changes, and the close on every exit path."""
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from ec2gpu.errors import RemoteError
from ec2gpu.runs.execute import attempt as lifecycle
from ec2gpu.runs.execute import engine
from ec2gpu.runs.execute import nodes as N


class _UI:
    def __init__(self, steps):
        self.steps, self.notes = steps, []

    @contextmanager
    def phase(self, name):
        self.steps.append(f"phase {name}")
        yield

    def note(self, text):
        self.notes.append(text)

    def log(self, line):
        pass


class _Conn:
    def __init__(self, steps, iid):
        self.steps, self.iid = steps, iid

    def close(self):
        self.steps.append(f"closed {self.iid}")


@pytest.fixture
def steps(monkeypatch, tmp_path):
    """The node steps replaced by records of their calls, in the order they were made."""
    seen: list[str] = []

    def open_node(nd, *a):
        nd.host, nd.port, nd.conn = f"127.0.0.{nd.index + 2}", 22, _Conn(seen, nd.instance_id)
        seen.append(f"open {nd.index}")
    monkeypatch.setattr(N, "open_node", open_node)
    monkeypatch.setattr(N, "prepare_node", lambda nd, say: seen.append(f"prepare {nd.index}"))
    monkeypatch.setattr(engine, "upload_node", lambda nd, job, config, run_id, addresses, resume, ckpt, say, rank=None:
                        seen.append(f"upload {nd.index} {config.name} {addresses} resume={resume}"))
    monkeypatch.setattr(engine, "mounts_node", lambda nd, job, config, say: seen.append(f"mounts {nd.index}"))
    monkeypatch.setattr(engine, "setup_node", lambda nd, job, say: seen.append(f"setup {nd.index}"))
    monkeypatch.setattr(lifecycle, "mark", lambda nodes, what: seen.append(f"mark {what} {[n.index for n in nodes]}"))
    return seen


def _attempt(tmp_path, seen, setup="pip install x", mounts=()):
    settings = SimpleNamespace(home=tmp_path, ssh_user="ubuntu")
    job = SimpleNamespace(task=SimpleNamespace(setup=setup), mounts=list(mounts))
    backend = SimpleNamespace(private_address=lambda inst: f"10.0.0.{inst.id[-1]}")
    instances_ = [SimpleNamespace(id="i-0"), SimpleNamespace(id="i-1")]
    return lifecycle.new(None, settings, "r1", _UI(seen), SimpleNamespace(key_path=tmp_path / "k"), backend, job,
                         instances_, tmp_path / "out", 1)


class _Job(lifecycle.Strategy[str]):
    def __init__(self, seen, fail=None):
        self.seen, self.fail = seen, fail

    def opened(self, a):
        self.seen.append(f"opened, config written: {a.config.exists()}")

    def run(self, a):
        self.seen.append(f"run, config written: {a.config.exists()}")
        if self.fail:
            raise self.fail

    def collect(self, a):
        self.seen.append("collect")
        return "summary"


def test_an_attempt_goes_open_config_prepare_upload_setup_heartbeat_run_collect_then_closes(steps, tmp_path):
    a = _attempt(tmp_path, steps, mounts=[SimpleNamespace(write_back=False)])
    plan = SimpleNamespace(wait_s=3600.0)
    assert lifecycle.drive(a, _Job(steps), plan) == "summary"
    assert steps[:3] == ["phase waiting for SSH", "open 0", "open 1"]
    # the strategy's opening comes before the run's SSH config (a bake reboots there), which the run has
    assert steps[3:5] == ["opened, config written: False", "phase setup"]
    assert steps[5:7] == ["prepare 0", "prepare 1"]
    assert steps[7:10] == ["phase upload", "upload 0 r1.config ['10.0.0.0', '10.0.0.1'] resume=False",
                           "upload 1 r1.config ['10.0.0.0', '10.0.0.1'] resume=False"]
    assert steps[10:12] == ["mounts 0", "mounts 1"]
    assert steps[12:15] == ["phase task setup", "setup 0", "setup 1"]  # the task's setup: its own phase
    assert steps[15:] == ["mark controller [0, 1]", "run, config written: True", "collect", "closed i-0", "closed i-1"]
    assert not a.config.exists()  # the run's SSH config goes with the attempt


def test_a_step_that_fails_reaches_the_strategy_and_the_nodes_close_and_the_config_goes(steps, tmp_path):
    a = _attempt(tmp_path, steps, setup=None)
    failure = RemoteError("the job on node 0 exited 3", "its last lines are above")
    seen_by_strategy = []

    class Failing(_Job):
        def failed(self, a, exc):
            seen_by_strategy.append(exc)
            raise exc
    with pytest.raises(RemoteError, match="exited 3"):
        lifecycle.drive(a, Failing(steps, fail=failure))
    assert seen_by_strategy == [failure]
    assert "phase task setup" not in steps  # no task setup phase for a task without one
    assert "collect" not in steps and steps[-2:] == ["closed i-0", "closed i-1"]
    assert not a.config.exists()
    assert not any(s.startswith("mark") for s in steps)  # no hand-over plan: no heartbeat


def test_ctrl_c_closes_the_nodes_and_stops_the_heartbeat(steps, tmp_path, monkeypatch):
    from ec2gpu.runs.recover import handover
    stopped = []
    monkeypatch.setattr(handover.Heartbeat, "stop", lambda self: stopped.append(True))
    a = _attempt(tmp_path, steps)
    with pytest.raises(KeyboardInterrupt):
        lifecycle.drive(a, _Job(steps, fail=KeyboardInterrupt()), SimpleNamespace(wait_s=3600.0))
    assert stopped == [True] and steps[-2:] == ["closed i-0", "closed i-1"] and not a.config.exists()


def test_a_strategy_without_file_mounts_and_without_watched_nodes_gets_neither(steps, tmp_path):
    class Bake(_Job):
        places_mounts = False

        def watched(self, a):
            return []
    a = _attempt(tmp_path, steps, mounts=[SimpleNamespace(write_back=False)])
    lifecycle.drive(a, Bake(steps), SimpleNamespace(wait_s=3600.0))
    assert not any(s.startswith(("mounts", "mark")) for s in steps)


class _Steps(lifecycle.Lifecycle[list, str]):
    """A mode without nodes (the detached hand-off, --local): it supplies its steps, the driver orders them."""

    def __init__(self, fail=None):
        self.fail = fail

    def open(self, a):
        a.append("open")

    def prepare(self, a):
        a.append("prepare")

    def upload(self, a):
        a.append("upload")

    def setup(self, a):
        a.append("setup")

    def run(self, a):
        a.append("run")
        if self.fail:
            raise self.fail

    def collect(self, a):
        a.append("collect")
        return "record"

    def close(self, a):
        a.append("close")


def test_a_mode_without_nodes_gets_its_steps_in_the_drivers_order_and_its_close_on_every_way_out():
    seen: list[str] = []
    assert lifecycle.drive(seen, _Steps()) == "record"
    assert seen == ["open", "prepare", "upload", "setup", "run", "collect", "close"]
    for stop in (RemoteError("the job exited 3", "its last lines are above"), KeyboardInterrupt()):
        seen = []
        with pytest.raises(type(stop)):
            lifecycle.drive(seen, _Steps(fail=stop))
        assert seen == ["open", "prepare", "upload", "setup", "run", "close"]


def test_a_lifecycle_step_a_mode_does_not_supply_is_no_step():
    """Lifecycle's own steps do nothing but run and collect, which every mode must supply."""
    class Only(lifecycle.Lifecycle[list, str]):
        def run(self, a):
            a.append("run")

        def collect(self, a):
            return "done"
    seen: list[str] = []
    assert lifecycle.drive(seen, Only(), SimpleNamespace(wait_s=3600.0)) == "done" and seen == ["run"]
    with pytest.raises(NotImplementedError):
        lifecycle.drive([], lifecycle.Lifecycle())
