"""The instance side of S3 file_mounts (tasks/mounts.py): copy a bucket prefix in before the setup,
and write back what the job wrote when it ends. Shipped to the instance and run there as
``python3 s3files.py in|out SPEC.json``; stdlib and boto3 only (the Deep Learning AMI has boto3;
without it the AWS CLI that the AMI also has is used).

Credentials: the instance role's, found by boto3's own chain on the instance (IMDSv2:
https://docs.aws.amazon.com/sdk-for-python/latest/guide/credentials.html, "IAM role"), never keys
sent from the user's machine. SPEC.json is a list of {"target": absolute path, "bucket", "prefix",
"region", "write_back": bool, "record": absolute path}. ``in`` copies every object under the
prefix (a prefix that is one object's whole key is that file, copied to the target path itself)
and records what it wrote (path -> size, mtime) at ``record``; ``out`` uploads every regular file
under the target that is new or changed since then, and records it (so the controller may write
back every minute while the job runs and at its end, each time sending only what changed;
``out --settled=S`` leaves out hidden files and those modified in the last S seconds, which the
end's write-back sends). Keys that would land outside the target
(``..``, absolute) are skipped and counted. Prints one JSON line per mount: {"target", "files",
"bytes", "skipped"}; exits 1 with {"error": ...} on the first failure, 3 when neither boto3 nor
the AWS CLI is on the instance.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from typing import Any

if __package__:  # in the package (the controller, the tests)
    from ..wire import bounded_json
else:  # a script: shipped flat, bounded_json.py beside this file; run from the source tree, ../wire/
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _HERE if os.path.exists(os.path.join(_HERE, "bounded_json.py")) else os.path.join(_HERE, "..", "wire"))
    bounded_json = importlib.import_module("bounded_json")

MAX_KEYS = 1_000_000  # objects copied from one prefix
#: SPEC.json and the records sit in the run's directory, where the job could rewrite them
#: (bounded_json): a spec of at most 100 mounts (tasks/mounts.py); a record of one entry per file,
#: its path and [size, mtime]: 128 MiB holds MAX_KEYS entries of about 130 bytes (a path of 90
#: characters; 1,000,000 entries of 13 characters measured 45 MiB, parsed in 1.6 s in 650 MB), and
#: keeps a record the job rewrote from taking the instance's memory. One over it reads as no record
#: (_record: every file is sent again), as a refused one does
MAX_SPEC_BYTES, MAX_RECORD_BYTES = 1 << 20, 128 << 20


def _inside(target: str, rel: str) -> str | None:
    """The local path of key suffix ``rel`` under ``target``, or None when it would leave it."""
    rel = rel.lstrip("/")
    if not rel or rel.endswith("/") or ".." in rel.split("/"):
        return None
    path = os.path.normpath(os.path.join(target, rel))
    return path if path.startswith(target.rstrip("/") + "/") else None


def _copy_in(s3: Any, m: dict[str, Any]) -> dict[str, Any]:
    """Copy the objects under ``m``'s prefix into its target (one object to the target path itself
    when ``m["file"]``: the controller found the prefix to be one object's whole key) and record
    each file written (path -> [size, mtime]). Returns the mount's record line."""
    target, bucket, prefix = m["target"], m["bucket"], m["prefix"]
    done, total, skipped, record = 0, 0, 0, {}
    single = bool(m.get("file"))
    if single:
        objects = [{"Key": prefix, "Size": s3.head_object(Bucket=bucket, Key=prefix)["ContentLength"]}]
    else:
        listed = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        objects = [o for page in listed for o in page.get("Contents", [])][:MAX_KEYS]
    if not single:
        os.makedirs(target, exist_ok=True)
        folder = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        objects = [o for o in objects if o["Key"].startswith(folder)]  # s3://b/data is data/..., not database/...
    for o in objects:
        rel = o["Key"][len(prefix):]
        path = target if single else _inside(target, rel)
        if path is None:
            skipped += 1
            continue
        if not single:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:  # into the path itself: a file target's directory may not be writable
            s3.download_fileobj(bucket, o["Key"], f)
        st = os.stat(path)
        record["." if single else os.path.relpath(path, target)] = [st.st_size, st.st_mtime]
        done, total = done + 1, total + o["Size"]
    os.makedirs(os.path.dirname(m["record"]), exist_ok=True)
    with open(m["record"], "w") as f:
        json.dump(record, f)
    return {"target": target, "files": done, "bytes": total, "skipped": skipped}


