"""Issue 44 item 3: a record an instance writes nested 50,000 deep (``'[' * 50000 + ']' * 50000``,
100 KB) once ended the command that read it with RecursionError. Through each path it came by, the
command now goes on, says the record was refused in one inert line, and brings home what it can;
the agent on the instance reads what the job or S3 wrote the same way. (The progress file is also
followed through a whole sandbox run: tests/e2e/test_hostile_json.py.)"""
from __future__ import annotations

import io
import json
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from ec2gpu.errors import RemoteError
from ec2gpu.inert import inert
from ec2gpu.remote import jobs

DEEP = b"[" * 50000 + b"]" * 50000  # the issue's: over some paths' size bound too
SMALL = b"[" * 5000 + b"]" * 5000  # 10 KB, under every bound: refused for its depth alone
#: (document, why it is refused): each path is tried with both
DOCUMENTS = pytest.mark.parametrize("doc, why", [(DEEP, r"(nested deeper than 64 levels|over [0-9,]+ bytes|bytes, more than)"),
                                                 (SMALL, "nested deeper than 64 levels")], ids=["100KB", "10KB"])
REFUSED = "nested deeper than 64 levels"
RUN = "20261125-103000-1a2b"
USER = "AIDAEXAMPLEUSER00001"  # the caller's STS UserId: the run store's prefix (aws/runstore.user_id)


def one_inert_line(said: list[str], why: str) -> str:
    """The one line of ``said`` that says ``why`` (a regular expression), checked to be a single inert line."""
    (line,) = [s for s in said if re.search(why, s)]
    assert "\n" not in line and inert(line) == line
    return line


