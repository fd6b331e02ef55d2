"""`ec2gpu train mnist --local`: the built-in task on this machine, under the same agent and with
the same job contract as on an instance (no AWS, no SSH, no cost)."""
from __future__ import annotations

import importlib.util
from dataclasses import replace
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...errors import RemoteError, UsageError
from ...settings import Settings
from ...wire import agent_record
from ..execute import engine
from .. import job_summary
from ..settle import record as run_record
from ..options import TrainOptions
from .pipeline import _ledger, _with_summary, builtin_task, new_run_id
from ..execute.reporter import ReporterLike


def train_local(opts: TrainOptions, ui: ReporterLike, data_dir: str | None = None,
                settings: Settings | None = None) -> run_record.RunRecord:
    """Run the built-in MNIST task on this machine (needs torch), under the same agent and with the
    same job contract as on an instance (run_local below); return its run record.

    With ``settings``, the run goes into the ledger (backend "local", no cost).

    Raises UsageError when torch is missing, RemoteError when the trainer fails.
    """
    if importlib.util.find_spec("torch") is None:
        raise UsageError("--local needs PyTorch on this machine", "pip install 'ec2gpu[train]' (or make demo)")
    opts = replace(opts, trainer_args=list(opts.trainer_args) + (["--data-dir", data_dir] if data_dir else []))
    job = builtin_task(opts)
    run_id = new_run_id()
    started = datetime.now(timezone.utc).isoformat()
    out = Path(opts.out or Path("runs") / run_id).resolve()
    with ui.phase("running"):
        summary = run_local(job, run_id, out, ui)
    record = run_record.new(run_id, opts.command, "local", out, status="completed", task=job.name,
                            instance_type="local", market="local", model=opts.model, phases=dict(ui.phases),
                            ended_at=datetime.now(timezone.utc).isoformat(), billed_seconds=0.0, cost_usd=0.0)
    record["started_at"] = started
    _with_summary(record, summary)
    run_record.save(record, out)
    if settings is not None:
        _ledger(settings, record, ui)
    return record


def run_local(job: engine.TaskJob, run_id: str, out: Path, ui: ReporterLike, poll_s: float = 0.2) -> dict[str, Any]:
    """Run ``job`` on this machine as node 0 of 1, under the same agent and job contract as on an
    instance: the workdir is used where it is (nothing is copied), outputs go to ``out``/outputs,
    checkpoints to ``out``/checkpoints, the log to ``out``/job.log (followed live through ``ui.log``).
    Returns the job's summary.json ({} when it wrote none). Raises RemoteError (exit 5) when the
    job fails, with its exit code and last log lines."""
    out.mkdir(parents=True, exist_ok=True)
    gpus = 0
    try:
        import torch
        gpus = torch.cuda.device_count()
    except ImportError:
        pass
    workdir = job.manifest.root if job.manifest is not None else (job.loaded.workdir or Path.cwd())
    env = {**engine.node_env(job, run_id, str(out), 0, ["127.0.0.1"], gpus, False, sys.executable),
           "EC2GPU_OUTPUT_DIR": str(out / "outputs"), "EC2GPU_CHECKPOINT_DIR": str(out / "checkpoints"),
           "EC2GPU_WORKDIR": str(workdir)}
    env_file = out / "job.env.json"
    env_file.touch(mode=0o600)
    env_file.write_text(json.dumps(env))
    argv = [*engine.agent_command(sys.executable, str(engine.AGENT.parent)), "--dir", str(out), "--env-file", str(env_file), "--",
            "bash", "-c", job.task.run, job.name, *job.args]
    log_path = out / "job.log"
    log_path.unlink(missing_ok=True)
    lines = engine._LineWriter(lambda line: ui.log(job_summary.mask_text(line, job.secret_values)))
    agent = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    offset = 0
    try:
        while True:
            done = agent.poll() is not None
            if log_path.exists():
                with open(log_path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                lines.write(chunk.decode(errors="replace"))
            if done:
                break
            time.sleep(poll_s)
    except BaseException:
        agent.terminate()  # the agent forwards SIGTERM to the job's process group
        agent.wait(30)
        raise
    finally:
        lines.flush()
        env_file.unlink(missing_ok=True)
    # the agent's record, read as any agent's (bounded, validated)
    record = out / agent_record.NAME
    status = agent_record.parse(record.read_bytes() if record.exists() else None, None) or {}
    if status.get("state") != "succeeded":
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-engine.TAIL_LINES:]) if log_path.exists() else ""
        code = status.get("exit_code")
        raise RemoteError(f"the job on this machine {'exited ' + str(code) if code is not None else 'did not finish'}"
                          + engine.worker_failure(status.get("error")), f"its last lines are above; see {log_path}",
                          command=job.task.run, host="local", exit_status=code or 1,
                          tail=job_summary.mask_text(tail, job.secret_values))
    # bounded, masked, checked against the job's schema, as from an instance
    return job_summary.read_summary(out / "outputs" / "summary.json", job_summary.schema_of(job), job.secret_values,
                                    root=out) or {}
