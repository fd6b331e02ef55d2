"""A sandbox array's Ray is the pool's own (issue 44, item 1): while a 2-element array runs over two
sandbox instances, every socket that its Ray processes (the descendants of that pool's node.py
processes, and of the head's agent, under which the driver runs: another pool on this machine does
not count) listen on is on its node's own 127.0.0.N,
a `ray.init` without the pool's token is refused by its GCS (and one with it is let in), each
node's Ray directory is private and its own, and the token is in no command line, Ray log or file
but its 0600 token files; once the run is over the Ray directories are gone."""
import ipaddress
import json
import os
import stat
import subprocess
import sys
import time

import psutil
import pytest

from test_spot_recovery import assert_nothing_left, drive  # same folder (pytest prepend import mode)

#: alone: two Ray nodes are most of this 2-core machine (tests/e2e/test_pool.py)
pytestmark = [pytest.mark.e2e, pytest.mark.alone]
NEEDS_MNIST = False

# each element waits (up to 150 s) for the test to let it end: the pool runs while it is looked at
TASK = """\
name: pool-private
workdir: .
run: |
  echo "element $EC2GPU_ARRAY_INDEX on $EC2GPU_NODE_IP"
  for i in $(seq 150); do [ -f ~/release ] && break; sleep 1; done
  echo "$EC2GPU_ARRAY_INDEX" > "$EC2GPU_OUTPUT_DIR/index.txt"
array: 2
max_workers: 2
resources:
  instance_type: g4dn.xlarge
max_runtime: 30m
"""

#: a driver that connects to the GCS at argv[1] and says whether it got in (as JSON)
CONNECT = """
import json, sys
import ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
except Exception as exc:
    print(json.dumps({"connected": False, "error": type(exc).__name__}))
    raise SystemExit(0)
print(json.dumps({"connected": True, "nodes": sum(1 for n in ray.nodes() if n["Alive"])}))
"""


def _tree(proc) -> list:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _pool_nodes(home) -> list[dict]:
    """This pool's node.py processes (their command line's node.py is in one of this home's
    sandbox instances), each with its role, address, token file and the process with its
    descendants; the head's with its agent and the agent's descendants too (the driver, started
    through `node.py driver`, is `pool_driver.py` once it runs)."""
    root = str(home / "sandbox" / "instances") + os.sep
    found, agents = [], {}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        agent = next((a for a in cmd if a.startswith(root) and a.endswith("/agent.py")), None)
        if agent is not None:
            agents.setdefault(os.path.dirname(agent), []).append(proc)
        script = next((a for a in cmd if a.startswith(root) and a.endswith("/ray/node.py")), None)
        if script is None or "--ip" not in cmd or cmd[cmd.index(script) + 1] not in ("head", "worker"):
            continue
        found.append({"role": cmd[cmd.index(script) + 1], "ip": cmd[cmd.index("--ip") + 1], "procs": _tree(proc),
                      "token_file": cmd[cmd.index("--token-file") + 1],
                      "ready": os.path.join(os.path.dirname(script), "ready"),
                      "run_dir": os.path.dirname(os.path.dirname(script))})
    for n in found:
        if n["role"] == "head":
            n["procs"] += [p for agent in agents.get(n["run_dir"], []) for p in _tree(agent)]
    return found


def _running(nodes) -> int:
    """How many elements the pool's driver says run now (its table.json on the head)."""
    head = next((n for n in nodes if n["role"] == "head"), None)
    try:
        status = json.loads(open(os.path.join(os.path.dirname(head["ready"]), "..", "pool", "table.json")).read())
        return int(status["counts"]["running"])
    except (TypeError, OSError, ValueError, KeyError):
        return 0


def _cmdline(proc) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # ended meanwhile
        return ""


