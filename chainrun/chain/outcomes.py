"""How a segment ended, and what it means for the chain.

Two witnesses: the outcome file the wrapper writes (what the payload did) and sacct's
final state (what Slurm did). The file wins when it exists; without it (the job was
killed before it could write, or the node died) the Slurm state decides.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Callable

from chainrun.chain.contract import control_path, parse_outcome
from chainrun.runner.base import Runner
from chainrun.slurm.parsers import AcctRow
from chainrun.state.records import (
    CANCELLED_OUT, CHECKPOINT_CRASH, CONTINUE, CRASH, DONE, ENDED, HANDOFF, NO_RUN_FOLDER, SKIPPED, UNSTARTED, Chain,
    Segment,
)

# the wrapper's exit code when the run folder (its token, control/token) is not there on its node: it
# trains nothing and usually cannot write an outcome file either (templates/wrapper.sh)
NO_RUN_FOLDER_EXIT = 86
# the batch step could not open its output file, so the script never ran (sacct ExitCode 0:53)
OUTPUT_NOT_OPENED_SIGNAL = 53

FINAL_STATES = {
    "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "REVOKED",
}
_CRASH_STATES = {"FAILED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
_LOST_NODE_STATES = {"NODE_FAIL", "PREEMPTED"}  # the job's node went away under it: not the payload's doing


def is_final(state: str) -> bool:
    return state in FINAL_STATES


@dataclass(frozen=True)
class Result:
    outcome: str
    credit_s: float
    reason: str
    message: str
    external: bool = False  # cancelled by someone other than chainrun


def read_outcome_file(runner: Runner, chain: Chain, seg: Segment, *, run_start: float | None = None) -> dict[str, str]:
    """What the wrapper wrote about this job: its outcome file, else its last state (``phase=...``).

    A segment killed before it could write an outcome still left its state: ``waiting`` (it
    never trained) or ``training`` with the payload's start time. ``run_start``: when the job's
    last run started (a requeued job runs again under the same id); what an earlier run wrote
    does not count.
    """
    for kind in ("outcome", "state"):
        res = runner.run(["cat", control_path(chain.run_dir, seg.idx, kind)], 30)
        if not res.ok:
            continue
        info = parse_outcome(res.stdout)
        raw = next((line.partition("=")[2].strip() for line in res.stdout.splitlines()
                    if line.partition("=")[0].strip() == "outcome"), "")
        if raw == NO_RUN_FOLDER:  # known to this reader whether or not the contract's list has it yet
            info["outcome_raw"] = raw
        # a file left by another job with the same index (a resubmission) does not count
        if info.get("job") and seg.job_id and info["job"] != seg.job_id:
            continue
        if run_start and earlier_run(info, run_start):
            continue
        if kind == "state" or info.get("outcome") or info.get("outcome_raw"):
            return info
    return {}


REQUEUE_SLACK_S = 5.0  # clocks of the node and of slurmctld may differ a little


def earlier_run(info: dict[str, str], run_start: float) -> bool:
    """The wrapper wrote ``info`` in an earlier run of the same job (before a requeue): its write time,
    or its payload's start, comes before this run started."""
    when = _num(info.get("written")) or _num(info.get("payload_start")) or _num(info.get("since"))
    return when is not None and when < run_start - REQUEUE_SLACK_S


@dataclass(frozen=True)
class Run:
    """One earlier run of a requeued job: sacct's row of it, and what its wrapper recorded."""
    start: float
    end: float
    state: str
    trained_s: float
    held_s: float


