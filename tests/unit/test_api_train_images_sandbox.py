"""`train mnist`, `bench`, `image ls|rm` and `sandbox ...` as library functions, without the CLI
(issue 29, item 7): bad input is refused before a backend is opened (nothing created, no ledger
row), the flags reach the layers below as the CLI's did, and the sandbox functions answer for a
home where no sandbox runs. tests/e2e/test_api_images_sandbox_e2e.py asks a running sandbox."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from ec2gpu import backend
from ec2gpu.api import images, sandbox as sb, train
from ec2gpu.errors import SandboxError, UsageError
from ec2gpu.runs.settle import ledger


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh EC2GPU_HOME outside any sandbox, tmp_path the current directory."""
    for k in ("EC2GPU_SANDBOX", "AWS_ENDPOINT_URL", "EC2GPU_REGION", "EC2GPU_INSTANCE_TYPE", "EC2GPU_DATA_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


@pytest.fixture
def no_local_run(no_backend, monkeypatch):
    """As no_backend (tests/conftest.py), and no training started on this machine either."""
    from ec2gpu.runs.provision import bench
    from ec2gpu.runs.provision import local

    def refuse(*args, **kwargs):
        raise AssertionError("a local run started for input that should have been refused")
    monkeypatch.setattr(local, "train_local", refuse)
    monkeypatch.setattr(bench, "local", refuse)


@pytest.mark.parametrize("kwargs, words", [
    ({"model": "resnet"}, "unknown model 'resnet'"),
    ({"cluster": "lab", "nodes": 2}, "--cluster trains on an existing cluster"),
    ({"cluster": "lab", "spot": True}, "--cluster trains on an existing cluster"),
    ({"cluster": "lab", "instance_type": "g5.xlarge"}, "--cluster trains on an existing cluster"),
    ({"cluster": "lab", "keep": True, "max_runtime": 60}, "--cluster trains on an existing cluster"),
    ({"keep": True}, "--keep needs an explicit --max-runtime"),
    ({"keep": True, "sandbox": True}, "--keep needs an explicit --max-runtime"),
    ({"data_dir": "no/such/dir"}, "data directory no/such/dir does not exist"),
    ({"data_dir": "no/such/dir", "local": True}, "data directory no/such/dir does not exist"),
    ({"nodes": 0}, "--nodes 0 is out of range"),
    ({"nodes": 65}, "--nodes 65 is out of range"),
    ({"epochs": 0}, "--epochs 0 is under 1"),
    ({"max_runtime": 0}, "--max-runtime 0 is under 1"),
    ({"budget": -1.0}, "--budget -1 is under 0"),
    ({"max_price": -0.5}, "--max-price -0.5 is under 0"),
    ({"max_attempts": 0}, "--max-attempts 0 is under 1"),
    ({"unreachable_after": 1.0}, "--unreachable-after 1 is under 5"),
    ({"detach": True, "cluster": "lab"}, "--detach trains on new instances of its own"),
    ({"detach": True, "local": True}, "--detach trains on new instances of its own"),
    ({"detach": True, "keep": True, "max_runtime": 60}, "--keep has no meaning with --detach"),
    ({"detach": True, "checkpoint_uri": "s3://b/p"}, "--checkpoint-uri is for a run in the foreground"),
])
def test_train_mnist_refuses_bad_input_before_any_backend_is_opened(home, no_local_run, kwargs, words):
    with pytest.raises(UsageError, match=words):
        train.train_mnist(**kwargs)
    assert ledger.runs(home) == []  # not even a ledger row


@pytest.mark.parametrize("kwargs, env, words", [
    ({"local": True, "instance_type": "g5.xlarge"}, {}, "--local benches this machine"),
    ({"local": True, "spot": True}, {}, "--local benches this machine"),
    ({"local": True, "sandbox": True}, {}, "--local benches this machine"),
    ({"local": True}, {"EC2GPU_SANDBOX": "1"}, "--local benches this machine"),  # the sandbox from the environment
    ({"local": True, "data_dir": "no/such/dir"}, {}, "data directory no/such/dir does not exist"),
    ({"data_dir": "."}, {}, "--data-dir . is a directory on this machine, which an instance on AWS cannot read"),
    ({"max_runtime": 0}, {}, "--max-runtime 0 is under 1"),
    ({"budget": -2.0}, {}, "--budget -2 is under 0"),
])
def test_bench_refuses_bad_input_before_any_backend_is_opened(home, no_local_run, monkeypatch, kwargs, env, words):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UsageError, match=words):
        train.bench(**kwargs)
    assert ledger.runs(home) == []


