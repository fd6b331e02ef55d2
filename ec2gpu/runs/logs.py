"""`ec2gpu logs`: a run's job log, from its instance while it stands (followed by byte offset
through dropped connections), else from the artifacts brought home."""
from __future__ import annotations

from pathlib import Path

from ..errors import RemoteError, UsageError


def saved_log(home: Path, name: str) -> Path:
    """The job log a finished run brought home (job.log, or node 0's of a cluster run).

    Raises UsageError when the ledger has no such run or its artifacts hold no log.
    """
    from . import ledger
    try:
        artifacts = Path(ledger.get(home, name).get("artifacts") or "")
    except UsageError as exc:
        raise UsageError(f"no running instance named {name!r}, and {exc.message}", "see `ec2gpu ls` and `ec2gpu runs`")
    path = next((p for p in (artifacts / "job.log", artifacts / "job-node-0.log") if p.is_file()), None)
    if path is None:
        raise UsageError(f"run {name!r} has no instance left and no log at {artifacts / 'job.log'}",
                         "its artifacts were moved or never downloaded")
    return path


def stream(ctx, inst: dict, follow: bool, write, note) -> tuple[int | None, str]:
    """Write the job log of the run on instance ``inst`` (a DescribeInstances dict) to ``write``
    (bytes), as it is now or, with ``follow``, to the job's end; return (the job's exit status, or
    None without ``follow``; the run id). The host key is checked against the console output.

    Raises RemoteError when the instance stays unreachable, UsageError without its private key.
    """
    from ..aws import instances, network
    from ..aws import tags as T
    from ..remote import jobs, ssh

    run_id, iid = T.as_dict(inst.get("Tags")).get(T.RUN), inst["InstanceId"]
    host, port = ssh.target(inst, ctx.resolver)
    key = network.require_private_key(ctx.settings.keys_dir, inst["KeyName"])
    known = ctx.settings.home / "known_hosts" / iid
    conn = ssh.wait_for_ssh(host, port, ctx.settings.ssh_user, key, known, timeout_s=60, log=note,
                            fingerprints=lambda: instances.host_key_fingerprints(ctx.aws.ec2, iid))
    run_dir = jobs.remote_run_dir(conn, run_id)
    cursor = jobs.LogCursor(write)
    status = None
    try:
        if follow:
            try:
                status, conn = jobs.follow_reconnecting(
                    lambda: ssh.connect(host, port, ctx.settings.ssh_user, key, known, note), run_dir,
                    "job.log", cursor, conn=conn, log=note)
            except jobs.Unreachable as exc:
                raise RemoteError(f"{iid}: {exc}", "see `ec2gpu ls`; the instance may have been terminated")
        else:
            cursor.deliver(jobs.read_from(conn, f"{run_dir}/job.log", 0))
    finally:
        conn.close()
    return status, run_id
