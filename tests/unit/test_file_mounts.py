"""file_mounts as SkyPilot writes them: local paths, s3:// sources, storage entries; other stores refused."""
import json
import sys
import types
from pathlib import Path

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.remote import sync
from ec2gpu.runs.execute import engine
from ec2gpu.tasks import load, mounts


def _task(tmp_path: Path, body: str) -> load.LoadedTask:
    (tmp_path / "task.yaml").write_text("resources:\n  accelerators: T4:1\nrun: echo hi\n" + body)
    return load.load(tmp_path / "task.yaml")


def test_each_form_becomes_what_skypilot_means(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    (tmp_path / "vocab.txt").write_text("v")
    loaded = _task(tmp_path, "file_mounts:\n  /data: ./data\n  ~/vocab.txt: vocab.txt\n  ckpt: s3://my-bucket/ckpt\n"
                             "  /out:\n    name: my-out\n    mode: MOUNT\n"
                             "  /ds:\n    source: s3://ds-bucket/imagenet/\n    mode: COPY\n")
    by = {m.target: m for m in loaded.mounts}
    assert by["/data"].kind == "local" and by["/data"].source == str((tmp_path / "data").resolve())
    assert by["~/vocab.txt"].is_file
    assert (by["ckpt"].kind, by["ckpt"].bucket, by["ckpt"].prefix, by["ckpt"].write_back) == ("s3", "my-bucket",
                                                                                              "ckpt", False)
    assert by["/out"].create and by["/out"].write_back and by["/out"].bucket == "my-out"
    assert by["/ds"].mode == "COPY" and not by["/ds"].write_back and by["/ds"].prefix == "imagenet/"
    assert any("MOUNT" in w and "written back" in w for w in loaded.warnings)
    # no "ignored SkyPilot field" warning: file_mounts is read now
    assert not any("file_mounts" in w and "ignored" in w for w in loaded.warnings)


@pytest.mark.parametrize("source, words", [
    ("gs://bucket/x", "Google Cloud Storage"), ("r2://bucket", "Cloudflare R2"),
    ("https://acct.blob.core.windows.net/c", "Azure"), ("ftp://host/x", "ftp://"),
    ("s3://UPPER/x", "not an S3 bucket name"), ("s3://ok-bucket/../x", "'..'"),
])
def test_stores_ec2gpu_cannot_reach_are_refused_with_the_line(tmp_path, source, words):
    with pytest.raises(UsageError) as err:
        _task(tmp_path, f"file_mounts:\n  /data: {source}\n")
    assert "task.yaml:5: file_mounts./data:" in err.value.message and words in err.value.message


@pytest.mark.parametrize("target", ["/", "~", "/data/../etc", "~other/x", "a\tb", "/my data", "~/x;rm -rf ~",
                                    "/d/$(id)", "/d/`id`", "~/a'b", "/d/*"])
def test_targets_that_are_not_a_place_of_their_own_are_refused(tmp_path, target):
    with pytest.raises(UsageError):
        _task(tmp_path, f"file_mounts:\n  {json.dumps(target)}: s3://my-bucket/x\n")


def test_local_sources_follow_the_workdir_rules(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("[default]\n")
    monkeypatch.setenv("HOME", str(home))
    proj = home / "proj"
    proj.mkdir()
    with pytest.raises(UsageError, match="credentials"):
        _task(proj, "file_mounts:\n  ~/.aws: ~/.aws\n")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(UsageError, match="outside"):
        _task(proj, f"file_mounts:\n  /x: {tmp_path / 'elsewhere'}\n")
    with pytest.raises(UsageError, match="no such file"):
        _task(proj, "file_mounts:\n  /x: ./missing\n")


def test_a_credentials_file_is_not_sent_and_a_directory_is_bounded(tmp_path):
    (tmp_path / ".netrc").write_text("machine x login y password z\n")
    loaded = _task(tmp_path, "file_mounts:\n  ~/.netrc: .netrc\n")
    with pytest.raises(UsageError, match="credentials file"):
        engine.prepare(loaded, {})
    assert engine.prepare(loaded, {}, include_secrets=True).mount_manifests == {}
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "blob.bin").write_bytes(b"x" * 5000)
    (tmp_path / "big" / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    loaded = _task(tmp_path, "file_mounts:\n  /big: big\n")
    job = engine.prepare(loaded, {})
    assert job.mount_manifests["/big"].files == ["blob.bin"] and job.mount_manifests["/big"].withheld == ["key.pem"]
    with pytest.raises(UsageError):
        engine.prepare(loaded, {}, max_upload=1000)


def test_two_spellings_of_one_place_are_refused(tmp_path):
    with pytest.raises(UsageError, match="same place"):
        _task(tmp_path, "file_mounts:\n  ~/d: s3://my-bucket/a\n  d: s3://my-bucket/b\n")


def test_paths_on_the_instance():
    assert mounts.on_instance("~/x", "/home/ubuntu") == "/home/ubuntu/x"
    assert mounts.on_instance("x/y", "/home/ubuntu") == "/home/ubuntu/x/y"
    assert mounts.on_instance("/data/./a/", "/home/ubuntu") == "/data/a"
    assert mounts.on_instance("/data", "/h", "/sandbox/i-1/root") == "/sandbox/i-1/root/data"


def test_a_single_file_is_withheld_by_name_or_content(tmp_path):
    (tmp_path / "ok.txt").write_text("fine")
    (tmp_path / "k").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert not sync.withheld(tmp_path / "ok.txt") and sync.withheld(tmp_path / "k")
    assert sync.withheld(Path("/home/u/.aws/config"))


def test_mount_mode_targets_are_written_back_while_the_job_runs_and_a_failure_is_only_said(monkeypatch):
    from ec2gpu.errors import RemoteError
    from ec2gpu.runs.recover import recovery
    said, calls = [], []
    watch = recovery.InstanceWatch(None, "i-1", recovery.NoCheckpoints(), said.append, every_s=1e9)
    monkeypatch.setattr(recovery, "WRITE_BACK_EVERY_S", 0.0)

    def write_back(conn):
        calls.append(conn)
        if len(calls) == 2:
            raise RemoteError("file_mounts: the S3 copy back failed on the instance: AccessDenied")
    watch.write_back = write_back
    watch("conn")
    watch("conn")
    assert calls == ["conn", "conn"] and said == ["warning: file_mounts not written back this time: file_mounts: "
                                                  "the S3 copy back failed on the instance: AccessDenied"]


def test_skypilots_labels_become_tags_of_the_instances_and_their_volumes(tmp_path):
    from ec2gpu.aws import instances
    loaded = _task(tmp_path, "")
    (tmp_path / "l.yaml").write_text("resources:\n  accelerators: T4:1\n  labels: {team: vision, ver: 2}\nrun: x\n")
    labels = load.load(tmp_path / "l.yaml").task.resources.labels
    assert labels == {"team": "vision", "ver": "2"} and not loaded.task.resources.labels
    spec = instances.LaunchSpec(run_id="r", owner="o", name="n", instance_type="g4dn.xlarge", image_id="ami-12345678",
                                root_device_name="/dev/sda1", key_name="k", security_group_id="sg-1",
                                labels=tuple(sorted(labels.items())))
    instance, volume = instances.run_request(spec)["TagSpecifications"][:2]
    for ts in (instance, volume):
        got = {t["Key"]: t["Value"] for t in ts["Tags"]}
        assert got["team"] == "vision" and got["ver"] == "2" and got["ec2gpu:run"] == "r"
    for bad in ("{aws:x: y}", "{ec2gpu:run: other}", "{Name: x}", "{'a<b': c}"):
        (tmp_path / "b.yaml").write_text(f"resources:\n  labels: {bad}\nrun: x\n")
        with pytest.raises(UsageError, match="resources.labels"):
            load.load(tmp_path / "b.yaml")


def test_a_run_text_too_long_for_one_argument_is_refused_at_its_line(tmp_path):
    body = "echo " + "x" * (101 * 1024)
    (tmp_path / "t.yaml").write_text(f"workdir: null\nsetup: echo hi\nrun: {body}\n")
    with pytest.raises(UsageError, match=r"t\.yaml:3: run: 103,429 bytes: a run reaches the instance as one argument"):
        load.load(tmp_path / "t.yaml")


def test_while_the_job_runs_only_settled_files_are_written_back_and_at_its_end_all(tmp_path):
    """agent/s3files.py out: with --settled (every minute while the job runs) a file modified in the
    last 30 s or a hidden one (being written, then renamed) waits; the end's write-back sends it."""
    import os
    import time

    from ec2gpu.agent import s3files
    sent = []
    s3 = type("S3", (), {"upload_file": lambda self, path, bucket, key: sent.append(key)})()
    target = tmp_path / "results"
    target.mkdir()
    for name in ("old.txt", "new.txt", ".part.tmp"):
        (target / name).write_text(name)
    long_ago = time.time() - 120
    os.utime(target / "old.txt", (long_ago, long_ago))
    os.utime(target / ".part.tmp", (long_ago, long_ago))
    m = {"target": str(target), "bucket": "b", "prefix": "runs", "record": str(tmp_path / "rec.json")}
    assert s3files._write_back(s3, m, settled_s=30)["files"] == 1 and sent == ["runs/old.txt"]
    assert s3files._write_back(s3, m)["files"] == 2 and sorted(sent[1:]) == ["runs/.part.tmp", "runs/new.txt"]
    assert s3files._write_back(s3, m)["files"] == 0  # nothing changed since


@pytest.mark.parametrize("record", ["[1, 2]", "[" * 50000 + "]" * 50000, "not json"], ids=["a list", "too deep", "not JSON"])
def test_a_single_file_mount_with_a_bad_record_is_sent_again_and_the_next_mount_still_written_back(
        tmp_path, monkeypatch, capsys, record):
    """Review of issue 44 (round 3): in the single-file branch of the write-back a refused or
    non-object record (the job can rewrite it) raised, so `s3files.py out` exited 1 and skipped every
    mount after it. Now it reads as no record, as the directory branch's does: the file is sent."""
    from ec2gpu.agent import s3files
    sent = []
    client = type("S3", (), {"upload_file": lambda self, path, bucket, key: sent.append(f"{bucket}/{key}")})()
    monkeypatch.setitem(sys.modules, "boto3", types.SimpleNamespace(client=lambda *a, **kw: client))
    (tmp_path / "one.txt").write_text("the job's")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a.txt").write_text("a")
    (tmp_path / "bad.json").write_text(record)
    spec = [{"target": str(tmp_path / "one.txt"), "bucket": "b1", "prefix": "one.txt", "region": "us-east-1",
             "write_back": True, "record": str(tmp_path / "bad.json")},
            {"target": str(tmp_path / "dir"), "bucket": "b2", "prefix": "d", "region": "us-east-1",
             "write_back": True, "record": str(tmp_path / "dir.json")}]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert s3files.main(["out", str(tmp_path / "spec.json")]) == 0, capsys.readouterr().out
    assert sent == ["b1/one.txt", "b2/d/a.txt"]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["target"], r["files"]) for r in lines] == [(str(tmp_path / "one.txt"), 1), (str(tmp_path / "dir"), 1)]


