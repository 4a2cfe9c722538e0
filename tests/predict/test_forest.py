"""chainrun's one quantile regression forest (chainrun/predict/forest.py): two growers, one reading."""

from __future__ import annotations

import numpy as np
import pytest

from chainrun.predict.forest import GRID_STEP, LeafForest, SklearnLeafForest


def _two_regimes(n=700, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.random((n, 3))
    y = np.where(X[:, 0] > 0.5, rng.normal(4.0, 0.5, n), rng.normal(1.5, 0.5, n)).clip(0)
    return X, y


def _grown(kind, X, y):
    if kind == "lightgbm":
        return LeafForest.fit(X, y, params={"min_data_in_leaf": 10}, trees=20)
    return SklearnLeafForest.fit(X, y, n_estimators=20, min_samples_leaf=10, max_features=1.0)


@pytest.mark.parametrize("kind", ["lightgbm", "sklearn"])
def test_probability_is_the_inverse_of_the_quantiles(kind):
    """P(wait <= H) read at a quantile's own value gives back its level: the CDF and the quantiles
    are one curve (linear inside a grid step), whoever grew the trees."""
    X, y = _two_regimes()
    f = _grown(kind, X, y)
    Q = np.array([[0.9, 0.5, 0.5], [0.1, 0.5, 0.5], [0.5, 0.1, 0.9]])
    levels = (0.1, 0.5, 0.9)
    q = f.quantiles(Q, levels)
    for i in range(len(Q)):
        p = f.prob_within(Q[i:i + 1], [10 ** v for v in q[i]])[0]
        assert p == pytest.approx(levels, abs=1e-6)
    # every answer stays on the grid's range and is monotone in H
    p = f.prob_within(Q, [1.0, 60.0, 600.0, 3600.0, 86400.0, 1e9])
    assert np.all(np.diff(p, axis=1) >= -1e-12) and np.all((p >= 0) & (p <= 1 + 1e-9))
    assert np.allclose(p[:, -1], 1.0)


def test_tables_are_one_byte_a_point_and_the_saved_forest_answers_the_same():
    X, y = _two_regimes()
    f = LeafForest.fit(X, y, params={"min_data_in_leaf": 10}, trees=20)
    assert f.tables.dtype == np.uint8 and f.tables.shape[2] == round(7.0 / GRID_STEP) + 1
    g = LeafForest.decode(f.booster, f.encode())
    Q = X[:50]
    assert np.array_equal(g.quantiles(Q, (0.1, 0.5, 0.98)), f.quantiles(Q, (0.1, 0.5, 0.98)))
    assert np.array_equal(g.prob_within(Q, [600.0, 3600.0]), f.prob_within(Q, [600.0, 3600.0]))


def test_sklearn_leaves_are_numbered_per_tree():
    """scikit-learn numbers inner nodes too; each leaf gets one table row, and a training row's
    leaf is the one scikit-learn's apply gives."""
    X, y = _two_regimes(400)
    f = SklearnLeafForest.fit(X, y, n_estimators=5, min_samples_leaf=20, max_features=1.0)
    leaves = f.leaves(X)
    nodes = f.rf.apply(X)
    for t, est in enumerate(f.rf.estimators_):
        n_leaves = int((est.tree_.children_left == -1).sum())
        assert leaves[:, t].max() < n_leaves <= f.tables.shape[1]
        # one table row per node reached, and distinct nodes get distinct rows
        assert len(np.unique(leaves[:, t])) == len(np.unique(nodes[:, t]))
