"""Shared fixtures: the MNIST directory, an isolated EC2GPU_HOME, a running sandbox."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MNIST = Path(os.environ.get("EC2GPU_DATA_DIR") or ROOT.parent / "shared" / "data" / "mnist")


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    if not (MNIST / "t10k-labels-idx1-ubyte.gz").exists() and not (MNIST / "t10k-labels-idx1-ubyte").exists():
        pytest.skip(f"real MNIST not found at {MNIST} (set EC2GPU_DATA_DIR)")
    return MNIST


@pytest.fixture(scope="session")
def sandbox_home(tmp_path_factory, mnist_dir):
    """A sandbox that runs for the whole session in its own EC2GPU_HOME; stopped by pid after."""
    from ec2gpu.sandbox import control

    home = tmp_path_factory.mktemp("ec2gpu-home")
    saved = {k: os.environ.get(k) for k in ("EC2GPU_DATA_DIR",)}
    os.environ["EC2GPU_DATA_DIR"] = str(mnist_dir)
    state = control.up(home)
    yield home, state
    control.down(home)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def sandbox_env(sandbox_home, monkeypatch):
    """EC2GPU_HOME and the AWS variables of the session's sandbox, set for one test."""
    from ec2gpu.sandbox import control

    home, state = sandbox_home
    monkeypatch.setenv("EC2GPU_HOME", str(home))
    for k, v in control.env_vars(state).items():
        monkeypatch.setenv(k, v)
    return home, state
