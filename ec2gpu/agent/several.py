"""One instance's part in a detached run of several nodes (spec.json's ``nodes`` > 1; agent/gang.py
has the rules): each instance writes its own record ``nodes/<instance_id>.json`` (a heartbeat thread
keeps it fresh: members.py), the instances agree on a generation in ``gang.json`` (S3 conditional
writes: ranks and SKYPILOT_NODE_IPS), and every member runs the job once per generation; the head
(rank 0) alone writes the run's record (with the ``generation`` it heads), checkpoints, outputs and
``logs/job.log``; the others upload their own log to ``logs/nodes/<instance_id>.log``. A member lost
(a spot notice, or a record gone stale) stops every member's job (SIGTERM: it checkpoints); the
group's replacement joins the next generation and all start again from the head's checkpoints
(EC2GPU_RESUME=1, the new SKYPILOT_NODE_IPS). After a failure on any rank the head restarts them all
together while max_restarts_on_errors allows. An attempt stopped that way is recorded with the
outcome ``regroup``. Standard library and boto3 only: shipped beside detached.py.
"""
from __future__ import annotations

import importlib
import os
import secrets
from typing import Any

if __package__:  # in the package (tests, the controller)
    from ..wire import run_record
    from . import attempt, context, gang, mirror, prepare, store
else:  # on the instance: beside this file (runs/detached/launch.AGENT_FILES)
    run_record = importlib.import_module("run_record")
    attempt = importlib.import_module("attempt")
    context = importlib.import_module("context")
    gang = importlib.import_module("gang")
    mirror = importlib.import_module("mirror")
    prepare = importlib.import_module("prepare")
    store = importlib.import_module("store")

FINAL = run_record.FINAL_STATES
IMDS_TRIES = 5  # the metadata service asked this often (2 s apart) for the private address
MAX_ERRORS_IN_ROW = 5  # generations not begun for S3 or the disk before the run ends failed
SETTLE_S = 60.0  # the others' jobs awaited this long after the head's failed (Several.settle)
AGAIN = "again"  # Several._look: look again at once


class Several:
    """This instance's part in a run of ``spec["nodes"]`` instances, from the launch's parts:
    ``ctx`` (context.Context), ``lease`` (store.Lease), ``uploads`` (mirror.Uploads), ``job``
    (attempt.Job), ``members`` (members.Members)."""

    def __init__(self, ctx: context.Context, spec: dict[str, Any], lease: store.Lease, uploads: mirror.Uploads,
                 job: attempt.Job, members: Any):
        self.ctx, self.spec, self.lease, self.uploads, self.job, self.members = ctx, spec, lease, uploads, job, members
        self.gang: dict[str, Any] | None = None
        self.next_nodes_read = 0.0
        self.peer_failed = False  # the job was stopped because a member's failed (watch)
        self.handed_on = 0  # the generation whose checkpoints and record this head last handed on (settle)
        self.errors_in_row = 0  # generations not begun for an error of S3 or the disk, in a row
        self.setup_done = spec["setup"] is None
        self.stopped = False  # this instance stopped its job in the last generation for a member that was lost
        self.word: dict[str, Any] | None = None  # this head's job ended in the last generation (settle's record)
        self.hooks = attempt.Hooks(cancelled=lease.cancelled, tick=lambda: uploads.tick(lease),
                                   begin=lambda: lease.save() if uploads.writer else None, watch=self.watch,
                                   noticed=members.leaving)

    def run(self, instance_id: str, at: float) -> int:
        """Its record, then a job per generation it is a member of, until the run ends; this
        process's exit code."""
        lease, uploads, members, spec = self.lease, self.uploads, self.members, self.spec
        lease.several, uploads.writer = True, False
        lease.instances_of = lambda: members.instances(lease.status["instances"])
        members.iid = uploads.iid = instance_id if instance_id != "unknown" else f"i-unknown-{secrets.token_hex(4)}"
        if lease.status["state"] in FINAL:
            lease.end_group()
            return 0
        if not lease.conditional:  # gang.json could not be formed: fail now rather than wait to the deadline
            return self.end_several("failed", "this instance's boto3 cannot write S3 objects conditionally, "
                                              "which a run of several nodes needs (boto3 and botocore "
                                              f"{store.MIN_CONDITIONAL_BOTOCORE} or later)")
        if lease.cancelled():
            return self.end_several("cancelled", "cancelled before this launch ran anything")
        if spec["limit_at"] is not None and at >= spec["limit_at"]:
            return self.end_several("failed", "the run's time limit passed before this launch")
        try:
            self.job.workdir, uploads.write_backs = prepare.instance(self.ctx, spec)
        except store.Refused as exc:
            self.ctx.log(f"refused: {exc}")
            return self.end_several("failed", str(exc)[:1000])
        ip = self.private_ip()
        if ip is None:  # the others could not reach it: no member without one
            return self.end_several("failed", f"instance {members.iid} has no private address in its metadata")
        members.node = {"instance_id": members.iid, "ip": ip, "booted_at": store.iso(at), "state": "waiting",
                        "generation": 0, "outcome": None, "exit_code": None}
        members.node_write()
        members.heartbeat()
        try:
            return self.loop(ip)
        finally:
            members.beat_stop.set()

    def private_ip(self) -> str | None:
        """This instance's private address from the metadata service, asked IMDS_TRIES times 2 s apart."""
        for _ in range(IMDS_TRIES):
            ip = self.ctx.imds("/latest/meta-data/local-ipv4")
            if ip and gang.IP_RE.fullmatch(ip):
                return str(ip)
            self.ctx.sleep(2.0)
        return None

    def loop(self, ip: str) -> int:
        """Join each generation that names this instance, run its attempt, and judge it, until the run ends."""
        ctx, spec = self.ctx, self.spec
        if len(self.members.read_nodes()) > spec["max_launches"]:
            return self.end_several("failed", f"launch {len(self.members.records)} is beyond max_launches "
                                              f"{spec['max_launches']}")
        python = attempt.find_python(spec["python"])
        env = attempt.job_env(spec, ctx.run_dir, self.job.workdir, ip, ctx.gpus(), False, python, ctx.secrets)
        self.uploads.start(env["EC2GPU_OUTPUT_DIR"], env["EC2GPU_CHECKPOINT_DIR"], spec["outputs"])
        prepare.share_log(ctx, spec["log_reader"])
        last = 0
        while True:
            got = self.join(last, self.stopped, self.word)
            if isinstance(got, int):
                return got
            self.word = None
            g = self.gang = got
            self.lease.generation = last = g["generation"]
            rank = g["members"].index(self.members.iid)
            self.uploads.writer, self.stopped, self.peer_failed = rank == 0, False, False
            if not self.uploads.writer and not self.await_head(g):
                self.stopped = True
                continue
            outcome, record = self.attempt(g, rank, ip, python)
            if outcome is None:
                return int(record["exit_code"])
            done = self.judge(g, outcome, record)
            if done is not None:
                return done

    def attempt(self, g: dict[str, Any], rank: int, ip: str, python: str) -> tuple[str | None, dict[str, Any]]:
        """This member's attempt in generation ``g``: the head's checkpoints pulled, the setup (once),
        the job; (outcome, {"exit_code", "signal"}), or (None, {"exit_code": this process's}) when the
        run ends here (errors of S3 or the disk MAX_ERRORS_IN_ROW generations in a row)."""
        ctx, members, last = self.ctx, self.members, g["generation"]
        try:
            ckpt = self.uploads.ckpt
            assert ckpt is not None, "Uploads.start made it before the first generation (loop)"
            found = ckpt.pull()  # the head's latest, on every node
        except Exception as exc:
            ctx.log(f"checkpoints not downloaded: {type(exc).__name__}: {exc}"[:300])
            found = 0
        members.node_write(state="running", generation=last, outcome=None, exit_code=None)
        ctx.log(f"generation {last}: rank {rank} of {len(g['members'])} (head {g['ips'][0]})")
        try:
            if self.uploads.writer:
                self.lead(g)
            env = attempt.job_env(self.spec, ctx.run_dir, self.job.workdir, ip, ctx.gpus(), found > 0, python,
                                  ctx.secrets, rank=rank, ips=g["ips"])
            os.makedirs(env["EC2GPU_CHECKPOINT_DIR"], exist_ok=True)
            code = 0 if self.setup_done else self.job.run_setup(env, self.hooks)
            self.setup_done = code == 0
            if code == -1:
                outcome, record = "cancelled", {}
            elif code != 0:  # a failed setup is the job's failure: the head decides on a restart
                ctx.log(f"the setup exited {code}")
                outcome, record = "failed", {"exit_code": code, "signal": None}
            else:
                outcome, record = self.job.run_job(env, self.lease, self.hooks)
        except store.Superseded as exc:  # a newer generation's head writes the record: this one joins it
            ctx.log(f"{exc}: waiting for the next generation")
            self.uploads.writer, self.stopped = False, True
            members.node_write(state="ended", outcome="stopped")
            return "superseded", {}
        except Exception as exc:  # S3 or the disk, for a moment: start again together, a few times
            if not isinstance(exc, (store.Refused, store.Conflict, OSError)) and not type(exc).__module__.startswith("botocore"):
                raise
            self.errors_in_row += 1
            ctx.log(f"generation {last} not begun: {type(exc).__name__}: {exc}"[:300])
            if self.errors_in_row >= MAX_ERRORS_IN_ROW:
                return None, {"exit_code": self.end_several(
                    "failed", f"generation {last} could not begin, {self.errors_in_row} times in a row: "
                              f"{type(exc).__name__}: {exc}"[:1000])}
            return "regroup", {}
        self.errors_in_row = 0
        return outcome, record

    def judge(self, g: dict[str, Any], outcome: str, record: dict[str, Any]) -> int | None:
        """What follows this member's attempt in ``g`` ended as ``outcome``: this process's exit code
        when it ends here, else None (the next generation is joined)."""
        members, uploads, lease = self.members, self.uploads, self.lease
        if outcome == "superseded":
            return None
        if outcome == "interrupted":  # a spot notice here: the group replaces this instance
            members.node_write(state="leaving", outcome="stopped")
            if uploads.writer:
                uploads.push(settled=False)
                lease.status.update(state="interrupted", message="spot interruption: the group replaces the instance")
                lease.try_save()
            else:
                uploads.push_own_log()
            return context.EXIT_INTERRUPTED
        if outcome in ("cancelled", "limit"):
            members.node_write(state="ended", outcome="stopped")
            if uploads.writer:
                return uploads.finish(lease, *(("cancelled", "cancelled") if outcome == "cancelled" else
                                               ("failed", "the run's time limit: the job was stopped")))
            return None  # join waits for the head's word
        if outcome == "regroup" and not self.peer_failed:  # (a member lost, or an error above)
            members.node_write(state="ended", outcome="stopped")
            self.stopped = True
            if uploads.writer:
                self.hand_on()
            return None
        if outcome == "regroup":  # stopped because a member's job failed: an end, for the head to judge
            outcome = "stopped"
        members.node_write(state="ended", outcome=outcome, exit_code=record.get("exit_code"))
        if not uploads.writer:
            uploads.push_own_log()
            return None
        self.word = dict(record) if outcome != "stopped" else {"exit_code": None, "signal": None}
        return self.settle(g, self.word)

    def end_several(self, state: str, message: str | None) -> int:
        """The run's end from any of its nodes: the record read again (this instance writes over
        the head's record only to end it), then ``lease.end``."""
        st = self.lease.reread()
        self.lease.generation = max(self.lease.generation, st["generation"])
        if st["state"] in FINAL:
            self.lease.end_group()
            return 0
        self.uploads.writer = True
        return int(self.lease.end(state, message))

    def finish_several(self, state: str, message: str | None) -> int:
        """The end, by the head (outputs, checkpoints, log: Uploads.finish) or by another node (end_several)."""
        return self.uploads.finish(self.lease, state, message) if self.uploads.writer else self.end_several(state, message)

    def watch(self) -> str | None:
        """While the job runs: why it must stop (its generation is no longer gang.json's, a member
        is no longer live, or a member's job failed in it: read every gang.HEARTBEAT_S seconds),
        else None. A gang.json that cannot be read is not a reason (S3 for a moment, or a hostile
        write: the members' records decide)."""
        ctx, members, generation = self.ctx, self.members, self.lease.generation
        try:
            g, _ = members.read_gang()
            if g is not None and g["generation"] != generation:
                return f"generation {g['generation']} replaced {generation}"
            if ctx.clock() >= self.next_nodes_read:
                self.next_nodes_read = ctx.clock() + gang.HEARTBEAT_S
                records = members.read_nodes()
                lost = [m for m in gang.lost_members(self.gang, records, members.s3_now(), ctx.stale_s)
                        if not gang.ended_in(records.get(m), generation)]  # one that ended counts by its end
                if lost:
                    return f"{', '.join(lost)} of generation {generation} is gone"
                failed = [m for m in (self.gang or {}).get("members", []) if records[m]["generation"] == generation
                          and records[m]["state"] == "ended" and records[m]["outcome"] == "failed"]
                if failed:
                    self.peer_failed = True
                    return f"the job failed on {', '.join(failed)}"
        except Exception as exc:  # S3 out of reach for a moment: the job goes on
            ctx.log(f"the generation not checked: {type(exc).__name__}: {exc}"[:300])
        return None

    def join(self, last: int, stopped: bool = False, word: dict[str, Any] | None = None) -> dict[str, Any] | int:
        """Wait for a generation after ``last`` that names this instance, forming it (gang.propose)
        when it is this instance's to form; returns it, or this process's exit code when the run
        ended (its record's end: the group is ended again, harmless), was cancelled or ran out of
        time. The end is the head's to give (with the outputs): recorded here only when this
        instance is the head of the latest generation, or that head has gone silent.
        ``stopped``: this instance stopped its job in ``last`` for a member that was lost; when
        that member is back and no one formed a generation since, the same members regroup.
        ``word``: this instance headed ``last`` and its job ended (its record, for ``settle``):
        while no one has formed a generation since, it keeps judging ``last`` (a member it took
        for lost may come back with its end)."""
        while True:
            try:
                got = self._look(last, stopped, word)
                if isinstance(got, str):  # AGAIN
                    continue
                if got is not None:
                    return got
            except (store.Refused, store.Conflict) as exc:
                self.ctx.log(f"waiting for the next generation: {exc}"[:300])
            except Exception as exc:  # S3 out of reach for a moment: tried again
                self.ctx.log(f"waiting for the next generation: {type(exc).__name__}: {exc}"[:300])
            self.ctx.sleep(self.ctx.poll_s)

    def _look(self, last: int, stopped: bool, word: dict[str, Any] | None) -> dict[str, Any] | int | str | None:
        """One look of ``join``: its answer, None to look again after a poll, AGAIN at once."""
        ctx, members, lease, iid = self.ctx, self.members, self.lease, self.members.iid
        st = lease.fetch()
        if st["state"] in FINAL:
            members.node_write(state="ended")
            lease.end_group()
            return 0
        g: dict[str, Any] | None  # members.Members.read_gang's
        g, etag = members.read_gang()
        records = members.read_nodes()
        over = self.spec["limit_at"] is not None and ctx.clock() >= self.spec["limit_at"]
        if over or lease.cancelled():
            if not members.head_live(g):
                self.uploads.writer = g is not None and g["members"][0] == iid
                return self.finish_several("failed" if over else "cancelled",
                                           "the run's time limit" if over else "cancelled")
            return None  # the head's word is awaited
        if g is not None and g["generation"] > last and iid in g["members"]:
            return g
        if word is not None and g is not None and g["generation"] == last and g["members"][0] == iid:
            done = self.settle(g, word, wait=False)  # this head's word on it was never given
            if done is not None:
                return done
        members.replace_silent(g, records)
        now = members.s3_now()
        floor = max(last, st["generation"])  # a gang.json lost or written over: never numbered back
        new = gang.propose(g, records, self.spec["nodes"], now, ctx.stale_s, floor=floor)
        if new is None and stopped and (g is None or g["generation"] == last) and iid in (g or {}).get("members", []):
            new = gang.propose(g, records, self.spec["nodes"], now, ctx.stale_s, restart="regroup", floor=floor)
        if new is not None and members.form(new, etag):
            return AGAIN  # formed: looked at again at once
        return None

    def lead(self, g: dict[str, Any]) -> None:
        """This instance is generation ``g``'s head: the record read again (the previous head's, if
        another), counted (an interruption, when ``g`` replaced a lost member), and written."""
        records = self.members.read_nodes()
        st = self.lease.reread()
        last = st["attempts"][-1] if st["attempts"] else None
        if g["reason"] == "interruption":
            st["interruptions"] += 1
        if last and last.get("outcome") == "running":  # its head went before it could say
            last.update(outcome="interrupted" if g["reason"] == "interruption" else "regroup",
                        ended_at=st.get("updated_at"))
        if self.uploads.log_base == b"" and st.get("instance_id") not in (None, self.members.iid):  # the run's log so far
            try:
                self.uploads.log_base = self.ctx.store.get_bytes("logs/job.log", mirror.LOG_MAX) or b""
            except Exception as exc:
                self.ctx.log(f"the earlier log not read: {type(exc).__name__}: {exc}"[:300])
        self.lease.launch = len(records)
        self.uploads.log_sent = None  # a worker's last upload was its own log's, not the run's
        st.update(launches=len(records), instance_id=self.members.iid, state="starting")
        self.lease.save()

    def await_head(self, g: dict[str, Any]) -> bool:
        """A worker of generation ``g``: wait until its head has begun it (its record says so), so
        that the checkpoints the head uploaded when it stopped its last job are in S3 before this
        instance downloads them. False when ``g`` was replaced meanwhile, or its head went."""
        ctx, members, head = self.ctx, self.members, g["members"][0]
        while True:
            try:
                rec = gang.parse_node(ctx.store.get_json(f"nodes/{head}.json", gang.MAX_NODE_BYTES), head,
                                      members.s3_now())
                if rec is not None and rec["generation"] >= g["generation"] and rec["state"] != "leaving":
                    return True
                now_g, _ = members.read_gang()
                if now_g is not None and now_g["generation"] != g["generation"]:
                    return False
                if not gang.is_live(members.read_nodes().get(head), members.s3_now(), ctx.stale_s) \
                        or self.lease.cancelled():
                    return False
            except Exception as exc:
                ctx.log(f"waiting for the head: {type(exc).__name__}: {exc}"[:300])
            ctx.sleep(ctx.poll_s)

    def hand_on(self) -> None:
        """The head stopped its job to start again: the checkpoint the job wrote on SIGTERM and the
        record (the attempt "regroup") for the next generation, while this instance still heads the
        latest one (else a newer head owns them: it writes nothing, and is a worker from now on)."""
        try:
            now_g, _ = self.members.read_gang()
        except Exception as exc:
            self.ctx.log(f"gang.json not read: {type(exc).__name__}: {exc}"[:300])
            now_g = None
        if now_g is not None and now_g["generation"] != self.lease.generation and now_g["members"][0] != self.members.iid:
            self.uploads.writer = False
            return
        try:
            self.lease.check_superseded()
            self.uploads.push(settled=False)
            self.lease.try_save()
        except store.Superseded:
            self.uploads.writer = False

    def settle(self, g: dict[str, Any], record: dict[str, Any], wait: bool = True) -> int | None:
        """The head, its own job ended in generation ``g`` (``record``: its exit code and signal):
        wait for every member's (gang.decide), then end the run (succeeded; failed with the
        restarts used up: its exit code) or go on (None: a member is lost and the checkpoints are
        up, or a restart was formed, or the others formed a generation). When the head's own job
        failed, the others get SETTLE_S seconds (at least the stale time: a member that died hard
        is lost, not failed) to end theirs, then the attempt failed. ``wait`` False: one look (from
        ``join``, where this head keeps judging ``g`` until a generation is formed)."""
        ctx, lease, uploads = self.ctx, self.lease, self.uploads
        bound = max(SETTLE_S, ctx.stale_s + gang.HEARTBEAT_S)
        failed_by = record.setdefault("failed_by", ctx.clock() + bound) \
            if record.get("exit_code") != 0 or record.get("signal") else None
        while True:
            if lease.cancelled():
                return uploads.finish(lease, "cancelled", "cancelled")
            if self.spec["limit_at"] is not None and ctx.clock() >= self.spec["limit_at"]:
                return uploads.finish(lease, "failed", "the run's time limit")
            word, etag = self._decide(g, failed_by)
            if word == "moved on":
                return None
            if word == "succeeded":
                return uploads.finish(lease, "succeeded", None)
            if word == "lost":
                if self.handed_on != g["generation"]:
                    self.handed_on = g["generation"]
                    self.hand_on()
                return None
            if word == "failed":
                done = self._failed(g, etag)
                if not isinstance(done, str):  # "again": looked at again
                    return done
            if not wait:
                return None
            ctx.sleep(ctx.poll_s)

    def _decide(self, g: dict[str, Any], failed_by: float | None) -> tuple[str | None, str | None]:
        """One look of ``settle``: (gang.decide's word on ``g``, or "failed" past ``failed_by``, or
        "moved on" when the others formed another generation; gang.json's ETag)."""
        ctx, members = self.ctx, self.members
        word, etag = None, None
        try:
            now_g, etag = members.read_gang()
            if now_g is not None and now_g["generation"] != g["generation"]:
                if now_g["members"][0] == members.iid:
                    self.hand_on()  # the others formed the next one: this head's last word goes first
                self.uploads.writer = now_g["members"][0] == members.iid
                return "moved on", etag
            word = gang.decide(g, members.read_nodes(), members.s3_now(), ctx.stale_s)
            if word is None and failed_by is not None and ctx.clock() >= failed_by:
                word = "failed"
        except Exception as exc:
            ctx.log(f"the members' ends not read: {type(exc).__name__}: {exc}"[:300])
        return word, etag

    def _failed(self, g: dict[str, Any], etag: str | None) -> int | str | None:
        """Generation ``g`` failed: the run ends failed with the restarts used up (this process's
        exit code), or all nodes restart together (None); "again" when the restart could not be formed."""
        lease, members, spec = self.lease, self.members, self.spec
        failed = []
        for i, m in enumerate(g["members"]):
            r = members.records.get(m) or {}
            ended = gang.ended_in(r or None, g["generation"])
            if not ended or r.get("outcome") == "failed":
                failed.append(f"rank {i} ({'exit ' + str(r.get('exit_code')) if ended else 'still running'})")
        where = ", ".join(failed) or "a rank"
        if lease.status["restarts"] >= spec["max_restarts_on_errors"]:
            return self.uploads.finish(lease, "failed", f"the job failed on {where} with "
                                                         f"{lease.status['restarts']} restart(s) on errors used")
        new = gang.propose(g, members.records, spec["nodes"], members.s3_now(), self.ctx.stale_s,
                           restart="restart", floor=g["generation"])
        if new is not None and new["reason"] == "restart" and members.form(new, etag):
            lease.status["restarts"] += 1
            self.ctx.log(f"the job failed on {where}: restart {lease.status['restarts']} of "
                         f"{spec['max_restarts_on_errors']}, all nodes together")
            self.hand_on()
            return None
        return "again"  # not formed (S3 did not take it, or a member was lost meanwhile): looked at again
