"""One attempt, whatever it runs: the lifecycle every way of running a job on instances shares,
written once, with a Strategy that supplies only what differs (issue 45, item 2).

  open nodes (SSH, host key checked) -> [strategy.opened] -> the run's SSH config (one entry per node:
  remote/ssh_config.ssh_config_for) -> prepare (machine setup) -> upload (workdir, then file_mounts) ->
  [strategy.setup: the task's setup, and what the mode adds] -> hand-over heartbeat (while there is
  a hand-over plan: runs/recover/handover.py) -> [strategy.run: start and follow] ->
  [strategy.collect: results home, the verdict] -> close (every exit path: heartbeat stopped,
  connections closed, the SSH config removed)

The strategies: runs/execute/foreground.ForegroundJob (the task under the agent, `ec2gpu run`,
`exec`, `train mnist`), pool/attempt.PoolDriver (an array's Ray driver on the pool's head; pool/
plugs it in: runs/ never imports pool/) and runs/provision/bake.ImageBake (an image of the
builder instead of a job). Each phase is timed by the reporter (``ui.phase``): "waiting for SSH",
"setup", "upload", then the strategy's own.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generic, TypeVar

from ...errors import RemoteError
from ...remote import ssh_config as sc
from . import engine
from . import nodes as N

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...aws.session import Aws
    from ...backend import Backend
    from ...settings import Settings
    from ..job import Provisioned
    from ..recover.handover import Handover, Heartbeat
    from ..recover.recovery import DirCheckpoints
    from ..job import TaskJob
    from .nodes import Node
    from .reporter import ReporterLike

R = TypeVar("R")


@dataclass
class Attempt:
    """One attempt as every strategy sees it: the run's context, its nodes (node 0 first), the
    run's SSH config (rsync's and the tunnels'), the nodes' private addresses (once prepared) and
    the hand-over plan (None without one)."""

    aws: Aws
    settings: Settings
    run_id: str
    ui: ReporterLike
    prov: Provisioned
    backend: Backend
    job: TaskJob
    local_out: Path
    n: int  # the run's attempt number (1 first)
    nodes: list[Node]
    config: Path
    addresses: list[str] = field(default_factory=list)
    plan: Handover | None = None

    def say(self, nd: Node) -> Callable[[str], None]:
        """Where node ``nd``'s lines go: ``node K: line`` on a cluster, the line alone on one node."""
        ui = self.ui
        return (lambda line: ui.note(f"node {nd.index}: {line}")) if len(self.nodes) > 1 else ui.note


def new(aws: Aws, settings: Settings, run_id: str, ui: ReporterLike, prov: Provisioned, backend: Backend,
        job: TaskJob, instances_: list[Instance], local_out: Path, n: int) -> Attempt:
    """The attempt of ``job`` on ``instances_`` (node 0 first): a Node each, and the run's SSH
    config path, $EC2GPU_HOME/ssh/<run id>.config (written once the nodes answer)."""
    return Attempt(aws, settings, run_id, ui, prov, backend, job, local_out, n,
                   [N.Node(k, inst) for k, inst in enumerate(instances_)], settings.home / "ssh" / f"{run_id}.config")


class Strategy(Generic[R]):
    """What differs between the ways an attempt runs; the defaults are what most modes do. ``run``
    and ``collect`` are each mode's own. A strategy object serves one attempt (it keeps what its
    ``run`` learned for its ``collect``)."""

    places_mounts = True  # the task's file_mounts go on every node (a bake's image holds none)

    def opened(self, a: Attempt) -> None:
        """After every node answers, before the SSH config is written (a bake's driver install)."""

    def resume(self, a: Attempt) -> bool:
        """Whether the job resumes (EC2GPU_RESUME=1, the checkpoint directory pushed)."""
        return False

    def checkpoints_for(self, a: Attempt, nd: Node) -> DirCheckpoints | None:
        """The checkpoint directory pushed to node ``nd`` when the job resumes."""
        return None

    def setup(self, a: Attempt) -> None:
        """The "setup" phase after the upload: the task's setup on every node (skipped where the
        same text already ran: engine.setup_node), when the task has one."""
        if a.job.task.setup:
            with a.ui.phase("setup"):
                task_setup(a)

    def watched(self, a: Attempt) -> list[Node]:
        """The nodes whose agents watch this controller's heartbeat while there is a hand-over plan."""
        return a.nodes

    def run(self, a: Attempt) -> None:
        """Start the mode's work on the nodes and follow it to its end."""
        raise NotImplementedError

    def collect(self, a: Attempt) -> R:
        """Bring the results home and judge them; the attempt's result."""
        raise NotImplementedError

    def failed(self, a: Attempt, exc: Exception) -> R:
        """What an error from any step becomes (raised again by default; the nodes are closed after)."""
        raise exc


