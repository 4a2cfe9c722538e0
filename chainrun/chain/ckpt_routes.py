"""Which copy routes each site allows: the ``[copy.NAME]`` tables of config.toml.

Direct copies (the source's login node runs rsync to the destination) need a key from one site
to the other, which many centres forbid; so a route is direct only where the user says so:

    [copy.ls6]
    rsync = "/usr/bin/rsync"        # rsync on ls6's login node (default: rsync on its PATH)
    [copy.ls6.direct]
    frontera = "frontera"           # ls6's login node reaches frontera with `ssh frontera` (its own config)
    vista = { dest = "me@vista.tacc.utexas.edu", ssh_options = ["-i", "~/.ssh/id_xfer"] }

Every other pair copies through the driver (the OpenSSH transport's own connections).
``bwlimit_kbps = N`` in ``[copy.NAME]`` caps every copy out of or into NAME at N KiB/s (rsync's
``--bwlimit``), as sites ask of transfers from shared login nodes; with both ends capped, the lower cap.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field

from chainrun.chain.ckpt_site import CopySite, DirectRoute, site_for
from chainrun.errors import UsageError
from chainrun.runner.base import Runner


@dataclass(frozen=True)
class CopySettings:
    direct: dict[str, DirectRoute] = field(default_factory=dict)
    rsync: str = "rsync"
    bwlimit_kbps: int | None = None  # rsync --bwlimit (KiB/s) for copies out of or into the site


def settings(data: dict, name: str, where: str = "config.toml") -> CopySettings:
    """The copy settings of site ``name`` from a parsed config (pure)."""
    table = (data.get("copy") or {})
    if not isinstance(table, dict):
        raise UsageError(f"{where}: `copy` must hold tables like [copy.NAME]")
    mine = table.get(name) or {}
    if not isinstance(mine, dict):
        raise UsageError(f"{where}: [copy.{name}] must be a table")
    unknown = set(mine) - {"direct", "rsync", "bwlimit_kbps"}
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} in [copy.{name}]")
    rsync = mine.get("rsync", "rsync")
    if not isinstance(rsync, str) or not rsync.strip():
        raise UsageError(f"{where}: [copy.{name}] rsync must be a path or command name in quotes")
    bw = mine.get("bwlimit_kbps")
    if bw is not None and (isinstance(bw, bool) or not isinstance(bw, int) or bw < 1):
        raise UsageError(f"{where}: [copy.{name}] bwlimit_kbps must be a whole number of KiB/s, 1 or more")
    direct = {}
    for dst, spec in (mine.get("direct") or {}).items():
        if isinstance(spec, str):
            spec = {"dest": spec}
        opts = spec.get("ssh_options", []) if isinstance(spec, dict) else None
        if (not isinstance(spec, dict) or not isinstance(spec.get("dest"), str) or not spec["dest"].strip()
                or set(spec) - {"dest", "ssh_options"} or not isinstance(opts, list)
                or not all(isinstance(o, str) for o in opts)):
            raise UsageError(f"{where}: [copy.{name}.direct] {dst} must be an ssh destination in quotes, or "
                             '{ dest = "...", ssh_options = ["..."] }')
        if spec["dest"].startswith("-"):
            raise UsageError(f"{where}: [copy.{name}.direct] {dst}: a destination cannot start with '-'")
        direct[dst] = DirectRoute(spec["dest"], tuple(opts))
    return CopySettings(direct, rsync, bw)


def load(name: str) -> CopySettings:
    """Site ``name``'s copy settings from the chainrun home's config.toml (defaults without one)."""
    from chainrun.clusters import config_path

    path = config_path()
    if not path.exists():
        return CopySettings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {e}", hint="fix or remove the file") from None
    return settings(data, name, str(path))


def configured_site(name: str, runner: Runner, ckpt_dir: str) -> CopySite:
    """A copy end for a configured cluster, its routes and rsync from config.toml."""
    s = load(name)
    return site_for(name, runner, ckpt_dir, direct=s.direct, rsync=s.rsync)


def bwlimit_kbps(*names: str) -> int | None:
    """The rate cap of a copy between these sites: the lowest ``bwlimit_kbps`` any of them sets (None: none)."""
    caps = [c for c in (load(n).bwlimit_kbps for n in names) if c]
    return min(caps) if caps else None
