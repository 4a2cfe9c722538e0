"""Time-ordered evaluation of the wait model against simple baselines.

Split: training targets are jobs submitted after the data's warm-up (first start + 7 days,
see prep.warmup_end; none for traces under 4 weeks) and before ``train_until`` whose wait was known by then (started
before it); test targets are jobs submitted in [train_until, test_until) that started.
Dependency-like jobs (see prep) and censored jobs (never started) are left out of both
and counted in the report. Features of every row use only what was known at its time,
from the whole trace (a live system knows the test period's past as it goes).

Metrics, on the test targets (log10 of waits with waits under 1 s counted as 1 s):
- ``within_2x``: share of p50 predictions within a factor 2 of the actual wait; a
  prediction and an actual that are both under 60 s count as a hit.
- ``mae_log10``: mean |log10 p50 - log10 actual|.
- ``pinball``: pinball loss of p10/p50/p90 on the log10 scale.
- ``coverage_p10_p90``: share of actual waits inside [p10, p90] (nominal 80 %).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from chainrun.errors import UsageError
from chainrun.predict.features import USER_WINDOW, build_features, log_wait
from chainrun.predict.model import QUANTILES, fit_predictor, queries_of, training_rows
from chainrun.predict.prep import default_since, prepare

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

SMALL_S = 60.0
RF_MAX_ROWS = 50_000


def metrics(y_log, pred_log) -> dict:
    """Metrics of a (n x 3) array of log10 p10/p50/p90 predictions against log10 actuals."""
    import numpy as np

    from chainrun.predict.model import pinball

    y = np.asarray(y_log, float)
    p = np.asarray(pred_log, float)
    a, m = 10**y, 10 ** p[:, 1]
    hit = (np.abs(p[:, 1] - y) <= np.log10(2.0)) | ((a < SMALL_S) & (m < SMALL_S))
    return {
        "within_2x": round(float(hit.mean()), 4),
        "mae_log10": round(float(np.mean(np.abs(p[:, 1] - y))), 4),
        "pinball": {f"p{int(q * 100)}": round(pinball(y, p[:, j], q), 4) for j, q in enumerate(QUANTILES)},
        "coverage_p10_p90": round(float(np.mean((y >= p[:, 0]) & (y <= p[:, 2]))), 4),
        "n_test": int(len(y)),
    }


def evaluate(df: "pd.DataFrame", *, train_until: float, test_until: float, random_forest: bool = True) -> dict:
    """Train on the history before ``train_until``, test on [train_until, test_until); see module doc."""
    import numpy as np

    if test_until <= train_until:
        raise UsageError("--test-until must be after --train-until")
    t0 = time.time()
    p = prepare(df)
    warm = default_since(p)  # first start + 7 days, unless the trace is under 4 weeks long
    if warm >= train_until:
        raise UsageError("nothing to train on: the warm-up (first start + 7 days) reaches --train-until")
    sub = p["submit"].to_numpy(float)
    in_test = (sub >= train_until) & (sub < test_until)
    test_idx = np.flatnonzero(in_test & ~p["censored"].to_numpy(bool) & ~p["dep_like"].to_numpy(bool))
    if len(test_idx) == 0:
        raise UsageError("no started job was submitted between --train-until and --test-until")
    train_idx = training_rows(p, since=warm, until=train_until)
    y_tr = log_wait(p["wait"].to_numpy(float)[train_idx])
    y_te = log_wait(p["wait"].to_numpy(float)[test_idx])

    models: dict[str, dict] = {}
    timing: dict[str, float] = {}
    fitted = {}
    for name, policy in (("lightgbm", "auto"), ("lightgbm_cluster", "never"), ("lightgbm_per_user", "always")):
        ts = time.time()
        pr = fit_predictor(df, since=warm, until=train_until, per_user=policy, prepared=p)
        timing[name] = round(time.time() - ts, 2)
        fitted[name] = pr
    pr = fitted["lightgbm"]
    qte = queries_of(p, test_idx)
    X_te = build_features(qte, p, capacity=pr.meta["capacity"], all_users=pr.meta["all_users"],
                          categories=pr.meta["categories"])
    for name, m in fitted.items():
        chooser = [m.model_for(u) for u in qte["user"].astype(str)]
        models[name] = metrics(y_te, m.predict_matrix(X_te, chooser))
        models[name]["answered_by_user_model"] = round(float(np.mean([c != "cluster" for c in chooser])), 4)

    # baselines
    lo, mid, hi = np.quantile(y_tr, QUANTILES)
    models["global_median"] = metrics(y_te, np.tile([lo, mid, hi], (len(y_te), 1)))
    models["user_median"] = metrics(y_te, _user_last_quantiles(p, qte, fallback=(lo, mid, hi)))
    if random_forest:
        ts = time.time()
        qtr = queries_of(p, train_idx)
        X_tr = build_features(qtr, p, capacity=pr.meta["capacity"], all_users=pr.meta["all_users"],
                              categories=pr.meta["categories"])
        models["random_forest"] = metrics(y_te, _random_forest(X_tr, y_tr, X_te))
        timing["random_forest"] = round(time.time() - ts, 2)

    def window(idx, extra):
        s = sub[idx]
        return {"from": _iso(s.min()) if len(s) else None, "to": _iso(s.max()) if len(s) else None,
                "n": int(len(idx)), **extra}

    dep = p["dep_like"].to_numpy(bool)
    cens = p["censored"].to_numpy(bool)
    return {
        "models": models,
        "train": window(train_idx, {
            "warmup_until": _iso(warm), "until": _iso(train_until),
            "user_models": sorted(pr.meta["user_models"]), "fit_seconds": timing,
        }),
        "test": window(test_idx, {
            "until": _iso(test_until),
            "excluded_dependency_like": int((in_test & dep).sum()),
            "excluded_censored": int((in_test & cens).sum()),
            "small_wait_rule": f"prediction and actual both < {SMALL_S:.0f} s count as within 2x",
            "scale": "log10 seconds, waits < 1 s counted as 1 s",
        }),
        "seconds": round(time.time() - t0, 1),
    }


def _user_last_quantiles(p: "pd.DataFrame", q: "pd.DataFrame", *, fallback) -> "np.ndarray":
    """p10/p50/p90 of each user's last 20 waits known at t (started before t); fallback if none."""
    import numpy as np

    from chainrun.predict.prep import SPAN

    start = p["start"].to_numpy(float)
    ok = ~np.isnan(start) & ~p["dep_like"].to_numpy(bool)
    users = p["user"].astype(str).to_numpy()
    codes = {u: i for i, u in enumerate(np.unique(np.concatenate([users, q["user"].astype(str).to_numpy()])))}
    ucode = np.array([codes[u] for u in users[ok]], float)
    keys = ucode * SPAN + start[ok]
    o = np.argsort(keys, kind="stable")
    keys, lw, ucode = keys[o], log_wait(p["wait"].to_numpy(float)[ok])[o], ucode[o]
    qcode = np.array([codes[u] for u in q["user"].astype(str)], float)
    k = np.searchsorted(keys, qcode * SPAN + q["t"].to_numpy(float), side="left")  # started before t
    first = np.searchsorted(keys, qcode * SPAN, side="left")  # the user's first job
    out = np.tile(np.asarray(fallback, float), (len(q), 1))
    for i in np.flatnonzero(k > first):
        out[i] = np.quantile(lw[max(first[i], k[i] - USER_WINDOW):k[i]], QUANTILES)
    return out


def _random_forest(X_tr, y_tr, X_te) -> "np.ndarray":
    """Mirage's choice: a random forest on the same features; quantiles over its trees."""
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    if len(y_tr) > RF_MAX_ROWS:  # the most recent rows (they are in time order): bounded eval time
        X_tr, y_tr = X_tr[-RF_MAX_ROWS:], y_tr[-RF_MAX_ROWS:]
    rf = RandomForestRegressor(n_estimators=100, min_samples_leaf=5, max_features=0.5, n_jobs=1, random_state=7)
    rf.fit(np.nan_to_num(X_tr, nan=-1.0), y_tr)
    Xt = np.nan_to_num(X_te, nan=-1.0)
    per_tree = np.stack([t.predict(Xt) for t in rf.estimators_], axis=1)
    out = np.quantile(per_tree, QUANTILES, axis=1).T
    out[:, 1] = rf.predict(Xt)
    return out


def _iso(epoch: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(float(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
