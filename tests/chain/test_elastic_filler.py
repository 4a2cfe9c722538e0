"""The filler (docs/elastic.md, "Filler") through the real engine on the in-memory Slurm (fast).

While nothing of the chain is live and the reference shape would only queue, the segment runs on
fewer nodes; the moment it runs, the watcher asks for the reference shape (whatever the policy's
timing), sized as an early successor, and writes no adaptive wait rule for it (it always cuts).
"""

from __future__ import annotations

import pytest

from chainrun.chain.shape_plan import plan_first_shape
from chainrun.chain.summary import view_chain
from chainrun.state.records import RUNNING, Segment
from tests.chain.test_elastic_engine import run_segment, world

H = 3600


def shape_events(store, c):
    return [e.message for _, e in store.events(c.id) if e.kind == "shape"]


def test_no_filler_unless_the_chain_asks_for_one(tmp_path):
    """The shipped default is no filler (the replay's pick, docs/elastic.md): the same queue as below
    gives the reference shape; `submit --filler 6` (extra["filler_margin"]) gives the filler."""
    fake, store, eng, c = world(tmp_path, total_s=20000, delay={4: H, 2: 0})
    seg = Segment(chain_id=c.id, idx=0, time_limit_s=1200)
    fake.test_only_nodes.clear()
    plan_first_shape(eng, c, seg)
    assert seg.extra["nodes"] == 4 and "filler" not in seg.extra


def test_submit_plans_segment_0_as_a_filler_while_the_reference_queues(tmp_path):
    # what `chainrun submit` asks (create_chain -> shape_plan.plan_first_shape): 4 nodes in 1 h, 2 nodes now
    fake, store, eng, c = world(tmp_path, filler_margin=6.0, total_s=20000, delay={4: H, 2: 0})
    seg = Segment(chain_id=c.id, idx=0, time_limit_s=1200)
    fake.test_only_nodes.clear()
    event = plan_first_shape(eng, c, seg)
    assert seg.extra["nodes"] == 2 and seg.extra["filler"] is True
    assert seg.extra["shape"]["filler"] is True
    assert seg.extra["shape"]["reason"].startswith("filler on 2 nodes while 4 nodes queue (~60 min)")
    # 0.5 x (3600 - 0 - 30 s signal lead) of 4-node work before 4 nodes start
    assert {o["nodes"]: o.get("gain_s") for o in seg.extra["shape"]["options"]} == {4: 0.0, 2: pytest.approx(1785, abs=2)}
    assert event.startswith("segment 0 asks for 2 nodes instead of 4: filler on 2 nodes")
    assert sorted(fake.test_only_nodes) == [2, 4]


@pytest.mark.parametrize("delay, no_adapt", [({4: 140, 2: 0}, False), ({4: H, 2: 0}, True)])
def test_no_filler_for_a_short_reference_wait_or_with_no_adapt(tmp_path, delay, no_adapt):
    # 0.5 x (140 - 30) = 55 s < 6 boundaries of 30 s; --no-adapt: never another shape
    fake, store, eng, c = world(tmp_path, filler_margin=6.0, total_s=20000, delay=delay, no_adapt=no_adapt)
    seg = Segment(chain_id=c.id, idx=0, time_limit_s=1200)
    assert plan_first_shape(eng, c, seg) == ""
    assert seg.extra["nodes"] == 4 and "filler" not in seg.extra


