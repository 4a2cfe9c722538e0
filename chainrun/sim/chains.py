"""Whole-chain replay: what a user pays, per chain, under each submission policy.

A chain of fixed work (default 168 h of compute on k nodes, 48 h segments) is injected into the
trace replayed alone (the replay is forked at the injection time, so chains
never queue behind each other) and every segment is run until the work is done:

- A segment of limit L gets its signal ``signal_lead_s`` before the limit; its payload trains from
  its start (or, at a hand-off, from the moment its predecessor released the chain) until then.
  The first ``restart_s`` of every segment's training are lost compute (model load, data loader
  warm-up): **work** is training minus restarts, the chain's ``--total`` less those minutes.
- Segments are planned as the watcher plans them: the gate, the sizes and the slack allowance are
  ``chainrun.chain.sizing``'s, which ``planning.plan`` calls too, on the engine's own
  ``expected_training``, ``trained_so_far`` and ``total_tolerance`` (tests/chain/test_sizing.py
  drives both on random chain states and checks they agree): the next one is asked for only
  while exactly one segment is live and more than the tolerance (a minute) of work is left after it;
  its limit is the work left *as if the live segment stopped now* (so an early start takes over;
  before a segment starts, all the work left), plus the restart and the signal lead, in whole
  minutes, at most the segment length. ``successor_limit="handover"`` replays the rule before the
  fix (the work left after the live segment trains to its hand-over point), which spirals.
- **Hand-off**: a successor that starts before its predecessor's hand-over point asks it to stop;
  the predecessor's training ends at once, it saves and exits ``handoff_s`` later, and the
  successor trains from then on. What the cut took is simply still to do: it lands in later
  segments, with their own queue waits and restarts. With the adaptive variant the successor may
  wait instead (chainrun.chain.handoff_plan: the watcher's wait windows, from handoff_rule).
- **Elastic shapes** (``PolicySpec.shapes``, policy ``predicted_elastic``): work is counted at the
  reference shape (the first, the chain's injected node count); a segment of ``n`` nodes does
  ``shape_rate(n)`` reference-seconds of work per second of training (linear in nodes times the
  spec's efficiency, which is both the simulated truth and what the rule is told). As in
  ``planning.submit_next``: the submit moment is the shipped policy's (its estimate is for the live
  segment's shape), and the shape is chosen when the segment is submitted, by
  ``chainrun.chain.shapes.choose_shape`` on the work left if the live segment stopped now and the
  model's median wait for every shape asked at once (``SimWatcher.shape_waits``, the watcher's
  ``_shape_waits``: one ``predict_many``), a segment's training ``segment - signal lead`` and a
  boundary's cost the signal lead (``segment_overhead`` of a chain with no measured segments).
  A segment planned while nothing is live (the first; one submitted after its predecessor ended)
  may be a **filler** (``chainrun.chain.shapes.choose_filler``, as ``shape_plan.choose``): the
  moment it starts, the reference successor is submitted (``planning.submit_after_filler``, sized
  as an early successor), and when that starts it cuts the filler (never the adaptive wait: the
  watcher writes no wait rule for a filler's successor).
- Completion overhead = (time the work is done - chain submission) - work, and it splits exactly
  into queue gaps (the first wait plus every boundary where the successor started after the
  hand-over point), restarts and hand-off minutes (and, for elastic chains, the slowdown: training
  time on a smaller shape beyond the reference work it did).

The policies are the shipped classes (``chainrun.chain.policies``), asked through an adapter that
builds the ``PolicyView`` the watcher builds (adapter.py). The oracle is greedy per boundary: for
each boundary, the latest submit time (on a ``oracle_step_s`` grid) whose successor starts by the
hand-over point, found with the future known, given the schedule so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from chainrun.chain import sizing
from chainrun.chain.pace import expected_training, shape_rate, total_tolerance, trained_so_far
from chainrun.chain.shapes import FILLER_MARGIN, DEFAULT_MARGIN_S, choose_filler, choose_shape
from chainrun.chain.policies import default_lead_s
from chainrun.sim import boundary
from chainrun.sim.scheduler import Scheduler

NAN = float("nan")


@dataclass(frozen=True)
class ChainWork:
    work_s: float = 168 * 3600.0
    segment_s: float = 48 * 3600.0
    restart_s: float = 600.0
    handoff_s: float = 300.0
    signal_lead_s: float = 300.0  # chainrun's default --signal USR2@300
    lead_s: float | None = None  # the chain's --lead (Lead's lead, Predicted's floor); None: the policy's default
    reactive_latency_s: float = 60.0  # the watcher notices an ended segment and submits
    tick_s: float = 600.0  # the watcher's finest step between asks
    poll_max_s: float = 6 * 3600.0
    oracle_step_s: float = 600.0
    horizon_s: float = 60 * 86400.0
    # how the next segment's limit is sized when it is submitted:
    # "shipped": as planning.plan does now, the work left as if the live segment stopped now
    #   (total - credited - trained_so_far), so an early start takes over ("takeover" is an alias);
    # "handover": the rule before the fix, the work left after the live segment trains to its
    #   hand-over point (a successor that starts early and cuts it is then too short: a spiral).
    successor_limit: str = "shipped"
    max_segments: int = 60  # a chain that needs more is reported as stuck (a hand-off spiral)
    pace: float = 1.0  # work per wall second of training on this cluster (two_sites.py: --pace)

    @property
    def save_s(self) -> float:
        """The payload's last save and exit once it stops training, at its signal or when asked to
        hand off: the same checkpoint either way, so the same time (``handoff_s``), within the
        signal lead. A successor trains from the checkpoint only once it is written."""
        return min(self.handoff_s, self.signal_lead_s)

    def runtime_s(self, limit_s: float) -> float:
        """A segment's job in the replayed queue: it trains to its signal, saves and exits."""
        return limit_s - self.signal_lead_s + self.save_s


