"""Replay the trace alone and say how close the simulated waits are to the recorded ones.

Printed with every run, good or bad: the policy numbers are only as credible as this replay.
Waits are compared as (wait + 60 s) so that the many zero-second waits neither divide by zero
nor count as "infinitely wrong" for starting a minute late.
"""

from __future__ import annotations

from dataclasses import dataclass

from chainrun.sim.scheduler import Scheduler
from chainrun.sim.workload import Workload


@dataclass(frozen=True)
class Fidelity:
    spearman: float
    median_ratio: float  # median over jobs of simulated / recorded (wait + 60 s)
    within_2x: float  # share of jobs whose simulated wait is within x2 of the recorded one
    jobs: int

    def as_dict(self) -> dict:
        return {"spearman": self.spearman, "median_ratio": self.median_ratio, "within_2x": self.within_2x}


def replay_alone(w: Workload, nodes: int, *, bf_depth: int, size_weight_s: float, fairshare=None) -> list[float]:
    """Simulated start time of every job (by jid) when the trace runs alone."""
    sim = Scheduler(
        nodes, w.jobs, open_at=w.open_at, bf_depth=bf_depth, size_weight_s=size_weight_s, record_starts=True,
        fairshare=fairshare,
    )
    sim.run_until(float("inf"))
    return sim.starts


def fidelity(w: Workload, sim_starts, *, since: float, without_holds: bool = False) -> Fidelity:
    """Compare waits of jobs submitted at or after ``since`` (skip the warm-up). ``without_holds``:
    leave out the jobs replayed as dependencies (rebuilt from recorded starts, so they agree with
    the record by construction)."""
    import numpy as np
    import pandas as pd

    t = w.table
    real = t["start"].to_numpy(float) - t["submit"].to_numpy(float)
    sim = np.asarray(sim_starts, float) - t["submit"].to_numpy(float)
    keep = (t["submit"].to_numpy(float) >= since) & np.isfinite(sim)
    if without_holds:
        dep = np.full(len(t), -1)
        for j in w.jobs:
            dep[j[1]] = j[5]
        keep &= dep < 0
    real, sim = np.maximum(real[keep], 0.0), np.maximum(sim[keep], 0.0)  # DST shifts can make a wait < 0
    if len(real) < 2:
        return Fidelity(float("nan"), float("nan"), float("nan"), int(len(real)))
    import warnings

    with warnings.catch_warnings():  # constant waits (a tiny trace): rho is nan, reported as such
        warnings.simplefilter("ignore")
        rho = pd.Series(sim).corr(pd.Series(real), method="spearman")
    ratio = (sim + 60.0) / (real + 60.0)
    return Fidelity(
        spearman=float(rho) if rho == rho else float("nan"),
        median_ratio=float(np.median(ratio)),
        within_2x=float(np.mean((ratio >= 0.5) & (ratio <= 2.0))),
        jobs=int(len(real)),
    )
