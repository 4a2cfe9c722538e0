"""Where the next segment of a chain spanning clusters runs, and submitting it there (issue 26).

Planning asks this module at every tick where a successor may be asked for (the ASK step of
chain/planning.py). For each site of the chain it estimates the successor's wait if submitted now
(the site's queue-delay model; without one, Slurm's own ``sbatch --test-only`` start), the checkpoint's
transfer there (its measured size over the copy rate measured between the two sites; before a copy,
DEFAULT_TRANSFER_S), and the chain's pace and restart cost there (measured, else declared in
config.toml, else the default: chain/site_pace.py); chain/site_choice.py then picks the site expected
to finish the chain first, staying unless another saves more than the margin; its segments train the limit less the
chain's overhead and each boundary costs the restart and the hand-off, as in the replay (``boundaries``).
The policy times the successor with the chosen site's wait; a successor on another site is a move
(chain/mover.py takes it from there). Segment 0 is placed at submit by the same rule (``first_site``).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from chainrun.chain import site_choice, site_pace, sizing, span
from chainrun.chain.handoff_plan import measured_handoff_s
from chainrun.chain.move_steps import AHEAD
from chainrun.chain.pace import expected_training, segment_overhead, segment_rate
from chainrun.chain.policies import WaitEstimate
from chainrun.chain.segments import sbatch_args, wrapper_path
from chainrun.errors import ChainrunError, SlurmError
from chainrun.state.records import PENDING, RUNNING, Chain, ChainSite, Segment

if TYPE_CHECKING:
    from chainrun.chain.tick_context import TickContext

log = logging.getLogger(__name__)

DEFAULT_TRANSFER_S = 900.0  # a checkpoint's copy before one was measured (the replay's default --transfer)
DEFAULT_COPY_BPS = 50e6  # ...or its size over this rate once its size is known
COPY_RATES_KEPT = 5  # a link's copy rate: the median of its last 5 whole copies (one outlier does not swing it)
TEST_ONLY = "slurm --test-only"  # the source of a wait that is Slurm's own expected start
NO_START = "Slurm gives it no start (sbatch --test-only)"  # why a site that answered has no wait


@dataclass(frozen=True)
class Move:
    """A decision to run the next segment on another site: the choice, every site's wait, and the
    segment it follows (the live one, or the last one when none is live)."""

    choice: site_choice.SiteChoice
    waits: dict
    pred: Segment

    @property
    def site(self) -> str:
        return self.choice.site


class SiteAccess:
    """The other sites as one engine's planning sees them: ``engine(name)`` is that site's Engine
    (its Slurm client, runner, predictor and user), made once per watcher by MultiEngine."""

    def __init__(self, engine: Callable[[str], object]) -> None:
        self._engine = engine
        self._queues: dict[str, list] = {}

    def engine(self, name: str):
        return self._engine(name)

    def queue(self, name: str) -> list:
        """That site's queue, everyone's (the model reads the queue ahead): one squeue per site and tick."""
        if name not in self._queues:
            self._queues[name] = self._engine(name).slurm.queue(all_users=True)
        return self._queues[name]

    def new_tick(self) -> None:
        self._queues.clear()


def last_trained(segs: list[Segment]) -> Segment:
    """The segment a successor follows when none is live: the newest that trained (a cancelled or
    unstarted one after it holds no checkpoint), else the newest."""
    trained = [s for s in segs if s.credit_s > 0 or s.outcome in ("continue", "handoff", "checkpoint-crash")]
    return max(trained, key=lambda s: s.idx) if trained else segs[-1]


def margin_s(c: Chain) -> float:
    m = c.extra.get("site_margin_s")
    return float(m) if m is not None else site_choice.SHIPPED_MARGIN_S


def wait_estimate(t: TickContext, c: Chain, site: ChainSite, cur: Segment, now: float, *,
                  bounded: bool = True, model_only: bool = False,
                  left_out: dict[str, str] | None = None) -> WaitEstimate | None:
    """The successor's wait on ``site`` if submitted now: the site's model, else Slurm's own estimate;
    ``bounded``: no earlier than Slurm's recent plan for the chain's job pending there; ``model_only``:
    None where the model gives no answer (no ``sbatch --test-only`` call). ``left_out``: where a site with
    no wait gets its why (the decision names every site it did not weigh)."""
    here = site.cluster == c.cluster
    view = span.site_view(c, site)
    probe = Segment(chain_id=c.id, idx=cur.idx + 1, time_limit_s=view.segment_s, cluster=site.cluster)
    try:
        eng = None if here else t.sites.engine(site.cluster)
        predictor = t.predictor if here else eng.predictor
        if predictor is not None:
            queue = t.queue if here else t.sites.queue(site.cluster)
            est = predictor(view, probe, queue)
            if est is not None:
                return _at_least_planned(c, site.cluster, est, now) if bounded else est
        if model_only:
            return None
        slurm = t.slurm if here else eng.slurm
        start = slurm.test_only(wrapper_path(view), sbatch_args(view, probe), script_args=[str(probe.idx)])
    except (ChainrunError, SlurmError) as e:  # that site does not answer: it is not an option this tick
        log.info("site %s: no wait estimate (%s)", site.cluster, e)
        if left_out is not None:
            left_out[site.cluster] = f"cannot reach it ({_short(e)})"
        return None
    est = test_only_wait(start, now)
    if est is None and left_out is not None:
        left_out[site.cluster] = NO_START
    if est is None or not bounded:
        return est
    return _at_least_planned(c, site.cluster, est, now)


def _short(e: Exception) -> str:
    """An error in one clause: its first line, cut (an ssh error may carry a whole banner)."""
    line = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    return line if len(line) <= 120 else line[:117] + "..."


def with_left_out(choice: site_choice.SiteChoice, left_out: dict[str, str]) -> site_choice.SiteChoice:
    """The decision naming every site it did not weigh, and why, in its reason (the event) and its record
    (``status --json``: ``site_choice.left_out``): a site dropped silently looks like one that lost."""
    if not left_out:
        return choice
    said = "; ".join(f"{n} not weighed: {why}" for n, why in left_out.items())
    return dataclasses.replace(choice, reason=f"{choice.reason}; {said}", left_out=tuple(left_out.items()))


def test_only_wait(start: float | None, now: float) -> WaitEstimate | None:
    """Slurm's own expected start (``sbatch --test-only``) as a wait: every site's estimate where it has no
    model, and where its model fails. None when Slurm gave no start."""
    if start is None:
        return None
    w = max(0.0, float(start) - now)
    return WaitEstimate(seconds=w, model=TEST_ONLY, p50=w)


def median_s(est: WaitEstimate) -> float:
    """The wait the rule reads (site_choice.LEVEL): the estimate's median, else its one number."""
    return est.p50 if est.p50 is not None else est.seconds


