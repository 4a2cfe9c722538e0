"""``chainrun model eval``: the JSON interface external checks read, and its metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chainrun.cli.main import main
from chainrun.predict.evaluate import metrics


def _probs(pred, obs=None):
    from chainrun.predict.distribution import prob_within_matrix
    from chainrun.predict.evaluate import HORIZONS

    return {h: prob_within_matrix(pred, hs) for h, hs in HORIZONS.items()}


def _rates(v):
    from chainrun.predict.evaluate import HORIZONS

    return {h: v for h in HORIZONS}


def test_metrics_small_wait_rule_coverage_ties_and_never_started():
    y = np.log10([10.0, 30.0, 1000.0, 1000.0, 1.0, 5.0])
    obs = np.array([True, True, True, True, True, False])  # the last one never started
    base = np.log10([[1, 50, 100, 150, 200], [40, 100, 200, 300, 400], [100, 1900, 5000, 6000, 7000],
                     [1, 2100, 3000, 4000, 5000], [1, 1, 10, 20, 30], [1, 1, 10, 20, 30]])
    m = metrics(y, obs, base, _probs(base), _rates(0.5))
    # 10 vs 50: both under 60 s -> hit; 30 vs 100 -> miss; 1000 vs 1900 -> hit; 1000 vs 2100 -> miss; 1 vs 1 hit
    assert m["within_2x"] == 0.6 and m["n_test"] == 5 and m["n_never_started"] == 1
    # q50: below in rows 1, 2, 3, 4 (10<50, 30<100, 1000<1900, 1000<2100), a tie at the floor (half), never started 0
    assert m["calibration"]["q50"] == round(4.5 / 6, 4)
    assert set(m["pinball"]) == {"p10", "p50", "p90", "p95", "p98"}
    assert set(m["deadline"]) == {"10m", "1h", "6h", "24h"}
    assert m["deadline"]["10m"]["brier_skill"] is not None


def test_probability_matrix_matches_the_prediction_object():
    from chainrun.predict import Prediction
    from chainrun.predict.distribution import QUANTILES, prob_within_matrix

    vals = (1.0, 30.0, 4000.0, 9000.0, 40000.0)
    p = Prediction(vals[0], vals[1], vals[2], "x", QUANTILES, vals)
    row = np.log10([vals])
    for h in (1.0, 10.0, 600.0, 3600.0, 20000.0, 86400.0, 10 * 86400.0):
        assert prob_within_matrix(row, h)[0] == pytest.approx(p.prob_within(h), abs=1e-9)


def test_deadline_answer_at_one_half_is_the_median_rule():
    """P(wait <= H) >= 0.5 exactly when q50 <= H: the deadline accuracy at 0.5 depends on the
    median alone (docs/model.md, "Why deadline accuracy stops short of the target"); the curve's shape
    between levels moves the Brier score, not the accuracy."""
    from chainrun.predict.distribution import QUANTILES, prob_within_matrix

    rng = np.random.default_rng(1)
    v = np.sort(rng.uniform(0, 6, (5000, len(QUANTILES))), axis=1)
    v[:500, 0] = 0.0  # waits at the 1 s floor, as for many real jobs
    v[:100, 1] = 0.0
    j50 = QUANTILES.index(0.5)
    for h in (600.0, 3600.0, 21600.0):
        p = prob_within_matrix(v, h)
        assert np.array_equal(p >= 0.5, v[:, j50] <= np.log10(h))


def test_quantile_forest_uses_leaf_waits():
    """The baseline is chainrun's one quantile forest (chainrun/predict/forest.py) on trees grown
    by scikit-learn: the answer is the waits in the leaves reached, not the trees' means."""
    from chainrun.predict.forest import SklearnLeafForest
    from chainrun.predict.distribution import QUANTILES

    rng = np.random.default_rng(0)
    X = rng.random((600, 3))
    X[::7, 2] = np.nan  # scikit-learn before 1.4 refuses NaN; features have them
    y = np.where(X[:, 0] > 0.5, rng.normal(4.0, 0.3, 600), rng.normal(1.0, 0.3, 600)).clip(0)
    f = SklearnLeafForest.fit(X, y, n_estimators=20, min_samples_leaf=10, max_features=1.0)
    Q = np.array([[0.9, 0.5, 0.5], [0.1, 0.5, np.nan]])
    q, pw = f.quantiles(Q, QUANTILES), f.prob_within(Q, [3600.0])
    assert np.all(np.diff(q, axis=1) >= 0)
    j50 = QUANTILES.index(0.5)
    assert 3.3 < q[0, j50] < 4.7 and 0.3 < q[1, j50] < 1.7  # medians of each regime's leaf waits
    assert q[0, -1] - q[0, j50] > 0.3  # a spread of the waits, not of tree means
    assert pw[0, 0] < 0.3 and pw[1, 0] > 0.9
    with pytest.raises(TypeError):
        f.encode()  # a baseline, never saved


