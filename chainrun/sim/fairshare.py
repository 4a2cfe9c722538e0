"""Fair share for the simulated partition: Slurm's multifactor priority with a flat Fair Tree.

What is modelled (``--priority fairshare``), with LS6's weights (chainrun/data/
ls6-a100-priority-config.json: age 7000 over a 7-day PriorityMaxAge, fair share 4000, job size
100, usage half-life 2 days):

- **Usage**: node-seconds each user's jobs held, charged while they run, decayed with the
  half-life. Kept in units scaled by 2^(t / half-life) from a fixed origin, so that decay does
  not touch the stored numbers (it scales every user alike and does not change their order).
- **Fair share factor**: Fair Tree (Slurm's default since 19.05) on a flat tree, every user of the
  trace one association with equal shares under one account: users are ranked by usage; a user
  with no usage gets 1.0, the user with the most gets 1/N, the k-th most k/N (N = users).
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
from dataclasses import dataclass
from typing import Sequence

# the injected chain's segments are jobs with ids beyond the trace; they belong to one extra user
CHAIN_USER = -1


@dataclass(frozen=True)
class FairShare:
    users: Sequence[int]  # user index of every trace job, by jid (0 .. n_users-1)
    n_users: int  # users of the trace; the chain's user is one more
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
    w_age = float(c.get("PriorityWeightAge", 0)) or 1.0
    max_age = float(c.get("PriorityMaxAge", 7)) * 86400.0  # days in the config file
    per_point = max_age / w_age  # seconds of age one priority point is worth
    return FairShare(
        users=[int(u) for u in codes], n_users=len(uniques),
        weight_s=float(c.get("PriorityWeightFairshare", 0)) * per_point,
        size_weight_s=float(c.get("PriorityWeightJobSize", 0)) * per_point,
        max_age_s=max_age, half_life_s=_duration_s(c.get("PriorityDecayHalfLife", "7-0")),
        period_s=period_s, origin=origin,
    )


class Usage:
    """Per-user decayed usage and the Fair Tree factors, inside one Scheduler (forked with it)."""

    __slots__ = ("fs", "done", "running", "factor", "next_calc", "_k")

    def __init__(self, fs: FairShare) -> None:
        self.fs = fs
        self.done = [0.0] * (fs.n_users + 1)  # scaled usage of ended jobs (last slot: the chain user)
        self.running: dict[int, tuple[int, float, int]] = {}  # jid -> (user, start, nodes)
        self.factor = [1.0] * (fs.n_users + 1)
        self.next_calc = -math.inf
        self._k = math.log(2.0) / fs.half_life_s

    def copy(self) -> "Usage":
        u = Usage.__new__(Usage)
        u.fs, u._k, u.next_calc = self.fs, self._k, self.next_calc
        u.done = list(self.done)
        u.running = dict(self.running)
        u.factor = self.factor  # replaced, never mutated, on recomputation
        return u

    def user(self, jid: int) -> int:
        users = self.fs.users
        return users[jid] if 0 <= jid < len(users) else self.fs.n_users

    def _scaled_integral(self, a: float, b: float) -> float:
        """The integral of 2^((t - origin) / half-life) dt from a to b."""
        k, o = self._k, self.fs.origin
        return (math.exp(k * (b - o)) - math.exp(k * (a - o))) / k

    def started(self, jid: int, nodes: int, now: float) -> None:
        self.running[jid] = (self.user(jid), now, nodes)

    def ended(self, jid: int, now: float) -> None:
        r = self.running.pop(jid, None)
        if r is not None:
            self.done[r[0]] += r[2] * self._scaled_integral(r[1], now)

    def recalc(self, now: float) -> None:
        """Fair Tree on a flat tree: rank users by usage (the decay factor is common to all)."""
        usage = list(self.done)
        for u, start, nodes in self.running.values():
            usage[u] += nodes * self._scaled_integral(start, now)
        n = len(usage) - 1  # the trace's users; the chain user ranks among them
        used = sorted((x for x in range(len(usage)) if usage[x] > 0.0), key=usage.__getitem__, reverse=True)
        factor = [1.0] * len(usage)
        for i, x in enumerate(used):
            factor[x] = (i + 1) / (n + 1)
        self.factor = factor
        p = self.fs.period_s
        self.next_calc = (math.floor(now / p) + 1) * p

    def bonus_s(self, jid: int, nodes: int, total: int) -> float:
        """Fair share plus job size, in seconds of age."""
        return self.fs.weight_s * self.factor[self.user(jid)] + self.fs.size_weight_s * nodes / total
