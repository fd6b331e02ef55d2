"""The sandbox's instance metadata service (IMDSv2) and its spot interruptions.

Every sandbox instance reaches it at ``EC2GPU_IMDS_ENDPOINT`` = http://127.0.0.1:P/<instance-id>
(set in its SSH sessions by sshd), the way a real instance reaches http://169.254.169.254. It
answers what the trainer asks (train/spot.py), with the token handshake IMDSv2 requires:

- ``PUT  /<id>/latest/api/token`` (header X-aws-ec2-metadata-token-ttl-seconds) -> a token
- ``GET  /<id>/latest/meta-data/spot/instance-action`` (header X-aws-ec2-metadata-token) -> 404 until
  a notice is published, then ``{"action": "terminate", "time": "2026-11-21T10:02:03Z"}``
- ``GET  /<id>/latest/meta-data/events/recommendations/rebalance`` -> 404 until a rebalance
  recommendation is published, then ``{"noticeTime": "2026-11-21T10:00:03Z"}``, as EC2 answers
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html)
- ``GET  /<id>/latest/meta-data/instance-id``
- a request without a valid token gets 401, as on EC2 with IMDSv2 required.

``POST /control/interrupt`` ({"instance_id", "notice_seconds"}) is the sandbox's own: it publishes a
notice and, ``notice_seconds`` later, terminates the instance with the reason EC2 gives
(Server.SpotInstanceTermination); the daemon then stops its sshd and processes. EC2 gives two
minutes' notice: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
With ``"rebalance": true`` it publishes a rebalance recommendation instead, and nothing else: the
instance is at elevated risk of interruption and keeps running (EC2 emits one for spot instances
only, on a best-effort basis, sometimes with the notice itself; page above).
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import datetime, timedelta, timezone

DEFAULT_NOTICE_SECONDS = 120.0  # EC2's two-minute warning (page above)


class Metadata:
    """Tokens and published notices; ``terminate(instance_id)`` is the daemon's hook into moto."""

    def __init__(self, terminate):
        self.terminate = terminate
        self.tokens: set[str] = set()
        self.notices: dict[str, dict] = {}
        self.rebalances: dict[str, dict] = {}
        self.lock = threading.Lock()

    def new_token(self) -> str:
        token = secrets.token_urlsafe(24)
        with self.lock:
            self.tokens.add(token)
        return token

    def valid(self, token: str | None) -> bool:
        with self.lock:
            return bool(token) and token in self.tokens

    def interrupt(self, instance_id: str, notice_seconds: float, find) -> dict:
        """Publish a notice for ``instance_id`` and schedule its termination; return the notice.

        ``find(instance_id)`` returns (state, lifecycle) or None. Raises LookupError for an unknown
        or not-running instance, ValueError for an on-demand one (EC2 interrupts spot only).
        """
        found = find(instance_id)
        if not found or found[0] != "running":
            raise LookupError(f"{instance_id} is not a running sandbox instance"
                              + (f" (it is {found[0]})" if found else ""))
        if found[1] != "spot":
            raise ValueError(f"{instance_id} is on-demand; EC2 interrupts spot instances only")
        at = datetime.now(timezone.utc) + timedelta(seconds=notice_seconds)
        notice = {"action": "terminate", "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        with self.lock:
            self.notices[instance_id] = notice
        timer = threading.Timer(notice_seconds, self._reclaim, args=(instance_id,))
        timer.daemon = True
        timer.start()
        return {"instance_id": instance_id, "notice": notice, "notice_seconds": notice_seconds,
                "published_at": time.time()}

    def rebalance(self, instance_id: str, find) -> dict:
        """Publish a rebalance recommendation for ``instance_id`` (it keeps running); return it.
        Raises LookupError for an unknown or not-running instance, ValueError for an on-demand one."""
        found = find(instance_id)
        if not found or found[0] != "running":
            raise LookupError(f"{instance_id} is not a running sandbox instance"
                              + (f" (it is {found[0]})" if found else ""))
        if found[1] != "spot":
            raise ValueError(f"{instance_id} is on-demand; EC2 sends rebalance recommendations to spot instances only")
        recommendation = {"noticeTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        with self.lock:
            self.rebalances[instance_id] = recommendation
        return {"instance_id": instance_id, "rebalance": recommendation, "published_at": time.time()}

    def _reclaim(self, instance_id: str) -> None:
        self.terminate(instance_id)


def handle(meta: Metadata, method: str, path: str, headers, body: bytes, find) -> tuple[int, str, str]:
    """Answer one HTTP request: (status, content type, body). Pure apart from ``meta``."""
    if method == "POST" and path == "/control/interrupt":
        try:
            req = json.loads(body or b"{}")
            done = meta.rebalance(req["instance_id"], find) if req.get("rebalance") is True else \
                meta.interrupt(req["instance_id"], float(req.get("notice_seconds", DEFAULT_NOTICE_SECONDS)), find)
        except (LookupError, ValueError, KeyError, TypeError) as exc:
            return 400, "application/json", json.dumps({"error": str(exc).strip("'")})
        return 200, "application/json", json.dumps(done)
    parts = path.split("/", 2)  # "", "<instance-id>", "latest/..."
    if len(parts) < 3 or not parts[1].startswith("i-"):
        return 404, "text/plain", "Not Found"
    instance_id, rest = parts[1], "/" + parts[2]
    if method == "PUT" and rest == "/latest/api/token":
        if not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return 400, "text/plain", "Bad Request"
        return 200, "text/plain", meta.new_token()
    if method != "GET":
        return 405, "text/plain", "Method Not Allowed"
    if not meta.valid(headers.get("X-aws-ec2-metadata-token")):
        return 401, "text/plain", "Unauthorized"
    if rest == "/latest/meta-data/instance-id":
        return 200, "text/plain", instance_id
    if rest in ("/latest/meta-data/spot/instance-action", "/latest/meta-data/events/recommendations/rebalance"):
        with meta.lock:
            item = (meta.notices if rest.endswith("instance-action") else meta.rebalances).get(instance_id)
        return (200, "application/json", json.dumps(item)) if item else (404, "text/plain", "Not Found")
    return 404, "text/plain", "Not Found"
