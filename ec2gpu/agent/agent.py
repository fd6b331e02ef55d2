"""The instance-side agent: runs one job, writes status.json, and watches for the spot interruption notice.

Shipped with every `ec2gpu run` job and started detached from SSH as
``python3 agent.py --dir RUN_DIR -- bash -c '<the task's run>'``. Standard library only: it runs
on whatever Python the image has. It

- starts the job in a process group of its own, its stdout and stderr appended to RUN_DIR/job.log;
- writes RUN_DIR/status.json (atomically, by rename) when the job starts and when it ends:
  ``{"state": "running" | "succeeded" | "failed" | "interrupted", "pid", "exit_code", "signal",
  "started_at", "ended_at", "notice", "rebalance", "limit"}`` (times UTC, ISO 8601);
- with ``--limit-at T`` (POSIX seconds: the run's --max-runtime, less ``--limit-grace`` seconds,
  runs/plan/limits.py), sends SIGTERM to the job's process group at T so it can checkpoint before the
  instance ends itself, records ``limit`` (``{"ends_at", "stopped_at"}``) and state "failed", and
  sends SIGKILL 5 s before the instance's end if the job is still running;
- polls the instance metadata service (IMDSv2: a token PUT, then
  ``/latest/meta-data/spot/instance-action``) every EC2GPU_SPOT_POLL_SECONDS (5) seconds; on a
  notice it records it and sends SIGTERM to the job's process group, then SIGKILL after
  EC2GPU_STOP_GRACE_SECONDS (90) if the job has not ended
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html);
- on the same polls, ``/latest/meta-data/events/recommendations/rebalance``: EC2's rebalance
  recommendation (``{"noticeTime": ...}``; 404 until there is one), the signal that a spot
  instance is at elevated risk of interruption, often sooner than the two-minute notice
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html). It does
  not stop the job: the agent writes ``{"notice_time", "seen_at"}`` to the file the job knows as
  EC2GPU_REBALANCE_FILE (RUN_DIR/rebalance.json; absent until then), so a job that polls for it
  can checkpoint early, and records the same in status.json as ``rebalance``;
- forwards its own SIGTERM and SIGINT to the job's process group;
- puts the directory of EC2GPU_PYTHON (the Python with torch that setup found) first on PATH,
  sets EC2GPU_AGENT=1 (the built-in trainer then leaves the notice to the agent) and
  TORCHELASTIC_ERROR_FILE=RUN_DIR/error.json: torchrun writes a failed worker's root cause there
  (https://pytorch.org/docs/stable/elastic/errors.html), and status.json carries it as ``error``
  (``{"message", "exit_code", "rank", "timestamp"}``; a negative exit_code is the signal that
  killed the worker).

With ``--key-file`` (the controller's, mode 0600, read and deleted before the job starts, so the
job never sees it) every status.json carries ``signature``: HMAC-SHA256 of the record's canonical
JSON (sorted keys, no spaces, without ``signature``) under that key. The controller believes only a
record whose signature checks (runs/execute/status.py): a job, or a process it left behind, cannot write
the agent's record. When the job's process ends, the agent ends what is left of its process group
(SIGTERM, then SIGKILL after 5 s) before its last write.

The controller reads status.json; it never parses the log.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
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

IMDS = "http://169.254.169.254"
SPOT_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
REBALANCE_FILE = "rebalance.json"  # in the run directory: the job's EC2GPU_REBALANCE_FILE
EXIT_NOTICE = 75  # the agent's exit code when a notice stopped the job (EX_TEMPFAIL: try again elsewhere)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def canonical(record: dict) -> bytes:
    """What a signature covers: ``record`` without ``signature``, as JSON with sorted keys and no spaces."""
    return json.dumps({k: v for k, v in record.items() if k != "signature"}, sort_keys=True,
                      separators=(",", ":")).encode()


def sign(record: dict, key: bytes) -> str:
    """HMAC-SHA256 of ``canonical(record)`` under ``key``, in hex (RFC 2104; Python's hmac)."""
    return hmac.new(key, canonical(record), hashlib.sha256).hexdigest()


def write_status(run_dir: str, status: dict, key: bytes | None = None) -> None:
    """RUN_DIR/status.json, replaced atomically (a reader sees the old or the new, never half),
    signed with ``key`` when there is one."""
    with _WRITING:  # the watcher thread writes too (a notice, a rebalance recommendation): one at a time
        record = {k: v for k, v in status.items() if k != "signature"}
        if key:
            record["signature"] = sign(record, key)
        write_atomic(os.path.join(run_dir, "status.json"), json.dumps(record, indent=2))


_WRITING = threading.Lock()


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
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)


def metadata(endpoint: str, paths: list[str], timeout_s: float = 2.0) -> dict:
    """{path: its JSON value} for each of ``paths`` the metadata service publishes now, under one
    IMDSv2 token; a path it does not publish (404) is left out, and so is every path when it
    cannot be reached (an instance without one, or none at all)."""
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
                found[path] = json.loads(resp.read(64 * 1024))
        except (urllib.error.URLError, OSError, ValueError):
            pass
    return found


def spot_notice(endpoint: str, timeout_s: float = 2.0) -> dict | None:
    """The spot interruption notice ({"action", "time"}) if one is published, else None (also when
    the metadata service cannot be reached: an on-demand instance or none at all)."""
    return metadata(endpoint, [SPOT_ACTION], timeout_s).get(SPOT_ACTION)


def rebalance_record(item) -> dict:
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


