"""The instance agent: status.json for success, failure and a spot interruption notice."""
import http.server
import json
import sys
import threading
from pathlib import Path

from ec2gpu.agent import agent


def run_agent(tmp_path, command, endpoint="http://127.0.0.1:9", env=None):
    code = agent.run(str(tmp_path), command, endpoint, poll_s=0.1, grace_s=2.0, env=env)
    return code, json.loads((tmp_path / "status.json").read_text()), (tmp_path / "job.log").read_text()


def test_success_and_failure_are_recorded_with_the_exit_code(tmp_path):
    code, st, log = run_agent(tmp_path, ["bash", "-c", "echo $GREETING"], env={"GREETING": "hello"})
    assert (code, st["state"], st["exit_code"]) == (0, "succeeded", 0) and log == "hello\n"
    code, st, _ = run_agent(tmp_path, ["bash", "-c", "exit 7"])
    assert (code, st["state"], st["exit_code"]) == (7, "failed", 7) and st["ended_at"]
    code, st, _ = run_agent(tmp_path, ["bash", "-c", "kill -9 $$"])
    assert (code, st["state"], st["signal"]) == (137, "failed", 9)


def test_a_spot_notice_stops_the_job_and_says_interrupted(tmp_path):
    class Imds(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):
            self._send(200, b"token")

        def do_GET(self):
            ok = self.headers.get("X-aws-ec2-metadata-token") == "token"
            self._send(200 if ok else 401, json.dumps({"action": "terminate", "time": "2026-11-22T10:00:00Z"}).encode())

        def _send(self, status, body):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Imds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, st, _ = run_agent(tmp_path, [sys.executable, "-c", "import time; time.sleep(30)"],
                                f"http://127.0.0.1:{server.server_address[1]}")
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

    from ec2gpu.runs import engine
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
