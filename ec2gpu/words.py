"""Counts in the user's words (pure): "1 file", "2 files", "1,024 files": the one helper every
message that prints a count of things uses, so none says "1 files" or "file(s)"."""
from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` (thousands separated) and ``noun``, in its plural (``plural``, default ``noun`` + "s")
    unless ``n`` is 1: count(1, "file") == "1 file", count(2, "entry", "entries") == "2 entries"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
