"""Racing segment 0 of a chain spanning clusters: ``chainrun submit --cluster a,b --race`` (issue 26).

The replay (chainrun/sim/site_chain.py, row ``predicted_multi_race``) races a segment whenever nothing of
the chain is live: it is submitted on every site, the first to start is kept, the others are cancelled.
It takes the real first wait instead of the predicted one, and its evidence favours it at every load
level (docs/multi-cluster.md). The product races **segment 0 only**, opt-in; every later segment is
placed by the rule (chain/site_plan.py), as without ``--race``.

Never two copies training: every racer is submitted *gated* (templates/wrapper.sh: it waits for
``control/go.0`` in its own site's run folder, and ends ``unstarted`` at its limit without one). The
watcher, on the tick its one squeue per site shows a racer started, records that racer as the winner
(before anything else, so a watcher that dies and a next one that sees another racer started too never
chooses twice), writes ``go.0`` on the winner's site only, records it as segment 0 there (the chain's row
takes that site's folders: nothing ran yet, there is nothing to carry), then cancels the others: pending
ones never held a node; one that started before the watcher noticed held its nodes, gated, until the
scancel (``held_s``: GPU time held twice). Ties (several started by the same tick): the preferred site,
the order of ``--cluster``.

Until a winner is recorded the chain has no segment row (segments are keyed by (chain, idx); the racers
are all "segment 0"): the racers live in ``chain.extra["race"]`` and planning leaves the chain alone
(``live``). A race in which every racer ended without starting falls back to the rule: planning's first
step submits segment 0 on the chain's site, as a chain submitted without ``--race``.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from chainrun.chain import outcomes, span
from chainrun.chain.contract import go_text
from chainrun.chain.maintenance import fit_maintenance, read_reservations
from chainrun.chain.request import describe
from chainrun.chain.segments import job_name, sbatch_args, wrapper_path
from chainrun.errors import ChainrunError, SlurmError
from chainrun.slurm.client import SlurmClient, SlurmRefused
from chainrun.state.records import (ACTIVE, CANCELLED_OUT, ENDED, FAILED, LIVE_PHASES, PENDING, RUNNING,
                                    SUBMITTING, UNSTARTED, Chain, ChainSite, Segment)
from chainrun.state.store import Store

log = logging.getLogger(__name__)

RACING = "racing"  # racers submitted, none recorded as started yet
WON = "won"  # a racer was kept: segment 0 (the others are cancelled, or being cancelled)
NONE_STARTED = "none-started"  # every racer ended before starting: the rule places segment 0
LOST_AFTER_S = 900.0  # a racer whose sbatch was never confirmed, found in no squeue this long: never made
_RUNNING_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING"}


# ------------------------------------------------------------------ pure parts
def live(c: Chain) -> bool:
    """The race of segment 0 is not decided: planning leaves the chain to the race driver."""
    return (c.extra.get("race") or {}).get("phase") == RACING


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
    racers = race.get("racers") or {}
    parts = []
    for n in race.get("sites") or []:
        r = racers.get(n) or {}
        what = f"{n} job {r.get('job_id') or '?'}"
        if n == race.get("winner"):
            what += " started first: kept as segment 0"
        elif r.get("outcome") == CANCELLED_OUT:
            what += (f" cancelled after holding its nodes {int(r.get('held_s') or 0)}s (gated, trained nothing)"
                     if r.get("held_s") else " cancelled while pending")
        elif r.get("phase") in LIVE_PHASES:
            what += f" {r['phase'].lower()}" + (" (scancel failed: " + r["cancel_failed"] + ")"
                                                if r.get("cancel_failed") else "")
        else:
            what += f" ended ({r.get('reason') or r.get('slurm_state') or 'before starting'})"
        parts.append(what)
    head = {RACING: "racing segment 0", WON: "segment 0 raced", NONE_STARTED: "segment 0 raced, none started"}
    return f"{head.get(race.get('phase'), 'race')} on {', '.join(race.get('sites') or [])}: " + "; ".join(parts)


# ------------------------------------------------------------------ at submit
def start(store: Store, chain: Chain, sites: list[ChainSite],
          clients: Callable[[str], tuple[SlurmClient, object]], *, time_min_s: int | None = None) -> Segment:
    """Submit segment 0, gated, on every site (each with its own folders, options and script, as the first
    placement would submit there). Each racer's intent is in the store before its sbatch. Returns the first
    racer submitted as a Segment (not stored: segment 0's row is written when a racer wins). Every site
    refusing fails the chain, as a refused first segment does."""
    race = chain.extra["race"]
    race.update(phase=RACING, sites=[s.cluster for s in sorted(sites, key=lambda s: s.rank)], racers={})
    first: Segment | None = None
    refusals = []
    for site in sorted(sites, key=lambda s: s.rank):
        slurm, _ = clients(site.cluster)
        view = span.site_view(chain, site)
        seg = Segment(chain_id=chain.id, idx=0, time_limit_s=view.segment_s, cluster=site.cluster)
        if time_min_s:
            seg.extra["time_min_s"] = min(int(time_min_s), view.segment_s)
        fit_maintenance(view, seg, read_reservations(slurm), time.time())
        args = sbatch_args(view, seg)
        racer = race["racers"][site.cluster] = {"phase": SUBMITTING, "intent_at": time.time(),
                                                "time_limit_s": seg.time_limit_s, "request": describe(args)}
        store.save(chain)  # the intent first: a job sbatch made but we did not record is adopted by name
        try:
            job_id, cluster = slurm.submit(wrapper_path(view), args, script_args=["0", "gated"])
        except SlurmRefused as e:
            racer.update(phase=ENDED, reason=f"sbatch refused: {e}")
            refusals.append(f"{site.cluster}: {e}")
            store.save(chain, events=[(0, "race", f"segment 0 not raced on {site.cluster}: sbatch refused ({e})")])
            continue
        except SlurmError as e:  # may have made the job: the watcher adopts it by name, or gives it up
            store.save(chain, events=[(0, "warning", f"sbatch for segment 0 on {site.cluster} did not answer "
                                                     f"({e}); the watcher looks for the job")])
            continue
        racer.update(phase=PENDING, job_id=job_id, slurm_cluster=cluster, submit=time.time())
        store.save(chain, events=[(0, "submitted", f"segment 0 submitted as job {job_id} on {site.cluster} "
                                                   "(racing: gated until it is kept)")])
        if first is None:
            first = Segment(chain_id=chain.id, idx=0, phase=PENDING, job_id=job_id, slurm_cluster=cluster,
                            time_limit_s=seg.time_limit_s, cluster=site.cluster, submit=racer["submit"])
    if len(refusals) == len(sites):
        chain.status, chain.reason, chain.finished = FAILED, "first segment refused: " + "; ".join(refusals), time.time()
        race["phase"] = NONE_STARTED
        store.save(chain, [], [(0, "failed", chain.reason)])
        raise SlurmRefused(chain.reason)
    store.save(chain, events=[(0, "race", f"segment 0 raced on {', '.join(race['sites'])}: the first to start "
                                          "trains, the others are cancelled")])
    return first or Segment(chain_id=chain.id, idx=0, phase=SUBMITTING, cluster=race["sites"][0])


# ------------------------------------------------------------------ the watcher's driver
class Race:
    """Follows the racers once per watcher tick. ``site(name)``: that site's Engine (Slurm client, runner),
    as MultiEngine keeps them; ``queue(name)``: that site's squeue for this tick (SiteAccess: one per site
    and tick, shared with site planning)."""

    def __init__(self, store: Store, site: Callable[[str], object], queue: Callable[[str], list],
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self._site, self._queue, self.clock = store, site, queue, clock

    def racing(self) -> list[Chain]:
        return [c for c in self.store.chains() if span.spans(c) and open_racers(c)]

    def tick(self) -> list[str]:
        warnings = []
        for c in self.racing():
            try:
                self.step(c)
            except ChainrunError as e:  # a site did not answer: the race waits, nothing was half-done
                warnings.append(f"{c.id}: race of segment 0: {e.message}")
                log.info("race of %s: %s", c.id, e, exc_info=True)
        return warnings

    def step(self, c: Chain) -> None:
        race = c.extra["race"]
        events: list[tuple[int | None, str, str]] = []
        if c.status != ACTIVE and race.get("phase") == RACING:  # cancelled (or failed) while racing: all go
            race["phase"], race["winner"] = NONE_STARTED, None
            events.append((0, "race", f"the chain is {c.status.lower()}: every racer is cancelled"))
        if race.get("phase") == RACING:
            for n in race["sites"]:
                if race["racers"].get(n, {}).get("phase") in LIVE_PHASES:
                    self._follow(c, n, race["racers"][n], events)
            if race.get("winner") is None and (w := winner(race["racers"], race["sites"])) is not None:
                race["winner"], race["decided_at"] = w, self.clock()
                self.store.save(c)  # the choice is kept before the go-ahead: a next watcher never chooses twice
            if race.get("winner") is not None:
                self._keep(c, race, events)
            elif not any(r.get("phase") in LIVE_PHASES for r in race["racers"].values()):
                race["phase"] = NONE_STARTED
                events.append((0, "race", "every racer of segment 0 ended before starting: segment 0 is placed "
                                          "by the rule"))
        elif race.get("phase") == WON and not race.get("settled"):
            self._withdraw(c, race, events)
        self.store.save(c, events=events)
        self._cancel_losers(c, race)

    def _withdraw(self, c: Chain, race: dict, events: list) -> None:
        """Segment 0 kept but ended without training (cancelled outside chainrun, or its node failed before
        it claimed): its ``go.0`` would make every later segment on that site end ``stale`` (a go-ahead for
        a generation nobody claimed is only a gated segment's to take), so it is removed; the job it named
        has ended, nothing else there may claim by it. Settled once segment 0 has ended either way."""
        seg = next((s for s in self.store.segments(c.id) if s.idx == 0), None)
        if seg is None or seg.phase != ENDED:
            return
        if seg.outcome == UNSTARTED and c.status == ACTIVE:
            site = next(s for s in self.store.sites(c.id) if s.cluster == race["winner"])
            res = self._site(race["winner"]).runner.run(["rm", "-f", "--", f"{site.run_dir}/control/go.0"], 60)
            if not res.ok:
                raise ChainrunError(f"cannot remove go.0 on {race['winner']}: {res.first_error_line()}")
            events.append((0, "race", f"segment 0 ended on {race['winner']} before it trained: its go.0 is removed, "
                                      "the chain goes on by the rule"))
        race["settled"] = True

    def _follow(self, c: Chain, name: str, r: dict, events: list) -> None:
        """One racer's phase from its site's squeue this tick; sacct only for one that left it."""
        rows = self._queue(name)
        row = next((q for q in rows if (r.get("job_id") and q.job_id == r["job_id"])
                    or (not r.get("job_id") and q.name == job_name(c.id, 0))), None)
        now = self.clock()
        if row is not None:
            if not r.get("job_id"):
                events.append((0, "adopted", f"found job {row.job_id} for segment 0 on {name}"))
            r["job_id"], r["slurm_state"] = row.job_id, row.state
            if row.state in _RUNNING_STATES:
                if r.get("phase") != RUNNING:
                    r["start"] = row.start or now
                    events.append((0, "started", f"segment 0 (job {row.job_id}) started on {name}"))
                r["phase"], r["end"] = RUNNING, row.end
            else:
                r["phase"] = PENDING
            return
        if r.get("job_id"):
            acct = [x for x in self._site(name).slurm.accounting([r["job_id"]], since=r.get("submit") or r["intent_at"])
                    if x.job_id == r["job_id"]]
            if acct and outcomes.is_final(acct[-1].state):
                r.update(phase=ENDED, slurm_state=acct[-1].state, end=acct[-1].end or now,
                         reason=f"ended {acct[-1].state} before it was kept")
                events.append((0, "race", f"racer on {name} (job {r['job_id']}) {r['reason']}"))
        elif now - float(r["intent_at"]) > LOST_AFTER_S:
            r.update(phase=ENDED, reason="sbatch was never confirmed")
            events.append((0, "race", f"racer on {name}: {r['reason']}"))

    def _keep(self, c: Chain, race: dict, events: list) -> None:
        """The winner: its go-ahead on its own site, then segment 0's row there (and the chain's row)."""
        w = race["winner"]
        site = next(s for s in self.store.sites(c.id) if s.cluster == w)
        r = race["racers"][w]
        self._site(w).runner.write_file(f"{site.run_dir}/control/go.0",
                                        go_text(c.id, 0, seg=0, at=self.clock()), 0o600)
        seg = Segment(chain_id=c.id, idx=0, phase=RUNNING, job_id=r["job_id"], slurm_cluster=r.get("slurm_cluster"),
                      slurm_state=r.get("slurm_state", ""), time_limit_s=int(r["time_limit_s"]),
                      intent_at=float(r["intent_at"]), submit=r.get("submit"), start=r.get("start"), end=r.get("end"),
                      cluster=w, extra={"request": r.get("request", ""), "race": {"sites": race["sites"], "winner": w}})
        if w != c.cluster:
            span.move_to(c, site)  # not a move: nothing ran anywhere yet
        race["phase"], race["won_at"] = WON, self.clock()
        events.append((0, "race", f"segment 0 kept on {w} (job {r['job_id']}, started first"
                                  + (", preferred of those started" if sum(
                                      1 for x in race["racers"].values() if x.get("phase") == RUNNING) > 1 else "")
                                  + f"): wrote go.0 there; cancelling the racers on "
                                  + (", ".join(to_cancel(race)) or "no other site")))
        self.store.save(c, [seg])

    def _cancel_losers(self, c: Chain, race: dict) -> None:
        """scancel every live racer but the winner, one call per site; one that fails is asked again next tick."""
        events = []
        by_site: dict[str, list[str]] = {}
        for n in to_cancel(race):
            r = race["racers"][n]
            if r.get("job_id"):
                by_site.setdefault(n, []).append(r["job_id"])
        for n, ids in by_site.items():
            failed = self._site(n).slurm.cancel(ids)
            r = race["racers"][n]
            now = self.clock()
            if r["job_id"] in failed:
                if r.get("cancel_failed") != failed[r["job_id"]]:
                    events.append((0, "warning", f"racer on {n} (job {r['job_id']}) could not be cancelled: "
                                                 f"{failed[r['job_id']]}; trying again every watcher tick"))
                r["cancel_failed"] = failed[r["job_id"]]
                continue
            r.pop("cancel_failed", None)
            held = held_s(r, now)
            r.update(phase=ENDED, outcome=CANCELLED_OUT, cancelled_at=now, held_s=round(held, 1))
            why = (f"it started before the watcher noticed and held its nodes {int(held)}s, gated (GPU time held "
                   "twice; it trained nothing)" if held else "it never started")
            events.append((0, "race", f"racer on {n} (job {r['job_id']}) cancelled: "
                                      + (f"segment 0 runs on {race['winner']}; " if race.get("winner") else "")
                                      + why))
            race["held_twice_s"] = round(float(race.get("held_twice_s") or 0) + held, 1)
        if events:
            self.store.save(c, events=events)


def cancel_racers(store: Store, c: Chain, open_site: Callable[[str], object]) -> None:
    """`chainrun cancel` of a chain whose racers are still live (the chain's row is already cancelled):
    every racer is cancelled now, on its own site (``open_site(name)``: a context with .slurm, .runner;
    the caller closes them). One Slurm would not cancel is asked again by every watcher tick."""
    opened: dict[str, object] = {}

    def site(name: str):
        if name not in opened:
            opened[name] = open_site(name)
        return opened[name]

    Race(store, site, lambda name: []).step(c)
