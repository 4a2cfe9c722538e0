"""One segment boundary of a replayed chain, accounted the same way on one cluster
(``chains._Chain.run``) and between two segments on the same cluster of a chain spanning several
(``site_chain``; a move between clusters has its own accounting, ``site_chain.move``).

``cur`` trains until its hand-over point ``h``; its successor ``nxt`` started at ``bn``. Whenever
``cur`` stops training, at its signal or when asked to, it saves its checkpoint and exits
``work.save_s`` later, and the successor trains from that checkpoint only once it is written:
- **late** (``bn >= h``): ``cur`` stopped at ``h`` and exits at ``h + save_s``; the chain queued
  ``bn - h``, and a successor that started before that exit waits for it (hand-off minutes, its
  nodes held twice);
- **early, waited for**: the watcher's adaptive rule (``handoff_plan.should_wait``) holds the
  successor idle until ``h`` and the save after it (its nodes are held twice meanwhile);
- **early, handed off**: ``cur`` is asked to stop at ``bn``, saves and exits ``save_s`` later
  (its job is cut there, through ``cut``); the successor trains from then.
Before, the save at the signal was free (the job ended at ``h``) while the one at a hand-off was
charged, which flattered every rule that lets the successor start late, the oracle included.
"""

from __future__ import annotations

from collections.abc import Callable


def stop(cur, h: float, bn: float, work, *, waited: bool = False) -> None:
    """Where ``cur`` stops training and when its payload exits, on one cluster or at a move: at
    ``bn`` when its successor, started before ``h``, cuts it (unless the successor ``waited``), else
    at its signal ``h``; either way its last save takes ``work.save_s``."""
    cur.stop = bn if bn < h and not waited else h
    cur.exit = cur.stop + work.save_s


def hand_over(run, cur, nxt, h: float, bn: float, work, *, adaptive: bool, left_after: float,
              full_capacity_s: float, lead_s: float, cut: Callable[[int, float], None]) -> None:
    """Set ``cur.stop``/``cur.exit`` and ``nxt.train_start`` and charge the boundary to ``run``
    (queue, hand-off, nodes held twice, and the ``(gap, work cut)`` pair of ``boundaries``: the gap is
    the successor's start after ``cur``'s end at its signal, ``h + save_s``, when the job would end).
    ``adaptive``: the rule may wait for ``h`` (``--adaptive-handoff`` on, and ``cur`` no filler)."""
    from chainrun.chain.handoff_plan import should_wait, windows_for

    w = work
    gap = bn - (h + w.save_s)
    if bn >= h:
        stop(cur, h, bn, w)
        nxt.train_start = max(bn, cur.exit)
        run.queue_s += bn - h
        run.handoff_s += nxt.train_start - bn
        run.twice_node_s += (nxt.train_start - bn) * nxt.nodes
        run.boundaries.append((gap, 0.0))
        return
    wait = h - bn
    cap = nxt.limit - w.signal_lead_s - w.restart_s  # what it trains if it trains at once
    # (the rule reads the work left in the successor's training seconds: its shape's rate)
    if adaptive and should_wait(wait, windows_for(
            remaining_s=left_after / nxt.rate, successor_capacity_s=cap, full_capacity_s=full_capacity_s,
            handoff_s=w.handoff_s, restart_s=w.restart_s, lead_s=lead_s)):
        stop(cur, h, bn, w, waited=True)
    else:
        stop(cur, h, bn, w)
        cut(cur.jid, cur.exit)
    nxt.train_start = cur.exit
    run.handoff_s += cur.exit - cur.stop
    run.twice_node_s += (cur.exit - bn) * nxt.nodes
    run.boundaries.append((gap, max(0.0, h - cur.exit)))


def close(run, cur, work) -> float:
    """``cur`` has stopped: the work it trained (in the chain's units), its restart charged only as
    far as it ran (fair share can start a successor minutes after its predecessor, so a segment may
    stop before its restart is over: the overhead still splits exactly), its slowness to ``run``."""
    trained = max(0.0, cur.stop - cur.train_start - work.restart_s)
    run.restart_s -= work.restart_s - min(work.restart_s, max(0.0, cur.stop - cur.train_start))
    run.slow_s += (1.0 - cur.rate) * trained
    return cur.rate * trained
