"""The incremental Fair Tree ranking (chainrun/sim/fairshare.Usage) gives exactly the factors of the
plain definition: every user's usage as of the last recalculation, sorted most first (ties in the
order users entered ``done``, then running users in order of appearance), the k-th getting k / N.
Random event sequences with forks, ties and zero-length jobs, against that definition."""

from __future__ import annotations

import math
import random
from bisect import bisect_right

import pytest

from chainrun.sim.fairshare import FairShare, Usage


class PlainUsage:
    """The definition, written the obvious way (the implementation before the incremental one)."""

    def __init__(self, fs: FairShare) -> None:
        self.fs, self.done, self.running, self.factors = fs, {}, {}, {}
        self.k = math.log(2.0) / fs.half_life_s

    def copy(self) -> "PlainUsage":
        c = PlainUsage(self.fs)
        c.done, c.running, c.factors = dict(self.done), dict(self.running), self.factors
        return c

    def scaled(self, t: float) -> float:
        return math.exp(self.k * (t - self.fs.origin))

    def user(self, jid: int) -> int:
        return self.fs.users[jid] if 0 <= jid < len(self.fs.users) else self.fs.n_users

    def started(self, jid: int, nodes: int, now: float) -> None:
        self.running[jid] = (self.user(jid), self.scaled(now), nodes)

    def ended(self, jid: int, now: float) -> None:
        u, e0, nodes = self.running.pop(jid)
        self.done[u] = self.done.get(u, 0.0) + nodes * (self.scaled(now) - e0) / self.k

    def recalc(self, now: float) -> None:
        usage = dict(self.done)
        g = self.scaled(now)
        for u, e0, nodes in self.running.values():
            usage[u] = usage.get(u, 0.0) + nodes * (g - e0) / self.k
        n1 = bisect_right(self.fs.since, now) + 1
        ranked = [u for u in sorted(usage, key=usage.__getitem__, reverse=True) if usage[u] > 0.0]
        self.factors = {u: (i + 1) / n1 for i, u in enumerate(ranked)}

    def factor(self, u: int) -> float:
        return self.factors.get(u, 1.0)


def _fs(n_users: int, n_jobs: int, rng: random.Random) -> FairShare:
    return FairShare(users=[rng.randrange(n_users) for _ in range(n_jobs)], n_users=n_users,
                     since=sorted(rng.uniform(0, 5000) for _ in range(n_users)), weight_s=1000.0,
                     size_weight_s=10.0, max_age_s=7 * 86400.0, half_life_s=3600.0, origin=0.0)


@pytest.mark.parametrize("seed", range(60))
def test_incremental_factors_equal_the_plain_definition(seed: int) -> None:
    rng = random.Random(seed)
    n_jobs = 300
    fs = _fs(rng.choice((3, 8, 40)), n_jobs, rng)
    worlds = [(Usage(fs), PlainUsage(fs), set())]  # (fast, plain, running jids): forks are added
    t, jid = 0.0, 0
    for _ in range(900):
        fast, plain, running = rng.choice(worlds)
        # same-second events make zero-length jobs and identical usages (ties)
        t += rng.choice((0.0, 0.0, 1.0, 30.0, 400.0))
        r = rng.random()
        if r < 0.35 and jid < n_jobs:
            nodes = rng.choice((1, 1, 2, 8))
            fast.started(jid, nodes, t)
            plain.started(jid, nodes, t)
            running.add(jid)
            jid += 1
        elif r < 0.6 and running:
            j = rng.choice(sorted(running))
            fast.ended(j, t)
            plain.ended(j, t)
            running.discard(j)
        elif r < 0.75:
            fast.recalc(t)
            plain.recalc(t)
        elif r < 0.8 and len(worlds) < 6:
            worlds.append((fast.copy(), plain.copy(), set(running)))
        # the users (and the chain's) are asked now and then, between recalculations too, so that
        # the first question after a recalculation may come after jobs have ended
        if fast.next_calc != -math.inf and rng.random() < 0.3:
            us = rng.sample(range(fs.n_users + 1), k=min(3, fs.n_users + 1))
            # one user at a time, or a recalculation's batch (Scheduler._recalc), first or after
            got = fast.factors(us) if rng.random() < 0.5 else [fast.factor(u) for u in us]
            assert got == [plain.factor(u) for u in us], (seed, us, t)
    for fast, plain, _ in worlds:
        if fast.next_calc != -math.inf:
            everyone = list(range(fs.n_users + 1))
            assert fast.factors(everyone) == [plain.factor(u) for u in everyone]


def test_a_tie_keeps_the_order_users_entered_done() -> None:
    fs = FairShare(users=[0, 1, 2], n_users=3, since=[0.0, 0.0, 0.0], weight_s=1.0, size_weight_s=0.0,
                   max_age_s=1.0, half_life_s=3600.0)
    fast, plain = Usage(fs), PlainUsage(fs)
    for u in (fast, plain):  # users 1 and 0 hold the same node-seconds; 1 ends first
        u.started(1, 1, 0.0)
        u.started(0, 1, 0.0)
        u.ended(1, 100.0)
        u.ended(0, 100.0)
        u.recalc(200.0)
    assert [fast.factor(u) for u in range(4)] == [plain.factor(u) for u in range(4)] == [0.5, 0.25, 1.0, 1.0]
