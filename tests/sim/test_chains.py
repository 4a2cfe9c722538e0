"""Whole-chain replay on hand-made traces: the overhead splits exactly, the oracle is a bound,
the shipped policy classes are what is measured, the adaptive hand-off rule, the CLI shape."""

import json

import pytest

from chainrun.chain.handoff_rule import segments_needed, wait_instead_of_cut
from chainrun.sim.chain_replay import ChainsConfig, run_chains
from chainrun.sim.chains import ChainWork, PolicySpec
from chainrun.sim.knowledge import RecentWaits
from tests.conftest import run_cli

from .tracegen import frame, sacct_dump, steady

DAY = 86400.0
H = 3600.0


def busy():
    # two nodes, busy with 3 h jobs every 2 h: a segment's successor queues behind them
    return frame(steady(40, every_s=2 * H, run_s=3 * H))


def cfg(**kw):
    base = dict(nodes=2, chain_nodes=(1,), chains_every_s=4 * DAY, warmup_s=1 * DAY, workers=1,
                predictor=RecentWaits, retrain_every_s=2 * DAY,
                work=ChainWork(work_s=72 * H, segment_s=24 * H, oracle_step_s=600.0),
                priority="age")  # the scenarios are scheduled by hand in age order; fair share: test_scheduler
    base.update(kw)
    return ChainsConfig(**base)


@pytest.fixture(scope="module")
def result():
    return run_chains(busy(), cfg())


def test_overhead_splits_into_queue_restart_and_handoff(result):
    assert result.meta["injections"] >= 3
    for r in result.runs:
        assert r.done and not r.stuck
        assert r.overhead_s == pytest.approx(r.queue_s + r.restart_s + r.handoff_s, abs=1e-6)
        assert r.restart_s <= r.segments * 600.0 + 1e-6  # a segment cut within its restart lost less
        assert r.segments >= 4  # 72 h of work in 24 h segments, less restarts and signal leads


def test_oracle_is_a_bound_and_reactive_pays_the_queue(result):
    pols = result.summary["chains"]["policies"]
    assert pols["oracle"]["mean_overhead_h"] < pols["reactive"]["mean_overhead_h"] - 10
    assert pols["oracle"]["transitions"]["zero_interruption_share"] == 1.0
    for name, p in pols.items():
        assert p["mean_overhead_h"] >= pols["oracle"]["mean_overhead_h"] - 0.2, name
    # the JSON keys of the issue
    assert set(result.summary["chains"]) >= {"work_h", "segment_h", "restart_cost_min", "policies"}
    for name in ("reactive", "avg", "predicted", "oracle", "dependency", "predicted_cut"):
        assert set(pols[name]) >= {"n", "mean_overhead_h", "mean_segments", "gpu_h_twice_share", "by_load"}
        assert set(pols[name]["by_load"]) == {"low", "medium", "heavy"}


def test_the_shipped_class_is_what_is_measured(monkeypatch):
    """Change chainrun.chain.policies.Predicted and the replay's `predicted` changes with it."""
    from chainrun.chain import policies

    specs = [PolicySpec("reactive", "reactive"), PolicySpec("predicted", "predicted")]
    seen = []

    def always(self, view):
        seen.append(view)
        return policies.Decision(True, "test")

    base = run_chains(busy(), cfg(specs=specs, max_chains=1))
    monkeypatch.setattr(policies.Predicted, "decide", always)
    changed = run_chains(busy(), cfg(specs=specs, max_chains=1))
    assert seen, "the replay did not ask chainrun.chain.policies.Predicted"
    v = seen[-1]
    assert v.handover_at == v.current.end - v.chain.signal_lead_s  # as planning.plan builds it
    assert v.chain.lead_s == policies.PREDICTED_FLOOR_S and v.chain.segment_s == 24 * 3600  # the shipped floor
    b = base.summary["chains"]["policies"]["predicted"]
    c = changed.summary["chains"]["policies"]["predicted"]
    assert (b["mean_overhead_h"], b["mean_segments"]) != (c["mean_overhead_h"], c["mean_segments"])


