"""A detached run's instance made ready for its job, once per instance, before the setup: the run's
directory, the workdir unpacked from S3 (``workdir.tar.gz``, hostile input: ``extract_workdir``),
the secrets read from SSM Parameter Store, the task's file_mounts put in place, the log shared with
the SSH user; and what the instance says of itself (its metadata, its GPUs).

Standard library and boto3 only: shipped beside detached.py.
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from typing import Any, Callable

if __package__:  # in the package (tests, the controller)
    from ..wire import names, run_spec, unpack
    from . import s3files
else:  # on the instance: beside this file (runs/detached/launch.AGENT_FILES)
    names = importlib.import_module("names")
    run_spec = importlib.import_module("run_spec")
    unpack = importlib.import_module("unpack")
    s3files = importlib.import_module("s3files")

Refused = names.Refused
#: the workdir archive: hostile input (refused beyond these)
MAX_ARCHIVE_BYTES = 5 * 1024 ** 3
MAX_WORKDIR_BYTES = 20 * 1024 ** 3
MAX_WORKDIR_MEMBERS = 200_000
MAX_SECRET_BYTES = 8192  # a parameter's value read back (standard: 4 KB; advanced: 8 KB)
SECRET_ROOT = "/ec2gpu/runs/"  # aws/parameters.ROOT (a test compares them)


def instance(ctx: Any, spec: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The run's directory (0700), the workdir, the secrets (into ``ctx.secrets``) and the
    file_mounts, in that order; returns (the workdir, the MOUNT-mode file_mounts to write back).
    Raises Refused for what breaks the contract (the run then ends failed), S3's errors."""
    os.makedirs(ctx.run_dir, exist_ok=True)
    os.chmod(ctx.run_dir, 0o700)
    workdir = os.path.join(ctx.run_dir, "workdir")
    get_workdir(ctx, spec["workdir_key"], workdir)
    if spec["secrets"]:
        ctx.secrets = read_secrets(ctx.ssm, ctx.run_id, spec["secrets"])
    return workdir, place_mounts(ctx, spec["mounts"])


def get_workdir(ctx: Any, key: str | None, workdir: str) -> None:
    """The workdir from S3 (``key``; None: an empty one), unpacked once per instance (a restart on
    errors keeps it). Refused for an archive over MAX_ARCHIVE_BYTES, unreadable or hostile."""
    if os.path.isdir(workdir):
        return
    if key is None:
        os.makedirs(workdir)
        return
    store = ctx.store
    rel = key[len(store.prefix):]
    head = store.s3.head_object(Bucket=store.bucket, Key=store.key(rel))
    if int(head.get("ContentLength", 0)) > MAX_ARCHIVE_BYTES:
        raise Refused(f"workdir archive: over {MAX_ARCHIVE_BYTES:,} bytes")
    archive = os.path.join(ctx.run_dir, "workdir.tar.gz")
    store.s3.download_file(store.bucket, store.key(rel), archive)
    try:
        if os.path.getsize(archive) > MAX_ARCHIVE_BYTES:
            raise Refused(f"workdir archive: over {MAX_ARCHIVE_BYTES:,} bytes")
        extract_workdir(archive, workdir)
    except OSError as exc:  # the one unpacker raises only for its source or target, never for what the archive holds
        shutil.rmtree(workdir, ignore_errors=True)
        raise Refused(f"workdir archive: unreadable ({type(exc).__name__}: {exc})") from None
    finally:
        os.remove(archive)


