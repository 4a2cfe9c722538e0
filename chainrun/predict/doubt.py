"""How sure a queue-delay answer may be: widened by what the model has not seen, and leaning
on Slurm's own estimate where its history says nothing about the live queue.

A model trained on 29 jobs of an idle test cluster answered "1 s, 100 % within 1 h" while
every CPU was busy and 4 jobs pended (issue 24): it had never seen a queue, and its quantiles
came from 29 waits. Two rules, both from first principles, none tuned on a scored window:

1. **Widen by the history's size.** A quantile learned from n waits is uncertain by the
   binomial spread of the rank it sits at: the level-q answer is read at the one-sided 95 %
   bound of that rank, q +/- Z * sqrt(q (1 - q) / n) (up for levels above the median, down
   below it), on the model's own curve (``Prediction.quantile``). On a cluster with thousands
   of training jobs this moves nothing (q0.98 with 10 000 jobs: read at 0.982); with 29 jobs
   q0.9 is read at 0.99. A level whose bound passes n / (n + 1), the highest level n waits can
   vouch for (split-conformal rank), is *beyond the history*: the history is **short** for
   the levels the watcher acts on when q0.98's bound is (under ``rows_backing()`` training jobs).
2. **Lean on Slurm where the model is out of its depth**: the history is short, or the live
   queue is busier than anything in it (a load feature above its training maximum, or the
   free-node share below its minimum: trees answer such a queue like the busiest one they saw).
   Then the median is at least Slurm's own expected wait -- ``sbatch --test-only`` for this
   request where it was asked (``chainrun predict``), else the latest ``squeue --start`` of the
   jobs pending ahead of it in its partition (the watcher, from the squeue rows it has) -- and
   the levels above the median grow from it at the curve's least tail slope (TAIL_SLOPE decades
   per unit of normal score, the rule the curve already uses beyond its learned levels). Levels
   below the median stay the model's (widened): jobs end before their limits, and Slurm's plan
   assumes they do not.

Everything here is pure (numbers in, numbers out); the Slurm calls live in
``chainrun.predict.service`` and ``chainrun.chain.prediction``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Callable

from chainrun.predict.distribution import TAIL_SLOPE, Prediction

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from chainrun.slurm.parsers import QueueRow

Z = NormalDist().inv_cdf(0.95)  # one-sided 95 % bound on the rank of a quantile learned from n waits
ACTED_LEVEL = 0.98  # the highest level the watcher acts on (chain.policies.MAX_TARGET)
# live queue features that only grow with load: a value above the training maximum is a queue the
# model has never seen; q_free_nodes_frac is the one that shrinks with load
LOAD_FEATURES = ("q_pending_jobs", "q_pending_nodes", "q_pending_nodeh", "q_backlog_h", "q_running_nodes_frac",
                 "q_part_pending_jobs", "q_part_pending_nodes", "q_part_pending_nodeh")
FREE_FEATURES = ("q_free_nodes_frac",)
LABELS = {"q_pending_jobs": "pending jobs", "q_pending_nodes": "pending nodes", "q_pending_nodeh": "pending node-hours",
          "q_backlog_h": "backlog hours", "q_running_nodes_frac": "running share of nodes",
          "q_part_pending_jobs": "pending jobs in the partition", "q_part_pending_nodes": "pending nodes in the partition",
          "q_part_pending_nodeh": "pending node-hours in the partition", "q_free_nodes_frac": "free-node share"}
_ORDER = {f: i for i, f in enumerate(("q_pending_jobs", "q_free_nodes_frac", "q_part_pending_jobs", "q_backlog_h"))}
# pending for the queue itself (not a hold, a dependency or a limit): ahead of a new job
QUEUE_REASONS = ("Priority", "Resources", "None", "")


def feature_ranges(X: "np.ndarray", names: "tuple[str, ...]") -> dict:
    """{feature: [min, max]} over the training rows, for the load features (saved in meta.json)."""
    import numpy as np

    out = {}
    for f in (*LOAD_FEATURES, *FREE_FEATURES):
        col = X[:, names.index(f)]
        col = col[~np.isnan(col)]
        if len(col):
            out[f] = [float(col.min()), float(col.max())]
    return out


def read_level(q: float, n: int) -> float:
    """The level at which a quantile learned from ``n`` waits is read: its one-sided 95 % bound."""
    if n <= 0:
        return q
    step = Z * math.sqrt(q * (1.0 - q) / n)
    return q + step if q > 0.5 else q - step if q < 0.5 else q


def backed_level(n: int) -> float:
    """The highest level ``n`` exchangeable waits can vouch for: n / (n + 1)."""
    return n / (n + 1.0) if n > 0 else 0.0


def short_history(n: int) -> bool:
    """True when the acted-on level's bound passes what ``n`` waits can vouch for."""
    return read_level(ACTED_LEVEL, n) >= backed_level(n)


