"""Stop and start standing instances (`ec2gpu stop NAME`, `ec2gpu start NAME`): keep the disk, stop
paying for the GPU.

EC2 bills a stopped instance nothing for compute and its EBS volumes as usual
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html, "Stop and
start"). A started instance usually has a new public IP; it is found again by its tags, its host
key must be the one pinned for it before (pinned under its instance id, not an address:
remote/ssh.py), and `start` rewrites $EC2GPU_HOME/ssh_config with the new address. The `--max-runtime` shutdown that
user data scheduled does not survive a stop (the OS powers off; user data runs once per instance),
so `start` schedules it again over SSH from the instance's ec2gpu:max-runtime tag.

Spot instances cannot be stopped here: ec2gpu requests one-time spot instances, and EC2 stops only
spot instances of a persistent request
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/how-spot-instances-work.html).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ... import words
from ...aws import instances, network, sweep, tags, types
from ...aws.session import Aws
from ...errors import UsageError
from ...remote import ssh
from ...settings import Settings
from ..plan.limits import schedule_shutdown_command as schedule_shutdown_command  # re-exported; it lives with the run's limits
from ..execute.nodes import connect_verified
from . import hosts as standing

if TYPE_CHECKING:
    from ...aws.instances import Instance
    from ...backend import Backend

#: Minutes `start` gives an instance launched before the ec2gpu:max-runtime tag existed (the
#: `launch` default).
DEFAULT_MAX_RUNTIME_MINUTES = 120


def find(ec2: Any, name: str, states: list[str]) -> list[Instance]:
    """The tool's instances called ``name`` (Name, instance id, run id or cluster) in ``states``.
    Raises UsageError when there are none, naming the state they are in if they exist."""
    every = [i for i in sweep.find_instances(ec2) if tags.answers_to(i, name, (tags.NAME, tags.RUN, tags.CLUSTER))]
    found = [i for i in every if i.state in states]
    if not found:
        if every:
            now = sorted({i.state for i in every})
            hint = f"`ec2gpu start {name}` brings it back" if now == ["stopped"] else "see `ec2gpu ls`"
            raise UsageError(f"{name} is {', '.join(now)}, not {' or '.join(states)}", hint)
        raise UsageError(f"no instance named {name!r}", "see `ec2gpu ls`")
    return found


def refuse_spot(found: list[Instance], name: str) -> None:
    """Raise UsageError when any of ``found`` is a spot instance (module docstring)."""
    spot = [i.id for i in found if i.market == "spot"]
    if spot:
        raise UsageError(f"{name} is a spot instance ({', '.join(spot)}): EC2 stops only spot instances of a "
                         "persistent request, and ec2gpu's are one-time",
                         f"`ec2gpu down {name}` terminates it (its disk goes too; bring files home first with "
                         "`ec2gpu ssh` or scp)")


def stop(aws: Aws, name: str, log: Callable[[str], None] = lambda msg: None, timeout_s: float = 600) -> list[dict[str, Any]]:
    """Stop the on-demand standing instances called ``name`` and wait until they are stopped;
    return their summaries (aws/instances.summary) with ``instance_store_gb``: the GB of
    instance-store NVMe the stop erased (0: none; None: not known; aws/types.Facts). Raises
    UsageError (none running, or spot), WaitTimeout."""
    found = find(aws.ec2, name, ["running", "pending"])
    refuse_spot(found, name)
    ids = [i.id for i in found]
    log(f"stopping {', '.join(ids)}")
    instances.stop(aws.ec2, ids, timeout_s)
    rows = [instances.summary(i) for i in instances.describe_instances(aws.ec2, ids)]
    facts = types.describe(aws.ec2, [r["instance_type"] for r in rows], log)
    return [{**r, "instance_store_gb": getattr(facts.get(r["instance_type"]), "instance_store_gb", None)} for r in rows]


def start(aws: Aws, settings: Settings, backend: Backend, name: str, log: Callable[[str], None] = lambda msg: None,
          timeout_s: float = 600) -> list[dict[str, Any]]:
    """Start the stopped instances called ``name``, wait until they run and answer SSH with the
    host key pinned for them, schedule their --max-runtime shutdown again, and rewrite
    $EC2GPU_HOME/ssh_config (runs/standing/hosts.write_ssh_config: their new addresses); return their
    summaries. Raises UsageError (none stopped, or their private key is not here), WaitTimeout,
    RemoteError (a host key that is not the pinned one)."""
    found = find(aws.ec2, name, ["stopped"])
    ids = [i.id for i in found]
    key = network.require_private_key(settings.keys_dir, found[0].key_name or "")
    log(f"starting {', '.join(ids)}")
    started = instances.start(aws.ec2, ids, timeout_s)
    for inst in started:
        conn, host, port, _, _ = connect_verified(aws, settings, backend, inst, key, log)
        try:
            minutes = max_runtime_minutes(inst)
            ssh.run(conn, schedule_shutdown_command(minutes))
            ssh.run(conn, RESUME_IDLE_WATCH)
            log(f"{inst.id} answers SSH at {host}:{port}; {max_runtime_words(inst, minutes)}")
        finally:
            conn.close()
    path, entries, _ = standing.write_ssh_config(aws, settings, backend, log=log)
    log(f"wrote {path} ({words.count(len(entries), 'host')}) with the new address{'es' if len(started) > 1 else ''}")
    return [instances.summary(i) for i in started]


def max_runtime_words(instance: Instance, minutes: int) -> str:
    """What the --max-runtime shutdown scheduled again in ``minutes`` does to ``instance`` (pure):
    `launch --idle-stop` set InstanceInitiatedShutdownBehavior "stop" (aws/instances.run_request,
    kept in the ec2gpu:idle tag), so it stops that one; every other instance terminates."""
    rule = instances.parse_idle_tag(instance.tags.get(tags.IDLE))
    if rule is not None and rule.action == "stop":
        return f"it stops itself in {minutes} min (--max-runtime, scheduled again; its EBS disk is kept)"
    return f"it terminates itself in {minutes} min (--max-runtime, scheduled again)"


def max_runtime_minutes(instance: Instance) -> int:
    """The instance's --max-runtime in minutes, from its ec2gpu:max-runtime tag (pure); the launch
    default for an instance without it."""
    value = instance.tags.get(tags.MAX_RUNTIME, "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_RUNTIME_MINUTES


#: After a start: the idle watcher (ami/idle-watch.sh) comes back by itself on an instance (a
#: systemd service, enabled); where no systemd keeps it (the sandbox, EC2GPU_STATE_DIR set) it is
#: started again from the rule user data left. A no-op for an instance without an idle rule.
RESUME_IDLE_WATCH = (f'dir={instances.STATE_DIR}; if [ -n "${{EC2GPU_STATE_DIR:-}}" ] && [ -f "$dir/idle-rule" ] && '
                     '! pgrep -f "$dir/idle-watch.sh" >/dev/null; then read -r idle_s check_s <"$dir/idle-rule"; '
                     'nohup bash "$dir/idle-watch.sh" "$idle_s" "$check_s" >>"$dir/idle.log" 2>&1 </dev/null & fi')
