"""Placement from the user's side: stragglers (PAL) and interference (MARL), as pure rules.

A data-parallel job runs at its slowest GPU. chainrun sees every segment's pace (the progress
contract, chain/progress.py) per rank and node, and can only change what the next segment asks
for (``chain.extra["adapt"]``, merged by chain/request.py). The rules are pure functions of the
segments' recorded progress; the engine calls :func:`after_segment` when a segment ends and
records every change as an event. docs/placement.md states the rules and their evidence.

The straggler rule, per node, on the step time (the rank's reported compute seconds of a step,
else the interval between its lines; a node counts as its slowest rank):

- a segment *measures* a node when it has at least :data:`MIN_STEPS` step times there; its
  figure is the median step time, its noise the median absolute deviation (robust to the odd
  slow step: a checkpoint, a data-loader hiccup);
- multi-node segment: each node against the median of the segment's other nodes (same job,
  same moment, so the pace of the data or the code cancels out); one-node chain: the node's
  segments against the chain's segments on other nodes;
- the node is *slow in a segment* when it is at least :data:`SLOW_RATIO` slower (8 %) and the
  difference is at least :data:`Z_MIN` standard errors (so a short noisy segment proves nothing);
- it is excluded when it was slow in its last :data:`PERSIST` (2) measured segments, or once
  when it is grossly slow (:data:`GROSS_RATIO`, 30 %, at :data:`GROSS_Z` standard errors).

bench/straggler_rule.py replays paces with 10 % per-step noise and persistent per-node offsets
up to 3 %: the rule excludes well under 1 % of segments there, and a node 15 % slower within two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chainrun.chain.progress import per_node_step_s

MIN_STEPS = 20
SLOW_RATIO = 1.08
Z_MIN = 3.0
PERSIST = 2
GROSS_RATIO = 1.30
GROSS_Z = 5.0
ONE_NODE_WINDOW = 6  # segments of a one-node chain compared


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    ratio: float  # its step time over the others' (1.10 = 10 % slower)
    z: float  # how many standard errors that is
    slow: bool
    gross: bool
    step_s: float
    others_s: float

    def as_dict(self) -> dict:
        return {"node": self.node, "ratio": round(self.ratio, 4), "z": round(self.z, 2), "slow": self.slow,
                "gross": self.gross, "step_s": self.step_s, "others_s": self.others_s}


def _se_log(stat: dict) -> float:
    """Standard error of log(median step time): 1.25 x robust sigma / sqrt(n)."""
    sigma = 1.4826 * float(stat.get("mad") or 0.0) / max(1e-12, float(stat["step_s"]))
    return 1.2533 * max(sigma, 0.005) / math.sqrt(max(1, int(stat["n"])))


def compare(node: str, mine: dict, others: list[dict]) -> NodeVerdict:
    """One node's step time against the others' (their median), as a verdict."""
    ref = sorted(others, key=lambda o: o["step_s"])[len(others) // 2]
    ratio = float(mine["step_s"]) / max(1e-12, float(ref["step_s"]))
    se = math.hypot(_se_log(mine), _se_log(ref))
    z = math.log(ratio) / se if ratio > 0 else 0.0
    return NodeVerdict(node, ratio, z, ratio >= SLOW_RATIO and z >= Z_MIN, ratio >= GROSS_RATIO and z >= GROSS_Z,
                       float(mine["step_s"]), float(ref["step_s"]))


def segment_verdicts(progress: dict) -> list[NodeVerdict]:
    """Multi-node segment: every measured node against the segment's other nodes."""
    stats = {n: s for n, s in per_node_step_s(progress).items() if s["n"] >= MIN_STEPS}
    if len(stats) < 2:
        return []
    return [compare(n, s, [o for m, o in stats.items() if m != n]) for n, s in sorted(stats.items())]


def one_node_verdicts(history: list[dict]) -> list[NodeVerdict]:
    """One-node chain: the newest segment's node against the chain's recent segments on other nodes.
    ``history``: the progress of the chain's ended one-node segments, oldest first."""
    measured = []
    for p in history[-ONE_NODE_WINDOW:]:
        stats = [(n, s) for n, s in per_node_step_s(p).items() if s["n"] >= MIN_STEPS]
        if len(stats) == 1:
            measured.append(stats[0])
    if len(measured) < 2:
        return []
    out = []
    for node in dict.fromkeys(n for n, _ in measured):
        mine = [s for n, s in measured if n == node]
        others = [s for n, s in measured if n != node]
        if not others:
            continue
        out.append(compare(node, mine[-1], others))
    return out


