"""The instance side of `ec2gpu notebook`: this login's one JupyterLab, reused while it runs, else
started. Standard library only; run by the Python that has torch, which becomes JupyterLab's.

``PYTHON notebook.py DIR``, under an exclusive lock on DIR/lock (two `ec2gpu notebook` calls at
once start one server): when DIR/server.json (port, pid) and DIR/token (both 0600, written here)
name a process that is still a JupyterLab and answers /api/status with that token on
127.0.0.1:port, it is reused; one that does not answer within WAIT_S is ended. Otherwise one is
started on a free port of 127.0.0.1 with a new random token, given in its environment (never on a
command line, which `ps` shows every user), in a session of its own so that it outlives this SSH
session, its output appended to DIR/jupyter.log. Prints one JSON line: {"reused": bool, "port",
"pid", "token"}. Exits 1 with a line on stderr when the started one does not answer within WAIT_S.
"""
from __future__ import annotations

import fcntl
import importlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

if __package__:  # in the package (the tests)
    from ..wire import bounded_json
else:  # a script: shipped as server.py with bounded_json.py beside it; run from the source tree, ../wire/
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _HERE if os.path.exists(os.path.join(_HERE, "bounded_json.py")) else os.path.join(_HERE, "..", "wire"))
    bounded_json = importlib.import_module("bounded_json")

#: Seconds a JupyterLab gets to answer /api/status once started: it answers within seconds (a
#: first start after its pip install builds more); the controller gave it 180 s before.
WAIT_S = 120
#: DIR/server.json holds a port and a pid; a kernel, as this login, could rewrite it (bounded_json)
MAX_RECORD_BYTES = 4096


def answers(port: int, token: str) -> bool:
    """Whether 127.0.0.1:``port`` answers /api/status with 200 for ``token``."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/status", headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return bool(r.status == 200)
    except (OSError, ValueError):
        return False


def is_jupyterlab(pid: int) -> bool:
    """Whether process ``pid`` runs and is a JupyterLab (its command line, from /proc)."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return b"jupyterlab" in f.read().split(b"\0")
    except (OSError, ValueError):
        return False


def wait_answering(port: int, token: str, alive: Callable[[], bool]) -> bool:
    """Poll until the JupyterLab on ``port`` answers (True), ``alive()`` says it is gone or WAIT_S
    passed (False)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if answers(port, token):
            return True
        if not alive():
            return False
        time.sleep(0.5)
    return False


def recorded(directory: str) -> tuple[int, int, str] | None:
    """(port, pid, token) of the JupyterLab started here last, or None."""
    try:
        record = bounded_json.read(os.path.join(directory, "server.json"), max_bytes=MAX_RECORD_BYTES)
        with open(os.path.join(directory, "token")) as f:
            token = f.read().strip()
        return int(record["port"]), int(record["pid"]), token
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_private(path: str, text: str) -> None:
    """Replace ``path`` with ``text``, mode 0600 before anything is written."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # a leftover tmp file keeps its mode under O_CREAT
        f.write(text)
    os.replace(tmp, path)


def start(directory: str) -> tuple[int, subprocess.Popen[bytes], str]:
    """Start JupyterLab (module docstring); return (port, its Popen, token)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_urlsafe(32)
    write_private(os.path.join(directory, "token"), token)
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", "--port", str(port),
            "--ServerApp.port_retries=0"]
    if os.getuid() == 0:  # the sandbox's login may be root (this machine's user); an instance's never is
        argv.append("--allow-root")
    with open(os.path.join(directory, "jupyter.log"), "ab") as log:
        proc = subprocess.Popen(argv, cwd=os.path.expanduser("~"), env={**os.environ, "JUPYTER_TOKEN": token},
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    write_private(os.path.join(directory, "server.json"), json.dumps({"port": port, "pid": proc.pid}))
    return port, proc, token


def main(directory: str) -> int:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = recorded(directory)
        if found and is_jupyterlab(found[1]):
            port, pid, token = found
            if wait_answering(port, token, lambda: is_jupyterlab(pid)):
                print(json.dumps({"reused": True, "port": port, "pid": pid, "token": token}))
                return 0
            os.kill(pid, signal.SIGTERM)  # a JupyterLab that does not answer: one that does instead
        port, proc, token = start(directory)
        # its own child: poll(), not /proc (which shows this script's command line until it execs)
        if not wait_answering(port, token, lambda: proc.poll() is None):
            print(f"JupyterLab did not answer on 127.0.0.1:{port} within {WAIT_S} s; its log is "
                  f"{directory}/jupyter.log", file=sys.stderr)
            return 1
        print(json.dumps({"reused": False, "port": port, "pid": proc.pid, "token": token}))
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