def earlier_runs(runner: Runner, chain: Chain, seg: Segment) -> list[Run]:
    """The runs of a requeued job before its last one, oldest first. Slurm's rows of them (``sacct -D``;
    reconcile.match_rows keeps them in ``seg.extra["runs_before"]``) say when each held its allocation;
    each run's own record, ``seg-<N>.run-<restart>`` (the wrapper writes it at training start and at its
    outcome, and no later run overwrites it), says when its payload trained. A run with no record
    trained nothing that can be shown. One ``cat`` per earlier run: requeues are rare."""
    rows = seg.extra.get("runs_before") or []
    records = []
    for i in range(len(rows)):
        try:
            res = runner.run(["cat", control_path(chain.run_dir, seg.idx, f"run-{i}")], 30)
        except Exception:  # unreachable: the run's training is not known, never guessed
            continue
        rec = parse_outcome(res.stdout) if res.ok else {}
        if rec and not (rec.get("job") and seg.job_id and rec["job"] != seg.job_id):
            records.append(rec)
    runs = []
    for r in rows:
        start, end = float(r["start"]), float(r["end"])
        trained = 0.0
        for rec in records:  # the record whose payload started within this run (restart counts may skip)
            ps = _num(rec.get("payload_start"))
            if ps is not None and start - REQUEUE_SLACK_S <= ps <= end + REQUEUE_SLACK_S:
                pe = _num(rec.get("payload_end"))
                trained = max(0.0, (pe if pe is not None else end) - ps)  # a lost run: until Slurm ended it
                break
        runs.append(Run(start, end, str(r.get("state") or ""), trained, max(0.0, end - start)))
    return runs


def add_earlier_runs(result: Result, seg: Segment, runs: list[Run]) -> Result:
    """The segment's figures over all its runs: what the earlier runs of a requeued job trained adds to
    the last run's credit (it never replaces it), and what they held is kept in
    ``seg.extra["held_before_s"]`` beside the last run's start and end (the chain's allocated time)."""
    if not runs:
        return result
    trained, held = sum(r.trained_s for r in runs), sum(r.held_s for r in runs)
    seg.extra["earlier_runs"] = [{"start": r.start, "end": r.end, "state": r.state, "trained_s": r.trained_s}
                                 for r in runs]
    seg.extra["trained_before_s"], seg.extra["held_before_s"] = trained, held
    note = (f"{len(runs)} earlier run(s) of the job before Slurm requeued it add {_fmt(trained)} of training "
            f"({_fmt(held)} held)")
    return Result(result.outcome, result.credit_s + trained, result.reason, f"{result.message}; {note}",
                  result.external)


def read_tail(runner: Runner, chain: Chain, seg: Segment) -> str:
    """The last lines of a failed segment's output, as the wrapper kept them."""
    res = runner.run(["cat", control_path(chain.run_dir, seg.idx, "tail")], 30)
    return res.stdout.strip() if res.ok else ""


def payload_window(info: dict[str, str], row: AcctRow | None) -> tuple[float, float | None] | None:
    """When the payload of a job trained: (start, end); end is None while it still trains."""
    start = _num(info.get("payload_start"))
    if start is None:
        return None
    end = _num(info.get("payload_end"))
    if end is None and row is not None and row.end:
        end = float(row.end)  # killed before it could write the end: it trained until the job ended
    return start, end


def classify(chain: Chain, seg: Segment, row: AcctRow, info: dict[str, str],
             checkpoint_time: Callable[[], float | None] | None = None,
             cancel_record: Callable[[str], dict[str, str]] | None = None) -> Result:
    """How the segment ended. ``checkpoint_time`` (asked only for a payload killed after the signal)
    gives the time of its newest checkpoint, so the message says what is known instead of
    "checkpointed". ``cancel_record`` reads ``control/cancel.<G>`` (read_cancel_record), asked only
    for a job that was cancelled or signalled: a successor that stopped this owner wrote it."""
    cut = stopped_by_successor(seg, row, info, cancel_record)
    result = _classify(chain, seg, row, info, checkpoint_time, cut)
    if cut and result.outcome != CANCELLED_OUT:
        text = cut_text(cut)
        return Result(result.outcome, result.credit_s, f"{result.reason}; {text}", f"{result.message}; {text}")
    return result


