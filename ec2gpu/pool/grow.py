"""A replacement worker for a pool that lost one while work remains (issue 31, item 4), and the
pool's growth (item 3: it "grows as capacity comes").

A pool's first launch asks EC2 for up to ``--workers`` instances with MinCount 1
(runs/provision/resources.py): where a type is short, EC2 launches as many as it can, and the pool
starts with those. While more elements wait than its instances have free slots, the controller
launches one more at a time, as for a replacement (``lost`` None), until the pool has its size;
a launch that fails (no capacity on the whole list of types and zones) is asked again a minute
later (pool/follow.GROW_RETRY_S), and none once nothing waits.

When a worker is lost (EC2 says it is no longer running, or its Ray ended) and elements still
wait, the controller (pool/follow.follow) starts one ``Replacement``: in a thread of its own, so
that the live line, the shrinking and the results coming home go on meanwhile, it launches one
instance into the run's security group and key pair (runs/provision/resources.provision, the
same types, market and zones, the lost worker's zone last), tags it as the pool's next node, adds
it to the run's attempts (so it is billed and torn down with the run), opens it (host key
checked), sets it up, sends the workdir (and its copy of the task's file_mounts), installs this
machine's Ray version and starts Ray as a worker that joins the head with the pool's Ray token
(the attempt's ``join``: pool/ray_nodes.join_ray).
Ray schedules waiting elements on it as soon as it joins. The
controller takes the ready node at its next poll; from then on it is a member like any other
(released once nothing waits, watched for loss).

At most one replacement is made at a time, one per worker lost, and never more members than the
pool's size. When the array ends (or the attempt fails) while a replacement is being made, it
stops at its next step; an instance it launched is one of the run's and ends with them.
"""
from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from ..aws import instances
from ..remote import ssh_config
from ..runs.execute import engine
from ..runs.execute import nodes as run_nodes
from ..runs.provision import resources
from ..runs.recover import recovery

if TYPE_CHECKING:
    from ..aws.session import Aws
    from ..backend import Backend
    from ..runs.job import TaskJob
    from ..runs.execute.nodes import Node
    from ..runs.execute.reporter import ReporterLike
    from ..runs.options import PoolOptions
    from ..runs.job import Provisioned
    from ..settings import Settings


class Stopped(Exception):
    """The array ended while its replacement was being made: it goes no further."""


class _Aside:
    """A ReporterLike for the replacement's thread: its notes prefixed on the user's terminal, no
    phases of its own (the run is in its "running" phase), no progress."""

    def __init__(self, ui: ReporterLike, prefix: str):
        self.ui, self.prefix = ui, prefix
        self.phases: dict[str, float] = {}
        self.notes: list[str] = []

    def phase(self, name: str) -> ContextManager[Any]:
        return nullcontext()

    def log(self, line: str) -> None:
        self.ui.log(line)

    def progress(self, p: dict[str, Any]) -> None:
        pass

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.ui.note(f"{self.prefix}{text}")


@dataclass
class Context:
    """What a replacement needs of the attempt that makes it."""

    aws: Aws
    settings: Settings
    opts: PoolOptions
    run_id: str
    prov: Provisioned
    backend: Backend
    job: TaskJob
    attempt: int  # the run's attempt number (the ledger's attempt rows)
    attempts: list[dict[str, Any]]  # the run record's attempt rows: the replacement's is added
    ssh_config: Any  # Path of the run's SSH config (rsync's), rewritten with the new node
    join: Callable[[Node, str, Callable[[str], None]], None]  # (node, its address, log): Ray up there, joined


@dataclass
class Replacement:
    """One replacement being made for the worker ``lost`` (an instance id; None: an instance the
    pool grows by, one it never had), as node ``index``; ``node`` once its Ray has joined,
    ``error`` (the exception's type and words) when it failed."""

    lost: str | None
    index: int
    instance_id: str | None = None
    node: Node | None = None
    address: str | None = None  # the node's private address (Ray's --node-ip-address)
    error: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    pending: Node | None = None  # the node being set up (its connection closed by ``halt``)

    def halt(self) -> None:
        """Stop it: at its next step, or at once where it waits on its node's SSH connection
        (closed here: what it runs there fails, and the thread ends)."""
        self.stop.set()
        nd = self.pending
        if nd is not None:
            nd.close()

    @property
    def over(self) -> bool:
        return self.thread is not None and self.thread.ident is not None and not self.thread.is_alive()

    def as_dict(self) -> dict[str, Any]:
        return {"for": self.lost, "instance_id": self.instance_id, "node": self.index,
                "joined": self.node is not None, "error": self.error}


