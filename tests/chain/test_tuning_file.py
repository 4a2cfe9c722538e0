"""The tuning file (chainrun/chain/tuned.py) when it is unreadable or asked about a partition it does
not know: the watcher keeps ticking on the shipped values and logs it once; it is set aside, never
edited or lost; pin and roll back refuse what this cluster does not know and write nothing; `model
status`'s data holds the latest check's scores and the last choices whether or not adopted."""

from __future__ import annotations

import json
import logging
import time

import pytest

from chainrun.chain import tuned
from chainrun.errors import ModelError, NotFoundError

NEW = {"rule": "quantile", "transition_cost_s": 5400.0, "lead_share": 0.4, "floor_s": 10800.0}
WINDOW = {"choice_from": "2026-09-01T00:00:00", "choice_until": "2026-10-01T00:00:00",
          "check_from": "2026-10-01T00:00:00", "check_until": "2026-10-15T00:00:00", "choice_chains": 40,
          "check_chains": 20}
SCORES = {"chosen": 1.1, "in_force": 1.3, "reactive": 2.5, "oracle": 0.4, "best_fixed": 1.6}

BROKEN = {
    "not json": "{not json",
    "not a document": "[1, 2]",
    "an entry not an object": json.dumps({"partitions": {"gpu": "x"}}),
    "a rule predicted does not know": json.dumps({"partitions": {"gpu": {"in_force": {**NEW, "rule": "bogus"}}}}),
    "a cost that is no number": json.dumps({"partitions": {"gpu": {"in_force": {**NEW, "transition_cost_s": "1h"}}}}),
    "a choice put in force without values": json.dumps(
        {"partitions": {"gpu": {"in_force": NEW, "history": [{"put_in_force": True, "chosen": None}]}}}),
}


def write(cluster: str, text: str):
    p = tuned.path(cluster)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def save_model(cluster: str, partitions=("gpu", "small")):
    """The saved model's meta.json as far as the tuning file reads it: the partitions its history names."""
    d = tuned.path(cluster).parent
    d.mkdir(parents=True, exist_ok=True)
    (d / "meta.json").write_text(json.dumps({"categories": {"partition": {p: i for i, p in enumerate(partitions)},
                                                            "qos": {}}}))


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_an_unusable_file_is_named_with_the_way_past_it_and_predicted_runs_on_the_shipped_values(what, chainrun_home):
    p = write("c1", BROKEN[what])
    with pytest.raises(ModelError, match="tuning.json") as e:
        tuned.load("c1")
    assert "--rollback" in str(e.value) and "model refresh" in str(e.value)
    assert tuned.in_force("c1", "gpu") == tuned.shipped()
    st = tuned.status("c1")  # data, not an error: `model status` shows the rest
    assert st["partitions"] == {} and st["unreadable"]["why"] and st["file"] == str(p)
    assert p.read_text() == BROKEN[what]  # reading never touches it


def test_the_watcher_logs_an_unreadable_file_once_per_state_of_the_file(chainrun_home, caplog):
    caplog.set_level(logging.WARNING, logger="chainrun.chain.tuned")
    p = write("c1", "{not json")
    for _ in range(5):
        assert tuned.in_force("c1", "gpu") == tuned.shipped()
    said = [r.getMessage() for r in caplog.records if "unreadable tuning file" in r.getMessage()]
    assert len(said) == 1 and str(p) in said[0] and "shipped values" in said[0]
    time.sleep(0.01)
    p.write_text("[]")  # another broken state: said again, once
    tuned.in_force("c1", "gpu")
    tuned.in_force("c1", "gpu")
    assert len([r for r in caplog.records if "unreadable tuning file" in r.getMessage()]) == 2


