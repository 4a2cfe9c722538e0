"""Racing segments of a chain spanning clusters: ``chainrun submit --cluster a,b --race`` (issue 26).

The replay (chainrun/sim/site_chain.py, row ``predicted_multi_race``) races a segment whenever nothing of
the chain is live: it is submitted on every site where it could win (not where the chain, even started at
once, is done later than on the rule's site after its median wait: site_choice.race_sites, the skipped
sites and why in ``race["skipped"]`` and the race's events), the first to start is kept, the others are
cancelled.
It takes the real first wait instead of the predicted one (docs/multi-cluster.md: the evidence). The
product does the same, opt-in: segment 0 at submit (``start``), and a successor planned while nothing of
the chain is live (planning's first step with a segment behind it: ``begin``). A successor asked for while
a segment runs is placed by the rule (chain/site_plan.py), as without ``--race``.

Never two copies training: every racer is submitted *gated* (templates/wrapper.sh: it waits for
``control/go.<G>`` in its own site's run folder, and ends ``unstarted`` at its limit without one). The
watcher (its driver: chain/race_driver.py), on the tick its one squeue per site shows a racer started,
records that racer as the winner and the generation it will claim (before anything else, so a watcher that
dies and a next one that sees another racer started too never chooses twice), records it as the segment on
its site, and cancels the others: pending ones never held a node; one that started before the watcher
noticed held its nodes, gated, until the scancel (``held_s``: GPU time held twice). Ties (several started by
the same tick): the preferred site, the order of ``--cluster``. What lets the winner train: segment 0, or a
successor on the site where the chain's checkpoint is, gets ``go.<G>`` there at once (segment 0 anywhere:
nothing to carry; the chain's row takes that site's folders); a successor kept on another site is a move,
and the mover (chain/mover.py) fences the old site, copies and verifies the checkpoint, and only then writes
``go.<G>``.

Until a winner is recorded the raced segment has no row (segments are keyed by (chain, idx) and every
racer is that segment): the racers live in ``chain.extra["race"]`` (earlier races in ``races_done``), and
planning leaves the chain alone (``live``). A race in which every racer ended without starting falls back
to the rule for that segment.
"""

from __future__ import annotations

import time
from typing import Callable

from chainrun.chain import span
from chainrun.chain.maintenance import fit_maintenance, read_reservations
from chainrun.chain.request import describe
from chainrun.chain.segments import sbatch_args, wrapper_path
from chainrun.errors import RemoteError, SlurmError
from chainrun.slurm.client import SlurmClient, SlurmRefused
from chainrun.state.records import (CANCELLED_OUT, ENDED, FAILED, LIVE_PHASES, PENDING, RUNNING, SUBMITTING, Chain,
                                    ChainSite, Segment)
from chainrun.state.store import Store

PREPARING = "preparing"  # recorded at submit, its racers not yet submitted: nobody acts on it yet
RACING = "racing"  # racers submitted, none recorded as started yet
WON = "won"  # a racer was kept as the segment (the others are cancelled, or being cancelled)
NONE_STARTED = "none-started"  # every racer ended before starting: the rule places the segment
LOST_AFTER_S = 900.0  # a racer whose sbatch was never confirmed, found in no squeue this long: never made


# ------------------------------------------------------------------ pure parts
def live(c: Chain) -> bool:
    """A race is not decided: planning leaves the chain to the race driver."""
    return (c.extra.get("race") or {}).get("phase") in (PREPARING, RACING)


def races(c: Chain) -> bool:
    """Submitted with ``--race``."""
    return c.extra.get("race") is not None


def open_racers(c: Chain) -> bool:
    """The race driver has something to do: no decision yet, a loser not yet cancelled, or a kept racer
    not yet known to have claimed the chain (``_withdraw``)."""
    race = c.extra.get("race") or {}
    return race.get("phase") == RACING or bool(to_cancel(race)) or (race.get("phase") == WON
                                                                      and not race.get("settled"))


def winner(racers: dict[str, dict], order: list[str]) -> str | None:
    """The racer kept: the first in order of preference among those started (a tie goes to the preferred
    site); None while none started."""
    return next((n for n in order if (racers.get(n) or {}).get("phase") == RUNNING), None)


def to_cancel(race: dict) -> list[str]:
    """The racers to cancel: none before a winner is recorded; then every live one but the winner; all
    of them once the race is given up (the chain cancelled while racing)."""
    if race.get("phase") == RACING and race.get("winner") is None:
        return []  # no decision yet: every racer is still a candidate
    keep = race.get("winner") if race.get("phase") in (RACING, WON) else None
    return [n for n in race.get("sites") or [] if n != keep
            and (race.get("racers") or {}).get(n, {}).get("phase") in LIVE_PHASES]


