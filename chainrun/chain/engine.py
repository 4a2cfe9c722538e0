"""One watcher tick: reconcile every active chain with Slurm, then move it forward.

Budget per tick, whatever the number of chains: one ``squeue`` and at most one ``sacct``
(plus ``sbatch``/``scancel`` when something is actually submitted or cancelled). A failed
Slurm query ends the tick early and changes nothing; the next tick tries again.
"""

from __future__ import annotations

import getpass
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from chainrun.chain import handoff_plan, outcomes, reconcile, settle, sizing
from chainrun.chain.contract import control_path, done_file, parse_outcome
from chainrun.chain.policies import PolicyView, WaitEstimate, get_policy
from chainrun.chain.pace import (
    chain_efficiency, chain_shape_rate, chain_shapes, expected_training, measured_pace, segment_overhead, segment_rate,
    total_tolerance, trained_so_far, work_done,
)
from chainrun.chain.shapes import ShapeChoice, choose_filler, choose_shape
from chainrun.chain.segments import job_name, parse_job_name, submit_segment
from chainrun.chain.maintenance import fit_maintenance, read_reservations
from chainrun.durations import format_duration
from chainrun.errors import SlurmError, TransientSlurmError
from chainrun.runner.base import Runner
from chainrun.slurm import reasons
from chainrun.slurm.client import SlurmClient, SlurmRefused
from chainrun.slurm.parsers import AcctRow, QueueRow
from chainrun.state.records import (
    ACTIVE, CANCELLED_OUT, CHECKPOINT_CRASH, COMPLETED, CONTINUE, CRASH, DONE, HANDOFF, ENDED, FAILED, LIVE_PHASES,
    NO_RUN_FOLDER, PENDING, RUNNING, SUBMITTING, UNSTARTED, Chain, Segment,
)
from chainrun.state.store import Store
from chainrun.chain import placement, progress, spread
from chainrun.state.records import SKIPPED

log = logging.getLogger(__name__)

ADOPT_AFTER_S = 60  # a SUBMITTING segment this old with no job in squeue is looked up in sacct
LOST_AFTER_S = 900  # a job neither squeue nor sacct knows for this long is declared lost
MAX_UNCONFIRMED = 6  # sbatch failed (or never answered) this many times in a row: the chain fails
MAX_CHECKPOINT_CRASHES = 2  # the payload crashed while saving this many times in a row: a broken checkpoint, stop
MAX_UNSTARTED = 6  # this many segments in a row ended waiting for the chain: its last owner cannot be established
MAX_NO_RUN_FOLDER = 2  # this many segments could not see the run folder on their node: it is not on a shared filesystem
_QUEUE_PHASE = {
    "PENDING": PENDING, "CONFIGURING": RUNNING, "RUNNING": RUNNING, "COMPLETING": RUNNING,
    "SUSPENDED": RUNNING, "STOPPED": RUNNING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING, "RESIZING": RUNNING,
}

Predictor = Callable[[Chain, Segment, list[QueueRow]], WaitEstimate | None]


@dataclass
class TickReport:
    chains: int = 0
    submitted: int = 0
    ended: int = 0
    slurm_calls: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    failed: bool = False  # Slurm could not be queried (or answered with nonsense): nothing changed


