"""--total reached while a segment trains: the engine signals it to stop (fast, on the in-memory Slurm).

A successor is sized for the work left when it was asked for; when its predecessor trains on, the last
segment's limit is longer than the work left. The real-Slurm check is in test_chain_slurm.py."""

from __future__ import annotations

import time

from chainrun.chain.contract import control_path
from chainrun.chain.engine import Engine
from chainrun.chain.segments import submit_segment
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import COMPLETED, Chain, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm


def _world(tmp_path, total_s=600):
    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = Chain(id="tot-0001", name="tot", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=total_s, segment_s=3600, policy="lead", lead_s=60, signal="USR2", signal_lead_s=30, retries=1,
              sbatch_args=[], partition="short", created=time.time())
    store.add_chain(c)
    return fake, store, eng, c, slurm


def _submit(fake, store, slurm, c, idx):
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=idx, time_limit_s=3600))
    job = fake.jobs[str(fake.next_id - 1)]
    job.limit_s = 3600  # what squeue shows as its end: the fake grants 2 minutes unless told
    return job


def _ends_checkpointed(fake, eng, c, job) -> None:
    """Segment 0 checkpointed on the signal and exited (what the wrapper writes then); the next tick reads it."""
    fake.files[control_path(c.run_dir, 0, "outcome")] = (
        f"outcome=continue\njob={job.id}\nexit=0\nsignaled=1\npayload_start={job.start:.0f}\n"
        f"payload_end={fake.now:.0f}\n")
    fake.finish(job.id, "COMPLETED")
    fake.now += 5
    eng.tick()


def test_the_segment_that_reaches_total_is_signalled_once_then_the_chain_completes(tmp_path):
    fake, store, eng, c, slurm = _world(tmp_path)
    # a segment longer than the work left (as an early successor is): 1 h limit for 10 min of work
    job = _submit(fake, store, slurm, c, 0)
    fake.start(job.id)
    fake.now += 300
    eng.tick()
    assert fake.signals == [] and len(fake.jobs) == 1  # 5 of 10 minutes: nothing to do, no successor needed
    fake.now += 310
    eng.tick()
    assert fake.signals == [(job.id, "USR2")]  # the chain's own signal, to the batch shell
    assert ("scancel", "--batch", "--signal=USR2", job.id) in fake.calls
    said = [e.message for _, e in store.events(c.id) if e.kind == "total"]
    assert len(said) == 1 and "--total 10m reached" in said[0] and f"job {job.id}" in said[0]
    fake.now += 20
    eng.tick()
    assert len(fake.signals) == 1 and store.chain(c.id).status != COMPLETED  # once; it is still saving
    _ends_checkpointed(fake, eng, c, job)
    chain = store.chain(c.id)
    assert chain.status == COMPLETED and chain.reason == "total time reached"
    assert len(fake.jobs) == 1  # no segment after it
    ended = [e.message for _, e in store.events(c.id) if e.kind == "continue"]
    assert len(ended) == 1 and ended[0].endswith("of training; --total reached")  # not "next segment continues"


def test_a_queued_segment_is_cancelled_when_total_is_reached(tmp_path):
    fake, store, eng, c, slurm = _world(tmp_path)
    first, second = _submit(fake, store, slurm, c, 0), _submit(fake, store, slurm, c, 1)
    fake.start(first.id)
    fake.now += 620
    eng.tick()
    assert fake.signals == [(first.id, "USR2")]
    assert fake.jobs[second.id].state == "CANCELLED"
    seg1 = store.segments(c.id)[1]
    assert seg1.outcome == "cancelled" and "--total reached" in seg1.reason


def test_no_signal_before_total_or_while_the_payload_waits_for_the_hand_off(tmp_path):
    fake, store, eng, c, slurm = _world(tmp_path, total_s=7200)
    job = _submit(fake, store, slurm, c, 0)
    fake.start(job.id)
    fake.now += 3000
    eng.tick()
    assert fake.signals == []  # 50 of 120 minutes
    fake2, store2, eng2, c2, slurm2 = _world(tmp_path / "waiting")
    job2 = _submit(fake2, store2, slurm2, c2, 0)
    fake2.start(job2.id)
    # its job runs, but the wrapper still waits for the chain's last owner: that is not training
    fake2.files[control_path(c2.run_dir, 0, "state")] = f"phase=waiting\njob={job2.id}\n"
    fake2.now += 700
    eng2.tick()
    assert fake2.signals == []


