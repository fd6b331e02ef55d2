"""A detached run's agent's own boto3: this machine's installed boto3 and what it requires, packed
into one zip (``RUNTIME``) that the run store holds beside the agent; the boot script
(runs/detached/launch.boot_script) checks its sha256, makes a venv on the instance and unpacks it
there, so the agent never runs on the image's boto3.

Why: an image's boto3 may predate S3's conditional writes (a Deep Learning AMI's release notes show
boto3/botocore 1.34.46, Ubuntu 24.04's package), which a run of several nodes needs (agent/gang.py):
PutObject's ``IfNoneMatch`` is in botocore's model from 1.35.2 and its ``IfMatch`` from 1.35.69
(botocore's CHANGELOG.rst, 1.35.2: "Add support for conditional writes for PutObject", 1.35.69: "Add
support for ETag based conditional writes in PutObject"; agent/store.MIN_CONDITIONAL_BOTOCORE).

Why from this machine rather than PyPI on the instance: the instance may have no way out to PyPI (a
private subnet without NAT; the sandbox's instances have none) and the image no pip (Debian's
python3 ships without ensurepip); the controller's boto3 is at least what ec2gpu requires
(pyproject.toml: boto3 1.38.25, past 1.35.69), its modules are pure Python, and its bytes are pinned
by their sha256 in the user data like the agent's own files: the run gets exactly the boto3 it was
launched with, whatever the image holds or the run's prefix is rewritten to. Only the models of the
services the agent calls (``SERVICES``) are packed: botocore's whole data directory is ~30 MB.
"""
from __future__ import annotations

import functools
import importlib.util
import io
import zipfile
from pathlib import Path

#: the object's name under the run's agent/ prefix, fetched and checked with the agent's files
RUNTIME = "boto3.zip"
#: the top-level modules packed, each its distribution's: boto3 and what it requires, without extras
#: (boto3: botocore, jmespath, s3transfer; botocore: python-dateutil, urllib3; python-dateutil: six),
#: every one pure Python (tests/unit/test_agent_runtime.py checks the list against their metadata)
MODULES = {"boto3": "boto3", "botocore": "botocore", "s3transfer": "s3transfer", "jmespath": "jmespath",
           "dateutil": "python-dateutil", "six": "six", "urllib3": "urllib3"}
#: the AWS services whose botocore models are packed: the ones the agent makes clients of (agent/:
#: s3, autoscaling, ssm) and sts, which a credential provider may call
SERVICES = ("s3", "autoscaling", "ssm", "sts")
#: the most bytes of the zip the boot script reads (it is ~1.6 MB: 241 files, 5.8 MB unpacked, with botocore 1.44)
MAX_BYTES = 64 * 1024 * 1024
#: one timestamp for every entry, so the same installed files always make the same bytes
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _files(module: str) -> list[tuple[str, Path]]:
    """(name in the zip, file on this machine) of ``module``'s installed files, sorted: a package's
    tree less compiled files (and botocore's models of services not in SERVICES), or one module file.
    Raises OSError when the module is not installed."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise OSError(f"{module} is not installed on this machine")
    if not spec.submodule_search_locations:  # a module of one file (six.py)
        return [(Path(spec.origin).name, Path(spec.origin))]
    root = Path(next(iter(spec.submodule_search_locations)))
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root.parent)
        if not path.is_file() or "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo"):
            continue
        if rel.parts[:2] == ("botocore", "data") and len(rel.parts) > 3 and rel.parts[2] not in SERVICES:
            continue
        out.append((rel.as_posix(), path))
    return out


@functools.lru_cache(maxsize=1)
def bundle() -> bytes:
    """The zip (bytes) of MODULES as installed on this machine, laid out as a site-packages directory:
    the same bytes for the same installed files (sorted, one timestamp). Read once per process.
    Raises OSError when one of MODULES is not installed or cannot be read."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for module in MODULES:
            for name, path in _files(module):
                info = zipfile.ZipInfo(name, _EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, path.read_bytes())
    return buf.getvalue()
