import pytest
from hypothesis import given
from hypothesis import strategies as st

from chainrun.durations import format_duration, parse_duration, to_slurm_time
from chainrun.errors import UsageError


@pytest.mark.parametrize(
    "text,seconds",
    [("72h", 259200), ("90m", 5400), ("3d", 259200), ("1-12:00:00", 129600), ("10:00:00", 36000),
     ("1h30m", 5400), ("45s", 45), (" 2H ", 7200), ("0.5h", 1800)],
)
def test_accepted(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["72", "", "abc", "0h", "1:30", "1h1h", "-5m", "10:61:00", "400d", "h", "1x"])
def test_rejected_with_a_clear_message(text):
    with pytest.raises(UsageError) as e:
        parse_duration(text, what="--total")
    assert "--total" in str(e.value) or "empty" in str(e.value)


@given(st.text(max_size=20))
def test_never_raises_anything_but_usage_error(text):
    try:
        assert parse_duration(text) > 0
    except UsageError:
        pass


@given(st.integers(min_value=1, max_value=300 * 86400))
def test_slurm_time_never_shortens(seconds):
    t = to_slurm_time(seconds)
    days, hms = t.split("-")
    h, m, s = map(int, hms.split(":"))
    assert int(days) * 86400 + h * 3600 + m * 60 + s >= seconds


def test_format():
    assert format_duration(None) == "-"
    assert format_duration(90061) == "1d01h"
    assert format_duration(3900) == "1h05m"
    assert format_duration(-30) == "-30s"
