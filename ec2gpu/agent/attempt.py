"""One attempt of a detached run's job on its instance: the setup (under reaper.py: what it leaves
running ends with it, before the job's key is made), then the job under agent.py, which signs its
record in the run directory with a key this agent gave it (a job cannot forge its verdict), watched
until it ends: the cancel object on every poll, the uploads every ``--every`` seconds and at once
on a spot notice or a rebalance recommendation, and (several nodes) the generation it runs in.

The job's environment is the engine's (runs/execute/engine.py: a test compares them); its shell
words are wire/shell.py's, as the engine's are. Standard library only: shipped beside detached.py.
"""
from __future__ import annotations

import hmac
import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

if __package__:  # in the package (tests, the controller)
    from ..wire import agent_record, bounded_json, run_record, shell
    from . import agent
else:  # on the instance: beside this file (runs/detached/launch.AGENT_FILES)
    agent_record = importlib.import_module("agent_record")
    bounded_json = importlib.import_module("bounded_json")
    run_record = importlib.import_module("run_record")
    shell = importlib.import_module("shell")
    agent = importlib.import_module("agent")

SETUP_TIMEOUT_S = 3600  # runs/execute/engine.py's
#: Pythons with torch on the Deep Learning AMIs (ami/setup-gpu.sh's order)
PYTHONS = ("/opt/pytorch/bin/python", "/opt/pytorch/bin/python3", "/opt/conda/envs/pytorch/bin/python3")
#: how setup and run are started: the engine's words (wire/shell.py, shipped beside this file)
INTERACTIVE, HANDOFF, PROLOGUE = shell.INTERACTIVE, shell.HANDOFF, shell.PROLOGUE
PROGRESS_FILE = "progress.json"  # runs/job.PROGRESS_FILE
HERE = os.path.dirname(os.path.abspath(__file__))  # agent.py and reaper.py lie beside this file


def find_python(spec_python: str | None) -> str:
    """spec.json's ``python`` when it runs here, else the first of PYTHONS that does, else python3."""
    for cand in ((spec_python,) if spec_python else ()) + PYTHONS:
        if os.access(cand, os.X_OK):
            return cand
    return "python3"


