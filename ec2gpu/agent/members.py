"""The nodes of a detached run of several, as S3 holds them (agent/gang.py has the rules and the
keys): this instance's own record ``nodes/<instance_id>.json`` written now and by a heartbeat thread,
the others' read back (their freshness by S3's clock, never this instance's), the generation in
``gang.json`` read and formed with conditional writes, and a member gone silent set Unhealthy so the
group replaces it. Standard library and boto3 only: shipped beside detached.py.
"""
from __future__ import annotations

import email.utils
import importlib
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

if __package__:  # in the package (tests, the controller)
    from ..wire import run_record
    from . import gang, store
else:  # on the instance: beside this file (runs/detached/launch.AGENT_FILES)
    run_record = importlib.import_module("run_record")
    gang = importlib.import_module("gang")
    store = importlib.import_module("store")

UNHEALTHY_TRIES = 5  # SetInstanceHealth asked this often for one silent member at most


class Members:
    """This instance (``iid``) among the run's nodes, from the context ``ctx`` (context.Context:
    its store, Auto Scaling client, log and ``stale_s``). ``node``: this instance's record;
    ``records``: the nodes' records as last read (read_nodes)."""

    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.iid = ""
        self.node: dict[str, Any] = {}
        self.node_lock = threading.Lock()
        self.beat_stop = threading.Event()
        self.records: dict[str, dict[str, Any]] = {}
        self.unhealthy: set[str] = set()  # members set Unhealthy by this instance, or given up on (replace_silent)
        self.unhealthy_tries: dict[str, int] = {}
        self.s3_clock = (datetime.now(timezone.utc), time.monotonic())  # S3's Date, when (s3_now)

    def node_write(self, **changes: Any) -> None:
        """This instance's record (nodes/ID.json) with ``changes``, written now (under the lock the
        heartbeat takes too, so an older body never lands after a newer one); errors said. A record
        that says "leaving" (a spot notice) stays so: this instance is never a member again."""
        with self.node_lock:
            if self.node.get("state") == "leaving":
                changes.pop("state", None)
            self.node.update(changes)
            try:
                self.ctx.store.put_json(f"nodes/{self.iid}.json", self.node)
            except Exception as exc:
                self.ctx.log(f"nodes/{self.iid}.json not written: {type(exc).__name__}: {exc}"[:500])

    def heartbeat(self) -> None:
        """A thread that writes this instance's record every gang.HEARTBEAT_S seconds while this
        process lives (through a long setup, download or job alike), until ``beat_stop``."""
        def beat() -> None:
            while not self.beat_stop.wait(gang.HEARTBEAT_S):
                self.node_write()
        threading.Thread(target=beat, name="heartbeat", daemon=True).start()

    def leaving(self) -> None:
        """A spot notice here: this instance's record says "leaving" now (the others stop their jobs
        at once, not at the stale time)."""
        if self.node.get("state") != "leaving":
            self.node_write(state="leaving")

    def s3_now(self) -> datetime:
        """Now by S3's clock (the Date of its last listing answer, plus the time since): what the
        records' LastModified is compared with, so a skewed instance clock decides nothing."""
        at, then = self.s3_clock
        return at + timedelta(seconds=time.monotonic() - then)

    def read_nodes(self) -> dict[str, dict[str, Any]]:
        """The run's node records (gang.parse_node each; one listing, then a GET for each record S3
        wrote within the stale time). An older one is of an instance gone silent: its last record
        read here is kept (marked ``stale``), so a member that ended its job and then went counts
        by its end (gang.decide)."""
        runs = self.ctx.store
        base = runs.key("nodes") + "/"
        found: dict[str, dict[str, Any]] = {}
        seen = 0
        for page in runs.s3.get_paginator("list_objects_v2").paginate(Bucket=runs.bucket, Prefix=base):
            date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            try:
                self.s3_clock = (email.utils.parsedate_to_datetime(date), time.monotonic())
            except (TypeError, ValueError):
                self.s3_clock = (datetime.now(timezone.utc), time.monotonic())
            now = self.s3_now()
            for o in page.get("Contents", []):
                seen += 1
                iid = o["Key"][len(base):].removesuffix(".json")
                if seen > gang.MAX_RECORDS or not o["Key"].endswith(".json") or not gang.IID_RE.fullmatch(iid):
                    continue
                modified = o["LastModified"]
                if (now - modified).total_seconds() > self.ctx.stale_s:
                    last = self.records.get(iid) or {"instance_id": iid, "ip": "0.0.0.0", "booted_at": "",
                                                     "state": "leaving", "generation": 0, "outcome": None,
                                                     "exit_code": None}
                    found[iid] = {**last, "modified": modified, "stale": True}
                    continue
                try:
                    rec = gang.parse_node(runs.get_json(f"nodes/{iid}.json", gang.MAX_NODE_BYTES), iid, modified)
                except store.Refused:
                    rec = None
                if rec is not None:
                    found[iid] = rec
        self.records = found
        return found

    def read_gang(self) -> tuple[dict[str, Any] | None, str | None]:
        """(gang.json as gang.parse_gang reads it, its ETag); (None, ETag) for one that is not a
        generation (it is written over), (None, None) for none."""
        runs = self.ctx.store
        try:
            data, etag = runs.get_json_tagged("gang.json", gang.MAX_GANG_BYTES)
        except store.Refused:
            data, etag = None, runs.get_tagged("gang.json", 0)[1]
        return gang.parse_gang(data), etag

    def form(self, new: dict[str, Any], etag: str | None) -> bool:
        """Write generation ``new`` over the gang.json of ``etag`` (none: where there is none);
        False when another instance wrote one first (it is joined instead), or S3 did not answer."""
        try:
            self.ctx.store.put_json("gang.json", new, if_match=etag, if_absent=etag is None)
        except store.Conflict:
            return False
        except Exception as exc:
            self.ctx.log(f"generation {new['generation']} not formed: {type(exc).__name__}: {exc}"[:300])
            return False
        self.ctx.log(f"generation {new['generation']} formed ({new['reason']}): {', '.join(new['members'])}")
        return True

    def instances(self, kept: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The run record's ``instances`` for a run of several nodes: one per node record, by boot
        time (the times the run's cost is settled from: runs/detached/costs.py); a stale record never
        read here keeps its entry of ``kept`` (the record's)."""
        out = []
        for i, r in enumerate(sorted(self.records.values(), key=lambda r: (r["booted_at"], r["instance_id"]))):
            if r["ip"] == "0.0.0.0" and not r["booted_at"]:  # stale, never read: kept as the record had it
                old = [x for x in kept if x.get("instance_id") == r["instance_id"]]
                if old:
                    out.append({**old[-1], "launch": i + 1})
                continue
            out.append({"launch": i + 1, "instance_id": r["instance_id"], "started_at": run_record.time(r["booted_at"]),
                        "last_seen_at": r["modified"].astimezone(timezone.utc).isoformat(timespec="seconds"),
                        "setup_exit_code": None, "setup_runs": 0, "resumed": False, "checkpoint_files": 0})
        return out[-run_record.MAX_ENTRIES:]

    def head_live(self, g: dict[str, Any] | None) -> bool:
        """Whether ``g``'s head (rank 0) is another instance whose record is live: its word (the
        run's end, with its outputs) is awaited rather than given here."""
        if g is None or g["members"][0] == self.iid:
            return False
        return gang.is_live(self.records.get(g["members"][0]), self.s3_now(), self.ctx.stale_s)

    def replace_silent(self, g: dict[str, Any] | None, records: dict[str, dict[str, Any]]) -> None:
        """Each member of ``g`` whose record went stale (its agent silent: the instance may run on,
        and would hold the group's place until the deadline) set Unhealthy: the group terminates
        and replaces it (aws/iam.detached_policy's ReplaceOwnNodes). Refused (one already gone is
        not in the group): said, and asked again at the next looks, UNHEALTHY_TRIES times at most."""
        for iid in gang.lost_members(g, records, self.s3_now(), self.ctx.stale_s):
            rec = records.get(iid)
            if iid == self.iid or iid in self.unhealthy or (rec is not None and not rec.get("stale")):
                continue  # itself, asked already, or leaving by its own word (a spot notice: AWS ends it)
            try:
                self.ctx.asg.set_instance_health(InstanceId=iid, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False)
                self.unhealthy.add(iid)
                self.ctx.log(f"{iid} has been silent over {self.ctx.stale_s:.0f} s: set Unhealthy, the group replaces it")
            except Exception as exc:  # asked again at the next looks, UNHEALTHY_TRIES times in all
                self.ctx.log(f"{iid} not set Unhealthy: {type(exc).__name__}: {exc}"[:300])
                self.unhealthy_tries[iid] = self.unhealthy_tries.get(iid, 0) + 1
                if store.code_of(exc) == "ValidationError" or self.unhealthy_tries[iid] >= UNHEALTHY_TRIES:
                    self.unhealthy.add(iid)  # not in the group (any more), or never taken: asked no more
