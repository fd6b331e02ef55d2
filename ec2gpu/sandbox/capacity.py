"""Limited capacity in the sandbox: EC2 has only so many instances of a type to give.

On EC2, RunInstances launches "the largest possible number of instances above the specified
minimum count" up to MaxCount, and none when it cannot launch MinCount
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RunInstances.html, MinCount and
MaxCount); a type a zone is out of answers ``InsufficientInstanceCapacity``
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html). moto has
unlimited capacity and launches MinCount instances, MaxCount unread. Here:

- ``limit(instance_type, count)`` (`ec2gpu sandbox capacity TYPE COUNT`, or None: no limit) sets how
  many instances of a type may be pending or running at once, all zones together;
- ``install()`` patches RunInstances: it launches MaxCount instances where the type has no limit
  (EC2 with the capacity), else as many as fit up to MaxCount, or answers
  ``InsufficientInstanceCapacity`` when MinCount do not fit. Auto Scaling's own launches
  (sandbox/autoscaling.py) do not go through RunInstances; they ask ``room`` and record a failed
  scaling activity when there is none, as AWS's group does.
"""
from __future__ import annotations

import threading

_LIMITS: dict[str, int] = {}  # instance type -> instances that may be pending or running at once
_LOCK = threading.Lock()  # one RunInstances at a time counts and launches, so two never share a slot


def limit(instance_type: str, count: int | None) -> dict[str, int]:
    """Let at most ``count`` instances of ``instance_type`` be pending or running at once (None:
    as many as asked). Returns every limit now in force. Raises ValueError for a bad count."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 10_000):
        raise ValueError(f"count {count!r}: give 0 to 10000, or none for no limit")
    if not isinstance(instance_type, str) or not 0 < len(instance_type) <= 64:
        raise ValueError("instance_type: a type's name, e.g. g4dn.xlarge")
    with _LOCK:
        if count is None:
            _LIMITS.pop(instance_type, None)
        else:
            _LIMITS[instance_type] = count
        return dict(_LIMITS)


def room(instance_type: str, in_use: int) -> bool:
    """Whether one more instance of ``instance_type`` fits beside ``in_use`` pending or running ones."""
    with _LOCK:
        return launchable(1, 1, _LIMITS.get(instance_type), in_use) == 1


def launchable(want_min: int, want_max: int, limit_: int | None, in_use: int) -> int:
    """How many instances RunInstances launches (pure): ``want_max`` without a limit, else as many
    as fit under ``limit_`` with ``in_use`` taken, up to ``want_max``; 0 when ``want_min`` do not fit."""
    if limit_ is None:
        return want_max
    free = max(0, limit_ - in_use)
    return min(want_max, free) if free >= want_min else 0


def install() -> None:
    """Patch moto's RunInstances as the module docstring says (call in the daemon after importing moto)."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.instances import InstanceResponse

    original = InstanceResponse.run_instances

    def run_instances(self):
        want_min = int(self._get_param("MinCount", if_none="1"))
        want_max = max(want_min, int(self._get_param("MaxCount", if_none=str(want_min))))
        kind = self._get_param("InstanceType", "m1.small")
        with _LOCK:
            in_use = sum(1 for inst in self.ec2_backend.all_instances()
                         if inst.instance_type == kind and inst.state in ("pending", "running"))
            count = launchable(want_min, want_max, _LIMITS.get(kind), in_use)
            if count == 0:
                zone = self._get_param("Placement.AvailabilityZone")
                raise EC2ClientError("InsufficientInstanceCapacity",
                                     f"We currently do not have sufficient {kind} capacity in the Availability Zone "
                                     f"you requested{f' ({zone})' if zone else ''}. Our system will be working on "
                                     "provisioning additional capacity.")
            if self.automated_parameter_parsing:  # moto launches MinCount: EC2's parameters, parsed by moto
                self.params["MinCount"] = count
            else:
                self.querystring["MinCount"] = [str(count)]
            return original(self)

    InstanceResponse.run_instances = run_instances