def test_exec_on_a_standing_instance_refuses_s3_file_mounts_before_asking_aws(tmp_path):
    from types import SimpleNamespace

    from ec2gpu.runs.standing import hosts as standing
    loaded = _task(tmp_path, "file_mounts:\n  /d: s3://my-bucket/x\n")
    job = engine.prepare(loaded, {})
    with pytest.raises(UsageError, match="no run role|has none"):
        standing.exec_task(SimpleNamespace(), None, job, None, "dev", None, None, "exec")


def test_a_single_local_file_is_held_to_max_upload_like_a_folder(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * 5000)
    loaded = _task(tmp_path, "file_mounts:\n  /data/big.bin: ./big.bin\n")
    with pytest.raises(UsageError, match="above --max-upload"):
        engine.prepare(loaded, {}, max_upload=4000)
    assert engine.prepare(loaded, {}, max_upload=6000).mounts[0].is_file


def test_an_entry_inside_a_written_back_target_is_refused(tmp_path):
    (tmp_path / "cfg").mkdir()
    with pytest.raises(UsageError, match="inside '~/out', which is written back to s3://my-out"):
        _task(tmp_path, "file_mounts:\n  ~/out:\n    name: my-out\n    mode: MOUNT\n  ~/out/cfg: ./cfg\n")
    assert len(_task(tmp_path, "file_mounts:\n  ~/out:\n    name: my-out\n    mode: MOUNT\n  ~/outside: ./cfg\n").mounts) == 2