def drive(a: Attempt, strategy: Strategy[R], handover: Future[Handover | None] | Handover | None = None) -> R:
    """Run the attempt ``a`` through its lifecycle (this module's docstring) with ``strategy``;
    return what its ``collect`` (or on an error its ``failed``) returns. ``handover`` (its Future
    while runs/recover/handover.start makes it) is resolved once the setup is done. Whatever ends
    the attempt, its heartbeat stops, every node's connection closes and its SSH config goes.
    Raises what the steps raise (RemoteError, WaitTimeout, recovery.Interrupted, ...) as
    ``strategy.failed`` lets through."""
    beating = None
    try:
        with a.ui.phase("waiting for SSH"):
            N.parallel(lambda nd: N.open_node(nd, a.aws, a.settings, a.prov, a.run_id, a.backend, a.ui.note), a.nodes)
        strategy.opened(a)
        assert a.prov.key_path is not None  # open_node needed it: the run's key pair
        # written after the strategy's opening (a bake's reboots: a sandbox instance's sshd moves on one)
        sc.ssh_config_for(a.nodes, a.config, a.settings.ssh_user, a.prov.key_path, a.settings.home / "known_hosts")
        with a.ui.phase("setup"):
            N.parallel(lambda nd: N.prepare_node(nd, a.say(nd)), a.nodes)
        a.addresses = [a.backend.private_address(nd.instance) for nd in a.nodes]
        with a.ui.phase("upload"):
            upload(a, strategy)
        strategy.setup(a)
        a.plan = handover.result() if isinstance(handover, Future) else handover
        beating = heartbeat(a, strategy.watched(a))
        strategy.run(a)
        return strategy.collect(a)
    except Exception as exc:  # noqa: BLE001 - the strategy decides; by default raised again as it was
        return strategy.failed(a, exc)
    finally:
        if beating is not None:
            beating.stop()
        for nd in a.nodes:
            nd.close()
        a.config.unlink(missing_ok=True)


def upload(a: Attempt, strategy: Strategy[R]) -> None:
    """The workdir, the agent and the job's environment to every node (engine.upload_node), then
    the task's file_mounts (engine.mounts_node) where the strategy places them."""
    job = a.job
    N.parallel(lambda nd: engine.upload_node(nd, job, a.config, a.run_id, a.addresses, strategy.resume(a),
                                             strategy.checkpoints_for(a, nd), a.say(nd)), a.nodes)
    if strategy.places_mounts and job.mounts:
        N.parallel(lambda nd: engine.mounts_node(nd, job, a.config, a.say(nd)), a.nodes)


def task_setup(a: Attempt) -> None:
    """The task's setup on every node at once (engine.setup_node; nothing without one)."""
    if a.job.task.setup:
        N.parallel(lambda nd: engine.setup_node(nd, a.job, a.say(nd)), a.nodes)


def heartbeat(a: Attempt, watched: list[Node]) -> Heartbeat | None:
    """While there is a hand-over plan: this controller's mark on ``watched`` now, and a
    Heartbeat that renews it (runs/recover/handover.py); None otherwise."""
    if a.plan is None or not watched:
        return None
    from ..recover.handover import Heartbeat
    mark(watched, "controller")
    return Heartbeat(lambda: mark(watched, "controller"), a.plan.wait_s).start()


def mark(nodes: list[Node], what: str) -> None:
    """The controller's mark ``what`` ("controller": its heartbeat; "collected":
    runs/recover/handover.py) in each node's run directory, so its agent does not hand over what
    this controller brings home. A node that does not answer is passed over (its agent may then
    hand over: a copy in S3, nothing lost)."""
    from ...remote import jobs, ssh
    from ..recover import handover as H
    for nd in nodes:
        if nd.conn is None:
            continue
        try:
            ssh.execute(nd.conn, H.mark_command(nd.run_dir, what))
        except (RemoteError, *jobs.CONNECTION_ERRORS):
            pass
