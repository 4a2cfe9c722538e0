"""Pending reasons and maintenance planning through the real engine, on the in-memory Slurm (fast)."""

from __future__ import annotations

import time

from chainrun.chain.engine import Engine
from chainrun.chain.segments import submit_segment
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import FAILED, PENDING, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import SQ_HEAD, FakeSlurm
from tests.reliability.test_engine_faults import make_chain


def _world(tmp_path):
    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = make_chain(store)
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
    return fake, store, eng, c


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
    from chainrun.chain.engine import cancel_chain
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
