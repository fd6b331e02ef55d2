"""What comes home from an instance (remote/files.py): names checked, places checked, bounded;
against a hostile SFTP server that lists whatever it likes (a compromised instance)."""
import stat
from types import SimpleNamespace

import pytest

from ec2gpu.remote import files, sync
from ec2gpu.runs.recover import recovery


@pytest.mark.parametrize("name, ok", [
    ("a.txt", True), ("sub/dir/b.bin", True), ("new\nline", True), ("-rf", True),
    ("", False), ("/etc/passwd", False), ("../x", False), ("a/../../x", False), ("a/./b", False), ("a//b", False),
    ("a/", False), ("x\0y", False), ("a" * 256, False), ("a/" * 2100 + "b", False)])
def test_check_name_refuses_every_name_that_could_leave_its_directory(name, ok):
    assert (files.check_name(name) is None) == ok


def test_local_target_refuses_links_and_special_files_on_this_machine(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "file-link").symlink_to(outside / "f")
    (root / "plain").write_text("x")
    (root / "adir").mkdir()
    import os
    os.mkfifo(root / "fifo")
    assert files.local_target(root, "new/deep/file") == root / "new/deep/file"
    assert files.local_target(root, "plain") == root / "plain"  # replaced by a newer copy
    for name in ("link/x", "file-link", "fifo", "adir", "plain/x"):
        assert files.local_target(root, name) is None, name


class HostileSftp:
    """An SFTP server that lists ``tree`` ({directory: [(name, mode, size)]}) whatever it holds,
    and serves ``content`` for any path it is asked for; ``got`` records the paths asked for."""

    def __init__(self, tree, content=b"x"):
        self.tree, self.content, self.got = tree, content, []

    def listdir_attr(self, path):
        if path not in self.tree:
            raise FileNotFoundError(path)
        return [SimpleNamespace(filename=n, st_mode=m, st_size=sz, st_mtime=1.0) for n, m, sz in self.tree[path]]

    def getfo(self, path, f, callback=None, prefetch=True, max_concurrent_prefetch_requests=None):
        self.got.append(path)
        f.write(self.content)
        if callback:
            callback(len(self.content), len(self.content))
        return len(self.content)


REG, DIR, LNK = stat.S_IFREG | 0o644, stat.S_IFDIR | 0o755, stat.S_IFLNK | 0o777


class FakeConn:
    def __init__(self, sftp):
        self._sftp = sftp

    def sftp(self):
        return self._sftp

    def run(self, command, **kw):  # "command -v rsync": none here, so the SFTP path runs
        return SimpleNamespace(ok=False, stdout="")


def test_a_hostile_listing_writes_nothing_outside_the_run_directory(tmp_path):
    """Issue 26.1 at the protocol level: a compromised instance's SFTP server returns names with
    '/', '..' and absolute paths in READDIR; none is written, each is named in one warning."""
    sftp = HostileSftp({"/r/out": [("../../dotdot_written.txt", REG, 1), ("/tmp/abs_written.txt", REG, 1),
                                   ("ok.txt", REG, 1), ("sub", DIR, 0), ("link", LNK, 0)],
                        "/r/out/sub": [("..", REG, 1), ("fine.bin", REG, 1)]})
    local, warned = tmp_path / "a" / "b" / "outputs", []
    got, how = sync.pull(FakeConn(sftp), "/r/out", local, [], None, "i-1", warn=warned.append)
    assert how == "sftp" and got == ["ok.txt", "sub/fine.bin"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "a/b/outputs/ok.txt", "a/b/outputs/sub/fine.bin"]
    assert len(warned) == 2 and "3 files not brought home" in warned[0] and "'../../dotdot_written.txt'" in warned[0]
    assert "1 symbolic link not brought home" in warned[1]  # said, never followed
    assert "/r/out/link" not in sftp.got  # a link on the instance is neither listed nor followed


def test_a_file_that_grows_past_the_limit_while_copied_is_not_left_here(tmp_path):
    sftp = HostileSftp({"/r/out": [("small.bin", REG, 10)]}, content=b"y" * 5000)  # listed at 10 bytes, serves 5000
    warned = []
    got, _ = sync.pull(FakeConn(sftp), "/r/out", tmp_path, [], None, "i-1", files.Limits(10, 1000), warn=warned.append)
    assert got == [] and list(tmp_path.iterdir()) == [] and "grew past the limit" in warned[0]


def test_the_listing_is_bounded_whatever_the_instance_holds():
    sftp = HostileSftp({"/d": [(f"f{i}", REG, 1) for i in range(50)]})
    assert len(files.listing(sftp, "/d", max_entries=20)) == 20


