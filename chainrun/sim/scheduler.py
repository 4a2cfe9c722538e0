"""A discrete-event model of one Slurm partition of whole nodes: priority by age, EASY backfill.

Why this shape:
- Event-driven: time jumps to the next submission or job end; a scheduling pass runs once per
  distinct event time (Slurm's main loop plus backfill, collapsed into one pass).
- Priority is age (earlier eligible first). ``size_weight_s`` optionally adds Slurm's multifactor
  job-size term, expressed in seconds of age (PriorityWeightJobSize / PriorityWeightAge *
  PriorityMaxAge * nodes / cluster nodes) so the order stays static and a sorted list suffices.
  ``fairshare`` (fairshare.py) adds fair share from the trace's users and caps age at
  PriorityMaxAge: the pending list is then re-keyed every PriorityCalcPeriod, as Slurm recomputes.
- EASY backfill: the first job that does not fit gets a reservation at the earliest time enough
  nodes free up (using running jobs' *time limits*, which is all Slurm knows); later jobs, up to
  ``bf_depth`` of them (Slurm's bf_max_job_test), start now if they fit and either end (by their
  limit) before that reservation or use only nodes the reservation does not need.
- Jobs run for their recorded duration, cut at their limit.
- ``fork()`` copies the state cheaply, so one replay can branch into one future per policy.

Jobs are tuples ``(submit, jid, nodes, limit_s, runtime_s, dep)``; ``dep`` is the jid of a job
this one waits for (-1 for none): it becomes eligible (and starts ageing) when that job ends.
"""

from __future__ import annotations

import heapq
from bisect import insort
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from chainrun.sim.fairshare import FairShare

Job = tuple  # (submit, jid, nodes, limit_s, runtime_s, dep)

_NOT_SUBMITTED, _WAITING, _RUNNING, _DONE = 0, 1, 2, 3


