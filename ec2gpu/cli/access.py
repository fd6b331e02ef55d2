"""Reaching an instance: ssh, ssh-config (OpenSSH with the pinned host keys), logs."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..errors import UsageError
from . import JSON, REGION, SANDBOX, Context, _sandbox_flag, app, err, out, render_json
from .instances import _find


@app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh_cmd(ctx_: typer.Context, name: str = typer.Argument(..., help="Name, instance id or run id."),
            region: Optional[str] = REGION, sandbox: bool = SANDBOX):
    """Open a shell on an instance, or run a command after `--`: ec2gpu ssh NAME -- nvidia-smi.

    Uses the config `ec2gpu ssh-config` writes and the instance's pinned host key (verified against
    its console output first if it is not pinned yet): OpenSSH refuses any other key."""
    import shutil
    import subprocess

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        inst = _find(ctx, name)[0]
        _pin_host_key(ctx, inst)
        config, _, _ = _write_ssh_config(ctx, lambda line: err.print(f"[yellow]warning:[/] {escape(line)}"))
        argv = [shutil.which("ssh") or "ssh", "-F", str(config), "-o", "LogLevel=ERROR", inst["InstanceId"],
                *ctx_.args]
        code = subprocess.call(argv)
    raise typer.Exit(code)


def _pin_host_key(ctx: Context, inst: dict) -> None:
    """Before OpenSSH connects (StrictHostKeyChecking): pin the instance's host key, verified
    against its console output, when it is not pinned yet. Raises RemoteError, WaitTimeout."""
    from ..aws import instances, network
    from ..remote import ssh

    iid = inst["InstanceId"]
    known = ctx.settings.home / "known_hosts" / iid
    if known.is_file() and known.stat().st_size:
        return
    host, port = ctx.backend.ssh_target(inst)
    key = network.require_private_key(ctx.settings.keys_dir, inst["KeyName"])
    ssh.wait_for_ssh(host, port, ctx.settings.ssh_user, key, known, timeout_s=ssh.FINGERPRINT_WAIT_S + 60,
                     log=lambda m: err.print(f"[dim]{m}[/]", highlight=False),
                     fingerprints=lambda: instances.host_key_fingerprints(ctx.aws.ec2, iid)).close()


@app.command()
def logs(name: str = typer.Argument(..., help="Run id, name or instance id."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends, "
                                     "reconnecting when SSH drops (no line missed or repeated)."),
         region: Optional[str] = REGION, sandbox: bool = SANDBOX):
    """Print a run's job log (job.log: the job's output, byte for byte) from its instance, or from
    the artifacts once the run is over. With --follow, exit with the job's exit status."""
    from ..runs import logs as run_logs

    stdout = sys.stdout.buffer

    def write(chunk: bytes) -> None:
        stdout.write(chunk)
        stdout.flush()

    from ..settings import load
    home = load({"region": region}).home
    row = run_logs.finished(home, name)
    if row is not None:  # over: the log is on this machine, no AWS needed
        write(run_logs.saved_log(home, row["run_id"]).read_bytes())
        if follow:
            raise typer.Exit(run_logs.exit_status_of(row))
        return
    with Context(region, _sandbox_flag(sandbox)) as ctx:
        try:
            inst = _find(ctx, name)[0]
        except UsageError:
            inst = None
        if inst is None:  # over: the log as it was brought home
            write(run_logs.saved_log(ctx.settings.home, name).read_bytes())
            return
        status, run_id = run_logs.stream(ctx, inst, follow, write,
                                         note=lambda m: err.print(f"[dim]{m}[/]", highlight=False))
    if follow:
        err.print(f"[dim]the job on {inst['InstanceId']} ended with exit status {status}; "
                  f"`ec2gpu down {run_id}` removes the instance[/]")
        raise typer.Exit(status)


