"""Spot interruption notices: poll the instance metadata service (IMDSv2) from a thread.

EC2 posts ``spot/instance-action`` two minutes before it reclaims a spot instance; see
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
It may post ``events/recommendations/rebalance`` sooner, when the instance is at elevated risk of
interruption: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html
The endpoint is ``EC2GPU_IMDS_ENDPOINT`` (default http://169.254.169.254) so tests and the
sandbox can serve a notice from a local HTTP server.
"""
from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from typing import Callable

DEFAULT_ENDPOINT = "http://169.254.169.254"
POLL_SECONDS = 5.0  # AWS recommends checking every 5 s (page above)
EXIT_SPOT_INTERRUPTED = 75  # EX_TEMPFAIL from sysexits.h: "try again later", on a new instance


def _endpoint() -> str:
    return os.environ.get("EC2GPU_IMDS_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def _token(endpoint: str, timeout: float) -> str:
    req = urllib.request.Request(
        f"{endpoint}/latest/api/token", method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        token: bytes = resp.read()
    return token.decode()


def instance_action(endpoint: str | None = None, timeout: float = 1.0,
                    item: str = "spot/instance-action") -> str | None:
    """Return the body of ``spot/instance-action`` (JSON text), or None when there is no notice;
    ``item="events/recommendations/rebalance"``: the rebalance recommendation's, the same way.

    Raises OSError (URLError) when the metadata service cannot be reached at all.
    """
    endpoint = endpoint or _endpoint()
    token = _token(endpoint, timeout)
    req = urllib.request.Request(
        f"{endpoint}/latest/meta-data/{item}",
        headers={"X-aws-ec2-metadata-token": token},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body: bytes = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # no interruption scheduled
            return None
        raise
    return body.decode()


class SpotWatcher(threading.Thread):
    """Daemon thread that sets ``notice`` (an Event) when an interruption notice appears, and
    ``rebalance`` (an Event) when a rebalance recommendation does (it keeps watching for the notice).

    ``start_if_available()`` starts it only when the metadata service answers, so the trainer
    runs unchanged on a laptop or the sandbox without one.
    """

    def __init__(self, poll_seconds: float | None = None, log: Callable[[str], object] = print) -> None:
        super().__init__(name="spot-watcher", daemon=True)
        self.poll_seconds = float(os.environ.get("EC2GPU_SPOT_POLL_SECONDS", poll_seconds or POLL_SECONDS))
        self.notice = threading.Event()
        self.rebalance = threading.Event()
        self.action: str | None = None
        self._stop = threading.Event()
        self._log = log

    def start_if_available(self) -> bool:
        """Start polling if IMDSv2 answers a token request within 1 s; return whether it did."""
        try:
            _token(_endpoint(), timeout=1.0)
        except OSError:
            return False
        self.start()
        return True

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                action = instance_action()
                if not self.rebalance.is_set() and instance_action(item="events/recommendations/rebalance"):
                    self._log("rebalance recommendation: this spot instance is at elevated risk of interruption")
                    self.rebalance.set()
            except OSError:
                action = None  # a missed poll is retried at the next interval
            if action:
                self.action = action
                self._log(f"spot interruption notice: {action}")
                self.notice.set()
                return
            self._stop.wait(self.poll_seconds)

    def stop(self) -> None:
        self._stop.set()
