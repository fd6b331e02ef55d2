"""A pool's Ray is its own (issue 44, item 1), the pure parts: each node's Ray directory private and
new, Ray's environment asking for the pool's token (and in the sandbox the bind shim), the token
reaching each node in a 0600 file and never a command line or a spec, the driver reading it before
Ray is imported, and a node refusing to start Ray where it would be exposed.
tests/e2e/test_pool_ray_private.py shows the same on a running sandbox array."""
import argparse
import json
import os
import stat
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from ec2gpu.pool import attempt, driver, node


def _args(role="head", **over):
    base = {"role": role, "ip": "127.0.0.7", "gpus": 1, "cpus": 2, "address": "127.0.0.2:6379",
            "object_store_bytes": 0, "temp_dir": "/tmp/ec2gpu-ray-x"}
    return argparse.Namespace(**{**base, **over})


def test_each_node_gets_a_new_private_ray_directory_short_enough_for_rays_sockets():
    made = [node.temp_dir(), node.temp_dir()]
    try:
        assert made[0] != made[1]  # a random name each time: never an address's, never shared
        for path in made:
            st = os.stat(path)
            assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid(), oct(st.st_mode)
            assert os.path.dirname(path) == "/tmp" and os.path.basename(path).startswith("ec2gpu-ray-")
            assert f"--temp-dir={node.ray_dir(path)}" in node.argv(_args(temp_dir=path), 6379, node.ports_for("127.0.0.7"))
            # Ray's longest socket under it: its session's name (a pid of up to 7 digits) and plasma_store.N
            session = f"session_{datetime.now().strftime('%Y-%m-%d_%H-%M-%S_%f')}_{4194304}"
            longest = f"{node.ray_dir(path)}/{session}/sockets/plasma_store.999"
            assert len(longest) <= len(node.ray_dir(path)) + node.SOCKET_TAIL <= node.SOCKET_PATH_MAX, longest
    finally:
        for path in made:
            os.rmdir(path)


def test_a_ray_directory_too_long_for_rays_sockets_is_refused_and_nothing_is_left(tmp_path):
    root = tmp_path / ("d" * 60)
    root.mkdir()
    with pytest.raises(ValueError, match="too long for Ray's sockets"):
        node.temp_dir(str(root))
    assert list(root.iterdir()) == []


def test_rays_environment_asks_for_the_pools_token_from_its_file():
    env = node.ray_env({"PATH": "/usr/bin", "RAY_AUTH_TOKEN": "someone-elses"}, "10.0.0.5", "/run/r1/ray/auth_token")
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/run/r1/ray/auth_token"
    assert "RAY_AUTH_TOKEN" not in env  # Ray would take it before the file
    assert env["PATH"] == "/usr/bin" and env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    # on EC2 (no shim named): nothing preloaded, the security group stands in front
    assert "LD_PRELOAD" not in env and node.BIND_VAR not in env


def test_rays_environment_on_a_sandbox_instance_preloads_the_bind_shim_with_the_nodes_own_address():
    env = node.ray_env({node.SHIM_VAR: "/home/u/.ec2gpu/sandbox/bindshim-ab.so", node.SANDBOX_MARKER: "i-1",
                        "LD_PRELOAD": "/opt/lib/other.so"}, "127.0.0.9", "/t")
    assert env["LD_PRELOAD"] == "/home/u/.ec2gpu/sandbox/bindshim-ab.so /opt/lib/other.so"
    assert env[node.BIND_VAR] == "127.0.0.9"
    assert node.ray_env({node.SHIM_VAR: "/s.so"}, "127.0.0.3", "/t")["LD_PRELOAD"] == "/s.so"


def test_a_node_refuses_a_token_file_others_can_read_and_a_sandbox_instance_without_its_shim(tmp_path):
    token = tmp_path / "auth_token"
    assert "No such file" in node.refusal({}, str(token))
    token.write_text("t")
    token.chmod(0o644)
    assert "not this user's alone (mode 644)" in node.refusal({}, str(token))
    token.chmod(0o600)
    assert node.refusal({}, str(token)) is None  # EC2: no shim needed
    shim = tmp_path / "bindshim.so"
    sandbox = {node.SANDBOX_MARKER: "i-1", node.SHIM_VAR: str(shim)}
    assert "no bind shim" in node.refusal(sandbox, str(token)) and str(shim) in node.refusal(sandbox, str(token))
    assert "no bind shim" in node.refusal({node.SANDBOX_MARKER: "i-1"}, str(token))
    shim.write_bytes(b"\x7fELF")
    assert node.refusal(sandbox, str(token)) is None


