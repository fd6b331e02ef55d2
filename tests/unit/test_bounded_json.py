"""The one bounded JSON reader (ec2gpu/wire/bounded_json.py, issue 44 item 3): what it refuses and
how it says so, that nothing else in the package parses JSON but a short list of modules whose input
is this machine's own, and that the agent finds it beside itself wherever it is shipped."""
from __future__ import annotations

import ast
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ec2gpu.agent import agent
from ec2gpu.wire import agent_record, bounded_json

PACKAGE = Path(bounded_json.__file__).resolve().parents[1]
DEEP = "[" * 50000 + "]" * 50000  # 100 KB: Python's parser recursed once per level into RecursionError


@pytest.mark.parametrize("data", [DEEP, DEEP.encode(), '{"a": ' * 5000 + "1" + "}" * 5000])
def test_a_document_nested_past_the_recursion_limit_is_refused_as_a_value_error(data):
    with pytest.raises(bounded_json.Refused, match="^nested deeper than 64 levels$") as got:
        bounded_json.loads(data, max_bytes=200_000)
    assert isinstance(got.value, ValueError) and got.value.reason == bounded_json.TOO_DEEP


def test_depth_is_counted_without_recursion_below_the_parsers_limit():
    """65 levels parse without RecursionError: the depth is measured after, iteratively."""
    value = bounded_json.loads("[" * 64 + "]" * 64, max_bytes=1000)  # 64 levels: the default's most
    for _ in range(63):
        (value,) = value
    assert value == []
    assert bounded_json.loads('{"a": [1, {"b": []}]}', max_bytes=100, max_depth=4) == {"a": [1, {"b": []}]}
    for text, depth in (("[" * 65 + "]" * 65, 64), ('{"a": [1, {"b": []}]}', 3), ("[[], [[[]]]]", 3)):
        with pytest.raises(bounded_json.Refused, match=f"nested deeper than {depth} levels"):
            bounded_json.loads(text, max_bytes=1000, max_depth=depth)
    assert bounded_json.loads("3", max_bytes=1, max_depth=0) == 3  # a scalar is no level


def test_size_is_counted_in_utf8_bytes_for_text_and_bytes():
    assert bounded_json.loads(b'"abc"', max_bytes=5) == "abc"
    for data in (b'"abcd"', '"abcd"', '"\u00e9\u00e9"'):  # é is two bytes: '"éé"' is six
        with pytest.raises(bounded_json.Refused, match="^over 5 bytes$") as got:
            bounded_json.loads(data, max_bytes=5)
        assert got.value.reason == bounded_json.TOO_LARGE
    with pytest.raises(bounded_json.Refused, match="over 65,536 bytes"):
        bounded_json.loads(b" " * 65537, max_bytes=65536)


@pytest.mark.parametrize("data, says", [
    (b"{nope", r"not JSON \(line 1, column 2\)"), (b"\xff\xfe", r"not JSON \(not UTF-8 text\)"),
    (b'{"a": NaN}', "not JSON: NaN is not a number"), (b"[Infinity]", "not JSON: Infinity is not a number"),
    (b"-Infinity", "not JSON: -Infinity is not a number"), (b"1e999", "not JSON: a number out of range"),
    (b"9" * 5000, "not JSON: a number out of range"), (b"", r"not JSON \(line 1, column 1\)"),
])
def test_what_is_not_json_is_said_in_plain_words(data, says):
    with pytest.raises(bounded_json.Refused, match=says) as got:
        bounded_json.loads(data, max_bytes=10_000)
    assert got.value.reason == bounded_json.NOT_JSON


def test_nan_and_infinity_only_where_a_caller_asks():
    got = bounded_json.loads(b'[NaN, Infinity, 1.5]', max_bytes=100, allow_nan=True)
    assert got[0] != got[0] and got[1] == float("inf") and got[2] == 1.5


def test_a_file_is_read_one_byte_past_the_limit_and_no_more(tmp_path, monkeypatch):
    asked = []
    real_open = open

    class Recorded:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, size=-1):
            asked.append(size)
            return self.f.read(size)
    monkeypatch.setattr(bounded_json, "open", lambda *a, **k: Recorded(real_open(*a, **k)), raising=False)
    (tmp_path / "big.json").write_bytes(b"[1]" + b" " * 1_000_000)
    (tmp_path / "ok.json").write_bytes(b'{"a": 1}')
    with pytest.raises(bounded_json.Refused, match="over 100 bytes"):
        bounded_json.read(str(tmp_path / "big.json"), max_bytes=100)
    assert asked == [101]
    assert bounded_json.read(str(tmp_path / "ok.json"), max_bytes=100) == {"a": 1}


