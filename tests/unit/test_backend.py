"""The one Backend object: how SSH reaches an instance, and whether this is the sandbox."""
import pytest

from ec2gpu.backend import AWS, Backend
from ec2gpu.errors import RemoteError
from dataclasses import replace
from datetime import datetime, timezone
from ec2gpu.aws.instances import Instance

INSTANCE = Instance("i-0abc", "g4dn.xlarge", "running", datetime.now(timezone.utc), public_ip="203.0.113.7",
                    private_ip="172.31.5.6")


def test_on_aws_ssh_goes_to_the_public_ip_and_nodes_meet_on_private_ips():
    assert not AWS.is_sandbox and AWS.name == "aws"
    assert AWS.ssh_target(INSTANCE) == ("203.0.113.7", 22)
    assert AWS.private_address(INSTANCE) == "172.31.5.6"


def test_an_aws_instance_without_a_public_ip_is_a_clear_error():
    with pytest.raises(RemoteError, match="no public IP"):
        AWS.ssh_target(replace(INSTANCE, public_ip=None))
    with pytest.raises(RemoteError, match="no private IP"):  # never an empty address for the other nodes
        AWS.private_address(replace(INSTANCE, private_ip=None))


def test_in_the_sandbox_the_instance_is_its_sshd_for_ssh_and_for_other_nodes():
    asked = []
    sandbox = Backend("sandbox", "http://127.0.0.1:5000", lambda iid, timeout_s=30.0: asked.append(iid) or ("127.0.0.9", 40022))
    assert sandbox.is_sandbox
    assert sandbox.ssh_target(INSTANCE) == ("127.0.0.9", 40022)
    assert sandbox.private_address(INSTANCE) == "127.0.0.9"
    assert asked == ["i-0abc", "i-0abc"]
