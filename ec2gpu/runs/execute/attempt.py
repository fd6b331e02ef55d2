"""One attempt, whatever it runs: the lifecycle every way of running a job shares, written once
(``drive``), with a strategy that supplies only what differs (issue 45, item 2).

  open -> prepare -> upload -> setup -> [hand-over heartbeat] -> run (start, follow) -> collect,
  and close on every exit path (an error from any step goes to the strategy's ``failed`` first)

``Lifecycle[A, R]`` names the steps, each a no-op by default but ``run`` and ``collect``: ``A`` is
what the mode's attempt holds, ``R`` what its ``collect`` returns. ``Strategy[R]`` is the lifecycle
of an attempt on instances (``Attempt``: its nodes over SSH), with the steps those modes share:

  open: every node over SSH, host key checked -> [strategy.opened] -> the run's SSH config (one
  entry per node: remote/ssh_config.ssh_config_for); prepare: machine setup, the nodes' private
  addresses; upload: workdir, then file_mounts; setup: the task's setup (and what the mode adds);
  heartbeat: while there is a hand-over plan (runs/recover/handover.py); close: the heartbeat
  stopped, connections closed, the SSH config removed.

Which steps each mode supplies ("shared": Strategy's; "-": the step does not exist in that mode):

  mode: strategy                                  open    prepare  upload  setup   heartbeat  run  collect  close
  ----------------------------------------------  ------  -------  ------  ------  ---------  ---  -------  ------
  agent job: execute/foreground.ForegroundJob     opened  shared   shared  shared  shared     own  own      shared
  Ray driver: pool/attempt.PoolDriver             shared  shared   shared  own     watched    own  own      shared
  image bake: provision/bake.ImageBake            opened  shared   shared  own     watched    own  own      shared
  detached hand-off: detached/launch.DetachedJob  -       own      own     -       -          own  own      own
  local: provision/local.LocalRun                 -       own      -       -       -          own  own      own

("opened": Strategy's open with the mode's ``opened`` hook; "watched": Strategy's heartbeat on the
nodes the mode names.) Each step on every node goes through ``on_nodes``: a node whose step fails
while EC2 says its instance is gone (a spot reclaim in the machine setup, the upload, ...) is a
recovery.Loss, and the strategy's ``lost`` decides (recovery.after_loss): Strategy's ends the
attempt as Interrupted, which the run's recovery relaunches; PoolDriver's drops a lost worker and
the pool goes on (issue 51, item 10). ``failed`` raises the error again, but in ForegroundJob and PoolDriver,
where a lost instance explains it (recovery.Interrupted). The agent job is `ec2gpu run`, `exec` and `train mnist`; the pool plugs
PoolDriver in (runs/ never imports pool/); the bake makes an image of the builder instead of a job.
The detached hand-off checks and writes the run's spec (prepare), puts the workdir, the agent and
the spec in the run store (upload), makes the role, secrets, network and the Auto Scaling group
that hands the run to the instance's agent (run: the agent sets up, starts and follows the job
there), and returns the run's record (collect); its close removes what was made when the hand-off
did not complete. `--local` writes the job's environment (prepare), starts the agent on this
machine and follows its log (run: the workdir is used where it is, nothing is uploaded), reads the
agent's record and the job's summary (collect), and removes the environment file (close). The
steps of an attempt on instances are timed by the reporter (``ui.phase``): "waiting for SSH",
"setup", "upload", then the strategy's own.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar, cast

from ...errors import RemoteError
from ...remote import jobs, ssh
from ...remote import ssh_config
from ..recover import handover as handing_over
from ..recover import recovery
from . import engine
from . import nodes as node_steps

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

A = TypeVar("A")
R = TypeVar("R")
T = TypeVar("T")


@dataclass
class Attempt:
    """One attempt on instances as every strategy sees it: the run's context, its nodes (node 0
    first), the run's SSH config (rsync's and the tunnels'), the nodes' private addresses (once
    prepared) and the hand-over plan (None without one)."""

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

    def drop(self, instance_ids: set[str]) -> list[Node]:
        """Take the nodes of ``instance_ids`` out of the attempt (a pool's lost workers: the
        later steps run on the others), with their private addresses once known; return them."""
        keep = [k for k, nd in enumerate(self.nodes) if nd.instance_id not in instance_ids]
        gone = [nd for nd in self.nodes if nd.instance_id in instance_ids]
        if len(self.addresses) == len(self.nodes):
            self.addresses[:] = [self.addresses[k] for k in keep]
        self.nodes[:] = [self.nodes[k] for k in keep]
        return gone

    def say(self, nd: Node) -> Callable[[str], None]:
        """Where node ``nd``'s lines go: ``node K: line`` on a cluster, the line alone on one node."""
        ui = self.ui
        return (lambda line: ui.note(f"node {nd.index}: {line}")) if len(self.nodes) > 1 else ui.note