def _classify(chain: Chain, seg: Segment, row: AcctRow, info: dict[str, str],
              checkpoint_time: Callable[[], float | None] | None, cut: dict[str, str]) -> Result:
    elapsed = _elapsed(row)
    what = f"segment {seg.idx} (job {row.job_id})"
    outcome = info.get("outcome")
    we_cancelled = bool(seg.extra.get("cancel_requested"))
    window = payload_window(info, row)
    # --total counts training: the payload's run time (docs/checkpoint-contract.md)
    trained = max(0.0, window[1] - window[0]) if window and window[1] is not None else 0.0
    never_trained = outcome in (UNSTARTED, SKIPPED) or (outcome is None and window is None and info.get("phase") == "waiting")
    if outcome == DONE:
        return Result(DONE, trained, "payload said done", f"{what} finished training")
    if is_no_run_folder(row, info):
        node = ran_on(row) or "?"
        seen = f" ({info['reason']})" if info.get("reason") else ""  # the wrapper's words, where it could write
        reason = (f"the run folder {chain.run_dir} is not visible on node {node}{seen}: put it on a shared "
                  "filesystem (one every compute node mounts)")
        return Result(NO_RUN_FOLDER, 0.0, reason, f"{what} trained nothing: {reason}")
    if row.state == "CANCELLED" and not we_cancelled and not cut and not (never_trained and outcome == UNSTARTED):
        reason = f"{what} was cancelled outside chainrun ({row.state_detail})"
        return Result(CANCELLED_OUT, trained, reason, reason, external=True)
    if outcome == SKIPPED:
        return Result(SKIPPED, 0.0, "chain already finished", f"{what} had nothing to do")
    if never_trained:
        how = f"got {info['stopped_by']}" if info.get("stopped_by") else f"ended {row.state}"
        gated = "gated" in (info.get("handoff_mode"), info.get("mode"))  # moving between clusters
        waited = "the go-ahead to train on this site" if gated else "its predecessor's hand-off"
        # the wrapper's own words when it chose to end (superseded, the chain moved to another site, ...)
        said = info.get("reason") or f"{how} while waiting for {waited}"
        reason = f"{said}; never trained"
        return Result(UNSTARTED, 0.0, reason, f"{what} {reason}")
    if outcome == HANDOFF:
        return Result(HANDOFF, trained, "handed off", f"{what} handed off to its successor after {_fmt(trained)} of training")
    if outcome == CONTINUE:
        then = "--total reached" if seg.extra.get("total_stop_at") else "next segment continues"  # total_stop.py
        killed = killed_by(info)
        if info.get("signaled") == "1" and killed:  # the wrapper counts it as stopped, but nothing says it saved
            how = _killed_text(chain, row, killed, info.get("exit", ""))
            saved = _checkpoint_note(checkpoint_time() if checkpoint_time else None, window, checkpoint_time is not None)
            return Result(CONTINUE, trained, how,
                          f"{what} {how} after {_fmt(trained)} of training" + (f"; {saved}" if saved else "") + f"; {then}")
        how = "checkpointed on the signal" if info.get("signaled") == "1" else "exited cleanly"
        return Result(CONTINUE, trained, how, f"{what} {how} after {_fmt(trained)} of training; {then}")
    if outcome == CHECKPOINT_CRASH:
        code = info.get("exit", str(row.exit_code))
        reason = f"crashed while checkpointing after the signal (exit {code})"
        return Result(CHECKPOINT_CRASH, trained, reason, f"{what} {reason}; the next segment resumes from the last good checkpoint")
    if outcome == CRASH:
        code = info.get("exit", str(row.exit_code))
        return Result(CRASH, trained, f"payload exit code {code}", f"{what} crashed: payload exit code {code}")
    # no outcome file: the wrapper was killed, or never ran
    if window is None and info.get("phase") != "training":
        trained = 0.0
    if row.state == "TIMEOUT":
        return Result(CONTINUE, trained, "reached its time limit",
                      f"{what} reached its time limit; next segment resumes from the last checkpoint")
    if row.state in _LOST_NODE_STATES:
        # not requeued by Slurm (--no-requeue, JobRequeue=0): retried as a new job, and a retry is spent
        # only if it trained (docs/reliability.md, "Requeue")
        how = "was preempted" if row.state == "PREEMPTED" else "lost its node (NODE_FAIL)"
        if window is None and info.get("phase") != "training":
            reason = f"{how} before training; retried as a new job"
            return Result(UNSTARTED, 0.0, reason, f"{what} {reason}")
        reason = f"{how} after {_fmt(trained)} of training, with no outcome written"
        return Result(CRASH, trained, reason, f"{what} {reason}; the next segment resumes from the last checkpoint")
    if row.state == "CANCELLED" and cut:  # its successor's scancel ended it before it wrote an outcome
        saved = _checkpoint_note(checkpoint_time() if checkpoint_time else None, window, checkpoint_time is not None)
        return Result(CONTINUE, trained, "cancelled by its successor",
                      f"{what} was cancelled after {_fmt(trained)} of training" + (f"; {saved}" if saved else "")
                      + "; the next segment resumes from the last checkpoint")
    if row.state == "CANCELLED":
        return Result(CANCELLED_OUT, trained, "cancelled by chainrun", f"{what} cancelled")
    if row.state in _CRASH_STATES or row.state == "COMPLETED":
        reason = f"{row.state.lower().replace('_', ' ')}, exit {row.exit_code}:{row.exit_signal}, no outcome written"
        return Result(CRASH, trained, reason, f"{what} failed: {reason}")
    return Result(CONTINUE, trained if window else elapsed, f"ended {row.state} without an outcome file",
                  f"{what} ended ({row.state})")


