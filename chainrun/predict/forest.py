"""A quantile regression forest kept as LightGBM text + JSON (no pickle).

LightGBM grows the forest (``boosting="rf"``: bagged, unshrunk trees on log10 wait); the
answer is Meinshausen's: the distribution of the training waits in the leaves a request
reaches, each tree's leaf weighted equally -- not the spread of the trees' means. Each leaf's
wait distribution is kept as its CDF on a grid of log10 wait (GRID_STEP decades, from 1 s to
10**GRID_TOP s), one byte a point, base64 in ``meta.json``. Quantiles are read off the
averaged CDF, interpolated inside a grid step.
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
        self.tables = tables  # (trees, leaves, grid) float32: P(log wait <= grid[j]) in each leaf

    @classmethod
    def fit(cls, X, y, *, params: dict | None = None, trees: int = TREES, feature_names=None) -> "LeafForest":
        import lightgbm as lgb

        prm = {**PARAMS, **(params or {})}
        prm["min_data_in_leaf"] = min(prm["min_data_in_leaf"], max(2, len(y) // 20))
        ds = lgb.Dataset(X, y, feature_name=list(feature_names) if feature_names else "auto", params={"verbose": -1})
        booster = lgb.train(prm, ds, num_boost_round=trees)
        return cls(booster, _tables(booster, X, y))

    def cdf(self, X) -> "np.ndarray":
        """(rows x grid) averaged leaf CDFs."""
        import numpy as np

        leaves = np.asarray(self.booster.predict(X, pred_leaf=True, num_threads=1), int).reshape(len(X), -1)
        out = np.zeros((len(X), self.tables.shape[2]))
        for t in range(leaves.shape[1]):
            out += self.tables[t][leaves[:, t]]
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

    def encode(self) -> dict:
        import base64

        import numpy as np

        u8 = np.round(np.clip(self.tables, 0.0, 1.0) * 255).astype(np.uint8)
        return {"grid_step": GRID_STEP, "grid_top": GRID_TOP, "shape": list(u8.shape),
                "cdf_u8_base64": base64.b64encode(u8.tobytes()).decode("ascii")}

    @classmethod
    def decode(cls, booster, blob: dict) -> "LeafForest":
        import base64

        import numpy as np

        if blob.get("grid_step") != GRID_STEP or blob.get("grid_top") != GRID_TOP:
            raise ValueError("forest grid differs from this chainrun's")
        u8 = np.frombuffer(base64.b64decode(blob["cdf_u8_base64"]), dtype=np.uint8).reshape(blob["shape"])
        return cls(booster, u8.astype(np.float32) / 255.0)


def _tables(booster, X, y) -> "np.ndarray":
    import numpy as np

    g = grid()
    leaves = np.asarray(booster.predict(X, pred_leaf=True, num_threads=1), int).reshape(len(X), -1)
    n_leaves = int(leaves.max()) + 1 if leaves.size else 1
    ybin = np.clip(np.searchsorted(g, np.asarray(y, float) - 1e-9, side="left"), 0, len(g) - 1)
    tables = np.zeros((leaves.shape[1], n_leaves, len(g)), np.float32)
    for t in range(leaves.shape[1]):
        h = np.zeros((n_leaves, len(g)))
        np.add.at(h, (leaves[:, t], ybin), 1.0)
        c = np.cumsum(h, axis=1)
        tables[t] = c / np.maximum(c[:, -1:], 1.0)
    # one byte a point, as saved: the model in memory answers exactly like the one loaded
    return (np.round(tables * 255) / 255).astype(np.float32)