def own_median_s(est: WaitEstimate) -> float:
    """The median the site's model gives on its own, before leaning on Slurm's plan of the queue ahead
    (chainrun/predict/doubt.py): what caps Slurm's plan for a pending job (``pending_wait_s``). The
    lean lifts a median to the latest planned start of the jobs ahead, itself a plan with every running
    job at its limit, so a leaned median caps nothing."""
    return est.model_p50 if est.model_p50 is not None else median_s(est)


def wait_sources(waits: dict[str, WaitEstimate | None]) -> dict[str, dict]:
    """What a site decision records per site (``status --json``: ``site_choice.waits``): the median wait
    the rule read and where it came from (a model's name, or ``slurm --test-only``)."""
    return {n: {"wait_s": round(median_s(w), 1), "from": w.model} for n, w in waits.items() if w is not None}


def _at_least_planned(c: Chain, site: str, est: WaitEstimate, now: float) -> WaitEstimate:
    """No earlier than Slurm's own plan for the chain's last job pending there (``sbatch --test-only`` sees
    free resources, not the jobs queued ahead; squeue's expected start does), while that plan lies ahead."""
    planned, seen_at = ((c.extra.get("planned_start") or {}).get(site) or (0, 0))
    if not plan_holds(planned, seen_at, now):
        return est
    w = max(est.seconds, planned - now)
    return WaitEstimate(seconds=w, model=f"{est.model}, no earlier than Slurm's plan", p50=max(est.p50 or 0, w))


