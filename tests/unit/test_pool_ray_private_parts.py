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

from ec2gpu.errors import UsageError
from ec2gpu.pool import attempt, driver, node, ray_nodes


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
            assert f"--temp-dir={node.ray_dir(path)}" in node.argv(_args(temp_dir=path), 6379, node.ports_for("127.0.0.7", 1))
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
    from ec2gpu.remote import files, jobs, ssh
    started = []
    monkeypatch.setattr(files, "make_dirs", lambda conn, *dirs: None)
    monkeypatch.setattr(files, "put_file", lambda conn, local, remote: None)
    monkeypatch.setattr(ssh, "run", lambda conn, command, **kw: "")
    monkeypatch.setattr(jobs, "start", lambda conn, run_dir, argv, env=None, private=None:
                        started.append((run_dir, argv, env, private)) or 42)
    monkeypatch.setattr(ray_nodes, "node_gpus", lambda nd, job: 1)
    monkeypatch.setattr(ray_nodes, "_cpus", lambda nd: 4)
    nd = SimpleNamespace(conn=None, run_dir="/home/ubuntu/ec2gpu/runs/r1", info={}, pid=None)
    token = ray_nodes.new_token()
    assert len(token) == 64 and token != ray_nodes.new_token()  # 256 random bits, a new one per pool
    ray_nodes.launch_ray(nd, ray_nodes.worker_role("10.0.0.1:6379", nd, False), "10.0.0.2", None, token)
    path = "/home/ubuntu/ec2gpu/runs/r1/ray/auth_token"
    [(run_dir, argv, env, private)] = started
    # written 0600 by the command that starts node.py, the token on its stdin (remote/jobs.start)
    assert f"{run_dir}/{next(iter(private))}" == path and private == {"auth_token": token}
    assert token not in " ".join(argv) and env is None and argv[argv.index("--token-file") + 1] == path
    # the driver on the head gets the same file, named by node.py: the token is in no spec or command line
    drv = ray_nodes.driver_argv("python3", "/home/ubuntu/ec2gpu/runs/r1", "10.0.0.1")
    assert drv[drv.index("--token-file") + 1] == path and token not in " ".join(drv)
    spec = attempt.pool_spec("r1", SimpleNamespace(max_retries=0, elements=()), SimpleNamespace(
        task=SimpleNamespace(run="true"), name="t", args=[]), "10.0.0.1:6379", 1)
    assert token not in json.dumps(spec)


def _head_run_dir(tmp_path):
    """A head's run directory as the pool leaves it for the driver: the driver and what it imports
    beside it, ray/node.py, pool.json, the token file (0600)."""
    import shutil
    run_dir = tmp_path / "run"
    (run_dir / "ray").mkdir(parents=True)
    (run_dir / "pool.json").write_text("{}")
    shutil.copy(driver.__file__, run_dir / "pool_driver.py")  # as the head has it: what it imports beside it
    for name, module in ray_nodes.SHIPPED.items():
        shutil.copy(Path(attempt.__file__).parents[1] / module, run_dir / name)
    shutil.copy(node.__file__, run_dir / "ray" / "node.py")
    (run_dir / driver.TOKEN_FILE).touch(mode=0o600)
    return run_dir


#: a stand-in `ray` that records what the driver's environment was when Ray was imported, then ends it
FAKE_RAY = ("import json, os, sys\n"
            "json.dump({k: os.environ.get(k) for k in ('RAY_AUTH_MODE', 'RAY_AUTH_TOKEN_PATH', 'LD_PRELOAD',"
            " 'EC2GPU_SANDBOX_BIND')}, open(os.environ['SEEN'], 'w'))\nsys.exit(7)\n")


