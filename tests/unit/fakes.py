"""Fakes that more than one pure test module uses (imported by name: the test folders are not
packages, so pytest's prepend import mode puts this folder on sys.path)."""
from __future__ import annotations

from datetime import datetime, timezone

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)


class _Pages:
    def __init__(self, pages):
        self.pages = pages

    def paginate(self, **kwargs):
        return iter(self.pages)


class FakeEC2:
    """An EC2 client with canned pages per paginator (describe_instance_types answers nothing, so
    a type's facts come from the catalog's table)."""

    def __init__(self, **pages):
        self.pages = {"describe_instance_types": [{"InstanceTypes": []}], **pages}

    def get_paginator(self, name):
        return _Pages(self.pages[name])


def _run(run_id, task, phases, status="completed"):
    return {"run_id": run_id, "command": "run", "backend": "aws", "status": status, "task": task,
            "started_at": T0.isoformat(), "phases": phases}