def read_cancel_record(runner: Runner, chain: Chain, gen: str) -> dict[str, str]:
    """``control/cancel.<gen>``: written by the wrapper of a segment that stopped the owner of generation
    ``gen`` (TERM through ``scancel --batch``, then ``scancel``) after it did not hand off in time; {}
    when there is none or it cannot be read."""
    try:
        res = runner.run(["cat", f"{chain.run_dir}/control/cancel.{gen}"], 30)
    except Exception:  # an unreachable cluster: the watcher knows less, it does not guess
        return {}
    return parse_outcome(res.stdout) if res.ok else {}


def stopped_by_successor(seg: Segment, row: AcctRow, info: dict[str, str],
                         cancel_record: Callable[[str], dict[str, str]] | None) -> dict[str, str]:
    """The cancel record naming this job, if a successor stopped it (chainrun's own wrapper: never
    "cancelled outside chainrun"); {} otherwise. Read only for a job Slurm shows CANCELLED, or whose
    wrapper wrote ``cut=1`` (it saw the record naming it when it wrote its outcome: the TERM path)."""
    gen = info.get("gen", "")
    if cancel_record is None or not gen.isdigit():
        return {}
    if row.state != "CANCELLED" and info.get("cut") != "1":  # cut=1: the wrapper saw the record naming it
        return {}
    rec = cancel_record(gen)
    return rec if rec.get("job") and rec.get("job") in (seg.job_id, row.job_id) else {}


def cut_text(rec: dict[str, str]) -> str:
    """Who stopped an owner that did not hand off, and after which bound (the save timeout)."""
    by = f"segment {rec.get('by_seg', '?')} (job {rec.get('by', '?')})"
    how = "sent it TERM, then cancelled it" if rec.get("how") == "scancel" else "sent it TERM"
    requested, deadline, timeout = _num(rec.get("requested")), _num(rec.get("deadline")), _num(rec.get("timeout"))
    if requested is not None and deadline is not None and timeout is not None and deadline < requested + timeout:
        bound = "by its own end (+ grace)"  # the wait never runs past the owner's end
    else:
        bound = f"within {_fmt(timeout)} of the request" if timeout is not None else "in time"
    return (f"{by} {how}: it had not handed off {bound} (the save timeout: max(signal lead + margin, "
            "--save-timeout); raise --save-timeout if its saves take longer)")


def killed_by(info: dict[str, str]) -> str:
    """The signal that killed the payload (``TERM``...) from the wrapper's exit code (128 + n), or ""."""
    code = _num(info.get("exit"))
    if code is None or not 128 < code < 128 + 65:
        return ""
    try:
        return signal.Signals(int(code) - 128).name.removeprefix("SIG")
    except ValueError:
        return f"signal {int(code) - 128}"


def _killed_text(chain: Chain, row: AcctRow, sig: str, code: str) -> str:
    if sig == chain.signal.removeprefix("SIG"):
        return f"was killed by the {sig} signal itself (exit {code}): it has no handler that saves and exits"
    if row.state == "TIMEOUT":
        return f"stopped at its time limit without reacting to the {chain.signal} signal (killed by {sig}, exit {code})"
    return f"was killed by {sig} (exit {code}) without having exited on the {chain.signal} signal"


