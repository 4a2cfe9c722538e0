"""The tuning procedure's pick: a guard without a bound (share 1.0) is reported, never picked while a
bounded share is left; then fewest stuck chains, then the lowest mean overhead."""

from chainrun.sim.tune import candidates, pick


def test_no_cap_is_not_picked_while_a_bounded_share_is_left():
    specs = candidates(shares=(0.5, 0.75, 1.0))
    overhead = {0.5: 3.52, 0.75: 3.50, 1.0: 3.42}
    rows = {s.name: {"n": 148, "mean_overhead_h": overhead[s.lead_share], "stuck": 0, "gpu_h_twice_share": 0.004}
            for s in specs}
    assert pick(rows, specs).lead_share == 0.75
    only_uncapped = candidates(shares=(1.0,))
    rows1 = {s.name: {"n": 10, "mean_overhead_h": 1.0, "stuck": 0} for s in only_uncapped}
    assert pick(rows1, only_uncapped).lead_share == 1.0


def test_fewest_stuck_before_the_mean():
    specs = candidates(shares=(0.25, 0.5))
    rows = {specs[0].name: {"n": 9, "mean_overhead_h": 9.0, "stuck": 0},
            specs[1].name: {"n": 9, "mean_overhead_h": 1.0, "stuck": 2}}
    assert pick(rows, specs).lead_share == 0.25
