"""Where a command goes is decided by its Backend, never by os.environ (issue 29, item 3): a sandbox
command, even one whose launches outlive it, leaves the process's environment as it was, so a later
command of the same process goes to AWS, not to the sandbox."""
import os

from ec2gpu.backend import Context
from ec2gpu.sandbox import control

AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
            "EC2GPU_CHECKIP_URL")


def test_a_sandbox_command_does_not_send_a_later_one_to_the_sandbox(sandbox_home, monkeypatch):
    home, state = sandbox_home
    monkeypatch.setenv("EC2GPU_HOME", str(home))
    for k in AWS_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(control, "up", lambda h, *a, **kw: state)  # the session's sandbox, as `launch` finds it
    for persistent in (False, True):  # `run --sandbox`, and `launch`/`bake --sandbox` (their instances outlive them)
        with Context(None, True, persistent=persistent) as ctx:
            assert ctx.backend.is_sandbox and ctx.aws.endpoint_url == state["endpoint"]
            assert ctx.aws.ec2.describe_instances()["Reservations"] is not None  # the sandbox answers
            assert not [k for k in AWS_VARS if k in os.environ]
        assert not [k for k in AWS_VARS if k in os.environ]
        with Context(None, False) as later:
            assert later.backend.name == "aws" and later.aws.endpoint_url is None
            assert later.aws.ec2.meta.endpoint_url.startswith("https://ec2.")


def test_the_sandbox_exported_in_the_shell_is_still_found(sandbox_home, monkeypatch):
    """`eval "$(ec2gpu sandbox env)"` then a command without --sandbox: the sandbox, as documented."""
    home, state = sandbox_home
    monkeypatch.setenv("EC2GPU_HOME", str(home))
    for k, v in control.env_vars(state).items():
        monkeypatch.setenv(k, v)
    with Context(None, False) as ctx:
        assert ctx.backend.is_sandbox and ctx.aws.endpoint_url == state["endpoint"]
