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


def _suggestions(err: UsageError) -> list[str]:
    """The values a hint suggests (after `e.g.`)."""
    text = (err.hint or "").split("e.g. ", 1)[1]
    return [w for w in text.replace(" or ", " ").split() if w]


@pytest.mark.parametrize("text", ["0", "0.0001", "72", "10000", "1000000", "0h", "0s", "400d", "0.5s"])
def test_every_hint_suggests_a_value_that_is_accepted(text):
    with pytest.raises(UsageError) as e:
        parse_duration(text, what="--total")
    assert "e.g." in str(e.value)
    for suggested in _suggestions(e.value):
        assert parse_duration(suggested, what="--total") >= 1, suggested


def test_total_zero_no_longer_suggests_zero():
    with pytest.raises(UsageError) as e:
        parse_duration("0", what="--total")
    assert "0h" not in str(e.value) and "0m" not in str(e.value)
    assert "1h" in str(e.value)


@given(st.one_of(st.integers(0, 10**7).map(str), st.floats(0, 1e6).map(lambda f: f"{f:.4f}")),
       st.integers(1, 2 * 86400), st.integers(2 * 86400, 400 * 86400))
def test_hints_respect_the_options_bounds(number, minimum, maximum):
    with pytest.raises(UsageError) as e:
        parse_duration(number, what="--x", minimum=minimum, maximum=maximum)
    for suggested in _suggestions(e.value):
        assert minimum <= parse_duration(suggested, minimum=minimum, maximum=maximum) <= maximum


def test_option_minimum_is_enforced_and_named():
    with pytest.raises(UsageError) as e:
        parse_duration("30s", what="--segment", minimum=90)
    assert "at least 1m30s" in str(e.value) and "e.g. 2m" in str(e.value)
    assert parse_duration("2m", what="--segment", minimum=90) == 120
