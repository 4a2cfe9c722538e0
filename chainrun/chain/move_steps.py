"""What the driver does next for one move between clusters: a pure function of what it has seen.

A move hands a chain from the segment training on site A (the predecessor, generation G-1) to a
segment submitted on site B (the successor, generation G). No filesystem is shared, so neither Slurm
nor the wrapper can keep the two apart: the driver does, in this order (docs/remote-clusters.md,
"Moving between clusters"):

1. while the predecessor trains, copy its newest complete checkpoint to B (a copy ahead);
2. once the successor runs (it waits, gated, for a go-ahead) or the predecessor has ended, write
   ``moved.<G>`` into A's control folder: no run below generation G starts training there again
   (a requeued or late predecessor);
3. if the predecessor still trains, ask it to hand off (``handoff.<G-1>`` on its site), as a successor
   on its own site would; not while copies to B fail (none verified since the last failure): a broken
   route must not stop training for a move that cannot complete (asked once a copy works again);
4. once the predecessor has released (``released.<G-1>``) or its job has ended: copy its final
   checkpoint, or resume from the copy ahead and redo the steps since (on B, at B's pace), whichever is
   expected to cost less; verify the copy on B;
5. then, and only then, write ``go.<G>`` into B's control folder.

The driver may die between any two steps; every action is idempotent and the move's phase is kept in
the store, so the next watcher repeats at most the step it was in. A go-ahead is never written before
the predecessor is known to have stopped: an unreachable site A stalls the move (and the successor ends
``unstarted`` at its limit), it never makes two copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# phases of a move (kept in the successor segment's extra["move"]["phase"])
AHEAD = "ahead"  # successor submitted on B; copying ahead while the predecessor trains
FENCED = "fenced"  # moved.<G> written on A; waiting for the predecessor to stop
GO = "go"  # go.<G> written on B
ABANDONED = "abandoned"  # the successor ended before its go-ahead: the chain plans again

# actions, in the order they must be carried out within one tick
COPY = "copy"  # copy (or resume copying) the named checkpoint from A to B and verify it there
FENCE = "fence"  # write moved.<G> into A's control folder
ASK_HANDOFF = "ask-handoff"  # write handoff.<G-1> into A's control folder
GO_AHEAD = "go"  # write go.<G> into B's control folder, naming the verified checkpoint
CANCEL = "cancel"  # the successor on B is no longer wanted while it still pends


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint as its manifest names it."""

    generation: int
    step: int
    size_bytes: int = 0


@dataclass(frozen=True)
class Seen:
    """What the driver read this tick (None: that site did not answer)."""

    successor: str  # the successor's phase: SUBMITTING, PENDING, RUNNING or ENDED
    predecessor_live: bool | None  # its job is pending or running on A (None: A did not answer)
    released: bool | None  # released.<G-1> exists on A (None: A did not answer)
    newest: Checkpoint | None  # the newest complete checkpoint on A (None: none, or A did not answer)
    copied: Checkpoint | None  # the newest copy verified on B
    copying: bool = False  # a copy is under way
    # what the expected-cost choice needs: seconds per step (measured on A), throughput A->B (bytes/s),
    # and B's pace against A (site_pace.SitePace.pace: work per wall second there over A's): the steps
    # redone after resuming from an older copy run on B, each taking step_s / pace there
    step_s: float = 0.0
    throughput_bps: float = 0.0
    pace: float = 1.0
    # the last copy to B failed (and none verified since): the route may be broken, so the predecessor is
    # not asked to stop training for a move that may never complete; asked: handoff.<G-1> is written on A
    copy_failing: bool = False
    asked: bool = False


@dataclass
class Step:
    phase: str
    actions: list[tuple[str, Checkpoint | None]] = field(default_factory=list)
    why: str = ""