def _record(path: str) -> dict[str, Any]:
    """The record at ``path`` ({relative path or ".": [size, mtime]}); {} when there is none, or it
    is refused or not an object (the job may have rewritten it): every file then counts as changed."""
    try:
        record = bounded_json.read(path, max_bytes=MAX_RECORD_BYTES)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _settled(path: str, st: os.stat_result, settled_s: float, now: float) -> bool:
    """Whether ``path`` (stat ``st``) may be sent now: always at the end (``settled_s`` 0); while the
    job runs, not a hidden file (the atomic-rename convention's file being written) nor one
    modified in the last ``settled_s`` seconds."""
    return not settled_s or (not os.path.basename(path).startswith(".") and now - st.st_mtime >= settled_s)


def _write_back(s3: Any, m: dict[str, Any], settled_s: float = 0) -> dict[str, Any]:
    """Upload each regular file under ``m``'s target that is new or changed since its record (and
    ``_settled``), and record it. Returns the mount's record line."""
    import time
    now = time.time()
    target, bucket, prefix = m["target"], m["bucket"], m["prefix"]
    if os.path.isfile(target):  # one object copied in as a file: written back if it changed
        st = os.stat(target)
        if not _settled(target, st, settled_s, now):
            return {"target": target, "files": 0, "bytes": 0, "skipped": 0}
        if _record(m["record"]).get(".") == [st.st_size, st.st_mtime]:
            return {"target": target, "files": 0, "bytes": 0, "skipped": 0}
        s3.upload_file(target, bucket, prefix)
        with open(m["record"], "w") as f:
            json.dump({".": [st.st_size, st.st_mtime]}, f)
        return {"target": target, "files": 1, "bytes": st.st_size, "skipped": 0}
    record = _record(m["record"])
    base = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    done, total = 0, 0
    for dirpath, _dirs, names in os.walk(target):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            rel = os.path.relpath(path, target)
            st = os.stat(path)
            if record.get(rel) == [st.st_size, st.st_mtime] or not _settled(path, st, settled_s, now):
                continue  # copied in and unchanged, or still being written
            s3.upload_file(path, bucket, base + rel.replace(os.sep, "/"))
            record[rel] = [st.st_size, st.st_mtime]
            done, total = done + 1, total + st.st_size
    if done:  # the next write-back sends only what changed after this one
        with open(m["record"], "w") as f:
            json.dump(record, f)
    return {"target": target, "files": done, "bytes": total, "skipped": 0}


def _with_cli(direction: str, m: dict[str, Any]) -> dict[str, Any]:
    """``aws s3 sync`` one way for ``m`` (no boto3 on the instance). Returns the mount's record line."""
    url = f"s3://{m['bucket']}/{m['prefix']}"
    src, dst = (url, m["target"]) if direction == "in" else (m["target"], url)
    subprocess.run(["aws", "s3", "sync", "--only-show-errors", "--region", m["region"], src, dst], check=True)
    return {"target": m["target"], "files": None, "bytes": None, "skipped": 0}


def main(argv: list[str]) -> int:
    """``in|out [--settled=S] SPEC.json``: copy every mount of SPEC.json one way; 0, 1 or 3 (above)."""
    direction, spec_path = argv[0], argv[-1]
    settled_s = next((float(a.split("=", 1)[1]) for a in argv[1:-1] if a.startswith("--settled=")), 0.0)
    spec = [m for m in bounded_json.read(spec_path, max_bytes=MAX_SPEC_BYTES) if direction == "in" or m.get("write_back")]
    try:
        import boto3
    except ImportError:
        boto3 = None
    if boto3 is None and not shutil.which("aws"):
        print(json.dumps({"error": "neither boto3 nor the AWS CLI is on this instance"}), flush=True)
        return 3
    for m in spec:
        try:
            if boto3 is None:
                done = _with_cli(direction, m)
            else:
                s3 = boto3.client("s3", region_name=m["region"])
                done = _copy_in(s3, m) if direction == "in" else _write_back(s3, m, settled_s)
        except Exception as exc:  # noqa: BLE001 - reported as a record; the controller decides
            print(json.dumps({"target": m["target"], "error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
            return 1
        print(json.dumps(done), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
