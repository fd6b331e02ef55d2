"""The instance agent: its record (agent-record.json) for success, failure and a spot interruption notice."""
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from ec2gpu.agent import agent
from ec2gpu.wire import agent_record


def run_agent(tmp_path, command, endpoint="http://127.0.0.1:9", env=None):
    code = agent.run(str(tmp_path), command, endpoint, poll_s=0.1, grace_s=2.0, env=env)
    return code, json.loads((tmp_path / "agent-record.json").read_text()), (tmp_path / "job.log").read_text()


def test_success_and_failure_are_recorded_with_the_exit_code(tmp_path):
    code, st, log = run_agent(tmp_path, ["bash", "-c", "echo $GREETING"], env={"GREETING": "hello"})
    assert (code, st["state"], st["exit_code"]) == (0, "succeeded", 0) and log == "hello\n"
    code, st, _ = run_agent(tmp_path, ["bash", "-c", "exit 7"])
    assert (code, st["state"], st["exit_code"]) == (7, "failed", 7) and st["ended_at"]
    code, st, _ = run_agent(tmp_path, ["bash", "-c", "kill -9 $$"])
    assert (code, st["state"], st["signal"]) == (137, "failed", 9)


def test_a_spot_notice_stops_the_job_and_says_interrupted(tmp_path):
    server, endpoint = _serve({"/latest/meta-data/spot/instance-action":
                               json.dumps({"action": "terminate", "time": "2026-11-22T10:00:00Z"})})
    try:
        code, st, _ = run_agent(tmp_path, [sys.executable, "-c", "import time; time.sleep(30)"], endpoint)
    finally:
        server.shutdown()
    assert code == agent.EXIT_NOTICE and st["state"] == "interrupted" and st["signal"] == 15
    assert st["notice"]["action"] == "terminate"


def test_the_python_with_torch_comes_first_on_path(tmp_path):
    code, _, log = run_agent(tmp_path, ["bash", "-c", "command -v python3"],
                             env={"EC2GPU_PYTHON": sys.executable})
    assert code == 0 and log.strip() == str(Path(sys.executable).parent / "python3")


def test_a_torchelastic_error_file_becomes_status_json_error_and_a_stale_one_is_removed(tmp_path):
    from ec2gpu.train.launch import failure_record
    # what ec2gpu.train.launch writes for a worker killed by SIGKILL (torch leaves no file of its own)
    record = failure_record(-9, 1, 1700000000, "Signal 9 (SIGKILL) received by PID 42", None)
    script = f"printf '%s' {json.dumps(json.dumps(record))} > \"$TORCHELASTIC_ERROR_FILE\"; exit 1"
    code, st, _ = run_agent(tmp_path, ["bash", "-c", script])
    assert code == 1 and st["error"] == {"message": "Signal 9 (SIGKILL) received by PID 42", "exit_code": -9,
                                         "rank": 1, "timestamp": "1700000000"}
    # the next job on the same run directory does not inherit it
    code, st, _ = run_agent(tmp_path, ["bash", "-c", "exit 3"])
    assert code == 3 and st["error"] is None


def test_a_worker_own_error_record_keeps_its_message_and_gets_the_exit_code():
    from ec2gpu.train.launch import failure_record
    child = {"message": {"message": "ValueError: bad lr", "extraInfo": {"timestamp": "5"}}}
    got = failure_record(1, 3, 9, "ignored", child)["message"]
    assert (got["message"], got["errorCode"], got["rank"], got["extraInfo"]["timestamp"]) == ("ValueError: bad lr", 1, 3, "5")


def test_the_root_cause_is_the_killed_worker_else_the_earliest_error():
    from types import SimpleNamespace

    from ec2gpu.runs.execute import engine
    nodes = [SimpleNamespace(index=k) for k in range(3)]
    statuses = {0: {"error": {"exit_code": 1, "timestamp": "20", "message": "RuntimeError: peer gone"}},
                1: {"error": {"exit_code": -9, "timestamp": "30", "message": "Signal 9"}},
                2: {"error": None}}
    assert engine.root_cause_node(nodes, statuses).index == 1
    assert engine.worker_failure(statuses[1]["error"]) == " (a worker died of SIGKILL)"
    del statuses[1]
    assert engine.root_cause_node([nodes[0], nodes[2]], statuses).index == 0  # an error beats none
    assert "rank" not in engine.worker_failure(statuses[0]["error"]) and "peer gone" in engine.worker_failure(
        statuses[0]["error"])


