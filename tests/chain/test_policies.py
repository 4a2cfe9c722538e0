"""Submission policies: pure decisions on hand-made states (outcomes: tests/chain/test_outcomes.py)."""

import pytest

from chainrun.chain.policies import Decision, PolicyView, Predicted, WaitEstimate, get_policy
from chainrun.errors import UsageError
from chainrun.state.records import PENDING, RUNNING, Chain, Segment


def chain(**kw):
    base = dict(id="c", name="c", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
                total_s=7200, segment_s=3600, policy="lead", lead_s=600, signal="USR2", signal_lead_s=300,
                retries=1, sbatch_args=[], partition="p")
    base.update(kw)
    return Chain(**base)


def view(now, *, phase=RUNNING, end=10_000.0, estimate=None, **kw):
    c = chain(**kw)
    cur = Segment(chain_id="c", idx=0, phase=phase, job_id="7", end=end if phase == RUNNING else None)
    handover = (end - c.signal_lead_s) if phase == RUNNING else None
    return PolicyView(now=now, chain=c, current=cur, handover_at=handover,
                      predict_wait=(lambda: estimate) if estimate is not None else None)


def test_reactive_never_submits_early():
    assert get_policy("reactive").decide(view(9_999)) == Decision(False)


def test_dependency_prequeues_with_afterany():
    d = get_policy("dependency").decide(view(0, phase=PENDING))
    assert d.submit and d.dependency == "afterany:7"


def test_lead_fires_at_handover_minus_lead():
    p = get_policy("lead")
    # handover = 10000 - 300 = 9700; due = 9700 - 600 = 9100
    assert not p.decide(view(9_099)).submit
    assert p.decide(view(9_100)).submit
    assert not p.decide(view(9_500, phase=PENDING)).submit


def test_predicted_submits_when_wait_reaches_time_left():
    p = Predicted(rule="quantile")  # the newsvendor rule (a tuning candidate)
    est = WaitEstimate(seconds=1000, model="cluster")
    assert not p.decide(view(8_000, estimate=est)).submit  # 1700 s left > 1000
    d = p.decide(view(8_700, estimate=est))  # 1000 s left
    assert d.submit and d.estimate == est


def test_predicted_asks_the_deadline_question():
    p = Predicted(rule="quantile")
    # P(wait <= h) = h / 2000: the chance of starting in time is 0.9 with 1800 s left
    est = WaitEstimate(seconds=1800, model="cluster", target=0.9, prob_within=lambda h: min(1.0, h / 2000))
    assert not p.decide(view(7_800, estimate=est)).submit  # 1900 s left: P = 0.95 > 0.9, too early
    d = p.decide(view(7_900, estimate=est))  # 1800 s left: P = 0.9, the last moment at the target
    assert d.submit and "P(start within" in d.reason and d.estimate == est
    # the floor still holds when the model says "no wait at all"
    sure = WaitEstimate(seconds=1, model="cluster", target=0.9, prob_within=lambda h: 1.0)
    assert not p.decide(view(9_099, estimate=sure)).submit and p.decide(view(9_100, estimate=sure)).submit


def test_predicted_rule_from_a_real_model_distribution():
    from chainrun.predict import Prediction

    dist = Prediction(10.0, 600.0, 3000.0, "cluster", (0.1, 0.5, 0.9, 0.95, 0.98), (10.0, 600.0, 3000.0, 4000.0, 5000.0))
    est = WaitEstimate(seconds=dist.quantile(0.98), model="cluster", target=0.98, prob_within=dist.prob_within)
    p = Predicted(rule="quantile")
    # hand-over at 9700: submit once the time left reaches the 0.98 quantile (5000 s), not before
    assert not p.decide(view(9_700 - 5_100, estimate=est)).submit
    assert p.decide(view(9_700 - 4_990, estimate=est)).submit


def test_predicted_lead_is_a_floor():
    p = Predicted(rule="quantile")
    tiny = WaitEstimate(seconds=5, model="cluster")  # the model says "no wait"
    assert not p.decide(view(9_099, estimate=tiny)).submit  # 601 s left, floor 600
    assert p.decide(view(9_100, estimate=tiny)).submit  # 600 s left: the floor decides


