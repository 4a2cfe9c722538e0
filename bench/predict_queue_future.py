"""Does a simulated look at the queue's future lift deadline accuracy? (the open path of #12)

    .venv/bin/python bench/predict_queue_future.py [--trace FILE] [--train-from 2022-11-01]
        [--val-from 2023-01-01] [--test-from 2023-02-01] [--test-until 2023-03-01]
        [--out docs/results/predict_queue_future.json]

docs/model.md ("Why deadline accuracy stops short of the target") ends on: what separates a job that
starts within the hour from its twin that waits is the queue's future, which no feature
known at submission holds. Slurm's own answer to that is `squeue --start`: play the queue
forward with every job running to its limit. This script builds that answer from facts known
at the job's eligible time (who runs, since when, with which limit; who waits, since when,
for how many nodes) and asks whether it carries what the existing features miss:

- ``sim_free_h``: hours until the job's nodes are free if nothing queued went first
  (running jobs end at their limits): the backfill-optimistic start;
- ``sim_fifo_h``: hours until it starts if every job queued before it starts first, in age
  order, each as soon as its nodes are free, all running to their limits: the no-backfill start;
- ``sim_easy_h``: the EASY answer from the two: the free start if the job would end (by its
  limit) before the head of the queue's start, else the no-backfill start.

Scored as the deadline question is scored (docs/model.md): a direct classifier for "started
within H" (LightGBM, binary, same settings as bench/predict_deadline.py), fit on the past
and scored on the test month, with and without the three features; and the hindsight ceiling
(5-fold CV inside the test month) with and without them. Features of every job are computed at
its eligible time from the whole trace (only comparisons with t read the future, as in
chainrun/predict/features.py). The test month only scores; nothing here is chosen on it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import subprocess
import sys
import time
from pathlib import Path

TRACE = "/work/shared/traces/ls6-a100/ls6-a100-dev.log"
NEW = ("sim_free_h", "sim_fifo_h", "sim_easy_h")


def simulated_starts(p, capacity: float):
    """(n x 3) hours from each job's eligible time to its simulated start: free, fifo, easy."""
    import numpy as np

    t_q = p["t_queue"].to_numpy(float)
    t = p["t_elig"].to_numpy(float)
    start = p["start"].to_numpy(float)
    end = p["end"].to_numpy(float)
    nodes = p["nodes"].to_numpy(float)
    limit = p["timelimit_s"].to_numpy(float)
    limit = np.where(np.isnan(limit), 86400.0, limit)
    leave = np.fmin(np.where(np.isnan(start), np.inf, start), np.where(np.isnan(end), np.inf, end))
    run_end = np.where(np.isnan(end), np.inf, end)
    s_order = np.argsort(np.where(np.isnan(start), np.inf, start), kind="stable")
    q_order = np.argsort(t_q, kind="stable")
    s_sorted = np.where(np.isnan(start), np.inf, start)[s_order]
    q_sorted = t_q[q_order]
    out = np.full((len(p), 3), np.nan)
    cap = float(capacity)
    for i in range(len(p)):
        ti = t[i]
        # running at t: started before t (strict, as the features), not ended by t
        cand = s_order[: np.searchsorted(s_sorted, ti, side="left")]
        run = cand[run_end[cand] > ti]
        # queued before this job, still waiting at t
        ahead = q_order[: np.searchsorted(q_sorted, ti, side="left")]
        ahead = ahead[(leave[ahead] > ti) & (ahead != i)]
        ends = np.maximum(start[run] + limit[run], ti)  # a job past its limit is about to go
        heap = list(zip(ends.tolist(), nodes[run].tolist()))
        heapq.heapify(heap)
        free = cap - float(nodes[run].sum())
        # free start: this job's nodes from running jobs only
        h2, f2, now = list(heap), free, ti
        while f2 < nodes[i] and h2:
            e, n = heapq.heappop(h2)
            f2, now = f2 + n, max(now, e)
        free_at = now
        # fifo: every job ahead first, in age order
        now, head_at = ti, None
        for j in ahead.tolist():
            while free < nodes[j] and heap:
                e, n = heapq.heappop(heap)
                free, now = free + n, max(now, e)
            head_at = now if head_at is None else head_at
            heapq.heappush(heap, (now + limit[j], nodes[j]))
            free -= nodes[j]
        while free < nodes[i] and heap:
            e, n = heapq.heappop(heap)
            free, now = free + n, max(now, e)
        fifo_at = now
        easy_at = free_at if head_at is None or free_at + limit[i] <= head_at else fifo_at
        out[i] = [(free_at - ti) / 3600.0, (fifo_at - ti) / 3600.0, (easy_at - ti) / 3600.0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--train-from", default="2022-11-01")
    ap.add_argument("--val-from", default="2023-01-01")
    ap.add_argument("--test-from", default="2023-02-01")
    ap.add_argument("--test-until", default="2023-03-01")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs/results/predict_queue_future.json"))
    a = ap.parse_args()

    import numpy as np
    from sklearn.model_selection import StratifiedKFold

    from predict_deadline import SEED, classifier  # the same classifier as the deadline study (bench/ is on the path)

    from chainrun.predict.evaluate import HORIZONS
    from chainrun.predict.features import FEATURES, build_features
    from chainrun.predict.prep import prepare
    from chainrun.predict.training import estimate_capacity, queries_of
    from chainrun.predict.service import parse_date
    from chainrun.traces import read_trace

    t0 = time.time()
    p = prepare(read_trace(a.trace))
    cap = estimate_capacity(p)
    X_old = build_features(queries_of(p, np.arange(len(p))), p, capacity=cap, all_users=True, categories={})
    t_sim = time.time()
    X_new = simulated_starts(p, cap)
    sim_s = time.time() - t_sim
    X_all = np.column_stack([X_old, X_new])
    sub = p["submit"].to_numpy(float)
    start = p["start"].to_numpy(float)
    wait = p["wait"].to_numpy(float)
    keep = ~p["dep_like"].to_numpy(bool)  # the scored set of model eval (dependency rule on)
    d = {k: parse_date(getattr(a, k), f"--{k.replace('_', '-')}") for k in ("train_from", "val_from", "test_from",
                                                                            "test_until")}
    train = keep & (sub >= d["train_from"]) & (sub < d["test_from"]) & ~np.isnan(start)
    val = keep & (sub >= d["val_from"]) & (sub < d["test_from"])
    test = keep & (sub >= d["test_from"]) & (sub < d["test_until"])
    cols = {"existing": np.arange(len(FEATURES)), "existing+sim": np.arange(len(FEATURES) + len(NEW)),
            "sim only": np.arange(len(FEATURES), len(FEATURES) + len(NEW))}
    out = {"n_train": int(train.sum()), "n_val": int(val.sum()), "n_test": int(test.sum()), "capacity": cap,
           "sim_seconds": round(sim_s, 1), "horizons": {}}
    for h, hs in HORIZONS.items():
        hit = ~np.isnan(start) & (wait <= hs)
        r = {"share_within_test": round(float(hit[test].mean()), 4)}
        for name, c in cols.items():
            fit_all = classifier().fit(X_all[train][:, c], hit[train])
            fit_val = classifier().fit(X_all[val][:, c], hit[val])
            cv = np.zeros(int(test.sum()))
            Xt, ht = X_all[test][:, c], hit[test]
            for tr, te in StratifiedKFold(5, shuffle=True, random_state=SEED).split(Xt, ht):
                cv[te] = classifier().fit(Xt[tr], ht[tr]).predict_proba(Xt[te])[:, 1]
            r[name] = {
                "fit_on_train_months": round(float(np.mean((fit_all.predict_proba(Xt)[:, 1] >= 0.5) == ht)), 4),
                "fit_on_validation_month": round(float(np.mean((fit_val.predict_proba(Xt)[:, 1] >= 0.5) == ht)), 4),
                "ceiling_cv_inside_test": round(float(np.mean((cv >= 0.5) == ht)), 4),
            }
        out["horizons"][h] = r
        print(f"{h}: within H in test {r['share_within_test']:.3f}")
        for name in cols:
            print(f"  {name:13s} " + "  ".join(f"{k} {v:.3f}" for k, v in r[name].items()))
    # how the simulated start reads on its own: rank correlation with the real wait, test month
    from scipy.stats import spearmanr

    ok = test & ~np.isnan(start)
    out["spearman_with_wait_test"] = {n: round(float(spearmanr(X_new[ok, k], wait[ok]).statistic), 3)
                                      for k, n in enumerate(NEW)}
    import warnings

    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns (cpus, qos on this trace) have no spread
    out["spearman_existing_best"] = max(
        ((FEATURES[k], round(float(abs(spearmanr(X_old[ok, k], wait[ok], nan_policy="omit").statistic)), 3))
         for k in range(len(FEATURES)) if np.nanstd(X_old[ok, k]) > 0), key=lambda kv: kv[1])
    print("spearman with the real wait (test month):", out["spearman_with_wait_test"],
          "best existing |rho|:", out["spearman_existing_best"])
    # why: are the long waits explained by nodes in use at all? (the node count the trace shows)
    long = test & ~np.isnan(start) & (wait > 6 * 3600)
    short = test & ~np.isnan(start) & (wait < 60)
    qf = FEATURES.index("q_free_nodes_frac")
    out["long_waits_test"] = {
        "jobs_waited_over_6h": int(long.sum()),
        "share_whose_nodes_were_free_at_eligible": round(float(np.mean(X_new[long, 0] == 0)), 3),
        "median_free_node_share_long": round(float(np.nanmedian(X_old[long, qf])), 3),
        "median_free_node_share_under_1min": round(float(np.nanmedian(X_old[short, qf])), 3),
    }
    print("test month, waits over 6 h:", out["long_waits_test"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    out.update(command=" ".join(["bench/predict_queue_future.py", *sys.argv[1:]]), commit=commit, seed=SEED,
               seconds=round(time.time() - t0, 1))
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"({out['seconds']:.0f} s, of which the simulation {sim_s:.0f} s; wrote {a.out})")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
