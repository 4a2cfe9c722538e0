"""When to submit the next segment: one small interface, one class per policy.

The engine asks a policy only while the chain's current segment is live and its successor
is not yet submitted. Once the current segment has ended, every policy submits at once
(that fallback is the whole of `reactive`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

from chainrun.errors import UsageError
from chainrun.state.records import PENDING, RUNNING, Chain, Segment


# The shipped values and why (chainrun/chain/shipped.py); the ones in force per cluster: chain/tuned.py
from chainrun.chain.shipped import (  # noqa: F401 (read as policies.X by the engine, the replay, the docs)
    DEFAULT_LEAD_S, MAX_LEAD_SHARE, MAX_TARGET, PREDICTED_FLOOR_S, PREDICTED_RULE, RULES, TRANSITION_COST_S,
)


def default_lead_s(policy: str, cluster: str | None = None, partition: str = "") -> int:
    """The chain's `--lead` when none is given: `predicted`'s floor, or the lead of the others. With a
    ``cluster``, `predicted`'s floor is the one in force there (``chainrun.chain.tuned``: what
    `model refresh` chose for the partition, else PREDICTED_FLOOR_S)."""
    if policy != "predicted":
        return DEFAULT_LEAD_S
    if cluster is None:
        return PREDICTED_FLOOR_S
    from chainrun.chain import tuned

    return int(tuned.in_force(cluster, partition)["floor_s"])


def cut_allowance(work_after_s: float, full_capacity_s: float, handoff_s: float = 0.0) -> float:
    """How much of the live segment an early successor may take (cut, or wait through) without the
    chain needing one more segment, shared evenly among the boundaries still ahead.

    ``work_after_s``: the work left once the live segment trains to its hand-over point;
    ``full_capacity_s``: what one full later segment trains. The chain needs n = ceil(work / full)
    more segments whatever happens at this boundary; their slack n x full - work absorbs cuts (and
    a successor's wait burns its own limit just as a cut burns its predecessor's). Each of the n
    boundaries ahead gets slack / n, less the hand-off minutes a cut also costs; 0 when nothing is
    left (the live segment is the last)."""
    full = max(float(full_capacity_s), 1.0)
    work = float(work_after_s)
    if work <= 0.0:
        return 0.0
    n = max(1, math.ceil(work / full - 1e-9))
    return max(0.0, (n * full - work) / n - max(0.0, float(handoff_s)))


def slack_lead(prob_within: Callable[[float], float], *, allowance_s: float, boundary_cost_s: float,
               floor_s: float, max_lead_s: float, step_s: float = 300.0) -> float:
    """The lead (time before the hand-over point) at which submitting costs the chain least, by the
    ``slack`` rule: a successor that starts ``late`` after the hand-over point costs ``late`` (the
    chain's nodes wait); one that starts more than ``allowance_s`` early costs one more segment
    boundary (``boundary_cost_s``); earlier than that costs nothing. With W the wait,
        cost(L) = E[(W - L)+] + boundary_cost x P(W < L - allowance),
    minimised over leads in [floor_s, max_lead_s] on a ``step_s`` grid (ties: the longest lead,
    i.e. the earliest moment)."""
    hi = max(float(floor_s), float(max_lead_s))
    grid = sorted({float(floor_s), hi} | {float(floor_s) + k * step_s
                                          for k in range(1, int((hi - floor_s) // step_s) + 1)}
                  | ({float(allowance_s)} if floor_s < allowance_s < hi else set()))  # the kink: free up to here
    late = _expected_lateness(prob_within, grid)
    best, best_cost = grid[0], math.inf
    for lead, lt in zip(grid, late):
        early = lead - allowance_s
        cost = lt + boundary_cost_s * (float(prob_within(early)) if early > 0 else 0.0)
        if cost <= best_cost + 1e-9:
            best, best_cost = lead, cost
    return best


class Remembered:
    """A distribution's ``prob_within`` that remembers its answers, and its expected lateness per
    grid of leads: the replay asks one state's distribution under every candidate policy, and the
    candidates that differ only in boundary cost or guard share ask the same grid (a pure function
    of the distribution, so the same floats)."""

    __slots__ = ("prob_within", "seen", "lateness")

    def __init__(self, prob_within: Callable[[float], float]) -> None:
        self.prob_within = prob_within
        self.seen: dict[float, float] = {}
        self.lateness: dict[tuple, list[float]] = {}

    def __call__(self, seconds: float) -> float:
        v = self.seen.get(seconds)
        if v is None:
            v = self.seen[seconds] = self.prob_within(seconds)
        return v


def _expected_lateness(prob_within: Callable[[float], float], leads: list[float]) -> list[float]:
    """E[(W - L)+] = integral from L to infinity of P(W > u) du, for each lead L (sorted), on a
    log-spaced grid up to 60 days (beyond it the model's tail says nothing useful)."""
    if isinstance(prob_within, Remembered):
        key = tuple(leads)
        out = prob_within.lateness.get(key)
        if out is None:
            out = prob_within.lateness[key] = _lateness(prob_within, leads)
        return out
    return _lateness(prob_within, leads)


def _lateness(prob_within: Callable[[float], float], leads: list[float]) -> list[float]:
    top = 60 * 86400.0
    pts = sorted({max(1.0, x) for x in leads if x < top} | {10 ** (k / 40) for k in range(int(40 * math.log10(top)) + 1)}
                 | {top})
    surv = [1.0 - float(prob_within(u)) for u in pts]
    tail = [0.0] * len(pts)  # integral from pts[i] to top
    for i in range(len(pts) - 2, -1, -1):
        tail[i] = tail[i + 1] + 0.5 * (surv[i] + surv[i + 1]) * (pts[i + 1] - pts[i])
    index = {u: i for i, u in enumerate(pts)}
    out = []
    for L in leads:
        if L >= top:
            out.append(0.0)
        elif L < 1.0:
            out.append(tail[0] + (1.0 - L))
        else:
            out.append(tail[index[L]])
    return out


def lead_cap_s(training_s: float, full_s: float, share: float = MAX_LEAD_SHARE) -> float:
    """How long before its hand-over point a segment expected to train ``training_s`` (from its
    start) may get its successor submitted at the earliest, when a full segment trains ``full_s``:
    what is left once it has trained (1 - share) x ``full_s``; 0 if it is shorter; inf for share >= 1."""
    if share >= 1.0:
        return float("inf")
    return max(0.0, float(training_s) - (1.0 - share) * float(full_s))


def predict_quantile(segment_s: float, transition_cost_s: float | None = None) -> float:
    """The quantile of the predicted wait the `predicted` policy acts on, for a segment length.

    The newsvendor quantile 1 / (1 + cost / segment) with cost ``transition_cost_s`` (default
    TRANSITION_COST_S, chosen by the tuning procedure), never below the median and never above
    MAX_TARGET (0.98, the highest level the model learns). With the 1 h cost: 48 h segments 0.9796,
    24 h 0.96, 6 h 0.857. See docs/evaluation.md.
    """
    cost = TRANSITION_COST_S if transition_cost_s is None else float(transition_cost_s)
    q = 1.0 / (1.0 + cost / max(float(segment_s), 1.0))
    return min(MAX_TARGET, max(0.5, q))


@dataclass(frozen=True)
class WaitEstimate:
    """A predicted queue wait for the successor, in seconds, and which model said so.

    ``seconds`` is the wait at the ``target`` quantile; ``prob_within(h)`` (when the model
    gives a distribution) answers the deadline question P(wait <= h) for a job submitted now.
    """

    seconds: float
    model: str
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    target: float | None = None
    prob_within: Callable[[float], float] | None = field(default=None, compare=False, repr=False)
    # the distribution's quantile function, when known: a policy that acts on another quantile (its
    # boundary cost in force) reads ``seconds`` there, so what is stored and scored is what it acted on
    quantile: Callable[[float], float] | None = field(default=None, compare=False, repr=False)
    # the model's own median before it leaned on Slurm's plan of the queue ahead (chainrun/predict/doubt.py);
    # None when it did not lean. What caps Slurm's plan for a pending job (site_plan.pending_wait_s):
    # a median leaned on a plan cannot bound a plan
    model_p50: float | None = None


@dataclass(frozen=True)
class PolicyView:
    now: float
    chain: Chain
    current: Segment
    # when the current segment is expected to stop training: its real end minus the signal lead
    handover_at: float | None
    # asks the queue-delay model (may be None when no model is available)
    predict_wait: Callable[[], WaitEstimate | None] | None = None
    # how much of the current segment an early successor may take without one more segment
    # (``cut_allowance``); None: unknown, counted as none
    cut_allowance_s: float | None = None


@dataclass(frozen=True)
class Decision:
    submit: bool
    reason: str = ""
    dependency: str = ""
    estimate: WaitEstimate | None = None
    # the lead (time before the hand-over point) the rule now plans to submit at, when it knows one
    due_lead_s: float | None = None
    # when it submits: the model's P(the successor starts before the hand-over point), the
    # probability acted on whatever the rule; `model status` sets it beside what happened
    prob_in_time: float | None = None


class Policy(Protocol):
    name: str

    def decide(self, view: PolicyView) -> Decision: ...


class Reactive:
    """Submit the next segment after the current one has ended (what people do by hand)."""

    name = "reactive"

    def decide(self, view: PolicyView) -> Decision:
        return Decision(False)


class Dependency:
    """Pre-queue the next segment with ``afterany`` (gains no age and no backfill plan while it waits)."""

    name = "dependency"

    def decide(self, view: PolicyView) -> Decision:
        cur = view.current
        if cur.job_id and cur.phase in (PENDING, RUNNING):
            return Decision(True, "pre-queued behind the current segment", dependency=f"afterany:{cur.job_id}")
        return Decision(False)


class Lead:
    """Submit the next segment as an independent job a fixed time before the hand-over point."""

    name = "lead"

    def decide(self, view: PolicyView) -> Decision:
        if view.current.phase != RUNNING or view.handover_at is None:
            return Decision(False)
        due = view.handover_at - view.chain.lead_s
        if view.now >= due:
            return Decision(True, f"lead {view.chain.lead_s}s before the hand-over point")
        return Decision(False)


class Predicted:
    """Submit when the chance that a job submitted now starts before the hand-over point has
    fallen to the target probability (``predict_quantile``: 0.98 for 48 h segments).

    Early in a segment that chance is ~1 and submitting would only start the successor too
    early; it falls as the hand-over point nears, and the last moment it is still at the
    target is when to submit: P(wait <= time left) <= target, i.e. the time left has reached
    the target quantile of the wait. Starting early costs only the short hand-off, so the
    target is high. The chain's ``--lead`` is a floor: the model can only make the submission
    earlier, never later, because a model is least reliable exactly where it predicts "no
    wait". Without a model this is the fixed lead.

    The guard (``lead_cap_s``, MAX_LEAD_SHARE): never before the segment has trained (1 - share)
    of a full segment (all of itself if shorter), whatever the model or the floor says, so no
    model answer can start a spiral of cut segments. Before that moment the model is not asked.
    """

    name = "predicted"

    def __init__(self, max_lead_share: float | None = None, rule: str | None = None,
                 transition_cost_s: float | None = None, *, tuned: bool = False) -> None:
        self.max_lead_share = MAX_LEAD_SHARE if max_lead_share is None else float(max_lead_share)
        self.rule = PREDICTED_RULE if rule is None else rule
        if self.rule not in RULES:
            raise ValueError(f"rule {self.rule!r}: use one of {', '.join(RULES)}")
        self.transition_cost_s = TRANSITION_COST_S if transition_cost_s is None else float(transition_cost_s)
        # tuned: the values not given here are the ones in force for the chain's cluster and
        # partition (chainrun.chain.tuned; what `model refresh` chose), read when a chain is decided
        self._tuned = {k for k, v in (("lead_share", max_lead_share), ("rule", rule),
                                      ("cost", transition_cost_s)) if v is None} if tuned else set()

    def for_chain(self, chain: Chain) -> "Predicted":
        """This rule with the values in force for ``chain``'s cluster and partition filled in."""
        if not self._tuned:
            return self
        from chainrun.chain import tuned

        v = tuned.in_force(chain.cluster, chain.partition or "")
        p = Predicted(self.max_lead_share if "lead_share" not in self._tuned else v["lead_share"],
                      self.rule if "rule" not in self._tuned else v["rule"],
                      self.transition_cost_s if "cost" not in self._tuned else v["transition_cost_s"])
        # the watcher's estimate carries the shipped cost's quantile target: the quantile rule acts
        # on the target of the cost in force
        p._retarget = "cost" in self._tuned
        return p

    def earliest(self, view: PolicyView) -> float | None:
        """The first moment this rule may submit (the guard), or None when it does not apply."""
        if self._tuned:
            return self.for_chain(view.chain).earliest(view)
        cur = view.current
        if view.handover_at is None or cur.start is None or self.max_lead_share >= 1.0:
            return None
        full = view.chain.segment_s - view.chain.signal_lead_s
        return view.handover_at - lead_cap_s(view.handover_at - cur.start, full, self.max_lead_share)

    def decide(self, view: PolicyView) -> Decision:
        if self._tuned:
            return self.for_chain(view.chain).decide(view)
        d = self._decide(view)
        if d.submit and d.estimate is not None and d.estimate.prob_within is not None and view.handover_at is not None:
            d = replace(d, prob_in_time=float(d.estimate.prob_within(max(0.0, view.handover_at - view.now))))
        return d

    def _decide(self, view: PolicyView) -> Decision:
        if view.current.phase != RUNNING or view.handover_at is None:
            return Decision(False)
        first = self.earliest(view)
        if first is not None and view.now < first:
            return Decision(False, f"guard: not before {view.handover_at - first:.0f}s before the hand-over "
                                   f"point (share {self.max_lead_share:.2f})")
        est = view.predict_wait() if view.predict_wait else None
        if est is not None and est.target is not None and getattr(self, "_retarget", False):
            q = predict_quantile(view.chain.segment_s, self.transition_cost_s)
            est = replace(est, target=q, seconds=float(est.quantile(q)) if est.quantile else est.seconds)
        left = view.handover_at - view.now
        if est is None:
            d = Lead().decide(view)
            return Decision(d.submit, "no model: " + d.reason if d.submit else "", estimate=None)
        if left <= view.chain.lead_s:
            return Decision(True, f"within the {view.chain.lead_s}s lead floor (model said {est.seconds:.0f}s)", estimate=est)
        if self.rule == "slack" and est.prob_within is not None:
            return self._decide_slack(view, est, left)
        if est.prob_within is not None and est.target is not None:
            p = float(est.prob_within(left))
            if p > est.target:
                return Decision(False, estimate=est)
            return Decision(True, f"P(start within the {left:.0f}s left) = {p:.3f} <= target {est.target:.2f} "
                                  f"({est.model})", estimate=est)
        if left > effective_lead(est.seconds, view.chain.lead_s):
            return Decision(False, estimate=est)
        return Decision(True, f"predicted wait {est.seconds:.0f}s >= {left:.0f}s left ({est.model})", estimate=est)

    def _decide_slack(self, view: PolicyView, est: WaitEstimate, left: float) -> Decision:
        """The ``slack`` rule: submit once the time left has reached the lead that costs the chain
        least (``slack_lead``), between the floor and now."""
        allowance = max(0.0, float(view.cut_allowance_s or 0.0))
        step = max(300.0, (left - view.chain.lead_s) / 96)
        due = slack_lead(est.prob_within, allowance_s=allowance, boundary_cost_s=self.transition_cost_s,
                         floor_s=float(view.chain.lead_s), max_lead_s=left, step_s=step)
        if due < left:
            return Decision(False, estimate=est, due_lead_s=due)
        p = float(est.prob_within(left))
        return Decision(True, f"slack rule: now costs least (P(start within the {left:.0f}s left) = {p:.3f}, "
                              f"{allowance:.0f}s of this segment free to cut; {est.model})", estimate=est, due_lead_s=due)


def effective_lead(predicted_wait_s: float, floor_s: float) -> float:
    """How long before the hand-over point the `predicted` policy submits: never less than the floor."""
    return max(predicted_wait_s, floor_s)


POLICIES: dict[str, type] = {p.name: p for p in (Reactive, Dependency, Lead, Predicted)}


def get_policy(name: str) -> Policy:
    """The shipped policy the watcher runs; `predicted` with the values in force for each chain's
    cluster and partition (``Predicted.for_chain``)."""
    if name == "predicted":
        return Predicted(tuned=True)
    try:
        return POLICIES[name]()
    except KeyError:
        raise UsageError(f"unknown policy {name!r}", hint=f"choose one of {', '.join(POLICIES)}") from None