def test_a_trainer_that_ignores_the_stop_gets_no_successor_and_a_waiting_one_is_cancelled(tmp_path):
    # what CI caught: the waiting successor was signalled too, ended unstarted, and the planner asked for
    # another one each tick until "6 segments in a row could not take the chain over"
    fake, store, eng, c, slurm = _world(tmp_path)
    trainer, waiting = _submit(fake, store, slurm, c, 0), _submit(fake, store, slurm, c, 1)
    fake.start(trainer.id)
    fake.start(waiting.id)
    fake.files[control_path(c.run_dir, 0, "state")] = f"phase=training\njob={trainer.id}\npayload_start={fake.now:.0f}\n"
    fake.files[control_path(c.run_dir, 1, "state")] = f"phase=waiting\njob={waiting.id}\n"
    fake.now += 620
    eng.tick()
    assert fake.signals == [(trainer.id, "USR2")]  # only the one that trains
    assert fake.jobs[waiting.id].state == "CANCELLED"
    assert "--total reached" in store.segments(c.id)[1].reason
    for _ in range(10):  # it ignores the signal and trains on to its limit: nothing more is asked for
        fake.now += 30
        eng.tick()
    assert len(fake.jobs) == 2 and len(fake.signals) == 1
    _ends_checkpointed(fake, eng, c, trainer)
    assert store.chain(c.id).status == COMPLETED and len(fake.jobs) == 2


def test_no_successor_is_asked_for_once_the_trainer_was_told_to_stop(tmp_path):
    # the planner counts a live segment as training its limit less the signal lead; one that ignores
    # the signal trains past that, so --total can be reached while the plan still sees work left
    fake, store, eng, c, slurm = _world(tmp_path)
    c.credited_s, c.signal_lead_s = 100.0, 90
    store.save(c, [])
    trainer = _submit(fake, store, slurm, c, 0)
    trainer.limit_s = 540  # expected 450 s of training: the plan sees 50 s left, above the 30 s tolerance
    store.save(c, [s for s in store.segments(c.id)])
    fake.start(trainer.id)
    fake.files[control_path(c.run_dir, 0, "state")] = f"phase=training\njob={trainer.id}\npayload_start={fake.now:.0f}\n"
    while not fake.signals and fake.now - trainer.start < 540:  # 500 s trained + 100 credited = --total
        fake.now += 20
        eng.tick()
    assert fake.signals == [(trainer.id, "USR2")]
    asked = len(fake.jobs)  # a successor asked for at the hand-over point, before --total, is cancelled
    assert all(j.state == "CANCELLED" for j in fake.jobs.values() if j.id != trainer.id)
    for _ in range(3):  # it ignores the signal and trains on toward its limit
        fake.now += 10
        eng.tick()
    assert len(fake.jobs) == asked and len(fake.signals) == 1


def test_a_segment_that_stops_on_its_own_signal_at_total_says_total_reached(tmp_path):
    """Slurm's signal (or the trainer) ended the segment that reached --total before a tick could: its event
    said "next segment continues", followed by "completed: total time reached" (a real chain, 3 min total)."""
    fake, store, eng, c, slurm = _world(tmp_path)
    job = _submit(fake, store, slurm, c, 0)
    fake.start(job.id)
    fake.now += 300
    eng.tick()
    fake.now += 310  # 10 min 10 s trained, no tick since: nobody told it to stop
    _ends_checkpointed(fake, eng, c, job)
    assert store.chain(c.id).status == COMPLETED and fake.signals == []
    ended = [e.message for _, e in store.events(c.id) if e.kind == "continue"]
    assert len(ended) == 1 and ended[0].endswith("of training; --total reached"), ended
