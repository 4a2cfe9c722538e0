"""Elastic segments: which node count the next segment asks for.

One pure rule, shared by the watcher (chainrun.chain.engine) and the whole-chain replay
(`chainrun sim --chains`, policy ``predicted_elastic``): what ships is what is measured.

Work is counted at the chain's **reference shape** (the first of ``--shapes``, the shape
``--total`` is stated in). A segment of another shape does ``rate`` reference-seconds of work per
wall second of training:

- from the chain's measured pace on that shape when it has one (steps/s, the global batch being
  kept by the trainer, so a step is the same work at every shape);
- else scaled from a measured pace on another shape, linear in nodes times the user's efficiency;
- else linear in nodes times the user's efficiency for that shape (default 1.0).

For every candidate the rule predicts when the remaining work would be done if the chain kept
that shape: the predicted start (the queue model's median wait for that request, or Slurm's own
``sbatch --test-only`` answer where the caller has one) plus the training time at that rate, plus
one ``boundary_s`` per extra segment boundary the slower shape needs. It picks the earliest finish;
a shape other than the reference must win by ``margin_s`` (default 10 min, or 5 % of the reference
finish if larger), so noise in the predictions does not make the chain flap between shapes.

The **filler** (``choose_filler``, MalleTrain's idea) is a second, separate rule for a chain with no
live segment: run a smaller shape in the time the reference shape would only be queueing, and hand
off to the reference as soon as it starts (the engine submits the reference successor the moment
the filler runs; a successor that starts early stops its predecessor, which saves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chainrun.chain.pace import shape_rate
from chainrun.errors import UsageError

DEFAULT_MARGIN_S = 600.0
MARGIN_SHARE = 0.05
# a filler must gain at least this many of the chain's segment boundaries (boundary_s) of reference
# work, and never less than a minute (Slurm's unit): in the chain's own scale, so a chain whose
# boundary costs 20 s may fill a few minutes and one whose boundary costs 5 min needs 30 min or more.
# None: no filler. Chosen on the replay's choice window among 2, 6, 12 and no filler
# (chainrun.sim.elastic.tune_elastic, docs/elastic.md): with the slack rule (commit f330469) no filler
# had the lowest mean overhead on chains that end before the scored window (2.08 h against 2.14 h at
# 12, 2.17 h at 6); with the quantile rule before it, 6. A chain asks for one with `submit --filler N`.
FILLER_MARGIN: float | None = None
FILLER_EXAMPLE = 6.0  # what `--filler` suggests: the margin the procedure picked before the slack rule
MIN_FILLER_GAIN_S = 60.0


def parse_shapes(text: str, *, max_nodes: int | None = None) -> tuple[int, ...]:
    """``"8,4,2"`` -> (8, 4, 2): node counts, the first the reference shape. One-line errors for
    non-numbers, counts below 1, duplicates, and counts above what the partition has."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise UsageError(f"--shapes {text!r}: give node counts separated by commas, e.g. --shapes 8,4,2")
    shapes: list[int] = []
    for p in parts:
        if not p.isdigit():
            raise UsageError(f"--shapes {text!r}: {p!r} is not a node count (a whole number >= 1)")
        n = int(p)
        if n < 1:
            raise UsageError(f"--shapes {text!r}: a shape needs at least 1 node, not {n}")
        if max_nodes is not None and n > max_nodes:
            raise UsageError(f"--shapes {text!r}: {n} nodes, but the partition has {max_nodes}")
        if n in shapes:
            raise UsageError(f"--shapes {text!r}: {n} is listed twice")
        shapes.append(n)
    return tuple(shapes)