def extract_workdir(archive: str, dest: str, max_bytes: int = MAX_WORKDIR_BYTES,
                    max_members: int = MAX_WORKDIR_MEMBERS) -> int:
    """Unpack the gzip'd tar ``archive`` into ``dest`` (which must not exist), as hostile input, with
    ec2gpu's one unpacker (wire/unpack.py: one pass, regular files only, each name and place
    checked, tarfile's data filter, the bounds it keeps on reading), each file keeping its
    permission bits (setuid, setgid and sticky dropped) and this process's owner. The workdir
    `run --detach` packs holds regular files only (runs/detached/launch.pack: remote/sync.manifest
    leaves links out), so anything else makes the whole archive Refused, ``dest`` removed: a
    member refused (a link, a device or FIFO, an absolute name or one with a '..' part...), a name
    twice, more than ``max_members`` files or ``max_bytes`` bytes, an archive broken or cut short.
    Returns the file count."""
    if os.path.lexists(dest):
        raise Refused(f"workdir archive: {dest} is there already")
    got = unpack.unpack(archive, dest, max_files=max_members, max_bytes=max_bytes, modes=True)
    why = None
    if got.refused:
        name, reason = got.refused[0]
        why = f"member {name[:200]!r} refused ({reason})" + (f", and {len(got.refused) - 1} more" if len(got.refused) > 1
                                                              else "")
    elif got.left is not None:
        why = f"more than {max_members:,} members or {max_bytes:,} bytes (not read past {got.left[0][:200]!r})"
    elif got.unread is not None:
        why = got.unread
    elif got.files != len(got.names):
        why = "a member's name appears twice"
    if why is not None:
        shutil.rmtree(dest, ignore_errors=True)
        raise Refused(f"workdir archive: {why}")
    return got.files


def read_secrets(ssm: Any, run_id: str, names_: list[str]) -> dict[str, str]:
    """The values of the run's secrets ``names_`` from SSM Parameter Store (GetParameters, 10 a
    call, decrypted): name -> value. Refused when one is missing (InvalidParameters: deleted, or
    never made) or is not a string of at most MAX_SECRET_BYTES without a NUL (hostile input: anyone
    with ssm:PutParameter on the path could write it). Raises botocore's errors as SSM answers."""
    full = {f"{SECRET_ROOT}{run_id}/{n}": n for n in names_}
    got: dict[str, str] = {}
    missing: list[str] = []
    keys = list(full)
    for i in range(0, len(keys), 10):
        answer = ssm.get_parameters(Names=keys[i:i + 10], WithDecryption=True)
        missing += [full.get(str(k), str(k)[:200]) for k in answer.get("InvalidParameters", [])]
        for p in answer.get("Parameters", []):
            name, value = full.get(p.get("Name")), p.get("Value")
            if name is None:
                continue
            if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > MAX_SECRET_BYTES or "\0" in value:
                raise Refused(f"the secret {name} is not a string of at most {MAX_SECRET_BYTES} bytes")
            got[name] = value
    missing += [n for n in names_ if n not in got and n not in missing]
    if missing:
        raise Refused(f"secret(s) {', '.join(sorted(missing))} not found in SSM Parameter Store under "
                      f"{SECRET_ROOT}{run_id}/ (deleted, or the instance role may not read them)")
    return got


