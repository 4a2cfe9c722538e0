"""``prep._previous_end_same_user`` (the end a dependency-like job waited for) against its plain
definition, on random histories that include the edge cases a young history has: nothing ended yet,
nothing started yet, nothing at all (these once raised IndexError inside `sim --chains` and the
self-tuning refresh)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from chainrun.predict.prep import _previous_end_same_user, prepared_columns


def _plain(codes, start, end):
    out = []
    for i in range(len(codes)):
        if math.isnan(start[i]):
            out.append(math.nan)
            continue
        ends = [(end[j], j) for j in range(len(codes))
                if codes[j] == codes[i] and not math.isnan(end[j]) and end[j] <= start[i] and j != i]
        out.append(max(ends)[0] if ends else math.nan)
    return out


def _same(a, b):
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b)) and len(a) == len(b)


@pytest.mark.parametrize("seed", range(40))
def test_matches_the_plain_definition_on_random_histories(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 30))
    codes = rng.integers(0, 4, n).astype(float)
    start = np.round(rng.uniform(0, 100, n))
    end = start + np.round(rng.uniform(0, 20, n))
    start[rng.random(n) < rng.choice([0.0, 0.3, 1.0])] = np.nan  # some, none or all pending
    end[np.isnan(start) | (rng.random(n) < rng.choice([0.0, 0.5, 1.0]))] = np.nan  # some, none or all running
    got = _previous_end_same_user(codes, start, end)
    assert _same(list(got), _plain(codes, start, end))


def test_a_history_where_jobs_started_but_none_ended_has_no_previous_end():
    got = _previous_end_same_user(np.array([0.0, 1.0]), np.array([10.0, 20.0]), np.array([np.nan, np.nan]))
    assert np.isnan(got).all() and len(got) == 2


def test_prepared_columns_on_running_jobs_only_with_unknown_eligibility():
    """The path that reached it: eligibility not recorded, so dependency-like jobs are looked for."""
    cols = prepared_columns(np.array([0.0, 5.0]), np.array([np.nan, np.nan]), np.array([10.0, 20.0]),
                            np.array([np.nan, np.nan]), np.array([False, False]), np.array([0, 0]), now=30.0)
    assert list(cols["wait"]) == [10.0, 15.0] and not cols["dep_like"].any()
