"""Injected chains on hand-made traces: the oracle reaches gap 0, and no rule sees the future."""

import math

import pytest

from chainrun.predict import Prediction
from chainrun.sim import SimConfig, run_sim
from chainrun.sim.experiment import ChainSpec
from chainrun.sim.knowledge import RecentWaits

from .tracegen import T0, frame, steady

DAY = 86400.0


def busy_one_node(days=16):
    # one node, 75 % busy with 3 h jobs: a 48 h predecessor lets ~12 jobs queue up behind it
    return frame(steady(days, every_s=4 * 3600, run_s=3 * 3600))


def cfg(**kw):
    base = dict(nodes=1, chain_nodes=(1,), chains_every_s=3 * DAY, warmup_s=1 * DAY, workers=1,
                predictor=RecentWaits, retrain_every_s=2 * DAY, spec=ChainSpec(oracle_step_s=300.0),
                priority="age")  # the scenarios are scheduled by hand in age order; fair share: test_scheduler
    base.update(kw)
    return SimConfig(**base)


def test_oracle_reaches_gap_zero_where_reactive_waits():
    res = run_sim(busy_one_node(), cfg())
    assert res.meta["injections"] >= 2
    exact = res.policies["oracle_nohandoff"]
    assert exact["transitions"] == res.meta["injections"]
    assert exact["mean_interruption_h"] == 0 and exact["mean_overlap_h"] == 0  # starts exactly at the end
    assert res.policies["oracle"]["zero_interruption_share"] == 1.0
    assert res.policies["reactive"]["mean_interruption_h"] > 10  # behind the jobs that queued meanwhile


def test_every_required_policy_is_reported_with_the_json_keys():
    res = run_sim(busy_one_node(), cfg())
    js = res.as_json()
    assert set(js["fidelity"]) == {"spearman", "median_ratio", "within_2x"}
    for name in ("reactive", "dependency", "avg", "predicted", "predicted_handoff", "oracle"):
        p = js["policies"][name]
        assert {"transitions", "mean_interruption_h", "mean_overlap_h", "zero_interruption_share"} <= set(p)
        assert set(p["by_load"]) == {"low", "medium", "heavy"}


def test_handoff_caps_the_overlap_at_the_handoff_time():
    res = run_sim(busy_one_node(), cfg(nodes=2, fixed_leads_s=(40 * 3600.0,)))  # a second node to start early on
    assert res.policies["fixed_40h_handoff"]["mean_overlap_h"] <= 300 / 3600 + 1e-9
    assert res.policies["fixed_40h"]["mean_overlap_h"] > 1  # without hand-off both hold nodes


class Recorder:
    """A predictor that checks what it is given, and answers with the mean of every wait it can
    see -- so any leaked future fact would also change its answer."""

    calls: list = []

    def __init__(self, history, until):
        self._check(history, until, "fit")

    @classmethod
    def _check(cls, df, now, what):
        cls.calls.append(what)
        assert (df["submit"] < now).all(), f"{what}: a job submitted after now"
        for c in ("start", "end"):
            v = df[c].dropna()
            assert (v <= now).all(), f"{what}: a {c} after now"

    def predict(self, req, snapshot, history):
        now = req.submit
        self._check(history, now, "history")
        assert (snapshot["submit"] <= now).all(), "snapshot: a job submitted after now"
        assert (snapshot["start"].dropna() <= now).all() and snapshot["end"].isna().all()
        w = (history["start"] - history["submit"]).dropna()
        m = float(w.mean()) if len(w) else 0.0
        return Prediction(m / 2, m, 2 * m + 600 * len(history), "recorder")


def test_no_policy_sees_the_future():
    rows = steady(16, every_s=4 * 3600, run_s=3 * 3600)
    cut = 10 * DAY
    # the same trace until `cut`; afterwards a flood of long jobs (the future a policy must not see)
    flood = rows + [{"submit": cut + i * 60.0, "start": cut + i * 60.0, "end": cut + i * 60.0 + 20 * 3600, "limit_s": 40 * 3600,
                     "nodes": 1, "user": "flood"} for i in range(30)]
    flood.sort(key=lambda r: r["submit"])
    Recorder.calls = []
    # with fair share (the default): the flood's user must not change anyone's priority before it submits
    a = run_sim(frame(rows), cfg(predictor=Recorder, chains_every_s=1 * DAY, priority="fairshare"))
    b = run_sim(frame(flood), cfg(predictor=Recorder, chains_every_s=1 * DAY, priority="fairshare"))
    assert "fit" in Recorder.calls and "history" in Recorder.calls
    done_before_cut = lambda r: [  # noqa: E731
        (t.rule, t.t0, t.submit, t.start) for t in r.transitions
        if t.rule != "oracle" and not t.rule.startswith("oracle") and t.start < T0 + cut and t.submit < T0 + cut]
    before_a, before_b = done_before_cut(a), done_before_cut(b)
    assert len(before_a) >= 10
    assert before_a == before_b  # decided (and started) before the cut: the future changed nothing
    # ... while the oracle, which is allowed to know the future, is the only rule that may differ
    assert any(not math.isnan(t.start) for t in b.transitions if t.rule == "oracle")


def test_bad_config_is_a_usage_error():
    from chainrun.errors import UsageError

    with pytest.raises(UsageError):
        run_sim(busy_one_node(), cfg(chains_every_s=0))
    with pytest.raises(UsageError):
        run_sim(busy_one_node(), cfg(chain_nodes=(8,)))  # no chain fits on one node
