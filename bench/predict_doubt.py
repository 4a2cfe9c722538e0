"""Does the short-history widening (chainrun/predict/doubt.py, rule 1) keep the learned quantiles
honest when a model has seen little? Validation on the past, not tuning: the rule has no
tunable (a one-sided 95 % binomial bound), and this bench only reports what it does.

For origins spread over the LS6 development trace's training months (mid-November to January,
never February, the month the evaluation scores), a cluster model is fit on only the last n
jobs that started before the origin (n = 30 .. 3000), and answers for every job that became
eligible in the next day. Reported per n: the coverage of q50 / q90 / q98 (share of waits at or
below; nominal 0.5 / 0.9 / 0.98) and the mean pinball loss, for the model alone and widened.

    .venv/bin/python bench/predict_doubt.py            # ~3 min on 2 shared cores
    .venv/bin/python bench/predict_doubt.py --json docs/results/predict_doubt.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chainrun.predict.distribution import QUANTILES, Prediction, pinball  # noqa: E402
from chainrun.predict.doubt import short_history, widen  # noqa: E402
from chainrun.predict.features import build_features, log_wait  # noqa: E402
from chainrun.predict.prep import prepare  # noqa: E402
from chainrun.predict.training import fit_predictor, queries_of, training_rows  # noqa: E402
from chainrun.traces import read_trace  # noqa: E402

SIZES = (30, 100, 300, 1000, 3000)
FIRST, LAST = "2022-11-15", "2023-01-31"  # origins: the training months only
ORIGINS = 10
DAY = 86400.0


def epoch(d: str) -> float:
    from datetime import datetime, timezone

    return datetime.fromisoformat(d).replace(tzinfo=timezone.utc).timestamp()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="ls6-a100-dev")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    t0 = time.time()
    df = read_trace(args.trace)
    p = prepare(df)
    first = fit_predictor(df, prepared=p, per_user="never")
    frozen = {k: first.meta[k] for k in ("capacity", "categories", "all_users")}
    X_all = build_features(queries_of(p, np.arange(len(p))), p, capacity=frozen["capacity"],
                           all_users=frozen["all_users"], categories=frozen["categories"])
    t_el = p["t_elig"].to_numpy(float)
    y_all = log_wait(p["wait"].to_numpy(float))
    usable = ~p["dep_like"].to_numpy(bool) & ~np.isnan(y_all)
    origins = np.linspace(epoch(FIRST), epoch(LAST), ORIGINS)
    rows: dict[int, dict[str, list]] = {n: {"alone": [], "widened": [], "y": []} for n in SIZES}
    for T in origins:
        known = training_rows(p, since=None, until=T)
        order = known[np.argsort(t_el[known], kind="stable")]
        test = np.flatnonzero(usable & (t_el >= T) & (t_el < T + DAY))
        if not len(test):
            continue
        for n in SIZES:
            if len(order) < n:
                continue
            since = float(t_el[order[-n]])
            model = fit_predictor(df, since=since, until=T, per_user="never", prepared=p, frozen=frozen, X_all=X_all)
            m = int(model.meta["training_window"]["rows"])
            logq = model.predict_matrix(X_all[test], ["cluster"])
            for lq, y in zip(logq, y_all[test]):
                vals = tuple(float(10 ** v) for v in lq)
                alone = Prediction(vals[0], vals[1], vals[2], "cluster", QUANTILES, vals)
                rows[n]["alone"].append([np.log10(max(v, 1.0)) for v in alone.values])
                rows[n]["widened"].append([np.log10(max(v, 1.0)) for v in widen(alone, m).values])
                rows[n]["y"].append(y)
    out = {"trace": args.trace, "origins": [float(t) for t in origins], "sizes": {}}
    print(f"{'n':>5} {'short':>5} {'jobs':>6}  {'model alone: cov q50/q90/q98  pinball':>38}  "
          f"{'widened: cov q50/q90/q98  pinball':>34}")
    for n in SIZES:
        y = np.asarray(rows[n]["y"])
        if not len(y):
            continue
        res = {"short_history": short_history(n), "jobs": int(len(y))}
        line = f"{n:>5} {str(short_history(n)):>5} {len(y):>6}"
        for kind in ("alone", "widened"):
            q = np.asarray(rows[n][kind])
            cov = {f"q{int(round(lvl * 100))}": float(np.mean(y <= q[:, j] + 1e-9)) for j, lvl in enumerate(QUANTILES)}
            pb = float(np.mean([pinball(y, q[:, j], lvl) for j, lvl in enumerate(QUANTILES)]))
            res[kind] = {"coverage": cov, "mean_pinball": pb}
            line += f"  {cov['q50']:.3f}/{cov['q90']:.3f}/{cov['q98']:.3f}  {pb:.4f}".rjust(38 if kind == "alone" else 34)
        out["sizes"][str(n)] = res
        print(line)
    out["seconds"] = round(time.time() - t0, 1)
    print(f"{out['seconds']:.0f}s")
    if args.json:
        from _results import head_state

        commit, dirty = head_state()
        Path(args.json).write_text(json.dumps({**out, "commit": commit, "dirty": dirty}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
