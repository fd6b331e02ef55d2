"""The instance-side agent: runs one job, writes its record, and watches for the spot interruption notice.

Shipped with every `ec2gpu run` job and started detached from SSH as ``python3 -I -S -B agent.py --dir RUN_DIR
-- bash -c '<the task's run>'`` (PYTHON_FLAGS). Standard library only: it runs on whatever Python the image has. It

- starts the job in a process group of its own, its stdout and stderr appended to RUN_DIR/job.log;
- writes its record, RUN_DIR/agent-record.json (atomically, by rename), when the job starts and when it ends:
  ``{"state": "running" | "succeeded" | "failed" | "interrupted", "pid", "exit_code", "signal",
  "started_at", "ended_at", "notice", "rebalance", "limit"}`` (times UTC, ISO 8601; wire/agent_record.py: its
  fields, its signature and the one reader the controller and a detached run's agent check it with);
- with ``--limit-at T`` (POSIX seconds: the run's --max-runtime, less ``--limit-grace`` seconds, runs/plan/limits.py),
  sends SIGTERM to the job's process group at T so it can checkpoint before the instance ends itself, records
  ``limit`` (``{"ends_at", "stopped_at"}``) and state "failed", and sends SIGKILL 5 s before the instance's end if
  the job is still running;
- polls the instance metadata service (IMDSv2: a token PUT, then ``/latest/meta-data/spot/instance-action``)
  every EC2GPU_SPOT_POLL_SECONDS (5) seconds; on a notice it records it and sends SIGTERM to the job's process
  group, then SIGKILL after EC2GPU_STOP_GRACE_SECONDS (90) if the job has not ended
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html);
- on the same polls, ``/latest/meta-data/events/recommendations/rebalance``: EC2's rebalance recommendation
  (``{"noticeTime": ...}``; 404 until there is one), the signal that a spot instance is at elevated risk of
  interruption, often sooner than the two-minute notice
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html). It does not stop the job:
  the agent writes ``{"notice_time", "seen_at"}`` to the file the job knows as EC2GPU_REBALANCE_FILE
  (RUN_DIR/rebalance.json; absent until then), so a job that polls for it can checkpoint early, and records the
  same in its record as ``rebalance``;
- forwards its own SIGTERM and SIGINT to the job's process group;
- puts the directory of EC2GPU_PYTHON (the Python with torch that setup found) first on PATH, sets EC2GPU_AGENT=1
  (the built-in trainer then leaves the notice to the agent) and TORCHELASTIC_ERROR_FILE=RUN_DIR/error.json:
  torchrun writes a failed worker's root cause there (https://pytorch.org/docs/stable/elastic/errors.html), and
  the record carries it as ``error`` (``{"message", "exit_code", "rank", "timestamp"}``; a negative exit_code is
  the signal that killed the worker).

With ``--key-file`` (the controller's, mode 0600, written by the command that starts the agent once the task's
setup and all it left running have ended (reaper.py), read and deleted before the job starts, so neither ever
sees it; the agent is non-dumpable first: undumpable) every record carries ``signature``: HMAC-SHA256 of the
record's canonical JSON (sorted keys, no spaces, without ``signature``) under that key. The controller believes
only a record whose signature checks (runs/execute/status.py): a job, or a process it left behind, cannot write
the agent's record. When the job's process ends, the agent ends what is left of its process group (SIGTERM, then
SIGKILL after 5 s) before its last write.

With ``--handover-file`` (written as the key is, read and deleted before the job starts: ``{"urls": {"outputs",
"log", "record", and "pool" for an array's driver} (S3 presigned PUT URLs, the head node's only), "wait_s",
"shutdown", "secret_names"}``) a run survives the loss of its controller (a closed laptop, ``kill -9``, a network
gone): a live controller touches RUN_DIR/controller every third of ``wait_s`` at most (runs/recover/handover.py:
Heartbeat) and writes RUN_DIR/collected once it has brought the outputs home. Once the job has ended, the agent
(in a child process: its own exit status goes to the controller at once) waits for ``collected`` until the
heartbeat has been silent ``wait_s`` seconds, counted from the job's end at the earliest. Then it puts what the
controller would have brought home into S3 through the URLs: RUN_DIR/out as one tar.gz (at most PUT_MAX_BYTES),
job.log's last LOG_MAX_BYTES with the secrets' values masked, an array's RUN_DIR/pool (the driver's element table
and element logs, masked too) as one tar.gz, and its record last; the record's ``handover`` says where that
stands ("pending", then "collected", "uploaded", "nothing to upload" or "failed: ..."), and the idle rule counts a
pending one as busy (ami/idle-watch.sh). Then, with ``shutdown`` and once all of it is in S3, it ends its instance
(``shutdown -h now``: the instance's shutdown behaviour is terminate); a failed hand-over leaves the instance to
its idle rule, its files there for `ec2gpu fetch`. A presigned URL lets its holder write one object and nothing
else (https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-presigned-url.html); it takes the URLs its controller
renewed, and signs a URL S3 refuses again with the instance role's credentials (wire/handover_urls.py, issue 51.2).

The controller reads the record; it never parses the log.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from collections.abc import Callable
from typing import Any

#: the agent's Python flags (engine.job_argv, the pool's driver, --local, detached.py): -I, neither the script's
#: directory (the run directory: the setup's to write) nor the user's site on sys.path, no PYTHON* variables;
#: -S, no site-packages or .pth files (it needs the standard library only); -B, no bytecode written
#: (https://docs.python.org/3/using/cmdline.html)
PYTHON_FLAGS = ("-I", "-S", "-B")
PR_SET_DUMPABLE = 4  # <linux/prctl.h>

#: the records' modules it loads from beside it (shipped flat with it: runs/execute/engine.AGENT_BESIDE,
#: runs/detached/launch.AGENT_FILES, which has no handover_urls.py: a detached run hands nothing over)
BESIDE = ("bounded_json.py", "agent_record.py", "handover_urls.py")


def _beside(name: str) -> Any:
    """The module ``name`` (one of BESIDE) beside this file (shipped flat), else in ../wire/ (the source tree), loaded by
    its path and never through sys.path (the run directory is the setup's to write; engine.start_agent removes
    RUN_DIR/__pycache__, where a planted .pyc would be)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    spec = importlib.util.spec_from_file_location(name[:-3], path if os.path.exists(path) else
                                                  os.path.join(os.path.dirname(path), "..", "wire", name))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]  # a path's spec: never None
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


