"""Unused checkpoint copies removed when a move ends (issue 26: "copies ahead that go unused are cleaned
up"; scratch filesystems purge by age and count quota against the user).

A move copies the old site's newest checkpoint ahead to the new site while the predecessor trains, often
several times (each newer checkpoint is copied again). When the move ends:

- **abandoned** (its segment ended on the new site before its go-ahead): nothing there is used; every copy
  chainrun landed there for this chain that no trainer has since rewritten is removed (the chain trains
  on the old site, whose newest checkpoint is at least as new);
- **done** (the go-ahead written, the chain lives on the new site): the copy it resumes from is kept,
  older copies ahead there are removed.

What "landed by chainrun, unchanged" means, and what is never touched (a trainer's own checkpoints, a
partial copy still being written), is ckpt_cleanup.plan's. The removal runs in the background (an ``rm``
of checkpoints on a slow scratch takes minutes; the tick does not wait) and its outcome becomes an event
on the next tick. A failure only leaves files behind: it is said once, nothing is retried.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from chainrun.state.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Asked:
    chain_id: str
    seg: int
    site: str
    why: str  # "abandoned" | "done"


class Cleanups:
    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: dict[Asked, Future] = {}

    def ask(self, asked: Asked, runner, ckpt_dir: str, keep: tuple[str, ...] = ()) -> None:
        """Remove the unused copies in ``ckpt_dir`` on ``asked.site`` (through ``runner``), ``keep`` aside."""
        if asked in self._jobs:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chainrun-cleanup")
        self._jobs[asked] = self._pool.submit(_remove, asked.site, runner, ckpt_dir, keep)

    def harvest(self, store: Store) -> None:
        """One event per finished removal: what went, or why nothing did."""
        for asked, fut in list(self._jobs.items()):
            if not fut.done():
                continue
            del self._jobs[asked]
            try:
                p = fut.result()
            except Exception as e:  # noqa: BLE001 -- files left behind, said once; the chain is not affected
                log.info("cleanup on %s for %s: %s", asked.site, asked.chain_id, e, exc_info=True)
                store.add_event(asked.chain_id, asked.seg, "warning",
                                f"unused checkpoint copies on {asked.site} not removed ({e}); they stay until the "
                                "site's purge")
                continue
            what = "the move was abandoned" if asked.why == "abandoned" else "older copies ahead of the move"
            if p.remove:
                store.add_event(asked.chain_id, asked.seg, "copy",
                                f"removed {len(p.remove)} unused checkpoint file(s) on {asked.site} ({what}): "
                                + ", ".join(p.remove[:6]) + (" ..." if len(p.remove) > 6 else ""))

    def close(self, wait_s: float) -> None:
        import time

        deadline = time.monotonic() + wait_s
        for fut in list(self._jobs.values()):
            try:
                fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 -- a removal cut here leaves files: the site's purge takes them
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _remove(site: str, runner, ckpt_dir: str, keep: tuple[str, ...]):
    from chainrun.chain.ckpt_cleanup import cleanup_unused
    from chainrun.chain.ckpt_routes import configured_site

    return cleanup_unused(configured_site(site, runner, ckpt_dir), keep=keep)
