"""`ec2gpu fetch RUN` and `ec2gpu logs RUN` for a detached run (issue 30), against moto's S3 in this
process: the keys under a run's prefix are the instance's (hostile), so none may choose a place
outside the target, what comes home is bounded in count and bytes, and the log is followed by its
new bytes only. The bucket is made plainly (no runstore.ensure: no TLS-only policy to work around)."""
import json
import os
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from ec2gpu.aws import runstore_objects, runstore_records
from ec2gpu.errors import UsageError
from ec2gpu.remote.files import Limits
from ec2gpu.runs.detached import fetch as detached

ACCOUNT = "123456789012"  # moto's
BUCKET = f"ec2gpu-{ACCOUNT}-us-east-1"
RUN = "20261125-103000-1a2b"
USER = "AIDAEXAMPLEUSERID0001"  # the caller's user id (STS's UserId): an IAM user's
PREFIX = f"runs/{USER}/{RUN}/"


@pytest.fixture
def aws():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        clients = {"s3": s3, "autoscaling": boto3.client("autoscaling", region_name="us-east-1")}
        yield SimpleNamespace(client=clients.__getitem__, check_credentials=lambda: {"Account": ACCOUNT, "UserId": USER},
                              region="us-east-1", s3=s3)


def _put(aws, key, body=b"x"):
    aws.s3.put_object(Bucket=BUCKET, Key=key, Body=body)


def _status(aws, state="succeeded", **fields):
    runstore_records.put_status(aws.s3, BUCKET, USER, RUN, {"state": state, **fields})


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def test_fetch_brings_outputs_checkpoints_log_and_status_home(aws, tmp_path):
    _status(aws, exit_code=0)
    _put(aws, PREFIX + "outputs/result.txt", b"42\n")
    _put(aws, PREFIX + "outputs/sub/dir/deep.bin", b"\0\1")
    _put(aws, PREFIX + "checkpoints/ckpt.pt", b"weights")
    _put(aws, PREFIX + "logs/job.log", b"line 1\nline 2\n")
    notes = []
    got = detached.fetch(aws, RUN, tmp_path / "out", Limits(), notes.append)
    out = tmp_path / "out"
    assert got["outputs"] == ["result.txt", "sub/dir/deep.bin"] and got["checkpoints"] == ["ckpt.pt"]
    assert got["files"] == ["job.log", "state.json"] and got["state"] == "succeeded"
    assert (got["skipped"], got["left"]) == (0, 0)
    assert (out / "outputs/result.txt").read_bytes() == b"42\n"
    assert (out / "outputs/sub/dir/deep.bin").read_bytes() == b"\0\1"
    assert (out / "checkpoints/ckpt.pt").read_bytes() == b"weights"
    assert (out / "job.log").read_bytes() == b"line 1\nline 2\n"
    assert json.loads((out / "state.json").read_text())["state"] == "succeeded"
    assert not [p for p in _tree(out) if p.endswith(".part")]
    assert any("2 output files, 1 checkpoint file" in n for n in notes)


