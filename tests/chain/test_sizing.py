"""One implementation of planning (chain/sizing.py): the watcher's planning.plan and the replay's
chains.py must plan alike; a property test drives both on random chain states (fast, fake Slurm)."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrun.chain import planning
from chainrun.chain import sizing
from chainrun.chain.contract import control_path, done_file
from chainrun.chain.engine import Engine
from chainrun.chain.pace import total_tolerance
from chainrun.chain.policies import Decision
from chainrun.chain.segments import submit_segment
from chainrun.sim.adapter import engine_chain
from chainrun.sim.chains import ChainWork, Seg, _Chain
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import ACTIVE, COMPLETED, Chain, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm

T0 = float(int(time.time()))  # the store records intents on the wall clock: Slurm's times must be near it


def test_the_gate():
    g = dict(work_after_s=600.0, tolerance_s=60.0)
    assert sizing.plan_gate(live=0, **g) == sizing.FIRST
    assert sizing.plan_gate(live=1, **g) == sizing.ASK
    assert sizing.plan_gate(live=2, **g) == sizing.WAIT
    assert sizing.plan_gate(live=0, work_after_s=59.0, tolerance_s=60.0) == sizing.FINISH
    assert sizing.plan_gate(live=1, work_after_s=59.0, tolerance_s=60.0) == sizing.WAIT
    assert sizing.plan_gate(live=1, unconfirmed=True, **g) == sizing.WAIT
    assert sizing.plan_gate(live=1, stopping=True, **g) == sizing.WAIT
    # the payload said done: nothing more is ever planned; with nothing live the chain is complete
    assert sizing.plan_gate(live=1, done_marker=True, **g) == sizing.WAIT
    assert sizing.plan_gate(live=0, done_marker=True, **g) == sizing.FINISH
    assert sizing.may_submit(left_if_cut_s=600.0, tolerance_s=60.0)
    assert not sizing.may_submit(left_if_cut_s=600.0, tolerance_s=60.0, done_marker=True)
    assert not sizing.may_submit(left_if_cut_s=59.0, tolerance_s=60.0)


def test_a_segment_carries_its_work_plus_the_lead_in_whole_minutes():
    assert sizing.segment_limit(100.0, segment_s=3600, signal_lead_s=30) == 180  # 130 s -> 3 min
    assert sizing.segment_limit(10.0, segment_s=3600, signal_lead_s=30) == 120  # at least a minute of training
    assert sizing.segment_limit(100.0, segment_s=3600, signal_lead_s=30, rate=0.5) == 240  # half the pace
    assert sizing.segment_limit(100.0, segment_s=3600, signal_lead_s=30, restart_s=600) == 780
    assert sizing.segment_limit(1e6, segment_s=3600, signal_lead_s=30) == 3600


def test_the_plan_counts_the_signal_lead():
    """Issue 23: `5m in ~3 segment(s)` needed 6 segments of 2 min with a 40 s lead: each trains 80 s."""
    assert sizing.planned_segments(300, segment_s=120, overhead_s=40, tolerance_s=15) == 4
    assert sizing.planned_segments(168 * 3600, segment_s=48 * 3600, overhead_s=300, tolerance_s=60) == 4
    assert sizing.planned_segments(96 * 3600, segment_s=48 * 3600, overhead_s=300, tolerance_s=60) == 3
    assert sizing.planned_segments(30, segment_s=120, overhead_s=40, tolerance_s=1.5) == 1


# ---------------------------------------------------------------- the watcher and the replay agree
class _Always:
    """A policy that submits whenever asked and keeps what it was shown."""

    name = "predicted"

    def __init__(self) -> None:
        self.views = []

    def decide(self, view):
        self.views.append(view)
        return Decision(True, "test")


def _engine_plan(state: dict, policy: _Always, sized: list) -> dict:
    """planning.plan on the state, through a real store and the fake Slurm: asked?, allowance, size."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeSlurm(now=T0 - state["elapsed"])
        store = Store(Path(tmp) / "state.db")
        slurm = SlurmClient(fake)
        eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
        c = Chain(id="p-0001", name="p", cluster="local", script="/s", workdir="/w", run_dir="/r",
                  checkpoint_dir="/c", total_s=state["total"], segment_s=state["segment"], policy="predicted",
                  lead_s=60, signal="USR2", signal_lead_s=state["lead"], retries=1, sbatch_args=[],
                  partition="short", created=T0, credited_s=state["credited"])
        store.add_chain(c)
        seg = Segment(chain_id=c.id, idx=0, time_limit_s=state["limit"])
        submit_segment(store, slurm, c, seg)
        job = fake.jobs[str(fake.next_id - 1)]
        seg.intent_at = seg.submit = job.submit  # recorded on the wall clock: the fake's, or it is another job
        store.save(c, [seg])
        job.limit_s = state["limit"]
        if state["running"]:
            fake.start(job.id)  # its payload starts with it (the state file says so)
            fake.files[control_path(c.run_dir, 0, "state")] = f"phase=training\njob={job.id}\npayload_start={fake.now}\n"
        fake.now = T0
        policy.views.clear()
        sized.clear()
        eng.tick()
        segs = store.segments(c.id)
        store.close()
    return {"asked": bool(policy.views), "allowance": policy.views[-1].cut_allowance_s if policy.views else None,
            "left": sized[-1] if sized else None, "limit": segs[1].time_limit_s if len(segs) > 1 else None}


