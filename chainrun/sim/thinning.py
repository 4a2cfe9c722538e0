"""A thinned replay for self-tuning: a history bigger than a fixed job budget is replayed as a
seeded random 1/k of its jobs on 1/k of the nodes (docs/self-tuning.md, "Cost").

Why it is sound: sampling *by job* (each job kept whole, with its submit, start, end, nodes and
user, independently of every other) keeps every user's share of the jobs and the mix of sizes and
lengths in expectation, and dividing the nodes by the same k keeps the load per node, so the queue
the injected chains meet has the same shape on a cluster k times smaller. Sampling by user would
keep whole users but lose the share of any user with many jobs to the luck of one draw. What
thinning loses (the fine grain of who is ahead of whom) shows in the replay's start-order
Spearman, which is measured on the thinned replay and guarded by the adoption floor as before.
The budget is fixed from cost alone, never from a score.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

# The shipped LS6 trace's 60 days (7000 rows, 6185 jobs that ran, 80 nodes) tuned in 283 s on 2
# shared cores (bench/predict_cost.py --tune, docs/results/predict_cost_tune.json before thinning):
# a history of at most this many jobs costs about that, so it is replayed whole; a bigger one is
# thinned down to it. Fixed from that cost alone.
JOB_BUDGET = 7000


def factor(jobs: int, budget: int = JOB_BUDGET) -> int:
    """k: 1 when the history fits the budget, else ceil(jobs / budget)."""
    return max(1, math.ceil(jobs / budget)) if budget > 0 else 1


def thin(trace: "pd.DataFrame", nodes: int | None, chain_nodes: int, *, budget: int = JOB_BUDGET,
         seed: int = 0) -> tuple["pd.DataFrame", int | None, dict | None]:
    """(trace, nodes, info): the trace itself, ``nodes`` and None when it fits ``budget``; else a
    seeded random ceil(jobs/k) of its jobs (rows kept whole, in their order) on ceil(nodes/k)
    nodes, never fewer than the injected chain's or the widest kept job's node count (``nodes``
    None stays None: the replay sizes the cluster from the thinned history's peak), and
    ``{"k", "jobs", "of_jobs", "nodes", "of_nodes", "seed"}``."""
    import numpy as np

    n = len(trace)
    k = factor(n, budget)
    if k == 1:
        return trace, nodes, None
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(n, size=math.ceil(n / k), replace=False))
    sample = trace.iloc[keep]
    new_nodes = None
    if nodes is not None:
        widest = int(sample["nodes"].max()) if len(sample) else 1
        new_nodes = max(math.ceil(nodes / k), int(chain_nodes), widest)
    return sample, new_nodes, {"k": k, "jobs": len(sample), "of_jobs": n, "nodes": new_nodes, "of_nodes": nodes,
                               "seed": seed}
