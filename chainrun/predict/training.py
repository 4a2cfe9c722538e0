"""Training the queue-delay model: which jobs it learns from, and how the chosen models are fit.

The boosters learn the quantiles the product uses (QUANTILES) on the older 80 % of the training
rows; on the most recent 20 %, plus the jobs of that period still waiting at the cut, each quantile
is shifted so that its coverage there equals its level (chainrun/predict/calibration.py). Then the
boosters are fit again on every training row and keep those shifts (REFIT). The user anchor
(learning the wait relative to the user's recent waits) is an option the tuning turned off
(bench/predict_tune.py).

A per-user model is kept only where it earns its place: users with enough history get a
candidate model trained on their older rows, and it must beat the cluster-wide model on that
user's recent rows (mean pinball loss over the quantiles); it is calibrated on those rows.
Everyone else -- and every new user -- gets the cluster model (cold start).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chainrun.errors import ModelError
from chainrun.predict.calibration import (CAL_FRACTION, MIN_CAL_ROWS, censored_lb, censored_rows, conformal_shifts,
                                          last_fact, shifts_of)
from chainrun.predict.distribution import QUANTILES, pinball, qname
from chainrun.predict.features import FEATURES, build_features, log_wait
from chainrun.predict.model import FORMAT, Predictor, anchor_of
from chainrun.predict.prep import default_since, prepare

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

MIN_ROWS = 20  # fewer and the quantiles are noise; a test cluster has a few dozen
MIN_USER_ROWS = 300  # training rows before a user may get an own model
MAX_USER_MODELS = 8  # candidates per fit, heaviest users first
MAX_TRAIN_ROWS = 100_000  # most recent rows kept: queues drift, and it bounds refresh cost
# chosen by bench/predict_tune.py on the last 20 % of the LS6 training months (replayed with
# refits, the trace as known at the end of January), never on the test month: 8 configurations,
# quantile boosters num_leaves {15, 63} x min_data_in_leaf {20, 100} and chainrun's own quantile
# forest num_leaves {255, 1023} x min_data_in_leaf {5, 20}, as many as the random forest got
# (docs/results/predict_tune.json). With the refit (REFIT) the boosters with 63-leaf trees of at
# least 100 jobs won (mean validation pinball 0.198; the best forest 0.199, the random-forest
# baseline 0.201; the same boosters without the refit 0.219, with the user anchor 0.208).
PARAMS = {
    "objective": "quantile", "learning_rate": 0.05, "num_leaves": 63, "min_data_in_leaf": 100,
    "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
    # one thread: OpenMP spinning on a shared 2-core box made fits 7x slower than one thread
    "num_threads": 1, "verbose": -1, "seed": 7, "deterministic": True,
}
ROUNDS = 100
USER_ROUNDS = 100
ANCHOR = False  # learn log wait minus the user's recent mean log wait? (the tuning said no)
# "quantile": one LightGBM quantile booster per level; "forest": a LightGBM random forest read as a
# quantile regression forest (chainrun/predict/forest.py). Chosen by bench/predict_tune.py.
KIND = "quantile"
KINDS = ("quantile", "forest")
# After the shifts are measured on the recent rows, refit the model on every training row and
# keep the shifts (the recent jobs are the most like the next ones; the shifts of a model that did
# not see them are a slightly conservative stand-in). Chosen by bench/predict_tune.py.
REFIT = True


# ---------------------------------------------------------------- which rows
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


def queries_of(p: "pd.DataFrame", idx, at: str = "t_elig") -> "pd.DataFrame":
    """The question each row asked: its request, at its eligible time (``at="t_queue"``: the
    recorded one, without the dependency re-basing)."""
    q = p.iloc[idx][["user", "nodes", "gpus", "cpus", "timelimit_s", "partition", "qos"]].copy()
    q["t"] = p[at].to_numpy(float)[idx]
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




def _target_rows(p: "pd.DataFrame", *, since: float, until: float | None) -> "np.ndarray":
    """The started jobs a fit learns from: the most recent MAX_TRAIN_ROWS, at least MIN_ROWS."""
    import numpy as np

    idx = training_rows(p, since=since, until=until)
    if len(idx) > MAX_TRAIN_ROWS:
        idx = idx[np.argsort(p["t_elig"].to_numpy(float)[idx], kind="stable")[-MAX_TRAIN_ROWS:]]
    if len(idx) < MIN_ROWS:
        raise ModelError(f"only {len(idx)} started jobs to learn from (need {MIN_ROWS})",
                         hint="widen the history window, or wait until more jobs have run")
    return idx


def _cluster_facts(p: "pd.DataFrame", *, until: float | None, frozen: dict | None, all_users: bool | None,
                   capacity: float | None) -> dict:
    """What the features need to know of the cluster: its node count (and where it came from),
    whether the history shows every user, and the codes of partitions and QOS."""
    if frozen is not None:
        return {"capacity": frozen["capacity"], "capacity_source": "frozen", "all_users": frozen["all_users"],
                "categories": frozen["categories"]}
    if all_users is None:
        all_users = p["user"].nunique() > 1
    known = p if until is None else p[p["submit"].to_numpy(float) < until]  # no category from after the cut
    categories = {c: {v: i for i, v in enumerate(sorted(set(known[c].astype(str)) - {""}))} for c in ("partition", "qos")}
    source = "scontrol" if capacity else "history"
    if not capacity:  # no node count from the cluster: the history's guess (node-slots on shared nodes)
        capacity = estimate_capacity(p if until is None else p[p["start"] < until])
    return {"capacity": capacity, "capacity_source": source, "all_users": all_users, "categories": categories}


# ---------------------------------------------------------------- the rows of one fit
@dataclass
class TrainingSet:
    """The rows one fit learns from and is calibrated on: the started training jobs, then the
    jobs of the calibration period still waiting at the cut (censored: their wait a lower bound).
    ``early`` rows train the models, ``late`` ones (from ``cut`` on) calibrate them."""

    X: "np.ndarray"
    y: "np.ndarray"  # log10 wait; a lower bound where not observed
    observed: "np.ndarray"  # started (False: still waiting at the cut)
    t: "np.ndarray"  # when each row was asked
    users: "np.ndarray"
    cut: float  # start of the calibration period (inf: not calibrated)
    early: "np.ndarray"
    late: "np.ndarray"

    @property
    def calibrated(self) -> bool:
        import numpy as np

        return bool(np.isfinite(self.cut))


def _training_set(p: "pd.DataFrame", idx, *, since: float, until: float | None, calibrate: bool,
                  X_all: "np.ndarray | None", facts: dict) -> TrainingSet:
    """Features and targets of the training rows ``idx`` and, when there is a calibration period
    (the most recent CAL_FRACTION of them, at least MIN_CAL_ROWS), of the jobs still waiting in it."""
    import numpy as np

    t_all = p["t_elig"].to_numpy(float)
    t = t_all[idx]
    t_q = p["t_queue"].to_numpy(float)
    n_cal = int(round(CAL_FRACTION * len(idx))) if calibrate else 0
    cut = float(np.sort(t)[len(t) - n_cal]) if n_cal >= MIN_CAL_ROWS else np.inf
    cens = censored_rows(p, since=max(cut, since or -np.inf), until=until) if np.isfinite(cut) else np.zeros(0, int)
    rows_all = np.concatenate([idx, cens])
    feats = dict(capacity=facts["capacity"], all_users=facts["all_users"], categories=facts["categories"])
    if X_all is not None:
        X = X_all[rows_all]
    else:
        X = build_features(queries_of(p, rows_all), p, **feats)
    if len(cens):  # still waiting at the cut: asked at their recorded eligible time (see censored_rows)
        X[len(idx):] = build_features(queries_of(p, cens, at="t_queue"), p, **feats)
    now = until if until is not None else last_fact(p)
    y = np.concatenate([log_wait(p["wait"].to_numpy(float)[idx]), censored_lb(p, cens, now)])
    observed = np.r_[np.ones(len(idx), bool), np.zeros(len(cens), bool)]
    t = np.concatenate([t_all[idx], t_q[cens]])
    users = p["user"].astype(str).to_numpy()[rows_all]
    early = observed & (t < cut)
    late = t >= cut  # calibration: started and still-waiting jobs of the recent period
    if not np.isfinite(cut):
        early = observed.copy()
    return TrainingSet(X, y, observed, t, users, cut, early, late)


# ---------------------------------------------------------------- fitting
def fit_predictor(history: "pd.DataFrame", *, since: float | None = None, until: float | None = None,
                  per_user: str = "auto", all_users: bool | None = None, prepared: "pd.DataFrame | None" = None,
                  rounds: int = ROUNDS, params: dict | None = None, anchor: bool = ANCHOR, calibrate: bool = True,
                  frozen: dict | None = None, X_all: "np.ndarray | None" = None,
                  capacity: float | None = None, kind: str = KIND, forest_params: dict | None = None,
                  refit: bool = REFIT) -> Predictor:
    """Train from a canonical frame. ``since`` defaults to the data's own warm-up end
    (first start + 7 days) when the history spans 4 weeks or more, else to its start;
    ``per_user`` is "auto" (selected on a time holdout), "always" or "never".

    Split conformal calibration (the method, and why, in docs/model.md): the boosters learn
    on the older (1 - CAL_FRACTION) of the training rows; on the most recent CAL_FRACTION,
    plus the jobs of that period still waiting at ``until`` (right-censored), each quantile
    gets the shift in log10 wait that makes its coverage there equal to its level
    (Kaplan-Meier over the residuals, so the long waits that have not ended yet count).
    With ``refit`` (REFIT) every chosen model is then fit again on all the started training rows
    and keeps its shifts: the most recent jobs are the most like the next ones.

    ``frozen`` ({"capacity", "categories", "all_users"}) and ``X_all`` (features of every
    row of ``prepared`` built with them) let a replay refit often without rebuilding features;
    ``params``/``anchor``/``calibrate`` exist for the tuning bench (bench/predict_tune.py).
    """
    import numpy as np

    from chainrun.predict.doubt import feature_ranges

    if per_user not in ("auto", "always", "never"):
        raise ValueError(per_user)
    if kind not in KINDS:
        raise ValueError(kind)
    t0 = time.time()
    p = prepared if prepared is not None else prepare(history)
    if since is None:
        since = default_since(p)
    idx = _target_rows(p, since=since, until=until)
    facts = _cluster_facts(p, until=until, frozen=frozen, all_users=all_users, capacity=capacity)
    meta = {
        "format": FORMAT, "features": list(FEATURES), "quantiles": list(QUANTILES),
        "capacity": float(facts["capacity"]), "capacity_source": facts["capacity_source"],
        "all_users": bool(facts["all_users"]), "categories": facts["categories"],
        "versions": _versions(), "target": "log10(max(wait_s, 1))", "anchor": bool(anchor and kind == "quantile"),
        "kind": kind,
    }
    ts = _training_set(p, idx, since=since, until=until, calibrate=calibrate, X_all=X_all, facts=facts)
    meta["refit"] = bool(refit and ts.calibrated)  # shifts measured on the recent rows, model then fit on all
    # the queue the model has seen: a busier live queue is out of its depth (predict/doubt.py)
    meta["feature_ranges"] = feature_ranges(ts.X[ts.observed], FEATURES)
    meta["anchor_fallback"] = float(np.mean(ts.y[ts.observed]))
    if kind == "forest":
        return _fit_forest(ts, meta, forest_params=forest_params, refit=refit, t0=t0)
    anc = anchor_of(ts.X, meta["anchor_fallback"]) if anchor else np.full(len(ts.y), meta["anchor_fallback"])
    fit = _BoosterFitter(ts, ts.y - anc, params, rounds)  # the boosters learn the wait minus the anchor
    boosters, calibration = _fit_cluster_model(ts, fit)
    chosen = _select_user_models(ts, fit, boosters, calibration, per_user)
    if refit and ts.calibrated:  # the shifts stay; the models now learn from the recent rows too
        def rows_of(name: str) -> "np.ndarray":
            return np.flatnonzero(ts.observed if name == "cluster" else
                                  ts.observed & (ts.users == name.removeprefix("user:")))

        boosters = {name: fit(rows_of(name), fit.rounds if name == "cluster" else USER_ROUNDS) for name in boosters}
    elif per_user == "always" and not ts.calibrated:
        for u, c in zip(*np.unique(ts.users, return_counts=True)):
            if c >= MIN_USER_ROWS:
                boosters[f"user:{u}"] = fit(np.flatnonzero(ts.users == u), USER_ROUNDS)
                chosen[str(u)] = {"train_rows": int(c)}
    meta.update({
        "trained_at": time.time(), "fit_seconds": round(time.time() - t0, 2), "per_user_policy": per_user,
        "training_window": _window(ts), "user_models": chosen, "calibration": calibration,
        "train_metrics": _pinball_dict(boosters["cluster"], ts.X[ts.early], fit.r[ts.early]),
    })
    return Predictor(boosters, meta)


class _BoosterFitter:
    """Fits one set of quantile boosters (one a level of QUANTILES) on some rows of a training set:
    ``fit(rows, rounds) -> {q: lightgbm.Booster}``."""

    def __init__(self, ts: TrainingSet, r: "np.ndarray", params: dict | None, rounds: int) -> None:
        import numpy as np

        prm = {**PARAMS, **(params or {})}
        self.rounds = int(prm.pop("rounds", rounds))
        # recency weighting (bench/predict_recency.py; off unless asked): a row's weight halves
        # every ``half_life_days`` before the newest training row
        half_life = prm.pop("half_life_days", None)
        self.weight = 0.5 ** ((np.max(ts.t[ts.early]) - ts.t) / (float(half_life) * 86400.0)) \
            if half_life and ts.early.any() else None
        self.params, self.X, self.r = prm, ts.X, r

    def __call__(self, rows, n: int) -> dict:
        import lightgbm as lgb

        prm = self.params
        ds = lgb.Dataset(self.X[rows], self.r[rows], weight=None if self.weight is None else self.weight[rows],
                         feature_name=list(FEATURES), free_raw_data=False, params={"verbose": -1})
        return {qq: lgb.train({**prm, "alpha": qq, "min_data_in_leaf": min(prm["min_data_in_leaf"], max(5, len(rows) // 20))},
                              ds, num_boost_round=n) for qq in QUANTILES}


def _fit_cluster_model(ts: TrainingSet, fit: _BoosterFitter) -> "tuple[dict, dict]":
    """The cluster-wide boosters, trained on the early rows, and their shifts on the late ones."""
    import numpy as np

    boosters = {"cluster": fit(np.flatnonzero(ts.early), fit.rounds)}
    calibration: dict[str, dict] = {}
    if ts.calibrated:
        late = ts.late
        calibration["cluster"] = conformal_shifts(boosters["cluster"], ts.X[late], fit.r[late], ts.observed[late])
    return boosters, calibration


def _select_user_models(ts: TrainingSet, fit: _BoosterFitter, boosters: dict, calibration: dict,
                        per_user: str) -> dict:
    """Add a model for each heavy user whose candidate beats the cluster model on that user's recent
    rows (``per_user="always"``: without the contest), with its own shifts; returns the choices."""
    import numpy as np

    chosen: dict[str, dict] = {}
    if per_user == "never" or not ts.calibrated:
        return chosen
    users, early, late, observed, X, r = ts.users, ts.early, ts.late, ts.observed, ts.X, fit.r
    counts = {u: int(c) for u, c in zip(*np.unique(users[early], return_counts=True))}
    cands = [u for u, c in counts.items() if c >= MIN_USER_ROWS and (users[late & observed] == u).sum() >= 20]
    # the heaviest users only: each candidate costs one small fit (refresh time budget)
    cands = sorted(cands, key=lambda u: -counts[u])[:MAX_USER_MODELS]
    for u in cands:
        mine = users == u
        cand = fit(np.flatnonzero(mine & early), USER_ROUNDS)
        rows = np.flatnonzero(mine & late & observed)
        info: dict = {"train_rows": int((mine & early).sum())}
        if per_user == "auto":
            g = _pinball_all(boosters["cluster"], X[rows], r[rows])
            m = _pinball_all(cand, X[rows], r[rows])
            if not m < 0.98 * g:
                continue
            info.update(holdout_pinball_user=m, holdout_pinball_cluster=g)
        boosters[f"user:{u}"] = cand
        ul = mine & late
        calibration[f"user:{u}"] = conformal_shifts(cand, X[ul], r[ul], observed[ul])
        chosen[u] = info
    return chosen


def _fit_forest(ts: TrainingSet, meta: dict, *, forest_params: dict | None, refit: bool, t0: float) -> Predictor:
    """``kind="forest"``: the leaves' waits are the answer: no anchor, one cluster-wide forest."""
    from chainrun.predict.forest import LeafForest

    X, y, observed, early, late = ts.X, ts.y, ts.observed, ts.early, ts.late
    calibration: dict[str, dict] = {}
    fr = LeafForest.fit(X[early], y[early], params=forest_params, feature_names=FEATURES)
    if ts.calibrated:
        calibration["cluster"] = shifts_of(fr.quantiles(X[late], QUANTILES), y[late], observed[late])
        if refit:
            fr = LeafForest.fit(X[observed], y[observed], params=forest_params, feature_names=FEATURES)
    meta.update({
        "trained_at": time.time(), "fit_seconds": round(time.time() - t0, 2), "per_user_policy": "never",
        "training_window": _window(ts), "user_models": {}, "calibration": calibration,
        "train_metrics": {qname(q): round(pinball(y[early], v, q), 4)
                          for q, v in zip(QUANTILES, fr.quantiles(X[early], QUANTILES).T)},
    })
    return Predictor({"cluster": {"forest": fr.booster}}, meta, {"cluster": fr})


def _window(ts: TrainingSet) -> dict:
    import numpy as np

    t, users, observed, early, late, cut = ts.t, ts.users, ts.observed, ts.early, ts.late, ts.cut
    return {"since": float(np.min(t)), "until": float(np.max(t)), "rows": int(observed.sum()),
            "users": int(len(set(users))), "boosters_rows": int(early.sum()),
            "calibration_rows": int((late & observed).sum()),
            "calibration_still_waiting": int((late & ~observed).sum()),
            "calibration_from": float(cut) if np.isfinite(cut) else None}


def _pinball_all(models, X, y) -> float:
    import numpy as np

    return float(np.mean([pinball(y, models[q].predict(X, num_threads=1), q) for q in QUANTILES]))


def _pinball_dict(models, X, y) -> dict:
    return {qname(q): round(pinball(y, models[q].predict(X, num_threads=1), q), 4) for q in QUANTILES}


def _versions() -> dict:
    import lightgbm
    import numpy

    from chainrun import __version__

    return {"chainrun": __version__, "lightgbm": lightgbm.__version__, "numpy": numpy.__version__}