def choose(t: TickContext, c: Chain, cur: Segment, *, remaining_s: float, handover_at: float | None,
           now: float) -> tuple[site_choice.SiteChoice, dict[str, WaitEstimate]] | None:
    """The site for the next segment, with every site's wait; None when no site could be estimated."""
    sites = t.store.sites(c.id)
    segs = t.store.segments(c.id)
    paces = site_paces(c, segs, [s.cluster for s in sites])
    ests: dict[str, WaitEstimate] = {}
    options = []
    left_out: dict[str, str] = {}
    for s in sites:
        est = wait_estimate(t, c, s, cur, now, left_out=left_out)
        if est is None:
            continue
        ests[s.cluster] = est
        options.append(option(c, s.cluster, median_s(est), paces.get(s.cluster)))
    if not options:
        return None
    ready_in = max(0.0, handover_at - now) if handover_at else 0.0
    choice = site_choice.choose_site(c.cluster, options, remaining_s=remaining_s, margin_s=margin_s(c),
                                     ready_in_s=ready_in, **boundaries(c, segs))
    return with_left_out(choice, left_out), ests


def first_site(c: Chain, names: list[str], waits: dict[str, WaitEstimate | None]) -> site_choice.SiteChoice | None:
    """Where segment 0 starts (not a move: there is nothing to carry): the rule of every next segment,
    from the first site (the preferred) with the margin, on each site's wait for segment 0 at submit
    (its model's median where it has one, else Slurm's ``sbatch --test-only`` start: chain/first_wait.py),
    each site's declared pace and restart, no transfer. A site with no wait (no model answer, and Slurm
    gave no start) is not weighed, and the decision names it and why (``with_left_out``), as later
    decisions do. When the first site has no wait, or no other site is left to weigh against it, segment
    0 starts on the first site and the decision says why. None only without sites."""
    if not names:
        return None
    left_out = {n: NO_START for n in names if waits.get(n) is None}
    weighed = [n for n in names if n not in left_out]
    paces = site_paces(c, [], names)
    options = [site_choice.SiteOption(name=n, wait={0.5: median_s(waits[n])}, transfer_s=0.0,
                                      restart_s=paces[n].restart_s if n in paces else 0.0,
                                      pace=paces[n].pace if n in paces else 1.0) for n in weighed]
    choice = site_choice.choose_site(None, options, remaining_s=float(c.total_s), margin_s=margin_s(c),
                                     **boundaries(c, [])) if options else None
    first = names[0]
    if first in left_out:
        # a known wait elsewhere against an unknown one here says nothing of which finishes first:
        # the user's order of preference decides, rather than a one-sided comparison
        others = "; ".join(f"{e.name} {site_choice.described(e)}" for e in choice.estimates) if choice else ""
        reason = (f"start on {first}, the first cluster: its wait is unknown, so it cannot be weighed against "
                  f"the others ({others})" if others else
                  f"start on {first}, the first cluster: no cluster has a wait to weigh")
        choice = site_choice.SiteChoice(first, False, reason, choice.estimates if choice else (), margin_s(c))
    elif len(weighed) == 1:
        choice = dataclasses.replace(choice, reason=(
            f"start on {first}, the first cluster: {site_choice.described(choice.estimates[0])}; "
            "no other cluster has a wait to weigh against it"))
    return with_left_out(choice, left_out)


def boundaries(c: Chain, segs: list[Segment]) -> dict[str, float]:
    """The rule's segment and boundary, as the replay gives them (sim/site_chain.py: a segment trains its
    limit less the signal lead and the restart; a boundary costs the restart and the hand-off), in the
    watcher's own numbers (handoff_plan.rule_numbers): the chain's per-segment overhead (the signal lead
    until a segment measured more) and its measured hand-off (the signal lead until one was measured)."""
    overhead = segment_overhead(c, segs)
    return {"segment_s": max(1.0, c.segment_s - overhead),
            "boundary_s": max(0.0, overhead - c.signal_lead_s) + measured_handoff_s(c, segs)}