def _checkpoint_note(mtime: float | None, window: tuple[float, float | None] | None, asked: bool) -> str:
    """What the checkpoint folder says about the last save; "" when it could not be asked."""
    if not asked:
        return ""
    if mtime is None:
        return "no checkpoint was found in its checkpoint folder"
    at = time.strftime("%H:%M:%S", time.localtime(mtime))
    end = window[1] if window else None
    if end is not None and mtime <= end:
        return f"the last checkpoint is from {at}, {_fmt(end - mtime)} before it stopped"
    return f"the last checkpoint is from {at}"


_NOT_CHECKPOINTS = ("*.log", "*.tmp", "*.tmp.*", ".*", "CHAINRUN_DONE")  # logs, temporary files, our marker


def newest_checkpoint(runner: Runner, chain: Chain) -> float | None:
    """The modification time of the newest file or folder in the checkpoint folder (two levels: a
    checkpoint may be a folder of shards), leaving out logs, temporary files and the done marker;
    None when there is none or it cannot be read. One ``find`` through the runner."""
    argv = ["find", chain.checkpoint_dir, "-mindepth", "1", "-maxdepth", "2"]
    for pattern in _NOT_CHECKPOINTS:
        argv += ["-not", "-name", pattern]
    argv += ["-printf", "%T@\\n"]
    try:
        res = runner.run(argv, 30)
    except Exception:  # an unreachable cluster: the message just says less
        return None
    times = [v for v in map(_num, res.stdout.split()) if v is not None] if res.ok else []
    return max(times) if times else None


def is_no_run_folder(row: AcctRow, info: dict[str, str]) -> bool:
    """The segment's node does not see its run folder. Two ways it shows: Slurm could not create the
    job's output file (in <run folder>/logs unless the user chose --output): the batch script never
    ran, and sacct says FAILED with ExitCode 0:53 (slurmstepd's job_rc 4021, ``& 127``; slurmd logs
    "Could not open stdout file"), and nothing was written; or the wrapper ran, found no token and
    exited 86, usually unable to write an outcome file (or wrote outcome ``no-run-folder``). A payload
    that exits 86 is a crash: its wrapper writes that outcome."""
    if info.get("outcome_raw") == NO_RUN_FOLDER or info.get("outcome") == NO_RUN_FOLDER:
        return True
    if row.state == "FAILED" and row.exit_code == 0 and row.exit_signal == OUTPUT_NOT_OPENED_SIGNAL and not info:
        return True
    return (not info.get("outcome") and row.exit_code == NO_RUN_FOLDER_EXIT and row.exit_signal == 0
            and info.get("phase") != "training")


def ran_on(row: AcctRow) -> str:
    """The node a job's batch script ran on (the first of its nodes); "" if Slurm did not say."""
    from chainrun.slurm.parsers import expand_hostlist

    nodes = expand_hostlist(row.nodelist) if row.nodelist else []
    return nodes[0] if nodes else ""


def payload_overlaps(windows: dict[str, tuple[float, float | None]], now: float) -> list[tuple[str, str, float]]:
    """Pairs of jobs of one chain whose payloads trained at the same time: (job a, job b, seconds)."""
    items = sorted(windows.items(), key=lambda kv: kv[1][0])
    out = []
    for i, (ja, (sa, ea)) in enumerate(items):
        for jb, (sb, eb) in items[i + 1:]:
            both = min(ea if ea is not None else now, eb if eb is not None else now) - max(sa, sb)
            if both > 0:
                out.append((ja, jb, round(both, 1)))
    return out


def record_overlaps(segs: list[Segment]) -> None:
    """Overlap of each segment with its predecessor: the time both held resources."""
    # segments that never trained (ended waiting for the chain, or had nothing to do) never held it
    ran = [s for s in segs if s.start is not None and s.outcome not in (UNSTARTED, SKIPPED)]
    for prev, nxt in zip(ran, ran[1:]):
        if prev.phase == ENDED and prev.end is not None and nxt.start is not None:
            nxt.overlap_s = max(0.0, prev.end - nxt.start)
            nxt.extra["gap_s"] = nxt.start - prev.end


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _elapsed(row: AcctRow) -> float:
    if row.elapsed_s is not None:
        return float(row.elapsed_s)
    if row.start and row.end:
        return max(0.0, row.end - row.start)
    return 0.0


def _fmt(seconds: float) -> str:
    from chainrun.durations import format_duration

    return format_duration(seconds)
