"""Quantile LightGBM models of log10 queue wait, split-conformally calibrated; one
cluster-wide model plus per-user ones.

The boosters learn the quantiles the product uses (QUANTILES: 0.1, 0.5, 0.9, 0.95, 0.98) on
the older 80 % of the training rows; on the most recent 20 %, plus the jobs of that period
still waiting at the cut, each quantile is shifted so that its coverage there equals its
level (Kaplan-Meier over the residuals: waits not yet over count as lower bounds). Then the
boosters are fit again on every training row and keep those shifts (REFIT). Every
other level and P(wait <= H) come from one monotone curve through the calibrated quantiles
(:class:`Prediction`). The user anchor (learning the wait relative to the user's recent
waits) is an option the tuning turned off (bench/predict_tune.py).

A per-user model is kept only where it earns its place: users with enough history get a
candidate model trained on their older rows, and it must beat the cluster-wide model on that
user's recent rows (mean pinball loss over the quantiles); it is calibrated on those rows.
Everyone else -- and every new user -- gets the cluster model (cold start). Saved as
LightGBM text files plus ``meta.json`` (with the calibration shifts); never pickle.
"""

from __future__ import annotations

import functools
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

# the quantiles the boosters learn: the band people read (p10-p90), the median, and the upper
# ones the watcher acts on (0.95 / 0.98 for 24 h / 48 h segments, see chain.policies).
# Every other level, and P(wait <= H), is interpolated between them (see WaitDistribution).
QUANTILES = (0.1, 0.5, 0.9, 0.95, 0.98)
FORMAT = 2
CAL_FRACTION = 0.2  # the most recent share of training rows: calibration only (conformal shifts)
MIN_CAL_ROWS = 50  # fewer calibration rows: no shifts, boosters trained on every row
MIN_ROWS = 20  # fewer and the quantiles are noise; a test cluster has a few dozen
MIN_USER_ROWS = 300  # training rows before a user may get an own model
MAX_USER_MODELS = 8  # candidates per fit, heaviest users first
MAX_TRAIN_ROWS = 100_000  # most recent rows kept: queues drift, and it bounds refresh cost
HISTORY_DAYS = 8.0  # history a prediction needs: 7-day usage window + slack
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
    """The distribution of the wait of one request, in seconds, and which model answered.

    ``p10``/``p50``/``p90`` are kept as fields (every caller reads them); ``qs``/``values``
    are the learned quantile levels and their waits (monotone). :meth:`quantile` and
    :meth:`prob_within` read the same piecewise-linear curve of log10 wait against the
    normal score of q, so ``prob_within(quantile(q)) == q`` wherever the curve is not flat.
    A Prediction built from three numbers only (baselines, the simulator's stand-ins) uses
    the three as its curve.
    """

    p10: float
    p50: float
    p90: float
    model: str
    qs: tuple = ()
    values: tuple = ()

    def _curve(self) -> "tuple[tuple[float, ...], tuple[float, ...]]":
        qs, vals = (self.qs, self.values) if self.qs else ((0.1, 0.5, 0.9), (self.p10, self.p50, self.p90))
        return _curve_of(tuple(qs), tuple(float(x) for x in vals))

    def quantile(self, q: float) -> float:
        """Wait (s) at level q in (0, 1): the learned levels exactly, log-linear in the normal
        score between them, and a straight tail beyond (at least TAIL_SLOPE decades per unit z)."""
        from statistics import NormalDist

        if not 0.0 < q < 1.0:
            raise ValueError("q must be in (0, 1)")
        z, v = self._curve()
        x = NormalDist().inv_cdf(q)
        return float(10.0 ** max(0.0, _interp(x, z, v)))

    def prob_within(self, seconds: float) -> float:
        """P(wait <= seconds): the deadline question, from the same curve as :meth:`quantile`."""
        from statistics import NormalDist

        if float(seconds) < 1.0:
            return 0.0  # waits are counted from 1 s
        z, v = self._curve()
        x = _log(seconds)
        return float(NormalDist().cdf(_inverse(x, z, v)))

    def as_dict(self) -> dict:
        qs = self.qs or (0.1, 0.5, 0.9)
        vals = self.values or (self.p10, self.p50, self.p90)
        return {"model": self.model, "quantiles_s": {_qname(q): float(v) for q, v in zip(qs, vals)}}