def option(c: Chain, site: str, median_wait_s: float,
           pace: site_pace.SitePace | None = None) -> site_choice.SiteOption:
    """One site as the rule weighs it: its median wait, the checkpoint's transfer there (none where the
    chain is), the chain's pace and restart there (``site_paces``; None: the defaults, pace 1, no restart)."""
    pace = pace or site_pace.SitePace()
    return site_choice.SiteOption(name=site, wait={0.5: median_wait_s},
                                  transfer_s=0.0 if site == c.cluster else transfer_s(c, site),
                                  restart_s=pace.restart_s, pace=pace.pace)


def site_paces(c: Chain, segs: list[Segment], names: list[str]) -> dict[str, site_pace.SitePace]:
    """The chain's pace and restart on each site: measured from its segments' progress, else as
    config.toml declares them (read at each decision, so an edit applies to running chains)."""
    return site_pace.for_chain(c, segs, names, declared_by_site(names))


def declared_by_site(names: list[str]) -> dict[str, site_pace.Declared]:
    """``[clusters.NAME.job] pace`` and ``restart`` for each site; none when config.toml cannot be
    read now (a decision must not fail on a file being edited: the defaults hold, and the log says why)."""
    from chainrun import clusters

    try:
        cfg = clusters.load()
    except ChainrunError as e:
        log.warning("declared pace and restart not read: %s", e)
        return {}
    out = {}
    for n in names:
        s = clusters.site_settings(n, cfg)
        if s.pace is not None or s.restart_s is not None:
            out[n] = site_pace.Declared(s.pace, s.restart_s)
    return out


def pair(src: str, to: str) -> str:
    """The key a copy rate between two sites is kept under: ``a>b`` (copies from a into b)."""
    return f"{src}>{to}"


def copy_rate(c: Chain, src: str, to: str) -> tuple[float, str | None]:
    """The measured rate of a whole copy from ``src`` to ``to`` and the key it was read under: the pair's
    (the link between the two sites), else the one kept for ``to`` alone (stores from before the pairs
    kept one rate per destination); (0, None) when neither was measured."""
    rates = c.extra.get("copy_Bps") or {}
    for key in (pair(src, to), to):
        rate = float(rates.get(key) or 0)
        if rate > 0:
            return rate, key
    return 0.0, None


def transfer_s(c: Chain, to: str, src: str | None = None) -> float:
    """The checkpoint's copy from ``src`` (None: the site the chain is on, where its checkpoint is) to
    ``to``: its last known size over the rate measured between the two (``copy_rate``); before any size
    is known DEFAULT_TRANSFER_S, before a whole copy between them DEFAULT_COPY_BPS."""
    return _transfer(c, to, src)[0]


def _transfer(c: Chain, to: str, src: str | None) -> tuple[float, str]:
    size = float(c.extra.get("checkpoint_bytes") or 0)
    if size <= 0:
        return DEFAULT_TRANSFER_S, "no size known: the default"
    rate, key = copy_rate(c, src or c.cluster, to)
    if key is None:
        return size / DEFAULT_COPY_BPS, "size over the default rate"
    where = key if ">" in key else f"into {key} (kept per destination)"
    return size / rate, f"size over the rate measured {where}"


def transfer_sources(c: Chain, names) -> dict[str, dict]:
    """What a site decision records per other site (``status --json``: ``site_choice.transfers``): the
    checkpoint's transfer there and what it was read from (the pair's measured rate, the destination's,
    or a default), so a decision shows which link it weighed."""
    out = {}
    for n in names:
        if n != c.cluster:
            took, said = _transfer(c, n, None)
            out[n] = {"transfer_s": round(took, 1), "from": said}
    return out