def new(aws: Aws, settings: Settings, run_id: str, ui: ReporterLike, prov: Provisioned, backend: Backend,
        job: TaskJob, instances_: list[Instance], local_out: Path, n: int) -> Attempt:
    """The attempt of ``job`` on ``instances_`` (node 0 first): a Node each, and the run's SSH
    config path, $EC2GPU_HOME/ssh/<run id>.config (written once the nodes answer)."""
    return Attempt(aws, settings, run_id, ui, prov, backend, job, local_out, n,
                   [node_steps.Node(k, inst) for k, inst in enumerate(instances_)],
                   settings.home / "ssh" / f"{run_id}.config")


class Lifecycle(Generic[A, R]):
    """The steps of one attempt, in ``drive``'s order: what a mode supplies. Each is a no-op here
    (a step that does not exist in the mode) but ``run`` and ``collect``, which every mode has. A
    lifecycle object serves one attempt (it keeps what its ``run`` learned for its ``collect``)."""

    def open(self, a: A) -> None:
        """Reach where the job runs."""

    def prepare(self, a: A) -> None:
        """Make it ready for the job (machine setup; a hand-off's spec)."""

    def upload(self, a: A) -> None:
        """Send the workdir, the agent and the file_mounts where the job runs."""

    def setup(self, a: A) -> None:
        """The task's setup, and what the mode adds."""

    def heartbeat(self, a: A, handover: Future[Handover | None] | Handover | None) -> Heartbeat | None:
        """After the setup: the hand-over plan taken and this controller's heartbeat started where
        an agent watches it; None (nothing to stop at the close) where nothing does."""
        return None

    def run(self, a: A) -> None:
        """Start the mode's work and follow it as far as this controller does."""
        raise NotImplementedError

    def collect(self, a: A) -> R:
        """Bring the results home and judge them; the attempt's result."""
        raise NotImplementedError

    def failed(self, a: A, exc: Exception) -> R:
        """What an error from any step becomes (raised again by default; ``close`` runs after)."""
        raise exc

    def close(self, a: A) -> None:
        """Release what the attempt holds, on every exit path (an error, Ctrl-C, the end)."""