if __package__:  # in the package (the controller, the tests)
    from ..wire import agent_record, bounded_json, handover_urls
else:  # a script (or loaded by its path: pool/node.py, detached.py)
    bounded_json, agent_record = _beside("bounded_json.py"), _beside("agent_record.py")
    with contextlib.suppress(OSError):  # before the job, as the others; detached.py ships none (it hands nothing over)
        handover_urls = _beside("handover_urls.py")

IMDS = "http://169.254.169.254"
SPOT_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
REBALANCE_FILE = "rebalance.json"  # in the run directory: the job's EC2GPU_REBALANCE_FILE
EXIT_NOTICE = 75  # the agent's exit code when a notice stopped the job (EX_TEMPFAIL: try again elsewhere)
COLLECTED, HEARTBEAT = "collected", "controller"  # in the run directory: the controller's marks
#: S3's largest single PUT, 5 GB (https://docs.aws.amazon.com/AmazonS3/latest/userguide/upload-objects.html)
PUT_MAX_BYTES = 5 * 10 ** 9
LOG_MAX_BYTES = 64 << 20  # the last this many bytes of job.log are handed over
PUT_TRIES = 4
#: the hand-over's objects: "pool" is an array's (its driver's RUN_DIR/pool: table.json, logs/INDEX.log)
HANDOVER_URLS = ("outputs", "log", "pool", "record")
#: urllib would send a body as a form (application/x-www-form-urlencoded), which a server may parse away
BINARY = {"Content-Type": "application/octet-stream"}
#: bounded_json's limits: an IMDS item, torchrun's error file, the hand-over file, job.env.json (execve(2): 2 MiB of env)
MAX_METADATA_BYTES, MAX_ERROR_FILE_BYTES, MAX_HANDOVER_BYTES, MAX_ENV_BYTES = 64 << 10, 4 << 20, 1 << 20, 8 << 20


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_record(run_dir: str, status: dict[str, Any], key: bytes | None = None) -> None:
    """RUN_DIR/agent-record.json (wire/agent_record.dumps: its fields, signed with ``key`` when there is one),
    replaced atomically (a reader sees the old or the new, never half)."""
    with _WRITING:  # the watcher thread writes too (a notice, a rebalance recommendation): one at a time
        write_atomic(os.path.join(run_dir, agent_record.NAME), agent_record.dumps(status, key))


