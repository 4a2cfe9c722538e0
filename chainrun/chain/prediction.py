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
    from chainrun.predict.service import model_dir

    mdir = model_dir(ctx.cluster)
    if not (mdir / "meta.json").exists():
        return None
    loaded: dict = {}

    def predict(chain: "Chain", seg: "Segment", rows: "list[QueueRow]") -> WaitEstimate | None:
        try:
            if not loaded:
                from chainrun.predict import ingest
                from chainrun.predict.model import load_predictor

                loaded["model"] = load_predictor(mdir)
                loaded["history"] = ingest.load_cache(ctx.cluster)[0]
            return _estimate(loaded["model"], loaded["history"], chain, seg, rows)
        except ChainrunError as e:  # a broken model must not stop the chain: the policy falls back to lead
            log.warning("queue-delay model unavailable (%s); using the fixed lead", e)
            return None

    return predict


def _estimate(model, history, chain: "Chain", seg: "Segment", rows: "list[QueueRow]") -> WaitEstimate:
    from chainrun.predict.model import WaitRequest
    from chainrun.predict.snapshot import snapshot_from_rows

    mine = next((r for r in rows if r.job_id == seg.job_id), None)
    req = WaitRequest(
        user=mine.user if mine else "", nodes=mine.nodes if mine else 1, gpus=mine.gpus if mine else 0,
        cpus=mine.cpus if mine else 0, timelimit_s=float(chain.segment_s), partition=chain.partition,
        qos=mine.qos if mine else "", submit=time.time(),
    )
    snapshot = snapshot_from_rows([r for r in rows if r.job_id != seg.job_id])
    p = model.predict(req, snapshot, history)
    q = predict_quantile(chain.segment_s)
    return WaitEstimate(seconds=p.quantile(q), model=p.model, p10=p.p10, p50=p.p50, p90=p.p90, target=q,
                        prob_within=p.prob_within)
