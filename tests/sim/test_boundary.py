"""The replay's segment boundary (chainrun/sim/boundary.py), which the one-cluster and the
several-cluster replay share: each of its three outcomes, and that the overhead splits exactly.
Whichever way a segment stops, its payload saves its checkpoint and exits ``W.save_s`` later, and
the successor trains only from then (before, the save at the signal was free)."""

from __future__ import annotations

import pytest

from chainrun.sim import boundary
from chainrun.sim.chains import ChainRun, ChainWork, Seg

H = 3600.0
W = ChainWork()  # 48 h segments, 10 min restart, 5 min hand-off and signal lead


def _pair(bn: float, rate: float = 1.0):
    cur = Seg(1, 0, 0.0, 48 * H, start=0.0, train_start=0.0, nodes=2, rate=rate)
    nxt = Seg(2, 1, 40 * H, 48 * H, start=bn, nodes=2)
    return cur, nxt, ChainRun("p", 0.0, 2, W.work_s)


H_POINT = 48 * H - W.signal_lead_s  # cur's hand-over point


def test_a_late_successor_queues_and_cur_stops_at_its_hand_over_point_and_exits_after_its_save():
    cur, nxt, run = _pair(H_POINT + 2 * H)
    cuts = []
    boundary.hand_over(run, cur, nxt, H_POINT, nxt.start, W, adaptive=True, left_after=100 * H,
                       full_capacity_s=47.75 * H, lead_s=H, cut=lambda j, t: cuts.append((j, t)))
    assert (cur.stop, cur.exit, nxt.train_start) == (H_POINT, H_POINT + W.save_s, H_POINT + 2 * H)
    assert run.queue_s == 2 * H and run.handoff_s == 0.0 and run.twice_node_s == 0.0
    assert run.boundaries == [(2 * H - W.save_s, 0.0)] and cuts == []  # the gap after its job ended


@pytest.mark.parametrize("after_s", [0.0, 60.0, W.save_s])
def test_a_successor_starting_while_its_predecessor_saves_at_the_signal_waits_for_the_save(after_s):
    # the oracle's successor starts at the hand-over point: it cannot train from a checkpoint not
    # yet written, as a handed-off one cannot
    cur, nxt, run = _pair(H_POINT + after_s)
    boundary.hand_over(run, cur, nxt, H_POINT, nxt.start, W, adaptive=True, left_after=100 * H,
                       full_capacity_s=47.75 * H, lead_s=H, cut=lambda j, t: None)
    assert nxt.train_start == H_POINT + W.save_s == cur.exit
    assert run.queue_s == after_s and run.handoff_s == W.save_s - after_s
    assert run.twice_node_s == (W.save_s - after_s) * 2
    # the chain's time from the signal to the successor's training splits exactly
    assert run.queue_s + run.handoff_s == nxt.train_start - H_POINT


@pytest.mark.parametrize("bn, waited, stopped", [(H_POINT + H, False, H_POINT), (H_POINT, False, H_POINT),
                                                 (H_POINT - H, False, H_POINT - H), (H_POINT - H, True, H_POINT)])
def test_where_a_segment_stops_and_exits_is_one_rule_for_one_cluster_and_a_move(bn, waited, stopped):
    # boundary.stop is what hand_over and the two-cluster replay's move (site_chain.move) both call
    cur, _, _ = _pair(bn)
    boundary.stop(cur, H_POINT, bn, W, waited=waited)
    assert (cur.stop, cur.exit) == (stopped, stopped + W.save_s)


def test_the_save_costs_the_same_at_the_signal_and_at_a_hand_off():
    late, early = _pair(H_POINT), _pair(H_POINT - 3 * H)
    for (cur, nxt, run), adaptive in ((late, True), (early, False)):
        boundary.hand_over(run, cur, nxt, H_POINT, nxt.start, W, adaptive=adaptive, left_after=100 * H,
                           full_capacity_s=47.75 * H, lead_s=H, cut=lambda j, t: None)
        assert nxt.train_start - cur.stop == W.save_s == run.handoff_s


def test_an_early_successor_without_the_adaptive_rule_cuts_its_predecessor():
    cur, nxt, run = _pair(H_POINT - 3 * H)
    cuts = []
    boundary.hand_over(run, cur, nxt, H_POINT, nxt.start, W, adaptive=False, left_after=100 * H,
                       full_capacity_s=47.75 * H, lead_s=H, cut=lambda j, t: cuts.append((j, t)))
    bn = H_POINT - 3 * H
    assert cur.stop == bn and cur.exit == bn + W.handoff_s == nxt.train_start
    assert cuts == [(1, bn + W.handoff_s)]  # the job is cut where its payload exits
    assert run.handoff_s == W.handoff_s and run.twice_node_s == W.handoff_s * 2
    assert run.boundaries == [(-3 * H - W.save_s, 3 * H - W.handoff_s)]
    # the restart is charged, and what it trained is credited at its rate
    run.restart_s = W.restart_s
    assert boundary.close(run, cur, W) == pytest.approx(bn - W.restart_s)
    assert run.restart_s == W.restart_s and run.slow_s == 0.0


def test_a_successor_a_few_minutes_early_waits_for_the_hand_over_point_when_the_rule_says_so():
    cur, nxt, run = _pair(H_POINT - 120.0)
    cuts = []
    boundary.hand_over(run, cur, nxt, H_POINT, nxt.start, W, adaptive=True, left_after=100 * H,
                       full_capacity_s=47.75 * H, lead_s=H, cut=lambda j, t: cuts.append((j, t)))
    assert (cur.stop, cur.exit, nxt.train_start) == (H_POINT, H_POINT + W.save_s, H_POINT + W.save_s)
    assert cuts == [] and run.twice_node_s == (120.0 + W.save_s) * 2 and run.handoff_s == W.save_s
    assert run.boundaries == [(-120.0 - W.save_s, 0.0)]


def test_a_segment_stopped_in_its_restart_is_charged_only_what_it_ran_and_a_slow_one_its_slowness():
    cur, _, run = _pair(0.0, rate=0.5)
    cur.stop = 240.0  # fair share started the successor 4 minutes in
    run.restart_s = W.restart_s
    assert boundary.close(run, cur, W) == 0.0
    assert run.restart_s == 240.0 and run.slow_s == 0.0
    cur.stop = 10 * H
    run = ChainRun("p", 0.0, 2, W.work_s, restart_s=W.restart_s)
    trained = 10 * H - W.restart_s
    assert boundary.close(run, cur, W) == pytest.approx(0.5 * trained)
    assert run.slow_s == pytest.approx(0.5 * trained) and run.restart_s == W.restart_s
