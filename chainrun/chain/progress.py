"""Training progress: the optional progress contract, its one parser, and a segment's pace.

The contract (docs/checkpoint-contract.md, "Progress"): the wrapper exports
``CHAINRUN_PROGRESS_FILE``; each rank of the payload appends lines to
``$CHAINRUN_PROGRESS_FILE.<SLURM_PROCID>.<SLURMD_NODENAME>`` (so every rank has its own file
and its node is in the name), one line per step or every few steps::

    <epoch seconds> <step> [<samples>] [<compute seconds of this rank's last step>] [<total steps>]

Optional fields are positional; ``-`` skips one. ``<step>`` and ``<samples>`` count from the
start of training (not of the segment). A file is written by a trainer that may be killed at
any moment, so the parser takes only whole, sane lines: a partial last line, garbage, negative
or huge numbers are skipped, never an error.

Reading costs no Slurm call: one ``sh`` command per segment (a file read; over SSH one remote
command), done when a segment ends and, while it runs, at most every
:data:`READ_EVERY_S` seconds (not every tick).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

READ_EVERY_S = float(os.environ.get("CHAINRUN_PROGRESS_EVERY", "300"))  # while a segment runs
HEAD_BYTES, TAIL_BYTES = 4096, 65536  # of each rank's file: its first lines and its recent pace
MAX_STEP = 1e15  # larger is garbage (a huge number must not wreck an ETA)
MAX_SAMPLES = 1e18
MAX_COMPUTE_S = 1e6
MIN_EPOCH, MAX_EPOCH = 1e9, 1e10
_SECTION = "==> chainrun-progress "


@dataclass(frozen=True)
class Point:
    t: float
    step: float
    samples: float | None = None
    compute_s: float | None = None
    total: float | None = None


def _num(tok: str, lo: float, hi: float) -> float | None:
    """A finite number in [lo, hi]; ``-`` is None; anything else raises ValueError."""
    if tok == "-":
        return None
    v = float(tok)
    if not math.isfinite(v) or v < lo or v > hi:
        raise ValueError(tok)
    return v


def parse_line(line: str) -> Point | None:
    """One progress line, or None when it is not a whole, sane one."""
    parts = line.split()
    if not 2 <= len(parts) <= 5:
        return None
    try:
        t = _num(parts[0], MIN_EPOCH, MAX_EPOCH)
        step = _num(parts[1], 0, MAX_STEP)
        if t is None or step is None:
            return None
        rest = [_num(p, 0, hi) for p, hi in zip(parts[2:], (MAX_SAMPLES, MAX_COMPUTE_S, MAX_STEP))]
    except (ValueError, OverflowError):
        return None
    rest += [None] * (3 - len(rest))
    return Point(t, step, rest[0], rest[1], rest[2])


def parse_lines(text: str, *, whole_first: bool = True) -> list[Point]:
    """Every sane line of ``text``; the last line counts only when a newline ends it (a trainer
    killed mid-write leaves a partial one), the first only with ``whole_first`` (a tail read may
    start inside a line)."""
    lines = text.split("\n")
    lines.pop()  # "" after a final newline, else a partial line
    if not whole_first and lines:
        lines.pop(0)
    return [p for p in map(parse_line, lines) if p is not None]


def rank_file(base: str, env: dict | None = None) -> str:
    """The file this process appends to: ``<base>.<SLURM_PROCID>.<SLURMD_NODENAME>``."""
    env = os.environ if env is None else env
    node = "".join(c for c in env.get("SLURMD_NODENAME", "") or "local" if c.isalnum() or c in "-_.") or "local"
    return f"{base}.{env.get('SLURM_PROCID', '0') or '0'}.{node}"


def format_line(step: float, samples=None, compute_s=None, total=None, t: float | None = None) -> str:
    vals = [samples, compute_s, total]
    while vals and vals[-1] is None:
        vals.pop()
    return " ".join([f"{time.time() if t is None else t:.3f}", _fmt(step)] + ["-" if v is None else _fmt(v) for v in vals]) + "\n"


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{float(v):.6g}"


def report(step: float, samples=None, compute_s=None, total=None) -> bool:
    """Append one line to this rank's progress file; False (and nothing written) outside chainrun.
    One ``write`` of a whole line in append mode, so concurrent readers never see half a number
    they would accept."""
    base = os.environ.get("CHAINRUN_PROGRESS_FILE")
    if not base:
        return False
    with open(rank_file(base), "a", encoding="ascii") as f:
        f.write(format_line(step, samples, compute_s, total))
    return True


def progress_main(argv: list[str] | None = None) -> None:
    """``chainrun-progress STEP [SAMPLES] [COMPUTE_S] [TOTAL_STEPS]`` (``-`` skips one)."""
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 4 or args[0] in ("-h", "--help"):
        print("usage: chainrun-progress STEP [SAMPLES] [COMPUTE_SECONDS] [TOTAL_STEPS]  ('-' skips a field)",
              file=sys.stderr)
        sys.exit(2)
    line = format_line(0).split()[0] + " " + " ".join(args)
    if parse_line(line) is None:
        print(f"chainrun-progress: not a progress line: {' '.join(args)!r}", file=sys.stderr)
        sys.exit(2)
    base = os.environ.get("CHAINRUN_PROGRESS_FILE")
    if base:
        with open(rank_file(base), "a", encoding="ascii") as f:
            f.write(line + "\n")


# ------------------------------------------------------------------ reading (watcher side)
_READ_SCRIPT = (
    'for f in "$0".*; do [ -f "$f" ] || continue; '
    'n=$(wc -c < "$f"); '
    f'printf "\\n{_SECTION}%s %s head <==\\n" "$f" "$n"; head -c {HEAD_BYTES} "$f" | tr -cd "\\11\\12\\40-\\176"; '
    f'printf "\\n{_SECTION}%s %s tail <==\\n" "$f" "$n"; tail -c {TAIL_BYTES} "$f" | tr -cd "\\11\\12\\40-\\176"; done'
)  # tr: printable ASCII only, so a NUL or an invalid byte a crashing trainer left cannot upset a decoder


def read_argv(base: str) -> list[str]:
    """One command printing the head and the tail of every rank's file of one segment."""
    return ["sh", "-c", _READ_SCRIPT, base]


