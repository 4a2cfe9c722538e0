"""The replay shows the model each trace job once: its live queue (the simulated ``squeue``) and its
history (the masked ``sacct``) name a job by one key, so ``model._universe`` (and its columnar copy,
``columnar.universe_at``) drops the history copy of every job the queue shows, as on a cluster.

The traces here give job ids that are not the replay's row numbers (tracegen: 1000 + row), and every
job its own submit time, so a job seen twice is a repeated submit among the trace's rows. Each path
that builds the model's view is checked: the two views themselves (frames and columns), the chain
replay (``estimate`` and the elastic ``shape_waits``, with a stand-in model on the frames and with
the chainrun model on the columns), the rolling replay and the self-tuning replay."""

from __future__ import annotations

import numpy as np
import pytest

from chainrun.predict import columnar
from chainrun.predict.model import _universe
from chainrun.predict.snapshot import snapshot_from_rows
from chainrun.sim import rolling as R
from chainrun.sim import selftune as S
from chainrun.sim.adapter import CHAIN_USER, SimWatcher, engine_segment
from chainrun.sim.chain_replay import run_chains
from chainrun.sim.chains import ChainWork, Seg, elastic_specs
from chainrun.sim.fidelity import replay_alone
from chainrun.sim.knowledge import Knowledge, RecentWaits
from chainrun.sim.scheduler import Scheduler
from chainrun.sim.workload import build_workload

from .test_chains import cfg
from .test_rolling import SPLIT, grid, small_cfg, trace
from .tracegen import T0, frame, steady

DAY = 86400.0
H = 3600.0


def queued_trace(days: float, every_s: float = 1.5 * H):
    """3 h jobs every ``every_s`` on two nodes: always running jobs, pending ones behind a chain (or
    behind each other, every 72 min: a queue that grows)."""
    return frame(steady(days, every_s=every_s, run_s=3 * H))


def trace_rows(u, user_col):
    """(jobs seen more than once, jobs pending or running) among the trace's rows of a universe."""
    theirs = u[u[user_col] != CHAIN_USER] if user_col == "user" else u
    return int(theirs["submit"].duplicated().sum()), int(theirs["end"].isna().sum())


def test_the_frames_and_the_columns_show_each_queued_job_once():
    tr = queued_trace(6, every_s=1.2 * H)
    tr.loc[1::3, "job_id"] = [f"{7000 + i}_{i % 4}" for i in range(len(tr.loc[1::3]))]  # array tasks: not numbers
    w = build_workload(tr)
    starts = np.asarray(replay_alone(w, 2, bf_depth=1000, size_weight_s=0.0), float)
    k = Knowledge(w.table, starts, factory=RecentWaits, retrain_every_s=1e9, first_retrain=T0)
    watcher = SimWatcher(k)
    sim = Scheduler(2, w.jobs, open_at=w.open_at)
    checked = 0
    for now in (T0 + 1.3 * DAY + 777.0, T0 + 2.7 * DAY + 777.0, T0 + 4.1 * DAY + 777.0):  # no job ends at now
        sim.run_until(now)
        pending, running = sim.queue_view()
        assert pending and running  # the queue the model must see once
        cur = Seg(jid=len(w.jobs) + 7, idx=0, submit=now - 600.0, start=now - 300.0, exit=float("nan"),
                  limit=24 * H)
        seg = engine_segment(cur, True)
        rows = [r for r in watcher.queue_rows(sim, now, seg, cur, 1) if r.job_id != seg.job_id]
        u = _universe(now, "u1", snapshot_from_rows(rows), watcher.history(now, [cur], 1))
        assert trace_rows(u, "user") == (0, len(pending) + len(running))
        names = watcher._columns()["names"]
        c = columnar.universe_at(now, names.user("u1"), watcher.snapshot_columns(sim),
                                 watcher.history_columns(now, [cur], 1))
        mine = c.jobs.user == names.user(CHAIN_USER)
        sub, end = c.jobs.submit[~mine], c.jobs.end[~mine]
        assert (len(sub) - len(np.unique(sub)), int(np.isnan(end).sum())) == (0, len(pending) + len(running))
        assert len(c.jobs) == len(u)  # the two paths keep the same rows
        checked += 1
    assert checked == 3