def decide_exclusions(verdict_history: dict[str, list[dict]], already: set[str]) -> list[tuple[str, str]]:
    """(node, why) for every node the evidence says to exclude now. ``verdict_history``: node ->
    its verdicts (as dicts), oldest first, one per measured segment."""
    out = []
    for node, vs in sorted(verdict_history.items()):
        if node in already or not vs:
            continue
        last = vs[-1]
        if last["gross"]:
            out.append((node, f"{(last['ratio'] - 1) * 100:.0f} % slower than the other nodes "
                              f"({last['step_s']:.3g} s vs {last['others_s']:.3g} s a step, {last['z']:.0f} standard errors)"))
        elif len(vs) >= PERSIST and all(v["slow"] for v in vs[-PERSIST:]):
            pct = ", ".join(f"{(v['ratio'] - 1) * 100:.0f} %" for v in vs[-PERSIST:])
            out.append((node, f"slower than the other nodes in its last {PERSIST} segments ({pct}; "
                              f"threshold {(SLOW_RATIO - 1) * 100:.0f} % at {Z_MIN:.0f} standard errors)"))
    return out


# ------------------------------------------------------------------ the engine's hook
def adapt_enabled(chain) -> bool:
    return not chain.extra.get("no_adapt")


def after_segment(chain, segs: list, seg) -> list[tuple[int | None, str, str]]:
    """Update ``chain.extra`` with the ended segment's evidence; returns the events of any change
    to the request of later segments (kind ``adapt``) or of evidence worth showing."""
    progress = seg.extra.get("progress") or {}
    if not progress.get("ranks"):
        return []
    pl = chain.extra.setdefault("placement", {})
    hist: dict[str, list[dict]] = pl.setdefault("verdicts", {})
    pardoned = pl.get("pardoned") or {}
    multi = segment_verdicts(progress)
    verdict_seg: dict[str, int] = {}  # node -> the segment its verdict is about
    if multi:
        verdicts = multi
    elif len(per_node_step_s(progress)) == 1:
        ones, last_seg = [], {}
        for o in sorted(segs, key=lambda s: s.idx):
            stats = per_node_step_s(o.extra.get("progress") or {})
            if len(stats) == 1 and (o.start or 0) >= pardoned.get(next(iter(stats)), 0):
                ones.append(o.extra["progress"])
                last_seg[next(iter(stats))] = o.idx
        # every node's latest segment against the others: a verdict counts once per segment of that node
        # (a normal pace elsewhere also shows up a slow node that ran before)
        verdicts = one_node_verdicts(ones)
        verdict_seg = last_seg
    else:
        verdicts = []
    for v in verdicts:
        rec = dict(v.as_dict(), seg=verdict_seg.get(v.node, seg.idx))
        rec.pop("node")
        lst = hist.setdefault(v.node, [])
        if not lst or lst[-1].get("seg") != rec["seg"]:
            lst.append(rec)
        else:
            lst[-1] = rec  # the same segment of that node, compared with more evidence now
        del lst[:-8]
    seg.extra["node_verdicts"] = [v.as_dict() for v in verdicts]
    adapt = chain.extra.setdefault("adapt", {})
    excluded = set(adapt.get("exclude") or [])
    events: list[tuple[int | None, str, str]] = []
    for node, why in decide_exclusions(hist, excluded):
        if not adapt_enabled(chain):
            key = f"straggler-noted:{node}"
            if not pl.get(key):
                pl[key] = True
                events.append((seg.idx, "placement", f"node {node} is a straggler: {why}; not excluded (--no-adapt)"))
            continue
        adapt["exclude"] = sorted(excluded | {node})
        excluded.add(node)
        pl.setdefault("excluded_why", {})[node] = why
        events.append((seg.idx, "adapt", f"excluding node {node} from the next segments: {why} "
                                         f"(`chainrun unexclude {chain.id} {node}` to pardon it)"))
        _note_change(chain, seg.idx, seg.end, f"--exclude {node}: {why}")
    return events


