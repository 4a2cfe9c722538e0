"""One watcher loop for chains on several clusters.

Each tick runs one :class:`Engine` per cluster that has active chains, so each cluster
still costs one ``squeue`` and at most one ``sacct`` per tick, over one SSH connection
kept for the life of the watcher. A cluster that cannot be reached (or was removed from
the config) becomes a warning for that tick; the other clusters' chains keep moving.

Duck-types the parts of Engine that ``run_watch`` and the live view use: ``tick()`` and
``store``.
"""

from __future__ import annotations

import logging
from typing import Callable

from chainrun.chain import untended
from chainrun.chain.ckpt_size_probe import SizeProbe
from chainrun.chain.engine import Engine, TickReport
from chainrun.chain.mover import Mover
from chainrun.chain.race_driver import Race
from chainrun.chain.settle import needs_tick
from chainrun.chain.site_plan import SiteAccess
from chainrun.clusters import LOCAL
from chainrun.errors import ChainrunError
from chainrun.state.lease import LeaseLost
from chainrun.state.store import Store

log = logging.getLogger(__name__)


def needs_human(e: Exception) -> bool:
    """A failure only a person can end: a login (MFA, an expired certificate) or a host key."""
    from chainrun.runner.base import HostKeyError
    from chainrun.runner.openssh import LoginRequired

    return isinstance(e, (LoginRequired, HostKeyError))


class TickFailed(ChainrunError):
    """No cluster's tick worked (`watch --once` exits with this): the exit code of the first cluster's
    failure (by name): 5 Slurm did not answer, 8 a remote cluster unreachable, 4 Slurm failed in a way
    chainrun does not recognise, 3 a cluster gone from the config (docs/exit-codes.md)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def tick_failed(causes: list[tuple[str, Exception | None]]) -> TickFailed:
    """One line for a tick where every cluster failed: each cluster and why."""
    from chainrun.errors import TransientSlurmError
    from chainrun.runner.base import RemoteUnreachable

    def why(e: Exception | None) -> str:  # short where the tick's warning, printed just before, has the words
        if isinstance(e, TransientSlurmError):
            return "Slurm did not answer"
        if isinstance(e, RemoteUnreachable):
            return "cannot be reached"
        return str(e) if e is not None else "the tick failed"

    first = causes[0][1] if causes else None
    code = first.exit_code if isinstance(first, ChainrunError) else TransientSlurmError.exit_code
    each = "; ".join(f"{name}: {why(e)}" for name, e in causes)
    where = {0: "", 1: f" on the only cluster with chains ({each})"}.get(len(causes), f" on every cluster ({each})")
    return TickFailed(f"the tick failed{where}; nothing changed, the next tick tries again", code)


class ClusterStore:
    """The store as one cluster's Engine sees it: only that cluster's chains."""

    def __init__(self, store: Store, cluster: str) -> None:
        self._store, self.cluster = store, cluster

    def chains(self, *, active_only: bool = False):
        return [c for c in self._store.chains(active_only=active_only) if c.cluster == self.cluster]

    def __getattr__(self, name: str):
        return getattr(self._store, name)


class MultiEngine:
    def __init__(
        self, store: Store, *, only: str | None = None, predictor_for: Callable | None = None,
        open_context: Callable | None = None,
    ) -> None:
        from chainrun.context import open_context as default_open

        self.base_store = store
        self.store = ClusterStore(store, only) if only else store
        self.only = only
        self._predictor_for = predictor_for
        self._open = open_context or default_open
        self.contexts: dict = {}
        self.engines: dict[str, Engine] = {}
        # chains spanning clusters: planning sees the other sites, the mover carries moves out (chain/span.py)
        self.sites = SiteAccess(self.engine)
        self.mover = Mover(self.store, self.engine)
        self.race = Race(self.store, self.engine, self.sites.queue)  # --race: a segment on every site
        self.sizes = SizeProbe(self.store, self.engine)  # a checkpoint's size before its first copy

    def engine(self, cluster: str) -> Engine:
        if cluster not in self.engines:
            ctx = self._open(cluster, store=self.base_store)
            self.contexts[cluster] = ctx
            predictor = self._predictor_for(ctx) if self._predictor_for else None
            self.engines[cluster] = Engine(ClusterStore(self.base_store, cluster), ctx.slurm, ctx.runner,
                                           predictor=predictor, user=ctx.user)
            self.engines[cluster].sites = self.sites
        return self.engines[cluster]

    def tick(self) -> TickReport:
        total = TickReport()
        self.sites.new_tick()
        names = sorted({c.cluster for c in self.store.chains() if needs_tick(c)})
        failed = 0
        causes: list[tuple[str, Exception | None]] = []  # (cluster, why its tick failed)
        for name in names:
            label = "" if name == LOCAL else f"{name}: "
            try:
                report = self.engine(name).tick()
            except LeaseLost:  # this watcher no longer acts: no other cluster may move either
                raise
            except ChainrunError as e:  # cluster gone from the config, or a refused host key
                log.info("%s%s", label, e)  # the file; the screen gets it once, as the tick's warning
                total.warnings.append(f"{label}{e}")
                total.chains += len([c for c in self.store.chains(active_only=True) if c.cluster == name])
                failed += 1
                causes.append((name, e))
                untended.record(self.base_store, name, ok=False, error=str(e), needs_human=needs_human(e))
                continue
            if getattr(report, "failed", False):
                failed += 1
                causes.append((name, getattr(report, "cause", None)))
            untended.record(self.base_store, name, ok=not getattr(report, "failed", False),
                            error="; ".join(report.warnings))
            total.chains += report.chains
            total.submitted += report.submitted
            total.ended += report.ended
            total.warnings += [f"{label}{w}" for w in report.warnings]
            for k, v in report.slurm_calls.items():
                key = k if name == LOCAL else f"{name}:{k}"
                total.slurm_calls[key] = total.slurm_calls.get(key, 0) + v
        if self.race.racing():  # a segment raced on every site: keep the first started, cancel the others
            total.warnings += self.race.tick()
        if self.mover.moving():  # moves between clusters: after every site's tick, with what it recorded
            total.warnings += self.mover.tick()
        self.sizes.tick()  # spanning chains whose checkpoint size is not known yet: read where they train
        # the loop backs off only when nothing worked; one unreachable cluster must not slow the others
        if names and failed == len(names) and hasattr(total, "failed"):
            total.failed = True
            total.cause = tick_failed(causes)
        return total

    def close(self) -> None:
        """Close the runners (their SSH connections); the shared store is the caller's. A checkpoint
        copy under way is let finish first (bounded; it would resume anyway)."""
        self.mover.close()
        for ctx in self.contexts.values():
            ctx.runner.close()
        self.contexts.clear()
        self.engines.clear()