SUCCESSOR_LIMITS = ("shipped", "handover", "takeover")  # "takeover": the shipped rule's old name


@dataclass(frozen=True)
class PolicySpec:
    name: str
    policy: str  # reactive | dependency | lead | predicted (shipped classes) | avg | oracle
    lead_s: float | None = None  # this chain's --lead (None: ChainWork.lead_s)
    adaptive: bool = False  # hand-off: wait instead of cutting when that is cheaper
    target: float | None = None  # predicted: the target probability (None: the shipped predict_quantile)
    lead_share: float | None = None  # predicted: the guard's MAX_LEAD_SHARE (None: the shipped constant)
    rule: str | None = None  # predicted: "quantile" or "slack" (None: the shipped PREDICTED_RULE)
    cost_s: float | None = None  # predicted: TRANSITION_COST_S, the cost of one more boundary (None: shipped)
    shapes: tuple[int, ...] | None = None  # elastic: node counts, the first the reference (= injected nodes)
    efficiency: float = 1.0  # elastic: every other shape's rate relative to linear in nodes
    margin_s: float = DEFAULT_MARGIN_S  # elastic: what another shape must save to be chosen (choose_shape)
    filler_margin: float | None = FILLER_MARGIN  # elastic: a filler's least gain, in boundaries; None: no filler


def default_specs(fixed_leads_s=(2 * 3600.0, 6 * 3600.0, 12 * 3600.0, 24 * 3600.0)) -> list[PolicySpec]:
    # The watcher writes the adaptive hand-off rule for every successor it queues early, whatever the
    # policy (chainrun.chain.handoff_plan.write_rule), so every early-submitting row replays it; only
    # `predicted_cut` keeps every early start cutting, for comparison.
    specs = [PolicySpec("reactive", "reactive"), PolicySpec("dependency", "dependency"),
             PolicySpec("lead_1h", "lead", lead_s=3600.0, adaptive=True)]
    specs += [PolicySpec(f"fixed_{int(s // 3600)}h", "lead", lead_s=float(s), adaptive=True) for s in fixed_leads_s]
    specs += [PolicySpec("avg", "avg", adaptive=True), PolicySpec("predicted", "predicted", adaptive=True),
              PolicySpec("predicted_cut", "predicted"), PolicySpec("oracle", "oracle")]
    return specs


