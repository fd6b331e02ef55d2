"""remote/ssh_config.py: the one per-run SSH config (ssh_config_for) that the foreground job, the
pool's driver and its replacements, and the image bake all write (issue 45, item 2)."""
import stat
from types import SimpleNamespace

from ec2gpu.remote import ssh_config as sc


def test_a_runs_ssh_config_names_each_node_by_its_instance_id_with_its_own_pinned_host_key(tmp_path):
    nodes = [SimpleNamespace(instance_id="i-0a", host="10.1.0.5", port=22),
             SimpleNamespace(instance_id="i-0b", host="127.0.0.9", port=2222)]
    path = sc.ssh_config_for(nodes, tmp_path / "ssh" / "r1.config", "ubuntu", tmp_path / "k.pem",
                             tmp_path / "known_hosts")
    assert path == tmp_path / "ssh" / "r1.config"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it names the run's private key
    blocks = path.read_text().split("\nHost ")[1:]
    assert [b.splitlines()[0] for b in blocks] == ["i-0a", "i-0b"]
    second = blocks[1]
    for line in ("HostName 127.0.0.9", "Port 2222", "User ubuntu", f"IdentityFile {tmp_path / 'k.pem'}",
                 f"UserKnownHostsFile {tmp_path / 'known_hosts' / 'i-0b'}", "HostKeyAlias i-0b",
                 "StrictHostKeyChecking yes",
                 # rsync over a reclaimed instance whose packets vanish ends in 45 s, not when TCP gives up
                 "ServerAliveInterval 15", "ServerAliveCountMax 3"):
        assert f"    {line}" in second.splitlines()
