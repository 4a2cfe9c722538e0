"""Self-tuning in `model refresh` (chainrun/sim/selftune.py, chainrun/chain/tuned.py) on small
hand-made traces: the values chosen at a moment depend on nothing after it; a choice is adopted only
past the check's noise and the fidelity floor; too little history keeps what is in force and says
so; the values in force are stored, pinned, rolled back and read by the shipped `predicted`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from chainrun.chain import tuned
from chainrun.chain.policies import Predicted, default_lead_s, get_policy
from chainrun.sim import rolling as R
from chainrun.sim import selftune as S
from chainrun.sim.fidelity import replay_alone
from chainrun.sim.knowledge import RecentWaits
from chainrun.sim.workload import build_workload

from .test_rolling import DAY, H, SPLIT, grid, trace
from .tracegen import frame, steady

SHAPE = {"source": "test", "nodes": 1, "segment_s": 12 * H, "work_s": 30 * H, "signal_lead_s": 300.0}
KEYS = ("chosen", "chosen_name", "check", "window", "reason", "adopted", "best_fixed_lead_s")


def choose(tr, **kw):
    base = dict(nodes=2, shape=SHAPE, in_force=tuned.shipped(), predictor=RecentWaits, min_choice=6, min_check=2,
                cands=grid(), warmup_s=5 * DAY, chains_every_s=DAY)
    return S.choose(tr, **{**base, **kw})


@pytest.fixture(scope="module")
def at_split():
    return choose(trace(), as_of=SPLIT, check_s=4 * DAY)


def test_the_values_chosen_do_not_change_when_the_history_after_the_check_window_does(at_split):
    changed = choose(trace(after_split_changes=True), as_of=SPLIT, check_s=4 * DAY)
    assert at_split["chosen"] and at_split["window"]["check_chains"] >= 2  # a real choice and check
    assert {k: changed.get(k) for k in KEYS} == {k: at_split.get(k) for k in KEYS}
    # the change is real: chosen at the end of each history, the two differ
    late = [choose(t, check_s=6 * DAY) for t in (trace(), trace(after_split_changes=True))]
    assert late[0]["window"] != late[1]["window"] or late[0]["check"] != late[1]["check"]


def test_the_check_scores_stand_beside_reactive_the_oracle_and_the_best_fixed_lead(at_split):
    sc = at_split["check"]["scores_h"]
    assert set(sc) == {"chosen", "in_force", "reactive", "oracle", "best_fixed"}
    assert sc["oracle"] <= sc["reactive"] and all(v is not None for v in sc.values())
    w = at_split["window"]  # chosen on older chains than it was checked on, all before as_of
    assert w["choice_until"] == w["check_from"] < w["check_until"] == pd.Timestamp(SPLIT, unit="s").strftime(
        "%Y-%m-%dT%H:%M:%S")


def self_consistent(tr: pd.DataFrame) -> pd.DataFrame:
    """The trace with its recorded starts replaced by its own replay (age priority, 2 nodes): the
    replay's fidelity is then 1, so the adoption rule is decided by the check alone."""
    w = build_workload(tr)
    starts = np.asarray(replay_alone(w, 2, bf_depth=1000, size_weight_s=0.0), float)
    t = w.table.copy()
    run = (t["end"] - t["start"]).clip(upper=t["timelimit_s"])
    t["start"] = starts
    t["end"] = starts + run.to_numpy(float)
    return t


def test_a_choice_that_beats_the_values_in_force_past_the_noise_is_adopted():
    tr = self_consistent(trace(after_split_changes=True))
    bad = R.values(grid()[1])  # 3 h floor, share 0.25: on this queue a chain pays hours for it
    out = choose(tr, in_force=bad, check_s=6 * DAY)
    assert out["fidelity"]["spearman"] >= S.FIDELITY_FLOOR
    assert out["chosen"] != bad and out["check"]["ci90_h"][0] > 0, out["reason"]
    assert out["adopted"] and out["reason"].startswith("beats the values in force")
    assert out["check"]["scores_h"]["chosen"] < out["check"]["scores_h"]["in_force"]