def parse_read_output(text: str, base: str) -> dict[tuple[int, str], list[Point]]:
    """(rank, node) -> that rank's points (time order, deduplicated) from :func:`read_argv`'s output."""
    out: dict[tuple[int, str], dict[tuple[float, float], Point]] = {}
    chunks = text.split("\n" + _SECTION)
    for chunk in chunks[1:]:
        header, _, body = chunk.partition(" <==\n")
        try:
            path, size, part = header.rsplit(" ", 2)
            size_n = int(size)
        except ValueError:
            continue
        key = _rank_key(path, base)
        if key is None:
            continue
        whole_first = part == "head" or size_n <= TAIL_BYTES
        pts = out.setdefault(key, {})
        for p in parse_lines(body, whole_first=whole_first):
            pts[(p.t, p.step)] = p
    return {k: sorted(v.values(), key=lambda p: (p.t, p.step)) for k, v in out.items() if v}


def _rank_key(path: str, base: str) -> tuple[int, str] | None:
    name = path[len(base) + 1:] if path.startswith(base + ".") else path.rsplit("/", 1)[-1]
    rank, _, node = name.partition(".")
    if not rank.isdigit() or not node:
        return None
    return int(rank), node


# ------------------------------------------------------------------ pace
@dataclass(frozen=True)
class RankPace:
    rank: int
    node: str
    first_step: float
    last_step: float
    first_t: float
    last_t: float
    steps_per_s: float | None
    samples_per_s: float | None
    total_steps: float | None
    step_s: float | None  # median seconds of one step: its compute time when reported, else the step interval
    step_s_mad: float | None  # median absolute deviation of those (the noise, for the straggler rule)
    n: int  # how many step times the median is of
    compute_reported: bool