def elastic_specs(shapes: tuple[int, ...], efficiencies=(1.0,), margin_s: float = DEFAULT_MARGIN_S,
                  filler_margin: float | None = FILLER_MARGIN) -> list[PolicySpec]:
    """The elastic comparison (chains of ``shapes[0]`` nodes): reactive (it defines the load
    levels), fixed-shape ``predicted`` and ``predicted_elastic`` at each efficiency (the first
    unsuffixed, then e.g. ``predicted_elastic_eff80``), fillers at ``filler_margin``."""
    from dataclasses import replace

    shipped = next(s for s in default_specs() if s.name == "predicted")  # what `--policy predicted` does
    specs = [PolicySpec("reactive", "reactive"), shipped]
    for i, e in enumerate(efficiencies):
        name = "predicted_elastic" if i == 0 else f"predicted_elastic_eff{int(round(e * 100))}"
        specs.append(replace(shipped, name=name, shapes=tuple(shapes), efficiency=float(e), margin_s=margin_s,
                             filler_margin=filler_margin))
    return specs


@dataclass
class Seg:
    jid: int
    idx: int
    submit: float
    limit: float
    start: float = NAN
    train_start: float = NAN  # when its payload got the chain
    stop: float = NAN  # when its training stopped (signal, hand-off or done)
    exit: float = NAN  # when its job ended
    nodes: int = 0
    rate: float = 1.0  # reference-seconds of work per second of training (elastic shapes)
    filler: bool = False  # elastic: runs while the reference shape queues (choose_filler)


@dataclass
class ChainRun:
    policy: str
    t0: float
    nodes: int
    work_s: float
    first_start: float = NAN
    finish: float = NAN
    segments: int = 0
    queue_s: float = 0.0  # first wait + positive boundary gaps
    first_wait_s: float = 0.0
    restart_s: float = 0.0
    handoff_s: float = 0.0
    twice_node_s: float = 0.0  # node-seconds held by two segments of the chain at once
    # [(gap_s signed: start - the predecessor's end at its signal, hand-over point + save; cut_s)]
    boundaries: list = field(default_factory=list)
    stuck: bool = False  # needed more than max_segments (short segments cutting each other)
    shapes: list = field(default_factory=list)  # node count of every segment that started
    slow_s: float = 0.0  # elastic: training time beyond the work (segments slower than the reference)
    fillers: int = 0  # elastic: filler segments that started
    ended: float = NAN  # when the replay stopped following the chain: done, stuck or past the horizon


    @property
    def done(self) -> bool:
        return self.finish == self.finish

    @property
    def overhead_s(self) -> float:
        return self.finish - self.t0 - self.work_s


def run_chain(base: Scheduler, t0: float, nodes: int, jid0: int, spec: PolicySpec, work: ChainWork,
              watcher, trunk=None, stop_at: float = math.inf) -> ChainRun:
    """One chain under one policy, on its own fork of ``base`` (already run to ``t0``). ``trunk``
    (chainrun/sim/trunk.py, one per point, the same ``jid0`` for every policy): the stretches of
    replay this chain shares with a policy run before it at this point are not recomputed.
    ``stop_at``: a chain that cannot be done before it is not followed past it (its ``ended`` is then
    ``stop_at`` or later); one that is done before it is replayed exactly as without it."""
    c = _Chain(base, t0, nodes, jid0, spec, work, watcher, trunk)
    c.stop_at = stop_at
    r = c.run()
    r.ended = max(r.finish, c.sim.now) if r.done else c.sim.now  # all it saw of the trace is before this
    if not r.done and not r.stuck and stop_at != math.inf:
        r.ended = max(r.ended, stop_at)
    return r


