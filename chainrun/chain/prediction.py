"""The queue-delay model as the `predicted` policy sees it.

Built once per watcher; the model and the cached sacct history load on first use (they
are heavy), and every prediction reuses the rows of the tick's single ``squeue --all``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from chainrun.chain.policies import WaitEstimate, predict_quantile
from chainrun.errors import ChainrunError

if TYPE_CHECKING:
    from chainrun.context import Context
    from chainrun.slurm.parsers import QueueRow
    from chainrun.state.records import Chain, Segment

log = logging.getLogger(__name__)


def make_predictor(ctx: "Context"):
    """A callable (chain, segment, queue rows) -> WaitEstimate | None, or None if no model was trained."""
    return for_cluster(ctx.cluster)


def for_cluster(cluster: str):
    """``make_predictor`` by the cluster's name (a spanning chain's submit asks each site's model:
    chain/first_wait.py), or None if no model was trained there."""
    from chainrun.predict.service import model_dir

    mdir = model_dir(cluster)
    if not (mdir / "meta.json").exists():
        return None
    loaded: dict = {}

    def predict(chain: "Chain", seg: "Segment", rows: "list[QueueRow]") -> WaitEstimate | None:
        try:
            if not loaded:
                from chainrun.predict import ingest
                from chainrun.predict.model import load_predictor

                loaded["model"] = load_predictor(mdir)
                loaded["history"], loaded["info"] = ingest.load_cache(cluster)
            return _estimate(loaded["model"], _live(loaded, rows), chain, seg, rows)
        except ChainrunError as e:  # a broken model must not stop the chain: the policy falls back to lead
            log.warning("queue-delay model unavailable (%s); using the fixed lead", e)
            return None

    def shape_waits(chain: "Chain", seg: "Segment", rows: "list[QueueRow]", shapes: "list[int]") -> dict[int, float]:
        """Median predicted wait (s) per node count for the chain's next segment: one ``WaitRequest``
        per shape, one ``predict_many`` call. Empty when there is no usable model."""
        try:
            if not loaded:
                predict(chain, seg, rows)
            if not loaded:
                return {}
            return _shape_waits(loaded["model"], _live(loaded, rows), chain, seg, rows, shapes)
        except ChainrunError as e:
            log.warning("queue-delay model unavailable for the shape choice (%s)", e)
            return {}

    predict.shape_waits = shape_waits  # type: ignore[attr-defined]  (the engine asks for it only when planning)
    return predict


def _live(loaded: dict, rows: "list[QueueRow]"):
    """The cached history with the jobs this tick's squeue no longer shows closed
    (``model.close_gone``); the replay calls ``_estimate`` with its own exact history instead."""
    from chainrun.predict.model import close_gone
    from chainrun.predict.snapshot import snapshot_from_rows

    ids = frozenset(str(i) for i in snapshot_from_rows(rows)["job_id"])
    if loaded.get("live_ids") != ids:  # once per queue seen: every chain of a tick asks with the same rows
        loaded["live"] = close_gone(loaded["history"], ids, loaded["info"].get("last_refresh"))
        loaded["live_ids"] = ids
    return loaded["live"]


def _shape_waits(model, history, chain: "Chain", seg: "Segment", rows: "list[QueueRow]",
                 shapes: "list[int]") -> dict[int, float]:
    from chainrun.predict.model import WaitRequest
    from chainrun.predict.snapshot import snapshot_from_rows

    mine = next((r for r in rows if r.job_id == seg.job_id), None)
    per_node = (mine.nodes or 1) if mine else 1
    gpus = (mine.gpus // per_node) if mine and mine.gpus else 0  # GPUs per node stay as given
    cpus = (mine.cpus // per_node) if mine and mine.cpus else 0
    reqs = [WaitRequest(user=mine.user if mine else "", nodes=n, gpus=gpus * n, cpus=cpus * n,
                        timelimit_s=float(chain.segment_s), partition=chain.partition,
                        qos=mine.qos if mine else "", submit=time.time()) for n in shapes]
    snapshot = snapshot_from_rows([r for r in rows if r.job_id != seg.job_id])
    return {n: float(p.p50) for n, p in zip(shapes, model.predict_many(reqs, snapshot, history))}


def _estimate(model, history, chain: "Chain", seg: "Segment", rows: "list[QueueRow]", slurm=None) -> WaitEstimate:
    """The watcher's wait estimate for the chain's next segment. ``slurm`` (a SlurmView, or a
    callable giving one when the model is out of its depth) replaces the view of the queue ahead
    that ``rows`` give: the replay passes its backfill plan (chainrun/sim/adapter.py)."""
    from chainrun.predict.model import WaitRequest
    from chainrun.predict.snapshot import snapshot_from_rows

    mine = next((r for r in rows if r.job_id == seg.job_id), None)
    req = WaitRequest(
        user=mine.user if mine else "", nodes=mine.nodes if mine else 1, gpus=mine.gpus if mine else 0,
        cpus=mine.cpus if mine else 0, timelimit_s=float(chain.segment_s), partition=chain.partition,
        qos=mine.qos if mine else "", submit=time.time(),
    )
    others = [r for r in rows if r.job_id != seg.job_id]
    # widened by what the model has not seen, leaning on the squeue --start of the jobs ahead when
    # it is out of its depth (chainrun/predict/doubt.py); no extra Slurm call: the tick's rows
    from chainrun.predict.doubt import SlurmView, answer, queue_ahead

    if slurm is None:
        jobs, nodes, latest = queue_ahead(others, chain.partition, req.submit)
        slurm = SlurmView(ahead_jobs=jobs, ahead_nodes=nodes, ahead_start_s=latest)
    a = answer(model, req, snapshot_from_rows(others), history, slurm)
    if a.reasons:
        log.info("chain %s: queue-delay model not sure (%s)%s", chain.id, "; ".join(a.reasons),
                 f"; leaning on Slurm's estimate {a.slurm.wait_s:.0f}s" if a.leaned and a.slurm else "")
    p = a.prediction
    q = predict_quantile(chain.segment_s)
    name = f"{p.model}, leaning on Slurm's squeue --start" if a.leaned else p.model  # named in the decision
    return WaitEstimate(seconds=p.quantile(q), model=name, p10=p.p10, p50=p.p50, p90=p.p90, target=q,
                        model_p50=a.model_only.p50 if a.leaned else None,
                        prob_within=p.prob_within, quantile=p.quantile)
