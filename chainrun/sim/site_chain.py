"""One chain over several clusters in the replay: the policy ``predicted_multi`` (issue #26).

The chain is chains.py's, run on one replayed partition per site (each site its own trace, model
and watcher, chainrun/sim/two_sites.py), all on one clock:

- **When** a successor is submitted is the shipped ``predicted`` class's decision, asked as the
  watcher asks it (adapter.py) for every site with that site's wait estimate: it is submitted when
  the decision for the site the rule currently picks says so (the next ask is the soonest any
  site's decision may change);
  **where** is ``chainrun.chain.site_choice.choose_site`` at that moment, on every site's estimate
  (the model's p10/p50/p90 and its target quantile for the successor's request on that site's
  queue), the checkpoint transfer (0 on the current site), the restart, the site's pace and the
  margin. The first segment's site is chosen the same way at injection (not a move). A successor
  submitted after its predecessor ended (the reactive fallback) is placed by the same rule.
- A successor on the **same site** is replayed exactly as in chains.py (hand-off or the adaptive wait).
- A **move** (a successor on another site) is charged in full. The predecessor is asked to stop when
  the successor starts (or stops at its own hand-over point), saves and exits ``save_s`` later;
  its checkpoints (every ``checkpoint_every_s`` of training, and the final one at its exit) reach
  the new site ``transfer_s`` after they are written. The successor then either waits for the final
  checkpoint (delay: it holds its nodes without training) or resumes at once from the newest
  checkpoint that has arrived and redoes the work since (lost work), whichever costs less time to
  the same work: what the driver decides with the same numbers. A move's successor is sized for
  the transfer and a checkpoint interval more, so the lost minutes do not need an extra segment.
- GPU-hours held twice: both sites' jobs of the chain holding nodes at once (the predecessor saving
  after its successor started), as on one site.
- A successor **pending** on the chain's site is reconsidered as the watcher does
  (``chainrun.chain.site_plan.reconsider``): on the watcher's tick grid, every ``RECONSIDER_EVERY_S`` at
  most, Slurm's expected start for it (what ``squeue --start`` shows: the replayed partition's backfill
  plan over the running jobs' *limits* and the jobs ahead of it, expected_start.py), no longer than the
  site's model median for the same request now (``site_plan.pending_wait_s``), is weighed against the
  other sites' model medians by ``site_plan.weigh_pending`` (``choose_site``, the same margin, segment and
  boundary as every choice here). When another site is expected to finish more than the margin sooner,
  the pending job is cancelled (it never trained: no GPU-hours) and the successor is planned again at
  once (the watcher's next tick), the current site's wait no earlier than that plan (``site_plan.plan_holds``);
  a successor then placed on another site is a move, charged as any.
- **Race** (``MoveRules.race``, the row ``predicted_multi_race``): whenever nothing of the chain is
  live (its first segment, a successor submitted after its predecessor ended) the segment is submitted
  on every site where it could win (``site_choice.race_sites``: not where the chain, even started at
  once, is done later than on the rule's site after its median wait); the first to start is kept and the others are cancelled when the driver notices
  (``reactive_latency_s`` later): one that started meanwhile held its nodes until then, counted as
  GPU-hours held twice. Successors asked for while a segment runs are placed by the rule as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from chainrun.chain import site_plan, sizing
from chainrun.chain.pace import total_tolerance, trained_so_far
from chainrun.chain.policies import default_lead_s
from chainrun.chain.site_choice import SiteChoice, SiteOption, choose_site, race_sites
from chainrun.sim import boundary
from chainrun.sim.chains import ChainRun, ChainWork, PolicySpec, Seg, _next_ask, first_ask

TRANSFER_S = 900.0  # the 15 min checkpoint copy between the sites
CHECKPOINT_EVERY_S = 1800.0  # the payload saves a checkpoint every 30 min of training (and when it stops)


@dataclass(frozen=True)
class Site:
    """One cluster of the replay: its partition advanced to the chain's injection, its watcher, its pace."""

    name: str
    base: object  # chainrun.sim.scheduler.Scheduler
    watcher: object  # chainrun.sim.adapter.SimWatcher
    pace: float = 1.0