class _Chain:
    def __init__(self, base, t0, nodes, jid0, spec, work, watcher, trunk=None) -> None:
        from chainrun.sim.adapter import engine_chain

        if work.successor_limit not in SUCCESSOR_LIMITS:
            raise ValueError(f"successor_limit {work.successor_limit!r}: use shipped or handover")
        self.sim = base.fork()
        self.sim.run_until(t0)
        self.trunk = trunk
        self.log: tuple | None = () if trunk is not None else None  # what it did to the partition (trunk.py)
        self.t0, self.nodes, self.spec, self.work, self.watcher = t0, nodes, spec, work, watcher
        self.lead_s = spec.lead_s if spec.lead_s is not None else \
            (default_lead_s(spec.policy) if work.lead_s is None else work.lead_s)  # as chainrun submit does
        self.next_jid = jid0
        self.segs: list[Seg] = []
        self.policy = watcher.policy(spec)
        self.out = ChainRun(spec.name, t0, nodes, work.work_s)
        self.chain = engine_chain(work, self.lead_s, spec.policy)  # the watcher's chain record
        self.tolerance = total_tolerance(self.chain)
        self.shapes = tuple(spec.shapes) if spec.shapes else None
        if self.shapes and self.shapes[0] != nodes:
            raise ValueError(f"{spec.name}: reference shape {self.shapes[0]} != the chain's {nodes} nodes")
        self.eff = {n: spec.efficiency for n in (self.shapes or ())[1:]}
        self.choices: list = []  # elastic: (time, ShapeChoice) of every submitted segment
        self.stop_at = math.inf  # run_chain's: not followed past it

    def limit_for(self, left_s: float, rate: float = 1.0) -> float:
        """As planning.submit_next: the work left (at least a minute) plus the signal lead, in whole
        minutes, at most a segment; plus the restart, which is the replay's (the watcher's --total
        counts it as training). ``rate``: the segment's shape's (the work left takes 1/rate as long)."""
        w = self.work
        return sizing.segment_limit(left_s, segment_s=w.segment_s, signal_lead_s=w.signal_lead_s, rate=rate,
                                    restart_s=w.restart_s)

    def expected(self, s: Seg) -> float:
        """Work a live segment should still deliver if it trains to its hand-over point
        (``expected_training``, less its restart)."""
        from chainrun.sim.adapter import engine_segment

        return sizing.expected_work(expected_training(self.chain, engine_segment(s, False)), rate=s.rate,
                                    restart_s=self.work.restart_s)

    def left_if_cut(self, cur: Seg, done_s: float, next_rate: float = 1.0) -> float:
        """planning.plan's size for a successor submitted while ``cur`` is live: the work left as if
        ``cur`` stopped now (``trained_so_far``: from its job's start, as the engine counts it;
        before it starts, nothing). In the replay's units: its restart is lost work (limit_for adds
        it), and so are the hand-off minutes the successor waits while ``cur`` saves, which the
        watcher credits to ``cur`` as training (its payload runs until it has saved): added here, as
        the work the successor (of rate ``next_rate``) could do in that time."""
        from chainrun.sim.adapter import engine_segment

        running = cur.start == cur.start and cur.start <= self.sim.now
        trained = trained_so_far(engine_segment(cur, running), self.sim.now)
        handoff = self.work.handoff_s if running else 0.0  # a pending segment is not cut
        return sizing.left_if_cut(self.work.work_s, done_s, trained, rate=cur.rate, restart_s=self.work.restart_s,
                                  handoff_s=handoff, next_rate=next_rate)

    def may_submit(self, cur: Seg, done_s: float) -> bool:
        """``sizing.may_submit``, the watcher's last check before an early successor: the work done so
        far has not reached the total. Always true while the replay polls (the work left if ``cur``
        stopped now is at least the work left after its hand-over point, which the gate found above
        the tolerance), so it changes no replayed chain; asked for the same code path as the watcher."""
        return sizing.may_submit(left_if_cut_s=self.left_if_cut(cur, done_s, 0.0), tolerance_s=self.tolerance)

    def submit(self, left_s: float, dep: Seg | None = None, cur: Seg | None = None, done_s: float = 0.0,
               oracle: bool = False, reference: bool = False) -> Seg:
        """``left_s``: the work left after ``cur`` trains to its hand-over point (the old rule); with
        ``cur`` live, the shipped rule sizes for ``left_if_cut`` instead. ``reference``: the reference
        shape without asking the rule (a filler's successor)."""
        oracle_sized = cur is not None and oracle and cur.start == cur.start
        if oracle_sized:
            # the oracle (a bound, not a shipped rule): what its short cut leaves, hand-off included
            left_s = self.work.work_s - done_s - max(0.0, self.sim.now - cur.train_start - self.work.restart_s) \
                + self.work.handoff_s
        take_over = cur is not None and not oracle_sized and self.work.successor_limit != "handover"
        nodes, rate, filler = self.nodes, self.work.pace, False  # pace: the site's (two_sites.py)
        if self.shapes and not reference:  # elastic: the shape rule on the work left (as if cur stopped now)
            choice = self.choose(self.left_if_cut(cur, done_s, 0.0) if take_over else left_s, cur)
            self.choices.append((self.sim.now, choice))
            nodes, rate = choice.nodes, shape_rate(choice.nodes, self.nodes, efficiency=self.eff)
            filler = choice.filler
        if take_over:
            left_s = self.left_if_cut(cur, done_s, rate)
        s = Seg(self.next_jid, len(self.segs), self.sim.now, self.limit_for(left_s, rate), nodes=nodes, rate=rate,
                filler=filler)
        self.next_jid += 1
        runtime = self.work.runtime_s(s.limit)
        if dep is not None:
            self.sim.submit_after(s.jid, dep.jid, nodes, s.limit, runtime)
        else:
            self.sim.submit(s.jid, nodes, s.limit, runtime)
        self._did(("submit", s.jid, dep.jid if dep is not None else None, nodes, s.limit, runtime))
        self.segs.append(s)
        return s

    def choose(self, left_s: float, cur: Seg | None):
        """``shape_plan.choose`` in the replay: ``choose_shape`` on the model's median wait for
        every shape (asked with the live segment ``cur`` in the queue; for a segment planned while
        nothing is live, the request as it would be queued now), the watcher's segment capacity and
        boundary cost; then, when nothing is live and the reference is kept, ``choose_filler`` on the
        same waits."""
        from chainrun.chain.pace import segment_overhead

        w = self.work
        live = cur is not None
        if cur is None:
            cur = Seg(-3, 0, self.sim.now, w.segment_s, start=self.sim.now, nodes=self.nodes)
        waits = self.watcher.shape_waits(self.sim, self.sim.now, cur, self.segs, self.shapes,
                                         lead_s=self.lead_s, work=w)
        overhead = segment_overhead(self.chain, [])
        choice = choose_shape(max(left_s, 0.0), self.shapes, waits, segment_s=max(60.0, w.segment_s - overhead),
                              boundary_s=overhead, efficiency=self.eff, margin_s=self.spec.margin_s)
        if live or choice.nodes != self.nodes or self.spec.filler_margin is None:
            return choice
        return choose_filler(self.shapes, waits, boundary_s=overhead, efficiency=self.eff,
                             margin=self.spec.filler_margin) or choice

    def ask(self, cur: Seg, running: bool, left_after: float | None = None):
        """The policy's decision now; ``left_after``: the work left once ``cur`` trains to its
        hand-over point (for the chain's slack, ``cut_allowance``, as planning.plan computes it)."""
        w = self.work
        allowance = None if left_after is None else sizing.slack_allowance(
            left_after, segment_s=w.segment_s, overhead_s=w.signal_lead_s, handoff_s=w.handoff_s, restart_s=w.restart_s)
        return self.watcher.ask(self.policy, self.sim, self.sim.now, cur, self.segs, running=running,
                                lead_s=self.lead_s, nodes=cur.nodes or self.nodes, work=self.work,
                                target=self.spec.target, cut_allowance_s=allowance)

    def run(self) -> ChainRun:
        w, run, horizon = self.work, self.out, min(self.t0 + self.work.horizon_s, self.stop_at)
        cap_full = w.segment_s - w.signal_lead_s - w.restart_s
        done_s = 0.0  # work delivered by segments that stopped
        cur = self.submit(w.work_s)
        nxt: Seg | None = None
        # pending: dependency pre-queues (never behind a filler: the engine waits until it runs)
        after = sizing.work_after(w.work_s, 0.0, self.expected(cur))
        if sizing.plan_gate(live=1, work_after_s=after, tolerance_s=self.tolerance) == sizing.ASK \
                and self.policy is not None and not cur.filler:
            d = self.ask(cur, running=False, left_after=after)
            if d.submit:
                nxt = self.submit(w.work_s - self.expected(cur), cur if d.dependency else None, cur)
        b = self._until_started(cur.jid, horizon)
        if b != b:
            return run
        cur.start = cur.train_start = b
        run.shapes.append(cur.nodes)
        run.fillers += cur.filler
        run.first_start = b
        run.first_wait_s = run.queue_s = b - self.t0
        while True:
            run.restart_s += w.restart_s
            h = cur.start + cur.limit - w.signal_lead_s  # hand-over point
            left_after = sizing.work_after(w.work_s, done_s, sizing.expected_work(
                h - cur.train_start, rate=cur.rate, restart_s=w.restart_s))
            if sizing.plan_gate(live=1, work_after_s=left_after, tolerance_s=self.tolerance) != sizing.ASK:
                # the last segment: the work is done before its hand-over point
                run.finish = cur.train_start + w.restart_s + (w.work_s - done_s) / cur.rate
                run.slow_s += (w.work_s - done_s) * (1.0 / cur.rate - 1.0)
                run.segments = len([s for s in self.segs if s.start == s.start])
                return run
            if len(self.segs) >= w.max_segments:
                run.stuck = True
                run.segments = len(self.segs)
                return run
            if h >= self.stop_at:  # it needs a successor after h: it cannot be done before stop_at
                return run
            if nxt is None and cur.filler:  # planning.submit_after_filler: the reference, the moment it runs
                nxt = self.submit(left_after, None, cur, done_s, reference=True)
            if nxt is None:
                self.done_s = done_s
                nxt = self.oracle(cur, h, left_after) if self.spec.policy == "oracle" else \
                    self.poll(cur, h, left_after)
            bn = self._until_started(nxt.jid, horizon)
            if bn != bn:
                return run
            nxt.start = bn
            run.shapes.append(nxt.nodes)
            run.fillers += nxt.filler
            boundary.hand_over(run, cur, nxt, h, bn, w, adaptive=self.spec.adaptive and not cur.filler,
                               left_after=left_after, full_capacity_s=cap_full, lead_s=self.lead_s, cut=self._cut)
            done_s += boundary.close(run, cur, w)
            cur, nxt = nxt, None

    # ---- the partition, through the point's trunk when there is one (trunk.py) ----------------
    def _cut(self, jid: int, at: float) -> None:
        self.sim.cut(jid, at)
        self._did(("cut", jid, at))

    def _did(self, action: tuple) -> None:
        if self.log is not None:
            self.log = self.log + ((self.sim.now, *action),)

    def _run_until(self, t: float) -> None:
        if self.log is None:
            self.sim.run_until(t)
        else:
            self.sim = self.trunk.advance(self.sim, self.log, t)

    def _until_started(self, jid: int, horizon: float) -> float:
        if self.log is None:
            return self.sim.run_until_started(jid, horizon)
        r, self.sim = self.trunk.until_started(self.sim, self.log, jid, horizon)
        return r

    def poll(self, cur: Seg, h: float, left_after: float) -> Seg:
        """Ask the policy on the watcher's tick grid while ``cur`` runs; submit when it says so,
        or once ``cur`` has ended (every policy's fallback: the whole of reactive)."""
        t = first_ask(max(self.sim.now, cur.start), cur.start, self.policy,
                      lambda: self.watcher.view(cur, h, self.lead_s, self.work), self.work.tick_s)
        while t < h:
            self._run_until(t)
            d = self.ask(cur, running=True, left_after=left_after)
            if d.submit and self.may_submit(cur, self.done_s):
                return self.submit(left_after, cur if d.dependency else None, cur, self.done_s)
            t = _next_ask(t, h, d, self.policy, self.work, self.lead_s)
        self._run_until(h + self.work.save_s + self.work.reactive_latency_s)
        return self.submit(left_after)  # the current segment has ended: nothing to take over

    def oracle(self, cur: Seg, h: float, left_after: float) -> Seg:
        """Greedy per boundary, future known: the latest grid submit time whose successor starts
        by ``cur``'s exit (its hand-over point and its last save: no interruption, the least cut);
        if none does, the earliest."""
        w = self.work
        e = h + w.save_s
        self.log = None  # it forks the partition itself: from here on it shares nothing (trunk.py)
        limit = self.limit_for(left_after)  # the oracle submits by the hand-over point: no take-over needed
        probe = -2  # a job id no one else uses
        grid: list[tuple[float, Scheduler]] = []
        t = max(self.sim.now, cur.start)
        while True:
            self.sim.run_until(t)
            grid.append((t, self.sim.fork()))
            if t >= e:
                break
            t = min(e, t + w.oracle_step_s)
        starts: dict[int, float] = {}

        def start(k: int) -> float:
            if k not in starts:
                f = grid[k][1].fork()
                f.submit(probe, self.nodes, limit, w.runtime_s(limit))
                # the search only asks whether a probe starts by e: one not started then is
                # inf, without replaying the queue on to its start
                s = f.run_until_started(probe, e)
                starts[k] = s if s == s else math.inf
            return starts[k]

        lo, hi = 0, len(grid) - 1
        if start(lo) > e:
            best = lo
        elif start(hi) <= e:
            best = hi
        else:
            while hi - lo > 1:  # start(lo) <= e < start(hi)
                mid = (lo + hi) // 2
                if start(mid) <= e:
                    lo = mid
                else:
                    hi = mid
            best = lo
        self.sim = grid[best][1]
        # a bound, not a shipped rule: sized to take over what its (short) cut leaves
        return self.submit(left_after, None, cur, self.done_s, oracle=True)


