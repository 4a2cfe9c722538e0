"""The chains the self-tuning replay injects, shaped like the user's own (docs/self-tuning.md, step 3).

The replay (chainrun/sim/chains.py) counts whole nodes, not GPUs: a chain's size is the node count its
jobs were given (sacct's NNodes, from the refresh's history), else the one its options ask for. A chain
asking for GPUs without ``--nodes`` (``--gpus=8`` on 4-GPU nodes) is injected on the nodes those GPUs
took, not on one. Pure but for the read of the user's chains from the store.
"""

from __future__ import annotations

from statistics import median_high  # the upper middle: a count stays a count
from typing import TYPE_CHECKING

from chainrun.chain.request import requested_nodes

if TYPE_CHECKING:  # pandas is heavy: the caller passes the history it already read
    import pandas as pd

WORK_SEGMENTS = 3.5  # a chain without a user's chain to copy: 3.5 segments (the evaluation's 168 h / 48 h)


def chain_shape(cluster: str, partition: str, max_time_s: float | None,
                history: "pd.DataFrame | None" = None) -> dict:
    """Chains shaped like the user's: the median node count, segment and work of their latest
    (at most 20) chains on this cluster and partition; else one node, the partition's limit (48 h
    when it has none) and WORK_SEGMENTS of it. A chain's node count is what its jobs were given
    (``allocated``: their NNodes in ``history``, the sacct cache), else what it asked for (``--nodes``):
    a chain asking for GPUs (``--gpus=8``) without ``--nodes`` holds as many whole nodes as those
    GPUs take, and the replay counts nodes. ``gpus`` is its jobs' median GPU count (None: unknown)."""
    from chainrun.paths import state_db

    mine, jobs = [], {}
    if state_db().exists():
        from chainrun.state.store import Store

        store = Store(state_db())
        try:
            mine = [c for c in store.chains() if c.cluster == cluster and (c.partition or "") == partition][-20:]
            jobs = {c.id: [s.job_id for s in store.segments(c.id) if s.job_id] for c in mine}
        finally:
            store.close()
    if mine:
        given = allocated(history, jobs)
        sizes = [given[c.id]["nodes"] if c.id in given else requested_nodes(c.sbatch_args) for c in mine]
        gpus = [given[c.id]["gpus"] for c in mine if given.get(c.id, {}).get("gpus")]
        said = f"; nodes as Slurm gave them to {len(given)}" if given else ""
        return {"source": f"your {len(mine)} chain(s) on this partition{said}", "nodes": median_high(sizes),
                "gpus": median_high(gpus) if gpus else None,
                "segment_s": float(median_high([c.segment_s for c in mine])),
                "work_s": float(median_high([c.total_s for c in mine])),
                "signal_lead_s": float(median_high([c.signal_lead_s for c in mine]))}
    seg = float(max_time_s) if max_time_s else 48 * 3600.0
    return {"source": "no chain of yours here: one node, the partition's limit", "nodes": 1, "gpus": None,
            "segment_s": seg, "work_s": WORK_SEGMENTS * seg, "signal_lead_s": min(300.0, seg / 10)}


def allocated(history: "pd.DataFrame | None", jobs: dict[str, list[str]]) -> dict[str, dict]:
    """Per chain, the median node and GPU count of its jobs that ran, as the history (sacct) recorded
    them; chains none of whose jobs is in the history are left out."""
    if history is None or history.empty or not jobs:
        return {}
    ran = history[history["nodes"].fillna(0) > 0]
    by_id = {str(j): (int(n), int(g)) for j, n, g in zip(ran["job_id"], ran["nodes"], ran["gpus"].fillna(0))}
    out = {}
    for cid, ids in jobs.items():
        got = [by_id[j.split(";")[0]] for j in ids if j.split(";")[0] in by_id]
        if got:
            out[cid] = {"nodes": median_high([n for n, _ in got]), "gpus": median_high([g for _, g in got]) or None}
    return out