class Strategy(Lifecycle[Attempt, R]):
    """An attempt on instances: the steps those modes share (this module's docstring); a mode
    supplies ``run`` and ``collect``, and changes the hooks below where it differs."""

    places_mounts = True  # the task's file_mounts go on every node (a bake's image holds none)

    def open(self, a: Attempt) -> None:
        """Every node over SSH (host key checked), the strategy's ``opened``, then the run's SSH config."""
        with a.ui.phase("waiting for SSH"):
            on_nodes(a, "wait for SSH", lambda nd: node_steps.open_node(nd, a.aws, a.settings, a.prov, a.run_id,
                                                                        a.backend, a.ui.note), self)
        self.opened(a)
        assert a.prov.key_path is not None  # open_node needed it: the run's key pair
        # written after the strategy's opening (a bake's reboots: a sandbox instance's sshd moves on one)
        ssh_config.ssh_config_for(a.nodes, a.config, a.settings.ssh_user, a.prov.key_path,
                                  a.settings.home / "known_hosts")

    def opened(self, a: Attempt) -> None:
        """After every node answers, before the SSH config is written (a bake's driver install)."""

    def prepare(self, a: Attempt) -> None:
        """The machine setup on every node (the "setup" phase), then the nodes' private addresses."""
        with a.ui.phase("setup"):
            on_nodes(a, "machine setup", lambda nd: node_steps.prepare_node(nd, a.say(nd)), self)
        a.addresses = [a.backend.private_address(nd.instance) for nd in a.nodes]

    def upload(self, a: Attempt) -> None:
        with a.ui.phase("upload"):
            upload(a, self)

    def resume(self, a: Attempt) -> bool:
        """Whether the job resumes (EC2GPU_RESUME=1, the checkpoint directory pushed)."""
        return False

    def checkpoints_for(self, a: Attempt, nd: Node) -> DirCheckpoints | None:
        """The checkpoint directory pushed to node ``nd`` when the job resumes."""
        return None

    def setup(self, a: Attempt) -> None:
        """The "task setup" phase after the upload (the machine's is "setup", in prepare): the task's
        setup on every node (skipped where the same text already ran: engine.setup_node), when the
        task has one."""
        if a.job.task.setup:
            with a.ui.phase("task setup"):
                task_setup(a, self)

    def heartbeat(self, a: Attempt, handover: Future[Handover | None] | Handover | None) -> Heartbeat | None:
        """The hand-over plan (``handover``'s Future resolved now that the setup is done) and, with
        one, this controller's heartbeat on the nodes ``watched`` names."""
        a.plan = handover.result() if isinstance(handover, Future) else handover
        return heartbeat(a, self.watched(a))

    def watched(self, a: Attempt) -> list[Node]:
        """The nodes whose agents watch this controller's heartbeat while there is a hand-over plan."""
        return a.nodes

    def lost(self, a: Attempt, losses: list[recovery.Loss]) -> None:
        """Nodes lost in a step on every node (``on_nodes``): recovery.after_loss decides; here
        (a run's node, any of a several-node run's, a bake's builder) it is RELAUNCH, so the attempt
        ends as recovery.Interrupted, which the run's recovery launches again
        (runs/provision/pipeline.py). PoolDriver drops a lost worker instead."""
        raise recovery.interrupted_by(losses)

    def close(self, a: Attempt) -> None:
        """Every node's connection closed and the run's SSH config removed."""
        for nd in a.nodes:
            nd.close()
        a.config.unlink(missing_ok=True)


def drive(a: A, strategy: Lifecycle[A, R], handover: Future[Handover | None] | Handover | None = None) -> R:
    """Run the attempt ``a`` through its lifecycle (this module's docstring) with ``strategy``;
    return what its ``collect`` (or on an error its ``failed``) returns. ``handover`` (its Future
    while runs/recover/handover.start makes it) is given to the strategy's heartbeat once the setup
    is done. Whatever ends the attempt, its heartbeat stops and the strategy's ``close`` runs (on an
    attempt on instances: every node's connection closes and its SSH config goes). Raises what the
    steps raise (RemoteError, WaitTimeout, recovery.Interrupted, UsageError, ...) as
    ``strategy.failed`` lets through."""
    beating = None
    try:
        strategy.open(a)
        strategy.prepare(a)
        strategy.upload(a)
        strategy.setup(a)
        beating = strategy.heartbeat(a, handover)
        strategy.run(a)
        return strategy.collect(a)
    except Exception as exc:  # noqa: BLE001 - the strategy decides; by default raised again as it was
        return strategy.failed(a, exc)
    finally:
        if beating is not None:
            beating.stop()
        strategy.close(a)


def upload(a: Attempt, strategy: Strategy[R]) -> None:
    """The workdir, the agent and the job's environment to every node (engine.upload_node), then
    the task's file_mounts (engine.mounts_node) where the strategy places them; a node lost
    meanwhile goes to ``strategy.lost`` (on_nodes)."""
    job = a.job
    rank = {nd.index: k for k, nd in enumerate(a.nodes)}  # its place in a.addresses: a pool may have dropped one
    on_nodes(a, "upload", lambda nd: engine.upload_node(nd, job, a.config, a.run_id, a.addresses, strategy.resume(a),
                                                        strategy.checkpoints_for(a, nd), a.say(nd),
                                                        rank=rank[nd.index]), strategy)
    if strategy.places_mounts and job.mounts:
        on_nodes(a, "file_mounts", lambda nd: engine.mounts_node(nd, job, a.config, a.say(nd)), strategy)