def test_the_watcher_estimate_sees_no_chain_job_in_the_snapshot(monkeypatch):
    """_estimate removes the live segment from the snapshot and takes the request from it."""
    from chainrun.predict import Prediction

    calls = []

    class Spy:
        def __init__(self, history, until):
            pass

        def predict(self, req, snapshot, history):
            calls.append((req, snapshot, history))
            return Prediction(600.0, 1200.0, 2400.0, "spy")

    run_chains(busy(), cfg(specs=[PolicySpec("predicted", "predicted")], max_chains=1, predictor=Spy))
    assert calls
    for req, snap, hist in calls:
        assert req.user == "chainrun-chain" and req.nodes == 1 and req.timelimit_s == 24 * 3600
        assert "chainrun-chain" not in set(snap["user"])
        known = hist[hist["start"].notna()]
        assert (known["start"] <= req.submit).all() and (hist["submit"] < req.submit).all()


def test_segments_needed_and_the_adaptive_rule():
    assert segments_needed(10 * H, 20 * H, 40 * H) == 1
    assert segments_needed(50 * H, 20 * H, 40 * H) == 2
    # a successor within the hand-off time of the hand-over point always waits
    assert wait_instead_of_cut(200, handoff_s=300, remaining_s=10 * H, capacity_s=40 * H, full_capacity_s=40 * H,
                               boundary_cost_s=H)
    # otherwise a cut costs no extra segment: cut
    assert not wait_instead_of_cut(2 * H, handoff_s=300, remaining_s=10 * H, capacity_s=40 * H,
                                   full_capacity_s=40 * H, boundary_cost_s=H)
    # the hand-off minutes would push the work into one more segment: wait if the idle time is short
    kw = dict(handoff_s=300, remaining_s=40 * H - 1000, capacity_s=40 * H, full_capacity_s=40 * H)
    assert wait_instead_of_cut(1200, boundary_cost_s=H, **kw)
    assert not wait_instead_of_cut(1200, boundary_cost_s=600, **kw)  # 15 min idle > a 10 min boundary


def test_cli_chains_json(tmp_path, chainrun_home):
    p = tmp_path / "sacct.txt"
    p.write_text(sacct_dump(busy()))
    r = run_cli("sim", "--trace", str(p), "--nodes", "2", "--chains", "--work", "72h", "--segment", "24h",
                "--restart-cost", "10m", "--chains-every", "6d", "--json", home=chainrun_home)
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)
    assert env["command"] == "sim"
    data = env["data"]
    assert {"spearman", "spearman_without_holds"} <= set(data["fidelity"])
    c = data["chains"]
    assert c["work_h"] == 72 and c["segment_h"] == 24 and c["restart_cost_min"] == 10
    for name in ("reactive", "avg", "predicted", "oracle"):
        row = c["policies"][name]
        assert row["n"] > 0 and row["mean_overhead_h"] is not None
        assert set(row["by_load"]["medium"]) >= {"n", "mean_overhead_h"}


def test_builtin_trace_name():
    from chainrun.traces import builtin_path, read_trace as load_trace

    assert builtin_path("ls6-a100-dev").is_file()
    t = load_trace("ls6-a100-dev")
    assert len(t) == 17975


def test_tune_picks_within_the_budget_fewest_stuck_then_lowest_overhead():
    from chainrun.sim.tune import candidates, pick

    specs = candidates(targets=(0.8, 0.9), floors=(3600.0,), shares=(1.0,), rules=("quantile",))
    a, b = specs
    rows = {a.name: {"n": 10, "mean_overhead_h": 5.0, "gpu_h_twice_share": 0.002, "stuck": 0},
            b.name: {"n": 10, "mean_overhead_h": 4.0, "gpu_h_twice_share": 0.002, "stuck": 0}}
    assert pick(rows, specs) == b
    rows[b.name]["gpu_h_twice_share"] = 0.02  # over the 1 % budget
    assert pick(rows, specs) == a
    rows[b.name]["gpu_h_twice_share"] = 0.002
    rows[b.name]["stuck"] = 1  # a mean over fewer chains is not comparable
    assert pick(rows, specs) == a


