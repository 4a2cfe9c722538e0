"""One watcher tick: reconcile every active chain with Slurm, then move it forward.

Budget per tick, whatever the number of chains: one ``squeue`` and at most one ``sacct``
(plus ``sbatch``/``scancel`` when something is actually submitted or cancelled). A failed
Slurm query ends the tick early and changes nothing; the next tick tries again.
"""

from __future__ import annotations

import logging

from chainrun.chain import handoff_plan, outcomes, placement, planning, progress, queue_row, reconcile, segment_end
from chainrun.chain import settle, span, spread, total_stop
from chainrun.chain.cancel import retry_cancels
from chainrun.chain.pace import segment_rate
from chainrun.chain.segments import job_name
from chainrun.chain.tick_context import TickContext, TickReport
from chainrun.errors import SlurmError, TransientSlurmError
from chainrun.slurm.client import SlurmRefused
from chainrun.slurm.parsers import AcctRow, QueueRow
from chainrun.state.records import ACTIVE, CANCELLED_OUT, ENDED, PENDING, RUNNING, SUBMITTING, Chain, Segment

log = logging.getLogger(__name__)

ADOPT_AFTER_S = 60  # a SUBMITTING segment this old with no job in squeue is looked up in sacct
LOST_AFTER_S = 900  # a job neither squeue nor sacct knows for this long is declared lost


