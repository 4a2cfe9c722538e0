"""The driver of moves between clusters: carries out chain/move_steps.py's steps, once per watcher tick.

A move is recorded on the successor segment (``extra["move"]``: from, to, generation, predecessor,
phase, the newest checkpoint seen on the old site, the copy verified on the new one, the copy's
progress). Until the move is over the successor is *foreign* to the chain's engine (chain/span.py):
this module follows its job on the new site (one ``squeue`` per site and tick, ``sacct`` only for a job
that left it), reads the old site's control folder (one listing), copies in a background thread (a
checkpoint copy takes minutes; the tick does not wait for it), and writes the three files of the
protocol (``moved.<G>``, ``handoff.<G-1>``, ``go.<G>``; docs/remote-clusters.md). Once the go-ahead is
written and the predecessor's end is recorded, the chain's row names the new site and its engine takes
the successor over.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from chainrun.chain import ckpt_manifest as cm
from chainrun.chain import move_steps as ms
from chainrun.chain import outcomes, site_pace, site_plan, span
from chainrun.chain.contract import go_text, handoff_text, moved_text
from chainrun.chain.move_cleanup import Asked, Cleanups
from chainrun.chain.engine import LOST_AFTER_S  # a submission never confirmed this long: never made
from chainrun.chain.segments import job_name
from chainrun.errors import ChainrunError
from chainrun.runner.base import innermost
from chainrun.state.records import ENDED, LIVE_PHASES, PENDING, RUNNING, SUBMITTING, UNSTARTED, Chain, ChainSite, Segment
from chainrun.state.store import Store

log = logging.getLogger(__name__)

DONE = "done"  # the chain's row names the new site: the move is over
COPY_RETRY_S, COPY_RETRY_MAX_S = 30.0, 600.0  # a failed copy is tried again after 30 s, doubling to 10 min
COPY_WAIT_AT_CLOSE_S = 1800.0  # a watcher that stops lets a running copy finish (it resumes anyway)
# a copy ahead re-reads the old site's newest checkpoint this often (the manifest hashes every file there)
LOOK_EVERY_S = 600.0


def live_move(s: Segment) -> dict | None:
    mv = s.extra.get("move")
    return mv if mv and mv.get("phase") not in (DONE, ms.ABANDONED) else None


def _ck(d: dict | None) -> ms.Checkpoint | None:
    return ms.Checkpoint(int(d["generation"] or 0), int(d["step"] or 0), int(d.get("bytes") or 0)) if d else None


def costs(c: Chain, mv: dict, pace: site_pace.SitePace | None = None) -> dict:
    """What the expected-cost choice of the checkpoint to resume from reads (move_steps.resume_from): the
    chain's measured seconds per step (chain/tick_context.py, from its progress: where it trains now, the
    old site), the copy rate to the new site, this move's own, else the chain's measured rate from the old
    site to the new (site_plan.copy_rate), and the new site's pace against the old (``dest_pace``; None: 1.0)."""
    rate = mv.get("copy_Bps") or site_plan.copy_rate(c, mv.get("from") or c.cluster, mv["to"])[0]
    return {"step_s": float(c.extra.get("step_s") or 0.0), "throughput_bps": float(rate or 0.0),
            "pace": pace.pace if pace is not None else 1.0}


def dest_pace(c: Chain, segs: list[Segment], mv: dict) -> site_pace.SitePace:
    """The new site's pace against the site the chain trains on (the move's old one, until it arrives):
    measured, else declared in config.toml, else 1.0, as the site rule weighed it (site_plan.site_paces)."""
    return site_plan.site_paces(c, segs, [c.cluster, mv["to"]])[mv["to"]]


def _summary(man: cm.Manifest) -> dict:
    path = man.marker if man.kind == cm.FOLDER else man.name
    return {**man.summary(), "path": path, "sha256": cm.content_sha256(man)}


