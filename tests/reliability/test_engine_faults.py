"""The engine and watcher under Slurm faults, on an in-memory Slurm (fast, no cluster needed).

Each test scripts one fault at the exact moment it hurts and checks the two invariants the
issue asks for: the watcher keeps going, and no segment index is ever submitted twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from chainrun.chain import engine as engine_mod
from chainrun.chain.engine import ADOPT_AFTER_S, Engine, TickReport
from chainrun.chain.planning import MAX_UNCONFIRMED
from chainrun.chain.segments import submit_segment
from chainrun.chain.watcher import run_watch
from chainrun.errors import StateError
from chainrun.slurm.client import Backoff, SlurmClient
from chainrun.state.records import ACTIVE, ENDED, FAILED, PENDING, RUNNING, SUBMITTING, Chain, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm

UNEXPLAINED = (1, "sbatch: error: Batch job submission failed: Unexpected message received")
TIMEOUT = (1, "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")
REFUSED = (1, "sbatch: error: Batch job submission failed: Invalid partition name specified")


def make_chain(store: Store, cid: str = "t-0001", policy: str = "reactive") -> Chain:
    c = Chain(id=cid, name="t", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=3600, segment_s=120, policy=policy, lead_s=30, signal="USR2", signal_lead_s=30, retries=1,
              sbatch_args=[], partition="short", created=time.time())
    store.add_chain(c)
    return c


def make_world(tmp_path):
    """An in-memory Slurm, a real store and engine, one chain with segment 0 submitted."""
    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = make_chain(store)
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
    return fake, store, eng, c


@pytest.fixture
def world(tmp_path):
    fake, store, eng, c = make_world(tmp_path)
    yield fake, store, eng, c
    store.close()


def names_submitted_once(fake: FakeSlurm) -> None:
    seen: dict[str, int] = {}
    for j in fake.jobs.values():
        seen[j.name] = seen.get(j.name, 0) + 1
    assert all(n == 1 for n in seen.values()), f"duplicate submissions: {seen}"


def end_current(fake: FakeSlurm, store: Store, c: Chain) -> None:
    live = [s for s in store.segments(c.id) if s.phase in (PENDING, RUNNING)]
    for s in live:
        fake.start(s.job_id)
        fake.now += 125
        fake.finish(s.job_id, "TIMEOUT")


# ------------------------------------------------------------------ query phase
@pytest.mark.parametrize("stderr", ["squeue: error: Unexpected message received", "squeue: error: Invalid user"])
def test_unexplained_squeue_error_skips_the_tick(world, stderr):
    fake, store, eng, c = world
    fake.fail["squeue"] = [(1, stderr)]
    rep = eng.tick()
    assert rep.failed and rep.warnings and store.chain(c.id).status == ACTIVE
    assert eng.tick().failed is False


def test_unreadable_squeue_output_skips_the_tick(world):
    fake, store, eng, c = world
    fake.squeue_text = "JOBID|USER|STATE|SUBMIT_TIME|NAME\n100|root|RUNNING|yesterday-ish|cr.t-0001.0\n"
    rep = eng.tick()
    assert rep.failed and "unreadable SUBMIT_TIME" in rep.warnings[0]
    assert store.chain(c.id).status == ACTIVE
    fake.squeue_text = None
    assert not eng.tick().failed


def test_sacct_timeout_skips_the_tick_and_changes_nothing(world):
    fake, store, eng, c = world
    end_current(fake, store, c)
    fake.fail["sacct"] = [(-1, "timed out after 60s")]
    rep = eng.tick()
    assert rep.failed
    assert store.segments(c.id)[0].phase == PENDING  # not declared ended, not lost
    rep = eng.tick()
    assert not rep.failed and rep.ended == 1 and rep.submitted == 1


# ------------------------------------------------------------------ sbatch faults
def test_unexplained_sbatch_error_does_not_fail_the_chain(world):
    fake, store, eng, c = world
    end_current(fake, store, c)
    fake.fail["sbatch"] = [UNEXPLAINED]
    rep = eng.tick()
    assert rep.failed and store.chain(c.id).status == ACTIVE
    assert store.segments(c.id)[-1].phase == SUBMITTING
    fake.now += ADOPT_AFTER_S + 1
    eng.tick()  # sacct --name: no such job -> plan it again
    eng.tick()
    segs = store.segments(c.id)
    assert store.chain(c.id).status == ACTIVE
    assert segs[1].phase == ENDED and segs[2].phase == PENDING
    names_submitted_once(fake)


def test_refused_sbatch_fails_the_chain(world):
    fake, store, eng, c = world
    end_current(fake, store, c)
    fake.fail["sbatch"] = [REFUSED]
    eng.tick()
    assert store.chain(c.id).status == FAILED and "refused" in store.chain(c.id).reason


def test_lost_sbatch_reply_is_adopted_not_duplicated(world):
    fake, store, eng, c = world
    end_current(fake, store, c)
    fake.land_late = True  # sbatch "times out" but the controller created the job
    fake.fail["sbatch"] = [TIMEOUT]
    assert eng.tick().failed
    rep = eng.tick()
    segs = store.segments(c.id)
    assert segs[1].phase == PENDING and segs[1].job_id == fake.by_name("cr.t-0001.1")[0].id
    assert rep.submitted == 0
    names_submitted_once(fake)
    assert any(e.kind == "adopted" for _, e in store.events(c.id))


def test_lost_reply_adopted_from_sacct_when_the_job_already_left_the_queue(world):
    fake, store, eng, c = world
    end_current(fake, store, c)
    fake.land_late = True
    fake.fail["sbatch"] = [TIMEOUT]
    eng.tick()
    jid = fake.by_name("cr.t-0001.1")[0].id
    fake.start(jid)
    fake.now += 125
    fake.finish(jid, "TIMEOUT")
    fake.now += ADOPT_AFTER_S
    eng.tick()
    seg1 = store.segments(c.id)[1]
    assert seg1.job_id == jid and seg1.phase == ENDED and seg1.outcome == "continue"
    names_submitted_once(fake)


def test_submission_that_lands_after_we_gave_up_is_cancelled(world):
    fake, store, eng, c = world
    end_current(fake, store, c)
    fake.fail["sbatch"] = [TIMEOUT]
    eng.tick()
    fake.now += ADOPT_AFTER_S + 1
    eng.tick()  # gave up on segment 1, planned segment 2
    eng.tick()
    segs = store.segments(c.id)
    assert segs[1].phase == ENDED and segs[2].phase == PENDING
    late = fake._sbatch(["sbatch", "--job-name=cr.t-0001.1"])  # the lost request is finally processed
    eng.tick()
    assert fake.jobs[late].state == "CANCELLED"
    assert fake.jobs[segs[2].job_id].state == "PENDING"
    assert any("second copy" in e.message for _, e in store.events(c.id))


def test_sbatch_failing_forever_fails_the_chain_after_a_bounded_number_of_tries(world):
    fake, store, eng, c = world
    end_current(fake, store, c)
    fake.fail["sbatch"] = [UNEXPLAINED] * 50
    for _ in range(3 * MAX_UNCONFIRMED + 3):
        eng.tick()
        fake.now += ADOPT_AFTER_S + 1
        if store.chain(c.id).status != ACTIVE:
            break
    ch = store.chain(c.id)
    assert ch.status == FAILED and "times in a row" in ch.reason


def test_every_tick_stays_within_the_query_budget_under_faults(world):
    fake, store, eng, c = world
    fake.fail["sbatch"] = [TIMEOUT, UNEXPLAINED]
    fake.fail["sacct"] = [(-1, "timed out")]
    for i in range(30):
        if i % 3 == 0:
            end_current(fake, store, c)
        rep = eng.tick()
        assert rep.slurm_calls.get("squeue", 0) <= 1 and rep.slurm_calls.get("sacct", 0) <= 1, rep.slurm_calls
        fake.now += 30
    names_submitted_once(fake)


# ------------------------------------------------------------------ job-id reuse
def test_reused_job_id_is_not_taken_for_ours(world):
    fake, store, eng, c = world
    jid = store.segments(c.id)[0].job_id
    fake.start(jid)
    eng.tick()
    assert store.segments(c.id)[0].phase == RUNNING
    # controller reset: the id now names somebody else's pending job, submitted much later
    fake.jobs[jid] = type(fake.jobs[jid])(jid, "someone-else", fake.now + 10)
    fake.now += 10
    eng.tick()
    seg = store.segments(c.id)[0]
    assert seg.phase == RUNNING and seg.slurm_state == "RUNNING"  # not flipped to the stranger's PENDING
    assert any("now names another job" in e.message for _, e in store.events(c.id))


def test_same_name_but_far_submit_time_is_not_ours(world):
    fake, store, eng, c = world
    seg = store.segments(c.id)[0]
    fake.jobs[seg.job_id].submit = fake.now + 3 * 86400  # a different era
    eng.tick()
    assert store.segments(c.id)[0].slurm_state == ""  # nothing copied from the impostor


# ------------------------------------------------------------------ watcher loop
class FlakyEngine:
    def __init__(self, fails: list):
        self.fails = fails
        self.store = type("S", (), {"chains": staticmethod(lambda active_only=False: [])})()

    def tick(self):
        f = self.fails.pop(0) if self.fails else None
        if isinstance(f, Exception):
            raise f
        return TickReport(failed=bool(f))


def test_watcher_survives_bugs_and_failed_ticks_with_capped_backoff():
    slept = []
    eng = FlakyEngine([RuntimeError("boom"), True, True, True, True, True, True, True, True, None, None])
    reports = []
    run_watch(eng, interval=10, once=False, max_ticks=11, sleep=slept.append, on_tick=reports.append)
    assert slept[:9] == [10, 20, 40, 80, 160, 300, 300, 300, 300]
    assert slept[9] == 10  # a good tick resets the backoff
    assert "boom" in reports[0].warnings[0]


def test_watch_once_reports_errors_and_state_errors_always_stop():
    with pytest.raises(RuntimeError):
        run_watch(FlakyEngine([RuntimeError("x")]), interval=1, once=True)
    with pytest.raises(StateError):
        run_watch(FlakyEngine([StateError("corrupt")]), interval=1, once=False, sleep=lambda s: None)


def test_backoff_is_capped():
    b = Backoff(5, 60)
    assert [b.failed() for _ in range(6)] == [5, 10, 20, 40, 60, 60]
    b.reset()
    assert b.failed() == 5


def test_engine_module_keeps_its_budget_constants():
    assert engine_mod.ADOPT_AFTER_S >= 30 and engine_mod.LOST_AFTER_S > engine_mod.ADOPT_AFTER_S


def test_sacct_placeholder_name_of_a_just_ended_job_is_still_ours(world):
    """sacct says JobName "allocation" for about a second after a job that failed before its script ran
    (its output file could not be opened): the segment is read from it, not taken for another job."""
    fake, store, eng, c = world
    seg = store.segments(c.id)[0]
    job = fake.jobs[seg.job_id]
    fake.start(job.id)
    fake.finish(job.id, "FAILED")
    job.name = "allocation"
    eng.tick()
    events = [e.message for _, e in store.events(c.id)]
    assert store.segments(c.id)[0].phase == ENDED and not any("names another job" in m for m in events)
