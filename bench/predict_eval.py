"""The queue-delay model scored as it is used, against baselines: a replay of the refresh.

    .venv/bin/python bench/predict_eval.py [--trace FILE] [--train-until 2023-02-01] [--test-until 2023-03-01]
        [--refit-every 1d] [--out docs/results/predict_eval.json]

Same code as ``chainrun model eval --json`` (chainrun.predict.evaluate): every model is refit
every --refit-every on what was known then and answers for the jobs submitted until the next
refit. Prints Markdown tables for docs/model.md and writes the whole result as JSON. Data:
TACC Lonestar6 A100 trace published with Mirage (Ding et al., SC'23), CC BY 4.0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TRACE = "/work/shared/traces/ls6-a100/ls6-a100-dev.log"
ORDER = ("lightgbm", "lightgbm_uncalibrated", "lightgbm_quantile", "lightgbm_forest", "random_forest", "user_median",
         "global_median")


def main_table(models: dict) -> None:
    um = models["user_median"]["mean_pinball"]
    um98 = models["user_median"]["pinball"]["p98"]
    print("| model | cov q50 | cov q90 | cov q95 | cov q98 | width q50-q98 (log10) | mean pinball | vs user median | "
          "pinball q98 | vs user median | within 2x | MAE log10 | n |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ORDER:
        if name not in models:
            continue
        m = models[name]
        c = m["calibration"]
        print(f"| {name} | {c['q50']:.3f} | {c['q90']:.3f} | {c['q95']:.3f} | {c['q98']:.3f} | "
              f"{m['sharpness_log10_q50_q98']:.2f} | {m['mean_pinball']:.3f} | {100 * (m['mean_pinball'] / um - 1):+.1f} % | "
              f"{m['pinball']['p98']:.3f} | {100 * (m['pinball']['p98'] / um98 - 1):+.1f} % | {m['within_2x']:.3f} | "
              f"{m['mae_log10']:.3f} | {m['n_test'] + m['n_never_started']} |")


def deadline_table(models: dict, base: dict) -> None:
    names = [n for n in ("lightgbm", "lightgbm_quantile", "lightgbm_forest", "random_forest", "user_median") if n in models]
    label = {"user_median": "user median (P = share of last 20)"}
    head = " | ".join(f"{label.get(n, n)} acc | Brier | skill" for n in names)
    print(f"| H | {head} | majority class acc | user median answer acc | started within H |")
    print("|---|" + "---:|" * (3 * len(names) + 3))
    for h in ("10m", "1h", "6h", "24h"):
        cells = []
        for n in names:
            d = models[n]["deadline"][h]
            skill = "-" if d["brier_skill"] is None else f"{d['brier_skill']:+.3f}"
            cells.append(f"{d['accuracy']:.3f} | {d['brier']:.3f} | {skill}")
        print(f"| {h} | {' | '.join(cells)} | {base[h]['majority_class_accuracy']:.3f} | "
              f"{base[h]['user_median_accuracy']:.3f} | {models['lightgbm']['deadline'][h]['share_started_within']:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--train-until", default="2023-02-01")
    ap.add_argument("--test-until", default="2023-03-01")
    ap.add_argument("--refit-every", default="1d")
    ap.add_argument("--no-forest", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs/results/predict_eval.json"))
    a = ap.parse_args()

    from chainrun.durations import parse_duration
    from chainrun.predict.service import eval_trace

    t0 = time.time()
    res = eval_trace(a.trace, cluster="bench", train_until=a.train_until, test_until=a.test_until,
                     refit_every_s=parse_duration(a.refit_every, what="--refit-every"), random_forest=not a.no_forest)
    tr, te = res["train"], res["test"]
    print(f"test: {te['n']} jobs submitted {te['from']} .. {te['to']}, refit every {te['refit_every_h']:g} h "
          f"({te['refits']} refits); train: {tr['n']} jobs from {tr['from']} (warm-up until {tr['warmup_until']})")
    print(f"dependency rule: {te['excluded_dependency_like']} test jobs left out; never started: {te['never_started']}")
    print()
    main_table(res["models"])
    print()
    deadline_table(res["models"], res["deadline_baselines"])
    wo = res["without_dependency_rule"]
    print()
    print(f"without the dependency rule ({wo['n']} test jobs, each asked at its recorded eligible time):")
    print()
    main_table(wo["models"])
    print()
    deadline_table(wo["models"], wo["deadline_baselines"])
    print()
    print(f"fit seconds: {tr['fit_seconds']}; per-user models ever chosen: {', '.join(tr['user_models']) or 'none'}")
    res["command"] = " ".join(["bench/predict_eval.py", *sys.argv[1:]])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"({time.time() - t0:.0f} s in all; wrote {a.out})")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
