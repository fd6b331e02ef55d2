"""The `ec2gpu` command: parse, call the api layer, render what it returns. Nothing else.

``app`` (app.py: the typer app, its groups and shared options, the root callback), ``render``
(render.py: every message as plain text through ``say``, tables, --json, the run's live display)
and ``errors`` (errors.py: the one error boundary, ``main``) are what the command modules build
on; this module registers those command modules on the app, in --help's order, and gives the
console script its entry point (``ec2gpu = "ec2gpu.cli:run"``).

Heavy modules (boto3, fabric, torch, and rich itself) are imported inside the commands, so
`ec2gpu --help` starts fast (scripts/help_time.py measures it; docs/testing.md has the figures).
"""
from __future__ import annotations

from .app import app

# registration order is --help's order: your own job first
from . import tasks as _tasks  # noqa: F401  (registers run, exec)
from . import train as _train  # noqa: F401  (registers train mnist)
from . import instances as _instances  # noqa: F401  (registers launch, scale, ls, down, cleanup, doctor)
from . import access as _access  # noqa: F401  (registers ssh, ssh-config, logs)
from . import costs as _costs  # noqa: F401  (registers prices, cost, runs)
from . import bench as _bench  # noqa: F401  (registers bench)
from . import images as _images  # noqa: F401  (registers image bake/ls/rm)
from . import sandbox as _sandbox  # noqa: F401  (registers sandbox up/down/status/interrupt/env)
from .errors import main, run

__all__ = ["app", "main", "run"]
