"""The workdir up against a real OpenSSH sshd on a loopback address: by rsync where both sides have
it, else by SFTP, and the run's words say which and why (issue 27.20)."""
import getpass
import shutil

import pytest

from ec2gpu.remote import ssh, ssh_config as sc, sync


@pytest.fixture
def server(start_sshd, tmp_path):
    inst, key, known = start_sshd("i-sync0001", "127.0.0.98")
    conn = ssh.wait_for_ssh(inst.host, inst.port, getpass.getuser(), key, known, timeout_s=20)
    config = tmp_path / "ssh.config"
    sc.write(config, sc.render([sc.HostEntry((inst.instance_id,), inst.host, inst.port, getpass.getuser(), key, known)],
                               config))
    yield conn, config, inst.instance_id
    conn.close()


def _project(tmp_path):
    root = tmp_path / "project"
    (root / "sub").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "sub" / "data.txt").write_text("1 2 3\n")
    return sync.manifest(root)


def _sent(conn, remote: str) -> dict:
    return {rel: ssh.run(conn, f"cat {remote}/{rel}") for rel in ("train.py", "sub/data.txt")}


def test_without_rsync_here_the_workdir_goes_by_sftp_whole_and_the_run_is_told_why(server, tmp_path, monkeypatch):
    conn, config, alias = server
    which = shutil.which
    monkeypatch.setattr(sync.shutil, "which", lambda name: None if name == "rsync" else which(name))
    remote = ssh.run(conn, "echo $HOME/w1").strip()
    how = sync.push(conn, _project(tmp_path), remote, config, alias)
    assert how == "sftp (rsync is missing on this machine: the whole workdir as one archive each time, not only " \
                  "what changed)"
    assert _sent(conn, remote) == {"train.py": "print('train')\n", "sub/data.txt": "1 2 3\n"}
    assert not ssh.run(conn, f"ls -A {remote}").count(".ec2gpu-workdir")  # the archive is gone once unpacked


def test_with_rsync_on_both_sides_the_workdir_goes_by_rsync(server, tmp_path):
    if not shutil.which("rsync"):
        pytest.skip("no rsync on this machine")
    conn, config, alias = server
    remote = ssh.run(conn, "echo $HOME/w2").strip()
    assert sync.push(conn, _project(tmp_path), remote, config, alias) == "rsync"
    assert _sent(conn, remote) == {"train.py": "print('train')\n", "sub/data.txt": "1 2 3\n"}