def test_a_file_whose_only_skypilot_marker_is_a_storage_entry_or_a_git_workdir_is_read_as_skypilots(tmp_path):
    (tmp_path / "t.yaml").write_text("file_mounts:\n  ~/out:\n    name: my-out\n    mode: MOUNT\nrun: echo hi\n")
    assert load.load(tmp_path / "t.yaml").skypilot
    (tmp_path / "t.yaml").write_text("workdir:\n  url: https://github.com/o/r.git\nrun: echo hi\n")
    assert load.load(tmp_path / "t.yaml").skypilot
    (tmp_path / "t.yaml").write_text("file_mounts:\n  ~/d: ./\nrun: echo hi\n")
    assert not load.load(tmp_path / "t.yaml").skypilot


STORE = "ec2gpu-123456789012-us-east-1"  # a run store's name (aws/runstore.bucket_name)


@pytest.mark.parametrize("entry", [
    f"s3://{STORE}", f"s3://{STORE}/", f"s3://{STORE}/runs/", f"S3://{STORE}/runs/x", f"s3://{STORE.upper()}/x",
    f"{{source: s3://{STORE}, mode: MOUNT}}", f"{{source: s3://{STORE}/runs, mode: COPY}}",
    f"{{source: 's3://{STORE}', mode: MOUNT_CACHED, store: s3}}", f"{{name: {STORE}, store: s3, mode: MOUNT}}",
    f"{{name: {STORE}, mode: COPY}}", "{name: ec2gpu-any-other-name}", "s3://ec2gpu-shared-data/x",
    "s3://$STORE_BUCKET/runs/", "{source: 's3://${STORE_BUCKET}', mode: MOUNT}", "{name: $STORE_BUCKET, mode: MOUNT}",
])
def test_ec2gpus_own_buckets_are_refused_as_a_source_in_any_mode_and_spelling(tmp_path, entry):
    """The run store holds every run's outputs and every detached run's agent code: no file_mounts
    entry reaches it (or any ec2gpu-* bucket), whatever the mode, however it is written, even
    through a $VAR of envs or --env; refused at the entry's line, exit 2, with or without the flag."""
    body = f"envs:\n  STORE_BUCKET: {STORE}\nfile_mounts:\n  /mnt/store: {entry}\n"
    for allow in ((), ("some-bucket",)):
        (tmp_path / "task.yaml").write_text("resources:\n  accelerators: T4:1\nrun: echo hi\n" + body)
        with pytest.raises(UsageError) as err:
            load.load(tmp_path / "task.yaml", allow_write=allow)
        assert err.value.message.startswith(f"{tmp_path / 'task.yaml'}:7: file_mounts./mnt/store: s3://")
        assert "is ec2gpu's own bucket" in err.value.message and "\n" not in err.value.message
        assert err.value.exit_code == 2 and "ec2gpu fetch" in err.value.hint
    # --env fills the same variable: refused the same way
    (tmp_path / "t2.yaml").write_text("run: echo hi\nenvs:\n  B: null\nfile_mounts:\n  /d: s3://$B/x\n")
    with pytest.raises(UsageError, match="t2.yaml:5: file_mounts./d: s3://ec2gpu-123456789012-us-east-1 is ec2gpu's"):
        load.load(tmp_path / "t2.yaml", envs={"B": STORE})