def test_checkpoints_with_hostile_names_come_home_inside_their_directory_and_a_newline_name_works(tmp_path):
    """Issue 26.6: a checkpoint named with a newline killed the run (the listing was split on
    newlines); names leading out were written out. Now the listing is SFTP's."""
    sftp = HostileSftp({"/ck": [("step\n1.pt", REG, 1), ("x/../../escape.pt", REG, 1), ("../hidden-escape.pt", REG, 1),
                                (".partial", REG, 1), ("d", DIR, 0)], "/ck/d": [("m.pt", REG, 1)]})
    notes = []
    ck = recovery.DirCheckpoints(remote="/ck", local=tmp_path / "ck", log=notes.append)
    assert ck.sync(FakeConn(sftp), force=True)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "ck/d/m.pt", "ck/step\n1.pt"]
    assert sum("'x/../../escape.pt'" in n for n in notes) == 1
    assert not ck.sync(FakeConn(sftp), force=True)  # unchanged: nothing copied, the warning not repeated
    assert sum("'x/../../escape.pt'" in n for n in notes) == 1


def test_checkpoints_stop_at_the_limit_and_say_so_once(tmp_path):
    sftp = HostileSftp({"/ck": [(f"c{i}", REG, 1) for i in range(5)]})
    notes = []
    ck = recovery.DirCheckpoints(remote="/ck", local=tmp_path, log=notes.append, limits=files.Limits(files=3))
    ck.sync(FakeConn(sftp), force=True)
    ck.sync(FakeConn(sftp), force=True)
    assert len(list(tmp_path.iterdir())) == 3 and sum("above the limit" in n for n in notes) == 2


def test_get_bounded_leaves_nothing_when_the_file_is_too_big(tmp_path):
    sftp = HostileSftp({}, content=b"z" * 100)
    with pytest.raises(files.TooBig):
        files.get_bounded(sftp, "/x", tmp_path / "x", 10)
    assert list(tmp_path.iterdir()) == []
    assert files.get_bounded(sftp, "/x", tmp_path / "x", 100) == 100 and (tmp_path / "x").read_bytes() == b"z" * 100
    assert (tmp_path / "x").stat().st_mode & 0o7000 == 0  # no set-id bits, whatever the instance says


def test_a_log_without_newlines_is_split_at_a_bound_and_a_log_here_stops_at_its_cap(tmp_path):
    """Issue 26.7: a 300 MB log was held whole (900 MB of controller memory). Lines are bounded, the
    log written here is capped with one line saying so (scripts/bench_big_log.py measures the rest)."""
    from ec2gpu.remote import jobs
    from ec2gpu.runs.execute import nodes
    got = []
    split = jobs.LineSplitter(got.append, max_line=10)
    split(b"a" * 35)
    assert got == ["a" * 10] * 3 and split.buf == b"a" * 5
    with nodes.LocalLog(tmp_path / "log", max_bytes=100) as log:
        for _ in range(30):
            log.write(b"0123456789")
    text = (tmp_path / "log").read_bytes()
    assert text.startswith(b"0123456789" * 10 + b"\n[ec2gpu: this log stops at 100 bytes") and text.count(b"[ec2gpu") == 1


def test_a_tree_goes_up_with_one_mkdir_for_all_its_directories(tmp_path):
    """remote/files.put_tree: every directory made in one command (not one SSH round trip per file)."""
    from ec2gpu.remote import files

    for rel in ("a.pt", "x/b.pt", "x/c.pt", "x/y/d.pt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    ran, put = [], []

    class Conn:
        def run(self, command, **_):
            ran.append(command)

        def sftp(self):
            return type("Sftp", (), {"put": lambda _self, local, remote: put.append(remote)})()

    paths = sorted(p for p in tmp_path.rglob("*.pt"))
    files.put_tree(Conn(), tmp_path, paths, "/r/ckpt")
    assert ran == ["mkdir -p /r/ckpt /r/ckpt/x /r/ckpt/x/y"]
    assert put == ["/r/ckpt/a.pt", "/r/ckpt/x/b.pt", "/r/ckpt/x/c.pt", "/r/ckpt/x/y/d.pt"]


def test_a_pull_says_the_symbolic_links_in_the_outputs_it_did_not_bring_home(tmp_path):
    """Issue 48 item 16: a link is never followed (nor listed as a file), and now said."""
    import stat as stat_
    from types import SimpleNamespace

    from ec2gpu.remote import sync

    class Sftp:
        def listdir_attr(self, path):
            return [SimpleNamespace(filename="latest.pt", st_mode=stat_.S_IFLNK | 0o777, st_size=9, st_mtime=1.0)]
    warned = []
    got = sync.pull(SimpleNamespace(sftp=Sftp), "/r/out", tmp_path / "home", [], None, "i-1", warn=warned.append)
    assert got == ([], "none")
    assert warned == ["/r/out: 1 symbolic link not brought home (a link is never followed: write the file itself "
                      "there): 'latest.pt'"]
