"""``file_mounts``: files a task puts on its instances besides the workdir, read as SkyPilot reads them.

SkyPilot's field (https://docs.skypilot.co/en/latest/reference/yaml-spec.html#file-mounts and
"Cloud storage": https://docs.skypilot.co/en/latest/reference/storage.html) maps a path on the
instance (the target: ``/data``, ``~/models``; a relative one is under the home directory) to:

- a local path (a directory or a file): sent like the workdir (its ignore rules, secrets
  withheld, the upload size limit), before the setup runs;
- ``s3://BUCKET[/PREFIX]``: copied onto the instance before the setup, by the instance itself with
  the run's own instance role (aws/iam.py: read access to that prefix only), never with this
  machine's keys;
- a storage entry ``{source: s3://..., mode: COPY | MOUNT | MOUNT_CACHED}`` or ``{name: BUCKET,
  mode: MOUNT}``: COPY is the copy above. MOUNT and MOUNT_CACHED (SkyPilot's read-write mounts)
  are copied in the same way, and what the job then writes under the target is written back to
  the bucket every minute while the job runs and when it ends (ec2gpu makes no FUSE mount;
  the run says so). A bucket named with
  no source is created when it does not exist: private, encrypted, public access blocked.

Whose buckets (issue 44, item 2): a bucket named ``ec2gpu-*`` (``OWN_PREFIX``: the run store,
which holds every run's outputs and every detached run's agent code) is refused as a source in any
mode. A MOUNT mode writes back only to the task's own bucket (one it names with ``name:`` and no
source, for ec2gpu to make) or to one the user names with ``--allow-write-bucket`` (``check_write``),
as ``--workdir-outside`` does for a local path; COPY only reads and needs no flag.

Other clouds' stores (``gs://``, ``r2://``, ``cos://``, ``oci://``, Azure's ``https://...blob...``)
are refused with a hint. Pure apart from ``check_local_source`` (links, $HOME).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..errors import UsageError

MODES = ("COPY", "MOUNT", "MOUNT_CACHED")
MAX_TARGET = 1024  # characters in one target path
#: the characters a target may hold: none that a remote shell (rsync before 3.2.4 passes the remote
#: path through it, https://download.samba.org/pub/rsync/NEWS#3.2.4) or ssh would read
TARGET_RE = re.compile(r"~?[A-Za-z0-9._+@,=/-]*")
#: S3 bucket names: 3-63 characters, lowercase letters, digits, dots and hyphens, a letter or digit
#: at each end (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: other clouds' object stores, as SkyPilot names them (sky/data/storage.py StoreType and its URL schemes)
OTHER_STORES = {"gs": "Google Cloud Storage", "gcs": "Google Cloud Storage", "r2": "Cloudflare R2",
                "cos": "IBM Cloud Object Storage", "oci": "OCI Object Storage", "nebius": "Nebius Object Storage",
                "az": "Azure Blob Storage", "azure": "Azure Blob Storage", "cw": "CoreWeave Object Storage",
                "hf": "Hugging Face"}
STORE_HINT = "copy the data to an S3 bucket (aws s3 sync) and name s3://BUCKET/PREFIX, or send a local copy"
#: the names of ec2gpu's own buckets: aws/runstore.BUCKET_PREFIX (the run store, ``ec2gpu-ACCOUNT-REGION``);
#: not imported from there (boto3, which a dry run never loads): tests/unit/test_file_mounts.py checks they agree
OWN_PREFIX = "ec2gpu-"
#: the flag that lets a MOUNT entry write back to a bucket the task does not make (cli/tasks.py)
WRITE_FLAG = "--allow-write-bucket"


class Storage(BaseModel):
    """SkyPilot's storage entry, a file_mounts value that is a mapping."""

    model_config = ConfigDict(extra="forbid")

    name: Optional[str] = Field(None, description="an S3 bucket: created (private, encrypted) when it does not exist")
    source: Optional[Union[str, list[str]]] = Field(None, description="s3://BUCKET[/PREFIX] or a local path")
    store: Optional[str] = Field(None, description="s3 (the only store ec2gpu reaches)")
    mode: Literal["COPY", "MOUNT", "MOUNT_CACHED"] = Field(
        "MOUNT", description="COPY: copied in before setup; MOUNT, MOUNT_CACHED: copied in, and what the job writes "
                             "there is written back to the bucket every minute and when it ends")
    persistent: bool = Field(True, description="SkyPilot's: delete a bucket it created with the run (false); "
                                               "ec2gpu keeps every bucket, and says so")
    config: Optional[dict[Any, Any]] = Field(None, description="SkyPilot's per-store options: not read (warned)")