def _replay_plan(state: dict) -> dict:
    """The same state in the replay (chains.py), with no restart: its gate, allowance and size."""
    lead = float(state["lead"])
    # the hand-off a cut costs: what the watcher assumes before it measured one (the signal lead)
    work = ChainWork(work_s=float(state["total"]), segment_s=float(state["segment"]), restart_s=0.0,
                     handoff_s=lead, signal_lead_s=lead, lead_s=60.0)
    ch = object.__new__(_Chain)
    asked = []
    ch.work, ch.sim, ch.segs, ch.nodes, ch.lead_s = work, SimpleNamespace(now=T0), [], 1, 60.0
    ch.chain = engine_chain(work, 60.0, "predicted")
    ch.tolerance = total_tolerance(ch.chain)
    ch.spec, ch.policy = SimpleNamespace(target=None), None
    ch.watcher = SimpleNamespace(ask=lambda *a, **kw: asked.append(kw["cut_allowance_s"]) or Decision(True))
    start = T0 - state["elapsed"] if state["running"] else math.nan
    cur = Seg(jid=7, idx=0, submit=T0 - state["elapsed"] - 1, limit=float(state["limit"]), start=start,
              train_start=start, nodes=1)
    done = float(state["credited"])
    if state["running"]:  # as in _Chain.run: the work left after cur's hand-over point, then poll's checks
        h = cur.start + cur.limit - work.signal_lead_s
        after = sizing.work_after(work.work_s, done, sizing.expected_work(h - cur.train_start, rate=cur.rate))
    else:  # the pre-queue check of the first segment
        after = sizing.work_after(work.work_s, 0.0, ch.expected(cur))
    out = {"asked": sizing.plan_gate(live=1, work_after_s=after, tolerance_s=ch.tolerance) == sizing.ASK,
           "allowance": None, "left": None}
    if out["asked"]:
        ch.ask(cur, running=state["running"], left_after=after)
        out["allowance"] = asked[-1]
        if not state["running"] or ch.may_submit(cur, done):
            # the replay's size adds the save minutes the watcher credits to the predecessor instead
            out["left"] = ch.left_if_cut(cur, done, 1.0) - (work.handoff_s if state["running"] else 0.0)
    out["limit"] = None if out["left"] is None else ch.limit_for(out["left"])
    return out


