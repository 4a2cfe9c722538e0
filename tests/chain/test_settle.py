"""A cancelled segment's figures come from Slurm and the wrapper, never from the cancel (fast, in-memory Slurm).

chainrun cancels by scancel, which returns before the job ends; the end, the time held and the training a
cancelled segment shows are read later from sacct and the wrapper's file (chain/settle.py). The real-Slurm
check is test_settle_slurm.py."""

from __future__ import annotations

import time

import pytest

from chainrun.chain.contract import control_path
from chainrun.chain.cancel import cancel_chain
from chainrun.chain.engine import Engine
from chainrun.chain.segments import submit_segment
from chainrun.chain.summary import view_chain
from chainrun.chain.watcher import run_watch
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import CANCELLED, COMPLETED, ENDED, PENDING, RUNNING, Chain, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm, Job


@pytest.fixture
def world(tmp_path):
    fake = FakeSlurm(now=float(int(time.time())))  # whole seconds, as squeue prints them
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = Chain(id="set-0001", name="set", cluster="local", script="/s", workdir="/w", run_dir="/r",
              checkpoint_dir="/c", total_s=3600, segment_s=1200, policy="lead", lead_s=60, signal="USR2",
              signal_lead_s=60, retries=1, sbatch_args=[], partition="short", created=time.time())
    store.add_chain(c)
    yield fake, store, slurm, eng, c
    store.close()


def _submit(fake, store, slurm, c, idx) -> Job:
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=idx, time_limit_s=1200))
    job = fake.jobs[str(fake.next_id - 1)]
    job.limit_s = 1200  # squeue's expected end of the running job: start + 20 min
    return job


def _training(fake, store, slurm, eng, c) -> Job:
    job = _submit(fake, store, slurm, c, 0)
    fake.start(job.id)
    fake.now += 5
    eng.tick()
    seg = store.segments(c.id)[0]
    assert seg.phase == RUNNING and seg.end == job.start + 1200  # the expected end, while it runs
    return job


def test_a_user_cancel_is_settled_from_sacct_and_the_wrapper(world):
    fake, store, slurm, eng, c = world
    job = _training(fake, store, slurm, eng, c)
    fake.now += 42
    cancel_chain(store, slurm, store.chain(c.id))
    job.state, job.in_queue = "RUNNING", True  # scancel returned; the trainer saves on TERM, the job still ends
    seg = store.segments(c.id)[0]
    assert seg.phase == ENDED and seg.end is None and seg.credit_s == 0.0  # nothing invented meanwhile
    view = view_chain(store.chain(c.id), store.segments(c.id), fake.now)
    assert "read from Slurm" in view.segment_views[0].note and view.allocated_s == 0
    from chainrun.report.timeline import build_timeline

    assert build_timeline(view, fake.now + 600).bars == []  # no bar drawn to "now" for an unknown end
    eng.tick()  # still in squeue: not settled yet
    assert store.segments(c.id)[0].extra.get("settle") is not None
    fake.now += 6  # it saved and ended 6 s after the cancel
    fake.files[control_path(c.run_dir, 0, "outcome")] = (
        f"outcome=continue\njob={job.id}\nexit=0\nsignaled=1\npayload_start={job.start + 2:.0f}\n"
        f"payload_end={fake.now - 1:.0f}\n")
    fake.finish(job.id, "CANCELLED")
    eng.tick()
    seg, ch = store.segments(c.id)[0], store.chain(c.id)
    assert seg.end == job.end and seg.slurm_state == "CANCELLED" and seg.outcome == "cancelled"
    assert seg.credit_s == pytest.approx(job.end - 1 - (job.start + 2))
    view = view_chain(ch, store.segments(c.id), fake.now + 600)
    assert view.allocated_s == pytest.approx(job.end - job.start)  # what it held, not start + limit
    assert view.trained_s == pytest.approx(seg.credit_s)
    assert ch.status == CANCELLED and "settling" not in ch.extra
    assert any(e.kind == "settled" for _, e in store.events(c.id))
    n = fake.count("sacct")
    eng.tick()
    assert fake.count("sacct") == n  # settled chains are not read again


def test_queued_successor_cancelled_when_the_chain_finishes_keeps_its_sacct_end(world):
    fake, store, slurm, eng, c = world
    job = _training(fake, store, slurm, eng, c)
    nxt = _submit(fake, store, slurm, c, 1)
    fake.start(nxt.id)  # started early, waiting for the hand-off (a segment chainrun sees as RUNNING)
    fake.now += 5
    eng.tick()
    fake.files[control_path(c.run_dir, 0, "outcome")] = (
        f"outcome=done\njob={job.id}\nexit=0\npayload_start={job.start:.0f}\npayload_end={fake.now:.0f}\n")
    fake.finish(job.id, "COMPLETED")
    fake.now += 5
    eng.tick()  # done: the chain completes and cancels segment 1
    assert store.chain(c.id).status == COMPLETED
    s1 = store.segments(c.id)[1]
    assert s1.phase == ENDED and s1.end is None and s1.extra.get("settle") is not None
    fake.files[control_path(c.run_dir, 1, "state")] = f"phase=waiting\njob={nxt.id}\n"
    # the watcher that would stop when idle goes on until segment 1 is settled
    run_watch(eng, interval=1, once=False, stop_when_idle=True, max_ticks=5, sleep=lambda _: None)
    s1 = store.segments(c.id)[1]
    assert s1.end == nxt.end and s1.credit_s == 0.0 and s1.extra.get("settle") is None
    view = view_chain(store.chain(c.id), store.segments(c.id), fake.now + 600)
    assert view.allocated_s == pytest.approx((job.end - job.start) + (nxt.end - nxt.start))