@dataclass(frozen=True)
class MoveRules:
    margin_s: float
    transfer_s: float = TRANSFER_S
    checkpoint_every_s: float = CHECKPOINT_EVERY_S
    race: bool = False  # submit a segment planned while nothing is live on every site; keep the first to start


@dataclass
class SiteRun(ChainRun):
    moves: int = 0
    move_cost_s: float = 0.0  # delay before a moved successor trains, plus the work it redid
    sites: list = field(default_factory=list)  # the site of every segment that started
    lost_work_moves: int = 0  # moves that resumed from an older copied checkpoint
    race_duplicates: int = 0  # raced segments that started before they were cancelled
    pending_moves: int = 0  # successors cancelled while pending on the chain's site to be placed again
    cancelled: list = field(default_factory=list)  # (when, jid, from site, to site) of each
    weighed: list = field(default_factory=list)  # (when, jid, Slurm's planned start, {site: finish_s}) of each weighing


def run_site_chain(sites: list[Site], t0: float, nodes: int, jid0: int, spec: PolicySpec, work: ChainWork,
                   rules: MoveRules) -> SiteRun:
    c = _SiteChain(sites, t0, nodes, jid0, spec, work, rules)
    r = c.run()
    r.ended = max(r.finish, c.now) if r.done else c.now
    return r