def test_a_summary_is_read_as_any_runs_with_the_runs_secrets_masked(aws, tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(detached, "run_secrets",
                        lambda aws_, s3, bucket, user, run_id: asked.append(run_id) or ["s3cret-v"])
    _status(aws)
    _put(aws, PREFIX + "outputs/result.txt", b"no summary")
    detached.fetch(aws, RUN, tmp_path / "first", Limits(), lambda n: None)
    assert asked == []  # no summary.json: SSM is not asked
    _put(aws, PREFIX + "outputs/summary.json", json.dumps({"test_acc": 0.991, "note": "token s3cret-v"}).encode())
    notes = []
    got = detached.fetch(aws, RUN, tmp_path / "out", Limits(), notes.append, schema="task")
    assert got["columns"]["test_acc"] == 0.991 and "s3cret" not in json.dumps(got["columns"])
    assert any("test accuracy 99.10%" in n for n in notes) and asked == [RUN]
    monkeypatch.setattr(detached, "run_secrets", lambda *a: None)  # SSM refused: nothing unmasked reaches the ledger
    notes = []
    got = detached.fetch(aws, RUN, tmp_path / "again", Limits(), notes.append, schema="task")
    assert got["columns"] == {} and any("kept out of the ledger" in n for n in notes)


def test_a_run_the_store_does_not_hold_is_a_usage_error(aws, tmp_path):
    with pytest.raises(UsageError, match="no detached run"):
        detached.fetch(aws, RUN, tmp_path / "out", Limits(), print)
    assert detached.status_of(aws, RUN) is None
    assert detached.status_of(aws, "my-instance") is None  # not a run id: not asked


def test_a_run_of_another_user_or_of_the_layout_before_the_user_id_is_not_looked_for(aws, tmp_path):
    """Each user's runs are under runs/USER_ID/ (aws/runstore.py): the same run id under another
    user's prefix, or under runs/RUN_ID/ as before, is not this caller's run; the error names where
    it was looked for."""
    runstore_records.put_status(aws.s3, BUCKET, "AROAEXAMPLEROLEID0002:bob", RUN, {"state": "succeeded"})
    _put(aws, f"runs/{RUN}/status.json", json.dumps({"run_id": RUN, "state": "succeeded"}).encode())
    _put(aws, f"runs/{RUN}/outputs/theirs.txt", b"not yours")
    with pytest.raises(UsageError, match=f"no detached run {RUN} in s3://{BUCKET}/runs/{USER}/") as err:
        detached.fetch(aws, RUN, tmp_path / "out", Limits(), print)
    assert "your own runs" in err.value.hint and not (tmp_path / "out" / "outputs").exists()
    assert detached.status_of(aws, RUN) is None
    with pytest.raises(UsageError, match="no detached run"):
        detached.show_log(aws, RUN, Collect(), print)


@pytest.mark.parametrize("name", [
    "../../x",              # runs/RUN/outputs/../../x
    "../../../../../../tmp/escaped",
    "/abs/olute",           # outputs//abs/olute: an absolute-looking name
    "a/../../b",
    "./dot",
    "sub//empty",
    "back\\slash",
    "..\\..\\win",
    "nul\0byte",
    "x" * 300,              # a component over NAME_MAX
    "dir/",                 # a "folder" marker the console makes
])
def test_a_hostile_key_is_skipped_counted_and_nothing_lands_outside(aws, tmp_path, name):
    _status(aws)
    _put(aws, PREFIX + "outputs/" + name, b"evil")
    _put(aws, PREFIX + "outputs/ok.txt", b"fine")
    before = _tree(tmp_path)
    warned = []
    got = detached.fetch(aws, RUN, tmp_path / "out", Limits(), warned.append)
    assert got["outputs"] == ["ok.txt"] and got["skipped"] == 1
    assert any("not brought home, their names or places are unsafe" in w for w in warned)
    added = _tree(tmp_path) - before
    assert all(p == "out" or p.startswith("out/") for p in added), added
    assert not any(p.endswith(("x", "escaped", "olute", "b", "win")) and "outputs/ok" not in p for p in added), added


def test_a_key_that_is_also_a_directory_prefix_is_skipped(aws, tmp_path):
    _status(aws)
    _put(aws, PREFIX + "outputs/a", b"file")
    _put(aws, PREFIX + "outputs/a/b", b"inside")
    got = detached.fetch(aws, RUN, tmp_path / "out", Limits(), lambda line: None)
    assert got["outputs"] == ["a/b"] and got["skipped"] == 1
    assert (tmp_path / "out/outputs/a/b").read_bytes() == b"inside"


def test_symbolic_links_already_in_the_target_are_never_followed(aws, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim").write_text("mine")
    outputs = tmp_path / "out" / "outputs"
    outputs.mkdir(parents=True)
    os.symlink(elsewhere, outputs / "linkdir")
    os.symlink(elsewhere / "victim", outputs / "linkfile")
    _status(aws)
    _put(aws, PREFIX + "outputs/linkdir/planted", b"evil")
    _put(aws, PREFIX + "outputs/linkfile", b"evil")
    _put(aws, PREFIX + "outputs/ok.txt", b"fine")
    got = detached.fetch(aws, RUN, tmp_path / "out", Limits(), lambda line: None)
    assert got["outputs"] == ["ok.txt"] and got["skipped"] == 2
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim"]
    assert (elsewhere / "victim").read_text() == "mine"


def test_a_job_log_or_status_that_is_a_link_here_is_not_written_through(aws, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / "job.log")
    _status(aws)
    _put(aws, PREFIX + "logs/job.log", b"evil")
    got = detached.fetch(aws, RUN, out, Limits(), lambda line: None)
    assert got["files"] == ["state.json"] and victim.read_text() == "mine"


def test_too_many_keys_are_left_and_counted(aws, tmp_path):
    _status(aws)
    for i in range(7):
        _put(aws, PREFIX + f"outputs/f{i}.txt", b"x")
    warned = []
    got = detached.fetch(aws, RUN, tmp_path / "out", Limits(files=3, bytes=1 << 20), warned.append)
    assert got["outputs"] == ["f0.txt", "f1.txt", "f2.txt"] and got["left"] == 4
    assert len(list((tmp_path / "out/outputs").iterdir())) == 3
    assert any("4 files, 4 bytes, not brought home" in w for w in warned)


def test_too_many_bytes_are_left_and_counted(aws, tmp_path):
    _status(aws)
    _put(aws, PREFIX + "outputs/big.bin", b"b" * 5000)
    _put(aws, PREFIX + "outputs/small.txt", b"s" * 10)
    got = detached.fetch(aws, RUN, tmp_path / "out", Limits(files=100, bytes=1000), lambda line: None)
    assert got["outputs"] == ["small.txt"] and got["left"] == 1
    assert not (tmp_path / "out/outputs/big.bin").exists()


def test_the_listing_itself_is_bounded(aws, monkeypatch, tmp_path):
    _status(aws)
    for i in range(5):
        _put(aws, PREFIX + f"outputs/f{i}", b"x")
    monkeypatch.setattr(runstore_objects, "MAX_LISTED", 2)
    listed, more = runstore_objects.list_objects(aws.s3, BUCKET, PREFIX + "outputs/", max_entries=2)
    assert len(listed) == 2 and more


def test_an_object_larger_than_listed_is_not_kept(aws, tmp_path):
    import io
    _put(aws, PREFIX + "outputs/grows", b"g" * 100)
    with pytest.raises(runstore_objects.TooLarge):
        runstore_objects.download(aws.s3, BUCKET, PREFIX + "outputs/grows", io.BytesIO(), 10)


# --- logs -------------------------------------------------------------------------------------

class Collect:
    def __init__(self):
        self.chunks, self.finals = [], 0

    def __call__(self, chunk, final=False):
        if chunk:
            self.chunks.append(bytes(chunk))
        self.finals += bool(final)

    @property
    def data(self):
        return b"".join(self.chunks)


def test_logs_prints_the_stored_log_once(aws):
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"hello\n")
    w = Collect()
    got = detached.show_log(aws, RUN, w, print)
    assert w.data == b"hello\n" and w.finals == 1 and got == {"state": "running", "exit_status": None}


def test_logs_of_a_long_log_is_its_last_bytes(aws):
    _status(aws, "failed", exit_code=3)
    _put(aws, PREFIX + "logs/job.log", b"a" * 100 + b"the end\n")
    w, notes = Collect(), []
    got = detached.show_log(aws, RUN, w, notes.append, max_bytes=8)
    assert w.data == b"the end\n" and got == {"state": "failed", "exit_status": 3}
    assert any("first 100 bytes not shown" in n for n in notes)


def test_follow_writes_only_new_bytes_and_stops_when_the_state_is_final(aws):
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"one\n")
    steps = [lambda: _put(aws, PREFIX + "logs/job.log", b"one\ntwo\n"),
             lambda: None,  # nothing new
             lambda: (_put(aws, PREFIX + "logs/job.log", b"one\ntwo\nthree\n"), _status(aws, "succeeded", exit_code=0))]
    w = Collect()
    got = detached.show_log(aws, RUN, w, print, follow=True, sleep=lambda s: steps.pop(0)())
    assert w.chunks == [b"one\n", b"two\n", b"three\n"] and w.finals == 1
    assert got == {"state": "succeeded", "exit_status": 0} and not steps


