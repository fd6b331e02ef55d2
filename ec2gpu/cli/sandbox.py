"""`ec2gpu sandbox ...`: the local stand-in for AWS (moto + one sshd per instance)."""
from __future__ import annotations

from typing import Optional

import typer

from .. import words
from .app import JSON, sandbox_app
from .render import err, out, render_json, say


@sandbox_app.command("up")
def sandbox_up(like_aws: bool = typer.Option(False, "--like-aws", help="Behave like EC2 where moto does not: "
                                             "instances pending for a few seconds, sshd and the console's host key "
                                             "fingerprints later still, NotFound for just-created resources now and "
                                             "then, occasional RequestLimitExceeded (docs/sandbox.md). Also "
                                             "EC2GPU_SANDBOX_LIKE_AWS=1."),
               as_json: bool = JSON) -> None:
    """Start the sandbox in the background; it keeps its state until `ec2gpu sandbox down`."""
    from ..api import sandbox as sandbox_api
    state = sandbox_api.sandbox_up(like_aws, log=lambda line: say(err, line, "yellow"))
    if as_json:
        render_json(state)
    else:
        say(out, f"sandbox up{' (like AWS)' if state.like_aws else ''}: AWS endpoint {state.endpoint} "
            f"(pid {state.pid}); `eval \"$(ec2gpu sandbox env)\"` points any AWS client at it")


@sandbox_app.command("down")
def sandbox_down() -> None:
    """Stop the sandbox and every sshd and process it started."""
    from ..api import sandbox as sandbox_api
    say(out, "sandbox stopped" if sandbox_api.sandbox_down() else "no sandbox was running")


@sandbox_app.command("status")
def sandbox_status(as_json: bool = JSON) -> None:
    """Say whether the sandbox runs, where, and which instances have an sshd."""
    from ..api import sandbox as sandbox_api
    state = sandbox_api.sandbox_status()
    if as_json:
        render_json(state if state is not None else {"running": False})
    elif state is None:
        say(out, "no sandbox is running (`ec2gpu sandbox up` starts one)")
    else:
        say(out, f"sandbox running: pid {state.pid}, AWS endpoint {state.endpoint}, "
            f"{words.count(len(state.instances), 'instance')}")
        for iid, i in state.instances.items():
            say(out, f"  {iid}: sshd {i['host']}:{i['port']} (pid {i['sshd_pid']})")


@sandbox_app.command("interrupt")
def sandbox_interrupt(instance_id: str = typer.Argument(..., help="A running spot instance of the sandbox."),
                      notice_seconds: float = typer.Option(120.0, "--notice-seconds", min=0,
                                                           help="Seconds between the notice and the termination "
                                                           "(EC2 gives 120)."),
                      rebalance: bool = typer.Option(False, "--rebalance",
                                                     help="Publish a rebalance recommendation instead (the instance "
                                                     "is at elevated risk of interruption), and nothing else: it "
                                                     "keeps running."),
                      as_json: bool = JSON) -> None:
    """Interrupt a spot instance as EC2 does: a notice on its metadata service, then termination."""
    from ..api import sandbox as sandbox_api
    done = sandbox_api.sandbox_interrupt(instance_id, notice_seconds, rebalance=rebalance)
    if as_json:
        render_json(done)
    elif done.rebalance is not None:
        say(out, f"{instance_id}: rebalance recommendation published (noticeTime {done.rebalance['noticeTime']}); "
            "it keeps running")
    else:
        notice = done.notice or {}
        say(out, f"{instance_id}: spot interruption notice published (action {notice.get('action')} at "
            f"{notice.get('time')}); the sandbox terminates it in {notice_seconds:g} s")


@sandbox_app.command("capacity")
def sandbox_capacity(instance_type: str = typer.Argument(..., help="An instance type, e.g. g4dn.xlarge."),
                     count: Optional[int] = typer.Argument(None, min=0, help="Instances of it that may be pending "
                                                           "or running at once, all zones together."),
                     unlimited: bool = typer.Option(False, "--unlimited", help="Remove the type's limit."),
                     as_json: bool = JSON) -> None:
    """Make the sandbox short of an instance type, as EC2 can be.

    A launch beyond the limit gets fewer instances, or InsufficientInstanceCapacity."""
    from ..api import sandbox as sandbox_api
    from ..errors import UsageError
    if (count is None) == (not unlimited):
        raise UsageError("give a count or --unlimited, not both or neither", "e.g. `ec2gpu sandbox capacity "
                         "g4dn.xlarge 1`")
    done = sandbox_api.sandbox_capacity(instance_type, None if unlimited else count)
    if as_json:
        render_json(done)
    else:
        say(out, f"{instance_type}: " + ("no limit" if unlimited else f"at most {count} pending or running at once"))


@sandbox_app.command("env")
def sandbox_env() -> None:
    """Print `export` lines that point AWS clients (boto3, the aws CLI) at the running sandbox."""
    import shlex

    from ..api import sandbox as sandbox_api
    for k, v in sandbox_api.sandbox_env().items():
        print(f"export {k}={shlex.quote(v)}")
