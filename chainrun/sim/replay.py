"""The whole run: fidelity replay, injection points, experiments (on 2 workers), the table."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from chainrun.errors import UsageError
from chainrun.sim.experiment import ChainSpec, Transition, run_experiment
from chainrun.sim.fairshare import priority_terms
from chainrun.sim.fidelity import Fidelity, fidelity, replay_alone
from chainrun.sim.knowledge import Knowledge, PredictorFactory, chainrun_predictor
from chainrun.sim.policies import default_reports, default_rules
from chainrun.sim.scheduler import Scheduler
from chainrun.sim.workload import Workload, build_workload

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class SimConfig:
    nodes: int | None = None  # None: the trace's peak concurrent nodes
    chains_every_s: float = 4 * 3600.0
    warmup_s: float = 7 * 86400.0  # after the partition opens; also the fidelity window start
    chain_nodes: tuple[int, ...] = (1, 8)  # injection points alternate between these sizes
    spec: ChainSpec = field(default_factory=ChainSpec)
    fixed_leads_s: tuple[float, ...] = (2 * 3600.0, 6 * 3600.0, 12 * 3600.0)
    quantiles: tuple[float, ...] = (0.5, 0.75, 0.9, 0.95, 0.98)  # sensitivity; the policies' own are added
    priority: str = "fairshare"  # or "age", "multifactor": age + job size (chainrun/sim/fairshare.py)
    size_weight_s: float = 100 / 7000 * 7 * 86400  # PriorityWeightJobSize/Age * PriorityMaxAge
    bf_depth: int = 1000
    infer_dependencies: bool = True
    retrain_every_s: float = 7 * 86400.0
    gpus_per_node: int = 3
    workers: int = 2
    predictor: PredictorFactory | None = None  # None: the chainrun predictor
    # the chain's user has one job the predictor can see: its running predecessor (as in real use;
    # the chainrun model anchors on the user's recent waits). False: a user with no history at all.
    show_predecessor: bool = True
    max_experiments: int | None = None  # for quick looks and tests


@dataclass
class SimResult:
    fidelity: Fidelity
    policies: dict
    gaps: dict  # report name -> [metrics.Gap], for plots
    meta: dict
    transitions: list  # [experiment.Transition], every rule of every injection

    def as_json(self) -> dict:
        """Plain JSON types; NaN (e.g. a Spearman of constant waits) becomes None, strict parsers refuse NaN."""
        return _finite({"fidelity": self.fidelity.as_dict(), "policies": self.policies, "meta": self.meta})


def _finite(x):
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    return x


# set in the parent before forking workers, so the trace is not pickled to them
_SHARED: dict = {}


def run_sim(trace: "pd.DataFrame", cfg: SimConfig | None = None) -> SimResult:
    cfg = cfg or SimConfig()
    t_begin = time.monotonic()
    if cfg.chains_every_s <= 0:
        raise UsageError("--chains-every must be positive")
    w = build_workload(trace, infer_dependencies=cfg.infer_dependencies)
    nodes = int(cfg.nodes or w.peak_nodes)
    if nodes < min(cfg.chain_nodes):
        raise UsageError(f"--nodes {nodes} is smaller than every injected chain ({min(cfg.chain_nodes)} nodes)")
    sizes = tuple(n for n in cfg.chain_nodes if n <= nodes)  # a small test partition gets only the small chains
    if sizes != tuple(cfg.chain_nodes):
        from dataclasses import replace

        cfg = replace(cfg, chain_nodes=sizes)
    size_w, fs = priority_terms(cfg.priority, w, cfg.size_weight_s)
    widest = max(j[2] for j in w.jobs)
    if widest > nodes:  # a job wider than the cluster would block the queue forever
        raise UsageError(f"the trace has a {widest}-node job but the replay has only {nodes} nodes",
                         hint=f"use --nodes {widest} or more")
    starts = replay_alone(w, nodes, bf_depth=cfg.bf_depth, size_weight_s=size_w, fairshare=fs)
    first = w.open_at + cfg.warmup_s
    fid = fidelity(w, starts, since=first if sum(j[0] >= first for j in w.jobs) >= 100 else w.open_at)
    points = injection_points(w, cfg, first)
    if cfg.max_experiments is not None:
        points = points[: cfg.max_experiments]
    rules = default_rules(cfg.fixed_leads_s, cfg.quantiles, segment_s=cfg.spec.segment_s)
    _SHARED.update(w=w, nodes=nodes, size_w=size_w, fs=fs, starts=starts, first=first, cfg=cfg, rules=rules)
    workers = max(1, cfg.workers)
    # a few chunks per worker, the later (busier, costlier) ones first: the pool balances itself
    chunks = _split(points, 3 * workers if workers > 1 else 1)
    if workers > 1 and len(chunks) > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(min(workers, len(chunks))) as pool:
            parts = pool.map(_run_chunk, chunks[::-1], chunksize=1)[::-1]
    else:
        parts = [_run_chunk(c) for c in chunks]
    transitions = [t for p, _, _ in parts for t in p]
    kinds = sorted({k for _, ks, _ in parts for k in ks})
    cost = {k: round(sum(c[k] for _, _, c in parts), 1) for k in parts[0][2]} if parts else {}
    cost["worker_s"] = [round(c["worker_s"], 1) for _, _, c in parts]  # balance of the split
    from chainrun.sim.metrics import policy_table

    reports = default_reports(rules)
    table, gaps = policy_table(reports, transitions, handoff_s=cfg.spec.handoff_s, gpus_per_node=cfg.gpus_per_node)
    meta = {
        "nodes": nodes, "jobs": len(w.jobs), "injections": len(points), "chain_nodes": list(cfg.chain_nodes),
        "chains_every_h": cfg.chains_every_s / 3600, "priority": cfg.priority, "predictor": kinds, "predictor_cost": cost,
        "fidelity_jobs": fid.jobs, "spec": asdict(cfg.spec), "seconds": round(time.monotonic() - t_begin, 1),
    }
    return SimResult(fid, table, gaps, meta, transitions)


def injection_points(w: Workload, cfg: SimConfig, first: float) -> list[tuple[float, int]]:
    """(time, chain nodes) every ``chains_every_s`` from the end of the warm-up until the
    background stops arriving: a chain injected later would see an emptying cluster."""
    last_submit = w.jobs[-1][0]
    stop = last_submit - cfg.spec.segment_s - 86400.0
    out, t, i = [], first, 0
    while t <= stop:
        out.append((t, cfg.chain_nodes[i % len(cfg.chain_nodes)]))
        t += cfg.chains_every_s
        i += 1
    return out


def _split(points: list, k: int) -> list[list]:
    """Contiguous time ranges (each replays the trace forward once and fits its own weeks)."""
    if not points:
        return []
    k = min(k, len(points))
    cut = [round(len(points) * i / k) for i in range(k + 1)]
    return [points[a:b] for a, b in zip(cut, cut[1:]) if b > a]


def _run_chunk(points: list[tuple[float, int]]) -> tuple[list[Transition], list[str], dict]:
    t_begin = time.monotonic()
    s = _SHARED
    w, cfg = s["w"], s["cfg"]
    factory = cfg.predictor or chainrun_predictor
    knowledge = Knowledge(w.table, s["starts"], factory=factory, retrain_every_s=cfg.retrain_every_s,
                          first_retrain=s["first"])
    base = Scheduler(s["nodes"], w.jobs, open_at=w.open_at, bf_depth=cfg.bf_depth, size_weight_s=s["size_w"],
                     fairshare=s.get("fs"))
    n = len(w.jobs)
    out: list[Transition] = []
    for i, (t0, chain_nodes) in enumerate(points):
        base.run_until(t0)
        out.extend(run_experiment(base, t0, chain_nodes, n + 2 * i, n + 2 * i + 1, s["rules"], cfg.spec,
                                  knowledge, gpus_per_node=cfg.gpus_per_node,
                                  show_predecessor=cfg.show_predecessor))
    cost = {"fallbacks": knowledge.fallbacks, **knowledge.cost, "worker_s": time.monotonic() - t_begin}
    return out, sorted(knowledge.model_kinds), cost