def test_the_agent_signs_its_record_with_a_key_the_job_never_sees(tmp_path):
    """Issue 26.6: a process the job left behind rewrote status.json after the agent's last write
    and so changed the reported outcome. Now the controller believes only the agent's signed record."""
    from ec2gpu.runs.execute import status
    key = status.new_key()
    (tmp_path / "agent.key").write_text(key)
    code = agent.main(["--dir", str(tmp_path), "--key-file", str(tmp_path / "agent.key"), "--",
                       "bash", "-c", f"test -e {tmp_path}/agent.key && echo SAW-THE-KEY; exit 3"])
    raw = (tmp_path / "agent-record.json").read_bytes()
    assert code == 3 and not (tmp_path / "agent.key").exists() and "SAW-THE-KEY" not in (tmp_path / "job.log").read_text()
    got = agent_record.parse(raw, key)
    assert (got["state"], got["exit_code"], got["problem"]) == ("failed", 3, None)
    # what a leftover process writes: the agent's own fields, claiming success, unsigned or re-signed with a guess
    forged = {**json.loads(raw), "state": "succeeded", "exit_code": 0}
    assert agent_record.parse(json.dumps(forged).encode(), key)["state"] == "unverified"
    guessed = {**forged, "signature": agent_record.sign(forged, b"guess")}
    assert agent_record.parse(json.dumps(guessed).encode(), key)["state"] == "unverified"


def test_what_the_job_leaves_running_in_its_group_ends_with_it(tmp_path):
    import os
    import time
    start = time.monotonic()
    code, _, _ = run_agent(tmp_path, ["bash", "-c", f"(sleep 60; touch {tmp_path}/late) & echo $! > {tmp_path}/pid"])
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.2)
    assert code == 0 and time.monotonic() - start < 30
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive


def test_any_status_file_parses_to_the_record_shape_and_never_raises():
    for data in (b"[1, 2, 3]", b"garbage", b'{"state": "succeeded", "exit_code": "0"}', b'{"state": "pwned"}',
                 b"[" * 100000, b" " * 70000, b'{"state": "failed", "error": {"timestamp": "soon", "rank": "x"}}',
                 b'{"state": "failed", "exit_code": 1e400, "notice": [1]}', b'{"state": "failed", "limit": [2]}'):
        got = agent_record.parse(data, None)
        assert set(got) == {"state", "exit_code", "signal", "started_at", "ended_at", "notice", "error", "rebalance",
                            "limit", "problem"}
        assert got["exit_code"] is None or isinstance(got["exit_code"], int)
        assert got["error"] is None or got["error"]["timestamp"] is None
    assert agent_record.parse(b"", None) is None


def test_a_failed_job_with_hostile_records_is_judged_failed_not_crashed():
    """Issue 26.6: a torchrun error file with a non-numeric timestamp, or `garbage` in exit_status,
    ended the run with ValueError exit 1 and nothing home; now it is exit 5 with the job's lines."""
    from types import SimpleNamespace

    import pytest

    from ec2gpu.errors import RemoteError
    from ec2gpu.remote import jobs
    from ec2gpu.runs.execute import engine, status
    records = [agent_record.parse(b'{"state": "failed", "exit_code": 1, "error": {"timestamp": "soon", "exit_code": 1}}', None),
               agent_record.parse(b'{"state": "failed", "exit_code": 2, "error": {"timestamp": "12", "exit_code": 2}}', None),
               agent_record.parse(b'{"state": "succeeded"}', status.new_key())]

    class Watch:
        def check(self):
            return None
    nodes = [SimpleNamespace(index=k, result=255, status=r, watch=Watch(), conn=None, run_dir="/r", instance_id=f"i-{k}",
                             host="h") for k, r in enumerate(records)]
    job = SimpleNamespace(task=SimpleNamespace(run="x"), secret_values=[])
    tails = []
    orig = jobs.tail
    jobs.tail = lambda conn, path, lines=20: tails.append(path) or "last line"
    try:
        with pytest.raises(RemoteError) as exc:
            engine.judge(nodes, job)
    finally:
        jobs.tail = orig
    assert exc.value.exit_code == 5 and "node 1" in exc.value.message and "exited 2" in exc.value.message
    assert "node 2" in exc.value.message  # the unsigned record is a failure too
    assert exc.value.tail == "last line"
    assert engine.root_cause_node(nodes[:1], {0: {"error": {"timestamp": "soon"}}}).index == 0


