"""The runtime contract a SkyPilot job relies on (issue 28, item 8), on this machine: the run
started as engine.job_argv starts it, under the agent, reads ~/.bashrc as SkyPilot's `bash -i`
does (its exports and its functions), without bash's no-terminal complaints in the log; $0 and
"$@" are the task's; a killed command is said as bash says it; a SIGTERM ends it with 143 once its
command has; SKYPILOT_TASK_ID is set and the same for every node."""
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from ec2gpu.agent import agent
from ec2gpu.runs.execute import engine
from ec2gpu.tasks.load import LoadedTask
from ec2gpu.tasks.spec import Task

UBUNTU_BASHRC = """# ~/.bashrc, as Ubuntu 24.04's skeleton starts: nothing for a non-interactive shell
case $- in
    *i*) ;;
      *) return;;
esac
export FROM_BASHRC=yes
activate_env() { echo "function from bashrc: $1"; }
"""


def _job(run: str, args=()):
    task = Task(name="contract", workdir=None, run=run)
    return engine.TaskJob(LoadedTask(task, None, None), {}, None, args=list(args))


def _argv(tmp_path, run: str, args=()):
    nd = SimpleNamespace(info={"python": sys.executable}, instance=None, run_dir=str(tmp_path / "run"))
    return engine.job_argv(nd, _job(run, args))


def _agent(tmp_path, argv, home, env=None):
    """The agent's command (after its own flags) run by agent.run, HOME ``home``; (code, log)."""
    command = argv[argv.index("--") + 1:]
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        code = agent.run(str(run_dir), command, "http://127.0.0.1:9", poll_s=0.1, grace_s=5.0,
                         env={"EC2GPU_WORKDIR": str(tmp_path), "EC2GPU_PYTHON": sys.executable, **(env or {})})
    finally:
        os.environ["HOME"] = old
    return code, (run_dir / "job.log").read_text()


def test_the_run_reads_bashrc_as_skypilots_bash_i_does_and_keeps_its_name_args_and_stderr(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(UBUNTU_BASHRC)
    argv = _argv(tmp_path, 'echo "bashrc=$FROM_BASHRC name=$0 args=$*"; activate_env myenv; echo to-stderr >&2; '
                           'pwd; sleep 0 & wait; exit 3', ["a 1", "b"])
    code, log = _agent(tmp_path, argv, home)
    lines = log.splitlines()
    assert code == 3
    assert lines[:2] == ["bashrc=yes name=contract args=a 1 b", "function from bashrc: myenv"]
    assert "to-stderr" in lines and str(tmp_path) in lines  # stderr kept; in the workdir
    # no interactive shell's words: no job control, terminal, "exit" or "[1] PID" lines
    assert lines[2:] == ["to-stderr", str(tmp_path)], log


def test_a_killed_command_is_said_as_bash_says_it_not_hidden_behind_terminal_noise(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(UBUNTU_BASHRC)
    code, log = _agent(tmp_path, _argv(tmp_path, "bash -c 'kill -KILL $$'; echo after $?"), home)
    assert code == 0 and "Killed" in log and "after 137" in log and "tcsetattr" not in log, log


def test_the_python_with_torch_stays_first_on_path_whatever_bashrc_puts_there(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(UBUNTU_BASHRC + 'export PATH="/opt/other/bin:$PATH"\n')
    code, log = _agent(tmp_path, _argv(tmp_path, 'echo "$PATH"'), home)
    assert code == 0 and log.split(":")[0] == os.path.dirname(sys.executable)


def test_a_sigterm_ends_the_run_with_143_once_its_command_has_checkpointed(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    ready = tmp_path / "ready"
    handler = (f"import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
               f"(print('checkpointed', flush=True), sys.exit(0))); pathlib.Path({str(ready)!r}).touch(); "
               "time.sleep(30)")
    argv = _argv(tmp_path, f"{sys.executable} -c \"{handler}\"; echo 'not reached after the stop'")
    command = argv[argv.index("--") + 1:]
    env = {**os.environ, "HOME": str(home), "EC2GPU_WORKDIR": str(tmp_path), "EC2GPU_PYTHON": sys.executable}
    with open(tmp_path / "log", "wb") as log:
        job = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGTERM)  # as the agent stops a job
    assert job.wait(timeout=20) == 143
    out = (tmp_path / "log").read_text()
    assert "checkpointed" in out and "not reached" not in out and "tcsetattr" not in out, out


def test_skypilot_task_id_is_the_same_for_every_node_and_names_the_run():
    job = _job("true")
    envs = [engine.node_env(job, "20261124-1200-ab12", "/r", i, ["10.0.0.1", "10.0.0.2"], 1, False) for i in (0, 1)]
    assert envs[0]["SKYPILOT_TASK_ID"] == envs[1]["SKYPILOT_TASK_ID"] == "ec2gpu-20261124-1200-ab12_contract"
    assert envs[1]["SKYPILOT_NODE_IPS"] == "10.0.0.1\n10.0.0.2" and envs[1]["SKYPILOT_NODE_RANK"] == "1"
