"""`ec2gpu notebook`: JupyterLab on a standing instance, opened at a local URL over SSH.

The instance is a standing one (`ec2gpu launch`, with its idle rule), launched for the notebook or
found by ``--name``. JupyterLab runs in the instance's Python with torch (what ami/setup-gpu.sh
finds), installed there with pip if that Python lacks it, bound to the instance's 127.0.0.1 with a
random token (given in its environment, never on a command line), detached so that it outlives
this command; a later `notebook --name` reuses the one that runs (agent/notebook.py, on the
instance). Its port reaches this machine through OpenSSH's forwarding with the pinned host key
(remote/tunnel.py); nothing is opened in the security group. The forward's ssh ends with this
command, however it ends (Ctrl-C, SIGTERM, SIGHUP). Stopped before JupyterLab answers, the command
removes the instance it launched for the notebook (an instance found by ``--name`` stays).
"""
from __future__ import annotations

import re
import shlex
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ...aws import instances, sweep, tags
from ...aws.session import Aws
from ...errors import RemoteError, UsageError, WaitTimeout
from ...remote import files, setup, ssh, tunnel
from ...settings import Settings
from ...wire import bounded_json
from . import hosts as standing

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...backend import Backend
    from ..execute.reporter import ReporterLike
    from ..options import LaunchOptions

#: On the instance, under the login's home: JupyterLab's token, record and log, setup-gpu.sh's report.
REMOTE_DIR = "ec2gpu/notebook"
#: The instance side (standard library only), uploaded next to them.
SERVER_SCRIPT = Path(__file__).resolve().parents[2] / "agent" / "notebook.py"
#: A token as the instance side makes it (secrets.token_urlsafe(32)); anything else is refused.
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")
#: the instance's answers (its script's one line; JupyterLab's /api/status): a few hundred bytes
MAX_REPLY_BYTES = 64 * 1024


def find_running(aws: Aws, opts: LaunchOptions, ui: ReporterLike) -> Instance | None:
    """The running instance ``opts.name`` names (its description; said through ``ui.note``), or
    None when ``opts.name`` is None or names none. Raises UsageError for a name that is stopped
    (`ec2gpu start` it)."""
    if not opts.name:
        return None
    found = [i for i in sweep.find_instances(aws.ec2) if tags.answers_to(i, opts.name)]
    running = [i for i in found if i.state == "running"]
    if running:
        ui.note(f"{opts.name}: using the running instance {running[0].id}")
        return running[0]
    if found:
        raise UsageError(f"{opts.name} is {found[0].state}", f"`ec2gpu start {opts.name}` first")
    return None


def open_server(conn: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """The JupyterLab of the instance behind ``conn``: the one that runs there, else a new one
    (module docstring); {"port" (on the instance), "token", "pid", "python", "reused"}. Raises
    RemoteError when it cannot be installed, started, or its record is not one ec2gpu wrote."""
    home = ssh.run(conn, 'printf %s "$HOME"').strip()
    directory = f"{home}/{REMOTE_DIR}"
    info = setup.setup(conn, directory, log=log)
    python = shlex.quote(info["python"])
    if not setup.has_module(conn, info["python"], "jupyterlab"):
        log(f"installing JupyterLab into {info['python']} (pip)")
        ssh.run(conn, f"{python} -m pip install --quiet jupyterlab", timeout_s=900)
    files.put_file(conn, SERVER_SCRIPT, f"{directory}/server.py")
    files.put_file(conn, Path(bounded_json.__file__), f"{directory}/bounded_json.py")  # server.py imports it
    answer = ssh.run(conn, f"{python} {shlex.quote(directory + '/server.py')} {shlex.quote(directory)}",
                     timeout_s=300).strip().splitlines()
    server = _server_record(answer[-1] if answer else "")
    how = "already runs there: reused" if server["reused"] else "started"
    log(f"JupyterLab {how} on the instance's 127.0.0.1:{server['port']} (pid {server['pid']}; log "
        f"~/{REMOTE_DIR}/jupyter.log)")
    return {**server, "python": info["python"]}


def _server_record(line: str) -> dict[str, Any]:
    """The instance side's answer (one JSON line), checked: it is the instance's word."""
    server: dict[str, Any] | None
    refused = ""
    try:
        got = bounded_json.loads(line, max_bytes=MAX_REPLY_BYTES)
        server = {"reused": got["reused"] is True, "port": int(got["port"]), "pid": int(got["pid"]),
                  "token": str(got["token"])}
    except bounded_json.Refused as exc:
        server, refused = None, f" (refused: {exc})"
    except (ValueError, KeyError, TypeError):
        server = None
    if not server or not 0 < server["port"] < 65536 or server["pid"] <= 0 or not TOKEN.fullmatch(server["token"]):
        raise RemoteError(f"the instance's answer about its JupyterLab is not one ec2gpu's script gives{refused}",
                          f"see ~/{REMOTE_DIR}/jupyter.log on the instance (`ec2gpu ssh NAME`)", tail=line[:500])
    return server


def wait_ready(local_port: int, token: str, timeout_s: float = 180.0) -> dict[str, Any]:
    """Poll JupyterLab's ``/api/status`` through the tunnel until it answers 200 with the token;
    return its JSON. Raises WaitTimeout."""
    url = f"http://127.0.0.1:{local_port}/api/status"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"token {token}"}),
                                        timeout=5) as r:
                status: dict[str, Any] = bounded_json.loads(r.read(MAX_REPLY_BYTES + 1), max_bytes=MAX_REPLY_BYTES)
                return status
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(0.5)
    raise WaitTimeout(f"JupyterLab did not answer at {url} within {timeout_s:.0f} s",
                      f"see its log on the instance: `ec2gpu ssh NAME -- tail ~/{REMOTE_DIR}/jupyter.log`")


