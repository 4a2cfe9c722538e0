"""chainrun's one quantile regression forest: Meinshausen's, read off per-leaf CDF tables.

The answer is the distribution of the training waits in the leaves a request reaches, each
tree's leaf weighted equally -- not the spread of the trees' means. Each leaf's wait
distribution is kept as its CDF on a grid of log10 wait (GRID_STEP decades, from 1 s to
10**GRID_TOP s), one byte a point. Quantiles and P(wait <= H) are read off the averaged CDF,
linear inside a grid step.

Two growers feed the same tables and the same reading:
- ``LeafForest``: LightGBM grows the trees (``boosting="rf"``: bagged, unshrunk trees on
  log10 wait). This is the model kind ``forest``, saved as LightGBM text + the tables base64
  in ``meta.json`` (no pickle).
- ``SklearnLeafForest``: scikit-learn's RandomForestRegressor grows them (bootstrap, grown
  down to ``min_samples_leaf``): the random-forest baseline of ``chainrun model eval``
  (Mirage's model), never saved. Needs the ``eval`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

GRID_STEP = 0.1
GRID_TOP = 7.0  # 10**7 s = 116 days
# features drawn per split, not per tree (``feature_fraction_bynode``), as scikit-learn's
# max_features does in the quantile-regression-forest baseline
PARAMS = {
    "boosting": "rf", "objective": "regression", "bagging_fraction": 0.632, "bagging_freq": 1,
    "feature_fraction": 1.0, "feature_fraction_bynode": 0.6, "num_leaves": 255, "min_data_in_leaf": 20,
    "num_threads": 1, "verbose": -1,
    "seed": 7, "deterministic": True,
}
TREES = 100


def grid() -> "np.ndarray":
    import numpy as np

    return np.round(np.arange(0.0, GRID_TOP + 1e-9, GRID_STEP), 6)


class LeafForest:
    def __init__(self, booster, tables: "np.ndarray") -> None:
        self.booster = booster  # lightgbm.Booster, boosting=rf
        self.tables = tables  # (trees, leaves, grid) uint8: 255 * P(log wait <= grid[j]) in each leaf

    @classmethod
    def fit(cls, X, y, *, params: dict | None = None, trees: int = TREES, feature_names=None) -> "LeafForest":
        import lightgbm as lgb

        prm = {**PARAMS, **(params or {})}
        prm["min_data_in_leaf"] = min(prm["min_data_in_leaf"], max(2, len(y) // 20))
        ds = lgb.Dataset(X, y, feature_name=list(feature_names) if feature_names else "auto", params={"verbose": -1})
        booster = lgb.train(prm, ds, num_boost_round=trees)
        f = cls(booster, None)
        f.tables = _tables(f.leaves(X), y)
        return f

    def leaves(self, X) -> "np.ndarray":
        """(rows x trees) the row of ``tables[t]`` each request reaches in tree t."""
        import numpy as np

        return np.asarray(self.booster.predict(X, pred_leaf=True, num_threads=1), int).reshape(len(X), -1)

    def cdf(self, X) -> "np.ndarray":
        """(rows x grid) averaged leaf CDFs."""
        import numpy as np

        leaves = self.leaves(X)
        out = np.zeros((len(X), self.tables.shape[2]))
        for t in range(leaves.shape[1]):
            out += self.tables[t][leaves[:, t]].astype(np.float32) / 255.0
        return out / max(leaves.shape[1], 1)

    def quantiles(self, X, levels) -> "np.ndarray":
        """(rows x levels) log10 waits, linear inside the grid step where the CDF crosses."""
        import numpy as np

        c = self.cdf(X)
        g = grid()
        out = np.empty((len(X), len(levels)))
        rows = np.arange(len(X))
        for k, lv in enumerate(levels):
            j = np.argmax(c >= lv - 1e-9, axis=1)
            j = np.where((c >= lv - 1e-9).any(axis=1), j, len(g) - 1)
            lo = np.where(j > 0, c[rows, np.maximum(j - 1, 0)], 0.0)
            hi = c[rows, j]
            frac = np.where(hi > lo, (lv - lo) / np.where(hi > lo, hi - lo, 1.0), 1.0)
            out[:, k] = np.where(j == 0, 0.0, g[np.maximum(j - 1, 0)] + np.clip(frac, 0.0, 1.0) * GRID_STEP)
        return out

    def prob_within(self, X, horizons_s) -> "np.ndarray":
        """(rows x horizons) P(wait <= H): the averaged CDF at log10 H, linear inside a grid step
        (the inverse of :meth:`quantiles`)."""
        import numpy as np

        c = self.cdf(X)
        g = grid()
        out = np.empty((len(X), len(horizons_s)))
        for k, h in enumerate(horizons_s):
            x = min(np.log10(max(float(h), 1.0)), GRID_TOP)
            j = min(int(np.floor(x / GRID_STEP + 1e-9)), len(g) - 2)
            frac = min(max((x - g[j]) / GRID_STEP, 0.0), 1.0)
            out[:, k] = c[:, j] + frac * (c[:, j + 1] - c[:, j])
        return out

    def encode(self) -> dict:
        import base64

        return {"grid_step": GRID_STEP, "grid_top": GRID_TOP, "shape": list(self.tables.shape),
                "cdf_u8_base64": base64.b64encode(self.tables.tobytes()).decode("ascii")}

    @classmethod
    def decode(cls, booster, blob: dict) -> "LeafForest":
        import base64

        import numpy as np

        if blob.get("grid_step") != GRID_STEP or blob.get("grid_top") != GRID_TOP:
            raise ValueError("forest grid differs from this chainrun's")
        u8 = np.frombuffer(base64.b64decode(blob["cdf_u8_base64"]), dtype=np.uint8).reshape(blob["shape"])
        return cls(booster, u8)


class SklearnLeafForest(LeafForest):
    """The ``model eval`` baseline: scikit-learn grows the trees, the tables and the reading are
    :class:`LeafForest`'s. Never saved (scikit-learn trees have no LightGBM text)."""

    def __init__(self, rf, leaf_row: "np.ndarray", tables: "np.ndarray") -> None:
        super().__init__(None, tables)
        self.rf = rf  # sklearn.ensemble.RandomForestRegressor
        self.leaf_row = leaf_row  # (trees, nodes) node id -> row of tables[t] (leaves only)

    @classmethod
    def fit(cls, X, y, *, n_estimators: int, min_samples_leaf: int, max_features: float,
            seed: int = 7) -> "SklearnLeafForest":
        import numpy as np
        from sklearn.ensemble import RandomForestRegressor

        rf = RandomForestRegressor(n_estimators=n_estimators, min_samples_leaf=min_samples_leaf,
                                   max_features=max_features, n_jobs=1, random_state=seed)
        rf.fit(_no_nan(X), y)
        # node ids run over inner nodes too: number the leaves 0.. so a table has one row a leaf
        trees = [e.tree_ for e in rf.estimators_]
        leaf_row = np.zeros((len(trees), max(t.node_count for t in trees)), np.int64)
        for k, t in enumerate(trees):
            is_leaf = t.children_left == -1
            leaf_row[k, :t.node_count] = np.cumsum(is_leaf) - 1
        f = cls(rf, leaf_row, None)
        f.tables = _tables(f.leaves(X), y)
        return f

    def leaves(self, X) -> "np.ndarray":
        import numpy as np

        nodes = self.rf.apply(_no_nan(X))
        return self.leaf_row[np.arange(nodes.shape[1]), nodes]

    def encode(self) -> dict:
        raise TypeError("the scikit-learn forest is a baseline of model eval; it is never saved")


def _no_nan(X) -> "np.ndarray":
    # scikit-learn before 1.4 refuses NaN; -1 sits below every feature's range
    import numpy as np

    return np.nan_to_num(np.asarray(X, float), nan=-1.0)


def _tables(leaves: "np.ndarray", y) -> "np.ndarray":
    """(trees, leaves, grid) uint8 CDF tables of the training waits ``y`` (log10 s) per leaf."""
    import numpy as np

    g = grid()
    n_leaves = int(leaves.max()) + 1 if leaves.size else 1
    ybin = np.clip(np.searchsorted(g, np.asarray(y, float) - 1e-9, side="left"), 0, len(g) - 1)
    tables = np.zeros((leaves.shape[1], n_leaves, len(g)), np.uint8)
    for t in range(leaves.shape[1]):
        h = np.zeros((n_leaves, len(g)))
        np.add.at(h, (leaves[:, t], ybin), 1.0)
        c = np.cumsum(h, axis=1)
        # one byte a point, as saved: the model in memory answers exactly like the one loaded
        # (the float32 step before the rounding is the one the format was written with)
        tables[t] = np.round((c / np.maximum(c[:, -1:], 1.0)).astype(np.float32) * 255)
    return tables
