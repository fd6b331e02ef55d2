"""The built-in trainer's summary.json as types (docs/tasks.md): what train/mnist.py writes and
train/bench.py reads; the controller validates it with runs/job_summary.TrainerSummary. Standard
library only: shipped with the trainer (runs/execute/engine ships every train/*.py)."""
from __future__ import annotations

from typing import Any, TypedDict


class RankRate(TypedDict):
    """One rank's training throughput: its node (torchrun's GROUP_RANK), host name, samples/s."""

    node_rank: int
    host: str
    samples_per_second: float


class NodeRate(RankRate):
    """One node's throughput: its ranks' samples/s summed, and how many ranks it ran."""

    ranks: int


class Resumed(TypedDict):
    """Where a resumed run started: epochs done, step within the next."""

    epoch: int
    step: int


class Summary(TypedDict):
    """summary.json (docs/tasks.md): the last epoch's metrics (None: no epoch ran), seconds of
    training and wall time, the first time --target-acc was reached (s, None: not reached), the
    device, world size, parameter count, per-node throughput, the GPU's name (None: CPU), versions,
    the autocast dtype (None: off), seed, hyperparameters, each data file's md5, and where a
    resumed run started (None: from scratch)."""

    status: str
    model: str
    epochs: int
    test_acc: float | None
    test_loss: float | None
    train_seconds: float
    wall_seconds: float
    time_to_target_seconds: float | None
    target_acc: float
    samples_per_second: float | None
    device: str
    world_size: int
    params: int
    nodes: int
    per_node: list[NodeRate]
    gpu_name: str | None
    torch_version: str
    cuda_version: str | None
    amp_dtype: str | None
    seed: int
    hparams: dict[str, Any]
    data_md5: dict[str, str]
    resumed_from: Resumed | None