TAIL_SLOPE = 0.25  # decades of wait per unit of normal score, at least, beyond the learned levels


@functools.lru_cache(maxsize=4096)
def _curve_of(qs: tuple, vals: tuple) -> "tuple[tuple[float, ...], tuple[float, ...]]":
    """The curve of log10 wait against the normal score (cached: the `slack` rule reads one
    distribution a few hundred times per decision)."""
    from statistics import NormalDist

    nd = NormalDist()
    z = [nd.inv_cdf(q) for q in qs]
    v = [_log(x) for x in vals]
    for i in range(1, len(v)):  # monotone whatever the caller passed
        v[i] = max(v[i], v[i - 1])
    return tuple(z), tuple(v)


def _log(seconds: float) -> float:
    import math

    return math.log10(max(float(seconds), 1.0))


def _slopes(z, v):
    lo = (v[1] - v[0]) / (z[1] - z[0]) if len(z) > 1 else TAIL_SLOPE
    hi = (v[-1] - v[-2]) / (z[-1] - z[-2]) if len(z) > 1 else TAIL_SLOPE
    return max(lo, TAIL_SLOPE), max(hi, TAIL_SLOPE)


def _interp(x, z, v) -> float:
    lo, hi = _slopes(z, v)
    if x <= z[0]:
        return v[0] - (z[0] - x) * lo
    if x >= z[-1]:
        return v[-1] + (x - z[-1]) * hi
    for i in range(1, len(z)):
        if x <= z[i]:
            return v[i - 1] + (x - z[i - 1]) * (v[i] - v[i - 1]) / (z[i] - z[i - 1])
    return v[-1]


def _inverse(y, z, v) -> float:
    """The normal score at which the curve reaches log wait y (the largest, across flat parts)."""
    lo, hi = _slopes(z, v)
    if y < v[0]:
        return z[0] - (v[0] - y) / lo
    if y >= v[-1]:
        return z[-1] + (y - v[-1]) / hi
    k = max(i for i in range(len(v)) if v[i] <= y)
    return z[k] + (y - v[k]) * (z[k + 1] - z[k]) / (v[k + 1] - v[k])


def _qname(q: float) -> str:
    return f"p{int(round(q * 100))}"