def test_a_running_filler_gets_its_reference_successor_at_once_and_is_handed_off(tmp_path):
    # the reference segment 0 ended; nothing is live: segment 1 is planned as a filler (a gap); its
    # boundary is now measured (600 s limit, 300 s trained: 300 s), so 4 nodes wait 2 h: 0.5 x 6900 >= 6 x 300
    fake, store, eng, c = world(tmp_path, filler_margin=6.0, total_s=20000, delay={4: 2 * H, 2: 0}, policy="reactive")
    (s0,) = store.segments(c.id)
    run_segment(fake, s0, 300)
    eng.tick()
    segs = store.segments(c.id)
    assert len(segs) == 2
    f = segs[1]
    assert f.extra["nodes"] == 2 and f.extra.get("filler") is True
    assert f.time_limit_s == 1200  # a full segment: it is cut when the reference starts
    # while it is queued: no successor (no policy may pre-queue behind it), no more test-only
    asked = len(fake.test_only_nodes)
    fake.now += 30
    eng.tick()
    assert len(store.segments(c.id)) == 2
    # it runs: the reference is asked for now, although `reactive` would wait for the filler's end
    fake.start(f.job_id)
    fake.files[f"/r/control/seg-{f.idx}.state"] = f"phase=training\njob={f.job_id}\npayload_start={fake.now + 5}\n"
    fake.now += 20
    eng.tick()
    segs = store.segments(c.id)
    assert len(segs) == 3
    r = segs[2]
    assert r.extra["nodes"] == 4 and "filler" not in r.extra and r.dependency == ""
    assert "asked as soon as the filler (segment 1, 2 nodes) runs" in r.extra["shape"]["reason"]
    assert len(fake.test_only_nodes) == asked  # no shape question for it: the reference, by rule
    # sized as an early successor: the work left as if the filler stopped now (15 s at rate 0.5 trained)
    left = 20000 - 300 - 15 * 0.5
    assert r.time_limit_s == min(1200, (int(left + 30) + 59) // 60 * 60)
    # no adaptive wait rule for a filler's successor: it cuts the filler when it starts
    assert "handoff_rule" not in r.extra
    assert not [a for a in fake.calls if "handoff-rule" in " ".join(a)]
    assert any("asks for 4 nodes instead of 2" in m for m in shape_events(store, c))
    assert any("filler on 2 nodes while 4 nodes queue" in m for m in shape_events(store, c))
    # status shows the filler's reason where the shape reason is shown
    v = view_chain(store.chain(c.id), segs, now=fake.now)
    assert "shape filler on 2 nodes while 4 nodes queue" in v.segment_views[1].note
    assert [sv.shape_nodes for sv in v.segment_views] == [4, 2, 4]
    # quiet ticks while both live: nothing more
    fake.now += 30
    eng.tick()
    assert len(store.segments(c.id)) == 3


def test_no_filler_while_a_segment_is_live(tmp_path):
    # segment 0 (reference) runs; the successor the policy asks for is chosen by choose_shape only
    fake, store, eng, c = world(tmp_path, filler_margin=6.0, total_s=20000, delay={4: H, 2: 0}, policy="lead")
    (s0,) = store.segments(c.id)
    fake.start(s0.job_id)
    fake.now += 560  # the lead policy (1 min) asks near the hand-over point
    eng.tick()
    segs = store.segments(c.id)
    assert len(segs) == 2 and segs[0].phase == RUNNING
    assert segs[1].extra["nodes"] == 4 and "filler" not in segs[1].extra


def test_no_start_estimate_for_the_reference_keeps_it(tmp_path):
    # test-only refused the 4-node request (a future reservation cuts into it): neither a filler nor a switch
    fake, store, eng, c = world(tmp_path, filler_margin=6.0, total_s=20000, delay={2: 0})
    real = fake.run

    def refuse_four(argv, timeout=60.0, **kw):
        argv = tuple(str(a) for a in argv)
        if argv[:2] == ("sbatch", "--test-only") and "--nodes=4" in argv:
            from chainrun.runner.base import RunResult

            return RunResult(argv, 1, "", "allocation failure: Requested node configuration is not available\n", 0.0)
        return real(argv, timeout, **kw)

    fake.run = refuse_four
    seg = Segment(chain_id=c.id, idx=0, time_limit_s=1200)
    assert plan_first_shape(eng, c, seg) == ""
    assert seg.extra["nodes"] == 4 and "no start estimate" in seg.extra["shape"]["reason"]