def task_setup(a: Attempt, strategy: Strategy[Any] | None = None) -> None:
    """The task's setup on every node at once (engine.setup_node; nothing without one); a node
    lost meanwhile goes to ``strategy.lost`` (on_nodes; None: Strategy's, the attempt relaunched)."""
    if a.job.task.setup:
        on_nodes(a, "task setup", lambda nd: engine.setup_node(nd, a.job, a.say(nd)), strategy)


def on_nodes(a: Attempt, phase: str, fn: Callable[[Node], T], strategy: Strategy[Any] | None = None,
             nodes: list[Node] | None = None) -> dict[int, T]:
    """``fn(node)`` on every node of the attempt (or of ``nodes``) at once, in the step ``phase``
    (the words a Loss gives: "machine setup", "upload", ...); return {node index: its result} for
    the nodes whose step succeeded. A node whose step failed and whose instance EC2 says is gone
    (recovery.lost: the node's watch asked, for a few seconds after a dropped connection) is a
    recovery.Loss; with any, ``strategy.lost(a, losses)`` decides (Strategy's by default: raises
    recovery.Interrupted) after every node's step has ended. Raises the first other failure as it
    was (a setup that failed on a running instance fails the run, whatever was lost beside it).
    While the steps run, EC2 is asked about the nodes still in theirs every
    recovery.STATE_EVERY_S (one DescribeInstances), and a gone one's connection is closed, so its
    step ends now (nodes.each)."""
    def gone(busy: list[Node]) -> list[Node]:
        watched = [nd for nd in busy if nd.watch is not None]
        found = recovery.gone_now(watched[0].watch.ec2, [nd.instance_id for nd in watched]) if watched else {}
        return [nd for nd in watched if nd.instance_id in found]
    outcomes = node_steps.each(fn, list(a.nodes if nodes is None else nodes), gone, recovery.STATE_EVERY_S)
    raised = {nd.index: exc for nd, _, exc in outcomes if exc is not None}
    failed = [nd for nd, _, exc in outcomes if exc is not None]
    why = node_steps.parallel(lambda nd: recovery.lost(nd.watch, raised[nd.index]), failed)
    errors = [raised[nd.index] for nd, gone in zip(failed, why, strict=True) if gone is None]
    if errors:
        raise errors[0]
    losses = [recovery.Loss(nd.index, nd.instance_id, phase, gone.reason)
              for nd, gone in zip(failed, why, strict=True) if gone is not None]
    if losses:
        (strategy or Strategy()).lost(a, losses)
    return {nd.index: cast(T, got) for nd, got, exc in outcomes if exc is None}


def heartbeat(a: Attempt, watched: list[Node]) -> Heartbeat | None:
    """While there is a hand-over plan: this controller's mark on ``watched`` now, and a
    Heartbeat that renews it and the head's hand-over URLs before they stop working
    (runs/recover/handover.py: Renewal); None otherwise."""
    if a.plan is None or not watched:
        return None
    mark(watched, "controller")
    head = a.nodes[0]  # the node whose agent holds the URLs (Handover.document)
    renewal = handing_over.Renewal(a.aws, a.plan, lambda doc: ssh.with_input(
        head.conn, handing_over.urls_command(head.run_dir), doc), a.ui.note)
    return handing_over.Heartbeat(lambda: mark(watched, "controller"), a.plan.wait_s, renewal.renew).start()


def mark(nodes: list[Node], what: str) -> None:
    """The controller's mark ``what`` ("controller": its heartbeat; "collected":
    runs/recover/handover.py) in each node's run directory, so its agent does not hand over what
    this controller brings home. A node that does not answer is passed over (its agent may then
    hand over: a copy in S3, nothing lost)."""
    for nd in nodes:
        if nd.conn is None:
            continue
        try:
            ssh.execute(nd.conn, handing_over.mark_command(nd.run_dir, what))
        except (RemoteError, *jobs.CONNECTION_ERRORS):
            pass
