"""The wait distribution of one answer: the learned quantile levels and the one monotone curve
through them that every other level and P(wait <= H) are read from.

The boosters learn QUANTILES (0.1, 0.5, 0.9, 0.95, 0.98): the band people read (p10-p90), the
median, and the upper ones the watcher acts on (0.95 / 0.98 for 24 h / 48 h segments, see
chain.policies). Between them log10 wait is piecewise linear in the normal score of q; beyond
them the tails are straight, at least TAIL_SLOPE decades per unit of normal score.
:class:`Prediction` reads the curve for one answer, :func:`prob_within_matrix` for many at once
(``model eval``); :func:`pinball` is the loss every choice of model is judged by.
"""

from __future__ import annotations

import functools
from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# every other level, and P(wait <= H), is interpolated between these (see Prediction)
QUANTILES = (0.1, 0.5, 0.9, 0.95, 0.98)
TAIL_SLOPE = 0.25  # decades of wait per unit of normal score, at least, beyond the learned levels


def qname(q: float) -> str:
    """The name of a level in meta.json and reports: 0.98 -> "p98"."""
    return f"p{int(round(q * 100))}"


@dataclass(frozen=True)
class Prediction:
    """The distribution of the wait of one request, in seconds, and which model answered.

    ``p10``/``p50``/``p90`` are kept as fields (every caller reads them); ``qs``/``values``
    are the learned quantile levels and their waits (monotone). :meth:`quantile` and
    :meth:`prob_within` read the same piecewise-linear curve of log10 wait against the
    normal score of q, so ``prob_within(quantile(q)) == q`` wherever the curve is not flat.
    A Prediction built from three numbers only (baselines, the simulator's stand-ins) uses
    the three as its curve.
    """

    p10: float
    p50: float
    p90: float
    model: str
    qs: tuple = ()
    values: tuple = ()

    def _curve(self) -> "tuple[tuple[float, ...], tuple[float, ...]]":
        # kept on the instance (outside the frozen fields): the slack rule reads one answer a few
        # hundred times per decision, and rebuilding the key tuples was most of each read
        c = self.__dict__.get("_zv")
        if c is None:
            qs, vals = (self.qs, self.values) if self.qs else ((0.1, 0.5, 0.9), (self.p10, self.p50, self.p90))
            c = self.__dict__["_zv"] = _curve_of(tuple(qs), tuple(float(x) for x in vals))
        return c

    def quantile(self, q: float) -> float:
        """Wait (s) at level q in (0, 1): the learned levels exactly, log-linear in the normal
        score between them, and a straight tail beyond (at least TAIL_SLOPE decades per unit z)."""
        from statistics import NormalDist

        if not 0.0 < q < 1.0:
            raise ValueError("q must be in (0, 1)")
        z, v = self._curve()
        x = NormalDist().inv_cdf(q)
        return float(10.0 ** max(0.0, _interp(x, z, v)))

    def prob_within(self, seconds: float) -> float:
        """P(wait <= seconds): the deadline question, from the same curve as :meth:`quantile`."""
        if float(seconds) < 1.0:
            return 0.0  # waits are counted from 1 s
        z, v = self._curve()
        x = _log(seconds)
        return float(_normal().cdf(_inverse(x, z, v)))

    def as_dict(self) -> dict:
        qs = self.qs or (0.1, 0.5, 0.9)
        vals = self.values or (self.p10, self.p50, self.p90)
        return {"model": self.model, "quantiles_s": {qname(q): float(v) for q, v in zip(qs, vals)}}


@functools.cache
def _normal():
    from statistics import NormalDist

    return NormalDist()


@functools.lru_cache(maxsize=4096)
def _curve_of(qs: tuple, vals: tuple) -> "tuple[tuple[float, ...], tuple[float, ...]]":
    """The curve of log10 wait against the normal score (cached: the `slack` rule reads one
    distribution a few hundred times per decision)."""
    from statistics import NormalDist

    nd = NormalDist()
    z = [nd.inv_cdf(q) for q in qs]
    v = [_log(x) for x in vals]
    for i in range(1, len(v)):  # monotone whatever the caller passed
        v[i] = max(v[i], v[i - 1])
    return tuple(z), tuple(v)


def _log(seconds: float) -> float:
    import math

    return math.log10(max(float(seconds), 1.0))


def _slopes(z, v):
    lo = (v[1] - v[0]) / (z[1] - z[0]) if len(z) > 1 else TAIL_SLOPE
    hi = (v[-1] - v[-2]) / (z[-1] - z[-2]) if len(z) > 1 else TAIL_SLOPE
    return max(lo, TAIL_SLOPE), max(hi, TAIL_SLOPE)


def _interp(x, z, v) -> float:
    lo, hi = _slopes(z, v)
    if x <= z[0]:
        return v[0] - (z[0] - x) * lo
    if x >= z[-1]:
        return v[-1] + (x - z[-1]) * hi
    for i in range(1, len(z)):
        if x <= z[i]:
            return v[i - 1] + (x - z[i - 1]) * (v[i] - v[i - 1]) / (z[i] - z[i - 1])
    return v[-1]


def _inverse(y, z, v) -> float:
    """The normal score at which the curve reaches log wait y (the largest, across flat parts)."""
    lo, hi = _slopes(z, v)
    if y < v[0]:
        return z[0] - (v[0] - y) / lo
    if y >= v[-1]:
        return z[-1] + (y - v[-1]) / hi
    k = bisect_right(v, y) - 1  # the last level at or below y (v is monotone)
    return z[k] + (y - v[k]) * (z[k + 1] - z[k]) / (v[k + 1] - v[k])


def _z():
    from statistics import NormalDist

    return [NormalDist().inv_cdf(q) for q in QUANTILES]


def prob_within_matrix(pred_log, h_s: float) -> "np.ndarray":
    """P(wait <= h) per row of log10 quantiles (rows x QUANTILES): the curve of
    :meth:`Prediction.prob_within`, vectorised."""
    import numpy as np
    from scipy.special import ndtr

    v = np.maximum.accumulate(np.asarray(pred_log, float), axis=1)
    z = np.asarray(_z())
    x = np.log10(max(h_s, 1.0))
    lo = np.maximum((v[:, 1] - v[:, 0]) / (z[1] - z[0]), TAIL_SLOPE)
    hi = np.maximum((v[:, -1] - v[:, -2]) / (z[-1] - z[-2]), TAIL_SLOPE)
    out = np.where(x < v[:, 0], z[0] - (v[:, 0] - x) / lo, z[-1] + (x - v[:, -1]) / hi)
    for k in range(len(z) - 1):
        inside = (v[:, k] <= x) & (x < v[:, k + 1])
        with np.errstate(invalid="ignore", divide="ignore"):
            zz = z[k] + (x - v[:, k]) * (z[k + 1] - z[k]) / (v[:, k + 1] - v[:, k])
        out = np.where(inside, zz, out)
    return ndtr(out)


def pinball(y, pred, q: float) -> float:
    """Mean pinball (quantile) loss of the level-q answers ``pred`` against ``y``."""
    import numpy as np

    d = np.asarray(y, float) - np.asarray(pred, float)
    return float(np.mean(np.maximum(q * d, (q - 1) * d)))
