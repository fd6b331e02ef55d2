"""Reaching an instance: ssh, ssh-config (OpenSSH with the pinned host keys), logs."""
from __future__ import annotations

import codecs
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, cast

import typer

from ..errors import UsageError
from ..inert import inert
from . import JSON, REGION, SANDBOX, Context, _sandbox_flag, app, err, note, out, render_json, say, warn
from .instances import _find

if TYPE_CHECKING:
    from ..backend import Context as BackendContext  # what cli.Context returns


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
        config, _, _ = _write_ssh_config(ctx, warn)
        argv = [shutil.which("ssh") or "ssh", "-F", str(config), "-o", "LogLevel=ERROR", inst["InstanceId"],
                *ctx_.args]
        code = subprocess.call(argv)
    raise typer.Exit(code)


def _pin_host_key(ctx: BackendContext, inst: dict) -> None:
    """Before OpenSSH connects (StrictHostKeyChecking yes, HostKeyAlias): pin the instance's host
    key under its instance id, verified against its console output, when it is not pinned yet.
    Raises RemoteError, WaitTimeout."""
    from ..remote import ssh
    from ..runs import standing
    if not ssh.pin_under_alias(ctx.settings.home / "known_hosts" / inst["InstanceId"], inst["InstanceId"], note):
        standing.pin_host_key(ctx.aws, ctx.settings, ctx.backend, inst, log=note).close()


@app.command()
def logs(name: str = typer.Argument(..., help="Run id, name or instance id."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends, "
                                     "reconnecting when SSH drops (no line missed or repeated)."),
         region: Optional[str] = REGION, sandbox: bool = SANDBOX):
    """Print a run's job log, from its instance or, once the run is over, from its artifacts.

    job.log is the job's output, its control characters shown as escapes (ESC as \\x1b): none reaches
    the terminal. With --follow, exit with the job's exit status."""
    from ..runs import logs as run_logs

    write = InertWriter(sys.stdout.buffer)

    from ..settings import load
    home = load({"region": region}).home
    row = run_logs.finished(home, name)
    if row is not None:  # over: the log is on this machine, no AWS needed
        write(run_logs.saved_log(home, row["run_id"]).read_bytes(), final=True)
        if follow:
            raise typer.Exit(run_logs.exit_status_of(row))
        return
    with Context(region, _sandbox_flag(sandbox)) as ctx:
        try:
            inst = _find(ctx, name)[0]
        except UsageError:
            inst = None
        if inst is None:  # over: the log as it was brought home
            write(run_logs.saved_log(ctx.settings.home, name).read_bytes(), final=True)
            return
        try:
            status, run_id = run_logs.stream(ctx, inst, follow, write, note=note)
        finally:
            write(b"", final=True)
    if follow:
        say(err, f"the job on {inst['InstanceId']} ended with exit status {status}; "
            f"`ec2gpu down {run_id}` removes the instance", "dim")
        raise typer.Exit(cast(int, status))  # stream gives the job's exit status when it follows


class InertWriter:
    """Write a job log's bytes to ``stream`` as they come, made inert (ec2gpu.inert): UTF-8 decoded
    across chunk boundaries (a byte that is not UTF-8 as U+FFFD), a CR at a chunk's end held until
    the next chunk says whether it ends a line. ``final``: the log's end (flush what is held)."""

    def __init__(self, stream):
        self.stream, self.held = stream, ""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, chunk: bytes, final: bool = False) -> None:
        text = self.held + self.decoder.decode(chunk, final)
        keep = len(text) if final else len(text.rstrip("\r"))
        text, self.held = text[:keep], text[keep:]
        if text:
            self.stream.write(inert(text).encode())
        self.stream.flush()


def _write_ssh_config(ctx: BackendContext, warn=lambda line: None, pin: bool = False):
    from ..runs import standing
    return standing.write_ssh_config(ctx.aws, ctx.settings, ctx.backend, warn, pin=pin, log=note)


