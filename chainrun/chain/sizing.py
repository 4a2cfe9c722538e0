"""Whether to plan a chain's next segment, and how much it must carry: one implementation for the
watcher (``planning.plan`` and ``planning.submit_next``) and the whole-chain replay
(``chainrun/sim/chains.py``), so the replay measures what the watcher does.

Pure arithmetic on numbers both callers read from their own records. Work is ``--total``'s unit:
seconds of training at the chain's reference shape. Two inputs exist only in the replay, because
it models what the watcher cannot see; the watcher passes 0 for both:

- ``restart_s``: the first minutes of every segment's training are lost compute (the replay's
  work excludes them; the watcher's ``--total`` counts them as training);
- the hand-off minutes a successor waits while its predecessor saves (``left_if_cut``'s
  ``handoff_s``): the watcher credits them to the predecessor, whose payload runs until it has
  saved; the replay adds them to the work the successor must carry.
"""

from __future__ import annotations

from chainrun.chain.policies import cut_allowance
from chainrun.durations import to_slurm_minutes

MIN_SEGMENT_S = 60  # Slurm's --time granularity: the shortest segment worth planning

# what plan_gate says to do this tick
WAIT = "wait"  # plan nothing
FINISH = "finish"  # nothing is live and the chain is done: complete it
FIRST = "first"  # nothing is live: submit the next segment now, for all the work left
ASK = "ask"  # one live segment with work left after it: ask the chain's policy when to submit


def plan_gate(*, live: int, work_after_s: float, tolerance_s: float, unconfirmed: bool = False,
              stopping: bool = False, done_marker: bool = False) -> str:
    """The planning gate. ``live``: the chain's queued and running segments; ``work_after_s``: the
    work left once they train to their hand-over points (``work_after``); ``unconfirmed``: a
    submission not yet seen in Slurm (wait for adoption before planning more); ``stopping``: the
    trainer was told to stop at ``--total``; ``done_marker``: the payload said training is finished
    (``CHAINRUN_DONE_FILE`` exists): nothing more is ever planned, and with nothing live the chain
    is complete."""
    if unconfirmed or stopping:
        return WAIT
    if done_marker:
        return FINISH if live == 0 else WAIT
    if live == 0:
        return FINISH if work_after_s < tolerance_s else FIRST
    if live > 1 or work_after_s < tolerance_s:
        return WAIT
    return ASK


def may_submit(*, left_if_cut_s: float, tolerance_s: float, done_marker: bool = False) -> bool:
    """The last check before a successor is submitted while a segment trains: never once the payload
    said it is done, nor once the work done so far reaches ``--total`` (within the tolerance): the
    live segment is then the last one, whatever the policy thinks of the queue."""
    return not done_marker and left_if_cut_s >= tolerance_s


def expected_work(training_s: float, *, rate: float = 1.0, restart_s: float = 0.0) -> float:
    """The work a live segment still delivers if it trains ``training_s`` (to its hand-over point):
    at its shape's ``rate``, less its restart."""
    return rate * max(0.0, training_s - restart_s)


def work_after(total_s: float, done_s: float, expected_s: float) -> float:
    """The work left once the live segments deliver ``expected_s`` (``expected_work``) on top of the
    ``done_s`` the ended ones delivered."""
    return total_s - done_s - expected_s


def left_if_cut(total_s: float, done_s: float, trained_s: float, *, rate: float = 1.0, restart_s: float = 0.0,
                handoff_s: float = 0.0, next_rate: float = 1.0) -> float:
    """The work an early successor must carry: what is left as if the live segment (``trained_s`` of
    training so far at ``rate``; nothing before it starts) stopped now. Sized for the hand-over point
    instead, a successor that starts early and cuts its predecessor is too short: a spiral.
    ``handoff_s``: the save minutes the successor (of rate ``next_rate``) waits, replay only."""
    return total_s - done_s - rate * max(0.0, trained_s - restart_s) + handoff_s * next_rate


def segment_limit(work_s: float, *, segment_s: float, signal_lead_s: float, rate: float = 1.0,
                  restart_s: float = 0.0) -> float:
    """The limit asked for a segment that must deliver ``work_s``: the training it needs at its
    shape's ``rate`` (at least a minute), plus its restart and the signal lead, in whole minutes
    (what Slurm grants), at most a segment."""
    wanted = max(work_s / rate, MIN_SEGMENT_S) + restart_s + signal_lead_s
    return min(segment_s, to_slurm_minutes(int(wanted)) * 60)


def slack_allowance(work_after_s: float, *, segment_s: float, overhead_s: float, handoff_s: float,
                    restart_s: float = 0.0) -> float:
    """The ``slack`` rule's allowance at this boundary (``cut_allowance``): the work left after the
    live segment, what a later full segment trains (its limit less the per-segment overhead and
    restart) and the hand-off minutes a cut costs."""
    return cut_allowance(work_after_s, segment_s - overhead_s - restart_s, handoff_s)


def planned_segments(total_s: float, *, segment_s: float, overhead_s: float, tolerance_s: float) -> int:
    """How many segments ``--total`` needs if none waits in the queue or is cut: as the gate plans
    them, one more while the work left after the live one reaches the tolerance, each training its
    limit less the per-segment overhead (the signal lead before anything was measured). The plan
    ``submit`` prints; queue waits, early signals and hand-offs can add more."""
    full = expected_work(max(float(segment_s) - float(overhead_s), float(MIN_SEGMENT_S)))
    n, left = 1, work_after(total_s, 0.0, full)
    while left >= tolerance_s:
        n, left = n + 1, work_after(left, 0.0, full)
    return n
