"""The prediction path on numpy columns: what ``Predictor.predict`` computes, without pandas.

``Predictor.features_for`` builds the universe (``model._universe``: recent history plus the
live snapshot, every fact after ``now`` masked), prepares it (``prep.prepare``) and builds the
features (``features.build_features``), all on DataFrames: about 20 ms of pandas calls per
answer, most of the chain replay's time (issue 24). Here the same steps run on arrays the caller
keeps (the replay holds its trace as arrays once, chainrun/sim/adapter.py), then the one
feature code (``features.feature_matrix``) and the model's own ``predict_matrix``.

The result is the same bits, not an approximation: rows keep the pandas path's order
(snapshot first, then history), the history keeps and drops the same rows, users and
partitions are numbered in order of first appearance as ``pd.unique`` numbers them (the code
order fixes the order of float additions in the sweeps), and ``prepared_columns`` is the code
``prepare`` runs. tests/sim/test_fast_asks.py compares both paths on many asks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from chainrun.predict.distribution import Prediction
    from chainrun.predict.model import Predictor, WaitRequest

NO_KEY = -1  # a history job no snapshot row can name


class Names:
    """One code space for user and partition names (any numbering: codes only group; the
    features renumber them in order of appearance)."""

    def __init__(self) -> None:
        self.users: dict[str, int] = {}
        self.parts: dict[str, int] = {}
        self.part_names: list[str] = []

    def user(self, name: str) -> int:
        return self.users.setdefault(str(name), len(self.users))

    def part(self, name: str) -> int:
        name = str(name)
        if name not in self.parts:
            self.parts[name] = len(self.part_names)
            self.part_names.append(name)
        return self.parts[name]

    def codes(self, values, kind: str) -> "np.ndarray":
        import numpy as np

        code = self.user if kind == "user" else self.part
        return np.fromiter((code(v) for v in values), np.int64, len(values))


@dataclass
class JobColumns:
    """Jobs in canonical columns (chainrun.traces), as arrays. ``key`` is the job id as the
    snapshot names it (a history row whose id equals a snapshot row's is that job: the history
    copy is dropped, as ``model._universe`` drops it); NO_KEY where no snapshot row can match."""

    key: "np.ndarray"  # int64
    user: "np.ndarray"  # int64, Names.user
    part: "np.ndarray"  # int64, Names.part
    submit: "np.ndarray"
    eligible: "np.ndarray"
    start: "np.ndarray"
    end: "np.ndarray"
    limit: "np.ndarray"  # timelimit_s
    nodes: "np.ndarray"
    known: "np.ndarray"  # bool: eligible_known

    def __len__(self) -> int:
        return len(self.submit)

    def take(self, idx) -> "JobColumns":
        return JobColumns(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @staticmethod
    def concat(parts: "list[JobColumns]") -> "JobColumns":
        import numpy as np

        return JobColumns(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(JobColumns)})


@dataclass
class Universe:
    """``model._universe`` after ``prep.prepare``: the jobs and the two prepared columns features read."""

    jobs: JobColumns
    t_queue: "np.ndarray"
    wait: "np.ndarray"


def universe_at(now: float, user: int, snapshot: JobColumns | None, history: JobColumns | None) -> Universe:
    """``model._universe(now, user, snapshot, history)`` then ``prepare(..., now=now)`` on arrays.

    ``snapshot``: pending and running jobs (squeue; a pending job's start must be NaN). ``history``:
    jobs as sacct shows them at ``now`` (start/end NaN while unknown). ``user``: Names.user code."""
    import numpy as np

    from chainrun.predict.model import HISTORY_DAYS
    from chainrun.predict.prep import prepared_columns

    parts = []
    if snapshot is not None and len(snapshot):
        s = snapshot.take(slice(None))  # views; the end below is a new array, the caller's stay as they were
        s.end = np.full(len(s), np.nan)  # squeue's end of a running job (and the start of a pending one) is a guess
        parts.append(s)
    if history is not None and len(history):
        h = history
        start, end = h.start, h.end
        lo = now - HISTORY_DAYS * 86400.0
        keep = (h.submit < now) & ((start >= lo) | (end >= lo) | np.isnan(end))
        mine = (h.user == user) & ~np.isnan(start)
        if mine.any():  # the user's last jobs count however old they are
            last = np.flatnonzero(mine)[np.argsort(start[mine])[-40:]]
            keep[last] = True
        if parts:
            keep &= ~np.isin(h.key, parts[0].key)
        h = h.take(keep)
        h.start = np.where(h.start >= now, np.nan, h.start)  # a history that knows the future must not leak it
        h.end = np.where(h.end >= now, np.nan, h.end)
        parts.append(h)
    if not parts:
        empty = np.zeros(0)
        jobs = JobColumns(key=empty.astype(np.int64), user=empty.astype(np.int64), part=empty.astype(np.int64),
                          submit=empty, eligible=empty, start=empty, end=empty, limit=empty, nodes=empty,
                          known=empty.astype(bool))
    else:
        jobs = parts[0] if len(parts) == 1 else JobColumns.concat(parts)
    prep = prepared_columns(jobs.submit, jobs.eligible, jobs.start, jobs.end, jobs.known, jobs.user, now=now)
    return Universe(jobs=jobs, t_queue=prep["t_queue"], wait=prep["wait"])


def usual_partition(u: Universe, user: int, names: Names) -> str:
    """``model._usual_partition``: the user's most used partition, else the cluster's ("" when
    none is named); ties go to the first seen, as ``value_counts`` orders them."""
    import numpy as np

    named = u.jobs.part != names.parts.get("", -1)
    pick = named & (u.jobs.user == user)
    if not pick.any():
        pick = named
    if not pick.any():
        return ""
    codes = u.jobs.part[pick]
    uniq, first, counts = np.unique(codes, return_index=True, return_counts=True)
    most = counts == counts.max()
    return names.part_names[int(uniq[most][np.argmin(first[most])])]


def _first_seen(jobs_codes, ask_codes) -> "tuple[np.ndarray, np.ndarray]":
    """Codes renumbered in order of first appearance over the jobs, then the asks (``pd.unique``)."""
    import numpy as np

    allc = np.concatenate([jobs_codes, ask_codes])
    uniq, first, inv = np.unique(allc, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq))
    rank[np.argsort(first)] = np.arange(len(uniq), dtype=float)
    r = rank[inv]
    return r[: len(jobs_codes)], r[len(jobs_codes):]


def features_at(predictor: "Predictor", now: float, requests: "list[WaitRequest]", u: Universe,
                names: Names) -> "np.ndarray":
    """``Predictor.features_for`` of each request asked at ``now`` (one row each)."""
    import numpy as np

    from chainrun.predict.features import Asks, Jobs, feature_matrix

    meta = predictor.meta
    ucode = np.array([names.user(r.user) for r in requests], np.int64)
    pnames = [r.partition or usual_partition(u, int(c), names) for r, c in zip(requests, ucode)]
    pcode = np.array([names.part(p) for p in pnames], np.int64)
    ju, au = _first_seen(u.jobs.user, ucode)
    jp, ap = _first_seen(u.jobs.part, pcode)
    cats = meta["categories"]
    cat = {name: np.array([cats.get(name, {}).get(str(v), np.nan) for v in values], float)
           for name, values in (("partition", pnames), ("qos", [r.qos or "" for r in requests]))}
    k = len(requests)
    asks = Asks(t=np.full(k, float(now)), nodes=np.array([r.nodes for r in requests], float),
                gpus=np.array([r.gpus for r in requests], float), cpus=np.array([r.cpus for r in requests], float),
                limit=np.array([float(r.timelimit_s) for r in requests], float),
                partition_code=cat["partition"], qos_code=cat["qos"], user=au, part=ap)
    j = u.jobs
    jobs = Jobs(user=ju, part=jp, t_queue=u.t_queue, start=j.start, end=j.end, nodes=j.nodes.astype(float),
                limit=j.limit, wait=u.wait)
    return feature_matrix(asks, jobs, capacity=meta["capacity"], all_users=meta["all_users"])


def predict_at(predictor: "Predictor", now: float, requests: "list[WaitRequest]", u: Universe,
               names: Names) -> "list[Prediction]":
    """``Predictor.predict_many`` of requests asked at ``now`` on the universe ``u``."""
    return [p for p, _ in predict_with_features_at(predictor, now, requests, u, names)]


def predict_with_features_at(predictor: "Predictor", now: float, requests: "list[WaitRequest]", u: Universe,
                             names: Names) -> "list[tuple[Prediction, np.ndarray]]":
    """``Predictor.predict_with_features`` of each request (chainrun.predict.doubt reads the row)."""
    from chainrun.predict.distribution import QUANTILES, Prediction

    X = features_at(predictor, now, requests, u, names)
    models = [predictor.model_for(r.user) for r in requests]
    out = []
    for name, row in zip(models, predictor.predict_matrix(X, models)):
        vals = tuple(float(10**v) for v in row)
        by = dict(zip(QUANTILES, vals))
        out.append(Prediction(by[0.1], by[0.5], by[0.9], name, tuple(QUANTILES), vals))
    return list(zip(out, X))
