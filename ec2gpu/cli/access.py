"""Reaching an instance: ssh, ssh-config (OpenSSH with the pinned host keys), logs, fetch, tunnel, notebook.

Only parsing, calling and rendering: each command is one function of api/access.py.
"""
from __future__ import annotations

import codecs
import sys
from pathlib import Path
from typing import Any, BinaryIO, Optional, cast

import typer

from .. import words
from ..inert import inert
from .app import JSON, REGION, SANDBOX, _sandbox_flag, app
from .render import err, note, out, render_json, say, warn


@app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh_cmd(ctx_: typer.Context, name: str = typer.Argument(..., help="Name, instance id or run id."),
            region: Optional[str] = REGION, sandbox: bool = SANDBOX) -> None:
    """Open a shell on an instance, or run a command after `--`: ec2gpu ssh NAME -- nvidia-smi.

    Uses the config `ec2gpu ssh-config` writes and the instance's pinned host key (verified against
    its console output first if it is not pinned yet): OpenSSH refuses any other key."""
    from ..api import access as ops
    raise typer.Exit(ops.ssh(name, ctx_.args, region=region, sandbox=_sandbox_flag(sandbox), log=note, warn=warn))


@app.command()
def logs(name: str = typer.Argument(..., help="Run id, name or instance id."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends, "
                                     "reconnecting when SSH drops (no line missed or repeated)."),
         index: Optional[int] = typer.Option(None, "--index", help="An array's or a sweep's element: its own "
                                             "log (logs/INDEX.log of the run's artifacts once it ended; from "
                                             "the worker that runs it while it runs, --follow to its end)."),
         region: Optional[str] = REGION, sandbox: bool = SANDBOX) -> None:
    """Print a run's job log, from its instance or, once the run is over, from its artifacts.

    A detached run's (run --detach) comes from its S3 store, from any machine of the account: as
    its agent last uploaded it (every 60 s), or with --follow until the run ends. job.log is the
    job's output, its control characters shown as escapes (ESC as \\x1b): none reaches the
    terminal. With --follow, exit with the job's exit status."""
    from ..api import access as ops

    write = InertWriter(sys.stdout.buffer)
    shown = ops.logs(name, follow=follow, write=write, region=region, sandbox=_sandbox_flag(sandbox), log=note,
                     index=index)
    if shown.source == "s3" and follow:
        if shown.exit_status is None:
            say(err, f"run {shown.run_id} is {shown.state} and its group has ended; "
                f"`ec2gpu status {shown.run_id}` says more", "dim")
            raise typer.Exit(1)
        say(err, f"run {shown.run_id} {shown.state} (exit status {shown.exit_status})", "dim")
        raise typer.Exit(shown.exit_status)
    if shown.source == "instance" and follow and index is not None:  # an element followed on its worker
        if shown.exit_status is None:
            say(err, f"element {index} is no longer running on {shown.instance_id} and its end is not recorded "
                f"(its worker lost: it runs again elsewhere); `ec2gpu status {shown.run_id}` says more", "dim")
            raise typer.Exit(1)
        say(err, f"element {index} ended with exit status {shown.exit_status}", "dim")
        raise typer.Exit(shown.exit_status if 0 <= shown.exit_status <= 255 else 1)
    if shown.source == "instance" and follow and shown.state is not None:  # its instance ends without `down`
        said = f"the job on {shown.instance_id} ended with exit status {shown.exit_status}; " \
            if shown.exit_status is not None else f"{shown.instance_id}: "
        say(err, f"{said}{shown.state}; `ec2gpu runs show {shown.run_id}` says how the run ended", "dim",
            soft_wrap=True)
        raise typer.Exit(1 if shown.exit_status is None else shown.exit_status)
    if shown.source == "instance" and follow:
        say(err, f"the job on {shown.instance_id} ended with exit status {shown.exit_status}; "
            f"`ec2gpu down {shown.run_id}` removes the instance", "dim", soft_wrap=True)  # the command stays whole
        raise typer.Exit(cast(int, shown.exit_status))  # the job's exit status, when it follows
    if follow and shown.exit_status is not None:  # a finished run: its job's exit status
        raise typer.Exit(shown.exit_status)