def test_follow_finds_its_place_when_the_stored_copy_lost_its_start(aws, monkeypatch):
    monkeypatch.setattr(detached, "AGENT_LOG_MAX", 16)  # the agent keeps the last 16 bytes
    monkeypatch.setattr(detached, "TAIL_BYTES", 4)
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"0123456789abcdef")
    steps = [lambda: (_put(aws, PREFIX + "logs/job.log", b"6789abcdefGHIJKL"), _status(aws, "failed"))]
    w = Collect()
    got = detached.show_log(aws, RUN, w, print, follow=True, sleep=lambda s: steps.pop(0)())
    assert w.data == b"0123456789abcdefGHIJKL" and got == {"state": "failed", "exit_status": 1}


def test_follow_stops_when_the_group_ended_without_a_final_state(aws, monkeypatch):
    """The agent killed: status.json says running forever, the group's deadline ended it."""
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"last words\n")
    sleeps = []
    w, notes = Collect(), []
    got = detached.show_log(aws, RUN, w, notes.append, follow=True, sleep=sleeps.append)  # no group in moto
    assert got == {"state": "running", "exit_status": None} and w.data == b"last words\n"
    assert len(sleeps) == detached.GROUP_EVERY - 1
    assert any("its group has ended" in n for n in notes)


class FakeLive:
    """A live log on an instance: ``file`` grows as ``steps`` run (one per read past its end); a
    step that is an exception is raised (SSH dropped)."""
    instance_id = "i-live"

    def __init__(self, file: bytes, steps=()):
        self.file, self.steps, self.closed = bytearray(file), list(steps), False

    def read(self, offset, limit):
        if offset >= len(self.file) and self.steps:
            step = self.steps.pop(0)
            if isinstance(step, BaseException):
                raise step
            step(self)
        return bytes(self.file[offset:offset + limit])

    def close(self):
        self.closed = True


