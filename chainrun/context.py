"""Open what a command needs: the state store, a runner for the cluster, a Slurm client.

``local`` is a cluster like any other; the others come from ``config.toml`` (see
chainrun.clusters) and get an SSH runner. Without ``--cluster`` the config's default
is used, else ``local``. The SSH runner connects on first use, so commands that only
read the state store (``status``) never open a connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chainrun import paths
from chainrun.clusters import LOCAL
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
    remote: bool = False
    workdir: str | None = None  # the cluster's configured remote workdir (None: the remote home)
    user: str | None = None  # whose jobs are ours on that cluster

    def close(self) -> None:
        self.store.close()
        self.runner.close()

    def remote_workdir(self) -> str:
        """Where chain folders go on a remote cluster: the configured workdir, else the remote home."""
        return self.workdir or self.runner.home()  # type: ignore[attr-defined]


def cluster_name(cluster: str | None) -> str:
    if cluster:
        return cluster
    from chainrun import clusters

    return clusters.default_name()


def open_runner(name: str, *, accept_new_host_key: bool = False) -> tuple[Runner, "object | None"]:
    """A runner for cluster ``name`` and its config entry (None for local)."""
    if name == LOCAL:
        from chainrun.runner.local import LocalRunner

        return LocalRunner(), None
    from chainrun import clusters
    from chainrun.runner import for_cluster

    spec = clusters.get(name)
    runner = for_cluster(spec, known_hosts=clusters.known_hosts_path(), accept_new_host_key=accept_new_host_key)
    return runner, spec


def open_context(cluster: str | None = None, *, store: Store | None = None) -> Context:
    name = cluster_name(cluster)
    runner, spec = open_runner(name)
    home = paths.home()
    return Context(
        home=home, store=store or Store(paths.state_db()), runner=runner, slurm=SlurmClient(runner), cluster=name,
        remote=spec is not None, workdir=getattr(spec, "workdir", None), user=getattr(runner, "user", None),
    )