def serve(aws: Aws, settings: Settings, backend: Backend, opts: LaunchOptions, ui: ReporterLike,
          show_url: Callable[[dict[str, Any]], None], local_port: int | None = None) -> dict[str, Any]:
    """Open a notebook on the running instance ``opts.name`` names, else on a new standing instance
    (runs/standing/hosts.launch: ``opts``' type, idle rule, --max-runtime), with ``open_server``; forward
    it to a free local port and call ``show_url(info)`` once it answers (info: instance_id, name,
    url, local_port, port, token); keep the forward up, reconnecting when SSH drops, until
    KeyboardInterrupt (Ctrl-C; the CLI turns SIGTERM and SIGHUP into it too), which is caught:
    this returns ``info``, with only instance_id and name when it came before the URL.

    An interrupt before the URL on an instance launched for this notebook removes that instance,
    its security group, key pair and key file (``remove_launched``: the user never had the
    notebook) and is raised again. Raises UsageError, RemoteError, WaitTimeout before the URL is
    shown (an instance launched for it then stays, with its idle rule, to be looked at)."""
    inst, launched, shown = find_running(aws, opts, ui), None, False
    info: dict[str, Any] = {} if inst is None else {"instance_id": inst.id,
                                    "name": inst.tags.get(tags.NAME) or inst.id}
    try:
        if inst is None:  # interrupted, standing.launch removes what it made and raises
            launched = standing.launch(aws, settings, opts, ui, backend)[0]
            info = {"instance_id": launched["instance_id"], "name": launched["name"] or launched["instance_id"]}
            inst = instances.describe_instances(aws.ec2, [launched["instance_id"]])[0]
        with ui.phase("setup"):  # the machine's setup; JupyterLab installed if need be, and started
            conn = standing.pin_host_key(aws, settings, backend, inst, log=ui.note)
            try:
                server = open_server(conn, ui.note)
            finally:
                conn.close()
        config, _, _ = standing.write_ssh_config(aws, settings, backend, ui.note, log=ui.note)
        here = tunnel.free_local_port(local_port)
        if local_port and here != local_port:
            raise UsageError(f"--local-port {local_port} is in use on this machine", "choose another, or leave it out")
        info.update(local_port=here, port=server["port"], token=server["token"],
                    url=f"http://127.0.0.1:{here}/lab?token={server['token']}")

        def when_up() -> None:
            nonlocal shown
            with ui.phase("waiting for JupyterLab"):
                wait_ready(here, server["token"])
            shown = True  # from here on the user may hold the URL: the instance is theirs to keep
            show_url(info)
        tunnel.forward_until_interrupted(  # its ssh ends with this command, however it ends
            tunnel.argv(config, inst.id, server["port"], here), here, ui.note,
            refresh=lambda: standing.write_ssh_config(aws, settings, backend), when_up=when_up)
    except KeyboardInterrupt:
        if launched is not None and not shown:
            remove_launched(aws, settings, launched, ui)
            raise
        if not info:  # nothing was found, or standing.launch removed what it made
            raise
    return info


def remove_launched(aws: Aws, settings: Settings, launched: dict[str, Any], ui: ReporterLike) -> dict[str, list[str]]:
    """Remove the instance launched for a notebook that never answered (``launched``: its
    aws/instances.summary) and what its run made (security group, key pair and key file: found
    by its ec2gpu:run tag, aws/sweep.delete_run), with SIGINT, SIGTERM and SIGHUP held meanwhile so
    that a second one cannot cut it short; say what was removed, or what may remain and how to
    remove it. Returns the ids removed, by kind ({} when it failed). Never raises an AWS error: the
    interrupt that brought it here is what the caller raises."""
    run_id = launched["run_id"]
    if not run_id:  # a run tag summary() would not show: never a sweep without a run id (it would take all)
        ui.note(f"{launched['instance_id']} was not removed: its ec2gpu:run tag is not readable; "
                f"`ec2gpu down {launched['instance_id']}` removes it")
        return {}
    try:
        with tunnel.signals_held(), ui.phase("terminating"):
            removed = sweep.delete_run(aws.ec2, run_id, settings.keys_dir, iam=aws.client("iam"))
    except Exception as exc:  # noqa: BLE001 - said with the fix; the interrupt goes on
        ui.note(f"could not remove {launched['instance_id']} ({type(exc).__name__}: {exc}); it may still run and "
                f"bill: `ec2gpu down {run_id}` removes it (`ec2gpu cleanup` finds it by its ec2gpu:run tag)")
        return {}
    done = "; ".join(f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in removed.items() if v)
    ui.note(f"removed: {done}" if done else "nothing of the notebook's was left to remove")
    return removed
