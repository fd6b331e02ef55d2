"""The run store: one S3 bucket per account and region, ``ec2gpu-<account>-<region>``, holding each
detached run's durable state (`ec2gpu run --detach`: runs/detached/) under ``runs/<user_id>/<run_id>/``:
its name, its key layout, and its settings (made by ``ensure``, checked by ``check``). Its objects
are read and written by aws/runstore_objects.py, a run's records by aws/runstore_records.py.

The bucket is made on first need (``ensure``) and checked by ``ec2gpu doctor`` (``check``). ec2gpu
keeps it:

- private: S3 Block Public Access, all four settings
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/access-control-block-public-access.html);
- encrypted at rest: default encryption SSE-S3
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/default-bucket-encryption.html; SSE-S3 and
  not KMS, so a run's instance role needs no KMS permission);
- TLS only: a bucket policy that denies every ``s3:*`` request whose ``aws:SecureTransport`` is
  false, as S3's security best practices advise
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html);
- bounded in time and cost: a lifecycle rule that expires objects under ``runs/`` after
  ``run_store_expire_days`` days (settings.py; S3 counts from each object's creation and rounds to
  the next midnight UTC) and aborts multipart uploads still incomplete a day after they began, whose
  parts are billed but invisible
  (https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-lifecycle-mgmt.html,
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpu-abort-incomplete-mpu-lifecycle-config.html);
- tagged ``ec2gpu:owner`` (the user whose run made it; the bucket is shared by the account's users).

Its name is predictable, so another account could take it first, or take it after the user
deleted it: every request that names the bucket carries ``ExpectedBucketOwner`` (the account in its
name), and S3 answers 403 when another account owns it
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucket-owner-condition.html).

Key layout (``prefix`` and the helpers below are its one definition): ``runs/<user_id>/<run_id>/``
holds ``state.json`` (the run's record: wire/run_record.py), ``logs/``, ``outputs/``, ``checkpoints/``,
``workdir.tar.gz`` and the rest of one run. ``user_id`` is the caller's, as STS GetCallerIdentity's
``UserId`` gives it, which is the value of the policy variable ``${aws:userid}`` (``user_id`` below): the user policy
docs/iam-policy.json lets each user of the account read, write and list ``runs/${aws:userid}/``
only, and a run's role reaches ``runs/<its ec2gpu:user tag>/<its ec2gpu:run tag>/`` only
(docs/iam-instance-boundary.json). A run id is checked against the format
``runs/provision/pipeline.new_run_id`` makes (``YYYYmmdd-HHMMSS-xxxx``) and a user id against
``USER_ID``, so no value can name a key outside its run's prefix. Every command finds a run under
its caller's own prefix: the run id is all a user gives.

Runs made before the prefix held the user id lie under ``runs/<run_id>/``: ec2gpu no longer lists
or reads them (under docs/iam-policy.json their owner may not either), and the lifecycle rule,
whose prefix is ``runs/`` still, expires them with the rest.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any

import botocore.exceptions

from ..errors import AwsError, UsageError
from ..wire import bounded_json, names, run_record, run_spec
from . import consistency, tags
from .runstore_objects import FORBIDDEN, MISSING_BUCKET, Forbidden, absent, expected_owner, get_config, request
from .session import Aws, Client, Item, Log, error_code

# --- names and keys (pure) --------------------------------------------------------------------

#: an AWS account id: 12 digits ([0-9], not \d: Python's \d also matches other scripts' digits)
_ACCOUNT = re.compile(r"[0-9]{12}")
#: a region code: us-east-1, eu-central-2, ap-southeast-4, us-gov-west-1, cn-north-1
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
#: S3's general purpose bucket names: 3-63 lowercase letters, digits, '.', '-', a letter or digit at
#: each end (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: a run id as runs/provision/pipeline.new_run_id makes it (wire/names.RUN_ID: the agent's own)
RUN_ID = names.RUN_ID
#: a caller's user id, as STS GetCallerIdentity's UserId and ${aws:userid} give it (wire/names.USER_ID,
#: where its sources are: the agent keys the run under the same prefix)
USER_ID = names.USER_ID
#: where every run's objects live, each user's under runs/USER_ID/; the lifecycle rule expires what is under it
RUNS = names.RUNS
#: the start of every run store's name (``bucket_name``): no file_mounts entry may name a bucket
#: with it (tasks/mounts.OWN_PREFIX, aws/iam.s3_policy), whatever the account or region
BUCKET_PREFIX = "ec2gpu-"

RECORD = run_record.NAME  # the run's record (wire/run_record.py)
LEGACY_RECORD = run_record.LEGACY_NAME  # its name before this release, read for one release
LOGS = "logs/"
OUTPUTS = "outputs/"
CHECKPOINTS = "checkpoints/"
WORKDIR = names.WORKDIR
CANCEL = "cancel"
SPEC = run_spec.NAME
AGENT = "agent/"
HANDOVER = "handover/"  # a run in the foreground whose controller was lost (agent/agent.py: hand_over)
#: "pool": an array's element table and element logs (pool/attempt.py), the driver's RUN_DIR/pool
HANDOVER_NAMES = {"outputs": "outputs.tar.gz", "log": "job.log", "pool": "pool.tar.gz", "record": "agent-record.json"}


def bucket_name(account_id: str, region: str) -> str:
    """The run store of ``account_id`` (12 digits) in ``region`` (a code such as us-east-1):
    ``ec2gpu-<account>-<region>`` (pure). Raises UsageError for an account id or region of another
    form, or a name S3 would refuse (more than 63 characters)."""
    if not isinstance(account_id, str) or not _ACCOUNT.fullmatch(account_id):
        raise UsageError(f"run store: {str(account_id)[:40]!r} is not an AWS account id (12 digits)",
                         "the account comes from the credentials (sts get-caller-identity)")
    if not isinstance(region, str) or not _REGION.fullmatch(region):
        raise UsageError(f"run store: {str(region)[:40]!r} is not an AWS region code",
                         "use a region code such as us-east-1 or eu-west-1 (--region)")
    name = f"{BUCKET_PREFIX}{account_id}-{region}"
    if not _BUCKET.fullmatch(name):
        raise UsageError(f"run store: {name!r} is longer than the 63 characters S3 allows in a bucket name",
                         "use a region code such as us-east-1 or eu-west-1 (--region)")
    return name


@functools.lru_cache(maxsize=32)
def partition(region: str) -> str:
    """The ARN partition of ``region`` (no AWS call; once per region and process): botocore's
    partition data (its endpoints.json, read by Session.get_partition_for_region: aws-cn for cn-*,
    aws-us-gov for us-gov-*, aws-iso, aws-iso-b, aws-iso-e...), "aws" for a region it does not know
    (the sandbox's "local") (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference-arns.html)."""
    import botocore.session
    try:
        return str(botocore.session.get_session().get_partition_for_region(region))
    except (botocore.exceptions.UnknownRegionError, ValueError):
        return "aws"


def check_run_id(run_id: str) -> str:
    """``run_id`` when all of it has new_run_id's form ``YYYYmmdd-HHMMSS-xxxx`` (8 digits, 6 digits,
    4 lowercase hex digits), so it has no '/', '..' or anything else that leaves its prefix (pure).
    Raises UsageError otherwise."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise UsageError(f"{str(run_id)[:80]!r} is not a run id",
                         "a run id looks like 20260125-103000-1a2b (ec2gpu runs --remote lists them)")
    return run_id


def user_id(identity: Item) -> str:
    """The caller's user id from STS GetCallerIdentity's answer (``identity``: aws/session.Aws.
    check_credentials), its ``UserId``: the value ``${aws:userid}`` takes in the caller's requests,
    so the prefix made here is the one docs/iam-policy.json lets the caller reach (pure). Raises
    UsageError for a value of another form (``check_user_id``)."""
    return check_user_id(identity.get("UserId") if isinstance(identity, dict) else None)


def check_user_id(user: object) -> str:
    """``user`` when all of it has USER_ID's form (pure). Raises UsageError otherwise: for a role
    session name with ",", which no tag can hold, naming it."""
    if isinstance(user, str) and USER_ID.fullmatch(user):
        return user
    if isinstance(user, str) and USER_ID.fullmatch(user.replace(",", "_")):
        raise UsageError(f"your AWS user id {user!r} holds a ',', which an AWS tag cannot hold: ec2gpu tags a run's "
                         "role and secrets with it, so that only your runs reach them",
                         "use a role session name without ',' (aws sts assume-role --role-session-name), "
                         "or an IAM user's credentials")
    raise UsageError(f"{str(user)[:80]!r} is not an AWS user id",
                     "it comes from the credentials (sts get-caller-identity's UserId)")


def user_prefix(user: str) -> str:
    """``runs/<user>/``: where every run of the user ``user`` (a USER_ID) is kept (pure). Raises
    UsageError for a value that is not a user id (check_user_id)."""
    return f"{RUNS}{check_user_id(user)}/"


def prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/``: where everything of the run is kept (pure). Raises UsageError
    for a value that is not a user id (check_user_id) or a run id (check_run_id)."""
    return f"{user_prefix(user)}{check_run_id(run_id)}/"


def record_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/state.json``: the run's record (aws/runstore_records.py: put_status, get_status)."""
    return prefix(user, run_id) + RECORD


def legacy_record_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/status.json``: the run's record as an agent of the previous release
    writes it (read for one release, when there is no ``record_key``)."""
    return prefix(user, run_id) + LEGACY_RECORD


def logs_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/logs/``: the job's logs, uploaded by the agent."""
    return prefix(user, run_id) + LOGS


def outputs_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/outputs/``: what the job wrote to $EC2GPU_OUTPUT_DIR (`ec2gpu fetch RUN`)."""
    return prefix(user, run_id) + OUTPUTS


def checkpoints_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/checkpoints/``: the job's checkpoints, which a replacement instance resumes from."""
    return prefix(user, run_id) + CHECKPOINTS


def cancel_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/cancel``: present once `ec2gpu cancel` asked the run's agent to stop."""
    return prefix(user, run_id) + CANCEL


def spec_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/spec.json``: what the agent runs (runs/plan/detached_spec.spec_document)."""
    return prefix(user, run_id) + SPEC


def agent_prefix(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/agent/``: the instance-side files the boot script fetches."""
    return prefix(user, run_id) + AGENT


def handover_keys(user: str, run_id: str) -> dict[str, str]:
    """{"outputs", "log", "pool", "record": the key under ``runs/<user>/<run_id>/handover/``}: where the
    agent of a run in the foreground puts what its lost controller did not collect (pure)."""
    return {what: prefix(user, run_id) + HANDOVER + name for what, name in HANDOVER_NAMES.items()}


def workdir_key(user: str, run_id: str) -> str:
    """``runs/<user>/<run_id>/workdir.tar.gz``: the task's workdir, as a replacement instance pulls it."""
    return prefix(user, run_id) + WORKDIR


# --- the bucket's settings (pure request builders) --------------------------------------------

#: Block Public Access: all four on
PUBLIC_ACCESS_BLOCK: dict[str, bool] = {"BlockPublicAcls": True, "IgnorePublicAcls": True,
                                        "BlockPublicPolicy": True, "RestrictPublicBuckets": True}
ENCRYPTION: Item = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}
TLS_SID = "DenyInsecureTransport"
RULE_ID = "ec2gpu-runs-expire"
ABORT_DAYS = 1


