"""`image ls|rm` and `sandbox ...` as library functions against the running sandbox, without the CLI
(issue 29, item 7): status, env and up describe the session's sandbox; a standing spot instance
shows in the status and takes a rebalance recommendation; images are listed and an unknown one is
refused. Nothing is left behind."""
import pytest

from ec2gpu.api import images, instances as ops, sandbox as sb
from ec2gpu.errors import UsageError
from ec2gpu.sandbox import control

from test_sandbox_train import leftovers  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False


def test_status_env_and_up_describe_the_running_sandbox(sandbox_env):
    home, state = sandbox_env
    status = sb.sandbox_status()
    assert status is not None and (status.pid, status.endpoint) == (state["pid"], state["endpoint"])
    assert status.to_json() == control.read_state(home)  # --json: the state file's document
    env = sb.sandbox_env()
    assert env == control.env_vars(state) and env["AWS_ENDPOINT_URL"] == state["endpoint"]
    said = []
    assert sb.sandbox_up(log=said.append).pid == state["pid"] and said == []  # the one running, kept
    assert sb.sandbox_up(like_aws=True, log=said.append).pid == state["pid"]
    assert said == ([] if state.get("like_aws") else
                    ["a sandbox without --like-aws is already running; `ec2gpu sandbox down` first"])


def test_images_are_listed_and_an_unknown_one_is_refused(sandbox_env):
    rows = images.list_images(sandbox=True)
    assert isinstance(rows, list)
    for r in rows:  # other tests of the session may have baked one
        assert {"name", "image_id", "snapshot_gib", "usd_per_month", "usd_per_gb_month", "price_source"} <= set(r.to_json())
    with pytest.raises(UsageError, match="no image of ec2gpu's named 'no-such-image' in us-east-1"):
        images.remove_image("no-such-image", sandbox=True)


def test_a_standing_spot_instance_shows_in_the_status_and_takes_a_rebalance(sandbox_env):
    home, _ = sandbox_env
    [row] = ops.launch(name="api-sbx", spot=True, max_runtime=30, sandbox=True)
    iid = row.instance_id
    try:
        status = sb.sandbox_status()
        assert status is not None
        instances = status.instances
        assert iid in instances and {"host", "port", "sshd_pid"} <= set(instances[iid])
        done = sb.sandbox_interrupt(iid, rebalance=True)
        assert done.instance_id == iid and done.rebalance and done.rebalance["noticeTime"]
        assert iid in {r.instance_id for r in ops.list_instances(sandbox=True)}  # it keeps running
        with pytest.raises(UsageError, match="not a running sandbox instance"):  # the user's input: exit 2
            sb.sandbox_interrupt("i-0123456789abcdef0")
    finally:
        ops.down("api-sbx", sandbox=True)
    assert leftovers(home) == ([], [], [])