@app.command()
def tunnel(name: str = typer.Argument(..., help="Name or instance id of a running instance."),
           port: int = typer.Argument(..., min=1, max=65535, help="The port on the instance (a server on its "
                                      "127.0.0.1 is enough)."),
           local_port: Optional[int] = typer.Option(None, "--local-port", min=1, max=65535, help="The port here "
                                                    "(default: the same one when free, else any free one)."),
           region: Optional[str] = REGION, sandbox: bool = SANDBOX):
    """Forward a port of a running instance to 127.0.0.1 here over SSH, until Ctrl-C.

    TensorBoard, a notebook, any server. OpenSSH with the pinned host key; nothing is opened in the
    security group. If SSH drops, it reconnects. Ctrl-C, SIGTERM and SIGHUP end it and its ssh."""
    from ..remote import tunnel as tn

    with Context(region, _sandbox_flag(sandbox)) as ctx, tn.hangup_interrupts():
        inst = _find(ctx, name)[0]
        _pin_host_key(ctx, inst)
        config, _, _ = _write_ssh_config(ctx, warn)
        here = tn.free_local_port(local_port or port)
        if local_port and here != local_port:
            raise UsageError(f"--local-port {local_port} is in use on this machine", "choose another, or leave it out")
        say(err, f"http://127.0.0.1:{here} -> {name}:{port} over SSH; Ctrl-C to stop")
        try:  # its ssh ends with this command, however it ends
            tn.forward_until_interrupted(tn.argv(config, inst["InstanceId"], port, here), here, note,
                                         refresh=lambda: _write_ssh_config(ctx, warn))
        except KeyboardInterrupt:
            say(err, "tunnel closed")


@app.command()
def notebook(
    instance_type: Optional[str] = typer.Option(None, "--instance-type", "-t", help="GPU instance type (for a new one)."),
    spot: bool = typer.Option(False, "--spot", help="A spot instance (for a new one)."),
    name: Optional[str] = typer.Option(None, "--name", help="Use this running instance, or name the new one."),
    local_port: Optional[int] = typer.Option(None, "--local-port", min=1, max=65535, help="The port here (default: "
                                             "a free one)."),
    down_on_exit: bool = typer.Option(False, "--down-on-exit", help="Terminate the instance when this command ends "
                                      "(default: it stays, with its idle rule)."),
    idle_stop: Optional[str] = typer.Option(None, "--idle-stop", help="A new instance stops itself after this long "
                                            "idle (30m, 1h)."),
    idle_down: Optional[str] = typer.Option(None, "--idle-down", help="A new instance terminates itself after this "
                                            "long idle (default 60m)."),
    no_idle: bool = typer.Option(False, "--no-idle", help="No idle rule (then --max-runtime must be given)."),
    max_runtime: Optional[int] = typer.Option(None, "--max-runtime", min=1, help="Minutes until a new instance "
                                              "terminates itself (default 120)."),
    ssh_cidr: Optional[str] = typer.Option(None, "--ssh-cidr", help="CIDR allowed to SSH (default: your IP/32)."),
    ami: Optional[str] = typer.Option(None, "--ami", help="AMI id (default: the PyTorch Deep Learning AMI)."),
    region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
):
    """JupyterLab on an instance, at a local URL, until Ctrl-C.

    The instance is launched (or found by --name); JupyterLab starts in its torch Python on its
    127.0.0.1 with a random token (or the one already running there is reused) and is forwarded
    over SSH (pinned host key; nothing opened in the security group), reconnecting if SSH drops.
    Ctrl-C, SIGTERM and SIGHUP close the tunnel. The instance then stays with its idle rule
    (--down-on-exit terminates it)."""
    from ..aws import catalog, sweep, tags as T
    from ..remote import tunnel
    from ..runs import notebook as nb
    from ..runs import pipeline
    from . import RichReporter
    from .instances import idle_rule

    if name is not None:
        T.check_name(name)
    idle = idle_rule(idle_stop, idle_down, no_idle, max_runtime, spot)
    with Context(region, _sandbox_flag(sandbox), persistent=True) as ctx, tunnel.hangup_interrupts():
        asked = instance_type or ctx.settings.instance_type
        opts = pipeline.TrainOptions(instance_type=",".join(catalog.lookup(t).name for t in asked.split(",")),
                                     spot=spot, name=name, ssh_cidr=ssh_cidr, ami=ami,
                                     max_runtime_minutes=max_runtime or 120, idle=idle)

        def show(info: dict) -> None:
            if as_json:
                render_json(info)
                sys.stdout.flush()
            else:
                say(out, f"notebook: {info['url']}", soft_wrap=True)
            say(err, f"on {info['name']} ({info['instance_id']}); Ctrl-C closes the tunnel", "dim")

        info = nb.serve(ctx.aws, ctx.settings, ctx.backend, opts, RichReporter(err, quiet=as_json), show, local_port)
        if down_on_exit:
            inst = sweep.find_instances(ctx.aws.ec2, states=["pending", "running", "stopping", "stopped"])
            run_id = next((T.as_dict(i.get("Tags")).get(T.RUN) for i in inst if i["InstanceId"] == info["instance_id"]),
                          None)
            if run_id:
                sweep.delete_run(ctx.aws.ec2, run_id, ctx.settings.keys_dir, log=note, iam=ctx.aws.client("iam"))
            say(err, f"notebook closed; {info['name']} terminated (--down-on-exit)")
        else:
            again = f"`ec2gpu tunnel {info['name']} {info['port']}`" if "port" in info else \
                f"`ec2gpu notebook --name {info['name']}`"
            say(err, f"notebook closed; {info['name']} keeps running with its idle rule (`ec2gpu ls`). "
                f"{again} reopens it, `ec2gpu down {info['name']}` removes it")


