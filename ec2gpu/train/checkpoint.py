"""Checkpoints: everything needed to resume a run exactly, written atomically.

A checkpoint is a dict saved with ``torch.save``: model, optimizer, scheduler and grad-scaler
state, the RNG states (torch CPU, CUDA, Python), the position (epoch, step within the epoch),
the hyperparameters, the metrics so far and the training seconds already spent.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch

from .files import replacing

FILENAME = "checkpoint.pt"

#: The RNG states training consumes: torch's CPU generator, Python's ``random`` (its getstate()
#: tuple), and each CUDA device's generator where CUDA is present. (Functional form: a key is named torch.)
RngState = TypedDict("RngState", {"torch": torch.Tensor, "python": tuple[Any, ...],
                                  "cuda": NotRequired[list[torch.Tensor]]})


class EpochRow(TypedDict):
    """One row of metrics.jsonl, one per epoch: losses are mean cross-entropy, ``test_acc`` a
    fraction (0-1), ``train_seconds`` the run's training seconds so far, ``lr`` the first parameter
    group's learning rate at the epoch's end, ``samples_per_second`` over the run so far."""

    epoch: int
    train_loss: float
    test_loss: float
    test_acc: float
    train_seconds: float
    lr: float
    samples_per_second: float


class State(TypedDict):
    """A checkpoint: torch's state dicts of the model, optimizer, scheduler and grad scaler, the RNG
    states, the position (``epoch`` done, ``step`` within the next), the training loss summed over
    the epoch's steps so far, training seconds, the metrics so far, the first time the target
    accuracy was reached (s, None: not yet), [global step, loss] pairs for curves.png (checkpoints
    written before they were kept have none), the hyperparameters (dataclasses.asdict of Hparams),
    the seed and the world size."""

    model: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    scaler: dict[str, Any]
    rng: RngState
    epoch: int
    step: int
    loss_sum: float
    train_seconds: float
    history: list[EpochRow]
    time_to_target: float | None
    step_losses: NotRequired[list[list[float]]]
    hparams: dict[str, Any]
    seed: int
    world_size: int


def save(path: Path, state: State) -> None:
    """Write ``state`` to ``path`` atomically (temp file in the same dir, fsync, rename)."""
    path = Path(path)
    with replacing(path, binary=True, fsync=True) as f:
        torch.save(state, f)


def load(path: Path, device: torch.device) -> State:
    """Read a checkpoint written by ``save``. Raises FileNotFoundError if there is none."""
    state: State = torch.load(Path(path), map_location=device, weights_only=False)  # what save wrote
    return state


def rng_state() -> RngState:
    """Capture the RNG states that training consumes (dropout, augmentation, sampling)."""
    state: RngState = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: RngState) -> None:
    """Restore what ``rng_state`` captured (CUDA states only where CUDA is present)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