def test_the_adoption_rule():
    ok = {"adopt": True, "mean_gain_h": 1.0, "ci90_h": [0.5, 1.5]}
    assert S.verdict(same=False, check=ok, spearman=0.5)[0]
    assert not S.verdict(same=True, check=ok, spearman=0.5)[0]
    adopted, why = S.verdict(same=False, check={**ok, "adopt": False, "ci90_h": [-0.2, 1.5]}, spearman=0.9)
    assert not adopted and "noise" in why
    for rho in (0.1, float("nan"), None):
        adopted, why = S.verdict(same=False, check=ok, spearman=rho)
        assert not adopted and "fidelity" in why


def test_too_short_a_history_keeps_what_is_in_force_and_says_so():
    out = choose(frame(steady(12, every_s=2 * H)), check_s=4 * DAY, min_choice=20)
    assert not out["adopted"] and "chosen" not in out
    assert out["reason"].startswith("history too short: ")


def test_history_as_seen_at_a_moment():
    tr = frame([{"submit": 0, "start": 10, "end": 100, "limit_s": 200}, {"submit": 50, "start": 300, "end": 400,
                                                                          "limit_s": 200},
                {"submit": 60, "start": 70, "end": 500, "limit_s": 600}, {"submit": 900, "start": 900, "end": 950,
                                                                          "limit_s": 60}])
    t0 = tr["submit"].min()
    seen = S.as_seen_at(tr, t0 + 200)
    assert len(seen) == 3  # the job submitted later is not there
    assert seen["start"].isna().tolist() == [False, True, False]  # pending then: its start is unknown
    assert seen["end"].isna().tolist() == [False, True, True]  # running then: its end is unknown


def test_the_partitions_sharing_the_nodes_are_replayed_together():
    tr = frame(steady(1, every_s=6 * H))
    tr["partition"] = ["gpu", "gpu,debug", "cpu", ""]
    assert S.partition_history(tr, {"gpu", "debug"})["partition"].tolist() == ["gpu", "gpu,debug", ""]


CONFIG = """PriorityDecayHalfLife   = 1-00:00:00
PriorityMaxAge          = 1-00:00:00
PriorityType            = priority/multifactor
PriorityWeightAge       = 1000
PriorityWeightFairShare = 1000
PriorityWeightJobSize   = 100
PriorityWeightPartition = 1000
"""


def test_priority_weights_from_scontrol_show_config():
    kind, cfg, size, notes = S.priority_from_config(CONFIG)
    assert kind == "fairshare" and cfg["PriorityMaxAge"] == 1.0 and cfg["PriorityWeightFairshare"] == 1000
    assert any("partition" in n for n in notes)
    kind, cfg, size, _ = S.priority_from_config(CONFIG.replace("FairShare = 1000", "FairShare = 0"))
    assert kind == "multifactor" and cfg is None and size == pytest.approx(100 / 1000 * 86400)
    kind, _, _, notes = S.priority_from_config("PriorityType = priority/basic\n")
    assert kind == "age" and "age-only" in notes[0]
    assert S.priority_from_config("")[0] == "age"


class Canned:
    """A runner answering the Slurm reads with canned text (the real-Slurm test runs the real ones)."""

    def __init__(self, config: str | None = CONFIG) -> None:
        self.config = config

    def run(self, argv, timeout=None, env=None, stdin=None):
        cmd = " ".join(argv[:3])
        if cmd == "scontrol show partition":
            out = ("PartitionName=gpu Default=YES MaxTime=2-00:00:00 State=UP TotalNodes=8 Nodes=g[1-8]\n"
                   "PartitionName=big MaxTime=1-00:00:00 State=UP TotalNodes=4 Nodes=g[5-8]\n"
                   "PartitionName=cpu MaxTime=1-00:00:00 State=UP TotalNodes=2 Nodes=c[1-2]\n")
            return SimpleNamespace(ok=True, returncode=0, stdout=out, stderr="", timed_out=False)
        if cmd == "scontrol show config" and self.config is not None:
            return SimpleNamespace(ok=True, returncode=0, stdout=self.config, stderr="", timed_out=False)
        return SimpleNamespace(ok=False, returncode=1, stdout="", stderr="no", timed_out=False,
                               first_error_line=lambda: "no")