def step_times(points: list[Point]) -> tuple[list[float], bool]:
    """Per-step seconds: the reported compute times, else intervals between lines per step."""
    comp = [p.compute_s for p in points if p.compute_s is not None and p.compute_s > 0]
    if len(comp) >= max(2, len(points) // 2):
        return comp, True
    out = []
    for a, b in zip(points, points[1:]):
        ds = b.step - a.step
        if ds > 0 and b.t > a.t:
            out.append((b.t - a.t) / ds)
    return out, False


def rank_pace(rank: int, node: str, points: list[Point]) -> RankPace:
    first, last = points[0], points[-1]
    span = last.t - first.t
    sps = (last.step - first.step) / span if span > 0 and last.step >= first.step else None
    samp = None
    s0 = next((p for p in points if p.samples is not None), None)
    s1 = next((p for p in reversed(points) if p.samples is not None), None)
    if s0 and s1 and s1.t > s0.t and s1.samples >= s0.samples:
        samp = (s1.samples - s0.samples) / (s1.t - s0.t)
    total = next((p.total for p in reversed(points) if p.total), None)
    times, reported = step_times(points)
    med = statistics.median(times) if times else None
    mad = statistics.median(abs(x - med) for x in times) if times else None
    return RankPace(rank, node, first.step, last.step, first.t, last.t, sps, samp, total, med, mad, len(times),
                    reported)


def timed_step_times(points: list[Point]) -> list[tuple[float, float]]:
    """(time, seconds of that step) for each step: the reported compute time, else the interval."""
    comp = [(p.t, p.compute_s) for p in points if p.compute_s is not None and p.compute_s > 0]
    if len(comp) >= max(2, len(points) // 2):
        return comp
    return [(b.t, (b.t - a.t) / (b.step - a.step)) for a, b in zip(points, points[1:]) if b.step > a.step and b.t > a.t]


def split_by_windows(points: list[Point], windows: list[tuple[float, float]]) -> dict:
    """Median step time inside the windows (another job shared the node) and outside them."""
    inside, outside = [], []
    for t, dt in timed_step_times(points):
        (inside if any(a <= t - dt / 2 <= b for a, b in windows) else outside).append(dt)
    return {"shared_step_s": statistics.median(inside) if inside else None, "shared_n": len(inside),
            "alone_step_s": statistics.median(outside) if outside else None, "alone_n": len(outside)}


def segment_progress(ranks: dict[tuple[int, str], list[Point]], *, read_at: float,
                     shared: dict[str, list[tuple[float, float]]] | None = None) -> dict:
    """What chainrun keeps of a segment's progress (``segment.extra["progress"]``): rank 0's
    steps and pace (the lowest rank reporting), and every rank's step time for the straggler rule;
    with ``shared`` (node -> windows when other jobs ran there), each rank's pace in and out of them."""
    paces = [rank_pace(r, n, pts) for (r, n), pts in sorted(ranks.items())]
    out: dict = {"read_at": read_at, "ranks": [asdict(p) for p in paces]}
    for rec, ((_, node), pts) in zip(out["ranks"], sorted(ranks.items())):
        if shared and shared.get(node):
            rec.update(split_by_windows(pts, shared[node]))
    if not paces:
        return out
    lead = paces[0]
    out.update({
        "step": lead.last_step, "steps": max(0.0, lead.last_step - lead.first_step), "at": lead.last_t,
        "steps_per_s": lead.steps_per_s, "samples_per_s": lead.samples_per_s, "total_steps": lead.total_steps,
        "nodes": sorted({p.node for p in paces}),
    })
    return out


def per_node_step_s(progress: dict) -> dict[str, dict]:
    """node -> {"step_s", "mad", "n"}: the slowest rank on each node (a node is as slow as its slowest GPU)."""
    out: dict[str, dict] = {}
    for r in progress.get("ranks") or []:
        if r.get("step_s") is None or not r.get("n"):
            continue
        cur = out.get(r["node"])
        if cur is None or r["step_s"] > cur["step_s"]:
            out[r["node"]] = {"step_s": r["step_s"], "mad": r.get("step_s_mad") or 0.0, "n": r["n"]}
    return out


def chain_pace(progresses: list[dict]) -> dict:
    """The chain's latest step count and recent pace from its segments' progress, newest last."""
    have = [p for p in progresses if p.get("step") is not None]
    if not have:
        return {}
    last = have[-1]
    recent = next((p for p in reversed(have) if p.get("steps_per_s")), {})
    return {"step": last["step"], "steps_per_s": recent.get("steps_per_s"),
            "samples_per_s": recent.get("samples_per_s"),
            "total_steps": next((p["total_steps"] for p in reversed(have) if p.get("total_steps")), None)}


def segment_fields(seg) -> dict:
    """A segment's own figures: steps it trained, its pace, the nodes that reported."""
    p = seg.extra.get("progress") or {}
    return {"step": p.get("step"), "steps": p.get("steps"), "steps_per_s": p.get("steps_per_s"),
            "samples_per_s": p.get("samples_per_s"), "nodes": tuple(p.get("nodes") or ()),
            "node_verdicts": tuple(seg.extra.get("node_verdicts") or ()), "switches": seg.extra.get("switches")}


__all__ = ["Point", "parse_line", "parse_lines", "rank_file", "format_line", "report", "progress_main", "read_argv",
           "parse_read_output", "segment_progress", "segment_fields", "per_node_step_s", "chain_pace", "READ_EVERY_S"]