class InertWriter:
    """Write a job log's bytes to ``stream`` as they come, made inert (ec2gpu.inert): UTF-8 decoded
    across chunk boundaries (a byte that is not UTF-8 as U+FFFD), a CR at a chunk's end held until
    the next chunk says whether it ends a line. ``final``: the log's end (flush what is held)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.held = stream, ""
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, chunk: bytes, final: bool = False) -> None:
        text = self.held + self.decoder.decode(chunk, final)
        keep = len(text) if final else len(text.rstrip("\r"))
        text, self.held = text[:keep], text[keep:]
        if text:
            self.stream.write(inert(text).encode())
        self.stream.flush()


@app.command()
def tunnel(name: str = typer.Argument(..., help="Name or instance id of a running instance."),
           port: int = typer.Argument(..., min=1, max=65535, help="The port on the instance (a server on its "
                                      "127.0.0.1 is enough)."),
           local_port: Optional[int] = typer.Option(None, "--local-port", min=1, max=65535, help="The port here "
                                                    "(default: the same one when free, else any free one)."),
           region: Optional[str] = REGION, sandbox: bool = SANDBOX) -> None:
    """Forward a port of a running instance to 127.0.0.1 here over SSH, until Ctrl-C.

    TensorBoard, a notebook, any server. OpenSSH with the pinned host key; nothing is opened in the
    security group. If SSH drops, it reconnects. Ctrl-C, SIGTERM and SIGHUP end it and its ssh."""
    from ..api import access as ops
    ops.tunnel(name, port, local_port=local_port, region=region, sandbox=_sandbox_flag(sandbox), log=note, warn=warn,
               on_ready=lambda url: say(err, f"{url} -> {name}:{port} over SSH; Ctrl-C to stop"))
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
) -> None:
    """JupyterLab on an instance, at a local URL, until Ctrl-C.

    The instance is launched (or found by --name); JupyterLab starts in its torch Python on its
    127.0.0.1 with a random token (or the one already running there is reused) and is forwarded
    over SSH (pinned host key; nothing opened in the security group), reconnecting if SSH drops.
    Ctrl-C, SIGTERM and SIGHUP close the tunnel. The instance then stays with its idle rule
    (--down-on-exit terminates it)."""
    from ..api import access as ops
    from .render import RichReporter

    def show(info: dict[str, Any]) -> None:
        if as_json:
            render_json(info)
            sys.stdout.flush()
        else:
            say(out, f"notebook: {info['url']}", soft_wrap=True)
        say(err, f"on {info['name']} ({info['instance_id']}); Ctrl-C closes the tunnel", "dim")

    info = ops.notebook(instance_type=instance_type, spot=spot, name=name, local_port=local_port,
                        down_on_exit=down_on_exit, idle_stop=idle_stop, idle_down=idle_down, no_idle=no_idle,
                        max_runtime=max_runtime, ssh_cidr=ssh_cidr, ami=ami, region=region,
                        sandbox=_sandbox_flag(sandbox), reporter=RichReporter(err, quiet=as_json), on_ready=show,
                        log=note)
    if down_on_exit:
        say(err, f"notebook closed; {info.name} terminated (--down-on-exit)")
    else:
        again = f"`ec2gpu tunnel {info.name} {info.port}`" if info.port is not None else \
            f"`ec2gpu notebook --name {info.name}`"
        say(err, f"notebook closed; {info.name} keeps running with its idle rule (`ec2gpu ls`). "
            f"{again} reopens it, `ec2gpu down {info.name}` removes it")


@app.command("ssh-config")
def ssh_config(region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Write ~/.ec2gpu/ssh_config so plain `ssh NAME`, scp and editors reach the running instances.

    Each entry insists on the instance's pinned host key (under its instance id, so a new address
    after `ec2gpu start` is still the same host); an instance not pinned yet is pinned first,
    checked against its console output, or left out with the reason."""
    from ..api import access as ops
    written = ops.ssh_config(region=region, sandbox=_sandbox_flag(sandbox), log=note, warn=warn)
    if as_json:
        render_json(written)
        return
    path = written.path
    say(out, f"wrote {path} with {words.count(len(written.hosts), 'host')}: {', '.join(written.hosts) or '-'}")
    for iid, why in written.skipped.items():  # the reason may quote the instance's console: inert
        say(out, f"skipped {iid}: {why}", "yellow")
    say(out, f"add this line to ~/.ssh/config once: Include {path}", "dim")


@app.command()
def fetch(run_id: str = typer.Argument(..., help="Run id (or a unique prefix), as `ec2gpu runs` lists it."),
          out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to (default: the run's artifacts "
                                                 "directory)."),
          max_download: Optional[str] = typer.Option(None, "--max-download", help="Bytes brought home per directory "
                                                     "(500MB, 2GiB; default EC2GPU_MAX_DOWNLOAD_BYTES, else 4GiB)."),
          max_files: Optional[int] = typer.Option(None, "--max-files", min=0, help="Files brought home per directory "
                                                  "(default EC2GPU_MAX_DOWNLOAD_FILES, else 10000)."),
          region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON) -> None:
    """Bring home what a run's job has written so far, from its running instance.

    Outputs, checkpoints, job.log, the agent's record: for a run whose controller died, before
    `ec2gpu down RUN`; or what a run left on a standing instance above its download limits. A
    detached run's (run --detach) come from its S3 store, from any machine of the account."""
    from ..api import access as ops
    got = ops.fetch(run_id, out=out_dir, max_download=max_download, max_files=max_files, region=region,
                    sandbox=_sandbox_flag(sandbox), log=note)
    if as_json:
        render_json(got)
