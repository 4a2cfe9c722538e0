"""Elastic shapes in the whole-chain replay (issue #14): ``predicted_elastic`` asks the shipped shape
rule (chainrun.chain.shapes.choose_shape) with the watcher's per-shape waits, runs segments of the
chosen node count in the simulated scheduler, and counts their work at the shape's rate."""

import json

import pytest

from chainrun.sim.chain_replay import ChainsConfig, run_chains
from chainrun.sim.chains import ChainWork, elastic_specs
from tests.conftest import run_cli

from .tracegen import frame, sacct_dump, steady

DAY = 86400.0
H = 3600.0


class FreeNodes:
    """Stand-in model that knows the shape matters: no wait when the request fits in the nodes the
    snapshot leaves free (the chain's own live segment is not in it), else days (in ``crowded``, a
    request that does not fit waits behind a growing queue of 3-node jobs)."""

    capacity = 4
    long = 5 * 86400.0

    def __init__(self, history, until) -> None:
        pass

    def predict_many(self, requests, snapshot=None, history=None):
        from chainrun.predict import Prediction

        busy = 0 if snapshot is None else int(snapshot.loc[snapshot["state"] == "RUNNING", "nodes"].sum())
        out = []
        for r in requests:
            w = 10.0 if r.nodes <= self.capacity - busy else self.long
            out.append(Prediction(w / 2, w, w * 2, "free-nodes"))
        return out

    def predict(self, request, snapshot=None, history=None):
        return self.predict_many([request], snapshot, history)[0]


def crowded():
    """4 nodes; a stream of 3-node, 20 h jobs every 10 h keeps 3 nodes busy and a queue of them
    growing: a 2-node request waits days, a 1-node one fits at once (next to the reservation)."""
    rows, t, i = [], 0.0, 0
    while t < 14 * DAY:
        rows.append({"submit": t, "start": t, "end": t + 20 * H, "limit_s": 20 * H, "nodes": 3, "user": f"u{i % 3}"})
        t += 10 * H
        i += 1
    return frame(rows)


def cfg(**kw):
    base = dict(nodes=4, chain_nodes=(2,), chains_every_s=3 * DAY, warmup_s=2 * DAY, workers=1, priority="age",
                predictor=FreeNodes, retrain_every_s=2 * DAY, max_chains=2,
                work=ChainWork(work_s=24 * H, segment_s=12 * H), specs=elastic_specs((2, 1), (1.0, 0.8)))
    base.update(kw)
    return ChainsConfig(**base)


@pytest.fixture(scope="module")
def result():
    return run_chains(crowded(), cfg())


def test_a_long_wide_wait_takes_the_narrow_shape_and_pays_its_slowdown(result):
    pols = result.summary["chains"]["policies"]
    el, fixed = pols["predicted_elastic"], pols["predicted"]
    assert el["n"] == fixed["n"] >= 1
    assert el["chains_elastic_share"] == 1.0 and el["segments_by_nodes"].get("1", 0) >= 1
    assert fixed["mean_overhead_h"] - el["mean_overhead_h"] > 24  # days of queue for 2 nodes vs 24 h of slowdown
    assert el["mean_slowdown_h"] > 0 and fixed["mean_slowdown_h"] == 0
    for r in result.runs:
        assert r.done and not r.stuck
        # the overhead still splits exactly: queue, restarts, hand-offs and the smaller shape's slowdown
        assert r.overhead_s == pytest.approx(r.queue_s + r.restart_s + r.handoff_s + r.slow_s, abs=1e-6)
        if r.policy == "predicted":
            assert set(r.shapes) == {2}


def test_the_work_is_counted_at_the_reference_shape(result):
    """A 1-node segment does half (efficiency 1.0) or 0.4 (0.8) of the 2-node work per hour."""
    for name, rate in (("predicted_elastic", 0.5), ("predicted_elastic_eff80", 0.4)):
        runs = [r for r in result.runs if r.policy == name]
        assert runs
        for r in runs:
            if set(r.shapes) == {1}:  # every segment on 1 node: the slowdown is exact
                assert r.slow_s == pytest.approx(r.work_s * (1 / rate - 1), rel=1e-6)
    el = result.summary["chains"]["policies"]
    assert el["predicted_elastic_eff80"]["efficiency"] == 0.8
    assert el["predicted_elastic_eff80"]["mean_slowdown_h"] > el["predicted_elastic"]["mean_slowdown_h"]


