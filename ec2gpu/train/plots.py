"""curves.png: training loss per step and test accuracy per epoch (matplotlib, Agg backend)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # the trainer imports this module only to draw; checkpoint imports torch
    from .checkpoint import EpochRow


def accuracy_limits(accs_pct: list[float]) -> tuple[float, float]:
    """The test-accuracy axis (percent) for ``accs_pct`` (pure): a margin of a fifth of their spread
    (at least 0.5 points) around them, never below 0 or above 100."""
    lo, hi = min(accs_pct), max(accs_pct)
    pad = max(0.5, (hi - lo) / 5)
    return max(0.0, lo - pad), min(100.0, hi + pad)


def plot_curves(history: list[EpochRow], path: Path, step_losses: Sequence[Sequence[float]] | None = None,
                steps_per_epoch: int = 0,
                title: str = "") -> None:
    """Draw a two-panel PNG at ``path``: left, the training loss every few steps (``step_losses``:
    [global step, loss], on an axis of epochs) with each epoch's train and test loss; right, the
    test accuracy of each epoch (percent, axis kept within 0-100). ``title`` names the run and
    model. ``history``: metrics.jsonl's rows (epoch, train_loss, test_loss, test_acc).

    Raises ImportError when matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = [r["epoch"] for r in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    if step_losses and steps_per_epoch:
        ax1.plot([s / steps_per_epoch for s, _ in step_losses], [v for _, v in step_losses], "-", lw=0.8,
                 alpha=0.7, label="training loss (every few steps)")
    ax1.plot(epochs, [r["train_loss"] for r in history], "o", label="train loss (epoch mean)")
    ax1.plot(epochs, [r["test_loss"] for r in history], "s", label="test loss")
    ax1.set_xlim(0, max(epochs + [1]))
    ax1.set_ylim(bottom=0)
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("cross-entropy")
    ax1.legend()
    ax1.grid(alpha=0.3)
    accs = [100 * r["test_acc"] for r in history]
    ax2.plot(epochs, accs, "o-", color="tab:green")
    ax2.set_xlim(0.5, max(epochs) + 0.5)
    ax2.set_ylim(*accuracy_limits(accs))
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy (%)")
    ax2.grid(alpha=0.3)
    best = max(history, key=lambda r: r["test_acc"])
    ax2.set_title(f"best {100 * best['test_acc']:.2f}% at epoch {best['epoch']}")
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