def test_the_own_prefix_is_the_run_stores():
    from ec2gpu.aws import runstore
    assert mounts.OWN_PREFIX == runstore.BUCKET_PREFIX
    assert runstore.bucket_name("123456789012", "eu-west-1").startswith(mounts.OWN_PREFIX)


def test_a_run_refuses_the_run_store_before_anything_is_made(tmp_path, capsys, monkeypatch):
    """The CLI: one line at the task file's line, exit 2, no AWS context opened (nothing made)."""
    from ec2gpu import backend, cli

    def no_context(*a, **kw):
        raise AssertionError("a Context was opened")
    monkeypatch.setattr(backend, "Context", no_context)
    (tmp_path / "t.yaml").write_text(f"run: echo hi\nfile_mounts:\n  /mnt/store:\n    source: s3://{STORE}\n"
                                     "    mode: MOUNT\n")
    assert cli.main(["run", str(tmp_path / "t.yaml"), "--detach", "--max-runtime", "1h"]) == 2
    err = capsys.readouterr().err
    assert f"t.yaml:3: file_mounts./mnt/store: s3://{STORE} is ec2gpu's own bucket" in " ".join(err.split())


def _mounts(tmp_path, body, allow=()):
    (tmp_path / "task.yaml").write_text("run: echo hi\nfile_mounts:\n" + body)
    return load.load(tmp_path / "task.yaml", allow_write=allow)


