"""The replay's `predicted` doubts as the watcher does (chainrun/predict/doubt.py): a model out of its
depth is widened and leans on Slurm's view of the queue ahead, which the replay draws from its
backfill plan (``squeue --start``: chainrun/sim/expected_start.py), asked only then."""

from __future__ import annotations

import numpy as np
import pytest

from chainrun.chain import site_plan

from chainrun.predict.doubt import SlurmView, Support, assess
from chainrun.predict.distribution import Prediction
from chainrun.predict.training import fit_predictor
from chainrun.sim.adapter import SimWatcher, engine_chain, engine_segment
from chainrun.sim.chains import ChainWork
from chainrun.sim.expected_start import expected_start, latest_planned_start
from chainrun.sim.knowledge import Knowledge

from .test_fast_asks import DAY, H, Queue, asks, busy_trace
from .tracegen import T0

# 4 nodes, all busy: 2 free at t=100, all 4 at t=200
RUNNING = [(100.0, 2), (200.0, 2)]
PENDING = [(1, 3, 50.0), (2, 1, 1000.0)]  # in priority order: job 1 waits for 3 nodes, job 2 backfills


def test_the_latest_planned_start_is_the_latest_squeue_start_of_the_counted_jobs():
    assert [expected_start(0.0, 4, RUNNING, PENDING, j) for j in (1, 2)] == [200.0, 100.0]
    assert latest_planned_start(0.0, 4, RUNNING, PENDING) == 200.0
    assert latest_planned_start(0.0, 4, RUNNING, PENDING, counted=lambda j: j != 1) == 100.0
    # beyond the backfill's depth Slurm plans nothing (squeue shows N/A)
    assert latest_planned_start(0.0, 4, RUNNING, PENDING, depth=1, counted=lambda j: j != 1) is None
    assert latest_planned_start(0.0, 4, RUNNING, [(3, 9, 10.0)]) is None  # never fits
    assert latest_planned_start(0.0, 4, RUNNING, []) is None


def test_a_lazy_view_is_drawn_only_when_the_model_is_out_of_its_depth():
    p = Prediction(10.0, 60.0, 600.0, "m", (0.1, 0.5, 0.9), (10.0, 60.0, 600.0))
    drawn = []

    def view():
        drawn.append(1)
        return SlurmView(ahead_jobs=3, ahead_nodes=3, ahead_start_s=7200.0)

    sure = assess(p, Support(rows=10**6, short=False), view)
    assert drawn == [] and not sure.leaned and sure.slurm is None
    unsure = assess(p, Support(rows=10**6, short=False, outside={"q_pending_jobs": (9.0, 0.0, 2.0)}), view)
    assert drawn == [1] and unsure.leaned and unsure.prediction.p50 >= 7200.0
    assert unsure.slurm.ahead_start_s == 7200.0


class PlannedQueue(Queue):
    """The test squeue with Slurm's plan: every pending job's latest planned start is ``latest``."""

    def __init__(self, table, now, rng, latest):
        super().__init__(table, now, rng)
        self.seq, self.free, self.ai, self.latest, self.asked = 0, 0, 0, latest, 0

    def latest_expected_start(self, counted):
        self.asked += 1
        return self.latest


@pytest.fixture(scope="module")
def idle_model_world():
    table = busy_trace(days=12)
    k = Knowledge(table, table["start"].to_numpy(float), factory=lambda h, u: None, retrain_every_s=1e9,
                  first_retrain=T0)
    early = table[table["submit"] < T0 + 0.7 * DAY]
    model = fit_predictor(early, until=T0 + 0.7 * DAY)  # a short history: the model is not sure
    k.predictor = lambda now: model
    return table, k, model


@pytest.mark.parametrize("fast", [True, False])
def test_the_replays_estimate_leans_on_the_backfill_plan_where_the_watcher_would(idle_model_world, fast):
    table, k, model = idle_model_world
    work = ChainWork(work_s=72 * H, segment_s=24 * H)
    now = T0 + 8 * DAY
    out = {}
    for latest in (None, now + 30 * H):
        w = SimWatcher(k)
        w.fast = fast
        rng = np.random.default_rng(5)
        q = PlannedQueue(table, now, rng, latest)
        segs, cur = asks(rng, now)
        chain = engine_chain(work, 3600.0, "predicted")
        est = w.estimate(q, now, chain, engine_segment(cur, True), cur, segs, 2)
        again = w.estimate(q, now, chain, engine_segment(cur, True), cur, segs, 2)  # the same state: cached
        assert again.seconds == est.seconds and q.asked == 1  # drawn once, and only because it is unsure
        out[latest is None] = est
    plain, leaned = out[True], out[False]
    assert "leaning on Slurm's squeue --start" in leaned.model and "leaning" not in plain.model
    assert leaned.p50 >= 30 * H > plain.p50 and leaned.seconds > plain.seconds
    # the model's own median travels with the leaned answer: what caps Slurm's plan for a pending
    # successor in placement (a median leaned on a plan caps nothing: site_plan.own_median_s)
    assert leaned.model_p50 == plain.p50 and plain.model_p50 is None
    assert site_plan.own_median_s(leaned) == plain.p50 and site_plan.own_median_s(plain) == plain.p50
    # the same distribution answers a tuning candidate's other level
    assert leaned.quantile(0.9) >= leaned.p50
