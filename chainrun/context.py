"""Open what a command needs: the state store, a runner for the cluster, a Slurm client."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chainrun import paths
from chainrun.errors import NotFoundError
from chainrun.runner.base import Runner
from chainrun.slurm.client import SlurmClient
from chainrun.state.store import Store


@dataclass
class Context:
    home: Path
    store: Store
    runner: Runner
    slurm: SlurmClient
    cluster: str

    def close(self) -> None:
        self.store.close()
        self.runner.close()


def open_context(cluster: str | None = None) -> Context:
    name = cluster or "local"
    if name != "local":
        raise NotFoundError(f"no cluster {name!r}", hint="only the local cluster is configured")
    from chainrun.runner.local import LocalRunner

    home = paths.home()
    runner = LocalRunner()
    return Context(home=home, store=Store(paths.state_db()), runner=runner, slurm=SlurmClient(runner), cluster=name)
