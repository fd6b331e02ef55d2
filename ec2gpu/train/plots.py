"""curves.png: train/test loss and test accuracy per epoch (matplotlib, Agg backend, no display)."""
from __future__ import annotations

from pathlib import Path


def plot_curves(history: list[dict], path: Path) -> None:
    """Draw the per-epoch rows of metrics.jsonl into a two-panel PNG at ``path``.

    Raises ImportError when matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = [r["epoch"] for r in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(epochs, [r["train_loss"] for r in history], "o-", label="train loss")
    ax1.plot(epochs, [r["test_loss"] for r in history], "s-", label="test loss")
    ax1.set_xlabel("epoch"); ax1.set_ylabel("cross-entropy"); ax1.legend(); ax1.grid(alpha=0.3)
    ax2.plot(epochs, [100 * r["test_acc"] for r in history], "o-", color="tab:green")
    ax2.set_xlabel("epoch"); ax2.set_ylabel("test accuracy (%)"); ax2.grid(alpha=0.3)
    best = max(history, key=lambda r: r["test_acc"])
    ax2.set_title(f"best {100 * best['test_acc']:.2f}% at epoch {best['epoch']}")
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