def test_garbage_in_exit_status_reads_as_an_unknown_failure():
    from ec2gpu.remote import jobs
    for data, want in ((b"garbage\n", 255), (b"3\n", 3), (b"", None), (b"  \n", None), (b"99999999999", 255)):
        conn = type("C", (), {})()
        orig = jobs.read_from
        jobs.read_from = lambda c, path, offset, limit=0, data=data: data
        try:
            assert jobs.exit_status(conn, "/r") == want
        finally:
            jobs.read_from = orig


class _Imds(http.server.BaseHTTPRequestHandler):
    """IMDSv2 (token required) publishing what ``items`` holds: {path: JSON body}; 404 otherwise."""

    items: dict = {}

    def do_PUT(self):
        self._send(200, b"token")

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != "token":
            return self._send(401, b"")
        body = self.items.get(self.path)
        self._send(404, b"") if body is None else self._send(200, body.encode())

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


def _serve(items: dict):
    handler = type("Imds", (_Imds,), {"items": items})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_rebalance_recommendation_reaches_the_job_as_a_file_and_status_json_and_the_job_goes_on(tmp_path):
    """Issue 27.23: the agent watched only the two-minute notice. EC2's rebalance recommendation
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html) now reaches
    the job as $EC2GPU_REBALANCE_FILE, which it can poll to checkpoint early; it is not stopped."""
    server, endpoint = _serve({agent.REBALANCE: '{"noticeTime": "2026-11-22T10:00:00Z"}'})
    job = ('for i in $(seq 100); do [ -f "$EC2GPU_REBALANCE_FILE" ] && break; sleep 0.1; done; '
           'cat "$EC2GPU_REBALANCE_FILE"; echo; echo checkpointed early')
    (tmp_path / "rebalance.json").write_text("{}")  # a previous job's: removed before this one starts
    try:
        code, st, log = run_agent(tmp_path, ["bash", "-c", job], endpoint)
    finally:
        server.shutdown()
    assert code == 0 and st["state"] == "succeeded" and st["notice"] is None
    assert st["rebalance"]["notice_time"] == "2026-11-22T10:00:00Z" and st["rebalance"]["seen_at"]
    told = json.loads(log.splitlines()[0])
    assert told == st["rebalance"] and "checkpointed early" in log
    assert agent_record.parse((tmp_path / "agent-record.json").read_bytes(), None)["rebalance"] == st["rebalance"]


def test_without_a_recommendation_there_is_no_rebalance_file(tmp_path):
    code, st, log = run_agent(tmp_path, ["bash", "-c", 'test -e "$EC2GPU_REBALANCE_FILE" && echo THERE; '
                                                      'echo "$EC2GPU_REBALANCE_FILE"'])
    assert code == 0 and st["rebalance"] is None and "THERE" not in log
    assert log.strip() == str(tmp_path / "rebalance.json")