def test_follow_reads_the_live_log_and_masks_it_as_the_agent_masks_s3s(aws, monkeypatch):
    """The store's copy is shown first (masked by the agent); the instance's log, the same bytes
    then more, unmasked, is read live from the byte shown on, masked here with the run's secrets
    (from SSM as these credentials read them); it stops on status.json's final state."""
    monkeypatch.setattr(detached, "run_secrets", lambda *a: ["hunter2"])
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"one ****\n")
    live = FakeLive(b"one hunter2\n", [lambda f: f.file.extend(b"two hunter2\n"),
                                       lambda f: (f.file.extend(b"three\n"), _status(aws, "succeeded", exit_code=0))])
    clock = iter(range(0, 10_000, 10)).__next__  # every read of the clock 10 s on: status read each time
    w, notes = Collect(), []
    got = detached.show_log(aws, RUN, w, notes.append, follow=True, sleep=lambda s: None, live=lambda: live,
                            clock=clock)
    assert w.data == b"one ****\ntwo ****\nthree\n" and b"hunter2" not in w.data
    assert got == {"state": "succeeded", "exit_status": 0} and live.closed
    assert any("live on i-live" in n for n in notes)


def test_when_the_live_log_drops_follow_goes_on_from_s3_at_the_same_byte(aws, monkeypatch):
    """SSH drops (the instance was interrupted): S3's copy, which the agent sent at the notice, is
    read from the byte shown on; nothing repeated, nothing missed."""
    import socket
    monkeypatch.setattr(detached, "run_secrets", lambda *a: [])
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"one\n")
    live = FakeLive(b"one\n", [lambda f: f.file.extend(b"two\n"), socket.timeout("gone")])
    # S3's copy is behind what the live log showed ("two" came live), then the agent's upload catches up
    steps = [lambda: None, lambda: (_put(aws, PREFIX + "logs/job.log", b"one\ntwo\nthree\n"), _status(aws, "succeeded"))]
    ticks = iter(range(0, 10_000)).__next__
    w, notes = Collect(), []
    got = detached.show_log(aws, RUN, w, notes.append, follow=True, live=lambda: live, clock=ticks,
                            sleep=lambda s: steps.pop(0)() if s >= detached.POLL_S and steps else None)
    assert w.data == b"one\ntwo\nthree\n" and got["state"] == "succeeded" and not steps
    assert any("live log of i-live stopped" in n for n in notes) and not any("lost its start" in n for n in notes)


