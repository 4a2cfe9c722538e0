"""`predicted`'s `slack` rule: the chain's slack per boundary, the lead that costs the chain least,
and the view the engine builds for it (the replay builds the same through chainrun.sim.adapter)."""

from __future__ import annotations

import math

import pytest

from chainrun.chain.policies import PolicyView, Predicted, WaitEstimate, cut_allowance, slack_lead
from chainrun.predict import Prediction
from chainrun.state.records import RUNNING, Chain, Segment

H = 3600.0
FULL = 47.75 * H  # a 48 h segment less the signal lead and a 10-minute restart


def test_the_allowance_is_the_slack_shared_by_the_boundaries_ahead():
    # 168 h of work: after segment 0 trains to its hand-over point 120.25 h are left, 3 more segments
    # are needed whatever happens, and they have 3 x 47.75 - 120.25 = 23 h to spare: 7.67 h each
    assert cut_allowance(168 * H - FULL, FULL) == pytest.approx(23 * H / 3)
    assert cut_allowance(168 * H - FULL, FULL, handoff_s=300) == pytest.approx(23 * H / 3 - 300)
    # spending it keeps the count: after a 7.67 h cut the next boundary still has 7.67 h
    after = 168 * H - FULL + 23 * H / 3 - FULL
    assert cut_allowance(after, FULL) == pytest.approx(23 * H / 3)
    # the last piece: what the final segment does not need
    assert cut_allowance(10 * H, FULL) == pytest.approx(FULL - 10 * H)
    # nothing left after the live segment, or a whole number of segments left: nothing to spare
    assert cut_allowance(0.0, FULL) == 0.0 and cut_allowance(-5.0, FULL) == 0.0
    assert cut_allowance(2 * FULL, FULL) == pytest.approx(0.0)
    assert cut_allowance(60.0, FULL, handoff_s=10 * FULL) == 0.0  # never negative


def _dist(*waits_h):
    vals = tuple(w * H for w in waits_h)
    return Prediction(vals[0], vals[1], vals[2], "cluster", (0.1, 0.5, 0.9, 0.95, 0.98), vals)


def test_a_quiet_queue_spends_the_allowance_and_no_more():
    quiet = _dist(0.003, 0.2, 1.0, 3.0, 6.0)  # usually minutes, a tail of hours
    a = 7.5 * H
    lead = slack_lead(quiet.prob_within, allowance_s=a, boundary_cost_s=H, floor_s=H, max_lead_s=24 * H, step_s=900)
    assert lead == pytest.approx(a)  # early within the slack is free; beyond it almost surely costs a boundary
    # the newsvendor rule would submit at the 0.98 quantile whatever the slack: here 6 h
    assert quiet.quantile(0.98) == pytest.approx(6 * H)


def test_a_busy_queue_goes_as_early_as_allowed_and_lateness_has_a_price():
    busy = _dist(1.0, 10.0, 30.0, 40.0, 50.0)
    lead = slack_lead(busy.prob_within, allowance_s=7.5 * H, boundary_cost_s=H, floor_s=H, max_lead_s=24 * H)
    assert lead == pytest.approx(24 * H)  # a boundary (1 h) costs less than the expected lateness
    # a boundary dearer than any lateness: the rule stays within the slack
    dear = slack_lead(busy.prob_within, allowance_s=7.5 * H, boundary_cost_s=1000 * H, floor_s=H, max_lead_s=24 * H)
    assert dear <= 7.5 * H


def test_the_lead_never_leaves_floor_and_cap():
    sure = _dist(0.001, 0.001, 0.001, 0.001, 0.001)  # "no wait at all"
    assert slack_lead(sure.prob_within, allowance_s=0.0, boundary_cost_s=H, floor_s=H, max_lead_s=5 * H) >= H
    never = _dist(100, 200, 300, 400, 500)
    assert slack_lead(never.prob_within, allowance_s=0.0, boundary_cost_s=H, floor_s=H, max_lead_s=5 * H) == 5 * H


