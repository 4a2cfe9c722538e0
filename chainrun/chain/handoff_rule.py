"""Adaptive hand-off: should a successor that started before its predecessor's hand-over point
wait for it, or cut it (ask it to checkpoint and exit now)?

A pure function, shared by the whole-chain replay (chainrun.sim.chains) and, once wired, by the
wrapper and the watcher. Both choices cost the chain the same training capacity except for the
hand-off minutes (the successor's time limit runs while it waits, so waiting eats the successor's
time exactly as a cut eats the predecessor's), so the choice is about GPU time:

- waiting holds the successor's nodes idle for ``wait_s`` (the time left to the hand-over point);
- cutting holds both for ``handoff_s`` and loses those minutes of training, which can push the
  chain into one more segment, and a segment boundary costs ``boundary_cost_s`` (its restart,
  its hand-off, its expected queue gap).

Wait when it costs less: ``wait_s <= handoff_s`` (a cut would save nothing), or when the cut
needs one more segment than waiting does and the idle time is shorter than that boundary.
"""

from __future__ import annotations

import math


def segments_needed(remaining_s: float, first_capacity_s: float, capacity_s: float) -> int:
    """Segments still needed for ``remaining_s`` of work: the next one trains ``first_capacity_s``,
    every later one ``capacity_s`` (> 0)."""
    if remaining_s <= first_capacity_s:
        return 1
    return 1 + math.ceil((remaining_s - max(first_capacity_s, 0.0)) / max(capacity_s, 1.0))


def wait_instead_of_cut(wait_s: float, *, handoff_s: float, remaining_s: float, capacity_s: float,
                        full_capacity_s: float, boundary_cost_s: float) -> bool:
    """True: the successor waits for its predecessor's hand-over point; False: it cuts.

    ``wait_s``: time from the successor's start to the predecessor's hand-over point.
    ``remaining_s``: work left after the predecessor if it trains to its hand-over point.
    ``capacity_s``: what the successor trains if it starts training now (cut, after the hand-off).
    ``full_capacity_s``: what a later full segment trains.
    ``boundary_cost_s``: what one more segment boundary costs in time on the chain's nodes.
    """
    if wait_s <= handoff_s:
        return True
    # cut: the predecessor stops now, the hand-off minutes are lost, the successor trains `capacity_s`
    n_cut = segments_needed(remaining_s + wait_s, capacity_s, full_capacity_s)
    # wait: the predecessor trains on; the successor's limit runs meanwhile, it trains what is left of it
    n_wait = segments_needed(remaining_s, capacity_s + handoff_s - wait_s, full_capacity_s)
    if n_cut > n_wait:
        return wait_s - handoff_s < boundary_cost_s * (n_cut - n_wait)
    return False