def test_a_secret_cut_between_two_reads_or_across_lines_is_masked_and_the_bytes_are_the_stores():
    """The live log is masked over its bytes as the agent masks the copy it uploads: a value cut
    between two reads, or holding a newline, is masked whole; nothing is added, so the bytes
    written, fed in any pieces, are agent/agent.mask_bytes's of the whole."""
    from ec2gpu.agent import agent as agent_side
    secrets = ["hunter2", "-----BEGIN KEY-----\nabc\n-----END KEY-----"]
    whole = (b"a hunter2 b\n" + "-----BEGIN KEY-----\nabc\n-----END KEY-----".encode() + b"\ntqdm 50%\r" + b"x" * 70_000
             + b" hunt" + b"er2 end")
    for size in (1, 3, 7, 64, 4096):
        out = []
        m = detached._Masker(secrets, out.append)
        for i in range(0, len(whole), size):
            m.feed(whole[i:i + size])
        m.flush()
        assert b"".join(out) == agent_side.mask_bytes(whole, secrets), size
    assert b"hunter" not in agent_side.mask_bytes(whole, secrets) and b"abc" not in agent_side.mask_bytes(whole, secrets)


def test_a_live_log_that_drops_inside_a_secret_goes_on_from_s3_with_nothing_shown_twice_or_unmasked(aws, monkeypatch):
    import socket
    monkeypatch.setattr(detached, "run_secrets", lambda *a: ["hunter2"])
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"one\n")
    live = FakeLive(b"one\n", [lambda f: f.file.extend(b"token hunt"), socket.timeout("gone")])
    steps = [lambda: None, lambda: (_put(aws, PREFIX + "logs/job.log", b"one\ntoken ****\nepoch 1 50%\n"),
                                    _status(aws, "succeeded"))]
    w = Collect()
    detached.show_log(aws, RUN, w, print, follow=True, live=lambda: live, clock=iter(range(10_000)).__next__,
                      sleep=lambda s: steps.pop(0)() if s >= detached.POLL_S and steps else None)
    assert w.data == b"one\ntoken ****\nepoch 1 50%\n" and b"hunt" not in w.data and not steps


def test_when_the_instance_went_without_a_word_the_replacements_log_goes_on_from_the_stores_copy(aws, monkeypatch):
    """The live view got ahead of the last upload and the instance vanished (no notice, no final
    upload): the replacement's log starts from the older copy. Its new lines are shown, after a
    note, rather than skipped for the bytes the live view had shown."""
    import socket
    monkeypatch.setattr(detached, "run_secrets", lambda *a: [])
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"one\n")
    live = FakeLive(b"one\n", [lambda f: f.file.extend(b"two (lost)\n"), socket.timeout("gone")])
    steps = [lambda: (_put(aws, PREFIX + "logs/job.log", b"one\nresumed on the replacement\n"),
                      _status(aws, "succeeded"))]
    w, notes = Collect(), []
    detached.show_log(aws, RUN, w, notes.append, follow=True, live=lambda: live, clock=iter(range(10_000)).__next__,
                      sleep=lambda s: steps.pop(0)() if s >= detached.POLL_S and steps else None)
    assert w.data == b"one\ntwo (lost)\nresumed on the replacement\n"
    assert any("went with the instance" in n for n in notes)


def test_without_the_runs_secrets_the_live_log_is_not_read(aws, monkeypatch):
    monkeypatch.setattr(detached, "run_secrets", lambda *a: None)
    _status(aws, "running")
    _put(aws, PREFIX + "logs/job.log", b"one ****\n")
    live = FakeLive(b"one hunter2\n")
    steps = [lambda: _status(aws, "succeeded")]
    w, notes = Collect(), []
    detached.show_log(aws, RUN, w, notes.append, follow=True, sleep=lambda s: steps.pop(0)() if steps else None,
                      live=lambda: live)
    assert w.data == b"one ****\n" and live.closed and any("could not be read" in n for n in notes)


def test_a_range_read_of_a_replaced_object_is_none(aws):
    _put(aws, PREFIX + "logs/job.log", b"first")
    head = runstore_objects.head_object(aws.s3, BUCKET, PREFIX + "logs/job.log")
    _put(aws, PREFIX + "logs/job.log", b"second")
    assert runstore_objects.read_range(aws.s3, BUCKET, PREFIX + "logs/job.log", 0, 3, head["etag"]) is None
    assert runstore_objects.read_range(aws.s3, BUCKET, PREFIX + "logs/job.log", 0, 3) == b"seco"
    assert runstore_objects.read_range(aws.s3, BUCKET, PREFIX + "logs/job.log", 100, 200) is None
    assert runstore_objects.head_object(aws.s3, BUCKET, PREFIX + "logs/nothing") is None


# --- the api/ functions: which runs go to the store --------------------------------------------