_WRITING = threading.Lock()


def undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0) (Linux; https://man7.org/linux/man-pages/man2/prctl.2.html), before the key
    and the job's secrets are read: no other process of this user (the job, what the setup installed) may
    ptrace this one or read its /proc/PID/mem, Yama or not; root still may. The job (execve) is dumpable
    again; the hand-over's fork child is not. Whether it worked (False elsewhere)."""
    try:
        return sys.platform.startswith("linux") and bool(ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def read_key(path: str | None) -> bytes | None:
    """The controller's signing key from ``path``, which is deleted at once (None without one)."""
    if not path:
        return None
    with open(path, "rb") as f:
        key = f.read().strip()
    os.remove(path)
    return key or None


def end_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM what is left of process group ``pgid`` (the job's children), SIGKILL after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + grace_s
        try:
            os.killpg(pgid, sig)
            while time.monotonic() < deadline:
                os.killpg(pgid, 0)  # ProcessLookupError once the group is gone
                time.sleep(0.1)
        except (ProcessLookupError, PermissionError):
            return


def metadata(endpoint: str, paths: list[str], timeout_s: float = 2.0) -> dict[str, Any]:
    """{path: its JSON value} for each of ``paths`` the metadata service publishes now, under one IMDSv2 token;
    a path it does not publish (404) is left out, and so is every path when it cannot be reached."""
    try:
        put = urllib.request.Request(f"{endpoint}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        with urllib.request.urlopen(put, timeout=timeout_s) as resp:
            token = resp.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    found = {}
    for path in paths:
        get = urllib.request.Request(f"{endpoint}{path}", headers={"X-aws-ec2-metadata-token": token})
        try:
            with urllib.request.urlopen(get, timeout=timeout_s) as resp:
                found[path] = bounded_json.loads(resp.read(MAX_METADATA_BYTES + 1), max_bytes=MAX_METADATA_BYTES)
        except (urllib.error.URLError, OSError, ValueError):
            pass
    return found


def rebalance_record(item: object) -> dict[str, Any]:
    """What the agent keeps of a rebalance recommendation (``{"noticeTime": "..."}`` on EC2):
    ``{"notice_time": str | None, "seen_at": now}`` (the instance's text, bounded)."""
    notice = item.get("noticeTime") if isinstance(item, dict) else None
    return {"notice_time": notice[:64] if isinstance(notice, str) else None, "seen_at": now()}


def write_atomic(path: str, text: str) -> None:
    """``path`` replaced whole by ``text`` (a reader sees nothing or all of it)."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def root_cause(error_file: str) -> dict[str, Any] | None:
    """A torchelastic error file (written by torchrun, or by ec2gpu.train.launch) as
    ``{"message", "exit_code", "rank", "timestamp"}``; None when there is none or it is unreadable."""
    try:
        data = bounded_json.read(error_file, max_bytes=MAX_ERROR_FILE_BYTES, follow=False)["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(data, str):
        return {"message": data, "exit_code": None, "rank": None, "timestamp": None}
    extra = data.get("extraInfo") or {}
    return {"message": str(data.get("message", ""))[:2000], "exit_code": data.get("errorCode"),
            "rank": data.get("rank"), "timestamp": extra.get("timestamp")}


def read_handover(path: str | None) -> dict[str, Any] | None:
    """The controller's handover file at ``path`` (deleted at once, before the job starts) as ``{"urls":
    {"outputs"|"log"|"pool"|"record": URL}, "wait_s": s, "shutdown": bool, "secret_names": [...]}``; None without one.
    What it holds is checked: unknown names and URLs that are not http(s) are dropped."""
    if not path:
        return None
    data = bounded_json.read(path, max_bytes=MAX_HANDOVER_BYTES)
    os.remove(path)
    if not isinstance(data, dict):
        return None
    urls = data.get("urls")
    urls = urls if isinstance(urls, dict) else {}
    return {"urls": {k: v for k, v in urls.items()
                     if k in HANDOVER_URLS and isinstance(v, str) and v.startswith(("https://", "http://"))},
            "wait_s": max(0.0, float(data.get("wait_s") or 0)), "shutdown": data.get("shutdown") is True,
            "secret_names": [str(n) for n in data.get("secret_names") or [] if isinstance(n, str)]}


def await_collection(run_dir: str, wait_s: float, until: float | None = None, tick_s: float = 1.0) -> bool:
    """True as soon as the controller's ``collected`` file is in ``run_dir``; False once its
    heartbeat (the ``controller`` file's modification time) has been silent ``wait_s`` seconds,
    counted from this call at the earliest, or at ``until`` (POSIX seconds: the instance's own end is
    near), whichever comes first."""
    start = time.time()
    while True:
        if os.path.exists(os.path.join(run_dir, COLLECTED)):
            return True
        try:
            beat = max(start, os.path.getmtime(os.path.join(run_dir, HEARTBEAT)))
        except OSError:
            beat = start
        silent = time.time() - beat
        if silent >= wait_s or (until is not None and time.time() >= until):
            return False
        time.sleep(min(tick_s, max(0.05, wait_s - silent)))


def pack_outputs(out_dir: str, dest: str, max_bytes: int = PUT_MAX_BYTES,
                 mask: list[str] | None = None) -> tuple[int, int]:
    """``out_dir``'s regular files (symbolic links and special files left out, none followed) as a tar.gz at
    ``dest``, names relative to ``out_dir``, while their sizes add up to ``max_bytes`` at most; with ``mask``, each
    file is read whole and those values masked in it (mask_bytes: for small files, the pool's record and element
    logs); return (files packed, files left out)."""
    import io
    import tarfile
    packed = left = total = 0
    with tarfile.open(dest, "w:gz") as tar:
        for top, dirs, names in os.walk(out_dir, followlinks=False):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(top, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not (st.st_mode & 0o170000 == 0o100000):  # a regular file (stat.S_ISREG)
                    continue
                if total + st.st_size > max_bytes:
                    left += 1
                    continue
                total += st.st_size
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, out_dir))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(path, "rb") as f:
                    if mask:
                        data = mask_bytes(f.read(st.st_size), mask)
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
                    else:
                        tar.addfile(info, f)
                packed += 1
    return packed, left


MASK = "****"  # runs/job_summary.MASK


def mask_bytes(data: bytes, values: list[str]) -> bytes:
    """``data`` with each of ``values`` replaced by MASK, longest first (pure; job_summary.mask_text's
    rule): the instance side's one masking function (agent/mirror.py masks the log it uploads with it,
    runs/detached/fetch.py the live log it reads over SSH)."""
    for v in sorted((v for v in values if v), key=len, reverse=True):
        data = data.replace(v.encode("utf-8", "surrogateescape"), MASK.encode())
    return data


def log_tail(path: str, values: list[str], max_bytes: int = LOG_MAX_BYTES) -> bytes:
    """The last ``max_bytes`` of the log at ``path`` (b'' without one), from a line's start when cut
    (half a secret is never sent), ``values`` masked."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return b""
    if size > max_bytes:
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    return mask_bytes(data, values)


def put(url: str, data: bytes | None = None, path: str | None = None, tries: int = PUT_TRIES,
        timeout_s: float = 300.0) -> str | None:
    """PUT ``data`` (or the file at ``path``) to the presigned ``url``, tried ``tries`` times with
    1, 2, 4 s between; None when S3 took it, else what went wrong (the last try's)."""
    why = None
    for n in range(tries):
        if n:
            time.sleep(2 ** (n - 1))
        try:
            with open(path, "rb") if path is not None else contextlib.nullcontext(data or b"") as body:
                size = {"Content-Length": str(os.path.getsize(path))} if path is not None else {}  # urllib sizes bytes
                req = urllib.request.Request(url, data=body, method="PUT", headers={**size, **BINARY})
                with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                    resp.read(1024)
            return None
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}"
            if exc.code < 500 and exc.code not in (408, 429):
                return why  # refused (an expired URL: 403): trying again changes nothing
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            why = type(exc).__name__
    return why


def hand_over(run_dir: str, handover: dict[str, Any], status: dict[str, Any], key: bytes | None,
              env: dict[str, str]) -> None:
    """What the controller would have brought home, put into S3 through ``handover``'s URLs
    (module docstring), ``status["handover"]`` set to how it went and the record written again."""
    urls = handover_urls.renewed(run_dir, handover["urls"], bounded_json.read)  # the controller's latest
    send = functools.partial(handover_urls.put_or_role, put, imds=handover.get("imds") or IMDS, loads=bounded_json.loads)
    secrets = [env.get(n, "") for n in handover["secret_names"]]
    problems = []
    status["handover_at"] = now()
    if "outputs" in urls:
        packed, problem = put_packed(urls["outputs"], env.get("EC2GPU_OUTPUT_DIR") or os.path.join(run_dir, "out"),
                                     os.path.join(run_dir, ".handover-outputs.tar.gz"), send=send)
        if packed is not None:
            status["handover_files"] = {"packed": packed[0], "left": packed[1]}
        if problem:
            problems.append(f"outputs: {problem}")
    if "log" in urls:
        problem = send(urls["log"], data=log_tail(os.path.join(run_dir, "job.log"), secrets))
        if problem:
            problems.append(f"log: {problem}")
    if "pool" in urls and os.path.isdir(os.path.join(run_dir, "pool")):  # an array's: its element table and logs
        status["array"] = array_counts(os.path.join(run_dir, "pool", "table.json"))  # for `ec2gpu status RUN`
        # table.json is JSON: a secret's quotes, backslashes and non-ASCII are escaped there
        _, problem = put_packed(urls["pool"], os.path.join(run_dir, "pool"), os.path.join(run_dir, ".handover-pool.tar.gz"),
                                mask=secrets + [json.dumps(v)[1:-1] for v in secrets if v], send=send)
        if problem:
            problems.append(f"pool: {problem}")
    status["handover"] = ("failed: " + "; ".join(problems) if problems else "uploaded" if urls
                          else "nothing to upload (a run's outputs are its head node's)")
    if "record" in urls:
        problem = send(urls["record"], data=agent_record.dumps(status, key).encode())
        if problem:
            status["handover"] = "failed: " + "; ".join(problems + [f"record: {problem}"])
    write_record(run_dir, status, key)


def array_counts(path: str, max_bytes: int = 16 << 20) -> dict[str, Any] | None:
    """The element counts ({"done", "failed", "running", "queued"}: integers) of the pool driver's
    table.json at ``path`` (ec2gpu/pool/driver.py), None when it cannot be read."""
    try:
        counts = bounded_json.read(path, max_bytes=max_bytes, follow=False).get("counts")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(counts, dict):
        return None
    return {k: counts[k] for k in ("done", "failed", "running", "queued")
            if isinstance(counts.get(k), int) and not isinstance(counts.get(k), bool)}


def put_packed(url: str, src: str, archive: str, mask: list[str] | None = None,
               send: Callable[..., str | None] = put) -> tuple[tuple[int, int] | None, str | None]:
    """``src`` packed into ``archive`` (pack_outputs, ``mask``) and PUT to the presigned ``url`` by ``send`` (put),
    the archive removed after: ((files packed, files left out) or None, what went wrong or None)."""
    try:
        packed = pack_outputs(src, archive, mask=mask)
        return packed, send(url, path=archive)
    except OSError as exc:
        return None, type(exc).__name__
    finally:
        if os.path.exists(archive):
            os.remove(archive)


def end_instance() -> None:
    """``shutdown -h now``: the instance's shutdown behaviour, terminate for a run's instances, ends it. The
    ``shutdown`` on this process's PATH, named by its absolute path (through ``sudo -n`` when not root, which would
    otherwise look it up on its own secure_path: in the sandbox the stand-in first on PATH is the one that must
    run, never the machine's own). Its failure is left to the instance's own limits."""
    import shutil
    found = shutil.which("shutdown")
    if found is None:
        return
    argv = [found, "-h", "now", "ec2gpu: the job ended and its controller is gone"]
    if os.geteuid() != 0:
        argv = ["sudo", "-n"] + argv
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60, check=False)


def after_end(run_dir: str, handover: dict[str, Any], status: dict[str, Any], key: bytes | None,
              env: dict[str, str]) -> None:
    """Once the job has ended: wait for the controller to collect; when it does not, hand over and, with
    ``shutdown``, end the instance (module docstring). A job stopped by a spot notice or the run's limit is
    waited for 30 s at most, or until 60 s before the limit's end, and its instance is left to end as it
    will (EC2 reclaims it, or the limit's own shutdown: a live controller may still be bringing its
    checkpoints home)."""
    until, ends_anyway = None, bool(status.get("notice") or status.get("limit"))
    if status.get("notice"):
        until = time.time() + 30
    elif status.get("limit"):
        try:
            until = datetime.fromisoformat(status["limit"]["ends_at"]).timestamp() - 60
        except (KeyError, TypeError, ValueError):
            until = time.time() + 30
    if await_collection(run_dir, handover["wait_s"], until):
        status["handover"] = "collected"
        write_record(run_dir, status, key)
        return
    hand_over(run_dir, handover, status, key, env)
    # only the head has URLs: a worker is left to its idle rule (its job may have ended before the head's)
    if handover["shutdown"] and not ends_anyway and status["handover"] == "uploaded":
        end_instance()


def _forked() -> bool:
    """Fork: True in the parent, False in the child."""
    return os.fork() != 0


def run(run_dir: str, argv: list[str], endpoint: str, poll_s: float, grace_s: float,
        env: dict[str, str] | None = None, key: bytes | None = None, limit: tuple[float, float] | None = None,
        handover: dict[str, Any] | None = None, background: bool = False) -> int:
    """Run ``argv`` to its end under the rules above, with ``env`` added to the environment, each record
    signed with ``key``; ``limit`` is (SIGTERM at, grace s), POSIX seconds, or None; ``handover``
    (read_handover's) makes the run survive its controller's loss (after_end): with ``background`` (the command
    line's agent) in a child process, so that this one returns at once and the controller, which waits for the
    agent's exit status, can collect. Return the agent's exit code (the job's, 128+N for signal N, or 75 when a
    notice stopped it)."""
    status: dict[str, Any] = {"state": "running", "started_at": now(), "exit_code": None, "signal": None,
                              "ended_at": None, "notice": None, "rebalance": None, "limit": None, "error": None,
                              "agent_pid": os.getpid()}
    rebalance_file = os.path.join(run_dir, REBALANCE_FILE)
    full_env = {**os.environ, **(env or {}), "EC2GPU_AGENT": "1", "EC2GPU_REBALANCE_FILE": rebalance_file}
    error_file = full_env.setdefault("TORCHELASTIC_ERROR_FILE", os.path.join(run_dir, "error.json"))
    for stale in (error_file, rebalance_file):  # a previous job's
        if os.path.exists(stale):
            os.remove(stale)
    if full_env.get("EC2GPU_PYTHON"):  # the Python with torch first: `python3` in the job means that one
        full_env["PATH"] = os.path.dirname(full_env["EC2GPU_PYTHON"]) + os.pathsep + full_env.get("PATH", "")
    with open(os.path.join(run_dir, "job.log"), "ab") as log:
        job = subprocess.Popen(argv, cwd=full_env.get("EC2GPU_WORKDIR") or run_dir, env=full_env,
                               stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    status["pid"] = job.pid
    write_record(run_dir, status, key)

    def stop_job(*_: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGTERM)
    previous = {s: signal.signal(s, stop_job) for s in (signal.SIGTERM, signal.SIGINT)}
    watcher = threading.Thread(target=watch, args=(job, stop_job, status, run_dir, key, endpoint, poll_s, grace_s,
                                                   limit), daemon=True)
    try:
        watcher.start()
        code = job.wait()
        end_group(job.pid)  # what the job left running in its group must not outlive it (or write after us)
        status.update(ended_at=now(), exit_code=code if code >= 0 else None, signal=-code if code < 0 else None)
        # a job that finished (exit 0) as the notice came is done: nothing to resume elsewhere
        status["state"] = ("failed" if status["limit"] else "succeeded" if code == 0
                           else "interrupted" if status["notice"] else "failed")
        if code != 0:
            status["error"] = root_cause(error_file)
        if handover:
            status["handover"] = "pending"  # the idle rule counts the instance busy meanwhile
        write_record(run_dir, status, key)
    finally:  # the caller's handlers again (the agent in a process of its own has nothing after this)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if handover:
        watcher.join(poll_s + 10)  # it ends with the job: never fork while it may hold _WRITING
        handover = {**handover, "imds": endpoint}  # where hand_over asks for the instance role's credentials
    if handover and not (background and _forked()):
        if background:  # the child: the agent's exit status was given (the controller judges by it)
            try:
                status["agent_pid"] = os.getpid()  # the idle rule's "that agent process lives"
                write_record(run_dir, status, key)
                after_end(run_dir, handover, status, key, full_env)
            except Exception as exc:  # noqa: BLE001 - said in the record; the idle rule ends the instance
                status["handover"] = f"failed: {type(exc).__name__}"
                write_record(run_dir, status, key)
            finally:
                os._exit(0)
        after_end(run_dir, handover, status, key, full_env)
    if status["state"] == "interrupted":
        return EXIT_NOTICE
    return code if code >= 0 else 128 - code


def watch(job: subprocess.Popen[bytes], stop_job: Callable[[], None], status: dict[str, Any], run_dir: str,
          key: bytes | None, endpoint: str, poll_s: float, grace_s: float, limit: tuple[float, float] | None = None) -> None:
    """Poll the metadata service every ``poll_s`` seconds while ``job`` runs (module docstring): a rebalance
    recommendation goes to the job's EC2GPU_REBALANCE_FILE and ``status``, once; a spot notice goes to ``status``
    and stops the job (``stop_job``), SIGKILL after ``grace_s``. At ``limit`` (SIGTERM at, grace s) the job is
    stopped the same way, SIGKILL 5 s before the end."""
    while job.poll() is None:
        if limit and time.time() >= limit[0]:
            ends_at = limit[0] + limit[1]
            status["limit"] = {"ends_at": datetime.fromtimestamp(ends_at, timezone.utc).isoformat(timespec="seconds"),
                               "stopped_at": now()}
            write_record(run_dir, status, key)
            stop_job()
            _kill_after(job, max(1.0, ends_at - 5 - time.time()))
            return
        found = metadata(endpoint, [SPOT_ACTION] + ([REBALANCE] if status["rebalance"] is None else []))
        if REBALANCE in found:  # the job is told, once; it goes on
            status["rebalance"] = rebalance_record(found[REBALANCE])
            write_atomic(os.path.join(run_dir, REBALANCE_FILE), json.dumps(status["rebalance"]))
            write_record(run_dir, status, key)
        notice = found.get(SPOT_ACTION)
        if notice:
            status["notice"] = {**notice, "seen_at": now()}
            write_record(run_dir, status, key)
            stop_job()
            _kill_after(job, grace_s)
            return
        time.sleep(poll_s if not limit else max(0.05, min(poll_s, limit[0] - time.time())))


def _kill_after(job: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGKILL ``job``'s process group unless it ends within ``grace_s`` seconds."""
    deadline = time.monotonic() + grace_s
    while job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if job.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="the run directory: agent-record.json and job.log go there")
    p.add_argument("--env-file", help="a JSON object of the job's environment (0600: secrets, never on a command line)")
    p.add_argument("--key-file", help="the key that signs its record (read, then deleted before the job starts)")
    p.add_argument("--limit-at", type=float, help="POSIX seconds: SIGTERM the job then (--max-runtime less --limit-grace)")
    p.add_argument("--limit-grace", type=float, default=120.0, help="seconds from --limit-at to the instance's end")
    p.add_argument("--handover-file", help="where the outputs go if the controller is gone (read, deleted before the job)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the job's command line")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command after --")
    key = read_key(args.key_file)
    handover = read_handover(args.handover_file)
    env = {}
    if args.env_file:
        env = {str(k): str(v) for k, v in bounded_json.read(args.env_file, max_bytes=MAX_ENV_BYTES).items()}
    return run(args.dir, command, os.environ.get("EC2GPU_IMDS_ENDPOINT", IMDS),
               float(os.environ.get("EC2GPU_SPOT_POLL_SECONDS", "5")),
               float(os.environ.get("EC2GPU_STOP_GRACE_SECONDS", "90")), env, key,
               (args.limit_at, args.limit_grace) if args.limit_at else None, handover, background=True)


if __name__ == "__main__":
    undumpable()  # here, not in main(): the tests call main() in their own process
    sys.exit(main())
