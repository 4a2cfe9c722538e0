"""Predictor: fit, predict, save/load round trip, refusals, speed."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from chainrun.errors import ModelError
from chainrun.predict import Prediction, WaitRequest, fit_predictor, load_predictor
from chainrun.predict import training as train_mod
from chainrun.predict.distribution import QUANTILES, pinball
from chainrun.predict.features import FEATURES

from .predict_helpers import synthetic_history


def _live(df, t):
    hist = df[df["end"] < t]
    snap = df[(df["submit"] < t) & ~(df["end"] < t)].copy()
    snap["state"] = np.where(snap["start"] < t, "RUNNING", "PENDING")
    return snap, hist


@pytest.fixture(scope="module")
def fitted():
    df = synthetic_history(900, seed=5)
    return df, fit_predictor(df)


def test_predict_orders_quantiles_and_names_model(fitted):
    df, pr = fitted
    t = float(df["submit"].iloc[-1]) + 60
    snap, hist = _live(df, t)
    p = pr.predict(WaitRequest(user="u1", nodes=2, gpus=8, cpus=64, timelimit_s=3600, partition="gpu", submit=t), snap, hist)
    assert isinstance(p, Prediction) and p.model == "cluster"
    assert 0 < p.p10 <= p.p50 <= p.p90
    assert p.quantile(0.5) == pytest.approx(p.p50)
    qs = [p.quantile(q) for q in (0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.98, 0.99)]
    assert qs == sorted(qs) and qs[1] == pytest.approx(p.p10) and qs[5] == pytest.approx(p.p90)
    # the upper levels are learned, not stretched: the answer carries them
    assert p.qs == QUANTILES and qs[7] == pytest.approx(p.values[p.qs.index(0.98)])


def test_deadline_probability_is_the_same_curve(fitted):
    df, pr = fitted
    t = float(df["submit"].iloc[-1]) + 60
    snap, hist = _live(df, t)
    p = pr.predict(WaitRequest(user="u1", nodes=1, gpus=4, cpus=0, timelimit_s=3600, submit=t), snap, hist)
    hs = [1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400]
    ps = [p.prob_within(h) for h in hs]
    assert ps == sorted(ps) and 0 <= ps[0] and ps[-1] <= 1
    for q in (0.5, 0.9, 0.95, 0.98):
        v = p.quantile(q)
        if v > 1.5:
            assert p.prob_within(v) == pytest.approx(q, abs=1e-9)
    assert p.prob_within(0.5) == 0.0


def test_calibration_shifts_are_saved_and_used(fitted, tmp_path):
    df, pr = fitted
    cal = pr.meta["calibration"]["cluster"]
    assert set(cal) == {"p10", "p50", "p90", "p95", "p98"}
    w = pr.meta["training_window"]
    assert w["boosters_rows"] + w["calibration_rows"] == w["rows"] and w["calibration_rows"] >= 50
    X = pr.features_for(WaitRequest(user="u1", nodes=1, gpus=4, cpus=0, timelimit_s=3600,
                                    submit=float(df["submit"].iloc[-1])), None, df)
    a, b = pr.predict_matrix(X, ["cluster"]), pr.predict_matrix(X, ["cluster"], calibrated=False)
    assert not np.allclose(a, b)


def test_km_quantile_counts_waits_that_have_not_ended():
    from chainrun.predict.calibration import km_quantile

    v = np.arange(10.0)
    assert km_quantile(v, np.ones(10, bool), 0.5) == 4.0
    # the five largest are only lower bounds at 5: the median can only be reached among them
    obs = v < 5
    assert km_quantile(np.r_[v[:5], [5.0] * 5], obs, 0.9) == 5.0


def test_predict_many_shapes(fitted):
    df, pr = fitted
    t = float(df["submit"].iloc[-1]) + 60
    snap, hist = _live(df, t)
    reqs = [WaitRequest(user="u1", nodes=n, gpus=4 * n, cpus=0, timelimit_s=3600, submit=t) for n in (1, 2, 4)]
    many = pr.predict_many(reqs, snap, hist)
    assert [m.p50 for m in many] == [pr.predict(r, snap, hist).p50 for r in reqs]


def test_round_trip_is_exact_and_has_no_pickle(fitted, tmp_path):
    df, pr = fitted
    pr.save(tmp_path / "m")
    files = sorted(f.name for f in (tmp_path / "m").iterdir())
    assert all(f.endswith((".txt", ".json")) for f in files), files
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    assert meta["features"] == list(FEATURES)
    assert {"chainrun", "lightgbm"} <= set(meta["versions"]) and meta["training_window"]["rows"] > 0
    assert set(meta["train_metrics"]) == {"p10", "p50", "p90", "p95", "p98"}
    back = load_predictor(tmp_path / "m")
    t = float(df["submit"].iloc[-1]) + 60
    snap, hist = _live(df, t)
    for u in ("u0", "u3", "newcomer"):
        req = WaitRequest(user=u, nodes=1, gpus=4, cpus=32, timelimit_s=4 * 3600, submit=t)
        assert back.predict(req, snap, hist) == pr.predict(req, snap, hist)


def test_load_refuses_other_feature_list(fitted, tmp_path):
    _, pr = fitted
    d = pr.save(tmp_path / "m")
    meta = json.loads((d / "meta.json").read_text())
    meta["features"] = meta["features"][:-1] + ["some_new_feature"]
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="different feature list") as e:
        load_predictor(d)
    assert "refresh" in str(e.value)


def test_load_refuses_missing_and_corrupt(fitted, tmp_path):
    with pytest.raises(ModelError, match="no queue-delay model"):
        load_predictor(tmp_path / "nothing")
    _, pr = fitted
    d = pr.save(tmp_path / "m")
    (d / "cluster_p50.txt").write_text("not a model")
    with pytest.raises(ModelError, match="cannot load"):
        load_predictor(d)


def test_per_user_models_and_cold_start(monkeypatch):
    monkeypatch.setattr(train_mod, "MIN_USER_ROWS", 40)
    df = synthetic_history(900, seed=2, users=4)
    pr = fit_predictor(df, per_user="always")
    assert pr.meta["user_models"] and all(f"user:{u}" in pr.boosters for u in pr.meta["user_models"])
    u = sorted(pr.meta["user_models"])[0]
    t = float(df["submit"].iloc[-1]) + 60
    snap, hist = _live(df, t)
    assert pr.predict(WaitRequest(user=u, nodes=1, gpus=4, cpus=0, timelimit_s=3600, submit=t), snap, hist).model == f"user:{u}"
    assert pr.predict(WaitRequest(user="brand-new", nodes=1, gpus=4, cpus=0, timelimit_s=3600, submit=t), snap, hist).model == "cluster"
    never = fit_predictor(df, per_user="never")
    assert list(never.boosters) == ["cluster"]


def test_too_little_history_is_a_clear_error():
    with pytest.raises(ModelError, match="started jobs to learn from"):
        fit_predictor(synthetic_history(15))


def test_one_prediction_is_fast(fitted):
    df, pr = fitted
    t = float(df["submit"].iloc[-1]) + 60
    snap, hist = _live(df, t)
    req = WaitRequest(user="u2", nodes=1, gpus=4, cpus=32, timelimit_s=3600, submit=t)
    pr.predict(req, snap, hist)
    best = min(_timed(pr.predict, req, snap, hist) for _ in range(7))
    assert best < 0.05, f"{best * 1000:.0f} ms"


def test_fit_is_fast_enough_for_the_simulator():
    df = synthetic_history(5000, seed=9, users=40)
    t0 = time.perf_counter()
    fit_predictor(df)
    assert time.perf_counter() - t0 < 10.0  # ~1-2 s here


def _timed(f, *a):
    t = time.perf_counter()
    f(*a)
    return time.perf_counter() - t


def test_predict_with_nothing_known(fitted):
    """A cold start: no snapshot, no history (or empty frames) still answers."""
    df, pr = fitted
    t = float(df["submit"].iloc[-1]) + 60
    req = WaitRequest(user="nobody", nodes=1, gpus=4, cpus=0, timelimit_s=3600, submit=t)
    a = pr.predict(req)
    b = pr.predict(req, df.iloc[:0], df.iloc[:0])
    assert a == b and 0 < a.p10 <= a.p50 <= a.p90
    snap = df.tail(10).copy()
    snap["state"] = "PENDING"
    assert pr.predict(req, snap, None).p50 > 0


def test_forest_kind_round_trip_without_pickle(tmp_path):
    """The quantile-forest kind: a LightGBM rf booster (text) + leaf CDF tables (JSON)."""
    df = synthetic_history(900, seed=5)
    pr = fit_predictor(df, kind="forest")
    assert pr.meta["kind"] == "forest" and set(pr.meta["calibration"]["cluster"]) == {"p10", "p50", "p90", "p95", "p98"}
    t = float(df["submit"].iloc[-1]) + 60
    snap, hist = _live(df, t)
    req = WaitRequest(user="u1", nodes=1, gpus=4, cpus=0, timelimit_s=3600, submit=t)
    p = pr.predict(req, snap, hist)
    assert p.qs == QUANTILES and list(p.values) == sorted(p.values) and p.values[0] >= 1.0
    d = pr.save(tmp_path / "f")
    assert sorted(f.name for f in d.iterdir()) == ["cluster_forest.txt", "meta.json"]
    assert load_predictor(d).predict(req, snap, hist) == p


def test_forest_reads_the_leaves_waits():
    from chainrun.predict.forest import LeafForest

    rng = np.random.default_rng(0)
    X = rng.random((800, 3))
    y = np.where(X[:, 0] > 0.5, rng.normal(4.0, 0.3, 800), rng.normal(1.0, 0.3, 800)).clip(0)
    f = LeafForest.fit(X, y, params={"min_data_in_leaf": 10}, trees=30)
    q = f.quantiles(np.array([[0.9, 0.5, 0.5], [0.1, 0.5, 0.5]]), (0.1, 0.5, 0.9))
    assert np.all(np.diff(q, axis=1) >= 0)
    assert 3.5 < q[0, 1] < 4.5 and 0.5 < q[1, 1] < 1.5
    assert q[0, 2] - q[0, 0] > 0.4  # the spread of the leaves' waits (sd 0.3: ~0.77 from q10 to q90)


def test_refit_learns_the_calibration_rows_and_keeps_their_shifts():
    """REFIT: the shifts are measured by a model that did not see the recent rows; the shipped
    model is then fit on every started row, so it has learned the recent ones too."""
    from chainrun.predict.features import build_features, log_wait
    from chainrun.predict.prep import default_since, prepare

    df = synthetic_history(900, seed=5)
    on, off = fit_predictor(df, per_user="never", refit=True), fit_predictor(df, per_user="never", refit=False)
    assert on.meta["refit"] is True and off.meta["refit"] is False
    assert on.meta["calibration"] == off.meta["calibration"]  # measured the same way, before the refit
    p = prepare(df)
    idx = train_mod.training_rows(p, since=default_since(p), until=None)
    late = idx[p["t_elig"].to_numpy(float)[idx] >= on.meta["training_window"]["calibration_from"]]
    X = build_features(train_mod.queries_of(p, late), p, capacity=on.meta["capacity"], all_users=on.meta["all_users"],
                       categories=on.meta["categories"])
    y = log_wait(p["wait"].to_numpy(float)[late])

    def loss(pr):
        out = pr.predict_matrix(X, ["cluster"], calibrated=False)
        return np.mean([pinball(y, out[:, j], q) for j, q in enumerate(QUANTILES)])

    assert len(late) >= 50 and loss(on) < loss(off)


def test_status_says_the_model_was_refit(tmp_path, monkeypatch, capsys):
    from chainrun.cli.main import main

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    fit_predictor(synthetic_history(900, seed=5), per_user="never").save(tmp_path / "models" / "local")
    assert main(["model", "status", "--cluster", "local", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["model"]["refit"] is True
    assert main(["model", "status", "--cluster", "local"]) == 0
    assert "then refit on every job" in " ".join(capsys.readouterr().out.split())
