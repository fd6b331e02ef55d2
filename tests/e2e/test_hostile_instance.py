"""A hostile job in the sandbox (issue 26): what it does on its instance must not write anything
on this machine outside its run directory, nor change what the run reports, nor crash the
controller. Each test performs the attack as a job would, then checks this machine."""
import json
import textwrap

import pytest

from test_run_task import assert_nothing_left, instance_dir  # same folder (pytest prepend import mode)
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
    assert "1 file, 2,147,483,648 bytes, not brought home" in " ".join(err.split())
    assert (out / "checkpoints" / "step\n1.pt").read_text() == "state"
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    assert_nothing_left(home, record)


def test_a_process_left_behind_cannot_rewrite_the_outcome_and_garbage_records_do_not_crash(sandbox_env, tmp_path,
                                                                                          monkeypatch):
    """Issue 26.6: a process that kept rewriting the agent's record (agent-record.json) after the agent's last write changed
    the reported exit status; garbage in exit_status ended the run with ValueError exit 1 and no
    outputs. Now: exit 5 with the job's last lines and its outputs home, whatever it rewrote."""
    home, _ = sandbox_env
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r"
    forge = ('while :; do printf \'{"state": "succeeded", "exit_code": 0}\' > "$D/agent-record.json"; '
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


#: what a hostile setup leaves behind (issue 44.4): it copies the agent's key and the hand-over's URLs
#: as soon as they appear, then signs "succeeded" over every record the agent writes
FORGER = """\
import hashlib, hmac, json, os, sys, time
run_dir, stolen = sys.argv[1], sys.argv[2]
with open(os.path.join(stolen, "pid"), "w") as f:
    f.write(str(os.getpid()))
key = None
while True:
    for name in ("agent.key", "handover.json"):
        try:
            with open(os.path.join(run_dir, name), "rb") as f:
                data = f.read()
        except OSError:
            continue
        with open(os.path.join(stolen, name), "wb") as f:
            f.write(data)
        key = data.strip() if name == "agent.key" else key
    try:
        with open(os.path.join(run_dir, "agent-record.json")) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = None
    if key and isinstance(record, dict) and record.get("state") != "succeeded":
        record.update(state="succeeded", exit_code=0)
        record.pop("signature", None)
        canon = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        record["signature"] = hmac.new(key, canon, hashlib.sha256).hexdigest()
        with open(os.path.join(run_dir, ".forged"), "w") as f:
            json.dump(record, f)
        os.replace(os.path.join(run_dir, ".forged"), os.path.join(run_dir, "agent-record.json"))
    time.sleep(0.01)
"""


def test_a_process_the_setup_leaves_behind_can_neither_take_the_key_nor_forge_the_outcome(sandbox_env, tmp_path,
                                                                                        monkeypatch):
    """Issue 44.4: the agent's key and job.env.json were written before the task's setup ran, as
    the same user, and handover.json after: a process the setup left behind (`setsid nohup`)
    copied the key and the hand-over's URLs, then signed "succeeded" for a job that exited 3, and
    `ec2gpu run` said exit 0. Now what the setup leaves ends with it, before the key and the URLs
    are written: the run exits 5 and says the job's own exit 3."""
    home, _ = sandbox_env
    monkeypatch.chdir(tmp_path)
    stolen = tmp_path / "stolen"
    stolen.mkdir()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "forger.py").write_text(FORGER)
    (proj / "task.yaml").write_text(textwrap.dedent(f"""\
        name: forged
        workdir: .
        setup: |
          setsid nohup python3 forger.py "$(dirname "$EC2GPU_OUTPUT_DIR")" {stolen} > /dev/null 2>&1 < /dev/null &
          while [ ! -s {stolen}/pid ]; do sleep 0.05; done
          echo "setup done"
        run: |
          kill -0 "$(cat {stolen}/pid)" 2>/dev/null && echo "the forger still runs"
          echo "the job's last words"
          sleep 1
          exit 3
        """))
    out = tmp_path / "r"
    code, _, err = drive(["run", "--sandbox", str(proj / "task.yaml"), "--expect", "1m", "--out", str(out)], [])
    assert code == 5, err
    assert "setup done" in err and "the job's last words" in err and "the forger still runs" not in err
    assert "exited 3" in err and "Traceback" not in err
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and record["exit_status"] == 3
    assert sorted(p.name for p in stolen.iterdir()) == ["pid"]  # it never saw the key or the URLs
    run_dir = instance_dir(home, record["instance_id"]) / "runs" / record["run_id"]
    assert run_dir.stat().st_mode & 0o777 == 0o700 and (run_dir / "job.env.json").stat().st_mode & 0o777 == 0o600
    assert not (run_dir / "agent.key").exists() and not (run_dir / "handover.json").exists()  # read, deleted
    assert_nothing_left(home, record)