def test_cluster_facts_and_the_age_only_fallback_that_says_so():
    f = S.read_facts(Canned(), "")
    assert (f.partition, f.nodes, f.max_time_s, f.sharing, f.priority) == ("gpu", 8, 172800.0, {"gpu", "big"},
                                                                           "fairshare")
    g = S.read_facts(Canned(config=None), "cpu")
    assert (g.nodes, g.sharing, g.priority) == (2, {"cpu"}, "age")
    assert any("age-only" in n for n in g.notes)


def test_hidden_users_or_short_history_keep_the_shipped_defaults_and_are_stored(chainrun_home):
    out = S.refresh_tuning(Canned(), cluster="c1", history=frame(steady(2)), all_users=False)
    assert out["gpu"]["summary"].startswith("kept shipped defaults: other users' jobs are hidden (PrivateData)")
    out = S.refresh_tuning(Canned(), cluster="c1", history=frame(steady(2)), all_users=True)
    assert out["gpu"]["summary"].startswith("kept shipped defaults: history too short")
    doc = json.loads(tuned.path("c1").read_text())  # JSON beside the model
    e = doc["partitions"]["gpu"]
    assert len(e["history"]) == 2 and e["in_force"]["source"] == "shipped"
    st = S.tuning_status("c1")["partitions"]["gpu"]
    assert st["last"]["summary"] == out["gpu"]["summary"] and st["in_force"]["rule"] == tuned.shipped()["rule"]


def test_a_replay_that_fails_unexpectedly_keeps_what_is_in_force_and_says_so(chainrun_home, monkeypatch, caplog):
    """A bug inside the replay (an IndexError once reached it) must not fail a cron refresh after the
    model is saved: the partition keeps its values, the outcome and the log say what failed."""
    def broken(*a, **k):
        raise IndexError("index 0 is out of bounds for axis 0 with size 0")

    monkeypatch.setattr(S, "choose", broken)
    with caplog.at_level("WARNING", logger="chainrun.sim.selftune"):
        out = S.refresh_tuning(Canned(), cluster="c1", history=frame(steady(2)), all_users=True)
    res = out["gpu"]
    assert not res["adopted"] and not res["put_in_force"] and res["in_force"] == tuned.shipped()
    assert "the replay failed (IndexError: index 0 is out of bounds" in res["summary"], res["summary"]
    assert any(r.exc_info and r.exc_info[0] is IndexError for r in caplog.records)


def chain(cluster="c1", partition="gpu"):
    return SimpleNamespace(cluster=cluster, partition=partition)


def test_the_values_in_force_are_what_predicted_runs_with_and_can_be_pinned_and_rolled_back(chainrun_home):
    new = {"rule": "quantile", "transition_cost_s": 5400.0, "lead_share": 0.4, "floor_s": 10800.0}
    adopted = {"adopted": True, "chosen": new, "previous": tuned.shipped(), "reason": "test", "window": {"w": 1}}
    tuned.record("c1", "gpu", adopted)
    assert tuned.in_force("c1", "gpu") == new and tuned.in_force("c1", "cpu") == tuned.shipped()
    p = get_policy("predicted").for_chain(chain())
    assert (p.rule, p.transition_cost_s, p.max_lead_share) == ("quantile", 5400.0, 0.4)
    q = get_policy("predicted").for_chain(chain(partition="cpu"))
    assert (q.rule, q.max_lead_share) == (tuned.shipped()["rule"], tuned.shipped()["lead_share"])
    assert Predicted(max_lead_share=0.75).for_chain(chain()).max_lead_share == 0.75  # explicit values stand
    assert default_lead_s("predicted", "c1", "gpu") == 10800 and default_lead_s("predicted") == 3600
    assert default_lead_s("lead", "c1", "gpu") == 3600

    tuned.pin("c1", "gpu")
    other = {**adopted, "chosen": {**new, "lead_share": 0.25}, "previous": new}
    tuned.record("c1", "gpu", other)  # recorded, not put in force: pinned
    assert tuned.in_force("c1", "gpu") == new
    tuned.pin("c1", "gpu", on=False)
    tuned.record("c1", "gpu", other)
    assert tuned.in_force("c1", "gpu")["lead_share"] == 0.25
    e = tuned.rollback("c1", "gpu")  # back to what was in force before, pinned
    assert tuned.in_force("c1", "gpu") == new and e["pinned"] and e["in_force"]["source"] == "rollback"
    e = tuned.rollback("c1", "gpu")
    assert tuned.in_force("c1", "gpu") == tuned.shipped()