@pytest.fixture
def api_ctx(aws, tmp_path, monkeypatch):
    """api.access with its backend replaced by moto's clients and a fresh EC2GPU_HOME."""
    import contextlib

    from ec2gpu.api import access
    home = tmp_path / "home"
    monkeypatch.setenv("EC2GPU_HOME", str(home))
    for k in ("EC2GPU_SANDBOX", "AWS_ENDPOINT_URL", "EC2GPU_REGION"):
        monkeypatch.delenv(k, raising=False)
    ctx = SimpleNamespace(aws=aws, settings=SimpleNamespace(home=home, download_limits=Limits()))
    monkeypatch.setattr(access, "_context", lambda *a, **k: contextlib.nullcontext(ctx))
    return access, home


def _row(run_id, **fields):
    return {"run_id": run_id, "command": "ec2gpu run task.yaml", "backend": "aws", "status": "detached",
            "started_at": "2026-11-25T10:30:00+00:00", "artifacts": None, **fields}


def test_fetch_of_a_detached_run_in_the_ledger_goes_to_the_store_by_a_prefix(api_ctx, aws, tmp_path, monkeypatch):
    from ec2gpu.runs.settle import ledger
    access, home = api_ctx
    ledger.record(home, _row(RUN, status="completed", artifacts=str(tmp_path / "art")))
    _status(aws)
    _put(aws, PREFIX + "outputs/r.txt", b"r")
    got = access.fetch(RUN[:15], max_files=5)
    assert got.run_id == RUN and got.source == "s3" and got.out == str((tmp_path / "art").resolve())
    assert got.outputs == ["r.txt"] and (tmp_path / "art/outputs/r.txt").read_bytes() == b"r"


def test_fetch_json_of_a_detached_run_prints_the_documents_keys_in_their_order(api_ctx, aws, tmp_path, monkeypatch,
                                                                                capsys):
    """`ec2gpu fetch --json` prints the api's Fetched record as the dict it returned before it was typed:
    the same keys, in the same order, with the same values."""
    from ec2gpu import cli
    monkeypatch.chdir(tmp_path)
    _status(aws)
    _put(aws, PREFIX + "outputs/r.txt", b"r")
    assert cli.main(["fetch", RUN, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed) == ["run_id", "out", "source", "outputs", "checkpoints", "files", "state", "skipped", "left",
                             "columns"]
    assert printed == {"run_id": RUN, "out": str((tmp_path / "runs" / RUN).resolve()), "source": "s3",
                       "outputs": ["r.txt"], "checkpoints": [], "files": ["state.json"], "state": "succeeded",
                       "skipped": 0, "left": 0, "columns": {}}


def test_fetch_of_a_run_only_the_store_holds_defaults_to_runs_run_id(api_ctx, aws, tmp_path, monkeypatch):
    access, _ = api_ctx
    monkeypatch.chdir(tmp_path)
    _status(aws)
    got = access.fetch(RUN)
    assert got.out == str((tmp_path / "runs" / RUN).resolve()) and got.files == ["state.json"]
    with pytest.raises(UsageError, match="no run"):  # neither here nor in the store: today's answer
        access.fetch("20261125-103000-ffff")


def test_logs_of_a_detached_run_come_from_the_store_and_a_foreground_runs_from_its_artifacts(api_ctx, aws, tmp_path):
    from ec2gpu.runs.settle import ledger
    access, home = api_ctx
    _status(aws, "failed", exit_code=7)
    _put(aws, PREFIX + "logs/job.log", b"from s3\n")
    ledger.record(home, _row(RUN))  # status "detached", no controller
    shown = access.logs(RUN)
    assert shown.to_json() == {"exit_status": 7, "run_id": RUN, "instance_id": None, "source": "s3", "state": "failed",
                     "log": "from s3\n"}
    art = tmp_path / "fg"
    art.mkdir()
    (art / "job.log").write_bytes(b"saved here\n")
    fg = "20261125-090000-0000"  # a foreground run: its controller recorded, its log here; the store not asked
    ledger.record(home, _row(fg, status="completed", exit_status=0, artifacts=str(art),
                             controller={"host": "h", "pid": 1, "started": 1.0}))
    _put(aws, f"runs/{USER}/{fg}/state.json", b"{}")
    assert access.logs(fg).log == "saved here\n"
