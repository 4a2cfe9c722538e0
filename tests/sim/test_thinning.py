"""The thinned replay of self-tuning (chainrun/sim/thinning.py): a history over the job budget is
replayed as a seeded 1/k of its jobs, whole, on 1/k of the nodes, and the outcome says so; one
under the budget is replayed as before."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from chainrun.chain import tuned
from chainrun.sim import selftune as S
from chainrun.sim.thinning import factor, thin

from .test_rolling import DAY, SPLIT, trace
from .test_selftune import KEYS, choose


def test_a_history_over_the_budget_keeps_whole_jobs_sampled_by_seed_on_scaled_nodes():
    tr = trace().reset_index(drop=True)
    budget = len(tr) // 4 + 1
    sample, nodes, info = thin(tr, 40, 1, budget=budget, seed=3)
    k = factor(len(tr), budget)
    assert k == info["k"] == 4
    assert info["jobs"] == len(sample) == -(-len(tr) // k) and info["of_jobs"] == len(tr)
    pd.testing.assert_frame_equal(sample, tr.loc[sample.index])  # every kept job intact, in order
    assert sample.index.is_monotonic_increasing
    again, _, _ = thin(tr, 40, 1, budget=budget, seed=3)
    other, _, _ = thin(tr, 40, 1, budget=budget, seed=4)
    assert list(again.index) == list(sample.index) and list(other.index) != list(sample.index)
    assert nodes == info["nodes"] == 10 and info["of_nodes"] == 40
    assert thin(tr, 4, 3, budget=budget)[1] == 3  # never fewer than the injected chain's nodes
    assert thin(tr, 4, 1, budget=budget)[1] == max(1, int(sample["nodes"].max()))  # nor the widest kept job


def test_a_history_under_the_budget_is_not_thinned():
    tr = trace()
    same, nodes, info = thin(tr, 2, 1, budget=len(tr))
    assert same is tr and nodes == 2 and info is None


@pytest.fixture(scope="module")
def both():
    return choose(trace(), as_of=SPLIT, check_s=4 * DAY), choose(trace(), as_of=SPLIT, check_s=4 * DAY,
                                                                  job_budget=10 ** 9)


def test_under_the_budget_the_outcome_is_the_unthinned_one(both):
    default, huge = both
    assert "thinned" not in default and "thinned" not in huge
    same = [json.dumps({k: o.get(k) for k in (*KEYS, "fidelity", "nodes")}, sort_keys=True) for o in both]
    assert same[0] == same[1]  # (as JSON: a NaN Spearman is equal to itself there)


def test_a_thinned_tuning_reports_k_its_own_fidelity_and_says_so():
    tr = trace()
    budget = len(tr) // 2 + 1
    out = choose(tr, as_of=SPLIT, check_s=4 * DAY, job_budget=budget)
    sample, nodes, _ = thin(S.as_seen_at(tr, SPLIT), 2, 1, budget=budget, seed=0)
    t = out["thinned"]
    assert t["k"] == 2 and t["of_jobs"] == int((tr["submit"] < SPLIT).sum()) and t["jobs"] == -(-t["of_jobs"] // 2)
    assert out["nodes"] == t["nodes"] == nodes == max(1, int(sample["nodes"].max()))  # 2 nodes / 2, or the widest
    assert out["fidelity"]["jobs"] <= t["jobs"]  # the fidelity is the thinned replay's
    line = S.summary_line({**out, "reason": out.get("reason", ""), "put_in_force": False}, {"source": "shipped",
                                                                                           **tuned.shipped()})
    on = "1 node" if nodes == 1 else f"{nodes} nodes"
    assert f"(thinned replay: 1/2 of the {t['of_jobs']} jobs on {on})" in line
