"""The suite's own layout: what `make test` needs of it to collect every module."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    """The test folders are not packages, so pytest imports each module by its file name: two
    modules of one name in one process (`pytest -m alone` collects every folder) stop the run
    with "import file mismatch" before any test runs, as tests/unit and tests/e2e's
    test_pool_ray_private.py once did."""
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []
