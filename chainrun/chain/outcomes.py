"""How a segment ended, and what it means for the chain.

Two witnesses: the outcome file the wrapper writes (what the payload did) and sacct's
final state (what Slurm did). The file wins when it exists; without it (the job was
killed before it could write, or the node died) the Slurm state decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from chainrun.chain.contract import control_path, parse_outcome
from chainrun.runner.base import Runner
from chainrun.slurm.parsers import AcctRow
from chainrun.state.records import CANCELLED_OUT, CONTINUE, CRASH, DONE, ENDED, HANDOFF, SKIPPED, Chain, Segment

FINAL_STATES = {
    "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "REVOKED",
}
_CRASH_STATES = {"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def is_final(state: str) -> bool:
    return state in FINAL_STATES


@dataclass(frozen=True)
class Result:
    outcome: str
    credit_s: float
    reason: str
    message: str
    external: bool = False  # cancelled by someone other than chainrun


def read_outcome_file(runner: Runner, chain: Chain, seg: Segment) -> dict[str, str]:
    res = runner.run(["cat", control_path(chain.run_dir, seg.idx, "outcome")], 30)
    if not res.ok:
        return {}
    info = parse_outcome(res.stdout)
    # a file left by another job with the same index (a resubmission) does not count
    if info.get("job") and seg.job_id and info["job"] != seg.job_id:
        return {}
    return info


def classify(chain: Chain, seg: Segment, row: AcctRow, info: dict[str, str]) -> Result:
    elapsed = _elapsed(row)
    limit = row.time_limit_s or seg.time_limit_s
    what = f"segment {seg.idx} (job {row.job_id})"
    outcome = info.get("outcome")
    we_cancelled = bool(seg.extra.get("cancel_requested"))
    if outcome == DONE:
        return Result(DONE, elapsed, "payload said done", f"{what} finished training")
    if row.state == "CANCELLED" and not we_cancelled:
        reason = f"{what} was cancelled outside chainrun ({row.state_detail})"
        return Result(CANCELLED_OUT, elapsed, reason, reason, external=True)
    if outcome == SKIPPED:
        return Result(SKIPPED, 0.0, "chain already finished", f"{what} had nothing to do")
    if outcome == HANDOFF:
        return Result(HANDOFF, elapsed, "handed off", f"{what} handed off to its successor after {_fmt(elapsed)}")
    if outcome == CONTINUE:
        # ran its planned length (signal or limit): the whole allocation counts toward --total
        signaled = info.get("signaled") == "1" or row.state == "TIMEOUT"
        credit = float(limit) if signaled and limit else elapsed
        how = "checkpointed on the signal" if info.get("signaled") == "1" else "exited cleanly"
        return Result(CONTINUE, credit, how, f"{what} {how}; next segment continues")
    if outcome == CRASH:
        code = info.get("exit", str(row.exit_code))
        return Result(CRASH, 0.0, f"payload exit code {code}", f"{what} crashed: payload exit code {code}")
    # no outcome file: the wrapper was killed, or never ran
    if row.state == "TIMEOUT":
        return Result(CONTINUE, float(limit or elapsed), "reached its time limit",
                      f"{what} reached its time limit; next segment resumes from the last checkpoint")
    if row.state == "PREEMPTED":
        return Result(CONTINUE, elapsed, "preempted", f"{what} was preempted; next segment resumes")
    if row.state == "CANCELLED":
        return Result(CANCELLED_OUT, elapsed, "cancelled by chainrun", f"{what} cancelled")
    if row.state in _CRASH_STATES:
        reason = f"{row.state.lower().replace('_', ' ')}, exit {row.exit_code}:{row.exit_signal}"
        return Result(CRASH, 0.0, reason, f"{what} failed: {reason}")
    return Result(CONTINUE, elapsed, f"ended {row.state} without an outcome file", f"{what} ended ({row.state})")


def record_overlaps(segs: list[Segment]) -> None:
    """Overlap of each segment with its predecessor: the time both held resources."""
    ran = [s for s in segs if s.start is not None]
    for prev, nxt in zip(ran, ran[1:]):
        if prev.phase == ENDED and prev.end is not None and nxt.start is not None:
            nxt.overlap_s = max(0.0, prev.end - nxt.start)
            nxt.extra["gap_s"] = nxt.start - prev.end


def _elapsed(row: AcctRow) -> float:
    if row.elapsed_s is not None:
        return float(row.elapsed_s)
    if row.start and row.end:
        return max(0.0, row.end - row.start)
    return 0.0


def _fmt(seconds: float) -> str:
    from chainrun.durations import format_duration

    return format_duration(seconds)