def _view(now, est, *, allowance, end=200 * H, lead_s=3600):
    c = Chain(id="c", name="c", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=int(168 * H), segment_s=int(48 * H), policy="predicted", lead_s=lead_s, signal="USR2",
              signal_lead_s=300, retries=1, sbatch_args=[], partition="p")
    cur = Segment(chain_id="c", idx=0, phase=RUNNING, job_id="7", start=end - 48 * H, end=end)
    return PolicyView(now=now, chain=c, current=cur, handover_at=end - 300, predict_wait=lambda: est,
                      cut_allowance_s=allowance)


def test_predicted_slack_submits_at_the_lead_it_names_and_not_before():
    quiet = _dist(0.003, 0.2, 1.0, 3.0, 6.0)
    est = WaitEstimate(seconds=quiet.quantile(0.98), model="cluster", target=0.98, prob_within=quiet.prob_within)
    p = Predicted(max_lead_share=0.5, rule="slack", transition_cost_s=H)
    handover = 200 * H - 300
    early = p.decide(_view(handover - 20 * H, est, allowance=7.5 * H))
    assert not early.submit and early.due_lead_s == pytest.approx(7.5 * H)
    assert not p.decide(_view(handover - 7.5 * H - 60, est, allowance=7.5 * H)).submit
    d = p.decide(_view(handover - 7.5 * H, est, allowance=7.5 * H))
    assert d.submit and "slack rule" in d.reason and d.estimate == est
    assert early.prob_in_time is None  # only a submission carries the chance it acted on
    assert d.prob_in_time == pytest.approx(quiet.prob_within(7.5 * H))
    # the newsvendor rule on the same distribution: at its 0.98 quantile (6 h), whatever the slack
    q = Predicted(max_lead_share=0.5, rule="quantile")
    assert not q.decide(_view(handover - 6 * H - 600, est, allowance=7.5 * H)).submit
    qd = q.decide(_view(handover - 6 * H + 60, est, allowance=7.5 * H))
    assert qd.submit and qd.prob_in_time == pytest.approx(quiet.prob_within(6 * H - 60))
    # no slack known counts as none: every early start costs a boundary, and only lateness decides
    none = p.decide(_view(handover - 20 * H, est, allowance=None))
    step = max(300.0, (20 * H - 3600) / 96)
    assert none.due_lead_s == slack_lead(quiet.prob_within, allowance_s=0.0, boundary_cost_s=H, floor_s=3600,
                                         max_lead_s=20 * H, step_s=step)
    # the floor still decides when the model says "no wait"
    sure = WaitEstimate(seconds=1, model="cluster", target=0.98, prob_within=lambda h: 1.0)
    assert p.decide(_view(handover - 3600, sure, allowance=0.0)).submit
    # the guard holds whatever the rule: before the segment has trained half, no ask at all
    asked = []
    guarded = _view(handover - 30 * H, est, allowance=40 * H)
    guarded = PolicyView(**{**guarded.__dict__, "predict_wait": lambda: asked.append(1) or est})
    assert not p.decide(guarded).submit and not asked


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError):
        Predicted(rule="median")


def test_the_engine_gives_the_rule_the_chains_slack(tmp_path, monkeypatch):
    """planning.plan computes the allowance from the chain (work left after the live segment, a full
    segment's training, the measured hand-off) with the same cut_allowance the replay calls."""
    from chainrun.chain import planning
    from chainrun.chain.policies import Decision
    from tests.reliability.test_engine_faults import make_world

    seen: list[PolicyView] = []

    class Recorder:
        name = "predicted"

        def decide(self, view):
            seen.append(view)
            return Decision(False)

    monkeypatch.setattr(planning, "get_policy", lambda name: Recorder())
    fake, store, eng, c = make_world(tmp_path)  # total 3600 s in 120 s segments, signal lead 30 s
    (job,) = fake.jobs.values()
    fake.start(job.id)
    eng.tick()
    assert seen, "the policy was asked"
    view = seen[-1]
    remaining = 3600 - (120 - 30)  # the live segment trains its limit less the signal lead
    full = 120 - 30
    expected = cut_allowance(remaining, full, 30 + 0)  # no hand-off measured yet: the signal lead
    assert view.cut_allowance_s == pytest.approx(expected)
    assert math.isfinite(view.cut_allowance_s)


