"""Shared helpers of the queue-delay model tests (imported by name: tests/ is not a package)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parents[1] / "data"
LS6 = Path("/work/shared/traces/ls6-a100/ls6-a100-dev.log")


def synthetic_history(n: int = 600, *, seed: int = 0, users: int = 8, eligible_known: bool = True) -> pd.DataFrame:
    """A canonical frame of a small busy cluster: waits grow with the queue."""
    rng = np.random.default_rng(seed)
    submit = 1_700_000_000 + np.cumsum(rng.exponential(600, n))
    wait = rng.lognormal(6, 2, n)
    start = submit + wait
    limit = rng.choice([3600.0, 4 * 3600.0, 24 * 3600.0], n)
    end = start + np.minimum(rng.exponential(3 * 3600, n), limit)
    nodes = rng.integers(1, 5, n)
    df = pd.DataFrame({
        "job_id": [str(i) for i in range(n)], "user": [f"u{k}" for k in rng.integers(0, users, n)],
        "name": "j", "partition": rng.choice(["gpu", "small"], n), "qos": "normal", "account": "a",
        "submit": submit, "eligible": submit, "start": start, "end": end, "timelimit_s": limit,
        "nodes": nodes, "gpus": nodes * 4, "cpus": nodes * 32, "state": "COMPLETED", "exit_code": "0:0",
        "eligible_known": eligible_known, "priority": np.nan,
    })
    return df
