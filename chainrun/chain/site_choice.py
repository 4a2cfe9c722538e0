"""Where a chain's next segment runs, when it may run on several clusters (issue #26): one pure rule.

The whole-chain replay (``chainrun sim --chains --trace A --trace B``, policy ``predicted_multi``,
chainrun/sim/site_chain.py) calls it, and so will the driver: what ships is what is measured.

For every site (a cluster the chain may use) the rule estimates, in seconds from now, when the
chain's remaining work would be done if its next segment ran there and the chain stayed there::

    finish = max(median wait, ready_in) + transfer + restart + remaining / pace + (segments - 1) * boundary

- ``wait``: the site's queue-wait distribution for the successor's request submitted now (its
  model's quantiles, or a quantile function), read at its median, as the shape rule reads it
  (chain/shapes.py). Not its mean: the model's upper quantiles can read thousands of hours where
  its median reads one (LS6 in the holiday weeks, docs/multi-cluster.md), and a mean over them
  made a queue that started chains within hours look hopeless.
- ``ready_in``: when the chain can continue at all (the live segment's hand-over point; 0 when
  nothing runs): a successor that starts before it gains nothing, so the wait counts beyond it only.
- ``transfer``: the checkpoint's copy to that site (0 on the site the chain is on). It is charged in
  full, after the start, even though a copy may overlap a queue wait: a move must pay for itself.
- ``pace``: work per wall second relative to the reference (GPUs differ): measured there, else
  declared, else 1.0.
- ``segments``: how many segments the remaining work needs at that pace (``segment_s``), each
  boundary after the first costing ``boundary_s`` (0 and 1 segment when not given).

The chain **stays** on ``current`` unless another site is expected to finish more than ``margin_s``
earlier (noise in the predictions must not make a chain flap between clusters; the margin is a
tunable chosen on the past, chainrun/sim/site_tune.py). A first placement (``current`` None) starts
from the first site, the user's preference, by the same rule, and is not a move. A current site that
is not among the options (unreachable) is left for the earliest finish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Union

# the quantile level at which a wait distribution is read
LEVEL = 0.5
# the margin the product uses where none was chosen for the chain: an hour, the replay's default
# (chainrun/sim/site_tune.py, DEFAULT_MARGIN_S); `submit --site-margin` sets a chain's own
SHIPPED_MARGIN_S = 3600.0

Wait = Union[Mapping[float, float], Callable[[float], float], object]  # {q: s}, q -> s, or .quantile(q)


@dataclass(frozen=True)
class SiteOption:
    """One site the next segment may run on."""

    name: str
    wait: Wait  # the successor's wait there if submitted now: {level: seconds}, a quantile function or a Prediction
    transfer_s: float = 0.0  # the checkpoint's copy there (0 on the chain's current site)
    restart_s: float = 0.0  # the payload's restart there (model load, data loader warm-up)
    pace: float = 1.0  # work per wall second relative to the reference


@dataclass(frozen=True)
class SiteEstimate:
    name: str
    wait_s: float  # max(median wait, ready_in)
    transfer_s: float
    restart_s: float
    pace: float
    segments: int
    finish_s: float

    def as_dict(self) -> dict:
        return {"site": self.name, "wait_s": round(self.wait_s, 1), "transfer_s": round(self.transfer_s, 1),
                "restart_s": round(self.restart_s, 1), "pace": round(self.pace, 4), "segments": self.segments,
                "finish_s": round(self.finish_s, 1)}


@dataclass(frozen=True)
class SiteChoice:
    site: str
    move: bool  # a change of site from ``current`` (a first placement never is)
    reason: str
    estimates: tuple[SiteEstimate, ...] = field(default=())
    margin_s: float = 0.0
    left_out: tuple[tuple[str, str], ...] = ()  # (site, why) for each site not weighed (chain/site_plan.py)

    @property
    def finish_s(self) -> dict[str, float]:
        """The expected finish (s from now) per site."""
        return {e.name: e.finish_s for e in self.estimates}

    def as_dict(self) -> dict:
        out = {"site": self.site, "move": self.move, "reason": self.reason, "margin_s": self.margin_s,
               "estimates": [e.as_dict() for e in self.estimates]}
        if self.left_out:
            out["left_out"] = dict(self.left_out)
        return out


def quantile_fn(wait: Wait) -> Callable[[float], float]:
    """A quantile function for ``wait``: a mapping {level: seconds} is read piecewise-linearly in the
    level (flat beyond its first and last levels), made monotone; a Prediction by its ``quantile``."""
    if hasattr(wait, "quantile"):
        return wait.quantile  # type: ignore[union-attr]
    if callable(wait):
        return wait
    pts = sorted((float(q), float(s)) for q, s in dict(wait).items())  # type: ignore[arg-type]
    if not pts:
        raise ValueError("an empty wait distribution")
    qs = [q for q, _ in pts]
    vs = []
    for _, s in pts:
        vs.append(max(s, vs[-1]) if vs else s)

    def q_of(level: float) -> float:
        if level <= qs[0]:
            return vs[0]
        for i in range(1, len(qs)):
            if level <= qs[i]:
                a = (level - qs[i - 1]) / (qs[i] - qs[i - 1])
                return vs[i - 1] + a * (vs[i] - vs[i - 1])
        return vs[-1]

    return q_of


def start_estimate(wait: Wait, ready_in_s: float = 0.0) -> float:
    """When the successor can continue the chain: max(median wait, ready_in_s) (= the median of
    max(wait, ready_in_s))."""
    return max(max(0.0, float(quantile_fn(wait)(LEVEL))), ready_in_s)


def estimate(o: SiteOption, *, remaining_s: float, ready_in_s: float = 0.0, segment_s: float | None = None,
             boundary_s: float = 0.0) -> SiteEstimate:
    if not o.pace > 0 or not math.isfinite(o.pace):
        raise ValueError(f"site {o.name}: pace must be positive, not {o.pace!r}")
    wall = max(remaining_s, 0.0) / o.pace
    segments = max(1, math.ceil(wall / segment_s)) if segment_s else 1
    wait = start_estimate(o.wait, max(0.0, ready_in_s))
    finish = wait + o.transfer_s + o.restart_s + wall + (segments - 1) * boundary_s
    return SiteEstimate(o.name, wait, o.transfer_s, o.restart_s, o.pace, segments, finish)


def choose_site(current: str | None, options: list[SiteOption] | tuple[SiteOption, ...], *, remaining_s: float,
                margin_s: float, ready_in_s: float = 0.0, segment_s: float | None = None,
                boundary_s: float = 0.0) -> SiteChoice:
    """The site for the next segment (see the module doc). ``options`` in the user's order of
    preference; ``current``: the site of the chain's newest segment (None before the first)."""
    if not options:
        raise ValueError("no site to choose from")
    names = [o.name for o in options]
    if len(set(names)) != len(names):
        raise ValueError(f"a site is listed twice: {names}")
    ests = tuple(estimate(o, remaining_s=remaining_s, ready_in_s=ready_in_s, segment_s=segment_s,
                          boundary_s=boundary_s) for o in options)
    best = min(ests, key=lambda e: (e.finish_s, names.index(e.name)))  # ties: the preferred
    here = current if current in names else None
    if current is not None and here is None:
        return SiteChoice(best.name, True, f"{current} is not available: {best.name}, done in ~{_h(best.finish_s)}",
                          ests, margin_s)
    ref = next(e for e in ests if e.name == (here or names[0]))
    gain = ref.finish_s - best.finish_s
    stay_word = "stay on" if here else "start on"
    if best.name != ref.name and gain > margin_s:
        verb = "move to" if here else "start on"
        return SiteChoice(best.name, here is not None, (
            f"{verb} {best.name}: done in ~{_h(best.finish_s)} ({_parts(best)}) against ~{_h(ref.finish_s)} "
            f"on {ref.name} ({_parts(ref)}); saves {_h(gain)} > margin {_h(margin_s)}"), ests, margin_s)
    if best.name == ref.name:
        others = [e for e in ests if e.name != ref.name]
        tail = f"; next {min(others, key=lambda e: e.finish_s).name} ~{_h(min(e.finish_s for e in others))}" \
            if others else ""
        return SiteChoice(ref.name, False, f"{stay_word} {ref.name}: done in ~{_h(ref.finish_s)} ({_parts(ref)}), "
                                           f"the earliest{tail}", ests, margin_s)
    return SiteChoice(ref.name, False, (
        f"{stay_word} {ref.name}: done in ~{_h(ref.finish_s)}; {best.name} ~{_h(best.finish_s)} saves {_h(gain)}, "
        f"not more than the margin {_h(margin_s)}"), ests, margin_s)


