"""Audit 24, gap 1: jobs the cached history saw pending or running, that the live squeue no longer
shows, have left the queue (model.close_gone), in `chainrun predict` and in the watcher."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from chainrun.predict import ingest, service
from chainrun.predict.features import FEATURES
from chainrun.predict.model import WaitRequest, close_gone, load_predictor
from chainrun.predict.training import fit_predictor
from chainrun.runner.base import RunResult

from .predict_helpers import synthetic_history

HEADER = "JOBID|USER|STATE|REASON|SUBMIT_TIME|START_TIME|END_TIME|TIME_LIMIT|TIME|PARTITION|QOS|NODES|CPUS|TRES_PER_NODE|DEPENDENCY|COMMENT|NAME"
N_PENDING, N_RUNNING = 40, 3


class Queue:
    """squeue answers ``rows``; Slurm's other calls fail (the prediction stands without them)."""

    name = "fake"

    def __init__(self, rows: list[str]):
        self.rows = rows

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        if argv[0] == "squeue":
            return RunResult(tuple(argv), 0, "\n".join([HEADER, *self.rows]) + "\n", "", 0.0)
        return RunResult(tuple(argv), 1, "", f"{argv[0]}: error: not here", 0.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A model trained on ended jobs, and a cache read an hour ago that still holds 40 pending and
    3 running jobs (a queue busier than any the model saw)."""
    now = time.time()
    df = synthetic_history(600, seed=1)
    shift = now - 7200 - df["end"].max()
    for c in ("submit", "eligible", "start", "end"):
        df[c] = df[c] + shift
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("CHAINRUN_HOME", str(home))
    fit_predictor(df).save(service.model_dir("t"))
    k = N_PENDING + N_RUNNING
    stale = pd.DataFrame({
        "job_id": [f"9{i:03d}" for i in range(k)], "user": "u1", "name": "j", "partition": "gpu", "qos": "normal",
        "account": "a", "submit": now - 3 * 3600.0, "eligible": now - 3 * 3600.0,
        "start": [np.nan] * N_PENDING + [now - 2 * 3600.0] * N_RUNNING, "end": np.nan, "timelimit_s": 86400.0,
        "nodes": 4, "gpus": 16, "cpus": 128, "state": ["PENDING"] * N_PENDING + ["RUNNING"] * N_RUNNING,
        "exit_code": "", "eligible_known": True, "priority": np.nan,
    })
    ingest.save_cache("t", pd.concat([df, stale], ignore_index=True),
                      {"last_refresh": now - 3600, "all_users": True, "rows": len(df) + k})
    rows = [f"{j}|u1|{s}|{'Priority' if s == 'PENDING' else 'None'}|{int(now - 3 * 3600)}|"
            f"{'N/A' if s == 'PENDING' else int(now - 7200)}|N/A|1-00:00:00|0:00|gpu|normal|4|128|gres:gpu:4|(null)|(null)|j"
            for j, s in zip(stale["job_id"], stale["state"])]
    yield rows
    mp.undo()


def _ask(rows):
    return service.predict_now(Queue(rows), cluster="t", nodes=1, gpus=0, cpus=0, timelimit_s=3600.0,
                               partition="gpu", user="u1")


def test_jobs_gone_from_squeue_are_not_counted(setup):
    a = _ask([])  # the queue emptied since the cache was read
    assert not any("busier" in r for r in a.reasons), a.reasons
    assert "q_pending_jobs" not in a.support.outside and "q_running_nodes_frac" not in a.support.outside


def test_jobs_squeue_still_shows_are_counted(setup):
    a = _ask(setup)
    assert any("busier" in r for r in a.reasons), a.reasons
    assert a.support.outside["q_pending_jobs"][0] == N_PENDING


def test_close_gone_ends_them_at_the_cache_read(setup):
    hist, info = ingest.load_cache("t")
    live = list(hist["job_id"].iloc[-N_RUNNING - 1:-N_RUNNING + 1])  # one pending, one running still there
    h = close_gone(hist, live, info["last_refresh"])
    was_open = hist["start"].isna() | hist["end"].isna()
    closed = was_open & h["end"].notna()
    assert closed.sum() == N_PENDING + N_RUNNING - 2
    assert (h.loc[closed, "end"] == info["last_refresh"]).all()
    assert h.loc[closed & hist["start"].isna(), "start"].isna().all()  # no start invented: no wait
    assert h.loc[hist["job_id"].isin(live), "end"].isna().all() and h.loc[~was_open].equals(hist.loc[~was_open])
    pr = load_predictor(service.model_dir("t"))
    req = WaitRequest(user="u1", nodes=1, gpus=0, cpus=0, timelimit_s=3600.0, partition="gpu", submit=time.time())
    snap = pd.DataFrame(columns=hist.columns)
    x = pr.features_for(req, snap, close_gone(hist, [], info["last_refresh"]))[0]
    assert x[FEATURES.index("q_pending_jobs")] == 0 and x[FEATURES.index("q_running_jobs")] == 0


def test_the_watcher_counts_only_what_its_tick_shows(setup, caplog):
    """chain/prediction.py: the same cache, read by the watcher with its tick's one squeue."""
    import logging
    from types import SimpleNamespace

    from chainrun.chain.prediction import for_cluster
    from chainrun.slurm.parsers import parse_squeue

    predict = for_cluster("t")
    chain = SimpleNamespace(id="c1", segment_s=3600.0, partition="gpu")
    seg = SimpleNamespace(job_id="77")
    caplog.set_level(logging.INFO, logger="chainrun.chain.prediction")
    assert predict(chain, seg, []) is not None
    assert "busier" not in caplog.text
    assert predict(chain, seg, parse_squeue("\n".join([HEADER, *setup]) + "\n")) is not None
    assert "busier than any in its history: pending jobs 40" in caplog.text
