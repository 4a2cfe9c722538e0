"""A chain spanning clusters, as the watcher sees it (issue 26; sites are recorded at submit by chain/sites.py).

The chain's row names the site it trains on now (``chain.cluster`` and its folders); each segment names
the site it was submitted on (``segment.cluster``; None: the chain's own, as on every single-cluster
chain). The engine of the chain's site reconciles and plans the chain as always, but leaves alone a
segment on another site: a successor submitted there for a move, which the driver (chain/mover.py)
follows until the move is over and the chain's row names the new site.
"""

from __future__ import annotations

from dataclasses import replace

from chainrun.state.records import Chain, ChainSite, Segment


def spans(c: Chain) -> bool:
    return len(c.extra.get("sites") or ()) > 1


def site_of(c: Chain, s: Segment) -> str:
    return s.cluster or c.cluster


def foreign(c: Chain, s: Segment) -> bool:
    """On another site than the one the chain trains on now: the driver's, not the engine's."""
    return s.cluster is not None and s.cluster != c.cluster


def site_view(c: Chain, site: ChainSite) -> Chain:
    """The chain as one site sees it: that site's folders, script, options, partition and segment length.
    Used to submit there; never saved (the row keeps the site the chain trains on now)."""
    return replace(c, cluster=site.cluster, workdir=site.workdir, run_dir=site.run_dir,
                   checkpoint_dir=site.checkpoint_dir, script=site.script, sbatch_args=list(site.sbatch_args),
                   partition=site.extra.get("partition", c.partition),
                   segment_s=int(site.extra.get("segment_s") or c.segment_s), extra=c.extra)


def move_to(c: Chain, site: ChainSite) -> None:
    """The chain trains on ``site`` from now on: its row takes that site's folders and options."""
    v = site_view(c, site)
    c.cluster, c.workdir, c.run_dir, c.checkpoint_dir = v.cluster, v.workdir, v.run_dir, v.checkpoint_dir
    c.script, c.sbatch_args, c.partition, c.segment_s = v.script, v.sbatch_args, v.partition, v.segment_s


def control_names(runner, run_dir: str) -> set[str] | None:
    """The file names in a site's control folder (one listing); None when the site did not answer."""
    from chainrun.errors import ChainrunError

    try:
        res = runner.run(["ls", "-1", "--", f"{run_dir}/control"], 60)
    except ChainrunError:
        return None
    return set(res.stdout.split()) if res.ok else None


def highest(names: set[str], kind: str) -> int:
    """The highest N of the files ``kind.<N>`` (owner, moved, go, ...), -1 when there is none."""
    return max((int(n.split(".", 1)[1]) for n in names
                if n.startswith(kind + ".") and n.split(".", 1)[1].isdigit()), default=-1)
