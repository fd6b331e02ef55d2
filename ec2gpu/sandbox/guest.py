"""`shutdown`, `poweroff` and `halt` on a sandbox instance: the OS ending its own instance.

On EC2, an instance that shuts itself down is stopped or terminated as its
InstanceInitiatedShutdownBehavior says (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_ChangingInstanceInitiatedShutdownBehavior.html).
In the sandbox these commands (first on the instance's PATH, cloudinit.py) ask the daemon to do
the same: ``POST $EC2GPU_SANDBOX_CONTROL/control/shutdown`` with the instance id and the delay.
The daemon keeps the schedule, as systemd does for ``shutdown +N``, so the command returns at once.

Accepted like systemd's shutdown: ``shutdown [-h|-P|-H|--poweroff|--halt] [now|+M|HH:MM] [message]``,
``shutdown -c`` (cancel), ``poweroff``, ``halt``. ``-r`` (reboot) keeps the instance running.
"""
from __future__ import annotations

import json
import os
import sys
import urllib.request
from datetime import datetime, timedelta


def delay_seconds(when: str, now: datetime | None = None) -> float:
    """Seconds until ``when`` ('now', '+M' minutes, 'HH:MM' local time) (pure).

    Raises ValueError for anything else, as shutdown(8) refuses it.
    """
    if when == "now":
        return 0.0
    if when.startswith("+"):
        return 60.0 * int(when[1:])
    hh, mm = when.split(":")
    now = now or datetime.now()
    at = now.replace(hour=int(hh), minute=int(mm), second=0, microsecond=0)
    if at <= now:
        at += timedelta(days=1)
    return (at - now).total_seconds()


def parse(command: str, args: list[str]) -> dict:
    """The request for ``command args`` (pure): {"action": "shutdown"|"cancel"|"reboot", "delay_s"}."""
    if command in ("poweroff", "halt"):
        return {"action": "shutdown", "delay_s": 0.0}
    flags = [a for a in args if a.startswith("-")]
    rest = [a for a in args if not a.startswith("-")]
    if "-c" in flags:
        return {"action": "cancel", "delay_s": 0.0}
    action = "reboot" if "-r" in flags or "--reboot" in flags else "shutdown"
    # shutdown(8): the time defaults to +1 minute
    return {"action": action, "delay_s": delay_seconds(rest[0] if rest else "+1")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command, args = argv[0], argv[1:]
    try:
        req = parse(command, args)
    except ValueError:
        print(f"{command}: failed to parse time specification: {' '.join(args)}", file=sys.stderr)
        return 1
    if req["action"] == "reboot":
        print(f"{command}: reboot keeps a sandbox instance running", file=sys.stderr)
        return 0
    body = json.dumps({"instance_id": os.environ["EC2GPU_SANDBOX_INSTANCE"], **req}).encode()
    http = urllib.request.Request(f"{os.environ['EC2GPU_SANDBOX_CONTROL']}/control/shutdown", data=body, method="POST",
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(http, timeout=10) as resp:
        answer = json.loads(resp.read())
    if req["action"] == "cancel":
        print("Shutdown cancelled.", file=sys.stderr)
    elif req["delay_s"] > 0:
        print(f"Shutdown scheduled for {answer['at']}, use 'shutdown -c' to cancel.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
