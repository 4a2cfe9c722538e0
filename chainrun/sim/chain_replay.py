"""The whole-chain run: injection points, every policy's chain on two workers, the summary.

``run_chains(trace, ChainsConfig())`` -> ``ChainsResult`` with ``as_json()`` in the shape of
``chainrun sim --chains --json`` (under ``chains``), and per-chain records for the tuning
procedure (tune.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from chainrun.errors import UsageError
from chainrun.sim.chains import ChainRun, ChainWork, PolicySpec, default_specs, run_chain
from chainrun.sim.fairshare import priority_terms
from chainrun.sim.fidelity import fidelity, replay_alone
from chainrun.sim.knowledge import Knowledge, chainrun_predictor
from chainrun.sim.scheduler import Scheduler
from chainrun.sim.trunk import Trunk
from chainrun.sim.workload import build_workload, check_span

if TYPE_CHECKING:
    import pandas as pd

LOAD_LEVELS = ("low", "medium", "heavy")


@dataclass
class ChainsConfig:
    nodes: int | None = None  # None: the trace's peak concurrent nodes
    chains_every_s: float = 12 * 3600.0
    warmup_s: float = 7 * 86400.0
    chain_nodes: tuple[int, ...] = (1, 8)
    work: ChainWork = field(default_factory=ChainWork)
    specs: list[PolicySpec] | None = None  # None: default_specs()
    priority: str = "fairshare"  # or age, multifactor (chainrun/sim/fairshare.py)
    priority_config: dict | None = None  # fairshare's weights (None: the shipped LS6 file)
    size_weight_s: float = 100 / 7000 * 7 * 86400
    bf_depth: int = 1000
    retrain_every_s: float = 7 * 86400.0
    gpus_per_node: int = 3
    workers: int = 2
    predictor: object = None  # None: the chainrun predictor
    inject_from: float | None = None  # only chains injected in [inject_from, inject_until)
    inject_until: float | None = None
    max_chains: int | None = None
    seed: int = 0  # bootstrap
    share: bool = True  # the policies at a point share the replay until they act differently (trunk.py)
    stop_at: float | None = None  # no chain is followed past this time (run_chain): the self-tuning's as_of


@dataclass
class ChainsResult:
    runs: list  # [ChainRun]
    loads: dict  # (t0, nodes) -> level
    summary: dict
    meta: dict
    fidelity: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        from chainrun.sim.jsonsafe import finite as _finite

        return _finite({**self.summary, "meta": self.meta})


_SHARED: dict = {}


def run_chains(trace: "pd.DataFrame", cfg: ChainsConfig | None = None) -> ChainsResult:
    cfg = cfg or ChainsConfig()
    t_begin = time.monotonic()
    w, nodes, sizes = setup(trace, cfg)
    points = chain_points(w.jobs[-1][0], _SHARED["first"], cfg, sizes)
    specs = _SHARED["specs"]
    runs, cost = run_points(points, cfg.workers)
    loads = load_levels(runs)
    summary = summarize(runs, loads, cfg, specs)
    meta = {"nodes": nodes, "jobs": len(w.jobs), "injections": len(points), "chain_nodes": list(sizes),
            "chains_every_h": cfg.chains_every_s / 3600, "priority": cfg.priority, "cost": cost,
            "seed": cfg.seed, "seconds": round(time.monotonic() - t_begin, 1)}
    return ChainsResult(runs, loads, summary, meta, _SHARED["fid"])


def setup(trace: "pd.DataFrame", cfg: ChainsConfig):
    """The replayed partition and the trace replayed alone, shared with the workers (forked):
    (workload, nodes, chain sizes). ``run_points`` then runs chains on it."""
    w = build_workload(trace)
    nodes = int(cfg.nodes or w.peak_nodes)
    sizes = tuple(n for n in cfg.chain_nodes if n <= nodes)
    if not sizes:
        raise UsageError(f"--nodes {nodes} is smaller than every injected chain ({min(cfg.chain_nodes)} nodes)")
    widest = max(j[2] for j in w.jobs)
    if widest > nodes:
        raise UsageError(f"the trace has a {widest}-node job but the replay has only {nodes} nodes",
                         hint=f"use --nodes {widest} or more")
    size_w, fs = priority_terms(cfg.priority, w, cfg.size_weight_s, config=cfg.priority_config)
    starts = replay_alone(w, nodes, bf_depth=cfg.bf_depth, size_weight_s=size_w, fairshare=fs)
    first = w.open_at + cfg.warmup_s
    fid = fidelity_dict(w, starts, nodes, first)
    _SHARED.update(w=w, nodes=nodes, size_w=size_w, fs=fs, starts=starts, first=first, cfg=cfg,
                   specs=cfg.specs or default_specs(), fid=fid)
    return w, nodes, sizes


def run_points(points: list, workers: int) -> "tuple[list[ChainRun], dict]":
    """Every spec's chain at every point (``(t0, nodes)``, or ``(t0, nodes, specs)`` for a point's
    own specs), on ``workers`` processes; (runs in point order, cost)."""
    return map_chunks(_run_chunk, points, workers)


def map_chunks(fn, items: list, workers: int) -> tuple[list, dict]:
    """``fn`` over ``items`` in chunks (three per worker, the last first so the longest start early, in
    forked processes when ``workers`` > 1: the module's shared replay state is inherited, not pickled);
    ``fn`` returns (results, cost). (results in item order, costs summed by key)."""
    workers = max(1, workers)
    chunks = _split(items, 3 * workers if workers > 1 else 1)
    if workers > 1 and len(chunks) > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(min(workers, len(chunks))) as pool:
            parts = pool.map(fn, chunks[::-1], chunksize=1)[::-1]
    else:
        parts = [fn(c) for c in chunks]
    runs = [r for p, _ in parts for r in p]
    cost: dict = {}
    for _, c in parts:
        for k, v in c.items():
            cost[k] = round(cost.get(k, 0) + v, 1)
    return runs, cost


def fidelity_dict(w, starts, nodes: int, first: float) -> dict:
    since = first if sum(j[0] >= first for j in w.jobs) >= 100 else w.open_at
    f = fidelity(w, starts, since=since)
    g = fidelity(w, starts, since=since, without_holds=True)
    return {**f.as_dict(), "jobs": f.jobs, "spearman_without_holds": g.spearman, "jobs_without_holds": g.jobs,
            "nodes": nodes}


def chains_fidelity(trace, cfg: ChainsConfig) -> dict:
    w = build_workload(trace)
    nodes = int(cfg.nodes or w.peak_nodes)
    size_w, fs = priority_terms(cfg.priority, w, cfg.size_weight_s)
    starts = replay_alone(w, nodes, bf_depth=cfg.bf_depth, size_weight_s=size_w, fairshare=fs)
    return fidelity_dict(w, starts, nodes, w.open_at + cfg.warmup_s)


def chain_life_s(work_s: float) -> float:
    """How long a chain of ``work_s`` may live in the replay: its work plus slack for its waits (the
    background must arrive that long after an injection; a choice must stop that long before its split)."""
    return work_s * 1.5 + 2 * 86400.0


def chain_points(last_submit: float, first: float, cfg: ChainsConfig, sizes) -> list[tuple[float, int]]:
    """(time, nodes) every ``chains_every_s`` from the end of the warm-up while the background
    still arrives for the chain's whole life (work plus slack for its waits)."""
    stop = last_submit - chain_life_s(cfg.work.work_s)
    out, t, i = [], first, 0
    while t <= stop:
        if (cfg.inject_from is None or t >= cfg.inject_from) and (cfg.inject_until is None or t < cfg.inject_until):
            out.append((t, sizes[i % len(sizes)]))
        t += cfg.chains_every_s
        i += 1
    return out[: cfg.max_chains] if cfg.max_chains is not None else out


def check_window(trace: "pd.DataFrame", cfg: ChainsConfig, what: str | None = None, hint: str | None = None) -> None:
    """Refuse, in one line and before any replay, a run that would score no chain: ``--from``/``--until``
    outside the injection points, or a trace too short for one. The points are ``chain_points``' own,
    from the trace's times as ``build_workload`` reads them (its jobs that ran). ``what`` names the
    window (default: "to score" and ``--from``/``--until`` in words) and ``hint`` the fix."""
    t = trace[trace["start"].notna() & (trace["nodes"] > 0)]
    if t.empty:
        return  # build_workload says so
    check_span(t)  # before chain_points walks decades between stray rows
    opened, last = float(t["start"].min()), float(t["submit"].max())
    first = opened + cfg.warmup_s
    if chain_points(last, first, cfg, cfg.chain_nodes):
        return
    stop = last - chain_life_s(cfg.work.work_s)  # chain_points' last injection
    covers = f"the trace covers {day(float(t['submit'].min()), time=False)} .. {day(last, time=False)}"
    if stop < first:
        raise UsageError(f"no chain to score: {covers}, too short for a chain of {cfg.work.work_s / 3600:g} h after "
                         f"a {cfg.warmup_s / 86400:g}-day warm-up", hint="a longer trace or a shorter --work")
    raise UsageError(f"no chain {what or 'to score ' + window_text(cfg)}: {covers}, its chains start {day(first)} .. "
                     f"{day(stop)} every {cfg.chains_every_s / 3600:g} h",
                     hint=hint or "--from/--until within that")


def window_text(cfg: ChainsConfig) -> str:
    """``--from``/``--until`` in words: "between A and B", "from A on", "before B"."""
    if cfg.inject_from is not None and cfg.inject_until is not None:
        return f"between {day(cfg.inject_from)} and {day(cfg.inject_until)}"
    if cfg.inject_from is not None:
        return f"from {day(cfg.inject_from)} on"
    return f"before {day(cfg.inject_until)}" if cfg.inject_until is not None else "in the trace"


def day(t: float, *, time: bool = True) -> str:
    """A trace time as the user types it: the date, and the time of day when it is not midnight."""
    import pandas as pd

    ts = pd.Timestamp(t, unit="s")
    return ts.strftime("%Y-%m-%d" if not time or ts == ts.normalize() else "%Y-%m-%d %H:%M")


def _split(points: list, k: int) -> list[list]:
    if not points:
        return []
    k = min(k, len(points))
    cut = [round(len(points) * i / k) for i in range(k + 1)]
    return [points[a:b] for a, b in zip(cut, cut[1:]) if b > a]


def _run_chunk(points):
    from chainrun.sim.adapter import SimWatcher

    t_begin = time.monotonic()
    s = _SHARED
    w, cfg = s["w"], s["cfg"]
    knowledge = Knowledge(w.table, s["starts"], factory=cfg.predictor or chainrun_predictor,
                          retrain_every_s=cfg.retrain_every_s, first_retrain=s["first"])
    watcher = SimWatcher(knowledge, gpus_per_node=cfg.gpus_per_node)
    base = Scheduler(s["nodes"], w.jobs, open_at=w.open_at, bf_depth=cfg.bf_depth, size_weight_s=s["size_w"],
                     fairshare=s.get("fs"))
    n = len(w.jobs)
    out: list[ChainRun] = []
    shared = 0
    for i, (t0, k, *own) in enumerate(points):
        base.run_until(t0)
        trunk = Trunk() if cfg.share else None  # one per point: its policies share the same job ids
        for j, spec in enumerate(own[0] if own else s["specs"]):
            jid0 = n + 10_000 * (i * 256 + (0 if cfg.share else j))
            out.append(run_chain(base, t0, k, jid0, spec, cfg.work, watcher, trunk,
                                 stop_at=math.inf if cfg.stop_at is None else cfg.stop_at))
        shared += trunk.hits if trunk else 0
    cost = {"fits": knowledge.cost["fits"], "fit_s": knowledge.cost["fit_s"], **watcher.cost,
            "fallbacks": watcher.fallbacks, "trunk_hits": shared, "worker_s": time.monotonic() - t_begin}
    return out, cost


def load_level(mean_gap_s: float) -> str:
    if mean_gap_s <= 2 * 3600:
        return "low"
    if mean_gap_s <= 12 * 3600:
        return "medium"
    return "heavy"


def load_levels(runs: list[ChainRun]) -> dict:
    """Load of an injection: reactive's mean gap per boundary (Mirage's levels)."""
    out = {}
    for r in runs:
        if r.policy == "reactive" and r.done:
            gaps = [max(0.0, g) for g, _ in r.boundaries]
            out[(r.t0, r.nodes)] = load_level(sum(gaps) / len(gaps) if gaps else 0.0)
    return out


def bootstrap_ci(values, *, seed: int = 0, n_boot: int = 2000, level: float = 0.90):
    import numpy as np

    v = np.asarray(values, float)
    if len(v) < 2:
        return [None, None]
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(axis=1)
    a = (1 - level) / 2
    return [float(np.quantile(means, a)), float(np.quantile(means, 1 - a))]


def _agg(runs: list[ChainRun], seed: int) -> dict:
    n = len(runs)
    if n == 0:
        return {"n": 0, "mean_overhead_h": None, "ci90_h": [None, None]}
    oh = [r.overhead_s / 3600 for r in runs]
    return {"n": n, "mean_overhead_h": sum(oh) / n, "ci90_h": bootstrap_ci(oh, seed=seed)}


def summarize(runs: list[ChainRun], loads: dict, cfg: ChainsConfig, specs) -> dict:
    w = cfg.work
    gpn = cfg.gpus_per_node
    pols: dict = {}
    for spec in specs:
        mine = [r for r in runs if r.policy == spec.name and (not loads or (r.t0, r.nodes) in loads)]
        rs = [r for r in mine if r.done]
        n = len(rs)
        row = _agg(rs, cfg.seed)
        row["stuck"] = sum(r.stuck for r in mine)  # more than max_segments: not in the means
        row["unfinished"] = len(mine) - n
        if n:
            work_gpu_h = sum(r.work_s / 3600 * r.nodes * gpn for r in rs)
            bounds = [b for r in rs for b in r.boundaries]
            row.update({
                "mean_overhead_from_start_h": sum(r.finish - r.first_start - r.work_s for r in rs) / n / 3600,
                "mean_queue_h": sum(r.queue_s for r in rs) / n / 3600,
                "mean_first_wait_h": sum(r.first_wait_s for r in rs) / n / 3600,
                "mean_restart_h": sum(r.restart_s for r in rs) / n / 3600,
                "mean_handoff_h": sum(r.handoff_s for r in rs) / n / 3600,
                "mean_slowdown_h": sum(r.slow_s for r in rs) / n / 3600,
                "mean_segments": sum(r.segments for r in rs) / n,
                "gpu_h_twice": sum(r.twice_node_s / 3600 * gpn for r in rs),
                "gpu_h_twice_share": sum(r.twice_node_s / 3600 * gpn for r in rs) / work_gpu_h,
                "transitions": {
                    "n": len(bounds),
                    "mean_interruption_h": sum(max(0.0, g) for g, _ in bounds) / max(1, len(bounds)) / 3600,
                    "zero_interruption_share": sum(g <= 60 for g, _ in bounds) / max(1, len(bounds)),
                    "mean_cut_h": sum(c for _, c in bounds) / max(1, len(bounds)) / 3600,
                },
            })
        row["by_load"] = {lv: _agg([r for r in rs if loads.get((r.t0, r.nodes)) == lv], cfg.seed) for lv in LOAD_LEVELS}
        if spec.shapes:
            row.update(elastic_row(spec, rs))
        pols[spec.name] = row
    for spec in specs:
        if spec.shapes and pols.get("predicted", {}).get("n"):
            pols[spec.name]["vs_predicted"] = vs_predicted(pols[spec.name], pols["predicted"])
    return {"chains": {"work_h": w.work_s / 3600, "segment_h": w.segment_s / 3600, "restart_cost_min": w.restart_s / 60,
                       "handoff_min": w.handoff_s / 60, "signal_lead_s": w.signal_lead_s, "lead_h": _h(w.lead_s, "lead"),
                       "predicted_floor_h": _h(w.lead_s, "predicted"),
                       "tick_min": w.tick_s / 60, "policies": pols, "targets": targets(pols)}}


MIN_TARGET_N = 5  # the goal applies at the load levels with at least this many chains


def _h(lead_s, policy: str) -> float:
    from chainrun.chain.policies import default_lead_s

    return (default_lead_s(policy) if lead_s is None else lead_s) / 3600


def targets(pols: dict) -> dict:
    """The issue's goals for `predicted`, per load level: it closes >= 90 % of the reactive-oracle
    gap, or ends within 10 min of the oracle, at every level with at least MIN_TARGET_N chains
    (``met``; None below that); never > 5 min worse than reactive; GPU-h twice <= 1 %.
    ``closes_90pct`` keeps the share alone, where the gap is >= 30 min."""
    out: dict = {}
    p, r, o = pols.get("predicted"), pols.get("reactive"), pols.get("oracle")
    if not (p and r and o) or not p.get("n"):
        return out
    for lv in LOAD_LEVELS:
        pl, rl, ol = p["by_load"][lv], r["by_load"][lv], o["by_load"][lv]
        if not pl["n"] or not rl["n"] or not ol["n"]:
            continue
        gap = rl["mean_overhead_h"] - ol["mean_overhead_h"]
        share = (pl["mean_overhead_h"] - ol["mean_overhead_h"]) / gap if gap > 0 else None
        behind_min = (pl["mean_overhead_h"] - ol["mean_overhead_h"]) * 60
        met = None if min(pl["n"], rl["n"], ol["n"]) < MIN_TARGET_N else \
            bool((share is not None and share <= 0.10) or behind_min <= 10.0)
        out[lv] = {"reactive_minus_oracle_h": gap, "left_share": share,
                   "closes_90pct": (share is not None and share <= 0.10) if gap >= 0.5 else None,
                   "behind_oracle_min": behind_min, "met": met,
                   "worse_than_reactive_min": (pl["mean_overhead_h"] - rl["mean_overhead_h"]) * 60}
    out["gpu_h_twice_share_ok"] = p.get("gpu_h_twice_share", 1) <= 0.01
    out["predicted_stuck"] = p.get("stuck", 0)  # stuck chains are not in the means: > 0 is a miss
    return out


def elastic_row(spec, runs: list[ChainRun]) -> dict:
    """What an elastic policy did: its shapes and efficiency, segments per node count, and the
    share of chains that ran any segment on another shape than the reference."""
    used: dict = {}
    for r in runs:
        for k in r.shapes:
            used[str(k)] = used.get(str(k), 0) + 1
    ref = spec.shapes[0]
    return {"shapes": list(spec.shapes), "efficiency": spec.efficiency, "margin_s": spec.margin_s,
            "segments_by_nodes": dict(sorted(used.items(), key=lambda kv: -int(kv[0]))),
            "chains_elastic_share": sum(any(k != ref for k in r.shapes) for r in runs) / len(runs) if runs else None}


def vs_predicted(el: dict, pred: dict) -> dict:
    """Issue #14's targets per load level: at heavy load >= 30 % less completion overhead than
    fixed-shape ``predicted``; at no level more than 5 % above it."""
    out: dict = {}
    for lv in LOAD_LEVELS:
        e, p = el["by_load"][lv], pred["by_load"][lv]
        if not e["n"] or not p["n"] or p["mean_overhead_h"] is None:
            out[lv] = None
            continue
        red = (p["mean_overhead_h"] - e["mean_overhead_h"]) / p["mean_overhead_h"] if p["mean_overhead_h"] > 0 else None
        out[lv] = {"n": e["n"], "reduction": red, "within_5pct": e["mean_overhead_h"] <= 1.05 * p["mean_overhead_h"]}
        if lv == "heavy":
            out[lv]["reduction_30pct"] = red is not None and red >= 0.30
    return out


def with_work(cfg: ChainsConfig, **kw) -> ChainsConfig:
    return replace(cfg, work=replace(cfg.work, **kw))