@pytest.mark.parametrize("mode", ["MOUNT", "MOUNT_CACHED"])
def test_writing_back_to_a_bucket_the_task_does_not_make_needs_the_flag(tmp_path, mode):
    body = f"  /in: s3://data-bucket/ds\n  /out:\n    source: s3://shared-results/team-a\n    mode: {mode}\n"
    with pytest.raises(UsageError) as err:
        _mounts(tmp_path, body)
    assert err.value.message == (f"{tmp_path / 'task.yaml'}:4: file_mounts./out: mode {mode} writes back to "
                                 "s3://shared-results, a bucket this task does not make: the job could change or "
                                 "replace anything under s3://shared-results/team-a")
    assert err.value.hint == ("give --allow-write-bucket shared-results to let the job write there, or mode: COPY "
                              "to read it only")
    with pytest.raises(UsageError, match="writes back to s3://shared-results, a bucket this task does not make"):
        _mounts(tmp_path, body, ("data-bucket",))  # another bucket's flag does not do
    by = {m.target: m for m in _mounts(tmp_path, body, ("shared-results",)).mounts}
    assert by["/out"].write_allowed and by["/out"].write_back and not by["/in"].write_allowed
    # COPY only reads: no flag
    assert not _mounts(tmp_path, "  /in:\n    source: s3://shared-results/team-a\n    mode: COPY\n").mounts[0].write_back


def test_the_tasks_own_named_bucket_is_written_without_the_flag(tmp_path):
    loaded = _mounts(tmp_path, "  /out:\n    name: my-out\n    mode: MOUNT\n  /logs:\n    source: s3://my-out/logs\n"
                               "    mode: MOUNT\n")
    assert [(m.target, m.write_back, m.write_allowed) for m in loaded.mounts] == [("/out", True, False),
                                                                                ("/logs", True, False)]
    assert mounts.access(loaded.mounts) == {
        "read": ["s3://my-out/", "s3://my-out/logs"],
        "write": [{"url": "s3://my-out/", "why": mounts.OWN_WHY},
                  {"url": "s3://my-out/logs", "why": mounts.OWN_WHY}]}


@pytest.mark.parametrize("flag, words", [
    (STORE, "is ec2gpu's own bucket"), ("s3://shared-results", "not an S3 bucket name"),
    ("Shared", "not an S3 bucket name"), ("shared-results/team-a", "not an S3 bucket name"),
])
def test_a_flag_that_names_no_bucket_or_ec2gpus_own_is_refused(tmp_path, flag, words):
    with pytest.raises(UsageError, match=f"^--allow-write-bucket .*{words}"):
        _mounts(tmp_path, "  /in: s3://data-bucket/ds\n", (flag,))


def test_a_flag_no_mount_uses_is_said(tmp_path):
    loaded = _mounts(tmp_path, "  /in: s3://data-bucket/ds\n", ("data-bucket", "other"))
    assert any(w.startswith("--allow-write-bucket data-bucket, other: no MOUNT-mode") for w in loaded.warnings)


def test_the_plan_and_the_runs_first_lines_say_what_the_job_may_read_and_write(tmp_path, capsys, monkeypatch):
    from ec2gpu import cli
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.yaml").write_text("resources:\n  accelerators: T4:1\nrun: echo hi\nfile_mounts:\n"
                                     "  /in: s3://data-bucket/ds\n  /out:\n    source: s3://shared/team-a\n"
                                     "    mode: MOUNT\n  /mine:\n    name: my-out\n    mode: MOUNT\n")
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--allow-write-bucket", "shared"]) == 0
    got = capsys.readouterr()
    plan = json.loads(got.out)
    assert plan["s3_access"] == {"read": ["s3://data-bucket/ds", "s3://shared/team-a", "s3://my-out/"], "write": [
        {"url": "s3://shared/team-a", "why": "--allow-write-bucket shared"},
        {"url": "s3://my-out/", "why": mounts.OWN_WHY}]}
    line = ("S3, through the run's own role: the job may read s3://data-bucket/ds, s3://shared/team-a, s3://my-out/; "
            "may write s3://shared/team-a (--allow-write-bucket shared), s3://my-out/ (the task's own bucket (name:), "
            "made for you by ec2gpu (an existing one only if ec2gpu made it for you)); nothing else")
    assert line in " ".join(got.err.split())  # the run's own first lines, before anything is made
    assert cli.main(["run", "t.yaml", "--dry-run", "--allow-write-bucket", "shared"]) == 0
    assert f"  {line}" in capsys.readouterr().out.splitlines()


# --- tasks/mounts.py ----------------------------------------------------------------------------
# A mutmut run over this module with the fast tier (issue 29, item 14) left these mutants alive;
# each test fails when the one token it pins changes (what is copied where).

def _entry(target, value, base=Path("/nowhere"), warnings=None):
    from ec2gpu.tasks import mounts
    return mounts.entry(target, value, base, lambda p: p, [] if warnings is None else warnings)


