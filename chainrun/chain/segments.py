"""Submitting one segment, exactly once: record the intent, call sbatch, record the job.

A segment is written as SUBMITTING before sbatch runs. If chainrun dies between the two,
the next tick finds the job by its name (``cr.<chain>.<idx>``) and adopts it instead of
submitting a second copy.
"""

from __future__ import annotations

import re
import time

from chainrun.chain.request import describe, job_name, segment_args
from chainrun.errors import SlurmError, TransientSlurmError
from chainrun.slurm.client import SlurmClient, SlurmRefused
from chainrun.state.records import PENDING, SUBMITTING, Chain, Segment
from chainrun.state.store import Store

_NAME_RE = re.compile(r"^cr\.(?P<chain>[A-Za-z0-9_-]+)\.(?P<idx>\d+)$")


def parse_job_name(name: str) -> tuple[str, int] | None:
    m = _NAME_RE.match(name or "")
    return (m.group("chain"), int(m.group("idx"))) if m else None


def wrapper_path(chain: Chain) -> str:
    return f"{chain.run_dir}/wrapper.sh"


def sbatch_args(chain: Chain, seg: Segment) -> list[str]:
    """Options for one segment: the user's and the site's, chainrun's adaptations, then ours (chain/request.py)."""
    return segment_args(chain, seg)


def submit_segment(store: Store, slurm: SlurmClient, chain: Chain, seg: Segment, *, note: str = "",
                   site: Chain | None = None) -> Segment:
    """Submit ``seg`` (already planned: idx, time limit, dependency). Returns it with its job id.

    Raises SlurmRefused when sbatch refuses the job. Any other failure (a timeout, an error we
    do not recognise, output without a job id) may still have created the job: the segment
    stays SUBMITTING, and the next ticks adopt it by name or, once sacct confirms there is no
    such job, plan it again.
    """
    seg.phase = SUBMITTING
    seg.intent_at = time.time()
    there = site or chain  # ``site``: the chain as another cluster sees it (a move, chain/site_plan.py)
    seg.extra["request"] = describe(sbatch_args(there, seg))  # what this segment asked for, shown by status
    store.save(chain, [seg])
    # a successor on another site waits, gated, for the driver's go-ahead (templates/wrapper.sh)
    script_args = [str(seg.idx)] + (["gated"] if seg.extra.get("move") else [])
    try:
        job_id, cluster = slurm.submit(wrapper_path(there), sbatch_args(there, seg), script_args=script_args)
    except TransientSlurmError:
        store.add_event(chain.id, seg.idx, "warning", f"sbatch did not answer for segment {seg.idx}; will check and retry")
        raise
    except SlurmRefused:
        raise
    except SlurmError as e:
        store.add_event(chain.id, seg.idx, "warning", f"sbatch failed unexpectedly for segment {seg.idx} ({e}); "
                        "will check whether the job exists and retry")
        raise
    seg.job_id, seg.slurm_cluster, seg.phase = job_id, cluster, PENDING
    seg.submit = seg.submit or time.time()
    msg = f"segment {seg.idx} submitted as job {job_id}" + (f" ({note})" if note else "")
    store.save(chain, [seg], [(seg.idx, "submitted", msg)])
    return seg

__all__ = ["job_name", "parse_job_name", "sbatch_args", "submit_segment", "wrapper_path"]