class Scheduler:
    def __init__(
        self,
        nodes: int,
        arrivals: Sequence[Job],
        *,
        open_at: float = float("-inf"),
        bf_depth: int = 1000,
        size_weight_s: float = 0.0,
        n_ids: int | None = None,
        record_starts: bool = False,
        fairshare: "FairShare | None" = None,
    ) -> None:
        self.total = int(nodes)
        self.free = int(nodes)
        self.arrivals = arrivals  # sorted by submit; shared (read-only) between forks
        self.ai = 0
        self.now = arrivals[0][0] if arrivals else 0.0
        self.open_at = open_at  # the partition starts no job before this (LS6 entered service late)
        self.bf_depth = bf_depth
        self.size_weight_s = size_weight_s if fairshare is None else 0.0  # fair share has its own size term
        if fairshare is not None:
            from chainrun.sim.fairshare import Usage

            self.usage: "Usage | None" = Usage(fairshare)
        else:
            self.usage = None
        self.pending: list = []  # sorted (key, seq, jid, nodes, limit, runtime, eligible)
        self.running: list = []  # heap (end, jid, nodes)
        self.limits: list = []  # sorted (start + limit, jid, nodes, start): what the backfill planner sees
        self.held: dict[int, list] = {}  # dep jid -> jobs waiting for it
        n = n_ids if n_ids is not None else len(arrivals)
        self.status = bytearray(n)  # by jid, for trace jobs (jid < n)
        self.starts: list[float] | None = [float("nan")] * n if record_starts else None
        self.watched: dict[int, float] = {}  # injected jid -> start time (nan until it starts)
        self.seq = 0

    # ---- state copies -------------------------------------------------------------------
    def fork(self) -> "Scheduler":
        f = Scheduler.__new__(Scheduler)
        f.__dict__.update(self.__dict__)
        f.pending = list(self.pending)  # entries are immutable tuples
        f.running = list(self.running)
        f.limits = list(self.limits)
        f.held = {k: list(v) for k, v in self.held.items()}
        f.status = bytearray(self.status)
        f.starts = None  # forks only watch injected jobs
        f.watched = dict(self.watched)
        if self.usage is not None:
            f.usage = self.usage.copy()
        return f

    # ---- inputs -------------------------------------------------------------------------
    def submit(self, jid: int, nodes: int, limit_s: float, runtime_s: float, *, eligible: float | None = None) -> None:
        """Inject a job now (chain segments); it is watched: its start time is recorded."""
        self.watched[jid] = float("nan")
        self._enqueue(jid, nodes, limit_s, runtime_s, self.now if eligible is None else eligible)
        if self.now >= self.open_at:
            self._schedule()  # sbatch wakes the scheduler: a job that fits starts at once

    def submit_after(self, jid: int, dep: int, nodes: int, limit_s: float, runtime_s: float) -> None:
        """Inject a job held by ``afterany:dep`` (an injected job): eligible, and ageing, only
        once ``dep`` has ended. If ``dep`` has ended already it is eligible now."""
        self.watched[jid] = float("nan")
        if any(e[1] == dep for e in self.running) or any(p[2] == dep for p in self.pending) \
                or any(j[1] == dep for js in self.held.values() for j in js):
            self.held.setdefault(dep, []).append((self.now, jid, nodes, limit_s, runtime_s, dep))
        else:
            self.submit(jid, nodes, limit_s, runtime_s)

    def cut(self, jid: int, at: float) -> None:
        """A running job ends at ``at`` instead (a hand-off: its payload checkpoints and exits)."""
        for i, (end, j, nodes) in enumerate(self.running):
            if j == jid:
                if at < end:
                    self.running[i] = (max(at, self.now), j, nodes)
                    heapq.heapify(self.running)
                return

    def _enqueue(self, jid, nodes, limit, runtime, eligible) -> None:
        self.seq += 1
        if self.usage is None:
            key = eligible - self.size_weight_s * nodes / self.total
        else:
            if self.now >= self.usage.next_calc:
                self._recalc()
            key = eligible - self.usage.bonus_s(jid, nodes, self.total)
        insort(self.pending, (key, self.seq, jid, nodes, limit, runtime, eligible))
        if 0 <= jid < len(self.status):
            self.status[jid] = _WAITING

    # ---- the event loop -----------------------------------------------------------------
    def next_event(self) -> float:
        t = self.arrivals[self.ai][0] if self.ai < len(self.arrivals) else float("inf")
        if self.running and self.running[0][0] < t:
            t = self.running[0][0]
        if self.now < self.open_at < t:
            t = self.open_at
        return t

    def run_until(self, t_stop: float) -> None:
        """Process every event at times <= t_stop, then set the clock to t_stop."""
        while True:
            t = self.next_event()
            if t > t_stop or t == float("inf"):
                break
            self._step(t)
        if t_stop > self.now and t_stop != float("inf"):
            self.now = t_stop

    def run_until_started(self, jid: int, horizon: float) -> float:
        """Run until watched job ``jid`` starts (or the clock passes ``horizon``); its start or nan."""
        while self.watched[jid] != self.watched[jid]:  # nan: not started yet
            t = self.next_event()
            if t > horizon or t == float("inf"):
                break
            self._step(t)
        return self.watched[jid]

    def _step(self, t: float) -> None:
        self.now = t
        run = self.running
        while run and run[0][0] <= t:
            _, jid, nodes = heapq.heappop(run)
            self.free += nodes
            self._drop_limit(jid)
            if self.usage is not None:
                self.usage.ended(jid, t)
            if 0 <= jid < len(self.status):
                self.status[jid] = _DONE
            for job in self.held.pop(jid, ()):
                self._enqueue(job[1], job[2], job[3], job[4], t)
        arr = self.arrivals
        while self.ai < len(arr) and arr[self.ai][0] <= t:
            job = arr[self.ai]
            self.ai += 1
            dep = job[5]
            if dep >= 0 and self.status[dep] != _DONE:
                self.held.setdefault(dep, []).append(job)
                self.status[job[1]] = _WAITING
            else:
                self._enqueue(job[1], job[2], job[3], job[4], job[0])
        if t >= self.open_at:
            self._schedule()

    def _drop_limit(self, jid: int) -> None:
        for i, entry in enumerate(self.limits):
            if entry[1] == jid:
                del self.limits[i]
                return

    def _start(self, p: tuple) -> None:
        now = self.now
        jid, nodes, limit, runtime = p[2], p[3], p[4], p[5]
        self.free -= nodes
        if self.usage is not None:
            self.usage.started(jid, nodes, now)
        heapq.heappush(self.running, (now + min(runtime, limit), jid, nodes))
        insort(self.limits, (now + limit, jid, nodes, now))
        if 0 <= jid < len(self.status):
            self.status[jid] = _RUNNING
            if self.starts is not None:
                self.starts[jid] = now
        if jid in self.watched:
            self.watched[jid] = now

    def _schedule(self) -> None:
        if not self.pending or self.free == 0:
            return
        if self.usage is not None and self.now >= self.usage.next_calc:
            self._recalc()
        pend = self.pending
        n = len(pend)
        i = 0
        while i < n and pend[i][3] <= self.free:  # strict priority order while jobs fit
            self._start(pend[i])
            i += 1
        if i == n:
            self.pending = []
            return
        if self.free == 0:
            self.pending = pend[i:]
            return
        # reservation for the top blocked job: when do enough nodes free up (by time limits)?
        need = pend[i][3]
        avail = self.free
        shadow = float("inf")
        for end, _, nodes, _ in self.limits:
            avail += nodes
            if avail >= need:
                shadow = end
                break
        extra = avail - need if shadow != float("inf") else 0
        now = self.now
        started = []
        stop = min(n, i + 1 + self.bf_depth)
        for j in range(i + 1, stop):
            p = pend[j]
            nodes = p[3]
            if nodes > self.free:
                continue
            if now + p[4] <= shadow:
                self._start(p)
                started.append(j)
            elif nodes <= extra:
                extra -= nodes
                self._start(p)
                started.append(j)
            if self.free == 0:
                break
        if started:
            gone = set(started)
            self.pending = [pend[k] for k in range(i, n) if k not in gone]
        else:
            self.pending = pend[i:] if i else pend

    def _recalc(self) -> None:
        """Fair share factors now, and every pending job re-keyed: age capped at PriorityMaxAge
        plus its (new) fair share and size terms, all in seconds of age."""
        u = self.usage
        now = self.now
        u.recalc(now)
        oldest = now - u.fs.max_age_s
        total = self.total
        # Usage.bonus_s inlined (the same expression, so the same floats): every pending job, every 5 min
        fs = u.fs
        w, sw, users, n_users = fs.weight_s, fs.size_weight_s, fs.users, fs.n_users
        n = len(users)
        pend = self.pending
        fac = u.factors([users[p[2]] if 0 <= p[2] < n else n_users for p in pend])
        self.pending = sorted([(max(p[6], oldest) - (w * f + sw * p[3] / total),) + p[1:] for p, f in zip(pend, fac)])

    # ---- views for policies ---------------------------------------------------------------
    def queue_view(self) -> tuple[list[int], list[tuple[int, float]]]:
        """What squeue shows at ``now`` minus dependency holds (they are ahead of no one):
        pending jids and running (jid, start)."""
        pending = [p[2] for p in self.pending]
        running = [(entry[1], entry[3]) for entry in self.limits]
        return pending, running

    def expected_start(self, jid: int) -> float | None:
        """What ``squeue --start`` shows for pending job ``jid`` at ``now``: Slurm's backfill plan over
        the running jobs' limits and the jobs ahead of it (expected_start.py); None when it is not
        pending (running, ended, or held by a dependency: Slurm plans no held job) or has no plan."""
        from chainrun.sim.expected_start import expected_start

        ahead = []
        for p in self.pending:  # in priority order: only the jobs ahead of it (and itself) matter
            ahead.append((p[2], p[3], p[4]))
            if p[2] == jid:
                break
        else:
            return None
        return expected_start(self.now, self.total, ((e[0], e[2]) for e in self.limits), ahead, jid,
                              depth=self.bf_depth + 1, open_at=self.open_at)

    def latest_expected_start(self, counted) -> float | None:
        """The latest ``squeue --start`` among the pending jobs ``counted(jid)`` keeps (the watcher's
        view of the queue ahead, chainrun.predict.doubt.queue_ahead): Slurm's plan of every pending job
        in priority order within the backfill's depth; None when none of them has a plan."""
        from chainrun.sim.expected_start import latest_planned_start

        return latest_planned_start(self.now, self.total, ((e[0], e[2]) for e in self.limits),
                                    [(p[2], p[3], p[4]) for p in self.pending], depth=self.bf_depth + 1,
                                    open_at=self.open_at, counted=counted)
