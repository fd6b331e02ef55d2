"""The money and access commands as library functions against the sandbox, without the CLI (issue 29,
item 7): prices and estimates from its simulated market; ssh, ssh_config, logs and tunnel on one
standing instance, which is removed after."""
import os
import signal
import threading
import time
import urllib.request

import pytest

from ec2gpu.api import access, costs, instances as ops
from ec2gpu.errors import UsageError

from test_sandbox_train import leftovers  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False


def test_prices_and_a_spot_estimate_come_from_the_sandboxs_market(sandbox_env):
    found = costs.prices(gpu="t4", sandbox=True)
    assert found.region == "us-east-1" and found.note is not None and "simulated market" in found.note
    assert {r["gpu"] for r in found.instance_types} == {"T4"}
    g4 = next(r for r in found.instance_types if r["instance_type"] == "g4dn.xlarge")
    assert g4["on_demand_usd_per_hour"] == 0.526 and len(g4["spot_usd_per_hour"]) >= 2
    estimated = costs.estimate("g4dn.xlarge", spot=True, sandbox=True)
    [est] = estimated.estimates
    assert est.market == "spot" and estimated.backend == "sandbox" and est.price_source.startswith("spot now")
    assert est.usd_per_hour is not None and 0 < est.usd_per_hour < 0.526 and est.cost_usd and est.cost_usd > 0
    with pytest.raises(UsageError, match="below the spot price"):
        costs.estimate("g4dn.xlarge", spot=True, max_price=0.0001, sandbox=True)


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler (KeyboardInterrupt) for one test, the one before put back: a
    suite started in the background by a shell without job control inherits SIGINT ignored, and
    the tunnel below, ended as Ctrl-C ends it, then waited for pytest's timeout."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


def test_ssh_ssh_config_logs_and_a_tunnel_on_a_standing_instance(sandbox_env, ctrl_c_raises):
    home, _ = sandbox_env
    with pytest.raises(UsageError, match="no running instance named"):
        access.logs("no-such-run", sandbox=True)
    [row] = ops.launch(name="api-access", max_runtime=30, sandbox=True)
    iid = row.instance_id
    try:
        assert access.ssh("api-access", ["exit", "3"], sandbox=True) == 3  # the remote command's exit status
        assert access.ssh("api-access", "echo kept > kept.txt", sandbox=True) == 0  # a str: one command line
        written = access.ssh_config(sandbox=True)
        assert written.path == str(home / "ssh_config") and "api-access" in written.hosts
        assert iid not in written.skipped
        with pytest.raises(UsageError, match="no job has run on"):
            access.logs("api-access", sandbox=True)

        port = 20000 + os.getpid() % 20000
        assert access.ssh("api-access", f"nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &",
                          sandbox=True) == 0
        body, urls = [], []

        def ready(url: str) -> None:  # then fetch through the forward, and end it as Ctrl-C would
            urls.append(url)

            def get_then_interrupt() -> None:
                deadline = time.monotonic() + 60
                try:
                    while not body and time.monotonic() < deadline:
                        try:
                            body.append(urllib.request.urlopen(f"{url}/kept.txt", timeout=5).read().decode())
                        except OSError:
                            time.sleep(0.5)
                finally:
                    os.kill(os.getpid(), signal.SIGINT)
            threading.Thread(target=get_then_interrupt, daemon=True).start()
        info = access.tunnel("api-access", port, sandbox=True, on_ready=ready)
        assert body == ["kept\n"]
        assert info.to_json() == {"instance_id": iid, "name": "api-access", "port": port, "local_port": info.local_port,
                        "url": f"http://127.0.0.1:{info.local_port}"} and urls == [info.url]
    finally:
        removed = ops.down("api-access", fetch=False, sandbox=True)
    assert any(iid in r["instances"] for r in removed.values())
    assert leftovers(home) == ([], [], [])
