"""Why deadline accuracy (P(wait <= H) >= 0.5 vs "started within H") sits near 0.8, and how far up it can go.

    .venv/bin/python bench/predict_deadline.py [--trace FILE] [--val-from 2023-01-01] [--train-until 2023-02-01]
        [--test-until 2023-03-01] [--refit-every 1d] [--out docs/results/predict_deadline.json]
    .venv/bin/python bench/predict_deadline.py --render docs/results/predict_deadline.json   # the doc tables

Two replays of the refresh (chainrun.predict.evaluate, the code of ``model eval``): the
validation month [val-from, train-until) and the test month [train-until, test-until). Every
choice below is made on the validation month, which ends before the test month starts
(decide on the past, score on the future); the test month only scores it.

Reported per horizon (1 h and 6 h are the targets; 10 min and 24 h for context):
- base rates: share started within H in the training data (what the models learnt) and in
  the validation and test months (what they were asked about);
- accuracy at P >= 0.5 per model, and the reliability of P (observed share per P bin);
- where the errors are: accuracy and share of jobs by |P - 0.5|;
- a threshold on P chosen on the validation month, scored on the test month;
- a direct classifier (LightGBM, binary, on the same features) fit on the validation month's
  rows, scored on the test month;
- two optimistic ceilings that use the test month's own outcomes (never shippable, they bound
  what the features and the data can say): a classifier cross-validated inside the test month
  (5 folds, shuffled), and the "twin" answer (the outcome of the same user's nearest job with
  the same request submitted within 10 minutes, read as if known).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TRACE = "/work/shared/traces/ls6-a100/ls6-a100-dev.log"
MODELS = ("lightgbm", "lightgbm_forest", "random_forest", "user_median")
BINS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001)
SEED = 7


def replay(df, frm: float, until: float, refit_s: float) -> dict:
    from chainrun.predict.evaluate import evaluate

    return evaluate(df, train_until=frm, test_until=until, refit_every_s=refit_s, keep_rows=True)


def reliability(p, hit) -> list[dict]:
    out = []
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        m = (p >= lo) & (p < hi)
        if m.any():
            out.append({"p_from": lo, "p_to": round(min(hi, 1.0), 2), "n": int(m.sum()),
                        "mean_p": round(float(p[m].mean()), 3), "observed": round(float(hit[m].mean()), 3)})
    return out


def best_threshold(p, hit) -> float:
    import numpy as np

    grid = np.round(np.arange(0.05, 0.96, 0.01), 2)
    acc = [float(np.mean((p >= t) == hit)) for t in grid]
    return float(grid[int(np.argmax(acc))])


def classifier(seed: int = SEED):
    import lightgbm as lgb

    return lgb.LGBMClassifier(n_estimators=200, learning_rate=0.05, num_leaves=15, min_child_samples=20,
                              subsample=0.8, subsample_freq=1, colsample_bytree=0.8, random_state=seed,
                              n_jobs=2, verbose=-1)


def twin_answer(df, rows: dict, hs: float):
    """Outcome of the same user's nearest other job in the scored set with the same request
    (nodes, gpus, partition, limit) submitted within 10 min; NaN where there is none."""
    import numpy as np

    idx = rows["index"]
    sub = rows["submit"]
    key = (df.iloc[idx][["user", "partition", "nodes", "gpus", "timelimit_s"]].astype(str).agg("|".join, axis=1)).to_numpy()
    hit = rows["observed"] & (rows["y"] <= np.log10(hs))
    out = np.full(len(idx), np.nan)
    order = np.lexsort((sub, key))
    for a, b in zip(order[:-1], order[1:]):
        if key[a] == key[b] and abs(sub[b] - sub[a]) <= 600:
            out[a] = hit[b] if np.isnan(out[a]) else out[a]
            out[b] = hit[a]
    return out


def render(res: dict) -> None:
    """Markdown tables for docs/model.md from the JSON this script wrote."""
    hs = [h for h in ("1h", "6h", "10m", "24h") if h in res["horizons"]]
    print("| H | started within H: train / validation / test | majority | " +
          " | ".join(f"{n} acc (val threshold -> acc)" for n in MODELS) +
          " | direct classifier (fit on validation) | ceiling: CV inside test | ceiling: twin (share) |")
    print("|---|---|---:|" + "---:|" * len(MODELS) + "---:|---:|---:|")
    for h in hs:
        r = res["horizons"][h]
        cells = [f"{m['accuracy_test']:.3f} ({m['threshold_chosen_on_validation']:.2f} -> "
                 f"{m['accuracy_test_at_that_threshold']:.3f})" for m in (r["models"][n] for n in MODELS)]
        tw = r["ceiling_twin"]
        print(f"| {h} | {r['base_rate_train_at_test']:.3f} / {r['share_within_validation']:.3f} / "
              f"{r['share_within_test']:.3f} | {r['majority_class_accuracy_test']:.3f} | {' | '.join(cells)} | "
              f"{r['direct_classifier_fit_on_validation']:.3f} | {r['ceiling_cv_inside_test']:.3f} | "
              f"{tw['twin_accuracy']:.3f} ({tw['share_with_twin']:.2f}) |")
    print()
    for h in ("1h", "6h"):
        r = res["horizons"][h]
        print(f"Reliability of P(wait <= {h}) on the test month (P bin: jobs, mean P, observed share):")
        print()
        print("| P | " + " | ".join(MODELS[:3]) + " |")
        print("|---|" + "---|" * 3)
        bins = {}
        for n in MODELS[:3]:
            for b in r["models"][n]["reliability_test"]:
                bins.setdefault(f"{b['p_from']:.1f}-{b['p_to']:.1f}", {})[n] = b
        for k in sorted(bins):
            print(f"| {k} | " + " | ".join(
                f"{bins[k][n]['n']}: {bins[k][n]['mean_p']:.2f} / {bins[k][n]['observed']:.2f}" if n in bins[k] else "-"
                for n in MODELS[:3]) + " |")
        print()
        m = r["models"]["lightgbm"]["errors_by_margin"]
        print(f"lightgbm at {h}, by |P - 0.5|: " + "; ".join(
            f"{e['margin_from']:.1f}-{min(e['margin_to'], 0.5):.1f}: {100 * e['share_of_jobs']:.0f} % of jobs, acc "
            f"{e['accuracy'] if e['accuracy'] is None else round(e['accuracy'], 3)}" for e in m))
        print()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", metavar="JSON", help="only print the Markdown tables of an earlier run")
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--val-from", default="2023-01-01")
    ap.add_argument("--train-until", default="2023-02-01")
    ap.add_argument("--test-until", default="2023-03-01")
    ap.add_argument("--refit-every", default="1d")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs/results/predict_deadline.json"))
    a = ap.parse_args()
    if a.render:
        render(json.loads(Path(a.render).read_text()))
        return

    import numpy as np
    from sklearn.model_selection import StratifiedKFold

    from chainrun.durations import parse_duration
    from chainrun.predict.evaluate import HORIZONS
    from chainrun.predict.service import parse_date
    from chainrun.traces import read_trace

    t0 = time.time()
    df = read_trace(a.trace)
    refit_s = parse_duration(a.refit_every, what="--refit-every")
    val = replay(df, parse_date(a.val_from, "--val-from"), parse_date(a.train_until, "--train-until"), refit_s)
    test = replay(df, parse_date(a.train_until, "--train-until"), parse_date(a.test_until, "--test-until"), refit_s)
    V, T = val["rows"], test["rows"]
    out = {"validation": {k: val["test"][k] for k in ("from", "to", "n")},
           "test": {k: test["test"][k] for k in ("from", "to", "n")}, "horizons": {}}
    for h, hs in HORIZONS.items():
        hv = V["observed"] & (V["y"] <= np.log10(hs))
        ht = T["observed"] & (T["y"] <= np.log10(hs))
        r = {"base_rate_train_at_test": round(float(np.mean(T["base_rate"][h])), 4),
             "share_within_validation": round(float(hv.mean()), 4),
             "share_within_test": round(float(ht.mean()), 4),
             "majority_class_accuracy_test": round(float(np.mean((T["base_rate"][h] >= 0.5) == ht)), 4),
             "models": {}}
        for n in MODELS:
            pv, pt = V["probs"][n][h], T["probs"][n][h]
            thr = best_threshold(pv, hv)
            margin = np.abs(pt - 0.5)
            r["models"][n] = {
                "accuracy_test": round(float(np.mean((pt >= 0.5) == ht)), 4),
                "accuracy_validation": round(float(np.mean((pv >= 0.5) == hv)), 4),
                "threshold_chosen_on_validation": thr,
                "accuracy_test_at_that_threshold": round(float(np.mean((pt >= thr) == ht)), 4),
                "best_threshold_on_test_(hindsight)": best_threshold(pt, ht),
                "reliability_test": reliability(pt, ht),
                "errors_by_margin": [
                    {"margin_from": lo, "margin_to": hi, "share_of_jobs": round(float(m.mean()), 3),
                     "accuracy": round(float(np.mean((pt[m] >= 0.5) == ht[m])), 3) if m.any() else None}
                    for lo, hi in ((0.0, 0.1), (0.1, 0.2), (0.2, 0.3), (0.3, 0.4), (0.4, 0.51))
                    for m in [(margin >= lo) & (margin < hi)]],
            }
        # a direct classifier on the same features, fit on the validation month only (the past)
        c = classifier().fit(V["X"], hv)
        r["direct_classifier_fit_on_validation"] = round(float(np.mean((c.predict_proba(T["X"])[:, 1] >= 0.5) == ht)), 4)
        # ceilings from the test month's own outcomes (optimistic, not shippable)
        cv = np.zeros(len(ht))
        for tr, te in StratifiedKFold(5, shuffle=True, random_state=SEED).split(T["X"], ht):
            cv[te] = classifier().fit(T["X"][tr], ht[tr]).predict_proba(T["X"][te])[:, 1]
        r["ceiling_cv_inside_test"] = round(float(np.mean((cv >= 0.5) == ht)), 4)
        tw = twin_answer(df, T, hs)
        has = ~np.isnan(tw)
        r["ceiling_twin"] = {"share_with_twin": round(float(has.mean()), 4),
                             "twin_accuracy": round(float(np.mean(tw[has] == ht[has])), 4) if has.any() else None,
                             "lightgbm_accuracy_on_same_jobs": round(float(np.mean((T["probs"]["lightgbm"][h][has] >= 0.5)
                                                                                   == ht[has])), 4) if has.any() else None}
        out["horizons"][h] = r
        print(f"{h}: train base rate {r['base_rate_train_at_test']:.3f}, within H: val {r['share_within_validation']:.3f} "
              f"test {r['share_within_test']:.3f}; majority {r['majority_class_accuracy_test']:.3f}")
        for n, m in r["models"].items():
            print(f"  {n:16s} acc {m['accuracy_test']:.3f} (val {m['accuracy_validation']:.3f}); threshold from val "
                  f"{m['threshold_chosen_on_validation']:.2f} -> {m['accuracy_test_at_that_threshold']:.3f}; "
                  f"hindsight best {m['best_threshold_on_test_(hindsight)']:.2f}")
        print(f"  direct classifier (fit on val) {r['direct_classifier_fit_on_validation']:.3f}; ceilings: CV inside test "
              f"{r['ceiling_cv_inside_test']:.3f}, twin {r['ceiling_twin']}")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    except OSError:
        commit = ""
    out.update(command=" ".join(["bench/predict_deadline.py", *sys.argv[1:]]), commit=commit, seed=SEED,
               seconds=round(time.time() - t0, 1))
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"({out['seconds']:.0f} s; wrote {a.out})")
    render(out)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