def test_set_aside_renames_and_keeps_the_file_and_never_overwrites_an_earlier_one(chainrun_home):
    assert tuned.set_aside("c1") is None  # no file: nothing to do
    tuned.record("c1", "gpu", {"adopted": False, "reason": "test", "previous": tuned.shipped()})
    good = tuned.path("c1").read_text()
    assert tuned.set_aside("c1") is None and tuned.path("c1").read_text() == good  # a readable file stays
    write("c1", "{first")
    a = tuned.set_aside("c1")
    write("c1", "{second")
    b = tuned.set_aside("c1")  # within the same second: a name of its own
    assert a["moved_to"] != b["moved_to"] and not tuned.path("c1").exists()
    kept = sorted(tuned.path("c1").parent.glob("tuning.json.corrupt-*"))
    assert [k.read_text() for k in kept] == ["{first", "{second"] and a["why"]
    assert "tuning.json.corrupt-" in tuned.set_aside_text(a) and "shipped values" in tuned.set_aside_text(a)
    # the next write starts afresh
    tuned.record("c1", "gpu", {"adopted": True, "reason": "test", "previous": tuned.shipped(), "chosen": NEW})
    assert tuned.in_force("c1", "gpu") == NEW


def test_a_refresh_after_set_aside_records_again(chainrun_home):
    """What `model refresh` and `model tune` do before their tuning step (the step itself,
    chainrun/sim/selftune.py, reads the file strictly: it must find it readable or absent)."""
    from tests.sim.test_selftune import Canned
    from tests.sim.tracegen import frame, steady

    from chainrun.sim import selftune as S

    write("c1", "{not json")
    with pytest.raises(ModelError):
        S.refresh_tuning(Canned(), cluster="c1", history=frame(steady(2)), all_users=True)
    assert tuned.set_aside("c1")["moved_to"]
    out = S.refresh_tuning(Canned(), cluster="c1", history=frame(steady(2)), all_users=True)
    assert out["gpu"]["summary"].startswith("kept shipped defaults: history too short")
    assert len(tuned.status("c1")["partitions"]["gpu"]["history"]) == 1


def test_pin_and_rollback_refuse_a_partition_the_cluster_does_not_know_and_write_nothing(chainrun_home):
    with pytest.raises(ModelError, match="no queue-delay model for cluster c1"):  # no model, no record
        tuned.pin("c1", "gpu")
    with pytest.raises(ModelError, match="no queue-delay model for cluster c1"):
        tuned.rollback("c1", "gpu")
    assert not tuned.path("c1").exists()
    save_model("c1")
    for act in (lambda: tuned.pin("c1", "gpuu"), lambda: tuned.pin("c1", "gpuu", on=False),
                lambda: tuned.rollback("c1", "gpuu")):
        with pytest.raises(NotFoundError, match="no partition 'gpuu' on cluster c1: known gpu, small"):
            act()
    assert not tuned.path("c1").exists()
    assert tuned.pin("c1", "small")["pinned"]  # one the model's history names
    tuned.record("c1", "tuned-only", {"adopted": False, "reason": "test", "previous": tuned.shipped()})
    assert tuned.rollback("c1", "tuned-only")["pinned"]  # one the tuning record names
    before = tuned.path("c1").read_text()
    with pytest.raises(NotFoundError, match="known gpu, small, tuned-only"):
        tuned.rollback("c1", "nope")
    assert tuned.path("c1").read_text() == before


def test_pin_refuses_an_unreadable_file_and_rollback_sets_it_aside_for_the_shipped_values_pinned(chainrun_home):
    save_model("c1")
    p = write("c1", "{not json")
    with pytest.raises(ModelError, match="unreadable"):
        tuned.pin("c1", "gpu")
    with pytest.raises(NotFoundError):  # a partition it does not know: not even set aside
        tuned.rollback("c1", "gpuu")
    assert p.read_text() == "{not json" and not list(p.parent.glob("tuning.json.corrupt-*"))
    e = tuned.rollback("c1", "gpu")
    kept = list(p.parent.glob("tuning.json.corrupt-*"))
    assert e["set_aside"]["moved_to"] == str(kept[0]) and kept[0].read_text() == "{not json"
    assert e["pinned"] and e["in_force"]["source"] == "rollback"
    assert tuned.in_force("c1", "gpu") == tuned.shipped() and "set_aside" not in json.loads(p.read_text())[
        "partitions"]["gpu"]