class Mover:
    """``site(name)`` gives the Engine of a site (its Slurm client, runner and user), as MultiEngine keeps them."""

    def __init__(self, store: Store, site: Callable[[str], object], clock: Callable[[], float] = time.time) -> None:
        self.store, self._site, self.clock = store, site, clock
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: dict[tuple[str, int], Future] = {}
        self._progress: dict[tuple[str, int], dict] = {}
        self._manifests: dict[tuple[str, int], cm.Manifest] = {}
        self._queues: dict[str, list] = {}
        self._cleanups = Cleanups()  # unused copies removed when a move ends (move_cleanup.py)

    # ------------------------------------------------------------------ the tick
    def moving(self) -> list[Chain]:
        return [c for c in self.store.chains(active_only=True) if span.spans(c)
                and any(live_move(s) for s in self.store.segments(c.id))]

    def tick(self) -> list[str]:
        warnings: list[str] = []
        self._queues = {}
        self._cleanups.harvest(self.store)
        for c in self.moving():
            segs = self.store.segments(c.id)
            for s in segs:
                if (mv := live_move(s)) is None:
                    continue
                try:
                    self._step(c, segs, s, mv)
                except ChainrunError as e:  # a site did not answer: the move waits, nothing was half-done
                    warnings.append(f"{c.id}: moving to {mv['to']}: {e.message}")
                    log.info("move of %s: %s", c.id, e, exc_info=True)
        return warnings

    def close(self, wait_s: float = COPY_WAIT_AT_CLOSE_S) -> None:
        """Let running copies finish (bounded): a copy cut here resumes on the next watcher's first tick."""
        deadline = time.monotonic() + wait_s
        for fut in list(self._jobs.values()):
            try:
                fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - reported by the next tick's harvest, or lost with the process
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._cleanups.close(max(60.0, deadline - time.monotonic()))  # an rm on scratch: at least a minute
        self._cleanups.harvest(self.store)

    def _step(self, c: Chain, segs: list[Segment], s: Segment, mv: dict) -> None:
        sites = {x.cluster: x for x in self.store.sites(c.id)}
        a, b = sites[mv["from"]], sites[mv["to"]]
        ea, eb = self._site(a.cluster), self._site(b.cluster)
        key = (c.id, s.idx)
        self._follow(c, s, mv, eb)
        self._harvest(c, s, mv, key)
        pred = next((x for x in segs if x.idx == mv["pred"]), None)
        names = span.control_names(ea.runner, a.run_dir)  # None: the old site did not answer
        gen = int(mv["gen"])
        released = None if names is None else f"released.{gen - 1}" in names
        pred_live = None if names is None else (pred is not None and pred.phase in LIVE_PHASES)
        stopped = pred_live is False or released is True
        copying = key in self._jobs and not self._jobs[key].done()
        if self.clock() < float(mv.get("copy_retry_at") or 0):
            copying = True  # a failed copy waits before the next try: as if one were under way
        if mv["phase"] == ms.FENCED and stopped and not mv.get("final_read") and s.phase != ENDED:
            # the predecessor stopped: its newest checkpoint is the final one; read it before choosing
            if not copying:
                self._start(key, self._read_final, ea, a, key)
            self.store.save(c, [s])
            return
        if (mv["phase"] == ms.AHEAD and not stopped and not copying and s.phase != ENDED
                and self.clock() - float(mv.get("looked_at") or 0) >= LOOK_EVERY_S):
            mv["looked_at"] = self.clock()  # a copy ahead: the newest checkpoint is read (hashed) and sent
            self._start(key, self._copy_newest, ea, eb, a, b, key)
            copying = True
        # the pace is read (config.toml too) only where the choice of checkpoint is made: once A stopped
        pace = dest_pace(c, segs, mv) if mv["phase"] == ms.FENCED and stopped else None
        seen = ms.Seen(successor=s.phase, predecessor_live=pred_live, released=released,
                       newest=_ck(mv.get("newest")), copied=_ck(mv.get("copied")), copying=copying,
                       **costs(c, mv, pace), copy_failing=bool(mv.get("copy_error")),
                       asked=f"handoff.{gen - 1}" in (names or set()))
        step = ms.next_step(mv["phase"], seen)
        events = [self._weighed(mv, seen, pace, b.cluster)]
        for kind, target in step.actions:
            events.append(self._act(kind, target, c, s, mv, a, b, ea, eb, key, names or set()))
        if step.phase != mv["phase"]:
            events.append(f"move to {b.cluster}: {mv['phase']} -> {step.phase} ({step.why})")
            mv["phase"] = step.phase
        if step.phase == ms.ABANDONED:
            self._abandon(c, s, mv)
            self._cleanups.ask(Asked(c.id, s.idx, b.cluster, "abandoned"), innermost(eb.runner), b.checkpoint_dir)
            events.append(f"segment {s.idx} on {b.cluster} ended before its go-ahead: the chain plans again")
        elif step.phase == ms.GO and pred is not None and pred.phase == ENDED:
            self._arrive(c, segs, s, mv, b)
            self._cleanups.ask(Asked(c.id, s.idx, b.cluster, "done"), innermost(eb.runner), b.checkpoint_dir,
                               keep=(mv["copied"]["name"],))  # by name: older copies share its marker
            events.append(f"the chain moved from {a.cluster} to {b.cluster}: segment {s.idx} trains there "
                          f"from step {(mv.get('go') or {}).get('step')}")
        self.store.save(c, [s], [(s.idx, "move", e) for e in events if e])

    @staticmethod
    def _weighed(mv: dict, seen: ms.Seen, pace: site_pace.SitePace | None, to: str) -> str:
        """The choice of the checkpoint to resume from, with its numbers (the pace used among them), kept
        on the move (``status --json``: the segment's ``move.resume``) and said once per change."""
        cost = ms.resume_cost(seen) if pace is not None else None
        if cost is None:
            return ""
        said = {**cost.as_dict(), "pace_from": pace.pace_from}
        if mv.get("resume") == said:
            return ""
        mv["resume"] = said
        return f"move to {to}: {cost.words(pace.pace_from)}"

    # ------------------------------------------------------------------ what is seen
    def _follow(self, c: Chain, s: Segment, mv: dict, eb) -> None:
        """The successor's job on the new site: its phase from that site's squeue (one per tick), its end
        from sacct. After the go-ahead an end is left for the site's engine to read (it settles outcomes)."""
        if s.phase not in LIVE_PHASES:
            return
        if mv["to"] not in self._queues:
            self._queues[mv["to"]] = eb.slurm.queue()
        rows = self._queues[mv["to"]]
        row = next((q for q in rows if (s.job_id and q.job_id == s.job_id) or
                    (s.phase == SUBMITTING and q.name == job_name(c.id, s.idx))), None)
        now = self.clock()
        if row is not None:
            s.job_id = s.job_id or row.job_id
            s.slurm_state = row.state
            if row.state in ("RUNNING", "COMPLETING") and s.phase != RUNNING:
                s.phase, s.start = RUNNING, row.start or now
            elif s.phase == SUBMITTING:
                s.phase = PENDING
            return
        if mv["phase"] == ms.GO:
            return
        if s.job_id:
            acct = [r for r in eb.slurm.accounting([s.job_id], since=s.submit or s.intent_at) if r.job_id == s.job_id]
            if acct and outcomes.is_final(acct[-1].state):
                s.phase, s.slurm_state, s.end = ENDED, acct[-1].state, acct[-1].end or now
        elif now - s.intent_at > LOST_AFTER_S:
            s.phase, s.reason = ENDED, "sbatch on the new site was never confirmed"

    # ------------------------------------------------------------------ copies, in the background
    def _start(self, key, fn, *args) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chainrun-copy")
        self._jobs[key] = self._pool.submit(fn, *args)

    # the copy thread uses the runners themselves, not the acting watcher's fenced wrappers: the fence reads the
    # store (SQLite objects stay in their thread); a copy lands under a partial name and is verified, so a
    # watcher that lost its lease meanwhile can at worst copy twice, never put a wrong checkpoint in place
    def _read_final(self, ea, a: ChainSite, key) -> dict:
        man = cm.manifest(innermost(ea.runner), a.checkpoint_dir)
        if man is not None:
            self._manifests[key] = man
        return {"final": _summary(man) if man else None}

    def _copy(self, ea, eb, a: ChainSite, b: ChainSite, key, target: ms.Checkpoint) -> dict:
        from chainrun.chain.ckpt_copy import copy_checkpoint
        from chainrun.chain.ckpt_routes import bwlimit_kbps, configured_site

        man = self._manifests.get(key)
        if man is None or (man.generation or 0, man.step or 0) != (target.generation, target.step):
            man = cm.manifest(innermost(ea.runner), a.checkpoint_dir)
        src = configured_site(a.cluster, innermost(ea.runner), a.checkpoint_dir)
        dst = configured_site(b.cluster, innermost(eb.runner), b.checkpoint_dir)
        res = copy_checkpoint(src, dst, manifest=man, bwlimit_kbps=bwlimit_kbps(a.cluster, b.cluster),
                              on_progress=lambda p: self._progress.__setitem__(key, p.to_dict()))
        self._manifests[key] = man
        return {"copied": _summary(man), "copy_Bps": res.copy_Bps, "seconds": round(res.seconds, 1)}

    def _harvest(self, c: Chain, s: Segment, mv: dict, key) -> None:
        if key in self._progress:
            mv["copy"] = {k: self._progress[key].get(k) for k in
                          ("state", "bytes_done", "bytes_total", "throughput_Bps", "generation", "step", "route")}
            # the size is known from the copy's start (its manifest): later decisions weigh it at once
            site_plan.record_copy(c, mv["to"], src=mv.get("from"),
                                  size_bytes=self._progress[key].get("checkpoint_bytes"))
        fut = self._jobs.get(key)
        if fut is None or not fut.done():
            return
        del self._jobs[key]
        try:
            got = fut.result()
        except Exception as e:  # noqa: BLE001 - a failed copy is tried again later (rsync resumes it)
            n = mv["copy_failures"] = int(mv.get("copy_failures") or 0) + 1
            wait = min(COPY_RETRY_MAX_S, COPY_RETRY_S * 2 ** (n - 1))
            mv["copy_retry_at"] = self.clock() + wait
            if mv.get("copy_error") != str(e):  # said once per distinct error, not every tick
                mv["copy_error"] = str(e)
                self.store.add_event(c.id, s.idx, "warning", f"copy to {mv['to']} failed ({e}); trying again in "
                                     f"{wait:.0f}s, then less often")
            return
        mv.pop("copy_error", None)
        mv.pop("copy_retry_at", None)
        if "final" in got:  # the predecessor's last checkpoint, read once it stopped
            mv["final_read"] = True
            if got["final"]:
                mv["newest"] = got["final"]
                site_plan.record_copy(c, mv["to"], src=mv.get("from"), size_bytes=got["final"].get("bytes"))
        if "copied" in got:
            mv["copied"] = got["copied"]
            if not mv.get("final_read"):
                mv["newest"] = got["copied"]
            if got.get("copy_Bps"):
                mv["copy_Bps"] = got["copy_Bps"]
            # the chain's later decisions weigh a move by this: the size, and the rate of a whole copy there
            site_plan.record_copy(c, mv["to"], src=mv.get("from"), size_bytes=got["copied"].get("bytes"),
                                  copy_Bps=got.get("copy_Bps"))
            self.store.add_event(c.id, s.idx, "copy", f"checkpoint step {got['copied']['step']} copied to "
                                 f"{mv['to']} and verified ({got['copied']['bytes']} bytes, {got['seconds']} s)")

    # ------------------------------------------------------------------ acts
    def _act(self, kind, target, c, s, mv, a, b, ea, eb, key, names) -> str:
        gen, now = int(mv["gen"]), self.clock()
        if kind == ms.COPY:
            if key not in self._jobs:
                self._start(key, self._copy, ea, eb, a, b, key, target)
            return f"copying step {target.step} to {b.cluster}"
        if kind == ms.FENCE:
            if f"moved.{gen}" not in names:
                ea.runner.write_file(f"{a.run_dir}/control/moved.{gen}", moved_text(c.id, gen, to=b.cluster, at=now), 0o600)
            return f"wrote moved.{gen} on {a.cluster}: nothing below generation {gen} starts training there again"
        if kind == ms.ASK_HANDOFF:
            if f"handoff.{gen - 1}" not in names:
                ea.runner.write_file(f"{a.run_dir}/control/handoff.{gen - 1}",
                                     handoff_text(now, by=f"{b.cluster}:{s.job_id}", seg=s.idx), 0o600)
            return f"asked segment {mv['pred']} on {a.cluster} to hand off"
        if kind == ms.GO_AHEAD:
            copied = mv["copied"]
            eb.runner.write_file(f"{b.run_dir}/control/go.{gen}", go_text(
                c.id, gen, seg=s.idx, ckpt_gen=copied["generation"], step=copied["step"], manifest=copied["path"],
                manifest_sha256=copied["sha256"], at=now), 0o600)
            mv["go"] = {"at": now, "step": copied["step"], "generation": copied["generation"]}
            return f"wrote go.{gen} on {b.cluster}: segment {s.idx} resumes from step {copied['step']}"
        return ""

    def _copy_newest(self, ea, eb, a: ChainSite, b: ChainSite, key) -> dict:
        """A copy ahead: the newest complete checkpoint, whatever it is (nothing when there is none yet)."""
        man = cm.manifest(innermost(ea.runner), a.checkpoint_dir)
        if man is None:
            return {}
        self._manifests[key] = man
        return self._copy(ea, eb, a, b, key, ms.Checkpoint(man.generation or 0, man.step or 0))

    def _abandon(self, c: Chain, s: Segment, mv: dict) -> None:
        s.phase = ENDED
        s.outcome = s.outcome or UNSTARTED
        s.reason = s.reason or "ended on the new site before its go-ahead; never trained"

    def _arrive(self, c: Chain, segs: list[Segment], s: Segment, mv: dict, b: ChainSite) -> None:
        for x in segs:  # every earlier segment keeps naming the site it ran on
            if x.cluster is None:
                x.cluster = c.cluster
        self.store.save(c, [x for x in segs if x is not s])
        span.move_to(c, b)
        mv["phase"] = DONE
        c.extra["moves_made"] = int(c.extra.get("moves_made") or 0) + 1
