"""The `ec2gpu` typer app: the root and its command groups, the options every command shares, the
root callback (--version). The command modules (tasks.py, train.py, ...) register on these apps;
cli/__init__ imports them in --help's order.

typer and click only: nothing heavy is imported here, so that `ec2gpu --help` starts fast
(scripts/help_time.py measures it; docs/testing.md has the figures).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # the click typer vendors (typer >= 0.2x): its group's methods take these
    from typer._click import Context, HelpFormatter


class _Group(typer.core.TyperGroup):
    """typer's group, its command list giving each command's whole first sentence (click cuts it
    at 45 characters or the line's width with '...'; the help column wraps it instead), in the
    order the commands are registered (older typer lets click sort them by name)."""

    def list_commands(self, ctx: Context) -> list[str]:
        """The commands' names in registration order: your own job first."""
        return list(self.commands)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The 'Commands' section: name and first sentence of each visible command, in order."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def group(help: str, **options: Any) -> typer.Typer:  # options: typer.Typer's keyword arguments
    """A typer app (the root or a command group) with the settings every one of ours shares: plain
    click help (``rich_markup_mode=None``: typer's rich help imports rich's markdown and traceback
    renderers, which doubled `ec2gpu --help`'s start-up), no rich tracebacks (``main()`` is the one
    error boundary) and help instead of an error when no command is given."""
    options.setdefault("no_args_is_help", True)
    return typer.Typer(help=help, cls=_Group, rich_markup_mode=None, pretty_exceptions_enable=False, **options)


app = group("Rent a GPU on AWS EC2 for exactly as long as a training job needs it.", add_completion=False)
train_app = group("Train a built-in job on a new instance, then terminate it.")
sandbox_app = group("The local sandbox: moto's AWS server + one real sshd per instance.")
image_app = group("Machine images that already hold a task's setup: bake, list, remove.")
app.add_typer(train_app, name="train")
app.add_typer(image_app, name="image")
app.add_typer(sandbox_app, name="sandbox")

SANDBOX = typer.Option(False, "--sandbox", help="Use the local sandbox (started for this command if none is up). "
                       "Also EC2GPU_SANDBOX=1.")
REGION = typer.Option(None, "--region", help="AWS region (default: EC2GPU_REGION, AWS_REGION, us-east-1).")
JSON = typer.Option(False, "--json", help="Print JSON for scripts instead of a table.")


def _version(value: bool) -> None:
    if value:
        from .. import __version__
        print(f"ec2gpu {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Rent a GPU on AWS EC2 for exactly as long as a training job needs it."""


def _sandbox_flag(flag: bool = False) -> bool:
    """--sandbox, or EC2GPU_SANDBOX=1 (backend.sandbox_from_env)."""
    from ..backend import sandbox_from_env
    return sandbox_from_env(flag)
