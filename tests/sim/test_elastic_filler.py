"""The filler in the whole-chain replay: ``predicted_elastic`` asks the shipped
``chainrun.chain.shapes.choose_filler`` when nothing of the chain is live; a filler's reference
successor is submitted the moment it starts and cuts it when it starts."""

import pytest

from chainrun.sim.chain_replay import ChainsConfig, run_chains
from chainrun.sim.chains import ChainWork, elastic_specs

from .tracegen import frame

DAY = 86400.0
H = 3600.0


class QuietModel:
    """Stand-in queue model that predicts (almost) no wait: Slurm's simulated ``--test-only``
    answer (every job to its limit), the later of the two, decides."""

    def __init__(self, history, until) -> None:
        pass

    def predict_many(self, requests, snapshot=None, history=None):
        from chainrun.predict import Prediction

        return [Prediction(5.0, 10.0, 20.0, "quiet") for _ in requests]

    def predict(self, request, snapshot=None, history=None):
        return self.predict_many([request], snapshot, history)[0]


def busy_three_of_four():
    """4 nodes; every 12 h a 3-node job holds 3 nodes for 6 h (its limit): a chain injected an
    hour into one waits 5 h for 2 nodes while 1 node is free at once."""
    rows = [{"submit": k * 12 * H, "start": k * 12 * H, "end": k * 12 * H + 6 * H, "limit_s": 6 * H, "nodes": 3,
             "user": f"u{k % 3}"} for k in range(int(14 * DAY // (12 * H)))]
    return frame(rows)


def cfg(**kw):
    base = dict(nodes=4, chain_nodes=(2,), chains_every_s=3 * DAY, warmup_s=2 * DAY + H, workers=1, priority="age",
                predictor=QuietModel, retrain_every_s=2 * DAY, max_chains=2,
                work=ChainWork(work_s=24 * H, segment_s=12 * H), specs=elastic_specs((2, 1), filler_margin=6.0))
    base.update(kw)
    return ChainsConfig(**base)


@pytest.fixture(scope="module")
def result():
    return run_chains(busy_three_of_four(), cfg())


def test_the_first_segment_fills_the_reference_wait_and_hands_off(result):
    el = [r for r in result.runs if r.policy == "predicted_elastic"]
    fixed = [r for r in result.runs if r.policy == "predicted"]
    assert el and len(el) == len(fixed)
    for r, p in zip(el, fixed):
        assert r.done and not r.stuck and p.done
        # fixed shape: the first segment waits ~5 h for 2 nodes
        assert p.first_wait_s == pytest.approx(5 * H, abs=120)
        # elastic: a 1-node filler starts at once, then the 2-node reference takes over when it starts
        assert r.fillers == 1 and r.shapes[:2] == [1, 2], r.shapes
        assert r.first_wait_s < 120
        # the hand-off cut the filler (no adaptive wait): one boundary with a cut, the hand-off minutes paid
        assert r.boundaries[0][0] < 0 and r.handoff_s > 0
        # instead of a 5 h wait: the filler trained ~5 h (less its restart) at half rate, the other half
        # of that time is its slowdown; then one hand-off
        assert r.slow_s == pytest.approx(0.5 * (5 * H - 600), abs=120)
        assert r.handoff_s == pytest.approx(300, abs=60)
        assert r.overhead_s < p.overhead_s - 2 * H
        # the overhead still splits exactly (the filler's slowdown is a part of it)
        assert r.overhead_s == pytest.approx(r.queue_s + r.restart_s + r.handoff_s + r.slow_s, abs=1e-6)
    pols = result.summary["chains"]["policies"]
    assert pols["predicted_elastic"]["mean_overhead_h"] < pols["predicted"]["mean_overhead_h"] - 2


def test_the_shipped_filler_rule_decides(monkeypatch):
    """Change chainrun.chain.shapes.choose_filler and the replay's fillers change with it; and a
    spec with the filler off never runs one."""
    from chainrun.sim import chains

    seen = []
    monkeypatch.setattr(chains, "choose_filler", lambda *a, **kw: seen.append((a, kw)))
    res = run_chains(busy_three_of_four(), cfg(max_chains=1, specs=elastic_specs((2, 1), filler_margin=6.0)))
    assert seen and all(a[0] == (2, 1) and set(a[1]) == {1, 2} for a, _ in seen)
    assert all(r.fillers == 0 for r in res.runs)
    monkeypatch.undo()
    off = run_chains(busy_three_of_four(), cfg(max_chains=1, specs=elastic_specs((2, 1), filler_margin=None)))
    assert all(r.fillers == 0 and r.shapes[0] == 2 for r in off.runs)