class FakeContext:
    """backend.Context's stand-in: records how it was opened; settings, aws and backend of its own."""

    opened: list[tuple] = []

    def __init__(self, region, sandbox, persistent=False, note=lambda text: None):
        FakeContext.opened.append((region, sandbox, persistent))
        self.settings = SimpleNamespace(instance_type="g6.xlarge", home=Path("h"), region=region or "us-east-1")
        self.aws = SimpleNamespace(region=self.settings.region, check_credentials=lambda: None)
        self.backend = SimpleNamespace(is_sandbox=bool(sandbox), name="sandbox" if sandbox else "aws")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def fake_context(monkeypatch):
    FakeContext.opened = []
    monkeypatch.setattr(backend, "Context", FakeContext)
    return FakeContext.opened


def test_train_mnist_gives_the_pipeline_every_flag_and_returns_its_record(home, fake_context, monkeypatch):
    from ec2gpu.runs.provision import pipeline
    seen = {}

    def fake_train(aws, settings, opts, ui, back):
        seen.update(opts=opts, ui=ui, back=back)
        return {"run_id": "r1", "status": "completed"}
    monkeypatch.setattr(pipeline, "run_job", fake_train)
    monkeypatch.setenv("EC2GPU_INSTANCE_TYPE", "g6.xlarge")  # the configured type, read when the run is planned
    monkeypatch.setenv("EC2GPU_DATA_DIR", str(home.parent))  # the sandbox instance's MNIST, planned with the run
    reporter = pipeline.Reporter()
    record = train.train_mnist(model="lenet", epochs=2, seed=7, spot=True, spot_fallback="on-demand", keep=True,
                               max_runtime=30, trainer_args=("--lr=0.05",), budget=1.5, max_price=0.4, nodes=2,
                               max_attempts=4, checkpoint_uri="s3://b/p", unreachable_after=60.0, baked=False,
                               out=Path("o"), region="eu-west-1", sandbox=True, reporter=reporter,
                               as_typed="ec2gpu train mnist --spot")
    assert record.to_json() == {"run_id": "r1", "status": "completed"} and record.status == "completed"
    assert fake_context == [("eu-west-1", True, True)]  # --keep: a sandbox this starts outlives the command
    o = seen["opts"]
    assert type(o).__name__ == "TrainOptions"
    assert (o.model, o.epochs, o.seed, o.spot, o.spot_fallback, o.keep, o.max_runtime_minutes) == \
        ("lenet", 2, 7, True, "on-demand", True, 30)
    assert (o.trainer_args, o.budget_usd, o.max_price, o.nodes, o.max_attempts, o.checkpoint_uri) == \
        (["--lr=0.05", "--data-dir", str(home.parent.resolve())], 1.5, 0.4, 2, 4, "s3://b/p")
    assert (o.unreachable_s, o.baked, o.out, o.command) == (60.0, False, Path("o"), "ec2gpu train mnist --spot")
    assert o.instance_type == "g6.xlarge"  # none given: the configured type
    assert seen["ui"] is reporter and seen["back"].is_sandbox
    # the defaults: 120 min, the given type as typed, a silent reporter, the Python call as the command
    train.train_mnist(instance_type="g5.xlarge,g4dn.xlarge")
    o = seen["opts"]
    assert (o.instance_type, o.max_runtime_minutes, o.command, o.baked) == \
        ("g5.xlarge,g4dn.xlarge", 120, "ec2gpu.train_mnist()", True)
    assert isinstance(seen["ui"], pipeline.Reporter)