def test_predicted_without_model_falls_back_to_lead():
    p = get_policy("predicted")
    assert p.decide(view(9_100)).submit and not p.decide(view(9_000)).submit


def test_unknown_policy():
    with pytest.raises(UsageError, match="unknown policy"):
        get_policy("eager")


def test_predict_quantile_follows_segment_length():
    from chainrun.chain.policies import MAX_TARGET, TRANSITION_COST_S, predict_quantile

    # the newsvendor quantile 1 / (1 + boundary cost / segment), capped at the model's highest learned
    # level; the cost is the decide-on-past, score-on-future procedure's pick (chainrun/sim/tune.py)
    assert MAX_TARGET == 0.98
    assert predict_quantile(48 * 3600, 3600) == pytest.approx(0.9796, abs=0.0001)
    assert predict_quantile(48 * 3600, 7200) == pytest.approx(0.96, abs=0.001)
    assert predict_quantile(6 * 3600, 3600) == pytest.approx(0.857, abs=0.001)
    assert predict_quantile(48 * 3600, 1800) == MAX_TARGET  # a cheaper boundary: at the cap
    assert predict_quantile(48 * 3600) == predict_quantile(48 * 3600, TRANSITION_COST_S)
    assert predict_quantile(120) == 0.5  # short segments: early is as costly as late
    assert predict_quantile(10**9) == MAX_TARGET


def running_view(now, *, start=0.0, end=10_000.0, estimate=None, lead_s=600):
    c = chain(policy="predicted", lead_s=lead_s, segment_s=10_000)  # a full segment trains 9700 s
    cur = Segment(chain_id="c", idx=0, phase=RUNNING, job_id="7", start=start, end=end)
    return PolicyView(now=now, chain=c, current=cur, handover_at=end - c.signal_lead_s,
                      predict_wait=(lambda: estimate) if estimate is not None else None)


def test_predicted_guard_no_submit_at_a_segments_start_when_the_model_says_longer_than_the_segment():
    """The spiral: a model whose wait at the target is longer than the whole segment made the rule
    submit at the segment's start; the guard waits until only MAX_LEAD_SHARE of its training is left."""
    from chainrun.chain.policies import Predicted, lead_cap_s

    asked = []
    never = WaitEstimate(seconds=1e9, model="pessimist", target=0.95, prob_within=lambda h: 0.0)

    def estimate():
        asked.append(1)
        return never

    p = Predicted(max_lead_share=0.5)
    training = 9_700.0  # start 0 to the hand-over point 9700: a full segment
    first = 9_700.0 - lead_cap_s(training, training, 0.5)
    assert first == pytest.approx(4_850.0)
    v = running_view(0.0)
    v = PolicyView(now=0.0, chain=v.chain, current=v.current, handover_at=v.handover_at, predict_wait=estimate)
    d = p.decide(v)
    assert not d.submit and "guard" in d.reason and not asked  # the model is not even asked
    late = PolicyView(now=first, chain=v.chain, current=v.current, handover_at=v.handover_at, predict_wait=estimate)
    assert p.decide(late).submit and asked
    assert not p.decide(running_view(first - 1, estimate=never)).submit
    # the guard holds for the floor too: a floor longer than the segment no longer submits at its start
    assert not p.decide(running_view(100.0, estimate=never, lead_s=20_000)).submit
    # a segment shorter than (1 - share) of a full one (a chain's last piece) gets no early successor
    short = running_view(9_600.0, start=5_000.0, estimate=never)
    assert lead_cap_s(4_700.0, 9_700.0, 0.5) == 0.0 and not p.decide(short).submit


def test_predicted_guard_share_one_is_no_cap_and_the_shipped_share_is_used():
    from chainrun.chain.policies import MAX_LEAD_SHARE, Predicted, lead_cap_s

    never = WaitEstimate(seconds=1e9, model="pessimist", target=0.95, prob_within=lambda h: 0.0)
    assert Predicted(max_lead_share=1.0).decide(running_view(0.0, estimate=never)).submit  # the old rule
    assert lead_cap_s(10.0, 10.0, 1.0) == float("inf")
    assert get_policy("predicted").max_lead_share == MAX_LEAD_SHARE
    # without a start time (never seen running) there is nothing to measure the share on: no guard
    assert get_policy("predicted").decide(view(0.0, estimate=never)).submit