def parse_efficiency(text: str | None, shapes: tuple[int, ...] = ()) -> dict[int, float]:
    """``"2=0.9,4=0.95"`` -> {2: 0.9, 4: 0.95}: the user's scaling efficiency per node count,
    relative to linear (1.0 = twice the nodes do twice the work). One-line errors for anything else."""
    if not text:
        return {}
    out: dict[int, float] = {}
    for part in str(text).split(","):
        n, sep, v = part.strip().partition("=")
        try:
            nodes, eff = int(n), float(v)
        except ValueError:
            nodes, eff = 0, -1.0
        if not sep or nodes < 1 or not 0 < eff <= 2:
            raise UsageError(f"--shape-efficiency {text!r}: {part.strip()!r} is not NODES=EFFICIENCY "
                             "(a node count and a number in (0, 2], e.g. 2=0.9)")
        if shapes and nodes not in shapes:
            raise UsageError(f"--shape-efficiency {text!r}: {nodes} nodes is not one of --shapes "
                             f"{','.join(map(str, shapes))}")
        out[nodes] = eff
    return out


@dataclass(frozen=True)
class ShapeOption:
    """One candidate: its predicted start (s from now), rate, and finish of all remaining work
    (for a filler candidate: ``gain_s``, the reference work it does before the reference starts)."""

    nodes: int
    wait_s: float
    rate: float
    segments: int
    finish_s: float
    wait_source: str = "model"
    gain_s: float | None = None

    def as_dict(self) -> dict:
        out = {"nodes": self.nodes, "wait_s": round(self.wait_s, 1), "rate": round(self.rate, 4),
               "segments": self.segments, "finish_s": round(self.finish_s, 1), "wait_source": self.wait_source}
        if self.gain_s is not None:
            out["gain_s"] = round(self.gain_s, 1)
        return out


@dataclass(frozen=True)
class ShapeChoice:
    nodes: int
    reason: str
    options: tuple[ShapeOption, ...]
    filler: bool = False  # run until the reference shape starts (choose_filler), then hand off to it

    def as_dict(self) -> dict:
        out = {"nodes": self.nodes, "reason": self.reason, "options": [o.as_dict() for o in self.options]}
        if self.filler:
            out["filler"] = True
        return out


def finish_estimate(remaining_s: float, wait_s: float, rate: float, *, segment_s: float,
                    boundary_s: float) -> tuple[float, int]:
    """(seconds from now until ``remaining_s`` reference-seconds of work are done, segments used)
    if every remaining segment has this rate and trains at most ``segment_s`` each."""
    wall = max(remaining_s, 0.0) / max(rate, 1e-9)
    segments = max(1, math.ceil(wall / max(segment_s, 1.0)))
    return wait_s + wall + (segments - 1) * boundary_s, segments


def choose_shape(remaining_s: float, shapes: tuple[int, ...], waits: dict[int, float], *,
                 segment_s: float, boundary_s: float, measured: dict[int, float] | None = None,
                 efficiency: dict[int, float] | None = None, sources: dict[int, str] | None = None,
                 margin_s: float = DEFAULT_MARGIN_S) -> ShapeChoice:
    """The node count for the next segment (see the module doc).

    ``shapes``: the chain's shapes, the first the reference. ``waits``: predicted wait (s) per node
    count; a shape without one is not a candidate (the reference always is: missing = 0 s wait
    assumed only when no shape has a prediction, i.e. the caller has no model).
    """
    if not shapes:
        raise ValueError("no shapes")
    ref = shapes[0]
    if not waits:
        return ShapeChoice(ref, "no wait prediction: the reference shape", ())
    sources = sources or {}
    options = []
    for n in shapes:
        if n not in waits:
            continue
        rate = shape_rate(n, ref, measured=measured, efficiency=efficiency)
        finish, segs = finish_estimate(remaining_s, waits[n], rate, segment_s=segment_s, boundary_s=boundary_s)
        options.append(ShapeOption(n, float(waits[n]), rate, segs, finish, sources.get(n, "model")))
    if not options:
        return ShapeChoice(ref, "no wait prediction for any shape: the reference shape", ())
    best = min(options, key=lambda o: (o.finish_s, -o.nodes))
    ref_opt = next((o for o in options if o.nodes == ref), None)
    if ref_opt is None:
        return ShapeChoice(best.nodes, f"{best.nodes} nodes finish first ({_h(best.finish_s)})", tuple(options))
    need = max(margin_s, MARGIN_SHARE * ref_opt.finish_s)
    if best.nodes != ref and ref_opt.finish_s - best.finish_s >= need:
        return ShapeChoice(best.nodes, (
            f"{best.nodes} nodes: start in ~{_h(best.wait_s)}, work done in ~{_h(best.finish_s)}; "
            f"{ref} nodes: start in ~{_h(ref_opt.wait_s)}, done in ~{_h(ref_opt.finish_s)}"), tuple(options))
    return ShapeChoice(ref, f"{ref} nodes (reference): done in ~{_h(ref_opt.finish_s)}, no shape saves "
                            f"{_h(need)} or more", tuple(options))


