"""What ``squeue --start`` shows for a pending job in the replayed partition: Slurm's backfill plan.

Slurm's backfill walks the pending jobs in priority order and gives each the earliest time at which
enough nodes are free for its whole time limit, counting running jobs as ending at their *limits*
(all it knows: never their true end, which is the future) and every job planned before it as holding
its nodes from its planned start for its limit. The plan of the job asked about is its expected start.

This is a plan, not a promise, in the replay as on a cluster: the replayed partition backfills by
EASY (scheduler.py: only the top blocked job is protected), so a later job may still slip ahead, and
jobs ending before their limits make starts earlier. Pure: it reads the partition's state at ``now``.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Iterator, Sequence


def expected_start(now: float, total_nodes: int, running: Iterable[tuple[float, int]],
                   pending: Sequence[tuple[int, int, float]], jid: int, *, depth: int | None = None,
                   open_at: float = float("-inf")) -> float | None:
    """Slurm's planned start for pending job ``jid``.

    ``running``: (start + limit, nodes) of every running job; ``pending``: (jid, nodes, limit_s) in
    priority order (the job's dependency-held peers are not pending: Slurm plans no held job);
    ``depth``: how many pending jobs the backfill plans (bf_max_job_test), None for all. None when
    ``jid`` is not pending, lies beyond ``depth``, or can never fit (Slurm shows no start: N/A)."""
    for j, start in plan(now, total_nodes, running, pending, depth=depth, open_at=open_at):
        if j == jid:
            return start
    return None


def latest_planned_start(now: float, total_nodes: int, running: Iterable[tuple[float, int]],
                         pending: Sequence[tuple[int, int, float]], *, depth: int | None = None,
                         open_at: float = float("-inf"), counted=lambda jid: True) -> float | None:
    """The latest start ``squeue --start`` shows among the pending jobs ``counted`` keeps (what the
    watcher reads as Slurm's view of the queue ahead: chainrun.predict.doubt.queue_ahead), or None
    when none of them has a plan. One pass over the whole plan."""
    latest = None
    for j, start in plan(now, total_nodes, running, pending, depth=depth, open_at=open_at):
        if start is not None and counted(j):
            latest = start if latest is None else max(latest, start)
    return latest


def plan(now: float, total_nodes: int, running: Iterable[tuple[float, int]],
         pending: Sequence[tuple[int, int, float]], *, depth: int | None = None,
         open_at: float = float("-inf")) -> Iterator[tuple[int, float | None]]:
    """(jid, planned start or None) for the pending jobs in priority order, up to ``depth``."""
    earliest = max(now, open_at)
    ends = sorted((max(float(e), earliest), int(n)) for e, n in running)
    free = int(total_nodes) - sum(n for _, n in ends)
    # the free-node profile: free[i] nodes on [ts[i], ts[i+1]) (the last step lasts for ever)
    ts, fr = [earliest], [free]
    for e, n in ends:
        free += n
        if e == ts[-1]:
            fr[-1] = free
        else:
            ts.append(e)
            fr.append(free)
    for k, (j, nodes, limit) in enumerate(pending):
        if depth is not None and k >= depth:
            return
        if nodes > total_nodes:  # never fits: Slurm plans no start for it (nor reserves anything)
            yield j, None
            continue
        i = _earliest_fit(ts, fr, nodes, float(limit))
        yield j, ts[i]
        _reserve(ts, fr, i, ts[i] + float(limit), nodes)


def _earliest_fit(ts: list[float], fr: list[int], nodes: int, limit: float) -> int:
    """The first step at which ``nodes`` stay free for ``limit`` seconds (the last step always fits)."""
    i, n = 0, len(ts)
    while True:
        end = ts[i] + limit
        k = i
        while k < n and ts[k] < end and fr[k] >= nodes:
            k += 1
        if k == n or ts[k] >= end:
            return i
        i = k + 1  # step k is short of nodes: no start before its end fits


def _reserve(ts: list[float], fr: list[int], i: int, end: float, nodes: int) -> None:
    """Take ``nodes`` from step ``i``'s start until ``end``, splitting the step that ``end`` falls in."""
    k = bisect_left(ts, end)
    if k == len(ts) or ts[k] != end:
        ts.insert(k, end)
        fr.insert(k, fr[k - 1])
    for m in range(i, k):
        fr[m] -= nodes
