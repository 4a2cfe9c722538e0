"""Features at time t depend only on what was known at t."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from chainrun.predict.features import FEATURES, build_features
from chainrun.predict.prep import prepare
from chainrun.predict.training import queries_of

from .predict_helpers import synthetic_history

CATS = {"partition": {"gpu": 0, "small": 1}, "qos": {"normal": 0}}


def features_at(df: pd.DataFrame, q: pd.DataFrame) -> np.ndarray:
    return build_features(q, prepare(df), capacity=16, all_users=True, categories=CATS)


def change_the_future(df: pd.DataFrame, t: float, rng) -> pd.DataFrame:
    """Every fact after t replaced: later jobs shuffled, dropped and invented; start/end
    times after t moved to other times after t (or 'not yet'), order kept start <= end."""
    d = df.copy()
    fut = d["submit"] >= t
    later = d[fut].copy()
    for c in ("user", "nodes", "timelimit_s", "partition"):
        later[c] = rng.permutation(later[c].to_numpy())
    later = later.sample(frac=0.7, random_state=int(rng.integers(1 << 30)))
    extra = later.copy()
    extra["job_id"] = extra["job_id"] + "x"
    extra["submit"] = extra["submit"] + rng.uniform(0, 3600, len(extra))
    extra["eligible"] = extra["submit"]
    extra["start"] = extra["submit"] + rng.exponential(5000, len(extra))
    extra["end"] = extra["start"] + 100
    past = d[~fut].copy()
    s, e = past["start"].to_numpy(float).copy(), past["end"].to_numpy(float).copy()
    s_fut = ~(s <= t)
    new_s = t + 1 + rng.exponential(20000, len(s))
    s = np.where(s_fut, np.where(rng.random(len(s)) < 0.2, np.nan, new_s), s)
    e_fut = ~(e <= t)
    new_e = np.fmax(s, t) + 1 + rng.exponential(20000, len(e))
    e = np.where(e_fut, np.where(np.isnan(s), np.nan, new_e), e)
    past["start"], past["end"] = s, e
    past["priority"] = rng.random(len(past))  # known only after the fact: must not matter
    return pd.concat([past, later, extra], ignore_index=True)


def with_dependency_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Chain-like successors: every third job of each user is submitted while that user's
    previous job runs and starts 10 s after it ends (what the dependency rule looks for)."""
    d = df.sort_values("submit", kind="stable").reset_index(drop=True).copy()
    for _, g in d.groupby("user"):
        idx = g.index.to_numpy()
        for a, b in zip(idx[:-1:3], idx[1::3]):
            if d.at[a, "end"] > d.at[b, "submit"]:
                run = d.at[b, "end"] - d.at[b, "start"]
                d.at[b, "start"] = d.at[a, "end"] + 10.0
                d.at[b, "end"] = d.at[b, "start"] + run
    return d


