"""Fair share for the simulated partition: Slurm's multifactor priority with a flat Fair Tree.

What is modelled (``--priority fairshare``), with LS6's weights (chainrun/data/
ls6-a100-priority-config.json: age 7000 over a 7-day PriorityMaxAge, fair share 4000, job size
100, usage half-life 2 days):

- **Usage**: node-seconds each user's jobs held, charged while they run, decayed with the
  half-life. Kept in units scaled by 2^(t / half-life) from a fixed origin, so that decay does
  not touch the stored numbers (it scales every user alike and does not change their order).
- **Fair share factor**: Fair Tree (Slurm's default since 19.05) on a flat tree, every user of the
  trace one association with equal shares under one account: users are ranked by usage; a user
  with no usage gets 1.0, the user with the most gets 1/N, the k-th most k/N (N = the users that
  have submitted by then, plus the chain's: a user's association exists from its first job on, so
  the factors never depend on who submits later).
- **Priority** = age (capped at PriorityMaxAge) + fair share + job size, expressed in seconds of
  age so that a pending list sorted by "effective eligible time" is the priority order. Factors are
  recomputed every ``period_s`` (Slurm's PriorityCalcPeriod, 5 min), as the slurmctld decay thread
  does; between two recomputations the order changes only by new arrivals.

Not modelled: the real account tree and shares (the trace has pseudonymised users, no accounts),
usage on LS6's other partitions (the trace is the A100 partition only), QOS and partition factors
(one partition, no QOS column: a constant), TRES billing weights (a node is a node),
PriorityUsageResetPeriod, and the injected chain's user's past usage (it starts at zero: a new
user, as the predictor also sees it).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from typing import Sequence

# the injected chain's segments are jobs with ids beyond the trace; they belong to one extra user
CHAIN_USER = -1


@dataclass(frozen=True)
class FairShare:
    users: Sequence[int]  # user index of every trace job, by jid (0 .. n_users-1)
    n_users: int  # users of the trace; the chain's user is one more
    since: Sequence[float]  # sorted first submission times of the trace's users
    weight_s: float  # the fair share weight in seconds of age: W_fs / W_age * PriorityMaxAge
    size_weight_s: float  # the job size weight, likewise (x nodes / cluster nodes)
    max_age_s: float  # PriorityMaxAge: age counts up to this
    half_life_s: float  # PriorityDecayHalfLife
    period_s: float = 300.0  # PriorityCalcPeriod
    origin: float = 0.0  # the scaled usage's time origin (the trace's first submission)


def _duration_s(value) -> float:
    """A slurm.conf duration: "D-H", "D-H:M", "D-H:M:S", "M", "M:S" or "H:M:S" ("2-0": 2 days)."""
    text = str(value).strip()
    days = 0.0
    if "-" in text:
        d, text = text.split("-", 1)
        days = float(d)
        parts = [float(p) for p in text.split(":")] + [0.0, 0.0]
        return days * 86400.0 + parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
    parts = [float(p) for p in text.split(":")]
    if len(parts) == 3:
        return parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
    return parts[0] * 60.0 + (parts[1] if len(parts) > 1 else 0.0)


def load_priority_config(path=None) -> dict:
    """The shipped LS6 priority weights (or a file of the same shape)."""
    if path is None:
        from importlib import resources

        text = (resources.files("chainrun") / "data" / "ls6-a100-priority-config.json").read_text()
    else:
        from pathlib import Path

        text = Path(path).read_text()
    return json.loads(text)


def fair_share_for(table, *, config: dict | None = None, origin: float = 0.0,
                   period_s: float = 300.0) -> FairShare:
    """Fair share over the users of a workload table (``Workload.table``: jid = row)."""
    import pandas as pd

    c = config or load_priority_config()
    codes, uniques = pd.factorize(table["user"].astype(str), sort=True)
    since = sorted(pd.Series(table["submit"].to_numpy(float)).groupby(codes).min().tolist())
    w_age = float(c.get("PriorityWeightAge", 0)) or 1.0
    max_age = float(c.get("PriorityMaxAge", 7)) * 86400.0  # days in the config file
    per_point = max_age / w_age  # seconds of age one priority point is worth
    return FairShare(
        users=[int(u) for u in codes], n_users=len(uniques), since=since,
        weight_s=float(c.get("PriorityWeightFairshare", 0)) * per_point,
        size_weight_s=float(c.get("PriorityWeightJobSize", 0)) * per_point,
        max_age_s=max_age, half_life_s=_duration_s(c.get("PriorityDecayHalfLife", "7-0")),
        period_s=period_s, origin=origin,
    )


class Usage:
    """Per-user decayed usage and the Fair Tree factors, inside one Scheduler (forked with it).
    Only users that ever ran are stored: everyone else has no usage and the factor 1.0.

    The factors are Fair Tree's on a flat tree: users ranked by usage, most first, the k-th most
    getting k / N (ties in the order users first appeared, as a stable sort of ``done`` then the
    running users would give them). Recomputed every 5 min of every fork, a full sort of every
    user cost the self-tuning replay half its time on a busy cluster (issue 24), so the ranking is
    kept incrementally: ``keys`` is ``done``'s users sorted by (-usage, first-seen), updated when a
    job ends; at a recalculation only the running users' usage moves, and a user's rank is its
    place in ``keys`` corrected by the running users ahead of it (``factors``): a few bisections."""

    __slots__ = ("fs", "done", "running", "next_calc", "_k", "seen", "keys", "_dirty", "_n1", "_run", "_run_keys",
                 "_run_stale", "_cache")

    def __init__(self, fs: FairShare) -> None:
        self.fs = fs
        self.done: dict[int, float] = {}  # user -> scaled usage of its ended jobs (chain user: n_users)
        self.running: dict[int, tuple[int, float, int]] = {}  # jid -> (user, scaled start, nodes)
        self.seen: dict[int, int] = {}  # user -> the order in which it entered ``done`` (ties)
        self.keys: list[tuple[float, int]] = []  # (-done usage, seen) of ``done`` at the last recalculation, ascending
        self._dirty: dict[int, float | None] = {}  # user -> its done usage at the last recalculation, if changed since
        self.next_calc = -math.inf
        self._k = math.log(2.0) / fs.half_life_s
        self._n1 = 1
        self._run: dict[int, tuple[float, int]] = {}  # running user -> (-usage, order) at the last recalculation
        self._run_keys: list | None = []  # those keys with usage, ascending (None: not sorted yet)
        self._run_stale: list = []  # their users' ``keys`` entries, ascending
        self._cache: dict[int, float] = {}  # user -> factor, since the last recalculation

    def copy(self) -> "Usage":
        u = Usage.__new__(Usage)
        u.fs, u._k, u.next_calc, u._n1 = self.fs, self._k, self.next_calc, self._n1
        u.done = dict(self.done)
        u.running = dict(self.running)
        u.seen = dict(self.seen)
        u.keys = list(self.keys)
        u._dirty = dict(self._dirty)
        # replaced, never mutated, on recalculation (the cache only gains what these imply)
        u._run, u._run_keys, u._run_stale = self._run, self._run_keys, self._run_stale
        u._cache = dict(self._cache)
        return u

    def user(self, jid: int) -> int:
        users = self.fs.users
        return users[jid] if 0 <= jid < len(users) else self.fs.n_users

    def _scaled(self, t: float) -> float:
        """2^((t - origin) / half-life): usage charged at t, in the stored units."""
        return math.exp(self._k * (t - self.fs.origin))

    def started(self, jid: int, nodes: int, now: float) -> None:
        self.running[jid] = (self.user(jid), self._scaled(now), nodes)

    def ended(self, jid: int, now: float) -> None:
        r = self.running.pop(jid, None)
        if r is not None:  # the integral of nodes * 2^((t - origin) / half-life) over the run
            u = r[0]
            old = self.done.get(u)
            if u not in self._dirty:  # the factors stay those of the last recalculation until the next
                self._dirty[u] = old
            if old is None:
                self.seen[u] = len(self.seen)
            self.done[u] = (0.0 if old is None else old) + r[2] * (self._scaled(now) - r[1]) / self._k

    def recalc(self, now: float) -> None:
        """Fair Tree on a flat tree: rank users by usage (the decay factor is common to all)."""
        g, k, done, seen, keys = self._scaled(now), self._k, self.done, self.seen, self.keys
        for u, old in self._dirty.items():
            if old is not None:
                del keys[bisect_left(keys, (-old, seen[u]))]
            insort(keys, (-done[u], seen[u]))
        self._dirty = {}
        usage: dict[int, float] = {}
        for u, e0, nodes in self.running.values():
            usage[u] = usage.get(u, done.get(u, 0.0)) + nodes * (g - e0) / k
        # a running user not yet in ``done`` comes after every user in it, in order of appearance
        late = len(seen)
        run = {}
        for u, x in usage.items():
            if u in seen:
                run[u] = (-x, seen[u])
            else:
                run[u] = (-x, late)
                late += 1
        self._run = run
        self._run_keys = None  # sorted at the first factor asked for (most recalculations ask a few)
        self._cache = {}
        self._n1 = bisect_right(self.fs.since, now) + 1  # the users known by now and the chain's
        p = self.fs.period_s
        self.next_calc = (math.floor(now / p) + 1) * p

    def _done_then(self, u: int) -> float | None:
        """``done[u]`` as of the last recalculation (None: not in it then)."""
        return self._dirty[u] if u in self._dirty else self.done.get(u)

    def _running_keys(self) -> tuple[list, list]:
        """``_run_keys`` and ``_run_stale``, sorted at the first factor asked for after a recalculation."""
        if self._run_keys is None:
            self._run_keys = sorted(key for key in self._run.values() if key[0] < 0.0)
            self._run_stale = sorted((-x, self.seen[v]) for v in self._run if (x := self._done_then(v)) is not None)
        return self._run_keys, self._run_stale

    def factor(self, u: int) -> float:
        """The user's fair share factor as of the last recalculation (1.0 without usage)."""
        return self.factors([u])[0]

    def factors(self, us: list) -> list[float]:
        """The fair share factor of every user in ``us`` as of the last recalculation (1.0 without
        usage): its rank is its place in ``keys`` corrected by the running users ahead of it. One
        call for a recalculation's pending jobs (the replay recalculates millions of times; a
        method call per job was a fifth of the self-tuning refresh)."""
        cache, run, dirty, done, seen = self._cache, self._run, self._dirty, self.done, self.seen
        keys, n1 = self.keys, self._n1
        runk = stale = None
        out = []
        for u in us:
            f = cache.get(u)
            if f is None:
                key = run.get(u)
                if key is None:
                    x = dirty[u] if u in dirty else done.get(u)
                    key = (-(0.0 if x is None else x), seen.get(u, 0))
                if key[0] < 0.0:
                    if runk is None:
                        runk, stale = self._running_keys()
                    f = (bisect_left(keys, key) - bisect_left(stale, key) + bisect_left(runk, key) + 1) / n1
                else:
                    f = 1.0
                cache[u] = f
            out.append(f)
        return out

    def bonus_s(self, jid: int, nodes: int, total: int) -> float:
        """Fair share plus job size, in seconds of age."""
        return self.fs.weight_s * self.factor(self.user(jid)) + self.fs.size_weight_s * nodes / total


PRIORITIES = ("age", "multifactor", "fairshare")


def priority_terms(priority: str, w, size_weight_s: float, config: dict | None = None) -> tuple[float, "FairShare | None"]:
    """The Scheduler's ``size_weight_s`` and ``fairshare`` for a ``--priority`` name:
    age (age only), multifactor (age + job size), fairshare (age capped + job size + fair share)."""
    from chainrun.errors import UsageError

    if priority not in PRIORITIES:
        raise UsageError(f"unknown priority {priority!r}", hint="use " + ", ".join(PRIORITIES))
    if priority == "fairshare":
        return 0.0, fair_share_for(w.table, config=config, origin=w.jobs[0][0] if w.jobs else 0.0)
    return (size_weight_s if priority == "multifactor" else 0.0), None