def record_copy(c: Chain, to: str, *, src: str | None = None, size_bytes: int | None = None,
                copy_Bps: float | None = None) -> None:
    """What chain/mover.py measured, kept on the chain for ``transfer_s``: the checkpoint's size (from the
    manifest it read, before or after a copy), and a verified whole copy's rate from ``src`` (None: the
    chain's site) to ``to`` (a resumed copy says nothing of the rate): the median of the last
    COPY_RATES_KEPT between the two, kept under the pair (``a>b``: a link's rate in one direction says
    nothing of another link's)."""
    if size_bytes and size_bytes > 0:
        c.extra["checkpoint_bytes"] = int(size_bytes)
    if copy_Bps and copy_Bps > 0:
        key = pair(src or c.cluster, to)
        seen = c.extra.setdefault("copy_Bps_seen", {}).setdefault(key, [])
        seen.append(round(float(copy_Bps), 1))
        del seen[:-COPY_RATES_KEPT]
        c.extra.setdefault("copy_Bps", {})[key] = statistics.median(seen)


def next_generation(t: TickContext, c: Chain, to: ChainSite) -> int:
    """The generation the successor on ``to`` claims: above every generation claimed where the chain
    trains now, and above the last move away from ``to`` (a site moved away from claims only above it)."""
    def listed(runner, run_dir: str) -> set[str]:
        names = span.control_names(runner, run_dir)
        if names is None:
            raise ChainrunError(f"cannot list {run_dir}/control")
        return names

    here = span.highest(listed(t.runner, c.run_dir), "owner")
    there = span.highest(listed(t.sites.engine(to.cluster).runner, to.run_dir), "moved")
    return max(here + 1, there + 1)


def prepare_move(t: TickContext, c: Chain, seg: Segment, cur: Segment, to: str, choice: site_choice.SiteChoice,
                 now: float) -> Chain:
    """Make ``seg`` the successor on site ``to``: its site, its generation, its move record. Returns the
    chain as that site sees it (what sbatch is given there)."""
    site = next(s for s in t.store.sites(c.id) if s.cluster == to)
    seg.cluster = to
    seg.extra["move"] = {"from": c.cluster, "to": to, "gen": next_generation(t, c, site), "pred": cur.idx,
                         "phase": AHEAD, "at": now, "decided": choice.as_dict()}
    return span.site_view(c, site)


RECONSIDER_EVERY_S = 300.0  # a successor pending on the chain's site is weighed against the others this often
# Slurm's plan for a job it held back counts this long after it was read (the queue ahead may change)
PLAN_MEMORY_S = 120.0
SQUEUE_START = "slurm squeue --start"  # the source of a pending job's wait: Slurm's plan for it


def weigh_pending(current: site_choice.SiteOption, others: list[site_choice.SiteOption], *, remaining_s: float,
                  margin_s: float, ready_in_s: float, segment_s: float, boundary_s: float) -> site_choice.SiteChoice:
    """The rule on a successor pending on the chain's site (``reconsider``; the replay calls it too,
    sim/site_chain.py): ``current`` waits what Slurm expects for it (``pending_wait_s``), the others
    what a new submission there would; the current site is listed first (a tie stays)."""
    return site_choice.choose_site(current.name, [current, *others], remaining_s=remaining_s, margin_s=margin_s,
                                   ready_in_s=ready_in_s, segment_s=segment_s, boundary_s=boundary_s)


def pending_wait_s(planned_start: float, now: float, fresh_s: float | None = None) -> float:
    """A pending job's wait: Slurm's plan for it (squeue's expected start, from now, never negative),
    no longer than ``fresh_s``, the median wait of the same request submitted there now (the site's
    model on its own, ``own_median_s``: not leaned on Slurm's plan, and not ``sbatch --test-only``,
    which ignores the jobs queued ahead). Slurm plans with every running job taking its whole time
    limit, so its plan is an upper bound that real ends beat; read alone against the other sites'
    medians it made a successor pending behind long-limit jobs look days late and moved chains to a
    cluster 40 % slower (the replay, --pace 0.6), and so did a cap leaned on the same plan. A job
    already queued is no later than a new one."""
    w = max(0.0, planned_start - now)
    return w if fresh_s is None else min(w, max(0.0, fresh_s))


def plan_holds(planned: float, seen_at: float, now: float) -> bool:
    """Slurm's plan for a job of the chain (read at ``seen_at``) still bounds a wait there: it lies
    ahead and is recent (a plan passed, or too old, no longer says anything about the queue)."""
    return planned > now and now - seen_at <= PLAN_MEMORY_S


