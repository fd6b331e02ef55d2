"""`ec2gpu notebook`: JupyterLab on a standing instance, opened at a local URL over SSH.

The instance is a standing one (`ec2gpu launch`, with its idle rule), launched for the notebook or
found by ``--name``. JupyterLab runs in the instance's Python with torch (what ami/setup-gpu.sh
finds), installed there with pip if that Python lacks it, bound to the instance's 127.0.0.1 with a
random token (given in its environment, never on a command line), detached so that it outlives
this command. Its port reaches this machine through OpenSSH's forwarding with the pinned host key
(remote/tunnel.py); nothing is opened in the security group.
"""
from __future__ import annotations

import io
import secrets
import shlex
import threading
import time
import urllib.error
import urllib.request

from ..aws.session import Aws
from ..errors import RemoteError, UsageError, WaitTimeout
from ..settings import Settings

#: On the instance, under the login's home: JupyterLab's log, and setup-gpu.sh's report.
REMOTE_DIR = "ec2gpu/notebook"


def find_or_launch(aws: Aws, settings: Settings, opts, ui) -> dict:
    """The running instance ``opts.name`` names, else a new standing instance for ``opts``
    (runs/standing.launch, its idle rule included); its description. Raises UsageError for a name
    that is stopped (`ec2gpu start` it) or a cluster."""
    from ..aws import instances, sweep
    from ..aws import tags as T
    from . import standing

    if opts.name:
        found = [i for i in sweep.find_instances(aws.ec2)
                 if opts.name in (i["InstanceId"], T.as_dict(i.get("Tags")).get(T.NAME))]
        running = [i for i in found if i["State"]["Name"] == "running"]
        if running:
            ui.note(f"{opts.name}: using the running instance {running[0]['InstanceId']}")
            return running[0]
        if found:
            raise UsageError(f"{opts.name} is {found[0]['State']['Name']}", f"`ec2gpu start {opts.name}` first")
    rows = standing.launch(aws, settings, opts, ui)
    return instances.describe_instances(aws.ec2, [rows[0]["instance_id"]])[0]


def start_server(conn, log) -> dict:
    """Start JupyterLab on the instance behind ``conn`` (module docstring); return {"port" (on the
    instance), "token", "pid", "python"}. Raises RemoteError when it cannot be installed or started."""
    from ..remote import setup, ssh

    home = ssh.run(conn, 'printf %s "$HOME"').strip()
    info = setup.setup(conn, f"{home}/{REMOTE_DIR}", log=log)
    python = shlex.quote(info["python"])
    if not conn.run(f"{python} -c 'import jupyterlab'", warn=True, hide=True).ok:
        log(f"installing JupyterLab into {info['python']} (pip)")
        ssh.run(conn, f"{python} -m pip install --quiet jupyterlab", timeout_s=900)
    port = int(ssh.run(conn, f"{python} -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); "
                             "print(s.getsockname()[1])'").strip())
    token = secrets.token_urlsafe(32)
    secret = f"{home}/{REMOTE_DIR}/token"  # 0600: the token never appears on a command line (ps)
    ssh.run(conn, f"umask 077 && : >{shlex.quote(secret)}")
    conn.put(io.StringIO(token), secret)
    # --allow-root only where the login is root (the sandbox: this machine's user); never on an instance
    pid = ssh.run(conn, f"cd ~ || exit 1; JUPYTER_TOKEN=$(cat {shlex.quote(secret)}) nohup {python} -m jupyterlab "
                        f"--no-browser --ip 127.0.0.1 --port {port} --ServerApp.port_retries=0 "
                        '$([ "$(id -u)" = 0 ] && echo --allow-root) '
                        f">>~/{REMOTE_DIR}/jupyter.log 2>&1 </dev/null & echo $!").strip()
    log(f"JupyterLab started on the instance's 127.0.0.1:{port} (pid {pid}; log ~/{REMOTE_DIR}/jupyter.log)")
    return {"port": port, "token": token, "pid": int(pid), "python": info["python"]}


def wait_ready(local_port: int, token: str, timeout_s: float = 180.0) -> dict:
    """Poll JupyterLab's ``/api/status`` through the tunnel until it answers 200 with the token;
    return its JSON. Raises WaitTimeout."""
    url = f"http://127.0.0.1:{local_port}/api/status"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"token {token}"}),
                                        timeout=5) as r:
                import json
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(0.5)
    raise WaitTimeout(f"JupyterLab did not answer at {url} within {timeout_s:.0f} s",
                      f"see its log on the instance: `ec2gpu ssh NAME -- tail ~/{REMOTE_DIR}/jupyter.log`")


def serve(aws: Aws, settings: Settings, backend, opts, ui, show_url, local_port: int | None = None) -> dict:
    """Open a notebook (find_or_launch, start_server), forward it to a free local port and call
    ``show_url(info)`` once it answers (info: instance_id, name, url, local_port, port, token);
    keep the forward up, reconnecting when SSH drops, until Ctrl-C (KeyboardInterrupt is caught:
    this returns ``info``). Raises UsageError, RemoteError, WaitTimeout before the URL is shown."""
    from ..aws import tags as T
    from ..remote import tunnel
    from . import standing

    inst = find_or_launch(aws, settings, opts, ui)
    conn = standing.pin_host_key(aws, settings, backend, inst, log=ui.note)
    try:
        server = start_server(conn, ui.note)
    finally:
        conn.close()
    config, _, _ = standing.write_ssh_config(aws, settings, backend, ui.note)
    here = tunnel.free_local_port(local_port)
    if local_port and here != local_port:
        raise UsageError(f"--local-port {local_port} is in use on this machine", "choose another, or leave it out")
    name = T.as_dict(inst.get("Tags")).get(T.NAME) or inst["InstanceId"]
    info = {"instance_id": inst["InstanceId"], "name": name, "local_port": here, "port": server["port"],
            "token": server["token"], "url": f"http://127.0.0.1:{here}/lab?token={server['token']}"}
    stop = threading.Event()
    forward = threading.Thread(target=tunnel.keep_forwarding, daemon=True, name="notebook-tunnel",
                               args=(tunnel.argv(config, inst["InstanceId"], server["port"], here), here, stop,
                                     ui.note, lambda: standing.write_ssh_config(aws, settings, backend)))
    forward.start()
    try:
        wait_ready(here, server["token"])
        show_url(info)
        while forward.is_alive():
            forward.join(0.5)
        raise RemoteError("the notebook's tunnel ended", "run `ec2gpu notebook --name NAME` again")
    except KeyboardInterrupt:
        return info
    finally:
        stop.set()
        forward.join(10)
