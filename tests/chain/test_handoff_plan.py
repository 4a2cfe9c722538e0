"""The adaptive hand-off's threshold: the watcher turns ``wait_instead_of_cut`` into wait windows
the wrapper compares with (fast; the bash side is in test_wrapper_ownership.py, the real-Slurm
chain in test_handoff_slurm.py)."""

from __future__ import annotations

import random
import time

from chainrun.chain import handoff_plan as hp
from chainrun.chain.engine import Engine
from chainrun.chain.handoff_rule import wait_instead_of_cut
from chainrun.chain.segments import submit_segment
from chainrun.runner.local import LocalRunner
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import ENDED, PENDING, RUNNING, SUBMITTING, Chain, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm

H = 3600.0


def test_windows_are_exactly_the_rule_on_every_whole_second():
    """Against a brute-force scan of the pure rule, on random inputs of every scale the watcher and
    the replay see (segments of minutes to days, capacities below zero, no boundary cost)."""
    rng = random.Random(11)
    for _ in range(400):
        F = rng.choice([60.0, 80.0, 300.0, 3000.0, 40000.0])
        args = dict(handoff_s=rng.choice([0.0, 20.0, 40.0, 300.0, rng.uniform(0, 500)]),
                    remaining_s=rng.uniform(-100, 5 * F), capacity_s=rng.uniform(-50, 1.5 * F),
                    full_capacity_s=F, boundary_cost_s=rng.choice([0.0, 100.0, 600.0, 4500.0, rng.uniform(0, 5000)]))
        top = rng.uniform(0, min(3 * F, 20000))
        windows = hp.wait_windows(max_wait_s=top, **args)
        assert windows == sorted(windows) and all(lo <= hi for lo, hi in windows)
        assert all(b[0] > a[1] + 1 for a, b in zip(windows, windows[1:]))  # disjoint, merged
        for w in range(int(top) + 1):
            assert hp.should_wait(w, windows) == wait_instead_of_cut(float(w), **args), (args, top, w, windows)
        assert not hp.should_wait(int(top) + 1, windows)  # never past the cap


def test_windows_for_48h_segments():
    """What the rule means for a typical chain: within the hand-off minutes of the hand-over point
    always wait; an hour early, cut, unless those minutes would push the work into one more segment,
    where waiting is worth up to one boundary (restart + hand-off + lead)."""
    full = 48 * H - 300 - 600
    common = dict(successor_capacity_s=full, full_capacity_s=full, handoff_s=300.0, restart_s=600.0, lead_s=H)
    plain = hp.windows_for(remaining_s=10 * H, **common)
    assert plain == [(0, 300)]
    assert hp.should_wait(-50, plain)  # hand-over point already passed: the owner stops on its own signal
    assert not hp.should_wait(H, plain)
    # the work left fills the successor to within 20 minutes: a successor that starts 15-20 minutes
    # early and cuts needs one more segment for the 5 minutes lost; waiting costs less than that boundary
    assert hp.windows_for(remaining_s=full - 1200, **common) == [(0, 300), (901, 1200)]
    # a short successor (200 s of training) that starts 150 s early: a cut would leave it nothing
    # to train (the hand-off takes 300 s), waiting leaves it 50 s; it never waits past its capacity
    short = hp.windows_for(remaining_s=0.0, successor_capacity_s=200.0, full_capacity_s=full, handoff_s=300.0,
                           restart_s=0.0, lead_s=H)
    assert short == [(0, 200)]


def test_rule_file_round_trip():
    text = hp.rule_text("4711", 40, [(0, 40), (100, 160)], {"remaining_s": 120.4, "handoff_s": 40.0})
    assert "for_job=4711\nsignal_lead=40\nwait=0 40\nwait=100 160\n" in text
    assert hp.parse_rule(text) == ("4711", [(0, 40), (100, 160)])
    assert hp.parse_rule("for_job=1\nwait=x 2\nwait=3\n") == ("1", [])


def _chain(tmp_path, **kw) -> Chain:
    base = dict(id="t-0001", name="t", cluster="local", script="/s", workdir="/w", run_dir=str(tmp_path / "run"),
                checkpoint_dir="/c", total_s=600, segment_s=120, policy="lead", lead_s=50, signal="USR2",
                signal_lead_s=60, retries=1, sbatch_args=[], partition="short", created=time.time())
    base.update(kw)
    return Chain(**base)


def test_measured_handoff_is_the_checkpoint_time_plus_polling(tmp_path):
    c = _chain(tmp_path)
    assert hp.measured_handoff_s(c, []) == 60.0  # nothing measured: the signal lead the user gave it
    segs = [Segment(chain_id=c.id, idx=i, phase=ENDED, extra={"signal_at": str(100 * i), "payload_end": 100 * i + d})
            for i, d in enumerate((8.0, 12.0, 10.0))]
    assert hp.measured_handoff_s(c, segs) == 10.0 + hp.POLL_S