def start(ctx: Context, lost: str | None, lost_zone: str | None, index: int, addresses: list[str],
          ui: ReporterLike) -> Replacement:
    """Start making a replacement for the worker ``lost`` (None: one more instance for a pool
    below its size, which launched fewer than it asked for) as node ``index`` (a number no node or
    earlier replacement of the pool had; ``addresses``: the private addresses of the pool's nodes,
    head first, for the new node's SKYPILOT_NODE_IPS). Returns at once;
    ``Replacement.over`` says when it is done, ``Replacement.halt`` stops it."""
    rep = Replacement(lost, index)
    aside = _Aside(ui, f"replacement for {lost}: " if lost else f"node {index}: ")

    def run() -> None:
        try:
            rep.node = _make(ctx, rep, lost_zone, list(addresses), aside)
        except Stopped:
            rep.error = "stopped: the array ended first"
        except BaseException as exc:  # noqa: BLE001 - said on the terminal and kept in the record; the pool goes on
            rep.error = f"{type(exc).__name__}: {exc}"[:500]
        if rep.node is None and rep.instance_id and rep.stop.is_set():
            _end(ctx, rep.instance_id)  # launched as the run was being torn down: it may have missed it

    rep.thread = threading.Thread(target=run, daemon=True, name=f"pool-replacement-{index}")
    rep.thread.start()
    return rep


def _end(ctx: Context, instance_id: str) -> None:
    try:
        instances.terminate(ctx.aws.ec2, [instance_id], wait=False)
    except Exception:  # noqa: BLE001 - its max runtime and idle rule end it; `ec2gpu cleanup` finds it by tag
        pass


def _make(ctx: Context, rep: Replacement, lost_zone: str | None, addresses: list[str], ui: _Aside) -> Node:
    def step() -> None:
        if rep.stop.is_set():
            raise Stopped()

    say: Callable[[str], None] = ui.note
    [inst] = resources.provision(ctx.aws, ctx.settings, replace(ctx.opts, nodes=1), ctx.run_id, ui, ctx.prov,
                                 avoid_zones=[lost_zone] if lost_zone else [])
    rep.instance_id = inst.id
    [inst] = instances.tag_nodes(ctx.aws.ec2, [inst], ctx.opts.name or f"ec2gpu-{ctx.run_id}", first_index=rep.index)
    ctx.attempts.append(recovery.attempt_row(ctx.attempt, inst, rep.index))
    step()
    nd = rep.pending = run_nodes.Node(rep.index, inst)
    run_nodes.open_node(nd, ctx.aws, ctx.settings, ctx.prov, ctx.run_id, ctx.backend, say)
    step()
    assert ctx.prov.key_path is not None
    # an SSH config of its own (rsync's, for this node alone): the pool's stays the main thread's
    config = ssh_config.ssh_config_for([nd], Path(ctx.ssh_config).with_name(f"{ctx.run_id}-node-{rep.index}.config"),
                                       ctx.settings.ssh_user, ctx.prov.key_path, ctx.settings.home / "known_hosts")
    try:
        run_nodes.prepare_node(nd, say)
        step()
        address = ctx.backend.private_address(nd.instance)
        engine.upload_node(nd, ctx.job, config, ctx.run_id, [*addresses, address], False, None, say,
                           rank=len(addresses))  # its index may be past the list (a failed one's skipped)
        if ctx.job.mounts:  # its copy of the task's file_mounts, as the others got theirs
            engine.mounts_node(nd, ctx.job, config, say)
        step()
        if ctx.job.task.setup:
            engine.setup_node(nd, ctx.job, say)
            step()
        ctx.join(nd, address, say)
        step()
    finally:
        config.unlink(missing_ok=True)
    rep.address = address
    return nd
