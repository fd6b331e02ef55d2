"""The hand-over's URLs on the instance (issue 51, item 2; runs/recover/handover.py): the renewed
ones the controller sends while it lives, and a URL S3 refuses signed again with the instance
role's own credentials. Standard library only: shipped flat beside agent.py (agent.BESIDE), which
runs with no site-packages.

- ``renewed(run_dir, urls, read)``: the URLs the controller renewed (RUN_DIR/RENEWED, written by
  runs/recover/handover.urls_command; read and deleted), each taken only in place of one of
  ``urls`` for the same object (scheme, host and path: only its signature may differ);
- ``put_or_role(put, url, imds, ...)``: ``put`` (agent.put) to ``url``; when S3 refuses it as a
  URL it no longer takes (REFUSED), once more to the same object signed with the role's credentials;
- ``role_credentials(imds)``: the temporary credentials of the instance profile's role, from the
  metadata service (IMDSv2: a token PUT, then ``iam/security-credentials/`` names the role and
  ``.../ROLE`` gives {"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}:
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-metadata-security-credentials.html);
  None on an instance without a role.
- ``presign_put(url, credentials, region, at)``: the same object's URL (scheme, host, path) with
  a SigV4 query-string signature of those credentials, as botocore's S3SigV4QueryAuth makes it
  (signed header ``host``, payload ``UNSIGNED-PAYLOAD``:
  https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html); a test compares
  it with botocore's.

What the role may write is its policy's to say: a run role gets s3:PutObject on its own run's
``handover/`` prefix only (aws/iam.handover_policy), so another object's URL signed this way is
refused by S3.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

RENEWED = "handover-urls.json"  # in the run directory (runs/recover/handover.RENEWED)
MAX_RENEWED_BYTES = 1 << 20
#: what S3 answers a URL it no longer takes: 403 (AccessDenied: "Request has expired", or a signature
#: whose credentials are gone) and 400 (ExpiredToken: temporary credentials that have ended):
#: https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html (agent.put says "HTTP CODE")
REFUSED = ("HTTP 400", "HTTP 403")
CREDENTIALS = "/latest/meta-data/iam/security-credentials/"
MAX_BYTES = 64 << 10  # an IMDS answer is read at most this large
#: the longest a URL signed here lasts (s): it is used at once, and role credentials last longer
EXPIRES_S = 900


def _object(url: str) -> tuple[str, str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc, parts.path


def renewed(run_dir: str, urls: dict[str, str], read: Callable[..., Any]) -> dict[str, str]:
    """``urls`` ({name: URL}) with those the controller renewed in ``run_dir``/RENEWED in their place
    (``read``: bounded_json.read, which refuses a link, a file over MAX_RENEWED_BYTES, bad JSON),
    the file deleted; a renewed URL is taken only for a name of ``urls`` and the same object
    (a stale or planted file changes nothing else)."""
    path = os.path.join(run_dir, RENEWED)
    try:
        got = read(path, max_bytes=MAX_RENEWED_BYTES, follow=False)
    except (OSError, ValueError, RecursionError):
        return dict(urls)
    finally:
        try:
            os.remove(path)
        except OSError:  # none, or a directory the job made there: nothing taken from it
            pass
    fresh = got.get("urls") if isinstance(got, dict) else None
    fresh = fresh if isinstance(fresh, dict) else {}
    return {name: fresh[name] if isinstance(fresh.get(name), str) and fresh[name].startswith(("https://", "http://"))
            and _object(fresh[name]) == _object(url) else url for name, url in urls.items()}


def put_or_role(put: Callable[..., str | None], url: str, imds: str, loads: Callable[..., Any], **body: Any) -> str | None:
    """``put(url, **body)`` (agent.put: None when S3 took it, else what went wrong); when S3 refused
    the URL (REFUSED), ``put`` again to the same object signed with the instance role's credentials
    (role_credentials from ``imds``, read with ``loads``: bounded_json.loads; presign_put). None when
    one of them was taken, else what went wrong (both, when the role's try failed too)."""
    why = put(url, **body)
    if why not in REFUSED:
        return why
    credentials, region = role_credentials(imds, loads), region_of(url)
    if credentials is None or region is None:
        return f"{why}, and no instance role to sign it again"
    again = put(presign_put(url, credentials, region), **body)
    return None if again is None else f"{why}; signed by the instance role: {again}"


def role_credentials(imds: str, loads: Callable[..., Any], timeout_s: float = 2.0) -> dict[str, str] | None:
    """{"AccessKeyId", "SecretAccessKey", "Token"} of the instance's role, from the metadata service at
    ``imds`` (module docstring; its JSON read by ``loads``, bounded_json.loads: at most MAX_BYTES), or
    None when it has no role (404) or does not answer as it should."""
    try:
        put = urllib.request.Request(f"{imds}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        with urllib.request.urlopen(put, timeout=timeout_s) as resp:
            headers = {"X-aws-ec2-metadata-token": resp.read(MAX_BYTES).decode()}
        with urllib.request.urlopen(urllib.request.Request(imds + CREDENTIALS, headers=headers), timeout=timeout_s) as resp:
            name = resp.read(MAX_BYTES).decode().split("\n", 1)[0].strip()
        if not name or "/" in name or name in (".", ".."):
            return None
        with urllib.request.urlopen(urllib.request.Request(imds + CREDENTIALS + urllib.parse.quote(name), headers=headers),
                                    timeout=timeout_s) as resp:
            got: Any = loads(resp.read(MAX_BYTES + 1), max_bytes=MAX_BYTES)
    except (urllib.error.URLError, OSError, ValueError, UnicodeDecodeError):
        return None
    fields = ("AccessKeyId", "SecretAccessKey", "Token")
    if not isinstance(got, dict) or not all(isinstance(got.get(f), str) and got[f] for f in fields):
        return None
    return {f: got[f] for f in fields}


def region_of(url: str) -> str | None:
    """The region of a SigV4 presigned ``url``: its X-Amz-Credential's scope, KEY/DATE/REGION/s3/aws4_request."""
    scope = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("X-Amz-Credential", [""])[0].split("/")
    return scope[2] if len(scope) == 5 and scope[2] else None


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def presign_put(url: str, credentials: dict[str, str], region: str, at: datetime | None = None,
                expires_s: int = EXPIRES_S) -> str:
    """``url``'s object (its scheme, host and path, already URI-encoded as S3 URLs are; its query
    dropped) as a PUT URL signed with ``credentials`` (role_credentials') for ``region``, dated
    ``at`` (UTC; now when None), lasting ``expires_s`` seconds (module docstring)."""
    parts = urllib.parse.urlsplit(url)
    stamp = (at or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    query = {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": f"{credentials['AccessKeyId']}/{scope}",
             "X-Amz-Date": stamp, "X-Amz-Expires": str(expires_s), "X-Amz-SignedHeaders": "host"}
    if credentials.get("Token"):
        query["X-Amz-Security-Token"] = credentials["Token"]
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))
    request = "\n".join(["PUT", parts.path or "/", canonical_query, f"host:{parts.netloc}", "", "host", "UNSIGNED-PAYLOAD"])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(request.encode()).hexdigest()])
    key = ("AWS4" + credentials["SecretAccessKey"]).encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"{parts.scheme}://{parts.netloc}{parts.path}?{canonical_query}&X-Amz-Signature={signature}"
