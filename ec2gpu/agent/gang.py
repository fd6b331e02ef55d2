"""The nodes of a detached run of several (issue 30): how N instances of one Auto Scaling group
agree on who runs the job together, with which rank, and start again together when one of them is
replaced. Pure rules here; agent/members.py does the S3 reads and writes and agent/several.py runs
a node's part by them. Standard library only: shipped to the instance beside detached.py.

S3 keys, under the run's prefix ``runs/<user>/<run_id>/`` (store.Store):

- ``nodes/<instance_id>.json`` one per instance that ran the agent, written only by that instance:
  ``instance_id``, ``ip`` (its private address), ``booted_at`` (ISO 8601 UTC), ``state``
  (waiting | running | ended | leaving: a spot notice, it will not run again), ``generation`` (the
  last it ran in, 0: none), ``outcome`` (that attempt's: succeeded | failed | stopped | null),
  ``exit_code``. A thread writes it again every HEARTBEAT_S seconds: a record whose S3
  LastModified is older than the stale time (STALE_S) is an instance gone without a word. Its
  freshness is S3's clock, not the instance's.
- ``gang.json`` the current generation: ``generation`` (1, 2, ...), ``members`` (instance ids, rank
  order: member 0 is the head, SKYPILOT_NODE_RANK 0), ``ips`` (theirs, the same order:
  SKYPILOT_NODE_IPS), ``reason`` (start | interruption | restart | regroup: the members stopped for
  a member that was silent and came back), ``formed_at``. Written with S3
  conditional writes (IfNoneMatch for the first, IfMatch on the ETag read for the next), so of two
  instances that form one at once the first wins and the other joins it.

The rules (``propose``):
- A generation is formed when N instances are live (fresh, not leaving): the live members of the
  current one first, in their order (the head stays the head when a worker is replaced), then the
  others by boot time. Formed by any instance that is waiting when there is none yet, or when the
  current one has a member that is not live (it was interrupted, or went silent).
- Every node runs its job once per generation it is a member of. A node whose job is running
  stops it (SIGTERM: the job checkpoints) when the generation changes or one of its members is no
  longer live, and waits for the next one (EC2GPU_RESUME=1 there: the head's checkpoints are
  pulled by every node first).
- The head (member 0) alone writes the run's record (state.json), uploads checkpoints and outputs, and decides the
  attempt's end once every member's job has ended (``decide``; a member that ended its job and
  was lost after counts by its end): all succeeded -> the run succeeded; a member lost -> an
  interruption (the next generation starts when the group's replacement is up); else a failure,
  restarted together (reason "restart", the same members) while max_restarts_on_errors allows.
  A member's failure stops the others' jobs at once. A worker waits for that word; if the head
  itself is lost, the workers form the next generation with the replacement, and its head takes
  over the run's record. A member silent for a while that comes back, before anyone formed a
  generation, makes the same members start again together (reason "regroup").
- A worker downloads the checkpoints once the head's record says it began the generation (the
  head uploads its last ones before it joins one).
"""
from __future__ import annotations

import importlib
import re
from datetime import datetime, timezone
from typing import Any

if __package__:  # in the package (tests, the controller)
    from ..wire import run_spec
else:  # on the instance: beside this file (runs/detached/launch.AGENT_FILES)
    run_spec = importlib.import_module("run_spec")

HEARTBEAT_S = 15.0  # a node record written again this often (S3 PUT: 240 an hour per instance)
STALE_S = 120.0  # a record older than this (S3's LastModified) is an instance gone without a word
MAX_NODE_BYTES = 4096
MAX_GANG_BYTES = 64 * 1024
MAX_NODES = run_spec.MAX_NODES  # cli --nodes' maximum
MAX_RECORDS = 1000  # node records read at most (max_launches' maximum)
IID_RE = re.compile(r"[A-Za-z0-9-]{1,64}")
IP_RE = re.compile(r"[0-9a-fA-F.:]{1,64}")
NODE_STATES = ("waiting", "running", "ended", "leaving")
OUTCOMES = ("succeeded", "failed", "stopped")
REASONS = ("start", "interruption", "restart", "regroup")


def _iso(value: object) -> str | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return None
    return value


