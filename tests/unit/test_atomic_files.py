"""What the trainer writes while a reader may look (progress, summary.json, checkpoints, the data
set) is replaced whole or not at all (ec2gpu/train/files.py, issue 29 item 12)."""
import json
import os

import pytest

from ec2gpu.train.files import replacing, write_json


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"epoch": 1})
    with pytest.raises(RuntimeError):
        with replacing(path) as f:
            f.write('{"epoch": ')
            raise RuntimeError("the trainer died mid-write")
    assert json.loads(path.read_text()) == {"epoch": 1}
    assert os.listdir(tmp_path) == ["summary.json"]


def test_a_write_replaces_the_file_whole_and_binary_with_fsync_works(tmp_path):
    path = tmp_path / "progress.json"
    write_json(path, {"done": 1}, indent=2)
    assert path.read_text() == '{\n  "done": 1\n}\n'
    write_json(path, {"done": 2})
    assert json.loads(path.read_text()) == {"done": 2}
    with replacing(tmp_path / "checkpoint.pt", binary=True, fsync=True) as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt", "progress.json"]
