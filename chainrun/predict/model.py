"""Quantile LightGBM models of log10 queue wait: one cluster-wide, plus per-user ones.

The boosters learn the wait *relative to the user's recent waits* (log10 wait minus the
mean log10 wait of the user's last 20 jobs, or minus the training mean for a new user).
Trees cannot extrapolate; anchoring lets a model trained in a quiet month still move with
a busy one (on LS6, Nov-Jan -> Feb: coverage 0.64 -> 0.71, pinball a little better).

A per-user model is kept only where it earns its place: users with enough history get a
candidate model trained on the first 80 % (in time) of the training rows, and it must beat
the cluster-wide model trained on the same rows on that user's last 20 % (mean pinball
loss over p10/p50/p90). Everyone else -- and every new user -- gets the cluster model
(cold start). Saved as LightGBM text files plus ``meta.json``; never pickle.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from chainrun.errors import ModelError
from chainrun.predict.features import FEATURES, build_features, log_wait
from chainrun.predict.prep import default_since, prepare

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

QUANTILES = (0.1, 0.5, 0.9)
FORMAT = 1
MIN_ROWS = 20  # fewer and the quantiles are noise; a test cluster has a few dozen
MIN_USER_ROWS = 300  # training rows before a user may get an own model
MAX_USER_MODELS = 8  # candidates per fit, heaviest users first
MAX_TRAIN_ROWS = 100_000  # most recent rows kept: queues drift, and it bounds refresh cost
HISTORY_DAYS = 8.0  # history a prediction needs: 7-day usage window + slack
# chosen on a time holdout *inside* the LS6 training months (last 20 % of Nov-Jan), never on
# the February test: a 27-point grid over leaves {15,31,63} x min leaf {20,40,100} x rounds
# {100,200,400}; small, heavily regularised trees won (mean holdout pinball 0.308 vs 0.321)
PARAMS = {
    "objective": "quantile", "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 100,
    "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
    # one thread: OpenMP spinning on a shared 2-core box was 7x slower than one thread
    # one thread: OpenMP spinning on a shared 2-core box made fits 7x slower than one thread
    "num_threads": 1, "verbose": -1, "seed": 7, "deterministic": True,
}
ROUNDS = 100
USER_ROUNDS = 100


@dataclass(frozen=True)
class WaitRequest:
    """One question: how long would this job wait if submitted at ``submit`` (epoch s; None = now)?"""

    user: str
    nodes: int
    gpus: int
    cpus: int
    timelimit_s: float
    partition: str = ""
    qos: str = ""
    submit: float | None = None


@dataclass(frozen=True)
class Prediction:
    """Wait quantiles in seconds, and which model answered ("cluster" or "user:<name>")."""

    p10: float
    p50: float
    p90: float
    model: str

    def quantile(self, q: float) -> float:
        """Any quantile, interpolated in log-wait vs normal-score space through p10/p50/p90."""
        import math
        from statistics import NormalDist

        if not 0.0 < q < 1.0:
            raise ValueError("q must be in (0, 1)")
        z = NormalDist().inv_cdf(q)
        z90 = NormalDist().inv_cdf(0.9)
        lo, mid, hi = (math.log10(max(v, 1.0)) for v in (self.p10, self.p50, self.p90))
        v = mid + (z / z90) * ((hi - mid) if z >= 0 else (mid - lo))
        return float(10.0 ** v)


def _qname(q: float) -> str:
    return f"p{int(round(q * 100))}"


class Predictor:
    """Cluster model + selected per-user models; see the module doc."""

    def __init__(self, boosters: dict[str, dict[float, object]], meta: dict) -> None:
        self.boosters = boosters  # "cluster" or "user:<name>" -> {q: lightgbm.Booster}
        self.meta = meta

    # ------------------------------------------------------------ prediction
    def model_for(self, user: str) -> str:
        key = f"user:{user}"
        return key if key in self.boosters else "cluster"

    def features_for(self, request: WaitRequest, snapshot: "pd.DataFrame | None", history: "pd.DataFrame | None"):
        import numpy as np
        import pandas as pd

        now = float(request.submit) if request.submit is not None else time.time()
        universe = _universe(now, request.user, snapshot, history)
        partition = request.partition or _usual_partition(universe, request.user)
        q = pd.DataFrame({
            "user": [request.user], "t": [now], "nodes": [request.nodes], "gpus": [request.gpus],
            "cpus": [request.cpus], "timelimit_s": [float(request.timelimit_s)],
            "partition": [partition], "qos": [request.qos or ""],
        })
        X = build_features(q, universe, capacity=self.meta["capacity"], all_users=self.meta["all_users"],
                           categories=self.meta["categories"])
        return np.asarray(X, float)

    def predict(self, request: WaitRequest, snapshot: "pd.DataFrame | None" = None,
                history: "pd.DataFrame | None" = None) -> Prediction:
        X = self.features_for(request, snapshot, history)
        name = self.model_for(request.user)
        lo, mid, hi = self.predict_matrix(X, [name])[0]
        return Prediction(float(10**lo), float(10**mid), float(10**hi), name)

    def predict_matrix(self, X, models: list[str]) -> "np.ndarray":
        """log10-wait quantiles (rows x 3) for a feature matrix; ``models`` per row or one for all."""
        import numpy as np

        out = np.empty((len(X), len(QUANTILES)))
        anchor = anchor_of(X, self.meta["anchor_fallback"])
        names = np.asarray(models * len(X) if len(models) == 1 else models)
        for name in np.unique(names):
            rows = names == name
            for j, q in enumerate(QUANTILES):
                out[rows, j] = anchor[rows] + self.boosters[name][q].predict(X[rows], num_threads=1)
        out = np.sort(out, axis=1)  # quantile models are fitted apart: keep them ordered
        return np.maximum(out, 0.0)

    # ------------------------------------------------------------ storage
    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        files = {}
        for i, (name, models) in enumerate(sorted(self.boosters.items())):
            stem = "cluster" if name == "cluster" else f"user{i:04d}"
            files[name] = {}
            for q, b in models.items():
                fn = f"{stem}_{_qname(q)}.txt"
                b.save_model(str(d / fn))
                files[name][_qname(q)] = fn
        meta = {**self.meta, "files": files}
        tmp = d / ".meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, d / "meta.json")  # meta last: a half-written model has no meta
        return d


def load_predictor(directory: str | Path) -> Predictor:
    """Load a saved predictor; refuses a model built for another feature list."""
    import lightgbm as lgb

    d = Path(directory)
    try:
        meta = json.loads((d / "meta.json").read_text())
    except FileNotFoundError:
        raise ModelError(f"no queue-delay model in {d}", hint="run: chainrun model refresh") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"unreadable model metadata {d / 'meta.json'}: {e}", hint="run: chainrun model refresh") from None
    if meta.get("format") != FORMAT:
        raise ModelError(f"model in {d} has format {meta.get('format')}, this chainrun reads {FORMAT}",
                         hint="run: chainrun model refresh")
    if list(meta.get("features", [])) != list(FEATURES):
        missing = sorted(set(FEATURES) - set(meta.get("features", [])))
        extra = sorted(set(meta.get("features", [])) - set(FEATURES))
        raise ModelError(
            f"model in {d} was trained on a different feature list (missing {missing or 'none'}, "
            f"unknown {extra or 'none'}, or another order)", hint="run: chainrun model refresh")
    boosters: dict[str, dict[float, object]] = {}
    for name, per_q in meta["files"].items():
        boosters[name] = {}
        for q in QUANTILES:
            path = d / per_q[_qname(q)]
            try:
                b = lgb.Booster(model_file=str(path))
            except Exception as e:  # lightgbm raises its own error type for bad files
                raise ModelError(f"cannot load {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            if b.feature_name() != list(FEATURES):
                raise ModelError(f"{path} was trained on other features than its meta.json says",
                                 hint="run: chainrun model refresh")
            boosters[name][q] = b
    meta.pop("files", None)
    return Predictor(boosters, meta)


# ---------------------------------------------------------------- training
def training_rows(p: "pd.DataFrame", *, since: float | None, until: float | None) -> "np.ndarray":
    """Indices of prepared rows usable as targets: started, not dependency-like, in window."""
    import numpy as np

    t = p["submit"].to_numpy(float)
    ok = ~p["censored"].to_numpy(bool) & ~p["dep_like"].to_numpy(bool)
    if since is not None:
        ok &= p["t_elig"].to_numpy(float) >= since
    if until is not None:
        # only waits known at the cut: submitted and started before it
        ok &= (t < until) & (p["start"].to_numpy(float) < until)
    return np.flatnonzero(ok)


def queries_of(p: "pd.DataFrame", idx) -> "pd.DataFrame":
    q = p.iloc[idx][["user", "nodes", "gpus", "cpus", "timelimit_s", "partition", "qos"]].copy()
    q["t"] = p["t_elig"].to_numpy(float)[idx]
    return q.reset_index(drop=True)


def estimate_capacity(p: "pd.DataFrame") -> float:
    """Nodes of the cluster, guessed as the 99th percentile of nodes in use at job starts."""
    import numpy as np

    from chainrun.predict.features import _active

    ran = p["start"].notna().to_numpy()
    if not ran.any():
        return 1.0
    s = p["start"].to_numpy(float)[ran]
    e = p["end"].to_numpy(float)[ran]
    e = np.where(np.isnan(e), np.inf, np.maximum(e, s))
    use = _active(s, e, p["nodes"].to_numpy(float)[ran], s, in_side="right")[:, 0]
    return float(max(1.0, np.percentile(use, 99)))


def fit_predictor(history: "pd.DataFrame", *, since: float | None = None, until: float | None = None,
                  per_user: str = "auto", all_users: bool | None = None, prepared: "pd.DataFrame | None" = None,
                  rounds: int = ROUNDS) -> Predictor:
    """Train from a canonical frame. ``since`` defaults to the data's own warm-up end
    (first start + 7 days) when the history spans 4 weeks or more, else to its start;
    ``per_user`` is "auto" (selected on a time holdout), "always" or "never"."""
    import numpy as np
    import lightgbm as lgb

    if per_user not in ("auto", "always", "never"):
        raise ValueError(per_user)
    t0 = time.time()
    p = prepared if prepared is not None else prepare(history)
    if since is None:
        since = default_since(p)
    idx = training_rows(p, since=since, until=until)
    if len(idx) > MAX_TRAIN_ROWS:
        idx = idx[np.argsort(p["t_elig"].to_numpy(float)[idx], kind="stable")[-MAX_TRAIN_ROWS:]]
    if len(idx) < MIN_ROWS:
        raise ModelError(f"only {len(idx)} started jobs to learn from (need {MIN_ROWS})",
                         hint="widen the history window, or wait until more jobs have run")
    if all_users is None:
        all_users = p["user"].nunique() > 1
    categories = {c: {v: i for i, v in enumerate(sorted(set(p[c].astype(str)) - {""}))} for c in ("partition", "qos")}
    meta = {
        "format": FORMAT, "features": list(FEATURES), "quantiles": list(QUANTILES),
        "capacity": estimate_capacity(p if until is None else p[p["start"] < until]), "all_users": bool(all_users), "categories": categories,
        "versions": _versions(), "target": "log10(max(wait_s, 1))",
    }
    q = queries_of(p, idx)
    X = build_features(q, p, capacity=meta["capacity"], all_users=all_users, categories=categories)
    y = log_wait(p["wait"].to_numpy(float)[idx])
    meta["anchor_fallback"] = float(np.mean(y))
    anchor = anchor_of(X, meta["anchor_fallback"])
    r = y - anchor  # what the boosters learn; see the module doc
    t = q["t"].to_numpy(float)
    users = q["user"].astype(str).to_numpy()

    def fit(rows, n_rounds):
        ds = lgb.Dataset(X[rows], r[rows], feature_name=list(FEATURES), free_raw_data=False,
                         params={"verbose": -1})
        return {qq: lgb.train({**PARAMS, "alpha": qq, "min_data_in_leaf": min(PARAMS["min_data_in_leaf"], max(5, len(rows) // 20))},
                              ds, num_boost_round=n_rounds) for qq in QUANTILES}

    boosters = {"cluster": fit(np.arange(len(y)), rounds)}
    chosen: dict[str, dict] = {}
    if per_user != "never":
        cut = np.quantile(t, 0.8)
        early, late = t < cut, t >= cut
        counts = {u: int(c) for u, c in zip(*np.unique(users[early], return_counts=True))}
        cands = [u for u, c in counts.items() if c >= MIN_USER_ROWS and (users[late] == u).sum() >= 20]
        # the heaviest users only: each candidate costs two small fits (refresh time budget)
        cands = sorted(cands, key=lambda u: -counts[u])[:MAX_USER_MODELS]
        early_global = fit(np.flatnonzero(early), rounds) if (cands and per_user == "auto") else None
        for u in cands:
            mine = users == u
            if per_user == "auto":
                cand = fit(np.flatnonzero(mine & early), USER_ROUNDS)
                rows = np.flatnonzero(mine & late)
                g = _pinball_all(early_global, X[rows], r[rows])
                m = _pinball_all(cand, X[rows], r[rows])
                if not m < 0.98 * g:
                    continue
                chosen[u] = {"holdout_pinball_user": m, "holdout_pinball_cluster": g}
            else:
                chosen[u] = {}
            boosters[f"user:{u}"] = fit(np.flatnonzero(mine), USER_ROUNDS)
            chosen[u]["train_rows"] = int(mine.sum())
    meta.update({
        "trained_at": time.time(), "fit_seconds": round(time.time() - t0, 2), "per_user_policy": per_user,
        "training_window": {"since": float(np.min(t)), "until": float(np.max(t)), "rows": int(len(y)),
                            "users": int(len(set(users)))},
        "user_models": chosen,
        "train_metrics": _pinball_dict(boosters["cluster"], X, r),
    })
    return Predictor(boosters, meta)


def anchor_of(X, fallback: float) -> "np.ndarray":
    """Mean log10 wait of the user's last 20 jobs, or ``fallback`` for a user without any."""
    import numpy as np

    a = X[:, FEATURES.index("user_mean_wait20")]
    return np.where(np.isnan(a), fallback, a)


