"""Start, stop, find and use the sandbox daemon (server.py) from the controller's side.

The two seams the rest of the tool sees: ``env_vars()`` (an endpoint URL and dummy credentials
for boto3) and ``resolver()`` (instance id -> the loopback address of its sshd).

One sandbox per EC2GPU_HOME: starting it holds a lock (``sandbox/lock``, flock), so commands
started at the same instant share one server. Commands that only need it for their own length
(``session``) register in ``sandbox/users/``; the last one to leave stops it, unless it was
started for good (`ec2gpu sandbox up`, `launch`: the ``sandbox/persistent`` marker). A server
killed with SIGKILL cannot stop its instances' sshds: the next start stops every process it can
prove is one of this home's instances (sshd.orphans) before it starts a new server.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..errors import SandboxError, UsageError, WaitTimeout
from ..settings import private_home
from . import likeaws
from .sshd import orphans, sshd_binary

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"  # moto's default account
# What the daemon (server.py) imports beyond ec2gpu's own dependencies: the `sandbox` extra
# (moto[server] brings flask and flask-cors; moto's server app imports them).
EXTRA_MODULES = ("moto", "werkzeug", "flask", "flask_cors")


def state_dir(home: Path) -> Path:
    return Path(home) / "sandbox"


@contextlib.contextmanager
def _locked(home: Path):
    """Hold this home's sandbox lock (an exclusive flock) for the block."""
    d = state_dir(home)
    private_home(home)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def read_state(home: Path) -> dict | None:
    """The running sandbox's state (endpoint, pid, instances), or None when none is running."""
    path = state_dir(home) / "state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if _alive(state["pid"]) else None


def instance_env() -> dict[str, str]:
    """Environment of sessions on sandbox instances: this Python (with torch) first on PATH, as
    the Deep Learning AMI has its PyTorch; spot notices polled every second; EC2GPU_DATA_DIR when the controller has one, as an
    instance with the data set cached."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           # EC2 is polled every 5 s (train/spot.py); the sandbox's short notices need 1 s
           "EC2GPU_SPOT_POLL_SECONDS": "1"}
    if os.environ.get("EC2GPU_DATA_DIR"):
        env["EC2GPU_DATA_DIR"] = str(Path(os.environ["EC2GPU_DATA_DIR"]).resolve())
    return env


def require_extra() -> None:
    """Raise UsageError (one line, exit 2) when a module of the `sandbox` extra is missing: the
    daemon would die on its import, with a traceback cut short in its log."""
    import importlib.util
    for module in EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken install, or a module set to None in sys.modules
            found = False
        if not found:
            raise UsageError(f"the sandbox needs {module}: pip install 'ec2gpu[sandbox]'")


def up(home: Path, timeout_s: float = 60.0, like_aws: bool | None = None, persistent: bool = True) -> dict:
    """Start the sandbox daemon in the background unless one is running; return its state.

    ``like_aws`` True starts it in the AWS-like mode (likeaws.py); None leaves that to
    EC2GPU_SANDBOX_LIKE_AWS. ``persistent``: it keeps running until `ec2gpu sandbox down` (else
    the last ``session`` to end stops it). Raises UsageError without the `sandbox` extra (moto),
    SandboxError when sshd is missing or the daemon does not come up in ``timeout_s``.
    """
    with _locked(home):
        state = _up(home, timeout_s, like_aws)
        if persistent:
            (state_dir(home) / "persistent").touch()
        return state


def _up(home: Path, timeout_s: float, like_aws: bool | None) -> dict:
    """``up`` with the lock held."""
    state = read_state(home)
    if state:
        return state
    require_extra()
    d = state_dir(home)
    reaped = orphans(d / "instances", stop=True)  # a server killed with SIGKILL left its instances' sshds
    if reaped:
        print(f"sandbox: stopped {len(reaped)} process(es) a previous sandbox left: {reaped}", file=sys.stderr)
    (d / "persistent").unlink(missing_ok=True)
    for f in (d / "users").glob("*") if (d / "users").is_dir() else []:
        f.unlink(missing_ok=True)
    try:
        sshd_binary()
    except FileNotFoundError as exc:
        raise SandboxError(str(exc), "then run the command again")
    d = state_dir(home)
    private_home(home)
    d.mkdir(parents=True, exist_ok=True)
    (d / "state.json").unlink(missing_ok=True)
    env = {**os.environ, "EC2GPU_SANDBOX_INSTANCE_ENV": json.dumps(instance_env())}
    if like_aws:
        env[likeaws.ENV] = "1"
    with open(d / "server.log", "ab") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "ec2gpu.sandbox.server", str(d)], env=env,
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = read_state(home)
            if state:
                return state
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    except BaseException:  # Ctrl-C while it starts: the half-started daemon goes too (it stops what it started)
        _stop_started(proc, home)
        raise
    _stop_started(proc, home)
    log = (d / "server.log").read_text()[-1500:]
    raise SandboxError(f"the sandbox did not start: {log}", f"see {d / 'server.log'}")


def _stop_started(proc: subprocess.Popen, home: Path) -> None:
    """Stop a daemon this process started (SIGTERM: it stops its sshds; SIGKILL after 10 s) and
    forget its state file."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    (state_dir(home) / "state.json").unlink(missing_ok=True)