@functools.lru_cache(maxsize=1)
def rows_backing() -> int:
    """The fewest training waits for which the history is not short (for `model status`)."""
    lo, hi = 1, 1_000_000
    while lo < hi:
        mid = (lo + hi) // 2
        if short_history(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Support:
    """What the model's history covers for this question."""

    rows: int  # waits the model learned from
    short: bool  # too few for the acted-on level (see short_history)
    outside: dict = field(default_factory=dict)  # feature -> (live value, training min, training max)

    @property
    def out_of_depth(self) -> bool:
        return self.short or bool(self.outside)


def support_of(meta: dict, x: "np.ndarray", names: "tuple[str, ...]") -> Support:
    """Where the live feature row ``x`` lies against the training rows of a saved model."""
    n = int((meta.get("training_window") or {}).get("rows") or 0)
    ranges = meta.get("feature_ranges") or {}
    outside = {}
    for f, (lo, hi) in ranges.items():
        if f not in names:
            continue
        v = float(x[names.index(f)])
        if math.isnan(v):
            continue
        if (f in LOAD_FEATURES and v > hi + 1e-9) or (f in FREE_FEATURES and v < lo - 1e-9):
            outside[f] = (v, lo, hi)
    return Support(rows=n, short=short_history(n), outside=outside)


def widen(p: Prediction, n: int) -> Prediction:
    """Each learned level read at its bound for ``n`` training waits (rule 1 of the module doc)."""
    if n <= 0 or not p.qs:
        return p
    eps = 1e-9
    vals = tuple(p.quantile(min(1.0 - eps, max(eps, read_level(q, n)))) for q in p.qs)
    return _rebuilt(p, vals)


@dataclass(frozen=True)
class SlurmView:
    """Slurm's own view of when a request submitted now would start (seconds from now)."""

    test_only_s: float | None = None  # sbatch --test-only for this request
    ahead_jobs: int = 0  # jobs pending for the queue itself in the request's partition
    ahead_nodes: int = 0
    ahead_start_s: float | None = None  # the latest squeue --start among them
    refused: str = ""  # sbatch --test-only refused the request (its error line): Slurm would not run it as asked

    @property
    def wait_s(self) -> float | None:
        """Slurm's expected wait: --test-only's answer where asked, else the queue ahead's latest start."""
        return self.test_only_s if self.test_only_s is not None else self.ahead_start_s

    @property
    def source(self) -> str:
        return "sbatch --test-only" if self.test_only_s is not None else \
            "squeue --start of the jobs ahead" if self.ahead_start_s is not None else ""


def queue_ahead(rows: "list[QueueRow]", partitions: "str | set[str]", now: float) -> tuple[int, int, float | None]:
    """Jobs pending for the queue (Priority/Resources) in ``partitions`` (a name, or the set of
    partitions sharing nodes with the request's; all when empty): a job submitted now has the
    least age, so they are ahead of it unless fair share or size weighs more. Returns (jobs,
    nodes, the latest expected start among them - now, or None)."""
    names = {partitions} if isinstance(partitions, str) and partitions else set(partitions or ())
    jobs = nodes = 0
    latest: float | None = None
    for r in rows:
        if r.state != "PENDING" or r.reason.split(",")[0].strip("()") not in QUEUE_REASONS:
            continue
        if names and not names & set(r.partition.split(",")):
            continue
        jobs += 1
        nodes += max(1, int(r.nodes or 1))
        if r.start is not None:
            s = max(0.0, float(r.start) - now)
            latest = s if latest is None else max(latest, s)
    return jobs, nodes, latest


def lean_on(p: Prediction, slurm_wait_s: float) -> Prediction:
    """Levels from the median up at least Slurm's wait grown at the least tail slope (rule 2)."""
    if not p.qs:
        return p
    nd = NormalDist()
    base = max(float(slurm_wait_s), 1.0)
    vals = tuple(v if q < 0.5 else max(v, base * 10 ** (TAIL_SLOPE * nd.inv_cdf(q))) for q, v in zip(p.qs, p.values))
    return _rebuilt(p, vals)


def _rebuilt(p: Prediction, vals: tuple) -> Prediction:
    out = []
    for v in vals:  # monotone in q
        out.append(max(float(v), out[-1]) if out else float(v))
    by = dict(zip(p.qs, out))
    return Prediction(by.get(0.1, p.p10), by.get(0.5, p.p50), by.get(0.9, p.p90), p.model, tuple(p.qs), tuple(out))


@dataclass(frozen=True)
class Answer:
    """A prediction as it should be acted on, with what it rests on.

    ``prediction`` is what callers use; ``model_only`` the model's own answer; ``leaned`` says
    whether Slurm's estimate moved it, ``reasons`` why the model was not trusted alone.
    """

    prediction: Prediction
    model_only: Prediction
    support: Support
    slurm: SlurmView | None
    leaned: bool
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        s = self.slurm
        return {
            "training_rows": self.support.rows, "short_history": self.support.short,
            "rows_for_full_support": rows_backing(),
            "outside_history": {f: {"live": v, "min": lo, "max": hi} for f, (v, lo, hi) in self.support.outside.items()},
            "leaned_on_slurm": self.leaned, "reasons": list(self.reasons),
            "slurm": None if s is None else {"wait_s": s.wait_s, "source": s.source, "test_only_s": s.test_only_s,
                                             "ahead_jobs": s.ahead_jobs, "ahead_nodes": s.ahead_nodes,
                                             "ahead_start_s": s.ahead_start_s, "refused": s.refused},
            "model_only": self.model_only.as_dict(),
        }


def assess(model_only: Prediction, support: Support, slurm: "SlurmView | Callable[[], SlurmView] | None") -> Answer:
    """Rules 1 and 2 of the module doc applied to one answer. ``slurm`` may be a callable giving
    the view: it is asked only when the model is out of its depth (the replay's view is a backfill
    plan of the whole queue, too dear to draw on every ask)."""
    if callable(slurm):
        slurm = slurm() if support.out_of_depth else None
    p = widen(model_only, support.rows)
    reasons = []
    if support.short:
        reasons.append(f"the model learned from {support.rows} jobs (q{ACTED_LEVEL * 100:.0f} needs "
                       f"{rows_backing()})")
    if support.outside:
        said = [f"{LABELS.get(f, f)} {v:.3g} ({'least' if f in FREE_FEATURES else 'at most'} "
                f"{lo if f in FREE_FEATURES else hi:.3g} seen)"
                for f, (v, lo, hi) in sorted(support.outside.items(), key=lambda kv: _ORDER.get(kv[0], 99))]
        more = f", and {len(said) - 3} more measure{'s' if len(said) > 4 else ''}" if len(said) > 3 else ""
        reasons.append("the live queue is busier than any in its history: " + ", ".join(said[:3]) + more)
    leaned = False
    if support.out_of_depth and slurm is not None and slurm.wait_s is not None:
        held = lean_on(p, slurm.wait_s)
        # "leaned" only when Slurm's estimate moved the answer: one no later than the model's changes
        # nothing, and saying it leaned would credit Slurm with what the widening did
        leaned, p = held.values != p.values, held
    return Answer(prediction=p, model_only=model_only, support=support, slurm=slurm, leaned=leaned,
                  reasons=tuple(reasons))


def answer(predictor, request, snapshot: "pd.DataFrame | None", history: "pd.DataFrame | None",
           slurm: "SlurmView | Callable[[], SlurmView] | None") -> Answer:
    """The model's answer to ``request`` (a :class:`chainrun.predict.model.WaitRequest`), assessed.

    A predictor without ``predict_with_features`` (the replay's stand-in where no chainrun model
    could be fit, chainrun/sim/knowledge.py) answers alone: no meta to measure its support against."""
    from chainrun.predict.features import FEATURES

    if not hasattr(predictor, "predict_with_features"):
        p = predictor.predict(request, snapshot, history)
        return Answer(prediction=p, model_only=p, support=Support(rows=0, short=False),
                      slurm=None if callable(slurm) else slurm, leaned=False)
    p, x = predictor.predict_with_features(request, snapshot, history)
    return assess(p, support_of(predictor.meta, x, FEATURES), slurm)
