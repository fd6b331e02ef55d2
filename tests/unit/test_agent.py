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