def exclude(chain, node: str, why: str, idx: int | None, at: float | None) -> bool:
    """Exclude ``node`` from the chain's later segments for a reason other than its pace (e.g. it does
    not see the run folder); False if it was excluded already. `chainrun unexclude` pardons it."""
    adapt = chain.extra.setdefault("adapt", {})
    if node in (adapt.get("exclude") or []):
        return False
    adapt["exclude"] = sorted(set(adapt.get("exclude") or []) | {node})
    chain.extra.setdefault("placement", {}).setdefault("excluded_why", {})[node] = why
    _note_change(chain, idx, at, f"--exclude {node}: {why}")
    return True


def _note_change(chain, idx: int | None, at: float | None, what: str) -> None:
    """Every change to the request of later segments, kept for `status` (also an event)."""
    changes = chain.extra.setdefault("placement", {}).setdefault("changes", [])
    changes.append({"after_segment": idx, "at": at, "what": what})
    del changes[:-20]


# ------------------------------------------------------------------ interference (MARL row)
INTERFERENCE_LOSS = 0.15  # the pace while another job shared a node is at least this much slower


def record_sharing(seg, row, queue, now: float) -> None:
    """From the tick's one (widened) squeue: this running segment's nodes and every other running
    job on any of them (id, user, nodes in common, its start, when we saw it)."""
    from chainrun.slurm.parsers import expand_hostlist

    mine = set(expand_hostlist(getattr(row, "nodelist", "")))
    if not mine:
        return
    seg.extra["slurm_nodes"] = sorted(mine)
    shared = seg.extra.setdefault("shared", {})
    for q in queue:
        if q.job_id == row.job_id or q.state not in ("RUNNING", "COMPLETING") or not getattr(q, "nodelist", ""):
            continue
        common = mine & set(expand_hostlist(q.nodelist))
        if not common:
            continue
        e = shared.setdefault(q.job_id, {"user": q.user, "nodes": sorted(common), "cpus": q.cpus, "start": q.start,
                                         "first_seen": now})
        e["last_seen"] = now
        if len(shared) > 50:
            shared.pop(next(iter(shared)))