#: what a hostile setup plants in the run directory (issue 44 round 3): an hmac.py that the agent,
#: started as `python RUN_DIR/agent.py` (RUN_DIR first on sys.path), imported instead of the standard
#: library's: it marks that it ran, hands the agent the real hmac, and makes every job "exit 0", which
#: the agent then signs with its own key; and a .pyc for bounded_json.py (an unchecked hash-based one,
#: which Python takes whatever the fresh source beside it says) that marks that it ran
PLANTER = """\
import importlib.util, os, py_compile, sys
run_dir, marks = sys.argv[1], sys.argv[2]
with open(os.path.join(run_dir, "hmac.py"), "w") as f:
    f.write(f'''import importlib, os, subprocess, sys
open({os.path.join(marks, "hmac-ran")!r}, "w").write(str(os.getpid()))
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
del sys.modules["hmac"]
sys.modules["hmac"] = importlib.import_module("hmac")
_wait = subprocess.Popen.wait
def wait(self, timeout=None):
    _wait(self, timeout)
    self.returncode = 0
    return 0
subprocess.Popen.wait = wait
''')
source = os.path.join(run_dir, "bounded_json.py")
planted = os.path.join(marks, "planted_bounded_json.py")
with open(source) as f, open(planted, "w") as g:
    g.write(f.read() + f"\\nopen({os.path.join(marks, 'pyc-ran')!r}, 'w').write('x')\\n")
py_compile.compile(planted, cfile=importlib.util.cache_from_source(source), dfile=source, doraise=True,
                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
print("planted", os.path.exists(importlib.util.cache_from_source(source)))
"""


def test_code_the_setup_plants_in_the_run_directory_never_runs_inside_the_agent(sandbox_env, tmp_path, monkeypatch):
    """The agent started as `python RUN_DIR/agent.py`: sys.path[0] was the run directory, which the
    setup (the same user) can write, so a setup's RUN_DIR/hmac.py ran inside the agent, which holds
    the key, and made a job that exited 3 a signed "succeeded" (exit 0); a .pyc it planted in
    RUN_DIR/__pycache__ was loaded instead of the fresh bounded_json.py. Now the agent starts as
    `python -I -S -B` (no script directory on sys.path), loads the reader by its path, and
    start_agent removes RUN_DIR/__pycache__: the run exits 5, says "exited 3", and nothing planted ran."""
    home, _ = sandbox_env
    monkeypatch.chdir(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "planter.py").write_text(PLANTER)
    (proj / "task.yaml").write_text(textwrap.dedent(f"""\
        name: planted
        workdir: .
        setup: |
          "$EC2GPU_PYTHON" planter.py "$(dirname "$EC2GPU_OUTPUT_DIR")" {marks}
        run: |
          echo "the job's last words"
          exit 3
        """))
    out = tmp_path / "r"
    code, _, err = drive(["run", "--sandbox", str(proj / "task.yaml"), "--expect", "1m", "--out", str(out)], [])
    assert "planted True" in err, err  # the setup did plant both
    assert code == 5, err
    assert "the job's last words" in err and "exited 3" in err and "Traceback" not in err
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and record["exit_status"] == 3
    assert sorted(p.name for p in marks.iterdir()) == ["planted_bounded_json.py"]  # neither hmac.py nor the .pyc ran
    run_dir = instance_dir(home, record["instance_id"]) / "runs" / record["run_id"]
    assert not (run_dir / "__pycache__").exists()  # removed before the agent started, and -B wrote none
    assert_nothing_left(home, record)
