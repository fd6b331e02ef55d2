"""`ec2gpu run` / `ec2gpu exec` with a user's own project (not MNIST) in the sandbox: the workdir
sync and what never leaves this machine, the job's contract (environment, outputs, exit code),
spot resume, cached setup on a standing instance, SkyPilot task files, secrets."""
import json
import os
import shutil
import sqlite3
import subprocess
import textwrap
from pathlib import Path

import pytest

from ec2gpu import cli
from ec2gpu.sandbox import control

from test_sandbox_train import leftovers, processes_gone, sandbox_settles  # same folder (pytest prepend import mode)
from test_spot_recovery import EC2GPU, drive, launched

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # a user project, not the built-in trainer
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
SECRET = "s3cr3t-value-4242"
PRINT_ENV = ("python3 -c \"import os; [print(k, '=', os.environ[k]) for k in sorted(os.environ) "
             "if k.startswith(('EC2GPU_', 'SKYPILOT_', 'EPOCHS'))]\"")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user project: the quickstart's train.py, a task file, and files that must not travel."""
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copy(QUICKSTART / "train.py", root / "train.py")
    (root / ".gitignore").write_text("data/\nout/\ncheckpoints/\n")
    (root / ".ec2gpuignore").write_text("notes.txt\n")
    (root / "notes.txt").write_text("private notes\n")
    (root / ".env").write_text(f"MY_TOKEN={SECRET}\n")
    (root / "deploy.pem").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n")
    (root / "data").mkdir()
    with open(root / "data" / "big.bin", "wb") as f:  # gitignored, 50 MB
        f.truncate(50 * 1024 * 1024)
    (root / "task.yaml").write_text(textwrap.dedent(f"""\
        name: proj
        workdir: .
        setup: echo setting up
        run: |
          echo "token $MY_TOKEN"
          echo begun > "$EC2GPU_CHECKPOINT_DIR/begun.txt" || exit 9
          if [ -n "${{WATCH_REBALANCE:-}}" ]; then
            (while [ ! -f "$EC2GPU_REBALANCE_FILE" ]; do sleep 0.1; done; echo "rebalance seen") &
          fi
          {PRINT_ENV}
          python3 train.py
        envs:
          EPOCHS: 6
          SECONDS_PER_EPOCH: 0.1
          MY_TOKEN:
        secrets: [MY_TOKEN]
        outputs: ["summary.json", "metrics.jsonl"]
        """))
    monkeypatch.setenv("MY_TOKEN", SECRET)
    monkeypatch.chdir(tmp_path)
    return root


def instance_dir(home, instance_id: str) -> Path:
    return home / "sandbox" / "instances" / instance_id / "home" / "ec2gpu"


def assert_nothing_left(home, record):
    assert leftovers(home) == ([], [], [])
    assert sandbox_settles(home) and processes_gone(record["instance_ids"])


def test_a_user_project_runs_end_to_end_and_what_must_stay_home_stays(sandbox_env, project, tmp_path):
    home, _ = sandbox_env
    # the task's first run: no --expect, no --max-runtime (issue 28.1); what is known is said, and it starts
    code, stdout, err = drive(["run", "--sandbox", str(project / "task.yaml"), "--json",
                               "--out", str(tmp_path / "r")], [])
    assert code == 0, err
    said = " ".join(err.split())
    assert "task proj has not run on g4dn.xlarge before, so its time is unknown" in said
    assert "so it costs at most $12.62" in said and "max runtime: 24 h (task proj has not run before" in said
    record = json.loads(stdout)
    assert record["estimated_cost_usd"] is None and record["estimate"]["upper_bound"] is True
    assert record["status"] == "completed" and record["task"] == "proj" and record["exit_status"] == 0
    assert record["summary"]["epochs"] == 6  # the job's own summary.json, in the run record
    outputs = tmp_path / "r" / "outputs"
    assert sorted(p.name for p in outputs.iterdir()) == ["metrics.jsonl", "summary.json"]
    # on the instance's disk: the workdir without the gitignored, .ec2gpuignored and secret files
    workdir = instance_dir(home, record["instance_id"]) / "workdirs" / "proj"
    sent = sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob("*") if p.is_file())
    assert sent == [".ec2gpuignore", ".gitignore", "task.yaml", "train.py"], sent
    assert "withheld (secrets): .env, deploy.pem (--include-secrets sends them)" in " ".join(err.split())
    # the job's contract: its environment
    log = (tmp_path / "r" / "job.log").read_text()
    for line in ("EC2GPU_NODE_RANK = 0", "EC2GPU_NUM_NODES = 1", "EC2GPU_RESUME = 0", "SKYPILOT_NODE_RANK = 0",
                 "SKYPILOT_NUM_NODES = 1", f"EC2GPU_RUN_ID = {record['run_id']}", "EPOCHS = 6"):
        assert line in log, line
    assert "EC2GPU_OUTPUT_DIR = " in log and "EC2GPU_CHECKPOINT_DIR = " in log and "EC2GPU_HEAD_IP = 127.0.0." in log
    # the checkpoint directory existed when the job started (its first write is before train.py makes it)
    assert (tmp_path / "r" / "checkpoints" / "begun.txt").read_text() == "begun\n"
    # the secret: used by the job, written nowhere
    assert "token ****" in log and "token ****" in err
    run_json = (tmp_path / "r" / "run.json").read_text()
    ledger_bytes = (home / "ledger.sqlite").read_bytes()
    for where in (stdout, err, log, run_json, ledger_bytes.decode(errors="replace"),
                  (tmp_path / "r" / "attempt-1-node-0.log").read_text()):
        assert SECRET not in where
    row = sqlite3.connect(home / "ledger.sqlite").execute(
        "SELECT task, status, exit_status, summary FROM runs WHERE run_id = ?", (record["run_id"],)).fetchone()
    assert row[:3] == ("proj", "completed", 0) and json.loads(row[3])["epochs"] == 6
    assert_nothing_left(home, record)


