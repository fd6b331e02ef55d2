"""Fixtures of the AWS-layer tests: clients on the session's sandbox, a launch spec with real resources."""
import os

import pytest

from ec2gpu.aws import images, instances, network, sweep
from ec2gpu.aws.session import Aws


@pytest.fixture
def aws(sandbox_env):
    return Aws("us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


@pytest.fixture
def spec(aws, tmp_path, request):
    """A launch spec with a real key pair and security group (run id from the test module's RUN_ID);
    everything launched under it is removed after."""
    run_id = getattr(request.module, "RUN_ID", "run-test")
    key, _ = network.create_key_pair(aws.ec2, run_id, "alice", tmp_path)
    group = network.create_security_group(aws.ec2, run_id, "alice", "127.0.0.1/32")
    ami = images.resolve_ami(aws.client("ssm"), aws.ec2)
    yield instances.LaunchSpec(run_id=run_id, owner="alice", name="test", instance_type="g4dn.xlarge",
                               image_id=ami["ImageId"], root_device_name=ami["RootDeviceName"], key_name=key,
                               security_group_id=group, max_runtime_minutes=90)
    sweep.delete_run(aws.ec2, run_id, tmp_path)
