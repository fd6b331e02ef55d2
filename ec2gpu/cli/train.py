"""`ec2gpu train mnist`: the built-in task on a new instance (or --cluster, --local)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from .app import JSON, REGION, SANDBOX, _sandbox_flag, train_app
from .render import RichReporter, err


# the options of `train mnist` (module level: the command's signature stays readable)
INSTANCE_TYPE_OPT = typer.Option(None, "--instance-type", "-t", help="GPU instance type, or several in order "
                                 "of preference: g4dn.xlarge,g5.xlarge,g6.xlarge (T4, A10G, L4). Each is tried "
                                 "in every zone that offers it before the next.")
SPOT_OPT = typer.Option(False, "--spot", help="Use a spot instance (one-time, terminated on interruption).")
SPOT_FALLBACK_OPT = typer.Option(None, "--spot-fallback", help="on-demand: when no zone or type has "
                                 "spot capacity, make a last on-demand try.")
MODEL_OPT = typer.Option("cnn", "--model", "-m", help="cnn (fast default), lenet, mlp or dbn.")
EPOCHS_OPT = typer.Option(None, "--epochs", "-e", min=1, help="Epochs (default: the model preset's).")
SEED_OPT = typer.Option(0, "--seed", help="Random seed of the trainer.")
KEEP_OPT = typer.Option(False, "--keep", help="Leave the instance running afterwards (it still "
                        "terminates itself after --max-runtime).")
OUT_DIR_OPT = typer.Option(None, "--out", help="Where artifacts go (default runs/<run-id>/).")
LOCAL_OPT = typer.Option(False, "--local", help="Train on this machine instead (needs torch).")
SSH_CIDR_OPT = typer.Option(None, "--ssh-cidr", help="CIDR allowed to SSH (default: your public IP/32).")
AMI_OPT = typer.Option(None, "--ami", help="AMI id (default: the newest image baked for mnist, "
                       "`ec2gpu image bake mnist`, else the AWS Deep Learning AMI, PyTorch).")
NO_BAKED_OPT = typer.Option(False, "--no-baked", help="Boot the Deep Learning AMI even when a baked image exists.")
MAX_RUNTIME_OPT = typer.Option(None, "--max-runtime", help="Minutes (or 90m, 2h) after which the instance "
                               "shuts itself down (= terminates), whatever happens to this command; the job gets "
                               "SIGTERM 7 min before, to checkpoint (default 2h; --keep needs it given explicitly).")
DATA_DIR_OPT = typer.Option(None, "--data-dir", help="MNIST directory for --local "
                            "(default EC2GPU_DATA_DIR, else downloaded).")
TRAINER_ARG_OPT = typer.Option([], "--trainer-arg", help="Extra trainer flag, repeatable: "
                               "--trainer-arg=--lr=0.05")
BUDGET_OPT = typer.Option(None, "--budget", min=0, help="Refuse the run (creating nothing) "
                          "if its estimated cost in USD is above this.")
MAX_PRICE_OPT = typer.Option(None, "--max-price", min=0, help="With --spot: the highest "
                             "spot price to pay, USD/h (default: up to the on-demand price).")
ON_CLUSTER_OPT = typer.Option(None, "--cluster", help="Train on the nodes a standing cluster has "
                              "now (ec2gpu launch --nodes N --name NAME) and leave it running.")
NODES_OPT = typer.Option(1, "--nodes", "-n", min=1, max=64, help="Instances that train together through "
                         "torchrun (rank 0 on node 0), in one security group and a cluster placement "
                         "group where the type supports it.")
MAX_ATTEMPTS_OPT = typer.Option(None, "--max-attempts", min=1, help="Instances to try before "
                                "giving up: a lost instance (spot interruption, terminated, SSH "
                                "unreachable) is replaced and training resumes from its last "
                                "checkpoint (default 3 with --spot, else 1).")
CHECKPOINT_URI_OPT = typer.Option(None, "--checkpoint-uri", help="s3://BUCKET/PREFIX: also copy each "
                                  "checkpoint to PREFIX/RUN_ID/ there (from this machine; the instance gets no "
                                  "credentials). Checkpoints always come home to --out/checkpoints.")
UNREACHABLE_AFTER_OPT = typer.Option(120.0, "--unreachable-after", min=5, help="Seconds of SSH "
                                     "unreachability after which the instance counts as lost.")
SWEEP_OPT = typer.Option([], "--sweep", help="NAME=V1,V2: train once per combination of the values given (a "
                         "grid), over a pool scheduled by Ray; repeatable, e.g. --sweep lr=0.1,0.05 --sweep "
                         "seed=0,1,2 (6 trainings). NAME: a trainer flag (model, seed, epochs, lr, batch_size, ...).")
WORKERS_OPT = typer.Option(None, "--workers", help="With --sweep: instances in the pool at most (default 1); it "
                           "shrinks as the queue drains.")
MAX_RETRIES_OPT = typer.Option(2, "--max-retries", help="With --sweep: runs again of a training that fails.")
DETACH_OPT = typer.Option(False, "--detach", help="Hand the training to AWS and return: an Auto Scaling group runs "
                          "it (a spot instance lost is replaced and training resumes from its last checkpoint in "
                          "S3), with nobody watching, until --max-runtime at most; `ec2gpu status RUN` follows it, "
                          "`ec2gpu fetch RUN` brings its results.")


def sweep_flags(values: List[str]) -> dict[str, list[str]]:
    """``--sweep NAME=V1,V2`` flags -> {NAME: [V1, V2]} (pure). Raises UsageError for one without
    ``=`` or values, or a name given twice."""
    from ..errors import UsageError
    sweep: dict[str, list[str]] = {}
    for value in values:
        name, eq, listed = value.partition("=")
        items = [v.strip() for v in listed.split(",") if v.strip()]
        if not eq or not name.strip() or not items:
            raise UsageError(f"--sweep {value!r}: give NAME=V1,V2", "e.g. --sweep lr=0.1,0.05")
        if name.strip() in sweep:
            raise UsageError(f"--sweep {name.strip()} is given twice", "list all its values once: NAME=V1,V2,V3")
        sweep[name.strip()] = items
    return sweep


@train_app.command("mnist")
def train_mnist(
    instance_type: Optional[str] = INSTANCE_TYPE_OPT, spot: bool = SPOT_OPT, spot_fallback: Optional[str] = SPOT_FALLBACK_OPT,
    model: str = MODEL_OPT, epochs: Optional[int] = EPOCHS_OPT, seed: int = SEED_OPT, keep: bool = KEEP_OPT,
    out_dir: Optional[Path] = OUT_DIR_OPT, local: bool = LOCAL_OPT, ssh_cidr: Optional[str] = SSH_CIDR_OPT,
    ami: Optional[str] = AMI_OPT, no_baked: bool = NO_BAKED_OPT, max_runtime: Optional[str] = MAX_RUNTIME_OPT,
    data_dir: Optional[str] = DATA_DIR_OPT, trainer_arg: List[str] = TRAINER_ARG_OPT,
    budget: Optional[float] = BUDGET_OPT, max_price: Optional[float] = MAX_PRICE_OPT,
    on_cluster: Optional[str] = ON_CLUSTER_OPT, nodes: int = NODES_OPT,
    max_attempts: Optional[int] = MAX_ATTEMPTS_OPT, checkpoint_uri: Optional[str] = CHECKPOINT_URI_OPT,
    unreachable_after: float = UNREACHABLE_AFTER_OPT, sweep: List[str] = SWEEP_OPT,
    workers: Optional[int] = WORKERS_OPT, max_retries: int = MAX_RETRIES_OPT, detach: bool = DETACH_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, as `run --dry-run` does, and create nothing."),
    region: Optional[str] = REGION, sandbox: bool = SANDBOX, as_json: bool = JSON,
) -> None:
    """Launch a GPU instance, train MNIST on it, download the results, terminate everything.

    With --spot the run is managed: on an interruption the newest checkpoint (brought home as the
    trainer writes it) goes to a replacement instance, which resumes training. With --detach AWS
    owns the run and this command returns at once (see `ec2gpu run --help`).
    """
    from .. import api
    from .tasks import failed_array_table, print_outcome
    as_typed = " ".join(["ec2gpu"] + sys.argv[1:]) if sys.argv[0].endswith("ec2gpu") else "ec2gpu train mnist"
    options = api.RunFlags(
        instance_type=instance_type, spot=spot, spot_fallback=spot_fallback, keep=keep, out=out_dir, ssh_cidr=ssh_cidr,
        ami=ami, baked=not no_baked, max_runtime=max_runtime, budget=budget, max_price=max_price, nodes=nodes,
        max_attempts=max_attempts, checkpoint_uri=checkpoint_uri, unreachable_s=unreachable_after, region=region,
        sandbox=_sandbox_flag(sandbox), as_typed=as_typed, workers=workers, max_retries=max_retries, detach=detach)
    trainer = api.Trainer(model=model, epochs=epochs, seed=seed, trainer_args=tuple(trainer_arg),
                          sweep=sweep_flags(sweep) or None, data_dir=data_dir, local=local, cluster=on_cluster)
    with failed_array_table(as_json):
        got = api.train_mnist(options, trainer, reporter=RichReporter(err), dry_run=dry_run)
    print_outcome(got, as_json, detach, sandbox)
