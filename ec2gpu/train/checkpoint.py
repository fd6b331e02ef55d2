"""Checkpoints: everything needed to resume a run exactly, written atomically.

A checkpoint is a dict saved with ``torch.save``: model, optimizer, scheduler and grad-scaler
state, the RNG states (torch CPU, CUDA, Python), the position (epoch, step within the epoch),
the hyperparameters, the metrics so far and the training seconds already spent.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from .files import replacing

FILENAME = "checkpoint.pt"


def save(path: Path, state: dict) -> None:
    """Write ``state`` to ``path`` atomically (temp file in the same dir, fsync, rename)."""
    path = Path(path)
    with replacing(path, binary=True, fsync=True) as f:
        torch.save(state, f)


def load(path: Path, device: torch.device) -> dict:
    """Read a checkpoint written by ``save``. Raises FileNotFoundError if there is none."""
    return torch.load(Path(path), map_location=device, weights_only=False)


def rng_state() -> dict:
    """Capture the RNG states that training consumes (dropout, augmentation, sampling)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` captured (CUDA states only where CUDA is present)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