class Engine:
    def __init__(
        self, store: Store, slurm: SlurmClient, runner: Runner, *, predictor: Predictor | None = None,
        clock: Callable[[], float] = time.time, user: str | None = None,
    ) -> None:
        self.store, self.slurm, self.runner = store, slurm, runner
        self.predictor = predictor
        self.clock = clock
        self.user = user or getpass.getuser()  # whose job names we may adopt
        self._queue: list[QueueRow] = []
        self._reservations: list | None = None  # read at most once a tick, and only when planning
        self._topology = None  # `scontrol show topology`, read once per watcher (it does not change)

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
                self.retry_cancels(stuck)
            except TransientSlurmError as e:
                report.failed = True
                report.warnings.append(f"Slurm did not answer ({e}); trying again next tick")
                log.warning("tick skipped: %s", e)
            except SlurmError as e:  # unreadable output or an error we do not know: Slurm's state, not the chains'
                report.failed = True
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
        self._queue = queue
        self._reservations = None
        # each row goes to the segment it belongs to, by id, name and submit time: a recorded id that now
        # names a later job (ids restart after a controller reset) is not ours, and never the other way round
        recorded: dict[str, list[tuple[Chain, Segment]]] = {}
        for c in chains:
            for s in segs[c.id]:
                if s.job_id and (s.phase in (PENDING, RUNNING) or s.extra.get("settle") is not None):
                    recorded.setdefault(s.job_id, []).append((c, s))
        by_seg, foreign = reconcile.match_rows(queue, recorded)
        for c, s, q in foreign:
            self._note_reuse(c, s, q)
        by_name = {q.name: q for q in queue if not everyone or q.user == self.user}

        # adopt jobs whose submission we did not get to record
        for c in chains:
            for s in segs[c.id]:
                if s.phase == SUBMITTING and (q := by_name.get(job_name(c.id, s.idx))):
                    s.job_id, s.phase = q.job_id, PENDING
                    self.store.save(c, [s], [(s.idx, "adopted", f"found job {q.job_id} for segment {s.idx}")])

        # one sacct for every live job that left squeue, plus old unconfirmed submissions
        now = self.clock()
        gone = [s for c in chains for s in segs[c.id]
                if s.job_id and any(o is s for _, o in recorded.get(s.job_id, ())) and (c.id, s.idx) not in by_seg]
        orphans = [(c, s) for c in chains for s in segs[c.id]
                   if s.phase == SUBMITTING and now - s.intent_at > ADOPT_AFTER_S]
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
                self._fail(c, segs[c.id], f"Slurm refused a request: {e}")
                report.warnings.append(f"{c.id}: {e}")
            # any other SlurmError means Slurm is unwell, not that the chain is wrong: it ends the tick

    def _settle(self, c: Chain, segs: list[Segment], by_seg: dict, acct: dict) -> None:
        """Cancelled segments whose job has ended: their figures from sacct and the wrapper (chain/settle.py)."""
        now = self.clock()
        for s in settle.unsettled(segs):
            row = acct.get((c.id, s.idx))
            if row is None or not outcomes.is_final(row.state):
                if (c.id, s.idx) not in by_seg and now - float(s.extra["settle"]) > settle.GIVE_UP_S:
                    self.store.save(c, [s], [(s.idx, "warning", settle.give_up(s))])
                continue
            trained, text = settle.settle(c, s, row, outcomes.read_outcome_file(self.runner, c, s))
            s.credit_s = trained
            if trained > 0:
                self._read_progress(c, s)
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
            if s.phase not in (PENDING, RUNNING):
                continue
            q = by_seg.get((c.id, s.idx))
            if q is not None:
                self._from_queue(c, segs, s, q)
                if s.phase == RUNNING:
                    placement.record_sharing(s, q, self._queue, now)
                    self._record_switches(s)
                if s.phase == RUNNING and now - (s.extra.get("progress") or {}).get("read_at", 0) >= progress.READ_EVERY_S:
                    self._read_progress(c, s)
                if s.phase == RUNNING:
                    self._note_training_start(c, s, now)
            elif (row := acct.get((c.id, s.idx))) is not None and outcomes.is_final(row.state):
                self._ended(c, segs, s, row)
                report.ended += 1
            elif now - max(s.submit or 0, s.intent_at) > LOST_AFTER_S and (c.id, s.idx) not in acct:
                s.phase, s.outcome, s.reason = ENDED, "crash", "Slurm has no record of this job"
                self.store.save(c, [s], [(s.idx, "lost", f"segment {s.idx} (job {s.job_id}): {s.reason}")])
                self._count_failure(c, segs, s)
            if c.status != ACTIVE:
                return
        outcomes.record_overlaps(segs)
        self._stop_at_total(c, segs, now)
        handoff_plan.refresh(self.runner, c, segs)  # a queued successor's adaptive hand-off rule
        self.store.save(c, segs)
        self._plan(c, segs, report)

    def _stop_at_total(self, c: Chain, segs: list[Segment], now: float) -> None:
        """--total reached while a segment trains: send it the chain's signal now, as Slurm would before
        its limit, so it checkpoints and exits; the chain then completes. A successor is sized for the work
        left when it was asked for, and the segment before it may train until its hand-over point, so the
        last segment's limit is often longer than the work left (by up to the lead the policy chose: hours
        for `predicted`). Without this, a trainer that runs until signalled would train past --total to
        that limit. Once per segment. A segment not training (queued, or started and waiting for the
        hand-off) is no longer needed and is cancelled: signalled, a waiting successor would only end
        unstarted and be replaced. The replay (chainrun/sim/chains.py) ends a chain when its work is done:
        this is what makes that true here, to within one watcher tick."""
        running = [s for s in segs if s.phase == RUNNING and s.job_id]
        if not running or c.total_s - work_done(c, segs, now) > 0:
            return
        for s in running:  # the exact payload start before acting on it (a hand-off wait is not training)
            self._note_training_start(c, s, now, force=True)
        if c.total_s - work_done(c, segs, now) > 0:
            return
        events = []
        training = [s for s in running if not s.extra.get("handoff_waiting")]
        for s in training:
            if s.extra.get("total_stop_at"):
                continue
            try:
                self.slurm.signal(s.job_id, c.signal)
            except SlurmRefused as e:  # it ended meanwhile: the next tick reads its end
                log.info("scancel --signal %s: %s", s.job_id, e)
                continue
            s.extra["total_stop_at"] = now
            events.append((s.idx, "total", f"--total {format_duration(c.total_s)} reached: segment {s.idx} "
                                           f"(job {s.job_id}) was sent {c.signal} to checkpoint and stop"))
        unneeded = [s for s in segs if s.job_id and (s.phase == PENDING or (s.phase == RUNNING and s not in training))]
        if unneeded:
            failed = self.slurm.cancel([s.job_id for s in unneeded])
            for s in unneeded:
                if s.job_id in failed:  # still live: this runs again next tick, and so does its scancel
                    events.append((s.idx, "warning", f"segment {s.idx} (job {s.job_id}) is not needed (--total "
                                                     f"reached) but scancel failed: {failed[s.job_id]}"))
                    continue
                settle.mark_cancelled(c, s, "cancelled by chainrun: not needed, --total reached", now)
                events.append((s.idx, "total", f"segment {s.idx} (job {s.job_id}) cancelled: --total reached"))
        if events:
            self.store.save(c, running + [s for s in unneeded if s not in running], events)

    def _from_queue(self, c: Chain, segs: list[Segment], s: Segment, q: QueueRow) -> None:
        phase = _QUEUE_PHASE.get(q.state, s.phase)
        if phase == PENDING and s.phase == RUNNING:
            self._requeued(c, s, q)
        changed = phase != s.phase or q.state != s.slurm_state
        s.slurm_state, s.submit = q.state, q.submit or s.submit
        if phase == RUNNING:
            s.start, s.end = q.start or s.start, q.end or s.end
            s.extra.pop("pending_reason", None)
            s.extra.pop("expected_start", None)
        if changed and phase == RUNNING and s.phase != RUNNING:
            self.store.add_event(c.id, s.idx, "started", f"segment {s.idx} (job {s.job_id}) started")
        s.phase = phase
        if phase == PENDING:
            self._pending(c, segs, s, q)

    def _requeued(self, c: Chain, s: Segment, q: QueueRow) -> None:
        """A running segment is back in the queue under the same job id: Slurm requeued it (a node
        failure, preemption with PreemptMode=REQUEUE, `scontrol requeue`). It stays the same segment,
        neither a new submission nor a foreign job; what its last run recorded is dropped, so its
        training start, hand-off wait and --total stop are read afresh when it runs again (the
        wrapper's rerun claims the chain through the normal protocol, SLURM_RESTART_COUNT >= 1)."""
        s.extra["requeues"] = int(s.extra.get("requeues") or 0) + 1
        for k in ("payload_start", "handoff_waiting", "state_read_at", "total_stop_at", "granted_s"):
            s.extra.pop(k, None)
        trained = f", after {format_duration(self.clock() - s.start)} running" if s.start else ""
        self.store.add_event(c.id, s.idx, "requeued",
                             f"segment {s.idx} (job {s.job_id}) was requeued by Slurm{trained} ({q.state}, "
                             f"{q.reason or 'no reason given'}); it runs again under the same job id")
        s.start = s.end = None

    def _pending(self, c: Chain, segs: list[Segment], s: Segment, q: QueueRow) -> None:
        """Why it waits, and Slurm's own start estimate: both from the tick's one squeue."""
        why = reasons.explain(q.reason)
        s.extra["pending_reason"] = q.reason
        s.extra["expected_start"] = q.start  # squeue --start's answer; None until the backfill plans it
        what = f"segment {s.idx} (job {s.job_id})"
        if why.hopeless:
            self._fail(c, segs, f"{what} can never start: {why.words} ({why.code})" + (f"; {why.hint}" if why.hint else ""))
        elif why.code in (*reasons.UNAVAILABLE, "JobHeldUser", "JobHeldAdmin") and s.extra.get("warned_reason") != why.code:
            s.extra["warned_reason"] = why.code
            if why.code in reasons.UNAVAILABLE:  # Slurm's catch-all: say which nodes, or which reservation
                why = self._explain_unavailable(c, s, q.reason)
                s.extra["pending_explained"] = {"reason": q.reason, "words": why.words}
            self.store.add_event(c.id, s.idx, "warning", f"{what} is pending: {why.words}"
                                 + (f" ({why.hint})" if why.hint else ""))

    def _explain_unavailable(self, c: Chain, s: Segment, reason: str) -> reasons.Reason:
        """What the nodes and reservations say (two scontrol calls, once per segment and reason)."""
        from chainrun.chain.contract import option_value
        from chainrun.slurm.reservations import expand_nodes

        if self._reservations is None:
            self._reservations = read_reservations(self.slurm)
        try:
            states = self.slurm.node_states(c.partition)
        except SlurmError as e:  # without them, Slurm's own words
            log.info("scontrol show node: %s", e)
            return reasons.explain(reason)
        pinned = set(expand_nodes(option_value(c.sbatch_args, "--nodelist", "-w") or ""))
        return reasons.explain_unavailable(reason, node_states=states, reservations=self._reservations,
                                           now=self.clock(), limit_s=s.time_limit_s, pinned=pinned,
                                           partition=c.partition)

    def _ended(self, c: Chain, segs: list[Segment], s: Segment, row: AcctRow) -> None:
        info = outcomes.read_outcome_file(self.runner, c, s, run_start=row.start if s.extra.get("requeues") else None)
        result = outcomes.classify(c, s, row, info, checkpoint_time=lambda: outcomes.newest_checkpoint(self.runner, c))
        s.phase, s.slurm_state, s.outcome, s.reason = ENDED, row.state, result.outcome, result.reason
        s.submit, s.eligible, s.start, s.end = row.submit, row.eligible, row.start, row.end
        s.exit_code, s.credit_s = row.exit_code, result.credit_s
        s.extra.update({k: v for k, v in info.items() if k in ("handoff_wait", "signaled", "signal_at", "gen")})
        window = outcomes.payload_window(info, row)
        if window:
            s.extra["payload_start"], s.extra["payload_end"] = window
        events = [(s.idx, result.outcome, result.message)]
        if result.outcome in (CONTINUE, HANDOFF):
            c.consecutive_failures = 0  # UNSTARTED and SKIPPED neither spend a retry nor reset the count
        if result.outcome in (CRASH, CHECKPOINT_CRASH) and (tail := outcomes.read_tail(self.runner, c, s)):
            s.extra["log_tail"] = tail[-2000:]
            events.append((s.idx, "warning", f"last lines of job {s.job_id}:\n{tail}"))
        events += self._check_overlaps(c, segs, s)
        if result.outcome == NO_RUN_FOLDER:
            events += self._exclude_blind_node(c, segs, s, row)
        elif result.outcome not in (UNSTARTED, SKIPPED):  # the pace it trained at, then what it says about its nodes
            self._read_progress(c, s)
        # --total is work at the reference shape: this segment's training times its shape's rate
        s.extra["rate"] = segment_rate(c, s, segs, final=True)
        s.extra["work_s"] = result.credit_s * s.extra["rate"]
        c.credited_s += s.extra["work_s"]
        if result.outcome not in (UNSTARTED, SKIPPED):
            events += placement.after_segment(c, segs, s)
            events += placement.interference(c, s, lambda: self._exclusive_cost(c, s))
            events += spread.after_segment(c, segs, s)
            if any(kind == "adapt" for _, kind, _ in events):
                events += self._update_queued(c, segs)
        self.store.save(c, [s], events)
        if result.outcome == DONE:
            self._finish(c, segs, COMPLETED, f"training finished in segment {s.idx}")
        elif result.outcome == CRASH:
            self._count_failure(c, segs, s)
        elif result.outcome == CHECKPOINT_CRASH and _streak(segs, CHECKPOINT_CRASH) >= MAX_CHECKPOINT_CRASHES:
            self._fail(c, segs, f"the payload crashed while checkpointing {MAX_CHECKPOINT_CRASHES} times in a row "
                                f"(last: segment {s.idx}, job {s.job_id}); fix the checkpoint code and resubmit")
        elif result.outcome == UNSTARTED and _streak(segs, UNSTARTED) >= MAX_UNSTARTED:
            self._fail(c, segs, f"{MAX_UNSTARTED} segments in a row could not take the chain over from its last owner; "
                                f"see {c.run_dir}/control")
        elif result.outcome == CANCELLED_OUT and result.external:
            self._fail(c, segs, result.reason)
        elif result.outcome == NO_RUN_FOLDER and sum(o.outcome == NO_RUN_FOLDER for o in segs) >= MAX_NO_RUN_FOLDER:
            blind = sorted({o.extra.get("blind_node") or "?" for o in segs if o.outcome == NO_RUN_FOLDER})
            self._fail(c, segs, f"{MAX_NO_RUN_FOLDER} segments could not see the run folder {c.run_dir} "
                                f"(node(s) {', '.join(blind)}): put it on a shared filesystem that every compute "
                                "node mounts and submit again (`chainrun cluster test --probe` checks one)")

    def _exclude_blind_node(self, c: Chain, segs: list[Segment], s: Segment, row: AcctRow) -> list[tuple[int, str, str]]:
        """A node that does not see the run folder gets no further segment of the chain: excluded like a
        straggler (placement.py; `chainrun unexclude` pardons it), a queued successor updated in place.
        Not subject to --no-adapt: a segment there cannot train at all."""
        node = outcomes.ran_on(row)
        if not node:
            return []
        s.extra["blind_node"] = node
        why = f"the run folder {c.run_dir} is not visible there"
        if not placement.exclude(c, node, why, s.idx, s.end):
            return []
        events = [(s.idx, "adapt", f"excluding node {node} from the next segments: {why} "
                                   f"(`chainrun unexclude {c.id} {node}` to pardon it)")]
        return events + self._update_queued(c, segs)

    def _check_overlaps(self, c: Chain, segs: list[Segment], s: Segment) -> list[tuple[int, str, str]]:
        """The promise checked, not assumed: did two payloads of this chain ever train at once?"""
        windows: dict[str, tuple[float, float | None]] = {}
        for o in segs:
            if o.job_id and o.extra.get("payload_start") is not None and (o is s or o.phase == ENDED):
                windows[o.job_id] = (float(o.extra["payload_start"]), o.extra.get("payload_end"))
            elif o is not s and o.phase == RUNNING and o.job_id:  # still training: its start is in its state file
                again = o.start if o.extra.get("requeues") else None  # only this run's record
                w = outcomes.payload_window(outcomes.read_outcome_file(self.runner, c, o, run_start=again), None)
                if w:
                    windows[o.job_id] = (w[0], None)
        found = [(a, b, secs) for a, b, secs in outcomes.payload_overlaps(windows, self.clock()) if s.job_id in (a, b)]
        events = []
        for a, b, secs in found:
            pair = sorted((a, b))
            known = s.extra.setdefault("payload_overlaps", [])
            if any(sorted(k["jobs"]) == pair for k in known):
                continue
            known.append({"jobs": pair, "seconds": secs})
            msg = (f"ERROR: two copies of chain {c.id} trained at the same time: jobs {pair[0]} and {pair[1]} "
                   f"for {secs:.0f}s (both wrote to {c.checkpoint_dir}); please report this")
            log.error(msg)
            events.append((s.idx, "error", msg))
        return events

    def _read_progress(self, c: Chain, s: Segment) -> None:
        """The segment's progress files (chain/progress.py): one file read, never a Slurm call."""
        base = f"{c.run_dir}/control/seg-{s.idx}.progress"
        try:
            res = self.runner.run(progress.read_argv(base), 30)
        except Exception as e:  # an unreachable cluster must not stop the tick: progress is optional
            log.info("progress of %s segment %s not read: %s", c.id, s.idx, e)
            return
        ranks = progress.parse_read_output(res.stdout if res.ok else "", base)
        old = s.extra.get("progress") or {}
        if ranks or not old.get("ranks"):
            s.extra["progress"] = progress.segment_progress(ranks, read_at=self.clock(),
                                                            shared=placement.sharing_windows(s))
        else:
            old["read_at"] = self.clock()

    def _update_queued(self, c: Chain, segs: list[Segment]) -> list[tuple[int, str, str]]:
        """A request change reaches a successor already queued (submitted early): `scontrol update`."""
        events = []
        for o in segs:
            if o.phase != PENDING or not o.job_id or not (fields := placement.queued_update(c, o)):
                continue
            try:
                self.slurm.update_pending(o.job_id, fields)
            except SlurmError as e:  # it may have just started, or the site may refuse: the next one asks anew
                events.append((o.idx, "placement", f"queued segment {o.idx} (job {o.job_id}) keeps its request: {e}"))
                continue
            events.append((o.idx, "adapt", placement.note_queued_update(o, fields)))
            self.store.save(c, [o])
        return events

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

    def _exclusive_cost(self, c: Chain, s: Segment) -> float | None:
        """How much longer the next segment would wait with --exclusive: two `sbatch --test-only` (no job
        is created), made only when a segment's pace suffered from a neighbour."""
        from chainrun.chain.request import segment_args
        from chainrun.chain.segments import wrapper_path

        probe = Segment(chain_id=c.id, idx=s.idx + 1, time_limit_s=c.segment_s,
                        extra={"nodes": s.extra["nodes"]} if s.extra.get("nodes") else {})  # elastic: its shape
        args = segment_args(c, probe)
        try:
            plain = self.slurm.test_only(wrapper_path(c), args, script_args=[str(probe.idx)])
            excl = self.slurm.test_only(wrapper_path(c), args + ["--exclusive"], script_args=[str(probe.idx)])
        except SlurmError as e:
            log.info("sbatch --test-only for chain %s: %s", c.id, e)
            return None
        return None if plain is None or excl is None else max(0.0, excl - plain)

    def _count_failure(self, c: Chain, segs: list[Segment], s: Segment) -> None:
        c.consecutive_failures += 1
        if c.consecutive_failures > c.retries:
            self._fail(c, segs, f"segment {s.idx} failed ({s.reason}); no retries left")
        else:
            left = c.retries - c.consecutive_failures
            self.store.save(c, [], [(s.idx, "retry", f"segment {s.idx} failed ({s.reason}); retrying ({left} retries left after this)")])

    # ------------------------------------------------------------------ planning
    def _plan(self, c: Chain, segs: list[Segment], report: TickReport) -> None:
        """The gate, the sizes and the slack come from chain/sizing.py, which the replay calls too."""
        now = self.clock()
        live = [s for s in segs if s.phase in LIVE_PHASES]
        # --total counts training: a live segment is expected to train its limit less the signal lead
        overhead = segment_overhead(c, segs)
        expected = sum(sizing.expected_work(expected_training(c, s, overhead), rate=segment_rate(c, s, segs))
                       for s in live)
        remaining = sizing.work_after(c.total_s, c.credited_s, expected)
        gate = dict(live=len(live), work_after_s=remaining, tolerance_s=total_tolerance(c),
                    unconfirmed=any(s.phase == SUBMITTING for s in live),  # wait for adoption first
                    stopping=any(s.extra.get("total_stop_at") for s in live))  # told to stop (_stop_at_total)
        step = sizing.plan_gate(**gate)
        if step == sizing.FIRST and self._done_marker(c):  # the payload said done: nothing more to run
            step = sizing.plan_gate(**gate, done_marker=True)
        if step == sizing.FINISH:
            self._finish(c, segs, COMPLETED, "total time reached" if not live and remaining < gate["tolerance_s"]
                         else "training finished (the payload's done marker exists)")
            return
        if step == sizing.FIRST:
            # the last prediction made while the predecessor ran stays beside the actual wait
            last = segs[-1].extra.get("last_prediction") if segs else None
            est = WaitEstimate(seconds=last["wait_s"], model=last["model"]) if last else None
            self._submit_next(c, segs, remaining, dependency="", note="", estimate=est)
            report.submitted += 1
            return
        if step != sizing.ASK:
            return
        cur = live[0]
        if cur.extra.get("filler"):  # docs/elastic.md, "Filler": the reference is asked for the moment it runs
            if cur.phase == RUNNING and self._submit_after_filler(c, segs, cur, now):
                report.submitted += 1
            return  # a queued filler: no policy may pre-queue behind it (a dependency would wait for its end)
        policy = get_policy(c.policy)
        handover = (cur.end - c.signal_lead_s) if (cur.phase == RUNNING and cur.end) else None
        predict = (lambda: self.predictor(c, cur, self._queue)) if self.predictor else None
        # the share of the chain's slack this boundary may spend (the `slack` rule): remaining is the work
        # left once cur trains to its hand-over point, a later full segment trains segment_s - overhead
        allowance = sizing.slack_allowance(remaining, segment_s=c.segment_s, overhead_s=overhead,
                                           handoff_s=handoff_plan.measured_handoff_s(c, segs))
        view = PolicyView(now=now, chain=c, current=cur, handover_at=handover, predict_wait=predict,
                          cut_allowance_s=allowance)
        decision = policy.decide(view)
        if decision.estimate is not None:
            cur.extra["last_prediction"] = {"at": now, "wait_s": decision.estimate.seconds, "model": decision.estimate.model}
            self.store.save(c, [cur])
        if decision.submit and (left := self._left_if_cut(c, segs, cur, now)) is not None:
            self._submit_next(c, segs, left, dependency=decision.dependency, note=decision.reason,
                              estimate=decision.estimate, prob_in_time=decision.prob_in_time)
            report.submitted += 1

    def _left_if_cut(self, c: Chain, segs: list[Segment], cur: Segment, now: float) -> float | None:
        """The size of an early successor of ``cur`` (the one live segment): it carries the work left as
        if ``cur`` stopped now, since if it starts early it cuts ``cur`` (sized for the hand-over point,
        early successors spiral). None when nothing may be submitted (sizing.may_submit): the work is
        reached, or the payload's done marker exists (a segment that finished the chain a moment ago
        still shows as running)."""
        self._note_training_start(c, cur, now, force=True)
        left = sizing.left_if_cut(c.total_s, c.credited_s, trained_so_far(cur, now), rate=segment_rate(c, cur, segs))
        tolerance = total_tolerance(c)
        if not sizing.may_submit(left_if_cut_s=left, tolerance_s=tolerance):
            return None
        return left if sizing.may_submit(left_if_cut_s=left, tolerance_s=tolerance,
                                         done_marker=self._done_marker(c)) else None

    def _done_marker(self, c: Chain) -> bool:
        """Whether the payload said training is finished (CHAINRUN_DONE_FILE, in the checkpoint folder):
        one file test, made only before a submission. Unreadable: not known to be done (the wrapper
        checks the marker itself before it trains)."""
        try:
            return self.runner.run(["test", "-e", done_file(c)], 30).ok
        except Exception as e:
            log.info("done marker of %s not read: %s", c.id, e)
            return False

    def _submit_after_filler(self, c: Chain, segs: list[Segment], cur: Segment, now: float) -> bool:
        """A filler runs: ask for the reference shape at once, whatever the policy's timing, sized as an
        early successor (the work left as if the filler stopped now). When it starts, the hand-off stops
        the filler (no adaptive wait: handoff_plan writes no rule for a filler's successor); if the
        filler reaches its own end first, the chain simply goes on with it. False if nothing may be
        submitted (``_left_if_cut``)."""
        left = self._left_if_cut(c, segs, cur, now)
        if left is None:
            return False
        ref = chain_shapes(c)[0]
        why = (f"{ref} nodes (reference), asked as soon as the filler (segment {cur.idx}, {cur.extra.get('nodes')} "
               "nodes) runs: it takes over when it starts")
        self._submit_next(c, segs, left, dependency="", estimate=None, choice=ShapeChoice(ref, why, ()),
                          note=f"filler segment {cur.idx} is running: the reference shape is asked for now")
        return True

    def _submit_next(self, c: Chain, segs: list[Segment], remaining: float, *, dependency: str, note: str,
                     estimate: WaitEstimate | None, choice: ShapeChoice | None = None,
                     prob_in_time: float | None = None) -> None:
        if reconcile.unconfirmed_run(segs) >= MAX_UNCONFIRMED:
            raise SlurmRefused(f"sbatch failed or did not answer {MAX_UNCONFIRMED} times in a row for chain {c.id}")
        idx = (max(s.idx for s in segs) + 1) if segs else 0
        if choice is None:
            choice = self._choose_shape(c, segs, remaining, idx)  # None unless the chain has --shapes
        rate = chain_shape_rate(c, segs, choice.nodes) if choice else 1.0
        # the training this segment needs at its shape's rate, plus the signal lead, as Slurm grants it
        limit = sizing.segment_limit(remaining, segment_s=c.segment_s, signal_lead_s=c.signal_lead_s, rate=rate)
        prev_failed = bool(segs) and segs[-1].outcome == "crash"
        seg = Segment(chain_id=c.id, idx=idx, time_limit_s=limit, dependency=dependency, is_retry=prev_failed,
                      predicted_wait_s=estimate.seconds if estimate else None,
                      predicted_model=estimate.model if estimate else "")
        if prob_in_time is not None:  # what the policy acted on, scored by `model status` (predict/service.py)
            seg.extra["prob_in_time"] = round(prob_in_time, 4)
        shape_event = self._apply_shape(c, segs, seg, choice)
        if c.extra.get("time_min_s"):  # --time-min: Slurm may start it sooner with a shorter limit
            seg.extra["time_min_s"] = min(int(c.extra["time_min_s"]), limit)
        self._fit_maintenance(c, seg)
        if seg.extra.get("plan_note"):
            note = f"{note}; {seg.extra['plan_note']}" if note else seg.extra["plan_note"]
        handoff_plan.write_rule(self.runner, c, segs, seg)  # before sbatch: a successor may start at once
        submit_segment(self.store, self.slurm, c, seg, note=note)
        segs.append(seg)
        if shape_event:
            self.store.add_event(c.id, idx, "shape", shape_event)

    # ------------------------------------------------------------------ elastic shapes (docs/elastic.md)
    def plan_first_shape(self, c: Chain, seg: Segment) -> str:
        """Segment 0's node count, asked by `chainrun submit` (nothing is live yet): the reference shape,
        or another, by the same rules as any segment planned while nothing is live (_choose_shape).
        Recorded in ``seg``; returns the event text when it is not the reference ("" otherwise)."""
        return self._apply_shape(c, [], seg, self._choose_shape(c, [], c.total_s, seg.idx))

    def _choose_shape(self, c: Chain, segs: list[Segment], remaining: float, idx: int) -> ShapeChoice | None:
        """The next segment's node count: the shape that finishes the remaining work first (chain/shapes.py);
        with no live segment, a filler if the reference keeps that shape and would only queue meanwhile.
        Asked only here, when a segment is planned: the model once, and one `sbatch --test-only` per shape."""
        shapes = chain_shapes(c)
        if not shapes:
            return None
        ref = shapes[0]
        if len(shapes) == 1:
            return ShapeChoice(ref, f"{ref} nodes: the only shape", ())
        if c.extra.get("no_adapt"):
            return ShapeChoice(ref, f"{ref} nodes: the reference shape (--no-adapt)", ())
        waits, sources = self._shape_waits(c, segs, shapes, idx)
        if waits and ref not in waits:
            # no start for the reference (no model, and test-only refused it: Slurm 22.05 says "Requested node
            # configuration is not available" for a request a future reservation cuts into, though it starts
            # with --time-min): nothing says it waits, so the chain keeps it rather than leave it blind
            return ShapeChoice(ref, f"{ref} nodes (reference): no start estimate for it, kept", ())
        overhead = segment_overhead(c, segs)
        choice = choose_shape(remaining, shapes, waits, segment_s=max(60.0, c.segment_s - overhead),
                              boundary_s=overhead, measured=measured_pace(c, segs),
                              efficiency=chain_efficiency(c), sources=sources)
        if choice.nodes != ref or any(s.phase in LIVE_PHASES for s in segs):
            return choice  # a filler only when nothing is live: it would cut a running segment
        filler = choose_filler(shapes, waits, boundary_s=overhead, measured=measured_pace(c, segs),
                               efficiency=chain_efficiency(c), sources=sources, margin=c.extra.get("filler_margin"))
        return filler or choice

    def _shape_waits(self, c: Chain, segs: list[Segment], shapes: tuple[int, ...],
                     idx: int) -> tuple[dict[int, float], dict[int, str]]:
        """Predicted wait (s) per node count: the queue model's median and Slurm's own `sbatch --test-only`
        start; with both, the later (test-only knows the running jobs' limits and the reservations, the
        model knows how the queue usually moves)."""
        from chainrun.chain.request import segment_args
        from chainrun.chain.segments import wrapper_path

        now = self.clock()
        waits: dict[int, float] = {}
        sources: dict[int, str] = {}
        model = getattr(self.predictor, "shape_waits", None)
        if model is not None:
            probe = next((s for s in reversed(segs) if s.job_id), Segment(chain_id=c.id, idx=idx))
            try:
                for n, w in (model(c, probe, self._queue, list(shapes)) or {}).items():
                    waits[int(n)], sources[int(n)] = max(0.0, float(w)), "model"
            except Exception as e:  # a broken model must not stop planning: test-only (or the reference) decides
                log.warning("queue-delay model for the shape choice of %s: %s", c.id, e)
        # asked as the segment will be: with --time-min Slurm may start it sooner with a shorter limit
        tmin = {"time_min_s": min(int(c.extra["time_min_s"]), c.segment_s)} if c.extra.get("time_min_s") else {}
        for n in shapes:
            probe = Segment(chain_id=c.id, idx=idx, time_limit_s=c.segment_s, extra={"nodes": n, **tmin})
            try:
                start = self.slurm.test_only(wrapper_path(c), segment_args(c, probe), script_args=[str(idx)])
            except SlurmError as e:
                log.info("sbatch --test-only (%s nodes) for chain %s: %s", n, c.id, e)
                continue
            if start is None:
                continue
            w = max(0.0, start - now)
            if n in waits:
                waits[n], sources[n] = max(waits[n], w), "model+test-only"
            else:
                waits[n], sources[n] = w, "test-only"
        return waits, sources

    def _apply_shape(self, c: Chain, segs: list[Segment], seg: Segment, choice: ShapeChoice | None) -> str:
        """Record the choice in the segment; the event text when the shape changes ("" otherwise)."""
        if choice is None:
            return ""
        seg.extra["nodes"] = choice.nodes
        seg.extra["shape"] = choice.as_dict()
        if choice.filler:  # the watcher asks for the reference shape as soon as it runs (_plan)
            seg.extra["filler"] = True
        prev = next((int(s.extra["nodes"]) for s in sorted(segs, key=lambda s: s.idx, reverse=True)
                     if s.extra.get("nodes")), chain_shapes(c)[0])
        if choice.nodes == prev:
            return ""
        return f"segment {seg.idx} asks for {choice.nodes} nodes instead of {prev}: {choice.reason}"

    def _note_training_start(self, c: Chain, s: Segment, now: float, *, force: bool = False) -> None:
        """A running segment's payload start (its state file: a taken-over segment first waits for the
        hand-off, which is not training) and the limit Slurm really granted (--time-min may shorten it).
        One file read, until the start is known; at most every 30 s unless planning needs it now."""
        if s.start and s.end and s.end - s.start < s.time_limit_s - 1:
            s.extra["granted_s"] = s.end - s.start
        if s.extra.get("payload_start") is not None or (not force and now - s.extra.get("state_read_at", 0) < 30):
            return
        s.extra["state_read_at"] = now
        try:
            res = self.runner.run(["cat", control_path(c.run_dir, s.idx, "state")], 30)
        except Exception as e:  # optional: without it training counts from the job's start
            log.info("state of %s segment %s not read: %s", c.id, s.idx, e)
            return
        info = parse_outcome(res.stdout) if res.ok else {}
        if info.get("job") and s.job_id and info["job"] != s.job_id:
            return
        if s.extra.get("requeues") and s.start and outcomes.earlier_run(info, s.start):
            return  # the state the run before the requeue left: this run has not written its own yet
        if info.get("payload_start"):
            s.extra["payload_start"] = float(info["payload_start"])
            s.extra.pop("handoff_waiting", None)
        elif info.get("phase") == "waiting":
            s.extra["handoff_waiting"] = True

    def _fit_maintenance(self, c: Chain, seg: Segment) -> None:
        if self._reservations is None:  # one scontrol a tick at most, and only when planning
            self._reservations = read_reservations(self.slurm)
        fit_maintenance(c, seg, self._reservations, self.clock())

    # ------------------------------------------------------------------ endings
    def _finish(self, c: Chain, segs: list[Segment], status: str, reason: str) -> None:
        events = cancel_live(self.slurm, c, segs, "cancelled by chainrun: chain finished")
        c.status, c.reason, c.finished = status, reason, self.clock()
        self.store.save(c, segs, [(None, status.lower(), f"chain {c.id} {status.lower()}: {reason}"), *events])

    def _fail(self, c: Chain, segs: list[Segment], reason: str) -> None:
        self._finish(c, segs, FAILED, reason)

    def retry_cancels(self, chains: list[Chain]) -> None:
        """Jobs of finished chains that a scancel could not stop (cancel_live): asked again every tick
        until Slurm takes it, so a finished chain never leaves a job queued or training."""
        for c in chains:
            segs = self.store.segments(c.id)
            events = cancel_live(self.slurm, c, segs, c.extra.get("cancel_reason") or "cancelled by chainrun")
            self.store.save(c, segs, events)