@pytest.mark.parametrize("eligible_known", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_no_leakage_from_the_future(seed, eligible_known):
    rng = np.random.default_rng(seed)
    df = synthetic_history(800, seed=seed, eligible_known=eligible_known)
    if not eligible_known:  # the path of traces without an Eligible column: the dependency guess
        df = with_dependency_runs(df)
        assert prepare(df)["dep_like"].sum() > 20
    t = float(np.quantile(df["submit"], 0.6))
    p = prepare(df)
    idx = np.flatnonzero((p["submit"] < t).to_numpy() & (p["submit"] >= t - 2 * 86400).to_numpy())
    q = queries_of(p, idx)
    # a dependency-like job's question time is re-based to its predecessor's end, maybe after t
    q = q[q["t"] < t]
    q = pd.concat([q, q.assign(t=t)], ignore_index=True)  # and everyone asking at exactly t
    before = features_at(df, q)
    after = features_at(change_the_future(df, t, rng), q)
    # atol: the running sums subtract large epoch-scaled cumsums (1e-7 node-hours of rounding)
    diff = ~np.isclose(before, after, atol=1e-5, equal_nan=True)
    assert not diff.any(), f"features that saw the future: {sorted({FEATURES[j] for j in np.flatnonzero(diff.any(axis=0))})}"


def test_the_future_is_noticed_once_it_is_the_past():
    # the guard above is not vacuous: the same change seen from after t moves features
    rng = np.random.default_rng(1)
    df = synthetic_history(800, seed=1)
    t = float(np.quantile(df["submit"], 0.6))
    p = prepare(df)
    idx = np.flatnonzero((p["submit"] > t + 0.5 * 86400).to_numpy())[:50]
    assert len(idx) == 50
    q = queries_of(p, idx)
    assert not np.allclose(features_at(df, q), features_at(change_the_future(df, t, rng), q), equal_nan=True)


def test_features_are_the_same_code_path_for_one_live_query():
    """Training features of a job equal what predict() computes from history + snapshot at its submit."""
    from chainrun.predict import WaitRequest
    from chainrun.predict.model import Predictor

    df = synthetic_history(800, seed=3)
    p = prepare(df)
    i = int(np.flatnonzero(p["submit"].to_numpy() > np.quantile(p["submit"], 0.7))[0])
    row = p.iloc[i]
    t = float(row["t_elig"])
    train = build_features(queries_of(p, [i]), p, capacity=16, all_users=True, categories=CATS)
    hist = df[(df["end"] < t)]
    snap = df[(df["submit"] < t) & ~(df["end"] < t)].copy()
    snap["state"] = np.where(snap["start"] < t, "RUNNING", "PENDING")
    pr = Predictor({}, {"capacity": 16, "all_users": True, "categories": CATS})
    live = pr.features_for(WaitRequest(user=row["user"], nodes=int(row["nodes"]), gpus=int(row["gpus"]),
                                       cpus=int(row["cpus"]), timelimit_s=float(row["timelimit_s"]),
                                       partition=row["partition"], qos=row["qos"], submit=t), snap, hist)
    # the live path keeps only 8 days of history: windows longer than that may differ
    same = [j for j, f in enumerate(FEATURES)]
    assert np.allclose(train[0, same], live[0, same], equal_nan=True), dict(
        (FEATURES[j], (train[0, j], live[0, j])) for j in same if not np.isclose(train[0, j], live[0, j], equal_nan=True))


def test_priority_is_not_a_feature():
    assert not any("prio" in f for f in FEATURES)


def test_own_jobs_only_leaves_queue_features_empty(history):
    p = prepare(history)
    X = build_features(queries_of(p, np.arange(50, 60)), p, capacity=16, all_users=False, categories=CATS)
    qcols = [j for j, f in enumerate(FEATURES) if f.startswith(("q_", "c_"))]
    assert np.isnan(X[:, qcols]).all()
    assert not np.isnan(X[:, FEATURES.index("user_pending_jobs")]).any()


def test_partition_queue_sees_only_its_partition():
    df = synthetic_history(400, seed=4)
    df["partition"] = np.where(np.arange(len(df)) % 2 == 0, "gpu", "small")
    p = prepare(df)
    t = float(np.quantile(df["submit"], 0.7))
    q = pd.DataFrame({"user": ["u1", "u1"], "t": [t, t], "nodes": [1, 1], "gpus": [4, 4], "cpus": [32, 32],
                      "timelimit_s": [3600.0, 3600.0], "partition": ["gpu", "small"], "qos": ["normal"] * 2})
    X = build_features(q, p, capacity=16, all_users=True, categories=CATS)
    j = FEATURES.index
    total = X[0, j("q_pending_jobs")]
    assert X[0, j("q_part_pending_jobs")] + X[1, j("q_part_pending_jobs")] == total
    assert X[0, j("q_part_running_nodes")] + X[1, j("q_part_running_nodes")] == X[0, j("q_running_nodes")]


@pytest.mark.parametrize("eligible_known", [True, False])
def test_a_fit_at_t_does_not_see_after_t(eligible_known):
    """Training too: targets, the dependency guess and the still-waiting calibration rows are
    taken as known at the cut; a model fit at t on two traces that differ only after t is the same."""
    from chainrun.predict import fit_predictor

    rng = np.random.default_rng(11)
    df = synthetic_history(900, seed=11, eligible_known=eligible_known)
    if not eligible_known:
        df = with_dependency_runs(df)
    t = float(np.quantile(df["submit"], 0.8))
    a = fit_predictor(df, until=t, per_user="never")
    b = fit_predictor(change_the_future(df, t, rng), until=t, per_user="never")
    assert a.meta["calibration"] == b.meta["calibration"]
    assert a.meta["training_window"] == b.meta["training_window"]
    X = features_at(df, queries_of(prepare(df), np.arange(0, 900, 7)))
    assert np.allclose(a.predict_matrix(X, ["cluster"]), b.predict_matrix(X, ["cluster"]))
