"""`ec2gpu notebook`'s instance side (agent/notebook.py): one JupyterLab per login, reused while it
runs; and what the controller accepts of its answer."""
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from ec2gpu.errors import RemoteError
from ec2gpu.runs.standing import notebook

#: Stands in for `python -m jupyterlab` (its flags, its token from the environment, /api/status)
FAKE_JUPYTERLAB = textwrap.dedent("""\
    import http.server, os, sys
    port, token = int(sys.argv[sys.argv.index("--port") + 1]), os.environ["JUPYTER_TOKEN"]
    class Status(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/api/status" and self.headers.get("Authorization") == "token " + token
            self.send_response(200 if ok else 403)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Status).serve_forever()
    """)


@pytest.fixture
def instance_side(tmp_path):
    """run(): the instance side run in tmp_path/notebook, with the stand-in JupyterLab first on
    PYTHONPATH; (run, the directory). Every server it started is stopped by pid afterwards."""
    (tmp_path / "fake" / "jupyterlab").mkdir(parents=True)
    (tmp_path / "fake" / "jupyterlab" / "__init__.py").write_text("")
    (tmp_path / "fake" / "jupyterlab" / "__main__.py").write_text(FAKE_JUPYTERLAB)
    directory = tmp_path / "notebook"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake"), "HOME": str(tmp_path)}
    started = set()

    def run(wait=True):
        proc = subprocess.Popen([sys.executable, str(notebook.SERVER_SCRIPT), str(directory)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return proc if not wait else answer(proc)

    def answer(proc):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        got = json.loads(out)
        started.add(got["pid"])
        return got
    run.answer = answer
    yield run, directory
    for pid in started:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def test_two_calls_at_once_start_one_jupyterlab_and_a_later_call_reuses_it(instance_side):
    """Issue 27.18: the lock makes two `notebook --name X` at once share one server; a later one
    reuses it (same port, pid and token), the token and record 0600."""
    run, directory = instance_side
    both = [run(wait=False), run(wait=False)]
    first, second = (run.answer(p) for p in both)
    assert sorted([first["reused"], second["reused"]]) == [False, True]
    assert {(a["port"], a["pid"], a["token"]) for a in (first, second)} == {(first["port"], first["pid"],
                                                                           first["token"])}
    later = run()
    assert later["reused"] and later["pid"] == first["pid"] and later["token"] == first["token"]
    for name in ("token", "server.json"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    assert first["token"] not in " ".join(psutil.Process(first["pid"]).cmdline())  # in its environment only


def test_a_recorded_server_that_is_gone_is_replaced_not_reused(instance_side):
    run, _ = instance_side
    first = run()
    proc = psutil.Process(first["pid"])
    os.kill(first["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _gone(proc) and time.monotonic() < deadline:
        time.sleep(0.01)
    again = run()
    assert not again["reused"] and again["pid"] != first["pid"] and again["token"] != first["token"]


def _gone(proc: psutil.Process) -> bool:
    """Ended: no such process, or a zombie until this machine's init reaps it."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("line", [
    "", "not json", '{"reused": false, "port": 0, "pid": 5, "token": "' + "a" * 43 + '"}',
    '{"reused": false, "port": 8888, "pid": -1, "token": "' + "a" * 43 + '"}',
    '{"reused": false, "port": 8888, "pid": 5, "token": "[red]x[/red]\\u001b[2J' + "a" * 40 + '"}',
    '{"reused": false, "port": "8888x", "pid": 5, "token": "' + "a" * 43 + '"}', "[1, 2]",
])
def test_the_instances_answer_is_checked_before_its_token_reaches_a_url(line):
    with pytest.raises(RemoteError, match="not one ec2gpu's script gives"):
        notebook._server_record(line)
    good = notebook._server_record('{"reused": true, "port": 8888, "pid": 5, "token": "' + "a" * 43 + '"}')
    assert good == {"reused": True, "port": 8888, "pid": 5, "token": "a" * 43}
