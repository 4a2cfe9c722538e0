"""Segment 0's wait on each site of a chain spanning clusters, at submit (issue 26).

The watcher estimates a later segment's wait on a site with that site's queue-delay model, else
Slurm's own ``sbatch --test-only`` start (chain/site_plan.py ``wait_estimate``); segment 0 gets the
same: the site's model (chain/prediction.py, read against that site's one ``squeue --all``, widened
and leaning on Slurm where it is out of its depth) where ``chainrun model refresh`` trained one there,
else the ``--test-only`` start the submit's checks just gave. A model that fails (no sacct cache, a
broken file, a queue that cannot be read) is logged and the site falls back to Slurm's start: a model
must never stop a submit. The replay places segment 0 on the models too (sim/site_chain.py).
"""

from __future__ import annotations

import logging
from typing import Callable

from chainrun.chain.policies import WaitEstimate
from chainrun.chain.site_plan import test_only_wait, wait_sources
from chainrun.errors import ChainrunError
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import Chain, Segment

log = logging.getLogger(__name__)


def model_wait(name: str, slurm: SlurmClient, view: Chain,
               predictor_for: Callable | None = None) -> WaitEstimate | None:
    """Segment 0's wait on site ``name`` by its model, as the watcher asks it for a successor; None when
    the site has no model or it gave no estimate. ``view``: the chain as that site sees it."""
    if predictor_for is None:
        from chainrun.chain.prediction import for_cluster as predictor_for
    predictor = predictor_for(name)
    if predictor is None:
        return None
    probe = Segment(chain_id=view.id, idx=0, time_limit_s=view.segment_s, cluster=name)
    try:
        return predictor(view, probe, slurm.queue(all_users=True))
    except (ChainrunError, ImportError) as e:  # no queue there, or no lightgbm here: Slurm's start stands
        log.warning("cluster %s: no model estimate for segment 0 (%s); using sbatch --test-only", name, e)
        return None


def first_waits(sites: list[tuple[str, SlurmClient, Chain]], starts: dict[str, float | None], now: float, *,
                predictor_for: Callable | None = None) -> dict[str, WaitEstimate | None]:
    """Every site's wait for segment 0: its model's, else its ``--test-only`` start's (None: neither)."""
    out = {}
    for name, slurm, view in sites:
        out[name] = model_wait(name, slurm, view, predictor_for) or test_only_wait(starts.get(name), now)
    return out


def note(waits: dict[str, WaitEstimate | None]) -> str:
    """``a 5h00m (MODEL), b 1m (slurm --test-only)``: the event says where each wait came from."""
    from chainrun.durations import format_duration

    return ", ".join(f"{n} {format_duration(s['wait_s'])} ({s['from']})" for n, s in wait_sources(waits).items())
