"""The trainer: outputs, exact resume, spot interruption notice, torchrun with 2 processes (gloo)."""
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")

SUBSET = ["--train-subset", "4096", "--no-plot", "--threads", "1"]


def trainer(out, *args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "ec2gpu.train.mnist", "--out", str(out), *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300, **kw)


def test_outputs_and_summary_fields(mnist_dir, tmp_path):
    progress = tmp_path / "progress.json"
    r = trainer(tmp_path, "--data-dir", str(mnist_dir), "--epochs", "2", "--train-subset", "8192", "--threads", "1",
                "--checkpoint-dir", str(tmp_path / "ckpt"), env={"EC2GPU_PROGRESS_FILE": str(progress)})
    assert r.returncode == 0, r.stdout + r.stderr
    p = json.loads(progress.read_text())  # the controller's progress bar: structured, not log text
    assert p["label"].startswith("epoch ") and p["label"].endswith("/2") and 0 < p["done"] <= p["total"] == 8192 // 128
    assert p["rate"] > 0 and p["rate_unit"] == "samples/s" and p["eta_s"] >= 0
    import torch
    losses = torch.load(tmp_path / "ckpt" / "checkpoint.pt", weights_only=False)["step_losses"]
    assert len(losses) == 2 * (8192 // 128 // 20) and all(0 < v < 5 for _, v in losses)  # every 20 steps
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]
    s = json.loads((tmp_path / "summary.json").read_text())
    for key in ("test_acc", "epochs", "train_seconds", "wall_seconds", "device", "model", "world_size",
                "time_to_target_seconds", "samples_per_second", "params", "torch_version", "hparams", "data_md5"):
        assert key in s, key
    assert s["device"] == "cpu" and s["world_size"] == 1 and 0.9 < s["test_acc"] <= 1
    assert s["train_seconds"] < s["wall_seconds"]
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "epoch 2/2" in (tmp_path / "train.log").read_text()


def test_interrupted_run_resumed_ends_with_the_same_accuracy(mnist_dir, tmp_path):
    args = ["--data-dir", str(mnist_dir), "--model", "mlp", "--epochs", "2", *SUBSET]
    full = trainer(tmp_path / "full", *args)
    assert full.returncode == 0, full.stderr
    # stop after epoch 1: run 1 epoch of the same 2-epoch schedule by killing at the checkpoint
    part = tmp_path / "part"
    proc = subprocess.Popen([sys.executable, "-m", "ec2gpu.train.mnist", "--out", str(part), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (part / "metrics.jsonl").exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.terminate()  # SIGTERM in epoch 2: the trainer checkpoints where it is and exits 143
    assert proc.wait(60) == 143  # interrupted, not finished first (else "resume" would pass trivially)
    assert not (part / "summary.json").exists()
    resumed = trainer(part, *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a = json.loads((tmp_path / "full" / "summary.json").read_text())
    b = json.loads((part / "summary.json").read_text())
    assert b["resumed_from"]["epoch"] == 1 and b["resumed_from"]["step"] >= 0  # within epoch 2, after epoch 1
    assert b["test_acc"] == a["test_acc"] and b["test_loss"] == a["test_loss"]


class Imds(http.server.BaseHTTPRequestHandler):
    """IMDSv2 with a spot interruption notice (token required)."""

    def do_PUT(self):
        self._send(200, b"token-123") if self.path == "/latest/api/token" else self._send(404, b"")

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != "token-123":
            return self._send(401, b"")
        if self.path == "/latest/meta-data/spot/instance-action":
            return self._send(200, b'{"action": "terminate", "time": "2026-11-21T12:00:00Z"}')
        self._send(404, b"")

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_spot_interruption_notice_checkpoints_and_exits_75(mnist_dir, tmp_path):
    # and, first, a rebalance recommendation as the agent passes it on (issue 27.23): the file
    # $EC2GPU_REBALANCE_FILE is there, so the trainer checkpoints at once, mid-epoch, and trains on
    told = tmp_path / "rebalance.json"
    told.write_text('{"notice_time": "2026-11-22T10:00:00Z", "seen_at": "2026-11-22T10:00:01+00:00"}')

    class AfterACheckpoint(Imds):  # the notice comes once a checkpoint is written: the order is certain
        def do_GET(self):
            self._send(404, b"") if not (tmp_path / "checkpoint.pt").exists() else super().do_GET()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AfterACheckpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = trainer(tmp_path, "--data-dir", str(mnist_dir), "--model", "mlp", "--epochs", "50", *SUBSET,
                    env={"EC2GPU_IMDS_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
                         "EC2GPU_SPOT_POLL_SECONDS": "0.2", "EC2GPU_REBALANCE_FILE": str(told)})
    finally:
        server.shutdown()
    assert r.returncode == 75, r.stdout + r.stderr
    log = (tmp_path / "train.log").read_text()
    assert (tmp_path / "checkpoint.pt").exists() and "spot interruption notice" in log
    assert log.count("rebalance recommendation: checkpoint written at epoch 1 step 0; training goes on") == 1


def test_two_processes_under_torchrun_with_gloo(mnist_dir, tmp_path):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                        "--nproc-per-node", "2",
                        "-m", "ec2gpu.train.mnist", "--out", str(tmp_path), "--data-dir", str(mnist_dir),
                        "--epochs", "1", "--train-subset", "8192", "--no-plot", "--threads", "1"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["world_size"] == 2 and s["test_acc"] > 0.9
    assert "[rank 1]" in r.stdout and "[rank 0]" in r.stdout


def test_missing_data_is_exit_2_with_a_clear_message(tmp_path):
    r = trainer(tmp_path / "o", "--data-dir", str(tmp_path / "none"))
    assert r.returncode == 2 and "does not exist" in r.stdout + r.stderr


def test_curves_of_a_one_epoch_run_keep_accuracy_within_0_100_and_plot_the_loss_per_step(tmp_path):
    pytest.importorskip("matplotlib")
    from ec2gpu.train.plots import accuracy_limits, plot_curves
    assert accuracy_limits([99.1]) == (98.6, 99.6) and accuracy_limits([99.9, 100.0])[1] == 100.0
    assert accuracy_limits([10.0, 90.0]) == (0.0, 100.0)
    history = [{"epoch": 1, "train_loss": 0.15, "test_loss": 0.06, "test_acc": 0.991}]
    plot_curves(history, tmp_path / "curves.png", [[20, 1.9], [40, 0.8], [60, 0.4]], 469, "run r1: cnn, 1 epoch")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