class Remote:
    """The files of an instance's run directory, read as remote/jobs.read_from reads them."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.reads = files, []

    def read_from(self, conn, path, offset, limit=jobs.CHUNK_BYTES):
        self.reads.append(path)
        return self.files.get(path.rsplit("/", 1)[-1], b"")[offset:offset + limit]


# --- the progress file ($EC2GPU_PROGRESS_FILE), followed while `ec2gpu run` shows the log ----------

@DOCUMENTS
def test_a_deep_progress_file_is_said_once_and_the_progress_after_it_still_shown(monkeypatch, doc, why):
    from ec2gpu.runs.execute import nodes
    remote = Remote({"progress.json": doc})
    monkeypatch.setattr(jobs, "read_from", remote.read_from)
    shown, said = [], []
    reader = nodes.ProgressReader("/home/u/ec2gpu/runs/r", shown.append, said.append, every_s=0.0)
    for _ in range(5):  # every poll, one line in all
        reader(object())
    assert shown == [] and len(remote.reads) == 5
    assert "progress.json" in one_inert_line(said, why)
    remote.files["progress.json"] = b'{"done": 3, "total": 10}'
    reader(object())
    assert shown == [{"done": 3, "total": 10}] and len(said) == 1


def test_a_progress_file_caught_half_written_is_skipped_without_a_word(monkeypatch):
    from ec2gpu.runs.execute import nodes
    monkeypatch.setattr(jobs, "read_from", Remote({"progress.json": b'{"done": 3, "to'}).read_from)
    said = []
    nodes.ProgressReader("/r", lambda p: None, said.append, every_s=0.0)(object())
    assert said == []


# --- the pool driver's table.json, read every poll while an array runs --------------------------

def _pool(**over):
    element = {"index": 0, "status": "running", "attempts": 1, "node": "10.0.0.1", "nodes": ["10.0.0.1"],
               "tail": []}
    return json.dumps({"schema": 1, "final": False, "counts": {"done": 0, "failed": 0, "running": 1, "queued": 0},
                       "nodes": {"10.0.0.1": 1}, "elements": [{**element, **over}]}).encode()


@pytest.mark.parametrize("record", [DEEP, _pool(tail=["[LIST]"]).replace(b'"[LIST]"', DEEP)],
                         ids=["the-whole-file", "inside-an-element"])
def test_a_deep_pool_status_is_said_once_and_the_array_goes_on(monkeypatch, record):
    """The status is bounded at 16 MiB: the 100 KB document is refused for its depth."""
    from ec2gpu.pool import follow
    remote = Remote({"table.json": record})
    monkeypatch.setattr(jobs, "read_from", remote.read_from)
    ui = SimpleNamespace(notes=[])
    ui.note = ui.notes.append
    head = SimpleNamespace(conn=object(), run_dir="/home/u/ec2gpu/runs/r")
    opts = SimpleNamespace(elements=[SimpleNamespace(as_dict=lambda: {"index": 0, "params": {}})],
                           task=SimpleNamespace(secret_values=[]))
    assert [follow.read_status(head, opts, ui) for _ in range(3)] == [None] * 3
    assert "pool's status not accepted" in one_inert_line(ui.notes, REFUSED)
    remote.files["table.json"] = _pool()  # the driver writes it again: read as ever
    assert follow.read_status(head, opts, ui)["counts"]["running"] == 1 and len(ui.notes) == 1


# --- the hand-over record, brought home by `ec2gpu fetch` (and by a controller back from sleep) ----

@pytest.fixture
def aws():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="ec2gpu-123456789012-us-east-1")
        yield SimpleNamespace(client=lambda name: s3, region="us-east-1", s3=s3,
                              check_credentials=lambda: {"Account": "123456789012", "UserId": USER})


@DOCUMENTS
def test_a_deep_handed_over_record_is_refused_and_the_outputs_and_log_still_come_home(aws, tmp_path, doc, why):
    from ec2gpu.aws import runstore
    from ec2gpu.remote.files import Limits
    from ec2gpu.runs.recover import handover
    keys, bucket = runstore.handover_keys(USER, RUN), "ec2gpu-123456789012-us-east-1"
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        info = tarfile.TarInfo("model.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"42\n"))
    aws.s3.put_object(Bucket=bucket, Key=keys["outputs"], Body=packed.getvalue())
    aws.s3.put_object(Bucket=bucket, Key=keys["log"], Body=b"epoch 1\n")
    aws.s3.put_object(Bucket=bucket, Key=keys["record"], Body=doc)
    said = []
    got = handover.fetch(aws, RUN, tmp_path / "out", Limits(), said.append)
    assert got["outputs"] == ["model.txt"] and (tmp_path / "out" / "outputs" / "model.txt").read_bytes() == b"42\n"
    assert (tmp_path / "out" / "job.log").read_bytes() == b"epoch 1\n"
    assert got["state"] == "unreadable" and "handed-over agent-record.json is not accepted" in one_inert_line(said, why)
    assert handover.handed(aws, RUN)["state"] == "unreadable"  # `ec2gpu status` of the run: the same record


# --- secret_names.json, read by `ec2gpu logs` to mask the job's secrets in its log ---------------

@DOCUMENTS
def test_a_deep_secret_names_file_is_said_and_the_log_still_shown(monkeypatch, doc, why):
    from ec2gpu.runs.execute import logs
    remote = Remote({"agent-record.json": b'{"state": "running"}', "secret_names.json": doc,
                     "job.env.json": b'{"TOKEN": "s3cr3t"}', "job.log": b"line 1\nline 2\n"})
    monkeypatch.setattr(jobs, "read_from", remote.read_from)
    monkeypatch.setattr(jobs, "remote_run_dir", lambda conn, run_id: f"/home/u/ec2gpu/runs/{run_id}")
    monkeypatch.setattr(logs, "run_id_on", lambda home, inst: RUN)
    monkeypatch.setattr(logs, "_open", lambda ctx, inst, note: (SimpleNamespace(close=lambda: None), None))
    written, said = [], []
    ctx = SimpleNamespace(settings=SimpleNamespace(home=Path("/nowhere")))
    assert logs.stream(ctx, SimpleNamespace(id="i-0123456789abcdef0"), False, written.append, said.append) == (None, RUN, None)
    assert b"".join(written) == b"line 1\nline 2\n"
    assert "secret_names.json" in one_inert_line(said, why)


@DOCUMENTS
def test_a_deep_job_env_file_is_said_and_no_secret_taken_from_it(monkeypatch, doc, why):
    from ec2gpu.runs.execute import logs
    monkeypatch.setattr(jobs, "read_from", Remote({"secret_names.json": b'["TOKEN"]', "job.env.json": doc}).read_from)
    said = []
    assert logs.secret_values(object(), "/r", said.append) == []
    assert "job.env.json" in one_inert_line(said, why)


# --- the notebook's reply line (its instance-side script's one JSON line) -------------------------

@DOCUMENTS
def test_a_deep_notebook_reply_is_refused_in_one_line(doc, why):
    from ec2gpu.runs.standing import notebook
    with pytest.raises(RemoteError) as got:
        notebook._server_record(doc.decode())
    assert re.fullmatch(f"the instance's answer about its JupyterLab is not one ec2gpu's script gives "
                        f"\\(refused: {why}\\)", str(got.value))


# --- the agent, on the instance: what the job, torchrun, the metadata service or S3 wrote ---------

def test_the_agent_takes_a_deep_error_file_or_pool_table_as_none(tmp_path):
    from ec2gpu.agent import agent
    (tmp_path / "error.json").write_bytes(b'{"message": ' + DEEP + b"}")
    (tmp_path / "table.json").write_bytes(b'{"counts": ' + DEEP + b"}")
    assert agent.root_cause(str(tmp_path / "error.json")) is None
    assert agent.array_counts(str(tmp_path / "table.json")) is None
    (tmp_path / "handover.json").write_bytes(DEEP)
    with pytest.raises(ValueError, match=REFUSED):  # as a handover file that is not JSON: the agent does not start
        agent.read_handover(str(tmp_path / "handover.json"))


def test_the_agent_leaves_out_a_deep_metadata_item():
    from ec2gpu.agent import agent

    class Imds(BaseHTTPRequestHandler):
        def do_PUT(self):
            self._send(b"token")

        def do_GET(self):
            self._send(DEEP if self.path == agent.SPOT_ACTION else b'{"noticeTime": "2026-11-25T10:00:00Z"}')

        def _send(self, body):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Imds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = agent.metadata(f"http://127.0.0.1:{server.server_address[1]}", [agent.SPOT_ACTION, agent.REBALANCE])
    finally:
        server.shutdown()
        server.server_close()
    assert got == {agent.REBALANCE: {"noticeTime": "2026-11-25T10:00:00Z"}}


def test_a_detached_agent_refuses_a_deep_object_from_s3_as_it_refuses_one_not_json():
    from ec2gpu.agent import store as agent_store
    from ec2gpu.wire import names, run_spec
    s3 = SimpleNamespace(get_object=lambda **kw: {"Body": io.BytesIO(DEEP), "ETag": '"e"'})
    store = agent_store.Store(s3, "b", USER, RUN)
    with pytest.raises(names.Refused, match=f"spec.json: {REFUSED}"):
        store.get_json("spec.json", run_spec.MAX_BYTES)


def test_file_mounts_and_the_notebook_on_the_instance_take_a_deep_record_as_none(tmp_path):
    from ec2gpu.agent import notebook, s3files
    target = tmp_path / "data"
    target.mkdir()
    (target / "a.txt").write_text("a")
    (tmp_path / "record.json").write_bytes(DEEP)
    sent = []
    s3 = SimpleNamespace(upload_file=lambda path, bucket, key: sent.append(key))
    m = {"target": str(target), "bucket": "b", "prefix": "p/", "record": str(tmp_path / "record.json")}
    assert s3files._write_back(s3, m)["files"] == 1 and sent == ["p/a.txt"]  # no record: all of it sent
    (tmp_path / "server.json").write_bytes(DEEP)
    (tmp_path / "token").write_text("t")
    assert notebook.recorded(str(tmp_path)) is None
