"""Interactive work in the sandbox: a standing instance stopped and started keeps its home and its
pinned host key at its new address, a tunnel carries HTTP from a server on the instance, and a
spot instance refuses `stop` with the reason."""
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from ec2gpu.remote.tunnel import free_local_port

from test_sandbox_train import leftovers, sandbox_settles  # same folder (pytest prepend import mode)
from test_spot_recovery import EC2GPU

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False


def ec2gpu(*args, timeout=180) -> subprocess.CompletedProcess:
    at = args.index("--") if "--" in args else len(args)  # options go before `--`
    return subprocess.run([EC2GPU, *args[:at], "--sandbox", *args[at:]], env=dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)


def keys_of(known_hosts) -> set[str]:
    """The host keys (type and base64) a known_hosts file pins, whatever address they are under."""
    return {" ".join(line.split()[1:3]) for line in known_hosts.read_text().splitlines() if line.strip()}


def test_stop_and_start_keep_the_home_and_the_pinned_host_key_and_a_tunnel_carries_http(sandbox_env):
    home, _ = sandbox_env
    launched = ec2gpu("launch", "--name", "dev", "--max-runtime", "30", "--json")
    assert launched.returncode == 0, launched.stderr
    [inst] = json.loads(launched.stdout)
    iid, address = inst["instance_id"], None
    try:
        assert ec2gpu("ssh", "dev", "--", "echo kept > kept.txt").returncode == 0
        known = home / "known_hosts" / iid
        pinned = keys_of(known)
        address = known.read_text().split()[0]

        from ec2gpu.sandbox import control
        armed = control.read_state(home)["shutdowns"][iid]  # user data's `shutdown -h +30`
        stopped = ec2gpu("stop", "dev", "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert [r["state"] for r in json.loads(stopped.stdout)] == ["stopped"]
        [row] = [r for r in json.loads(ec2gpu("ls", "--json").stdout) if r["instance_id"] == iid]
        assert row["state"] == "stopped" and row["disk_gib"] == 100 and row["usd_per_hour"] is None
        assert row["disk_usd_per_month"] == pytest.approx(100 * 0.08)  # gp3, us-east-1 list price
        refused = ec2gpu("ssh", "dev", "--", "true")
        assert refused.returncode == 2 and "stopped" in refused.stderr and "ec2gpu start dev" in refused.stderr
        assert sandbox_settles(home)  # its sshd is gone while it is stopped
        assert iid not in control.read_state(home)["shutdowns"]  # ... and its pending shutdown, as an OS's

        started = ec2gpu("start", "dev", "--json")
        assert started.returncode == 0, started.stderr
        assert "scheduled again" in started.stderr  # the --max-runtime safety net survives the stop
        assert control.read_state(home)["shutdowns"][iid] > armed  # 30 min from the start, not from the launch
        assert ec2gpu("ssh", "dev", "--", "cat kept.txt").stdout.strip() == "kept"
        # the idle rule (launch's default: down after 60 min) watches again: a stop had ended its watcher
        assert ec2gpu("ssh", "dev", "--", "pgrep -f idle-watch.sh").stdout.strip()
        hosts = [line.split()[0] for line in known.read_text().splitlines()]
        assert hosts[0] == address and len(hosts) == 2 and hosts[1] != address  # a new address (as EC2 gives)
        assert keys_of(known) == pinned  # ... and the same key, now pinned there too

        port, local = free_local_port(), free_local_port()
        assert ec2gpu("ssh", "dev", "--", f"nohup python3 -m http.server {port} --bind 127.0.0.1 "
                      ">/dev/null 2>&1 &").returncode == 0
        tunnel = subprocess.Popen([EC2GPU, "tunnel", "dev", str(port), "--local-port", str(local), "--sandbox"],
                                  env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            body, deadline = None, time.monotonic() + 60
            while body is None and time.monotonic() < deadline:
                try:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{local}/kept.txt", timeout=5).read().decode()
                except OSError:
                    time.sleep(0.5)
            assert body == "kept\n"
        finally:
            tunnel.send_signal(signal.SIGINT)
            _, tunnel_err = tunnel.communicate(timeout=30)
        assert tunnel.returncode == 0, tunnel_err
        assert f"http://127.0.0.1:{local}" in tunnel_err
    finally:
        assert ec2gpu("down", "dev", "--no-fetch").returncode == 0
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)


def test_a_spot_instance_refuses_stop_with_the_reason_and_the_way_out(sandbox_env):
    home, _ = sandbox_env
    assert ec2gpu("launch", "--spot", "--name", "sp", "--max-runtime", "30").returncode == 0
    try:
        refused = ec2gpu("stop", "sp")
        assert refused.returncode == 2
        assert "spot" in refused.stderr and "one-time" in refused.stderr and "ec2gpu down sp" in refused.stderr
        assert [r["state"] for r in json.loads(ec2gpu("ls", "--json").stdout) if r["name"] == "sp"] == ["running"]
    finally:
        assert ec2gpu("down", "sp", "--no-fetch").returncode == 0
    assert leftovers(home) == ([], [], [])


def _state(iid: str) -> str:
    [row] = [r for r in json.loads(ec2gpu("ls", "--json").stdout) if r["instance_id"] == iid] or [{"state": "gone"}]
    return row["state"]


def test_an_idle_instance_ends_itself_and_one_with_an_ssh_session_open_does_not(sandbox_env):
    """The rule is enforced on the instance (ami/idle-watch.sh): the controller only watches
    through the EC2 API, as a laptop that was closed would not."""
    home, state = sandbox_env
    import boto3
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
    idle = ec2gpu("launch", "--name", "idle1", "--idle-down", "12s", "--max-runtime", "30", "--json")
    busy = ec2gpu("launch", "--name", "busy1", "--idle-stop", "12s", "--max-runtime", "30", "--json")
    assert idle.returncode == 0 and busy.returncode == 0, idle.stderr + busy.stderr
    idle_id, busy_id = json.loads(idle.stdout)[0]["instance_id"], json.loads(busy.stdout)[0]["instance_id"]
    session = subprocess.Popen([EC2GPU, "ssh", "busy1", "--sandbox", "--", "sleep 60"], env=dict(os.environ),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen_idle = None
        deadline = time.monotonic() + 90
        while _state(idle_id) == "running" and time.monotonic() < deadline:
            rows = {r["instance_id"]: r for r in json.loads(ec2gpu("ls", "--json").stdout)}
            if rows.get(idle_id, {}).get("idle_seconds") is not None:
                seen_idle = rows[idle_id]
            time.sleep(2)
        assert seen_idle and seen_idle["idle_rule"] == "down 12" and seen_idle["busy"] is None  # ls said so
        desc = ec2.describe_instances(InstanceIds=[idle_id])["Reservations"][0]["Instances"][0]
        assert desc["State"]["Name"] == "terminated"  # --idle-down: InstanceInitiatedShutdownBehavior terminate
        assert desc["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
        [row] = [r for r in json.loads(ec2gpu("ls", "--json").stdout) if r["instance_id"] == busy_id]
        assert row["state"] == "running" and row["busy"] == "ssh" and row["idle_seconds"] is None
        assert ec2.describe_instance_attribute(InstanceId=busy_id, Attribute="instanceInitiatedShutdownBehavior")[
            "InstanceInitiatedShutdownBehavior"]["Value"] == "stop"  # --idle-stop
    finally:
        session.kill()
        session.wait()
        for name in ("idle1", "busy1"):
            ec2gpu("down", name, "--no-fetch")
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)


def test_a_notebook_answers_through_the_printed_url_with_its_token_only_and_opens_nothing(sandbox_env):
    home, state = sandbox_env
    import boto3
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
    proc = subprocess.Popen([EC2GPU, "notebook", "--sandbox", "--name", "nb", "--down-on-exit", "--json"],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text = ""
        while not text.rstrip().endswith("}"):  # the JSON document, printed once JupyterLab answers
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            text += line
        info = json.loads(text)
        assert info["url"] == f"http://127.0.0.1:{info['local_port']}/lab?token={info['token']}"
        base = f"http://127.0.0.1:{info['local_port']}"
        status = json.loads(urllib.request.urlopen(f"{base}/api/status?token={info['token']}", timeout=10).read())
        assert "started" in status
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/status", timeout=10)
        assert refused.value.code == 403  # the token is needed
        [sg] = [g for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupName"].startswith("ec2gpu-")]
        assert [(p["FromPort"], p["ToPort"]) for p in sg["IpPermissions"]] == [(22, 22)]  # ports travel over SSH
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "terminated (--down-on-exit)" in err
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)


def test_a_tasks_ports_are_forwarded_while_its_job_runs(sandbox_env, tmp_path, monkeypatch):
    from test_spot_recovery import drive
    port = free_local_port()
    (tmp_path / "task.yaml").write_text(
        "name: board\nworkdir: .\n"
        f"run: |\n  echo served > page.txt\n  python3 -m http.server {port} --bind 127.0.0.1 & sleep 6; kill %1\n"
        f"ports: [{port}]\n")
    monkeypatch.chdir(tmp_path)
    got = []

    def fetch(line, _):
        url = line.split(" is at ")[1].split()[0]
        deadline = time.monotonic() + 6
        while not got and time.monotonic() < deadline:
            try:
                got.append(urllib.request.urlopen(f"{url}/page.txt", timeout=3).read().decode())
            except OSError:
                time.sleep(0.3)
    code, _, err = drive(["run", "--sandbox", "task.yaml", "--expect", "1m"], [(f"port {port} of ", fetch)])
    assert code == 0, err
    assert got == ["served\n"]
