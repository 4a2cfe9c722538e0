"""Submission policies and outcome classification: pure decisions on hand-made states."""

import pytest

from chainrun.chain.outcomes import classify, record_overlaps
from chainrun.chain.policies import Decision, PolicyView, WaitEstimate, get_policy
from chainrun.errors import UsageError
from chainrun.slurm.parsers import AcctRow
from chainrun.state.records import ENDED, PENDING, RUNNING, Chain, Segment


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
    p = get_policy("predicted")
    est = WaitEstimate(seconds=1000, model="cluster")
    assert not p.decide(view(8_000, estimate=est)).submit  # 1700 s left > 1000
    d = p.decide(view(8_700, estimate=est))  # 1000 s left
    assert d.submit and d.estimate == est


def test_predicted_lead_is_a_floor():
    p = get_policy("predicted")
    tiny = WaitEstimate(seconds=5, model="cluster")  # the model says "no wait"
    assert not p.decide(view(9_099, estimate=tiny)).submit  # 601 s left, floor 600
    assert p.decide(view(9_100, estimate=tiny)).submit  # 600 s left: the floor decides


def test_predicted_without_model_falls_back_to_lead():
    p = get_policy("predicted")
    assert p.decide(view(9_100)).submit and not p.decide(view(9_000)).submit


def test_unknown_policy():
    with pytest.raises(UsageError, match="unknown policy"):
        get_policy("eager")


def row(state, *, elapsed=100.0, limit=3600.0, code=0, sig=0, job="7"):
    return AcctRow(job_id=job, name="cr.c.0", user="u", partition="p", qos="", submit=0, eligible=0, start=0,
                   end=elapsed, elapsed_s=elapsed, time_limit_s=limit, nodes=1, cpus=1, gpus=0, state=state,
                   exit_code=code, exit_signal=sig, reason="", state_detail=state)


@pytest.mark.parametrize(
    "state,info,outcome,credit",
    [
        ("COMPLETED", {"outcome": "continue", "signaled": "1"}, "continue", 3600),  # ran its planned length
        ("COMPLETED", {"outcome": "continue", "signaled": "0"}, "continue", 100),  # left early on its own
        ("COMPLETED", {"outcome": "handoff"}, "handoff", 100),
        ("COMPLETED", {"outcome": "done"}, "done", 100),
        ("FAILED", {"outcome": "crash", "exit": "3"}, "crash", 0),
        ("TIMEOUT", {}, "continue", 3600),  # killed at the limit before writing anything
        ("OUT_OF_MEMORY", {}, "crash", 0),
        ("NODE_FAIL", {}, "crash", 0),
        ("PREEMPTED", {}, "continue", 100),
    ],
)
def test_classify(state, info, outcome, credit):
    r = classify(chain(), Segment(chain_id="c", idx=0, job_id="7", time_limit_s=3600), row(state), info)
    assert (r.outcome, r.credit_s) == (outcome, credit)


def test_cancelled_outside_chainrun_is_external():
    seg = Segment(chain_id="c", idx=0, job_id="7")
    r = classify(chain(), seg, row("CANCELLED"), {"outcome": "continue", "signaled": "1"})
    assert r.outcome == "cancelled" and r.external
    seg.extra["cancel_requested"] = True
    assert not classify(chain(), seg, row("CANCELLED"), {}).external


def test_overlap_and_gap():
    a = Segment(chain_id="c", idx=0, phase=ENDED, start=0, end=100)
    b = Segment(chain_id="c", idx=1, phase=ENDED, start=90, end=200)
    c = Segment(chain_id="c", idx=2, phase=RUNNING, start=260)
    record_overlaps([a, b, c])
    assert b.overlap_s == 10 and b.extra["gap_s"] == -10
    assert c.overlap_s == 0 and c.extra["gap_s"] == 60


def test_predict_quantile_follows_segment_length():
    from chainrun.chain.policies import predict_quantile

    assert predict_quantile(48 * 3600) == pytest.approx(0.98, abs=0.001)
    assert predict_quantile(24 * 3600) == pytest.approx(0.96, abs=0.001)
    assert predict_quantile(120) == 0.5  # short segments: early is as costly as late
    assert predict_quantile(10**9) == 0.99
