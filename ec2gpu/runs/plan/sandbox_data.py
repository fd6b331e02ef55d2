"""Where a sandbox instance finds MNIST for the built-in trainer: decided by the plan, before
anything is opened, so that `train mnist --sandbox` with no data here and no internet is refused
in its dry run as in its real run (runs/plan/runplan.plan adds ``sandbox_data_args``' flags to the
trainer's).

A sandbox "instance" runs on this machine: it reads the files given here (``--data-dir``), or
downloads them from the public mirrors as a real instance does (train/sources.py).
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from ...errors import UsageError
from ...train import sources

GIVE_DATA = "EC2GPU_DATA_DIR=/path/to/mnist ec2gpu train mnist --sandbox (or DATA=/path/to/mnist make demo)"


def sandbox_data_args(trainer_args: list[str], reachable: Callable[[str], bool] | None = None,
                      give: str = GIVE_DATA) -> list[str]:
    """The trainer flags that give a sandbox instance this run's MNIST: ``--data-dir`` with
    $EC2GPU_DATA_DIR as this command has it (so each run's own setting reaches its instance, not
    the one the sandbox started with), else with this machine's cache when it holds the files;
    [] when the user passed --data-dir, or when the public mirrors answer (the instance downloads
    from them, as a real one does). ``reachable(url) -> bool`` asks the first mirror.

    Raises UsageError, before anything is created, for a $EC2GPU_DATA_DIR that is not a directory,
    or when there is no data here and the mirrors cannot be reached (its hint: ``give``, the
    command's own way to name the data).
    """
    if any(a == "--data-dir" or a.startswith("--data-dir=") for a in trainer_args):
        return []
    given = os.environ.get("EC2GPU_DATA_DIR")
    if given:
        path = Path(given).expanduser().resolve()
        if not path.is_dir():
            raise UsageError(f"EC2GPU_DATA_DIR {path} is not a directory",
                             "point it at the four MNIST IDX files, e.g. DATA=/path/to/mnist make demo")
        return ["--data-dir", str(path)]
    if sources.has_all(sources.DEFAULT_CACHE):
        return ["--data-dir", str(sources.DEFAULT_CACHE)]
    if (reachable or _reachable)(sources.MIRRORS[0]):
        return []
    raise UsageError("no MNIST for the sandbox: EC2GPU_DATA_DIR is not set, this machine has no cached copy, and the "
                     f"public mirrors ({sources.MIRRORS[0]}) cannot be reached from here",
                     f"give the four IDX files: {give}")


def _reachable(url: str, timeout_s: float = 5.0) -> bool:
    """Whether ``url``'s host answers HTTP within ``timeout_s`` (any status counts)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s).close()
        return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False
