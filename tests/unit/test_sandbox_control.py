"""`ec2gpu sandbox interrupt|capacity` (sandbox/control.py) against a control endpoint answering as
the sandbox's does (sandbox/imds.handle): a request it cannot do is the user's input, exit 2."""
import http.server
import threading

import pytest

from ec2gpu import cli
from ec2gpu.errors import ExitCode, SandboxError, UsageError
from ec2gpu.sandbox import control, imds


@pytest.fixture
def endpoint(monkeypatch, tmp_path):
    """A control endpoint with no instances (imds.handle) at the sandbox state's imds_url; its
    ``status`` overrides the answer's code where set."""
    meta = imds.Metadata(terminate=lambda iid: None)
    forced: dict = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, ctype, text = imds.handle(meta, "POST", self.path, self.headers, body, lambda iid: None)
            status = forced.get("status", status)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setattr(control, "read_state", lambda home: {"imds_url": f"http://127.0.0.1:{server.server_port}"})
    yield forced
    server.shutdown()
    server.server_close()


def test_interrupting_an_instance_the_sandbox_does_not_have_is_a_usage_error_exit_2(endpoint, capsys):
    assert cli.main(["sandbox", "interrupt", "BAD"]) == ExitCode.USAGE == 2
    said = capsys.readouterr().err
    assert "BAD is not a running sandbox instance" in said and "ec2gpu ls --sandbox" in said
    with pytest.raises(UsageError, match="not a running sandbox instance"):
        control.interrupt(control.Path("."), "i-0123456789abcdef0", 120.0)


def test_a_sandbox_that_fails_otherwise_is_still_a_sandbox_error(endpoint):
    endpoint["status"] = 500
    with pytest.raises(SandboxError) as got:
        control.interrupt(control.Path("."), "i-0123456789abcdef0", 120.0)
    assert not isinstance(got.value, UsageError)
