"""The adaptive hand-off as shipped: the watcher decides, the wrapper compares numbers.

``chainrun.chain.handoff_rule.wait_instead_of_cut`` says, for one wait, whether a successor that
started before its predecessor's hand-over point should wait for it or cut it. Only the watcher
knows what the rule needs (the work left, a segment's capacity, the measured hand-off minutes,
the cost of a boundary); the wrapper on the compute node knows the clock and the control files,
and chainrun need not be installed there. So the watcher turns the rule into **wait windows**
(``wait_windows``: every whole number of seconds between the successor's start and the
predecessor's hand-over point for which the rule says wait, as a few ``[lo, hi]`` ranges) and
writes them to ``control/handoff-rule.<successor's segment>`` before the successor is submitted
(so a job that starts at once finds them) and again on every tick while it is queued when they
change. The predecessor's wrapper records its real end (``end_time``) in its state file and the
rule file carries the chain's signal lead, so the successor's wrapper knows the hand-over point
(end less lead); it waits without asking for the hand-off when the time to it falls in a window,
else it cuts as before; without a rule file (or one made for another predecessor job) it behaves
exactly as before. The whole-chain replay's adaptive
variant asks the same two functions (``windows_for`` and ``should_wait``).

Waiting never claims the chain: the ownership protocol (docs/checkpoint-contract.md) is unchanged,
so a waiting successor still takes over the moment its predecessor releases the chain or Slurm
reports its job ended (it stopped early, crashed, was cancelled, or ignored the signal).
"""

from __future__ import annotations

import logging
import math
import statistics

from chainrun.chain import pace
from chainrun.chain.handoff_rule import wait_instead_of_cut
from chainrun.errors import ChainrunError
from chainrun.runner.base import Runner
from chainrun.state.records import ENDED, PENDING, RUNNING, SUBMITTING, Chain, Segment

log = logging.getLogger(__name__)

RULE_KIND = "handoff-rule"
# the successor's wrapper notices a hand-off request within 2 s and polls for the release every 1 s
POLL_S = 3.0
MAX_BREAKPOINTS = 20_000  # a guard: absurd inputs (a 1 s segment, a 10-year limit) cannot hang a tick

Window = tuple[int, int]


def boundary_cost(restart_s: float, handoff_s: float, lead_s: float) -> float:
    """What one more segment boundary costs on the chain's nodes: its restart, its hand-off and an
    expected queue gap (the chain's --lead: how early the chain plans to ask, i.e. what it expects
    a successor to wait)."""
    return max(0.0, restart_s) + max(0.0, handoff_s) + max(0.0, lead_s)


def wait_windows(*, handoff_s: float, remaining_s: float, capacity_s: float, full_capacity_s: float,
                 boundary_cost_s: float, max_wait_s: float) -> list[Window]:
    """Every whole second ``w`` in ``[0, max_wait_s]`` with ``wait_instead_of_cut(w, ...)`` true, as
    sorted, disjoint ``[lo, hi]`` ranges (inclusive). Exact, not sampled: the rule is constant
    between its breakpoints (where a segment count or the cost test changes), so it is evaluated
    at each breakpoint's whole second and once in each stretch between them."""
    top = int(math.floor(max(0.0, max_wait_s)))
    args = dict(handoff_s=handoff_s, remaining_s=remaining_s, capacity_s=capacity_s,
                full_capacity_s=full_capacity_s, boundary_cost_s=boundary_cost_s)
    F, R, C, H, B = max(full_capacity_s, 1.0), remaining_s, capacity_s, handoff_s, boundary_cost_s
    if top / F > MAX_BREAKPOINTS or (B > 0 and top / B > MAX_BREAKPOINTS):
        top = int(min(top, MAX_BREAKPOINTS * min(F, B if B > 0 else F)))
    bps = [0.0, float(top), H, C - R, C + H - R, C + H]

    def multiples(base: float) -> None:  # base + k F inside [0, top]
        for k in range(math.ceil(-base / F), math.floor((top - base) / F) + 1):
            bps.append(base + k * F)

    multiples(max(C, 0.0) - R)  # the cut's segment count changes
    multiples(C + H - R)  # the wait's segment count changes
    if B > 0:
        bps += [H + B * d for d in range(1, math.floor((top - H) / B) + 2)]  # the cost test flips
    cand = sorted({int(math.floor(b)) for b in bps if 0 <= b <= top} | {0, top})
    points = []
    for a, b in zip(cand, cand[1:] + [top + 1]):
        points.append((a, a))
        if b - a > 1:  # the rule is the same on every whole second strictly between two candidates
            points.append((a + 1, b - 1))
    out: list[Window] = []
    for lo, hi in points:
        if not wait_instead_of_cut(float(lo), **args):
            continue
        if out and out[-1][1] == lo - 1:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def windows_for(*, remaining_s: float, successor_capacity_s: float, full_capacity_s: float, handoff_s: float,
                restart_s: float, lead_s: float) -> list[Window]:
    """The wait windows for one successor, from the chain's numbers (the watcher's and the replay's
    one entry point).

    ``remaining_s``: work left once the predecessor trains to its hand-over point.
    ``successor_capacity_s``: what the successor trains if it starts training the moment it starts.
    ``full_capacity_s``: what a later full segment trains. ``handoff_s``: the hand-off minutes (a cut
    stops the predecessor and the successor trains that much later). ``restart_s`` and ``lead_s``:
    the rest of a boundary's cost. A successor never waits past its own capacity (its time limit
    runs while it waits: it would reach its own signal before the hand-over point).
    """
    cap_cut = successor_capacity_s - handoff_s
    return wait_windows(handoff_s=handoff_s, remaining_s=remaining_s, capacity_s=cap_cut,
                        full_capacity_s=full_capacity_s, boundary_cost_s=boundary_cost(restart_s, handoff_s, lead_s),
                        max_wait_s=max(0.0, successor_capacity_s))


