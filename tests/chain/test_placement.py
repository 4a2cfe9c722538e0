"""The straggler rule as pure functions: evidence, persistence, pardon, --no-adapt."""

from __future__ import annotations

import random

from chainrun.chain import placement, progress
from chainrun.chain.request import segment_args
from chainrun.state.records import Chain, Segment


def _chain(**extra) -> Chain:
    return Chain(id="c1", name="c1", cluster="local", script="", workdir="/w", run_dir="/r", checkpoint_dir="/k",
                 total_s=600, segment_s=120, policy="lead", lead_s=60, signal="USR2", signal_lead_s=40, retries=1,
                 sbatch_args=["--nodes=2"], partition="short", extra=dict(extra))


def _seg(idx: int, nodes: dict[str, float], rng: random.Random, steps: int = 100) -> Segment:
    ranks = {}
    for r, (node, step_s) in enumerate(nodes.items()):
        t, text = 1.7e9, ""
        for k in range(steps):
            dt = step_s * rng.lognormvariate(0, 0.1)
            t += dt
            text += progress.format_line(k, compute_s=dt, t=t)
        ranks[(r, node)] = progress.parse_lines(text)
    s = Segment(chain_id="c1", idx=idx, start=1.7e9 + idx)
    s.extra["progress"] = progress.segment_progress(ranks, read_at=0)
    return s


def test_grossly_slow_node_is_excluded_after_one_segment_and_shows_in_the_request():
    rng, c = random.Random(1), _chain()
    s0 = _seg(0, {"n1": 1.0, "n2": 0.5}, rng)
    events = placement.after_segment(c, [s0], s0)
    assert [k for _, k, _ in events] == ["adapt"] and "n1" in events[0][2] and "unexclude" in events[0][2]
    assert c.extra["adapt"]["exclude"] == ["n1"]
    assert "--exclude=n1" in segment_args(c, Segment(chain_id="c1", idx=1, time_limit_s=120))
    view = placement.excluded_view(c)
    assert view[0]["node"] == "n1" and view[0]["ratio"] > 1.9


def test_moderately_slow_node_needs_two_segments_and_healthy_noise_none():
    rng, c = random.Random(2), _chain()
    segs = []
    for i in range(2):
        s = _seg(i, {"n1": 0.575, "n2": 0.5, "n3": 0.51}, rng)
        segs.append(s)
        events = placement.after_segment(c, segs, s)
        assert bool(events) == (i == 1), (i, events)
    assert c.extra["adapt"]["exclude"] == ["n1"]
    healthy = _chain()
    segs = []
    for i in range(6):
        s = _seg(i, {"n1": 0.515, "n2": 0.5}, rng)
        segs.append(s)
        assert placement.after_segment(healthy, segs, s) == []


def test_one_node_chain_compares_segments_on_different_nodes():
    rng, c = random.Random(3), _chain()
    s0 = _seg(0, {"n3": 1.0}, rng)
    assert placement.after_segment(c, [s0], s0) == []  # nothing to compare with yet
    s1 = _seg(1, {"n4": 0.5}, rng)
    events = placement.after_segment(c, [s0, s1], s1)
    assert c.extra["adapt"]["exclude"] == ["n3"], events


def test_pardon_and_no_adapt():
    rng, c = random.Random(4), _chain()
    s0 = _seg(0, {"n1": 1.0, "n2": 0.5}, rng)
    placement.after_segment(c, [s0], s0)
    assert placement.unexclude(c, "n1", now=2e9)
    assert c.extra["adapt"]["exclude"] == [] and "n1" not in c.extra["placement"]["verdicts"]
    off = _chain(no_adapt=True)
    events = placement.after_segment(off, [s0], s0)
    assert [k for _, k, _ in events] == ["placement"] and "--no-adapt" in events[0][2]
    assert not (off.extra.get("adapt") or {}).get("exclude")


def test_too_few_steps_prove_nothing():
    rng, c = random.Random(5), _chain()
    s0 = _seg(0, {"n1": 2.0, "n2": 0.5}, rng, steps=placement.MIN_STEPS - 2)
    assert placement.after_segment(c, [s0], s0) == []


def _shared_seg(rng: random.Random) -> Segment:
    """60 steps alone at 0.5 s, then 60 steps at 0.8 s while job 900 ran on n3."""
    from chainrun.slurm.parsers import QueueRow

    row = lambda jid, nodes, start: QueueRow(jid, "u", "RUNNING", "None", 0, start, None, 60, 1, "short", "", 1, 2, 0,  # noqa: E731
                                             "", "", "x", nodes)
    t, text = 1.7e9, ""
    for k in range(120):
        dt = (0.5 if k < 60 else 0.8) * rng.lognormvariate(0, 0.05)
        t += dt
        text += progress.format_line(k, compute_s=dt, t=t)
    s = Segment(chain_id="c1", idx=0, start=1.7e9, end=t)
    placement.record_sharing(s, row("7", "n[3]", 1.7e9), [row("7", "n3", 1.7e9), row("900", "n[3-4]", 1.7e9 + 31),
                                                          row("901", "n1", 1.7e9)], now=t)
    assert list(s.extra["shared"]) == ["900"] and s.extra["shared"]["900"]["nodes"] == ["n3"]
    s.extra["progress"] = progress.segment_progress({(0, "n3"): progress.parse_lines(text)}, read_at=t,
                                                    shared=placement.sharing_windows(s))
    return s


def test_interference_asks_exclusive_when_it_costs_less_than_the_pace_lost():
    rng = random.Random(6)
    c = _chain(sbatch_args=[])
    c.segment_s = 3600
    s = _shared_seg(rng)
    events = placement.interference(c, s, lambda: 30.0)
    assert [k for _, k, _ in events] == ["adapt"] and "job(s) 900" in events[0][2], events
    assert c.extra["adapt"]["exclusive"] is True
    assert "--exclusive" in segment_args(c, Segment(chain_id="c1", idx=1, time_limit_s=120))
    dear = _chain()
    events = placement.interference(dear, s, lambda: 5000.0)
    assert [k for _, k, _ in events] == ["placement"] and "not asking" in events[0][2]
    assert not dear.extra["adapt"].get("exclusive")
    assert "would not estimate" in placement.interference(_chain(), s, lambda: None)[0][2]
