"""`ec2gpu image bake --max-runtime M` (issue 27): the builder's user data schedules its own end M
minutes after boot, and a bake whose estimate is longer than M is refused before anything is made."""
import base64
import os
import re
import signal
import subprocess
import sys
import threading

import boto3
import pytest

from ec2gpu import cli

from test_interrupts import PAUSE  # same folder (pytest prepend import mode)
from test_sandbox_train import leftovers, sandbox_settles

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # the builder is stopped before it fetches anything


def test_a_bakes_max_runtime_reaches_the_builders_user_data_and_bounds_its_estimate(sandbox_env, tmp_path,
                                                                                   monkeypatch, capsys):
    home, state = sandbox_env
    ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
    (tmp_path / "task.yaml").write_text("name: lim\nsetup: echo ready\nrun: echo ok\n")
    monkeypatch.chdir(tmp_path)
    # the builder, paused once SSH answers: its user data, then Ctrl-C (teardown removes it)
    proc = subprocess.Popen([sys.executable, PAUSE, "waiting for SSH", "image", "bake", "task.yaml", "--sandbox",
                             "--max-runtime", "45"], env=dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    lines, scheduled = [], None
    try:
        for line in proc.stderr:
            lines.append(line)
            if "pausing in phase" in line:
                [iid] = re.findall(r"launched (i-[0-9a-f]+)", "".join(lines))
                got = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
                scheduled = re.findall(r"shutdown -h \+(\d+)", base64.b64decode(got).decode())
                proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        watchdog.cancel()
    err = "".join(lines)
    assert scheduled == ["45"], err
    assert proc.returncode == 130 and "removed: instances" in err, err
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)

    # the estimate (an assumed 30 min from bare Ubuntu on a type with no bake in the ledger) above M: refused
    assert cli.main(["image", "bake", "task.yaml", "--sandbox", "--from", "ubuntu-24.04", "-t", "g6.xlarge",
                     "--max-runtime", "20"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "longer than --max-runtime 20 min" in said
    assert leftovers(home) == ([], [], [])
