"""One duration grammar for every flag and field (issue 29, item 12): s, m, h, d and w, case
ignored; a bare number is minutes where a flag takes minutes, and needs a unit for --since."""
from datetime import datetime, timedelta, timezone

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.runs.settle import ledger
from ec2gpu.runs.plan import limits
from ec2gpu.tasks.spec import minutes

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, got", [("90", 90), (90, 90), ("45s", 0.75), ("2h", 120), ("2H", 120),
                                       ("1d", 1440), ("2w", 20160), (" 1.5 h ", 90)])
def test_every_unit_is_read_the_same_way(text, got):
    assert minutes(text) == got


@pytest.mark.parametrize("text", ["", "2y", "h", "-5m", "5 m s", "2w\n3", "nan", "1e3"])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError):
        minutes(text)


def test_max_runtime_takes_weeks_and_since_takes_minutes():
    assert limits.parse("2w") == (True, 20160)
    assert ledger.parse_since("30m", NOW) == NOW - timedelta(minutes=30)
    assert ledger.parse_since("2w", NOW) == NOW - timedelta(weeks=2)
    assert ledger.parse_since("45s", NOW) == NOW - timedelta(seconds=45)
    assert ledger.parse_since("2026-11-01", NOW) == datetime(2026, 11, 1, tzinfo=timezone.utc)
    with pytest.raises(UsageError, match="not a duration or a date"):
        ledger.parse_since("30", NOW)  # ago by how much: a unit is needed


def test_the_bound_of_thirty_days_holds_for_limits_not_for_since():
    with pytest.raises(UsageError):
        limits.parse("5w")
    assert ledger.parse_since("52w", NOW) == NOW - timedelta(weeks=52)



def test_sizes_are_pydantic_byte_sizes_decimal_units_and_binary_ones():
    """One size grammar (issue 29 item 12): pydantic's ByteSize, in every size flag."""
    from ec2gpu.tasks.spec import size_bytes
    assert size_bytes("2048") == 2048 and size_bytes(2048) == 2048
    assert size_bytes("500MB") == 500 * 10**6 and size_bytes("10G") == 10 * 10**9
    assert size_bytes("1GiB") == 1 << 30 and size_bytes(" 4gib ") == 4 << 30
    for bad in ("x", "-1", "1.5.2G", "", True):
        with pytest.raises(ValueError):
            size_bytes(bad)