class Spy(RecentWaits):
    """The stand-in model (quantiles of recent waits), which also builds the universe the chainrun
    model would build from what it is handed, and counts the trace jobs it holds twice."""

    asks: list = []
    shapes: list = []  # the asks of several shapes at once (the elastic rule's predict_many)

    def predict(self, request, snapshot_df=None, history_df=None):
        u = _universe(float(request.submit), request.user, snapshot_df, history_df)
        Spy.asks.append(trace_rows(u, "user"))
        return super().predict(request)

    def predict_many(self, requests, snapshot=None, history=None):
        Spy.shapes.append(len(requests))
        return [self.predict(r, snapshot, history) for r in requests]


@pytest.fixture
def spy():
    Spy.asks, Spy.shapes = [], []
    yield Spy.asks
    Spy.asks, Spy.shapes = [], []


def seen_once(asks: list) -> None:
    assert asks, "the model was never asked"
    assert sum(q for _, q in asks) > 0  # the asks did see a queue
    assert sum(d for d, _ in asks) == 0, f"{sum(d > 0 for d, _ in asks)} of {len(asks)} asks saw jobs twice"


def test_the_chain_replay_shows_each_queued_job_once(spy):
    run_chains(queued_trace(12), cfg(predictor=Spy, chains_every_s=2 * DAY, warmup_s=2 * DAY,
                                     work=ChainWork(work_s=30 * H, segment_s=12 * H)))
    seen_once(spy)


def test_the_elastic_shapes_are_asked_with_each_queued_job_once(spy, monkeypatch):
    from chainrun.sim import adapter

    shaped = []
    real = adapter.SimWatcher.shape_waits
    monkeypatch.setattr(adapter.SimWatcher, "shape_waits",
                        lambda self, *a, **kw: shaped.append(1) or real(self, *a, **kw))
    run_chains(queued_trace(12), cfg(nodes=4, predictor=Spy, chains_every_s=2 * DAY, warmup_s=2 * DAY,
                                     chain_nodes=(2,), specs=elastic_specs((2, 1)),
                                     work=ChainWork(work_s=30 * H, segment_s=12 * H)))
    assert shaped and Spy.shapes  # the shapes were asked, and the model with them (predict_many)
    seen_once(spy)


def test_the_replay_with_the_chainrun_model_shows_each_queued_job_once(monkeypatch):
    from chainrun.sim.knowledge import chainrun_predictor

    from .test_fast_asks import busy_trace

    seen = []
    real = columnar.universe_at

    def universe_at(now, user, snapshot, history):
        u = real(now, user, snapshot, history)
        j = u.jobs
        theirs = j.key != columnar.NO_KEY  # the chain's own segments have no key
        seen.append((int(theirs.sum() - len(np.unique(j.submit[theirs]))), int(np.isnan(j.end[theirs]).sum())))
        return u

    monkeypatch.setattr(columnar, "universe_at", universe_at)
    tr = busy_trace(days=16)
    tr["submit"] += np.arange(len(tr)) * 1e-3  # every job its own submit (the trace's are whole seconds)
    tr["eligible"] = tr["submit"]
    res = run_chains(tr, cfg(nodes=4, chain_nodes=(1,), chains_every_s=3 * DAY, warmup_s=8 * DAY,
                                              retrain_every_s=3 * DAY, predictor=chainrun_predictor,
                                              work=ChainWork(work_s=40 * H, segment_s=12 * H)))
    assert res.runs
    seen_once(seen)  # universe_at is the columnar path: asked only with a chainrun model


def test_the_rolling_replay_shows_each_queued_job_once(spy):
    R.rolling(trace(), small_cfg(predictor=Spy, inject_from=T0 + 5 * DAY, inject_until=T0 + 14 * DAY),
              check_s=4 * DAY, min_choice=2, min_check=1, cands=grid())
    seen_once(spy)


def test_the_self_tuning_replay_shows_each_queued_job_once(spy):
    from chainrun.chain import tuned

    from .test_selftune import SHAPE

    S.choose(trace(), nodes=2, shape=SHAPE, in_force=tuned.shipped(), predictor=Spy, min_choice=2, min_check=1,
             cands=grid(), warmup_s=5 * DAY, chains_every_s=2 * DAY, as_of=SPLIT, check_s=4 * DAY)
    seen_once(spy)
