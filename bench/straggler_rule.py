#!/usr/bin/env python3
"""The straggler rule (chain/placement.py) replayed on paces: false exclusions and detection.

Each replayed chain has N nodes per segment (2 or 4; or one node per segment, drawn from 4, for
one-node chains). Every node has a persistent offset drawn uniformly from [-3 %, +3 %] (a
spread of up to 6 % between two healthy nodes); every step's time has 10 % log-normal noise.
The paces are drawn once per scenario (seeded: the "recording"), written as progress lines,
read back through the one parser (chain/progress.py) and fed segment by segment to the same
``after_segment`` the watcher calls. Reported:

- false exclusions: the share of segments after which a healthy node was excluded (must be < 1 %);
- detection: the share of chains in which a node 15 % slower is excluded within two segments.

Run: .venv/bin/python bench/straggler_rule.py [--chains 300] [--segments 8] [--steps 50 200 500]
     [--json docs/results/straggler_rule.json]   (about 1-2 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chainrun.chain import placement, progress  # noqa: E402  (after the path line above)
from chainrun.state.records import Chain, Segment  # noqa: E402

NODES = ["n1", "n2", "n3", "n4"]
NOISE, OFFSET, SLOW = 0.10, 0.03, 0.15


def _chain() -> Chain:
    return Chain(id="bench", name="bench", cluster="local", script="", workdir="", run_dir="", checkpoint_dir="",
                 total_s=0, segment_s=0, policy="lead", lead_s=0, signal="USR2", signal_lead_s=0, retries=0,
                 sbatch_args=[], partition="")


def _progress(rng: random.Random, nodes: list[str], offsets: dict, steps: int, t0: float) -> dict:
    """One segment's progress as the watcher would read it: lines written, then parsed."""
    ranks = {}
    for r, node in enumerate(nodes):
        text, t = [], t0
        for k in range(steps):
            dt = 0.5 * (1 + offsets[node]) * rng.lognormvariate(0, NOISE)
            t += dt
            text.append(progress.format_line(k + 1, compute_s=round(dt, 6), t=t))
        ranks[(r, node)] = progress.parse_lines("".join(text))
    return progress.segment_progress(ranks, read_at=t0)


def replay(rng: random.Random, *, width: int, steps: int, segments: int, slow_node: str | None) -> dict:
    """One chain: returns the segment after which each node was excluded."""
    offsets = {n: rng.uniform(-OFFSET, OFFSET) for n in NODES}
    if slow_node:
        offsets[slow_node] = SLOW + rng.uniform(-OFFSET, OFFSET) / 3
    c, segs, excluded_at = _chain(), [], {}
    for i in range(segments):
        free = [n for n in NODES if n not in (c.extra.get("adapt") or {}).get("exclude", [])]
        if width == 1:  # a one-node chain lands on whichever node Slurm gives it
            nodes = [rng.choice(free)]
        else:
            nodes = free[:width] if len(free) >= width else free
            if slow_node and slow_node in free and slow_node not in nodes:
                nodes = nodes[:-1] + [slow_node]
        seg = Segment(chain_id="bench", idx=i, start=1e9 + 1000 * i)
        seg.extra["progress"] = _progress(rng, nodes, offsets, steps, 1e9 + 1000 * i)
        segs.append(seg)
        for _, kind, msg in placement.after_segment(c, segs, seg):
            if kind == "adapt":
                node = msg.split()[2]
                excluded_at.setdefault(node, i)
    return excluded_at


