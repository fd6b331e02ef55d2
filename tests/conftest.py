"""Shared fixtures: the MNIST directory, an isolated EC2GPU_HOME, a running sandbox."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MNIST = Path(os.environ.get("EC2GPU_DATA_DIR") or ROOT.parent / "shared" / "data" / "mnist")


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    if not has_mnist():
        pytest.skip(f"real MNIST not found at {MNIST} (set EC2GPU_DATA_DIR)")
    return MNIST


#: The slowest modules, slowest first, as `--durations=0` ranked them in one serial run of the
#: whole suite on this 2-core machine (2026-11-27): started first, so that `make test`'s workers
#: (pytest-xdist, `--dist loadfile`: a module stays on one worker, with its sandbox) do not end with
#: one long module left on one worker.
SLOW_FIRST = ("e2e/test_detached_train.py", "e2e/test_api_access_costs_e2e.py", "e2e/test_run_task.py",
              "e2e/test_spot_recovery.py", "e2e/test_like_aws.py", "e2e/test_detached_run.py",
              "e2e/test_stop_start.py", "e2e/test_detached_fetch_logs.py", "e2e/test_interrupts.py",
              "e2e/test_sandbox_train.py", "e2e/test_image_bake.py", "e2e/test_interrupt_exec.py")


def pytest_collection_modifyitems(items) -> None:
    """Slow modules first (SLOW_FIRST, then the rest of e2e/, then everything else), each
    module's tests in their own order: the order only decides which worker starts what when."""
    def rank(item) -> tuple[int, int]:
        try:
            path = Path(str(item.path)).relative_to(ROOT / "tests").as_posix()
        except ValueError:  # a test file outside tests/
            return (2, 0)
        if path in SLOW_FIRST:
            return (0, SLOW_FIRST.index(path))
        return (1, 0) if path.startswith("e2e/") else (2, 0)
    items.sort(key=rank)  # stable: within a rank, collection order


def has_mnist() -> bool:
    return (MNIST / "t10k-labels-idx1-ubyte.gz").exists() or (MNIST / "t10k-labels-idx1-ubyte").exists()


@pytest.fixture(scope="session")
def sandbox_home(tmp_path_factory):
    """A sandbox that runs for the whole session in its own EC2GPU_HOME; stopped by pid after.
    Its instances see MNIST when this machine has it (the tests that train ask for ``mnist_dir``)."""
    from ec2gpu.sandbox import control

    home = tmp_path_factory.mktemp("ec2gpu-home")
    saved = {k: os.environ.get(k) for k in ("EC2GPU_DATA_DIR",)}
    if has_mnist():
        os.environ["EC2GPU_DATA_DIR"] = str(MNIST)
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


class _Raw:
    """The body of a canned HTTP response, as botocore reads it (AWSResponse.raw.stream())."""

    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body


@pytest.fixture
def wire_errors(monkeypatch):
    """(inject, calls, sleeps). inject(client, operation, code, times, status=400, when=None): the
    next ``times`` calls of ``operation`` (those whose request body ``when(body)`` accepts) are
    answered on the wire with EC2's error XML for ``code`` (a `before-send` hook, so botocore parses
    it and its retry logic runs as for a real answer). ``calls``: the call count per operation;
    ``sleeps``: every retry delay botocore slept (sleeping is skipped)."""
    from botocore.awsrequest import AWSResponse

    calls: dict[str, int] = {}
    sleeps: list[float] = []
    monkeypatch.setattr("botocore.endpoint.time.sleep", sleeps.append)

    def inject(client, operation: str, code: str, times: int, status: int = 400, when=None):
        left = {"n": times}

        def before_send(request, **_):
            calls[operation] = calls.get(operation, 0) + 1
            if left["n"] <= 0 or (when and not when(request.body)):
                return None
            left["n"] -= 1
            body = (f"<Response><Errors><Error><Code>{code}</Code><Message>injected</Message></Error></Errors>"
                    "<RequestID>test</RequestID></Response>").encode()
            return AWSResponse(request.url, status, {}, _Raw(body))
        client.meta.events.register(f"before-send.ec2.{operation}", before_send)
    return inject, calls, sleeps


@pytest.fixture
def no_backend(monkeypatch):
    """Fail the test if a backend (a sandbox or AWS clients) is opened: every api/ function opens one
    through ec2gpu.backend.Context, so input it must refuse first is proven refused before that."""
    from ec2gpu import backend

    def refuse(*args, **kwargs):
        raise AssertionError("a backend was opened for input that should have been refused first")
    monkeypatch.setattr(backend, "Context", refuse)
