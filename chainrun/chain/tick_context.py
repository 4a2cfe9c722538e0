"""What one watcher tick works with, and the few acts every part of a tick may take.

The seams (store, Slurm client, runner, clock), the tick's one ``squeue`` (``queue``), the reads
made at most once a tick, the reads of a segment's run-folder files, and finishing a chain. The
Engine (chain/engine.py) is one; the parts of a tick it calls (queue_row.py, segment_end.py,
total_stop.py, planning.py, shape_plan.py) take it as ``t``.
"""

from __future__ import annotations

import getpass
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from chainrun.chain import outcomes, placement, progress
from chainrun.chain.cancel import cancel_live
from chainrun.chain.contract import control_path, done_file, parse_outcome
from chainrun.chain.maintenance import read_reservations
from chainrun.chain.policies import WaitEstimate
from chainrun.errors import SlurmError
from chainrun.runner.base import Runner
from chainrun.slurm.client import SlurmClient
from chainrun.slurm.parsers import QueueRow
from chainrun.state.records import FAILED, PENDING, Chain, Segment
from chainrun.state.store import Store

log = logging.getLogger(__name__)

Predictor = Callable[[Chain, Segment, list[QueueRow]], WaitEstimate | None]


@dataclass
class TickReport:
    chains: int = 0
    submitted: int = 0
    ended: int = 0
    slurm_calls: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    failed: bool = False  # Slurm could not be queried (or answered with nonsense): nothing changed
    cause: Exception | None = None  # why it failed (a ChainrunError): `watch --once` exits with its code


class TickContext:
    def __init__(
        self, store: Store, slurm: SlurmClient, runner: Runner, *, predictor: Predictor | None = None,
        clock: Callable[[], float] = time.time, user: str | None = None,
    ) -> None:
        self.store, self.slurm, self.runner = store, slurm, runner
        self.predictor = predictor
        self.clock = clock
        self.user = user or getpass.getuser()  # whose job names we may adopt
        self.queue: list[QueueRow] = []
        self._reservations: list | None = None  # read at most once a tick, and only when planning
        self._topology = None  # `scontrol show topology`, read once per watcher (it does not change)
        self.sites = None  # the other clusters of chains spanning several (chain/site_plan.SiteAccess)


    def reservations(self) -> list:
        """Slurm's reservations (`scontrol show reservation`): read at most once a tick, and only when
        planning or explaining a pending reason needs them."""
        if self._reservations is None:
            self._reservations = read_reservations(self.slurm)
        return self._reservations


    def note_training_start(self, c: Chain, s: Segment, now: float, *, force: bool = False) -> None:
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


    def read_progress(self, c: Chain, s: Segment) -> None:
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
            sps = s.extra["progress"].get("steps_per_s")
            if sps and sps > 0:  # wall seconds per step, newest measured: what a move weighs redone steps by
                c.extra["step_s"] = 1.0 / sps  # (chain/move_steps.py resume_from)
        else:
            old["read_at"] = self.clock()


    def done_marker(self, c: Chain) -> bool:
        """Whether the payload said training is finished (CHAINRUN_DONE_FILE, in the checkpoint folder):
        one file test, made only before a submission. Unreadable: not known to be done (the wrapper
        checks the marker itself before it trains)."""
        try:
            return self.runner.run(["test", "-e", done_file(c)], 30).ok
        except Exception as e:
            log.info("done marker of %s not read: %s", c.id, e)
            return False


    def finish(self, c: Chain, segs: list[Segment], status: str, reason: str) -> None:
        events = cancel_live(self.slurm, c, segs, "cancelled by chainrun: chain finished")
        c.status, c.reason, c.finished = status, reason, self.clock()
        self.store.save(c, segs, [(None, status.lower(), f"chain {c.id} {status.lower()}: {reason}"), *events])


    def fail(self, c: Chain, segs: list[Segment], reason: str) -> None:
        self.finish(c, segs, FAILED, reason)


    def update_queued(self, c: Chain, segs: list[Segment]) -> list[tuple[int, str, str]]:
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


__all__ = ["TickContext", "TickReport", "Predictor"]
