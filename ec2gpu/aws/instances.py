"""Instances: build the run_instances request (pure), wait, describe, terminate.

Sending the request, with zone and type fallback, is aws/capacity.py.

Waiters: https://boto3.amazonaws.com/v1/documentation/api/latest/guide/clients.html#waiters
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import botocore.exceptions

from ..errors import AwsError, WaitTimeout
from . import tags
# the idle rule is the ec2gpu:idle tag's value: its home is tags.py, light enough for a run's plan
from .tags import IdleRule as IdleRule, parse_idle_tag as parse_idle_tag
from .session import Client, error_code

_REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def _reason_time(reason: str) -> datetime | None:
    """The time in a StateTransitionReason such as "User initiated (2026-11-21 10:02:03 GMT)" (UTC)."""
    m = _REASON_TIME.search(reason)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc) if m else None


@dataclass(frozen=True)
class Instance:
    """One EC2 instance as ec2gpu uses it: what aws/ returns for a DescribeInstances or
    RunInstances entry (``Instance.of``), so nothing above aws/ indexes EC2's dicts.

    Fields (from the API's Instance structure, botocore's ec2 service model):
    ``id`` (InstanceId), ``type`` (InstanceType), ``state`` (State.Name: pending, running,
    stopping, stopped, shutting-down, terminated), ``market`` ("spot" when InstanceLifecycle is
    spot, else "on-demand"), ``zone`` (Placement.AvailabilityZone), ``placement_group``
    (Placement.GroupName), ``public_ip``/``private_ip``, ``key_name``, ``image_id``, ``subnet_id``,
    ``security_group_ids``, ``launched_at`` (LaunchTime, UTC: its last start), ``billing_start``
    (when billing began as far as this machine saw it: wait_running sets it, else None),
    ``tags`` ({key: value}), ``launch_index`` (AmiLaunchIndex), ``state_reason_code`` (StateReason.Code,
    e.g. Server.SpotInstanceTermination), ``state_reason`` (StateReason.Message, else the
    StateTransitionReason text: AWS's words, show them inert), ``transitioned_at`` (the UTC time in
    StateTransitionReason: when it last stopped or terminated, EC2's own record, used for billing).
    """
    id: str
    type: str
    state: str
    launched_at: datetime
    market: str = "on-demand"
    zone: str | None = None
    placement_group: str | None = None
    public_ip: str | None = None
    private_ip: str | None = None
    key_name: str | None = None
    image_id: str | None = None
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    billing_start: datetime | None = None
    tags: dict[str, str] = field(default_factory=dict)
    launch_index: int = 0
    state_reason_code: str | None = None
    state_reason: str = ""
    transitioned_at: datetime | None = None

    @classmethod
    def of(cls, d: dict[str, Any], billing_start: datetime | None = None) -> Instance:
        """The Instance of one DescribeInstances (or RunInstances) entry ``d``."""
        placement = d.get("Placement") or {}
        transition = d.get("StateTransitionReason") or ""
        return cls(
            id=d["InstanceId"], type=d["InstanceType"], state=(d.get("State") or {}).get("Name", "pending"),
            market="spot" if d.get("InstanceLifecycle") == "spot" else "on-demand",
            zone=placement.get("AvailabilityZone"), placement_group=placement.get("GroupName") or None,
            public_ip=d.get("PublicIpAddress"), private_ip=d.get("PrivateIpAddress"), key_name=d.get("KeyName"),
            image_id=d.get("ImageId"), subnet_id=d.get("SubnetId"),
            security_group_ids=tuple(g["GroupId"] for g in d.get("SecurityGroups") or []),
            launched_at=d["LaunchTime"], billing_start=billing_start, tags=tags.as_dict(d.get("Tags")),
            launch_index=int(d.get("AmiLaunchIndex") or 0), state_reason_code=(d.get("StateReason") or {}).get("Code"),
            state_reason=(d.get("StateReason") or {}).get("Message") or transition,
            transitioned_at=_reason_time(transition))

    @property
    def name(self) -> str | None:
        """Its Name tag."""
        return self.tags.get(tags.NAME)

    @property
    def run_id(self) -> str | None:
        """Its ec2gpu:run tag."""
        return self.tags.get(tags.RUN)

    @property
    def node(self) -> int | None:
        """Its ec2gpu:node tag (the node index in its cluster or run), None without a valid one."""
        value = self.tags.get(tags.NODE, "")
        return int(value) if value.isdigit() else None


def described(reservations: list[dict[str, Any]]) -> list[Instance]:
    """The instances of DescribeInstances ``Reservations`` (flattened, in order)."""
    return [Instance.of(i) for r in reservations for i in r.get("Instances", [])]


@dataclass(frozen=True)
class LaunchSpec:
    """What to launch. ``max_runtime_minutes`` schedules a shutdown in user data: a termination, or a
    stop for an ``idle`` rule that stops (InstanceInitiatedShutdownBehavior follows the rule)."""

    run_id: str
    owner: str
    name: str
    instance_type: str
    image_id: str
    root_device_name: str
    key_name: str
    security_group_id: str
    spot: bool = False
    root_volume_gib: int = 100
    max_runtime_minutes: int | None = 120
    count: int = 1  # instances asked for: RunInstances' MaxCount
    #: the fewest that will do (MinCount; None: ``count``): EC2 launches "the largest possible number of
    #: instances above the specified minimum count" (API_RunInstances), a pool's start where a type is short
    min_count: int | None = None
    subnet_id: str | None = None
    max_price: float | None = None  # spot only: the highest USD/h to pay (None: up to on-demand)
    placement_group: str | None = None  # a cluster placement group for multi-node runs
    cluster: str | None = None  # the cluster's name (tag ec2gpu:cluster) for multi-node runs
    idle: IdleRule | None = None  # a standing instance's idle rule (`launch --idle-stop/--idle-down`)
    instance_profile: str | None = None  # the run's own instance role (aws/iam.py), for S3 file_mounts
    #: (key, value) pairs: the task's labels (SkyPilot's), tags of its instances and volumes
    labels: tuple[tuple[str, str], ...] = ()
    #: lines of bash run at boot after the limits (a detached run's agent: runs/detached/launch.boot_script)
    boot: str | None = None


#: Where the idle rule lives on an instance (root's; the sandbox sets EC2GPU_STATE_DIR per instance).
STATE_DIR = '"${EC2GPU_STATE_DIR:-/var/lib/ec2gpu}"'

#: Start the idle watcher of ``$dir`` unless it runs: a systemd service on an instance (it comes back
#: after a stop and start); in the background where ec2gpu's sandbox stands in for the instance
#: (EC2GPU_STATE_DIR is set there only, and the machine's systemd is not the instance's).
START_IDLE_WATCH = """\
read -r idle_s check_s <"$dir/idle-rule"
if [ -z "${EC2GPU_STATE_DIR:-}" ] && [ -d /run/systemd/system ]; then
  { printf '[Unit]\\nDescription=ec2gpu idle rule\\n[Service]\\nExecStart=/bin/bash %s/idle-watch.sh %s %s\\n' \\
      "$dir" "$idle_s" "$check_s"
    printf 'Restart=always\\n[Install]\\nWantedBy=multi-user.target\\n'; } >/etc/systemd/system/ec2gpu-idle.service
  systemctl daemon-reload && systemctl enable --now ec2gpu-idle.service
elif ! pgrep -f "$dir/idle-watch.sh" >/dev/null; then
  nohup bash "$dir/idle-watch.sh" "$idle_s" "$check_s" >>"$dir/idle.log" 2>&1 </dev/null &
fi"""


def user_data(max_runtime_minutes: int | None, idle: IdleRule | None = None, boot: str | None = None) -> str:
    """Cloud-init script: schedule a shutdown after ``max_runtime_minutes`` (None: nothing), install
    and start the idle watcher (ami/idle-watch.sh) for ``idle``, then ``boot`` (bash lines)."""
    lines = ["#!/bin/bash"]
    if max_runtime_minutes:
        # InstanceInitiatedShutdownBehavior turns this shutdown into a termination (or, with
        # --idle-stop, a stop), so a controller that crashed or lost its network never leaves a
        # GPU running.
        lines.append(f"shutdown -h +{int(max_runtime_minutes)} 'ec2gpu: max runtime reached'")
    if idle:
        from pathlib import Path
        watch = (Path(__file__).resolve().parents[1] / "ami" / "idle-watch.sh").read_text().rstrip("\n")
        lines += [f"dir={STATE_DIR}", 'mkdir -p "$dir"', "cat >\"$dir/idle-watch.sh\" <<'EC2GPU_IDLE_WATCH'", watch,
                  "EC2GPU_IDLE_WATCH", 'chmod 755 "$dir/idle-watch.sh"',
                  f'echo "{idle.seconds} {idle.check_seconds}" >"$dir/idle-rule"', START_IDLE_WATCH]
    if boot:
        lines.append(boot.rstrip("\n"))
    return "\n".join(lines) + "\n"


def run_request(spec: LaunchSpec) -> dict[str, Any]:
    """run_instances kwargs for ``spec`` (pure; tested without any AWS)."""
    req: dict[str, Any] = {
        "ImageId": spec.image_id, "InstanceType": spec.instance_type,
        "MinCount": spec.min_count or spec.count, "MaxCount": spec.count,
        "KeyName": spec.key_name, "SecurityGroupIds": [spec.security_group_id],
        "InstanceInitiatedShutdownBehavior": "stop" if spec.idle and spec.idle.action == "stop" else "terminate",
        # IMDSv2 only: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-IMDS-new-instances.html
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": [{"DeviceName": spec.root_device_name, "Ebs": {
            "VolumeSize": spec.root_volume_gib, "VolumeType": "gp3", "Encrypted": True,
            "DeleteOnTermination": True}}],
        # plain text: boto3 base64-encodes UserData for RunInstances itself (botocore handlers.py,
        # base64_encode_user_data); encoding it here too would hand the instance base64 text that
        # cloud-init never runs (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html)
        "UserData": user_data(spec.max_runtime_minutes, spec.idle, spec.boot),
        "TagSpecifications": [tags.tag_spec("instance", spec.run_id, spec.owner, spec.name),
                              tags.tag_spec("volume", spec.run_id, spec.owner, spec.name)],
    }
    if spec.spot:
        req["TagSpecifications"].append(tags.tag_spec("spot-instances-request", spec.run_id, spec.owner, spec.name))
        req["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        if spec.max_price is not None:
            req["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] = f"{spec.max_price:.4f}"
    if spec.instance_profile:
        req["IamInstanceProfile"] = {"Name": spec.instance_profile}
    for ts in req["TagSpecifications"][:2]:  # the instance and its volume
        ts["Tags"] += [{"Key": k, "Value": v} for k, v in spec.labels]
    if spec.subnet_id:
        req["SubnetId"] = spec.subnet_id
    if spec.placement_group:
        req["Placement"] = {"GroupName": spec.placement_group}
    if spec.cluster:
        for ts in req["TagSpecifications"]:
            ts["Tags"].append({"Key": tags.CLUSTER, "Value": spec.cluster})
    if spec.max_runtime_minutes:
        req["TagSpecifications"][0]["Tags"].append({"Key": tags.MAX_RUNTIME, "Value": str(int(spec.max_runtime_minutes))})
    if spec.idle:
        req["TagSpecifications"][0]["Tags"].append({"Key": tags.IDLE, "Value": spec.idle.tag()})
    return req


def tag_nodes(ec2: Client, instances_: list[Instance], name: str, first_index: int = 0) -> list[Instance]:
    """Number the instances of one launch as cluster nodes (tags ec2gpu:node and Name NAME-K, in
    AmiLaunchIndex order); return them in node order, with those tags."""
    ordered = sorted(instances_, key=lambda i: i.launch_index)
    out = []
    for k, inst in enumerate(ordered, start=first_index):
        ec2.create_tags(Resources=[inst.id], Tags=[{"Key": tags.NODE, "Value": str(k)},
                                                   {"Key": tags.NAME, "Value": f"{name}-{k}"}])
        out.append(replace(inst, tags={**inst.tags, tags.NODE: str(k), tags.NAME: f"{name}-{k}"}))
    return out


def _waiter_config(timeout_s: float, delay_s: float) -> dict[str, Any]:
    return {"Delay": delay_s, "MaxAttempts": max(1, math.ceil(timeout_s / delay_s))}


#: Instance.billing_start, as wait_running sets it: when billing began, as far as this machine
#: saw it. EC2 bills an instance from the moment it is ``running``, not while ``pending``
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html), and reports
#: no time for that transition; the last moment it was seen ``pending`` (its LaunchTime at the
#: least) is the earliest it can have started, so billing from there never bills too little.
#: the states of an instance that ended before it was running (the instance_running waiter fails on them)
ENDED_STATES = ("shutting-down", "terminated", "stopping", "stopped")


class EndedBeforeRunning(AwsError):
    """Instances that ended before they were running: a spot instance reclaimed at launch
    (StateReason Server.SpotInstanceTermination), a volume limit, an internal error. ``ended``:
    {instance id: (state, its StateReason code or None)}; the others of the launch may still be
    pending or running. EC2 bills an instance from when it is running, so these cost nothing
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html)."""

    def __init__(self, message: str, hint: str, ended: dict[str, tuple[str, str | None]]):
        super().__init__(message, hint)
        self.ended = ended


def wait_running(ec2: Client, instance_ids: list[str], timeout_s: float = 600, delay_s: float = 2) -> list[Instance]:
    """Wait until the instances are running; return them, each with its ``billing_start``.

    Raises WaitTimeout after ``timeout_s`` seconds, EndedBeforeRunning (an AwsError) if one ended
    instead (its state and StateReason code from the waiter's last DescribeInstances).
    """
    seen_pending: dict[str, datetime] = {}

    def observe(parsed: dict[str, Any], **_: Any) -> None:  # every DescribeInstances the waiter makes: who is still pending, when
        now = datetime.now(timezone.utc)
        for r in parsed.get("Reservations", []):
            for i in r.get("Instances", []):
                if i.get("State", {}).get("Name") == "pending":
                    seen_pending[i["InstanceId"]] = now

    ec2.meta.events.register("after-call.ec2.DescribeInstances", observe)
    try:
        ec2.get_waiter("instance_running").wait(InstanceIds=instance_ids,
                                                WaiterConfig=_waiter_config(timeout_s, delay_s))
    except botocore.exceptions.WaiterError as exc:
        described = [i for r in (exc.last_response or {}).get("Reservations", []) for i in r.get("Instances", [])]
        ended = {str(i.get("InstanceId")): (str(i.get("State", {}).get("Name")), (i.get("StateReason") or {}).get("Code"))
                 for i in described if i.get("State", {}).get("Name") in ENDED_STATES}
        if ended:
            said = ", ".join(f"{i} ({st}: {why})" if why else f"{i} ({st})" for i, (st, why) in ended.items())
            raise EndedBeforeRunning(f"instance {said} ended before running",
                                     "see `aws ec2 describe-instances` for its StateReason", ended) from None
        raise WaitTimeout(f"instance {', '.join(instance_ids)} not running after {timeout_s:.0f} s",
                          "AWS may be short of capacity; try another zone or type")
    finally:
        ec2.meta.events.unregister("after-call.ec2.DescribeInstances", observe)
    out = []
    for inst in describe_instances(ec2, instance_ids):
        pending = seen_pending.get(inst.id)
        start = max(inst.launched_at, pending) if pending else inst.launched_at
        out.append(replace(inst, billing_start=start))
    return out


def describe_instances(ec2: Client, instance_ids: list[str]) -> list[Instance]:
    """The instances ``instance_ids``, as DescribeInstances describes them now."""
    return described(ec2.describe_instances(InstanceIds=instance_ids)["Reservations"])


def terminate(ec2: Client, instance_ids: list[str], wait: bool = True, timeout_s: float = 600,
              delay_s: float = 2) -> None:
    """Terminate the instances and (``wait``) wait until they are terminated.

    Raises WaitTimeout if they are still shutting down after ``timeout_s`` seconds.
    """
    if not instance_ids:
        return
    ec2.terminate_instances(InstanceIds=instance_ids)
    if wait:
        wait_terminated(ec2, instance_ids, timeout_s, delay_s)


def wait_terminated(ec2: Client, instance_ids: list[str], timeout_s: float = 600, delay_s: float = 2) -> None:
    """Wait until the instances are terminated. Raises WaitTimeout after ``timeout_s`` seconds."""
    try:
        ec2.get_waiter("instance_terminated").wait(InstanceIds=instance_ids,
                                                   WaiterConfig=_waiter_config(timeout_s, delay_s))
    except botocore.exceptions.WaiterError:
        raise WaitTimeout(f"instances {', '.join(instance_ids)} not terminated after {timeout_s:.0f} s",
                          "check with `ec2gpu ls` and `ec2gpu cleanup`")


def stop(ec2: Client, instance_ids: list[str], timeout_s: float = 600, delay_s: float = 2) -> None:
    """Stop the instances and wait until they are stopped (EBS-backed instances keep their root
    volume). Raises WaitTimeout after ``timeout_s`` seconds."""
    ec2.stop_instances(InstanceIds=instance_ids)
    try:
        ec2.get_waiter("instance_stopped").wait(InstanceIds=instance_ids, WaiterConfig=_waiter_config(timeout_s, delay_s))
    except botocore.exceptions.WaiterError:
        raise WaitTimeout(f"instances {', '.join(instance_ids)} not stopped after {timeout_s:.0f} s",
                          "check with `ec2gpu ls`; `ec2gpu down NAME` terminates them")


def start(ec2: Client, instance_ids: list[str], timeout_s: float = 600) -> list[Instance]:
    """Start stopped instances; return them once running (wait_running). Raises
    WaitTimeout, AwsError (one stopped again instead, e.g. InsufficientInstanceCapacity)."""
    ec2.start_instances(InstanceIds=instance_ids)
    return wait_running(ec2, instance_ids, timeout_s)


def reboot(ec2: Client, instance_ids: list[str]) -> None:
    """Ask EC2 to reboot the instances (RebootInstances: asynchronous, returns at once; an instance
    keeps its id, addresses, volumes and LaunchTime). Waits for nothing: a caller that needs the
    instance back watches its boot id (remote/ssh.boot_id). Raises botocore's ClientError as it is."""
    ec2.reboot_instances(InstanceIds=instance_ids)

def root_volume_gib(ec2: Client, instance_ids: list[str]) -> dict[str, int]:
    """Instance id -> GiB of the EBS volumes attached to it (one DescribeVolumes call)."""
    if not instance_ids:
        return {}
    sizes: dict[str, int] = {}
    pages = ec2.get_paginator("describe_volumes").paginate(
        Filters=[{"Name": "attachment.instance-id", "Values": list(instance_ids)}])
    for v in (v for page in pages for v in page["Volumes"]):
        for a in v.get("Attachments", []):
            sizes[a["InstanceId"]] = sizes.get(a["InstanceId"], 0) + v["Size"]
    return sizes


def summary(instance: Instance) -> dict[str, Any]:
    """The fields `ec2gpu ls` shows, from one instance. A Name, run id or cluster
    tag that is not safe to show or paste into a command (tags.safe) is left out ("" / None) and
    ``unsafe_tags`` names it."""
    tg = instance.tags
    unsafe = [k for k in (tags.NAME, tags.RUN, tags.CLUSTER) if k in tg and not tags.safe(tg[k])]
    tg = {k: v for k, v in tg.items() if k not in unsafe}
    launched = instance.launched_at
    return {
        "name": tg.get(tags.NAME, ""), "run_id": tg.get(tags.RUN, ""), "instance_id": instance.id,
        "cluster": tg.get(tags.CLUSTER), "node": instance.node,
        "instance_type": instance.type, "market": instance.market,
        "state": instance.state, "public_ip": instance.public_ip, "private_ip": instance.private_ip,
        "zone": instance.zone,
        "launched_at": launched.isoformat() if isinstance(launched, datetime) else launched,
        "idle_rule": tg.get(tags.IDLE),  # "stop 1800" / "down 3600" (IdleRule.tag), None without one
        "unsafe_tags": unsafe,
    }


_FINGERPRINTS = re.compile(r"-----BEGIN SSH HOST KEY FINGERPRINTS-----(.*?)-----END SSH HOST KEY FINGERPRINTS-----",
                           re.S)


def parse_host_key_fingerprints(console: str) -> list[str]:
    """'SHA256:...' fingerprints from the block cloud-init prints to the console (pure); [] if none."""
    found: list[str] = []
    for block in _FINGERPRINTS.findall(console or ""):
        found += re.findall(r"SHA256:[A-Za-z0-9+/]+", block)
    return found


def idle_state(console: str, now: float) -> dict[str, Any] | None:
    """What the instance's idle watcher last said on its console (ami/idle-watch.sh), as of ``now``
    (epoch s) (pure): {"idle_seconds": s or None while busy, "busy": "job"|"ssh"|"gpu"|None}, or
    None when it has said nothing yet."""
    said = re.findall(r"^ec2gpu-idle: (idle since|busy (\w+) since) (\d+) rule \d+\s*$", console, re.M)
    if not said:
        return None
    kind, busy, since = said[-1]
    if kind == "idle since":
        return {"idle_seconds": max(0, round(now - int(since))), "busy": None}
    return {"idle_seconds": None, "busy": busy}


def console_output(ec2: Client, instance_id: str) -> str:
    """The instance's console output, newest (Latest=True where the instance supports it); "" when
    EC2 has none or refuses."""
    try:
        try:
            return ec2.get_console_output(InstanceId=instance_id, Latest=True).get("Output") or ""
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) not in ("UnsupportedOperation", "InvalidParameterValue", "InvalidParameterCombination"):
                raise
            return ec2.get_console_output(InstanceId=instance_id).get("Output") or ""  # Latest needs Nitro
    except botocore.exceptions.ClientError:
        return ""


def host_key_fingerprints(ec2: Client, instance_id: str) -> list[str]:
    """The instance's SSH host key fingerprints from its console output ([] until cloud-init printed them).

    GetConsoleOutput (Latest=True) is its own record, out of band from the SSH connection, so a
    key that does not match is refused (remote/ssh.py). Errors reading it count as "none yet".
    """
    return parse_host_key_fingerprints(console_output(ec2, instance_id))
