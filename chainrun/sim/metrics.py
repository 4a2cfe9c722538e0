"""From transitions to the numbers in the table: interruption, overlap, zero share, by load.

Signed gap = successor start - predecessor end. Without hand-off the predecessor always runs
to its limit, so an early successor holds its nodes idle until then (overlap = -gap). With
hand-off the predecessor checkpoints and exits ``handoff_s`` after the successor starts, so
the overlap is at most the hand-off time, and the predecessor's unused time ("cut") moves to
the end of the chain: the same training, a little later, in one more (short) segment.
Load levels follow Mirage: the reactive gap of the same injection <= 2 h low, <= 12 h medium,
else heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from chainrun.sim.experiment import Transition
from chainrun.sim.policies import Report

ZERO_S = 60.0
LOAD_LEVELS = ("low", "medium", "heavy")


@dataclass(frozen=True)
class Gap:
    load: str
    gap_s: float  # signed, as counted for this report (hand-off caps the overlap)
    overlap_s: float
    cut_s: float
    gpu_h_twice: float


def load_level(reactive_gap_s: float) -> str:
    if reactive_gap_s <= 2 * 3600:
        return "low"
    if reactive_gap_s <= 12 * 3600:
        return "medium"
    return "heavy"


def gaps_for(report: Report, transitions: list[Transition], loads: dict, *, handoff_s: float,
             gpus_per_node: int) -> list[Gap]:
    out = []
    for tr in transitions:
        if tr.rule != report.rule or tr.start != tr.start:
            continue
        raw = tr.start - tr.pred_end
        cut = 0.0
        if raw < 0 and report.handoff:
            overlap = min(handoff_s, -raw)
            cut = -raw - overlap
            gap = -overlap
        else:
            gap = raw
            overlap = max(0.0, -raw)
        out.append(Gap(loads[(tr.t0, tr.nodes)], gap, overlap, cut, overlap / 3600 * tr.nodes * gpus_per_node))
    return out


def summarize(gaps: list[Gap]) -> dict:
    n = len(gaps)
    if n == 0:
        return {"transitions": 0, "mean_interruption_h": None, "mean_overlap_h": None,
                "zero_interruption_share": None, "gpu_hours_twice": 0.0, "mean_cut_h": None}
    return {
        "transitions": n,
        "mean_interruption_h": sum(max(0.0, g.gap_s) for g in gaps) / n / 3600,
        "mean_overlap_h": sum(g.overlap_s for g in gaps) / n / 3600,
        "zero_interruption_share": sum(g.gap_s <= ZERO_S for g in gaps) / n,
        "gpu_hours_twice": sum(g.gpu_h_twice for g in gaps),
        "mean_cut_h": sum(g.cut_s for g in gaps) / n / 3600,
    }


def policy_table(reports: list[Report], transitions: list[Transition], *, handoff_s: float,
                 gpus_per_node: int) -> tuple[dict, dict]:
    """({report name: summary with by_load}, {report name: [Gap]})."""
    loads = {}
    for tr in transitions:
        if tr.rule == "reactive":
            loads[(tr.t0, tr.nodes)] = load_level(tr.start - tr.pred_end if tr.start == tr.start else float("inf"))
    table, all_gaps = {}, {}
    for rep in reports:
        gaps = gaps_for(rep, [t for t in transitions if (t.t0, t.nodes) in loads], loads,
                        handoff_s=handoff_s, gpus_per_node=gpus_per_node)
        row = summarize(gaps)
        row["by_load"] = {lv: summarize([g for g in gaps if g.load == lv]) for lv in LOAD_LEVELS}
        table[rep.name] = row
        all_gaps[rep.name] = gaps
    return table, all_gaps
