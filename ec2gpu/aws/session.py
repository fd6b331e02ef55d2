"""boto3 clients: retry mode "adaptive", an endpoint override (the sandbox), clear credential errors.

Retry modes: https://boto3.amazonaws.com/v1/documentation/api/latest/guide/retries.html
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import boto3
import botocore.config
import botocore.credentials
import botocore.exceptions

from ..errors import AwsError, NoCredentials, UsageError

RETRIES = {"mode": "adaptive", "max_attempts": 8}  # throttling backs off, bounded
#: for calls whose failure means "try the next zone/type": no SDK retries at all (EC2 answers
#: InsufficientInstanceCapacity with HTTP 500, which the SDK's modes would retry in place)
FAIL_FAST = {"mode": "standard", "total_max_attempts": 1}  # max_attempts counts retries: 1 would retry once
#: error codes that mean "slow down": retried in place even by the fail-fast client
THROTTLED = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})

#: EC2's eventual consistency: a resource made a moment ago can be "not found" by the next call
#: (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html). botocore retries
#: none of these, so they are retried with bounded backoff here: these codes, for these operations only.
NOT_YET_VISIBLE: dict[str, frozenset[str]] = {
    "CreateTags": frozenset({"InvalidInstanceID.NotFound"}),
    "DescribeInstances": frozenset({"InvalidInstanceID.NotFound"}),
    "GetConsoleOutput": frozenset({"InvalidInstanceID.NotFound"}),
    "TerminateInstances": frozenset({"InvalidInstanceID.NotFound"}),
    "AuthorizeSecurityGroupIngress": frozenset({"InvalidGroup.NotFound"}),
    "RunInstances": frozenset({"InvalidGroup.NotFound", "InvalidKeyPair.NotFound"}),
}
EXTRA_ATTEMPTS = 7  # at most 7 retries: 0.25, 0.5, 1, 2, 4, 4, 4 s (about 16 s in all)

#: a boto3 client (ec2, sts, iam, s3, pricing, ...): boto3 has no type information here (no
#: boto3-stubs), so its clients are Any; the alias names what a parameter holds
Client = Any
#: What a boto3 call raises, by the names the layers above aws/ catch it (they never import botocore):
#: AWS answered and refused (ClientError: its code is ``error_code(exc)``, its operation ``exc.operation_name``),
#: or botocore's own failure (BotoCoreError: no network, an endpoint that does not answer;
#: NoCredentialsError among them). botocore/exceptions.py defines them.
ClientError = botocore.exceptions.ClientError
BotoCoreError = botocore.exceptions.BotoCoreError
NoCredentialsError = botocore.exceptions.NoCredentialsError
AWS_ERRORS = (ClientError, BotoCoreError)
#: a response item of a DescribeX / GetX call (an instance, an image, a volume): JSON as boto3 parses it
Item = dict[str, Any]
#: where a function's progress lines go (print, a reporter's log); what it returns is ignored
Log = Callable[[str], object]
#: botocore's ``needs-retry`` handler: the delay in seconds, or None to leave the decision to the retry mode
RetryHandler = Callable[..., float | None]


def backoff_s(attempt: int, base_s: float = 0.25, cap_s: float = 4.0) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): base doubling, capped (pure)."""
    return min(cap_s, base_s * 2.0 ** (attempt - 1))


def retry_handler(codes_by_operation: dict[str, frozenset[str]], also: frozenset[str] = frozenset(),
                  max_retries: int = EXTRA_ATTEMPTS) -> RetryHandler:
    """A botocore ``needs-retry`` handler: the delay (s) when the error code is listed for the
    operation (or in ``also``, for any operation) and fewer than ``max_retries`` retries were made;
    None otherwise, leaving the decision to the client's own retry mode."""
    def needs_retry(attempts: int, response: tuple[Any, Item] | None = None, operation: Any = None,
                    **_: Any) -> float | None:
        if response is None or operation is None or attempts > max_retries:
            return None
        code: str | None = response[1].get("Error", {}).get("Code")
        if code in also or code in codes_by_operation.get(operation.name, ()):
            return backoff_s(attempts)
        return None
    return needs_retry


