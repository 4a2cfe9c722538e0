"""Evaluation of the wait model as it is used: a replay of the refresh through the test window.

Split: training targets are jobs submitted after the data's warm-up (first start + 7 days,
see prep.warmup_end; none for traces under 4 weeks) whose wait was known at the refit time.
The test window [train_until, test_until) is cut into steps of ``refit_every_s``; at the start
of each step every model is refit on what was known then (the cron refresh does this every
6 h; one day is the default here for cost) and answers for the jobs submitted during the step.
Features of every row use only what was known at its time, from the whole trace.

Test jobs: every job submitted in the window. Jobs that never started count as "waited
longer than any answer" (coverage) and "did not start in time" (deadline). On traces without
an Eligible column the *dependency rule* (prep) removes jobs that started within 60 s of the
same user's previous end: that rule reads the job's own start, i.e. the outcome, so the
report gives every metric twice, with the rule (``models``, comparable to earlier tables)
and without it (``without_dependency_rule``: every job, asked at its recorded eligible time).

Metrics (log10 of waits, waits under 1 s counted as 1 s):
- ``calibration``: per quantile, the share of test waits below the predicted quantile (ties
  count half: many waits sit at the 1 s floor); nominal = the level.
- ``sharpness_log10_q50_q98``: mean log10(q98 / q50), the width the watcher pays for.
- ``pinball``: pinball loss of each quantile (started jobs); ``mean_pinball`` their mean.
- ``deadline``: for H in 10 min, 1 h, 6 h, 24 h, the answer "it starts within H" when
  P(wait <= H) >= 0.5: ``accuracy``, ``brier`` and ``brier_skill`` = 1 - brier / brier of the
  training base rate.
- ``within_2x`` (p50 within a factor 2, both under 60 s a hit), ``mae_log10`` of p50,
  ``coverage_p10_p90``: kept for comparison with published predictors.

The ``random_forest`` baseline needs scikit-learn (the ``eval`` extra); without it the row is
left out and ``notes`` says so in one line, every other row stays.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from chainrun.errors import UsageError
from chainrun.predict.distribution import QUANTILES, pinball, prob_within_matrix, qname
from chainrun.predict.features import USER_WINDOW, build_features, log_wait
from chainrun.predict.forest import SklearnLeafForest
from chainrun.predict.prep import default_since, prepare
from chainrun.predict.training import fit_predictor, queries_of, training_rows

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

SMALL_S = 60.0
RF_MAX_ROWS = 50_000
HORIZONS = {"10m": 600.0, "1h": 3600.0, "6h": 21600.0, "24h": 86400.0}
REFIT_EVERY_S = 86400.0
# the random forest as a quantile regression forest; chosen by bench/predict_tune.py on the
# same validation split and with as many configurations as the LightGBM parameters
RF_PARAMS = {"n_estimators": 100, "min_samples_leaf": 5, "max_features": 0.6}
# scikit-learn serves this baseline only: it is the `eval` extra, not a dependency
NO_SKLEARN = "random_forest left out: scikit-learn is not installed (pip install 'chainrun[eval]')"


def metrics(y_log, observed, pred_log, probs: dict, base_rates: dict) -> dict:
    """Metrics of (n x len(QUANTILES)) log10 quantile answers against log10 actuals.

    ``observed`` False: the job never started (its y is ignored). ``probs``: horizon name ->
    P(wait <= H) per row; ``base_rates``: horizon name -> share of training waits <= H."""
    import numpy as np

    y = np.asarray(y_log, float)
    obs = np.asarray(observed, bool)
    p = np.asarray(pred_log, float)
    j50 = QUANTILES.index(0.5)
    ys, ps = y[obs], p[obs]
    a, m = 10**ys, 10 ** ps[:, j50]
    hit = (np.abs(ps[:, j50] - ys) <= np.log10(2.0)) | ((a < SMALL_S) & (m < SMALL_S))
    cal = {}
    for j, q in enumerate(QUANTILES):
        below = np.where(obs, (y < p[:, j] - 1e-9) + 0.5 * (np.abs(y - p[:, j]) <= 1e-9), 0.0)
        cal[f"q{int(round(q * 100))}"] = round(float(below.mean()), 4)
    pin = {qname(q): round(pinball(ys, ps[:, j], q), 4) for j, q in enumerate(QUANTILES)}
    j10, j90, j98 = QUANTILES.index(0.1), QUANTILES.index(0.9), QUANTILES.index(0.98)
    dl = {}
    for h, hs in HORIZONS.items():
        actual = obs & (y <= np.log10(hs))
        pr = np.clip(np.asarray(probs[h], float), 0.0, 1.0)
        brier = float(np.mean((pr - actual) ** 2))
        ref = float(np.mean((base_rates[h] - actual) ** 2))
        dl[h] = {"accuracy": round(float(np.mean((pr >= 0.5) == actual)), 4), "brier": round(brier, 4),
                 "brier_skill": round(1.0 - brier / ref, 4) if ref > 0 else None,
                 "share_started_within": round(float(actual.mean()), 4)}
    return {
        "calibration": cal,
        "sharpness_log10_q50_q98": round(float(np.mean(p[:, j98] - p[:, j50])), 4),
        "pinball": pin, "mean_pinball": round(float(np.mean(list(pin.values()))), 4),
        "deadline": dl,
        "within_2x": round(float(hit.mean()), 4),
        "mae_log10": round(float(np.mean(np.abs(ps[:, j50] - ys))), 4),
        "coverage_p10_p90": round(float(np.mean(obs & (y >= p[:, j10]) & (y <= p[:, j90]))), 4),
        "n_test": int(obs.sum()), "n_never_started": int((~obs).sum()),
    }


def evaluate(df: "pd.DataFrame", *, train_until: float, test_until: float, random_forest: bool = True,
             refit_every_s: float = REFIT_EVERY_S, per_user: str = "auto", lightgbm_params: dict | None = None,
             anchor: bool | None = None, rf_params: dict | None = None, kind: str | None = None,
             other_kind: bool = True, forest_params: dict | None = None, keep_rows: bool = False,
             refit: bool | None = None) -> dict:
    """Replay the refresh through [train_until, test_until); see the module doc.

    ``keep_rows``: also return the per-job answers of the scored set (``rows``: features,
    log10 waits, started or not, quantiles and P(wait <= H) per model, training base rates)
    for diagnostics such as bench/predict_deadline.py."""
    import numpy as np

    from chainrun.predict.training import KIND, KINDS

    kind = kind or KIND
    other = next(k for k in KINDS if k != kind) if other_kind else None
    if test_until <= train_until:
        raise UsageError("--test-until must be after --train-until")
    if refit_every_s <= 0:
        raise UsageError("--refit-every must be > 0")
    notes = []
    if random_forest and not _has_sklearn():
        random_forest = False
        notes.append(NO_SKLEARN)
    t0 = time.time()
    p = prepare(df)
    warm = default_since(p)  # first start + 7 days, unless the trace is under 4 weeks long
    if warm >= train_until:
        raise UsageError("nothing to train on: the warm-up (first start + 7 days) reaches --train-until")
    sub = p["submit"].to_numpy(float)
    start = p["start"].to_numpy(float)
    dep = p["dep_like"].to_numpy(bool)
    in_test = (sub >= train_until) & (sub < test_until)
    if not (in_test & ~np.isnan(start)).any():
        raise UsageError("no started job was submitted between --train-until and --test-until")
    first = fit_predictor(df, since=warm, until=train_until, per_user="never", prepared=p)
    frozen = {k: first.meta[k] for k in ("capacity", "categories", "all_users")}
    feats = dict(capacity=frozen["capacity"], all_users=frozen["all_users"], categories=frozen["categories"])
    # features of every row at its own time: they use only facts before it, so one pass serves every refit
    X_all = build_features(queries_of(p, np.arange(len(p))), p, **feats)
    sets = {
        "with_rule": np.flatnonzero(in_test & ~dep),
        "without_rule": np.flatnonzero(in_test),
    }
    X_set = {"with_rule": X_all[sets["with_rule"]],
             "without_rule": build_features(queries_of(p, sets["without_rule"], at="t_queue"), p, **feats)}
    wait_q = np.where(np.isnan(start), np.nan, np.maximum(start - p["t_queue"].to_numpy(float), 0.0))
    y_set = {"with_rule": log_wait(p["wait"].to_numpy(float)[sets["with_rule"]]),
             "without_rule": log_wait(wait_q[sets["without_rule"]])}
    obs_set = {k: ~np.isnan(start[v]) for k, v in sets.items()}
    K = len(QUANTILES)
    names = ["lightgbm", "lightgbm_uncalibrated"] + ([f"lightgbm_{other}"] if other else []) + \
        ["global_median", "user_median"] + (["random_forest"] if random_forest else [])
    preds = {s: {n: np.full((len(v), K), np.nan) for n in names} for s, v in sets.items()}
    probs = {s: {n: {h: np.full(len(v), np.nan) for h in HORIZONS} for n in names} for s, v in sets.items()}
    base = {s: {h: np.full(len(v), np.nan) for h in HORIZONS} for s, v in sets.items()}
    user_q = {s: _user_last(p, queries_of(p, v, at="t_elig" if s == "with_rule" else "t_queue")) for s, v in sets.items()}
    timing = {"lightgbm": 0.0, "random_forest": 0.0}
    refits, user_models = 0, set()
    steps = np.arange(train_until, test_until, refit_every_s)
    for T in steps:
        step_rows = {s: (sub[v] >= T) & (sub[v] < T + refit_every_s) for s, v in sets.items()}
        if not any(r.any() for r in step_rows.values()):
            continue
        refits += 1
        ts = time.time()
        pr = fit_predictor(df, since=warm, until=T, per_user=per_user, prepared=p, frozen=frozen, X_all=X_all,
                           params=lightgbm_params, **({} if anchor is None else {"anchor": anchor}), kind=kind,
                           forest_params=forest_params, **({} if refit is None else {"refit": refit}))
        timing["lightgbm"] += time.time() - ts
        alt = None
        if other:
            ts = time.time()
            alt = fit_predictor(df, since=warm, until=T, per_user=per_user, prepared=p, frozen=frozen, X_all=X_all,
                                kind=other)
            timing[f"lightgbm_{other}"] = timing.get(f"lightgbm_{other}", 0.0) + time.time() - ts
        user_models |= set(pr.meta["user_models"])
        tr = training_rows(p, since=warm, until=T)
        y_tr = log_wait(p["wait"].to_numpy(float)[tr])
        rates = {h: float(np.mean(y_tr <= np.log10(hs))) for h, hs in HORIZONS.items()}
        gq = np.quantile(y_tr, QUANTILES)
        rf = None
        if random_forest:
            ts = time.time()
            keep = tr[np.argsort(p["t_elig"].to_numpy(float)[tr], kind="stable")][-RF_MAX_ROWS:]
            y_keep = log_wait(p["wait"].to_numpy(float)[keep])
            rf = SklearnLeafForest.fit(X_all[keep], y_keep, **(rf_params or RF_PARAMS))
            timing["random_forest"] += time.time() - ts
        for s, rows in step_rows.items():
            if not rows.any():
                continue
            X = X_set[s][rows]
            users = p["user"].astype(str).to_numpy()[sets[s][rows]]
            chooser = [pr.model_for(u) for u in users]
            runs = [("lightgbm", pr, True), ("lightgbm_uncalibrated", pr, False)]
            if alt is not None:
                runs.append((f"lightgbm_{other}", alt, True))
            for n, model, calibrated in runs:
                ch = chooser if model is pr else [model.model_for(u) for u in users]
                out = model.predict_matrix(X, ch, calibrated=calibrated)
                preds[s][n][rows] = out
                for h, hs in HORIZONS.items():
                    probs[s][n][h][rows] = prob_within_matrix(out, hs)
            preds[s]["global_median"][rows] = gq
            for h in HORIZONS:
                probs[s]["global_median"][h][rows] = rates[h]
                base[s][h][rows] = rates[h]
            uq, uw = user_q[s]
            um = uq[rows]
            fallback = np.isnan(um[:, 0])
            um[fallback] = gq
            preds[s]["user_median"][rows] = um
            for h, hs in HORIZONS.items():
                w = uw[rows]
                known = (~np.isnan(w)).sum(axis=1)
                share = (w <= np.log10(hs)).sum(axis=1) / np.maximum(known, 1)
                probs[s]["user_median"][h][rows] = np.where(fallback, rates[h], share)
            if rf is not None:
                preds[s]["random_forest"][rows] = rf.quantiles(X, QUANTILES)
                p_rf = rf.prob_within(X, list(HORIZONS.values()))
                for i, h in enumerate(HORIZONS):
                    probs[s]["random_forest"][h][rows] = p_rf[:, i]
    report = {}
    for s in sets:
        ok = ~np.isnan(preds[s]["lightgbm"][:, 0])
        br = {h: float(np.mean(base[s][h][ok])) for h in HORIZONS}
        models = {}
        for n in names:
            m = metrics(y_set[s][ok], obs_set[s][ok], preds[s][n][ok], {h: probs[s][n][h][ok] for h in HORIZONS},
                        {h: base[s][h][ok] for h in HORIZONS})
            models[n] = m
        # the two non-model answers to the deadline question
        actual = {h: obs_set[s][ok] & (y_set[s][ok] <= np.log10(hs)) for h, hs in HORIZONS.items()}
        um_yes = {h: preds[s]["user_median"][ok][:, QUANTILES.index(0.5)] <= np.log10(hs) for h, hs in HORIZONS.items()}
        baselines = {h: {
            "base_rate_train": round(br[h], 4),
            "majority_class_accuracy": round(float(np.mean((base[s][h][ok] >= 0.5) == actual[h])), 4),
            "user_median_accuracy": round(float(np.mean(um_yes[h] == actual[h])), 4),
        } for h in HORIZONS}
        report[s] = {"models": models, "deadline_baselines": baselines, "n": int(ok.sum())}

    def window(idx, extra):
        s = sub[idx]
        return {"from": _iso(s.min()) if len(s) else None, "to": _iso(s.max()) if len(s) else None,
                "n": int(len(idx)), **extra}

    train_idx = training_rows(p, since=warm, until=train_until)
    cens = p["censored"].to_numpy(bool)
    extra = {}
    if keep_rows:
        ok = ~np.isnan(preds["with_rule"]["lightgbm"][:, 0])
        idx = sets["with_rule"][ok]
        extra["rows"] = {"index": idx, "X": X_set["with_rule"][ok], "y": y_set["with_rule"][ok],
                         "observed": obs_set["with_rule"][ok], "submit": sub[idx],
                         "user": p["user"].astype(str).to_numpy()[idx],
                         "preds": {n: preds["with_rule"][n][ok] for n in names},
                         "probs": {n: {h: probs["with_rule"][n][h][ok] for h in HORIZONS} for n in names},
                         "base_rate": {h: base["with_rule"][h][ok] for h in HORIZONS}}
    return {**extra,
        "models": report["with_rule"]["models"],
        "deadline_baselines": report["with_rule"]["deadline_baselines"],
        "without_dependency_rule": report["without_rule"],
        "train": window(train_idx, {
            "warmup_until": _iso(warm), "until": _iso(train_until),
            "user_models": sorted(user_models), "fit_seconds": {k: round(v, 2) for k, v in timing.items()},
            "calibration_rows_first_fit": first.meta["training_window"]["calibration_rows"],
        }),
        "test": window(sets["with_rule"], {
            "until": _iso(test_until), "refit_every_h": round(refit_every_s / 3600.0, 3), "refits": refits,
            "excluded_dependency_like": int((in_test & dep).sum()),
            "never_started": int((in_test & cens & ~dep).sum()),
            "small_wait_rule": f"prediction and actual both < {SMALL_S:.0f} s count as within 2x",
            "scale": "log10 seconds, waits < 1 s counted as 1 s",
        }),
        "quantiles": list(QUANTILES),
        "horizons_s": HORIZONS,
        "lightgbm_kind": kind,
        "seconds": round(time.time() - t0, 1),
        "notes": notes,
    }


def _has_sklearn() -> bool:
    try:
        import sklearn.ensemble  # noqa: F401
    except ImportError:
        return False
    return True


def _user_last(p: "pd.DataFrame", q: "pd.DataFrame") -> "tuple[np.ndarray, np.ndarray]":
    """Per query: quantiles (QUANTILES) of the user's last 20 waits known at t (started before t;
    NaN rows for a user without any), and those waits (NaN-padded, for P(wait <= H))."""
    import numpy as np

    from chainrun.predict.prep import SPAN

    start = p["start"].to_numpy(float)
    ok = ~np.isnan(start) & ~p["dep_like"].to_numpy(bool)
    users = p["user"].astype(str).to_numpy()
    codes = {u: i for i, u in enumerate(np.unique(np.concatenate([users, q["user"].astype(str).to_numpy()])))}
    ucode = np.array([codes[u] for u in users[ok]], float)
    keys = ucode * SPAN + start[ok]
    o = np.argsort(keys, kind="stable")
    keys, lw = keys[o], log_wait(p["wait"].to_numpy(float)[ok])[o]
    qcode = np.array([codes[u] for u in q["user"].astype(str)], float)
    k = np.searchsorted(keys, qcode * SPAN + q["t"].to_numpy(float), side="left")  # started before t
    first = np.searchsorted(keys, qcode * SPAN, side="left")  # the user's first job
    quant = np.full((len(q), len(QUANTILES)), np.nan)
    waits = np.full((len(q), USER_WINDOW), np.nan)
    for i in np.flatnonzero(k > first):
        w = lw[max(first[i], k[i] - USER_WINDOW):k[i]]
        quant[i] = np.quantile(w, QUANTILES)
        waits[i, :len(w)] = w
    return quant, waits


def _iso(epoch: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(float(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