def place_mounts(ctx: Any, mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's file_mounts (spec.json's ``mounts``) in place, once per instance (a marker in the
    run directory), before the setup: a local source from the run's prefix (a file, or an archive
    unpacked with the workdir's rules and copied over the target), an S3 one copied in by
    agent/s3files.py with the instance role. Returns the MOUNT-mode ones (s3files' records), every
    launch. Refused for an archive that breaks the rules or is too large, or an entry not put in place."""
    root = os.environ.get("EC2GPU_SANDBOX_ROOT", "")
    records = os.path.join(ctx.run_dir, "s3mounts")
    write_backs = [
        {"target": run_spec.on_instance(m["target"], ctx.home, root), "bucket": m["bucket"], "prefix": m["prefix"],
         "region": m["region"], "record": os.path.join(records, f"{i}.json")}
        for i, m in enumerate(mounts) if m["kind"] == "s3" and m["write_back"]]
    marker = os.path.join(ctx.run_dir, "mounts.done")
    if not mounts or os.path.exists(marker):
        return write_backs
    for i, m in enumerate(mounts):
        path = run_spec.on_instance(m["target"], ctx.home, root)
        if not root and m["target"].startswith("/") and os.environ.get("EC2GPU_SANDBOX_CONTROL"):
            raise Refused(f"file_mounts {m['target']}: this sandbox instance has no EC2GPU_SANDBOX_ROOT (a sandbox "
                          "started by an older ec2gpu): restart it")
        try:
            _place(ctx, m, i, path, records)
        except Refused:
            raise
        except Exception as exc:  # S3 refused, a path not made: the run ends failed, saying which entry
            raise Refused(f"file_mounts {m['target']}: not put in place ({type(exc).__name__}: {exc})"[:1000]) \
                from None
    with open(marker, "w"):
        pass
    return write_backs


def _place(ctx: Any, m: dict[str, Any], i: int, path: str, records: str) -> None:
    """One file_mounts entry at ``path`` (place_mounts)."""
    if m["kind"] == "s3":
        if m["file"]:  # one object to the target path itself: its folder made first
            os.makedirs(os.path.dirname(path), exist_ok=True)
        done = s3files._copy_in(ctx.s3_in(m["region"]), {
            "target": path, "bucket": m["bucket"], "prefix": m["prefix"], "file": m["file"],
            "record": os.path.join(records, f"{i}.json")})
        ctx.log(f"file_mounts: {done['files']} object(s), {done['bytes']} bytes from s3://{m['bucket']}/"
                f"{m['prefix']} to {m['target']}")
        return
    store = ctx.store
    rel = m["key"][len(store.prefix):]
    head = store.s3.head_object(Bucket=store.bucket, Key=store.key(rel))
    if int(head.get("ContentLength", 0)) > MAX_ARCHIVE_BYTES:
        raise Refused(f"file_mounts {m['target']}: over {MAX_ARCHIVE_BYTES:,} bytes")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if m["is_file"]:
        store.s3.download_file(store.bucket, store.key(rel), path)
        return
    archive, unpacked = os.path.join(ctx.run_dir, "mount.tar.gz"), os.path.join(ctx.run_dir, "mount")
    shutil.rmtree(unpacked, ignore_errors=True)
    store.s3.download_file(store.bucket, store.key(rel), archive)
    try:
        extract_workdir(archive, unpacked)
        shutil.copytree(unpacked, path, symlinks=True, dirs_exist_ok=True)
    finally:
        os.remove(archive)
        shutil.rmtree(unpacked, ignore_errors=True)


def share_log(ctx: Any, reader: str | None) -> None:
    """Let ``reader`` (the SSH user) read job.log, live, over SSH: the log (made here if the
    earlier launches left none) gets ``reader``'s group and mode 0640, the run directory and the
    agent's home that group and mode 0710 (the group passes through by name and lists nothing;
    the job's environment file with its secrets and the agent's key stay 0600, root's; what the
    job made readable, its workdir and outputs, that group may read by name). Said, never
    raised, when it cannot be done (no such user; not root): the log is then read from S3 only."""
    if not reader:
        return
    import pwd
    path = os.path.join(ctx.run_dir, "job.log")
    try:
        gid = pwd.getpwnam(reader).pw_gid
        with open(path, "ab"):
            pass
        for p, mode in ((path, 0o640), (ctx.run_dir, 0o710), (ctx.home, 0o710)):
            os.chown(p, -1, gid)
            os.chmod(p, mode)
    except (KeyError, OSError) as exc:
        ctx.log(f"job.log not shared with {reader}: {type(exc).__name__}: {exc}"[:300])


def link_sky_workdir(home: str, workdir: str) -> None:
    """~/sky_workdir -> the workdir (SkyPilot's path), unless something real is there."""
    sky = os.path.join(home, "sky_workdir")
    if not os.path.exists(sky) or os.path.islink(sky):
        try:
            if os.path.islink(sky):
                os.remove(sky)
            os.symlink(workdir, sky)
        except OSError:
            pass


def imds_reader(endpoint: str, timeout_s: float = 2.0) -> Callable[[str], str | None]:
    """A reader of IMDSv2 text (``/latest/meta-data/instance-id``): None when not published."""
    def read(path: str) -> str | None:
        try:
            put = urllib.request.Request(f"{endpoint}/latest/api/token", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
            with urllib.request.urlopen(put, timeout=timeout_s) as resp:
                token = resp.read(4096).decode()
            get = urllib.request.Request(f"{endpoint}{path}", headers={"X-aws-ec2-metadata-token": token})
            with urllib.request.urlopen(get, timeout=timeout_s) as resp:
                return str(resp.read(4096).decode().strip())
        except (urllib.error.URLError, OSError, ValueError, UnicodeDecodeError):
            return None
    return read


def gpu_count() -> int:
    """GPUs on this instance (``nvidia-smi -L``), 0 without it."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))