def test_train_mnist_on_a_cluster_and_on_this_machine_go_where_they_should(home, fake_context, monkeypatch, tmp_path):
    from ec2gpu.runs.provision import local
    from ec2gpu.runs.provision import pipeline
    from ec2gpu.runs.standing import hosts as standing
    monkeypatch.setattr(pipeline, "run_job", lambda *a, **k: pytest.fail("a new instance for --cluster or --local"))
    monkeypatch.setenv("EC2GPU_DATA_DIR", str(tmp_path))  # a sandbox cluster's MNIST, planned with the run
    calls = []
    monkeypatch.setattr(standing, "train_on_cluster",
                        lambda aws, settings, opts, ui, name, back: calls.append(("cluster", name)) or {"run_id": "c"})
    assert train.train_mnist(cluster="lab", sandbox=True).run_id == "c"
    monkeypatch.setattr(local, "train_local",
                        lambda opts, ui, data_dir, settings: calls.append(("local", data_dir)) or {"run_id": "l"})
    assert train.train_mnist(local=True, data_dir=str(tmp_path)).run_id == "l"
    assert calls == [("cluster", "lab"), ("local", str(tmp_path))]
    assert len(fake_context) == 1  # --local opens no backend


def test_bench_says_the_sandbox_is_this_machine_and_returns_the_ranked_results(home, fake_context, monkeypatch):
    from ec2gpu.runs.provision import bench
    seen = {}

    def on_instances(aws, settings, opts, ui, back):
        seen.update(opts=opts)
        return [{"instance_type": "g6.xlarge", "usd_per_run": {}}]
    monkeypatch.setattr(bench, "on_instances", on_instances)
    said = []
    got = train.bench(quick=True, data_dir=".", max_runtime=15, budget=0.5, sandbox=True, log=said.append,
                      as_typed="ec2gpu bench --sandbox")
    assert [r.to_json() for r in got] == [{"instance_type": "g6.xlarge", "usd_per_run": {}}]
    assert said == ["sandbox: the instance is this machine, without a GPU: the figures are its CPU's"]
    o = seen["opts"]
    assert (o.instance_type, o.max_runtime_minutes, o.budget_usd, o.command) == \
        ("g6.xlarge", 15, 0.5, "ec2gpu bench --sandbox")
    assert type(o).__name__ == "BenchOptions" and o.quick is True and o.data_dir == "."
    said.clear()
    train.bench(instance_type="g4dn.xlarge,g5.xlarge", log=said.append)  # on AWS: nothing said
    assert said == [] and seen["opts"].instance_type == "g4dn.xlarge,g5.xlarge"
    assert seen["opts"].command == "ec2gpu.bench()" and fake_context[-1] == (None, False, False)


def test_list_and_remove_images_check_credentials_and_return_the_layers_data(home, fake_context, monkeypatch):
    from ec2gpu.runs.provision import bake
    rows = [{"name": "mnist-1", "image_id": "ami-1", "state": "available", "created": "2026-11-20T10:00:00.000Z",
             "task": "mnist", "setup_hash": "abc", "base": "dlami", "base_image": "ami-0", "run_id": "r1",
             "torch": "2.5", "cuda": "12.4", "driver": "550", "snapshots": ["snap-1"], "snapshot_gib": 40.0,
             "size_basis": "stored bytes", "usd_per_month": 1.0, "usd_per_gb_month": 0.05, "price_source": "table"}]
    monkeypatch.setattr(bake, "listing", lambda aws, where: rows if where == Path("h") else pytest.fail("home"))
    [listed] = images.list_images(region="eu-west-1", sandbox=True)
    assert listed.to_json() == rows[0] and list(listed.to_json()) == list(rows[0])  # --json: the layer's row as it was
    said = []

    def remove(aws, ref, log):
        log(f"deregistered {ref}")
        return {"image_id": "ami-1", "name": ref, "snapshots": ["snap-1"]}
    monkeypatch.setattr(bake, "remove", remove)
    assert images.remove_image("mnist-1", log=said.append).to_json() == {"image_id": "ami-1", "name": "mnist-1",
                                                                        "snapshots": ["snap-1"]}
    assert said == ["deregistered mnist-1"]
    assert fake_context == [("eu-west-1", True, False), (None, False, False)]


def test_without_credentials_images_are_not_listed(home, fake_context, monkeypatch):
    from ec2gpu.errors import NoCredentials
    from ec2gpu.runs.provision import bake

    def no_creds():
        raise NoCredentials("no AWS credentials found", "-")
    monkeypatch.setattr(FakeContext, "__enter__", lambda self: (setattr(self.aws, "check_credentials", no_creds), self)[1])
    monkeypatch.setattr(bake, "listing", lambda *a: pytest.fail("listed without credentials"))
    with pytest.raises(NoCredentials):
        images.list_images()


