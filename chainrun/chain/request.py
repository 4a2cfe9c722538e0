"""The sbatch request of one segment: the user's options, the site's, and chainrun's adaptations.

Merge rules (docs/cli.md, "What each segment asks for"):
- the user's options (`-- ...` on submit, and the cluster's `sbatch` list in config.toml, which
  the user's own options override) travel to every segment and are never dropped;
- chainrun's adaptations (``chain.extra["adapt"]``: nodes to exclude, ``--exclusive``, a node
  count; and an elastic chain's per-segment node count, ``segment.extra["nodes"]``, which
  replaces the user's ``--nodes``: submit checked that it equals the first of ``--shapes``)
  apply on top: excluded nodes are the union of the user's ``--exclude`` and chainrun's;
  an option the user pinned (e.g. ``--nodes``, ``--exclusive``/``--oversubscribe``) is not changed;
- chainrun's own options (job name, time limit, signal, working folder, dependency) come last.
"""

from __future__ import annotations

from chainrun.durations import to_slurm_time
from chainrun.state.records import Chain, Segment

_EXCLUDE = ("--exclude", "-x")
_NODES = ("--nodes", "-N")
_SHARING = ("--exclusive", "--oversubscribe", "-s", "--share")


def job_name(chain_id: str, idx: int) -> str:
    return f"cr.{chain_id}.{idx}"


def requested_nodes(opts: list[str]) -> int:
    """The node count sbatch options ask for (``--nodes``/``-N``; a range counts its minimum); 1 when
    they do not say (or say something that is no count)."""
    from chainrun.chain.contract import option_value

    try:
        return max(1, int(str(option_value(opts, *_NODES) or "1").split("-")[0]))
    except ValueError:
        return 1


def user_pinned(opts: list[str], *names: str) -> bool:
    """Whether the user gave this option (any spelling: ``--x``, ``--x=v``, ``-xv``)."""
    for o in opts:
        for n in names:
            if o == n or (n.startswith("--") and o.startswith(n + "=")) or (
                    not n.startswith("--") and o.startswith(n) and len(o) > len(n)):
                return True
    return False


def _drop(opts: list[str], names: tuple[str, ...]) -> list[str]:
    """``opts`` without any occurrence of these value-taking options."""
    out, skip = [], False
    for o in opts:
        if skip:
            skip = False
            continue
        if o in names:
            skip = True
            continue
        if any((n.startswith("--") and o.startswith(n + "=")) or (not n.startswith("--") and o.startswith(n) and
                                                                  len(o) > len(n)) for n in names):
            continue
        out.append(o)
    return out


def merge_site_options(site: list[str], user: list[str]) -> list[str]:
    """The cluster's options from config.toml, then the user's; an option the user gave wins,
    except ``--exclude``, whose node lists are joined."""
    keep = []
    i = 0
    while i < len(site):
        o = site[i]
        name = o.split("=", 1)[0]
        takes_value = "=" not in o and o.startswith("-") and i + 1 < len(site) and not site[i + 1].startswith("-")
        if name in _EXCLUDE or not user_pinned(user, name):
            keep += site[i:i + 2] if takes_value else [o]
        i += 2 if takes_value else 1
    return _union_exclude(keep + list(user), [])


def _union_exclude(opts: list[str], extra: list[str]) -> list[str]:
    nodes: list[str] = []
    rest = []
    i = 0
    while i < len(opts):
        o = opts[i]
        val = None
        if o in _EXCLUDE and i + 1 < len(opts):
            val, i = opts[i + 1], i + 2
        elif o.startswith("--exclude="):
            val, i = o.split("=", 1)[1], i + 1
        elif o.startswith("-x") and len(o) > 2:
            val, i = o[2:], i + 1
        else:
            rest.append(o)
            i += 1
            continue
        nodes += [n for n in val.split(",") if n]
    nodes += extra
    merged = list(dict.fromkeys(nodes))
    return rest + ([f"--exclude={','.join(merged)}"] if merged else [])


def _pinned_nodes(opts: list[str]) -> set[str]:
    from chainrun.chain.contract import option_value
    from chainrun.slurm.reservations import expand_nodes

    return set(expand_nodes(option_value(opts, "--nodelist", "-w") or ""))


def segment_args(chain: Chain, seg: Segment) -> list[str]:
    """Every sbatch option of one segment, in the order sbatch applies them (later wins)."""
    user = list(chain.sbatch_args)
    adapt = chain.extra.get("adapt") or {}
    # a node the user pinned with --nodelist is never excluded by chainrun (sbatch would refuse both)
    pinned = _pinned_nodes(user)
    args = _union_exclude(user, [n for n in adapt.get("exclude") or [] if n not in pinned])
    if adapt.get("exclusive") and not user_pinned(user, *_SHARING):
        args.append("--exclusive")
    if seg.extra.get("nodes"):  # elastic segments (--shapes): this segment's node count replaces the user's
        args = _drop(args, _NODES) + [f"--nodes={int(seg.extra['nodes'])}"]
    elif adapt.get("nodes") and not user_pinned(user, *_NODES):
        args.append(f"--nodes={int(adapt['nodes'])}")
    if adapt.get("switches") and not user_pinned(user, "--switches") and not _pinned_nodes(user):
        args.append(f"--switches={adapt['switches']}")  # chain/spread.py: at most T of extra wait
    args += [
        f"--job-name={job_name(chain.id, seg.idx)}",
        f"--time={to_slurm_time(seg.time_limit_s)}",
        f"--signal=B:{chain.signal}@{chain.signal_lead_s}",
        f"--chdir={chain.workdir}",
        "--open-mode=append",  # a requeued segment (same job id, same output file) keeps its first run's log
    ]
    if seg.extra.get("time_min_s"):
        args.append(f"--time-min={to_slurm_time(int(seg.extra['time_min_s']))}")
    if seg.dependency:
        args.append(f"--dependency={seg.dependency}")
    return args


def describe(args: list[str]) -> str:
    """The request as a user would type it, without chainrun's bookkeeping options."""
    hidden = ("--job-name=", "--chdir=", "--output=", "--open-mode=")
    return " ".join(a for a in args if not a.startswith(hidden))


__all__ = ["job_name", "merge_site_options", "segment_args", "describe", "user_pinned"]