def scenario(width: int, steps: int, chains: int, segments: int, seed: int) -> dict:
    rng = random.Random(seed)
    healthy_segs = false_segs = 0
    for _ in range(chains):
        ex = replay(rng, width=width, steps=steps, segments=segments, slow_node=None)
        healthy_segs += segments
        false_segs += len(ex)
    out = {"width": width, "steps_per_segment": steps, "chains": chains, "segments": segments,
           "false_exclusion_rate": false_segs / healthy_segs}
    if width == 1:  # detection in one-node chains: one_node_latency
        return out
    found_within2 = found_ever = false_with_slow = 0
    for _ in range(chains):
        slow = rng.choice(NODES[:width])
        ex = replay(rng, width=width, steps=steps, segments=segments, slow_node=slow)
        found_ever += slow in ex
        found_within2 += ex.get(slow, 99) <= 1  # excluded after its first or second segment
        false_with_slow += len([n for n in ex if n != slow])
    return dict(out, slow_excluded_within_2_segments=found_within2 / chains, slow_excluded_ever=found_ever / chains,
                false_exclusions_beside_slow_node=false_with_slow / (chains * segments))


def one_node_latency(steps: int, chains: int, seed: int) -> dict:
    """One-node chains: segments of the slow node *after* another node showed a normal pace."""
    rng = random.Random(seed)
    lat = []
    for _ in range(chains):
        offsets = {n: rng.uniform(-OFFSET, OFFSET) for n in NODES}
        offsets["n1"] = SLOW
        c, segs, extra_on_slow, compared = _chain(), [], 0, False
        order = ["n1", "n2"] + [rng.choice(NODES) for _ in range(10)]
        for i, node in enumerate(order):
            if node in (c.extra.get("adapt") or {}).get("exclude", []):
                node = "n3"
            seg = Segment(chain_id="bench", idx=i, start=1e9 + 1000 * i)
            seg.extra["progress"] = _progress(rng, [node], offsets, steps, 1e9 + 1000 * i)
            segs.append(seg)
            placement.after_segment(c, segs, seg)
            if "n1" in (c.extra.get("adapt") or {}).get("exclude", []):
                break
            if compared and node == "n1":
                extra_on_slow += 1
            compared = compared or node != "n1"
        excluded = "n1" in (c.extra.get("adapt") or {}).get("exclude", [])
        lat.append((extra_on_slow if excluded else None, extra_on_slow >= 1 or excluded))
    found = [x for x, _ in lat if x is not None]
    ran_again = sum(1 for _, again in lat if again)
    return {"steps_per_segment": steps, "chains": chains, "excluded": len(found) / chains,
            "slow_ran_again": ran_again / chains,
            # of the chains in which the slow node got a second segment after another node showed its pace:
            # excluded by the end of that second slow segment
            "excluded_by_its_second_slow_segment": sum(1 for x in found if x <= 1) / max(1, ran_again)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", type=int, default=300)
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--steps", type=int, nargs="+", default=[50, 200, 500])
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    t0 = time.time()
    rows = []
    for steps in a.steps:
        for width in (2, 4, 1):
            r = scenario(width, steps, a.chains, a.segments, a.seed)
            rows.append(r)
            det = "" if width == 1 else (
                f"; 15 % slower node excluded within 2 segments in {r['slow_excluded_within_2_segments']*100:5.1f} % "
                f"of chains (ever: {r['slow_excluded_ever']*100:5.1f} %)")
            print(f"nodes/segment={width} steps/segment={steps:5d}: false exclusions "
                  f"{r['false_exclusion_rate']*100:5.2f} % of segments{det}", flush=True)
    one = [one_node_latency(s, a.chains // 2, a.seed) for s in a.steps]
    for r in one:
        print(f"one-node chains, steps/segment={r['steps_per_segment']:5d}: slow node excluded in {r['excluded']*100:5.1f} % "
              f"of chains (it ran again in {r['slow_ran_again']*100:5.1f} %); of those, by its second slow segment: "
              f"{r['excluded_by_its_second_slow_segment']*100:5.1f} %", flush=True)
    out = {"noise": NOISE, "offset": OFFSET, "slow": SLOW, "rule": {k: getattr(placement, k) for k in (
        "MIN_STEPS", "SLOW_RATIO", "Z_MIN", "PERSIST", "GROSS_RATIO", "GROSS_Z")}, "multi_node": rows,
        "one_node": one, "seconds": round(time.time() - t0, 1)}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"({out['seconds']} s)")


if __name__ == "__main__":
    main()