def first_ask(t: float, start: float, policy, view, tick_s: float) -> float:
    """The first ask of a poll from ``t``, on the watcher's tick grid from the segment's ``start``.
    Predicted's guard says no ask submits before ``earliest``: the asks before it are skipped (exact),
    and the first one is the first tick at or after it, as a watcher that acts only on ticks asks
    (so candidates whose guards open within one tick share that ask, and the trunk's states)."""
    if not hasattr(policy, "earliest"):
        return t
    first = policy.earliest(view())
    if first is None or first <= t:
        return t
    return max(t, start + math.ceil((first - start) / tick_s - 1e-9) * tick_s)


def _next_ask(t: float, h: float, d, policy, work: ChainWork, lead_s: float) -> float:
    """The next tick the decision can change on. Exact for reactive (never before the end) and
    lead (its due time); for a decision that carries a wait estimate, half the distance to the
    moment the time left reaches max(estimate, --lead), on the tick grid (the queue may fill
    meanwhile); else the next tick."""
    tick = work.tick_s
    name = getattr(policy, "name", "")
    if name == "reactive":
        return h
    if name == "lead":
        k = max(1, math.ceil((h - lead_s - t) / tick))
        return t + k * tick
    est = getattr(d, "estimate", None)
    due = getattr(d, "due_lead_s", None)  # the slack rule says which lead it now aims at
    if due is not None or (est is not None and est.seconds == est.seconds):
        wait = (h - t - max(float(due if due is not None else est.seconds), lead_s)) / 2
        steps = max(1, int(min(wait, work.poll_max_s) // tick))
        return t + steps * tick
    return t + tick
