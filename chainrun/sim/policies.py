"""When to submit a chain's next segment: the rules compared by the replay.

Every rule is a *lead*: submit when the predecessor's time left is at most the lead. A rule is
asked at the predecessor's start and again whenever it says so (like the chainrun watcher that
polls); it sees only ``Context`` (the masked past and the live queue, see knowledge.py).

- reactive:   submit ``reactive_latency_s`` after the predecessor ends (a script that notices).
- dependency: pre-queued with afterany; eligible, and ageing, only from the predecessor's end.
- fixed_<L>:  a constant lead.
- avg:        Mirage's baseline, lead = mean wait of the last 100 jobs that started.
- predicted_q<NN>: chainrun, lead = the NN-th percentile of the wait the chainrun model predicts
              for this job if submitted now. Which percentile is a newsvendor choice,
              q* = cost of an hour late / (cost of an hour late + cost of an hour early):
              * without hand-off an hour early holds the chain's nodes idle for an hour (and
                eats an hour of the successor's limit), as costly as an hour late: q* = 0.5;
              * with hand-off an hour early only moves an hour of work into one more segment,
                i.e. 1/48 of an extra transition (~1 h of cost with hand-off minutes and its
                own small gap): c = 1/48 and q* = 1 / (1 + c) = 0.98.
              ``predicted_handoff`` replays chainrun's watcher as shipped: the quantile
              ``chainrun.chain.policies.predict_quantile(segment)`` (this same newsvendor rule,
              0.98 for 48 h segments) with the default ``--lead`` (1 h) as a floor the model can
              only move earlier (rule ``predicted_watcher``); the bare quantiles are sensitivity rows.
- oracle:     not a rule but the limit: searches the submit time with the full future known.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str  # reactive | dependency | fixed | avg | predicted | oracle
    lead_s: float = 0.0
    quantile: float = 0.5
    floor_s: float = 0.0  # predicted: never a shorter lead than this


def _qname(q: float) -> str:
    return f"predicted_q{int(round(q * 100))}"


@dataclass(frozen=True)
class Report:
    """One row of the result table: a rule, counted with or without hand-off."""

    name: str
    rule: str
    handoff: bool


Q_NO_HANDOFF = 0.5


def watcher_settings(segment_s: float) -> tuple[float, float]:
    """(quantile, lead floor in s) of chainrun's `predicted` watcher policy for this segment
    length: the replay acts like the shipped watcher, whatever they become."""
    from chainrun.chain.policies import default_lead_s, predict_quantile

    return predict_quantile(segment_s), float(default_lead_s("predicted"))


def default_rules(fixed_leads_s=(2 * 3600, 6 * 3600, 12 * 3600),
                  quantiles=(0.5, 0.75, 0.9, 0.95, 0.98), *, segment_s: float = 48 * 3600.0) -> list[Rule]:
    quantiles = tuple(sorted({*quantiles, Q_NO_HANDOFF}))
    rules = [Rule("reactive", "reactive"), Rule("dependency", "dependency")]
    rules += [Rule(f"fixed_{int(s // 3600)}h", "fixed", lead_s=float(s)) for s in fixed_leads_s]
    rules.append(Rule("avg", "avg"))
    rules += [Rule(_qname(q), "predicted", quantile=q) for q in quantiles]
    q, floor = watcher_settings(segment_s)
    rules.append(Rule("predicted_watcher", "predicted", quantile=q, floor_s=floor))
    rules.append(Rule("oracle", "oracle"))
    return rules


def default_reports(rules: list[Rule]) -> list[Report]:
    """Names the external checks rely on: predicted (q 0.5, no hand-off), predicted_handoff
    (the shipped watcher rule, hand-off), oracle (with hand-off: the physical limit), plus every
    rule both ways."""
    out: list[Report] = []
    names = {r.name for r in rules}
    for r in rules:
        if r.kind in ("reactive", "dependency"):
            out.append(Report(r.name, r.name, False))  # never starts early: hand-off changes nothing
        elif r.kind == "oracle":
            out.append(Report("oracle", "oracle", True))
            out.append(Report("oracle_nohandoff", "oracle_nohandoff", False))
        else:
            out.append(Report(r.name, r.name, False))
            out.append(Report(f"{r.name}_handoff", r.name, True))
    if _qname(Q_NO_HANDOFF) in names:
        out.append(Report("predicted", _qname(Q_NO_HANDOFF), False))
    if "predicted_watcher" in names:
        out.append(Report("predicted_handoff", "predicted_watcher", True))
    return out


class Context:
    """What rules may ask at time ``now``; predictions are cached per (experiment, time)."""

    def __init__(self, knowledge, sim, *, nodes: int, segment_s: float, gpus_per_node: int, user: str,
                 predecessor: tuple[float, float] | None = None) -> None:
        self.predecessor = predecessor  # (submit, start): the chain's own running job, as squeue shows it
        self.k = knowledge
        self.sim = sim
        self.nodes = nodes
        self.segment_s = segment_s
        self.gpus_per_node = gpus_per_node
        self.user = user
        self._pred: dict[float, object] = {}

    def prediction(self, now: float):
        if now not in self._pred:
            from chainrun.predict import WaitRequest

            pending, running = self.sim.queue_view()
            req = WaitRequest(user=self.user, nodes=self.nodes, gpus=self.nodes * self.gpus_per_node, cpus=0,
                              timelimit_s=self.segment_s, submit=now)
            if self.sim.free >= self.nodes and not self.sim.pending:
                # an idle partition: the job would start at once; no model needed (saves time)
                from chainrun.predict import Prediction

                self._pred[now] = Prediction(0.0, 0.0, 0.0, "idle")
                return self._pred[now]
            model = self.k.predictor(now)
            t_pred = time.monotonic()
            history = self.k.history(now)
            try:
                self._pred[now] = model.predict(req, self._snapshot(now, pending, running), history)
            except ValueError:
                # chainrun.predict (features._active) fails when no job in the window ever
                # waited: the queue is empty, so the recent waits (all 0) answer instead
                from chainrun.sim.knowledge import RecentWaits

                self.k.fallbacks += 1
                self._pred[now] = RecentWaits(history, now).predict(req)
            self.k.cost["predictions"] += 1
            self.k.cost["predict_s"] += time.monotonic() - t_pred
        return self._pred[now]

    def _snapshot(self, now, pending, running):
        snap = self.k.snapshot(now, pending, running)
        if self.predecessor is None:
            return snap
        import pandas as pd

        sub, start = self.predecessor
        own = {c: snap[c].iloc[0] if len(snap) else "" for c in snap.columns}
        own.update(job_id="chain-predecessor", user=self.user, name="chain", submit=sub, eligible=sub, start=start,
                   end=float("nan"), timelimit_s=self.segment_s, nodes=self.nodes,
                   gpus=self.nodes * self.gpus_per_node, cpus=0, state="RUNNING", exit_code="",
                   partition="", qos="", account="", eligible_known=False, priority=float("nan"))
        return pd.concat([snap, pd.DataFrame([own])[snap.columns]], ignore_index=True)


def lead_of(rule: Rule, ctx: Context, now: float) -> float:
    if rule.kind == "fixed":
        return rule.lead_s
    if rule.kind == "avg":
        return ctx.k.mean_recent_wait(now)
    if rule.kind == "predicted":
        p = ctx.prediction(now)
        lead = float(p.quantile(rule.quantile)) if hasattr(p, "quantile") else float(p.p50)
        return max(lead, rule.floor_s)
    raise ValueError(rule.kind)
