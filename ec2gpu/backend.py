"""Where a command runs: AWS, or the sandbox. ``Backend`` says which and how SSH reaches an
instance; ``Context`` holds it with the settings and the AWS clients for one command. The CLI and
the Python API both use them, and everything below is handed the ``Backend``: nothing decides
"this is the sandbox" any other way."""
from __future__ import annotations

import contextlib
import getpass
import os
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Optional

from .errors import RemoteError
from .sandbox import control
from .settings import Settings, load, private_home

if TYPE_CHECKING:
    from .aws.instances import Instance


@dataclass(frozen=True)
class Backend:
    """Where instances live: ``name`` "aws" or "sandbox" (also the ledger's ``backend`` column),
    the EC2 endpoint (None: AWS's own), and in the sandbox ``resolve(instance_id, timeout_s) ->
    (host, port)`` of the sshd that stands in for the instance, its credentials and its checkip
    URL. Every AWS client of a command is built from it (``Context``): nothing is read from or
    written to os.environ to choose the sandbox, so a sandbox command never changes where a later
    command of the same process goes."""

    name: str = "aws"
    endpoint_url: Optional[str] = None
    resolve: Optional[Callable[..., tuple[str, int]]] = None
    #: the sandbox's (access key id, secret, session token) and checkip URL; None on AWS (boto3's chain)
    credentials: Optional[tuple[str, str, str | None]] = None
    checkip_url: Optional[str] = None

    @property
    def is_sandbox(self) -> bool:
        return self.name == "sandbox"

    def ssh_target(self, instance: Instance) -> tuple[str, int]:
        """(host, port) to reach ``instance`` over SSH: its public IP on
        port 22, or the sandbox's sshd. Raises RemoteError when an AWS instance has no public IP,
        WaitTimeout when the sandbox has no sshd for it."""
        if self.resolve is not None:
            return self.resolve(instance.id)
        ip = instance.public_ip
        if not ip:
            raise RemoteError(f"{instance.id} has no public IP address",
                              "the default subnet must assign public IPs (MapPublicIpOnLaunch)")
        return ip, 22

    def private_address(self, instance: Instance) -> str:
        """The address other nodes reach ``instance`` at: its private IP, or in the sandbox the
        loopback address of its sshd (which stands in for that private IP). Raises RemoteError when
        an AWS instance has none (one that is not running)."""
        if self.resolve is not None:
            return self.resolve(instance.id)[0]
        if not instance.private_ip:
            raise RemoteError(f"{instance.id} has no private IP address", "is it still running? ec2gpu ls")
        return instance.private_ip


AWS = Backend()


def sandbox_from_env(flag: bool = False) -> bool:
    """--sandbox, or EC2GPU_SANDBOX read as every setting is (settings.Settings: 1, true, yes, on).
    Raises UsageError for a value that is not a boolean."""
    if flag:
        return True
    return load().sandbox


def name_for(settings: Settings) -> str:
    """"sandbox" or "aws": the backend a Context opened with ``settings`` would have (the ledger's
    ``backend`` column), without opening it: ``settings.sandbox``, or a running sandbox whose
    endpoint this shell exported (`eval "$(ec2gpu sandbox env)"`) as AWS_ENDPOINT_URL."""
    if settings.sandbox:
        return "sandbox"
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return "aws"
    state = control.read_state(settings.home)
    return "sandbox" if state and state["endpoint"] == endpoint else "aws"


class Context:
    """Settings, AWS clients and the ``Backend`` for one command (sandbox or AWS); a context manager.

    ``persistent``: what the command launches must outlive it, so a sandbox it starts keeps running.
    ``note(text)`` is told when a sandbox is started for good.
    """

    def __init__(self, region: str | None, sandbox: bool, persistent: bool = False,
                 note: Callable[[str], None] = lambda text: None):
        self.settings = load({"region": region, "sandbox": sandbox or None})
        self.sandbox, self.persistent, self.note = self.settings.sandbox, persistent, note

    def __enter__(self) -> Context:
        # boto3: only a command that reaches AWS (a dry run imports this module and never does: test_dry_run's
        # test_a_dry_run_imports_no_aws_sdk)
        from .aws.session import Aws

        self._stack = contextlib.ExitStack()
        self.backend = AWS
        private_home(self.settings.home)
        state = control.read_state(self.settings.home)
        if self.sandbox and self.persistent:  # what is launched must outlive this command
            if not state:
                self.note("starting the sandbox; it keeps running until `ec2gpu sandbox down`")
            state = control.up(self.settings.home)
        elif self.sandbox:
            state = self._stack.enter_context(control.session(self.settings.home))
        # the sandbox: --sandbox, or its endpoint exported in this shell (`eval "$(ec2gpu sandbox env)"`)
        if state and (self.sandbox or os.environ.get("AWS_ENDPOINT_URL") == state["endpoint"]):
            env = control.env_vars(state)
            self.backend = Backend("sandbox", state["endpoint"], control.resolver(self.settings.home),
                                   credentials=(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                                                env["AWS_SESSION_TOKEN"]), checkip_url=env["EC2GPU_CHECKIP_URL"])
            self.settings = self.settings.model_copy(update={"ssh_user": getpass.getuser()})
        self.aws = Aws(self.settings.region, endpoint_url=self.backend.endpoint_url, credentials=self.backend.credentials,
                       checkip_url=self.backend.checkip_url)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        return self._stack.__exit__(exc_type, exc, tb)
