"""The two ends of a checkpoint copy: a site's runner, the chain's checkpoint folder there, and how
rsync reaches it (from the driver over the OpenSSH transport, or from another site directly)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from chainrun.errors import UsageError
from chainrun.runner.base import Runner
from chainrun.runner.local import LocalRunner

INCOMING = ".chainrun-incoming."  # a copy on its way: never read by a trainer (no marker names it)
COPIED = ".chainrun-copied."  # the record of a landed copy: what cleanup_unused may remove


@dataclass(frozen=True)
class DirectRoute:
    """How a source site's login node reaches a destination with its own ssh (its keys, its config)."""

    dest: str  # the ssh destination there: an alias of that site's ~/.ssh/config, or user@host
    ssh_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class CopySite:
    """One end of a copy: a site's runner and the chain's checkpoint folder there."""

    name: str
    runner: Runner
    ckpt_dir: str
    ssh: tuple[str, ...] | None = None  # the driver's ssh to reach the site, without the destination; None: here
    host: str | None = None  # ...and the destination it names
    direct: Mapping[str, DirectRoute] = field(default_factory=dict)  # site name -> route from this site's host
    rsync: str = "rsync"  # rsync on this site

    @property
    def here(self) -> bool:
        return self.ssh is None

    def path(self, p: str) -> str:
        """``p`` as an rsync run on the driver names it."""
        return p if self.here else f"{self.host}:{p}"


def site_for(name: str, runner: Runner, ckpt_dir: str, *, direct: Mapping[str, DirectRoute] | None = None,
             rsync: str = "rsync") -> CopySite:
    """A copy end for a configured cluster's runner: this machine, or the OpenSSH transport (whatever
    wraps it: the acting watcher's runner is fenced by its lease)."""
    from chainrun.runner.base import innermost

    refused = transport_refusal(name, runner)
    if refused is not None:
        raise refused
    inner = innermost(runner)
    if isinstance(inner, LocalRunner):
        return CopySite(name, runner, ckpt_dir, direct=dict(direct or {}), rsync=rsync)
    from chainrun.runner.openssh import base_argv

    return CopySite(name, runner, ckpt_dir, ssh=tuple(base_argv(inner.alias)[:-1]), host=inner.alias,
                    direct=dict(direct or {}), rsync=rsync)


def transport_refusal(name: str, runner: Runner) -> UsageError | None:
    """Why no checkpoint copy can ever go to or from this site (None: it can). rsync needs this machine
    or the OpenSSH transport (its ssh carries rsync); the built-in client (paramiko) cannot carry it.
    `submit --cluster a,b` asks this too (chain/copy_ready.py), so a chain is never accepted on a site
    whose first move would fail here."""
    from chainrun.runner.base import innermost

    inner = innermost(runner)
    if isinstance(inner, LocalRunner):
        return None
    from chainrun.runner.openssh import OpenSSHRunner

    if isinstance(inner, OpenSSHRunner):
        return None
    return UsageError(f"checkpoint copies to or from {name} need the OpenSSH transport",
                      hint=f"re-add the cluster with `chainrun cluster add {name} --ssh ALIAS` "
                           "(a Host alias of ~/.ssh/config)")
