"""A small job in the shape of a real one, standard library only: fits y = 3x + 1 by gradient
descent, writes a checkpoint every epoch, resumes from it on a replacement instance
(EC2GPU_RESUME=1), reports its progress ($EC2GPU_PROGRESS_FILE) and leaves its results in
$EC2GPU_OUTPUT_DIR. Runs anywhere, the sandbox too.

    EPOCHS=20 python train.py          # locally: outputs go to ./out
"""
import json
import os
import random
import sys
import time
from pathlib import Path

out = Path(os.environ.get("EC2GPU_OUTPUT_DIR", "out"))
ckpt_dir = Path(os.environ.get("EC2GPU_CHECKPOINT_DIR", "checkpoints"))
out.mkdir(parents=True, exist_ok=True)
ckpt_dir.mkdir(parents=True, exist_ok=True)
ckpt = ckpt_dir / "state.json"
epochs = int(os.environ.get("EPOCHS", "20"))
seconds_per_epoch = float(os.environ.get("SECONDS_PER_EPOCH", "0.2"))
fail_at = int(os.environ.get("FAIL_AT_EPOCH", "-1"))  # to see what a failing job looks like

state = {"epoch": 0, "w": 0.0, "b": 0.0}
if os.environ.get("EC2GPU_RESUME") == "1" and ckpt.exists():
    state = json.loads(ckpt.read_text())
    print(f"resumed from {ckpt} at epoch {state['epoch']}", flush=True)
rng = random.Random(0)
data = [(x, 3 * x + 1 + rng.gauss(0, 0.1)) for x in (rng.uniform(-1, 1) for _ in range(256))]
print(f"node {os.environ.get('EC2GPU_NODE_RANK', '0')} of {os.environ.get('EC2GPU_NUM_NODES', '1')}, "
      f"head {os.environ.get('EC2GPU_HEAD_IP', '-')}, run {os.environ.get('EC2GPU_RUN_ID', 'local')}", flush=True)
for epoch in range(state["epoch"], epochs):
    if epoch == fail_at:
        print(f"error: failing at epoch {epoch} as FAIL_AT_EPOCH asks", file=sys.stderr, flush=True)
        sys.exit(3)
    gw = sum(2 * (state["w"] * x + state["b"] - y) * x for x, y in data) / len(data)
    gb = sum(2 * (state["w"] * x + state["b"] - y) for x, y in data) / len(data)
    state.update(epoch=epoch + 1, w=state["w"] - 0.5 * gw, b=state["b"] - 0.5 * gb)
    loss = sum((state["w"] * x + state["b"] - y) ** 2 for x, y in data) / len(data)
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(ckpt)  # atomic: a copy brought home is always whole
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"epoch": epoch + 1, "loss": loss}) + "\n")
    print(f"epoch {epoch + 1}/{epochs} loss {loss:.5f}", flush=True)
    if os.environ.get("EC2GPU_PROGRESS_FILE"):  # ec2gpu draws a progress bar from it (docs/tasks.md)
        progress = Path(os.environ["EC2GPU_PROGRESS_FILE"])
        progress.with_suffix(".tmp").write_text(json.dumps({"label": f"epoch {epoch + 1}/{epochs}",
                                                            "done": epoch + 1, "total": epochs}))
        progress.with_suffix(".tmp").replace(progress)
    time.sleep(seconds_per_epoch)
(out / "summary.json").write_text(json.dumps({"epochs": epochs, "w": round(state["w"], 4), "b": round(state["b"], 4),
                                              "loss": round(loss, 6)}))
print("done", flush=True)
