"""S3 in the sandbox refuses a presigned URL that AWS would no longer take (issue 51, item 2); moto
takes any signature, so without this a hand-over URL never dies in the sandbox.

Only requests signed in the query string (SigV4: ``X-Amz-Signature``, a credential scope of
service ``s3``; SigV2's ``Signature``, ``Expires``, ``AWSAccessKeyId`` too) are looked at, and
only two things about them, as S3 answers them
(https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html,
https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html):

- ``X-Amz-Date`` plus ``X-Amz-Expires`` seconds (SigV2: ``Expires``) is past: 403 AccessDenied,
  "Request has expired";
- the access key is one of temporary credentials that have ended (moto's STS AssumeRole: the
  sandbox's instance roles, roles.mint, and any session a test assumes): 400 ExpiredToken, "The
  provided token has expired." A URL presigned with temporary credentials stops working when they
  end, whatever its ExpiresIn (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-presigned-url.html).

Every other request goes to moto as it came. On in every sandbox (server.py), as on AWS; kept on by
tests/e2e/test_handover_credentials_e2e.py and tests/unit/test_handover_credentials.py.
"""
from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

#: an S3 error document, as S3 writes one
_ERROR = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
          '<RequestId>sandbox</RequestId></Error>')


def sts_expiry(access_key_id: str) -> float | None:
    """When the temporary credentials of ``access_key_id`` end (POSIX s), from moto's STS
    AssumeRole records in every account and partition; None for a key it did not make."""
    from moto.sts.models import sts_backends

    for account in list(sts_backends.keys()):
        for backend in list(sts_backends[account].values()):
            for role in list(backend.assumed_roles):
                if role.access_key_id == access_key_id:  # moto's expiration is naive UTC
                    return float(role.expiration.replace(tzinfo=timezone.utc).timestamp())
    return None


def refusal(query: dict[str, list[str]], now: float, expiry_of: Callable[[str], float | None]) -> tuple[str, str, str] | None:
    """(HTTP status line, S3 error code, message) for a presigned S3 request whose parsed ``query``
    AWS would refuse at ``now`` (POSIX s; module docstring), else None. ``expiry_of``: when an
    access key's credentials end (sts_expiry)."""
    if "X-Amz-Signature" in query:
        scope = query.get("X-Amz-Credential", [""])[0].split("/")
        if len(scope) != 5 or scope[3] != "s3":
            return None
        key_id = scope[0]
        try:
            signed = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()
            end = signed + int(query["X-Amz-Expires"][0])
        except (KeyError, ValueError):
            return "400 Bad Request", "AuthorizationQueryParametersError", "X-Amz-Date and X-Amz-Expires must be given"
    elif "Signature" in query and "AWSAccessKeyId" in query:  # SigV2 (a client without s3v4): Expires is POSIX s
        key_id = query["AWSAccessKeyId"][0]
        try:
            end = int(query.get("Expires", [""])[0])
        except ValueError:
            return "403 Forbidden", "AccessDenied", "Expires must be a number of seconds"
    else:
        return None
    if now > end:
        return "403 Forbidden", "AccessDenied", "Request has expired"
    ends = expiry_of(key_id)
    if ends is not None and now >= ends:
        return "400 Bad Request", "ExpiredToken", "The provided token has expired."
    return None


class Middleware:
    """moto's WSGI app behind the refusal above (server.moto_server's ``middleware``)."""

    def __init__(self, app: Any, now: Callable[[], float] = time.time,
                 expiry_of: Callable[[str], float | None] = sts_expiry) -> None:
        self.app, self._now, self._expiry_of = app, now, expiry_of

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        refused = refusal(query, self._now(), self._expiry_of) if query else None
        if refused is None:
            return self.app(environ, start_response)
        status, code, message = refused
        body = _ERROR.format(code=code, message=message).encode()
        start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]