def test_eval_json_on_a_slice_of_the_real_trace(ls6_slice, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    rc = main(["model", "eval", "--trace", str(ls6_slice), "--train-until", "2023-01-05",
               "--test-until", "2023-01-20", "--refit-every", "5d", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    env = json.loads(out)
    assert env["command"] == "model eval" and "schema" in env
    res = env["data"]
    assert set(res) >= {"models", "train", "test", "without_dependency_rule", "deadline_baselines"}
    assert res["test"]["refit_every_h"] == 120 and res["test"]["refits"] == 3
    assert res["notes"] == []  # scikit-learn is here (the test extra): the random forest ran
    for name in ("lightgbm", "user_median", "global_median", "random_forest"):
        m = res["models"][name]
        assert set(m) >= {"within_2x", "mae_log10", "pinball", "coverage_p10_p90", "n_test", "calibration", "deadline",
                          "sharpness_log10_q50_q98"}
        assert set(m["calibration"]) >= {"q50", "q90", "q95", "q98"}
        assert set(m["deadline"]) == {"10m", "1h", "6h", "24h"}
        assert set(m["deadline"]["1h"]) >= {"accuracy", "brier"}
        assert m["n_test"] == res["test"]["n"] > 100
        assert 0 <= m["within_2x"] <= 1 and 0 <= m["coverage_p10_p90"] <= 1
    assert res["without_dependency_rule"]["n"] == res["test"]["n"] + res["test"]["excluded_dependency_like"]
    # warm-up comes from the data: first start of the slice + 7 days
    assert res["train"]["warmup_until"].startswith("2022-12-0")
    assert res["test"]["from"] >= "2023-01-05"


def test_eval_bad_input_is_one_line(ls6_slice, capsys):
    assert main(["model", "eval", "--trace", str(ls6_slice), "--train-until", "yesterday", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--train-until" in err
    assert main(["model", "eval", "--trace", str(ls6_slice), "--train-until", "2023-01-10",
                 "--test-until", "2023-01-01"]) == 2


def test_eval_table_fits_a_terminal(ls6_slice, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    rc = main(["model", "eval", "--trace", str(ls6_slice), "--train-until", "2023-01-05", "--test-until", "2023-01-12",
               "--refit-every", "7d", "--no-forest"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [ln for ln in out.splitlines() if ln.startswith(("lightgbm ", "user_median", "global_median"))]
    assert len(rows) == 3 and all(len(ln) <= 80 for ln in rows) and "random_forest" not in out


def test_eval_reads_what_sim_reads_compressed_and_built_in(ls6_slice, capsys, tmp_path, monkeypatch):
    """One trace reader for every --trace: `model eval` takes .gz/.xz files and built-in names
    as `sim` does, and a broken archive is a one-line error."""
    import gzip

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    gz = tmp_path / "slice.log.gz"
    gz.write_bytes(gzip.compress(ls6_slice.read_bytes()))
    rc = main(["model", "eval", "--trace", str(gz), "--train-until", "2023-01-05", "--test-until", "2023-01-12",
               "--refit-every", "7d", "--no-forest", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert json.loads(out)["data"]["test"]["n"] > 100
    bad = tmp_path / "broken.log.xz"
    bad.write_bytes(b"not an xz archive")
    assert main(["model", "eval", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read trace" in err
    # the built-in trace is found (the error is about the window, not the file)
    assert main(["model", "eval", "--trace", "ls6-a100-dev", "--train-until", "2030-01-01"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" not in err and "--test-until" in err