def tls_deny_statement(bucket: str, region: str = "us-east-1") -> Item:
    """The bucket policy statement that denies every S3 action on ``bucket`` and its objects to any
    principal when the request did not come over TLS (``aws:SecureTransport`` false), as
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html advises (pure)."""
    arn = f"arn:{partition(region)}:s3:::{bucket}"
    return {"Sid": TLS_SID, "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [arn, f"{arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}


def bucket_policy(bucket: str, region: str = "us-east-1", current: Item | None = None) -> Item:
    """The bucket policy (JSON as a dict, pure): ``current``'s statements (a parsed policy already
    on the bucket, kept: the user's own) but one with TLS_SID, then tls_deny_statement."""
    kept = [s for s in _listed((current or {}).get("Statement", []))
            if not (isinstance(s, dict) and s.get("Sid") == TLS_SID)]
    return {"Version": "2012-10-17", "Statement": [*kept, tls_deny_statement(bucket, region)]}


def expire_rule(expire_days: int) -> Item:
    """The lifecycle rule (pure): objects under ``runs/`` expire ``expire_days`` days after they
    were written; multipart uploads under it still incomplete ABORT_DAYS after they began are
    aborted and their parts deleted. Raises UsageError for ``expire_days`` < 1 (S3's minimum)."""
    return {"ID": RULE_ID, "Filter": {"Prefix": RUNS}, "Status": "Enabled",
            "Expiration": {"Days": _days(expire_days)},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": ABORT_DAYS}}


def lifecycle(expire_days: int, current: list[Item] | None = None) -> Item:
    """The lifecycle configuration (pure): ``current``'s rules (kept: the user's own) but one with
    RULE_ID, then expire_rule. A PutBucketLifecycleConfiguration replaces the whole configuration,
    so the others are sent again."""
    kept = [r for r in current or [] if r.get("ID") != RULE_ID]
    return {"Rules": [*kept, expire_rule(expire_days)]}


def _days(expire_days: int) -> int:
    if not isinstance(expire_days, int) or isinstance(expire_days, bool) or expire_days < 1:
        raise UsageError(f"run_store_expire_days must be a whole number of days, at least 1 (got {expire_days!r})",
                         "fix it in EC2GPU_RUN_STORE_EXPIRE_DAYS or ec2gpu.toml")
    return expire_days


def owner_tag(owner: str) -> str:
    """``owner`` as an S3 tag value (pure): tags.tag_value, "unknown" for none."""
    return tags.tag_value(owner) or "unknown"


# --- ensure and check -------------------------------------------------------------------------

def exists(s3: Client, bucket: str) -> bool:
    """Whether ``bucket`` exists and is this account's (GetBucketLocation with ExpectedBucketOwner);
    creates nothing. Not HeadBucket: it is authorised as s3:ListBucket, which the user policy
    (docs/iam-policy.json) grants on the run store only for a listing under the caller's own
    prefix (an ``s3:prefix`` condition, which a HeadBucket, carrying no prefix, never meets), so
    that no user lists another's runs; GetBucketLocation is authorised as s3:GetBucketLocation on
    the bucket (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketLocation.html). Raises
    UsageError on 403 (another account owns the name, or these credentials may not read it),
    AwsError for other errors."""
    try:
        s3.get_bucket_location(Bucket=bucket, **expected_owner(bucket))
        return True
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if code in MISSING_BUCKET:
            return False
        if code in FORBIDDEN:
            raise UsageError(f"run store: s3://{bucket} exists but is not this account's, or these credentials "
                             "may not read it (403)",
                             "allow s3:GetBucketLocation on it (docs/iam-policy.json); a name another AWS account "
                             "took cannot be used: see docs/security.md, 'The run store'") from None
        raise AwsError(f"run store: s3://{bucket}: GetBucketLocation failed ({code})", "try again") from None


def ensure(s3: Client, account_id: str, region: str, owner: str, expire_days: int, log: Log = lambda line: None) -> str:
    """The run store of ``account_id`` in ``region``, made on first need and returned by name.

    Idempotent: a bucket that exists keeps its data, and each setting of the module docstring that
    differs (Block Public Access, SSE-S3, the TLS-deny statement, the lifecycle rule with
    ``expire_days`` (>= 1), an ``ec2gpu:owner`` tag when it has none) is set again; the user's own
    policy statements, lifecycle rules and tags are kept. ``log`` hears one line per change. A
    bucket made here is configured through consistency.FreshBucket: S3 may answer NoSuchBucket for
    a moment after CreateBucket, and those answers are tried again.

    A setting these credentials may not make (403) is left as it is, and ``log`` hears one line
    naming them: docs/iam-policy.json gives a user no s3:PutBucketPolicy, PutLifecycleConfiguration,
    PutEncryptionConfiguration or PutBucketPublicAccessBlock on the run store, since whoever may set
    its bucket policy may grant themselves every user's runs (a bucket policy that names a principal
    of the account allows what it grants whatever that principal's own policies say:
    https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html), and
    whoever may set its lifecycle may expire them. An administrator's credentials set them (their
    first run, detached or with a hand-over, calls this); `ec2gpu doctor` says what the bucket lacks.
    Raises UsageError for a bad account, region or ``expire_days``, or a name another account owns
    (BucketAlreadyExists, or 403 on GetBucketLocation); AwsError for other S3 errors.
    """
    bucket = bucket_name(account_id, region)
    days = _days(expire_days)
    if not exists(s3, bucket):
        s3 = _create(s3, bucket, region)
        log(f"run store: created s3://{bucket} in {region}")
    done, refused = _apply(s3, bucket, region, owner, days)
    for what in done:
        log(f"run store: s3://{bucket}: {what}")
    if refused:
        log(f"run store: s3://{bucket}: not set, these credentials may not: {'; '.join(refused)} (docs/iam-policy.json "
            "leaves the bucket's settings to an administrator, whose credentials set them at their next run; "
            "`ec2gpu doctor` says what the bucket lacks)")
    return bucket


def _create(s3: Client, bucket: str, region: str) -> Client:
    """CreateBucket of ``bucket`` in ``region``; returns the client for its configuration calls,
    which tries them again while S3 does not see the new bucket yet (consistency.FreshBucket).
    Raises UsageError for a name another account took, AwsError for other S3 errors."""
    req: dict[str, Any] = {"Bucket": bucket}  # ACLs off: S3's default for new buckets since April 2023
    if region != "us-east-1":  # us-east-1 refuses its own name as a LocationConstraint
        req["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        s3.create_bucket(**req)
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if code == "BucketAlreadyOwnedByYou":  # made meanwhile by another command of this account
            return consistency.FreshBucket(s3, bucket)
        if code == "BucketAlreadyExists":
            raise UsageError(f"run store: the bucket name {bucket} is taken by another AWS account",
                             "S3 bucket names are global and this one is ec2gpu's for this account and region: "
                             "detached runs cannot use it (runs in the foreground still work); docs/security.md, "
                             "'The run store'") from None
        raise AwsError(f"run store: could not create s3://{bucket} ({code})", "see docs/iam-policy.json") from None
    return consistency.FreshBucket(s3, bucket)


#: S3 keeps a bucket policy to 20 KB (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-iam-policies.html)
MAX_POLICY_BYTES = 64 * 1024


def _policy_of(got: Item | None) -> Item | None:
    """The bucket policy GetBucketPolicy answered, parsed; None when absent or not a JSON object."""
    try:
        policy = bounded_json.loads((got or {}).get("Policy") or "null", max_bytes=MAX_POLICY_BYTES)
    except ValueError:
        return None
    return policy if isinstance(policy, dict) else None


def _apply(s3: Client, bucket: str, region: str, owner: str, days: int) -> tuple[list[str], list[str]]:
    """Set each setting of ``bucket`` that differs from ec2gpu's; returns (what was set, what these
    credentials were refused: 403)."""
    done: list[str] = []
    refused: list[str] = []

    def put(op: str, what: str, **kw: Any) -> None:
        try:
            request(s3, op, bucket, **kw)
            done.append(what)
        except Forbidden:
            refused.append(what)
    bpa = (get_config(s3, "get_public_access_block", bucket) or {}).get("PublicAccessBlockConfiguration", {})
    if any(bpa.get(k) is not True for k in PUBLIC_ACCESS_BLOCK):
        put("put_public_access_block", "Block Public Access on (all four)", PublicAccessBlockConfiguration=PUBLIC_ACCESS_BLOCK)
    if _encryption_problem(get_config(s3, "get_bucket_encryption", bucket)):
        put("put_bucket_encryption", "default encryption SSE-S3", ServerSideEncryptionConfiguration=ENCRYPTION)
    policy = _policy_of(get_config(s3, "get_bucket_policy", bucket))
    if not any(_denies_plain_http(s, bucket) for s in _listed((policy or {}).get("Statement", []))):
        put("put_bucket_policy", "bucket policy: requests without TLS denied",
            Policy=json.dumps(bucket_policy(bucket, region, policy)))
    rules = (get_config(s3, "get_bucket_lifecycle_configuration", bucket) or {}).get("Rules", [])
    ours = [r for r in rules if r.get("ID") == RULE_ID]
    if not ours or _normal(ours[0]) != _normal(expire_rule(days)):
        put("put_bucket_lifecycle_configuration",
            f"lifecycle: runs/ expire after {days} days, incomplete uploads aborted after {ABORT_DAYS}",
            LifecycleConfiguration=lifecycle(days, rules))
    tag_set = (get_config(s3, "get_bucket_tagging", bucket) or {}).get("TagSet", [])
    if not any(t.get("Key") == tags.OWNER for t in tag_set):
        put("put_bucket_tagging", f"tagged {tags.OWNER}",
            Tagging={"TagSet": [*tag_set, {"Key": tags.OWNER, "Value": owner_tag(owner)}]})
    return done, refused


def _normal(rule: Item) -> tuple[Any, ...]:
    """What of a lifecycle rule ec2gpu sets, comparable across S3's spellings of it."""
    return (rule.get("Status"), _rule_prefix(rule), (rule.get("Expiration") or {}).get("Days"),
            (rule.get("AbortIncompleteMultipartUpload") or {}).get("DaysAfterInitiation"))


def _rule_prefix(rule: Item) -> str | None:
    """The key prefix a lifecycle rule applies to: its Filter's Prefix, the legacy top-level Prefix,
    "" for an empty filter (every object); None for a rule that picks objects otherwise (tags, sizes)."""
    flt = rule.get("Filter")
    if flt is None:
        p = rule.get("Prefix")
        return p if isinstance(p, str) else None
    if not isinstance(flt, dict):
        return None
    if not flt:
        return ""
    if set(flt) == {"Prefix"} and isinstance(flt["Prefix"], str):
        return str(flt["Prefix"])
    return None


def _covers_runs(rule: Item) -> bool:
    p = _rule_prefix(rule)
    return rule.get("Status") == "Enabled" and p is not None and RUNS.startswith(p)


def runs_expire_days(rules: list[Item]) -> int | None:
    """The fewest days after which an Enabled lifecycle rule of ``rules`` (GetBucketLifecycleConfiguration's
    Rules, anyone's) expires an object under runs/ (its Expiration.Days), None when none does (pure).
    S3 adds the days to the object's creation and rounds up to the next midnight UTC, so an object
    lives at least that long (https://docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html)."""
    days = [r["Expiration"]["Days"] for r in rules if isinstance(r, dict) and _covers_runs(r)
            and isinstance((r.get("Expiration") or {}).get("Days"), int)]
    return min(days) if days else None


#: a detached run's files must outlive its limit by this much (s): the upload before its deadline is
#: taken, and clocks
STORE_MARGIN_S = 3600


def check_keeps(s3: Client, bucket: str, expire_days: int, minutes: int) -> None:
    """Refuse (UsageError, nothing made) a detached run whose limit (``minutes``) outlasts its files
    in the run store: every instance its group launches, a spot replacement days in too, fetches the
    agent, spec.json, the workdir and the local file_mounts from the run's prefix, and the bucket's
    lifecycle expires them ``days`` after they were written (S3 rounds up to the next midnight UTC:
    runs_expire_days). ``days``: the fewest of the bucket's rules that expire runs/ (anyone's,
    as GetBucketLifecycleConfiguration answers; none for a bucket not made yet) and of ``expire_days``
    (run_store_expire_days, which ``ensure`` sets where these credentials may; alone when they may
    not read the rules: s3:GetLifecycleConfiguration, which docs/iam-policy.json grants). Raises
    AwsError for other errors."""
    try:
        rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket, **expected_owner(bucket)).get("Rules", [])
    except botocore.exceptions.ClientError as exc:
        if not absent(error_code(exc)) and error_code(exc) not in FORBIDDEN:
            raise AwsError(f"run store: s3://{bucket}: GetBucketLifecycleConfiguration failed ({error_code(exc)})",
                           "try again") from None
        rules = []
    found = runs_expire_days(rules if isinstance(rules, list) else [])
    days = min(d for d in (found, expire_days) if d)
    if minutes * 60 + STORE_MARGIN_S <= days * 86400:
        return
    source = f"s3://{bucket}'s lifecycle rule" if found == days else "run_store_expire_days"
    limit = (f"{minutes // 1440}d" if minutes % 1440 == 0 else f"{minutes // 60}h" if minutes % 60 == 0
             else f"{minutes}m")  # the spelling --max-runtime takes
    raise UsageError(f"a detached run's limit of {limit} outlasts its files in the run store: {source} expires "
                     f"them after {days} days, and an instance launched after that (a spot replacement) could not "
                     "fetch its agent, spec and workdir",
                     f"give --max-runtime {days * 24 - 1}h or less, or raise run_store_expire_days (ec2gpu.toml, "
                     "EC2GPU_RUN_STORE_EXPIRE_DAYS; the bucket's rule is set by credentials that may: "
                     "docs/iam-policy.json)")


def _lifecycle_problems(rules: list[Item], expire_days: int | None) -> list[str]:
    out = []
    expiring = [r for r in rules if _covers_runs(r) and isinstance((r.get("Expiration") or {}).get("Days"), int)]
    if not expiring:
        out.append("no lifecycle rule expires what is under runs/: run data is kept (and billed) forever")
    elif expire_days is not None and all(r["Expiration"]["Days"] != expire_days for r in expiring):
        got = ", ".join(str(r["Expiration"]["Days"]) for r in expiring)
        out.append(f"runs/ expire after {got} days, not the {expire_days} that run_store_expire_days asks for")
    if not any(_covers_runs(r) and (r.get("AbortIncompleteMultipartUpload") or {}).get("DaysAfterInitiation")
               for r in rules):
        out.append("no lifecycle rule aborts incomplete multipart uploads: their parts are kept (and billed) unseen")
    return out


def _encryption_problem(got: Item | None) -> str | None:
    if got is None:
        return "no default encryption"
    algos = [(r.get("ApplyServerSideEncryptionByDefault") or {}).get("SSEAlgorithm")
             for r in (got.get("ServerSideEncryptionConfiguration") or {}).get("Rules", [])]
    if "AES256" not in algos:
        return (f"default encryption is {', '.join(str(a) for a in algos) or 'unset'}, not SSE-S3 (AES256): "
                "a run's instance role has no KMS permission")
    return None


def _listed(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def _denies_plain_http(stmt: Any, bucket: str) -> bool:
    """Whether a policy statement denies every S3 action on ``bucket`` and its objects, to everyone,
    when aws:SecureTransport is false (tls_deny_statement, or an equivalent the user wrote)."""
    if not isinstance(stmt, dict) or stmt.get("Effect") != "Deny":
        return False
    principal = stmt.get("Principal")
    if principal != "*" and not (isinstance(principal, dict) and "*" in _listed(principal.get("AWS"))):
        return False
    if "s3:*" not in _listed(stmt.get("Action")) and "*" not in _listed(stmt.get("Action")):
        return False
    resources = {str(r).split(":::", 1)[-1] for r in _listed(stmt.get("Resource"))}
    if not ({bucket, f"{bucket}/*"} <= resources or "*" in _listed(stmt.get("Resource"))):
        return False
    secure = ((stmt.get("Condition") or {}).get("Bool") or {}).get("aws:SecureTransport")
    return [str(v).lower() for v in _listed(secure)] == ["false"]


def check(s3: Client, bucket: str, expire_days: int | None = None) -> list[str]:
    """What of the module docstring's settings ``bucket`` lacks, one sentence each; [] when it has
    them all. ``expire_days``, when given, must also be the days of the rule that expires runs/.
    Reads only (Get* with ExpectedBucketOwner), creates nothing; a missing bucket or configuration
    (NoSuch* codes) is a problem, not an error. Raises AwsError for other S3 errors (403: these
    credentials may not read the setting)."""
    if get_config(s3, "get_bucket_location", bucket) is None:  # not HeadBucket: ``exists`` says why
        return [f"s3://{bucket} does not exist"]
    problems = []
    bpa = get_config(s3, "get_public_access_block", bucket)
    if bpa is None:
        problems.append("Block Public Access is not set on the bucket")
    else:
        conf = bpa.get("PublicAccessBlockConfiguration", {})
        problems += [f"Block Public Access: {k} is off" for k in PUBLIC_ACCESS_BLOCK if conf.get(k) is not True]
    encryption = _encryption_problem(get_config(s3, "get_bucket_encryption", bucket))
    if encryption:
        problems.append(encryption)
    got = get_config(s3, "get_bucket_policy", bucket)
    policy = _policy_of(got)
    if got is None:
        problems.append("no bucket policy: requests without TLS are not denied")
    elif not any(_denies_plain_http(s, bucket) for s in _listed((policy or {}).get("Statement", []))):
        problems.append("the bucket policy does not deny requests without TLS (aws:SecureTransport false)")
    life = get_config(s3, "get_bucket_lifecycle_configuration", bucket)
    if life is None:
        problems.append("no lifecycle configuration: run data under runs/ never expires and incomplete multipart "
                        "uploads are kept (and billed)")
    else:
        problems += _lifecycle_problems(life.get("Rules", []), expire_days)
    return problems


def store(aws: Aws) -> tuple[Any, str, str]:
    """(an S3 client, the run store's name, the caller's user id: whose prefix ``runs/USER_ID/``
    holds the caller's runs) of ``aws``'s account and region. Raises NoCredentials, AwsError,
    UsageError (a user id no tag holds: aws/runstore.user_id)."""
    identity = aws.check_credentials()
    return (aws.client("s3"), bucket_name(identity["Account"], aws.region), user_id(identity))