class _SiteChain:
    def __init__(self, sites, t0, nodes, jid0, spec, work, rules) -> None:
        from chainrun.sim.adapter import engine_chain

        if spec.policy != "predicted":
            raise ValueError(f"{spec.name}: the multi-site replay runs the predicted policy only")
        self.sites = {s.name: s for s in sites}
        self.order = [s.name for s in sites]
        self.sims = {}
        for s in sites:
            self.sims[s.name] = s.base.fork()
            self.sims[s.name].run_until(t0)
        self.now = t0
        self.t0, self.nodes, self.spec, self.work, self.rules = t0, nodes, spec, work, rules
        self.lead_s = spec.lead_s if spec.lead_s is not None else \
            (default_lead_s(spec.policy) if work.lead_s is None else work.lead_s)
        self.next_jid = jid0
        self.segs: list[Seg] = []
        self.site_of: dict[int, str] = {}
        self.policy = sites[0].watcher.policy(spec)
        self.chain = engine_chain(work, self.lead_s, spec.policy)
        self.tolerance = total_tolerance(self.chain)
        self.out = SiteRun(spec.name, t0, nodes, work.work_s)
        self.choices: list[tuple[float, SiteChoice]] = []
        self.reconsidered_at = float("-inf")  # the last time a pending successor was weighed
        self.planned: tuple | None = None  # (site, Slurm's planned start, when read) of the last weighing

    # ---- the clock: every site's partition at ``now`` -------------------------------------
    def sim(self, site: str):
        s = self.sims[site]
        if s.now < self.now:
            s.run_until(self.now)
        return s

    def _until_started(self, seg: Seg, horizon: float) -> float:
        s = self.sim(self.site_of[seg.jid])
        b = s.run_until_started(seg.jid, horizon)
        self.now = max(self.now, s.now)
        return b

    # ---- sizes, as chains._Chain ----------------------------------------------------------
    def limit_for(self, left_s: float, rate: float) -> float:
        w = self.work
        return sizing.segment_limit(left_s, segment_s=w.segment_s, signal_lead_s=w.signal_lead_s, rate=rate,
                                    restart_s=w.restart_s)

    def left_if_cut(self, cur: Seg, done_s: float, next_rate: float) -> float:
        from chainrun.sim.adapter import engine_segment

        running = cur.start == cur.start and cur.start <= self.now
        trained = trained_so_far(engine_segment(cur, running), self.now)
        handoff = self.work.handoff_s if running else 0.0
        return sizing.left_if_cut(self.work.work_s, done_s, trained, rate=cur.rate, restart_s=self.work.restart_s,
                                  handoff_s=handoff, next_rate=next_rate)

    # ---- the two decisions -----------------------------------------------------------------
    def estimate(self, site: str, cur: Seg):
        """The watcher's estimate on ``site`` for a successor of ``cur``'s request, with the chain's own
        segments on that site in its history (what that cluster's sacct shows)."""
        from chainrun.sim.adapter import engine_chain, engine_segment

        running = cur.start == cur.start and cur.start <= self.now
        mine = [s for s in self.segs if self.site_of[s.jid] == site]
        return self.sites[site].watcher.estimate(self.sim(site), self.now, engine_chain(self.work, self.lead_s,
                                                 "predicted"), engine_segment(cur, running), cur, mine, self.nodes,
                                                 self.spec.target)

    def rule_numbers(self) -> dict[str, float]:
        """The rule's segment (its limit less the signal lead and the restart) and boundary (the
        restart and the hand-off): site_plan.boundaries in the replay's numbers."""
        w = self.work
        return {"segment_s": w.segment_s - w.signal_lead_s - w.restart_s, "boundary_s": w.restart_s + w.handoff_s}

    def no_earlier_than_planned(self, site: str, median_s: float) -> float:
        """A median wait on ``site``, no earlier than Slurm's plan for the job of the chain last weighed
        there while that plan holds (site_plan._at_least_planned)."""
        if self.planned is None or self.planned[0] != site:
            return median_s
        _, planned, seen_at = self.planned
        return max(median_s, planned - self.now) if site_plan.plan_holds(planned, seen_at, self.now) else median_s

    def where(self, cur: Seg | None, left_s: float, ready_in_s: float) -> SiteChoice:
        """``choose_site`` on every site's estimate now (``cur`` None: the first placement)."""
        probe = cur if cur is not None else Seg(-3, 0, self.now, self.work.segment_s, start=self.now, nodes=self.nodes)
        here = self.site_of[cur.jid] if cur is not None else None
        options = []
        for name in self.order:
            est = self.estimate(name, probe)
            if est is None:  # no model answer there: only the current site stays a candidate (waits unknown)
                if name == here:
                    options.append(SiteOption(name, {0.5: self.no_earlier_than_planned(name, 0.0)}, 0.0,
                                              self.work.restart_s, self.sites[name].pace))
                continue
            # the model's own levels (its target quantile may be an extrapolated tail: at q0.98 it can read
            # months, which would make a queue look hopeless that the model thinks is a day)
            dist = {q: v for q, v in ((0.1, est.p10), (0.5, est.p50), (0.9, est.p90)) if v is not None}
            if not dist:
                dist = {0.5: est.seconds}
            dist[0.5] = self.no_earlier_than_planned(name, dist[0.5])
            move = here is not None and name != here
            options.append(SiteOption(name, dist, self.rules.transfer_s if move else 0.0, self.work.restart_s,
                                      self.sites[name].pace))
        if not options:
            options = [SiteOption(here or self.order[0], {0.5: 0.0}, 0.0, self.work.restart_s,
                                  self.sites[here or self.order[0]].pace)]
        choice = choose_site(here, options, remaining_s=left_s, margin_s=self.rules.margin_s, ready_in_s=ready_in_s,
                             **self.rule_numbers())
        self.choices.append((self.now, choice))
        return choice

    def reconsider(self, seg: Seg, cur: Seg, h: float, left_after: float) -> SiteChoice | None:
        """site_plan.reconsider on ``seg``, pending on ``cur``'s site: Slurm's expected start for it (no
        later than the site model's own median for the same request now) against the other sites' medians now.
        None when Slurm has no plan for it (nothing to weigh)."""
        here = self.site_of[seg.jid]
        planned = self.sim(here).expected_start(seg.jid)
        if planned is None:
            return None
        self.reconsidered_at = self.now
        self.planned = (here, planned, self.now)
        w = self.work
        others = []
        for name in self.order:
            est = self.estimate(name, cur) if name != here else None
            if est is not None:
                others.append(SiteOption(name, {0.5: site_plan.median_s(est)}, self.rules.transfer_s, w.restart_s,
                                         self.sites[name].pace))
        fresh = self.estimate(here, cur)  # the same request there now (site_plan.reconsider's bounded=False)
        current = SiteOption(here, {0.5: site_plan.pending_wait_s(planned, self.now, None if fresh is None else
                                                                  site_plan.own_median_s(fresh))}, 0.0, w.restart_s,
                             self.sites[here].pace)
        # the work left once cur trains to its hand-over point (site_plan.work_after_running); once cur
        # has ended, left_after is what is left after it too
        remaining = left_after
        choice = site_plan.weigh_pending(current, others, remaining_s=remaining, margin_s=self.rules.margin_s,
                                         ready_in_s=max(0.0, h - self.now), **self.rule_numbers())
        self.choices.append((self.now, choice))
        self.out.weighed.append((self.now, seg.jid, planned, choice.finish_s))
        return choice

    def ask(self, cur: Seg, h: float, left_after: float) -> tuple[dict, SiteChoice]:
        """The policy's decision for a successor on every site (each with that site's estimate), and
        the site the rule picks now."""
        w = self.work
        choice = self.where(cur, left_after, max(0.0, h - self.now))
        allowance = sizing.slack_allowance(left_after, segment_s=w.segment_s, overhead_s=w.signal_lead_s,
                                           handoff_s=w.handoff_s, restart_s=w.restart_s)
        out = {}
        for site in self.order:
            mine = [s for s in self.segs if self.site_of[s.jid] == site]
            out[site] = self.sites[site].watcher.ask(self.policy, self.sim(site), self.now, cur, mine, running=True,
                                                     lead_s=self.lead_s, nodes=self.nodes, work=w,
                                                     target=self.spec.target, cut_allowance_s=allowance)
        return out, choice

    def submit(self, left_s: float, site: str, cur: Seg | None = None, done_s: float = 0.0,
               dep: Seg | None = None, prev: Seg | None = None) -> Seg:
        """``cur``: the live segment a successor takes over from (sized as if it stopped now); ``prev``:
        the chain's newest segment (``cur`` when given): on another site, room for the transfer."""
        rate = self.sites[site].pace
        prev = cur if cur is not None else prev
        if cur is not None and self.work.successor_limit != "handover":
            left_s = self.left_if_cut(cur, done_s, rate)
        if prev is not None and self.site_of[prev.jid] != site:  # room for the transfer and a checkpoint interval
            left_s += (self.rules.transfer_s + self.rules.checkpoint_every_s) * rate
        s = Seg(self.next_jid, len(self.segs), self.now, self.limit_for(left_s, rate), nodes=self.nodes, rate=rate)
        self.next_jid += 1
        self.site_of[s.jid] = site
        sim = self.sim(site)
        runtime = self.work.runtime_s(s.limit)
        if dep is not None and self.site_of[dep.jid] == site:
            sim.submit_after(s.jid, dep.jid, self.nodes, s.limit, runtime)
        else:
            sim.submit(s.jid, self.nodes, s.limit, runtime)
        self.segs.append(s)
        return s

    def place(self, left_s: float, prev: Seg | None) -> list[Seg]:
        """A segment planned while nothing is live: on the rule's site, or raced on every site."""
        if self.rules.race and len(self.order) > 1:  # not where it cannot win (site_choice.race_sites)
            raced, _ = race_sites(self.where(prev, left_s, 0.0), self.order)
            return [self.submit(left_s, site, prev=prev) for site in raced]
        return [self.submit(left_s, self.where(prev, left_s, 0.0).site, prev=prev)]

    def first_to_start(self, cands: list[Seg], horizon: float) -> tuple[Seg | None, float]:
        """The candidate that starts first (ties: the preferred site) and its start; the others are
        cancelled when the driver notices, one that started meanwhile counted as held twice."""
        if len(cands) == 1:
            return cands[0], self._until_started(cands[0], horizon)
        sims = {c.jid: self.sim(self.site_of[c.jid]) for c in cands}
        while True:
            started = [(sims[c.jid].watched[c.jid], self.order.index(self.site_of[c.jid]), c) for c in cands
                       if sims[c.jid].watched[c.jid] == sims[c.jid].watched[c.jid]]
            if started:
                break
            t = min(x.next_event() for x in sims.values())
            if t > horizon or t == float("inf"):
                return None, float("nan")
            for x in sims.values():
                x.run_until(t)
            self.now = max(self.now, t)
        b, _, win = min(started, key=lambda s: (s[0], s[1]))
        notice = b + self.work.reactive_latency_s
        for c in cands:
            if c is win:
                continue
            x = sims[c.jid]
            x.run_until(notice)
            st = x.watched[c.jid]
            if st == st:  # it started too: it held its nodes until cancelled
                x.cut(c.jid, notice)
                self.out.twice_node_s += max(0.0, notice - st) * c.nodes
                self.out.race_duplicates += 1
            else:
                _cancel(x, c.jid)
            self.segs.remove(c)
        self.now = b
        return win, b

    def await_start(self, cur: Seg, h: float, left_after: float, done_s: float, cands: list[Seg],
                    horizon: float) -> tuple[Seg | None, float]:
        """``first_to_start`` for ``cur``'s successor; one pending on ``cur``'s site is reconsidered
        (``pending``) and, when cancelled, planned again at once (``poll``: the watcher's next tick)."""
        while len(cands) == 1 and self.site_of[cands[0].jid] == self.site_of[cur.jid]:
            b = self.pending(cands[0], cur, h, left_after, horizon)
            if b is not None:
                return cands[0], b
            cands = self.poll(cur, h, left_after, done_s)
        return self.first_to_start(cands, horizon)

    def pending(self, seg: Seg, cur: Seg, h: float, left_after: float, horizon: float) -> float | None:
        """Run until ``seg`` starts (its start; nan past ``horizon``), weighing it on the watcher's ticks
        (from ``cur``'s start) every RECONSIDER_EVERY_S at most; None when it was cancelled to move."""
        site, tick = self.site_of[seg.jid], self.work.tick_s
        sim = self.sim(site)
        t = _tick_after(cur.start, tick, max(seg.submit, self.reconsidered_at + site_plan.RECONSIDER_EVERY_S - 1e-6))
        while True:
            b = sim.run_until_started(seg.jid, min(t, horizon))
            self.now = max(self.now, sim.now)
            if b == b or t > horizon:
                return b
            self.now = t
            sim.run_until(t)
            choice = self.reconsider(seg, cur, h, left_after)
            if choice is not None and choice.move:
                _cancel(sim, seg.jid)
                self.segs.remove(seg)
                self.out.pending_moves += 1
                self.out.cancelled.append((self.now, seg.jid, site, choice.site))
                return None
            t = _tick_after(cur.start, tick, max(t, self.reconsidered_at + site_plan.RECONSIDER_EVERY_S - 1e-6))

    def poll(self, cur: Seg, h: float, left_after: float, done_s: float) -> list[Seg]:
        """As chains._Chain.poll, with the site chosen at every ask."""
        from chainrun.sim.adapter import SimWatcher

        t = first_ask(max(self.now, cur.start), cur.start, self.policy,
                      lambda: SimWatcher.view(cur, h, self.lead_s, self.work), self.work.tick_s)
        while t < h:
            self.now = max(self.now, t)
            ds, choice = self.ask(cur, h, left_after)
            d = ds[choice.site]
            if d.submit and sizing.may_submit(left_if_cut_s=self.left_if_cut(cur, done_s, 0.0),
                                              tolerance_s=self.tolerance):
                return [self.submit(left_after, choice.site, cur, done_s, cur if d.dependency else None)]
            # the next ask: the soonest any site's decision may change (the pick may change to it)
            t = min(_next_ask(t, h, x, self.policy, self.work, self.lead_s) for x in ds.values())
        self.now = max(self.now, h + self.work.save_s + self.work.reactive_latency_s)  # ended: nothing to take over
        return self.place(left_after, cur)

    # ---- the chain ---------------------------------------------------------------------------
    def run(self) -> SiteRun:
        w, run, horizon = self.work, self.out, self.t0 + self.work.horizon_s
        cap_full = w.segment_s - w.signal_lead_s - w.restart_s
        done_s = 0.0
        cur, b = self.first_to_start(self.place(w.work_s, None), horizon)
        if b != b:
            return run
        cur.start = cur.train_start = b
        run.sites.append(self.site_of[cur.jid])
        run.shapes.append(cur.nodes)
        run.first_start = b
        run.first_wait_s = run.queue_s = b - self.t0
        while True:
            run.restart_s += w.restart_s
            h = cur.start + cur.limit - w.signal_lead_s
            left_after = sizing.work_after(w.work_s, done_s, sizing.expected_work(
                h - cur.train_start, rate=cur.rate, restart_s=w.restart_s))
            if sizing.plan_gate(live=1, work_after_s=left_after, tolerance_s=self.tolerance) != sizing.ASK:
                run.finish = cur.train_start + w.restart_s + (w.work_s - done_s) / cur.rate
                run.segments = len([s for s in self.segs if s.start == s.start])
                return run
            if len(self.segs) >= w.max_segments:
                run.stuck = True
                run.segments = len(self.segs)
                return run
            nxt, bn = self.await_start(cur, h, left_after, done_s, self.poll(cur, h, left_after, done_s), horizon)
            if bn != bn:
                return run
            nxt.start = bn
            run.shapes.append(nxt.nodes)
            run.sites.append(self.site_of[nxt.jid])
            moved = self.site_of[nxt.jid] != self.site_of[cur.jid]
            if moved:
                done_s = self.move(cur, nxt, h, bn, done_s)
                cur = nxt
                continue
            # the same site: chains._Chain.run's boundary
            boundary.hand_over(run, cur, nxt, h, bn, w, adaptive=self.spec.adaptive, left_after=left_after,
                               full_capacity_s=cap_full, lead_s=self.lead_s,
                               cut=lambda jid, at: self.sim(self.site_of[jid]).cut(jid, at))
            done_s += boundary.close(run, cur, w)
            cur = nxt

    def move(self, cur: Seg, nxt: Seg, h: float, bn: float, done_s: float) -> float:
        """The boundary of a move (see the module doc); returns the work the successor resumes from."""
        w, r, run = self.work, self.rules, self.out
        boundary.stop(cur, h, bn, w)  # asked to stop at bn, or at its signal: it saves and exits
        if bn < h:
            self.sim(self.site_of[cur.jid]).cut(cur.jid, cur.exit)
            run.handoff_s += cur.exit - bn
        else:
            run.queue_s += bn - h
        run.twice_node_s += max(0.0, cur.exit - bn) * nxt.nodes

        def work_at(t: float) -> float:  # the chain's work in a checkpoint the predecessor wrote at t
            return done_s + cur.rate * max(0.0, min(t, cur.stop) - cur.train_start - w.restart_s)

        final_work, final_at = work_at(cur.stop), cur.exit + r.transfer_s
        wait_start = max(bn, final_at)  # (b) wait for the final checkpoint
        # (a) the newest copy that has arrived: periodic checkpoints, or the one the predecessor resumed from
        first_ckpt = cur.train_start + w.restart_s
        best_work = done_s if cur.train_start + r.transfer_s <= bn else None
        k = int(max(0.0, (min(cur.stop, bn - r.transfer_s) - first_ckpt)) // r.checkpoint_every_s) \
            if bn - r.transfer_s >= first_ckpt else 0
        if k >= 1:
            best_work = work_at(first_ckpt + k * r.checkpoint_every_s)
        if final_at <= bn:
            best_work = final_work
        cost_wait = wait_start - bn
        cost_lost = (final_work - best_work) / nxt.rate if best_work is not None else float("inf")
        if cost_lost < cost_wait:
            nxt.train_start, resume = bn, best_work
            run.lost_work_moves += 1
            run.move_cost_s += cost_lost
        else:
            nxt.train_start, resume = wait_start, final_work
            run.move_cost_s += cost_wait
        run.moves += 1
        run.boundaries.append((bn - h - w.save_s, max(0.0, h - cur.stop)))
        boundary.close(run, cur, w)  # the successor resumes from ``resume``, not from what cur trained
        return resume


def _tick_after(anchor: float, tick: float, t: float) -> float:
    """The first tick of the grid ``anchor + k * tick`` strictly after ``t``."""
    return anchor + (math.floor((t - anchor) / tick + 1e-9) + 1) * tick


def _cancel(sim, jid: int) -> None:
    """``scancel`` of a pending job in the replayed partition."""
    sim.pending = [p for p in sim.pending if p[2] != jid]
    for dep, jobs in list(sim.held.items()):
        sim.held[dep] = [j for j in jobs if j[1] != jid]
