"""The instance-side limit of a run (``--max-runtime``): how long its instances may live, and why.

Every instance `ec2gpu run` launches ends itself after its limit (user data's ``shutdown -h +M``,
aws/instances.user_data), so a controller that died or lost its network never leaves a GPU
running. A limit nobody chose must never cut a job short without warning, so it is picked like this
(``for_task``), and said before launch with the most the run can cost:

1. ``--max-runtime`` (minutes, ``90m``, ``2h``; ``none`` removes it), else the task's ``max_runtime``;
2. else, once the task has run, HISTORY_FACTOR times its longest completed run (ledger), at least
   MIN_MINUTES;
3. else (a task never run before) FIRST_RUN_MINUTES: long, because nothing says how long it takes.

With no limit (``none``) a run's instances get an idle rule instead (NO_LIMIT_IDLE): a forgotten
instance with no job, no SSH connection and no busy GPU ends itself after that long.

Before the limit the agent gives the job SIGTERM and a grace period to checkpoint (``stop_at``;
agent/agent.py ``--limit-at``), early enough for its outputs to come home before the instance's
shutdown closes logins (NOLOGIN_SECONDS), and the run then says that the limit ended it and how to
raise it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import math
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from ...tasks.spec import max_runtime
from ...tasks.spec import OFF_WORDS as OFF_WORDS  # re-exported: the words that remove the limit
from ..settle import ledger

if TYPE_CHECKING:
    from ...aws.instances import Instance

FIRST_RUN_MINUTES = 24 * 60  # a task with no history: a day, said before launch with its cost
HISTORY_FACTOR = 3  # a task with history: three times its longest completed run ...
MIN_MINUTES = 60  # ... and never less than an hour
DEFAULT_GRACE_SECONDS = 120  # SIGTERM this long before the limit (EC2GPU_LIMIT_GRACE_SECONDS)
#: systemd's shutdown(8): "If the time argument is used, 5 minutes before the system goes down the
#: /run/nologin file is created to ensure that further logins shall not be allowed", and pam_nologin
#: then refuses every user but root: outputs come home over a new SSH connection (rsync), so the job
#: is stopped, and its grace over, this long before the instance's end
NOLOGIN_SECONDS = 300
NO_LIMIT_IDLE_SECONDS = 30 * 60  # --max-runtime none: the instance ends itself after 30 min idle


@dataclass(frozen=True)
class Limit:
    """A run's limit: ``minutes`` after launch its instances end themselves (None: no limit), and
    ``source``, where that figure comes from (said to the user)."""

    minutes: int | None
    source: str

    def words(self) -> str:
        """'24 h' / '90 min' / 'no limit' (pure)."""
        if self.minutes is None:
            return "no limit"
        return f"{self.minutes // 60} h" if self.minutes % 60 == 0 and self.minutes >= 120 else f"{self.minutes} min"


def parse(value: str | float | None) -> tuple[bool, int | None]:
    """(given, minutes) of a ``--max-runtime`` or ``max_runtime`` value (pure): None -> (False,
    None); 'none'/'off'/'never' -> (True, None); 90, '90m', '2h' -> (True, 90 / 120), whole
    minutes, at least 1. Raises UsageError for anything else."""
    try:
        return max_runtime(value)
    except ValueError as exc:
        raise UsageError(f"--max-runtime {exc}", "e.g. --max-runtime 90m, 4h, or none (no limit)")


def longest_run(home: Path, task: str, backend: str) -> tuple[float, str] | None:
    """(seconds, run id) of the longest completed run with the history key ``task`` (runs/job.
    TaskJob.history_key; ledger.history_key) on ``backend`` in the ledger (the sum of its phases:
    launch to termination), or None when it has none."""
    found = [(sum(v for v in (r.get("phases") or {}).values() if isinstance(v, (int, float))), r.get("run_id") or "?")
             for r in ledger.runs(home, backend=backend, limit=500, tolerant=True)
             if ledger.history_key(r) == task and r.get("status") == "completed"]
    found = [f for f in found if f[0] > 0]
    return max(found) if found else None


def for_task(home: Path, task_name: str, backend: str, flag: str | float | None = None,
             task_value: str | float | None = None) -> Limit:
    """The limit of a run of ``task_name`` (its history key: runs/job.TaskJob.history_key, a
    command's with the command; module docstring): ``flag`` (--max-runtime), else
    ``task_value`` (the task's max_runtime), else from the ledger's history, else FIRST_RUN_MINUTES.
    Raises UsageError for a value ``parse`` refuses."""
    for value, where in ((flag, "--max-runtime"), (task_value, "the task's max_runtime")):
        given, minutes = parse(value)
        if given:
            return Limit(minutes, where)
    longest = longest_run(home, task_name, backend)
    if longest:
        seconds, run_id = longest
        minutes = max(MIN_MINUTES, math.ceil(HISTORY_FACTOR * seconds / 60))
        return Limit(minutes, f"{HISTORY_FACTOR} x the longest earlier run of task {task_name} "
                              f"({seconds / 60:.1f} min, {run_id})")
    return Limit(FIRST_RUN_MINUTES, f"task {task_name} has not run before: a long limit for its first run")


def grace_seconds(minutes: int, setting: float = DEFAULT_GRACE_SECONDS) -> float:
    """Seconds from the job's SIGTERM to its SIGKILL (pure): ``setting``, at most a quarter of the limit."""
    return max(0.0, min(float(setting), minutes * 60 / 4))


def lead_seconds(minutes: int, setting: float = DEFAULT_GRACE_SECONDS) -> float:
    """Seconds before the instance's end that the job gets SIGTERM (pure): its grace, then
    NOLOGIN_SECONDS, in which its outputs come home before the shutdown closes logins; at most
    half the limit."""
    return min(grace_seconds(minutes, setting) + NOLOGIN_SECONDS, minutes * 60 / 2)


def stop_at(instance: Instance | None, minutes: int | None, setting: float = DEFAULT_GRACE_SECONDS) -> float | None:
    """When the agent gives the job SIGTERM (POSIX seconds; None without a limit or an instance):
    the instance's LaunchTime plus ``minutes``, less ``lead_seconds``. User data's shutdown was
    scheduled a little after launch, so this is never later than the instance's own end."""
    if not minutes or instance is None:
        return None
    return instance.launched_at.timestamp() + minutes * 60 - lead_seconds(minutes, setting)


def schedule_shutdown_command(minutes: int) -> str:
    """The shell line that schedules the instance's shutdown in ``minutes`` (pure): as root, or
    through passwordless sudo (the DLAMI's ubuntu user has it), with the ``shutdown`` the login's
    PATH finds resolved first, since sudo's secure_path would find another (the sandbox's stand-in
    comes first on an instance's PATH there; on EC2 both are /usr/sbin/shutdown)."""
    return (f'cmd=$(command -v shutdown) && if [ "$(id -u)" = 0 ]; then "$cmd" -h +{int(minutes)} '
            f"'ec2gpu: max runtime reached'; else sudo -n \"$cmd\" -h +{int(minutes)} 'ec2gpu: max runtime reached'; fi")
