"""A segment Slurm requeues (same job id, pending again) and, with --no-requeue, one whose node
failed: on the in-memory Slurm. The real cluster: tests/chain/test_requeue_slurm.py."""

from __future__ import annotations

import time

import pytest

from chainrun.chain.engine import Engine
from chainrun.chain.segments import submit_segment
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import ACTIVE, CRASH, ENDED, FAILED, PENDING, RUNNING, UNSTARTED, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm
from tests.reliability.test_engine_faults import make_chain


def _world(tmp_path):
    fake = FakeSlurm(now=float(int(time.time())))  # whole seconds, as squeue and sacct print them
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = make_chain(store)
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=7200))
    return fake, store, eng, c


def test_a_requeued_segment_stays_the_same_segment(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.start(job.id)
    fake.files[f"{c.run_dir}/control/seg-0.state"] = f"phase=training\npayload_start={fake.now + 5}\njob={job.id}\n"
    fake.now += 40
    eng.tick()
    assert store.segments(c.id)[0].extra.get("payload_start") == job.start + 5
    fake.now += 2 * 3600  # long enough that the new submit time is far from the recorded one
    fake.requeue(job.id)
    eng.tick()
    (s,) = store.segments(c.id)
    assert s.phase == PENDING and s.job_id == job.id and s.extra["requeues"] == 1
    assert "payload_start" not in s.extra and s.start is None  # the last run's figures are not this run's
    msgs = [e.message for _, e in store.events(c.id)]
    assert any(f"segment 0 (job {job.id}) was requeued by Slurm" in m for m in msgs)
    assert not any("names another job" in m for m in msgs)  # not taken for a foreign job
    assert fake.count("sbatch") == 1  # not a new submission
    fake.now += 120
    fake.start(job.id)
    second_start = fake.now
    fake.files[f"{c.run_dir}/control/seg-0.state"] = f"phase=training\npayload_start={second_start + 3}\njob={job.id}\n"
    eng.tick()
    assert store.segments(c.id)[0].phase == RUNNING and store.segments(c.id)[0].start == second_start
    fake.now += 600
    fake.files[f"{c.run_dir}/control/seg-0.outcome"] = (f"outcome=continue\nsignaled=1\npayload_start={second_start + 3}\n"
                                                        f"payload_end={fake.now - 1}\njob={job.id}\n")
    fake.finish(job.id, "COMPLETED")
    eng.tick()
    s = store.segments(c.id)[0]
    assert s.phase == ENDED and s.start == second_start and s.end == fake.now
    assert s.credit_s == fake.now - 1 - (second_start + 3)  # the run that ended, as the wrapper recorded it
    assert fake.count("sbatch") == 2 and store.chain(c.id).status == ACTIVE


def test_no_requeue_node_failure_before_training_spends_no_retry(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.start(job.id)
    fake.now += 5
    fake.finish(job.id, "NODE_FAIL")  # --no-requeue: Slurm ends it instead of requeueing it
    eng.tick()
    s0, s1 = store.segments(c.id)
    assert s0.outcome == UNSTARTED and "lost its node (NODE_FAIL) before training" in s0.reason
    assert store.chain(c.id).consecutive_failures == 0 and s1.phase == PENDING  # retried as a new job


def test_no_requeue_failures_after_training_count_against_retries(tmp_path):
    fake, store, eng, c = _world(tmp_path)  # --retries 1
    for i, state in enumerate(("NODE_FAIL", "PREEMPTED")):
        seg = store.segments(c.id)[-1]
        fake.start(seg.job_id)
        fake.files[f"{c.run_dir}/control/seg-{i}.state"] = (f"phase=training\npayload_start={fake.now + 2}\n"
                                                            f"job={seg.job_id}\n")
        fake.now += 300
        fake.finish(seg.job_id, state)
        eng.tick()
        seg = store.segments(c.id)[i]
        assert seg.outcome == CRASH and seg.credit_s == 298 and "after 4m58s of training" in seg.reason
    assert store.chain(c.id).status == FAILED and "no retries left" in store.chain(c.id).reason


def test_what_the_run_before_a_requeue_wrote_is_not_this_runs(tmp_path):
    """The first run saved and wrote its outcome on the requeue's TERM; the rerun was killed before it wrote
    anything: its end is read from Slurm and its own (absent) record, not from the first run's files."""
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.start(job.id)
    first = fake.now
    eng.tick()
    fake.now += 60
    fake.files[f"{c.run_dir}/control/seg-0.outcome"] = (f"outcome=continue\nsignaled=1\npayload_start={first + 2}\n"
                                                        f"payload_end={fake.now}\njob={job.id}\nwritten={fake.now}\n")
    fake.files[f"{c.run_dir}/control/seg-0.state"] = f"phase=training\npayload_start={first + 2}\njob={job.id}\n"
    fake.requeue(job.id)
    eng.tick()
    fake.now += 200
    fake.start(job.id)
    eng.tick()  # running again; the state file is still the first run's
    s = store.segments(c.id)[0]
    assert s.phase == RUNNING and "payload_start" not in s.extra
    fake.now += 30
    fake.finish(job.id, "FAILED")  # killed before its wrapper wrote anything
    eng.tick()
    s = store.segments(c.id)[0]
    assert s.outcome == CRASH and s.credit_s == 0  # not the first run's 'continue' with its 58 s


# ---------------------------------------------------------------- a requeued job's runs add up (sacct -D, seg-<N>.run-<R>)
def _run_file(fake, c, job, restart, **kv):
    fake.files[f"{c.run_dir}/control/seg-0.run-{restart}"] = "".join(
        f"{k}={v}\n" for k, v in {**kv, "job": job.id, "restart": restart}.items())


def _first_run(fake, eng, c, job, *, trained=100, held=130, record="outcome"):
    """Run 0 of the job: it starts (a tick sees it run), trains ``trained`` s from 5 s in, and Slurm
    requeues it at ``held`` s."""
    fake.start(job.id)
    first = fake.now
    eng.tick()
    fake.now += held
    if record == "outcome":  # it saved on the requeue's TERM and wrote its outcome
        _run_file(fake, c, job, 0, outcome="continue", signaled=1, payload_start=first + 5,
                  payload_end=first + 5 + trained, written=fake.now)
    elif record == "training":  # killed (node failure) before it could write its outcome
        _run_file(fake, c, job, 0, phase="training", payload_start=first + 5)
    fake.requeue(job.id, "REQUEUED" if record == "outcome" else "NODE_FAIL")
    return first


@pytest.mark.parametrize("seen", [True, False])  # did a tick see the job pending again in between?
def test_a_requeued_segment_is_credited_with_what_every_run_trained(tmp_path, seen):
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    first = _first_run(fake, eng, c, job)
    if seen:
        eng.tick()
        assert store.segments(c.id)[0].extra["requeues"] == 1
    fake.now += 120
    fake.start(job.id)
    second = fake.now
    fake.now += 300
    fake.files[f"{c.run_dir}/control/seg-0.outcome"] = (f"outcome=continue\nsignaled=1\npayload_start={second + 2}\n"
                                                        f"payload_end={second + 290}\njob={job.id}\nrestart=1\n"
                                                        f"written={fake.now}\n")
    fake.finish(job.id, "COMPLETED")
    eng.tick()
    s, ch = store.segments(c.id)[0], store.chain(c.id)
    assert s.phase == ENDED and s.outcome == "continue" and s.extra["requeues"] == 1
    assert s.credit_s == 100 + 288  # the first run's training plus the rerun's, never only the last
    assert ch.credited_s == 100 + 288 and s.extra["held_before_s"] == 130
    assert (s.start, s.end) == (second, fake.now)  # start and end stay the last run's, as sacct has them
    assert [r["start"] for r in s.extra["earlier_runs"]] == [first]
    from chainrun.chain.summary import view_chain

    assert view_chain(ch, store.segments(c.id), now=fake.now).allocated_s == 130 + 300  # what both runs held
    msg = next(e.message for _, e in store.events(c.id) if e.kind == "continue")
    assert "1 earlier run(s) of the job before Slurm requeued it add 1m40s of training" in msg, msg


def test_a_run_lost_with_its_node_is_credited_until_slurm_ended_it(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    _first_run(fake, eng, c, job, held=130, record="training")  # no payload_end: it trained until the run ended
    fake.now += 60
    fake.start(job.id)
    fake.now += 50
    fake.finish(job.id, "FAILED")  # the rerun was killed before it wrote anything
    eng.tick()
    s = store.segments(c.id)[0]
    assert s.outcome == CRASH and s.credit_s == 125  # 130 - 5: the first run; the rerun trained nothing known


def test_a_superseded_rerun_keeps_what_the_first_run_trained(tmp_path):
    """The rerun found a later segment holding the chain and ended unstarted: the segment still
    delivered what its first run trained (formerly the unstarted rerun replaced it with 0)."""
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    _first_run(fake, eng, c, job)
    eng.tick()
    fake.now += 120
    fake.start(job.id)
    rerun = fake.now
    fake.now += 3
    fake.files[f"{c.run_dir}/control/seg-0.state"] = f"phase=waiting\nsince={rerun}\n"
    fake.files[f"{c.run_dir}/control/seg-0.rerun-1"] = f"outcome=unstarted\nreason=superseded\njob={job.id}\n"
    fake.finish(job.id, "COMPLETED")
    eng.tick()
    s = store.segments(c.id)[0]
    assert s.outcome == UNSTARTED and s.credit_s == 100 and store.chain(c.id).credited_s == 100


def test_a_cancelled_requeued_segment_is_settled_over_all_its_runs(tmp_path):
    from chainrun.chain.cancel import cancel_chain

    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    _first_run(fake, eng, c, job)
    eng.tick()  # pending again
    cancel_chain(store, SlurmClient(fake), store.chain(c.id))  # the user cancels it before the rerun starts
    fake.jobs[job.id].in_queue = False
    fake.now += 5
    eng.tick()
    s = store.segments(c.id)[0]
    assert s.credit_s == 100 and s.extra["held_before_s"] == 130
    msg = next(e.message for _, e in store.events(c.id) if e.kind == "settled")
    assert "it never started" in msg and "1 earlier run(s)" in msg, msg


def test_an_owner_its_successor_cancelled_does_not_fail_the_chain(tmp_path):
    """Segment 0 did not hand off within the save timeout: segment 1's wrapper sent it TERM, then
    cancelled it (control/cancel.0). Slurm says CANCELLED, but chainrun did it: the chain goes on."""
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.start(job.id)
    fake.files[f"{c.run_dir}/control/seg-0.state"] = f"phase=training\ngen=0\npayload_start={fake.now + 2}\n"
    fake.now += 600
    fake.files[f"{c.run_dir}/control/cancel.0"] = (f"job={job.id}\ngen=0\nby=555\nby_seg=1\ntimeout=300\n"
                                                   f"requested={fake.now - 400}\ndeadline={fake.now - 100}\n"
                                                   f"how=scancel\nat={fake.now}\n")
    fake.finish(job.id, "CANCELLED")
    eng.tick()
    s, ch = store.segments(c.id)[0], store.chain(c.id)
    assert ch.status == ACTIVE and s.outcome == "continue" and s.credit_s == 598, (ch.reason, s.reason)
    assert "segment 1 (job 555) sent it TERM, then cancelled it" in s.reason and "within 5m" in s.reason
    assert not any("outside chainrun" in e.message for _, e in store.events(c.id))
