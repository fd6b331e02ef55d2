"""Model presets for MNIST: the seeds' recipes (dbn, mlp, lenet) and the fast default (cnn).

The hyperparameters of each preset live in presets.py (torch-free); this module builds the networks.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .presets import PRESETS, Hparams


def _conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class FastCNN(nn.Sequential):
    """[N,1,28,28] -> logits [N,10]: conv-BN-ReLU + 2x2 max-pool, three times (28->14->7->3)."""

    def __init__(self, width: int = 16) -> None:
        w = width
        super().__init__(
            _conv_bn(1, w), nn.MaxPool2d(2),
            _conv_bn(w, 2 * w), nn.MaxPool2d(2),
            _conv_bn(2 * w, 4 * w), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(4 * w * 9, 10),
        )


class LeNet(nn.Sequential):
    """[N,1,28,28] -> logits [N,10]: conv5(20)-pool-conv5(50)-pool-FC500-ReLU-FC10."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(1, 20, 5), nn.MaxPool2d(2),
            nn.Conv2d(20, 50, 5), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(50 * 4 * 4, 500), nn.ReLU(inplace=True), nn.Linear(500, 10),
        )


class MLP(nn.Sequential):
    """[N,1,28,28] -> logits [N,10]: 784-512-512-10, ReLU, dropout ``p`` after each hidden layer."""

    def __init__(self, dropout: float = 0.2) -> None:
        super().__init__(
            nn.Flatten(),
            nn.Linear(784, 512), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(512, 512), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(512, 10),
        )


class DBN(nn.Sequential):
    """[N,1,28,28] -> logits [N,10]: 784-800-800-10 with sigmoid hidden units.

    ``hidden`` holds the two Linear layers that RBM pre-training initialises.
    """

    def __init__(self) -> None:
        self.hidden: list[nn.Linear] = []
        l1, l2 = nn.Linear(784, 800), nn.Linear(800, 800)
        super().__init__(nn.Flatten(), l1, nn.Sigmoid(), l2, nn.Sigmoid(), nn.Linear(800, 10))
        self.hidden = [l1, l2]


def build(hp: Hparams) -> nn.Module:
    """Instantiate the network named by ``hp.model``. Raises ValueError for an unknown name."""
    if hp.model == "cnn":
        return FastCNN(hp.width)
    if hp.model == "lenet":
        return LeNet()
    if hp.model == "mlp":
        return MLP(hp.dropout)
    if hp.model == "dbn":
        return DBN()
    raise ValueError(f"unknown model {hp.model!r}; choose one of {', '.join(PRESETS)}")


def pretrain_rbm(layers: list[nn.Linear], x: torch.Tensor, epochs: int, lr: float,
                 batch_size: int, generator: torch.Generator, log: Callable[[str], object] = print) -> None:
    """Greedy layer-wise RBM pre-training with CD-1 (Hinton 2006) of ``layers`` in place.

    ``x`` is [N, 784] in [0, 1] on the training device. Each layer is trained as a
    Bernoulli RBM on the previous layer's hidden probabilities; the visible biases are
    discarded afterwards, the weights and hidden biases initialise the classifier.
    """
    data = x
    for i, layer in enumerate(layers):
        w, hb = layer.weight.data, layer.bias.data  # [H, V], [H]
        vb = torch.zeros(w.shape[1], device=w.device)
        for epoch in range(epochs):
            perm = torch.randperm(data.shape[0], generator=generator).to(data.device)
            err = 0.0
            for s in range(0, data.shape[0], batch_size):
                v0 = data[perm[s:s + batch_size]]
                h0 = torch.sigmoid(v0 @ w.T + hb)
                v1 = torch.sigmoid(torch.bernoulli(h0) @ w + vb)
                h1 = torch.sigmoid(v1 @ w.T + hb)
                n = v0.shape[0]
                w += lr * (h0.T @ v0 - h1.T @ v1) / n
                hb += lr * (h0 - h1).mean(0)
                vb += lr * (v0 - v1).mean(0)
                err += float(((v0 - v1) ** 2).sum())
            log(f"rbm layer {i + 1} epoch {epoch + 1}/{epochs} reconstruction error "
                f"{err / data.shape[0]:.3f}")
        with torch.no_grad():
            data = torch.sigmoid(data @ w.T + hb)