def test_the_shipped_rule_decides(monkeypatch):
    """Change chainrun.chain.shapes.choose_shape and the replay's shapes change with it."""
    from chainrun.chain import shapes
    from chainrun.sim import chains

    seen = []
    real = shapes.choose_shape

    def reference_only(remaining_s, shps, waits, **kw):
        seen.append((remaining_s, shps, dict(waits), kw))
        c = real(remaining_s, shps, waits, **kw)
        return shapes.ShapeChoice(shps[0], "test: the reference", c.options)

    monkeypatch.setattr(chains, "choose_shape", reference_only)
    # the filler off: it is a second rule (tests/sim/test_elastic_filler.py)
    res = run_chains(crowded(), cfg(max_chains=1, specs=elastic_specs((2, 1), filler_margin=None)))
    assert seen and all(s[1] == (2, 1) and set(s[2]) == {1, 2} for s in seen)
    assert seen[0][2][2] > seen[0][2][1]  # the wide shape was predicted to wait longer
    assert all(set(r.shapes) == {2} for r in res.runs)


def test_vs_predicted_reports_the_issue_targets(result):
    vs = result.summary["chains"]["policies"]["predicted_elastic"]["vs_predicted"]
    levels = [lv for lv in ("low", "medium", "heavy") if vs[lv] is not None]
    assert levels
    for lv in levels:
        assert set(vs[lv]) >= {"n", "reduction", "within_5pct"}
    if vs["heavy"] is not None:
        assert "reduction_30pct" in vs["heavy"]


def test_cli_shapes_json(tmp_path, chainrun_home):
    p = tmp_path / "sacct.txt"
    p.write_text(sacct_dump(frame(steady(16, every_s=2 * H, run_s=3 * H))))
    out = run_cli("sim", "--trace", str(p), "--nodes", "2", "--chains", "--shapes", "2,1", "--efficiency", "1,0.8",
                  "--work", "24h", "--segment", "12h", "--chains-every", "3d", "--priority", "age", "--workers", "1",
                  "--json", home=chainrun_home, timeout=600)
    assert out.returncode == 0, out.stderr
    c = json.loads(out.stdout)["data"]["chains"]
    assert set(c) >= {"work_h", "segment_h", "restart_cost_min", "policies"}
    assert set(c["policies"]) == {"reactive", "predicted", "predicted_elastic", "predicted_elastic_eff80"}
    el = c["policies"]["predicted_elastic"]
    assert el["shapes"] == [2, 1] and el["efficiency"] == 1.0
    assert el["n"] == c["policies"]["predicted"]["n"] >= 1
    assert set(el["by_load"]) == {"low", "medium", "heavy"} and "vs_predicted" in el
    assert c["elastic"]["reference_nodes"] == 2 and c["elastic"]["efficiencies"] == [1.0, 0.8]


@pytest.mark.parametrize("args,fragment", [
    (["--shapes", "2,0"], "at least 1 node"),
    (["--shapes", "2,x"], "not a node count"),
    (["--shapes", "8,1"], "the partition has 4"),
    (["--shapes", "2,1", "--efficiency", "0"], "--efficiency"),
    (["--efficiency", "0.8"], "--shapes"),
])
def test_bad_shapes_are_one_line(args, fragment, tmp_path, chainrun_home):
    p = tmp_path / "sacct.txt"
    p.write_text(sacct_dump(crowded()))
    out = run_cli("sim", "--trace", str(p), "--nodes", "4", "--chains", *args, home=chainrun_home)
    assert out.returncode == 2, out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("chainrun: error")]
    assert "Traceback" not in out.stderr and len(errors) == 1 and fragment in errors[0], out.stderr
