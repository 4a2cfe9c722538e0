"""A segment whose node cannot see the run folder (the wrapper exits 86 before training, usually
without an outcome file): the watcher says what to fix, keeps that node out of the next segments
and fails the chain after two such segments. On the in-memory Slurm; the real one is in
tests/chain/test_no_run_folder_slurm.py."""

from __future__ import annotations

import time

from chainrun.chain.engine import Engine
from chainrun.chain.segment_end import MAX_NO_RUN_FOLDER
from chainrun.chain.segments import submit_segment
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import ACTIVE, CRASH, ENDED, FAILED, NO_RUN_FOLDER, PENDING, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm
from tests.reliability.test_engine_faults import make_chain


def _world(tmp_path, policy="reactive"):
    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = make_chain(store, policy=policy)
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
    return fake, store, eng, c


def _blind_end(fake: FakeSlurm, jid: str, node: str) -> None:
    """The wrapper found no token on ``node`` and exited 86 at once, writing nothing."""
    j = fake.jobs[jid]
    j.node, j.exit_code = node, "86:0"
    fake.start(jid)
    fake.now += 1
    fake.finish(jid, "FAILED")


def _sbatch_argvs(fake: FakeSlurm) -> list[tuple[str, ...]]:
    return [a for a in fake.calls if a[0] == "sbatch"]


def test_a_blind_node_is_named_excluded_and_the_chain_goes_on(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    _blind_end(fake, job.id, "n2")
    eng.tick()
    s0, s1 = store.segments(c.id)
    assert s0.phase == ENDED and s0.outcome == NO_RUN_FOLDER and s0.credit_s == 0
    assert s0.reason == (f"the run folder {c.run_dir} is not visible on node n2: put it on a shared filesystem "
                         "(one every compute node mounts)")
    chain = store.chain(c.id)
    assert chain.status == ACTIVE and chain.consecutive_failures == 0  # no retry spent: nothing ran
    assert chain.extra["adapt"]["exclude"] == ["n2"]
    assert s1.phase == PENDING and "--exclude=n2" in _sbatch_argvs(fake)[-1]
    msgs = [e.message for _, e in store.events(c.id)]
    assert any("excluding node n2 from the next segments: the run folder" in m for m in msgs)


def test_two_blind_segments_fail_the_chain_with_what_to_fix(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    _blind_end(fake, job.id, "n2")
    eng.tick()
    s1 = store.segments(c.id)[1]
    _blind_end(fake, s1.job_id, "n3")
    eng.tick()
    chain = store.chain(c.id)
    assert chain.status == FAILED and MAX_NO_RUN_FOLDER == 2
    assert f"could not see the run folder {c.run_dir} (node(s) n2, n3)" in chain.reason
    assert "shared filesystem" in chain.reason and "cluster test --probe" in chain.reason
    assert len(fake.jobs) == 2  # nothing more submitted


def test_a_queued_successor_is_moved_off_the_blind_node(tmp_path):
    """Submitted early (policy lead), the successor already waits when its predecessor ends blind."""
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    nxt = Segment(chain_id=c.id, idx=1, time_limit_s=120)
    submit_segment(store, SlurmClient(fake), store.chain(c.id), nxt)
    _blind_end(fake, job.id, "n4")
    eng.tick()
    assert fake.updates == [(nxt.job_id, {"ExcNodeList": "n4"})]
    assert store.segments(c.id)[1].extra["request"].startswith("--exclude=n4")


def test_the_outcome_file_says_it_where_the_wrapper_could_write_one(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.files[f"{c.run_dir}/control/seg-0.outcome"] = (f"outcome=no-run-folder\nreason={c.run_dir}/control/token is "
                                                        f"missing\njob={job.id}\n")
    fake.jobs[job.id].node = "n3"
    fake.start(job.id)
    fake.finish(job.id, "COMPLETED")
    eng.tick()
    s0 = store.segments(c.id)[0]
    assert s0.outcome == NO_RUN_FOLDER
    assert s0.reason.startswith(f"the run folder {c.run_dir} is not visible on node n3 ({c.run_dir}/control/token "
                                "is missing): put it on a shared filesystem")


def test_a_payload_that_exits_86_is_a_crash_not_a_blind_node(tmp_path):
    fake, store, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.files[f"{c.run_dir}/control/seg-0.outcome"] = f"outcome=crash\nexit=86\njob={job.id}\n"
    _blind_end(fake, job.id, "n2")
    eng.tick()
    s0 = store.segments(c.id)[0]
    assert s0.outcome == CRASH and not store.chain(c.id).extra.get("adapt", {}).get("exclude")
