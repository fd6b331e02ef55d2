"""runs/recover/handover.py: what a lost controller's instance handed over is unpacked as hostile input."""
import io
import json
import tarfile
from pathlib import Path

from ec2gpu.remote.files import Limits
from ec2gpu.runs.recover import handover


def _archive(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type, info.linkname = kind, data
                tar.addfile(info)
    return path


def test_only_plain_files_inside_outputs_are_written(tmp_path):
    archive = _archive(tmp_path / "o.tar.gz", [
        ("ok.txt", "file", b"1"), ("sub/deep.txt", "file", b"2"), ("../escape.txt", "file", b"x"),
        ("/etc/abs.txt", "file", b"x"), ("link", tarfile.SYMTYPE, "/etc/passwd"),
        ("hard", tarfile.LNKTYPE, "ok.txt"), ("dev", tarfile.CHRTYPE, ""), ("a/./b", "file", b"x")])
    said = []
    names, skipped, left = handover.unpack(archive, tmp_path / "out", Limits(files=10, bytes=100), said.append)
    assert names == ["ok.txt", "sub/deep.txt"] and skipped == 6 and left == 0
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["deep.txt", "ok.txt", "sub"]
    assert not (tmp_path / "escape.txt").exists() and "6 member(s)" in said[0]


def test_the_download_limits_hold_for_an_archive_too(tmp_path):
    archive = _archive(tmp_path / "o.tar.gz", [(f"f{i}", "file", b"x" * 40) for i in range(5)])
    said = []
    names, _, left = handover.unpack(archive, tmp_path / "out", Limits(files=10, bytes=100), said.append)
    assert names == ["f0", "f1"] and left == 1  # the reading stops at the first member over them: f2
    assert "not read past 'f2'" in said[0] and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["f0", "f1"]
    names, _, left = handover.unpack(archive, tmp_path / "o2", Limits(files=1, bytes=10_000), lambda line: None)
    assert names == ["f0"] and left == 1


def test_a_broken_archive_is_said_not_raised(tmp_path):
    (tmp_path / "o.tar.gz").write_bytes(b"not gzip")
    said = []
    assert handover.unpack(tmp_path / "o.tar.gz", tmp_path / "out", Limits(), said.append) == ([], 0, 0)
    assert "could not be read" in said[0]


def test_the_record_handed_over_is_checked_and_its_words_made_inert():
    got = handover._record(json.dumps({"state": "succeeded", "exit_code": 0, "handover": "uploaded\x1b[2J",
                                       "signature": "x"}).encode())
    assert got["state"] == "succeeded" and "\x1b" not in got["handover"] and got["signature_checked"] is False
    got = handover._record(json.dumps({"state": "succeeded", "array": {"done": 4, "failed": -1, "queued": True,
                                                                       "other": 1}}).encode())
    assert got["array"] == {"done": 4}  # an array's counts: known names, counts only
    assert handover._record(b"[1]")["state"] == "unreadable"


def test_the_agents_document_gives_the_urls_to_the_head_only_and_the_pools_to_an_arrays_driver():
    h = handover.Handover("b", {"outputs": "https://u", "pool": "https://p"}, 300)
    assert json.loads(h.document(True, True, ["B", "A"])) == {"urls": {"outputs": "https://u"}, "wait_s": 300,
                                                             "shutdown": True, "secret_names": ["A", "B"]}
    assert json.loads(h.document(True, True, [], pool=True))["urls"] == {"outputs": "https://u", "pool": "https://p"}
    assert json.loads(h.document(False, False, [], pool=True))["urls"] == {}


def _pool_status(**element):
    return json.dumps({"schema": 1, "final": True, "counts": {"done": 1, "failed": 0, "running": 0, "queued": 0},
                       "nodes": {}, "elements": [{"index": 3, "status": "succeeded", "attempts": 1, "exit_status": 0,
                                                  "params": {"lr": "0.1"}, "tail": ["ok"], **element}]}).encode()


def _fetch_pool(monkeypatch, tmp_path, archive, out, submitted=None):
    def download(s3, bucket, key, path, cap):
        data = archive.read_bytes()
        Path(path).write_bytes(data)
        return len(data)
    monkeypatch.setattr(handover.runstore_objects, "download_head", download)
    said = []
    got = handover.fetch_pool(None, "b", "k", out, Limits(files=20, bytes=10_000), said.append, submitted)
    return got, said


def test_an_arrays_table_and_element_logs_come_home_checked_and_nothing_else(monkeypatch, tmp_path):
    archive = _archive(tmp_path / "p.tar.gz", [
        ("table.json", "file", _pool_status()), ("logs/3.log", "file", b"element 3\n"),
        ("logs/x.log", "file", b"x"), ("logs/03.log", "file", b"x"), ("job.log", "file", b"not the driver's"),
        ("pool.json", "file", b"{}"), ("logs/4.log", tarfile.SYMTYPE, "/etc/passwd")])
    out = tmp_path / "out"
    (out / "outputs" / "3").mkdir(parents=True)  # the element's outputs, home before its table
    (out / "outputs" / "3" / "summary.json").write_text(json.dumps({"test_acc": 0.991}))
    got, said = _fetch_pool(monkeypatch, tmp_path, archive, out)
    assert got["counts"]["done"] == 1 and got["elements"][0]["params"] == {"lr": "0.1"}
    assert got["elements"][0]["test_accuracy"] == 0.991  # read from its summary.json, as a sweep's table shows it
    assert json.loads((out / "pool.json").read_text())["elements"][0]["index"] == 3  # the checked table
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if "outputs" not in p.parts) == \
        ["logs", "logs/3.log", "pool.json"]
    assert (out / "logs" / "3.log").read_text() == "element 3\n"
    # checked against the elements submitted, where they are known: one never submitted is refused
    got, said = _fetch_pool(monkeypatch, tmp_path, archive, tmp_path / "o2", submitted=[])
    assert got is None and "not accepted" in said[-1] and not (tmp_path / "o2" / "pool.json").exists()


def test_an_element_log_is_never_written_through_a_link(monkeypatch, tmp_path):
    archive = _archive(tmp_path / "p.tar.gz", [("table.json", "file", _pool_status()),
                                               ("logs/3.log", "file", b"element 3\n")])
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "logs").symlink_to(elsewhere)
    got, _ = _fetch_pool(monkeypatch, tmp_path, archive, out)
    assert got is not None and list(elsewhere.iterdir()) == []


def test_an_archive_of_very_many_members_is_not_read_past_the_limits(tmp_path):
    archive = _archive(tmp_path / "o.tar.gz", [(f"f{i}", "file", b"") for i in range(5000)])
    said = []
    names, _, left = handover.unpack(archive, tmp_path / "out", Limits(files=10, bytes=100), said.append)
    assert len(names) == 10 and left == 1  # the eleventh file is over the limits: the rest is left unread
    assert any("not read past 'f10'" in line for line in said)
