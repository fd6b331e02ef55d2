"""The sandbox's bind shim (sandbox/bindshim.c, issue 44 item 1): built once per source with this
machine's C compiler, it makes a bind to the wildcard address (0.0.0.0, ::, ::ffff:0.0.0.0), and
a listen on a socket not bound (which Linux binds to the wildcard), one to the instance's own
127.0.0.N, and leaves every other bind alone; without a compiler a sandbox array is refused before anything
is created."""
import json
import shutil
import subprocess
import sys

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.pool import ray_nodes
from ec2gpu.sandbox import bindshim

needs_cc = pytest.mark.skipif(not any(shutil.which(c) for c in bindshim.COMPILERS), reason="no C compiler here")

#: binds as Ray's servers do (and one the shim must leave alone), printed as getsockname() says
BINDS = r"""
import json, socket
out = {}
with socket.socket(socket.AF_INET) as s:
    s.bind(("0.0.0.0", 0)); out["v4 wildcard"] = s.getsockname()[0]
with socket.socket(socket.AF_INET6) as s:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", 0)); out["dual-stack wildcard"] = s.getsockname()[0]
with socket.socket(socket.AF_INET6) as s:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind(("::", 0)); out["IPv6-only wildcard"] = s.getsockname()[0]
with socket.socket(socket.AF_INET6) as s:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::ffff:0.0.0.0", 0)); out["v4-mapped wildcard"] = s.getsockname()[0]
with socket.socket(socket.AF_INET) as s:
    s.listen(); out["v4 listen unbound"] = s.getsockname()[0]
with socket.socket(socket.AF_INET6) as s:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.listen(); out["dual-stack listen unbound"] = s.getsockname()[0]
with socket.socket(socket.AF_INET6) as s:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.listen(); out["IPv6-only listen unbound"] = s.getsockname()[0]
with socket.socket(socket.AF_INET) as s:
    s.bind(("127.0.0.1", 0)); s.listen(); out["an address"] = s.getsockname()[0]
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    try:
        s.listen()
    except OSError:
        pass
    out["UDP listen"] = s.getsockname()  # left unbound: listen is not for it
print(json.dumps(out))
"""


def _binds(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", BINDS], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return bindshim.build(tmp_path_factory.mktemp("state"))


@needs_cc
def test_a_wildcard_bind_becomes_a_bind_to_the_instances_own_address(shim):
    got = _binds({"LD_PRELOAD": str(shim), "EC2GPU_SANDBOX_BIND": "127.0.0.9", "PATH": "/usr/bin:/bin"})
    assert got == {"v4 wildcard": "127.0.0.9", "dual-stack wildcard": "::ffff:127.0.0.9",
                   "IPv6-only wildcard": "::1", "v4-mapped wildcard": "::ffff:127.0.0.9",
                   "v4 listen unbound": "127.0.0.9", "dual-stack listen unbound": "::ffff:127.0.0.9",
                   "IPv6-only listen unbound": "::1", "an address": "127.0.0.1", "UDP listen": ["0.0.0.0", 0]}, got


@needs_cc
def test_without_an_address_to_bind_the_shim_changes_nothing(shim):
    got = _binds({"LD_PRELOAD": str(shim), "PATH": "/usr/bin:/bin"})
    assert got == {"v4 wildcard": "0.0.0.0", "dual-stack wildcard": "::", "IPv6-only wildcard": "::",
                   "v4-mapped wildcard": "::ffff:0.0.0.0", "v4 listen unbound": "0.0.0.0",
                   "dual-stack listen unbound": "::", "IPv6-only listen unbound": "::", "an address": "127.0.0.1",
                   "UDP listen": ["0.0.0.0", 0]}, got


@needs_cc
def test_the_shim_is_built_once_per_source_text(tmp_path, monkeypatch):
    first = bindshim.build(tmp_path)
    assert first == bindshim.library(tmp_path) and first.is_file()
    monkeypatch.setattr(bindshim.subprocess, "run", lambda *a, **kw: pytest.fail("built again"))
    assert bindshim.build(tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no part file left


def test_without_a_c_compiler_a_sandbox_array_is_refused_before_anything_is_created(tmp_path, monkeypatch):
    """api/ gives pool/ the sandbox's part (pool/ never imports sandbox/): the shim built into the
    sandbox's state directory under the tool home, or a refusal before any instance exists."""
    from ec2gpu.sandbox import control
    monkeypatch.setattr(bindshim.shutil, "which", lambda name: None)
    with pytest.raises(UsageError) as exc:
        ray_nodes.ray_here(lambda: bindshim.for_sandbox(tmp_path))
    assert "an array in the sandbox needs a C compiler (cc)" in exc.value.message
    assert "apt-get install gcc" in exc.value.hint
    assert not (tmp_path / "sandbox").exists()
    assert ray_nodes.ray_here(None)  # on EC2 no shim is needed: the security group stands in front
    monkeypatch.undo()
    if any(shutil.which(c) for c in bindshim.COMPILERS):
        assert ray_nodes.ray_here(lambda: bindshim.for_sandbox(tmp_path))
        assert bindshim.library(control.state_dir(tmp_path)).is_file()  # where the daemon names it (server.py)


def test_a_compiler_that_fails_is_said_in_one_line_with_the_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(bindshim.shutil, "which", lambda name: "/usr/bin/false" if name == "cc" else None)
    with pytest.raises(UsageError) as exc:
        bindshim.build(tmp_path)
    assert exc.value.message.startswith("the sandbox's bind shim was not built (/usr/bin/false exited 1")
    assert "\n" not in exc.value.message and list(tmp_path.iterdir()) == []


def test_a_running_sandbox_that_names_no_shim_is_refused_before_anything_is_created(tmp_path):
    """A daemon an older ec2gpu started names no library to its instances: node.py there would
    refuse to start Ray only once the array's instances exist. for_sandbox reads the running
    daemon's state first and says to restart it."""
    import os

    from ec2gpu.sandbox import control
    if not any(shutil.which(c) for c in bindshim.COMPILERS):
        pytest.skip("no C compiler here")
    state = control.state_dir(tmp_path)
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"pid": os.getpid(), "endpoint": "http://127.0.0.1:1"}))
    with pytest.raises(UsageError, match="started by an older ec2gpu") as exc:
        bindshim.for_sandbox(tmp_path)
    assert "ec2gpu sandbox down && ec2gpu sandbox up" in exc.value.hint
    (state / "state.json").write_text(json.dumps({"pid": os.getpid(), "endpoint": "http://127.0.0.1:1",
                                                  "bind_shim": str(bindshim.library(state))}))
    assert bindshim.for_sandbox(tmp_path) == bindshim.library(state)