class Predictor:
    """Cluster model + selected per-user models; see the module doc."""

    def __init__(self, boosters: dict[str, dict[float, object]], meta: dict, forests: dict | None = None) -> None:
        self.boosters = boosters  # "cluster" or "user:<name>" -> {q: lightgbm.Booster} (or {"forest": ...})
        self.meta = meta
        self.forests = forests or {}  # name -> chainrun.predict.forest.LeafForest

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
        """The wait distribution of one request (quantiles and P(wait <= H)); see :class:`Prediction`."""
        return self.predict_many([request], snapshot, history)[0]

    def predict_many(self, requests: "list[WaitRequest]", snapshot: "pd.DataFrame | None" = None,
                     history: "pd.DataFrame | None" = None) -> "list[Prediction]":
        """Distributions for several request shapes asked at the same moment (elastic shapes,
        ``--exclusive`` or not, one partition or another): one feature pass per shape."""
        return [self.predict_with_features(request, snapshot, history)[0] for request in requests]

    def predict_with_features(self, request: WaitRequest, snapshot: "pd.DataFrame | None" = None,
                              history: "pd.DataFrame | None" = None) -> "tuple[Prediction, np.ndarray]":
        """:meth:`predict` and the feature row it answered (chainrun.predict.doubt reads it
        against the training ranges in ``meta["feature_ranges"]``)."""
        X = self.features_for(request, snapshot, history)
        name = self.model_for(request.user)
        row = self.predict_matrix(X, [name])[0]
        vals = tuple(float(10**v) for v in row)
        by = dict(zip(QUANTILES, vals))
        return Prediction(by[0.1], by[0.5], by[0.9], name, tuple(QUANTILES), vals), X[0]

    def predict_matrix(self, X, models: list[str], *, calibrated: bool = True) -> "np.ndarray":
        """log10-wait quantiles (rows x len(QUANTILES)) for a feature matrix; ``models`` per row
        or one for all. Calibration shifts (see fit_predictor) are added, then rows are sorted."""
        import numpy as np

        out = np.empty((len(X), len(QUANTILES)))
        anchor = anchor_of(X, self.meta["anchor_fallback"]) if self.meta.get("anchor", True) else \
            np.full(len(X), self.meta["anchor_fallback"])
        names = np.asarray(models * len(X) if len(models) == 1 else models)
        cal = self.meta.get("calibration", {}) if calibrated else {}
        for name in np.unique(names):
            rows = names == name
            shift = cal.get(str(name), {})
            if str(name) in self.forests:
                out[rows] = self.forests[str(name)].quantiles(X[rows], QUANTILES) + \
                    np.array([shift.get(_qname(q), 0.0) for q in QUANTILES])
                continue
            for j, q in enumerate(QUANTILES):
                out[rows, j] = anchor[rows] + self.boosters[name][q].predict(X[rows], num_threads=1) + shift.get(_qname(q), 0.0)
        out = np.maximum(out, 0.0)
        # quantile models are fitted apart: keep them ordered (a running max keeps the learned
        # upper levels where a lower one crossed them, instead of swapping levels)
        return np.maximum.accumulate(out, axis=1)

    # ------------------------------------------------------------ storage
    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        files = {}
        for i, (name, models) in enumerate(sorted(self.boosters.items())):
            stem = "cluster" if name == "cluster" else f"user{i:04d}"
            files[name] = {}
            for q, b in models.items():
                key = q if isinstance(q, str) else _qname(q)
                fn = f"{stem}_{key}.txt"
                b.save_model(str(d / fn))
                files[name][key] = fn
        meta = {**self.meta, "files": files}
        if self.forests:
            meta["forests"] = {name: f.encode() for name, f in self.forests.items()}
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
    forest_blobs = meta.pop("forests", None) or {}
    for name, per_q in meta["files"].items():
        boosters[name] = {}
        for q in (["forest"] if name in forest_blobs else QUANTILES):
            path = d / per_q[q if isinstance(q, str) else _qname(q)]
            try:
                b = lgb.Booster(model_file=str(path))
            except Exception as e:  # lightgbm raises its own error type for bad files
                raise ModelError(f"cannot load {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            if b.feature_name() != list(FEATURES):
                raise ModelError(f"{path} was trained on other features than its meta.json says",
                                 hint="run: chainrun model refresh")
            boosters[name][q] = b
    meta.pop("files", None)
    forests = {}
    if forest_blobs:
        from chainrun.predict.forest import LeafForest

        for name, blob in forest_blobs.items():
            try:
                forests[name] = LeafForest.decode(boosters[name]["forest"], blob)
            except (KeyError, ValueError) as e:
                raise ModelError(f"unreadable forest tables in {d / 'meta.json'}: {e}", hint="run: chainrun model refresh") from None
    return Predictor(boosters, meta, forests)


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

    if per_user not in ("auto", "always", "never"):
        raise ValueError(per_user)
    if kind not in KINDS:
        raise ValueError(kind)
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
    if frozen is not None:
        all_users, categories, capacity = frozen["all_users"], frozen["categories"], frozen["capacity"]
    else:
        if all_users is None:
            all_users = p["user"].nunique() > 1
        known = p if until is None else p[p["submit"].to_numpy(float) < until]  # no category from after the cut
        categories = {c: {v: i for i, v in enumerate(sorted(set(known[c].astype(str)) - {""}))} for c in ("partition", "qos")}
        source = "scontrol" if capacity else "history"
        if not capacity:  # no node count from the cluster: the history's guess (node-slots on shared nodes)
            capacity = estimate_capacity(p if until is None else p[p["start"] < until])
    meta = {
        "format": FORMAT, "features": list(FEATURES), "quantiles": list(QUANTILES),
        "capacity": float(capacity), "capacity_source": source if frozen is None else "frozen", "all_users": bool(all_users), "categories": categories,
        "versions": _versions(), "target": "log10(max(wait_s, 1))", "anchor": bool(anchor and kind == "quantile"),
        "kind": kind,
    }
    t_all = p["t_elig"].to_numpy(float)
    t = t_all[idx]
    t_q = p["t_queue"].to_numpy(float)
    n_cal = int(round(CAL_FRACTION * len(idx))) if calibrate else 0
    cut = float(np.sort(t)[len(t) - n_cal]) if n_cal >= MIN_CAL_ROWS else np.inf
    cens = censored_rows(p, since=max(cut, since or -np.inf), until=until) if np.isfinite(cut) else np.zeros(0, int)
    meta["refit"] = bool(refit and np.isfinite(cut))  # shifts measured on the recent rows, model then fit on all
    rows_all = np.concatenate([idx, cens])
    if X_all is not None:
        X = X_all[rows_all]
    else:
        X = build_features(queries_of(p, rows_all), p, capacity=capacity, all_users=all_users, categories=categories)
    if len(cens):  # still waiting at the cut: asked at their recorded eligible time (see censored_rows)
        X[len(idx):] = build_features(queries_of(p, cens, at="t_queue"), p, capacity=capacity,
                                      all_users=all_users, categories=categories)
    now = until if until is not None else _last_fact(p)
    y = np.concatenate([log_wait(p["wait"].to_numpy(float)[idx]), censored_lb(p, cens, now)])
    observed = np.r_[np.ones(len(idx), bool), np.zeros(len(cens), bool)]
    from chainrun.predict.doubt import feature_ranges

    # the queue the model has seen: a busier live queue is out of its depth (predict/doubt.py)
    meta["feature_ranges"] = feature_ranges(X[observed], FEATURES)
    t = np.concatenate([t_all[idx], t_q[cens]])
    users = p["user"].astype(str).to_numpy()[rows_all]
    meta["anchor_fallback"] = float(np.mean(y[observed]))
    anc = anchor_of(X, meta["anchor_fallback"]) if anchor else np.full(len(y), meta["anchor_fallback"])
    r = y - anc  # what the boosters learn; see the module doc
    early = observed & (t < cut)
    late = t >= cut  # calibration: started and still-waiting jobs of the recent period
    if not np.isfinite(cut):
        early = observed.copy()
    prm = {**PARAMS, **(params or {})}
    n_rounds = int(prm.pop("rounds", rounds))
    # recency weighting (bench/predict_recency.py; off unless asked): a row's weight halves
    # every ``half_life_days`` before the newest training row
    half_life = prm.pop("half_life_days", None)
    weight = 0.5 ** ((np.max(t[early]) - t) / (float(half_life) * 86400.0)) if half_life and early.any() else None

    def fit(rows, n):
        import lightgbm as lgb

        ds = lgb.Dataset(X[rows], r[rows], weight=None if weight is None else weight[rows], feature_name=list(FEATURES),
                         free_raw_data=False, params={"verbose": -1})
        return {qq: lgb.train({**prm, "alpha": qq, "min_data_in_leaf": min(prm["min_data_in_leaf"], max(5, len(rows) // 20))},
                              ds, num_boost_round=n) for qq in QUANTILES}

    calibration: dict[str, dict] = {}
    chosen: dict[str, dict] = {}
    if kind == "forest":  # the leaves' waits are the answer: no anchor, one cluster-wide forest
        from chainrun.predict.forest import LeafForest

        fr = LeafForest.fit(X[early], y[early], params=forest_params, feature_names=FEATURES)
        if np.isfinite(cut):
            calibration["cluster"] = shifts_of(fr.quantiles(X[late], QUANTILES), y[late], observed[late])
            if refit:
                fr = LeafForest.fit(X[observed], y[observed], params=forest_params, feature_names=FEATURES)
        forests = {"cluster": fr}
        meta.update({
            "trained_at": time.time(), "fit_seconds": round(time.time() - t0, 2), "per_user_policy": "never",
            "training_window": _window(t, users, observed, early, late, cut),
            "user_models": {}, "calibration": calibration,
            "train_metrics": {_qname(q): round(pinball(y[early], v, q), 4)
                              for q, v in zip(QUANTILES, fr.quantiles(X[early], QUANTILES).T)},
        })
        return Predictor({"cluster": {"forest": fr.booster}}, meta, forests)
    boosters = {"cluster": fit(np.flatnonzero(early), n_rounds)}
    if np.isfinite(cut):
        calibration["cluster"] = conformal_shifts(boosters["cluster"], X[late], r[late], observed[late])
    if per_user != "never" and np.isfinite(cut):
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
    if refit and np.isfinite(cut):  # the shifts stay; the models now learn from the recent rows too
        def rows_of(name: str) -> "np.ndarray":
            return np.flatnonzero(observed if name == "cluster" else observed & (users == name.removeprefix("user:")))

        boosters = {name: fit(rows_of(name), n_rounds if name == "cluster" else USER_ROUNDS) for name in boosters}
    elif per_user == "always" and not np.isfinite(cut):
        for u, c in zip(*np.unique(users, return_counts=True)):
            if c >= MIN_USER_ROWS:
                boosters[f"user:{u}"] = fit(np.flatnonzero(users == u), USER_ROUNDS)
                chosen[str(u)] = {"train_rows": int(c)}
    meta.update({
        "trained_at": time.time(), "fit_seconds": round(time.time() - t0, 2), "per_user_policy": per_user,
        "training_window": _window(t, users, observed, early, late, cut),
        "user_models": chosen, "calibration": calibration,
        "train_metrics": _pinball_dict(boosters["cluster"], X[early], r[early]),
    })
    return Predictor(boosters, meta)


def _window(t, users, observed, early, late, cut) -> dict:
    import numpy as np

    return {"since": float(np.min(t)), "until": float(np.max(t)), "rows": int(observed.sum()),
            "users": int(len(set(users))), "boosters_rows": int(early.sum()),
            "calibration_rows": int((late & observed).sum()),
            "calibration_still_waiting": int((late & ~observed).sum()),
            "calibration_from": float(cut) if np.isfinite(cut) else None}


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


def _last_fact(p: "pd.DataFrame") -> float:
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
        out[_qname(q)] = round(float(km_quantile(y - pred[:, j], observed, level)), 5)
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


def anchor_of(X, fallback: float) -> "np.ndarray":
    """Mean log10 wait of the user's last 20 jobs, or ``fallback`` for a user without any."""
    import numpy as np

    a = X[:, FEATURES.index("user_mean_wait20")]
    return np.where(np.isnan(a), fallback, a)


def _pinball_all(models, X, y) -> float:
    import numpy as np

    return float(np.mean([pinball(y, models[q].predict(X, num_threads=1), q) for q in QUANTILES]))


def _pinball_dict(models, X, y) -> dict:
    return {_qname(q): round(pinball(y, models[q].predict(X, num_threads=1), q), 4) for q in QUANTILES}


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
