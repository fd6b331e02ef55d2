"""The standing-instance commands as library functions, without the CLI (issue 29, item 7): each
returns data, refuses bad input before a backend is opened, and leaves nothing behind."""
import pytest

from ec2gpu import api
from ec2gpu.api import instances as ops
from ec2gpu.errors import UsageError

from test_sandbox_train import leftovers  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False


@pytest.mark.parametrize("call, words", [
    (lambda: ops.launch(name="dev\n"), "name"),
    (lambda: ops.launch(ssh_cidr="not-a-cidr"), "CIDR"),
    (lambda: ops.launch(nodes=0), "nodes"),
    (lambda: ops.launch(instance_type="t3.micro", sandbox=True), "no NVIDIA GPU"),  # no sandbox started for it
    (lambda: ops.launch(idle_stop="30m", spot=True), "spot"),
    (lambda: ops.launch(no_idle=True), "--max-runtime"),
    (lambda: ops.down(), "which instances"),
    (lambda: ops.down("dev", all=True), "which instances"),
    (lambda: ops.scale("dev", 0), "at least 1 node"),
])
def test_bad_input_is_refused_before_any_backend_is_opened(no_backend, call, words):
    with pytest.raises(UsageError, match=words):
        call()


def test_launch_list_doctor_and_down_return_data_and_leave_nothing(sandbox_env):
    home, _ = sandbox_env
    said = []
    rows = ops.launch(name="api-dev", max_runtime=30, sandbox=True, log=said.append)
    assert [(r.name, r.state, r.market) for r in rows] == [("api-dev", "running", "on-demand")]
    iid = rows[0].instance_id
    try:
        listed = {r.instance_id: r for r in ops.list_instances(sandbox=True)}
        assert listed[iid].name == "api-dev" and listed[iid].idle_rule  # the default idle rule, as a tag
        checks = ops.doctor(sandbox=True)
        assert {c.name for c in checks} >= {"credentials"} and all(set(c.as_dict()) >= {"name", "ok", "detail"} for c in checks)
        with pytest.raises(UsageError, match="nothing of ec2gpu's is named"):
            ops.down("no-such-instance", sandbox=True)
    finally:
        removed = ops.down("api-dev", sandbox=True, log=said.append)
    [report] = removed.values()
    assert iid in report["instances"] and not report.get("left")
    assert iid not in {r.instance_id for r in ops.list_instances(sandbox=True)}
    swept = ops.cleanup(dry_run=True, sandbox=True)
    assert swept.dry_run is True and swept.searched == ["us-east-1"]
    assert leftovers(home) == ([], [], [])


def test_import_ec2gpu_gives_a_function_per_standing_instance_command():
    import ec2gpu
    for name in ("launch", "stop", "start", "scale", "list_instances", "down", "cleanup", "doctor"):
        assert callable(getattr(ec2gpu, name)) and getattr(ec2gpu, name) is getattr(api, name)
