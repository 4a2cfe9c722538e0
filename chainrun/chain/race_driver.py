"""The watcher's side of ``--race`` (issue 26): follows every open race once per watcher tick, keeps the first
racer started, lets it train, cancels the others; and ``chainrun cancel`` of a chain still racing.

What a race is, why every racer is gated and how they are submitted: chain/site_race.py. The order here is the
safety: the winner and the generation it claims are in the store before its go-ahead is written (a watcher
that dies in between, and the next one seeing another racer started too, never chooses twice).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from chainrun.chain import outcomes, span
from chainrun.chain.contract import go_text
from chainrun.chain.segments import job_name
from chainrun.chain.site_race import LOST_AFTER_S, NONE_STARTED, RACING, WON, held_s, open_racers, to_cancel, winner
from chainrun.errors import ChainrunError
from chainrun.state.records import (ACTIVE, CANCELLED_OUT, ENDED, LIVE_PHASES, PENDING, RUNNING, UNSTARTED, Chain,
                                    Segment)
from chainrun.state.store import Store

if TYPE_CHECKING:
    from chainrun.slurm.parsers import AcctRow

log = logging.getLogger(__name__)

_RUNNING_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING"}


@dataclass
class Gone:
    """How the racers that left their site's squeue ended: one sacct per site for every racing chain's
    racers there (the house rule: one batched squeue and sacct per cluster and tick, never one per job)."""

    rows: dict[str, dict[str, AcctRow]] = field(default_factory=dict)  # site -> job id -> its last sacct row
    queue_failed: dict[str, ChainrunError] = field(default_factory=dict)  # its squeue failed: the chain waits
    acct_failed: dict[str, ChainrunError] = field(default_factory=dict)  # its sacct failed: those racers wait


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
        chains = self.racing()
        gone = self.sacct(chains)
        for c in chains:
            head = f"{c.id}: race of segment {(c.extra.get('race') or {}).get('idx', 0)}: "
            try:
                waited = self.step(c, gone)
            except ChainrunError as e:  # a site did not answer: the race waits, nothing was half-done
                warnings.append(head + e.message)
                log.info("race of %s: %s", c.id, e, exc_info=True)
                continue
            if waited:  # a site's sacct failed: its racers wait for the next tick, the other sites' went on
                warnings.append(head + "; ".join(f"{n}: {gone.acct_failed[n].message}" for n in waited))
        return warnings

    def sacct(self, chains: list[Chain]) -> Gone:
        """One sacct per site, for every racer of these chains (live, its job id known) that its site's
        squeue no longer shows this tick, since the earliest of their submissions (job ids are reused after
        a controller reset, as SlurmClient.accounting's ``since``). A site whose squeue or sacct fails is
        recorded as such: ``step`` treats its racers as the failure requires."""
        out = Gone()
        left: dict[str, list[dict]] = {}
        for c in chains:
            race = c.extra.get("race") or {}
            if c.status != ACTIVE or race.get("phase") != RACING:
                continue  # step follows no racer of it (a chain no longer active cancels them all)
            for n in race.get("sites") or []:
                r = (race.get("racers") or {}).get(n) or {}
                if r.get("phase") not in LIVE_PHASES or not r.get("job_id") or n in out.queue_failed:
                    continue
                try:
                    rows = self._queue(n)
                except ChainrunError as e:
                    out.queue_failed[n] = e
                    continue
                if not any(q.job_id == r["job_id"] for q in rows):
                    left.setdefault(n, []).append(r)
        for n, rs in left.items():
            try:
                rows = self._site(n).slurm.accounting([r["job_id"] for r in rs],
                                                      since=min(r.get("submit") or r["intent_at"] for r in rs))
            except ChainrunError as e:
                out.acct_failed[n] = e
                log.info("race: sacct on %s: %s", n, e, exc_info=True)
                continue
            out.rows[n] = {x.job_id: x for x in rows}  # the last row of a job: its latest run (sacct -D)
        return out

    def step(self, c: Chain, gone: Gone | None = None) -> list[str]:
        """One chain's race, this tick. ``gone``: the tick's sacct of the racers that left their squeue (made
        here, for this chain alone, when not given). Returns the sites whose sacct failed with a racer of this
        chain to follow there: those racers wait for the next tick."""
        if gone is None:
            gone = self.sacct([c])
        race = c.extra["race"]
        i = int(race.get("idx") or 0)
        events: list[tuple[int | None, str, str]] = []
        waited: list[str] = []
        if c.status != ACTIVE and race.get("phase") == RACING:  # cancelled (or failed) while racing: all go
            race["phase"], race["winner"] = NONE_STARTED, None
            events.append((i, "race", f"the chain is {c.status.lower()}: every racer is cancelled"))
        if race.get("phase") == RACING:
            for n in race["sites"]:
                if race["racers"].get(n, {}).get("phase") in LIVE_PHASES:
                    if not self._follow(c, i, n, race["racers"][n], gone, events):
                        waited.append(n)
            if race.get("winner") is None and (w := winner(race["racers"], race["sites"])) is not None:
                race["winner"], race["decided_at"] = w, self.clock()
                race["gen"] = self._generation(c, i, w)
                self.store.save(c)  # the choice is kept before the go-ahead: a next watcher never chooses twice
            if race.get("winner") is not None:
                self._keep(c, race, events)
            elif not any(r.get("phase") in LIVE_PHASES for r in race["racers"].values()):
                race["phase"] = NONE_STARTED
                events.append((i, "race", f"every racer of segment {i} ended before starting: segment {i} is "
                                          "placed by the rule"))
        elif race.get("phase") == WON and not race.get("settled"):
            self._withdraw(c, race, events)
        self.store.save(c, events=events)
        self._cancel_losers(c, race)
        return waited

    def _generation(self, c: Chain, i: int, w: str) -> int:
        """The generation the kept racer claims. Segment 0: 0. A successor on the chain's site: above every
        generation claimed or named there. On another site: a move's (site_plan.next_generation): above
        every generation claimed where the chain trains, and above the last move away from that site."""
        if i == 0:
            return 0
        sites = {s.cluster: s for s in self.store.sites(c.id)}

        def names(n: str) -> set[str]:
            got = span.control_names(self._site(n).runner, sites[n].run_dir)
            if got is None:
                raise ChainrunError(f"cannot list {sites[n].run_dir}/control on {n}")
            return got

        here = names(c.cluster)
        if w == c.cluster:
            return max(span.highest(here, k) for k in ("owner", "go", "moved")) + 1
        return max(span.highest(here, "owner") + 1, span.highest(names(w), "moved") + 1)

    def _withdraw(self, c: Chain, race: dict, events: list) -> None:
        """The kept racer ended without training (cancelled outside chainrun, or its node failed before it
        claimed): a ``go.<G>`` of ours on its site would make every later segment there end ``stale`` (a
        go-ahead for a generation nobody claimed is only a gated segment's to take), so it is removed; the
        job it named has ended, nothing else there may claim by it. Settled once the segment ended either
        way; a kept racer on another site than the checkpoint's is a move, whose driver writes the go-ahead."""
        i = int(race.get("idx") or 0)
        seg = next((s for s in self.store.segments(c.id) if s.idx == i), None)
        if seg is None or seg.phase != ENDED:
            return
        if seg.outcome == UNSTARTED and c.status == ACTIVE and race.get("go_written"):
            g = int(race.get("gen") or 0)
            site = next(s for s in self.store.sites(c.id) if s.cluster == race["winner"])
            res = self._site(race["winner"]).runner.run(["rm", "-f", "--", f"{site.run_dir}/control/go.{g}"], 60)
            if not res.ok:
                raise ChainrunError(f"cannot remove go.{g} on {race['winner']}: {res.first_error_line()}")
            events.append((i, "race", f"segment {i} ended on {race['winner']} before it trained: its go.{g} is "
                                      "removed, the chain goes on by the rule"))
        race["settled"] = True

    def _follow(self, c: Chain, i: int, name: str, r: dict, gone: Gone, events: list) -> bool:
        """One racer's phase from its site's squeue this tick; from the tick's one sacct of that site for one
        that left it. False: that sacct failed, the racer waits (it is in no squeue: it runs nowhere, it
        cannot be kept)."""
        if name in gone.queue_failed:
            raise gone.queue_failed[name]  # the whole chain waits: a racer there may have started
        rows = self._queue(name)
        row = next((q for q in rows if (r.get("job_id") and q.job_id == r["job_id"])
                    or (not r.get("job_id") and q.name == job_name(c.id, i))), None)
        now = self.clock()
        if row is not None:
            if not r.get("job_id"):
                events.append((i, "adopted", f"found job {row.job_id} for segment {i} on {name}"))
            r["job_id"], r["slurm_state"] = row.job_id, row.state
            if row.state in _RUNNING_STATES:
                if r.get("phase") != RUNNING:
                    r["start"] = row.start or now
                    events.append((i, "started", f"segment {i} (job {row.job_id}) started on {name}"))
                r["phase"], r["end"] = RUNNING, row.end
            else:
                r["phase"] = PENDING
            return True
        if r.get("job_id"):
            if name in gone.acct_failed:
                return False
            last = gone.rows.get(name, {}).get(r["job_id"])
            if last is not None and outcomes.is_final(last.state):
                r.update(phase=ENDED, slurm_state=last.state, end=last.end or now,
                         reason=f"ended {last.state} before it was kept")
                events.append((i, "race", f"racer on {name} (job {r['job_id']}) {r['reason']}"))
        elif now - float(r["intent_at"]) > LOST_AFTER_S:
            r.update(phase=ENDED, reason="sbatch was never confirmed")
            events.append((i, "race", f"racer on {name}: {r['reason']}"))
        return True

    def _keep(self, c: Chain, race: dict, events: list) -> None:
        """The winner's segment row, and what lets it train: on the site the chain's checkpoint is on (or for
        segment 0, anywhere: nothing to carry) its go-ahead, written now; on another site a move, whose
        driver (chain/mover.py) fences the old site, copies and verifies the checkpoint, then writes it."""
        i, w, g = int(race.get("idx") or 0), race["winner"], int(race.get("gen") or 0)
        site = next(s for s in self.store.sites(c.id) if s.cluster == w)
        r = race["racers"][w]
        seg = Segment(chain_id=c.id, idx=i, phase=RUNNING, job_id=r["job_id"], slurm_cluster=r.get("slurm_cluster"),
                      slurm_state=r.get("slurm_state", ""), time_limit_s=int(r["time_limit_s"]),
                      intent_at=float(r["intent_at"]), submit=r.get("submit"), start=r.get("start"), end=r.get("end"),
                      cluster=w, extra={"request": r.get("request", ""), "race": {"sites": race["sites"], "winner": w}})
        moving = i > 0 and w != c.cluster
        # kept: the racer waits on for its go-ahead (a move's copy may take long) instead of giving its
        # nodes back when not kept in time (templates/wrapper.sh, CHAINRUN_RACE_KEEP); before the go-ahead
        self._site(w).runner.write_file(f"{site.run_dir}/control/kept.{r['job_id']}",
                                        f"chain={c.id}\nseg={i}\ngen={g}\nat={self.clock():.0f}\n", 0o600)
        if moving:
            from chainrun.chain.move_steps import AHEAD

            seg.extra["move"] = {"from": c.cluster, "to": w, "gen": g, "pred": int(race.get("pred") or 0),
                                 "phase": AHEAD, "at": self.clock(), "decided": {"race": True}}
            said = f"moving the chain there (generation {g}: its checkpoint is copied and verified first)"
        else:
            self._site(w).runner.write_file(f"{site.run_dir}/control/go.{g}",
                                            go_text(c.id, g, seg=i, at=self.clock()), 0o600)
            race["go_written"] = True
            said = f"wrote go.{g} there"
            if w != c.cluster:
                span.move_to(c, site)  # segment 0: not a move, nothing ran anywhere yet
        race["phase"], race["won_at"] = WON, self.clock()
        tie = sum(1 for x in race["racers"].values() if x.get("phase") == RUNNING) > 1
        events.append((i, "race", f"segment {i} kept on {w} (job {r['job_id']}, started first"
                                  + (", preferred of those started" if tie else "")
                                  + f"): {said}; cancelling the racers on " + (", ".join(to_cancel(race)) or "no other site")))
        if moving:
            race["settled"] = True  # the move's driver owns the go-ahead (and abandons it if the segment ends first)
        self.store.save(c, [seg])

    def _cancel_losers(self, c: Chain, race: dict) -> None:
        """scancel every live racer but the winner, one call per site; one that fails is asked again next tick."""
        i = int(race.get("idx") or 0)
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
                    events.append((i, "warning", f"racer on {n} (job {r['job_id']}) could not be cancelled: "
                                                 f"{failed[r['job_id']]}; trying again every watcher tick"))
                r["cancel_failed"] = failed[r["job_id"]]
                continue
            r.pop("cancel_failed", None)
            held = held_s(r, now)
            r.update(phase=ENDED, outcome=CANCELLED_OUT, cancelled_at=now, held_s=round(held, 1))
            why = (f"it started before the watcher noticed and held its nodes {int(held)}s, gated (GPU time held "
                   "twice; it trained nothing)" if held else "it never started")
            events.append((i, "race", f"racer on {n} (job {r['job_id']}) cancelled: "
                                      + (f"segment {i} runs on {race['winner']}; " if race.get("winner") else "")
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

    # the chain's row is cancelled: no racer is followed (no sacct), every live one is cancelled
    Race(store, site, lambda name: []).step(c)
