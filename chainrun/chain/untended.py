"""What a chain does while nothing ticks it, read from the store alone.

A chain's state lives in the store of the machine that drives it (docs/remote-clusters.md,
"Where a chain's state lives"). When that machine sleeps, or a cluster needs a human to log in
again, Slurm still runs what is queued and the wrappers still hand off, but nothing submits the
next segment. ``status`` then says since when the chain's cluster was last ticked and what
happens next: which queued segments start anyway, and by when the next one needs a tick.

Each watcher tick records, per cluster, when it last reached the cluster and since when its ticks
fail (the store's ``meta`` table, one key per cluster: no migration). A failure that only a human
can fix (a login with MFA, a host key) is notified once, remembered here until a tick reaches the
cluster again: a scheduled tick every 5 minutes must not send a message every 5 minutes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from chainrun.state.records import ACTIVE, LIVE_PHASES, PENDING, RUNNING, SUBMITTING, Chain, Segment

KEY_PREFIX = "ticks."  # + cluster name
# no tick for this long and `status` says so: three periods of the default schedule (every 5 min),
# so a scrontab tick that queued a little or one failed connection does not raise it
STALE_S = 900.0


@dataclass(frozen=True)
class ClusterTicks:
    """The watcher's record of one cluster."""

    cluster: str
    ok_at: float | None = None  # the last tick that reached the cluster and read Slurm
    failed_since: float | None = None  # the first failed tick after ok_at (None: the last tick worked)
    failed_at: float | None = None  # the latest failed tick
    error: str = ""  # why the latest tick failed, one line
    needs_human: bool = False  # the failure waits for a person (log in again, a host key): notified once
    notified: bool = False  # that failure was notified; cleared when a tick reaches the cluster again


def _key(cluster: str) -> str:
    return KEY_PREFIX + cluster


def read_all(store) -> dict[str, ClusterTicks]:
    """Every cluster's record (an unreadable one is left out: it only feeds what `status` says)."""
    with store.reading():
        rows = store.db.execute("SELECT key, value FROM meta WHERE key LIKE ?", (KEY_PREFIX + "%",)).fetchall()
    out = {}
    for key, value in rows:
        name = key[len(KEY_PREFIX):]
        try:
            d = json.loads(value)
            out[name] = ClusterTicks(cluster=name, **{k: d[k] for k in d if k in ClusterTicks.__dataclass_fields__
                                                       and k != "cluster"})
        except (ValueError, TypeError):
            continue
    return out


def _write(db, t: ClusterTicks) -> None:
    db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
               (_key(t.cluster), json.dumps({k: v for k, v in asdict(t).items() if k != "cluster"})))


def record(store, cluster: str, *, ok: bool, error: str = "", needs_human: bool = False,
           now: float | None = None) -> ClusterTicks:
    """One tick of ``cluster``: reached (``ok``) or failed with ``error``. Returns the new record."""
    now = time.time() if now is None else now
    with store.tx() as db:
        row = db.execute("SELECT value FROM meta WHERE key=?", (_key(cluster),)).fetchone()
        try:
            old = json.loads(row[0]) if row else {}
        except ValueError:
            old = {}
        if ok:
            t = ClusterTicks(cluster, ok_at=now)
        else:
            t = ClusterTicks(cluster, ok_at=old.get("ok_at"), failed_since=old.get("failed_since") or now,
                             failed_at=now, error=error.splitlines()[0] if error else "", needs_human=needs_human,
                             notified=bool(old.get("notified")))  # told once until reached again
        _write(db, t)
    return t


def to_notify(store) -> list[ClusterTicks]:
    """Clusters waiting for a person that were not notified yet."""
    return [t for t in read_all(store).values() if t.needs_human and not t.notified]


def mark_notified(store, cluster: str) -> None:
    with store.tx() as db:
        row = db.execute("SELECT value FROM meta WHERE key=?", (_key(cluster),)).fetchone()
        if row is None:
            return
        d = json.loads(row[0])
        d["notified"] = True
        db.execute("UPDATE meta SET value=? WHERE key=?", (json.dumps(d), _key(cluster)))


