"""Elastic segments through the real engine on the in-memory Slurm (fast, no cluster).

The fake answers `sbatch --test-only` with a start time per node count, as Slurm does when some
nodes are held by a long job: the engine must pick the shape that finishes the work first, count
the segment's training at that shape's rate, and say why (segment extra, event, status note).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from chainrun.chain.engine import Engine, segment_rate, trained_so_far, work_done
from chainrun.chain.segments import submit_segment
from chainrun.chain.summary import view_chain
from chainrun.runner.base import RunResult
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import ENDED, RUNNING, Chain, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import FakeSlurm


@dataclass
class ShapeSlurm(FakeSlurm):
    """FakeSlurm whose `sbatch --test-only` answers "starts in ``delay[nodes]`` seconds"; its `cat`
    serves the files in ``files`` (the wrapper's state files)."""

    delay: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    test_only_nodes: list = field(default_factory=list)

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        argv = tuple(str(a) for a in argv)
        if argv[:2] == ("sbatch", "--test-only"):
            self.calls.append(argv)
            n = int(next(a.split("=", 1)[1] for a in argv if a.startswith("--nodes=")))
            self.test_only_nodes.append(n)
            at = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.now + self.delay.get(n, 0)))
            return RunResult(argv, 0, "", f"sbatch: Job 999 to start at {at} using {n} processors on nodes "
                                          f"n1 in partition short\n", 0.0)
        if argv[0] == "cat" and argv[-1] in self.files:
            self.calls.append(argv)
            return RunResult(argv, 0, self.files[argv[-1]], "", 0.0)
        return super().run(argv, timeout, env=env, stdin=stdin)


def world(tmp_path, *, shapes=(4, 2), total_s=600, policy="reactive", efficiency=None, no_adapt=False,
          delay=None, time_min_s=None, filler_margin=None):
    fake = ShapeSlurm(now=time.time(), delay=dict(delay or {}))
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    extra = {"partition_nodes": 4, "shapes": list(shapes),
             "shape_efficiency": {str(k): v for k, v in (efficiency or {}).items()}}
    if no_adapt:
        extra["no_adapt"] = True
    if time_min_s:
        extra["time_min_s"] = time_min_s
    if filler_margin is not None:  # `submit --filler N`
        extra["filler_margin"] = filler_margin
    c = Chain(id="el-0001", name="el", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=total_s, segment_s=1200, policy=policy, lead_s=60, signal="USR2", signal_lead_s=30, retries=1,
              sbatch_args=[], partition="short", created=time.time(), extra=extra)
    store.add_chain(c)
    first = Segment(chain_id=c.id, idx=0, time_limit_s=600, extra={"nodes": shapes[0]})
    submit_segment(store, slurm, c, first)
    return fake, store, eng, c


def run_segment(fake: ShapeSlurm, seg: Segment, seconds: float) -> None:
    """The segment's job starts now, its payload trains ``seconds`` and checkpoints on the signal."""
    fake.start(seg.job_id)
    t0 = fake.now
    fake.now += seconds + 5
    fake.files[f"/r/control/seg-{seg.idx}.outcome"] = (
        f"outcome=continue\njob={seg.job_id}\nsignaled=1\npayload_start={t0 + 5}\npayload_end={t0 + 5 + seconds}\n")
    fake.finish(seg.job_id, "COMPLETED")


def test_the_next_segment_takes_the_shape_that_finishes_first(tmp_path):
    # 4 nodes start only in 40 min (a long job holds two of them); 2 nodes start now
    fake, store, eng, c = world(tmp_path, delay={4: 2400, 2: 0})
    (s0,) = store.segments(c.id)
    run_segment(fake, s0, 300)
    eng.tick()
    segs = store.segments(c.id)
    assert len(segs) == 2
    s1 = segs[1]
    assert s1.extra["nodes"] == 2
    assert "--nodes=2" in s1.extra["request"]
    assert sorted(fake.test_only_nodes) == [2, 4]  # asked once per shape, while planning only
    # 300 s of 600 done at 4 nodes; 300 reference-seconds left at rate 0.5: 600 s of training + the lead
    assert s1.time_limit_s == 660
    reason = s1.extra["shape"]["reason"]
    assert reason.startswith("2 nodes: start in ~0 min") and "4 nodes: start in ~40 min" in reason
    assert {o["nodes"]: o["wait_source"] for o in s1.extra["shape"]["options"]} == {4: "test-only", 2: "test-only"}
    events = [e for _, e in store.events(c.id) if e.kind == "shape"]
    assert len(events) == 1 and "asks for 2 nodes instead of 4" in events[0].message
    # status shows the shape and why
    v = view_chain(store.chain(c.id), store.segments(c.id), now=fake.now)
    assert [sv.shape_nodes for sv in v.segment_views] == [4, 2]
    assert "shape 2 nodes: start in ~0 min" in v.segment_views[1].note
    from rich.console import Console

    from chainrun.cli import tables

    lines = tables.detail_lines(v, 120)
    assert any("shape=4N" in ln for ln in lines) and any("shape=2N" in ln for ln in lines)
    con = Console(width=220, record=True)
    con.print(tables.chain_detail(v))
    assert "shape" in con.export_text()
    # so does report (its --json and its table rows)
    from chainrun.cli.report_cmd import _detail_rows
    from chainrun.report.timeline import summarize

    summ = summarize(v)
    assert [(x["segment"], x["nodes"]) for x in summ["shapes"]] == [(0, 4), (1, 2)]
    assert ("segment 1 shape", reason) in _detail_rows(summ)
    # no more test-only calls on quiet ticks
    fake.now += 10
    eng.tick()
    assert len(fake.test_only_nodes) == 2


