"""The replay's columnar prediction path (chainrun/predict/columnar.py, used by chainrun/sim/adapter.py)
gives the bits the pandas path gives: on many (moment, queue, own segments, request) asks of a
synthetic trace, the feature row of ``Predictor.features_for`` on the frames the watcher would read
(``snapshot_from_rows`` of the simulated squeue, the masked sacct history) equals the columnar one,
and so do the predictions; and a replay with a real chainrun model gives the same chains both ways."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, replace

import numpy as np
import pandas as pd
import pytest

from chainrun.chain.prediction import _shape_waits
from chainrun.predict.columnar import features_at, predict_at, universe_at
from chainrun.predict.model import WaitRequest
from chainrun.predict.snapshot import snapshot_from_rows
from chainrun.predict.training import fit_predictor
from chainrun.sim.adapter import CHAIN_USER, SimWatcher, _sim_time, engine_chain, engine_segment
from chainrun.sim.chain_replay import run_chains
from chainrun.sim.chains import ChainWork, PolicySpec
from chainrun.sim.knowledge import Knowledge

from .test_chains import cfg
from .tracegen import T0

DAY = 86400.0
H = 3600.0


def busy_trace(days: float = 24, seed: int = 3) -> pd.DataFrame:
    """Bursts of 1-3 node jobs of 8 users on two named partitions and the unnamed
    one, some with a recorded Eligible; job ids are plain numbers, some equal to the replay's row
    numbers (a job is named by its JobID in both views, never by its row: both paths must drop
    the same history rows), and some runs look like dependencies (start 10 s after the same user's
    previous end)."""
    rng = np.random.default_rng(seed)
    n = int(days * 24 * 3)
    submit = T0 + np.sort(rng.uniform(0, days * DAY, n)).round()
    wait = np.where(rng.random(n) < 0.3, 0.0, rng.lognormal(7.5, 1.5, n)).round()
    start = submit + wait
    limit = rng.choice([2 * H, 6 * H, 12 * H], n) + rng.integers(0, 3600, n)  # node-hours not whole: sums round
    run = np.minimum(rng.exponential(3 * H, n), limit).round()
    user = np.array([f"u{k}" for k in rng.integers(0, 7, n)], dtype=object)
    user[::15] = "rare"  # ~40 jobs in 8 days: its last 40 reach back beyond them at some moments
    for i in range(1, n, 9):  # dependency-like: the same user's next job starts 10 s after this one ends
        j = i + 1
        if j < n:
            user[j] = user[i]
            start[j] = max(start[j], start[i] + run[i] + 10.0)
    rows = pd.DataFrame({
        "job_id": [str(5 * i) if i % 3 else str(i) for i in range(n)], "user": user, "name": "j",
        "partition": rng.choice(["gpu", "gpu", "small", ""], n), "qos": rng.choice(["normal", ""], n),
        "account": "", "submit": submit, "eligible": submit, "start": start, "end": start + run,
        "timelimit_s": np.where(rng.random(n) < 0.05, np.nan, limit), "nodes": rng.integers(1, 4, n),
        "gpus": 0, "cpus": 0, "state": "COMPLETED", "exit_code": "0:0",
        "eligible_known": rng.random(n) < 0.3, "priority": np.nan,
    })
    rows["gpus"] = rows["nodes"] * 3
    return rows


@dataclass
class Seg:  # the replay's own segment records (chains.py), as the adapter reads them
    jid: int
    idx: int
    submit: float
    start: float
    exit: float
    limit: float
    nodes: int = 1
    train_start: float = float("nan")


class Queue:
    """A simulated squeue at ``now`` (what ``Scheduler.queue_view`` returns), read off the trace."""

    def __init__(self, table: pd.DataFrame, now: float, rng) -> None:
        sub, st, en = (table[c].to_numpy(float) for c in ("submit", "start", "end"))
        self.pending = [int(j) for j in np.flatnonzero((sub < now) & ~(st <= now))]
        run = np.flatnonzero((st <= now) & (en > now))
        self.running = [(int(j), float(st[j])) for j in run]
        rng.shuffle(self.pending)  # the scheduler's order is its priority order, not the table's
        self.running.append((10**6, now - 100.0))  # another chain's job: not a trace row, not in squeue rows

    def queue_view(self):
        return list(self.pending), list(self.running)


@pytest.fixture(scope="module")
def world():
    table = busy_trace()
    k = Knowledge(table, table["start"].to_numpy(float), factory=lambda h, u: None, retrain_every_s=1e9,
                  first_retrain=T0)
    model = fit_predictor(table[table["submit"] < T0 + 16 * DAY], until=T0 + 16 * DAY)
    return table, k, model


def asks(rng, now: float):
    """Own segments (earlier, running, pending) and a request at ``now``."""
    segs = []
    t = now - rng.uniform(0, 3 * DAY)
    for i in range(int(rng.integers(0, 4))):
        s = t + rng.uniform(0, 2 * H)
        e = s + rng.uniform(H, 20 * H)
        segs.append(Seg(jid=10**6 + i, idx=i, submit=t, start=s if rng.random() < 0.9 else float("nan"),
                        exit=e, limit=24 * H))
        t = e - rng.uniform(0, H)
    cur = Seg(jid=10**6 + 99, idx=len(segs), submit=now - 600.0, start=now - 300.0, exit=float("nan"), limit=24 * H)
    return segs + [cur], cur


def frames_and_columns(w: SimWatcher, q: Queue, now: float, segs, cur, nodes: int):
    seg = engine_segment(cur, True)
    rows = [r for r in w.queue_rows(q, now, seg, cur, nodes) if r.job_id != seg.job_id]
    return snapshot_from_rows(rows), w.history(now, segs, nodes), w.snapshot_columns(q), \
        w.history_columns(now, segs, nodes)


def test_feature_rows_and_predictions_are_the_same_bits_on_many_asks(world):
    table, k, model = world
    w = SimWatcher(k)
    names = w._columns()["names"]
    rng = np.random.default_rng(7)
    users = [CHAIN_USER, "u1", "rare", "nobody"]
    checked = dropped = 0
    for now in np.concatenate([T0 + rng.uniform(1 * DAY, 23 * DAY, 60), T0 + 12 * DAY + rng.uniform(0, 1, 5)]):
        now = float(now) if rng.random() < 0.7 else float(round(now))
        q = Queue(table, now, rng)
        segs, cur = asks(rng, now)
        nodes = int(rng.integers(1, 4))
        snap, hist, snap_c, hist_c = frames_and_columns(w, q, now, segs, cur, nodes)
        dropped += int(hist["job_id"].isin(set(snap["job_id"])).sum())
        reqs = [WaitRequest(user=str(rng.choice(users)), nodes=int(rng.integers(1, 5)), gpus=int(rng.integers(0, 9)),
                            cpus=int(rng.choice([0, 16])), timelimit_s=float(rng.choice([H, 24 * H, 7.5 * H])),
                            partition=str(rng.choice(["", "gpu", "small", "new"])), qos=str(rng.choice(["", "normal"])),
                            submit=now) for _ in range(3)]
        for r in reqs:
            u = universe_at(now, names.user(r.user), snap_c, hist_c)
            a = model.features_for(r, snap, hist)
            b = features_at(model, now, [r], u, names)
            assert a.shape == b.shape == (1, len(model.meta["features"]))
            assert a.tobytes() == b.tobytes(), (now, r, np.flatnonzero(~((a == b) | (np.isnan(a) & np.isnan(b)))))
            checked += 1
        # several requests of one user at once (the elastic shapes' predict_many)
        shapes = [replace(reqs[0], nodes=n) for n in (1, 2, 4)]
        u = universe_at(now, names.user(reqs[0].user), snap_c, hist_c)
        assert model.predict_many(shapes, snap, hist) == predict_at(model, now, shapes, u, names)
    assert checked == 195 and dropped > 0  # some history rows were named by the snapshot: both paths drop them


def test_the_watchers_estimate_and_shapes_are_the_same_either_way(world):
    table, k, model = world
    rng = np.random.default_rng(11)
    work = ChainWork(work_s=72 * H, segment_s=24 * H)
    k.predictor = lambda now: model  # the one model for every moment
    fast, frames = SimWatcher(k), SimWatcher(k)
    frames.fast = False
    for now in T0 + rng.uniform(2 * DAY, 22 * DAY, 25):
        now = float(now)
        q = Queue(table, now, rng)
        q.seq, q.free, q.ai = 0, 0, 0
        segs, cur = asks(rng, now)
        est = [w.estimate(q, now, engine_chain(work, 3600.0, "predicted"), engine_segment(cur, True), cur, segs, 2)
               for w in (fast, frames)]
        assert est[0].seconds == est[1].seconds and est[0].model == est[1].model
        assert [est[0].prob_within(s) for s in (60.0, 3600.0, 86400.0)] == \
            [est[1].prob_within(s) for s in (60.0, 3600.0, 86400.0)]
        seg = engine_segment(cur, True)
        with _sim_time(now):
            a = _shape_waits(model, frames.history(now, segs, 2), engine_chain(work, 3600.0), seg,
                             frames.queue_rows(q, now, seg, cur, 2), [1, 2, 3])
            b = _shape_waits(_Cols(fast, model, q, now, segs), None, engine_chain(work, 3600.0), seg,
                             fast.queue_rows(q, now, seg, cur, 2, only_own=True), [1, 2, 3])
        assert a == b and len(a) == 3
    assert fast.cost["predictions"] == frames.cost["predictions"] == 25


class _Cols:
    def __init__(self, w, model, q, now, segs):
        self.answer = w._columnar(model, q, now, segs, 2)

    def predict_many(self, requests, snapshot=None, history=None):
        return self.answer(requests)


def rows(runs):
    return [tuple(None if isinstance(v, float) and math.isnan(v) else v for v in astuple(r)) for r in runs]


def test_a_replay_with_the_chainrun_model_gives_the_same_chains_either_way(monkeypatch):
    from chainrun.sim.knowledge import chainrun_predictor

    table = busy_trace(days=16)
    specs = [PolicySpec("predicted", "predicted"), PolicySpec("reactive", "reactive"),
             PolicySpec("predicted_quantile", "predicted", rule="quantile", lead_share=0.4)]
    c = cfg(nodes=4, chain_nodes=(1, 2), chains_every_s=3 * DAY, warmup_s=8 * DAY, retrain_every_s=3 * DAY,
            predictor=chainrun_predictor, specs=specs, work=ChainWork(work_s=40 * H, segment_s=12 * H),
            priority="fairshare")
    from chainrun.predict import columnar

    calls = []
    real = columnar.predict_with_features_at  # the estimate's path (predict_at goes through it too)
    monkeypatch.setattr(columnar, "predict_with_features_at", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    fast = run_chains(table, c)
    monkeypatch.setattr(SimWatcher, "fast", False)
    n_fast = len(calls)
    frames = run_chains(table, c)
    assert rows(fast.runs) == rows(frames.runs)
    assert len(fast.runs) >= 4
    cost = fast.meta["cost"], frames.meta["cost"]
    assert cost[0]["predictions"] == cost[1]["predictions"] > 0 and cost[0]["fallbacks"] == cost[1]["fallbacks"]
    assert n_fast > 0 and len(calls) == n_fast  # the columnar path answered the first run, the frames the second