def cancel_live(slurm: SlurmClient, c: Chain, segs: list[Segment], reason: str) -> list[tuple[int, str, str]]:
    """scancel a chain's live segments; a segment is recorded cancelled only once Slurm took the scancel
    (SlurmClient.cancel retries). One it did not stays live with the error, and the chain is marked
    ``cancel_pending`` for the watcher to ask again (Engine.retry_cancels). Returns warning events."""
    live = [s for s in segs if s.phase in LIVE_PHASES]
    failed = slurm.cancel([s.job_id for s in live if s.job_id]) if live else {}
    events = []
    for s in live:
        if s.job_id in failed:
            if s.extra.get("cancel_failed") != failed[s.job_id]:
                events.append((s.idx, "warning", f"segment {s.idx} (job {s.job_id}) could not be cancelled: "
                                                 f"{failed[s.job_id]}; trying again every watcher tick"))
            s.extra["cancel_failed"] = failed[s.job_id]
            continue
        s.extra.pop("cancel_failed", None)
        settle.mark_cancelled(c, s, reason, time.time())
    if failed:
        c.extra["cancel_pending"], c.extra["cancel_reason"] = True, reason
    else:
        c.extra.pop("cancel_pending", None)
        c.extra.pop("cancel_reason", None)
    return events


def cancel_chain(store: Store, slurm: SlurmClient, c: Chain, *, reason: str = "cancelled by the user") -> list[str]:
    """Cancel a chain's queued and running segments; returns the job ids cancelled. Jobs Slurm would not
    cancel stay live (the watcher asks again) and raise SlurmError once the rest is recorded."""
    from chainrun.state.records import CANCELLED

    segs = store.segments(c.id)
    ids = [s.job_id for s in segs if s.phase in LIVE_PHASES and s.job_id]
    events = cancel_live(slurm, c, segs, reason)
    stuck = [s for s in segs if s.phase in LIVE_PHASES and s.extra.get("cancel_failed")]
    done = [j for j in ids if j not in {s.job_id for s in stuck}]
    c.status, c.reason, c.finished = CANCELLED, reason, time.time()
    store.save(c, segs, [(None, "cancelled", f"chain {c.id} cancelled ({len(done)} job(s) cancelled)"), *events])
    if stuck:
        raise SlurmError(f"chain {c.id} cancelled, but Slurm did not cancel job(s) "
                         f"{', '.join(s.job_id for s in stuck)}: {stuck[0].extra['cancel_failed']}",
                         hint="the watcher asks again every tick; or run `scancel` on them yourself")
    return done


def _streak(segs: list[Segment], outcome: str) -> int:
    """How many of the chain's last ended segments had this outcome, in a row."""
    n = 0
    for s in sorted((s for s in segs if s.phase == ENDED and s.outcome != CANCELLED_OUT), key=lambda s: s.idx,
                    reverse=True):
        if s.outcome != outcome:
            break
        n += 1
    return n


__all__ = ["Engine", "TickReport", "cancel_chain", "parse_job_name"]
