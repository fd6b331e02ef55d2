"""What a run tells the user (``Reporter``), in a module of its own: the CLI's RichReporter and
`run --dry-run` (api._prepare) need it without importing pipeline.py, which imports boto3.
pipeline.Reporter is this class (re-exported there).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager, Iterator, Protocol


class Reporter:
    """What the pipeline tells the user; the CLI renders it with rich, tests record it.

    ``after_phase`` is a seam for tests (None in the shipped program): called with the phase's name
    at the end of its work, still inside it, so a fault injected there surely lands in that phase.
    """

    after_phase: Callable[[str], object] | None = None

    def __init__(self, log: Callable[[str], object] | None = None) -> None:
        """``log``: each note is also said to it as it comes (an API caller's ``log=print``)."""
        self.phases: dict[str, float] = {}
        self.notes: list[str] = []
        self.said = log

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
            if Reporter.after_phase is not None:
                Reporter.after_phase(name)
        finally:
            # a managed run repeats phases on each attempt: their times add up
            self.phases[name] = round(self.phases.get(name, 0.0) + time.monotonic() - t0, 2)

    def log(self, line: str) -> None:
        """One line of the job's log."""

    def progress(self, p: dict[str, Any]) -> None:
        """The job's progress as it last wrote it (runs/execute/nodes.ProgressReader): ``done``, ``total``,
        optional ``label``, ``rate`` and ``rate_unit``, ``eta_s``."""

    def note(self, text: str) -> None:
        self.notes.append(text)
        if self.said is not None:
            self.said(text)


class ReporterLike(Protocol):
    """What the pipeline needs of its ``ui``: ``Reporter``, or the CLI's RichReporter (which wraps one)."""

    phases: dict[str, float]
    notes: list[str]

    def phase(self, name: str) -> ContextManager[Any]: ...

    def log(self, line: str) -> None: ...

    def progress(self, p: dict[str, Any]) -> None: ...

    def note(self, text: str) -> None: ...