def test_the_trainers_own_watcher_sees_a_rebalance_recommendation_and_keeps_watching(monkeypatch):
    """The built-in trainer without the agent (train/spot.py): the recommendation sets ``rebalance``,
    not ``notice``; the notice, when it comes, still does."""
    from ec2gpu.train import spot
    items = {agent.REBALANCE: '{"noticeTime": "2026-11-22T10:00:00Z"}'}
    server, endpoint = _serve(items)
    monkeypatch.setenv("EC2GPU_IMDS_ENDPOINT", endpoint)
    watcher = spot.SpotWatcher(poll_seconds=0.05, log=lambda line: None)
    try:
        assert watcher.start_if_available()
        assert watcher.rebalance.wait(10) and not watcher.notice.is_set()
        items[agent.SPOT_ACTION] = '{"action": "terminate", "time": "2026-11-22T10:02:00Z"}'
        assert watcher.notice.wait(10)
    finally:
        watcher.stop()
        server.shutdown()


def test_the_sandbox_metadata_service_publishes_a_rebalance_recommendation_for_spot_instances_only():
    from ec2gpu.sandbox import imds
    meta = imds.Metadata(terminate=lambda iid: None)
    find = {"i-spot": ("running", "spot"), "i-od": ("running", "on-demand")}.get
    token = meta.new_token()

    def get(iid):
        return imds.handle(meta, "GET", f"/{iid}/latest/meta-data/events/recommendations/rebalance",
                           {"X-aws-ec2-metadata-token": token}, b"", find)
    assert get("i-spot")[0] == 404  # none yet, as on EC2
    done = imds.handle(meta, "POST", "/control/interrupt", {}, json.dumps({"instance_id": "i-spot", "rebalance": True})
                       .encode(), find)
    assert done[0] == 200 and json.loads(done[2])["rebalance"]["noticeTime"]
    code, _, body = get("i-spot")
    assert code == 200 and json.loads(body) == json.loads(done[2])["rebalance"]
    spot_action = imds.handle(meta, "GET", "/i-spot/latest/meta-data/spot/instance-action",
                              {"X-aws-ec2-metadata-token": token}, b"", find)
    assert spot_action[0] == 404  # a recommendation only: no notice, no termination
    refused = imds.handle(meta, "POST", "/control/interrupt", {}, json.dumps({"instance_id": "i-od", "rebalance": True})
                          .encode(), find)
    assert refused[0] == 400 and "spot instances only" in json.loads(refused[2])["error"]


class _Puts(http.server.BaseHTTPRequestHandler):
    """A stand-in for S3's presigned PUTs: each body kept by its path; /refuse answers 403."""
    got: dict = {}

    def do_PUT(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/refuse"):
            self.send_response(403)
        else:
            type(self).got[self.path] = body
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _put_server():
    _Puts.got = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Puts)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _handover(base, wait_s=0.3, names=("outputs", "log", "record"), shutdown=False):
    return {"urls": {n: f"{base}/{n}" for n in names}, "wait_s": wait_s, "shutdown": shutdown,
            "secret_names": ["TOKEN"]}


def test_a_job_whose_controller_is_gone_hands_its_outputs_log_and_status_over_masked(tmp_path):
    import io
    import tarfile
    server, base = _put_server()
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere").write_text("not an output")
    job = ("mkdir -p $EC2GPU_OUTPUT_DIR/sub && echo 0.99 > $EC2GPU_OUTPUT_DIR/sub/acc.txt && "
           "ln -s ../elsewhere $EC2GPU_OUTPUT_DIR/link && echo token is $TOKEN")
    try:
        code = agent.run(str(tmp_path), ["bash", "-c", job], "http://127.0.0.1:9", 0.1, 2.0,
                         {"TOKEN": "s3cr3t-value", "EC2GPU_OUTPUT_DIR": str(out)}, b"k" * 32,
                         handover=_handover(base))
    finally:
        server.shutdown()
    assert code == 0
    with tarfile.open(fileobj=io.BytesIO(_Puts.got["/outputs"]), mode="r:gz") as tar:
        assert tar.getnames() == ["sub/acc.txt"]  # the symbolic link is not followed nor sent
        assert tar.extractfile("sub/acc.txt").read() == b"0.99\n"
    assert _Puts.got["/log"] == b"token is ****\n"  # the secret's value never leaves the instance
    sent = json.loads(_Puts.got["/record"])
    assert sent["state"] == "succeeded" and sent["handover"] == "uploaded"
    assert sent["signature"] == agent_record.sign(sent, b"k" * 32)
    assert json.loads((tmp_path / "agent-record.json").read_text())["handover"] == "uploaded"
    assert not (tmp_path / ".handover-outputs.tar.gz").exists()


