"""Does weighting recent training jobs more help the deadline answer? Chosen on the past.

    .venv/bin/python bench/predict_recency.py [--trace FILE] [--half-lives none,7,21]
        [--val-from 2023-01-01] [--train-until 2023-02-01] [--test-until 2023-03-01]

The refresh's replay (chainrun.predict.evaluate, LightGBM only, daily refits) on the
validation month [val-from, train-until) for each half-life of the training rows' weights
(``half_life_days``: a row's weight halves every that many days before the newest one);
the half-life with the best mean deadline accuracy at 1 h and 6 h there, among those that
keep the coverage targets (|cov - q| <= 0.05 at q50/q90, <= 0.03 at q98), is then scored once
on the test month [train-until, test-until) next to no weighting.
Writes docs/results/predict_recency.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TRACE = "/work/shared/traces/ls6-a100/ls6-a100-dev.log"


def score(df, frm, until, hl) -> dict:
    from chainrun.predict.evaluate import evaluate

    res = evaluate(df, train_until=frm, test_until=until, random_forest=False, other_kind=False,
                   lightgbm_params=None if hl is None else {"half_life_days": hl})
    m = res["models"]["lightgbm"]
    return {"calibration": m["calibration"], "mean_pinball": m["mean_pinball"],
            "mean_pinball_user_median": res["models"]["user_median"]["mean_pinball"],
            "deadline": {h: m["deadline"][h] for h in ("1h", "6h")},
            "coverage_ok": abs(m["calibration"]["q50"] - 0.5) <= 0.05 and abs(m["calibration"]["q90"] - 0.9) <= 0.05
            and abs(m["calibration"]["q98"] - 0.98) <= 0.03}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--half-lives", default="none,7,21")
    ap.add_argument("--val-from", default="2023-01-01")
    ap.add_argument("--train-until", default="2023-02-01")
    ap.add_argument("--test-until", default="2023-03-01")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs/results/predict_recency.json"))
    a = ap.parse_args()

    from chainrun.predict.service import parse_date
    from chainrun.traces import read_trace

    t0 = time.time()
    df = read_trace(a.trace)
    v0, v1, t1 = (parse_date(x, w) for x, w in ((a.val_from, "--val-from"), (a.train_until, "--train-until"),
                                                   (a.test_until, "--test-until")))
    hls = [None if h == "none" else float(h) for h in a.half_lives.split(",")]
    val = {}
    for hl in hls:
        val[str(hl)] = r = score(df, v0, v1, hl)
        print(f"validation, half-life {hl}: acc 1h {r['deadline']['1h']['accuracy']:.3f} 6h "
              f"{r['deadline']['6h']['accuracy']:.3f}, coverage {r['calibration']}, mean pinball {r['mean_pinball']:.4f}",
              flush=True)

    def key(h):
        r = val[str(h)]
        return (r["coverage_ok"], (r["deadline"]["1h"]["accuracy"] + r["deadline"]["6h"]["accuracy"]) / 2)

    best = max(hls, key=key)
    test = {str(h): score(df, v1, t1, h) for h in dict.fromkeys([None, best])}
    for h, r in test.items():
        print(f"test, half-life {h}: acc 1h {r['deadline']['1h']['accuracy']:.3f} 6h {r['deadline']['6h']['accuracy']:.3f}, "
              f"coverage {r['calibration']}, mean pinball {r['mean_pinball']:.4f} (user median {r['mean_pinball_user_median']:.4f})")
    out = {"validation": val, "chosen_half_life_days": best, "test": test,
           "command": " ".join(["bench/predict_recency.py", *sys.argv[1:]]), "seconds": round(time.time() - t0, 1)}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"chose {best} on validation; ({out['seconds']:.0f} s; wrote {a.out})")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
