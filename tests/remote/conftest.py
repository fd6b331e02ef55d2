"""A real OpenSSH sshd on a loopback address, for the remote layer's tests."""
import pytest

from ec2gpu.aws.network import generate_key, write_private_key
from ec2gpu.sandbox import sshd


@pytest.fixture
def start_sshd(tmp_path):
    """start_sshd(instance_id, host) -> (SshdInstance, its private key path, the known_hosts file
    for it: tmp/known_hosts/<instance-id>, as $EC2GPU_HOME/known_hosts/<instance-id>); each sshd
    started is stopped by pid after the test. Skips where this machine has no sshd."""
    try:
        sshd.sshd_binary()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    started = []

    def start(instance_id: str, host: str):
        private, public = generate_key()
        key = tmp_path / f"{instance_id}.pem"
        write_private_key(key, private)
        inst = sshd.start(instance_id, tmp_path / instance_id, host, public, {})
        started.append(inst)
        return inst, key, tmp_path / "known_hosts" / instance_id
    yield start
    for inst in started:
        sshd.stop(inst.pid, inst.instance_id)
        assert not sshd._alive(inst.pid)