@st.composite
def chain_states(draw):
    lead = draw(st.integers(10, 600))
    segment = 60 * draw(st.integers(max(3, lead // 60 + 2), 48 * 60))
    total = draw(st.integers(60, 10 * segment))
    limit = 60 * draw(st.integers(lead // 60 + 1, segment // 60))
    running = draw(st.booleans())
    # the replay asks a running segment only before its hand-over point; it pre-queues only segment 0
    elapsed = draw(st.integers(0, max(0, limit - lead - 1))) if running else 0
    credited = draw(st.floats(0, total, allow_nan=False)) if running else 0.0
    return {"lead": lead, "segment": segment, "total": total, "limit": limit, "running": running,
            "elapsed": elapsed, "credited": credited}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=chain_states())
def test_the_watcher_and_the_replay_plan_alike(state, monkeypatch):
    policy, sized = _Always(), []
    monkeypatch.setattr(planning, "get_policy", lambda name: policy)
    submit_next = planning.submit_next

    def recording(t, c, segs, remaining, **kw):
        sized.append(remaining)
        return submit_next(t, c, segs, remaining, **kw)

    monkeypatch.setattr(planning, "submit_next", recording)
    eng, sim = _engine_plan(state, policy, sized), _replay_plan(state)
    assert eng["asked"] == sim["asked"]
    if sim["asked"]:
        assert eng["allowance"] == pytest.approx(sim["allowance"], abs=1e-6)
    assert (eng["left"] is None) == (sim["left"] is None)
    if sim["left"] is not None:
        assert eng["left"] == pytest.approx(sim["left"], abs=1e-6)
        assert eng["limit"] == sim["limit"]


# ---------------------------------------------------------------- issue 23: nothing after done
def _world(tmp_path, policy="lead", shapes=None):
    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = Chain(id="d-0001", name="d", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=3 * 3600, segment_s=3600, policy=policy, lead_s=600, signal="USR2", signal_lead_s=30,
              retries=1, sbatch_args=[], partition="short", created=time.time(),
              extra={"shapes": list(shapes)} if shapes else {})
    store.add_chain(c)
    seg = Segment(chain_id=c.id, idx=0, time_limit_s=3600, extra={"nodes": shapes[1], "filler": True} if shapes else {})
    submit_segment(store, slurm, c, seg)
    job = fake.jobs[str(fake.next_id - 1)]
    job.limit_s = 3600
    return fake, store, eng, c, job


def test_no_successor_once_the_payload_said_done(tmp_path):
    """A segment that finished the chain still shows as running for a moment: the lead policy is due,
    but the done marker exists, so nothing is submitted (issue 23: segment 4, one second after 3)."""
    fake, store, eng, c, job = _world(tmp_path)
    fake.start(job.id)
    fake.now += 3600 - 30 - 600 + 5  # inside the 10 min lead: the policy says submit
    fake.files[done_file(c)] = "finished at step 900\n"
    eng.tick()
    assert len(fake.jobs) == 1 and ("test", "-e", "/c/CHAINRUN_DONE") in fake.calls
    del fake.files[done_file(c)]  # without the marker the same tick submits: the marker was the reason
    eng.tick()
    assert len(fake.jobs) == 2


def test_nothing_live_and_done_completes_the_chain_instead_of_resubmitting(tmp_path):
    fake, store, eng, c, job = _world(tmp_path)
    fake.start(job.id)
    fake.now += 60
    fake.files[done_file(c)] = "done\n"
    fake.finish(job.id, "FAILED")  # it crashed after saying done (nothing in its outcome file)
    fake.now += 5
    eng.tick()
    ch = store.chain(c.id)
    assert len(fake.jobs) == 1 and ch.status == COMPLETED and "done marker" in ch.reason


def test_no_filler_successor_once_done(tmp_path):
    fake, store, eng, c, job = _world(tmp_path, shapes=(2, 1))
    fake.files[done_file(c)] = "done\n"
    fake.start(job.id)
    fake.now += 60
    eng.tick()
    assert len(fake.jobs) == 1 and store.chain(c.id).status == ACTIVE
    del fake.files[done_file(c)]
    eng.tick()
    assert len(fake.jobs) == 2  # the filler's reference successor, asked the moment it runs


def test_no_successor_once_the_work_is_reached(tmp_path):
    """Past its hand-over point a segment may still train (its signal is due, or came late) while the
    policy is due: once the work done so far is within the tolerance of --total, it is the last
    segment; nothing is submitted for the few seconds left, and it is stopped at --total."""
    fake, store, eng, c, job = _world(tmp_path)
    ch = store.chain(c.id)
    ch.credited_s = 3 * 3600 - (3600 - 30 + 100)  # 100 s more than the live segment trains to its hand-over
    store.save(ch, [])
    fake.start(job.id)
    fake.now += 3600 - 30 + 60  # 40 s of work left now: within the tolerance (60 s)
    eng.tick()
    assert len(fake.jobs) == 1 and not fake.signals
    fake.now += 45
    eng.tick()
    assert len(fake.jobs) == 1 and fake.signals == [(job.id, "USR2")]  # stopped at --total instead


# ---------------------------------------------------------------- issue 23: the plan `submit` prints
def test_submit_prints_the_plan_the_watcher_then_runs(tmp_path, capsys):
    """`5m in ~3 segment(s)` needed more with 2 min segments and a 40 s lead. The printed count is
    what the watcher does when every segment runs to its signal: driven here on the fake Slurm."""
    from chainrun.cli.chain_cmd import _print_submitted

    fake = FakeSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = Chain(id="n-0001", name="n", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=300, segment_s=120, policy="reactive", lead_s=0, signal="USR2", signal_lead_s=40, retries=1,
              sbatch_args=[], partition="short", created=time.time())
    store.add_chain(c)
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
    _print_submitted(SimpleNamespace(chain=c, first=SimpleNamespace(job_id="100"), warnings=[], policy_note="", sites=()), False)
    assert "chain n-0001: 5m in ~4 segment(s) of 2m" in capsys.readouterr().out
    for idx in range(10):  # every segment trains to its signal, checkpoints and exits
        if store.chain(c.id).status != ACTIVE:
            break
        job = fake.jobs[str(fake.next_id - 1)]
        fake.start(job.id)
        fake.now += job.limit_s - 40
        fake.files[control_path(c.run_dir, idx, "outcome")] = (
            f"outcome=continue\njob={job.id}\nexit=0\nsignaled=1\npayload_start={job.start:.0f}\n"
            f"payload_end={fake.now:.0f}\n")
        fake.finish(job.id, "COMPLETED")
        fake.now += 5
        eng.tick()
    assert store.chain(c.id).status == COMPLETED and len(fake.jobs) == 4
