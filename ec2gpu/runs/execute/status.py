"""The agent's record as the controller believes it: read once from an instance, signature checked,
every field validated (wire/agent_record.py holds its fields, its signature rule and the one validator,
``parse``, which agent.py's writer and every reader share).

The record is written on the instance, where the job runs as the same user as the agent: the job
(or a process it left behind) can rewrite it. So the controller gives each attempt's agent a key of
its own (agent/agent.py ``--key-file``, written once the task's setup and all it left running have
ended, read and deleted before the job starts) and believes only a record signed with it; it
reads the record once, when the job has ended, and uses that copy for the verdict and for the
agent-record.json it writes at home. Whatever the file holds, ``read`` returns a record of
agent_record.parse's shape and never raises for its content: an unreadable or unsigned record is a
failed job (exit 5) with its outputs and last lines brought home, never a crash of the controller.
"""
from __future__ import annotations

import secrets
from typing import Any

from ...wire import agent_record


def new_key() -> str:
    """A fresh signing key for one agent: 32 random bytes in hex (Python's secrets)."""
    return secrets.token_hex(32)


def read(conn: Any, run_dir: str, key: str | None) -> dict[str, Any] | None:
    """The agent's record on an instance (agent_record.parse of RUN_DIR/agent-record.json, read once,
    at most agent_record.MAX_BYTES + 1 bytes; ``key``: hex, None for none to check). Raises the
    connection's errors."""
    from ...remote import jobs  # here: a dry run imports no paramiko (test_dry_run.py)
    return agent_record.parse(jobs.read_from(conn, f"{run_dir}/{agent_record.NAME}", 0, agent_record.MAX_BYTES + 1),
                              key)