def should_wait(wait_s: float, windows: list[Window]) -> bool:
    """What the wrapper does with the windows: whole seconds, a hand-over point already passed
    counts as 0 (the predecessor is stopping on its own signal)."""
    w = max(0, int(math.floor(wait_s)))
    return any(lo <= w <= hi for lo, hi in windows)


# ---------------------------------------------------------------------------------- the watcher
def measured_handoff_s(c: Chain, segs: list[Segment]) -> float:
    """How long a hand-off takes this chain: the median time its payloads took from the signal to
    their exit (the checkpoint), plus the wrappers' polling; the signal lead (the time the user
    gives a checkpoint) until one has been measured."""
    seen = []
    for s in segs:
        a, b = s.extra.get("signal_at"), s.extra.get("payload_end")
        if s.phase == ENDED and a not in (None, "") and b is not None:
            try:
                seen.append(max(0.0, float(b) - float(a)))
            except ValueError:
                continue
    return statistics.median(seen[-5:]) + POLL_S if seen else float(c.signal_lead_s)


def rule_numbers(c: Chain, segs: list[Segment], cur: Segment, nxt: Segment) -> dict:
    """The rule's inputs for ``nxt`` taking over from ``cur``, in seconds of the successor's training
    (--total counts training, so a restart is inside it and the only "restart" the watcher sees is
    the per-segment overhead beyond the signal lead; with --shapes the work left is converted at the
    successor's rate, and a wait is counted as if the predecessor trained at that rate too)."""
    overhead = pace.segment_overhead(c, segs)

    def work(s: Segment) -> float:  # as planning.plan counts it: --shapes count work at the reference shape
        return pace.expected_training(c, s, overhead) * pace.segment_rate(c, s, segs)

    live = [s for s in segs if s.phase in (SUBMITTING, PENDING, RUNNING) and s is not nxt and s.idx <= cur.idx]
    handoff = measured_handoff_s(c, segs)
    left = c.total_s - c.credited_s - sum(work(s) for s in live)
    return {
        "remaining_s": left / max(pace.segment_rate(c, nxt, segs), 1e-6),  # in the successor's training
        "successor_capacity_s": pace.expected_training(c, nxt, overhead),
        "full_capacity_s": max(1.0, c.segment_s - overhead),
        "handoff_s": handoff,
        "restart_s": max(0.0, overhead - c.signal_lead_s),
        "lead_s": float(c.lead_s),
    }


def rule_text(for_job: str, signal_lead_s: int, windows: list[Window], numbers: dict) -> str:
    """The control file: ``for_job`` (the predecessor job it applies to), ``signal_lead`` (its
    hand-over point is the ``end_time`` its state file records less this), one ``wait=LO HI`` line
    per window, and the rule's inputs, for a person reading the control folder."""
    lines = [f"for_job={for_job}", f"signal_lead={int(signal_lead_s)}"] + [f"wait={lo} {hi}" for lo, hi in windows]
    lines += [f"{k}={v:.0f}" for k, v in numbers.items()]
    return "\n".join(lines) + "\n"


def parse_rule(text: str) -> tuple[str, list[Window]]:
    """(for_job, windows) from a rule file, as the wrapper reads it."""
    job, windows = "", []
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k == "for_job" and not job:
            job = v.strip()
        elif k == "wait":
            parts = v.split()
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                windows.append((int(parts[0]), int(parts[1])))
    return job, windows


def rule_path(c: Chain, idx: int) -> str:
    return f"{c.run_dir}/control/{RULE_KIND}.{idx}"


def write_rule(runner: Runner, c: Chain, segs: list[Segment], nxt: Segment) -> None:
    """Write (or refresh) the rule file for ``nxt``, the successor of the chain's live segment.
    Nothing to do without a live predecessor with a job id; written only when it changes. A failed
    write is logged, not raised: without the file the wrapper cuts, as before."""
    before = [s for s in segs if s is not nxt and s.idx < nxt.idx and s.job_id
              and s.phase in (PENDING, RUNNING)]
    if not before or nxt.phase not in (SUBMITTING, PENDING):
        return
    cur = max(before, key=lambda s: s.idx)
    if cur.extra.get("filler"):  # a filler (docs/elastic.md) trains slower: its successor always cuts it
        return
    numbers = rule_numbers(c, segs, cur, nxt)
    windows = windows_for(**numbers)
    key = {"for_job": cur.job_id, "windows": [list(w) for w in windows]}
    if nxt.extra.get("handoff_rule") == key:
        return
    try:
        runner.write_file(rule_path(c, nxt.idx), rule_text(cur.job_id, c.signal_lead_s, windows, numbers))
    except (OSError, ChainrunError) as e:  # the cluster is unreachable: the next tick tries again
        log.info("hand-off rule of %s segment %s not written: %s", c.id, nxt.idx, e)
        return
    nxt.extra["handoff_rule"] = key


def refresh(runner: Runner, c: Chain, segs: list[Segment]) -> None:
    """Every tick: keep the rule of a queued successor current (the work left changes as segments end)."""
    for s in segs:
        if s.phase == PENDING and s.job_id:
            write_rule(runner, c, segs, s)
