"""End-to-end tests train MNIST on sandbox instances unless their module says NEEDS_MNIST = False:
those are skipped (not failed) on a machine without the data set; the others run anyway."""
import pytest


@pytest.fixture(autouse=True)
def _mnist_when_needed(request):
    if getattr(request.module, "NEEDS_MNIST", True):
        request.getfixturevalue("mnist_dir")