def race_sites(choice: SiteChoice | None, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Which of ``names`` (in order of preference) a raced segment is submitted on, and why each other is not.

    A racer elsewhere pays off only by starting sooner than the rule's site would; on a cluster where
    the chain, even started this instant, is done later than on the rule's site after its median wait
    (a slower pace, a transfer), it cannot win that way, and a race keeps whichever racer starts first.
    So the race takes the rule's site, every site not weighed (its wait unknown: the race finds it out),
    and every other site done no later when started now than the rule's site after its median wait.
    Equal paces and no transfer (segment 0 on clusters alike): every site races. No choice: every site."""
    pick = next((e for e in choice.estimates if e.name == choice.site), None) if choice is not None else None
    if pick is None:
        return list(names), {}
    skipped = {}
    for e in choice.estimates:
        now_s = e.finish_s - e.wait_s  # done this long from now, started at once
        if e.name != pick.name and now_s > pick.finish_s:
            skipped[e.name] = (f"not raced on {e.name}: done in ~{_h(now_s)} even starting now, against "
                               f"~{_h(pick.finish_s)} on {pick.name} ({_parts(pick)})")
    return [n for n in names if n not in skipped], skipped


def described(e: SiteEstimate) -> str:
    """``done in ~45.0 h (start ~0 min, ...)``: one site's numbers as every decision says them."""
    return f"done in ~{_h(e.finish_s)} ({_parts(e)})"


def _parts(e: SiteEstimate) -> str:
    out = f"start ~{_h(e.wait_s)}"
    if e.transfer_s:  # a measured copy may take seconds: below a minute in seconds ("0 min" would hide it)
        out += ", transfer " + (_h(e.transfer_s) if e.transfer_s >= 60 else f"{e.transfer_s:.0f} s")
    if e.restart_s > 0:  # below a minute in seconds: "0 min" would hide it
        out += ", restart " + (_h(e.restart_s) if e.restart_s >= 60 else f"{e.restart_s:.0f} s")
    if e.pace != 1.0:
        out += f", pace {e.pace:.3g}"
    return out


def _h(s: float) -> str:
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