def test_the_reader_is_standard_library_only_and_imports_nothing_of_the_package():
    """It is shipped as a flat file beside the agent (which runs on the image's Python)."""
    tree = ast.parse(Path(bounded_json.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert imported <= {"__future__", "errno", "json", "math", "os", "stat", "typing"}


# --- the source check: nothing else parses JSON -------------------------------------------------

#: modules that parse JSON themselves, and why their input is trusted. Everything else that reads
#: JSON reads it through bounded_json: what an instance, a job, S3 or the network wrote.
TRUSTED = {
    "wire/bounded_json.py": "the reader itself: json.loads within its limits",
    "sandbox/imds.py": "the sandbox's own control request (/control/interrupt: `ec2gpu sandbox interrupt`, the "
                       "tests); the sandbox runs its instances' jobs as this user on this machine: no boundary",
    "sandbox/server.py": "moto's bundled AMI list, the sandbox's own control requests, its own environment",
    "sandbox/control.py": "the sandbox's state.json in the tool's home, and its own control endpoint's answers",
    "sandbox/guest.py": "the sandbox's answer to its shutdown stand-in",
    "sandbox/tls.py": "a bucket policy as moto keeps it: the one this tool put (runstore.bucket_policy)",
    "sandbox/roles.py": "a role's trust policy as moto keeps it (made by this tool's or the user's own IAM call)",
    "aws/pricing.py": "AWS's Price List API answers (botocore: signed, over TLS), never an instance's",
    "aws/iam_boundary.py": "the account's permissions boundary, from IAM's GetPolicyVersion (the account admin's)",
    "aws/catalog.py": "the price cache this tool wrote in its home (`ec2gpu prices --refresh`)",
    "runs/settle/ledger.py": "the ledger's JSON columns, which this tool wrote into its own SQLite file (a job's "
                             "summary in it is checked again: job_summary.from_ledger)",
    "train/bench.py": "the summary.json the bench's own trainer wrote a moment ago in this process; train/ "
                      "travels to instances without wire/",
    "pool/driver.py": "on the pool's head among the job's own elements, as their user: the files the controller "
                      "put there (pool.json, job.env.json); a job that rewrites them harms its own run only, and "
                      "what the driver writes the controller reads through bounded_json (runs/element_table.py)",
}
#: json's parsing entry points, however reached
PARSERS = {"load", "loads", "JSONDecoder", "raw_decode", "scanner", "decoder"}


def json_parsers(source: str) -> list[str]:
    """Where ``source`` (a module's text) reaches json's parser: ``json.loads`` and ``json.load``
    (called or passed on), ``json.JSONDecoder``, a name imported from json or json.decoder."""
    tree = ast.parse(source)
    json_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                  if a.name in ("json", "json.decoder")} | {"json"}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in json_names \
                and node.attr in PARSERS:
            out.append(f"line {node.lineno}: json.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("json", "json.decoder", "json.scanner") \
                and not node.level:
            out += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names
                    if a.name in PARSERS or node.module != "json"]
    return out


def test_the_source_check_finds_each_way_to_reach_jsons_parser():
    for source in ("import json\njson.loads(b)", "import json\nf = json.load", "import json as j\nj.loads(b)",
                   "from json import loads", "from json import JSONDecoder as D", "import json\njson.JSONDecoder()",
                   "from json.decoder import JSONDecoder", "import json\njson.decoder.scanstring"):
        assert json_parsers(source), source
    assert not json_parsers("import json\njson.dumps(x)\nbounded_json.loads(b, max_bytes=1)\nfrom json import dumps")


def test_no_module_parses_json_but_through_the_bounded_reader_or_on_the_trusted_list():
    found = {str(p.relative_to(PACKAGE)): json_parsers(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    offences = {path: lines for path, lines in found.items() if lines and path not in TRUSTED}
    assert not offences, f"read JSON from outside through ec2gpu.wire.bounded_json, or say why it is trusted: {offences}"
    assert not [path for path in TRUSTED if not found.get(path)], "a trusted entry that parses no JSON any more"
    assert all(len(why) > 20 for why in TRUSTED.values())


# --- shipped beside the agent -------------------------------------------------------------------

def test_a_detached_runs_agent_files_carry_the_reader_from_wire():
    from ec2gpu.runs.detached import launch
    assert "bounded_json.py" in launch.AGENT_FILES
    sources = {name: launch.agent_source(name) for name in launch.AGENT_FILES}
    assert sources["bounded_json.py"] == Path(bounded_json.__file__) and all(p.is_file() for p in sources.values())
    hashes = launch.agent_hashes()  # checked on the instance before any of it runs, the reader too
    assert hashes["bounded_json.py"] == hashlib.sha256(Path(bounded_json.__file__).read_bytes()).hexdigest()
    boot = launch.boot_script("b", "AIDAEXAMPLEUSER0001", "20260125-103000-ffff", "us-east-1", "g", hashes, "0" * 64)
    assert '"runs/AIDAEXAMPLEUSER0001/20260125-103000-ffff/agent/"' in boot  # each file's key: the prefix and its name
    assert f'"bounded_json.py": "{hashes["bounded_json.py"]}"' in boot


FLAT = """
import importlib.util, sys
d = sys.argv[1]
sys.path.insert(0, d)
import agent, detached, s3files
spec = importlib.util.spec_from_file_location("server", d + "/server.py")
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
print(agent.bounded_json.__file__, detached.store.bounded_json.__file__, s3files.bounded_json.__file__,
      server.bounded_json.__file__, "ec2gpu" in sys.modules)
"""


def test_the_shipped_agent_imports_the_reader_beside_it_without_the_package(tmp_path):
    """As on an instance: the files flat in one directory, Python without site-packages (-S: no
    ec2gpu, no boto3), each script imports bounded_json.py from its own directory."""
    from ec2gpu.runs.detached import launch
    from ec2gpu.runs.standing import notebook
    for name in launch.AGENT_FILES:
        shutil.copy(launch.agent_source(name), tmp_path / name)
    shutil.copy(notebook.SERVER_SCRIPT, tmp_path / "server.py")
    got = subprocess.run([sys.executable, "-S", "-c", FLAT, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(tmp_path / "bounded_json.py")] * 4 + ["False"]


def test_agent_py_loaded_from_its_file_finds_the_reader_beside_it(tmp_path):
    """pool/node.py loads RUN_DIR/agent.py by its path (end_instance), with RUN_DIR not on sys.path."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "ray"
    run_dir.mkdir()
    elsewhere.mkdir()
    shutil.copy(PACKAGE / "agent" / "agent.py", run_dir)
    shutil.copy(bounded_json.__file__, run_dir)
    shutil.copy(agent_record.__file__, run_dir)  # its record's schema, shipped beside it too (agent.BESIDE)
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('ec2gpu_agent', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); print(m.bounded_json.__file__)")
    got = subprocess.run([sys.executable, "-S", "-c", code, str(run_dir / "agent.py")], capture_output=True, text=True,
                         cwd=elsewhere, timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == str(run_dir / "bounded_json.py"), got.stderr


def test_agent_py_run_from_the_source_tree_takes_the_reader_from_wire():
    """runs/provision/local.py (ec2gpu run --local) and the detached agent's tests run agent.py where it lies."""
    got = subprocess.run([sys.executable, "-S", str(PACKAGE / "agent" / "agent.py"), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0 and "--dir" in got.stdout, got.stderr


def test_a_fifo_a_device_or_a_link_not_to_be_followed_is_refused_at_once(tmp_path):
    """Review of issue 44 (round 3): read() opened whatever was at the path, and a FIFO's open waits
    for a writer for ever (the torchrun error file and a pool's status.json, which the agent reads,
    are paths the job controls). Now it opens without waiting and refuses what is no regular file."""
    fifo = tmp_path / "error.json"
    os.mkfifo(fifo)
    got: list = []

    def read() -> None:
        try:
            got.append(bounded_json.read(str(fifo), max_bytes=100))
        except Exception as exc:  # noqa: BLE001 - what it raised is the test's
            got.append(exc)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # before the fix: blocked in open(); a writer lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
        pytest.fail("reading a FIFO waited for a writer")
    assert isinstance(got[0], bounded_json.Refused) and got[0].reason == bounded_json.NOT_A_FILE
    assert str(got[0]) == "not a regular file (a FIFO)"
    with pytest.raises(bounded_json.Refused, match=r"^not a regular file \(a device\)$"):
        bounded_json.read("/dev/zero", max_bytes=100)
    with pytest.raises(bounded_json.Refused, match=r"^not a regular file \(a directory\)$"):
        bounded_json.read(str(tmp_path), max_bytes=100)
    (tmp_path / "real.json").write_text('{"a": 1}')
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert bounded_json.read(str(tmp_path / "link.json"), max_bytes=100) == {"a": 1}  # followed unless asked
    with pytest.raises(bounded_json.Refused, match=r"^not a regular file \(a symbolic link\)$"):
        bounded_json.read(str(tmp_path / "link.json"), max_bytes=100, follow=False)
    # the agent's readers of job-controlled paths: no record, at once
    assert agent.root_cause(str(fifo)) is None and agent.array_counts(str(fifo)) is None
    assert agent.root_cause(str(tmp_path / "link.json")) is None
