"""A chain's pace and restart cost on each of its clusters, as the site rule weighs them (issue 26).

GPUs differ, and so do file systems and software stacks: a cluster may train the chain's steps at
another rate, and take longer to start training. The rule (chain/site_choice.py) charges each site
``restart + remaining / pace``; this module says what those are, per site, from what is known:

- **measured** (the chain's own segments there): the pace is the median samples per second of that
  site's segments over the median of the site the chain is on now (steps per second where either site's
  payload reports no samples: a cluster's own script may train another batch size, so samples are the
  work when known); the restart is the median, over
  that site's segments, of the time from the payload's start to its first progress line (model load,
  data loader warm-up, the first step);
- else **declared** in config.toml (``[clusters.NAME.job] pace = 0.6``, ``restart = "3m"``;
  chainrun/site_config.py): a declared pace is against a cluster at 1.0, so a site's factor is its
  declared pace over the current site's (an undeclared one counts 1.0);
- else the **default**: pace 1.0, restart 0.

Only a payload that follows the optional progress contract (chain/progress.py,
docs/checkpoint-contract.md) gives measurements; without it the declared values (or the defaults)
hold for the chain's whole life. The site the chain is on now always has pace 1.0: the work left
(``remaining``) is counted in its seconds, as the rest of planning counts it. A chain spanning
clusters has one shape (``--shapes`` is refused with several clusters), so rates compare.

Pure: no I/O; the caller reads config.toml (chain/site_plan.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping

from chainrun.chain import span
from chainrun.state.records import Chain, Segment

MEASURED, DECLARED, DEFAULT, HERE = "measured", "declared", "default", "here"


@dataclass(frozen=True)
class Declared:
    """What config.toml declares for one cluster (None: not declared)."""

    pace: float | None = None
    restart_s: float | None = None


@dataclass(frozen=True)
class Measured:
    """What the chain measured on one cluster: medians, and how many segments each is of."""

    steps_per_s: float | None = None
    pace_n: int = 0
    restart_s: float | None = None
    restart_n: int = 0
    samples_per_s: float | None = None  # of the segments that reported samples (None: none did)


@dataclass(frozen=True)
class SitePace:
    """One site's pace factor (against the current site) and restart cost, and where each came from."""

    pace: float = 1.0
    pace_from: str = DEFAULT
    restart_s: float = 0.0
    restart_from: str = DEFAULT

    def as_dict(self) -> dict:
        return {"pace": round(self.pace, 4), "pace_from": self.pace_from, "restart_s": round(self.restart_s, 1),
                "restart_from": self.restart_from}


def restart_of(s: Segment, *, first: bool = False) -> float | None:
    """Seconds from the payload's start to its first progress line; None when not known.

    The payload's start is the wrapper's (``payload_start``): a successor submitted early waits for
    the hand-off (or, after a move, for its go-ahead) before it trains, and that wait is not a restart.
    Without it the job's start serves only when nothing can have been waited for: the chain's first
    segment (``first``), or one that started after its predecessor ended (``gap_s`` >= 0) and was not a
    move. A negative time (a requeued job's file holds the run before) is no measurement."""
    ranks = (s.extra.get("progress") or {}).get("ranks") or []
    first_t = ranks[0].get("first_t") if ranks else None
    if first_t is None:
        return None
    began = s.extra.get("payload_start")
    if began is None and s.start is not None and not s.extra.get("move") \
            and (first or float(s.extra.get("gap_s", -1)) >= 0):
        began = s.start
    if began is None:
        return None
    took = float(first_t) - float(began)
    return took if took >= 0 else None


def measured(c: Chain, segs: Iterable[Segment]) -> dict[str, Measured]:
    """Per site, the chain's measured pace (median steps, and samples, per second of the segments that
    reported one) and restart (median of :func:`restart_of`). A segment without progress is no measurement."""
    ordered = sorted(segs, key=lambda s: s.idx)
    steps: dict[str, list[float]] = {}
    samples: dict[str, list[float]] = {}
    restarts: dict[str, list[float]] = {}
    for i, s in enumerate(ordered):
        site = span.site_of(c, s)  # None: the chain's site (the driver names the old one at each move)
        prog = s.extra.get("progress") or {}
        for key, into in (("steps_per_s", steps), ("samples_per_s", samples)):
            if prog.get(key) is not None and float(prog[key]) > 0:
                into.setdefault(site, []).append(float(prog[key]))
        took = restart_of(s, first=i == 0)
        if took is not None:
            restarts.setdefault(site, []).append(took)

    def median(of: dict, site: str) -> float | None:
        return statistics.median(of[site]) if site in of else None

    return {site: Measured(median(steps, site), len(steps.get(site, ())), median(restarts, site),
                           len(restarts.get(site, ())), median(samples, site))
            for site in set(steps) | set(samples) | set(restarts)}


def site_paces(current: str, names: Iterable[str], found: Mapping[str, Measured],
               declared: Mapping[str, Declared]) -> dict[str, SitePace]:
    """Every site's pace and restart: measured beats declared beats the default (see the module doc).
    A site's measured pace needs the current site's too (one is over the other); without it the
    declared ratio holds."""
    here_m = found.get(current) or Measured()
    here_d = declared.get(current) or Declared()
    out = {}
    for name in names:
        m, d = found.get(name) or Measured(), declared.get(name) or Declared()
        if name == current:
            pace, pace_from = 1.0, HERE
        elif m.samples_per_s and here_m.samples_per_s:
            pace, pace_from = m.samples_per_s / here_m.samples_per_s, MEASURED
        elif m.steps_per_s and here_m.steps_per_s:
            pace, pace_from = m.steps_per_s / here_m.steps_per_s, MEASURED
        elif d.pace is not None or here_d.pace is not None:
            pace, pace_from = (d.pace or 1.0) / (here_d.pace or 1.0), DECLARED
        else:
            pace, pace_from = 1.0, DEFAULT
        if m.restart_s is not None:
            restart, restart_from = m.restart_s, MEASURED
        elif d.restart_s is not None:
            restart, restart_from = float(d.restart_s), DECLARED
        else:
            restart, restart_from = 0.0, DEFAULT
        out[name] = SitePace(pace, pace_from, restart, restart_from)
    return out


def for_chain(c: Chain, segs: Iterable[Segment], names: Iterable[str],
              declared: Mapping[str, Declared]) -> dict[str, SitePace]:
    """:func:`site_paces` for the chain's sites, from its segments, against the site it is on now."""
    return site_paces(c.cluster, names, measured(c, segs), declared)