def test_status_holds_the_latest_check_and_the_last_choices_whether_or_not_adopted(chainrun_home):
    tuned.record("c1", "gpu", {"adopted": False, "reason": "history too short: 3.0 days", "previous": tuned.shipped(),
                               "summary": "kept shipped defaults: history too short: 3.0 days"})
    kept = {"adopted": False, "chosen": NEW, "previous": tuned.shipped(), "window": WINDOW,
            "reason": "the choice does not beat the values in force on the check by more than its noise",
            "check": {"scores_h": SCORES, "mean_gain_h": 0.2}, "thinned": {"k": 2, "of_jobs": 9000, "nodes": 4}}
    tuned.record("c1", "gpu", kept)
    e = tuned.status("c1")["partitions"]["gpu"]
    assert e["in_force"]["source"] == "shipped"  # not adopted, yet its scores are there
    assert e["last_check"]["scores_h"] == SCORES and e["last_check"]["of_latest_refresh"]
    assert e["last_check"]["chosen"] == NEW and not e["last_check"]["put_in_force"]
    assert [c["chosen"] for c in e["recent"]] == [NEW, None]  # newest first
    assert e["recent"][0]["window"]["check_until"] == WINDOW["check_until"] and e["recent"][0]["thinned"]["k"] == 2
    assert e["history"][-1]["check"]["mean_gain_h"] == 0.2  # --json: the complete record
    tuned.record("c1", "gpu", {"adopted": False, "reason": "history too short", "previous": tuned.shipped()})
    e = tuned.status("c1")["partitions"]["gpu"]
    assert e["last_check"]["scores_h"] == SCORES and not e["last_check"]["of_latest_refresh"]
    for i in range(tuned.RECENT + 2):
        tuned.record("c1", "gpu", {"adopted": False, "reason": f"r{i}", "previous": tuned.shipped()})
    e = tuned.status("c1")["partitions"]["gpu"]
    assert [c["reason"] for c in e["recent"]] == [f"r{i}" for i in range(tuned.RECENT + 1, 1, -1)]
    assert len(e["history"]) == tuned.RECENT + 5


def test_a_watcher_tick_on_an_unreadable_file_runs_predicted_on_the_shipped_values(tmp_path, chainrun_home, caplog):
    """Engine -> get_policy("predicted") -> the values in force: with the file broken the tick goes on
    with the shipped guard (no successor before 0.4 of the segment has trained), and says so once."""
    from chainrun.chain.engine import Engine
    from chainrun.chain.policies import WaitEstimate
    from chainrun.slurm.client import SlurmClient
    from chainrun.state.records import Segment
    from chainrun.state.store import Store
    from tests.reliability.fakeslurm import FakeSlurm
    from tests.reliability.test_engine_faults import make_chain, submit_segment

    caplog.set_level(logging.WARNING, logger="chainrun.chain.tuned")
    # what was in force before the file broke: the quantile rule without a guard (submits at once)
    tuned.record("local", "short", {"adopted": True, "reason": "test", "previous": tuned.shipped(),
                                    "chosen": {"rule": "quantile", "transition_cost_s": 3600.0, "lead_share": 1.0,
                                               "floor_s": 3600.0}})
    tuned.path("local").write_text(tuned.path("local").read_text()[:-40])  # cut short: not JSON
    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    est = WaitEstimate(seconds=60.0, model="m", target=0.9, prob_within=lambda h: 0.5)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root", predictor=lambda c, cur, q: est)
    c = make_chain(store, "t-0001", policy="predicted")
    c.partition = "short"
    store.save(c, [])
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
    for job in list(fake.jobs.values()):
        fake.start(job.id)
    eng.tick()
    eng.tick()
    assert len(store.segments(c.id)) == 1  # the shipped guard, not the broken file's values
    said = [r.getMessage() for r in caplog.records if "unreadable tuning file" in r.getMessage()]
    assert len(said) == 1 and "shipped values" in said[0]
    store.close()
