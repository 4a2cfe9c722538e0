"""Features of a queue-wait question, as a pure function of job tables.

``build_features(queries, universe, ...)`` answers "what did the cluster look like at
time t for this request?" for every query row. The same code serves training (queries
are the history's own jobs at their eligible time, universe is the whole history) and
prediction (one query at ``now``; universe is recent history plus the live snapshot of
pending/running jobs). Only facts known at t are used: a job counts as pending at t if
it became eligible before t and had neither started nor ended by t; as running if it
started before t and had not ended by t; its wait counts once it started (start < t:
strict, so a job that starts the second it is submitted never sees its own wait). Future start/end times are only ever compared with t, never used as values --
tests/predict/test_features.py changes every future value and checks nothing moves.
Priority (set after the fact) is never read.

All sweeps are sorted arrays + searchsorted + cumsums: O(n log n), no Python loop per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chainrun.predict.prep import SPAN

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

FEATURES: tuple[str, ...] = (
    # the request
    "nodes", "gpus", "cpus", "log_limit", "partition_code", "qos_code",
    # calendar (cluster wall clock)
    "hour", "weekday",
    # the user's recent waits and usage
    "user_n_prev", "user_med_wait20", "user_mean_wait20", "user_last_wait",
    "user_nodes_started_7d", "user_nodeh_req_7d", "user_running_nodes", "user_pending_jobs", "user_pending_nodes",
    # the cluster's queue at t (NaN when the history does not show all users)
    "q_pending_jobs", "q_pending_nodes", "q_pending_nodeh", "q_pending_mean_age_h",
    "q_running_jobs", "q_running_nodes", "q_running_left_nodeh", "q_pending_nodes_frac", "q_running_nodes_frac",
    "q_backlog_h", "q_free_nodes_frac", "q_pending_max_age_h",
    # the same queue seen from the requested partition only (clusters with several)
    "q_part_pending_jobs", "q_part_pending_nodes", "q_part_pending_nodeh", "q_part_running_nodes",
    "q_part_running_left_nodeh", "c_part_med_wait50",
    "c_med_wait50", "c_mean_wait50", "c_last_wait", "c_started_6h",
)
USER_WINDOW = 20
CLUSTER_WINDOW = 50
_DAY = 86400.0
UNKNOWN_LIMIT_S = 86400.0  # UNLIMITED / unknown limits count as a day of work


def log_wait(w):
    """Target scale: log10 of the wait, waits under a second counted as one second."""
    import numpy as np

    return np.log10(np.maximum(np.asarray(w, float), 1.0))


def build_features(
    queries: "pd.DataFrame",
    universe: "pd.DataFrame",
    *,
    capacity: float,
    all_users: bool,
    categories: dict[str, dict[str, int]],
) -> "np.ndarray":
    """Feature matrix (len(queries) x len(FEATURES)), float64, NaN for unknown.

    ``queries``: columns user, t, nodes, gpus, cpus, timelimit_s, partition, qos.
    ``universe``: a prepared table (see prep.prepare): user, t_elig, start, end, nodes,
    timelimit_s, wait. ``capacity``: nodes of the cluster (for the *_frac features).
    """
    asks, jobs = columns_of(queries, universe, categories)
    return feature_matrix(asks, jobs, capacity=capacity, all_users=all_users)


@dataclass
class Asks:
    """The queries as arrays. ``user``/``part`` share one code space with :class:`Jobs`."""

    t: "np.ndarray"
    nodes: "np.ndarray"
    gpus: "np.ndarray"
    cpus: "np.ndarray"
    limit: "np.ndarray"  # requested time limit, s
    partition_code: "np.ndarray"  # the model's category code of the partition (NaN: unknown)
    qos_code: "np.ndarray"
    user: "np.ndarray"
    part: "np.ndarray"


@dataclass
class Jobs:
    """A prepared universe as arrays (prep.prepare's columns).

    Codes number users (and partitions) in order of first appearance over the jobs, then the
    asks: the sweeps' cumulative sums run over jobs sorted by (code, time), so the code order
    fixes the order of float additions, and every path that builds these arrays (pandas here,
    chainrun/predict/columnar.py for the replay) numbers them the same way to get the same bits."""

    user: "np.ndarray"
    part: "np.ndarray"
    t_queue: "np.ndarray"  # entered the queue (prep's t_queue, else t_elig)
    start: "np.ndarray"
    end: "np.ndarray"
    nodes: "np.ndarray"
    limit: "np.ndarray"  # timelimit_s as recorded (NaN: unknown)
    wait: "np.ndarray"


def columns_of(queries: "pd.DataFrame", universe: "pd.DataFrame", categories: dict) -> "tuple[Asks, Jobs]":
    """The two tables as arrays, codes in order of first appearance (see :class:`Jobs`)."""
    import numpy as np
    import pandas as pd

    codes = {}
    for c in ("user", "partition"):
        names = pd.Index(pd.unique(pd.concat([universe[c], queries[c]]).astype(str)))
        codes[c] = (names.get_indexer(universe[c].astype(str)).astype(float),
                    names.get_indexer(queries[c].astype(str)).astype(float))
    cat = {}
    for name in ("partition", "qos"):
        m = categories.get(name, {})
        cat[name] = queries[name].astype(str).map(lambda v, m=m: m.get(v, np.nan)).to_numpy(float)
    asks = Asks(t=queries["t"].to_numpy(float), nodes=queries["nodes"].to_numpy(float),
                gpus=queries["gpus"].to_numpy(float), cpus=queries["cpus"].to_numpy(float),
                limit=queries["timelimit_s"].to_numpy(float), partition_code=cat["partition"], qos_code=cat["qos"],
                user=codes["user"][1], part=codes["partition"][1])
    # pending from the recorded eligible time (t_queue), not the dependency re-basing: whether a
    # job without an Eligible column was dependency-held is only known from its later start
    jobs = Jobs(user=codes["user"][0], part=codes["partition"][0],
                t_queue=universe["t_queue" if "t_queue" in universe else "t_elig"].to_numpy(float),
                start=universe["start"].to_numpy(float), end=universe["end"].to_numpy(float),
                nodes=universe["nodes"].to_numpy(float), limit=universe["timelimit_s"].to_numpy(float),
                wait=universe["wait"].to_numpy(float))
    return asks, jobs


def feature_matrix(asks: Asks, jobs: Jobs, *, capacity: float, all_users: bool) -> "np.ndarray":
    """:func:`build_features` on arrays (no pandas): what every path computes features with."""
    import numpy as np

    X = np.full((len(asks.t), len(FEATURES)), np.nan)
    col = {f: i for i, f in enumerate(FEATURES)}
    _request_features(X, col, asks)
    u = _Universe.of(asks, jobs)
    _user_queue_features(X, col, u)
    if all_users:
        _queue_features(X, col, u, capacity)
        _partition_features(X, col, u, asks, jobs)
    _user_wait_features(X, col, u)
    if all_users:
        _cluster_wait_features(X, col, u)
    return X


def _request_features(X, col: dict, asks: Asks) -> None:
    """The request itself and the calendar (cluster wall clock)."""
    import numpy as np

    X[:, col["nodes"]] = asks.nodes
    X[:, col["gpus"]] = asks.gpus
    X[:, col["cpus"]] = np.where(asks.cpus > 0, asks.cpus, np.nan)  # 0 = not recorded
    X[:, col["log_limit"]] = np.log10(np.maximum(asks.limit, 60.0))
    X[:, col["partition_code"]] = asks.partition_code
    X[:, col["qos_code"]] = asks.qos_code
    X[:, col["hour"]], X[:, col["weekday"]] = calendar(asks.t)


def calendar(t) -> "tuple[np.ndarray, np.ndarray]":
    """Hour of day (with minutes as a fraction) and weekday (Monday 0) of epoch seconds, UTC: what
    ``pd.to_datetime(t, unit="s")`` gives (its float-to-nanosecond rounding included; a test
    compares them on fractional seconds), without pandas."""
    import numpy as np

    t = np.asarray(t, float)
    base = np.trunc(t)
    ns = base.astype(np.int64) * 10**9 + (np.round(t - base, 9) * 1e9).astype(np.int64)
    s = ns // 10**9
    return (s // 3600) % 24 + ((s // 60) % 60) / 60.0, ((s // 86400) + 3) % 7  # 1970-01-01 was a Thursday


@dataclass
class _Universe:
    """The universe's jobs as arrays, with the intervals in which each was pending and running,
    and the queries' keys: what every sweep below reads."""

    t: "np.ndarray"  # the queries' times
    u_code: "np.ndarray"  # user code of each universe job (one code space with the queries)
    q_code: "np.ndarray"  # user code of each query
    qk: "np.ndarray"  # (user, t) query keys
    start: "np.ndarray"
    nodes: "np.ndarray"
    limit: "np.ndarray"  # time limit, UNKNOWN_LIMIT_S where unknown
    wait: "np.ndarray"
    pend: "np.ndarray"  # was ever pending
    p_in: "np.ndarray"  # pending from (recorded eligible time) ...
    p_out: "np.ndarray"  # ... until it left the queue (start or end)
    pw: "np.ndarray"  # pending weights: jobs, nodes, node-hours by limit, eligible time
    ran: "np.ndarray"  # started
    r_in: "np.ndarray"  # running from start ...
    r_out: "np.ndarray"  # ... until its end
    rw: "np.ndarray"  # running weights: jobs, nodes, node-hours until the limit's end

    @classmethod
    def of(cls, asks: Asks, jobs: Jobs) -> "_Universe":
        import numpy as np

        t, u_code, q_code = asks.t, jobs.user, asks.user
        elig, start, end, nodes = jobs.t_queue, jobs.start, jobs.end, jobs.nodes
        limit = np.where(np.isnan(jobs.limit), UNKNOWN_LIMIT_S, jobs.limit)  # a constant: a median would see the future
        big = SPAN - 1.0

        # --- pending: eligible < t and left the queue (start or end, whichever first) > t
        leave = np.fmin(np.where(np.isnan(start), np.inf, start), np.where(np.isnan(end), np.inf, end))
        pend = leave > elig  # else it was never pending
        p_in, p_out = elig[pend], np.minimum(leave[pend], big)
        pw = np.column_stack([np.ones(pend.sum()), nodes[pend], nodes[pend] * limit[pend] / 3600.0, p_in])
        # --- running: start <= t < end
        ran = ~np.isnan(start)
        r_in = start[ran]
        r_out = np.minimum(np.where(np.isnan(end[ran]), np.inf, np.maximum(end[ran], start[ran])), big)
        rw = np.column_stack([np.ones(ran.sum()), nodes[ran], nodes[ran] * (start[ran] + limit[ran]) / 3600.0])
        return cls(t=t, u_code=u_code, q_code=q_code, qk=q_code * SPAN + t, start=start, nodes=nodes, limit=limit,
                   wait=jobs.wait, pend=pend, p_in=p_in, p_out=p_out, pw=pw, ran=ran,
                   r_in=r_in, r_out=r_out, rw=rw)


def _user_queue_features(X, col: dict, u: _Universe) -> None:
    """The user's own jobs pending and running at t (own jobs are always visible)."""
    pend, ran = u.pend, u.ran
    up = _active(u.u_code[pend] * SPAN + u.p_in, u.u_code[pend] * SPAN + u.p_out, u.pw[:, :2], u.qk, in_side="left")
    X[:, col["user_pending_jobs"]], X[:, col["user_pending_nodes"]] = up[:, 0], up[:, 1]
    ur = _active(u.u_code[ran] * SPAN + u.r_in, u.u_code[ran] * SPAN + u.r_out, u.rw[:, 1:2], u.qk, in_side="left")
    X[:, col["user_running_nodes"]] = ur[:, 0]


def _queue_features(X, col: dict, u: _Universe, capacity: float) -> None:
    """The whole cluster's queue at t: pending and running work, its age, the drain time."""
    import numpy as np

    t = u.t
    cp = _active(u.p_in, u.p_out, u.pw, t, in_side="left")
    cr = _active(u.r_in, u.r_out, u.rw, t, in_side="left")
    X[:, col["q_pending_jobs"]], X[:, col["q_pending_nodes"]], X[:, col["q_pending_nodeh"]] = cp[:, 0], cp[:, 1], cp[:, 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        X[:, col["q_pending_mean_age_h"]] = np.where(cp[:, 0] > 0, (t - cp[:, 3] / np.maximum(cp[:, 0], 1)) / 3600.0, 0.0)
    X[:, col["q_running_jobs"]], X[:, col["q_running_nodes"]] = cr[:, 0], cr[:, 1]
    X[:, col["q_running_left_nodeh"]] = cr[:, 2] - cr[:, 1] * t / 3600.0
    cap = max(float(capacity), 1.0)
    X[:, col["q_pending_nodes_frac"]] = cp[:, 1] / cap
    X[:, col["q_running_nodes_frac"]] = cr[:, 1] / cap
    # hours the whole cluster needs to drain what is queued and what runs (by limits)
    X[:, col["q_backlog_h"]] = (cp[:, 2] + np.maximum(X[:, col["q_running_left_nodeh"]], 0.0)) / cap
    X[:, col["q_free_nodes_frac"]] = np.maximum(cap - cr[:, 1], 0.0) / cap
    X[:, col["q_pending_max_age_h"]] = _oldest_pending_age_h(u.p_in, u.p_out, t)


def _partition_features(X, col: dict, u: _Universe, asks: Asks, jobs: Jobs) -> None:
    """The same queue seen from the requested partition only: sweeps keyed by (partition, time)."""
    import numpy as np

    t, pend, ran = u.t, u.pend, u.ran
    pa = jobs.part
    qp = asks.part * SPAN + t
    pp = _active(pa[pend] * SPAN + u.p_in, pa[pend] * SPAN + u.p_out, u.pw[:, :3], qp, in_side="left")
    pr = _active(pa[ran] * SPAN + u.r_in, pa[ran] * SPAN + u.r_out, u.rw[:, 1:3], qp, in_side="left")
    X[:, col["q_part_pending_jobs"]], X[:, col["q_part_pending_nodes"]] = pp[:, 0], pp[:, 1]
    X[:, col["q_part_pending_nodeh"]], X[:, col["q_part_running_nodes"]] = pp[:, 2], pr[:, 0]
    X[:, col["q_part_running_left_nodeh"]] = pr[:, 1] - pr[:, 0] * t / 3600.0
    ran_idx = np.flatnonzero(ran)
    pk = pa[ran_idx] * SPAN + u.start[ran_idx]
    o = np.argsort(pk, kind="stable")
    pk, plw, pcode = pk[o], log_wait(u.wait[ran_idx])[o], pa[ran_idx][o]
    if len(pk):
        pos_p = np.searchsorted(pk, qp, side="left") - 1
        ok_p = (pos_p >= 0) & (pcode[np.clip(pos_p, 0, None)] == np.floor(qp / SPAN))
        first_p = np.searchsorted(pk, np.floor(qp / SPAN) * SPAN, side="left")
        X[:, col["c_part_med_wait50"]] = _window_stats(plw, np.where(ok_p, pos_p, -1), first_p, CLUSTER_WINDOW)[0]


def _started_waits(u: _Universe) -> "tuple[np.ndarray, np.ndarray]":
    """The started jobs and their log10 waits (known from their start on)."""
    import numpy as np

    s_idx = np.flatnonzero(u.ran)
    lw = log_wait(u.wait[s_idx])
    return s_idx, np.where(np.isnan(u.wait[s_idx]), np.nan, lw)


def _user_wait_features(X, col: dict, u: _Universe) -> None:
    """The user's recent waits and usage: the user's started jobs, ordered by (user, start)."""
    import numpy as np

    s_idx, lw = _started_waits(u)
    n = len(u.t)
    ukeys = u.u_code[s_idx] * SPAN + u.start[s_idx]
    o = np.argsort(ukeys, kind="stable")
    ukeys, ulw, ucode_s = ukeys[o], lw[o], u.u_code[s_idx][o]
    unodes, unodeh = u.nodes[s_idx][o], (u.nodes * u.limit)[s_idx][o] / 3600.0
    pos = np.searchsorted(ukeys, u.qk, side="left") - 1  # last job of this user started before t
    same = (pos >= 0) & (ucode_s[np.clip(pos, 0, None)] == u.q_code) if len(ukeys) else np.zeros(n, bool)
    first_of_user = np.searchsorted(ukeys, u.q_code * SPAN, side="left")
    X[:, col["user_n_prev"]] = np.where(same, pos - first_of_user + 1, 0)
    if len(ukeys):
        pc = np.clip(pos, 0, None)
        med, mean = _window_stats(ulw, np.where(same, pos, -1), first_of_user, USER_WINDOW)
        X[:, col["user_med_wait20"]], X[:, col["user_mean_wait20"]] = med, mean
        X[:, col["user_last_wait"]] = np.where(same, ulw[pc], np.nan)
        c_nodes = np.concatenate([[0.0], np.cumsum(unodes)])
        c_nodeh = np.concatenate([[0.0], np.cumsum(unodeh)])
        lo = np.searchsorted(ukeys, u.qk - 7 * _DAY, side="right")
        hi = pos + 1
        X[:, col["user_nodes_started_7d"]] = np.where(same, c_nodes[hi] - c_nodes[lo], 0.0)
        X[:, col["user_nodeh_req_7d"]] = np.where(same, c_nodeh[hi] - c_nodeh[lo], 0.0)
    else:
        for f in ("user_nodes_started_7d", "user_nodeh_req_7d"):
            X[:, col[f]] = 0.0


def _cluster_wait_features(X, col: dict, u: _Universe) -> None:
    """The cluster's recent waits: the last CLUSTER_WINDOW jobs that started before t."""
    import numpy as np

    s_idx, lw = _started_waits(u)
    if not len(s_idx):
        return
    t = u.t
    o = np.argsort(u.start[s_idx], kind="stable")
    cs, clw = u.start[s_idx][o], lw[o]
    cpos = np.searchsorted(cs, t, side="left") - 1
    okc = cpos >= 0
    pc = np.clip(cpos, 0, None)
    X[:, col["c_med_wait50"]], X[:, col["c_mean_wait50"]] = _window_stats(clw, cpos, np.zeros(len(t), int), CLUSTER_WINDOW)
    X[:, col["c_last_wait"]] = np.where(okc, clw[pc], np.nan)
    X[:, col["c_started_6h"]] = cpos + 1 - np.searchsorted(cs, t - 6 * 3600.0, side="left")


def _window_stats(values, last, first, width: int):
    """Median and mean of ``values[max(first, last - width + 1) : last + 1]`` per query (NaN
    where last < first). A (queries x width) gather: only the windows asked for are computed,
    so one live query costs microseconds and a training set a few hundred milliseconds."""
    import numpy as np

    last = np.asarray(last)
    first = np.asarray(first)
    if len(values) == 0 or len(last) == 0:
        nan = np.full(len(last), np.nan)
        return nan, nan
    idx = last[:, None] - np.arange(width)[None, :]
    ok = (idx >= first[:, None]) & (idx >= 0) & (last[:, None] >= first[:, None])
    vals = np.where(ok, values[np.clip(idx, 0, len(values) - 1)], np.nan)
    has = ok.any(axis=1)
    med = np.full(len(last), np.nan)
    mean = np.full(len(last), np.nan)
    med[has] = _nanmedian_rows(vals[has])
    mean[has] = np.nanmean(vals[has], axis=1)
    return med, mean


def _nanmedian_rows(vals):
    """``np.nanmedian(vals, axis=1)`` for rows with at least one value, the same floats: the two
    middle values of the sorted row, added and halved, as numpy's small-array median does (for an
    odd count both are the middle one), without its masked-array machinery (most of a live ask's time).
    Only a tie of -0.0 with 0.0 may come out with the other sign; log waits are never -0.0."""
    import numpy as np

    s = np.sort(vals, axis=1)  # NaN last
    cnt = np.count_nonzero(~np.isnan(vals), axis=1)
    r = np.arange(len(s))
    return (s[r, np.where(cnt % 2 == 1, cnt // 2, cnt // 2 - 1)] + s[r, cnt // 2]) / 2.0


def _oldest_pending_age_h(k_in, k_out, q):
    """Hours since the oldest job still pending at each q became eligible (0 if none).

    Walk the queries in time order with a heap of pending jobs keyed by eligible time:
    O((n + m) log n), exact, and still only a comparison with each job's leave time.
    """
    import heapq

    import numpy as np

    if len(q) and (q == q[0]).all():
        # every query at one moment (a live ask): the heap's top would be the earliest-eligible
        # job among those pending at t, so take that minimum directly (the same float)
        t = q[0]
        live = (k_in < t) & (k_out > t)
        return np.full(len(q), (t - k_in[live].min()) / 3600.0 if live.any() else 0.0)
    oi = np.argsort(k_in, kind="stable")
    ins, outs = k_in[oi], k_out[oi]
    res = np.zeros(len(q))
    heap: list[tuple[float, float]] = []
    j = 0
    for i in np.argsort(q, kind="stable"):
        t = q[i]
        while j < len(ins) and ins[j] < t:
            heapq.heappush(heap, (ins[j], outs[j]))
            j += 1
        while heap and heap[0][1] <= t:  # left the queue by t
            heapq.heappop(heap)
        res[i] = (t - heap[0][0]) / 3600.0 if heap else 0.0
    return res


def _active(k_in, k_out, w, q, *, in_side: str):
    """Sum of weights ``w`` over items with k_in before q and k_out > q, for each query key q.

    ``in_side="left"`` counts k_in < q, ``"right"`` counts k_in <= q; an item leaves at
    k_out <= q. Items must have k_out >= k_in.
    """
    import numpy as np

    w = np.asarray(w, float)
    w = w[:, None] if w.ndim == 1 else w
    if len(k_in) == 0:
        return np.zeros((len(q), w.shape[1]))
    oi, oo = np.argsort(k_in, kind="stable"), np.argsort(k_out, kind="stable")
    ci = np.vstack([np.zeros(w.shape[1]), np.cumsum(w[oi], axis=0)])
    co = np.vstack([np.zeros(w.shape[1]), np.cumsum(w[oo], axis=0)])
    a = np.searchsorted(k_in[oi], q, side=in_side)
    b = np.searchsorted(k_out[oo], q, side="right")
    return ci[a] - co[b]
