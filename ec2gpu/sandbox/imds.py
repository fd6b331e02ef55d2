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
- ``GET  /<id>/latest/meta-data/local-ipv4`` -> its private IPv4 address: here the loopback address
  its sshd and its processes use (127.0.0.N), which the other instances reach it at; 404 before it
  has one (a detached run's nodes tell each other theirs: agent/gang.py)
- ``GET  /<id>/latest/meta-data/placement/availability-zone`` -> its zone (botocore's IMDS region
  provider asks it, in defaults mode "auto")
- ``GET  /<id>/latest/meta-data/iam/security-credentials/`` -> the name of the role of the instance's
  instance profile, 404 when it has none; ``.../security-credentials/ROLE`` -> that role's temporary
  credentials, ``{"Code": "Success", "LastUpdated", "Type": "AWS-HMAC", "AccessKeyId": "ASIA...",
  "SecretAccessKey", "Token", "Expiration": "2026-11-21T11:00:03Z"}``, the same ones until they are
  near their expiration, then new ones; ``{"Code": "AssumeRoleUnauthorizedAccess", "Message"}`` when
  the role's trust policy does not allow EC2. What botocore's InstanceMetadataFetcher reads:
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html and
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-metadata-security-credentials.html
- a request without a valid token gets 401, as on EC2 with IMDSv2 required.

The role and its credentials come from the daemon's hooks (``role_of``, ``mint``: roles.py). All
instances share one loopback endpoint, told apart by the path only: a sandbox process could ask for
another instance's credentials, which a real instance cannot (a known limit of the emulation).

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
#: seconds before their expiration that an instance's role credentials are replaced: EC2 makes new ones
#: available "at least five minutes before" (instance-metadata-security-credentials.html, above);
#: botocore refreshes 15 min before (its advisory window), so it gets new ones then
ROTATE_BEFORE_S = 20 * 60
CREDENTIALS_PATH = "/latest/meta-data/iam/security-credentials"
ZONE_PATH = "/latest/meta-data/placement/availability-zone"


def _stamp(at: datetime) -> str:
    """ISO 8601 UTC to the second, as EC2's metadata writes times (the form botocore parses)."""
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Metadata:
    """Tokens and published notices; ``terminate(instance_id)`` is the daemon's hook into moto."""

    def __init__(self, terminate):
        self.terminate = terminate
        self.tokens: set[str] = set()
        self.notices: dict[str, dict] = {}
        self.rebalances: dict[str, dict] = {}
        self.role_credentials: dict[tuple[str, str], dict] = {}  # (instance id, role ARN) -> what was minted
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

    def credentials(self, instance_id: str, role_arn: str, mint) -> dict:
        """The credentials of ``role_arn`` for ``instance_id`` with "LastUpdated" (when minted): the
        ones held, or new ones from ``mint(instance_id, role_arn)`` (a dict with AccessKeyId,
        SecretAccessKey, Token, Expiration: an aware datetime) when none are held or the held ones
        expire within ROTATE_BEFORE_S seconds. ``mint``'s PermissionError and LookupError pass through."""
        now = datetime.now(timezone.utc)
        with self.lock:
            held = self.role_credentials.get((instance_id, role_arn))
        if held and held["Expiration"] - now > timedelta(seconds=ROTATE_BEFORE_S):
            return held
        fresh = {**mint(instance_id, role_arn), "LastUpdated": now}
        with self.lock:
            self.role_credentials[(instance_id, role_arn)] = fresh
        return fresh


def handle(meta: Metadata, method: str, path: str, headers, body: bytes, find,
           role_of=lambda instance_id: None, mint=None, zone_of=lambda instance_id: None,
           address_of=lambda instance_id: None) -> tuple[int, str, str]:
    """Answer one HTTP request: (status, content type, body). Pure apart from ``meta`` and the hooks:
    ``find(instance_id)`` -> (state, lifecycle) or None; ``role_of(instance_id)`` -> the ARN of the
    role of its instance profile, or None; ``mint(instance_id, role_arn)`` -> new credentials (see
    Metadata.credentials); ``zone_of(instance_id)`` -> its availability zone, or None;
    ``address_of(instance_id)`` -> its private address, or None."""
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
    if rest == "/latest/meta-data/local-ipv4":
        address = address_of(instance_id)
        return (200, "text/plain", address) if address else (404, "text/plain", "Not Found")
    if rest.rstrip("/") == ZONE_PATH:
        zone = zone_of(instance_id)
        return (200, "text/plain", zone) if zone else (404, "text/plain", "Not Found")
    if rest == CREDENTIALS_PATH or rest.startswith(CREDENTIALS_PATH + "/"):
        return _security_credentials(meta, instance_id, rest[len(CREDENTIALS_PATH):].strip("/"), role_of, mint)
    if rest in ("/latest/meta-data/spot/instance-action", "/latest/meta-data/events/recommendations/rebalance"):
        with meta.lock:
            item = (meta.notices if rest.endswith("instance-action") else meta.rebalances).get(instance_id)
        return (200, "application/json", json.dumps(item)) if item else (404, "text/plain", "Not Found")
    return 404, "text/plain", "Not Found"


def _security_credentials(meta: Metadata, instance_id: str, name: str, role_of, mint) -> tuple[int, str, str]:
    """``iam/security-credentials/`` (``name`` empty): the role's name; ``.../NAME``: its credentials
    when NAME is the instance's role. 404 for an instance with no role, or another name, as on EC2."""
    arn = role_of(instance_id)
    role = arn.rsplit("/", 1)[-1] if arn else None
    if role is None or (name and name != role):
        return 404, "text/plain", "Not Found"
    if not name:
        return 200, "text/plain", role
    try:
        held = meta.credentials(instance_id, arn, mint)
    except PermissionError as exc:  # the role's trust policy does not let EC2 assume it
        return 200, "application/json", json.dumps({
            "Code": "AssumeRoleUnauthorizedAccess", "Message": str(exc),
            "LastUpdated": _stamp(datetime.now(timezone.utc))}, indent=2)
    except LookupError:  # gone since role_of answered
        return 404, "text/plain", "Not Found"
    return 200, "application/json", json.dumps({
        "Code": "Success", "LastUpdated": _stamp(held["LastUpdated"]), "Type": "AWS-HMAC",
        "AccessKeyId": held["AccessKeyId"], "SecretAccessKey": held["SecretAccessKey"],
        "Token": held["Token"], "Expiration": _stamp(held["Expiration"])}, indent=2)