def test_an_arrays_driver_hands_its_element_table_and_logs_over_masked_before_its_record(tmp_path):
    import io
    import tarfile
    server, base = _put_server()
    (tmp_path / "pool" / "logs").mkdir(parents=True)
    secret = 's3cr3t "é" value'  # as the driver's json.dump writes it: \" and \u00e9
    (tmp_path / "pool" / "table.json").write_text(json.dumps({"counts": {"done": 3, "failed": 1, "queued": "x"},
                                                               "elements": [{"tail": [f"token is {secret}"]}]}))
    (tmp_path / "pool" / "logs" / "3.log").write_text(f"token is {secret}\n")
    try:
        code = agent.run(str(tmp_path), ["bash", "-c", "true"], "http://127.0.0.1:9", 0.1, 2.0,
                         {"TOKEN": secret, "EC2GPU_OUTPUT_DIR": str(tmp_path / "out")}, None,
                         handover=_handover(base, names=("outputs", "log", "pool", "record")))
    finally:
        server.shutdown()
    assert code == 0
    with tarfile.open(fileobj=io.BytesIO(_Puts.got["/pool"]), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["logs/3.log", "table.json"]
        assert tar.extractfile("logs/3.log").read() == b"token is ****\n"
        sent = tar.extractfile("table.json").read()
        assert b"s3cr3t" not in sent and json.loads(sent)["elements"][0]["tail"] == ["token is ****"]
    assert list(_Puts.got)[-1] == "/record" and json.loads(_Puts.got["/record"])["handover"] == "uploaded"
    assert json.loads(_Puts.got["/record"])["array"] == {"done": 3, "failed": 1}  # for `ec2gpu status RUN`
    assert not (tmp_path / ".handover-pool.tar.gz").exists()


def test_a_controller_that_collects_stops_the_handover_and_a_refused_put_is_recorded(tmp_path):
    server, base = _put_server()
    try:
        (tmp_path / agent.COLLECTED).write_text("")  # the controller brought everything home
        agent.run(str(tmp_path), ["bash", "-c", "true"], "http://127.0.0.1:9", 0.1, 2.0, {}, None,
                  handover=_handover(base, wait_s=30))
        assert _Puts.got == {} and json.loads((tmp_path / "agent-record.json").read_text())["handover"] == "collected"
        (tmp_path / agent.COLLECTED).unlink()
        refused = {"urls": {"outputs": f"{base}/refuse", "record": f"{base}/record"}, "wait_s": 0.1,
                   "shutdown": False, "secret_names": []}
        agent.run(str(tmp_path), ["bash", "-c", "true"], "http://127.0.0.1:9", 0.1, 2.0, {}, None, handover=refused)
    finally:
        server.shutdown()
    # an expired URL (403) is not tried again, and what went wrong is in the record handed over (with no
    # instance role to sign it again: the metadata service at 127.0.0.1:9 does not answer)
    assert json.loads(_Puts.got["/record"])["handover"] == "failed: outputs: HTTP 403, and no instance role to sign it again"


def test_the_handover_file_is_read_checked_and_deleted_before_the_job_starts(tmp_path):
    path = tmp_path / "handover.json"
    path.write_text(json.dumps({"urls": {"outputs": "https://b.s3/x?sig", "log": "file:///etc/passwd",
                                         "other": "https://x"}, "wait_s": 5, "shutdown": True,
                                "secret_names": ["A", 3]}))
    got = agent.read_handover(str(path))
    assert got == {"urls": {"outputs": "https://b.s3/x?sig"}, "wait_s": 5.0, "shutdown": True, "secret_names": ["A"]}
    assert not path.exists()


def test_a_log_cut_for_the_handover_starts_at_a_line(tmp_path):
    (tmp_path / "job.log").write_bytes(b"first line with SECRET\n" + b"x" * 50 + b"\nlast SECRET\n")
    assert agent.log_tail(str(tmp_path / "job.log"), ["SECRET"], max_bytes=40) == b"last ****\n"


def test_a_live_controllers_heartbeat_keeps_the_agent_waiting_and_a_silent_one_does_not(tmp_path):
    import os
    import time
    stop = threading.Event()

    def beat():  # the controller's heartbeat (runs/recover/handover.Heartbeat), every 0.1 s
        while not stop.is_set():
            (tmp_path / agent.HEARTBEAT).touch()
            time.sleep(0.1)
    threading.Thread(target=beat, daemon=True).start()
    threading.Timer(1.5, lambda: (tmp_path / agent.COLLECTED).touch()).start()  # collected after 1.5 s
    started = time.monotonic()
    try:
        assert agent.await_collection(str(tmp_path), wait_s=0.5, tick_s=0.05) is True  # waited past wait_s
    finally:
        stop.set()
    assert time.monotonic() - started >= 1.4
    (tmp_path / agent.COLLECTED).unlink()
    old = time.time() - 3600
    os.utime(tmp_path / agent.HEARTBEAT, (old, old))  # silent for an hour: counted from the job's end
    started = time.monotonic()
    assert agent.await_collection(str(tmp_path), wait_s=0.3, tick_s=0.05) is False
    assert 0.25 <= time.monotonic() - started < 2


def test_the_instance_is_ended_by_the_shutdown_first_on_path_never_another(tmp_path, monkeypatch):
    """In the sandbox the stand-in first on PATH must run (sudo's secure_path would find the
    machine's own): the agent names it by its absolute path."""
    stand_in = tmp_path / "shutdown"
    stand_in.write_text(f'#!/bin/sh\necho "$0 $*" > {tmp_path}/called\n')
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(agent.os, "geteuid", lambda: 0)
    agent.end_instance()
    assert (tmp_path / "called").read_text().startswith(f"{stand_in} -h now")
    seen = []
    monkeypatch.setattr(agent.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(agent.subprocess, "run", lambda argv, **kw: seen.append(argv))
    agent.end_instance()
    assert seen[0][:3] == ["sudo", "-n", str(stand_in)]


#: run by the agent as the job: may it open the agent's (its parent's) memory and environment?
PEEK = ('for f in mem environ; do if (exec 3< "/proc/$PPID/$f") 2>/dev/null; then echo "$f: opened"; '
        'else echo "$f: denied"; fi; done; (exec 3< /proc/self/environ) && echo "own: opened"')


def test_a_job_of_the_agents_own_user_cannot_read_the_agents_memory(tmp_path):
    """Review of issue 44 (round 3): a job of the agent's user, not root, read the agent's key from
    /proc/<agent>/mem where Yama's ptrace_scope does not forbid it (reproduced as uid 65534). Now the
    agent makes itself non-dumpable (prctl PR_SET_DUMPABLE 0) before it reads the key: its memory and
    environment are closed to the job. Run as uid 65534 when the tests run as root (root may read any)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl(PR_SET_DUMPABLE) is Linux's")
    as_root = os.geteuid() == 0
    python = "/usr/bin/python3" if as_root else sys.executable  # as nobody: a Python outside root's 0700 home
    if as_root and not os.path.exists(python):
        pytest.skip("no /usr/bin/python3 for uid 65534")
    run_dir = Path(tempfile.mkdtemp(prefix="ec2gpu-undumpable-"))  # not under pytest's 0700 tmp: nobody reaches it
    try:
        if as_root:
            os.chown(run_dir, 65534, 65534)
        who = {"user": 65534, "group": 65534, "extra_groups": []} if as_root else {}
        got = subprocess.run([python, *agent.PYTHON_FLAGS, agent.__file__, "--dir", str(run_dir), "--", "bash", "-c", PEEK],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, **who)
        log = (run_dir / "job.log").read_text()
    finally:
        shutil.rmtree(run_dir)
    assert got.returncode == 0, got.stderr
    assert log.splitlines() == ["mem: denied", "environ: denied", "own: opened"], log