@pytest.mark.parametrize("sandbox", [False, True], ids=["ec2", "sandbox"])
def test_the_driver_gets_the_environment_of_its_nodes_ray_before_ray_is_imported(tmp_path, sandbox):
    """Ray reads RAY_AUTH_MODE and the token's path when it is imported (set later, ray.init
    connects without a token and is refused), and in the sandbox the driver's ray.init starts a
    core worker whose gRPC server binds every address without the shim, which must be preloaded
    when the process starts: the agent starts the driver through node.py (ray_nodes.driver_argv),
    which gives it node.ray_env's environment, the one its Ray has."""
    fake = tmp_path / "fake" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_RAY)
    run_dir = _head_run_dir(tmp_path)
    shim = tmp_path / "bindshim.so"
    shim.write_bytes(b"")  # the loader says it cannot preload it, and goes on
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "EC2GPU_SANDBOX"))}
    env.pop("LD_PRELOAD", None)
    if sandbox:
        env.update({node.SANDBOX_MARKER: "i-1", node.SHIM_VAR: str(shim)})
    done = subprocess.run(ray_nodes.driver_argv(sys.executable, str(run_dir), "127.0.0.9"), timeout=60,
                          capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(tmp_path / "fake"), "SEEN": str(tmp_path / "seen.json")})
    assert done.returncode == 7, done.stdout + done.stderr
    assert json.loads((tmp_path / "seen.json").read_text()) == {
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(run_dir / "ray" / "auth_token"),
        "LD_PRELOAD": str(shim) if sandbox else None, "EC2GPU_SANDBOX_BIND": "127.0.0.9" if sandbox else None}


