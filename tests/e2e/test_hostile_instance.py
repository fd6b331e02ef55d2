"""A hostile job in the sandbox (issue 26): what it does on its instance must not write anything
on this machine outside its run directory, nor change what the run reports, nor crash the
controller. Each test performs the attack as a job would, then checks this machine."""
import json
import textwrap

import pytest

from test_run_task import assert_nothing_left  # same folder (pytest prepend import mode)
from test_spot_recovery import drive

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # no training: jobs of a few shell lines


def _task(root, run: str, name: str) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        workdir: .
        run: |
        """) + textwrap.indent(textwrap.dedent(run), "  "))
    return str(root / "task.yaml")


def test_names_the_instance_lists_never_leave_the_run_directory(sandbox_env, tmp_path, monkeypatch):
    """Issue 26.1: a job appended a find() to ~/.bashrc; the controller's listing (find over SSH)
    then named ../ and absolute paths, and it wrote them outside the run, overwriting a file,
    while the run reported success. A checkpoint named with a newline killed the run (26.6). A
    2 GB sparse output was written here with no word (26.7)."""
    home, _ = sandbox_env
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EC2GPU_MAX_DOWNLOAD_BYTES", "1000000")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    out = tmp_path / "r"
    evil = (f"find() {{ printf '%s\\0' ../../victim.txt {tmp_path}/abs_written.txt ../dotdot_written.txt "
            "summary.json; }")
    run = f"""\
        printf '%s\\n' {json.dumps(evil)} >> ~/.bashrc
        echo '{{"ok": 1}}' > "$EC2GPU_OUTPUT_DIR/summary.json"
        ln -s / "$EC2GPU_OUTPUT_DIR/root-link"
        truncate -s 2G "$EC2GPU_OUTPUT_DIR/big.bin"
        mkdir -p "$EC2GPU_CHECKPOINT_DIR" && printf 'state' > "$EC2GPU_CHECKPOINT_DIR/$(printf 'step\\n1.pt')"
        sleep 6
        """
    code, stdout, err = drive(["run", "--sandbox", _task(tmp_path / "proj", run, "names"), "--expect", "1m", "--json",
                               "--out", str(out)], [])
    assert code == 0, err
    record = json.loads(stdout)
    assert victim.read_text() == "the user's own file\n"
    assert not (tmp_path / "abs_written.txt").exists() and not (tmp_path / "dotdot_written.txt").exists()
    assert sorted(p.name for p in (out / "outputs").iterdir()) == ["summary.json"]
    assert "1 file(s), 2,147,483,648 bytes, not brought home" in " ".join(err.split())
    assert (out / "checkpoints" / "step\n1.pt").read_text() == "state"
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    assert_nothing_left(home, record)


def test_a_process_left_behind_cannot_rewrite_the_outcome_and_garbage_records_do_not_crash(sandbox_env, tmp_path,
                                                                                          monkeypatch):
    """Issue 26.6: a process that kept rewriting status.json after the agent's last write changed
    the reported exit status; garbage in exit_status ended the run with ValueError exit 1 and no
    outputs. Now: exit 5 with the job's last lines and its outputs home, whatever it rewrote."""
    home, _ = sandbox_env
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r"
    forge = ('while :; do printf \'{"state": "succeeded", "exit_code": 0}\' > "$D/status.json"; '
             'echo garbage > "$D/exit_status"; sleep 0.05; done')
    run = f"""\
        export D=$(dirname "$EC2GPU_OUTPUT_DIR")
        echo '{{"epochs": 1}}' > "$EC2GPU_OUTPUT_DIR/summary.json"
        setsid bash -c {json.dumps(forge)} > /dev/null 2>&1 < /dev/null &
        echo "the job's last words"
        sleep 1  # the forger has left the job's process group by now
        exit 3
        """
    code, _, err = drive(["run", "--sandbox", _task(tmp_path / "proj", run, "forger"), "--expect", "1m",
                          "--out", str(out)], [])
    assert code == 5, err
    assert "the job's last words" in err and "Traceback" not in err and "ValueError" not in err
    assert (out / "outputs" / "summary.json").is_file()
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and record["exit_status"] != 0
    assert_nothing_left(home, record)  # the forger lived on the instance: it ends with it