@dataclass(frozen=True)
class Mount:
    """One file_mounts entry made ready (pure data).

    ``target`` is as written (/data, ~/x, x); ``kind`` "local" (``source`` an absolute path on this
    machine, ``is_file`` for one file) or "s3" (``bucket``, ``prefix``; ``write_back`` for MOUNT
    modes; ``create`` when a bucket is named with no source; ``write_allowed`` when the user named
    the bucket with --allow-write-bucket: ``check_writes``)."""

    target: str
    kind: str
    source: str
    mode: str = "COPY"
    bucket: Optional[str] = None
    prefix: str = ""
    write_back: bool = False
    create: bool = False
    is_file: bool = False
    write_allowed: bool = False

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.kind == "s3" else self.source

    def on_instance(self, home: str, root: str = "") -> str:
        """This entry's absolute path on an instance (pure): module ``on_instance`` of its target."""
        return on_instance(self.target, home, root)

    def words(self) -> str:
        """What this entry becomes, in one line (pure)."""
        if self.kind == "local":
            return f"{self.source} sent to {self.target} ({'a file' if self.is_file else 'rsync, the workdir rules'})"
        how = f"{self.url} copied to {self.target} by the instance's own role"
        if self.create:
            how += " (the bucket is created, private and encrypted, if it does not exist)"
        if self.write_back:
            how += (f"; what the job writes there is written back to {self.url} every minute and when it ends "
                    f"(mode {self.mode}: copied, not FUSE-mounted)")
        return how


def check_target(target: str) -> str:
    """``target`` when it is a path ec2gpu may write on the instance (pure): absolute, under ``~``,
    or relative (then under the home directory); only the characters of ``TARGET_RE``; no ``..``,
    not ``/`` or ``~`` themselves. Raises ValueError saying which rule it breaks."""
    t = str(target)
    if not t.strip() or len(t) > MAX_TARGET or any(ord(c) < 32 or ord(c) == 127 for c in t):
        raise ValueError(f"{t[:60]!r} is not a path: give an absolute path (/data) or one under ~ (~/data)")
    if not TARGET_RE.fullmatch(t):
        raise ValueError(f"{t[:60]!r}: a target path may hold only letters, digits and . _ - + @ , = / "
                         "(rsync before 3.2.4 splits a remote path at spaces and shell characters)")
    rel = t[1:] if t.startswith("~") else t
    if t.startswith("~") and rel and not rel.startswith("/"):
        raise ValueError(f"{t[:60]!r}: only your own home (~/...) is known on the instance")
    parts = PurePosixPath(rel).parts
    if ".." in parts:
        raise ValueError(f"{t[:60]!r} goes up with '..': name the directory itself")
    if not [p for p in parts if p not in ("/", ".")]:
        raise ValueError(f"{t[:60]!r} is the root or the home directory itself: name a directory in it, e.g. /data")
    return t


