"""Where a command runs: AWS, or the sandbox. One object holds the settings, the AWS clients and,
in the sandbox, the resolver from instance id to its sshd; the CLI and the Python API both use it."""
from __future__ import annotations

import contextlib
import os


def sandbox_from_env(flag: bool = False) -> bool:
    """--sandbox, or EC2GPU_SANDBOX=1."""
    return flag or os.environ.get("EC2GPU_SANDBOX", "").lower() in ("1", "true", "yes")


class Context:
    """Settings, AWS clients and the SSH resolver for one command (sandbox or AWS); a context manager.

    ``persistent``: what the command launches must outlive it, so a sandbox it starts keeps running.
    ``note(text)`` is told when a sandbox is started for good.
    """

    def __init__(self, region: str | None, sandbox: bool, persistent: bool = False, note=lambda text: None):
        from . import settings as settings_mod
        self.settings = settings_mod.load({"region": region, "sandbox": sandbox or None})
        self.sandbox, self.persistent, self.note = self.settings.sandbox, persistent, note

    def __enter__(self):
        import getpass
        from dataclasses import replace

        from .aws.session import Aws
        from .sandbox import control

        self._stack = contextlib.ExitStack()
        self.resolver = None
        state = control.read_state(self.settings.home)
        if self.sandbox and self.persistent:  # what is launched must outlive this command
            if not state:
                self.note("starting the sandbox; it keeps running until `ec2gpu sandbox down`")
            state = control.up(self.settings.home)
            os.environ.update(control.env_vars(state))
        elif self.sandbox:
            state = self._stack.enter_context(control.session(self.settings.home))
        if state and os.environ.get("AWS_ENDPOINT_URL") == state["endpoint"]:
            # the sandbox's endpoint is in use (--sandbox, or `eval "$(ec2gpu sandbox env)"`)
            self.resolver = control.resolver(self.settings.home)
            self.settings = replace(self.settings, ssh_user=getpass.getuser())
        self.aws = Aws(self.settings.region, endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)