@pytest.mark.parametrize("target", ["/", "~", "../up", "a b", "~other/x"])
def test_every_kind_of_entry_checks_its_target(target):
    for value in ("s3://my-bucket/x", {"name": "my-bucket"}):
        with pytest.raises(ValueError):
            _entry(target, value)


def test_a_plain_s3_url_is_copied_once_and_never_written_back():
    from ec2gpu.tasks.mounts import Mount

    assert _entry("/data", "s3://my-bucket/ds/") == Mount("/data", "s3", "s3://my-bucket/ds/", "COPY", "my-bucket",
                                                          "ds/")


@pytest.mark.parametrize("mode,back", [("COPY", False), ("MOUNT", True), ("MOUNT_CACHED", True)])
def test_a_storage_entry_writes_back_only_in_a_mount_mode(mode, back):
    from ec2gpu.tasks.mounts import Mount

    assert _entry("/out", {"name": "my-bucket", "mode": mode}) == Mount(
        "/out", "s3", "s3://my-bucket", mode, "my-bucket", "", write_back=back, create=True)
    assert _entry("/in", {"source": "s3://my-bucket/p", "mode": mode, "store": "S3"}) == Mount(
        "/in", "s3", "s3://my-bucket/p", mode, "my-bucket", "p", write_back=back)


def test_a_storage_entry_in_another_store_is_refused():
    for store in ("gcs", "azure", "r2"):
        with pytest.raises(ValueError, match=f"store '{store}': ec2gpu reaches S3 only"):
            _entry("/d", {"source": "s3://my-bucket/p", "store": store})
    assert _entry("/d", {"source": "s3://my-bucket/p", "store": "s3"}).bucket == "my-bucket"


def test_a_storage_entry_with_a_local_source_is_sent_from_the_task_files_directory(tmp_path):
    from ec2gpu.tasks.mounts import Mount

    (tmp_path / "data").mkdir()
    (tmp_path / "w.bin").write_bytes(b"x")
    warnings: list[str] = []
    assert _entry("/d", {"source": "data", "name": "my-bucket"}, tmp_path, warnings) == Mount(
        "/d", "local", str(tmp_path / "data"))
    assert warnings == ["file_mounts./d: the local source is sent to the instance; no bucket my-bucket is made"]
    assert _entry("~/w", "w.bin", tmp_path) == Mount("~/w", "local", str(tmp_path / "w.bin"), is_file=True)


@pytest.mark.parametrize("value", ["", "   ", 3, None])
def test_an_empty_or_non_text_source_is_refused(value):
    with pytest.raises(ValueError, match="give a local path, s3://BUCKET/PREFIX, or a storage entry"):
        _entry("/d", value)


@pytest.mark.parametrize("source,said", [
    ("https://acct.blob.core.windows.net/c/x", "is in Azure Blob Storage: ec2gpu copies from S3 only"),
    ("HTTP://acct.blob.core.windows.net/c/x", "is in Azure Blob Storage: ec2gpu copies from S3 only"),
    ("https://example.com/data.tar", "https:// is not a store ec2gpu reads"),
    ("ftp://example.com/data", "ftp:// is not a store ec2gpu reads"),
    ("gs://bucket/x", "is in Google Cloud Storage"),
])
def test_other_stores_are_refused_by_name(source, said):
    with pytest.raises(ValueError, match=said.replace("/", "/").replace(".", r"\.")):
        _entry("/d", source)


@pytest.mark.parametrize("target,ok", [("/" + "a" * 1023, True), ("/" + "a" * 1024, False), ("/d\x7f", False),
                                       ("/d\x1f", False), ("/d e", False)])
def test_a_target_is_at_most_1024_characters_of_the_allowed_ones(target, ok):
    from ec2gpu.tasks import mounts

    if ok:
        assert mounts.check_target(target) == target
    else:
        with pytest.raises(ValueError):
            mounts.check_target(target)
    if len(target) > 1024:
        with pytest.raises(ValueError, match="is not a path"):
            mounts.check_target(target)


def test_paths_on_the_instance_join_without_doubled_slashes():
    from ec2gpu.tasks import mounts

    assert mounts.parse_s3("s3://my-bucket//p/q") == ("my-bucket", "p/q")
    assert mounts.on_instance("~/x", "/home/u/") == "/home/u/x"
    assert mounts.on_instance("/data", "/home/u", root="/sandbox/i-1/") == "/sandbox/i-1/data"
    assert mounts.on_instance("/data", "/home/u") == "/data"
