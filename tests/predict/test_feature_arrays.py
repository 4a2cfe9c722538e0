"""The array pieces the live and replay paths share give what the pandas/numpy originals give:
the calendar (pd.to_datetime's float rounding included), the windows' median (np.nanmedian) and the
oldest pending age of asks at one moment (the heap walk)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from chainrun.predict.features import _nanmedian_rows, _oldest_pending_age_h, calendar


def test_calendar_is_pandas_wall_clock_to_the_bit():
    rng = np.random.default_rng(0)
    minute = (np.round(1.7e9 / 60) + np.arange(2000)) * 60.0
    t = np.concatenate([1.6e9 + rng.random(50000) * 2e8, np.floor(1.6e9 + rng.random(2000) * 2e8),
                        minute - 1e-7, minute + 1e-7, minute - 0.5, minute - 1e-10])
    ts = pd.to_datetime(t, unit="s")
    hour, weekday = calendar(t)
    assert np.asarray(ts.hour + ts.minute / 60.0).tobytes() == hour.tobytes()
    assert np.array_equal(np.asarray(ts.day_of_week), weekday)


def test_windows_median_is_nanmedian_to_the_bit():
    rng = np.random.default_rng(1)
    for width in (1, 2, 3, 20, 50):
        v = np.log10(np.maximum(rng.lognormal(6, 2, (20000, width)), 1.0))  # log waits: >= 0
        v[:2000] = np.round(v[:2000], 1)  # ties
        v[rng.random(v.shape) < 0.4] = np.nan
        v = v[~np.isnan(v).all(axis=1)]
        assert np.nanmedian(v, axis=1).tobytes() == _nanmedian_rows(v).tobytes()


def test_oldest_pending_age_at_one_moment_is_the_heap_walks():
    rng = np.random.default_rng(2)
    for n in (3000, 30):  # few jobs: the one entering at t is often the oldest
        k_in = np.round(rng.uniform(0, 1e5, n))
        k_out = k_in + np.round(rng.exponential(5000, n))
        for t in np.concatenate([rng.uniform(0, 1.2e5, 100), rng.choice(k_in, 50), rng.choice(k_out, 50)]):
            spread = np.array([t, t - 1.0, t + 7.0])  # the heap walk: asks at several moments
            one = _oldest_pending_age_h(k_in, k_out, np.array([t, t]))
            assert one[0] == one[1] == _oldest_pending_age_h(k_in, k_out, spread)[0]
        assert _oldest_pending_age_h(k_in, k_out, np.array([-5.0]))[0] == 0.0  # none pending yet