def test_a_node_that_must_not_start_ray_starts_nothing_and_says_why(monkeypatch, tmp_path, capsys):
    started = []
    monkeypatch.setattr(node.subprocess, "Popen", lambda *a, **kw: started.append(a))
    monkeypatch.setenv(node.SANDBOX_MARKER, "i-1")
    monkeypatch.delenv(node.SHIM_VAR, raising=False)
    (tmp_path / "token").touch(mode=0o600)
    code = node.main(["head", "--ip", "127.0.0.9", "--gpus", "0", "--cpus", "1", "--ready-file",
                      str(tmp_path / "ready"), "--token-file", str(tmp_path / "token")])
    assert code == 2 and started == [] and not (tmp_path / "ready").exists()
    assert "Ray not started: this sandbox instance has no bind shim" in capsys.readouterr().out


def test_a_nodes_ray_directory_is_removed_when_its_ray_ends(monkeypatch, tmp_path):
    seen = {}

    def fake_argv(args, port, ports):
        seen["dir"] = args.temp_dir
        return [sys.executable, "-c", "pass"]
    monkeypatch.setattr(node, "argv", fake_argv)
    monkeypatch.setattr(node, "_ready", lambda proc, targets: True)
    (tmp_path / "token").touch(mode=0o600)
    assert node.main(["worker", "--ip", "127.0.0.9", "--gpus", "0", "--cpus", "1", "--address", "127.0.0.2:1",
                      "--ready-file", str(tmp_path / "ready"), "--token-file", str(tmp_path / "token")]) == 0
    assert seen["dir"].startswith("/tmp/ec2gpu-ray-") and not os.path.exists(seen["dir"])


def test_the_pools_token_reaches_each_node_in_a_private_file_and_never_its_command_line(monkeypatch):
    from ec2gpu.remote import files, jobs
    wrote, started = {}, []
    monkeypatch.setattr(files, "make_dirs", lambda conn, *dirs: None)
    monkeypatch.setattr(files, "put_file", lambda conn, local, remote: None)
    monkeypatch.setattr(files, "write_private", lambda conn, path, text: wrote.update({path: text}))
    monkeypatch.setattr(jobs, "start", lambda conn, run_dir, argv, env=None: started.append((argv, env)) or 42)
    monkeypatch.setattr(attempt, "_gpus", lambda nd, job: 1)
    monkeypatch.setattr(attempt, "_cpus", lambda nd: 4)
    nd = SimpleNamespace(conn=None, run_dir="/home/ubuntu/ec2gpu/runs/r1", info={}, pid=None)
    token = attempt.new_token()
    assert len(token) == 64 and token != attempt.new_token()  # 256 random bits, a new one per pool
    attempt.launch_ray(nd, attempt.worker_role("10.0.0.1:6379", nd, False), "10.0.0.2", None, token)
    path = "/home/ubuntu/ec2gpu/runs/r1/ray/auth_token"
    assert wrote == {path: token}  # files.write_private: 0600 before a byte is in it
    [(argv, env)] = started
    assert token not in " ".join(argv) and env is None and argv[argv.index("--token-file") + 1] == path
    # the driver on the head reads that same file, named in its environment: the token is in no spec
    assert driver.ray_auth("/home/ubuntu/ec2gpu/runs/r1") == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": path}
    spec = attempt.pool_spec("r1", SimpleNamespace(max_retries=0, elements=()), SimpleNamespace(
        task=SimpleNamespace(run="true"), name="t", args=[]), "10.0.0.1:6379", 1)
    assert token not in json.dumps(spec)


def test_the_driver_names_the_token_to_ray_before_ray_is_imported(tmp_path):
    """Ray reads RAY_AUTH_MODE and the token's path when it is imported (set later, ray.init
    connects without a token and is refused): a stand-in `ray` records what it saw then."""
    fake = tmp_path / "fake" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import json, os, sys\n"
        "json.dump({k: os.environ.get(k) for k in ('RAY_AUTH_MODE', 'RAY_AUTH_TOKEN_PATH')},"
        " open(os.environ['SEEN'], 'w'))\nsys.exit(7)\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "pool.json").write_text("{}")
    import shutil
    shutil.copy(driver.__file__, run_dir / "pool_driver.py")  # as the head has it: what it imports beside it
    for name, module in attempt.SHIPPED.items():
        shutil.copy(Path(attempt.__file__).parents[1] / module, run_dir / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run([sys.executable, str(run_dir / "pool_driver.py"), str(run_dir / "pool.json")], timeout=60,
                          env={**env, "PYTHONPATH": str(tmp_path / "fake"), "SEEN": str(tmp_path / "seen.json")})
    assert done.returncode == 7
    assert json.loads((tmp_path / "seen.json").read_text()) == {
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(run_dir / "ray" / "auth_token")}