def _write_ssh_config(ctx: Context, warn=lambda line: None) -> tuple[Path, list, list[str]]:
    """Write $EC2GPU_HOME/ssh_config for every running instance whose key is here: (path, entries,
    instance ids skipped for want of their private key). A Name tag that is not safe in a Host line
    (tags.safe: anyone who can tag in the account could plant a ProxyCommand) is left out, and
    ``warn`` says so; the instance is still reachable by its id."""
    from ..aws import network, sweep
    from ..aws import tags as T
    from ..remote import ssh_config as sc

    entries, skipped = [], []
    for inst in sweep.find_instances(ctx.aws.ec2, states=["running"]):
        key = network.private_key_path(ctx.settings.keys_dir, inst.get("KeyName") or "")
        if not key.exists():
            skipped.append(inst["InstanceId"])
            continue
        host, port = ctx.backend.ssh_target(inst)
        name = T.as_dict(inst.get("Tags")).get(T.NAME)
        if name is not None and not T.safe(name):
            warn(f"{inst['InstanceId']}: its Name tag {name!r} has characters that are not safe in an ssh_config; "
                 "left out (use the instance id)")
            name = None
        entries.append(sc.HostEntry(tuple(a for a in (name, inst["InstanceId"]) if a), host, port,
                                    ctx.settings.ssh_user, key, ctx.settings.home / "known_hosts" / inst["InstanceId"]))
    path = ctx.settings.home / "ssh_config"
    (ctx.settings.home / "known_hosts").mkdir(parents=True, exist_ok=True)  # OpenSSH won't create it
    sc.write(path, sc.render(entries, path))
    return path, entries, skipped


@app.command()
def tunnel(name: str = typer.Argument(..., help="Name or instance id of a running instance."),
           port: int = typer.Argument(..., min=1, max=65535, help="The port on the instance (a server on its "
                                      "127.0.0.1 is enough)."),
           local_port: Optional[int] = typer.Option(None, "--local-port", min=1, max=65535, help="The port here "
                                                    "(default: the same one when free, else any free one)."),
           region: Optional[str] = REGION, sandbox: bool = SANDBOX):
    """Forward a port of a running instance to 127.0.0.1 here over SSH, until Ctrl-C: TensorBoard,
    a notebook, any server. OpenSSH with the pinned host key; nothing is opened in the security
    group. If SSH drops, it reconnects."""
    import threading

    from ..remote import tunnel as tn

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        inst = _find(ctx, name)[0]
        _pin_host_key(ctx, inst)
        warn = lambda line: err.print(f"[yellow]warning:[/] {escape(line)}")  # noqa: E731
        config, _, _ = _write_ssh_config(ctx, warn)
        here = tn.free_local_port(local_port or port)
        if local_port and here != local_port:
            raise UsageError(f"--local-port {local_port} is in use on this machine", "choose another, or leave it out")
        err.print(f"http://127.0.0.1:{here} -> {name}:{port} over SSH; Ctrl-C to stop", highlight=False)
        stop = threading.Event()
        try:
            tn.keep_forwarding(tn.argv(config, inst["InstanceId"], port, here), here, stop,
                               log=lambda m: err.print(f"[dim]{m}[/]", highlight=False),
                               refresh=lambda: _write_ssh_config(ctx, warn))
        except KeyboardInterrupt:
            stop.set()
            err.print("tunnel closed")


@app.command("ssh-config")
def ssh_config(region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Write ~/.ec2gpu/ssh_config so plain `ssh NAME`, scp and editors reach the running instances."""
    with Context(region, _sandbox_flag(sandbox)) as ctx:
        path, entries, skipped = _write_ssh_config(ctx, lambda line: err.print(f"[yellow]warning:[/] {escape(line)}"))
    if as_json:
        render_json({"path": str(path), "hosts": [e.aliases[0] for e in entries], "skipped": skipped})
        return
    out.print(f"wrote {path} with {len(entries)} host(s): {', '.join(e.aliases[0] for e in entries) or '-'}")
    if skipped:
        out.print(f"[yellow]skipped[/] {', '.join(skipped)}: their private keys are not on this machine")
    out.print(f"[dim]add this line to ~/.ssh/config once: Include {path}[/]")


@app.command()
def fetch(run_id: str = typer.Argument(..., help="Run id (or a unique prefix), as `ec2gpu runs` lists it."),
          out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to (default: the run's artifacts "
                                                 "directory)."),
          region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Bring home what a run's job has written so far (outputs, checkpoints, job.log, status.json)
    from its running instance: for a run whose controller died, before `ec2gpu down RUN`."""
    from ..runs import ledger, logs

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        row = ledger.get(ctx.settings.home, run_id)
        head = logs.head_instance(ctx.aws.ec2, row)
        if head is None:
            raise UsageError(f"run {row['run_id']} has no running instance to fetch from",
                             f"what it brought home is in {row.get('artifacts') or 'runs/' + row['run_id']}")
        out = Path(out_dir or row.get("artifacts") or Path("runs") / row["run_id"]).resolve()
        got = logs.fetch(ctx, head, row["run_id"], out, lambda m: err.print(f"[dim]{escape(m)}[/]", highlight=False))
    if as_json:
        render_json({"run_id": row["run_id"], "out": str(out), **got})