def test_an_unreadable_store_is_named_and_the_watcher_keeps_the_shipped_values(chainrun_home):
    from chainrun.errors import ModelError

    tuned.path("c2").parent.mkdir(parents=True, exist_ok=True)
    tuned.path("c2").write_text("{not json")
    with pytest.raises(ModelError, match="tuning.json"):
        tuned.load("c2")
    assert tuned.in_force("c2", "gpu") == tuned.shipped()


def test_the_quantile_rule_in_force_acts_on_its_own_costs_target(chainrun_home):
    from chainrun.chain.policies import PolicyView, WaitEstimate, predict_quantile
    from chainrun.state.records import RUNNING

    tuned.record("c3", "gpu", {"adopted": True, "reason": "test", "previous": tuned.shipped(),
                               "chosen": {"rule": "quantile", "transition_cost_s": 21600.0, "lead_share": 1.0,
                                          "floor_s": 3600.0}})
    ch = SimpleNamespace(cluster="c3", partition="gpu", segment_s=48 * 3600, signal_lead_s=300, lead_s=3600)
    cur = SimpleNamespace(phase=RUNNING, start=0.0)
    shipped_q, tuned_q = predict_quantile(ch.segment_s), predict_quantile(ch.segment_s, 21600.0)
    p_in_time = (shipped_q + tuned_q) / 2  # between the two targets: the shipped cost's submits, the tuned waits
    est = WaitEstimate(seconds=1.0, model="m", target=shipped_q, prob_within=lambda h: p_in_time)
    view = PolicyView(now=10 * 3600.0, chain=ch, current=cur, handover_at=40 * 3600.0, predict_wait=lambda: est)
    assert tuned_q < p_in_time < shipped_q
    assert Predicted(rule="quantile", max_lead_share=1.0).decide(view).submit  # P <= the shipped cost's target
    assert not get_policy("predicted").decide(view).submit  # P above the tuned cost's target: not yet
    late = PolicyView(now=10 * 3600.0, chain=ch, current=cur, handover_at=40 * 3600.0,
                      predict_wait=lambda: WaitEstimate(seconds=1.0, model="m", target=shipped_q,
                                                        prob_within=lambda h: tuned_q - 0.01))
    d = get_policy("predicted").decide(late)
    assert d.submit and f"target {tuned_q:.2f}" in d.reason


def test_the_watcher_runs_predicted_with_the_values_in_force(tmp_path, chainrun_home):
    """Engine -> get_policy("predicted") -> the values in force for the chain's cluster and partition:
    with the quantile rule and no guard in force on `short`, the first tick submits (P 0.5 <= the
    target); the same chain on `long` (shipped: the guard, 0.6 of a segment) does not yet."""
    import time

    from chainrun.chain.engine import Engine
    from chainrun.chain.policies import WaitEstimate
    from chainrun.slurm.client import SlurmClient
    from chainrun.state.records import Segment
    from chainrun.state.store import Store
    from tests.reliability.fakeslurm import FakeSlurm
    from tests.reliability.test_engine_faults import make_chain, submit_segment

    tuned.record("local", "short", {"adopted": True, "reason": "test", "previous": tuned.shipped(),
                                    "chosen": {"rule": "quantile", "transition_cost_s": 3600.0, "lead_share": 1.0,
                                               "floor_s": 3600.0}})
    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    est = WaitEstimate(seconds=60.0, model="m", target=0.9, prob_within=lambda h: 0.5)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root", predictor=lambda c, cur, q: est)
    chains = []
    for cid, part in (("t-0001", "short"), ("t-0002", "long")):
        c = make_chain(store, cid, policy="predicted")
        c.partition = part
        store.save(c, [])
        submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
        chains.append(c)
    for job in list(fake.jobs.values()):
        fake.start(job.id)
    eng.tick()
    short, long_ = (store.segments(c.id) for c in chains)
    said = [e.message for _, e in store.events(chains[0].id) if "segment 1 submitted" in e.message]
    assert len(short) == 2 and len(said) == 1 and "(P(start within" in said[0], said  # the quantile rule's words
    assert len(long_) == 1  # the shipped guard: not before 0.4 of the segment has trained
    store.close()
