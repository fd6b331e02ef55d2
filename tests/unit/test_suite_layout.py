"""The suite's own layout: what `make test` needs of it to collect every module, and each module named
for what its tests prove."""
import re
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


#: words a test module's name may not hold: an issue or round number says when a test was written,
#: and "more", "misc", "leftovers" say only that it did not fit elsewhere; neither says what it proves
NOT_A_SUBJECT = re.compile(r"^(issue|round)\d*$|^(more|misc|leftovers)$")


def test_every_test_module_is_named_for_a_source_module_or_a_behaviour():
    """A test belongs in the module of the source module it exercises (tests/unit/test_sync.py for
    remote/sync.py), or, when it crosses modules, in one named for the behaviour it proves
    (test_untrusted_text.py). The rule checked: no word of a module's name (split at "_") is
    ``issue``/``round`` with or without a number, nor ``more``, ``misc`` or ``leftovers``, as
    test_issue27_leftovers.py and test_decisions_more.py once were (issue 45, item 6)."""
    misnamed = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                      if any(NOT_A_SUBJECT.match(word) for word in p.stem.split("_")[1:]))
    assert misnamed == []
