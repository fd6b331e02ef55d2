"""A detached run's checkpoints reach S3 whatever the job's write rhythm, and the agent acts on a
spot notice within seconds (issue 51 item 11: a checkpoint rewritten every second was never sent,
the push skipping files modified in its last 5 s, and the agent looked for the notice every 5 s).
S3 from moto in process; agent/mirror.py's copies of real files a thread rewrites."""
import os
import subprocess
import threading
import time
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from ec2gpu.agent import agent, attempt, context, detached, mirror, store
from ec2gpu.wire import agent_record

BUCKET = "ec2gpu-123456789012-us-east-1"
USER = "AROAEXAMPLEROLEID0001:alice@example.com"
RUN_ID = "20261129-060000-abcd"
PREFIX = f"runs/{USER}/{RUN_ID}/"
SIZE = 64 * 1024  # bytes of each version of the checkpoint: one number repeated


def version(n: int) -> bytes:
    return (b"%07d\n" % n) * (SIZE // 8)


def whole(body: bytes) -> bool:
    """Whether ``body`` is one version of the checkpoint, complete."""
    return len(body) == SIZE and body == version(int(body[:7]))


@pytest.fixture
def s3():
    with pytest.MonkeyPatch.context() as mp:
        for k in list(os.environ):
            if k.startswith("AWS_"):
                mp.delenv(k)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        with mock_aws():
            client = boto3.client("s3", region_name="us-east-1")
            client.create_bucket(Bucket=BUCKET)
            yield client


def uploads_of(tmp_path, s3, **kw):
    ctx = context.Context(store=store.Store(s3, BUCKET, USER, RUN_ID), asg=None, home=str(tmp_path / "home"),
                          imds=lambda path: None, imds_endpoint="http://127.0.0.1:9", gpus=lambda: 0,
                          log=kw.pop("log", lambda line: None), **kw)
    os.makedirs(ctx.run_dir)
    up = mirror.Uploads(ctx)
    up.start(str(tmp_path / "out"), str(tmp_path / "ckpt"), [])
    return up


def body(s3, rel):
    try:
        return s3.get_object(Bucket=BUCKET, Key=PREFIX + rel)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


class Rewriter(threading.Thread):
    """The job: rewrites ``path`` every ``every_s`` seconds, version after version: in place, in two
    writes a moment apart (a reader between them sees half a checkpoint), or ``atomic``ally (a
    hidden file renamed over it)."""

    def __init__(self, path, every_s, atomic):
        super().__init__(daemon=True)
        self.path, self.every_s, self.atomic, self.n, self.halt = path, every_s, atomic, 0, threading.Event()

    def run(self):
        tmp = os.path.join(os.path.dirname(self.path), ".state.tmp")
        while not self.halt.is_set():
            self.n += 1
            data = version(self.n)
            with open(tmp if self.atomic else self.path, "wb") as f:
                f.write(data[:SIZE // 2])
                f.flush()
                time.sleep(0.002)
                f.write(data[SIZE // 2:])
            if self.atomic:
                os.replace(tmp, self.path)
            time.sleep(self.every_s)


@pytest.mark.parametrize("every_s, atomic", [(1.0, False), (0.2, False), (0.0, True)],
                         ids=["in-place-every-1s", "in-place-5-per-s", "renamed-without-pause"])
def test_a_checkpoint_the_job_rewrites_constantly_reaches_s3_whole_while_it_runs(s3, tmp_path, every_s, atomic):
    """The issue's job rewrote its checkpoint every second and nothing reached S3 in 70 s: each
    periodic push (``settled``: the job running) now sends a copy taken while the file held still,
    and a checkpoint written by rename goes up whatever its pace."""
    up = uploads_of(tmp_path, s3, settled_s=5.0)
    os.makedirs(tmp_path / "ckpt")
    job = Rewriter(str(tmp_path / "ckpt" / "state.bin"), every_s, atomic)
    job.start()
    try:
        while job.n < 2:
            time.sleep(0.01)
        sent = []
        for _ in range(8):  # periodic pushes while the job writes on (a loaded machine may miss some)
            up.push(settled=True)
            got = body(s3, "checkpoints/state.bin")
            if got is not None:
                assert whole(got), f"a torn checkpoint reached S3: {len(got)} bytes, starting {got[:8]!r}"
                sent.append(int(got[:7]))
            if len(set(sent)) >= 3:
                break
            time.sleep(max(every_s, 0.05) * 1.2)
    finally:
        job.halt.set()
        job.join()
    assert len(set(sent)) >= 3, f"the versions that reached S3 in 8 pushes: {sent}"
    assert sent == sorted(sent)  # each push sent the version it found
    assert body(s3, "checkpoints/.state.tmp") is None  # the temporary of a rename: never while the job runs
    assert not os.listdir(up.ctx.run_dir)  # the copies go with their upload


def test_a_copy_the_job_rewrote_during_it_is_not_sent_and_a_whole_one_is(s3, tmp_path, monkeypatch):
    """Copy, then check: a copy during which the file's size or mtime moved is thrown away and
    taken again, so what S3 holds is one version, never a mix of two."""
    up = uploads_of(tmp_path, s3)
    os.makedirs(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "state.bin"
    path.write_bytes(version(1))
    os.utime(path, (time.time() - 10, time.time() - 10))
    real, copies = mirror.shutil.copyfileobj, []

    def torn(src, dst, length=0):  # the job truncates and rewrites the file while the first copy reads it
        copies.append(1)
        dst.write(src.read(SIZE // 2))
        if len(copies) == 1:
            path.write_bytes(version(2)[:SIZE // 2])
            path.write_bytes(version(2))
        real(src, dst, length)
    monkeypatch.setattr(mirror.shutil, "copyfileobj", torn)
    up.push(settled=True)
    assert len(copies) == 2 and body(s3, "checkpoints/state.bin") == version(2)


def test_a_file_that_changes_during_every_copy_waits_for_the_next_push_and_is_said(s3, tmp_path, monkeypatch):
    said = []
    up = uploads_of(tmp_path, s3, log=said.append)
    os.makedirs(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "state.bin"
    path.write_bytes(version(1))
    real = mirror.shutil.copyfileobj

    def growing(src, dst, length=0):
        real(src, dst, length)
        with open(path, "ab") as f:
            f.write(b"more")
    monkeypatch.setattr(mirror.shutil, "copyfileobj", growing)
    up.push(settled=True)
    assert body(s3, "checkpoints/state.bin") is None
    assert said == [f"checkpoints changed during each of {mirror.COPY_TRIES} copies, left for the next upload: state.bin"]
    monkeypatch.setattr(mirror.shutil, "copyfileobj", real)
    up.push(settled=True)  # it holds still now: sent
    assert body(s3, "checkpoints/state.bin") == version(1) + b"more" * mirror.COPY_TRIES


def test_a_checkpoint_replaced_by_a_rename_during_the_copy_is_sent_whole_and_its_successor_next(s3, tmp_path,
                                                                                             monkeypatch):
    """The atomic way (write a hidden file, rename it over the checkpoint): the copy reads the
    version it opened, whole; the hidden file is never sent while the job runs; the next push sends
    the new version."""
    up = uploads_of(tmp_path, s3)
    ckpt = tmp_path / "ckpt"
    os.makedirs(ckpt)
    (ckpt / "state.bin").write_bytes(version(1))
    real = mirror.shutil.copyfileobj

    def renamed(src, dst, length=0):
        (ckpt / ".state.bin.tmp").write_bytes(version(2))
        os.replace(ckpt / ".state.bin.tmp", ckpt / "state.bin")
        (ckpt / ".next.tmp").write_bytes(b"half")
        real(src, dst, length)
    monkeypatch.setattr(mirror.shutil, "copyfileobj", renamed)
    up.push(settled=True)
    assert body(s3, "checkpoints/state.bin") == version(1) and body(s3, "checkpoints/.next.tmp") is None
    monkeypatch.setattr(mirror.shutil, "copyfileobj", real)
    up.push(settled=True)
    assert body(s3, "checkpoints/state.bin") == version(2)
    up.push(settled=False)  # the end: everything, hidden files too
    assert body(s3, "checkpoints/.next.tmp") == b"half"


def test_a_link_put_where_a_checkpoint_was_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("not the job's")
    (tmp_path / "state.bin").symlink_to(secret)
    with open(tmp_path / "copy", "w+b") as copy:
        assert mirror.consistent_copy(str(tmp_path / "state.bin"), copy) is None and copy.tell() == 0


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s
        time.sleep(0.001)


def test_the_detached_agent_acts_on_a_notice_within_two_of_its_polls_whatever_its_s3_poll(tmp_path):
    """agent.py looks every agent_poll_s; the detached agent reads agent.py's record as often, so a
    notice starts the uploads within seconds even where the cancel object is looked at every 30 s
    (it was read only at each --poll, 5 s)."""
    clock = FakeClock()
    ctx = context.Context(store=SimpleNamespace(run_id=RUN_ID), asg=None, home=str(tmp_path), imds=lambda p: None,
                          imds_endpoint="",
                          gpus=lambda: 0, clock=clock, sleep=clock.sleep, poll_s=30.0, agent_poll_s=2.0,
                          every_s=600.0)
    os.makedirs(ctx.run_dir)
    job = attempt.Job(ctx, {}, str(tmp_path))
    key = b"k" * 32
    proc = subprocess.Popen(["sleep", "30"])
    noticed_at, cancel_looks = [], []
    start = clock()

    def sleep(s):
        clock.sleep(s)
        if clock() - start >= 3 and not os.path.exists(os.path.join(ctx.run_dir, agent_record.NAME)):
            rec = {"state": "running", "pid": proc.pid, "notice": {"action": "terminate", "time": "x"}}
            with open(os.path.join(ctx.run_dir, agent_record.NAME), "w") as f:
                f.write(agent_record.dumps(rec, key))
    ctx.sleep = sleep

    def tick():
        noticed_at.append(clock() - start)
        proc.kill()
    hooks = attempt.Hooks(cancelled=lambda: cancel_looks.append(clock()) or False, tick=tick)
    try:
        assert job.supervise(proc, key, {"notice": None, "rebalance": None}, hooks) is None
    finally:
        proc.kill()
        proc.wait()
    assert noticed_at and noticed_at[0] <= 3 + 2 * ctx.agent_poll_s, noticed_at
    assert len(cancel_looks) == 1  # S3 is still asked at its own pace


def test_the_periodic_upload_starts_every_every_s_however_long_one_takes(tmp_path):
    """A copy every minute: the next upload is due every_s after the last one started, not after it
    ended (a 30 s upload of a large checkpoint made the cycle 90 s)."""
    clock = FakeClock()
    ctx = context.Context(store=SimpleNamespace(run_id=RUN_ID), asg=None, home=str(tmp_path), imds=lambda p: None,
                          imds_endpoint="", gpus=lambda: 0, clock=clock, sleep=clock.sleep, poll_s=5.0,
                          agent_poll_s=2.0, every_s=60.0)
    os.makedirs(ctx.run_dir)
    proc = subprocess.Popen(["sleep", "30"])
    start, ticks = clock(), []

    def tick():  # each upload takes 30 s
        ticks.append(clock() - start)
        clock.t += 30
        if len(ticks) == 3:
            proc.kill()
    try:
        attempt.Job(ctx, {}, str(tmp_path)).supervise(proc, b"k" * 32, {"notice": None, "rebalance": None},
                                                      attempt.Hooks(cancelled=lambda: False, tick=tick))
    finally:
        proc.kill()
        proc.wait()
    assert [round(t) for t in ticks] == [60, 120, 180], ticks


def test_the_agent_looks_for_the_spot_notice_at_least_every_2_s(s3, monkeypatch, tmp_path):
    """Both agent.py's default (a foreground run's job, and the detached run's) and the detached agent's."""
    assert agent.SPOT_POLL_S <= 2
    seen = {}
    monkeypatch.delenv("EC2GPU_SPOT_POLL_SECONDS", raising=False)
    monkeypatch.setattr(agent, "run", lambda run_dir, argv, endpoint, poll_s, *a, **kw: seen.setdefault("poll_s", poll_s)
                        and 0)
    agent.main(["--dir", str(tmp_path), "--", "true"])
    assert seen["poll_s"] <= 2
    d = detached.Detached(bucket=BUCKET, user=USER, run_id=RUN_ID, home=str(tmp_path), s3=s3, asg=None)
    assert d.ctx.agent_poll_s <= 2