def test_work_at_another_shape_counts_at_its_rate(tmp_path):
    fake, store, eng, c = world(tmp_path, delay={4: 2400, 2: 0}, efficiency={2: 0.9})
    (s0,) = store.segments(c.id)
    run_segment(fake, s0, 300)
    eng.tick()
    s1 = store.segments(c.id)[1]
    assert s1.extra["nodes"] == 2
    # rate 0.5 x 0.9 = 0.45: 300 reference-seconds need 667 s of training -> 12 min with the lead
    assert s1.time_limit_s == 720
    run_segment(fake, s1, 400)
    eng.tick()
    ch = store.chain(c.id)
    segs = store.segments(c.id)
    assert segs[1].extra["rate"] == pytest.approx(0.45)
    assert segs[1].extra["work_s"] == pytest.approx(180)
    assert ch.credited_s == pytest.approx(300 + 180)
    v = view_chain(ch, segs, now=fake.now)
    assert v.done_s == pytest.approx(480)


def test_measured_pace_per_shape_replaces_the_efficiency(tmp_path):
    fake, store, eng, c = world(tmp_path, delay={4: 2400, 2: 0}, efficiency={2: 0.5})
    (s0,) = store.segments(c.id)
    run_segment(fake, s0, 300)
    eng.tick()
    segs = store.segments(c.id)
    # the chain measured 10 steps/s on 4 nodes and 8 steps/s on 2: rate 0.8, whatever the user guessed
    segs[0].extra["progress"] = {"steps_per_s": 10.0, "step": 3000}
    segs[1].extra["progress"] = {"steps_per_s": 8.0, "step": 3100}
    assert segment_rate(c, segs[1], segs) == pytest.approx(0.8)


def test_no_adapt_keeps_the_reference_shape(tmp_path):
    fake, store, eng, c = world(tmp_path, delay={4: 2400, 2: 0}, no_adapt=True)
    (s0,) = store.segments(c.id)
    run_segment(fake, s0, 300)
    eng.tick()
    s1 = store.segments(c.id)[1]
    assert s1.extra["nodes"] == 4 and "--no-adapt" in s1.extra["shape"]["reason"]
    assert fake.test_only_nodes == []  # nothing asked: nothing to choose
    assert not [e for _, e in store.events(c.id) if e.kind == "shape"]


def test_a_small_saving_keeps_the_reference_shape(tmp_path):
    # 4 nodes wait 100 s, 2 nodes start now but need twice the training: the reference wins (and a
    # filler would gain 0.5 x (100 - 30) s, less than its margin: none)
    fake, store, eng, c = world(tmp_path, total_s=1200, delay={4: 100, 2: 0})
    (s0,) = store.segments(c.id)
    run_segment(fake, s0, 300)
    eng.tick()
    s1 = store.segments(c.id)[1]
    assert s1.extra["nodes"] == 4 and "(reference)" in s1.extra["shape"]["reason"]


def test_time_min_goes_to_each_segment_and_a_shorter_grant_is_planned_around(tmp_path):
    fake, store, eng, c = world(tmp_path, shapes=(4,), total_s=1200, time_min_s=180, policy="lead")
    (s0,) = store.segments(c.id)
    assert "--time-min" not in s0.extra["request"]  # segment 0 came from submit (create_chain sets it there)
    fake.start(s0.job_id)
    fake.jobs[s0.job_id].limit_s = 240  # Slurm started it with 4 min of the 10 asked (--time-min)
    fake.files["/r/control/seg-0.state"] = f"phase=training\njob={s0.job_id}\npayload_start={fake.now + 20}\n"
    fake.now += 160
    eng.tick()
    segs = store.segments(c.id)
    assert segs[0].extra["granted_s"] == 240
    assert segs[0].extra["payload_start"] == pytest.approx(fake.now - 140)
    # the lead policy (1 min) submits once the granted end is near (its hand-over in 50 s), not the asked
    # one (8 min away)
    assert len(segs) == 2, "the successor is planned around the real (shortened) end"
    s1 = segs[1]
    assert "--time-min=0-00:03:00" in s1.extra["request"]
    # sized to take over: 1200 - 140 s trained so far (from the payload start, not the job start)
    assert s1.time_limit_s == 1140  # 1060 s left + the 30 s lead, in Slurm's whole minutes
    assert "granted 4m" in view_chain(store.chain(c.id), segs, now=fake.now).segment_views[0].note


