"""One injected chain, every rule: fork the replay once per submission time.

Fairness: every injection is its own experiment on top of the trace replayed alone (the
replay is forked at the injection time), so chains never queue behind each other and every
rule faces exactly the same predecessor start. Within an experiment all rules share one
timeline until they submit; each submission forks it, so a rule's early successor perturbs
only its own future. One transition per chain (predecessor -> successor) is measured; the
fork stops when the successor starts.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from chainrun.sim.policies import Context, Rule, lead_of
from chainrun.sim.scheduler import Scheduler

NAN = float("nan")


@dataclass(frozen=True)
class Transition:
    rule: str
    t0: float  # injection (predecessor submit) time
    nodes: int
    pred_start: float
    pred_end: float  # when the predecessor would reach its limit
    submit: float  # successor submit (eligible time for "dependency")
    start: float  # successor start; nan if it never started within the horizon


@dataclass(frozen=True)
class ChainSpec:
    segment_s: float = 48 * 3600.0
    handoff_s: float = 300.0
    reactive_latency_s: float = 60.0
    poll_min_s: float = 600.0  # the watcher's finest step between re-predictions
    poll_max_s: float = 6 * 3600.0  # ... and the longest it goes without asking again
    oracle_step_s: float = 600.0
    horizon_s: float = 60 * 86400.0


def run_experiment(base: Scheduler, t0: float, nodes: int, pred_id: int, succ_id: int, rules: list[Rule],
                   spec: ChainSpec, knowledge, *, gpus_per_node: int = 3,
                   show_predecessor: bool = True) -> list[Transition]:
    sim = base.fork()
    sim.run_until(t0)
    sim.submit(pred_id, nodes, spec.segment_s, spec.segment_s)
    ps = sim.run_until_started(pred_id, t0 + spec.horizon_s)
    if ps != ps:
        return []
    pe = ps + spec.segment_s
    ctx = Context(knowledge, sim, nodes=nodes, segment_s=spec.segment_s, gpus_per_node=gpus_per_node,
                  user="chainrun-chain", predecessor=(t0, ps) if show_predecessor else None)
    memo: dict[tuple[float, float], float] = {}

    def start_if_submitted(state: Scheduler, eligible: float | None = None) -> float:
        key = (state.now, NAN if eligible is None else eligible)
        if key not in memo:
            f = state.fork()
            f.submit(succ_id, nodes, spec.segment_s, spec.segment_s, eligible=eligible)
            memo[key] = f.run_until_started(succ_id, state.now + spec.horizon_s)
        return memo[key]

    out: list[Transition] = []

    def record(name: str, submit: float, start: float) -> None:
        out.append(Transition(name, t0, nodes, ps, pe, submit, start))

    # events on the shared timeline: (time, order, kind, payload)
    events: list = []
    for i, r in enumerate(rules):
        if r.kind == "reactive":
            heapq.heappush(events, (pe + spec.reactive_latency_s, i, "submit", r))
        elif r.kind == "dependency":
            heapq.heappush(events, (pe, i, "dependency", r))
        elif r.kind == "oracle":
            continue
        elif r.kind != "predicted":
            heapq.heappush(events, (ps, i, "ask", [r]))
    predicted = [r for r in rules if r.kind == "predicted"]
    if predicted:  # one watcher, one prediction per poll, read at several quantiles
        heapq.heappush(events, (ps, len(rules), "ask", predicted))
    grid: list[tuple[float, Scheduler]] = []
    if any(r.kind == "oracle" for r in rules):
        k, t = 0, ps
        while t < pe:
            heapq.heappush(events, (t, -1, "grid", None))
            k += 1
            t = ps + k * spec.oracle_step_s
        heapq.heappush(events, (pe, -1, "grid", None))

    while events:
        t, i, kind, r = heapq.heappop(events)
        sim.run_until(t)
        if kind == "grid":
            grid.append((t, sim.fork()))
        elif kind == "submit":
            record(r.name, t, start_if_submitted(sim))
        elif kind == "dependency":
            record(r.name, t, start_if_submitted(sim, eligible=pe))
        else:  # ask the rules: submit now, or when to ask again?
            later, wait = [], spec.poll_max_s
            for rule in r:
                lead = lead_of(rule, ctx, t)
                if pe - t <= lead:
                    record(rule.name, t, start_if_submitted(sim))
                else:
                    later.append(rule)
                    # halve the distance to the moment the lead would be reached: the queue can
                    # fill up after a quiet look, so look more often as the end comes near
                    wait = min(wait, (pe - lead - t) / 2)
            if later:
                steps = max(1, int(wait // spec.poll_min_s))  # round down: never later than asked
                heapq.heappush(events, (min(t + steps * spec.poll_min_s, pe), i, "ask", later))
    if grid:
        _oracle(grid, pe, start_if_submitted, record)
    return out


def _oracle(grid, pe, start_if_submitted, record) -> None:
    """Latest grid submit time whose successor starts by ``pe`` (start(s) grows with s: an
    earlier submission is older, so never behind). With hand-off that is the best possible:
    no interruption, the shortest cut. Without hand-off, the closer of it and the next step."""
    starts = {}

    def start(k):
        if k not in starts:
            starts[k] = start_if_submitted(grid[k][1])
        return starts[k]

    lo, hi = 0, len(grid) - 1
    if start(lo) > pe or start(hi) <= pe:  # cannot make it, or even submitting at the end is fine
        best = lo if start(lo) > pe else hi
        record("oracle", grid[best][0], start(best))
        record("oracle_nohandoff", grid[best][0], start(best))
        return
    while hi - lo > 1:  # invariant: start(lo) <= pe < start(hi)
        mid = (lo + hi) // 2
        if start(mid) <= pe:
            lo = mid
        else:
            hi = mid
    record("oracle", grid[lo][0], start(lo))
    closer = lo if pe - start(lo) <= start(hi) - pe else hi
    record("oracle_nohandoff", grid[closer][0], start(closer))