def _bound(procs) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every TCP socket listening and every UDP socket bound in ``procs``."""
    out = []
    for p in procs:
        try:
            name, conns = p.name(), p.net_connections(kind="inet")
        except psutil.Error:  # ended meanwhile
            continue
        out += [(name, c.laddr.ip, c.laddr.port) for c in conns
                if c.laddr and (c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr))]  # 2: SOCK_DGRAM
    return out


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback and not (mapped or addr).is_unspecified


def _connect(address: str, tmp_path, token_file: str | None = None) -> dict:
    """CONNECT run as a stranger to the pool would run it (no RAY_ variable, a home without
    ~/.ray/auth_token), or with the pool's ``token_file``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path), RAY_USAGE_STATS_ENABLED="0")
    if token_file:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_file)
    done = subprocess.run([sys.executable, "-c", CONNECT, address], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _files_holding(roots, secret: bytes) -> list[str]:
    found = []
    for root in roots:
        for path, _dirs, names in os.walk(root):
            for name in names:
                full = os.path.join(path, name)
                try:
                    if not os.path.islink(full) and os.path.isfile(full) and secret in open(full, "rb").read():
                        found.append(full)
                except OSError:
                    continue
    return found


def test_a_sandbox_arrays_ray_listens_on_its_nodes_own_addresses_and_lets_in_only_its_token(sandbox_env, tmp_path):
    home, _state = sandbox_env
    (tmp_path / "task.yaml").write_text(TASK)
    seen: dict = {}

    def look(_line, _lines):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # both nodes up, each running its element (Ray's workers started)
            nodes = _pool_nodes(home)
            if len(nodes) == 2 and all(os.path.exists(n["ready"]) for n in nodes) and _running(nodes) == 2:
                break
            time.sleep(0.5)
        nodes = _pool_nodes(home)
        seen["nodes"] = [{k: v for k, v in n.items() if k != "procs"} for n in nodes]
        try:
            seen["bound"] = {n["ip"]: _bound(n["procs"]) for n in nodes}
            seen["driver"] = [(_cmdline(p), _bound([p])) for n in nodes for p in n["procs"]
                              if _cmdline(p).split(" ")[1:2] == [f"{n['run_dir']}/pool_driver.py"]]  # python DRIVER
            head = next(n for n in nodes if n["role"] == "head")
            seen["gcs"] = f"{head['ip']}:{int(open(head['ready']).read())}"
            seen["token"] = open(head["token_file"], "rb").read()
            seen["tokens"] = {n["token_file"]: (open(n["token_file"], "rb").read(),
                                                stat.S_IMODE(os.stat(n["token_file"]).st_mode)) for n in nodes}
            seen["cmdlines"] = [_cmdline(p) for n in nodes for p in n["procs"]]
            seen["temp_dirs"] = sorted({a.split("=", 1)[1] for c in seen["cmdlines"] for a in c.split()
                                        if a.startswith("--temp-dir=")})
            seen["private"] = {os.path.dirname(d): os.stat(os.path.dirname(d)) for d in seen["temp_dirs"]}
            seen["in_ray_files"] = _files_holding(seen["private"], seen["token"])
            seen["stranger"] = _connect(seen["gcs"], tmp_path)
            seen["member"] = _connect(seen["gcs"], tmp_path, head["token_file"])
        finally:
            for n in nodes:  # each element may end now
                open(os.path.join(n["token_file"].split("/ec2gpu/runs/")[0], "release"), "w").close()

    code, stdout, err = drive(["run", str(tmp_path / "task.yaml"), "--sandbox", "--out", str(tmp_path / "run"),
                               "--json"], [("element(s) submitted", look)], timeout_s=280)
    assert code == 0, err
    record = json.loads(stdout)
    assert {e["status"] for e in record["pool"]["elements"]} == {"succeeded"}, err
    assert sorted({n["role"] for n in seen["nodes"]}) == ["head", "worker"], seen["nodes"]
    # (a) every socket of the pool's Ray processes is on its node's own 127.0.0.N: no wildcard, no other address
    for ip, bound in seen["bound"].items():
        assert {name for name, _, _ in bound} >= {"raylet"}, bound  # the raylets' ports are among them
        wrong = [b for b in bound if b[1] not in (ip, f"::ffff:{ip}") or not _loopback(b[1])]
        assert wrong == [], (ip, wrong)
    gcs_ip, gcs_port = seen["gcs"].rsplit(":", 1)
    assert any(port == int(gcs_port) and name == "gcs_server" for name, _, port in seen["bound"][gcs_ip])
    # the driver (under the head's agent) among them: its ray.init's core worker listens, on the head's address
    [(driver_cmd, driver_bound)] = seen["driver"]
    assert driver_bound and {ip for _, ip, _ in driver_bound} <= {gcs_ip, f"::ffff:{gcs_ip}"}, (driver_cmd, driver_bound)
    print(f"listening or bound: {json.dumps(seen['bound'])}\ndriver: {driver_cmd}: {driver_bound}")
    # (b) a stranger's ray.init is refused; the pool's token lets a driver in, and sees both nodes
    assert seen["stranger"] == {"connected": False, "error": "ConnectionError"}, seen["stranger"]
    assert seen["member"] == {"connected": True, "nodes": 2}, seen["member"]
    # one token for the pool, in a 0600 file on each node; in no command line, Ray log or file but those
    assert len(seen["token"]) == 64 and {v for v in seen["tokens"].values()} == {(seen["token"], 0o600)}
    assert not [c for c in seen["cmdlines"] if seen["token"].decode() in c]
    assert seen["in_ray_files"] == []
    holding = _files_holding([home, tmp_path / "run"], seen["token"])
    assert sorted(holding) == sorted(seen["tokens"]), holding
    assert seen["token"].decode() not in stdout + err
    # (c) each node's Ray directory is in a private directory of its own, and gone once the run is over
    assert len(seen["private"]) == 2, seen["temp_dirs"]
    for private, st in seen["private"].items():
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid(), (private, oct(st.st_mode))
        assert os.path.basename(private).startswith("ec2gpu-ray-") and len(private) < 40
    deadline = time.monotonic() + 20
    while any(os.path.exists(p) for p in seen["private"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [p for p in seen["private"] if os.path.exists(p)] == []
    assert_nothing_left(home, record)