def test_the_max_runtime_stops_the_job_with_sigterm_first_and_the_run_says_so(sandbox_env, project, tmp_path,
                                                                            monkeypatch):
    """Issue 28.2: no silent cut. A 1-minute limit: the agent gives the job SIGTERM half a minute
    after launch (its grace and the nologin window, at most half the limit: limits.lead_seconds),
    the job checkpoints, the run fails (exit 5)
    saying the limit ended it and how to raise it, the checkpoint comes home, nothing is left."""
    home, _ = sandbox_env
    (project / "limit.yaml").write_text(textwrap.dedent("""\
        name: limited
        run: |
          trap 'echo saved > "$EC2GPU_CHECKPOINT_DIR/at-sigterm.txt"; exit 0' TERM
          echo started; while :; do sleep 0.2; done
        """))
    monkeypatch.setenv("EC2GPU_LIMIT_GRACE_SECONDS", "600")  # capped: SIGTERM 30 s before the end, SIGKILL 15 s later
    code, _, err = drive(["run", "--sandbox", str(project / "limit.yaml"), "--max-runtime", "1", "--out",
                          str(tmp_path / "r")], [], timeout_s=120)
    said = " ".join(err.split())
    assert code == 5, err
    assert "max runtime: 1 min (--max-runtime)" in said and "the run's --max-runtime ended the job on node 0" in said
    assert "--max-runtime 8h" in said
    assert (tmp_path / "r" / "checkpoints" / "at-sigterm.txt").read_text() == "saved\n"
    status = json.loads((tmp_path / "r" / "agent-record.json").read_text())
    assert status["state"] == "failed" and status["limit"]["stopped_at"]
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)


