"""``scontrol show topology``: which leaf switch each node hangs off (topology/tree).

Slurm reports topology only when the site runs a topology plugin (``TopologyPlugin=topology/tree``);
otherwise the command prints nothing useful or fails, and chainrun says "not reported" rather
than guessing. A segment's *spread* is the number of distinct leaf switches its nodes sit under:
a data-parallel job whose all-reduce crosses switches pays for it in every step.

Output (one line a switch, 22.05 through 24.x)::

    SwitchName=s0 Level=1 LinkSpeed=1 Nodes=n[1-4] Switches=s[1-2]
    SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chainrun.slurm.parsers import expand_hostlist, parse_scontrol_oneliners


@dataclass(frozen=True)
class Topology:
    """node -> its leaf switch; empty when Slurm reports no topology."""

    leaf_of: dict[str, str] = field(default_factory=dict)

    @property
    def reported(self) -> bool:
        return bool(self.leaf_of)

    def switches_spanned(self, nodes) -> int | None:
        """Distinct leaf switches under ``nodes``; None when any node's switch is unknown."""
        nodes = list(nodes)
        if not nodes or not self.reported:
            return None
        leaves = [self.leaf_of.get(n) for n in nodes]
        if any(x is None for x in leaves):
            return None
        return len(set(leaves))


def parse_topology(text: str) -> Topology:
    """The leaf switches (Level=0, or switches without child switches) of ``scontrol show topology``."""
    leaf_of: dict[str, str] = {}
    for rec in parse_scontrol_oneliners(text or ""):
        name = rec.get("SwitchName")
        if not name:
            continue
        is_leaf = rec.get("Level") == "0" if "Level" in rec else not rec.get("Switches")
        if not is_leaf:
            continue
        for node in expand_hostlist(rec.get("Nodes", "")):
            leaf_of.setdefault(node, name)
    return Topology(leaf_of)