def _int(value: object, low: int, high: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high else None


def parse_node(data: object, instance_id: str, modified: datetime) -> dict[str, Any] | None:
    """A node record read back (``nodes/<instance_id>.json``: anyone holding the run's role may have
    written it, so hostile input) as a record of the right shape, or None: its ``instance_id``
    must be the key's and its ``ip`` an address. ``modified``: the object's S3 LastModified
    (aware), kept as ``modified``."""
    if not isinstance(data, dict) or data.get("instance_id") != instance_id or not IID_RE.fullmatch(instance_id):
        return None
    ip = data.get("ip")
    if not isinstance(ip, str) or not IP_RE.fullmatch(ip):
        return None
    return {"instance_id": instance_id, "ip": ip, "booted_at": _iso(data.get("booted_at")) or "",
            "state": data.get("state") if data.get("state") in NODE_STATES else "waiting",
            "generation": _int(data.get("generation"), 0, 10 ** 9) or 0,
            "outcome": data.get("outcome") if data.get("outcome") in OUTCOMES else None,
            "exit_code": _int(data.get("exit_code"), -255, 255), "modified": modified}


def parse_gang(data: object) -> dict[str, Any] | None:
    """gang.json read back (hostile input, as parse_node) as a generation of the right shape, or
    None: 1-MAX_NODES distinct instance ids with as many addresses."""
    if not isinstance(data, dict):
        return None
    gen = _int(data.get("generation"), 1, 10 ** 9)
    members, ips = data.get("members"), data.get("ips")
    if (gen is None or not isinstance(members, list) or not isinstance(ips, list)
            or not 1 <= len(members) <= MAX_NODES or len(ips) != len(members) or len(set(map(str, members))) != len(members)
            or not all(isinstance(m, str) and IID_RE.fullmatch(m) for m in members)
            or not all(isinstance(ip, str) and IP_RE.fullmatch(ip) for ip in ips)):
        return None
    return {"generation": gen, "members": list(members), "ips": list(ips),
            "reason": data.get("reason") if data.get("reason") in REASONS else "start",
            "formed_at": _iso(data.get("formed_at")) or ""}


def is_live(record: dict[str, Any] | None, now: datetime, stale_s: float = STALE_S) -> bool:
    """Whether the node of ``record`` may run: written within ``stale_s`` seconds (S3's time) and
    not leaving."""
    return (record is not None and record["state"] != "leaving"
            and (now - record["modified"]).total_seconds() <= stale_s)


def lost_members(gang: dict[str, Any] | None, records: dict[str, dict[str, Any]], now: datetime,
                 stale_s: float = STALE_S) -> list[str]:
    """The members of ``gang`` that are not live (pure): [] while it is whole."""
    if gang is None:
        return []
    return [m for m in gang["members"] if not is_live(records.get(m), now, stale_s)]


def propose(gang: dict[str, Any] | None, records: dict[str, dict[str, Any]], nodes: int, now: datetime,
            stale_s: float = STALE_S, restart: str | None = None, floor: int = 0) -> dict[str, Any] | None:
    """The next generation (pure), or None when there is none to form: fewer than ``nodes`` live
    instances, or a current one that is whole (unless ``restart`` gives the reason to form one all
    the same: "restart", the head's after a failure; "regroup", its members stopped theirs). Members:
    the current one's live members in their order, then the other live ones by boot time (then
    instance id). Numbered after both ``gang``'s and ``floor`` (the last this instance ran in: a
    gang.json deleted or written over is never numbered back below it)."""
    lost = lost_members(gang, records, now, stale_s)
    if gang is not None and not lost and not restart:
        return None
    live = [r for r in records.values() if is_live(r, now, stale_s)]
    if len(live) < nodes:
        return None
    order = [m for m in (gang["members"] if gang else []) if m not in lost]
    order += [r["instance_id"] for r in sorted(live, key=lambda r: (r["booted_at"], r["instance_id"]))
              if r["instance_id"] not in order]
    members = order[:nodes]
    reason = "start" if gang is None and not floor else "interruption" if lost else restart or "regroup"
    return {"generation": max(gang["generation"] if gang else 0, floor) + 1, "members": members,
            "ips": [records[m]["ip"] for m in members], "reason": reason,
            "formed_at": now.astimezone(timezone.utc).isoformat(timespec="seconds")}


def ended_in(record: dict[str, Any] | None, generation: int) -> bool:
    """Whether ``record`` says its job ended in ``generation`` (pure): by itself, or stopped while
    the node stayed (a peer failed); not one stopped by its own spot notice (it is lost)."""
    return record is not None and record["generation"] == generation and record["outcome"] is not None and (
        record["state"] == "ended" or record["outcome"] != "stopped")


def decide(gang: dict[str, Any], records: dict[str, dict[str, Any]], now: datetime,
           stale_s: float = STALE_S) -> str | None:
    """The head's word on generation ``gang`` once its own job has ended (pure): "succeeded" (every
    member's job succeeded in it), "failed" (every member's job ended in it, one not succeeded),
    "lost" (a member whose job had not ended is not live: an interruption), or None (a member's
    job still runs). A member that ended its job in it and was lost after is counted by its end."""
    g = gang["generation"]
    if [m for m in lost_members(gang, records, now, stale_s) if not ended_in(records.get(m), g)]:
        return "lost"
    if not all(ended_in(records.get(m), g) for m in gang["members"]):
        return None
    return "succeeded" if all(records[m]["outcome"] == "succeeded" for m in gang["members"]) else "failed"
