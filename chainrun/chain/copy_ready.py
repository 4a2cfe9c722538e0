"""At `submit --cluster a,b`: can the checkpoint follow the chain between these sites at all?

A move copies the newest checkpoint with rsync (chain/ckpt_copy.py). Found only at the first move,
a site that can never carry a copy leaves the chain stuck there, hours or days after submit. So
before anything is written, each site's transport is held against the predicate the copy itself
uses (ckpt_site.transport_refusal: this machine or the OpenSSH transport), and rsync is looked up
where a copy runs it: on every site (its ``[copy.NAME] rsync``, else ``rsync`` on its PATH) and, when
some pair of sites has no direct route (``[copy.A.direct]``), on this machine, which then relays
the copy. Each failure is one line naming the cluster.
"""

from __future__ import annotations

import shutil
from typing import Sequence

from chainrun.errors import SiteRefused
from chainrun.runner.base import Runner

DRIVER = "this machine"


def check_transport(name: str, runner: Runner) -> None:
    """Raises SiteRefused when no copy can ever go to or from ``name`` (needs no connection)."""
    from chainrun.chain.ckpt_site import transport_refusal

    refused = transport_refusal(name, runner)
    if refused is not None:
        raise SiteRefused(f"cluster {name}: {refused.message}; a chain spanning clusters moves its checkpoint "
                          "between them", hint=refused.hint)


def check_rsync(name: str, runner: Runner) -> str:
    """rsync where this site runs it; raises SiteRefused when it is not there. Returns a note for the result."""
    from chainrun.chain import ckpt_routes

    rsync = ckpt_routes.load(name).rsync
    res = runner.run(["sh", "-c", 'command -v "$1"', "sh", rsync], 60)
    if not res.ok or not res.stdout.strip():
        raise SiteRefused(f"cluster {name}: `{rsync}` not found there; checkpoint copies to and from it run rsync "
                          "there", hint=f"install rsync on {name}, or name its path in config.toml "
                                        f"([copy.{name}] rsync = \"/path/to/rsync\")")
    return f"rsync: {res.stdout.strip().splitlines()[0]}"


def driver_relays(names: Sequence[str]) -> bool:
    """Whether a copy between some two of these sites goes through this machine (no direct route)."""
    from chainrun.chain import ckpt_routes

    direct = {n: ckpt_routes.load(n).direct for n in names}
    return any(b not in direct[a] for a in names for b in names if a != b)


def check_driver_rsync(names: Sequence[str]) -> None:
    """rsync on this machine when it relays copies (it runs plain ``rsync`` there)."""
    if not driver_relays(names):
        return
    if shutil.which("rsync") is None:
        raise SiteRefused(f"{DRIVER}: `rsync` not found; checkpoint copies between {', '.join(names)} without a "
                          "direct route run through this machine",
                          hint="install rsync here, or allow direct copies between the sites ([copy.A.direct])")
