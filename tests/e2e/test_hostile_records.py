"""A job that writes a hostile summary.json, through a whole sandbox run: a summary that is not an
object is kept marked and breaks no later command; a secret value the job writes into it is in
none of what ec2gpu prints or keeps (runs/job_summary.py)."""
import json
import sqlite3
import textwrap

import pytest

from test_run_task import assert_nothing_left  # same folder (pytest prepend import mode)
from test_spot_recovery import drive

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # a user's task, not the built-in trainer
SECRET = "s3cr3t-h0stile-7731"

WRITE_SUMMARY = """\
import json, os
tok = os.environ["MY_TOKEN"]
data = [1, 2, 3] if os.environ["MODE"] == "list" else \\
    {"token": tok, "key-" + tok: {"deep": ["x" + tok + "y", 1]}, "loss": 0.25}
with open(os.path.join(os.environ["EC2GPU_OUTPUT_DIR"], "summary.json"), "w") as f:
    json.dump(data, f)
"""


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    root = tmp_path / "hostile"
    root.mkdir()
    (root / "write_summary.py").write_text(WRITE_SUMMARY)
    (root / "task.yaml").write_text(textwrap.dedent("""\
        name: hostile
        workdir: .
        run: python3 write_summary.py
        envs:
          MODE: list
          MY_TOKEN:
        secrets: [MY_TOKEN]
        """))
    monkeypatch.setenv("MY_TOKEN", SECRET)
    monkeypatch.chdir(tmp_path)
    return root


def test_a_hostile_summary_is_kept_marked_and_a_secret_in_it_is_stored_and_shown_nowhere(sandbox_env, hostile,
                                                                                          tmp_path):
    home, _ = sandbox_env
    code, stdout, err = drive(["run", "--sandbox", str(hostile / "task.yaml"), "--expect", "1m", "--json",
                               "--out", str(tmp_path / "list")], [])
    assert code == 0, err
    listed = json.loads(stdout)
    assert_nothing_left(home, listed)
    shown = [stdout, err]
    code, stdout, err = drive(["run", "--sandbox", str(hostile / "task.yaml"), "--expect", "1m", "--env", "MODE=secret",
                               "--json", "--out", str(tmp_path / "secret")], [])
    assert code == 0, err
    masked = json.loads(stdout)
    assert_nothing_left(home, masked)
    shown += [stdout, err]
    # every later command goes on, and none shows the secret
    for argv in (["runs"], ["runs", "--json"], ["runs", "show", listed["run_id"]], ["runs", "show", masked["run_id"]],
                 ["runs", "show", masked["run_id"], "--json"]):
        code, out, errs = drive(argv, [], timeout_s=60)
        assert code == 0 and "Traceback" not in errs, (argv, errs)
        shown += [out, errs]
    assert "****" in shown[-2]
    kept = [(tmp_path / d / "run.json").read_text() for d in ("list", "secret")]
    kept.append((home / "ledger.sqlite").read_bytes().decode(errors="replace"))
    for where in shown + kept:
        assert SECRET not in where
    # the list: kept marked, as the ledger has it
    assert listed["status"] == "completed" and listed["summary_schema"] == "invalid"
    assert listed["summary"] == {"invalid": "not a JSON object but a list", "raw": "[1, 2, 3]"}
    assert "summary.json not accepted (not a JSON object but a list)" in " ".join(shown[1].split())
    row = sqlite3.connect(home / "ledger.sqlite").execute(
        "SELECT summary, summary_schema FROM runs WHERE run_id = ?", (listed["run_id"],)).fetchone()
    assert json.loads(row[0]) == listed["summary"] and row[1] == "invalid"
    # the secret: masked in keys and values at any depth
    assert masked["summary_schema"] == "task"
    assert masked["summary"] == {"token": "****", "key-****": {"deep": ["x****y", 1]}, "loss": 0.25}
    # the job's own file came home as it wrote it (docs/tasks.md: outputs are the job's)
    assert SECRET in (tmp_path / "secret" / "outputs" / "summary.json").read_text()