def test_tuning_chooses_only_on_chains_that_end_before_the_split_and_never_scores_it(monkeypatch):
    """The run that chooses replays only the choice window: no score of the window it will be
    judged on is shown beside the pick (score it in another run, or with --rolling)."""
    from chainrun.sim import tune as tune_mod

    seen = []
    real = tune_mod.run_chains

    def spy(trace, cfg):
        seen.append((cfg.inject_from, cfg.inject_until, [s.name for s in cfg.specs]))
        return real(trace, cfg)

    monkeypatch.setattr(tune_mod, "run_chains", spy)
    c = cfg(chains_every_s=2 * DAY, work=ChainWork(work_s=30 * H, segment_s=12 * H))
    split = busy()["submit"].min() + 20 * DAY
    out = tune_mod.tune(busy(), c, split)
    [(f1, u1, names1)] = seen
    life = 30 * H * 1.5 + 2 * DAY
    assert f1 is None and u1 == split - life
    # the choice run holds the grid and the two rows the per-level goal is measured against
    assert {n for n in names1 if not n.startswith("predicted_")} == {"reactive", "oracle"}
    assert out["choose"]["picked"]["name"] in names1
    assert "score" not in out and out["choose"]["candidates"][out["choose"]["picked"]["name"]]["n"] > 0


def test_hand_off_spiral_only_with_the_sizing_before_the_fix():
    """A lead longer than the last segment: its successor starts at once on an idle partition and
    cuts it. Sized as the watcher sized it before the fix (successor_limit="handover": the work
    left after the live segment), it is short of what the cut took, so yet another one follows: a
    spiral. Sized as planning.plan sizes it now (the default: the work left as if the live segment
    stopped now), it takes over and the chain ends."""
    idle = frame(steady(30, every_s=12 * H, run_s=H))  # two nodes, almost always free
    specs = [PolicySpec("reactive", "reactive"), PolicySpec("fixed_6h", "lead", lead_s=6 * H)]
    work = dict(work_s=30 * H, segment_s=12 * H, max_segments=20)
    old = run_chains(idle, cfg(specs=specs, max_chains=1, work=ChainWork(successor_limit="handover", **work)))
    shipped = run_chains(idle, cfg(specs=specs, max_chains=1, work=ChainWork(**work)))
    s = [r for r in old.runs if r.policy == "fixed_6h"][0]
    t = [r for r in shipped.runs if r.policy == "fixed_6h"][0]
    assert s.stuck or s.segments > 6
    # a 6 h lead cuts every segment about 6 h early: 30 h of work in 5 segments, no spiral
    assert t.done and not t.stuck and t.segments <= 5


def test_the_replay_sizes_a_successor_with_the_engines_helpers(monkeypatch):
    """The shipped sizing is planning.plan's: chainrun.chain.pace.trained_so_far is what it calls."""
    from chainrun.chain import pace
    from chainrun.sim import chains

    calls = []

    def spy(seg, now):
        calls.append((seg.phase, now))
        return pace.trained_so_far(seg, now)

    monkeypatch.setattr(chains, "trained_so_far", spy)
    specs = [PolicySpec("fixed_6h", "lead", lead_s=6 * H)]
    run_chains(busy(), cfg(specs=specs, max_chains=1))
    assert calls and all(p == "RUNNING" for p, _ in calls)
    with pytest.raises(ValueError):
        run_chains(busy(), cfg(specs=specs, max_chains=1, work=ChainWork(successor_limit="nope")))


def test_the_replays_predicted_is_what_submit_ships():
    """`predicted` is the shipped rule with the adaptive hand-off the watcher always writes, and
    the guard's shipped share; `predicted_cut` the same rule cutting at every early start."""
    from chainrun.chain.policies import Predicted
    from chainrun.sim.adapter import SimWatcher
    from chainrun.sim.chains import default_specs
    from chainrun.sim.tune import candidates

    specs = {s.name: s for s in default_specs()}
    assert specs["predicted"].adaptive and specs["predicted"].lead_share is None
    assert not specs["predicted_cut"].adaptive and specs["predicted_cut"].policy == "predicted"
    assert all(c.adaptive for c in candidates())  # the procedure tunes what ships
    w = SimWatcher.__new__(SimWatcher)
    assert w.policy(specs["predicted"]).max_lead_share == Predicted().max_lead_share
    assert w.policy(PolicySpec("x", "predicted", lead_share=0.25)).max_lead_share == 0.25