_LOADER: Any = None  # botocore's data loader, shared by every Aws of this process (its models are parsed once)


def _boto3_session(**kwargs: Any) -> boto3.session.Session:
    """A boto3 Session (``kwargs``: its region and credentials) over ``_botocore_session``."""
    core = _botocore_session()
    session = boto3.session.Session(botocore_session=core, **kwargs)
    paths = core.get_component("data_loader").search_paths  # boto3 appends its data folder per Session
    paths[:] = list(dict.fromkeys(paths))
    return session


def check_region(region: str, session: boto3.session.Session | None = None) -> None:
    """Raise UsageError for a ``region`` EC2 does not have: not in botocore's endpoint data for ec2
    (``session``'s, else a new session's; no AWS call), nor the sandbox's "local"."""
    if session is None:
        session = _boto3_session()
    if region not in session.get_available_regions("ec2") + ["local"]:
        raise UsageError(f"unknown AWS region {region!r}",
                         "use a region code such as us-east-1, us-west-2 or eu-west-1 (--region)")


def _botocore_session() -> Any:
    """A new botocore session that shares this process's data loader: service models and endpoint
    data are read once per process (about 0.13 s for ec2, sts and iam) instead of once per ``Aws``,
    while credentials are still resolved per session (the sandbox's and AWS's never mix).
    Measured: scripts/bench_aws_session.py."""
    import botocore.session
    global _LOADER
    session = botocore.session.Session()
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)
    return session