@app.command("ssh-config")
def ssh_config(region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Write ~/.ec2gpu/ssh_config so plain `ssh NAME`, scp and editors reach the running instances.

    Each entry insists on the instance's pinned host key (under its instance id, so a new address
    after `ec2gpu start` is still the same host); an instance not pinned yet is pinned first,
    checked against its console output, or left out with the reason."""
    with Context(region, _sandbox_flag(sandbox)) as ctx:
        path, entries, skipped = _write_ssh_config(ctx, warn, pin=True)
    if as_json:
        render_json({"path": str(path), "hosts": [e.aliases[0] for e in entries], "skipped": skipped})
        return
    say(out, f"wrote {path} with {len(entries)} host(s): {', '.join(e.aliases[0] for e in entries) or '-'}")
    for iid, why in skipped.items():  # the reason may quote the instance's console: inert
        say(out, f"skipped {iid}: {why}", "yellow")
    say(out, f"add this line to ~/.ssh/config once: Include {path}", "dim")


@app.command()
def fetch(run_id: str = typer.Argument(..., help="Run id (or a unique prefix), as `ec2gpu runs` lists it."),
          out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to (default: the run's artifacts "
                                                 "directory)."),
          max_download: Optional[str] = typer.Option(None, "--max-download", help="Bytes brought home per directory "
                                                     "(500M, 10G; default EC2GPU_MAX_DOWNLOAD_BYTES, else 4G)."),
          max_files: Optional[int] = typer.Option(None, "--max-files", min=0, help="Files brought home per directory "
                                                  "(default EC2GPU_MAX_DOWNLOAD_FILES, else 10000)."),
          region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON):
    """Bring home what a run's job has written so far, from its running instance.

    Outputs, checkpoints, job.log, status.json: for a run whose controller died, before
    `ec2gpu down RUN`; or what a run left on a standing instance above its download limits."""
    from dataclasses import replace

    from ..runs import ledger, logs
    from .tasks import _size

    with Context(region, _sandbox_flag(sandbox)) as ctx:
        row = ledger.get(ctx.settings.home, run_id)
        head = logs.head_instance(ctx.aws.ec2, row)
        if head is None:
            raise UsageError(f"run {row['run_id']} has no running instance to fetch from",
                             f"what it brought home is in {row.get('artifacts') or 'runs/' + row['run_id']}")
        out = Path(out_dir or row.get("artifacts") or Path("runs") / row["run_id"]).resolve()
        limits = ctx.settings.download_limits
        if max_download is not None:
            limits = replace(limits, bytes=_size(max_download, "--max-download"))
        if max_files is not None:
            limits = replace(limits, files=max_files)
        got = logs.fetch(ctx, head, row["run_id"], out, note, limits)
    if as_json:
        render_json({"run_id": row["run_id"], "out": str(out), **got})
