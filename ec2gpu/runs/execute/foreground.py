"""The agent job as an attempt's strategy (runs/execute/attempt.py): the task started under the
instance agent on every node at once, its log followed live, its outputs home, the attempt judged
from the agents' status.json (runs/execute/engine.py has the steps: upload_node, setup_node,
start_agent, download, judge). For `ec2gpu run`, `ec2gpu exec` and `ec2gpu train mnist` alike.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ... import words
from ...errors import AwsError, RemoteError, WaitTimeout
from ...remote import jobs, tunnel
from . import engine, status
from . import attempt as lifecycle
from . import nodes as node_steps
from ..job_summary import mask_text

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...aws.session import Aws
    from ...backend import Backend
    from ...settings import Settings
    from ..options import RunOptions
    from ..job import Provisioned
    from ..recover.handover import Handover
    from ..recover.recovery import DirCheckpoints
    from ..job import TaskJob
    from .nodes import Node
    from .reporter import ReporterLike


def run_attempt(aws: Aws, settings: Settings, opts: RunOptions, run_id: str, ui: ReporterLike, prov: Provisioned,
                instances_: list[Instance], local_out: Path, backend: Backend, n: int,
                checkpoints: DirCheckpoints, handover: Future[Handover | None] | Handover | None = None,
                shutdown: bool = False) -> dict[str, Any]:
    """One attempt of the task ``opts.task`` (a TaskJob) on running instances (node 0 first);
    return the job's summary.json ({} when it wrote none).

    ``checkpoints`` (recovery.DirCheckpoints) brings node 0's checkpoint directory home while the
    job runs. ``handover`` (runs/recover/handover.py; its Future while it is being made) lets the
    agents hand the job's outputs over to S3 if this controller is lost, and with ``shutdown`` end
    their instances then. Raises recovery.Interrupted when a node is lost or gets a spot notice, RemoteError
    when the setup or the job fails (after its outputs came home), WaitTimeout when SSH never answers.
    """
    job = cast("TaskJob", opts.task)  # pipeline.run_job and standing/hosts.py set it before any attempt
    a = lifecycle.new(aws, settings, run_id, ui, prov, backend, job, instances_, local_out, n)
    return lifecycle.drive(a, ForegroundJob(opts, checkpoints, shutdown), handover)


class ForegroundJob(lifecycle.Strategy[dict[str, Any]]):
    """The task under the agent on every node, followed by this controller (the strategy of
    run_attempt)."""

    def __init__(self, opts: RunOptions, checkpoints: DirCheckpoints, shutdown: bool) -> None:
        self.opts, self.checkpoints, self.shutdown = opts, checkpoints, shutdown

    def opened(self, a: lifecycle.Attempt) -> None:
        a.nodes[0].watch.checkpoints = replace(self.checkpoints, remote=engine.checkpoint_remote(a.job,
                                                                                                 a.nodes[0].run_dir))

    def resume(self, a: lifecycle.Attempt) -> bool:
        return a.n > 1

    def checkpoints_for(self, a: lifecycle.Attempt, nd: Node) -> DirCheckpoints | None:
        # node 0's copy (its watch's) learns what it was given, so it is not brought home again
        return cast("DirCheckpoints", nd.watch.checkpoints) if nd.index == 0 else self.checkpoints

    def run(self, a: lifecycle.Attempt) -> None:
        """The job started under each node's agent (after the setup and all it left), its log
        followed (the task's ports forwarded meanwhile), each node's record read once it ended."""
        nodes, job, ui, plan = a.nodes, a.job, a.ui, a.plan
        if any(m.write_back for m in job.mounts):  # written through while the job runs, as SkyPilot's MOUNT
            for nd in nodes:
                nd.watch.write_back = engine._write_back_on(nd, a.say(nd))
        with ui.phase("running"):
            try:
                def start(nd: Node) -> None:  # the key and the hand-over's URLs go with it: after the setup and all it left
                    nd.pid = engine.start_agent(nd, engine.job_argv(nd, job, self.opts.max_runtime_minutes,
                                                                    a.settings.limit_grace_seconds, plan is not None),
                                                plan.document(nd.index == 0, self.shutdown, sorted(job.task.secrets))
                                                if plan else None)
                node_steps.parallel(start, nodes)
                ui.note(f"job started on {words.count(len(nodes), 'node')} under the agent"
                        + (f" (head {a.addresses[0]})" if len(nodes) > 1 else "") + "; its log follows")
                with tunnel.forwarding(a.config, nodes[0].instance_id, job.task.ports, ui.note,
                                       same_ports=same_ports_for(nodes[0].host, job.same_ports)):
                    node_steps.follow_all(nodes, ui, a.local_out, a.n, self.opts.unreachable_s,
                                          mask=(lambda line: mask_text(line, job.secret_values))
                                          if job.secret_values else None)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what the job wrote comes home before the teardown
                node_steps.records_home_on_interrupt(nodes, lambda line: mask_text(line, job.secret_values),
                                                     a.local_out, ui.note)
                raise
            for nd in nodes:  # AWS stopped answering about an instance: nothing more can be done on it
                if isinstance(nd.result, AwsError):
                    raise nd.result
            snapshot_statuses(nodes)
            for nd in nodes:  # the agent passed EC2's rebalance recommendation on to the job (docs/tasks.md)
                rebalance = (nd.status or {}).get("rebalance")
                if rebalance:
                    a.say(nd)(f"EC2 recommended a rebalance at {rebalance['notice_time']} (this spot "
                              "instance was at elevated risk of interruption); the job was told through "
                              "$EC2GPU_REBALANCE_FILE")

    def collect(self, a: lifecycle.Attempt) -> dict[str, Any]:
        """Outputs, checkpoints and records home (engine.download), then the verdict (engine.judge):
        the job's own failure is said before a part that could not come home."""
        brought, summary = None, None
        with a.ui.phase("download"):
            try:
                summary = engine.download(a.nodes, a.job, a.local_out, a.config, a.ui.note, a.settings.download_limits)
            except RemoteError as exc:  # a part could not come home: the job's own failure is said first
                brought = exc
            if a.plan is not None:
                lifecycle.mark(a.nodes, "collected")
        engine.judge(a.nodes, a.job)
        if brought is not None:
            raise brought
        return summary or {}

    def failed(self, a: lifecycle.Attempt, exc: Exception) -> dict[str, Any]:
        if isinstance(exc, (*jobs.CONNECTION_ERRORS, WaitTimeout, RemoteError)):
            for nd in a.nodes:
                if nd.watch:
                    nd.watch.check()  # a lost instance explains the failure: Interrupted
        raise exc


def same_ports_for(host: object, same_ports: tuple[int, ...]) -> tuple[int, ...]:
    """The ports forwarded to the same port here for a head at ``host`` (pure): ``same_ports``
    (--port), but none for an instance on this machine's loopback (the sandbox's 127.0.0.N), which
    shares this machine's ports: the same one would be taken twice."""
    return () if str(host).startswith("127.") else tuple(same_ports)


def snapshot_statuses(nodes: list[Node]) -> None:
    """Read each node's agent record once, now that its log has ended (``nd.status``,
    runs/execute/status.py: signature checked, fields validated); the verdict and the agent-record.json written
    at home use this copy, whatever the instance's file says later. Nodes whose follow ended
    without an exit status (lost, stopped by an error) keep None. Raises the connection's errors."""
    for nd in nodes:
        if isinstance(nd.result, int) and not isinstance(nd.result, bool):
            nd.status = status.read(nd.conn, nd.run_dir, nd.agent_key)


