"""Planning a segment around maintenance windows (issue #16): the engine's and submit's one rule."""

from __future__ import annotations

import logging
import time

from chainrun.chain.contract import option_value
from chainrun.chain.request import requested_nodes
from chainrun.durations import format_duration
from chainrun.errors import SlurmError
from chainrun.slurm.client import SlurmClient
from chainrun.slurm.reservations import Reservation, expand_nodes, fit_before
from chainrun.state.records import Chain, Segment

log = logging.getLogger(__name__)
MIN_TRAINING_S = 60  # a segment that cannot train this long after its signal lead is not worth starting


def read_reservations(slurm: SlurmClient) -> list[Reservation]:
    """The cluster's reservations; an error means "none known", never a failed plan."""
    try:
        return slurm.reservations()
    except SlurmError as e:
        log.info("scontrol show reservation: %s", e)
        return []


def fit_maintenance(c: Chain, seg: Segment, reservations: list[Reservation], now: float,
                    given_nodes: int | None = None) -> None:
    """Shorten ``seg`` to end before a MAINT window in its way (and allow Slurm to shorten it further
    with --time-min if it waits); note what was decided in ``seg.extra["plan_note"]``. ``given_nodes``:
    the nodes Slurm gave (or shows for) the chain's previous job, which counts before the options: a
    script may set ``#SBATCH --nodes`` itself, and ``--gpus`` alone takes as many nodes as the GPUs need."""
    if not reservations:
        return
    shortest = c.signal_lead_s + MIN_TRAINING_S
    pinned = set(expand_nodes(option_value(c.sbatch_args, "--nodelist", "-w") or ""))
    # an elastic segment (--shapes) asks for its own node count
    nodes = int(seg.extra.get("nodes") or given_nodes or requested_nodes(c.sbatch_args))
    fit = fit_before(now, seg.time_limit_s, shortest, reservations, pinned_nodes=pinned,
                     job_nodes=nodes, partition=c.partition,
                     partition_nodes=int(c.extra.get("partition_nodes", 0)))
    if fit.reservation is None:
        return
    at = time.strftime("%a %H:%M", time.localtime(fit.reservation.start))
    if fit.shortened:
        seg.time_limit_s = fit.limit_s
        seg.extra["time_min_s"] = shortest
        seg.extra["plan_note"] = f"segment {seg.idx} shortened to {format_duration(fit.limit_s)}: maintenance at {at}"
    else:
        seg.extra["plan_note"] = (f"maintenance at {at} leaves segment {seg.idx} no room before it: "
                                  "it starts after the window")