def test_sandbox_status_json_prints_running_false_with_none_and_the_state_file_with_one(home, monkeypatch, capsys):
    """`sandbox status --json` prints what it printed when sandbox_status returned dicts: {"running": false}
    without a sandbox, else the state file's document (sandbox_status returns None, or a SandboxState)."""
    import json

    from ec2gpu import cli
    from ec2gpu.sandbox import control
    assert cli.main(["sandbox", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"running": False}
    state = {"pid": 1, "endpoint": "http://127.0.0.1:1", "checkip_url": "http://127.0.0.1:1/checkip",
             "imds_url": "http://127.0.0.1:2", "like_aws": True, "instances": {"i-1": {"host": "127.0.0.2", "port": 22,
                                                                                      "sshd_pid": 2, "directory": "/d"}},
             "shutdowns": {}, "bind_shim": "/h/sandbox/bindshim.so"}
    monkeypatch.setattr(control, "read_state", lambda where: state)
    assert cli.main(["sandbox", "status", "--json"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == state and list(json.loads(printed)) == list(state)

def test_with_no_sandbox_running_status_says_so_env_refuses_and_down_finds_none(home):
    assert sb.sandbox_status() is None  # `sandbox status --json` prints {"running": false}
    with pytest.raises(SandboxError, match="no sandbox is running"):
        sb.sandbox_env()
    with pytest.raises(SandboxError, match="no sandbox is running"):
        sb.sandbox_interrupt("i-0123456789abcdef0")
    assert sb.sandbox_down() is False


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_interrupt_refuses_a_notice_that_is_not_seconds_before_asking_the_sandbox(home, monkeypatch, seconds):
    from ec2gpu.sandbox import control
    monkeypatch.setattr(control, "interrupt", lambda *a, **k: pytest.fail("the sandbox was asked"))
    with pytest.raises(UsageError, match="--notice-seconds"):
        sb.sandbox_interrupt("i-0123456789abcdef0", seconds)


def test_up_asks_the_sandbox_of_this_home_and_says_when_one_not_like_aws_runs(home, monkeypatch):
    from ec2gpu.sandbox import control
    calls = []
    running = {"pid": 1, "endpoint": "http://127.0.0.1:1", "checkip_url": "http://127.0.0.1:1/checkip",
               "imds_url": "http://127.0.0.1:2", "like_aws": False, "instances": {}, "shutdowns": {},
               "bind_shim": "/h/sandbox/bindshim.so"}  # a state.json's document
    monkeypatch.setattr(control, "up", lambda where, like_aws=None: calls.append((where, like_aws)) or running)
    said = []
    assert sb.sandbox_up(log=said.append).to_json() == running and said == []
    assert sb.sandbox_up(like_aws=True, log=said.append).to_json() == running
    assert said == ["a sandbox without --like-aws is already running; `ec2gpu sandbox down` first"]
    assert calls == [(home.resolve(), None), (home.resolve(), True)]


def test_train_mnist_takes_runflags_and_a_trainer_and_keywords_set_the_same_fields(home, no_backend):
    from ec2gpu import api
    typed = train.train_mnist(dataclasses.replace(train.TRAIN_FLAGS, max_runtime=30, unreachable_s=60.0),
                              api.Trainer(model="lenet", epochs=2), dry_run=True)
    keywords = train.train_mnist(max_runtime=30, unreachable_after=60.0, model="lenet", epochs=2, dry_run=True)
    assert isinstance(typed, api.RunPlan) and typed.flags == keywords.flags and typed.trainer == keywords.trainer
    assert keywords.trainer.model == "lenet" and keywords.flags.unreachable_s == 60.0
    # no flags given: `train mnist`'s own defaults (on-demand, one node, an element retried twice)
    plain = train.train_mnist(dry_run=True).flags
    assert (plain.spot, plain.nodes, plain.max_retries) == (False, 1, 2)
    with pytest.raises(TypeError, match="'modle'"):
        train.train_mnist(modle="lenet", dry_run=True)
