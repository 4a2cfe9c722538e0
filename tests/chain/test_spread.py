"""Topology: parsing `scontrol show topology`, switch counts, and the --switches rule (chain/spread.py)."""

from __future__ import annotations

import random

from chainrun.chain import spread
from chainrun.chain.request import segment_args
from chainrun.slurm.topology import Topology, parse_topology
from chainrun.state.records import Segment
from tests.chain.test_placement import _chain, _seg

# captured from the test cluster with scripts/start-cluster.sh's topology.conf (Slurm 22.05)
TOPOLOGY = """\
SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]
SwitchName=s2 Level=0 LinkSpeed=1 Nodes=n[3-4]
SwitchName=s0 Level=1 LinkSpeed=1 Nodes=n[1-4] Switches=s1,s2
"""


def test_parse_topology_leaf_switches():
    t = parse_topology(TOPOLOGY)
    assert t.leaf_of == {"n1": "s1", "n2": "s1", "n3": "s2", "n4": "s2"}
    assert t.switches_spanned(["n1", "n2"]) == 1
    assert t.switches_spanned(["n2", "n3"]) == 2
    assert t.switches_spanned(["n9"]) is None  # a node Slurm did not place: unknown, not a guess


def test_no_topology_plugin_means_not_reported():
    for text in ("", "No topology information available\n", "garbage = = ="):
        t = parse_topology(text)
        assert not t.reported and t.switches_spanned(["n1", "n2"]) is None


def _ended(idx, nodes_pace, switches, rng):
    s = _seg(idx, nodes_pace, rng)
    s.extra["slurm_nodes"] = sorted(nodes_pace)
    s.extra["switches"] = switches
    return s


def test_spread_slower_asks_switches_with_the_loss_as_the_bound():
    rng, c = random.Random(3), _chain()
    c.segment_s, c.signal_lead_s = 3600, 60
    s0 = _ended(0, {"n1": 0.5, "n2": 0.5}, 1, rng)
    assert spread.after_segment(c, [s0], s0) == []  # nothing to compare yet
    s1 = _ended(1, {"n2": 0.65, "n3": 0.65}, 2, rng)
    events = spread.after_segment(c, [s0, s1], s1)
    assert [k for _, k, _ in events] == ["adapt"], events
    # 30 % slower -> a spread segment of 3540 s training loses 3540 * 0.3 / 1.3 ~ 817 s
    sw = c.extra["adapt"]["switches"]
    assert sw.startswith("1@00:1") and "--switches" in events[0][2]
    assert f"--switches={sw}" in segment_args(c, Segment(chain_id="c1", idx=2, time_limit_s=3600))
    assert spread.after_segment(c, [s0, s1], s1) == []  # decided once


def test_spread_as_fast_is_noted_not_acted_on():
    rng, c = random.Random(4), _chain()
    s0 = _ended(0, {"n1": 0.5, "n2": 0.5}, 1, rng)
    s1 = _ended(1, {"n2": 0.51, "n3": 0.5}, 2, rng)
    spread.after_segment(c, [s0], s0)
    events = spread.after_segment(c, [s0, s1], s1)
    assert [k for _, k, _ in events] == ["placement"] and "not asking for --switches" in events[0][2]
    assert "switches" not in c.extra.get("adapt", {})


def test_no_adapt_and_pinned_nodes_never_change_the_request():
    rng = random.Random(5)
    c = _chain(no_adapt=True)
    s0 = _ended(0, {"n1": 0.5, "n2": 0.5}, 1, rng)
    s1 = _ended(1, {"n2": 0.8, "n3": 0.8}, 2, rng)
    spread.after_segment(c, [s0], s0)
    events = spread.after_segment(c, [s0, s1], s1)
    assert "--no-adapt" in events[0][2] and "switches" not in c.extra.get("adapt", {})
    pinned = _chain(adapt={"switches": "1@00:10:00"})
    pinned.sbatch_args = ["--nodelist=n1,n3"]
    assert not any(a.startswith("--switches") for a in segment_args(pinned, Segment(chain_id="c1", idx=1, time_limit_s=60)))


def test_unknown_switches_decide_nothing():
    rng, c = random.Random(6), _chain()
    s0 = _ended(0, {"n1": 0.5, "n2": 0.5}, None, rng)
    assert spread.after_segment(c, [s0], s0) == []
    seg = Segment(chain_id="c1", idx=0)
    seg.extra["slurm_nodes"] = ["n1", "n2"]
    spread.record_switches(seg, Topology())
    assert seg.extra["switches"] is None
    spread.record_switches(Segment(chain_id="c1", idx=1), parse_topology(TOPOLOGY))  # no nodes yet: not recorded
