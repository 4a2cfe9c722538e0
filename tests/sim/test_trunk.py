"""The shared trunks (chainrun/sim/trunk.py) change no replayed chain: every policy's chain, and
the rolling evaluation's JSON, are the same with the policies at a point sharing the replay as
with each one replaying its own partition from the injection (the straightforward path)."""

import json
import math
from dataclasses import astuple, replace

from chainrun.sim import rolling as R
from chainrun.sim.chain_replay import run_chains
from chainrun.sim.chains import ChainWork, PolicySpec, default_specs
from chainrun.sim.jsonsafe import finite

from .test_chains import cfg
from .test_rolling import run as rolling_run
from .test_rolling import trace as rolling_trace
from .tracegen import T0, frame, steady

DAY = 86400.0
H = 3600.0


def mixed():
    # three nodes: a steady stream of 1-node jobs, 2-node jobs of other users, and 3-node bursts, so
    # queues form and clear, fair share reorders them and the policies' decisions differ
    rows = steady(24, every_s=2 * H, run_s=3 * H, users=4) + \
        [dict(r, nodes=2, user=f"w{i % 3}") for i, r in enumerate(steady(24, every_s=5 * H, run_s=4 * H))]
    for d in range(2, 24, 3):
        rows += [{"submit": d * DAY + i * 600, "start": d * DAY + i * 600, "end": d * DAY + i * 600 + 6 * H,
                  "limit_s": 8 * H, "nodes": 3, "user": "burst"} for i in range(2)]
    rows.sort(key=lambda r: r["submit"])
    return frame(rows)


def specs():
    grid = R.grid(24 * H)
    # both rules, every share, both floors, two costs; the fixed leads, the references, the others
    pick = [s for s in grid if s.cost_s in (3600.0, 10800.0)]
    return pick + R.fixed_specs() + [s for s in default_specs() if s.name in ("reactive", "oracle", "avg",
                                                                              "dependency", "predicted_cut")]


def rows(runs):
    # every field of every chain; nan (not started, not finished) compared as None
    return [tuple(None if isinstance(v, float) and math.isnan(v) else v for v in astuple(r)) for r in runs]


def test_every_chain_is_the_same_with_and_without_shared_trunks():
    c = cfg(nodes=3, chain_nodes=(1, 2), chains_every_s=2 * DAY, priority="fairshare", specs=specs(),
            work=ChainWork(work_s=60 * H, segment_s=24 * H, oracle_step_s=1800.0), inject_from=T0 + 3 * DAY)
    shared = run_chains(mixed(), c)
    alone = run_chains(mixed(), replace(c, share=False))
    assert len(shared.runs) == len(alone.runs) > 100
    assert rows(shared.runs) == rows(alone.runs)
    assert shared.meta["cost"]["trunk_hits"] > 0 and alone.meta["cost"]["trunk_hits"] == 0
    # the chains did differ between policies (else sharing would be trivially right)
    assert len({r.finish for r in shared.runs if r.done}) > 10
    assert sum(r.done for r in shared.runs) > 0.8 * len(shared.runs)


def test_the_rolling_json_is_the_same_with_and_without_shared_trunks():
    def json_of(share):
        out = rolling_run(rolling_trace(), inject_from=T0 + 5 * DAY, share=share)
        out = json.loads(json.dumps(finite(out)))
        for k in ("cost", "seconds"):  # what it took, not what it computed
            out["meta"].pop(k)
        return out

    a, b = json_of(True), json_of(False)
    assert a == b
    assert a["chains"]["policies"]["predicted"]["n"] > 0


def test_a_kept_state_is_never_changed_by_the_chain_that_continues_from_it():
    from chainrun.sim.scheduler import Scheduler
    from chainrun.sim.trunk import Trunk

    jobs = [(float(i * 600), i, 1, 7200.0, 5000.0, -1) for i in range(40)]
    t = Trunk()
    a = t.advance(Scheduler(2, jobs), (), 6000.0)
    kept = t.kept[()][-1][2]
    before = (kept.now, list(kept.pending), list(kept.running), kept.free, kept.ai)
    b = t.advance(Scheduler(2, jobs), (), 9000.0)  # continues from the kept state, on a copy
    b.submit(10_000, 1, 3600.0, 3600.0)
    assert t.hits == 1 and b is not kept and a is not kept
    assert (kept.now, list(kept.pending), list(kept.running), kept.free, kept.ai) == before
    alone = Scheduler(2, jobs)
    alone.run_until(9000.0)
    alone.submit(10_000, 1, 3600.0, 3600.0)
    assert (b.now, b.pending, sorted(b.running), b.free, b.ai) == \
        (alone.now, alone.pending, sorted(alone.running), alone.free, alone.ai)


def test_a_stop_changes_no_chain_done_before_it_and_ends_the_others_after_it():
    # the self-tuning follows no chain past its as_of (ChainsConfig.stop_at): a chain that ends
    # before the stop is replayed field for field as without it; every other one ends at or after it
    c = cfg(nodes=3, chain_nodes=(1, 2), chains_every_s=2 * DAY, priority="fairshare", specs=specs(),
            work=ChainWork(work_s=60 * H, segment_s=24 * H, oracle_step_s=1800.0), inject_from=T0 + 3 * DAY)
    free = run_chains(mixed(), c)
    ends = sorted(r.ended for r in free.runs)
    for stop in (ends[len(ends) // 4] + 1234.0, ends[len(ends) // 2] + 37.0, ends[3 * len(ends) // 4] - 500.0):
        capped = run_chains(mixed(), replace(c, stop_at=stop))
        assert len(free.runs) == len(capped.runs)
        before = [i for i, r in enumerate(free.runs) if r.ended < stop]
        after = [i for i, r in enumerate(free.runs) if r.ended >= stop]
        assert len(before) > 10 and len(after) > 10  # both kinds are exercised
        assert rows([free.runs[i] for i in before]) == rows([capped.runs[i] for i in before]), stop
        assert all(capped.runs[i].ended >= stop for i in after)
        # and the stop saved replay: the chains cut short held fewer segments
        assert sum(len(capped.runs[i].shapes) for i in after) < sum(len(free.runs[i].shapes) for i in after)
