"""The tuning procedure's pick: a guard without a bound (share 1.0) is reported, never picked while a
bounded share is left; then fewest stuck chains, then the lowest mean overhead."""

import pytest

from chainrun.sim.tune import candidates, pick


def test_no_cap_is_not_picked_while_a_bounded_share_is_left():
    specs = candidates(shares=(0.5, 0.75, 1.0), costs=(3600.0,), rules=("quantile",))
    overhead = {0.5: 3.52, 0.75: 3.50, 1.0: 3.42}
    rows = {s.name: {"n": 148, "mean_overhead_h": overhead[s.lead_share], "stuck": 0, "gpu_h_twice_share": 0.004}
            for s in specs}
    assert pick(rows, specs).lead_share == 0.75
    only_uncapped = candidates(shares=(1.0,), costs=(3600.0,), rules=("quantile",))
    rows1 = {s.name: {"n": 10, "mean_overhead_h": 1.0, "stuck": 0} for s in only_uncapped}
    assert pick(rows1, only_uncapped).lead_share == 1.0


def test_fewest_stuck_before_the_mean():
    specs = candidates(shares=(0.25, 0.5), costs=(3600.0,), rules=("quantile",))
    rows = {specs[0].name: {"n": 9, "mean_overhead_h": 9.0, "stuck": 0},
            specs[1].name: {"n": 9, "mean_overhead_h": 1.0, "stuck": 2}}
    assert pick(rows, specs).lead_share == 0.25


def _lv(low, medium, heavy=None, n=10):
    return {"low": {"n": n, "mean_overhead_h": low}, "medium": {"n": n, "mean_overhead_h": medium},
            "heavy": {"n": 0 if heavy is None else n, "mean_overhead_h": heavy}}


def test_the_pick_closes_the_worst_load_level_before_the_mean():
    """Two candidates: one lower on average but leaving the quiet chains behind, one that leaves
    less of reactive - oracle open at its worst level. The goal is per level, so the second wins;
    a level with too few chains (heavy here, n = 0) does not steer."""
    from chainrun.sim.tune import gap_left

    a, b = candidates(shares=(0.5, 0.75), costs=(3600.0,), rules=("quantile",))
    refs = {"reactive": {"n": 20, "mean_overhead_h": 9.0, "by_load": _lv(2.0, 16.0)},
            "oracle": {"n": 20, "mean_overhead_h": 1.0, "by_load": _lv(1.0, 1.0)}}
    rows = {a.name: {"n": 20, "mean_overhead_h": 2.0, "stuck": 0, "by_load": _lv(1.8, 2.2)},  # leaves 0.8 of low
            b.name: {"n": 20, "mean_overhead_h": 2.2, "stuck": 0, "by_load": _lv(1.2, 3.2)}, **refs}  # worst: 0.2 of low
    assert gap_left(rows[a.name], refs["reactive"], refs["oracle"]) == pytest.approx(0.8)
    assert gap_left(rows[b.name], refs["reactive"], refs["oracle"]) == pytest.approx(0.2)
    assert pick(rows, [a, b]) == b
    # a level whose reactive - oracle gap is under 30 min has no goal: only the mean decides then
    quiet = {k: dict(v, by_load=_lv(1.2, 1.0)) for k, v in refs.items()}
    assert gap_left(rows[a.name], quiet["reactive"], quiet["oracle"]) is None
    assert pick({**rows, **quiet}, [a, b]) == a


def test_the_grid_tunes_the_boundary_cost_through_the_shipped_quantile():
    from chainrun.chain.policies import predict_quantile

    specs = candidates(shares=(0.5,), costs=(3600.0, 7200.0), segment_s=48 * 3600.0)
    assert [s.name for s in specs] == ["predicted_cost60m_floor60m_share50", "predicted_cost120m_floor60m_share50",
                                       "predicted_slack_cost60m_floor60m_share50",
                                       "predicted_slack_cost120m_floor60m_share50"]
    assert [s.target for s in specs[:2]] == [predict_quantile(48 * 3600, 3600.0), predict_quantile(48 * 3600, 7200.0)]
    # every candidate names its rule (the shipped default may be either) and the slack rule its cost
    assert [s.rule for s in specs] == ["quantile", "quantile", "slack", "slack"]
    assert [s.cost_s for s in specs[2:]] == [3600.0, 7200.0] and specs[2].target is None


def test_every_candidate_reaches_the_shipped_class_with_its_own_rule_cost_and_share():
    from chainrun.chain.policies import Predicted
    from chainrun.sim.adapter import SimWatcher

    for spec in candidates(shares=(0.4,), costs=(5400.0,)):
        pol = SimWatcher.policy(object.__new__(SimWatcher), spec)
        assert isinstance(pol, Predicted)
        assert (pol.rule, pol.transition_cost_s, pol.max_lead_share) == (spec.rule, 5400.0, 0.4)


def test_worst_levels_within_the_best_ones_noise_tie_then_the_mean_decides():
    """The choice window's low-load gap is small, so its share is noisy: a candidate whose worst
    share lies within the best one's 90 % interval there ties with it, and the lower mean wins
    (here: 5 minutes more at low load, 3 hours less at medium)."""
    from chainrun.sim.tune import gap_left, tolerance

    a, b, c = candidates(shares=(0.4, 0.6, 0.75), costs=(3600.0,), rules=("slack",))
    refs = {"reactive": {"n": 40, "mean_overhead_h": 9.0, "by_load": _lv(1.4, 19.0)},
            "oracle": {"n": 40, "mean_overhead_h": 1.0, "by_load": _lv(0.8, 1.5)}}

    def row(low, ci_hi, medium, mean):
        lv = _lv(low, medium)
        lv["low"]["ci90_h"] = [low - 0.1, ci_hi]
        return {"n": 40, "mean_overhead_h": mean, "stuck": 0, "by_load": lv}

    rows = {a.name: row(1.11, 1.23, 6.4, 2.6),   # the smallest worst share (0.52 of low), interval +0.2
            b.name: row(1.19, 1.30, 3.5, 1.6),   # 0.65 of low: within 0.52 + 0.2
            c.name: row(1.30, 1.40, 3.4, 1.5),   # 0.83 of low: outside, though its mean is lowest
            **refs}
    assert gap_left(rows[a.name], refs["reactive"], refs["oracle"]) == pytest.approx(0.31 / 0.6)
    assert tolerance(rows[a.name], refs["reactive"], refs["oracle"]) == pytest.approx(0.12 / 0.6)
    assert pick(rows, [a, b, c]) == b
    # without an interval nothing ties: the smallest worst share wins, as before
    for k in (a.name, b.name, c.name):
        del rows[k]["by_load"]["low"]["ci90_h"]
    assert pick(rows, [a, b, c]) == a