def sharing_windows(seg) -> dict[str, list[tuple[float, float]]]:
    """node -> [(from, to)] when other jobs were seen on it (from their start, to the last tick that saw them)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in (seg.extra.get("shared") or {}).values():
        a = e.get("start") or e.get("first_seen")
        b = e.get("last_seen") or a
        for n in e.get("nodes") or []:
            out.setdefault(n, []).append((float(a), float(b)))
    return out


def interference(chain, seg, extra_wait) -> list[tuple[int | None, str, str]]:
    """After a segment that shared a node: was its pace worse while sharing, and is `--exclusive` worth
    its extra wait? ``extra_wait()`` -> seconds more queue wait `--exclusive` costs (sbatch --test-only)
    or None when Slurm would not say. Decides only with >= MIN_STEPS steps both alone and shared."""
    progress = seg.extra.get("progress") or {}
    worst = None
    for r in progress.get("ranks") or []:
        if (r.get("shared_n") or 0) >= MIN_STEPS and (r.get("alone_n") or 0) >= MIN_STEPS and r.get("alone_step_s"):
            loss = r["shared_step_s"] / r["alone_step_s"] - 1
            if worst is None or loss > worst[0]:
                worst = (loss, r)
    if worst is None or worst[0] < INTERFERENCE_LOSS:
        return []
    loss, r = worst
    adapt = chain.extra.setdefault("adapt", {})
    if adapt.get("exclusive"):
        return []
    frac = r["shared_n"] / (r["shared_n"] + r["alone_n"])
    per_segment = max(60.0, chain.segment_s - chain.signal_lead_s)
    lost = per_segment * frac * loss / (1 + loss)  # training time a segment like this one loses to the neighbour
    jobs = ", ".join(f"{j} ({e.get('user') or '?'})" for j, e in (seg.extra.get("shared") or {}).items()
                     if r["node"] in (e.get("nodes") or []))
    seen = (f"segment {seg.idx} trained {loss * 100:.0f} % slower on {r['node']} while job(s) {jobs} shared it "
            f"({r['shared_step_s']:.3g} s vs {r['alone_step_s']:.3g} s a step, {frac * 100:.0f} % of its steps)")
    if not adapt_enabled(chain):
        return [(seg.idx, "placement", f"{seen}; not asking for --exclusive (--no-adapt)")]
    cost = extra_wait()
    if cost is None:
        return [(seg.idx, "placement", f"{seen}; not asking for --exclusive: Slurm would not estimate its extra wait "
                                       "(sbatch --test-only)")]
    if lost <= cost:
        return [(seg.idx, "placement", f"{seen}; not asking for --exclusive: it would wait ~{cost:.0f} s longer "
                                       f"(sbatch --test-only), more than the ~{lost:.0f} s a segment loses")]
    adapt["exclusive"] = True
    why = f"{seen}; --exclusive costs ~{cost:.0f} s more wait (sbatch --test-only), a segment loses ~{lost:.0f} s"
    _note_change(chain, seg.idx, seg.end, f"--exclusive: {why}")
    return [(seg.idx, "adapt", f"asking --exclusive for the next segments: {why}")]


def unexclude(chain, node: str, now: float) -> bool:
    """Pardon a node: drop it from the excludes and forget the evidence against it so far."""
    adapt = chain.extra.setdefault("adapt", {})
    pl = chain.extra.setdefault("placement", {})
    had = node in (adapt.get("exclude") or [])
    adapt["exclude"] = [n for n in adapt.get("exclude") or [] if n != node]
    pl.get("verdicts", {}).pop(node, None)
    pl.setdefault("pardoned", {})[node] = now
    (pl.get("excluded_why") or {}).pop(node, None)
    if had:
        _note_change(chain, None, now, f"node {node} pardoned: no longer excluded")
    return had


def excluded_view(chain) -> list[dict]:
    """The nodes chainrun excluded, with the numbers: for `status`."""
    pl = chain.extra.get("placement") or {}
    out = []
    for node in (chain.extra.get("adapt") or {}).get("exclude") or []:
        last = ((pl.get("verdicts") or {}).get(node) or [{}])[-1]
        out.append({"node": node, "why": (pl.get("excluded_why") or {}).get(node, ""),
                    "ratio": last.get("ratio"), "step_s": last.get("step_s"), "others_s": last.get("others_s")})
    return out


__all__ = ["compare", "segment_verdicts", "one_node_verdicts", "decide_exclusions", "after_segment", "unexclude",
           "excluded_view", "MIN_STEPS", "SLOW_RATIO", "Z_MIN", "PERSIST", "GROSS_RATIO", "GROSS_Z"]


# ------------------------------------------------------------------ a successor already queued
def queued_update(chain, seg) -> dict[str, str]:
    """``scontrol update`` fields that make a queued segment ask what a segment planned now would:
    its excluded nodes and ``--switches``. Slurm lets a user change these on a pending job; an
    ``--exclusive`` cannot be added to one, so that waits for the next submission. Empty: no change."""
    import shlex

    from chainrun.chain.contract import option_value
    from chainrun.chain.request import segment_args

    old = shlex.split(seg.extra.get("request") or "")
    new = segment_args(chain, seg)
    fields = {}
    for field_name, names in (("ExcNodeList", ("--exclude", "-x")), ("Switches", ("--switches",))):
        value = option_value(new, *names)
        if value and value != option_value(old, *names):
            fields[field_name] = value
    return fields


def note_queued_update(seg, fields: dict[str, str]) -> str:
    """Record the change in the segment's shown request; the event's words."""
    import shlex

    args = shlex.split(seg.extra.get("request") or "")
    for field_name, opt in (("ExcNodeList", "--exclude"), ("Switches", "--switches")):
        if field_name in fields:
            args = [a for a in args if not a.startswith(opt + "=") and not (opt == "--exclude" and a.startswith("-x"))]
            args.insert(0, f"{opt}={fields[field_name]}")
    seg.extra["request"] = " ".join(args)
    said = ", ".join(f"{'--exclude' if k == 'ExcNodeList' else '--switches'}={v}" for k, v in fields.items())
    return f"queued segment {seg.idx} (job {seg.job_id}) updated in place: {said} (scontrol update)"
