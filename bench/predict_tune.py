"""Choose the model parameters on the training months only: LightGBM and the quantile random
forest get the same number of configurations (8) on the same validation window. LightGBM's 8
cover both kinds chainrun can ship: quantile boosters (4) and its own quantile forest (4).

    .venv/bin/python bench/predict_tune.py [--trace FILE] [--train-until 2023-02-01] [--refit-every 4d]
        [--out docs/results/predict_tune.json]

Validation: the last 20 % (by eligible time) of the training rows, replayed like
``chainrun model eval`` (refit every --refit-every on what was known then), on the trace as it
was known at --train-until: jobs submitted later are dropped, starts and ends after it are
unknown (those jobs count as still waiting). Nothing at or after --train-until is read.
Score: mean pinball loss over the learned quantiles (log10 s); coverage is printed beside it.
The anchor ablation (the best quantile-booster configuration with the user anchor on) and,
for the chosen configuration, the calibration on and off (the same fits) and the refit off
(trained on the older 80 % only, as before the refit) are shown beside.
Prints a Markdown table; writes JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

TRACE = "/work/shared/traces/ls6-a100/ls6-a100-dev.log"
LGB_GRID = {"quantile": {"num_leaves": (15, 63), "min_data_in_leaf": (20, 100)},
            "forest": {"num_leaves": (255, 1023), "min_data_in_leaf": (5, 20)}}
RF_GRID = {"min_samples_leaf": (5, 20, 50, 100), "max_features": (0.33, 0.6)}


def known_at(df, until: float):
    """The trace as it was known at ``until``."""
    import numpy as np

    d = df[df["submit"].to_numpy(float) < until].copy()
    for c in ("start", "end"):
        v = d[c].to_numpy(float)
        d[c] = np.where(v >= until, np.nan, v)
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--train-until", default="2023-02-01")
    ap.add_argument("--refit-every", default="4d")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs/results/predict_tune.json"))
    a = ap.parse_args()

    import numpy as np

    from chainrun.durations import parse_duration
    from chainrun.predict.evaluate import evaluate
    from chainrun.predict.training import training_rows
    from chainrun.predict.prep import default_since, prepare
    from chainrun.predict.service import parse_date
    from chainrun.traces import read_trace

    t0 = time.time()
    until = parse_date(a.train_until, "--train-until")
    every = parse_duration(a.refit_every, what="--refit-every")
    df = known_at(read_trace(a.trace), until)
    p = prepare(df)
    tr = training_rows(p, since=default_since(p), until=until)
    cut = float(np.quantile(p["t_elig"].to_numpy(float)[tr], 0.8))

    def run(**kw):
        res = evaluate(df, train_until=cut, test_until=until, refit_every_s=every, per_user="never", **kw)
        return res

    rows = []
    for kind, grid in LGB_GRID.items():
        for vals in itertools.product(*grid.values()):
            cfg = dict(zip(grid, vals))
            ts = time.time()
            kw = {"lightgbm_params": cfg} if kind == "quantile" else {"forest_params": cfg}
            res = run(random_forest=False, kind=kind, other_kind=False, **kw)
            for name in ("lightgbm", "lightgbm_uncalibrated"):
                rows.append({"model": name, "config": {"kind": kind, **cfg}, **_score(res["models"][name]),
                             "seconds": round(time.time() - ts, 1)})
    n_val = res["test"]["n"]
    for vals in itertools.product(*RF_GRID.values()):
        cfg = dict(zip(RF_GRID, vals))
        ts = time.time()
        res = run(random_forest=True, rf_params={"n_estimators": 100, **cfg})
        rows.append({"model": "random_forest", "config": cfg, **_score(res["models"]["random_forest"]),
                     "seconds": round(time.time() - ts, 1)})
    cands = {"lightgbm": [r for r in rows if r["model"] == "lightgbm"],
             "random_forest": [r for r in rows if r["model"] == "random_forest"]}
    best = {m: min(rs, key=lambda r: r["mean_pinball"]) for m, rs in cands.items()}
    uncal = next(r for r in rows if r["model"] == "lightgbm_uncalibrated" and r["config"] == best["lightgbm"]["config"])
    bq = min((r for r in cands["lightgbm"] if r["config"]["kind"] == "quantile"), key=lambda r: r["mean_pinball"])
    cfg = {k: v for k, v in bq["config"].items() if k != "kind"}
    res = run(random_forest=False, kind="quantile", other_kind=False, lightgbm_params=cfg, anchor=True)
    anchored = {"model": "lightgbm (best quantile configuration, user anchor on)", "config": bq["config"],
                **_score(res["models"]["lightgbm"]), "seconds": None}
    bc = best["lightgbm"]["config"]
    prm = {k: v for k, v in bc.items() if k != "kind"}
    res = run(random_forest=False, kind=bc["kind"], other_kind=False, refit=False,
              **({"lightgbm_params": prm} if bc["kind"] == "quantile" else {"forest_params": prm}))
    no_refit = {"model": "lightgbm (chosen configuration, no refit: trained on the older 80 % only)", "config": bc,
                **_score(res["models"]["lightgbm"]), "seconds": None}

    print(f"validation: {n_val} jobs submitted {_iso(cut)} .. {a.train_until}, refit every {a.refit_every}; "
          f"the trace as known at {a.train_until}")
    print()
    print("| model | configuration | mean pinball | pinball q98 | cov q50 | cov q90 | cov q98 | width q50-q98 | deadline acc 1h / 6h |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in cands["lightgbm"] + [uncal, anchored, no_refit] + cands["random_forest"]:
        c = r["calibration"]
        mark = " **chosen**" if r is best.get(r["model"]) else (" (chosen config, calibration off)" if r is uncal else "")
        print(f"| {r['model']}{mark} | {', '.join(f'{k}={v}' for k, v in r['config'].items())} | {r['mean_pinball']:.4f} | "
              f"{r['pinball']['p98']:.4f} | {c['q50']:.3f} | {c['q90']:.3f} | {c['q98']:.3f} | "
              f"{r['sharpness_log10_q50_q98']:.2f} | {r['deadline_acc']['1h']:.3f} / {r['deadline_acc']['6h']:.3f} |")
    out = {"trace": a.trace, "train_until": a.train_until, "validation_from": _iso(cut), "n_validation": n_val,
           "refit_every": a.refit_every, "configs": rows, "chosen": {m: r["config"] for m, r in best.items()},
           "chosen_without_calibration": uncal, "anchor_ablation": anchored, "refit_ablation": no_refit, "seconds": round(time.time() - t0, 1),
           "command": " ".join(["bench/predict_tune.py", *sys.argv[1:]])}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"\nchosen: {out['chosen']}; wrote {a.out} ({out['seconds']:.0f} s)")


def _score(m: dict) -> dict:
    return {"mean_pinball": m["mean_pinball"], "pinball": m["pinball"], "calibration": m["calibration"],
            "sharpness_log10_q50_q98": m["sharpness_log10_q50_q98"],
            "deadline_acc": {h: d["accuracy"] for h, d in m["deadline"].items()}}


def _iso(epoch: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(float(epoch), tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
