"""The multi-cluster replay reconsiders a successor pending on the chain's cluster as the watcher does
(site_plan.reconsider, issue #26): Slurm's expected start for it against the other cluster's wait."""

from pathlib import Path

from chainrun.predict import Prediction
from chainrun.sim import two_sites
from chainrun.sim.chain_replay import ChainsConfig, with_work
from chainrun.traces import read_trace

from .test_two_sites import QueueLength  # 10 h of wait per pending job: sees a quiet queue as quiet
from .tracegen import T0, frame, sacct_dump, steady

H, DAY = 3600.0, 86400.0


class Flat:
    """A stand-in model that says an hour whatever the queue holds."""

    def __init__(self, history, until) -> None:
        pass

    def predict(self, request, snapshot=None, history=None):
        return Prediction(0.5 * H, H, 1.5 * H, "flat")


def _a(flood_jobs: int, flood_limit_h: float, flood_run_h: float | None = None) -> list[dict]:
    """Cluster a (two nodes): quiet, then another user's job takes the chain's other node at 205 h (12 h
    limit, done in 11), so the chain's successor, asked for at 208.5 h, pends there behind the
    predecessor's limit (216 h: no later than the hand-over, nothing to gain elsewhere); at 209 h a new
    user's two-node jobs arrive and, ahead of it by fair share, take both nodes first."""
    rows = steady(20, every_s=12 * H, run_s=H)
    rows.append({"submit": 205 * H, "start": 205 * H, "end": 216 * H, "limit_s": 12 * H, "user": "blocker"})
    for i in range(flood_jobs):
        t = (209 + 2 * i) * H
        run_h = flood_limit_h if flood_run_h is None else flood_run_h
        rows.append({"submit": t, "start": t, "end": t + run_h * H, "limit_s": flood_limit_h * H,
                     "nodes": 2, "user": "flood"})
    return sorted(rows, key=lambda r: r["submit"])


def _runs(tmp_path: Path, a_rows: list[dict], margin_s: float, predictor=QueueLength) -> dict:
    """One chain (segment 0 on a at 192 h) under every row at one margin: {policy: its run}."""
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    paths[0].write_text(sacct_dump(frame(a_rows)))
    paths[1].write_text(sacct_dump(frame(steady(20, every_s=12 * H, run_s=H))))  # b stays quiet
    cfg = with_work(ChainsConfig(nodes=2, chains_every_s=DAY, workers=1, chain_nodes=(1,), predictor=predictor,
                                 retrain_every_s=H, inject_from=T0 + 8 * DAY, inject_until=T0 + 8.5 * DAY),
                    work_s=40 * H, segment_s=24 * H)
    traces = [str(p) for p in paths]
    frames = [read_trace(t) for t in traces]
    weeks = two_sites.shift_weeks(frames, [two_sites.trace_key(t) for t in traces], "end")
    sh = two_sites.setup(frames, two_sites.site_names(traces), weeks, cfg, two_sites.SitesConfig(margin_s=margin_s),
                         {})
    pts = two_sites.points(two_sites.window(sh["cover"]), cfg, sh["sizes"])
    assert [t for t, _ in pts] == [T0 + 8 * DAY]
    runs, _ = two_sites.run_points(pts, (margin_s,), 1)
    return {r.policy.split("@")[0]: r for r in runs}


def _at(r) -> dict:
    """Each weighing of the pending successor: {hours since T0: Slurm's planned start, hours since T0}."""
    return {round((at - T0) / H, 2): round((planned - T0) / H, 2) for at, _, planned, _ in r.weighed}


def test_a_successor_pending_on_a_cluster_that_fills_is_cancelled_and_moves(tmp_path):
    runs = _runs(tmp_path, _a(3, 24), H)
    multi, on_a = runs["predicted_multi"], runs["predicted:a"]
    # the cancelled job never started (2 segments, not 3) and the successor placed on b is a move, charged
    assert multi.sites == ["a", "b"] and multi.segments == 2 and multi.moves == 1 and multi.move_cost_s > 0
    assert multi.overhead_s < 1 * H < 24 * H < on_a.overhead_s  # a alone waits out the flood
    # before the flood Slurm plans it at the predecessor's limit (216 h): within the margin, it stays;
    # at 209 h the flood's first job is planned at the blocker's limit (217 h) for 24 h, and the
    # successor's 24 h fit only after it (241 h): b finishes ~25 h sooner, more than the 1 h margin
    assert _at(multi) == {208.67: 216.0, 208.83: 216.0, 209.0: 241.0}
    (at, jid, frm, to), = multi.cancelled
    assert (at, frm, to) == (T0 + 209 * H, "a", "b") and multi.pending_moves == 1
    assert {j for _, j, _, _ in multi.weighed} == {jid}  # the job weighed is the one cancelled
    # a's wait is Slurm's plan (32 h from now) no longer than a's model for the same request now (the
    # flood and the successor pending: 20 h): b finishes more than the margin sooner, by less than the plan says
    gain = multi.weighed[-1][3]["a"] - multi.weighed[-1][3]["b"]
    assert H < gain < 24 * H


def test_slurms_plan_alone_never_moves_a_chain_its_model_says_will_start_soon(tmp_path):
    # the flood's jobs ask for 24 h and end after one: Slurm plans the successor at 241 h (limits), a's
    # model says an hour, as b's does. Read alone, the plan made b look 25 h sooner and moved the chain
    # (to a cluster 40 % slower in the --pace 0.6 replay); no longer than a's median, nothing is gained
    multi = _runs(tmp_path, _a(3, 24, flood_run_h=1), H, predictor=Flat)["predicted_multi"]
    assert _at(multi)[209.0] == 241.0  # the plan is as pessimistic as before
    assert multi.pending_moves == 0 and not multi.cancelled and multi.sites == ["a", "a"] and multi.moves == 0
    at209 = next(w for w in multi.weighed if round((w[0] - T0) / H, 2) == 209.0)
    assert at209[3]["a"] <= at209[3]["b"]  # the same hour's wait, and no transfer to pay


def test_a_successor_whose_delay_is_within_the_margin_stays(tmp_path):
    # one two-node job of 2 h: Slurm's plan for the successor moves from 216 h to 219 h (behind it at
    # the blocker's limit), then to 218 h when the blocker ends (at 216 h, before its limit); b would
    # finish ~2.8 h sooner: more than a 1 h margin (it moves), less than 3 h (it stays and waits)
    moved = _runs(tmp_path, _a(1, 2), H)["predicted_multi"]
    assert moved.pending_moves == 1 and moved.sites == ["a", "b"]
    multi = _runs(tmp_path, _a(1, 2), 3 * H)["predicted_multi"]
    plans = _at(multi)
    assert plans[208.83] == 216.0 and plans[209.0] == 219.0 and plans[216.17] == 218.0
    at209 = next(w for w in multi.weighed if round((w[0] - T0) / H, 2) == 209.0)
    assert 2 * H < at209[3]["a"] - at209[3]["b"] < 3 * H
    assert multi.pending_moves == 0 and not multi.cancelled and multi.sites == ["a", "a"] and multi.moves == 0
    assert max(plans) < 218.0  # weighed every tick until it started, at Slurm's planned 218 h
