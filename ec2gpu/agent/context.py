"""What one launch of a detached run's agent works with on its instance: its AWS clients, clock,
log, places and pace. One object that every part of the agent (store.Lease, mirror.Uploads,
attempt.Job, members.Members, several.Several) reads at the time it needs a value, so that each is
given (or, in a test, replaced) in one place. Standard library only: shipped beside detached.py.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Context:
    """``store``: the run's prefix in S3 (store.Store); ``asg``, ``ssm``: boto3 clients;
    ``s3_for``: a file_mounts bucket's region -> an S3 client there; ``clock``: POSIX seconds;
    ``imds``: a metadata path -> its text or None; ``gpus``: -> this instance's GPU count;
    ``home``: the job's HOME; ``run_dir``: HOME/ec2gpu/runs/RUN_ID (remote/jobs.run_dir's);
    ``secrets``: name -> value, read at this launch (prepare.read_secrets), never written anywhere.
    Seconds: ``every_s`` between uploads of the log and checkpoints (and the heartbeat), ``poll_s``
    between looks at the cancel object (and, several nodes, the generation), ``agent_poll_s``
    agent.py's metadata polls and the looks at its record (a spot notice is acted on within
    2 x agent_poll_s), ``stop_grace_s`` from SIGTERM to SIGKILL, ``settled_s`` a MOUNT-mode
    file_mounts file unchanged this long is written back while the job runs (checkpoints are sent
    from consistent copies instead: mirror.consistent_copy), ``stale_s`` a node record older than
    this is a node gone (agent/gang.py)."""

    store: Any
    asg: Any
    home: str
    imds: Callable[[str], str | None]
    imds_endpoint: str
    gpus: Callable[[], int]
    ssm: Any = None
    s3_for: Callable[[str], Any] | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    log: Callable[[str], None] = _say
    every_s: float = 60.0
    poll_s: float = 5.0
    agent_poll_s: float = 2.0  # agent.SPOT_POLL_S
    stop_grace_s: float = 90.0
    settled_s: float = 5.0
    stale_s: float = 120.0
    secrets: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return str(self.store.run_id)

    @property
    def run_dir(self) -> str:
        return os.path.join(self.home, "ec2gpu", "runs", self.run_id)

    def s3_in(self, region: str) -> Any:
        """An S3 client for a file_mounts bucket in ``region`` (the run store's own without ``s3_for``)."""
        return self.s3_for(region) if self.s3_for else self.store.s3


#: this process's exit codes (detached.main): the run ended (its group too), or
EXIT_ENDED = 0
EXIT_REFUSED = 2  # bad arguments or spec
EXIT_INTERRUPTED = 75  # the instance is going away: the group replaces it
EXIT_SUPERSEDED = 76  # a later launch owns the run
