"""Model presets: the hyperparameters of each MNIST recipe, in one dataclass (no torch needed).

The controller reads these (epochs for cost estimates) without importing torch; models.py builds
the networks. Every field can be overridden from the trainer's command line (``--lr 0.05`` ...)
and is saved in every checkpoint, so a resumed run continues exactly.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hparams:
    """Hyperparameters of one run. Units are in the comments."""

    model: str = "cnn"
    epochs: int = 1  # full passes over the 60,000 training images
    batch_size: int = 128  # images per optimizer step, summed over all ranks
    optimizer: str = "sgd"  # sgd | rmsprop | adam
    lr: float = 0.1  # peak learning rate (per optimizer step, not scaled by batch)
    momentum: float = 0.9  # SGD momentum (nesterov when schedule is onecycle)
    weight_decay: float = 5e-4  # L2 coefficient applied by the optimizer
    schedule: str = "onecycle"  # onecycle (per step) | exp (per epoch) | constant
    lr_decay: float = 1.0  # multiplier per epoch for schedule=exp
    warmup_frac: float = 0.2  # fraction of all steps spent rising to lr, schedule=onecycle
    dropout: float = 0.0  # dropout probability on hidden layers
    label_smoothing: float = 0.0  # cross-entropy label smoothing
    l1: float = 0.0  # L1 weight penalty coefficient, added to the loss
    pretrain_epochs: int = 0  # greedy RBM pre-training epochs per layer (dbn only, CD-1)
    pretrain_lr: float = 0.05  # RBM learning rate per CD-1 step (dbn only)
    width: int = 16  # channels of the first convolution (cnn), doubled at each stage

    def replace(self, **changes: Any) -> "Hparams":
        """A copy with ``changes`` applied; unknown field names raise TypeError. (Any: each
        field's own type, as ``dataclasses.replace`` takes them; the command line parsed them.)"""
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, Hparams] = {
    # The deep-belief-network experiment of the GPU-vs-CPU blog post: 784-800-800-10 sigmoid
    # units, SGD lr 0.3 decayed x0.9 per epoch, 10 epochs; RBM pre-training is optional. The
    # rest are the defaults of the library it used (nolearn.dbn.DBN on gdbn): mini-batches of
    # 64, momentum 0.9, L2 cost 1e-4. Without momentum the same schedule stops near 92%.
    "dbn": Hparams(model="dbn", epochs=10, batch_size=64, optimizer="sgd", lr=0.3, momentum=0.9,
                   weight_decay=1e-4, schedule="exp", lr_decay=0.9),
    # Keras' mnist_mlp.py: 784-512-512-10 ReLU, dropout 0.2, RMSprop (Keras defaults: lr 1e-3,
    # rho 0.9, eps 1e-7), batch 128, 20 epochs; ~98.4% test accuracy is the known result.
    "mlp": Hparams(model="mlp", epochs=20, batch_size=128, optimizer="rmsprop", lr=1e-3,
                   momentum=0.0, weight_decay=0.0, schedule="constant", dropout=0.2),
    # The cluster paper's LeNet: conv5x5(20) -> pool2 -> conv5x5(50) -> pool2 -> FC 500 ReLU ->
    # softmax, with an L1 weight penalty; SGD with momentum as in Caffe's LeNet solver.
    "lenet": Hparams(model="lenet", epochs=10, batch_size=64, optimizer="sgd", lr=0.01,
                     momentum=0.9, weight_decay=0.0, schedule="exp", lr_decay=0.9, l1=1e-5),
    # The fast default: three conv-BN-ReLU stages (16-32-64 channels), each halving the
    # resolution, a linear head; one-cycle SGD. Built for time to 99% test accuracy.
    "cnn": Hparams(model="cnn", epochs=1, batch_size=128, optimizer="sgd", lr=0.1, momentum=0.9,
                   weight_decay=5e-4, schedule="onecycle", warmup_frac=0.2),
}