def work_after_running(c: Chain, segs: list[Segment]) -> float:
    """The work a pending successor is left with: the total less what is credited and what the running
    segment(s) of the chain here should still train to their hand-over points (as ``planning.plan``
    counts them, the pending successor itself left out). ``Chain.remaining_s`` alone still counts the
    running predecessor's work, which at another site's pace would be weighed at the wrong speed."""
    overhead = segment_overhead(c, segs)
    running = [s for s in segs if s.phase == RUNNING and not span.foreign(c, s)]
    expected = sum(sizing.expected_work(expected_training(c, s, overhead), rate=segment_rate(c, s, segs))
                   for s in running)
    return sizing.work_after(c.total_s, c.credited_s, expected)


def reconsider(t: TickContext, c: Chain, segs: list[Segment], now: float) -> bool:
    """A successor already pending on the chain's site, whose queue backed up since it was asked for:
    its wait there (``pending_wait_s``: Slurm's plan for it, squeue's expected start, no longer than the
    site's median for the same request now) against the other sites' waits, by the same rule. When
    another site is expected to finish more than the margin sooner, the pending job is cancelled (it
    never trained) and the next tick plans the successor there. True when it cancelled."""
    from chainrun.chain.cancel import cancel_live

    pending = [s for s in segs if s.phase == PENDING and not span.foreign(c, s) and s.job_id]
    if len(pending) != 1 or now - float(c.extra.get("reconsidered_at") or 0) < RECONSIDER_EVERY_S:
        return False
    succ = pending[0]
    row = next((q for q in t.queue if q.job_id == succ.job_id), None)
    if row is None or row.start is None:  # Slurm has no plan for it: nothing to weigh
        return False
    c.extra["reconsidered_at"] = now
    c.extra.setdefault("planned_start", {})[c.cluster] = [row.start, now]  # Slurm's plan there (wait_estimate)
    running = [s for s in segs if s.phase == RUNNING and not span.foreign(c, s)]
    handover = (running[0].end - c.signal_lead_s) if running and running[0].end else None
    sites = t.store.sites(c.id)
    paces = site_paces(c, segs, [s.cluster for s in sites])
    own = next((s for s in sites if s.cluster == c.cluster), None)
    # the model's answer only: `sbatch --test-only` sees free nodes, not the jobs queued ahead (the plan does)
    fresh = None if own is None else wait_estimate(t, c, own, succ, now, bounded=False, model_only=True)
    cap = None if fresh is None else own_median_s(fresh)
    here = pending_wait_s(row.start, now, cap)
    said = SQUEUE_START if cap is None or here < cap else f"{fresh.model} (its own median), within Slurm's plan"
    ests = {c.cluster: WaitEstimate(seconds=here, model=said, p50=here)}
    others = []
    left_out: dict[str, str] = {}
    for s in sites:
        if s.cluster == c.cluster:
            continue
        est = ests[s.cluster] = wait_estimate(t, c, s, succ, now, left_out=left_out)
        if est is not None:
            others.append(option(c, s.cluster, median_s(est), paces.get(s.cluster)))
    ready_in = max(0.0, handover - now) if handover else 0.0
    choice = weigh_pending(option(c, c.cluster, here, paces.get(c.cluster)), others, remaining_s=work_after_running(c, segs),
                           margin_s=margin_s(c), ready_in_s=ready_in, **boundaries(c, segs))
    choice = with_left_out(choice, left_out)
    if not choice.move:
        t.store.save(c)
        return False
    why = f"cancelled while pending on {c.cluster} (Slurm expects it to start at {_clock(row.start)}): {choice.reason}"
    events = cancel_live(t.slurm, c, [succ], why)
    c.extra["site_choice"] = {**choice.as_dict(), "at": now, "for": succ.idx, "waits": wait_sources(ests),
                              "transfers": transfer_sources(c, [e.name for e in choice.estimates])}
    t.store.save(c, [succ], events + [(succ.idx, "site", f"segment {succ.idx} {why}")])
    return succ.phase not in (PENDING, RUNNING)


def _clock(ts: float) -> str:
    import time as _time

    return _time.strftime("%H:%M", _time.localtime(ts))