def test_the_guard_stops_the_spiral_of_a_model_that_always_says_longer_than_the_segment():
    """A model whose wait at the target is always longer than the segment: without the guard
    (share 1.0) `predicted` submits at every segment's start and on an idle partition each
    successor cuts its predecessor minutes in; with the guard every segment trains at least
    (1 - share) of itself, so the chain needs few segments."""
    from chainrun.predict import Prediction

    class Pessimist:
        def __init__(self, history, until):
            pass

        def predict(self, req, snapshot, history):
            return Prediction(100 * H, 200 * H, 400 * H, "pessimist")

    idle = frame(steady(30, every_s=12 * H, run_s=H))  # two nodes, almost always free
    specs = [PolicySpec("no_guard", "predicted", lead_share=1.0), PolicySpec("guard", "predicted", lead_share=0.5)]
    work = ChainWork(work_s=30 * H, segment_s=12 * H, max_segments=20)
    res = run_chains(idle, cfg(specs=specs, max_chains=1, work=work, predictor=Pessimist))
    runs = {r.policy: r for r in res.runs}
    assert runs["no_guard"].stuck or runs["no_guard"].segments > 8
    g = runs["guard"]
    assert g.done and not g.stuck
    # each segment trains >= half of a full 12 h one (all of itself if shorter) before its
    # successor exists: 30 h in a handful (a 5-min reactive tail: the hand-off wait, see evaluation.md)
    assert g.segments <= 8 < runs["no_guard"].segments
    assert all(cut <= 0.5 * 12 * H + 60 for _, cut in g.boundaries)


class Recorder:
    """A predictor that checks what it is given, and answers with the mean of every wait it can
    see -- so any leaked future fact would also change its answer (moved here with the
    per-transition replay's retirement: the whole-chain replay is the one that runs)."""

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
        from chainrun.predict import Prediction

        now = req.submit
        self._check(history, now, "history")
        assert (snapshot["submit"] <= now).all(), "snapshot: a job submitted after now"
        assert (snapshot["start"].dropna() <= now).all()
        w = (history["start"] - history["submit"]).dropna()
        m = float(w.mean()) if len(w) else 0.0
        return Prediction(m / 2, m, 2 * m + 600 * len(history), "recorder")


def test_no_policy_sees_the_future():
    from .tracegen import T0

    rows = steady(16, every_s=4 * H, run_s=3 * H)
    cut = 10 * DAY
    # the same trace until `cut`; afterwards a flood of long jobs (the future a policy must not see)
    flood = rows + [{"submit": cut + i * 60.0, "start": cut + i * 60.0, "end": cut + i * 60.0 + 20 * H,
                     "limit_s": 40 * H, "nodes": 1, "user": "flood"} for i in range(30)]
    flood.sort(key=lambda r: r["submit"])
    Recorder.calls = []
    # with fair share: the flood's user must not change anyone's priority before it submits
    a = run_chains(frame(rows), cfg(predictor=Recorder, chains_every_s=1 * DAY, priority="fairshare"))
    b = run_chains(frame(flood), cfg(predictor=Recorder, chains_every_s=1 * DAY, priority="fairshare"))
    assert "fit" in Recorder.calls and "history" in Recorder.calls

    def before_cut(res):  # chains whose whole life (every decision and start) ended before the cut
        return {(r.policy, r.t0, r.nodes): (r.finish, r.segments, r.queue_s, r.handoff_s, tuple(r.boundaries))
                for r in res.runs if r.policy != "oracle" and r.done and r.finish < T0 + cut}

    assert len(before_cut(a)) >= 10 and {p for p, _, _ in before_cut(a)} >= {"reactive", "predicted", "avg"}
    assert before_cut(a) == before_cut(b)  # the future changed nothing
