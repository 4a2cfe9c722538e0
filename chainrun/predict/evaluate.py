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
from dataclasses import dataclass
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


@dataclass
class _Scored:
    """One set of scored test jobs (with or without the dependency rule): the rows of the prepared
    frame, their features, log10 waits and started-or-not, and every model's answers, filled in
    step by step by the replay (NaN until answered)."""

    rows: "np.ndarray"
    X: "np.ndarray"
    y: "np.ndarray"
    observed: "np.ndarray"
    user_q: "tuple[np.ndarray, np.ndarray]"  # the user's last waits known at each row (see _user_last)
    preds: dict  # model name -> (rows x QUANTILES) log10 wait
    probs: dict  # model name -> horizon name -> P(wait <= H) per row
    base: dict  # horizon name -> the training base rate each row was answered with


@dataclass
class _Step:
    """What was known at one refit: the models fit then and the training waits' summaries."""

    model: object  # the shipped kind, a Predictor
    alt: object  # the other kind chainrun can ship (None: not asked)
    rates: dict  # horizon name -> share of training waits <= H (base rate, majority class)
    global_q: "np.ndarray"  # quantiles of every training wait (global_median)
    rf: object  # the scikit-learn quantile regression forest (None: not asked)


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
    names = ["lightgbm", "lightgbm_uncalibrated"] + ([f"lightgbm_{other}"] if other else []) + \
        ["global_median", "user_median"] + (["random_forest"] if random_forest else [])
    sets = _scored_sets(p, in_test, X_all, feats, names)
    timing = {"lightgbm": 0.0, "random_forest": 0.0}
    refits, user_models = 0, set()
    for T in np.arange(train_until, test_until, refit_every_s):
        step_rows = {s: (sub[sc.rows] >= T) & (sub[sc.rows] < T + refit_every_s) for s, sc in sets.items()}
        if not any(r.any() for r in step_rows.values()):
            continue
        refits += 1
        step = _refit(df, p, T, warm=warm, frozen=frozen, X_all=X_all, timing=timing, per_user=per_user,
                      kind=kind, other=other, random_forest=random_forest, lightgbm_params=lightgbm_params,
                      anchor=anchor, forest_params=forest_params, refit=refit, rf_params=rf_params)
        user_models |= set(step.model.meta["user_models"])
        for s, rows in step_rows.items():
            if rows.any():
                _answer(sets[s], rows, step, users=p["user"].astype(str).to_numpy()[sets[s].rows[rows]],
                        other=other)
    report = {s: _report(sc, names) for s, sc in sets.items()}
    cens = p["censored"].to_numpy(bool)
    return {**({"rows": _kept_rows(sets["with_rule"], names, p)} if keep_rows else {}),
        "models": report["with_rule"]["models"],
        "deadline_baselines": report["with_rule"]["deadline_baselines"],
        "without_dependency_rule": report["without_rule"],
        "train": _window(sub, training_rows(p, since=warm, until=train_until), {
            "warmup_until": _iso(warm), "until": _iso(train_until),
            "user_models": sorted(user_models), "fit_seconds": {k: round(v, 2) for k, v in timing.items()},
            "calibration_rows_first_fit": first.meta["training_window"]["calibration_rows"],
        }),
        "test": _window(sub, sets["with_rule"].rows, {
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


def _window(sub, idx, extra: dict) -> dict:
    """The submit-time span and size of the jobs ``idx``, with ``extra``."""
    s = sub[idx]
    return {"from": _iso(s.min()) if len(s) else None, "to": _iso(s.max()) if len(s) else None,
            "n": int(len(idx)), **extra}


def _scored_sets(p: "pd.DataFrame", in_test, X_all, feats: dict, names: list) -> "dict[str, _Scored]":
    """The test jobs scored twice: ``with_rule`` leaves the dependency-like ones out and asks each
    at its (re-based) eligible time; ``without_rule`` keeps every job, asked at its recorded one."""
    import numpy as np

    start = p["start"].to_numpy(float)
    wait_q = np.where(np.isnan(start), np.nan, np.maximum(start - p["t_queue"].to_numpy(float), 0.0))
    with_rule = np.flatnonzero(in_test & ~p["dep_like"].to_numpy(bool))
    without_rule = np.flatnonzero(in_test)
    parts = {
        "with_rule": (with_rule, X_all[with_rule], log_wait(p["wait"].to_numpy(float)[with_rule]), "t_elig"),
        "without_rule": (without_rule, build_features(queries_of(p, without_rule, at="t_queue"), p, **feats),
                         log_wait(wait_q[without_rule]), "t_queue"),
    }
    K = len(QUANTILES)
    return {s: _Scored(rows=v, X=X, y=y, observed=~np.isnan(start[v]), user_q=_user_last(p, queries_of(p, v, at=at)),
                       preds={n: np.full((len(v), K), np.nan) for n in names},
                       probs={n: {h: np.full(len(v), np.nan) for h in HORIZONS} for n in names},
                       base={h: np.full(len(v), np.nan) for h in HORIZONS})
            for s, (v, X, y, at) in parts.items()}


def _refit(df, p, T: float, *, warm: float, frozen: dict, X_all, timing: dict, per_user: str, kind: str,
           other: str | None, random_forest: bool, lightgbm_params, anchor, forest_params, refit, rf_params) -> _Step:
    """Every model refit on what was known at T (``timing`` adds each kind's fit seconds)."""
    import numpy as np

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
    tr = training_rows(p, since=warm, until=T)
    y_tr = log_wait(p["wait"].to_numpy(float)[tr])
    rates = {h: float(np.mean(y_tr <= np.log10(hs))) for h, hs in HORIZONS.items()}
    rf = None
    if random_forest:
        ts = time.time()
        keep = tr[np.argsort(p["t_elig"].to_numpy(float)[tr], kind="stable")][-RF_MAX_ROWS:]
        y_keep = log_wait(p["wait"].to_numpy(float)[keep])
        rf = SklearnLeafForest.fit(X_all[keep], y_keep, **(rf_params or RF_PARAMS))
        timing["random_forest"] += time.time() - ts
    return _Step(pr, alt, rates, np.quantile(y_tr, QUANTILES), rf)


def _answer(sc: _Scored, rows, step: _Step, *, users, other: str | None) -> None:
    """Every model's answers for the jobs ``rows`` of ``sc`` submitted during one step."""
    import numpy as np

    X = sc.X[rows]
    pr, rates, gq = step.model, step.rates, step.global_q
    chooser = [pr.model_for(u) for u in users]
    runs = [("lightgbm", pr, True), ("lightgbm_uncalibrated", pr, False)]
    if step.alt is not None:
        runs.append((f"lightgbm_{other}", step.alt, True))
    for n, model, calibrated in runs:
        ch = chooser if model is pr else [model.model_for(u) for u in users]
        out = model.predict_matrix(X, ch, calibrated=calibrated)
        sc.preds[n][rows] = out
        for h, hs in HORIZONS.items():
            sc.probs[n][h][rows] = prob_within_matrix(out, hs)
    sc.preds["global_median"][rows] = gq
    for h in HORIZONS:
        sc.probs["global_median"][h][rows] = rates[h]
        sc.base[h][rows] = rates[h]
    uq, uw = sc.user_q
    um = uq[rows]
    fallback = np.isnan(um[:, 0])
    um[fallback] = gq
    sc.preds["user_median"][rows] = um
    for h, hs in HORIZONS.items():
        w = uw[rows]
        known = (~np.isnan(w)).sum(axis=1)
        share = (w <= np.log10(hs)).sum(axis=1) / np.maximum(known, 1)
        sc.probs["user_median"][h][rows] = np.where(fallback, rates[h], share)
    if step.rf is not None:
        sc.preds["random_forest"][rows] = step.rf.quantiles(X, QUANTILES)
        p_rf = step.rf.prob_within(X, list(HORIZONS.values()))
        for i, h in enumerate(HORIZONS):
            sc.probs["random_forest"][h][rows] = p_rf[:, i]


def _report(sc: _Scored, names: list) -> dict:
    """Metrics of every model on the answered jobs of one set, and the deadline question's two
    non-model answers (majority class, the user's median)."""
    import numpy as np

    ok = ~np.isnan(sc.preds["lightgbm"][:, 0])
    y, obs = sc.y[ok], sc.observed[ok]
    br = {h: float(np.mean(sc.base[h][ok])) for h in HORIZONS}
    models = {n: metrics(y, obs, sc.preds[n][ok], {h: sc.probs[n][h][ok] for h in HORIZONS},
                         {h: sc.base[h][ok] for h in HORIZONS}) for n in names}
    actual = {h: obs & (y <= np.log10(hs)) for h, hs in HORIZONS.items()}
    um_yes = {h: sc.preds["user_median"][ok][:, QUANTILES.index(0.5)] <= np.log10(hs) for h, hs in HORIZONS.items()}
    baselines = {h: {
        "base_rate_train": round(br[h], 4),
        "majority_class_accuracy": round(float(np.mean((sc.base[h][ok] >= 0.5) == actual[h])), 4),
        "user_median_accuracy": round(float(np.mean(um_yes[h] == actual[h])), 4),
    } for h in HORIZONS}
    return {"models": models, "deadline_baselines": baselines, "n": int(ok.sum())}


def _kept_rows(sc: _Scored, names: list, p: "pd.DataFrame") -> dict:
    """The per-job answers of the answered jobs of ``sc`` (``evaluate(keep_rows=True)``)."""
    import numpy as np

    ok = ~np.isnan(sc.preds["lightgbm"][:, 0])
    idx = sc.rows[ok]
    return {"index": idx, "X": sc.X[ok], "y": sc.y[ok], "observed": sc.observed[ok],
            "submit": p["submit"].to_numpy(float)[idx], "user": p["user"].astype(str).to_numpy()[idx],
            "preds": {n: sc.preds[n][ok] for n in names},
            "probs": {n: {h: sc.probs[n][h][ok] for h in HORIZONS} for n in names},
            "base_rate": {h: sc.base[h][ok] for h in HORIZONS}}


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
