"""A job that writes a document nested 50,000 deep (100 KB: over the progress file's size limit) or
5,000 deep (10 KB: under it, too deep) as its progress file, through a whole sandbox run (issue 44
item 3): `ec2gpu run` once ended 1.2 s in with RecursionError, the job killed and nothing home.
Now the run goes on to the job's end, says once in one line that the progress file was refused,
and brings the outputs home (runs/execute/nodes.ProgressReader, ec2gpu/wire/bounded_json.py)."""
import json
import textwrap

import pytest

from test_run_task import assert_nothing_left  # same folder (pytest prepend import mode)
from test_spot_recovery import drive

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # a user's task, not the built-in trainer

WRITE_DEEP = """\
import os, sys, time
with open(os.environ["EC2GPU_PROGRESS_FILE"], "w") as f:
    f.write("[" * int(sys.argv[1]) + "]" * int(sys.argv[1]))
time.sleep(4)  # the controller reads the progress file every second while it follows the log
with open(os.path.join(os.environ["EC2GPU_OUTPUT_DIR"], "result.txt"), "w") as f:
    f.write("42\\n")
print("the job ended", flush=True)
"""


#: the issue's 100 KB document (over the progress file's 32 KiB: refused for its size), and the unit
#: tests' 10 KB one (under it: refused for its depth alone, so the depth check runs in a real run too)
@pytest.mark.parametrize("levels, why", [(50000, "over 32,768 bytes"), (5000, "nested deeper than 64 levels")],
                         ids=["100 KB, too large", "10 KB, too deep"])
def test_a_deep_progress_file_is_refused_in_one_line_and_the_run_goes_on(sandbox_env, tmp_path, monkeypatch, levels, why):
    home, _ = sandbox_env
    root = tmp_path / "deep"
    root.mkdir()
    (root / "write_deep.py").write_text(WRITE_DEEP)
    (root / "task.yaml").write_text(textwrap.dedent(f"""\
        name: deep
        workdir: .
        run: python3 write_deep.py {levels}
        """))
    monkeypatch.chdir(tmp_path)
    code, stdout, err = drive(["run", "--sandbox", str(root / "task.yaml"), "--expect", "1m", "--json",
                               "--out", str(tmp_path / "out")], [])
    assert code == 0, err
    assert "RecursionError" not in err and "Traceback" not in err
    said = " ".join(err.split())  # rich wraps a long line at the terminal's width
    assert said.count("warning: the job's progress file (progress.json) is refused") == 1, err  # once, not every poll
    assert f"is refused ({why}): no progress shown" in said, err
    assert "the job ended" in err  # followed to its end: the job was not stopped
    record = json.loads(stdout)
    assert record["status"] == "completed" and (tmp_path / "out" / "outputs" / "result.txt").read_text() == "42\n"
    assert_nothing_left(home, record)