def choose_filler(shapes: tuple[int, ...], waits: dict[int, float], *, boundary_s: float,
                  measured: dict[int, float] | None = None, efficiency: dict[int, float] | None = None,
                  sources: dict[int, str] | None = None,
                  margin: float | None = FILLER_MARGIN) -> ShapeChoice | None:
    """A filler shape for a chain with **no live segment**, or None (always None with ``margin`` None:
    no filler, the shipped default).

    A filler on ``n`` nodes (n != the reference) starts after ``waits[n]`` and is cut when the
    reference shape starts, after ``waits[ref]``; meanwhile it trains at its rate, less one segment
    boundary (its restart and the hand-off it adds: ``boundary_s``, the engine's
    ``segment_overhead``). Its gain, in reference-seconds of work the chain has when the reference
    starts and would not have had without it::

        gain(n) = rate(n) * (waits[ref] - waits[n] - boundary_s)

    It is worth it when the largest gain is at least ``margin`` boundaries (``margin * boundary_s``,
    at least ``MIN_FILLER_GAIN_S``): a queue wait turned into work, worth the boundary it adds and
    the noise in the predicted waits. The filler asks for a full segment (it is cut when the reference
    starts, or ends on its own if that comes first), its work counts at its rate like any segment.

    Why a separate rule: ``choose_shape`` compares finishing *all* the remaining work at one shape,
    so a smaller shape wins only when the reference waits for days; a filler does not replace the
    reference, it uses its queue wait. Never for a chain with a live segment: a filler starts at once
    and would cut a running reference-shape segment (the engine and the replay only ask when nothing
    is live). Without a predicted wait for the reference there is nothing to fill: None.
    """
    if not shapes:
        raise ValueError("no shapes")
    ref = shapes[0]
    if margin is None or ref not in waits or len(shapes) < 2:
        return None
    sources = sources or {}
    wait_ref = max(0.0, float(waits[ref]))
    options = [ShapeOption(ref, wait_ref, 1.0, 1, wait_ref, sources.get(ref, "model"), 0.0)]
    for n in shapes[1:]:
        if n not in waits:
            continue
        w = max(0.0, float(waits[n]))
        rate = shape_rate(n, ref, measured=measured, efficiency=efficiency)
        gain = rate * (wait_ref - w - max(0.0, boundary_s))
        options.append(ShapeOption(n, w, rate, 1, wait_ref, sources.get(n, "model"), gain))
    need = max(MIN_FILLER_GAIN_S, margin * max(0.0, boundary_s))
    fill = [o for o in options[1:] if o.gain_s is not None and o.gain_s >= need]
    if not fill:
        return None
    best = max(fill, key=lambda o: (o.gain_s, o.nodes))
    return ShapeChoice(best.nodes, (
        f"filler on {best.nodes} nodes while {ref} nodes queue (~{_h(wait_ref)}): starts in ~{_h(best.wait_s)}, "
        f"~{_h(best.gain_s)} of {ref}-node work before {ref} nodes start and take over"), tuple(options), filler=True)


def _h(seconds: float) -> str:
    s = max(0.0, float(seconds))
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def parse_filler(value: float | None) -> float | None:
    """``--filler N``: a filler's least gain in segment boundaries (a positive number), or None."""
    if value is None:
        return None
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise UsageError(f"--filler {value:g}: give a positive number of segment boundaries",
                         hint=f"e.g. --filler {FILLER_EXAMPLE:g} (docs/elastic.md, 'Filler')")
    return v
