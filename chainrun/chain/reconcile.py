"""Is this Slurm job really the one we recorded? Identity checks the engine makes on every tick.

A job id alone is not an identity: after a controller reset (or on another cluster) ids
start again, so a recorded id can come back naming somebody else's job. A job is ours only
when its name is the segment's ``cr.<chain>.<idx>`` and it was submitted around the time we
submitted it. The same checks find *strays*: a second job for a segment we already gave up
on (a submission that looked failed but landed late), which must not train alongside.
"""

from __future__ import annotations

from typing import Iterable, Protocol

from chainrun.chain.segments import job_name, parse_job_name
from chainrun.state.records import ENDED, LIVE_PHASES, Segment

ACCT_PLACEHOLDER_NAME = "allocation"
REUSE_SLACK_S = 3600  # a recorded job whose Slurm submit time is this far from ours is another job
EARLIER_S = 60  # a job with our id submitted this long before ours held the id before us (our clock may lag)
UNCONFIRMED = "submission was not confirmed and no such job exists"
_LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "RESIZING"}


class JobRow(Protocol):
    job_id: str
    name: str
    submit: float | None


def is_ours(chain_id: str, seg: Segment, row: JobRow) -> bool:
    """``row`` (from squeue or sacct) is the job recorded for ``seg``, not a job that reuses its id."""
    # sacct names a job "allocation" for about a second after it ended before its script ran (seen on the
    # test cluster with a segment whose output file could not be opened): no name yet, not another job's
    if row.name and row.name != ACCT_PLACEHOLDER_NAME and row.name != job_name(chain_id, seg.idx):
        return False
    ref = seg.submit or seg.intent_at
    if row.name and seg.start and row.submit and row.submit >= seg.start:
        return True  # a requeue of the job we saw start gives it a new submit time (job_mgr.c), never an earlier one
    return not (ref and row.submit and abs(row.submit - ref) > REUSE_SLACK_S)


def match_rows(rows: Iterable, recorded: dict[str, list[tuple[object, Segment]]]) -> tuple[dict, list]:
    """Give each Slurm row (squeue or sacct) to the recorded segment it belongs to.

    ``recorded``: job id -> the (chain, segment) pairs that recorded it (after an id reuse two
    segments may hold one id). Returns ``{(chain id, idx): row}`` and the (chain, segment, row)
    triples where a *later* job now holds a segment's id. A row is matched per segment, never by
    id alone: the chain's own job is never taken for another's, and a job that held the id
    *before* ours (sacct keeps older jobs of a reused id) is history, not a warning.
    """
    mine: dict[tuple[str, int], object] = {}
    seg_of: dict[tuple[str, int], Segment] = {}
    foreign = []
    rows = list(rows)
    for row in rows:
        holders = recorded.get(row.job_id) or []
        owners = [(c, s) for c, s in holders if is_ours(c.id, s, row)]
        for c, s in owners:
            key = (c.id, s.idx)
            seg_of[key] = s
            if key not in mine or (row.submit or 0) >= (mine[key].submit or 0):  # a requeued job: its last run
                mine[key] = row
        for c, s in holders:
            if any(o is s for _, o in owners):
                continue
            ref = s.submit or s.intent_at
            if not (ref and row.submit and row.submit < ref - EARLIER_S):
                foreign.append((c, s, row))
    for key, last in mine.items():
        note_earlier_runs(seg_of[key], last, rows)
    return mine, foreign


def note_earlier_runs(seg: Segment, last: JobRow, rows: list) -> None:
    """A requeued job runs again under its id; ``sacct -D`` lists each run as a row (the earlier ones
    REQUEUED, NODE_FAIL or PREEMPTED, submit times reset by each requeue). The earlier runs of the
    segment's job, oldest first, go to ``seg.extra["runs_before"]`` (their training is added to the
    last run's: outcomes.earlier_runs), and ``requeues`` counts them even if no tick saw the job pending
    again. Rows of an older job that held the id before ours (submitted before our intent) are not runs."""
    first = min(x for x in (seg.intent_at, seg.submit) if x) if (seg.intent_at or seg.submit) else None
    before = sorted((r for r in rows if r is not last and r.job_id == last.job_id and r.name == last.name
                     and r.submit and last.submit and r.submit < last.submit
                     and getattr(r, "start", None) and getattr(r, "end", None)
                     and not (first and r.submit < first - EARLIER_S)), key=lambda r: r.submit)
    if not before:
        return
    seg.extra["runs_before"] = [{"start": r.start, "end": r.end, "state": getattr(r, "state", "")} for r in before]
    seg.extra["requeues"] = max(int(seg.extra.get("requeues") or 0), len(before))


def reuse_note(chain_id: str, seg: Segment, row: JobRow) -> str:
    return (f"job id {row.job_id} now names another job ({row.name or '?'}, submitted "
            f"{row.submit or '?'}); segment {seg.idx} is resolved from accounting instead")


def strays(queue: Iterable, segs_by_chain: dict[str, list[Segment]], user: str) -> list[tuple[str, Segment, object]]:
    """Live jobs of our active chains that no live segment owns: (chain id, segment, queue row).

    Only jobs named for a segment we recorded and submitted after its intent count, so jobs of
    another chainrun store that happens to use the same chain id are never touched.
    """
    out = []
    for q in queue:
        if q.state not in _LIVE_STATES or (user and q.user and q.user != user):
            continue
        parsed = parse_job_name(q.name)
        if not parsed or parsed[0] not in segs_by_chain:
            continue
        seg = next((s for s in segs_by_chain[parsed[0]] if s.idx == parsed[1]), None)
        if seg is None or seg.job_id == q.job_id:
            continue
        if q.submit and seg.intent_at and q.submit < seg.intent_at - 120:
            continue
        if (seg.phase == ENDED and seg.reason == UNCONFIRMED) or (seg.phase in LIVE_PHASES and seg.job_id):
            out.append((parsed[0], seg, q))
    return out


def unconfirmed_run(segs: list[Segment]) -> int:
    """How many of the latest segments in a row were given up as never created by sbatch."""
    n = 0
    for s in reversed(segs):
        if s.phase == ENDED and s.reason == UNCONFIRMED:
            n += 1
        else:
            break
    return n
