"""The elastic upper bound (chainrun.sim.elastic_bound): overhead parts and the filler's best gain."""

import pytest

from chainrun.sim.chains import ChainRun, ChainWork
from chainrun.sim.elastic_bound import bound_by_level, filler_gain, overhead_parts, shape_rates

H = 3600.0
WORK = ChainWork(work_s=100 * H, restart_s=600.0, handoff_s=300.0)


def chain(t0=0.0, first=2 * H, gaps=((3 * H, 0.0), (-H, H)), restarts=3, policy="predicted"):
    r = ChainRun(policy, t0, 4, WORK.work_s, first_wait_s=first, restart_s=restarts * 600.0,
                 handoff_s=2 * 300.0, boundaries=list(gaps))
    r.finish = t0 + WORK.work_s + first + sum(g for g, _ in gaps if g > 0) + r.restart_s + r.handoff_s
    return r


def test_overhead_parts_add_up_and_count_only_positive_gaps():
    p = overhead_parts(chain())
    assert p["first_wait"] == 2 * H and p["gaps"] == 3 * H  # the early start (-1 h) is no idle time
    assert p["restarts"] == 1800.0 and p["handoffs"] == 600.0
    assert p["other"] == pytest.approx(0.0)


def test_filler_gain_uses_the_best_rate_and_pays_restart_and_handoff():
    r = chain()
    # first wait 2 h and gap 3 h at rate 0.5: 0.5 x (2 h - 10 min) - 5 min + 0.5 x (3 h - 10 min) - 5 min
    expect = 0.5 * (2 * H - 600) - 300 + 0.5 * (3 * H - 600) - 300
    assert filler_gain(r, WORK, (0.25, 0.5)) == pytest.approx(expect)
    assert filler_gain(r, WORK, ()) == 0.0
    # a stretch too short to pay its own restart and hand-off gains nothing (never negative)
    assert filler_gain(chain(first=300.0, gaps=()), WORK, (0.5,)) == 0.0


def test_shape_rates_skip_the_reference_and_scale_by_efficiency():
    assert shape_rates((4, 2, 1), 1.0) == (0.5, 0.25)
    assert shape_rates((8, 4), 0.8) == pytest.approx((0.4,))
    assert shape_rates((4,), 1.0) == ()


def test_bound_by_level_is_summed_gain_over_summed_overhead():
    runs = [chain(t0=0.0), chain(t0=1.0, first=0.0, gaps=()), chain(t0=2.0, policy="reactive"),
            chain(t0=3.0)]  # the last is not in loads: not counted
    loads = {(0.0, 4): "heavy", (1.0, 4): "heavy", (2.0, 4): "heavy"}
    out = bound_by_level(runs, loads, WORK, (4, 2), (1.0, 0.8))
    assert list(out) == ["heavy"] and out["heavy"]["n"] == 2
    over = runs[0].overhead_s + runs[1].overhead_s
    assert out["heavy"]["overhead_h"] == pytest.approx(over / 2 / H)
    gain = filler_gain(runs[0], WORK, (0.5,))  # the second chain never idled
    assert out["heavy"]["bound"]["1"]["max_reduction"] == pytest.approx(gain / over)
    assert out["heavy"]["bound"]["0.8"]["max_reduction"] < out["heavy"]["bound"]["1"]["max_reduction"]