def test_a_failing_job_exits_5_with_its_outputs_home_and_nothing_left(sandbox_env, project, tmp_path):
    home, _ = sandbox_env
    code, _, err = drive(["run", "--sandbox", str(project / "task.yaml"), "--expect", "1m", "--env",
                          "FAIL_AT_EPOCH=3", "--out", str(tmp_path / "r")], [])
    assert code == 5, err
    assert "the job on node 0" in err and "exited 3" in err and "failing at epoch 3" in err  # the last lines
    assert "Traceback" not in err
    assert (tmp_path / "r" / "outputs" / "metrics.jsonl").read_text().count("\n") == 3  # outputs came home
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["status"] == "failed" and record["exit_status"] == 3
    assert_nothing_left(home, record)
    # its log is on this machine: `logs --follow` needs no AWS (an endpoint nobody answers) and
    # exits with the job's exit status
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    env.pop("EC2GPU_SANDBOX", None)
    shown = subprocess.run([EC2GPU, "logs", record["run_id"], "--follow"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 3, shown.stderr
    assert "failing at epoch 3" in shown.stdout and SECRET not in shown.stdout


def test_a_spot_interruption_restarts_the_job_with_EC2GPU_RESUME_and_its_checkpoint(sandbox_env, project, tmp_path):
    home, _ = sandbox_env
    code, stdout, err = drive(["run", "--sandbox", str(project / "task.yaml"), "--spot", "--expect", "1m", "--json",
                               "--env", "EPOCHS=30", "--env", "SECONDS_PER_EPOCH=0.3", "--env", "WATCH_REBALANCE=1",
                               "--out", str(tmp_path / "r")],
                              # first a rebalance recommendation, which reaches the job as $EC2GPU_REBALANCE_FILE
                              [("epoch 3/30", lambda line, lines: control.interrupt(home, launched(lines), 0,
                                                                                    rebalance=True)),
                               ("rebalance seen", lambda line, lines: control.interrupt(home, launched(lines), 3.0))])
    assert code == 0, err
    record = json.loads(stdout)
    first, second = record["attempts"]
    # the agent saw the notice (its record), or the controller saw EC2 terminate it first: both interrupt
    assert "spot interruption notice" in first["ended"] or "SpotInstanceTermination" in first["ended"], first
    assert second["ended"] == "completed"
    log = (tmp_path / "r" / "job.log").read_text()
    assert "EC2GPU_RESUME = 1" in log and "resumed from" in log
    resumed_at = int(log.split("resumed from")[1].split("at epoch")[1].split()[0])
    assert resumed_at >= 3  # the checkpoint directory came home and went to the replacement
    assert record["summary"]["epochs"] == 30
    assert_nothing_left(home, record)


def test_exec_on_a_standing_instance_skips_a_setup_that_already_ran(sandbox_env, project, tmp_path, capsys):
    home, _ = sandbox_env
    assert cli.main(["launch", "--sandbox", "--name", "dev", "--max-runtime", "30"]) == 0
    try:
        said = " ".join(capsys.readouterr().out.split())  # issue 27.21: launch says how its instance ends
        assert "it terminates itself after 1h00m idle (--idle-down" in said and "30 min after it boots" in said
        assert cli.main(["exec", "dev", str(project / "task.yaml"), "--sandbox", "--out", str(tmp_path / "a")]) == 0
        first = capsys.readouterr().err
        assert "setting up" in first and "skipped" not in first
        # `logs NAME` on the standing instance shows its newest run's job log, the secret masked
        assert cli.main(["logs", "dev", "--sandbox"]) == 0
        shown = capsys.readouterr().out
        assert "token ****" in shown and SECRET not in shown and "EC2GPU_RUN_ID" in shown
        (project / "train.py").write_text((project / "train.py").read_text() + "\n# changed\n")
        assert cli.main(["exec", "dev", str(project / "task.yaml"), "--sandbox", "--out", str(tmp_path / "b")]) == 0
        second = " ".join(capsys.readouterr().err.split())
        assert "setup unchanged since it ran on this instance" in second and "setting up" not in second
        # the machine setup (setup-gpu.sh) is not redone either: the first exec's result is reused
        assert "machine setup skipped" not in first and "machine setup skipped: setup-gpu.sh" in second
        run = json.loads((tmp_path / "b" / "run.json").read_text())
        used = json.loads((instance_dir(home, run["instance_id"]) / "runs" / run["run_id"] / "setup.json").read_text())
        assert used["reused"] and used["python"]
        assert json.loads((tmp_path / "b" / "outputs" / "summary.json").read_text())["epochs"] == 6
    finally:
        assert cli.main(["down", "dev", "--sandbox"]) == 0
    assert leftovers(home) == ([], [], [])


def test_a_skypilot_task_file_runs_on_two_nodes_and_names_what_it_ignores(sandbox_env, project, tmp_path):
    home, _ = sandbox_env
    (project / "sky.yaml").write_text(textwrap.dedent("""\
        # written the way SkyPilot's docs write a multi-node task
        name: sky-proj
        num_nodes: 2
        resources:
          cloud: aws
          accelerators: T4:1
          use_spot: false
          disk_size: 100
        file_mounts:
          ~/data: ./data
        service:
          readiness_probe: /
        workdir: .
        envs:
          EPOCHS: 2
          SECONDS_PER_EPOCH: 0
        setup: |
          echo "setup on $(hostname)"
        run: |
          echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES, gpus $SKYPILOT_NUM_GPUS_PER_NODE"
          echo "ips $(echo "$SKYPILOT_NODE_IPS" | tr '\\n' ' ')"
          echo "mounted: $(cat ~/data/hello.txt)"
          python3 train.py
        """))
    (project / "data").mkdir(exist_ok=True)
    (project / "data" / "hello.txt").write_text("from a local file mount\n")
    code, stdout, err = drive(["run", "--sandbox", str(project / "sky.yaml"), "--expect", "1m", "--json",
                               "--out", str(tmp_path / "r")], [])
    assert code == 0, err
    flat = " ".join(err.split())
    assert "warning: ignored SkyPilot field(s) ec2gpu does not support: service" in flat and "resources.cloud" not in flat
    assert flat.count("mounted: from a local file mount") == 2  # file_mounts reach every node
    record = json.loads(stdout)
    assert len(record["instance_ids"]) == 2 and record["task"] == "sky-proj"
    assert "node 0 | rank 0 of 2" in err and "node 1 | rank 1 of 2" in err
    assert_nothing_left(home, record)


@pytest.mark.parametrize("text, words", [
    ("run: [unclosed\n", "task.yaml:1: not valid YAML"),
    ("name: x\nrun: y\nreosurces: {}\n", "task.yaml:3: reosurces: unknown field"),
    ("name: x\nrun: y\nresources:\n  gpu: T9\n", "task.yaml:4: resources.gpu: 'T9' is not a GPU EC2 sells"),
    ("name: x\nrun: y\nnodes: two\n", "task.yaml:3: nodes:"),
    ("name: x\nnum_nodes: 0\nrun: y\n", "task.yaml:2: num_nodes:"),
    ("name: x\nrun: y\nenvs: {A: null}\nsecrets: [B]\n", "secrets B are not in envs"),
    ("name: x\n", "run: missing"),
])
def test_a_bad_task_file_is_one_line_exit_2_and_nothing_created(sandbox_env, tmp_path, capsys, text, words):
    home, _ = sandbox_env
    (tmp_path / "task.yaml").write_text(text)
    assert cli.main(["run", "--sandbox", str(tmp_path / "task.yaml")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert words in err and "Traceback" not in err and err.startswith("error:")
    assert leftovers(home) == ([], [], [])


def test_a_corrupt_ledger_does_not_stop_a_run_and_is_named_once(sandbox_env, project, tmp_path):
    home, _ = sandbox_env
    path = home / "ledger.sqlite"
    kept = path.read_bytes() if path.exists() else None
    path.write_bytes(b"not a database" * 500)
    try:
        code, stdout, err = drive(["run", "--sandbox", str(project / "task.yaml"), "--expect", "1m", "--env",
                                   "EPOCHS=1", "--json", "--out", str(tmp_path / "r")], [])
    finally:
        path.write_bytes(kept) if kept is not None else path.unlink()
    assert code == 0, err
    said = " ".join(err.split())
    assert said.count(f"warning: the ledger {path} cannot be used") == 1 and f"mv {path} {path}.bad" in said
    record = json.loads(stdout)
    assert record["status"] == "completed"
    assert_nothing_left(home, record)


def test_the_python_api_runs_a_task_and_returns_its_record(sandbox_env, project, tmp_path):
    import ec2gpu
    from ec2gpu.runs.provision.pipeline import Reporter
    home, _ = sandbox_env

    class Recording(Reporter):
        seen: list = []

        def progress(self, p):
            self.seen.append(p)
    result = ec2gpu.run(project / "task.yaml", sandbox=True, expect="1m", env={"EPOCHS": "12", "SECONDS_PER_EPOCH": "0.25"},
                        out=tmp_path / "r", reporter=Recording())
    record = result.to_json()
    assert result.status == "completed" and result.summary["epochs"] == 12
    # the progress the job wrote reached the reporter, as written (no log text parsed)
    assert Recording.seen and all(p["total"] == 12 and p["label"] == f"epoch {p['done']}/12" for p in Recording.seen)
    assert json.loads((tmp_path / "r" / "run.json").read_text())["run_id"] == record["run_id"]
    assert_nothing_left(home, record)


@pytest.mark.parametrize("example, extra, check", [
    ("skypilot-quickstart.yaml", [], lambda r: r["summary"]["epochs"] == 10),
    ("pytorch-ddp/task.yaml", ["--gpu", "T4"], lambda r: r["summary"]["world_size"] == 2),  # 2 nodes, torchrun
])
def test_the_examples_run_in_the_sandbox_as_the_readme_says(sandbox_env, torchrun_port, tmp_path, example, extra, check):
    """torchrun_port: the DDP example's rendezvous listens on every address at 29500 (the sandbox's
    instances share this machine's network), as the other multi-node tests' does."""
    home, _ = sandbox_env
    path = QUICKSTART.parent / example
    code, stdout, err = drive(["run", "--sandbox", str(path), *extra, "--expect", "2m", "--json",
                               "--out", str(tmp_path / "r")], [])
    assert code == 0, err
    record = json.loads(stdout)
    assert record["status"] == "completed" and check(record), record
    assert_nothing_left(home, record)
