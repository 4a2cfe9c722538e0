"""The multi-cluster replay (chainrun/sim/two_sites.py, site_chain.py, site_tune.py): names, the weekly
shift, the injection window, the margin's choice and a move charged in full, on small synthetic traces."""

from dataclasses import replace

import pandas as pd
import pytest

from chainrun.errors import UsageError
from chainrun.predict import Prediction
from chainrun.sim import site_tune, two_sites
from chainrun.sim.chain_replay import ChainsConfig, with_work

from .tracegen import T0, frame, sacct_dump, steady

H, DAY, WEEK = 3600.0, 86400.0, 7 * 86400.0


def test_site_names_are_file_stems_and_a_repeat_is_numbered():
    assert two_sites.site_names(["/x/ls6.log.xz", "ls6-a100-dev", "/y/ls6.txt", "/x/ls6.log.xz"]) == \
        ["ls6", "ls6-a100-dev", "ls6#2", "ls6#3"]
    assert two_sites.trace_key("ls6-a100-dev") == two_sites.trace_key(str(two_sites.trace_key("ls6-a100-dev")))
    # a file named like a numbered copy keeps every name distinct (two clusters never share one)
    assert two_sites.site_names(["x#2.log", "x.log", "x.log"]) == ["x#2", "x", "x#3"]


def test_end_alignment_shifts_by_whole_weeks_and_a_copy_by_four():
    a = frame(steady(60))
    b = frame(steady(30))  # ends 30 days earlier: 4.3 weeks -> 4
    assert two_sites.shift_weeks([a, b, a], ["a", "b", "a"], "end") == [0, 4, two_sites.DUPLICATE_SHIFT_WEEKS]
    assert two_sites.shift_weeks([a, b], ["a", "b"], "-2w") == [0, -2]
    for bad in ("start", "2d", "w"):
        with pytest.raises(UsageError, match="--align"):
            two_sites.parse_align(bad)


def test_a_shift_keeps_weekday_and_hour_and_leaves_the_input_alone():
    a = frame(steady(3))
    s = two_sites.shifted(a, 3)
    assert (s["submit"] - a["submit"] == 3 * WEEK).all() and (s["end"] - a["end"] == 3 * WEEK).all()
    t, u = pd.to_datetime(a["submit"], unit="s"), pd.to_datetime(s["submit"], unit="s")
    assert (t.dt.day_of_week == u.dt.day_of_week).all() and (t.dt.hour == u.dt.hour).all()
    assert a["submit"].iloc[0] == T0  # not changed in place
    assert two_sites.shifted(a, 0) is a


def test_chains_are_injected_only_where_every_trace_covers_their_life():
    cfg = ChainsConfig(chains_every_s=DAY)
    win = two_sites.window([(10 * DAY, 50 * DAY), (20 * DAY, 40 * DAY)])
    assert win == (20 * DAY, 40 * DAY)
    pts = two_sites.points(win, cfg, (1, 8))
    assert [t for t, _ in pts] == [(20 + i) * DAY for i in range(21)] and [k for _, k in pts[:3]] == [1, 8, 1]
    inside = two_sites.points(win, replace(cfg, inject_from=25 * DAY, inject_until=27 * DAY), (1,))
    assert [t for t, _ in inside] == [25 * DAY, 26 * DAY]
    # the life is counted at the slowest pace
    slow = with_work(cfg, work_s=100 * H)
    assert two_sites.life_s(slow, {"b": 0.5}) == 200 * H * 1.5 + 2 * DAY


def test_pace_is_cluster_equals_number():
    assert two_sites.parse_paces(["b=0.6", "a=1,b=0.5"], ["a", "b"]) == {"a": 1.0, "b": 0.5}
    assert two_sites.parse_paces(["ls6#2=0.6"], ["ls6", "ls6#2"]) == {"ls6#2": 0.6}
    for bad, msg in (("c=1", "no cluster"), ("b", "not CLUSTER=PACE"), ("b=0", "not CLUSTER=PACE")):
        with pytest.raises(UsageError, match=msg):
            two_sites.parse_paces([bad], ["a", "b"])


def _row(mean, moves=0.0, stuck=0, twice=0.0, n=20):
    return {"n": n, "mean_overhead_h": mean, "moves": moves, "stuck": stuck, "gpu_h_twice_share": twice}


def test_the_margin_pick_fewest_stuck_then_budgets_then_lowest_mean_ties_to_the_largest():
    rows = {0.0: _row(1.00, moves=2.0), 1800.0: _row(1.10), 3600.0: _row(1.14), 10800.0: _row(1.30),
            21600.0: _row(0.50, stuck=1)}
    # 0 breaks the moves budget, 6 h is stuck once; 30 min is lowest, 1 h within 0.05 h of it: the larger
    assert site_tune.pick(rows) == 3600.0
    assert site_tune.pick({0.0: _row(1.0, moves=3.0), 3600.0: _row(2.0, moves=2.0)}) == 0.0  # none keeps it


