"""Turn a canonical trace table (chainrun.traces) into the simulator's job list.

Choices that matter for fidelity, each visible here:
- run time = recorded End - Start, cut at the limit; jobs that never ran are dropped (they
  held no nodes); a missing limit becomes the longest limit in the trace (the partition max);
  a job still running when sacct was dumped (no End) runs to its limit or the dump's last time.
- a job recorded as ending before it started (a clock change, a bad row) ran 0 s, and holds no
  node in the peak the partition is sized by; a trace where none ran for any time is refused.
- the trace's Submit and Start times must lie within ``MAX_SPAN_S`` of each other (a stray 1970 or 2099
  row is named, not replayed over decades: fair share's decay would overflow, chains would cover empty
  years); a stray End only lengthens its job up to its limit, as any run time does.
- the partition opens at the first recorded Start: LS6's A100s queued jobs for weeks before
  entering service, and a replay that starts them on day one would invent a different month.
- dependency-like runs (same user, starts within ``dep_gap_s`` of that user's previous job's
  end, submitted before that end) are replayed as dependencies: without an Eligible column the
  recorded wait includes the hold, and a replay that starts them early would look wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


MAX_SPAN_S = 10 * 365 * 86400.0  # real traces cover months; fair share's decay overflows past ~20 years


@dataclass
class Workload:
    jobs: list  # (submit, jid, nodes, limit_s, runtime_s, dep), sorted by submit; jid = row in `table`
    table: "pd.DataFrame"  # the trace rows the jobs came from (jid = positional index)
    open_at: float
    peak_nodes: int
    max_limit_s: float


def build_workload(trace: "pd.DataFrame", *, infer_dependencies: bool = True, dep_gap_s: float = 60.0) -> Workload:
    import numpy as np

    t = trace[trace["start"].notna() & (trace["nodes"] > 0)]
    t = t.sort_values(["submit", "job_id"], kind="stable").reset_index(drop=True)
    if t.empty:
        from chainrun.errors import UsageError

        raise UsageError("the trace has no job that ran (no row with a Start time)")
    check_span(t)
    if t["end"].isna().any():  # running at dump time: it holds its nodes to the end of what we know
        last = float(np.nanmax(t[["submit", "start", "end"]].to_numpy(float)))
        t = t.copy()
        t["end"] = t["end"].fillna(np.minimum(t["start"] + t["timelimit_s"].fillna(np.inf), last))
    limit = t["timelimit_s"].to_numpy(float)
    known = limit[np.isfinite(limit) & (limit > 0)]  # a limit of 0 is no limit Slurm ran a job under: unknown
    max_limit = float(known.max()) if known.size else 48 * 3600.0
    limit = np.where(np.isfinite(limit) & (limit > 0), limit, max_limit)
    runtime = np.clip(t["end"].to_numpy(float) - t["start"].to_numpy(float), 0.0, limit)
    if not (runtime > 0).any():  # (limits are positive by now: only End against Start is left)
        from chainrun.errors import UsageError

        raise UsageError("no job in the trace ran for any time: End is not after Start on any row",
                         hint="are the Start and End columns swapped?")
    deps = _dependencies(t, dep_gap_s) if infer_dependencies else np.full(len(t), -1)
    submit = t["submit"].to_numpy(float)
    nodes = t["nodes"].to_numpy(int)
    jobs = [
        (float(submit[i]), i, int(nodes[i]), float(limit[i]), float(runtime[i]), int(deps[i])) for i in range(len(t))
    ]
    return Workload(jobs, t, float(t["start"].min()), peak_concurrent_nodes(t), max_limit)


def peak_concurrent_nodes(t: "pd.DataFrame") -> int:
    """Most nodes in use at once, and never fewer than the widest job (a partition must hold it)."""
    import numpy as np

    start = t["start"].to_numpy(float)
    end = np.fmax(t["end"].to_numpy(float), start)  # an End before its Start: 0 s, not a negative count
    nodes = t["nodes"].to_numpy(int)
    times = np.concatenate([start, end])
    delta = np.concatenate([nodes, -nodes])
    order = np.lexsort((delta, times))  # ends before starts at the same second
    return int(max(1, np.cumsum(delta[order]).max(), nodes.max(initial=1)))


def check_span(t: "pd.DataFrame") -> None:
    """Refuse, naming the row furthest from the others, jobs (that ran) submitted or started more than
    ``MAX_SPAN_S`` apart."""
    import numpy as np

    cols = ("submit", "start")
    t = t[t["start"].notna() & (t["nodes"] > 0)]
    if t.empty:
        return
    times = t[list(cols)].to_numpy(float)
    lo, hi = float(np.nanmin(times)), float(np.nanmax(times))
    if hi - lo <= MAX_SPAN_S:
        return
    from chainrun.errors import UsageError

    med = float(np.nanmedian(times[:, 1]))
    far = np.nan_to_num(np.abs(times - med), nan=-1.0)
    i, j = np.unravel_index(int(np.argmax(far)), far.shape)
    raise UsageError(f"the trace's jobs span {_when(lo)} .. {_when(hi)}, more than a replay covers "
                     f"({MAX_SPAN_S / (365 * 86400):g} years): job {t['job_id'].iloc[i]} has {cols[j]} "
                     f"{_when(times[i, j])}, far from the others (median start {_when(med)})",
                     hint="remove or fix such rows")


def _when(t: float) -> str:
    """A trace time as its date, whatever its size (datetime stops at year 9999)."""
    from datetime import datetime, timezone

    try:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")
    except (OverflowError, OSError, ValueError):
        return f"epoch {t:.0f}"


def _dependencies(t: "pd.DataFrame", gap_s: float):
    import numpy as np

    dep = np.full(len(t), -1)
    by_user = t.reset_index().sort_values(["user", "start"], kind="stable")
    idx = by_user["index"].to_numpy()
    user = by_user["user"].to_numpy()
    start = by_user["start"].to_numpy(float)
    end = by_user["end"].to_numpy(float)
    submit = by_user["submit"].to_numpy(float)
    # for each job, the same user's job that ended last before (or at) its start
    for k in range(1, len(idx)):
        if user[k] != user[k - 1]:
            continue
        prev = k - 1
        gap = start[k] - end[prev]
        if 0.0 <= gap <= gap_s and submit[k] < end[prev] and idx[prev] < idx[k]:
            dep[idx[k]] = idx[prev]
    return dep