@dataclass
class Aws:
    """One region's clients. ``endpoint_url`` points every client at the sandbox when set, and
    ``credentials`` (access key id, secret access key, session token or None) are then the
    sandbox's; None: boto3's own chain (environment, profile, SSO, instance role). ``checkip_url``:
    the "what is my IP" service a security group is opened from (None: network.CHECKIP_URL). All
    come from the command's ``Backend``, never from os.environ after start-up."""

    region: str
    endpoint_url: str | None = None
    credentials: tuple[str, str, str | None] | None = field(default=None, repr=False)
    checkip_url: str | None = None
    _session: boto3.session.Session = field(init=False, repr=False)
    _clients: dict[tuple[str, bool], Client] = field(default_factory=dict, init=False, repr=False)
    _identity: Item | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        key, secret, token = self.credentials or (None, None, None)
        self._session = _boto3_session(region_name=self.region, aws_access_key_id=key, aws_secret_access_key=secret,
                                       aws_session_token=token)
        check_region(self.region, self._session)

    def client(self, service: str, fail_fast: bool = False) -> Client:
        """A cached boto3 client for ``service``; ``fail_fast`` disables SDK retries."""
        key = (service, fail_fast)
        if key not in self._clients:
            # S3: URLs it presigns use SigV4 too (botocore's default for them is still SigV2 in some
            # regions, which AWS deprecated: https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-authenticating-requests.html)
            cfg = botocore.config.Config(retries=FAIL_FAST if fail_fast else RETRIES,
                                         connect_timeout=10, read_timeout=60,
                                         **({"signature_version": "s3v4"} if service == "s3" else {}))
            client = self._session.client(service, endpoint_url=self.endpoint_url, config=cfg)
            if service == "ec2":  # consulted when the retry mode's own handler declines (returns None)
                client.meta.events.register("needs-retry.ec2", retry_handler(
                    NOT_YET_VISIBLE, also=THROTTLED if fail_fast else frozenset()))
            self._clients[key] = client
        return self._clients[key]

    def in_region(self, region: str) -> "Aws":
        """The clients of ``region`` with this one's endpoint, credentials and checkip service."""
        if region == self.region:
            return self
        return Aws(region, self.endpoint_url, self.credentials, self.checkip_url)

    def partition_regions(self) -> list[str]:
        """The EC2 regions of the standard AWS partition that botocore knows."""
        regions: list[str] = self._session.get_available_regions("ec2")
        return regions

    def enabled_regions(self) -> list[str]:
        """The EC2 regions this account has enabled (DescribeRegions, which lists only those by default:
        https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeRegions.html) that are in the
        standard partition botocore knows (partition_regions: DescribeRegions may list other partitions'
        regions, China's or GovCloud's), sorted. Raises botocore's errors."""
        known = set(self.partition_regions())
        return sorted(r["RegionName"] for r in self.ec2.describe_regions()["Regions"] if r["RegionName"] in known)

    def pricing(self) -> Client:
        """A Price List API client; that API is served from us-east-1 whatever the region."""
        key = ("pricing", False)
        if key not in self._clients:
            cfg = botocore.config.Config(retries=RETRIES, connect_timeout=10, read_timeout=60)
            self._clients[key] = self._session.client("pricing", region_name="us-east-1",
                                                      endpoint_url=self.endpoint_url, config=cfg)
        return self._clients[key]

    @property
    def ec2(self) -> Client:
        return self.client("ec2")

    def credentials_expire_at(self) -> datetime | None:
        """When the credentials that sign this Aws's requests (and the URLs it presigns) stop
        working (UTC), or None when they do not expire: an IAM user's access keys, the sandbox's.

        Temporary credentials (SSO, an assumed role, an instance profile, AWS_CREDENTIAL_EXPIRATION
        beside environment keys) are botocore's RefreshableCredentials, whose ``_expiry_time`` is
        their end (botocore/credentials.py: ``refresh_needed`` reads it). They are refreshed first
        when near their end (``get_frozen_credentials``: within botocore's advisory 15 min), so the
        time said is that of the credentials the next signature uses. A URL presigned with them
        stops working at that time, whatever its ExpiresIn
        (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-presigned-url.html).
        Raises botocore's errors when a refresh fails (an expired SSO session: TokenRetrievalError)."""
        creds = self._session.get_credentials()  # the botocore object (boto3 returns it as it is)
        if not isinstance(creds, botocore.credentials.RefreshableCredentials):
            return None
        creds.get_frozen_credentials()  # refreshed now if near its end; a deferred one is fetched
        expiry: datetime | None = creds._expiry_time
        if expiry is None:
            return None
        return (expiry if expiry.tzinfo else expiry.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)

    def check_credentials(self) -> Item:
        """Return the caller identity (Account, Arn, UserId): asked of STS once per ``Aws`` (a run
        asks for it before its estimate and again for the account's permissions boundary).

        Raises AwsError with a hint when there are no credentials or they are rejected (asked again
        at the next call).
        """
        if self._identity is not None:
            return self._identity
        try:
            identity: Item = self.client("sts").get_caller_identity()
            self._identity = identity
            return identity
        except botocore.exceptions.NoCredentialsError:
            raise NoCredentials() from None
        except botocore.exceptions.ClientError as exc:
            raise AwsError(f"AWS rejected the credentials: {describe(exc)}",
                           "check the access key, its expiry (aws sso login) and the region")
        except botocore.exceptions.EndpointConnectionError as exc:
            raise AwsError(f"cannot reach AWS: {exc}", "check the network, or use --sandbox")


def describe(exc: botocore.exceptions.ClientError) -> str:
    """'Code: Message' of a ClientError."""
    err = exc.response.get("Error", {})
    return f"{err.get('Code', '?')}: {err.get('Message', '')}".strip()


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a ClientError, else None."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code: str | None = exc.response.get("Error", {}).get("Code")
        return code
    return None


def sandbox_endpoint() -> str | None:
    """The endpoint URL from AWS_ENDPOINT_URL (what `ec2gpu sandbox env` exports), if any."""
    return os.environ.get("AWS_ENDPOINT_URL") or None
