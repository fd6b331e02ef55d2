"""`python -m ec2gpu.train.launch`: torchrun, plus a structured root cause when a worker fails.

Takes torchrun's own arguments (https://pytorch.org/docs/stable/elastic/run.html) and runs it
(``torch.distributed.run.run``). When a worker fails, torchrun raises ChildFailedError: a worker
that raised an exception under ``@record`` left an error file, and plain ``torchrun`` copies it to
``TORCHELASTIC_ERROR_FILE``; a worker that died of a signal (SIGKILL, the OOM killer) left none,
and torchrun only logs it. This wrapper writes the error file in both cases, in torchelastic's
format (https://pytorch.org/docs/stable/elastic/errors.html) with ``errorCode`` set to the
worker's exit code (negative: killed by that signal, as torchelastic reports it) and the failed
rank, so the instance agent (agent/agent.py) can put the root cause into its record and the
controller never reads it from log text. Exits 1 after a worker failure, without a traceback.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from .files import write_json


def failure_record(exitcode: int, rank: int, timestamp: int, message: str,
                   child: dict[str, Any] | None) -> dict[str, Any]:
    """The error file's content (pure): the worker's own record when it wrote one (``child``: its
    JSON, torchelastic's format), else one made from torchelastic's ProcessFailure; either way with
    ``errorCode`` and the failed ``rank``."""
    record: dict[str, Any] = dict(child) if child and isinstance(child.get("message"), dict) else \
        {"message": {"message": message, "extraInfo": {"timestamp": str(timestamp)}}}
    record["message"] = {**record["message"], "errorCode": exitcode, "rank": rank}
    return record


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        record = failure_record(failure.exitcode, rank, failure.timestamp, failure.message,
                                failure.error_file_data or None)
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            write_json(path, record)
        print(f"ec2gpu.train.launch: rank {rank} failed: {failure.message.splitlines()[0] if failure.message else ''}"
              f" (exit code {failure.exitcode})", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