def test_trained_so_far_counts_from_the_payload_start():
    s = Segment(chain_id="x", idx=1, phase=RUNNING, start=1000.0, time_limit_s=600)
    assert trained_so_far(s, 1100) == 100  # nothing known: the job's start
    s.extra["handoff_waiting"] = True
    assert trained_so_far(s, 1100) == 0  # known to wait for the hand-off: not training yet
    s.extra["payload_start"] = 1060.0
    assert trained_so_far(s, 1100) == 40


def test_work_done_is_credited_plus_running_at_rate():
    c = Chain(id="w", name="w", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
              total_s=3600, segment_s=600, policy="lead", lead_s=60, signal="USR2", signal_lead_s=30, retries=1,
              sbatch_args=[], partition="short", credited_s=500, extra={"shapes": [4, 2]})
    ended = Segment(chain_id="w", idx=0, phase=ENDED, extra={"nodes": 4, "rate": 1.0})
    run = Segment(chain_id="w", idx=1, phase=RUNNING, start=1000.0, extra={"nodes": 2, "payload_start": 1000.0})
    assert work_done(c, [ended, run], 1200) == pytest.approx(500 + 200 * 0.5)
    c.extra = {}  # one shape: training is work
    assert work_done(c, [ended, run], 1200) == pytest.approx(700)


@pytest.mark.parametrize("ref, nodes, gpn, want", [
    (4, 2, 2, {"CHAINRUN_NODES": "2", "CHAINRUN_GPUS": "4", "CHAINRUN_REF_NODES": "4", "CHAINRUN_REF_GPUS": "8",
               "CHAINRUN_GPUS_PER_NODE": "2"}),
    (None, 2, 0, {"CHAINRUN_NODES": "2", "CHAINRUN_GPUS": "0", "CHAINRUN_REF_NODES": "2", "CHAINRUN_REF_GPUS": "0"}),
])
def test_the_wrapper_exports_the_segment_and_reference_shapes(tmp_path, ref, nodes, gpn, want):
    import os
    import subprocess

    from chainrun.chain.contract import render_wrapper, token_text

    (tmp_path / "run" / "control").mkdir(parents=True)
    (tmp_path / "run" / "control" / "token").write_text(token_text("c1"))  # as submit writes it
    payload = tmp_path / "payload.sh"
    payload.write_text(f"#!/bin/bash\nenv | grep ^CHAINRUN_ > {tmp_path}/env.txt\n")
    payload.chmod(0o755)
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(render_wrapper(chain_id="c1", run_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ck"),
                                      payload=str(payload), signal="USR2", script_text="", ref_nodes=ref))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CHAINRUN_"))}
    env.update({"SLURM_JOB_NUM_NODES": str(nodes), **({"SLURM_GPUS_ON_NODE": str(gpn)} if gpn else {})})
    p = subprocess.run(["bash", str(wrapper), "0"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    got = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines())
    assert {k: got.get(k) for k in want} == want


def test_the_model_is_asked_once_for_every_shape_and_its_median_used(tmp_path):
    from chainrun.chain.prediction import _shape_waits
    from chainrun.predict.distribution import Prediction
    from chainrun.slurm.parsers import QueueRow

    class Model:  # the queue-delay model's interface: one predict_many call for all shapes
        def __init__(self):
            self.calls = []

        def predict_many(self, reqs, snapshot, history):
            self.calls.append(reqs)
            return [Prediction(10.0 * r.nodes, 100.0 * r.nodes, 1000.0 * r.nodes, "m") for r in reqs]

    fake, store, eng, c = world(tmp_path)
    (s0,) = store.segments(c.id)
    mine = QueueRow(job_id=s0.job_id, user="ann", state="RUNNING", reason="None", submit=1.0, start=2.0, end=None,
                    time_limit_s=600.0, elapsed_s=1.0, partition="short", qos="normal", nodes=4, cpus=8, gpus=8,
                    dependency="", comment="", name="cr.el-0001.0")
    model = Model()
    waits = _shape_waits(model, None, c, s0, [mine], [4, 2])
    assert waits == {4: 400.0, 2: 200.0}  # the median
    (reqs,) = model.calls
    assert [(r.nodes, r.gpus, r.cpus, r.user) for r in reqs] == [(4, 8, 8, "ann"), (2, 4, 4, "ann")]

    # through the engine: the model's waits beside Slurm's test-only answers, the later one counts
    def predictor(chain, seg, rows):
        return None

    predictor.shape_waits = lambda chain, seg, rows, shapes: {4: 3000.0, 2: 5.0}
    eng.predictor = predictor
    fake.delay = {4: 60, 2: 30}
    run_segment(fake, s0, 300)
    eng.tick()
    s1 = store.segments(c.id)[1]
    opts = {o["nodes"]: o for o in s1.extra["shape"]["options"]}
    assert (opts[4]["wait_s"], opts[4]["wait_source"]) == (3000.0, "model+test-only")
    assert opts[2]["wait_s"] == pytest.approx(30, abs=2) and s1.extra["nodes"] == 2
