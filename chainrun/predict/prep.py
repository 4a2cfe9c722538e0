"""Turn a canonical job table into observations of queue wait.

Wait = Start - Eligible. Three things make that less simple than it looks:

- Traces without an Eligible column (LS6) count time held by a dependency as wait. A job
  of the same user that starts within ``DEP_GAP_S`` of that user's previous job's end,
  and was submitted before that end, looks like a dependency (or a job that only became
  startable when the user's own job freed its nodes). For those we re-base eligibility
  to the previous job's end (``dep_like`` marks them); real sacct data with an Eligible
  column is used as printed.
- Jobs still pending, or cancelled before they started, have no wait -- only a lower
  bound. They are *censored* (``censored``, lower bound ``wait_lb``), never zeros: they
  are kept for the queue state (they were ahead of others) and left out of regression
  targets and of test metrics.
- The first weeks of a trace see a queue whose earlier jobs are missing and, on LS6, a
  partition not yet in service. :func:`warmup_end` picks the end of that period from the
  data (first start + a week), never from a date.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

DEP_GAP_S = 60.0
WARMUP_S = 7 * 86400.0
# group-key spacing: epoch seconds < 2**33 (year 2242), so (group, time) fits one float64 exactly
SPAN = float(2**33)


def group_codes(values: "pd.Series") -> "tuple[object, dict[str, int]]":
    import pandas as pd

    codes, uniques = pd.factorize(values.astype(str), sort=False)
    return codes.astype("int64"), {u: i for i, u in enumerate(uniques)}


def prepare(df: "pd.DataFrame", *, now: float | None = None) -> "pd.DataFrame":
    """Copy of ``df`` with ``t_elig``, ``t_queue``, ``dep_like``, ``wait``, ``censored``, ``wait_lb`` added."""
    import numpy as np

    out = df.copy()
    known = out["eligible_known"].to_numpy(bool) if "eligible_known" in out else np.zeros(len(out), bool)
    cols = prepared_columns(out["submit"].to_numpy(float), out["eligible"].to_numpy(float),
                            out["start"].to_numpy(float), out["end"].to_numpy(float), known,
                            lambda: group_codes(out["user"])[0], now=now)
    for c in ("t_elig", "t_queue", "dep_like", "wait", "censored", "wait_lb"):
        out[c] = cols[c]
    return out


def prepared_columns(submit, eligible, start, end, known, user_codes, *, now: float | None = None) -> dict:
    """:func:`prepare`'s added columns from arrays (no pandas). ``user_codes``: integer user codes
    (any numbering: they only group), or a callable giving them (asked only when some job's
    eligibility is not known)."""
    import numpy as np

    elig = np.where(np.isnan(eligible), submit, np.maximum(eligible, submit))
    dep = np.zeros(len(submit), bool)
    if len(submit) and not known.all():
        prev_end = _previous_end_same_user(user_codes() if callable(user_codes) else user_codes, start, end)
        dep = (~known) & ~np.isnan(prev_end) & (start - prev_end <= DEP_GAP_S) & (submit < prev_end)
        elig = np.where(dep, np.maximum(prev_end, submit), elig)
    started = ~np.isnan(start)
    stop = np.where(np.isnan(end), np.nan if now is None else now, end)
    return {
        "t_elig": elig,
        # when the job entered the queue as far as anyone could tell at the time: the recorded
        # Eligible (or Submit). The re-based ``t_elig`` of a dependency-like job is decided by its
        # own later start, so queue-state sweeps and still-waiting jobs use this one instead.
        "t_queue": np.where(np.isnan(eligible), submit, np.maximum(eligible, submit)),
        "dep_like": dep,
        "wait": np.where(started, np.maximum(start - elig, 0.0), np.nan),
        "censored": ~started,
        "wait_lb": np.where(started, np.nan, np.maximum(stop - elig, 0.0)),
    }


def _previous_end_same_user(codes, start, end):
    """End of the same user's job that ended last at or before each job's start (NaN if none)."""
    import numpy as np

    n = len(codes)
    ok = ~np.isnan(end)
    idx_ok = np.flatnonzero(ok)
    keys = codes[idx_ok] * SPAN + end[idx_ok]
    order = np.argsort(keys, kind="stable")
    keys, jobs = keys[order], idx_ok[order]
    out = np.full(n, np.nan)
    has = ~np.isnan(start)
    q_idx = np.flatnonzero(has)
    if not len(jobs) or not len(q_idx):  # nothing ended yet (or nothing started): no previous end to find
        return out
    q = codes[q_idx] * SPAN + start[q_idx]
    pos = np.searchsorted(keys, q, side="right") - 1
    # skip the job itself (zero-length run ending at its own start)
    self_hit = (pos >= 0) & (jobs[np.clip(pos, 0, None)] == q_idx)
    pos = pos - self_hit
    valid = pos >= 0
    pos_c = np.clip(pos, 0, None)
    same_user = codes[jobs[pos_c]] == codes[q_idx]
    valid &= same_user
    out[q_idx[valid]] = end[jobs[pos_c[valid]]]
    return out


def warmup_end(df: "pd.DataFrame") -> float:
    """Epoch second before which jobs are warm-up: first start in the data + one week."""
    import numpy as np

    starts = df["start"].to_numpy(float)
    if np.isnan(starts).all():
        return float(np.nanmin(df["submit"].to_numpy(float)))
    first = float(np.nanmin(starts))
    return max(first, float(np.nanmin(df["submit"].to_numpy(float)))) + WARMUP_S


def default_since(df: "pd.DataFrame") -> float | None:
    """Training starts after the warm-up if the history is long enough to spare it (4 weeks+)."""
    import numpy as np

    if not len(df):
        return None
    sub = df["submit"].to_numpy(float)
    if float(np.nanmax(sub) - np.nanmin(sub)) > 4 * WARMUP_S:
        return warmup_end(df)
    return float(np.nanmin(sub))