def job_env(spec: dict[str, Any], run_dir: str, workdir: str, ip: str, gpus: int, resume: bool,
            python: str, secret_values: dict[str, str] | None = None, rank: int = 0,
            ips: list[str] | None = None) -> dict[str, str]:
    """The job's environment (pure): the task's envs, its secrets (name -> value), then ours,
    as engine.node_env gives it for node ``rank`` of ``ips`` (default: node 0 of one, at ``ip``; a
    test compares the two)."""
    ips = ips or [ip]
    run_id = spec["run_id"]
    limit = spec["gpus_limit"] if spec["gpus_limit"] and spec["gpus_limit"] < gpus else None
    gpus = limit or gpus
    ckpt = f"{workdir}/{spec['checkpoint_dir'].rstrip('/')}" if spec["checkpoint_dir"] else f"{run_dir}/checkpoints"
    ours = {
        "EC2GPU_RUN_ID": run_id, "EC2GPU_OUTPUT_DIR": f"{run_dir}/out", "EC2GPU_CHECKPOINT_DIR": ckpt,
        "EC2GPU_RESUME": "1" if resume else "0", "EC2GPU_NODE_RANK": str(rank), "EC2GPU_NUM_NODES": str(len(ips)),
        "EC2GPU_HEAD_IP": ips[0], "EC2GPU_NODE_IP": ips[rank], "EC2GPU_GPUS_PER_NODE": str(gpus),
        "EC2GPU_PROGRESS_FILE": f"{run_dir}/{PROGRESS_FILE}", "EC2GPU_WORKDIR": workdir, "EC2GPU_PYTHON": python,
        "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": str(len(ips)), "SKYPILOT_NODE_IPS": "\n".join(ips),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus), "SKYPILOT_TASK_ID": f"ec2gpu-{run_id}_{spec['name']}",
    }
    if limit:
        ours["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(limit))
    return {**spec["envs"], **(secret_values or {}), **ours}


def _none() -> str | None:
    return None


def _nothing() -> None:
    return None


@dataclass
class Hooks:
    """What the launch does while its setup or job runs: ``cancelled`` (the cancel object is
    there), ``tick`` (every ``every_s`` seconds and at once on a notice: the uploads, the record),
    ``begin`` (the job started: its record written), ``watch`` (several nodes: why the job must
    stop now, else None), ``noticed`` (a spot notice was seen: several nodes, this node is leaving)."""

    cancelled: Callable[[], bool]
    tick: Callable[[], None]
    begin: Callable[[], None] = _nothing
    watch: Callable[[], str | None] = _none
    noticed: Callable[[], None] = _nothing


class Job:
    """The setup and the job of ``spec`` (wire/run_spec.parse's) in ``workdir``, from the context
    ``ctx`` (context.Context); ``proc`` and ``key``: the agent while it runs, and its key."""

    def __init__(self, ctx: Any, spec: dict[str, Any], workdir: str):
        self.ctx, self.spec, self.workdir = ctx, spec, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.key = b""

    def run_setup(self, env: dict[str, str], hooks: Hooks) -> int:
        """The setup as engine.py runs it (bash -i, then a plain bash, SKYPILOT_SETUP_* too, under
        reaper.py: what it leaves running ends with it, before the job's key is made), its output
        appended to job.log; its exit code (124 after SETUP_TIMEOUT_S, -1 when cancelled)."""
        ctx = self.ctx
        full = {**os.environ, **env, "HOME": ctx.home, "SKYPILOT_SETUP_NODE_RANK": env["SKYPILOT_NODE_RANK"],
                "SKYPILOT_SETUP_NODE_IPS": env["SKYPILOT_NODE_IPS"],
                "SKYPILOT_SETUP_NUM_GPUS_PER_NODE": env["SKYPILOT_NUM_GPUS_PER_NODE"]}
        if env.get("EC2GPU_PYTHON", "").startswith("/"):
            full["PATH"] = os.path.dirname(env["EC2GPU_PYTHON"]) + os.pathsep + full.get("PATH", "")
        with open(os.path.join(ctx.run_dir, "job.log"), "ab") as out:
            proc = subprocess.Popen([sys.executable, *agent.PYTHON_FLAGS, os.path.join(HERE, "reaper.py"),
                                     "--grace", f"{ctx.stop_grace_s:g}", "--",
                                     "bash", "-c", INTERACTIVE, HANDOFF, PROLOGUE + self.spec["setup"], "setup"],
                                    cwd=self.workdir, env=full, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        deadline = ctx.clock() + SETUP_TIMEOUT_S
        next_push = ctx.clock() + ctx.every_s
        try:
            while proc.poll() is None:
                if hooks.cancelled():
                    self.end_setup(proc)
                    return -1
                if ctx.clock() >= deadline:
                    self.end_setup(proc)
                    return 124
                if ctx.clock() >= next_push:
                    hooks.tick()
                    next_push = ctx.clock() + ctx.every_s
                ctx.sleep(ctx.poll_s)
        except BaseException:  # superseded, or this agent's own error: the setup does not outlive it
            self.end_setup(proc)
            raise
        code = proc.returncode  # the reaper's: it ended what the setup left before it did
        return code if code >= 0 else 128 - code

    def end_setup(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM the setup's reaper: it ends the setup and all it left (SIGKILL after its grace,
        ``stop_grace_s``, then up to reaper.KILL_WAIT_S); SIGKILL it if it has not ended by then."""
        proc.terminate()
        try:
            proc.wait(self.ctx.stop_grace_s + 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def agent_record(self, key: bytes) -> dict[str, Any] | None:
        """The record agent.py keeps in the run directory (wire/agent_record.NAME) when it signed it
        with ``key``, else None."""
        try:
            rec = bounded_json.read(os.path.join(self.ctx.run_dir, agent_record.NAME), max_bytes=agent_record.MAX_BYTES)
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or not isinstance(rec.get("signature"), str):
            return None
        return rec if hmac.compare_digest(rec["signature"], agent_record.sign(rec, key)) else None

    def _argv(self, env: dict[str, str]) -> tuple[list[str], bytes]:
        """agent.py's command line for the job, its environment and key in 0600 files; (argv, key)."""
        run_dir, spec = self.ctx.run_dir, self.spec
        env_file, key_file = os.path.join(run_dir, "job.env.json"), os.path.join(run_dir, "agent.key")
        key = secrets.token_hex(32).encode()
        for path, text in ((env_file, json.dumps({**env, "HOME": self.ctx.home})), (key_file, key.decode())):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        record_path = os.path.join(run_dir, agent_record.NAME)
        if os.path.exists(record_path):
            os.remove(record_path)  # the last attempt's: this one's record is the agent's next
        limit = [] if spec["limit_at"] is None else ["--limit-at", f"{spec['limit_at']:.0f}",
                                                     "--limit-grace", f"{spec['limit_grace_s']:.0f}"]
        return [sys.executable, *agent.PYTHON_FLAGS, os.path.join(HERE, "agent.py"),
                "--dir", run_dir, "--env-file", env_file, "--key-file", key_file, *limit, "--",
                "bash", "-c", INTERACTIVE, HANDOFF, PROLOGUE + spec["run"], spec["name"], *spec["args"]], key

    def run_job(self, env: dict[str, str], lease: Any, hooks: Hooks) -> tuple[str, dict[str, Any]]:
        """One attempt of the job under agent.py, recorded in ``lease.status`` (store.Lease): its
        counter, its entry of ``attempts``, the last exit code; (outcome, {"exit_code", "signal"}).
        Outcomes: succeeded, failed, interrupted, cancelled, limit, regroup (``hooks.watch``)."""
        ctx, st = self.ctx, lease.status
        os.makedirs(env["EC2GPU_CHECKPOINT_DIR"], exist_ok=True)
        argv, key = self._argv(env)
        agent_env = {**os.environ, "HOME": ctx.home, "EC2GPU_IMDS_ENDPOINT": ctx.imds_endpoint,
                     "EC2GPU_SPOT_POLL_SECONDS": str(ctx.agent_poll_s),
                     "EC2GPU_STOP_GRACE_SECONDS": str(ctx.stop_grace_s)}
        st["attempt"] += 1
        attempt = {"attempt": st["attempt"], "launch": lease.launch, "instance_id": st["instance_id"],
                   "started_at": lease.now(), "ended_at": None, "outcome": "running", "exit_code": None, "signal": None,
                   "resume": env["EC2GPU_RESUME"] == "1", "notice": None, "rebalance": None}
        st["attempts"] = (st["attempts"] + [attempt])[-run_record.MAX_ENTRIES:]
        st["state"] = "running"
        proc = self.proc = subprocess.Popen(argv, env=agent_env, stdin=subprocess.DEVNULL)
        self.key = key
        try:
            hooks.begin()
            outcome = self.supervise(proc, key, attempt, hooks)
        except BaseException:  # superseded, or S3 refused the record: the job does not run on without its agent
            self.stop(proc, key)
            self.proc = None
            raise
        self.proc = None
        record = self.agent_record(key) or {}
        attempt.update(ended_at=lease.now(), exit_code=run_record.exit_code(record.get("exit_code")),
                       signal=run_record.signal(record.get("signal")))
        if outcome is None:
            state = record.get("state")
            outcome = ("limit" if record.get("limit") else state if state in ("succeeded", "interrupted")
                       else "failed")
            if not record:
                code = proc.returncode
                attempt["exit_code"] = code if code >= 0 else 128 - code
        attempt["outcome"] = outcome
        for k, check in (("notice", run_record.notice), ("rebalance", run_record.rebalance)):
            attempt[k] = check(record[k]) if isinstance(record.get(k), dict) else attempt[k]
        st.update(exit_code=attempt["exit_code"], signal=attempt["signal"])
        return outcome, {"exit_code": attempt["exit_code"], "signal": attempt["signal"]}

    def supervise(self, proc: subprocess.Popen[bytes], key: bytes, attempt: dict[str, Any], hooks: Hooks) -> str | None:
        """Watch the agent until it ends: the cancel object (and ``hooks.watch``) every ``poll_s``
        seconds; the agent's record every ``agent_poll_s`` (as often as agent.py looks for a notice);
        ``hooks.tick`` every ``every_s`` seconds, and at once on a spot notice or a rebalance
        recommendation (within 2 x agent_poll_s of EC2 publishing it). Returns
        "cancelled" when this agent stopped the job, "regroup" when it stopped it because
        ``hooks.watch`` said why (several nodes), else None (the agent's record decides)."""
        ctx = self.ctx
        next_push = ctx.clock() + ctx.every_s
        next_look = ctx.clock()  # S3 (the cancel object, the generation) every poll_s; the record every agent_poll_s
        while proc.poll() is None:
            if ctx.clock() >= next_look:
                next_look = ctx.clock() + ctx.poll_s
                if hooks.cancelled():
                    self.stop(proc, key)
                    return "cancelled"
                why = hooks.watch()
                if why:
                    ctx.log(f"{why}: the job is stopped, to start again with the next generation")
                    self.stop(proc, key)
                    return "regroup"
            rec = self.agent_record(key) or {}
            urgent = False
            for k, check in (("notice", run_record.notice), ("rebalance", run_record.rebalance)):
                if isinstance(rec.get(k), dict) and attempt[k] is None:
                    attempt[k] = check(rec[k])
                    urgent = True
            if isinstance(rec.get("notice"), dict):
                hooks.noticed()  # several nodes: the others stop theirs now, not at the stale time
            if urgent or ctx.clock() >= next_push:
                next_push = ctx.clock() + ctx.every_s  # from the push's start: a slow upload does not stretch the cycle
                hooks.tick()
            ctx.sleep(min(ctx.poll_s, ctx.agent_poll_s))
        return None

    def stop(self, proc: subprocess.Popen[bytes], key: bytes) -> None:
        """SIGTERM to the job's process group (as agent.py forwards its own SIGTERM: sent to the
        group directly once the agent's record names it, so no start-up race leaves the job
        running without its agent; to the agent when its record never comes); SIGKILL to the
        group and the agent after stop_grace_s."""
        wait_until = time.monotonic() + 10
        pid = None
        while proc.poll() is None and time.monotonic() < wait_until:
            pid = (self.agent_record(key) or {}).get("pid")
            if isinstance(pid, int) and pid > 1:
                break
            time.sleep(0.05)
        try:
            if isinstance(pid, int) and pid > 1:
                os.killpg(pid, signal.SIGTERM)
            else:
                proc.send_signal(signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + self.ctx.stop_grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            if isinstance(pid, int) and pid > 1:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            proc.kill()
            proc.wait()