def held_s(racer: dict, at: float) -> float:
    """The time a cancelled racer held its nodes (gated, training nothing): from its start to ``at``."""
    start = racer.get("start")
    return max(0.0, at - float(start)) if start else 0.0


def summary(race: dict) -> str:
    """The race in one line, for events and `status`."""
    i = int(race.get("idx") or 0)
    racers = race.get("racers") or {}
    parts = []
    for n in race.get("sites") or []:
        r = racers.get(n) or {}
        what = f"{n} job {r.get('job_id') or '?'}"
        if n == race.get("winner"):
            what += f" started first: kept as segment {i}"
        elif r.get("outcome") == CANCELLED_OUT:
            what += (f" cancelled after holding its nodes {int(r.get('held_s') or 0)}s (gated, trained nothing)"
                     if r.get("held_s") else " cancelled while pending")
        elif r.get("phase") in LIVE_PHASES:
            what += f" {r['phase'].lower()}" + (" (scancel failed: " + r["cancel_failed"] + ")"
                                                if r.get("cancel_failed") else "")
        else:
            what += f" ended ({r.get('reason') or r.get('slurm_state') or 'before starting'})"
        parts.append(what)
    parts += [f"{n} not raced (cannot win there)" for n in race.get("skipped") or {}]  # the event says the numbers
    head = {RACING: f"racing segment {i}", WON: f"segment {i} raced", NONE_STARTED: f"segment {i} raced, none started"}
    return f"{head.get(race.get('phase'), 'race')} on {', '.join(race.get('sites') or [])}: " + "; ".join(parts)


# ------------------------------------------------------------------ at submit
def start(store: Store, chain: Chain, sites: list[ChainSite],
          clients: Callable[[str], tuple[SlurmClient, object]], *, time_min_s: int | None = None) -> Segment:
    """Submit segment 0, gated, on every site (each with its own folders, options and script, as the first
    placement would submit there). Each racer's intent is in the store before its sbatch. Returns the first
    racer submitted as a Segment (not stored: segment 0's row is written when a racer wins). Every site
    refusing fails the chain, as a refused first segment does."""
    def seg_for(view: Chain, site: ChainSite) -> Segment:
        seg = Segment(chain_id=chain.id, idx=0, time_limit_s=view.segment_s, cluster=site.cluster)
        if time_min_s:
            seg.extra["time_min_s"] = min(int(time_min_s), view.segment_s)
        return seg

    skipped = (chain.extra.get("race") or {}).get("skipped") or {}  # sites.py: where segment 0 cannot win
    chain.extra["race"] = {"idx": 0, **({"skipped": skipped} if skipped else {})}
    sites = [s for s in sites if s.cluster not in skipped] or sites
    first, refusals = _submit_racers(store, chain, sites, lambda n: clients(n)[0], seg_for)
    if len(refusals) == len(sites):
        chain.status, chain.reason, chain.finished = FAILED, "first segment refused: " + "; ".join(refusals), time.time()
        chain.extra["race"]["phase"] = NONE_STARTED
        store.save(chain, [], [(0, "failed", chain.reason)])
        raise SlurmRefused(chain.reason)
    return first or Segment(chain_id=chain.id, idx=0, phase=SUBMITTING, cluster=chain.extra["race"]["sites"][0])


def begin(t, c: Chain, segs: list[Segment], remaining_s: float) -> bool | None:
    """Planning's first step for a chain submitted with ``--race`` and a segment already behind it (nothing
    of the chain is live: its predecessor ended before a successor was asked for): the successor is raced
    like segment 0, on every site, sized for the work left. True: raced; False: not raced (a race of this
    same segment just ended with none started: this one goes by the rule); None: nothing this tick (the
    last race still has a loser to cancel or a go-ahead to settle: the race driver's, after this tick)."""
    from chainrun.chain import sizing

    if c.extra.get("race") is None or getattr(t, "sites", None) is None:
        return False
    idx = max(s.idx for s in segs) + 1
    last = c.extra["race"]
    if open_racers(c):
        return None
    if last.get("phase") == NONE_STARTED and int(last.get("idx") or 0) == idx:
        return False
    c.extra.setdefault("races_done", []).append(
        {k: last.get(k) for k in ("idx", "phase", "winner", "held_twice_s") if last.get(k) is not None})

    def seg_for(view: Chain, site: ChainSite) -> Segment:
        limit = sizing.segment_limit(remaining_s, segment_s=view.segment_s, signal_lead_s=c.signal_lead_s)
        seg = Segment(chain_id=c.id, idx=idx, time_limit_s=limit, cluster=site.cluster,
                      is_retry=bool(segs) and segs[-1].outcome == "crash")
        if c.extra.get("time_min_s"):
            seg.extra["time_min_s"] = min(int(c.extra["time_min_s"]), limit)
        return seg

    c.extra["race"] = {"idx": idx, "pred": max((s.idx for s in segs if s.credit_s > 0 or s.outcome in (
        "continue", "handoff", "checkpoint-crash")), default=segs[-1].idx)}
    sites = t.store.sites(c.id)
    skipped = _cannot_win(t, c, segs, sites, remaining_s)
    if skipped:
        c.extra["race"]["skipped"] = skipped
        sites = [s for s in sites if s.cluster not in skipped]
    _, refusals = _submit_racers(t.store, c, sites, lambda n: t.slurm if n == c.cluster else t.sites.engine(n).slurm,
                                 seg_for)
    if len(refusals) == len(sites):
        c.extra["race"]["phase"] = NONE_STARTED
        t.store.save(c)
        raise SlurmRefused(f"segment {idx} refused on every cluster: " + "; ".join(refusals))
    return True