def root_cause(error_file: str) -> dict | None:
    """A torchelastic error file (written by torchrun, or by ec2gpu.train.launch) as
    ``{"message", "exit_code", "rank", "timestamp"}``; None when there is none or it is unreadable."""
    try:
        with open(error_file) as f:
            data = json.load(f)["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(data, str):
        return {"message": data, "exit_code": None, "rank": None, "timestamp": None}
    extra = data.get("extraInfo") or {}
    return {"message": str(data.get("message", ""))[:2000], "exit_code": data.get("errorCode"),
            "rank": data.get("rank"), "timestamp": extra.get("timestamp")}


def run(run_dir: str, argv: list[str], endpoint: str, poll_s: float, grace_s: float, env: dict | None = None,
        key: bytes | None = None, limit: tuple[float, float] | None = None) -> int:
    """Run ``argv`` to its end under the rules above, with ``env`` added to the environment, each
    status.json signed with ``key``; ``limit`` is (SIGTERM at, grace s), POSIX seconds, or None.
    Return the agent's exit code (the job's, 128+N for signal N, or 75 when a notice stopped it)."""
    status: dict = {"state": "running", "started_at": now(), "exit_code": None, "signal": None, "ended_at": None,
              "notice": None, "rebalance": None, "limit": None, "error": None, "agent_pid": os.getpid()}
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
    write_status(run_dir, status, key)

    def stop_job(*_):
        try:
            os.killpg(job.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    previous = {s: signal.signal(s, stop_job) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        threading.Thread(target=watch, args=(job, stop_job, status, run_dir, key, endpoint, poll_s, grace_s, limit),
                         daemon=True).start()
        code = job.wait()
        end_group(job.pid)  # what the job left running in its group must not outlive it (or write after us)
        status.update(ended_at=now(), exit_code=code if code >= 0 else None, signal=-code if code < 0 else None)
        # a job that finished (exit 0) as the notice came is done: nothing to resume elsewhere
        status["state"] = ("failed" if status["limit"] else "succeeded" if code == 0
                           else "interrupted" if status["notice"] else "failed")
        if code != 0:
            status["error"] = root_cause(error_file)
        write_status(run_dir, status, key)
    finally:  # the caller's handlers again (the agent in a process of its own has nothing after this)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if status["state"] == "interrupted":
        return EXIT_NOTICE
    return code if code >= 0 else 128 - code


def watch(job, stop_job, status: dict, run_dir: str, key: bytes | None, endpoint: str, poll_s: float,
          grace_s: float, limit: tuple[float, float] | None = None) -> None:
    """Poll the metadata service every ``poll_s`` seconds while ``job`` runs (module docstring): a
    rebalance recommendation goes to the job's EC2GPU_REBALANCE_FILE and ``status``, once; a spot
    notice goes to ``status`` and stops the job (``stop_job``), SIGKILL after ``grace_s``. At
    ``limit`` (SIGTERM at, grace s) the job is stopped the same way, SIGKILL 5 s before the end."""
    while job.poll() is None:
        if limit and time.time() >= limit[0]:
            ends_at = limit[0] + limit[1]
            status["limit"] = {"ends_at": datetime.fromtimestamp(ends_at, timezone.utc).isoformat(timespec="seconds"),
                               "stopped_at": now()}
            write_status(run_dir, status, key)
            stop_job()
            _kill_after(job, max(1.0, ends_at - 5 - time.time()))
            return
        found = metadata(endpoint, [SPOT_ACTION] + ([REBALANCE] if status["rebalance"] is None else []))
        if REBALANCE in found:  # the job is told, once; it goes on
            status["rebalance"] = rebalance_record(found[REBALANCE])
            write_atomic(os.path.join(run_dir, REBALANCE_FILE), json.dumps(status["rebalance"]))
            write_status(run_dir, status, key)
        notice = found.get(SPOT_ACTION)
        if notice:
            status["notice"] = {**notice, "seen_at": now()}
            write_status(run_dir, status, key)
            stop_job()
            _kill_after(job, grace_s)
            return
        time.sleep(poll_s if not limit else max(0.05, min(poll_s, limit[0] - time.time())))


def _kill_after(job, grace_s: float) -> None:
    """SIGKILL ``job``'s process group unless it ends within ``grace_s`` seconds."""
    deadline = time.monotonic() + grace_s
    while job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if job.poll() is None:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="the run directory: status.json and job.log go there")
    p.add_argument("--env-file", help="a JSON object of environment variables for the job (mode 0600: it may "
                                      "hold secrets, which never appear on a command line)")
    p.add_argument("--key-file", help="the key that signs status.json (read, then deleted before the job starts)")
    p.add_argument("--limit-at", type=float, help="POSIX seconds: SIGTERM the job then (the run's --max-runtime, "
                                                  "less --limit-grace)")
    p.add_argument("--limit-grace", type=float, default=120.0, help="seconds from --limit-at to the instance's end")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the job's command line")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command after --")
    key = read_key(args.key_file)
    env = {}
    if args.env_file:
        with open(args.env_file) as f:
            env = {str(k): str(v) for k, v in json.load(f).items()}
    return run(args.dir, command, os.environ.get("EC2GPU_IMDS_ENDPOINT", IMDS),
               float(os.environ.get("EC2GPU_SPOT_POLL_SECONDS", "5")),
               float(os.environ.get("EC2GPU_STOP_GRACE_SECONDS", "90")), env, key,
               (args.limit_at, args.limit_grace) if args.limit_at else None)


if __name__ == "__main__":
    sys.exit(main())