def _pinball_all(models, X, y) -> float:
    import numpy as np

    return float(np.mean([pinball(y, models[q].predict(X), q) for q in QUANTILES]))


def _pinball_dict(models, X, y) -> dict:
    return {_qname(q): round(pinball(y, models[q].predict(X), q), 4) for q in QUANTILES}


def pinball(y, pred, q: float) -> float:
    import numpy as np

    d = np.asarray(y, float) - np.asarray(pred, float)
    return float(np.mean(np.maximum(q * d, (q - 1) * d)))


def _usual_partition(universe: "pd.DataFrame", user: str) -> str:
    """No partition asked for: Slurm will use the default; guess it as the user's most used
    partition, else the cluster's ("" when the history has none)."""
    parts = universe["partition"].astype(str)
    parts = parts[parts != ""]
    if not len(parts):
        return ""
    mine = parts[universe.loc[parts.index, "user"].astype(str) == str(user)]
    return str((mine if len(mine) else parts).value_counts().index[0])


def _universe(now: float, user: str, snapshot, history) -> "pd.DataFrame":
    """Recent history + the live snapshot, with every fact after ``now`` masked out."""
    import numpy as np
    import pandas as pd

    from chainrun.traces import CANONICAL_COLUMNS

    parts = []
    snap_ids: set = set()
    if snapshot is not None and len(snapshot):
        s = snapshot.copy()
        st = s["state"].astype(str).str.upper()
        s = s[st.isin(["PENDING", "RUNNING"])].copy()
        st = s["state"].astype(str).str.upper()
        s.loc[st == "PENDING", ["start", "end"]] = np.nan  # squeue's start of a pending job is a guess
        s.loc[st == "RUNNING", "end"] = np.nan  # ... and the end of a running one too
        snap_ids = set(s["job_id"].astype(str))
        parts.append(s)
    if history is not None and len(history):
        h = history
        start, end = h["start"].to_numpy(float), h["end"].to_numpy(float)
        lo = now - HISTORY_DAYS * 86400.0
        keep = (h["submit"].to_numpy(float) < now) & ((start >= lo) | (end >= lo) | np.isnan(end))
        mine = (h["user"].astype(str) == str(user)).to_numpy() & ~np.isnan(start)
        if mine.any():  # the user's last jobs count however old they are
            last = np.flatnonzero(mine)[np.argsort(start[mine])[-40:]]
            keep[last] = True
        h = h[keep]
        if snap_ids:
            h = h[~h["job_id"].astype(str).isin(snap_ids)]
        h = h.copy()
        for c in ("start", "end"):  # a history that knows the future must not leak it
            h.loc[h[c] >= now, c] = np.nan
        parts.append(h)
    if not parts:
        return prepare(pd.DataFrame({c: pd.Series(dtype=float) for c in CANONICAL_COLUMNS}).astype(
            {"user": str, "eligible_known": bool}), now=now)
    u = pd.concat(parts, ignore_index=True)
    if "eligible_known" not in u:
        u["eligible_known"] = False
    u["eligible_known"] = u["eligible_known"].fillna(False).astype(bool)
    if "eligible" not in u:
        u["eligible"] = u["submit"]
    return prepare(u, now=now)


def _versions() -> dict:
    import lightgbm
    import numpy

    from chainrun import __version__

    return {"chainrun": __version__, "lightgbm": lightgbm.__version__, "numpy": numpy.__version__}