def _cannot_win(t, c: Chain, segs: list[Segment], sites: list[ChainSite], remaining_s: float) -> dict[str, str]:
    """The sites a successor's race leaves out, and why: where the chain, even started at once, is done later
    than on the rule's site after its median wait (site_choice.race_sites). No estimate: none left out."""
    from chainrun.chain import site_choice, site_plan

    got = site_plan.choose(t, c, segs[-1], remaining_s=remaining_s, handover_at=None, now=time.time())
    return site_choice.race_sites(got[0] if got else None, [s.cluster for s in sites])[1]


def _submit_racers(store: Store, chain: Chain, sites: list[ChainSite], slurm_of: Callable[[str], SlurmClient],
                   seg_for: Callable[[Chain, ChainSite], Segment]) -> tuple[Segment | None, list[str]]:
    """One gated racer per site, in order of preference; each intent in the store before its sbatch."""
    race = chain.extra["race"]
    i = int(race["idx"])
    race.update(phase=RACING, sites=[s.cluster for s in sorted(sites, key=lambda s: s.rank)], racers={})
    first: Segment | None = None
    refusals = []
    for site in sorted(sites, key=lambda s: s.rank):
        slurm = slurm_of(site.cluster)
        view = span.site_view(chain, site)
        seg = seg_for(view, site)
        try:
            reservations = read_reservations(slurm)
        except RemoteError:  # the sbatch below says what became of this racer; the others race on
            reservations = []
        fit_maintenance(view, seg, reservations, time.time())
        args = sbatch_args(view, seg)
        racer = race["racers"][site.cluster] = {"phase": SUBMITTING, "intent_at": time.time(),
                                                "time_limit_s": seg.time_limit_s, "request": describe(args)}
        store.save(chain)  # the intent first: a job sbatch made but we did not record is adopted by name
        try:
            job_id, cluster = slurm.submit(wrapper_path(view), args, script_args=[str(i), "gated", "race"])
        except SlurmRefused as e:
            racer.update(phase=ENDED, reason=f"sbatch refused: {e}")
            refusals.append(f"{site.cluster}: {e}")
            store.save(chain, events=[(i, "race", f"segment {i} not raced on {site.cluster}: sbatch refused ({e})")])
            continue
        except (SlurmError, RemoteError) as e:  # may have made the job (a timeout, a connection lost while
            # sbatch ran): the watcher adopts it by name, or gives it up; raising here would leave the racers
            # already submitted unreported and invite a second `submit`
            store.save(chain, events=[(i, "warning", f"sbatch for segment {i} on {site.cluster} did not answer "
                                                     f"({e}); the watcher looks for the job")])
            continue
        racer.update(phase=PENDING, job_id=job_id, slurm_cluster=cluster, submit=time.time())
        store.save(chain, events=[(i, "submitted", f"segment {i} submitted as job {job_id} on {site.cluster} "
                                                   "(racing: gated until it is kept)")])
        if first is None:
            first = Segment(chain_id=chain.id, idx=i, phase=PENDING, job_id=job_id, slurm_cluster=cluster,
                            time_limit_s=seg.time_limit_s, cluster=site.cluster, submit=racer["submit"])
    if len(refusals) < len(sites):
        store.save(chain, events=[(i, "race", f"segment {i} raced on {', '.join(race['sites'])}: the first to "
                                              "start trains, the others are cancelled"),
                                  *((i, "race", why) for why in (race.get("skipped") or {}).values())])
    return first, refusals
