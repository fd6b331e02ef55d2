"""runs/recover/handover.py: what a lost controller's instance handed over is unpacked as hostile input."""
import io
import json
import tarfile

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
    names, _, left = handover.unpack(archive, tmp_path / "out", Limits(files=10, bytes=100), lambda line: None)
    assert names == ["f0", "f1"] and left == 3
    names, _, left = handover.unpack(archive, tmp_path / "o2", Limits(files=1, bytes=10_000), lambda line: None)
    assert names == ["f0"] and left == 4


def test_a_broken_archive_is_said_not_raised(tmp_path):
    (tmp_path / "o.tar.gz").write_bytes(b"not gzip")
    said = []
    assert handover.unpack(tmp_path / "o.tar.gz", tmp_path / "out", Limits(), said.append) == ([], 0, 0)
    assert "could not be read" in said[0]


def test_the_record_handed_over_is_checked_and_its_words_made_inert():
    got = handover._record(json.dumps({"state": "succeeded", "exit_code": 0, "handover": "uploaded\x1b[2J",
                                       "signature": "x"}).encode())
    assert got["state"] == "succeeded" and "\x1b" not in got["handover"] and got["signature_checked"] is False
    assert handover._record(b"[1]")["state"] == "unreadable"


def test_the_agents_document_gives_the_urls_to_the_head_only():
    h = handover.Handover("b", {"outputs": "https://u"}, 300)
    assert json.loads(h.document(True, True, ["B", "A"])) == {"urls": {"outputs": "https://u"}, "wait_s": 300,
                                                             "shutdown": True, "secret_names": ["A", "B"]}
    assert json.loads(h.document(False, False, []))["urls"] == {}


def test_an_archive_of_very_many_members_is_not_read_past_the_limits(tmp_path):
    archive = _archive(tmp_path / "o.tar.gz", [(f"f{i}", "file", b"") for i in range(5000)])
    said = []
    names, _, left = handover.unpack(archive, tmp_path / "out", Limits(files=10, bytes=100), said.append)
    assert len(names) == 10 and left == 10 + handover.MAX_REFUSED + 1  # then the rest is left unread
    assert any("not read" in line for line in said)
