"""Before a chain spanning clusters first moves: its checkpoint's size, read where it trains (issue 26).

The site rule weighs a move by the checkpoint's transfer: its measured size over the rate measured
between the two sites (chain/site_plan.py ``transfer_s``). Both were known only once a copy had been
made, so the first move of every chain was weighed at a flat DEFAULT_TRANSFER_S (15 minutes), whether
its checkpoint was 50 MB or 500 GB. This probe reads the newest complete checkpoint's size on the
chain's own cluster (``ckpt_manifest.newest_size``: sizes from ``stat``, no file is read), so the
decision charges that size over the default rate until a copy measures the link.

Bounded: only chains spanning clusters whose size is not known yet, only while a segment of theirs
runs on the chain's cluster (a checkpoint may appear), at most once every EVERY_S per chain, one
command each; a site that does not answer is asked again EVERY_S later. Once a size is known the
probe leaves the chain alone: the copies update it (site_plan.record_copy).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from chainrun.chain import site_plan, span
from chainrun.chain.ckpt_manifest import newest_size
from chainrun.errors import ChainrunError
from chainrun.state.records import RUNNING, Chain
from chainrun.state.store import Store

log = logging.getLogger(__name__)

EVERY_S = 600.0  # as often as a copy ahead re-reads the newest checkpoint (chain/mover.py LOOK_EVERY_S)
PROBED_AT = "checkpoint_size_probed_at"  # chain.extra: when the size was last asked for


class SizeProbe:
    def __init__(self, store: Store, site: Callable[[str], object], clock: Callable[[], float] = time.time) -> None:
        self.store, self._site, self.clock = store, site, clock

    def due(self) -> list[Chain]:
        """The chains whose size is asked for now."""
        now, out = self.clock(), []
        for c in self.store.chains(active_only=True):
            if not span.spans(c) or c.extra.get("checkpoint_bytes"):
                continue
            if now - float(c.extra.get(PROBED_AT) or 0) < EVERY_S:
                continue
            if any(s.phase == RUNNING and span.site_of(c, s) == c.cluster for s in self.store.segments(c.id)):
                out.append(c)
        return out

    def tick(self) -> None:
        for c in self.due():
            c.extra[PROBED_AT] = self.clock()
            events = []
            try:
                size = newest_size(self._site(c.cluster).runner, c.checkpoint_dir)
            except ChainrunError as e:  # the site did not answer (or cannot run the command): next time
                log.info("%s: checkpoint size on %s not read: %s", c.id, c.cluster, e)
                size = None
            if size:
                site_plan.record_copy(c, c.cluster, size_bytes=size)
                events.append((None, "copy", f"checkpoint size {size} bytes read on {c.cluster}: a move's transfer "
                                             "is weighed at it (over the default rate until a copy measures the link)"))
            self.store.save(c, [], events)
