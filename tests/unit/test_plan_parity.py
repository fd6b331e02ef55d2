"""One plan (issue 45, item 1): `--dry-run` and the real run are the same plan (runs/plan/runplan.py).

Every flag and task-field combination the real run refuses without an AWS call is refused by both
paths with the same exit code and the same error line, and the real run refuses it before any backend
is opened: backend.Context and aws/session.Aws fail the test when they are reached, so nothing that
could be refused before the credentials check is refused after it. And what the real run runs is
what its dry run showed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ec2gpu import backend, cli
from ec2gpu.aws import session

TASK = "name: t\nworkdir: .\nresources:\n  accelerators: T4:1\nrun: python train.py\n"
FILES = {
    "t.yaml": TASK,
    "ports.yaml": "name: p\nworkdir: .\nresources:\n  accelerators: T4:1\narray: 3\nports: [6006]\nrun: x\n",
    "arr.yaml": "name: a\nworkdir: .\nresources:\n  accelerators: T4:1\narray: 3\nrun: x\n",
    "two.yaml": "name: two\nworkdir: .\nnodes: 2\nresources:\n  accelerators: T4:1\nrun: x\n",
    "secret.yaml": "name: s\nworkdir: .\nsecrets:\n  BIG: null\nresources:\n  accelerators: T4:1\nrun: x\n",
    "price.yaml": "name: mp\nworkdir: .\nresources:\n  accelerators: T4:1\n  max_price: 0.5\nrun: x\n",
    "short.yaml": "name: sh\nworkdir: .\nmax_runtime: 5\nresources:\n  accelerators: T4:1\nrun: x\n",
}


@pytest.fixture
def project(no_aws, monkeypatch):
    """A project in tmp_path (the current directory) with the task files above; no AWS (conftest.no_aws);
    and no backend: reaching backend.Context or aws/session.Aws fails the test."""
    for name, text in FILES.items():
        (no_aws / name).write_text(text)
    (no_aws / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("BIG", "x" * 5000)  # over an SSM standard parameter's 4 KB

    def opened(*args, **kwargs):
        raise AssertionError("a backend was opened for a run its plan should have refused")
    monkeypatch.setattr(backend, "Context", opened)
    monkeypatch.setattr(session.Aws, "__post_init__", opened)
    return no_aws


def said(err: str) -> str:
    """The error line the CLI printed ("error: ..." or typer's "Error: ..."), rejoined where rich wrapped it."""
    found = re.search(r"(?i)\berror: (.*?)(?= hint: |$)", " ".join(err.split()))
    return found.group(1) if found else f"<no error line in {err!r}>"


def both(capsys, argv: list[str]) -> tuple[tuple[int, str], tuple[int, str]]:
    """((exit code, error line) of ``argv``, the same of ``argv`` with --dry-run)."""
    real = cli.main(argv)
    real_err = said(capsys.readouterr().err)
    dry = cli.main([*argv, "--dry-run"])
    return (real, real_err), (dry, said(capsys.readouterr().err))


RUN_REFUSALS = [
    (["--ssh-cidr", "999.1.1.1/99"], "--ssh-cidr '999.1.1.1/99' is not a CIDR"),
    (["--max-price", "0.5"], "--max-price applies to spot instances only"),
    (["--on-demand", "--max-price", "0.5"], "--max-price applies to spot instances only"),
    (["--nodes", "0"], "Invalid value for '--nodes'"),
    (["--nodes", "65"], "Invalid value for '--nodes'"),
    (["--detach", "--max-runtime", "none"], "--detach needs a limit"),
    (["--detach", "--max-runtime", "1h", "--nodes", "2", "--max-attempts", "1"], "--max-attempts 1 is below --nodes 2"),
    (["--detach", "--max-runtime", "1h", "--secret", "BIG"], "the secret BIG is 5,000 bytes"),
    # one the detached run's agent would refuse in its spec (runs/plan/detached_spec.check)
    (["--detach", "--max-runtime", "1h", "--max-attempts", "1001"], "--max-attempts 1001: a detached run launches at most"),
    (["--expect", "soon"], "--expect:"),
    (["--max-runtime", "soon"], "--max-runtime"),
    (["--max-runtime", "0"], "--max-runtime"),
    (["--array", "3", "--nodes", "2"], "--nodes runs one job over several instances"),
    (["--workers", "2"], "--workers is for an array or a sweep"),
    (["--array", "5-1"], "--array:"),
    (["--array", "2", "--gpus-per-job", "8"], "--gpus-per-job 8: g4dn.xlarge has 1 GPU"),
    (["--budget", "1"], "--budget $1.00: task t has not run on g4dn.xlarge before"),
    (["--budget", "0.001", "--expect", "10m"], "is above --budget $0.0010"),
    (["--spot", "--budget", "1", "--max-runtime", "none"], "it could cost without bound"),
    (["--max-runtime", "5", "--expect", "30m"], "longer than --max-runtime 5 min"),
    (["--spot", "--max-runtime", "5", "--expect", "30m"], "longer than --max-runtime 5 min"),
    (["--instance-type", "g4dn.xlarge,,"], "has an empty entry"),
    (["--instance-type", "t3.micro"], "no NVIDIA GPU"),
    (["--gpu", "Z80"], "Z80"),
    (["--spot", "--spot-fallback", "reserved"], "--spot-fallback 'reserved' is not known"),
    (["--region", "mars-1"], "unknown AWS region 'mars-1'"),
    (["--infra", "aws/us-west-2", "--region", "us-east-1"], "name different regions"),
    (["--infra", "gcp"], "ec2gpu runs on AWS only"),
    (["--name", "bad name"], "is not a safe name"),
    (["--port", "70000"], "--port 70000 is not a TCP port"),
]


@pytest.mark.parametrize("flags, words", RUN_REFUSALS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_run_and_its_dry_run_refuse_the_same_input_with_the_same_line_before_any_backend(project, capsys, flags,
                                                                                          words):
    real, dry = both(capsys, ["run", "t.yaml", *flags])
    assert real == dry and real[0] == 2, (real, dry)
    assert words in real[1]


@pytest.mark.parametrize("argv, words", [
    (["run", "ports.yaml"], "an array or a sweep does not take ports yet"),
    (["run", "two.yaml", "--array", "3"], "--nodes runs one job over several instances"),
    (["run", "arr.yaml", "--max-price", "0.4", "--on-demand"], "--max-price applies to spot instances only"),
    (["run", "arr.yaml", "--workers", "65"], "--workers 65: 1 to 64"),
    (["run", "two.yaml", "--detach", "--max-runtime", "1h", "--max-attempts", "1"], "--max-attempts 1 is below --nodes 2"),
    (["run", "secret.yaml", "--detach", "--max-runtime", "1h"], "the secret BIG is 5,000 bytes"),
    (["run", "price.yaml"], "--max-price applies to spot instances only"),
    (["run", "short.yaml", "--expect", "30m"], "longer than --max-runtime 5 min"),
    (["run", "--ssh-cidr", "nope", "--", "python", "train.py"], "--ssh-cidr 'nope' is not a CIDR"),
    (["run", "--max-price", "1", "--", "python", "train.py"], "--max-price applies to spot instances only"),
])
def test_what_a_task_file_asks_is_refused_the_same_way_by_both_paths(project, capsys, argv, words):
    real, dry = both(capsys, argv)
    assert real == dry and real[0] == 2, (real, dry)
    assert words in real[1]


TRAIN_REFUSALS = [
    (["--ssh-cidr", "999.1.1.1/99"], "--ssh-cidr '999.1.1.1/99' is not a CIDR"),
    (["--max-price", "0.1"], "--max-price applies to spot instances only"),
    (["--keep"], "--keep needs an explicit --max-runtime"),
    (["--detach", "--keep", "--max-runtime", "60"], "--keep has no meaning with --detach"),
    (["--detach", "--checkpoint-uri", "s3://b/p"], "--checkpoint-uri is for a run in the foreground"),
    (["--detach", "--nodes", "2", "--max-attempts", "1"], "--max-attempts 1 is below --nodes 2"),
    (["--checkpoint-uri", "gs://bucket/x"], "is not an S3 URI"),
    (["--epochs", "100000000"], "the instance would terminate itself before the job finishes"),
    (["--budget", "0.001"], "is above --budget $0.0010"),
    (["--model", "resnet"], "unknown model 'resnet'"),
    (["--instance-type", "g4dn.xlarge,,"], "has an empty entry"),
    (["--instance-type", "g2.2xlarge"], "retired"),
    (["--spot", "--spot-fallback", "reserved"], "--spot-fallback 'reserved' is not known"),
    (["--sweep", "lr=0.1,0.05", "--nodes", "2"], "a sweep runs on a pool of new instances"),
    (["--sweep", "lrate=1"], "not a flag of the built-in trainer"),
    (["--sweep", "lr=0.1", "--workers", "65"], "--workers 65: 1 to 64"),
    (["--workers", "2"], "--workers is for a sweep"),
    (["--region", "mars-1"], "unknown AWS region 'mars-1'"),
    (["--cluster", "lab", "--nodes", "2"], "--cluster trains on an existing cluster"),
    (["--detach", "--cluster", "lab"], "--detach trains on new instances of its own"),
    (["--nodes", "65"], "Invalid value for '--nodes'"),
    # train mnist's --max-runtime takes run's durations now (2h, 90m, none: issue 48 item 12), refused by
    # the plan in run's words rather than by click's integer parser
    (["--max-runtime", "0"], "--max-runtime '0': at least 1 minute"),
    (["--max-runtime", "soon"], "--max-runtime 'soon' is not a duration"),
]


@pytest.mark.parametrize("flags, words", TRAIN_REFUSALS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_train_mnist_and_its_dry_run_refuse_the_same_input_with_the_same_line_before_any_backend(project, capsys,
                                                                                                  flags, words):
    real, dry = both(capsys, ["train", "mnist", *flags])
    assert real == dry and real[0] == 2, (real, dry)
    assert words in real[1]


def test_a_detached_spec_over_what_its_agent_reads_is_refused_by_both_paths_before_any_backend(project, capsys):
    """spec.json over the 1 MiB the agent reads (runs/plan/detached_spec.check, with ids of the
    longest form): refused by the plan, not after the credentials check; eleven values of 100 kB
    each (one environment variable may hold at most 128 KiB on Linux: MAX_ARG_STRLEN)."""
    envs = [a for i in range(11) for a in ("--env", f"V{i}=" + "x" * 100_000)]
    real, dry = both(capsys, ["run", "t.yaml", "--detach", "--max-runtime", "1h", *envs])
    assert real == dry and real[0] == 2, (real[0], dry[0], real[1][:200])
    assert "the run's spec would be 1,1" in real[1] and "largest environment variables" in real[1]


def test_train_mnist_on_the_sandbox_without_data_is_refused_by_both_paths_before_any_backend(project, capsys,
                                                                                            monkeypatch):
    """No MNIST here (no EC2GPU_DATA_DIR, no cached copy) and no mirror reachable: the sandbox
    instance would have nothing to train on; refused by the plan (runs/plan/sandbox_data.py), so
    the dry run says it too and no sandbox is started for it."""
    from ec2gpu.runs.plan import sandbox_data
    from ec2gpu.train import sources
    monkeypatch.delenv("EC2GPU_DATA_DIR", raising=False)
    monkeypatch.setattr(sources, "DEFAULT_CACHE", project / "no-cache")
    monkeypatch.setattr(sandbox_data, "_reachable", lambda url: False)
    real, dry = both(capsys, ["train", "mnist", "--sandbox"])
    assert real == dry and real[0] == 2, (real, dry)
    assert "no MNIST for the sandbox" in real[1]


def test_train_mnist_on_the_sandbox_plans_the_data_its_instance_reads(project, capsys, monkeypatch):
    """The data directory the sandbox instance gets is in the plan the dry run prints."""
    monkeypatch.setenv("EC2GPU_DATA_DIR", str(project))
    assert cli.main(["train", "mnist", "--sandbox", "--dry-run", "--json"]) == 0
    assert f"--data-dir {project.resolve()}" in capsys.readouterr().out


class Ran(Exception):
    """What the fake pipeline raises once it has the options (the CLI then exits 1)."""


@pytest.fixture
def ran(project, monkeypatch):
    """[the real run's options]: caught where the pipeline (or the detached launch) would take them,
    in a backend.Context that opens nothing."""
    from types import SimpleNamespace

    from ec2gpu import settings as settings_mod
    from ec2gpu.pool import attempt as pool_attempt
    from ec2gpu.runs.detached import launch
    from ec2gpu.runs.provision import pipeline

    class Context:
        def __init__(self, region, sandbox, persistent=False, note=lambda text: None):
            self.settings = settings_mod.load({"region": region, "sandbox": sandbox or None})
            self.aws, self.backend = SimpleNamespace(region=region), SimpleNamespace(is_sandbox=False, name="aws")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    seen = []

    def take(aws, settings, opts, ui, back, **handed):  # an array is handed its pool_attempt too
        seen.append(opts)
        raise Ran()
    monkeypatch.setattr(backend, "Context", Context)
    monkeypatch.setattr(pipeline, "run_job", take)
    monkeypatch.setattr(launch, "start", take)
    monkeypatch.setattr(pool_attempt, "ray_here", lambda shim=None: "2.0")
    return seen


@pytest.mark.parametrize("argv", [
    ["run", "t.yaml", "--spot", "--max-price", "0.3", "--expect", "10m", "--ssh-cidr", "198.51.100.0/24"],
    ["run", "arr.yaml", "--workers", "2", "--expect", "1m"],
    ["run", "t.yaml", "--detach", "--max-runtime", "2h", "--instance-type", "g5.xlarge,g4dn.xlarge"],
    ["train", "mnist", "--epochs", "2", "--nodes", "2", "--budget", "5"],
])
def test_the_real_run_runs_the_plan_its_dry_run_shows(ran, capsys, argv):
    capsys.readouterr()
    assert cli.main([*argv, "--dry-run", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert cli.main(argv) == 1 and len(ran) == 1
    opts = ran[0]
    assert opts.instance_types == [r["instance_type"] for r in shown["instance_types"]]
    assert ("spot" if opts.spot else "on-demand", opts.nodes) == (shown["market"], shown["nodes"])
    assert opts.max_runtime_minutes == shown["max_runtime"]["minutes"]
    assert (opts.idle.seconds // 60 if opts.idle else None) == shown["idle_rule_minutes"]
    assert (opts.max_price if opts.spot else None) == shown["max_price_usd_per_hour"]
    assert (opts.ssh_cidr or "<your public IP>/32") == shown["ssh"]["cidr"]
    assert opts.budget_usd == (shown["budget"] or {}).get("usd")
    assert len(getattr(opts, "elements", ())) == ((shown["array"] or {}).get("elements") or 0)
    assert ("detached" in shown["mode"]) == (getattr(opts, "detach", False) or "--detach" in argv)


def test_the_plan_says_where_each_value_comes_from(project, capsys):
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--spot", "--ssh-cidr", "198.51.100.7/32"]) == 0
    sources = json.loads(capsys.readouterr().out)["sources"]
    assert sources["instance_types"] == "the task's resources" and sources["market"] == "--spot"
    assert sources["ssh_cidr"] == "--ssh-cidr" and sources["nodes"] == "default: 1"
    assert sources["max_runtime"].startswith("task t has not run before")
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--gpu", "A10G", "--max-runtime", "2h"]) == 0
    sources = json.loads(capsys.readouterr().out)["sources"]
    assert (sources["instance_types"], sources["max_runtime"]) == ("--gpu A10G", "--max-runtime")
    assert sources["ssh_cidr"] == "your public IP/32, looked up at launch"


def test_a_dry_run_says_the_ssh_cidr_the_run_opens_not_the_default(project, capsys):
    assert cli.main(["run", "t.yaml", "--dry-run", "--ssh-cidr", "10.0.0.0/8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "SSH (port 22) open to 10.0.0.0/8 alone (--ssh-cidr)" in out and "16,777,216 addresses" in out
    assert "your public IP/32" not in out


def test_train_mnist_dry_run_shows_its_plan_as_run_dry_run_does(project, capsys):
    assert cli.main(["train", "mnist", "--dry-run", "--json", "--epochs", "3", "--spot"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "plan" and shown["task"] == "mnist" and "built-in task mnist" in shown["source"]
    assert shown["trainer"] == {"model": "cnn", "epochs": 3, "seed": 0, "trainer_args": ""}
    assert shown["market"] == "spot" and shown["max_runtime"]["minutes"] == 120
    assert shown["estimate"]["run"]["train_seconds"] > 0 and shown["instance_types"][0]["instance_type"] == "g4dn.xlarge"
    assert cli.main(["train", "mnist", "--dry-run", "--epochs", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("plan for task mnist") and any("trainer: --model cnn --seed 0 --epochs 3" in ln
                                                               for ln in lines)
    home = Path(project / "home")
    assert not home.exists() or not any(home.rglob("*"))  # nothing written: no ledger row, no key, no sandbox
    assert cli.main(["train", "mnist", "--dry-run", "--local"]) == 2
    assert "--dry-run shows a run on new instances" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("given, minutes", [("2h", 120), ("90m", 90), ("45", 45), ("none", None)])
def test_train_mnist_takes_a_max_runtime_as_run_does(project, capsys, given, minutes):
    """`train mnist --max-runtime 2h` was refused in pydantic's words (issue 48 item 12): it takes run's durations."""
    assert cli.main(["train", "mnist", "--dry-run", "--json", "--max-runtime", given]) == 0
    assert json.loads(capsys.readouterr().out)["max_runtime"]["minutes"] == minutes


@pytest.mark.parametrize("argv", [["run", "arr.yaml"], ["train", "mnist", "--sweep", "lr=0.1,0.05"]])
def test_an_array_without_ray_here_is_refused_before_any_backend_and_its_dry_run_still_shows_the_plan(
        project, capsys, monkeypatch, argv):
    from importlib import metadata

    def missing(name):
        if name == "ray":
            raise metadata.PackageNotFoundError(name)
        return real_version(name)
    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", missing)
    assert cli.main(argv) == 2  # project: opening a backend first would fail the test
    assert said(capsys.readouterr().err) == "an array or a sweep runs on Ray, which is not installed here"
    assert cli.main([*argv, "--dry-run"]) == 0  # the plan is this machine's files alone: Ray is the run's need