def down(home: Path, timeout_s: float = 30.0) -> bool:
    """Stop the sandbox daemon (it stops every sshd and process it started). Returns False if none ran."""
    state = read_state(home)
    if not state:
        return False
    os.kill(state["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(state["pid"]):
        try:
            os.waitpid(state["pid"], os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    if _alive(state["pid"]):
        raise SandboxError(f"sandbox pid {state['pid']} did not stop in {timeout_s:.0f} s",
                           f"kill {state['pid']}")
    return True


def env_vars(state: dict) -> dict[str, str]:
    """What makes any AWS client (boto3, the aws CLI) and this tool use the sandbox."""
    return {
        "AWS_ENDPOINT_URL": state["endpoint"], "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", REGION),
        "EC2GPU_CHECKIP_URL": state["checkip_url"],
    }


def interrupt(home: Path, instance_id: str, notice_seconds: float, rebalance: bool = False) -> dict:
    """Publish a spot interruption notice for ``instance_id`` on the sandbox's metadata service;
    the sandbox terminates the instance ``notice_seconds`` later. Returns the notice. With
    ``rebalance``, a rebalance recommendation instead, and nothing else (sandbox/imds.py).

    Raises SandboxError when no sandbox runs; UsageError for an unknown, stopped or on-demand
    instance (the sandbox's 400: what was asked cannot be done, exit 2).
    """
    return _control(home, "/control/interrupt", {"instance_id": instance_id, "notice_seconds": notice_seconds,
                                                 "rebalance": rebalance},
                    "see `ec2gpu ls --sandbox` for the running instances")


def capacity(home: Path, instance_type: str, count: int | None) -> dict:
    """Let at most ``count`` instances of ``instance_type`` be pending or running at once in the
    sandbox (None: no limit); RunInstances beyond it launches fewer, or answers
    InsufficientInstanceCapacity (sandbox/capacity.py). Returns {"limits": {type: count}}.
    Raises SandboxError when no sandbox runs; UsageError for a bad count (the sandbox's 400)."""
    return _control(home, "/control/capacity", {"instance_type": instance_type, "count": count},
                    "e.g. `ec2gpu sandbox capacity g4dn.xlarge 1`")


def _control(home: Path, path: str, payload: dict, hint: str) -> dict:
    """POST ``payload`` to the running sandbox's control endpoint ``path``; its JSON answer.
    Raises SandboxError when none runs or it fails; UsageError (with ``hint``) when it answers 400,
    which its control endpoints give for a request that cannot be done (an unknown instance, a bad
    count: imds.handle, server.py): the user's input, exit 2."""
    import urllib.error
    import urllib.request

    state = read_state(home)
    if not state:
        raise SandboxError("no sandbox is running", "start it with `ec2gpu sandbox up`")
    req = urllib.request.Request(f"{state['imds_url']}{path}", method="POST", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        message = json.loads(exc.read() or b"{}").get("error", str(exc))
        if exc.code == 400:
            raise UsageError(message, hint) from None
        raise SandboxError(message, hint) from None


def resolver(home: Path):
    """Return resolve(instance_id, timeout_s) -> (host, port) of that instance's sshd.

    resolve raises WaitTimeout when the sandbox has no sshd for the instance in time.
    """
    import tenacity

    def resolve(instance_id: str, timeout_s: float = 30.0) -> tuple[str, int]:
        def look() -> dict | None:
            return (read_state(home) or {}).get("instances", {}).get(instance_id)
        try:
            inst = tenacity.Retrying(retry=tenacity.retry_if_result(lambda found: not found),
                                     wait=tenacity.wait_fixed(0.1), stop=tenacity.stop_after_delay(timeout_s))(look)
        except tenacity.RetryError:
            raise WaitTimeout(f"the sandbox has no sshd for {instance_id} after {timeout_s:.0f} s",
                              f"see {state_dir(home) / 'server.log'}") from None
        assert inst is not None  # the retry above stops only on a found instance
        return inst["host"], inst["port"]
    return resolve


@contextlib.contextmanager
def session(home: Path):
    """Use the running sandbox, or start one, for the duration of the block; the last session to
    end stops a sandbox nobody started for good (see the module docstring).

    Yields the state; os.environ is left as it is (the caller builds its clients from the state:
    backend.Context).
    """
    users = state_dir(home) / "users"
    with _locked(home):
        state = _up(home, 60.0, None)
        users.mkdir(parents=True, exist_ok=True)
        me = users / f"{os.getpid()}-{secrets.token_hex(4)}"
        me.write_text(str(os.getpid()))
    try:
        yield state
    finally:
        with _locked(home):
            me.unlink(missing_ok=True)
            if not _other_users(users) and not (state_dir(home) / "persistent").exists():
                down(home)


def _other_users(users: Path) -> list[Path]:
    """The registrations in ``users`` whose process still runs; the others are removed."""
    live = []
    for f in users.glob("*"):
        try:
            pid = int(f.read_text())
        except (OSError, ValueError):
            continue
        if _alive(pid):
            live.append(f)
        else:
            f.unlink(missing_ok=True)
    return live
