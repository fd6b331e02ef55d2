"""Data-parallel PyTorch training under torchrun, in the shape ec2gpu expects of a user's job.

A small MLP learns a synthetic regression; every rank trains on its own shard (DistributedSampler),
rank 0 writes a checkpoint each epoch to $EC2GPU_CHECKPOINT_DIR and, at the end, summary.json to
$EC2GPU_OUTPUT_DIR. With EC2GPU_RESUME=1 (a replacement after a spot interruption) every rank
resumes from the checkpoint. NCCL on GPUs, gloo on CPUs (so it also runs in the sandbox).
"""
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ.get("LOCAL_RANK", 0))
device = torch.device(f"cuda:{local}" if cuda else "cpu")
if cuda:
    torch.cuda.set_device(device)
out = Path(os.environ.get("EC2GPU_OUTPUT_DIR", "out"))
ckpt = Path(os.environ.get("EC2GPU_CHECKPOINT_DIR", "checkpoints")) / "model.pt"
epochs = int(os.environ.get("EPOCHS", "5"))

g = torch.Generator().manual_seed(0)
x = torch.randn(8192, 32, generator=g)
y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(8192, 1, generator=g)
data = TensorDataset(x, y)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=256, sampler=sampler)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device),
            device_ids=[local] if cuda else None)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
start = 0
if os.environ.get("EC2GPU_RESUME") == "1" and ckpt.exists():
    state = torch.load(ckpt, map_location=device)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["epoch"]
    print(f"rank {rank}: resumed at epoch {start}", flush=True)
t0 = time.perf_counter()
for epoch in range(start, epochs):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
        loss.backward()
        opt.step()
    if rank == 0:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1},
                   ckpt.with_suffix(".tmp"))
        ckpt.with_suffix(".tmp").replace(ckpt)
        print(f"epoch {epoch + 1}/{epochs} loss {loss.item():.4f} (world size {world})", flush=True)
if rank == 0:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"final_loss": round(loss.item(), 5), "world_size": world,
                                                  "epochs": epochs, "seconds": round(time.perf_counter() - t0, 2)}))
dist.barrier()  # every rank waits for rank 0's files
dist.destroy_process_group()
# leave at once: on a loaded CPU machine a gloo rank has, rarely, died of SIGABRT in C++ exit-time
# destructors after its work was done (ec2gpu/train/mnist.py: leave_process_group)
sys.stdout.flush()
os._exit(0)