def test_the_engine_keeps_the_chance_it_acted_on(tmp_path, monkeypatch):
    """A submission's P(start in time), and the quantile its predicted wait was read at, reach the successor's
    record, where `model status` reads them."""
    from chainrun.chain import planning
    from chainrun.chain.policies import Decision
    from tests.reliability.test_engine_faults import make_world

    class Sure:
        name = "predicted"

        def decide(self, view):
            return Decision(True, "test", estimate=WaitEstimate(seconds=60, model="cluster", target=0.93),
                            prob_in_time=0.8125)

    monkeypatch.setattr(planning, "get_policy", lambda name: Sure())
    fake, store, eng, c = make_world(tmp_path)
    (job,) = fake.jobs.values()
    fake.start(job.id)
    eng.tick()
    segs = store.segments(c.id)
    assert len(segs) == 2 and segs[1].extra.get("prob_in_time") == 0.8125
    assert segs[1].predicted_wait_s == 60 and segs[1].extra.get("wait_quantile") == 0.93  # where it was read
    assert "prob_in_time" not in segs[0].extra


def test_a_remembered_distribution_answers_as_the_plain_one():
    # the replay asks one state's distribution under every candidate (policies.Remembered): each
    # answer, and each lead the rule picks, must be what the plain distribution gives
    from chainrun.chain.policies import Remembered, _expected_lateness

    asked = []
    for waits in ((0.003, 0.2, 1.0, 3.0, 6.0), (2.0, 9.0, 20.0, 30.0, 40.0), (0.1, 0.1, 0.1, 5.0, 5.0)):
        d = _dist(*waits)

        def plain(s, d=d):
            asked.append(s)
            return d.prob_within(s)

        mem = Remembered(plain)
        for floor, cap, step, allowance, cost in ((H, 30 * H, 300.0, 7 * H, H), (3 * H, 30 * H, 900.0, 0.0, 6 * H),
                                                  (H, 30 * H, 300.0, 7 * H, 3 * H)):
            kw = dict(allowance_s=allowance, boundary_cost_s=cost, floor_s=floor, max_lead_s=cap, step_s=step)
            assert slack_lead(mem, **kw) == slack_lead(d.prob_within, **kw)
        leads = [H, 2 * H, 7 * H]
        assert _expected_lateness(mem, leads) == _expected_lateness(d.prob_within, leads)
        n = len(asked)
        assert _expected_lateness(mem, leads) == _expected_lateness(d.prob_within, leads)
        assert len(asked) == n  # the second time from memory: the distribution was not read again


def test_a_tuned_cost_reads_the_wait_at_the_quantile_it_acts_on(chainrun_home):
    """The watcher's estimate comes at the shipped cost's quantile; with another boundary cost in force the
    quantile rule acts on that cost's quantile, and the wait it reports (stored as the segment's
    predicted_wait_s, scored by `model status`) is the one there, not the shipped quantile's."""
    from chainrun.chain import tuned
    from chainrun.chain.policies import predict_quantile

    busy = _dist(1.0, 10.0, 30.0, 40.0, 50.0)
    shipped_q = predict_quantile(48 * H)
    est = WaitEstimate(seconds=busy.quantile(shipped_q), model="cluster", target=shipped_q,
                       prob_within=busy.prob_within, quantile=busy.quantile)
    tuned.record("local", "p", {"adopted": True, "reason": "test", "summary": "test",
                                "chosen": {"rule": "quantile", "transition_cost_s": 6 * H, "lead_share": 0.9,
                                           "floor_s": 3600.0}})
    q = predict_quantile(48 * H, 6 * H)
    assert q != shipped_q
    d = Predicted(tuned=True).for_chain(_view(0, est, allowance=0).chain).decide(
        _view(200 * H - 300 - busy.quantile(q) + 60, est, allowance=0.0))
    assert d.submit and d.estimate.target == q and d.estimate.seconds == pytest.approx(busy.quantile(q))