# ---------------------------------------------------------------------------- the outlook
@dataclass(frozen=True)
class Outlook:
    """What happens to an active chain from now on if nothing ticks it."""

    last_tick: float | None  # the last tick that reached the chain's cluster (None: none recorded)
    stale: bool  # nothing reached the cluster for STALE_S, or its ticks fail: `status` says so
    failing: str  # why the cluster's ticks fail ("" when the last one worked)
    failing_since: float | None
    running: int | None  # the running segment, if any
    queued: tuple[int, ...]  # queued segments: Slurm starts them without a tick
    unconfirmed: tuple[int, ...]  # submissions not yet seen in Slurm: a tick adopts or resubmits them
    needs_tick: int | None  # the next segment, which only a tick can submit (None: the live ones finish the chain)
    tick_before: float | None  # the latest moment the policy plans that submission (now or past: overdue)
    stops_at: float | None  # without a tick, the chain trains until here (the last live segment's end)

    def to_dict(self) -> dict:
        return asdict(self)


def outlook(chain: Chain, segs: list[Segment], ticks: ClusterTicks | None, now: float | None = None) -> Outlook | None:
    """The outlook of an active chain (None for a finished one).

    The times are the earliest the store allows, so a tick before ``tick_before`` is in time
    whatever the queue does: a queued segment may start now (or, behind a dependency, when its
    predecessor ends) and then runs to its limit. ``tick_before`` is when the chain's policy
    submits the next segment at the latest: the hand-over point less ``--lead`` (`lead`;
    `predicted`, whose model only moves it earlier), as soon as the last live segment is alone
    (`dependency`), or at its end (`reactive`)."""
    if chain.status != ACTIVE:
        return None
    now = time.time() if now is None else now
    last = ticks.ok_at if ticks else None
    failing = ticks.error if ticks and ticks.failed_since and (last is None or ticks.failed_since >= last) else ""
    since = ticks.failed_since if failing else None
    stale = bool(failing) or now - (last if last is not None else chain.created) > STALE_S
    live = sorted((s for s in segs if s.phase in LIVE_PHASES), key=lambda s: s.idx)
    running = next((s.idx for s in live if s.phase == RUNNING), None)
    queued = tuple(s.idx for s in live if s.phase == PENDING)
    unconfirmed = tuple(s.idx for s in live if s.phase == SUBMITTING)
    start = end = None
    for s in live:  # the earliest each live segment starts and ends, in order
        limit = float(s.extra.get("granted_s") or s.time_limit_s)
        if s.phase == RUNNING:
            start = s.start or now
            end = s.end or (start + limit)
        else:
            start = max(now, end) if (end is not None and s.dependency) else now
            end = start + limit
    needs = (max(s.idx for s in segs) + 1) if segs else 0
    if live and _covers_the_rest(chain, segs, live):  # the last segment: training ends without a tick
        return Outlook(last_tick=last, stale=stale, failing=failing, failing_since=since, running=running,
                       queued=queued, unconfirmed=unconfirmed, needs_tick=None, tick_before=None, stops_at=end)
    if not live:  # nothing queued: the chain waits for a tick now (it has since its last segment ended)
        ended = [s.end for s in segs if s.end]
        before, stops = (max(ended) if ended else chain.created), None
    else:
        stops = end
        if chain.policy == "reactive":
            before = end
        elif chain.policy == "dependency":
            before = start  # alone once its predecessor ended, i.e. when it starts
        else:
            before = max(start, end - chain.signal_lead_s - chain.lead_s)
    return Outlook(last_tick=last, stale=stale, failing=failing, failing_since=since, running=running,
                   queued=queued, unconfirmed=unconfirmed, needs_tick=needs, tick_before=before, stops_at=stops)


def _covers_the_rest(chain: Chain, segs: list[Segment], live: list[Segment]) -> bool:
    """Whether the live segments, trained to their hand-over points, reach --total: the engine's own
    planning gate (engine._plan) then submits nothing more."""
    from chainrun.chain import sizing
    from chainrun.chain.pace import expected_training, segment_overhead, segment_rate, total_tolerance

    overhead = segment_overhead(chain, segs)
    expected = sum(sizing.expected_work(expected_training(chain, s, overhead), rate=segment_rate(chain, s, segs))
                   for s in live)
    return sizing.work_after(chain.total_s, chain.credited_s, expected) < total_tolerance(chain)