def test_targets_compare_with_the_better_single_cluster_per_level():
    def lv(**kw):
        return {k: {"n": 0, "mean_overhead_h": None} | kw.get(k, {}) for k in ("low", "medium", "heavy")}

    pols = {"predicted:a": {"n": 9, "by_load": lv(low={"n": 3, "mean_overhead_h": 1.0},
                                                      heavy={"n": 6, "mean_overhead_h": 10.0})},
            "predicted:b": {"n": 9, "by_load": lv(low={"n": 3, "mean_overhead_h": 2.0},
                                                      heavy={"n": 6, "mean_overhead_h": 8.0})},
            "predicted_multi": {"n": 9, "moves": 0.5, "stuck": 0, "gpu_h_twice_share": 0.002,
                                "by_load": lv(low={"n": 3, "mean_overhead_h": 1.04},
                                              heavy={"n": 6, "mean_overhead_h": 5.0})}}
    t = site_tune.targets(pols, ["a", "b"])
    assert t["low"]["better_single"] == "predicted:a" and t["low"]["within_5pct"] is True
    assert t["heavy"]["better_single"] == "predicted:b" and t["heavy"]["reduction"] == pytest.approx(3 / 8)
    assert t["heavy"]["cut_30pct"] is True and t["medium"] is None and t["moves_ok"] and t["gpu_h_twice_ok"]


class QueueLength:
    """A stand-in model that reads the queue: 10 h of wait per pending job (the move test needs a model
    that sees a queue fill up between two refits)."""

    def __init__(self, history, until) -> None:
        pass

    def predict(self, request, snapshot=None, history=None):
        pend = int((snapshot["state"] == "PENDING").sum()) if snapshot is not None and len(snapshot) else 0
        w = 10 * H * pend + 60.0
        return Prediction(w * 0.5, w, w * 1.5, "queue-length")


def _flooded(days: float, flood_at: float) -> list[dict]:
    """Two nodes, quiet, then from ``flood_at`` days a flood of two-node jobs: a queue of days."""
    rows = steady(days, every_s=12 * H, run_s=H)
    t = flood_at * DAY
    while t < days * DAY:
        rows.append({"submit": t, "start": t, "end": t + 20 * H, "limit_s": 24 * H, "nodes": 2, "user": "flood"})
        t += 2 * H
    return sorted(rows, key=lambda r: r["submit"])


def test_a_chain_whose_cluster_fills_up_moves_once_and_pays_the_transfer(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    # the flood starts after the first ask (the guard opens 9.57 h into the segment, asked on the 9.67 h
    # tick; the flood at 9.84 h): that ask sees a quiet a and waits, the next sees the queue and moves. A
    # flood that starts just before the first ask is seen with one job pending (a 10 h wait, hidden by the
    # 14 h before the hand-over point): the successor is submitted on a and, pending there, never moves
    a.write_text(sacct_dump(frame(_flooded(20, 8.41))))
    b.write_text(sacct_dump(frame(steady(20, every_s=12 * H, run_s=H))))
    cfg = with_work(ChainsConfig(nodes=2, chains_every_s=DAY, workers=1, chain_nodes=(1,), predictor=QueueLength,
                                 retrain_every_s=H, inject_from=T0 + 8 * DAY, inject_until=T0 + 8.5 * DAY),
                    work_s=40 * H, segment_s=24 * H)
    data = two_sites.run_sites([str(a), str(b)], cfg, two_sites.SitesConfig(margin_s=H), pace_args=[])
    pols = data["chains"]["policies"]
    multi, on_a = pols["predicted_multi"], pols["predicted:a"]
    assert data["meta"]["injections"] == 1 and multi["n"] == on_a["n"] == 1
    assert multi["moves"] == 1.0 and multi["segments_by_site"]["a"] == 1 and multi["segments_by_site"]["b"] >= 1
    # the move is paid: a wait for the final checkpoint or the work since the newest copy, never free
    assert 0 < multi["mean_move_cost_h"] * H <= 900 + 1800 + 300
    assert multi["mean_overhead_h"] < on_a["mean_overhead_h"] - 5  # a stays flooded for days
    assert multi["gpu_h_twice_share"] <= 0.01
    assert any("equal pace" in w for w in data["meta"]["warnings"])
    # the race: the first segment goes to both quiet clusters, both start, the second is cancelled a tick later
    raced = two_sites.run_sites([str(a), str(b)], cfg, two_sites.SitesConfig(margin_s=H, race=True), pace_args=[])
    r = raced["chains"]["policies"]["predicted_multi_race"]
    assert r["race_duplicates"] == 1.0 and r["segments_by_site"]["a"] == 1 and r["gpu_h_twice_share"] > 0
    assert r["gpu_h_twice"] <= (multi["gpu_h_twice"] + 60 / H * 3 + 1e-9)  # one node for a minute more
    # with a longer copy, the same move costs more
    slow = two_sites.run_sites([str(a), str(b)], cfg, two_sites.SitesConfig(margin_s=H, transfer_s=2 * H),
                               pace_args=[])
    assert slow["chains"]["policies"]["predicted_multi"]["mean_overhead_h"] > multi["mean_overhead_h"]