def parse_s3(url: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://BUCKET[/PREFIX]`` (pure; the prefix without a leading /). Raises
    ValueError for a bucket name S3 does not allow (BUCKET_RE) or ``..`` in the prefix."""
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if not BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"{url[:80]!r}: {bucket[:63]!r} is not an S3 bucket name (3-63 lowercase letters, digits, "
                         ". and -)")
    if ".." in PurePosixPath(prefix).parts:
        raise ValueError(f"{url[:80]!r}: '..' in the key prefix")
    return bucket, prefix.lstrip("/")


def _scheme(source: str) -> Optional[str]:
    m = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*)://", source)
    return m.group(1).lower() if m else None


def _refuse_store(source: str) -> None:
    scheme = _scheme(source)
    if scheme in OTHER_STORES:
        raise ValueError(f"{source[:80]!r} is in {OTHER_STORES[scheme]}: ec2gpu runs on AWS and copies from S3 "
                         f"only ({STORE_HINT})")
    if scheme in ("http", "https") and ".blob.core.windows.net" in source:
        raise ValueError(f"{source[:80]!r} is in Azure Blob Storage: ec2gpu copies from S3 only ({STORE_HINT})")
    if scheme is not None and scheme != "s3":
        raise ValueError(f"{source[:80]!r}: {scheme}:// is not a store ec2gpu reads ({STORE_HINT})")


def entry(target: str, value: Union[str, Storage, dict[str, Any]], base: Path, check_local: Callable[[Path], Path],
          warnings: list[str]) -> Mount:
    """One file_mounts entry, ``target``: ``value`` (a local path, s3://..., or a storage entry),
    made ready. ``base`` is the task file's directory (relative sources start there);
    ``check_local(path)`` resolves and checks a local source (tasks/load.check_local_source).
    Appends to ``warnings`` what differs from SkyPilot's meaning. Raises ValueError saying what is
    wrong (the caller adds the file and line), or check_local's UsageError."""
    check_target(target)
    if isinstance(value, dict):
        value = Storage.model_validate(value)
    if isinstance(value, Storage):
        if value.store is not None and value.store.lower() != "s3":
            raise ValueError(f"store {value.store!r}: ec2gpu reaches S3 only ({STORE_HINT})")
        if isinstance(value.source, list):
            raise ValueError("a list of sources: give one file_mounts entry per source")
        if value.config:
            warnings.append(f"file_mounts.{target}.config: SkyPilot's store options are not read")
        if not value.persistent:
            warnings.append(f"file_mounts.{target}.persistent: false: ec2gpu never deletes a bucket; it stays")
        if value.source is None and value.name is None:
            raise ValueError("a storage entry needs a bucket (name: my-bucket) or a source (source: s3://...): this one "
                             "has neither (an empty name: is a placeholder to fill in)")
        if value.source is None:
            assert value.name is not None  # refused just above when both are None
            refuse_own(value.name)
            if not BUCKET_RE.fullmatch(value.name):
                raise ValueError(f"name {value.name[:63]!r} is not an S3 bucket name (3-63 lowercase letters, digits, "
                                 ". and -)")
            return Mount(target, "s3", f"s3://{value.name}", value.mode, value.name, "",
                         write_back=value.mode != "COPY", create=True)
        if _scheme(value.source) is None:
            if value.name:
                warnings.append(f"file_mounts.{target}: the local source is sent to the instance; no bucket "
                                f"{value.name} is made")
            return _local(target, value.source, base, check_local)
        _refuse_store(value.source)
        refuse_own(_bucket_text(value.source))
        bucket, prefix = parse_s3(value.source)
        return Mount(target, "s3", value.source, value.mode, bucket, prefix, write_back=value.mode != "COPY")
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{str(value)[:60]!r}: give a local path, s3://BUCKET/PREFIX, or a storage entry "
                         "{source:, mode:}")
    if _scheme(value) is None:
        return _local(target, value, base, check_local)
    _refuse_store(value)
    refuse_own(_bucket_text(value))
    bucket, prefix = parse_s3(value)
    return Mount(target, "s3", value, "COPY", bucket, prefix)


def _local(target: str, source: str, base: Path, check_local: Callable[[Path], Path]) -> Mount:
    path = check_local(base / Path(source).expanduser())
    if not path.exists():
        raise ValueError(f"{source[:80]!r}: no such file or directory here ({path})")
    if not (path.is_dir() or path.is_file()):
        raise ValueError(f"{source[:80]!r} is neither a file nor a directory")
    return Mount(target, "local", str(path), is_file=path.is_file())


def normal_target(target: str) -> str:
    """``target`` in one spelling (pure): ``~/x`` and ``x`` both ``~/x``; ``/a/./b/`` is ``/a/b``."""
    t = target[1:].lstrip("/") if target.startswith("~") else target
    if t.startswith("/"):
        return str(PurePosixPath(t))
    return "~/" + str(PurePosixPath(t))


def on_instance(target: str, home: str, root: str = "") -> str:
    """The absolute path of ``target`` on an instance whose home is ``home`` (pure). ``root``: the
    sandbox instance's own root directory (EC2GPU_SANDBOX_ROOT), under which an absolute target is
    placed, so a sandbox run never writes outside its instance's directory; on EC2 it is empty."""
    t = normal_target(target)
    if t.startswith("~/"):
        return f"{home.rstrip('/')}/{t[2:]}"
    return f"{root.rstrip('/')}{t}" if root else t


def _bucket_text(url: str) -> str:
    """The bucket part of ``s3://BUCKET/...`` as written, before any check (pure)."""
    return url[len("s3://"):].partition("/")[0]


def refuse_own(bucket: str) -> str:
    """``bucket`` when it is not one of ec2gpu's own (pure): a name starting ``ec2gpu-`` in any case
    (OWN_PREFIX; S3 names are lowercase, and one spelled otherwise is refused all the same) is the
    run store's kind, which holds every run's outputs, checkpoints and logs and every detached
    run's agent code, run as root by its replacement instances. Raises UsageError (the caller adds
    the file and line)."""
    if bucket.strip().lower().startswith(OWN_PREFIX):
        raise UsageError(f"s3://{bucket[:63]} is ec2gpu's own bucket ({OWN_PREFIX}*: the run store, every run's "
                         "outputs, logs and agent code): never a file_mounts source, in any mode",
                         "copy what the job needs to a bucket of your own (aws s3 sync), or bring a run's outputs "
                         "home with `ec2gpu fetch RUN_ID`")
    return bucket


def own_buckets(mounts_: list[Mount]) -> frozenset[str]:
    """The task's own buckets (pure): those it names with ``name:`` and no source, for ec2gpu to
    make when missing (one that exists is checked by aws/storage.check_buckets)."""
    return frozenset(m.bucket for m in mounts_ if m.kind == "s3" and m.create and m.bucket)


def check_write(m: Mount, own: frozenset[str], allowed: frozenset[str]) -> Mount:
    """``m`` with ``write_allowed`` set when its bucket is in ``allowed`` (--allow-write-bucket)
    (pure). A MOUNT-mode entry writes back to its bucket: it may where the bucket is one of the
    task's ``own`` (own_buckets) or in ``allowed``. Raises UsageError for a MOUNT entry of any
    other bucket (the caller adds the file and line); COPY entries pass: they only read."""
    if m.kind == "s3" and m.bucket in allowed:
        return replace(m, write_allowed=True)
    if m.write_back and m.bucket not in own:
        raise UsageError(f"mode {m.mode} writes back to s3://{m.bucket}, a bucket this task does not make: the job "
                         f"could change or replace anything under {m.url}",
                         f"give {WRITE_FLAG} {m.bucket} to let the job write there, or mode: COPY to read it only")
    return m


#: why a MOUNT entry of a ``name:`` bucket may write back, as the plan says it: before anything is
#: made, the plan cannot know yet whether aws/storage.check_buckets will take an existing bucket of
#: that name for the task's own (only one ec2gpu made for the caller) or refuse it
OWN_WHY = "the task's own bucket (name:), made for you by ec2gpu (an existing one only if ec2gpu made it for you)"


def access(mounts_: list[Mount]) -> dict[str, list[Any]]:
    """What the job may reach in S3 through its instance role (aws/iam.s3_policy grants exactly
    this) (pure): {"read": [url, ...], "write": [{"url", "why"}, ...]}, each in the file's order
    without repeats; ``why`` is OWN_WHY or "--allow-write-bucket BUCKET"."""
    s3 = [m for m in mounts_ if m.kind == "s3"]
    writes = {m.url: (f"{WRITE_FLAG} {m.bucket}" if m.write_allowed else OWN_WHY) for m in s3 if m.write_back}
    return {"read": list(dict.fromkeys(m.url for m in s3)),
            "write": [{"url": url, "why": why} for url, why in writes.items()]}


def access_words(got: dict[str, list[Any]]) -> str | None:
    """``access``'s dict in one line, or None when the job reaches no bucket (pure)."""
    if not got.get("read"):
        return None
    writes = ", ".join(f"{w['url']} ({w['why']})" for w in got.get("write", []))
    return (f"S3, through the run's own role: the job may read {', '.join(got['read'])}; may write "
            f"{writes or 'nothing'}; nothing else")


def check_flag(buckets: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The --allow-write-bucket values as a set (pure). Raises UsageError for a value that is not
    an S3 bucket name (a URL or a prefix is named as its bucket) or one of ec2gpu's own."""
    for b in buckets:
        if not isinstance(b, str) or not BUCKET_RE.fullmatch(b):
            raise UsageError(f"{WRITE_FLAG} {str(b)[:80]!r}: not an S3 bucket name (3-63 lowercase letters, digits, "
                             ". and -)", f"give the bucket alone, e.g. {WRITE_FLAG} my-results")
        try:
            refuse_own(b)
        except UsageError as exc:
            raise UsageError(f"{WRITE_FLAG} {b}: {exc.message}", exc.hint) from None
    return frozenset(buckets)
