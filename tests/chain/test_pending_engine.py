"""Pending reasons and maintenance planning through the real engine, on the in-memory Slurm (fast)."""

from __future__ import annotations

import time

from chainrun.chain.engine import Engine
from chainrun.chain.segments import submit_segment
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import FAILED, PENDING, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import SQ_HEAD, FakeSlurm
from tests.reliability.test_engine_faults import make_world


_world = make_world


def _pending_as(fake: FakeSlurm, reason: str, start: str = "N/A") -> None:
    (job,) = fake.jobs.values()
    fake.squeue_text = (f"{SQ_HEAD}\n{job.id}|root|PENDING|{reason}|{int(job.submit)}|{start}|N/A|2:00|0:00|short|"
                        f"normal|1|1|N/A|(null)|(null)|{job.name}\n")


def test_a_reason_that_never_clears_fails_the_chain_with_a_hint(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    _pending_as(fake, "PartitionTimeLimit")
    eng.tick()
    chain = store.chain(c.id)
    assert chain.status == FAILED
    assert "can never start: its time limit is longer than the partition allows" in chain.reason
    assert "--segment" in chain.reason  # the hint says what to do
    assert not [j for j in fake.jobs.values() if j.state == "PENDING"]  # and it was cancelled


def test_a_waiting_segment_keeps_its_reason_and_slurms_estimate(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    start = int(fake.now + 5400)
    _pending_as(fake, "ReqNodeNotAvail, UnavailableNodes:n3", str(start))
    eng.tick()
    eng.tick()
    (seg,) = store.segments(c.id)
    assert seg.phase == PENDING and seg.extra["expected_start"] == start
    warnings = [e.message for _, e in store.events(c.id) if e.kind == "warning"]
    assert len(warnings) == 1 and "UnavailableNodes:n3" in warnings[0]  # said once, not every tick
    from chainrun.chain.summary import view_chain

    note = view_chain(store.chain(c.id), store.segments(c.id), now=fake.now).segment_views[0].note
    assert note.startswith("pending: a node it needs is unavailable") and "Slurm expects it to start" in note


def test_cancel_leaves_no_segment_shown_running(tmp_path):
    from chainrun.chain.cancel import cancel_chain
    from chainrun.chain.summary import view_chain

    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.start(job.id)
    eng.tick()
    assert store.segments(c.id)[0].slurm_state == "RUNNING"
    cancel_chain(store, SlurmClient(fake), store.chain(c.id))
    v = view_chain(store.chain(c.id), store.segments(c.id))
    assert v.status == "CANCELLED" and v.current_state == "CANCELLED"
    assert [s.slurm_state for s in v.segment_views] == ["CANCELLED"]


def test_an_early_successor_is_sized_to_take_over(tmp_path):
    """Submitted early, the next segment may start at once and cut the live one: it must carry the work
    left as if the live one stopped now, not only what is left after the live one's hand-over point
    (sized that way, early successors cut each other in a spiral: the whole-chain replay found it)."""
    from chainrun.state.records import Chain

    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = Chain(id="big-0001", name="big", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=4000, segment_s=3600, policy="lead", lead_s=3600, signal="USR2", signal_lead_s=30, retries=1,
              sbatch_args=[], partition="short", created=time.time())
    store.add_chain(c)
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=3600))
    (job,) = fake.jobs.values()
    fake.start(job.id)
    fake.now += 100
    eng.tick()
    segs = store.segments(c.id)
    assert len(segs) == 2, [s.phase for s in segs]  # --lead 1h: due at once
    assert segs[1].time_limit_s == 3600  # 4000 s of work, 100 s trained: a full segment, not 480 s


def test_segment_overhead_is_learnt_from_segments_that_ran_to_their_signal():
    from chainrun.chain.pace import expected_training, segment_overhead
    from chainrun.state.records import ENDED, Chain

    c = Chain(id="o", name="o", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=600, segment_s=120, policy="lead", lead_s=40, signal="USR2", signal_lead_s=50, retries=1,
              sbatch_args=[], partition="short")
    assert segment_overhead(c, []) == 50  # nothing seen yet: the signal lead

    def ended(i, credit, outcome="continue", signaled="1"):
        return Segment(chain_id="o", idx=i, phase=ENDED, outcome=outcome, time_limit_s=120, credit_s=credit,
                       extra={"signaled": signaled})

    segs = [ended(0, 50), ended(1, 58), ended(2, 55), ended(3, 10, outcome="handoff"), ended(4, 119, signaled="0")]
    assert segment_overhead(c, segs) == 70  # the worst seen: the signal came 20 s early; cut/unsignaled ones do not count
    live = Segment(chain_id="o", idx=5, phase="RUNNING", time_limit_s=120)
    assert expected_training(c, live, segment_overhead(c, segs)) == 50
    assert segment_overhead(c, [ended(0, 100)]) == 50  # never below the signal lead


SLURM_SENTENCE = "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"


def _pending_words(store, c, fake) -> tuple[list[str], str]:
    from chainrun.chain.summary import view_chain

    warnings = [e.message for _, e in store.events(c.id) if e.kind == "warning"]
    return warnings, view_chain(store.chain(c.id), store.segments(c.id), now=fake.now).segment_views[0].note


def test_slurms_catch_all_sentence_is_explained_when_every_node_is_up(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    fake.nodes = {f"n{i}": "IDLE" for i in range(1, 5)}
    _pending_as(fake, SLURM_SENTENCE)
    eng.tick()
    eng.tick()
    warnings, note = _pending_words(store, c, fake)
    assert len(warnings) == 1 and "DOWN, DRAINED" not in warnings[0] + note  # not Slurm's raw sentence
    assert "every node it may use is up and none is reserved" in warnings[0] and "--exclude" not in warnings[0]
    assert note.startswith("pending: every node it may use is up")


def test_down_nodes_are_named_and_exclude_is_suggested_only_while_others_are_left(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    fake.nodes = {"n1": "DOWN*", "n2": "IDLE+DRAIN", "n3": "IDLE", "n4": "MIXED"}
    _pending_as(fake, SLURM_SENTENCE)
    eng.tick()
    warnings, _ = _pending_words(store, c, fake)
    assert "n1 (DOWN), n2 (DRAIN)" in warnings[0] and "--exclude" in warnings[0]


def test_a_maintenance_window_on_every_node_suggests_no_exclude(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    fake.nodes = {f"n{i}": "IDLE+MAINT+RESERVED" for i in range(1, 5)}
    fake.reservations = (f"ReservationName=m1 StartTime={int(fake.now - 60)} EndTime={int(fake.now + 3600)} "
                         "Duration=01:00:00 Nodes=n[1-4] NodeCnt=4 PartitionName=(null) Flags=MAINT,SPEC_NODES "
                         "State=ACTIVE\n")
    _pending_as(fake, "ReqNodeNotAvail, Reserved for maintenance")
    eng.tick()
    warnings, note = _pending_words(store, c, fake)
    assert "maintenance m1 holds every node it may use until" in warnings[0]
    assert "--exclude" not in warnings[0] and "nothing to change" in warnings[0]
    assert note.startswith("pending: maintenance m1 holds every node")