def test_rule_written_for_a_queued_successor_and_only_rewritten_when_it_changes(tmp_path):
    c = _chain(tmp_path, total_s=6000, segment_s=600)
    cur = Segment(chain_id=c.id, idx=0, phase=RUNNING, job_id="500", time_limit_s=600, start=1000.0, end=1600.0)
    nxt = Segment(chain_id=c.id, idx=1, phase=SUBMITTING, time_limit_s=600)
    writes = []

    class Counting(LocalRunner):
        def write_file(self, path, content, mode=0o644):
            writes.append(path)
            super().write_file(path, content, mode)

    runner = Counting()
    hp.write_rule(runner, c, [cur], nxt)
    path = tmp_path / "run" / "control" / "handoff-rule.1"
    job, windows = hp.parse_rule(path.read_text())
    # segment 0 trains 540 s of the 6000: far more is left than segment 1 holds, so a cut's lost
    # minute never costs a segment: wait only within the hand-off time (the 60 s signal lead)
    assert job == "500" and windows == [(0, 60)]
    assert "signal_lead=60" in path.read_text()
    nxt.phase, nxt.job_id = PENDING, "501"
    hp.refresh(runner, c, [cur, nxt])
    assert len(writes) == 1  # nothing changed: no write
    c.credited_s = 4540  # earlier work credited: 920 s left after segment 0, segment 1 holds 540
    hp.refresh(runner, c, [cur, nxt])
    assert len(writes) == 2 and hp.parse_rule(path.read_text())[1] == [(0, 60), (101, 160)]
    nxt.phase = RUNNING  # started: it has decided; the file is left alone
    c.credited_s = 0
    hp.refresh(runner, c, [cur, nxt])
    assert len(writes) == 2


class RecordingSlurm(FakeSlurm):
    def write_file(self, path, content, mode=0o644):
        self.calls.append(("write_file", path, content))


def test_engine_writes_the_rule_before_it_submits_the_successor(tmp_path):
    """The watcher's hook: the rule file exists before sbatch runs, so a successor that starts at
    once finds it; it names the live segment's job, and the wrapper's inputs are in it."""
    fake = RecordingSlurm(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = _chain(tmp_path, total_s=200, lead_s=50, signal_lead_s=30)
    store.add_chain(c)
    s0 = submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
    fake.start(s0.job_id)
    eng.tick()
    assert not [a for a in fake.calls if a[0] == "write_file"]  # 90 s to the hand-over point: not yet
    fake.now += 45  # 45 s left < --lead 50 s: the lead policy submits segment 1
    eng.tick()
    order = [a[0] if a[0] != "sbatch" else "sbatch:" + next(x for x in a if x.startswith("--job-name=")) for a in fake.calls]
    i_write = next(i for i, a in enumerate(fake.calls) if a[0] == "write_file" and a[1].endswith("handoff-rule.1"))
    i_sbatch = order.index(f"sbatch:--job-name=cr.{c.id}.1")
    assert i_write < i_sbatch
    job, windows = hp.parse_rule(fake.calls[i_write][2])
    assert job == s0.job_id and windows and windows[0][0] == 0
    segs = store.segments(c.id)
    assert segs[1].phase == PENDING and segs[1].extra["handoff_rule"]["for_job"] == s0.job_id
    store.close()


def test_a_successor_killed_while_waiting_by_the_rule_never_trained():
    """Its time limit runs while it waits; if it ends then (its limit, scancel, kill -9, a node
    failure), its state file (phase=waiting mode=wait) makes it `unstarted`: no crash, no retry."""
    from chainrun.chain.outcomes import classify
    from tests.chain.test_outcomes import row
    from tests.chain.test_policies import chain

    waiting = {"phase": "waiting", "owner_gen": "0", "owner_job": "500", "mode": "wait", "handover_at": "1000"}
    for state in ("TIMEOUT", "FAILED", "NODE_FAIL", "CANCELLED"):
        seg = Segment(chain_id="c", idx=1, job_id="7", extra={"cancel_requested": state == "CANCELLED"})
        r = classify(chain(), seg, row(state), waiting)
        assert r.outcome == "unstarted" and r.credit_s == 0, (state, r)
    out = classify(chain(), Segment(chain_id="c", idx=1, job_id="7"), row("COMPLETED"),
                   {"outcome": "unstarted", "stopped_by": "USR2", "handoff_mode": "wait"})
    assert out.outcome == "unstarted"
