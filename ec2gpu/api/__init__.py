"""The Python API: one function per `ec2gpu` command, each returning data (docs/api.md).

    import ec2gpu
    result = ec2gpu.run("examples/quickstart/task.yaml", sandbox=True, expect="1m")
    print(result.status, result.cost_usd, result.summary)

``run`` and ``train_mnist`` take a task and a typed options object, RunFlags (``train_mnist`` also a
Trainer); their keyword arguments are a convenience that sets RunFlags' fields of the same names.
Every command returns a frozen record (RunResult, RunStatus, BenchResult in api/run_results.py; the
others beside their functions: InstanceRow, PriceList, RunList, ...; ``to_json()``: what ``--json``
prints); a dry run returns the RunPlan.

The CLI (ec2gpu/cli/) only parses flags, calls these and renders what they return. Every function
raises the ec2gpu.errors tree (UsageError for bad input before anything is created; NoCredentials;
AwsError, CapacityError, RemoteError for a failed job (its outputs still come home), WaitTimeout).
Each takes ``region`` and ``sandbox`` (the local sandbox instead of AWS; also EC2GPU_SANDBOX=1)
where it reaches AWS, and ``log(text)`` (and ``warn``) for what it says on the way; a long one a
``reporter``: a runs.execute.reporter.ReporterLike (``phase(name)`` context, ``log(line)`` of the job's log,
``progress(dict)``, ``note(text)``), by default a silent runs.execute.reporter.Reporter that records them.
Modules, as cli/'s: tasks (run, exec, bake; a detached run's status and cancel), train (train
mnist, bench), instances (standing instances and clusters), access (reaching an instance), costs
(prices, estimates, the ledger), images (baked images), sandbox (the local stand-in for AWS).
COMMANDS maps each command to its function.
"""
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what mypy and readers see; at run time each name is imported on first use (__getattr__)
    from .access import Fetched, LogShown, Notebook, SshConfig, Tunnel, fetch, logs, notebook, ssh, ssh_config, tunnel
    from .costs import CostEstimates, PriceList, RemoteRunList, RunList, estimate, list_runs, prices, show_run
    from .images import ImageRow, RemovedImage, list_images, remove_image
    from .instances import (Cleanup, InstanceRow, InstanceSummary, Scaled, StoppedInstance, cleanup, doctor, down, idle_rule,
                            launch, list_instances, scale, start, stop)
    from .sandbox import (CapacityLimits, Interruption, SandboxState, sandbox_capacity, sandbox_down, sandbox_env,
                          sandbox_interrupt, sandbox_status, sandbox_up)
    from ..runs.plan.runplan import RunFlags, RunPlan, Trainer
    from .run_results import BenchResult, RunResult, RunStatus
    from .tasks import bake, cancel, exec, load_task, run, status  # noqa: A004 - `exec` is the command's name
    from .train import bench, train_mnist

#: where each public name lives: a module is imported when one of its names is first used, so that
#: `ec2gpu run --dry-run` (api.run) loads neither boto3 nor paramiko (tests/unit/test_dry_run.py), as a
#: plain import of every module here would (api/instances, api/access reach AWS and SSH)
_HOMES = {
    ".access": ("Fetched", "LogShown", "Notebook", "SshConfig", "Tunnel", "fetch", "logs", "notebook", "ssh",
                "ssh_config", "tunnel"),
    ".costs": ("CostEstimates", "PriceList", "RemoteRunList", "RunList", "estimate", "list_runs", "prices", "show_run"),
    ".images": ("ImageRow", "RemovedImage", "list_images", "remove_image"),
    ".instances": ("Cleanup", "InstanceRow", "InstanceSummary", "Scaled", "StoppedInstance", "cleanup", "doctor",
                   "down", "idle_rule", "launch", "list_instances", "scale", "start", "stop"),
    ".sandbox": ("CapacityLimits", "Interruption", "SandboxState", "sandbox_capacity", "sandbox_down", "sandbox_env",
                 "sandbox_interrupt", "sandbox_status", "sandbox_up"),
    "..runs.plan.runplan": ("RunFlags", "RunPlan", "Trainer"),
    ".run_results": ("BenchResult", "RunResult", "RunStatus"),
    ".tasks": ("bake", "cancel", "exec", "load_task", "run", "status"),
    ".train": ("bench", "train_mnist"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:  # Any: whichever API function or record ``name`` is
    """The public name ``name``, its module imported now (PEP 562). Raises AttributeError for another."""
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME_OF[name], __name__), name)
    globals()[name] = value  # once: the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME_OF))


#: The command each function does (docs/api.md is generated from this and the docstrings).
COMMANDS = {
    "run": "run", "status": "status", "cancel": "cancel", "exec": "exec", "train mnist": "train_mnist",
    "bench": "bench",
    "launch": "launch", "stop": "stop", "start": "start", "scale": "scale", "ls": "list_instances",
    "down": "down", "cleanup": "cleanup", "doctor": "doctor",
    "ssh": "ssh", "ssh-config": "ssh_config", "logs": "logs", "fetch": "fetch", "tunnel": "tunnel",
    "notebook": "notebook",
    "prices": "prices", "cost": "estimate", "runs": "list_runs", "runs show": "show_run",
    "image bake": "bake", "image ls": "list_images", "image rm": "remove_image",
    "sandbox up": "sandbox_up", "sandbox down": "sandbox_down", "sandbox status": "sandbox_status",
    "sandbox interrupt": "sandbox_interrupt", "sandbox capacity": "sandbox_capacity", "sandbox env": "sandbox_env",
}

__all__ = ["COMMANDS", "BenchResult", "CapacityLimits", "Cleanup", "CostEstimates", "Fetched", "ImageRow",
           "InstanceRow", "InstanceSummary", "Interruption", "LogShown", "Notebook", "PriceList", "RemoteRunList",
           "RemovedImage", "RunFlags", "RunList", "RunPlan", "RunResult", "RunStatus", "SandboxState", "Scaled",
           "SshConfig", "StoppedInstance", "Trainer", "Tunnel", "bake", "bench", "cancel", "cleanup", "doctor",
           "down", "estimate", "exec", "fetch", "idle_rule", "launch", "list_images", "list_instances", "list_runs",
           "load_task", "logs", "notebook", "prices", "remove_image", "run", "sandbox_capacity", "sandbox_down",
           "sandbox_env", "sandbox_interrupt", "sandbox_status", "sandbox_up", "scale", "show_run", "ssh",
           "ssh_config", "start", "status", "stop", "train_mnist", "tunnel"]
