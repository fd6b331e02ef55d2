"""A hostile job in the sandbox: its log lines and its summary.json carry terminal control sequences
(clear the screen, set the window title, write the clipboard, make a hyperlink) and rich markup.
Nothing of it reaches the user's terminal as such: the run, `ec2gpu runs`, `runs show` and `logs`
show it inert (ec2gpu.inert) and exit 0."""
import json
import os
import subprocess
import textwrap

import pytest

from test_spot_recovery import EC2GPU, drive  # same folder (pytest prepend import mode)
from test_sandbox_train import leftovers

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # a user project, not the built-in trainer

HOSTILE = ("\033[2J\033]0;pwned\007\033]52;c;ZXZpbA==\007\033]8;;https://evil\033\\link\033]8;;\033\\"
           "[/oops][link=https://evil]click[/link]\u202egnp.exe")
JOB = f"""\
import json, os
H = {HOSTILE!r}
print("before " + H + " after", flush=True)
with open(os.path.join(os.environ["EC2GPU_OUTPUT_DIR"], "summary.json"), "w") as f:
    json.dump({{"msg": H, H: 1}}, f)
"""


def assert_no_controls(text: str) -> None:
    """No ESC, BEL, C1 control or bidi override: rich writes no colour to a pipe, so none is expected."""
    assert not any(c in text for c in "\033\007\x9b\x9d\u202e"), repr(text)


def assert_inert(text: str) -> None:
    """assert_no_controls, and the hostile text is there (made inert), or nothing was printed at all."""
    assert_no_controls(text)
    assert "pwned" in text or text == ""


def about_this_run(text: str, run_id: str) -> str:
    """``text`` without the notes on the shared sandbox's other runs ('run OTHER_ID (...): ...', which
    `runs` gives for runs of other tests that ended), which may come before or after this one's."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not (line.startswith("run ") and line.split()[1] != run_id))


def test_a_hostile_jobs_log_and_summary_reach_the_terminal_inert(sandbox_env, tmp_path, monkeypatch):
    home, _ = sandbox_env
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "job.py").write_text(JOB)
    (proj / "task.yaml").write_text(textwrap.dedent("""\
        name: hostile
        workdir: .
        run: python3 job.py
        """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "1000")  # rich folds nothing: each line is found whole
    code, stdout, err = drive(["run", "--sandbox", str(proj / "task.yaml"), "--expect", "1m",
                               "--out", str(tmp_path / "r")], [])
    assert code == 0, err
    assert_inert(stdout)
    assert_inert(err)
    assert "Traceback" not in err and "MarkupError" not in err
    # the live log: the line, its escapes shown
    assert r"| before \x1b[2J\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x1b]8;;https://evil\x1b\link" in err
    # the run's table: the summary (JSON, its escapes as JSON writes them), the markup as text
    table = " ".join(stdout.split())
    assert "summary" in table and r"\u001b]0;pwned\u0007" in table and "[/oops][link=https://evil]click[/link]" in table
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["summary"]["msg"] == HOSTILE  # the record keeps what the job wrote; only the screen is made safe
    # afterwards, from the ledger and the artifacts: `runs`, `runs show`, `logs`
    env = dict(os.environ)
    for argv in (["runs"], ["runs", "show", record["run_id"]], ["logs", record["run_id"]]):
        shown = subprocess.run([EC2GPU, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, (argv, shown.stderr)
        assert_inert(shown.stdout)
        assert_no_controls(shown.stderr)
        assert_inert(about_this_run(shown.stderr, record["run_id"]))
        assert "[/oops]" in shown.stdout, (argv, shown.stdout)
    assert leftovers(home) == ([], [], [])