def test_a_segment_slurm_never_reports_is_given_up_with_unknown_figures(world):
    fake, store, slurm, eng, c = world
    job = _training(fake, store, slurm, eng, c)
    cancel_chain(store, slurm, store.chain(c.id))
    job.in_acct = False
    fake.now += 60
    eng.tick()
    assert store.segments(c.id)[0].extra.get("settle") is not None
    fake.now += 1000
    eng.tick()
    seg = store.segments(c.id)[0]
    assert seg.extra.get("settle") is None and seg.end is None and seg.extra.get("settle_unknown")
    assert "settling" not in store.chain(c.id).extra


def test_a_job_that_ended_by_itself_before_the_cancel_keeps_its_own_ending(world):
    fake, store, slurm, eng, c = world
    job = _submit(fake, store, slurm, c, 0)
    fake.start(job.id)
    fake.now += 3
    fake.files[control_path(c.run_dir, 0, "outcome")] = f"outcome=skipped\njob={job.id}\n"
    fake.finish(job.id, "COMPLETED")  # it found the chain finished and ended; chainrun has not seen it yet
    cancel_chain(store, slurm, store.chain(c.id))
    fake.now += 5
    eng.tick()
    seg = store.segments(c.id)[0]
    assert seg.outcome == "skipped" and seg.slurm_state == "COMPLETED" and seg.end == job.end


# ------------------------------------------------------------------ job-id reuse: never the chain's own job
def test_an_older_job_with_our_id_in_accounting_is_no_warning(world):
    fake, store, slurm, eng, c = world
    job = _submit(fake, store, slurm, c, 0)
    # sacct still knows a job that held this id before a controller reset, and not (yet) ours
    fake.acct_only.append(Job(job.id, "cr.other-0002.3", fake.now - 7200, state="COMPLETED", start=fake.now - 7000,
                              end=fake.now - 6900))
    job.in_queue, job.in_acct = False, False
    fake.now += 30
    eng.tick()
    assert not [e for _, e in store.events(c.id) if "now names another job" in e.message]
    assert store.segments(c.id)[0].phase == PENDING
    job.in_acct, job.state, job.start, job.end = True, "COMPLETED", fake.now - 20, fake.now - 5
    fake.files[control_path(c.run_dir, 0, "outcome")] = (
        f"outcome=continue\njob={job.id}\nexit=0\npayload_start={job.start:.0f}\npayload_end={job.end:.0f}\n")
    eng.tick()
    seg = store.segments(c.id)[0]
    assert seg.phase == ENDED and seg.outcome == "continue" and seg.end == job.end  # its own row, not the old one


def test_two_segments_holding_one_id_each_get_their_own_row(world):
    fake, store, slurm, eng, c = world
    job = _submit(fake, store, slurm, c, 0)
    fake.start(job.id)
    # a stale active chain recorded the same id in an earlier era (before a controller reset)
    old = Chain(**{**c.__dict__, "id": "old-0002", "name": "old", "extra": {}, "created": c.created - 1})
    store.add_chain(old)
    store.save(old, [Segment(chain_id=old.id, idx=2, phase=RUNNING, job_id=job.id, submit=fake.now - 86400,
                             intent_at=fake.now - 86400, time_limit_s=1200)])
    fake.now += 5
    eng.tick()
    mine = store.segments(c.id)[0]
    assert mine.phase == RUNNING and mine.slurm_state == "RUNNING"
    assert not [e for _, e in store.events(c.id) if e.kind == "warning"]  # the chain's own job is never foreign
    assert [e for _, e in store.events(old.id) if "now names another job" in e.message]  # the stale one is told
    assert store.segments(old.id)[0].slurm_state == ""  # and copies nothing from the job that is not its own


def test_a_user_cancel_during_a_watcher_tick_is_never_cancelled_outside_chainrun(world):
    """`chainrun cancel` in another process acts after the watcher's tick read the store and before it
    asks Slurm: the tick's copy does not know chainrun cancelled the job that Slurm now shows CANCELLED.
    It reads the store again (the cancel wrote its intent before its scancel): chainrun's cancel, the
    chain stays cancelled, nothing is planned (it used to fail the chain 'cancelled outside chainrun')."""
    fake, store, slurm, eng, c = world
    job = _training(fake, store, slurm, eng, c)
    real_run, done = fake.run, []

    def run(argv, *a, **kw):  # the other process's cancel lands just before this tick's squeue
        if argv[0] == "squeue" and not done:
            done.append(cancel_chain(Store(store.path), SlurmClient(fake), store.chain(c.id)))
        return real_run(argv, *a, **kw)

    fake.run = run
    fake.now += 30
    eng.tick()
    assert done == [[job.id]]
    ch, (s,) = store.chain(c.id), store.segments(c.id)
    assert ch.status == CANCELLED and ch.reason == "cancelled by the user", ch.reason
    assert s.phase == ENDED and s.outcome == "cancelled" and "outside chainrun" not in s.reason
    assert not any("outside chainrun" in e.message for _, e in store.events(c.id))
    assert fake.count("sbatch") == 1  # nothing planned for a cancelled chain