def next_step(phase: str, seen: Seen) -> Step:
    """The move's next phase and the actions that get it there; the caller carries out the actions in
    order and stores the phase only once they all succeeded (so a failed action is retried next tick)."""
    if phase in (GO, ABANDONED):
        return Step(phase)
    if seen.successor == "ENDED":  # it left before its go-ahead (its limit, a cancel): plan again
        return Step(ABANDONED, why="the successor ended before its go-ahead")
    stopped = seen.predecessor_live is False or seen.released is True
    if phase == AHEAD:
        if seen.successor != "RUNNING" and not stopped:
            return Step(AHEAD, _copy_ahead(seen), "copying ahead while the predecessor trains")
        actions = [(FENCE, None)]
        if not stopped and not seen.copy_failing:
            actions.append((ASK_HANDOFF, None))
        why = ("the predecessor has stopped" if stopped else "the successor runs" if not seen.copy_failing
               else "the successor runs; copies to the new site fail, so the predecessor trains on until one works")
        return Step(FENCED, actions + _copy_ahead(seen), why)
    # FENCED: wait for the predecessor to stop; then the checkpoint to resume from, verified, then go
    if not stopped:
        if not seen.asked and not seen.copy_failing and seen.successor == "RUNNING":  # a copy works again
            return Step(FENCED, [(ASK_HANDOFF, None)] + _copy_ahead(seen), "a copy to the new site works again")
        return Step(FENCED, _copy_ahead(seen), "waiting for the predecessor to release")
    target = resume_from(seen)
    if target is None:
        return Step(FENCED, why="no complete checkpoint is known on either site yet")
    if seen.copied is not None and seen.copied.generation == target.generation and seen.copied.step == target.step:
        return Step(GO, [(GO_AHEAD, target)], f"resuming from step {target.step} (verified on the new site)")
    if seen.copying:
        return Step(FENCED, why="copying the final checkpoint")
    return Step(FENCED, [(COPY, target)], f"copying step {target.step} before the go-ahead")


@dataclass(frozen=True)
class ResumeCost:
    """The two expected costs ``resume_from`` weighs once the predecessor stopped, in seconds before the
    chain is back at the final checkpoint's step on B: redo the steps since the copy ahead, on B, or wait
    for the final checkpoint's transfer."""

    ahead: Checkpoint
    final: Checkpoint
    step_s: float  # measured on A, where the chain trained
    pace: float  # B's against A's: a step on B takes step_s / pace
    transfer_s: float

    @property
    def redo_s(self) -> float:
        return (self.final.step - self.ahead.step) * self.step_s / self.pace

    @property
    def target(self) -> Checkpoint:
        return self.ahead if self.redo_s < self.transfer_s else self.final

    def as_dict(self) -> dict:
        return {"ahead_step": self.ahead.step, "final_step": self.final.step, "step_s": round(self.step_s, 3),
                "pace": round(self.pace, 4), "redo_s": round(self.redo_s, 1), "transfer_s": round(self.transfer_s, 1),
                "resume_step": self.target.step}

    def words(self, pace_from: str = "") -> str:
        """The choice and its numbers, for the move's event; ``pace_from``: where the pace came from."""
        said = f", {pace_from}" if pace_from else ""
        redo = (f"redo {self.final.step - self.ahead.step} steps from the copy at step {self.ahead.step} "
                f"({_s(self.step_s)} s a step where it trained; pace {self.pace:.3g} there{said}: {_s(self.redo_s)} s)")
        wait = f"wait {_s(self.transfer_s)} s for step {self.final.step}'s transfer"
        if self.target == self.ahead:
            return f"resume from step {self.ahead.step}: {redo} < {wait}"
        return f"resume from step {self.final.step}: {wait} <= {redo}"


def _s(x: float) -> str:
    """Seconds as a person reads them: a tenth below 100 s (two close costs must not both read "20")."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}".removesuffix(".0")


def resume_cost(seen: Seen) -> ResumeCost | None:
    """The costs of the two checkpoints to resume from; None when there is no choice (no final one known,
    or the copy ahead is the final one) or a cost is unknown (no pace or rate measured)."""
    final, ahead = seen.newest, seen.copied
    if final is None or ahead is None or (ahead.generation, ahead.step) >= (final.generation, final.step):
        return None
    if seen.step_s <= 0 or seen.throughput_bps <= 0 or not (seen.pace > 0 and math.isfinite(seen.pace)):
        return None
    return ResumeCost(ahead, final, seen.step_s, seen.pace, final.size_bytes / seen.throughput_bps)


def resume_from(seen: Seen) -> Checkpoint | None:
    """The checkpoint the successor resumes from once the predecessor stopped: the final one (copied
    now: the successor waits for the transfer) or the copy ahead (ready: the steps since are redone on
    B, at B's pace), whichever costs less expected time. Unknown costs choose the final checkpoint (no
    work lost)."""
    if seen.newest is None:
        return seen.copied
    cost = resume_cost(seen)
    return cost.target if cost is not None else seen.newest


def _copy_ahead(seen: Seen) -> list[tuple[str, Checkpoint | None]]:
    """Copy the newest complete checkpoint ahead when it is newer than what B holds and no copy runs."""
    if seen.copying or seen.newest is None:
        return []
    if seen.copied is not None and (seen.copied.generation, seen.copied.step) >= (seen.newest.generation, seen.newest.step):
        return []
    return [(COPY, seen.newest)]
