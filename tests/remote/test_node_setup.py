"""A node made ready, against a real OpenSSH sshd on a loopback address: the machine setup reused on
an instance where the same script already ran (issue 27, item 17), and the job's checkpoint
directory made before the job starts (item 13)."""
import getpass
import json
from pathlib import Path

import pytest

from ec2gpu.remote import setup, ssh
from ec2gpu.runs.execute import engine, nodes
from ec2gpu.tasks import load
from datetime import datetime, timezone
from ec2gpu.aws.instances import Instance

#: a stand-in for setup-gpu.sh: counts its runs in $HOME/runs and writes a setup.json
FAKE_SETUP = """#!/usr/bin/env bash
set -eu
echo run >> "$HOME/runs"
printf '{"python": "/bin/sh", "torch_version": "%s", "cuda_available": false, "gpu_count": 0}' "$VERSION" > "$1"
echo "fake setup done"
"""


@pytest.fixture
def instance(start_sshd, tmp_path):
    """(a fabric Connection to a fresh sshd, its $HOME on this machine); the sshd stopped by pid after."""
    inst, key, known = start_sshd("i-setup0001", "127.0.0.98")
    conn = ssh.wait_for_ssh(inst.host, inst.port, getpass.getuser(), key, known, timeout_s=20)
    yield conn, inst.directory / "home"
    conn.close()


def fake_script(monkeypatch, tmp_path, version: str):
    path = tmp_path / f"setup-{version}.sh"
    path.write_text(FAKE_SETUP.replace('"$VERSION"', version))
    monkeypatch.setattr(setup, "script_path", lambda: path)


def test_the_machine_setup_is_reused_on_the_same_instance_and_redone_when_the_script_or_machine_changes(
        instance, monkeypatch, tmp_path):
    conn, home = instance
    fake_script(monkeypatch, tmp_path, "1")
    run_dir = str(home / "ec2gpu" / "runs")
    first = setup.setup(conn, f"{run_dir}/a", machine="i-1 g4dn.xlarge")
    assert first["reused"] is None and first["torch_version"] == "1"
    said = []
    second = setup.setup(conn, f"{run_dir}/b", log=said.append, machine="i-1 g4dn.xlarge")
    assert (home / "runs").read_text().count("run") == 1  # the script did not run again
    assert second["reused"] and second["python"] == "/bin/sh" and second["torch_version"] == "1"
    assert json.loads((home / "ec2gpu" / "runs" / "b" / "setup.json").read_text())["reused"] == second["reused"]
    assert said[0].startswith("machine setup skipped: setup-gpu.sh")
    # another type (stopped, changed, started), a changed script, or no machine named: it runs again
    assert setup.setup(conn, f"{run_dir}/c", machine="i-1 g5.xlarge")["reused"] is None
    fake_script(monkeypatch, tmp_path, "2")
    assert setup.setup(conn, f"{run_dir}/d", machine="i-1 g5.xlarge")["torch_version"] == "2"
    assert setup.setup(conn, f"{run_dir}/e")["reused"] is None
    assert (home / "runs").read_text().count("run") == 4


def _marker(digest: str, machine: str, python: str = "/bin/sh", **setup_fields) -> str:
    return json.dumps({"script_sha256": digest, "machine": machine, "at": "2026-11-22T10:00:00+00:00",
                       "setup": {"python": python, "cuda_available": False, "gpu_count": 0, **setup_fields}})


BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()  # the sandbox's instance boots with this machine


@pytest.mark.parametrize("marker, reused", [
    (lambda d: _marker(d, f"i-1 t boot {BOOT}"), True),  # ours: reused (the cases below differ in one thing)
    (lambda d: "not json", False),
    (lambda d: "[]", False),
    (lambda d: '{"script_sha256": "%s"}' % d, False),
    (lambda d: _marker(d, f"i-1 t boot {BOOT}", python=3), False),
    (lambda d: _marker(d, f"i-1 t boot {BOOT}", python="/nonexistent/python3"), False),  # its Python is gone
    (lambda d: _marker(d, "i-1 t boot 00000000-0000-0000-0000-000000000000"), False),  # set up before a reboot
    (lambda d: _marker("0" * 64, f"i-1 t boot {BOOT}"), False),  # by another setup script
])
def test_a_marker_is_reused_only_when_it_is_ours_for_this_boot_and_its_python_is_there(instance, monkeypatch,
                                                                                        tmp_path, marker, reused):
    conn, home = instance
    fake_script(monkeypatch, tmp_path, "1")
    (home / ".ec2gpu").mkdir(parents=True, exist_ok=True)
    (home / setup.MARKER).write_text(marker(setup.script_digest()))
    got = setup.setup(conn, str(home / "ec2gpu" / "runs" / "a"), machine="i-1 t")
    assert bool(got["reused"]) is reused
    assert (home / "runs").exists() is not reused  # the script ran, or did not


@pytest.mark.parametrize("checkpoint_dir", [None, "ckpt/latest"])
def test_the_checkpoint_directory_exists_before_the_job_starts(instance, tmp_path, checkpoint_dir):
    conn, home = instance
    text = "name: t\nworkdir: null\nrun: x\n" + (f"checkpoint_dir: {checkpoint_dir}\n" if checkpoint_dir else "")
    job = engine.prepare(load.parse(text, "t.yaml", tmp_path), {})
    instance = Instance("i-setup0001", "g4dn.xlarge", "running", datetime.now(timezone.utc))
    nd = nodes.Node(0, instance, conn=conn, run_dir=str(home / "ec2gpu" / "runs" / "r1"),
                    info={"python": "python3"})
    engine.upload_node(nd, job, None, "r1", ["127.0.0.98"], False, None, lambda line: None)
    env = json.loads((home / "ec2gpu" / "runs" / "r1" / "job.env.json").read_text())
    expected = home / "ec2gpu" / ("workdirs/t/ckpt/latest" if checkpoint_dir else "runs/r1/checkpoints")
    assert env["EC2GPU_CHECKPOINT_DIR"] == str(expected) and expected.is_dir()
    assert (home / "ec2gpu" / "runs" / "r1" / "out").is_dir()
