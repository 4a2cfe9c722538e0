"""Queue-delay model vs baselines on the LS6 A100 trace: train Nov-Jan, test February.

    .venv/bin/python bench/predict_eval.py [--trace FILE] [--train-until 2023-02-01] [--test-until 2023-03-01]

Same code as ``chainrun model eval --json`` (chainrun.predict.evaluate); prints a Markdown
table for docs/model.md and the split facts. Data: TACC Lonestar6 A100 trace published
with Mirage (Ding et al., SC'23), CC BY 4.0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TRACE = "/work/shared/traces/ls6-a100/ls6-a100-dev.log"
ORDER = ("lightgbm", "lightgbm_cluster", "lightgbm_per_user", "random_forest", "user_median", "global_median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--train-until", default="2023-02-01")
    ap.add_argument("--test-until", default="2023-03-01")
    a = ap.parse_args()

    from chainrun.predict.service import eval_trace

    t0 = time.time()
    res = eval_trace(a.trace, cluster="bench", train_until=a.train_until, test_until=a.test_until)
    um = res["models"]["user_median"]
    base = sum(um["pinball"].values()) / 3
    print("| model | within 2x | MAE log10 | pinball p10 | pinball p50 | pinball p90 | mean pinball vs user median | p10-p90 coverage | n test |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ORDER:
        m = res["models"][name]
        mean = sum(m["pinball"].values()) / 3
        print(f"| {name} | {m['within_2x']:.3f} | {m['mae_log10']:.3f} | {m['pinball']['p10']:.3f} | "
              f"{m['pinball']['p50']:.3f} | {m['pinball']['p90']:.3f} | {100 * (mean / base - 1):+.1f} % | "
              f"{m['coverage_p10_p90']:.3f} | {m['n_test']} |")
    tr, te = res["train"], res["test"]
    print()
    print(f"train: {tr['n']} jobs submitted {tr['from']} .. {tr['to']} (warm-up until {tr['warmup_until']}); "
          f"per-user models chosen: {', '.join(tr['user_models']) or 'none'}; fit seconds {tr['fit_seconds']}")
    print(f"test: {te['n']} jobs submitted {te['from']} .. {te['to']}; left out: {te['excluded_dependency_like']} "
          f"dependency-like, {te['excluded_censored']} never started")
    print(f"({time.time() - t0:.0f} s in all)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
