"""wire/unpack.py: one unpacker for every archive ec2gpu reads, in one pass within count and byte limits
(issue 44, item 5: a 4 MB hand-over archive took 19 s, skipping a member over the limits by decompressing it)."""
import ast
import gzip
import io
import tarfile
from pathlib import Path

import pytest

from ec2gpu.wire import unpack as unpacking
from ec2gpu.remote.files import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES

CHUNK = 64 << 20  # bytes of zeros in one gzip member of a bomb
#: decompressed bytes an unpack that stops at once may read (the bombs below hold GBs of zeros, or
#: 120 MiB of headers): the work it did, counted rather than timed (a timing fails on a busy machine)
AT_ONCE_BYTES = 4 << 20


@pytest.fixture
def decompressed(monkeypatch):
    """[bytes of each read]: what unpack read of the archive once decompressed (wire/unpack._Counted,
    the stream every member and header is read through)."""
    reads: list[int] = []
    real = unpacking._Counted.read

    def read(self, size=-1):
        data = real(self, size)
        reads.append(len(data))
        return data
    monkeypatch.setattr(unpacking._Counted, "read", read)
    return reads


def zeros_bomb(path, size, name="big.bin", kind=tarfile.REGTYPE, before=()):
    """A tar.gz at ``path``: the members ``before`` ((name, data) each), then one of ``size`` bytes of
    zeros, written as one gzip member of CHUNK zeros repeated (gzip's multi-member streams), so
    that a few GB cost a few MB and a fraction of a second to make."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for n, data in before:
            info = tarfile.TarInfo(n)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    head = buf.getvalue()[:-1024].rstrip(b"\0")  # the archive without its end blocks
    head += b"\0" * (-len(head) % 512)
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    zeros = gzip.compress(b"\0" * CHUNK, mtime=0)
    with open(path, "wb") as f:
        f.write(gzip.compress(head + info.tobuf(tarfile.GNU_FORMAT), mtime=0))
        for _ in range(size // CHUNK):
            f.write(zeros)
        f.write(gzip.compress(b"\0" * (size % CHUNK + (-size % 512) + 1024), mtime=0))  # its rest, the end
    return path


def _tar(members, gz=True):
    """A tar (gzipped with ``gz``) of ``members``: (name, data: bytes) a file, (name, None) a directory,
    (name, (type, linkname)) a link or special file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(data, tuple):
                info.type, info.linkname = data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def test_a_4_mb_archive_of_a_member_over_the_limits_stops_at_once_and_writes_nothing(tmp_path, decompressed):
    size = (DEFAULT_MAX_BYTES // CHUNK + 8) * CHUNK  # 4.5 GiB of zeros: above the default 4 GiB
    archive = zeros_bomb(tmp_path / "o.tar.gz", size)
    assert archive.stat().st_size < 8 << 20
    got = unpacking.unpack(archive, tmp_path / "out", max_files=DEFAULT_MAX_FILES, max_bytes=DEFAULT_MAX_BYTES)
    assert sum(decompressed) < AT_ONCE_BYTES  # took 11 s here (19 s where it was found): decompressed to skip it
    assert got.left == ("big.bin", size) and got.names == [] and got.bytes == 0
    assert list((tmp_path / "out").iterdir()) == []


def test_a_refused_member_of_zeros_is_not_decompressed_past_the_bound(tmp_path, decompressed):
    """A member that is not written (a name that leaves the target) still has its bytes counted:
    past max_bytes and a little more, the reading stops, whatever the members are."""
    archive = zeros_bomb(tmp_path / "o.tar.gz", 64 * CHUNK, name="../escape.bin", before=[("ok.txt", b"ok")])
    got = unpacking.unpack(archive, tmp_path / "out", max_files=10, max_bytes=1 << 20)
    assert sum(decompressed) < AT_ONCE_BYTES
    assert got.names == ["ok.txt"] and got.left == ("../escape.bin", 64 * CHUNK)
    assert not (tmp_path / "escape.bin").exists()


def test_a_long_name_record_of_zeros_is_not_read_whole(tmp_path, decompressed):
    """tarfile reads a GNU long-name (or PAX) record whole into memory: one member's headers are
    bounded (HEADER_BYTES), the rest of the archive is not read."""
    archive = zeros_bomb(tmp_path / "o.tar.gz", 2 * CHUNK, name="././@LongLink", kind=tarfile.GNUTYPE_LONGNAME,
                         before=[("ok.txt", b"ok")])
    got = unpacking.unpack(archive, tmp_path / "out", max_files=10, max_bytes=DEFAULT_MAX_BYTES)
    assert sum(decompressed) < AT_ONCE_BYTES
    assert got.names == ["ok.txt"] and got.left is None and "headers are over" in got.unread


def test_headers_count_toward_the_bytes_read(tmp_path, decompressed):
    """Empty files with a large PAX record each (tarfile parses it whole): what is read in all is
    bounded, not only each member's headers."""
    info = tarfile.TarInfo("f")
    info.pax_headers = {"comment": "a" * (60 << 10)}  # within one member's bound (HEADER_BYTES)
    one = gzip.compress(info.tobuf(tarfile.PAX_FORMAT), mtime=0)
    archive = tmp_path / "o.tar.gz"
    archive.write_bytes(one * 2000 + gzip.compress(b"\0" * 1024, mtime=0))  # 120 MiB of headers, 0.3 MB here
    got = unpacking.unpack(archive, tmp_path / "out", max_files=1000, max_bytes=1 << 20)
    assert sum(decompressed) <= (1 << 20) + (1000 + unpacking.MAX_PASSED_OVER + 1) * unpacking.MEMBER_OVERHEAD_BYTES \
        + unpacking.INPUT_SLACK_BYTES  # the bound wire/unpack.py documents, not the 120 MiB
    assert got.names == ["f"] and "once decompressed" in got.unread
    assert got.left is None  # stopped before its 1,001st file (over max_files) was reached


@pytest.mark.parametrize("member", [b"", None, (tarfile.SYMTYPE, "/etc/passwd")], ids=["files", "dirs", "links"])
def test_a_member_count_bomb_stops_at_the_limits(tmp_path, decompressed, member):
    """100,000 empty members: files stop at max_files (the next one is over the limits); members
    not written (directories, refused links) stop after MAX_PASSED_OVER."""
    info = tarfile.TarInfo("m00000")
    if member is None:
        info.type = tarfile.DIRTYPE
    elif isinstance(member, tuple):
        info.type, info.linkname = member
    header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    blank = sum(header[:148]) + 8 * 32 + sum(header[156:]) - sum(b"m00000")  # the checksum without the name
    archive = tmp_path / "o.tar.gz"
    with gzip.open(archive, "wb", compresslevel=1) as f:  # a streaming writer: one header at a time
        for i in range(100_000):
            name = b"m%05d" % i  # "m00000" ... "m99999": each header's name and checksum set in place
            header[0:6], header[148:156] = name, b"%06o\0 " % (blank + sum(name))
            f.write(header)
        f.write(b"\0" * 1024)
    got = unpacking.unpack(archive, tmp_path / "out", max_files=10, max_bytes=1 << 20)
    assert sum(decompressed) < AT_ONCE_BYTES
    if member == b"":
        assert len(got.names) == 10 and got.left == ("m00010", 0)
    else:
        assert got.names == [] and got.left is None and "1,000 members that are no file to unpack" in got.unread
        assert len(got.refused) == (0 if member is None else unpacking.MAX_PASSED_OVER + 1)


def test_the_reading_stops_at_the_first_member_over_the_limits_and_keeps_what_came_before(tmp_path):
    """The rule: nothing after the first member over the limits is read, not even a small good one
    (reading on would mean decompressing what is skipped); what came before it is kept."""
    got = unpacking.unpack(_tar([("a.txt", b"a"), ("big", b"x" * 200), ("b.txt", b"b")]), tmp_path / "out",
                           max_files=10, max_bytes=100)
    assert got.names == ["a.txt"] and got.left == ("big", 200) and got.bytes == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.txt"]
    said = got.warnings("the outputs archive", "it stays in S3")
    assert said == ["the outputs archive: not read past 'big' (200 bytes), its first member above the limit of 10 "
                    "files and 100 bytes (1 file(s), 1 bytes unpacked before it); it stays in S3"]
    got = unpacking.unpack(_tar([("big", b"x" * 200), ("b.txt", b"b")]), tmp_path / "o2", max_files=10, max_bytes=100)
    assert got.names == [] and got.left == ("big", 200) and list((tmp_path / "o2").iterdir()) == []



def _pax(pax_headers, data=b"", name="f"):
    """A tar (not gzipped) of one file ``name`` whose PAX record holds ``pax_headers``."""
    info = tarfile.TarInfo(name)
    info.size, info.pax_headers = len(data), pax_headers
    body = info.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * (-len(data) % 512)
    return io.BytesIO(_tar([("ok.txt", b"ok")], gz=False).getvalue()[:-1024].rstrip(b"\0").ljust(1024, b"\0")
                      + body + b"\0" * 1024)


@pytest.mark.parametrize("headers, data", [
    ({"GNU.sparse.map": "a,b"}, b""),  # sparse 0.1: tarfile's int() of each number
    ({"GNU.sparse.size": "x"}, b""),  # sparse 0.0
    ({"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "10"}, b"x\n" + b"\0" * 510),  # 1.0
], ids=["sparse-0.1-map", "sparse-0.0-size", "sparse-1.0-map"])
def test_a_pax_sparse_record_with_bad_numbers_ends_the_reading_in_one_line(tmp_path, headers, data):
    """tarfile raises ValueError for these (a 1.5 KB archive ended `ec2gpu fetch` with "error:
    ValueError"): the reading ends there, said in words, what came before kept."""
    got = unpacking.unpack(_pax(headers, data), tmp_path / "out", max_files=10, max_bytes=1 << 20)
    assert got.names == ["ok.txt"] and got.left is None
    assert got.unread == "could not be read whole: broken or cut short (ValueError)"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ok.txt"]


def test_a_chain_of_900_long_name_headers_ends_the_reading_in_one_line(tmp_path):
    """tarfile reads each GNU long-name header with one more level of recursion: 900 of them in a
    row (900 KiB) raised RecursionError. A member's headers are bounded (HEADER_BYTES): the
    reading ends there, said in words."""
    info = tarfile.TarInfo("n" * 200)  # over 100 bytes: a GNU long-name header before it
    whole = info.tobuf(tarfile.GNU_FORMAT)
    link, header = whole[:1024], whole[1024:]  # the long-name header and its name's block; the member's own
    archive = io.BytesIO(_tar([("ok.txt", b"ok")], gz=False).getvalue()[:1024] + link * 900 + header + b"\0" * 1024)
    got = unpacking.unpack(archive, tmp_path / "out", max_files=10, max_bytes=1 << 20)
    assert got.names == ["ok.txt"] and got.left is None and "headers are over" in got.unread
    assert unpacking.HEADER_BYTES // 1024 < 100  # each header at least two blocks: a short chain


def test_a_member_named_like_a_part_file_of_another_is_written_and_stays(tmp_path):
    """Files were written as ".NAME.part" first: a member of that name was truncated and renamed
    away by the next one while still listed as written (and `ec2gpu fetch` then failed on it)."""
    got = unpacking.unpack(_tar([(".model.bin.part", b"first"), ("model.bin", b"second")]), tmp_path / "out",
                           max_files=10, max_bytes=100)
    assert got.names == [".model.bin.part", "model.bin"] and got.bytes == 11 and got.unread is None
    out = tmp_path / "out"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {".model.bin.part": b"first", "model.bin": b"second"}


def test_a_name_of_255_bytes_is_written(tmp_path):
    """A name as long as Linux allows (NAME_MAX) is an honest one: its file being written is named
    shortly, not NAME + ".part" (ENAMETOOLONG)."""
    name = "a" * 255
    got = unpacking.unpack(_tar([(name, b"1"), (f"d/{'b' * 252}", b"2")]), tmp_path / "out", max_files=10,
                           max_bytes=100)
    assert got.names == sorted([name, f"d/{'b' * 252}"]) and got.refused == []
    assert (tmp_path / "out" / name).read_bytes() == b"1"


def test_a_name_written_twice_counts_twice(tmp_path):
    got = unpacking.unpack(_tar([("a", b"1")] * 3), tmp_path / "out", max_files=2, max_bytes=100)
    assert got.names == ["a"] and got.left == ("a", 1) and got.bytes == 2


def test_a_member_cut_short_leaves_no_file_and_keeps_the_ones_before(tmp_path):
    whole = _tar([("a.txt", b"a"), ("big", bytes(range(256)) * 4096)], gz=False).getvalue()
    got = unpacking.unpack(io.BytesIO(whole[:4096]), tmp_path / "out", max_files=10, max_bytes=1 << 30)
    assert got.names == ["a.txt"] and "could not be read whole" in got.unread
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.txt"]  # no big, no .big.part


def test_refused_members_are_named_and_the_others_written(tmp_path):
    got = unpacking.unpack(_tar([("ok", b"1"), ("d", None), ("d/in", b"2"), ("../up", b"x"), ("/abs", b"x"),
                                 ("a\\b", b"x"), ("l", (tarfile.SYMTYPE, "ok")), ("h", (tarfile.LNKTYPE, "ok")),
                                 ("c", (tarfile.CHRTYPE, "")), ("f", (tarfile.FIFOTYPE, ""))], gz=False),
                           tmp_path / "out", max_files=10, max_bytes=100)
    assert got.names == ["d/in", "ok"] and got.left is None and got.unread is None
    assert [n for n, _ in got.refused] == ["../up", "/abs", "a\\b", "l", "h", "c", "f"]
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*")) == ["d", "d/in", "ok"]


def test_tarfiles_data_filter_refuses_what_the_name_checks_would_let_through(tmp_path, monkeypatch):
    """The data filter is applied too (where this Python has it), not only the name checks."""
    if not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    monkeypatch.setattr(unpacking, "check_name", lambda name: None)
    monkeypatch.setattr(unpacking, "local_target", lambda root, name: Path(root) / name)
    got = unpacking.unpack(_tar([("../up", b"x"), ("ok", b"1")]), tmp_path / "out", max_files=10, max_bytes=100)
    assert got.names == ["ok"] and "data filter" in got.refused[0][1] and not (tmp_path / "up").exists()


#: the modules that open a tar to read it: the one unpacker, on every side (the detached agent's
#: workdir too: agent/prepare.extract_workdir unpacks with it, issue 45 item 2)
READERS = {"wire/unpack.py"}


#: what opens an archive to read it, by the name it has where it is defined (a mode that is not a
#: literal "w..."/"x..."/"a..." makes the first ones readers)
OPENERS = {"tarfile.open", "tarfile.TarFile", "tarfile.TarFile.open", "tarfile.TarFile.taropen",
           "tarfile.TarFile.gzopen", "tarfile.TarFile.bz2open", "tarfile.TarFile.xzopen", "zipfile.ZipFile"}
UNPACKERS = {"shutil.unpack_archive"}  # reads whatever its mode
#: a TarFile's (or ZipFile's) methods that read members, on whatever object
READ_METHODS = {"extractall", "extractfile", "extract", "getmembers", "getmember", "getnames", "next"}


def _aliases(tree):
    """Each name the module's imports bind -> the dotted name it stands for (``t`` -> ``tarfile``
    for ``import tarfile as t``, ``open`` -> ``tarfile.open`` for ``from tarfile import open``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update({(a.asname or a.name).split(".")[0]: a.name if a.asname else a.name.split(".")[0]
                        for a in node.names})
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return out


def _dotted(node, aliases):
    """``node`` (a name or an attribute chain) as the dotted name it stands for, None for others."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id if node.id in ("tarfile", "zipfile", "shutil") else None)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def tar_reads(source):
    """The lines of ``source`` (a module's text) that open an archive to read it or read its
    members: OPENERS called with a mode that is not a literal "w"/"x"/"a" one (or named without
    being called: passed on, it may be called with any), UNPACKERS, READ_METHODS called on anything;
    through any import's alias."""
    tree = ast.parse(source)
    aliases, called, out = _aliases(tree), set(), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called.add(id(node.func))
        name = _dotted(node.func, aliases)
        if isinstance(node.func, ast.Attribute) and node.func.attr in READ_METHODS or name in UNPACKERS:
            out.append(node.lineno)
        elif name in OPENERS:
            mode = next((k.value for k in node.keywords if k.arg == "mode"), node.args[1] if len(node.args) > 1 else None)
            if not (isinstance(mode, ast.Constant) and str(mode.value)[:1] in "wxa"):
                out.append(node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in called \
                and _dotted(node, aliases) in OPENERS | UNPACKERS and not isinstance(getattr(node, "ctx", None), ast.Store):
            out.append(node.lineno)
    return sorted(set(out))


@pytest.mark.parametrize("source, reads", [
    ("tarfile.open(p, 'r:gz')", True), ("tarfile.open(fileobj=b)", True), ("tarfile.open(p, mode='w:gz')", False),
    ("tar.next()", True), ("t.getnames()", True), ("t.extract(m)", True),
    ("import shutil\nshutil.unpack_archive(a, b)", True), ("from shutil import unpack_archive\nunpack_archive(a, b)", True),
    ("from tarfile import open\nopen(p)", True), ("from tarfile import open as o\no(p, 'r')", True),
    ("from tarfile import open\nopen(p, 'w')", False), ("open(p)", False),
    ("import tarfile as t\nt.open(p)", True), ("from tarfile import TarFile\nTarFile.open(p)", True),
    ("opener = tarfile.open", True), ("import zipfile\nzipfile.ZipFile(p)", True),
    ("from ..wire.unpack import unpack as unpack_archive\nunpack_archive(a, b)", False),
])
def test_the_source_check_finds_each_way_of_reading_an_archive(source, reads):
    assert bool(tar_reads(source)) is reads


def test_every_tar_is_read_by_the_one_unpacker():
    src = Path(unpacking.__file__).parents[1]  # ec2gpu/
    readers = {str(p.relative_to(src)) for p in src.rglob("*.py") if tar_reads(p.read_text())}
    assert readers == READERS


def test_the_pools_driver_unpacks_with_the_same_unpacker_as_shipped_to_its_head(tmp_path):
    """On the head the driver is a file, not a package: it imports the unpacker from beside it
    (pool/ray_nodes.SHIPPED), with its name checks in it; nothing else of ec2gpu is there."""
    import subprocess
    import sys

    from ec2gpu.pool import ray_nodes
    src = Path(unpacking.__file__).parents[1]
    (tmp_path / "pool_driver.py").write_text((src / "pool" / "driver.py").read_text())
    for name, module in ray_nodes.SHIPPED.items():
        (tmp_path / name).write_text((src / module).read_text())
    (tmp_path / "outputs.tar").write_bytes(_tar([("ok.txt", b"1"), ("../up", b"x")], gz=False).getvalue())
    check = ("import sys, tarfile; import pool_driver as d; assert 'ec2gpu' not in sys.modules, sorted(sys.modules)\n"
             "try:\n    d._unpack(open('outputs.tar', 'rb').read(), 'out/3', 100)\n"
             "except tarfile.TarError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-S", "-c", check], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "1 member(s) refused" in done.stdout and "'../up'" in done.stdout
    assert (tmp_path / "out" / "3" / "ok.txt").read_text() == "1" and not (tmp_path / "out" / "up").exists()
