"""End-to-end tests train MNIST on sandbox instances unless their module says NEEDS_MNIST = False:
those are skipped (not failed) on a machine without the data set; the others run anyway."""
import pytest


@pytest.fixture(autouse=True)
def _mnist_when_needed(request):
    if getattr(request.module, "NEEDS_MNIST", True):
        request.getfixturevalue("mnist_dir")


@pytest.fixture
def torchrun_port():
    """Held while a test trains over several nodes. torchrun's rendezvous (its TCPStore) listens on
    every address of this machine at the built-in task's --master-port, 29500 (checked here: `ss
    -ltn` shows *:29500), and `make test` runs several test processes, each with its sandbox, side
    by side: two such runs at once would take the same port. A lock file the processes share."""
    import fcntl
    with open("/tmp/ec2gpu-tests-torchrun-29500.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
