"""The instance lifecycle where moto differs from EC2: LaunchTime is set again at every start.

EC2's DescribeInstances gives ``LaunchTime`` as "the time that the instance was last launched": a
start after a stop sets it anew (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Instance.html,
and the stop-start page: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Stop_Start.html),
and billing runs per running interval. moto keeps the first launch's time forever; here (in the
daemon only) a start sets it, so the tool's ledger of running intervals (runs/plan/intervals.py) meets
what it meets on EC2.
"""
from __future__ import annotations


def install() -> None:
    """Patch moto's Instance.start (after moto is imported) to set ``launch_time`` as EC2 does."""
    from moto.core.utils import utcnow
    from moto.ec2.models.instances import Instance

    start = Instance.start

    def started(self, *args, **kwargs):
        was = self._state.name
        previous = start(self, *args, **kwargs)
        if was == "stopped":
            self.launch_time = utcnow()
        return previous

    Instance.start = started