class Engine(TickContext):
    """The tick's orchestrator: read Slurm (one squeue, at most one sacct), reconcile each chain's
    segments with it, then per chain: settle, read what ended, stop at --total, plan, act, record.
    The parts live in their own modules (see chain/tick_context.py)."""

    # ------------------------------------------------------------------ tick
    def tick(self) -> TickReport:
        report = TickReport()
        before = dict(self.slurm.calls)
        # finished chains too while a cancelled segment's accounting is still to be read (chain/settle.py)
        chains = [c for c in self.store.chains() if settle.needs_tick(c)]
        report.chains = sum(1 for c in chains if c.status == ACTIVE)
        # finished chains whose jobs a scancel could not stop (cancel_live): asked again every tick
        stuck = [c for c in self.store.chains() if c.status != ACTIVE and c.extra.get("cancel_pending")]
        if chains or stuck:
            try:
                if chains:
                    self._tick(chains, report)
                retry_cancels(self.store, self.slurm, stuck)
            except TransientSlurmError as e:
                report.failed, report.cause = True, e
                report.warnings.append(f"Slurm did not answer ({e}); trying again next tick")
                log.info("tick skipped: %s", e)  # the file; the screen gets it once, as the tick's warning
            except SlurmError as e:  # unreadable output or an error we do not know: Slurm's state, not the chains'
                report.failed, report.cause = True, e
                report.warnings.append(f"Slurm query failed ({e}); nothing changed, trying again next tick")
                log.info("tick skipped: %s", e, exc_info=True)  # the traceback: log file always, screen with -v
        report.slurm_calls = {k: v - before.get(k, 0) for k, v in self.slurm.calls.items() if v - before.get(k, 0)}
        return report

    def _tick(self, chains: list[Chain], report: TickReport) -> None:
        # the predicted policy reads everyone's queue; it comes from the same single squeue call
        segs = {c.id: self.store.segments(c.id) for c in chains}
        # ... and while a segment runs, so does the interference record (who shares its nodes: docs/placement.md)
        everyone = (self.predictor is not None and any(c.policy == "predicted" for c in chains)) or any(
            s.phase == RUNNING for c in chains for s in segs[c.id])
        queue = self.slurm.queue(all_users=everyone)
        self.queue = queue
        self._reservations = None
        # each row goes to the segment it belongs to, by id, name and submit time: a recorded id that now
        # names a later job (ids restart after a controller reset) is not ours, and never the other way round
        recorded: dict[str, list[tuple[Chain, Segment]]] = {}
        # a segment on another site (a move under way, chain/span.py) is the driver's: never looked up here
        for c in chains:
            for s in segs[c.id]:
                if s.job_id and (s.phase in (PENDING, RUNNING) or s.extra.get("settle") is not None) and not span.foreign(c, s):
                    recorded.setdefault(s.job_id, []).append((c, s))
        by_seg, foreign = reconcile.match_rows(queue, recorded)
        for c, s, q in foreign:
            self._note_reuse(c, s, q)
        by_name = {q.name: q for q in queue if not everyone or q.user == self.user}

        # adopt jobs whose submission we did not get to record
        for c in chains:
            for s in segs[c.id]:
                if s.phase == SUBMITTING and not span.foreign(c, s) and (q := by_name.get(job_name(c.id, s.idx))):
                    s.job_id, s.phase = q.job_id, PENDING
                    self.store.save(c, [s], [(s.idx, "adopted", f"found job {q.job_id} for segment {s.idx}")])

        # one sacct for every live job that left squeue, plus old unconfirmed submissions
        now = self.clock()
        gone = [s for c in chains for s in segs[c.id]
                if s.job_id and any(o is s for _, o in recorded.get(s.job_id, ())) and (c.id, s.idx) not in by_seg]
        orphans = [(c, s) for c in chains for s in segs[c.id]
                   if s.phase == SUBMITTING and now - s.intent_at > ADOPT_AFTER_S and not span.foreign(c, s)]
        acct: dict[tuple[str, int], AcctRow] = {}
        if gone:
            since = min((s.submit or s.intent_at or now) for s in gone)
            acct, foreign = reconcile.match_rows(self.slurm.accounting([s.job_id for s in gone], since=since), recorded)
            for c, s, r in foreign:
                self._note_reuse(c, s, r)
        elif orphans:  # rare; on its own sacct call so a tick never needs more than one
            since = min(s.intent_at for _, s in orphans)
            rows = self.slurm.accounting_by_name([job_name(c.id, s.idx) for c, s in orphans], since=since)
            found = {r.name: r for r in rows}
            for c, s in orphans:
                if r := found.get(job_name(c.id, s.idx)):
                    s.job_id, s.phase = r.job_id, PENDING
                    self.store.save(c, [s], [(s.idx, "adopted", f"found job {r.job_id} for segment {s.idx}")])
                    gone.append(s)
                    acct[(c.id, s.idx)] = r
                else:  # sbatch never created it: plan it again
                    s.phase = ENDED
                    s.outcome = CANCELLED_OUT
                    s.reason = reconcile.UNCONFIRMED
                    self.store.save(c, [s], [(s.idx, "warning", f"segment {s.idx}: {s.reason}; resubmitting")])

        self._cancel_strays(segs, queue)
        for c in chains:
            if c.status != ACTIVE:  # finished: only its cancelled segments' accounting is left to read
                self._settle(c, segs[c.id], by_seg, acct)
                continue
            try:
                self._advance(c, segs[c.id], by_seg, acct, report)
            except SlurmRefused as e:  # this chain's request was refused: stop it, keep the others going
                self.fail(c, segs[c.id], f"Slurm refused a request: {e}")
                report.warnings.append(f"{c.id}: {e}")
            # any other SlurmError means Slurm is unwell, not that the chain is wrong: it ends the tick

    def _settle(self, c: Chain, segs: list[Segment], by_seg: dict, acct: dict) -> None:
        """Cancelled segments whose job has ended: their figures from sacct and the wrapper (chain/settle.py)."""
        now = self.clock()
        for s in settle.unsettled([s for s in segs if not span.foreign(c, s)]):
            row = acct.get((c.id, s.idx))
            if row is None or not outcomes.is_final(row.state):
                if (c.id, s.idx) not in by_seg and now - float(s.extra["settle"]) > settle.GIVE_UP_S:
                    self.store.save(c, [s], [(s.idx, "warning", settle.give_up(s))])
                continue
            info = outcomes.read_outcome_file(self.runner, c, s, run_start=(row.start or row.submit) if s.extra.get("requeues") else None)
            trained, text = settle.settle(c, s, row, info, earlier=outcomes.earlier_runs(self.runner, c, s))
            s.credit_s = trained
            if trained > 0:
                self.read_progress(c, s)
            s.extra["rate"] = segment_rate(c, s, segs, final=True)
            s.extra["work_s"] = trained * s.extra["rate"]
            c.credited_s += s.extra["work_s"]
            self.store.save(c, [s], [(s.idx, "settled", text)])
        if c.extra.get("settling") and not settle.unsettled(segs):
            settle.done_settling(c, segs)
            self.store.save(c)

    def _note_reuse(self, c: Chain, s: Segment, row) -> None:
        if s.extra.get("reused_id_seen") != row.job_id + (row.name or ""):
            s.extra["reused_id_seen"] = row.job_id + (row.name or "")
            self.store.save(c, [s], [(s.idx, "warning", reconcile.reuse_note(c.id, s, row))])

    def _cancel_strays(self, segs: dict[str, list[Segment]], queue: list[QueueRow]) -> None:
        """A second job for one segment (a submission that looked failed but landed) must not run."""
        found = reconcile.strays(queue, segs, self.user)
        if not found:
            return
        failed = self.slurm.cancel([q.job_id for _, _, q in found])
        for chain_id, s, q in found:
            what = f"job {q.job_id} ({q.name}) is a second copy of segment {s.idx} (recorded: {s.job_id or 'none'})"
            if q.job_id in failed:  # still in the queue: found again, and cancelled again, next tick
                self.store.add_event(chain_id, s.idx, "warning", f"{what}; scancel failed ({failed[q.job_id]}), "
                                                                 "trying again next tick")
            else:
                self.store.add_event(chain_id, s.idx, "warning", f"{what}; cancelled it")
        log.warning("stray jobs %s; not cancelled: %s", [q.job_id for _, _, q in found], sorted(failed))

    # ------------------------------------------------------------------ one chain
    def _advance(self, c: Chain, segs: list[Segment], by_seg: dict, acct: dict, report: TickReport) -> None:
        now = self.clock()
        self._settle(c, segs, by_seg, acct)
        for s in segs:
            if s.phase not in (PENDING, RUNNING) or span.foreign(c, s):
                continue
            q = by_seg.get((c.id, s.idx))
            if q is not None:
                queue_row.apply(self, c, segs, s, q)
                if s.phase == RUNNING:
                    placement.record_sharing(s, q, self.queue, now)
                    self._record_switches(s)
                if s.phase == RUNNING and now - (s.extra.get("progress") or {}).get("read_at", 0) >= progress.READ_EVERY_S:
                    self.read_progress(c, s)
                if s.phase == RUNNING:
                    self.note_training_start(c, s, now)
            elif (row := acct.get((c.id, s.idx))) is not None and outcomes.is_final(row.state):
                segment_end.ended(self, c, segs, s, row)
                report.ended += 1
            elif now - max(s.submit or 0, s.intent_at) > LOST_AFTER_S and (c.id, s.idx) not in acct:
                s.phase, s.outcome, s.reason = ENDED, "crash", "Slurm has no record of this job"
                self.store.save(c, [s], [(s.idx, "lost", f"segment {s.idx} (job {s.job_id}): {s.reason}")])
                segment_end.count_failure(self, c, segs, s)
            if c.status != ACTIVE:
                return
        outcomes.record_overlaps(segs)
        here = [s for s in segs if not span.foreign(c, s)]
        total_stop.stop_at_total(self, c, here, now)
        handoff_plan.refresh(self.runner, c, here)  # a queued successor's adaptive hand-off rule
        self.store.save(c, segs)
        planning.plan(self, c, segs, report)

    def _record_switches(self, s: Segment) -> None:
        """How many leaf switches a running segment spans (chain/spread.py); topology read once."""
        if "switches" in s.extra or not s.extra.get("slurm_nodes"):
            return
        if self._topology is None:
            try:
                self._topology = self.slurm.topology()
            except SlurmError as e:  # transient: ask again next tick
                log.info("scontrol show topology: %s", e)
                return
        spread.record_switches(s, self._topology)

    # ------------------------------------------------------------------ planning
    # ------------------------------------------------------------------ elastic shapes (docs/elastic.md)
    # ------------------------------------------------------------------ endings
__all__ = ["Engine", "TickReport"]
