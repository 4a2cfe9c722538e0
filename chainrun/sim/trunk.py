"""Shared trunks: the replayed partition, computed once for every policy that has acted alike so far.

Every policy's chain at an injection point runs on its own fork of the partition, but until two
policies act differently (submit, hold or cut a segment at another moment) their partitions are
the same: the first segment's whole queue wait, and every stretch before the first decision that
differs, is the same replay run once per policy (109 times per point in the rolling evaluation).

A ``Trunk`` (one per injection point) keeps forks of the replayed state keyed by the chain's
**log**, the exact list of what it did to the partition (every submit, dependent submit and cut,
with the clock at which it was done): two chains with equal logs hold equal partitions at equal
clocks, because the replay is deterministic and advancing the clock to ``s`` then to ``t``
processes the same events as advancing it to ``t`` at once (events are stepped in time order; the
intermediate clock is read by nothing else). A chain that must advance to ``t`` takes the most
advanced kept state of its log that is not past ``t`` and steps on from there; what it computes is
unchanged, only not recomputed (tests/sim/test_trunk.py compares every spec's chain with and
without trunks).

The injected jobs' ids must then be the same for every policy at a point: they are in separate
forks, never in one queue, and an id is only an order among a chain's own segments (always above
the trace's ids), so the same ids change no replay.
"""

from __future__ import annotations

from bisect import bisect_right, insort

KEEP_EVERY_S = 1800.0  # a kept state at most every half hour of replayed time per log: the gaps are cheap


class Trunk:
    def __init__(self) -> None:
        self.kept: dict[tuple, list] = {}  # log -> sorted [(clock, seq, Scheduler)], never mutated
        self.started: dict[tuple, tuple] = {}  # (log, clock, jid, horizon) -> (start or nan, Scheduler)
        self._seq = 0
        self.hits = 0

    def advance(self, sim, log: tuple, t: float):
        """``sim.run_until(t)`` for a chain whose partition has the history ``log``; returns the
        partition to continue with (``sim`` itself, or a copy of a kept one further on)."""
        kept = self.kept.get(log)
        if kept:
            i = bisect_right(kept, (t, float("inf"))) - 1
            if i >= 0 and kept[i][0] > sim.now:
                sim = kept[i][2].fork()
                self.hits += 1
        sim.run_until(t)
        self._keep(log, sim)
        return sim

    def until_started(self, sim, log: tuple, jid: int, horizon: float):
        """``sim.run_until_started(jid, horizon)``: (its result, the partition to continue with)."""
        key = (log, sim.now, jid, horizon)
        hit = self.started.get(key)
        if hit is not None:
            self.hits += 1
            return hit[0], hit[1].fork()
        r = sim.run_until_started(jid, horizon)
        self.started[key] = (r, sim.fork())
        self._keep(log, sim)
        return r, sim

    def _keep(self, log: tuple, sim) -> None:
        kept = self.kept.setdefault(log, [])
        i = bisect_right(kept, (sim.now, float("inf")))
        if i and kept[i - 1][0] > sim.now - KEEP_EVERY_S:
            return
        self._seq += 1
        insort(kept, (sim.now, self._seq, sim.fork()))
