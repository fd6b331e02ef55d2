"""Interactive work in the sandbox: a standing instance stopped and started keeps its home and its
pinned host key at its new address, a tunnel carries HTTP from a server on the instance, and a
spot instance refuses `stop` with the reason."""
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from ec2gpu.remote.tunnel import free_local_port
from ec2gpu.sandbox import control

from test_sandbox_train import leftovers, sandbox_settles  # same folder (pytest prepend import mode)
from test_spot_recovery import EC2GPU

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False


def ec2gpu(*args, timeout=180) -> subprocess.CompletedProcess:
    at = args.index("--") if "--" in args else len(args)  # options go before `--`
    return subprocess.run([EC2GPU, *args[:at], "--sandbox", *args[at:]], env=dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)


def test_stop_and_start_keep_the_home_and_the_pinned_host_key_and_a_tunnel_carries_http(sandbox_env):
    home, _ = sandbox_env
    launched = ec2gpu("launch", "--name", "dev", "--max-runtime", "30", "--json")
    assert launched.returncode == 0, launched.stderr
    [inst] = json.loads(launched.stdout)
    iid = inst["instance_id"]
    try:
        # issue 27.10: launch pinned the host key (under the instance id, 27.11) and wrote the
        # ssh_config, so plain OpenSSH reaches the instance at once and never trusts on first use
        known = home / "known_hosts" / iid
        pinned = known.read_text()
        assert [line.split()[0] for line in pinned.splitlines()] == [iid]
        openssh = [shutil.which("ssh"), "-F", str(home / "ssh_config"), "-o", "BatchMode=yes", "dev"]
        config = (home / "ssh_config").read_text()
        assert f"HostKeyAlias {iid}" in config and "accept-new" not in config
        assert subprocess.run([*openssh, "echo kept > kept.txt"], timeout=30).returncode == 0
        port_before = control.resolver(home)(iid, timeout_s=10)[1]

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
        # a new address (as EC2 gives), the same pin under the instance id, and `start` rewrote
        # the ssh_config: plain OpenSSH goes on with StrictHostKeyChecking yes, nothing re-pinned
        port_after = control.resolver(home)(iid, timeout_s=10)[1]
        assert port_after != port_before and f"Port {port_after}" in (home / "ssh_config").read_text()
        assert known.read_text() == pinned
        done = subprocess.run([*openssh, "cat kept.txt"], capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() == "kept", done.stderr

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
    # 25 s: `ls` (every 2 s, each a few seconds on a loaded 2-core machine) sees it idle before it ends
    idle = ec2gpu("launch", "--name", "idle1", "--idle-down", "25s", "--max-runtime", "30", "--json")
    busy = ec2gpu("launch", "--name", "busy1", "--idle-stop", "25s", "--max-runtime", "30", "--json")
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
        assert seen_idle and seen_idle["idle_rule"] == "down 25" and seen_idle["busy"] is None  # ls said so
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


def _notebook(*args) -> tuple[subprocess.Popen, dict]:
    """`ec2gpu notebook --sandbox ARGS --json` started, and the JSON it prints once JupyterLab answers."""
    proc = subprocess.Popen([EC2GPU, "notebook", "--sandbox", *args, "--json"], env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    text = ""
    while not text.rstrip().endswith("}"):  # the JSON document, printed once JupyterLab answers
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        text += line
    return proc, json.loads(text)


def _ssh_children(proc: subprocess.Popen) -> list:
    import psutil
    return [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name() == "ssh"]


def _jupyterlabs(instance_id: str) -> list[int]:
    """Pids of the JupyterLab servers running on the sandbox instance."""
    import psutil

    from ec2gpu.sandbox import sshd
    found = []
    for pid in sshd.instance_processes(instance_id):
        try:
            if "jupyterlab" in psutil.Process(pid).cmdline():
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_notebook_answers_through_the_printed_url_with_its_token_only_and_opens_nothing(sandbox_env):
    """Also issues 27.14 and 27.18: SIGTERM (a supervisor's `kill PID`) and SIGHUP end the command
    and its `ssh -L` child (checked by pid), and a second `notebook --name` reuses the JupyterLab
    that runs there: one JupyterLab on the instance, the same token."""
    home, state = sandbox_env
    import boto3
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
    proc, info = _notebook("--name", "nb")
    try:
        assert info["url"] == f"http://127.0.0.1:{info['local_port']}/lab?token={info['token']}"
        base = f"http://127.0.0.1:{info['local_port']}"
        status = json.loads(urllib.request.urlopen(f"{base}/api/status?token={info['token']}", timeout=10).read())
        assert "started" in status
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/status", timeout=10)
        assert refused.value.code == 403  # the token is needed
        [sg] = [g for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupName"].startswith("ec2gpu-")]
        assert [(p["FromPort"], p["ToPort"]) for p in sg["IpPermissions"]] == [(22, 22)]  # ports travel over SSH
        [forward] = _ssh_children(proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert not forward.is_running()  # ended and reaped, not left holding a session on the instance
        assert "keeps running with its idle rule" in err

        again, info2 = _notebook("--name", "nb", "--down-on-exit")
        assert (info2["instance_id"], info2["port"], info2["token"]) == (info["instance_id"], info["port"],
                                                                           info["token"])
        assert len(_jupyterlabs(info["instance_id"])) == 1
        [forward] = _ssh_children(again)
        again.send_signal(signal.SIGHUP)
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        assert not forward.is_running()
        assert "terminated (--down-on-exit)" in err
    finally:
        for p in (proc, locals().get("again")):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                p.communicate(timeout=120)
        ec2gpu("down", "nb", "--no-fetch")
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


def test_a_standing_instance_stopped_started_and_ended_by_itself_is_billed_in_runs_and_leaves_nothing(sandbox_env):
    """Issue 27, items 15 and 16: `ls` counts every running interval (each start pays its own minute);
    the instance ends itself (its OS shuts down, as --max-runtime or the idle rule does: the sandbox's
    `shutdown`); the next command that lists instances (`runs` here) removes what it left, in one
    line, and its ledger row holds its actual cost: compute per interval, its public IPv4 address,
    its gp3 root volume."""
    import sys

    import boto3

    from ec2gpu.aws.instances import Instance
    home, state = sandbox_env
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")

    def seen(iid: str) -> dict:
        return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    launched = ec2gpu("launch", "--name", "selfend", "--no-idle", "--max-runtime", "30", "--json")
    assert launched.returncode == 0, launched.stderr
    [inst] = json.loads(launched.stdout)
    iid, run = inst["instance_id"], inst["run_id"]
    key_file = home / "keys" / f"ec2gpu-{run}.pem"
    assert ec2gpu("stop", "selfend").returncode == 0
    stopped = seen(iid)
    l1, s1 = stopped["LaunchTime"], Instance.of(stopped).transitioned_at
    assert s1 is not None
    assert ec2gpu("start", "selfend").returncode == 0
    l2 = seen(iid)["LaunchTime"]
    assert l2 >= s1  # set again by the start, as EC2 does
    [row] = [r for r in json.loads(ec2gpu("ls", "--json").stdout) if r["instance_id"] == iid]
    assert row["running_intervals"] == 2 and row["so_far"]["billed_seconds"] >= 120  # a minimum per start
    assert row["age_seconds"] >= round((s1 - l1).total_seconds())  # the first interval counts too
    assert row["cost_so_far_usd"] >= round(120 * 0.526 / 3600, 4)

    assert key_file.exists()
    ec2gpu("ssh", "selfend", "--", "shutdown -h now")  # the session ends with the instance
    deadline = time.monotonic() + 30
    while seen(iid)["State"]["Name"] != "terminated" and time.monotonic() < deadline:
        time.sleep(0.3)
    ended = seen(iid)
    assert ended["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
    t2 = Instance.of(ended).transitioned_at
    assert leftovers(home)[1:] != ([], [])  # its security group and key pair are still there

    shown = subprocess.run([EC2GPU, "runs", "--since", "1d", "--json"], env=dict(os.environ), capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    [said] = [line for line in shown.stderr.splitlines() if "left behind" in line]  # one line
    assert f"run {run} (ended itself)" in said and "security group sg-" in said and f"key pair ec2gpu-{run}" in said
    assert leftovers(home) == ([], [], []) and not key_file.exists()
    doc = json.loads(shown.stdout)
    [billed] = [r for r in doc["runs"] if r["run_id"] == run]
    spans = [(l1, s1), (l2, t2)]
    compute = sum(max(60.0, (b - a).total_seconds()) for a, b in spans) * 0.526 / 3600  # g4dn.xlarge table
    ipv4 = sum((b - a).total_seconds() for a, b in spans) * 0.005 / 3600  # https://aws.amazon.com/vpc/pricing/
    ebs = 100 * 0.08 * max(60.0, (t2 - l1).total_seconds()) / (30 * 86400)  # 100 GiB gp3, stopped time included
    assert billed["status"] == "ended" and billed["cost_usd"] == pytest.approx(compute + ipv4 + ebs, abs=1e-5)
    sandbox_rows = [r for r in doc["runs"] if r["backend"] == "sandbox"]
    assert doc["sandbox_total"]["cost_usd"] == pytest.approx(sum(r["cost_usd"] or 0 for r in sandbox_rows), abs=1e-4)
    assert sys.executable  # (the subprocess above is this venv's ec2gpu)
    assert sandbox_settles(home)