def test_a_driver_that_would_be_exposed_is_not_started(tmp_path):
    """As a node refuses to start Ray: a sandbox instance without its shim, a token file others
    can read. Exit 2, one line, the driver never run."""
    run_dir = _head_run_dir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "EC2GPU_SANDBOX"))}
    argv = ray_nodes.driver_argv(sys.executable, str(run_dir), "127.0.0.9")
    argv[argv.index("--") + 1:] = [sys.executable, "-c", "print('driver ran')"]
    done = subprocess.run(argv, timeout=60, capture_output=True, text=True, env={**env, node.SANDBOX_MARKER: "i-1"})
    assert done.returncode == 2 and "driver ran" not in done.stdout
    assert done.stdout.startswith("ec2gpu: the pool's driver not started: this sandbox instance has no bind shim")
    (run_dir / driver.TOKEN_FILE).chmod(0o644)
    done = subprocess.run(argv, timeout=60, capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "is not this user's alone (mode 644)" in done.stdout


class LocalConn:
    """A connection whose instance is this machine: commands run here (bash), a put writes the
    file as SFTP's open does (created or truncated, through a link)."""

    host = "local"

    def run(self, command, hide=True, in_stream=False, timeout=None, warn=False):
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 or warn, (command, done.stderr)
        return SimpleNamespace(stdout=done.stdout, stderr=done.stderr, exited=done.returncode, ok=not done.returncode)

    def put(self, local, remote):
        data = local.getvalue() if hasattr(local, "getvalue") else Path(local).read_bytes()
        with open(remote, "wb") as f:
            f.write(data)


@pytest.fixture
def local_instance(tmp_path, monkeypatch):
    """A node whose instance is this machine (LocalConn; its commands' input given here), its run
    directory under ``tmp_path``, "python" a program that does nothing (what is started ends at once)."""
    from ec2gpu.remote import ssh

    def with_input(conn, command, text, timeout_s=60):
        done = subprocess.run(["bash", "-c", command], input=text, capture_output=True, text=True, timeout=timeout_s)
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr
    monkeypatch.setattr(ssh, "with_input", with_input)
    monkeypatch.setattr(ray_nodes, "node_gpus", lambda nd, job: 1)
    monkeypatch.setattr(ray_nodes, "_cpus", lambda nd: 1)
    run_dir = tmp_path / "home" / "ec2gpu" / "runs" / "r1"
    (run_dir / "ray").mkdir(parents=True)
    return SimpleNamespace(conn=LocalConn(), run_dir=str(run_dir), info={"python": "true"}, pid=None, instance=None,
                           agent_key=None)


def test_a_link_the_setup_left_where_the_token_and_node_py_go_is_not_written_through(local_instance, tmp_path):
    """The task's setup runs earlier as the same user: a link it leaves at RUN_DIR/ray/auth_token
    (or node.py) is removed, not written through (the token in a file of its choosing, or one of
    the user's files overwritten), and the token file is the node's own, 0600."""
    nd, victims = local_instance, {}
    for name in ("auth_token", "node.py"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("the user's own\n")
        os.symlink(victims[name], Path(nd.run_dir) / "ray" / name)
    token = ray_nodes.new_token()
    ray_nodes.launch_ray(nd, ["head", "--ready-file", f"{nd.run_dir}/ray/ready"], "127.0.0.9", None, token)
    assert {name: v.read_text() for name, v in victims.items()} == {n: "the user's own\n" for n in victims}
    st = os.lstat(Path(nd.run_dir) / driver.TOKEN_FILE)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert (Path(nd.run_dir) / driver.TOKEN_FILE).read_text() == token
    assert (Path(nd.run_dir) / "ray" / "node.py").read_bytes() == Path(node.__file__).read_bytes()


def test_a_link_the_setup_left_where_the_driver_and_its_modules_go_is_not_written_through(local_instance, tmp_path):
    nd = local_instance
    names = ["pool_driver.py", "pool.json", *ray_nodes.SHIPPED]
    for name in names:
        (tmp_path / f"victim-{name}").write_text("the user's own\n")
        os.symlink(tmp_path / f"victim-{name}", Path(nd.run_dir) / name)
    opts = SimpleNamespace(max_runtime_minutes=None)
    ray_nodes.start_driver(nd, {"head_ip": "127.0.0.9"}, opts, SimpleNamespace(limit_grace_seconds=120.0))
    assert [(tmp_path / f"victim-{n}").read_text() for n in names] == ["the user's own\n"] * len(names)
    assert all(stat.S_ISREG(os.lstat(Path(nd.run_dir) / n).st_mode) for n in names)
    assert (Path(nd.run_dir) / "pool_driver.py").read_bytes() == Path(driver.__file__).read_bytes()


def test_a_token_file_that_is_a_link_is_refused_even_to_a_private_file(tmp_path):
    real = tmp_path / "elsewhere"
    real.touch(mode=0o600)
    os.symlink(real, tmp_path / "auth_token")
    assert "is not a file of its own (a link" in node.refusal({}, str(tmp_path / "auth_token"))
    assert node.refusal({}, str(real)) is None


@pytest.mark.parametrize("version", ["2.51.0", "2.59.9", "1.13.0", "nightly"])
def test_a_ray_without_token_authentication_is_refused_before_anything_is_created(monkeypatch, version):
    """An older Ray ignores RAY_AUTH_MODE (its pool open to whoever reaches it), and check_ray
    installs this machine's version on the nodes: refused here, in one line, the pip line the hint."""
    import importlib.metadata
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
    built = []
    with pytest.raises(UsageError) as exc:
        ray_nodes.ray_here(lambda: built.append(1))
    assert exc.value.message == (f"an array or a sweep needs Ray 2.60 or later (Ray's token authentication keeps "
                                 f"strangers off the pool); this machine has Ray {version}")
    assert exc.value.hint == "pip install 'ray>=2.60,<3'" and built == []
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.60.0")
    assert ray_nodes.ray_here(lambda: built.append(1)) == "2.60.0" and built == [1]


def test_the_oldest_ray_accepted_is_the_pool_extras():
    import tomllib
    extras = tomllib.loads((Path(attempt.__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["pool"] == [ray_nodes.RAY_REQUIREMENT]
    assert ray_nodes.RAY_REQUIREMENT.startswith(f"ray>={ray_nodes.MIN_RAY[0]}.{ray_nodes.MIN_RAY[1]},")


def test_pool_never_imports_sandbox():
    """sandbox/ plugs in from outside (docs/architecture.md): api/ gives pool/ what it needs of it."""
    import ast
    for path in Path(attempt.__file__).parent.glob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.ImportFrom):
                assert "sandbox" not in (n.module or "").split("."), (path.name, n.lineno)
            elif isinstance(n, ast.Import):
                assert not [a.name for a in n.names if "sandbox" in a.name.split(".")], (path.name, n.lineno)
