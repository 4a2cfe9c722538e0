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

import functools
import json
import math
from bisect import bisect_right
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
    Only users that ever ran are stored: everyone else has no usage and the factor 1.0."""

    __slots__ = ("fs", "done", "running", "factor", "next_calc", "_k")

    def __init__(self, fs: FairShare) -> None:
        self.fs = fs
        self.done: dict[int, float] = {}  # user -> scaled usage of its ended jobs (chain user: n_users)
        self.running: dict[int, tuple[int, float, int]] = {}  # jid -> (user, scaled start, nodes)
        self.factor: dict[int, float] = {}  # user -> fair share factor (absent: 1.0)
        self.next_calc = -math.inf
        self._k = math.log(2.0) / fs.half_life_s

    def copy(self) -> "Usage":
        u = Usage.__new__(Usage)
        u.fs, u._k, u.next_calc = self.fs, self._k, self.next_calc
        u.done = dict(self.done)
        u.running = dict(self.running)
        u.factor = self.factor  # replaced, never mutated, on recomputation
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
            self.done[u] = self.done.get(u, 0.0) + r[2] * (self._scaled(now) - r[1]) / self._k

    def recalc(self, now: float) -> None:
        """Fair Tree on a flat tree: rank users by usage (the decay factor is common to all)."""
        usage = dict(self.done)
        g, k = self._scaled(now), self._k
        for u, e0, nodes in self.running.values():
            usage[u] = usage.get(u, 0.0) + nodes * (g - e0) / k
        n1 = bisect_right(self.fs.since, now) + 1  # the users known by now and the chain's
        ranked = sorted(usage, key=usage.__getitem__, reverse=True)
        m = len(ranked)  # usage >= 0: the users without any are last (every 5 min of every fork: kept lean)
        while m and not usage[ranked[m - 1]] > 0.0:
            m -= 1
        self.factor = dict(zip(ranked[:m] if m < len(ranked) else ranked, _ranks(n1, m)))
        p = self.fs.period_s
        self.next_calc = (math.floor(now / p) + 1) * p

    def bonus_s(self, jid: int, nodes: int, total: int) -> float:
        """Fair share plus job size, in seconds of age."""
        return self.fs.weight_s * self.factor.get(self.user(jid), 1.0) + self.fs.size_weight_s * nodes / total


@functools.lru_cache(maxsize=64)
def _ranks(n1: int, m: int) -> tuple[float, ...]:
    """The factors of the m users with usage, most first: (i + 1) / n1."""
    return tuple((i + 1) / n1 for i in range(m))


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
