"""Split-conformal calibration of the learned quantiles on the most recent training jobs.

On the most recent CAL_FRACTION of the training rows, plus the jobs of that period still waiting
at the cut, each quantile gets the shift (log10 s) that makes its coverage there equal to its
level, with the finite-sample correction q (1 + 1/n). Jobs still waiting are right-censored: the
shift is a Kaplan-Meier quantile of the residuals, so a long wait that has not ended yet counts as
"at least this long" instead of disappearing (which would make the upper quantiles too low exactly
when the queue gets worse).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainrun.predict.distribution import QUANTILES, qname
from chainrun.predict.features import log_wait

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

CAL_FRACTION = 0.2  # the most recent share of training rows: calibration only (conformal shifts)
MIN_CAL_ROWS = 50  # fewer calibration rows: no shifts, boosters trained on every row


def censored_rows(p: "pd.DataFrame", *, since: float | None, until: float | None) -> "np.ndarray":
    """Jobs eligible in [since, until) that had not started by ``until`` (right-censored waits).
    Whether such a job is dependency-like is decided by its later start, unknown at ``until``:
    all count, from their recorded eligible time (``t_queue``)."""
    import numpy as np

    te = p["t_queue"].to_numpy(float)
    start = p["start"].to_numpy(float)
    ok = ~(start < (np.inf if until is None else until))
    if since is not None:
        ok &= te >= since
    if until is not None:
        ok &= p["submit"].to_numpy(float) < until
    return np.flatnonzero(ok)


def censored_lb(p: "pd.DataFrame", rows, now: float) -> "np.ndarray":
    """log10 lower bound of the wait of censored rows, as known at ``now``."""
    import numpy as np

    end = p["end"].to_numpy(float)[rows]
    stop = np.where(np.isnan(end) | (end > now), now, end)
    return log_wait(np.maximum(stop - p["t_queue"].to_numpy(float)[rows], 0.0))


def last_fact(p: "pd.DataFrame") -> float:
    """The latest time the frame knows anything about (submit, start or end)."""
    import numpy as np

    return float(np.nanmax(p[["submit", "start", "end"]].to_numpy(float)))


def conformal_shifts(models, X, r, observed) -> dict:
    """Per quantile, the shift (log10) that makes the share of calibration residuals at or
    below the booster's answer equal to its level; censored rows count via Kaplan-Meier."""
    import numpy as np

    if len(r) < MIN_CAL_ROWS:
        return {}
    pred = np.column_stack([models[q].predict(X, num_threads=1) for q in QUANTILES])
    return shifts_of(pred, r, observed)


def shifts_of(pred, y, observed) -> dict:
    """The conformal shift of each quantile column of ``pred`` against targets ``y``
    (``observed`` False: a lower bound)."""
    out = {}
    n = len(y)
    if n < MIN_CAL_ROWS or observed.sum() < MIN_CAL_ROWS // 2:
        return {}
    for j, q in enumerate(QUANTILES):
        level = min(1.0, q * (1.0 + 1.0 / n))  # split-conformal finite-sample correction
        out[qname(q)] = round(float(km_quantile(y - pred[:, j], observed, level)), 5)
    return out


def km_quantile(values, observed, q: float) -> float:
    """The q-quantile of a right-censored sample (Kaplan-Meier); the largest value if the
    estimate never reaches q (too much still unknown at the top: stay on the safe side)."""
    import numpy as np

    values = np.asarray(values, float)
    observed = np.asarray(observed, bool)
    o = np.lexsort((~observed, values))  # by value; at ties events before censored
    v, e = values[o], observed[o]
    at_risk = len(v) - np.arange(len(v))
    surv = np.cumprod(np.where(e, 1.0 - 1.0 / at_risk, 1.0))
    hit = np.flatnonzero(e & (1.0 - surv >= q - 1e-12))
    return float(v[hit[0]]) if len(hit) else float(v.max())
