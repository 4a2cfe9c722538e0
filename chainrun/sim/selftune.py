"""Self-tuning in ``chainrun model refresh``: `predicted`'s values chosen for this cluster and
partition from its own history (docs/self-tuning.md).

``choose(trace, ...)`` is the rolling-origin evaluation's step for one week (chainrun/sim/rolling.py),
run at ``as_of`` (default: the end of the history) instead of at a week's start:

1. **History**: the cached sacct rows of every job of the partitions that share a node with this
   one (all users, as the model reads them), as a refresh at ``as_of`` saw them: nothing submitted
   later, no start or end after it. The partition's size and the priority weights come from Slurm
   (``read_facts``), or age-only priority, and it says so.
2. **Chains** shaped like the user's (their chains on this partition: node count, segment, work;
   else one node, the partition's limit, 3.5 segments of work: the evaluation's 168 h / 48 h) are
   injected every 12 h after a 7-day warm-up; every policy of the grid (``rolling.grid``: rule,
   boundary cost, guard share, floor at or below 3 h), the fixed leads, reactive and the oracle run
   on every point that may have ended by ``as_of``; **past** = the points whose chains all ended
   before ``as_of``.
3. **Choice**: past points injected before ``as_of - CHECK_S`` (14 days), with the one frozen
   procedure ``tune.pick`` (and ``best_fixed`` likewise); **check**: the newer past points, never
   chosen on. Fewer than ``MIN_CHOICE`` / ``MIN_CHECK`` chains: keep what is in force, and say so.
4. **Adopt** only when the choice beats the values in force on the check by more than the check's
   noise (``rolling.beats``: the 90 % interval of the paired gain above 0, no more stuck chains) and
   the replay's fidelity (start-order Spearman of the trace replayed alone) is at least
   ``FIDELITY_FLOOR``. Fixed before any score was seen, as rolling's rule is.

Nothing here changes the procedure: it calls ``rolling``'s and ``tune``'s public functions.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from chainrun.errors import ChainrunError, SlurmError
from chainrun.sim.tuning_text import summary_line, thinned_text, values_text  # noqa: F401 (once defined here)
from chainrun.sim.user_chains import chain_shape  # noqa: F401 (the chains injected; once defined here)

if TYPE_CHECKING:
    import pandas as pd

    from chainrun.runner.base import Runner

log = logging.getLogger(__name__)

# Below this start-order rank correlation the replay says too little about this cluster's queue to
# move the values by: LS6's replay reaches 0.48 (docs/evaluation.md); 0.3 keeps clusters whose replay
# is clearly informative, whatever their size.
FIDELITY_FLOOR = 0.3
CHAINS_EVERY_S = 12 * 3600.0
WARMUP_S = 7 * 86400.0
# the points run in this many batches, each reported; every batch replays the queue up to its first
# point again (per worker), so few
PROGRESS_STEPS = 8
TUNE_DAYS = 60.0  # the recent history replayed (the model's default lookback): bounds the cost whatever the cache holds


@dataclass
class Facts:
    """What the replay needs from Slurm about the partition."""

    partition: str
    nodes: int | None  # nodes of the partition (scontrol show partition); None: unreadable
    max_time_s: float | None  # its MaxTime (None: UNLIMITED or unreadable)
    sharing: set = field(default_factory=set)  # partitions sharing a node with it (their jobs compete)
    priority: str = "age"  # the replay's priority: age | multifactor | fairshare
    priority_config: dict | None = None
    size_weight_s: float = 0.0
    notes: list = field(default_factory=list)  # what was not read and what stands in for it

    def as_dict(self) -> dict:
        return {"partition": self.partition, "nodes": self.nodes, "max_time_s": self.max_time_s,
                "sharing": sorted(self.sharing), "priority": self.priority,
                "priority_config": self.priority_config, "notes": list(self.notes)}


def _days(text: str | None) -> float | None:
    """A Slurm duration (``1-00:00:00``, ``7-0``, ``00:05:00``) in days."""
    from chainrun.sim.fairshare import _duration_s

    if not text or text.strip() in ("(null)", "NONE", "UNLIMITED"):
        return None
    try:
        return _duration_s(text.strip()) / 86400.0
    except ValueError:
        return None


def priority_from_config(text: str) -> tuple[str, dict | None, float, list[str]]:
    """The replay's priority from ``scontrol show config``: (name, fairshare config, job-size weight
    in seconds of age, notes). priority/basic is first come first served: age only."""
    from chainrun.slurm.parsers import parse_config_value as get

    kind = (get(text, "PriorityType") or "").strip()
    if not kind:
        return "age", None, 0.0, ["no PriorityType in scontrol show config: age-only priority"]
    if kind != "priority/multifactor":
        return "age", None, 0.0, [f"{kind}: first come, first served (age-only priority)"]

    def num(key: str) -> float:
        try:
            return float(get(text, key) or 0)
        except ValueError:
            return 0.0

    w_age, w_fs, w_size = num("PriorityWeightAge"), num("PriorityWeightFairShare"), num("PriorityWeightJobSize")
    max_age = _days(get(text, "PriorityMaxAge")) or 7.0
    half = get(text, "PriorityDecayHalfLife") or "7-0"
    notes = []
    if w_age <= 0:
        return "age", None, 0.0, ["PriorityWeightAge is 0: the replay orders by age anyway (it has no other clock)"]
    if num("PriorityWeightPartition") or num("PriorityWeightQOS"):
        notes.append("partition and QOS weights are not replayed (one partition, no QOS: a constant)")
    size_s = w_size / w_age * max_age * 86400.0
    if w_fs > 0:
        cfg = {"PriorityWeightAge": w_age, "PriorityWeightFairshare": w_fs, "PriorityWeightJobSize": w_size,
               "PriorityMaxAge": max_age, "PriorityDecayHalfLife": half}
        return "fairshare", cfg, 0.0, notes
    return "multifactor", None, size_s, notes


def read_facts(runner: "Runner", partition: str = "") -> Facts:
    """The partition's size, limit, the partitions sharing its nodes and the priority weights, from
    ``scontrol show partition`` and ``scontrol show config`` (``sprio -w`` when the config cannot be
    read). What cannot be read is said in ``notes`` and replaced: the history's peak for the size,
    age-only priority for the weights."""
    from chainrun.slurm.client import SlurmClient
    from chainrun.slurm.parsers import expand_hostlist

    client = SlurmClient(runner, timeout=60.0)
    f = Facts(partition=partition, nodes=None, max_time_s=None)
    try:
        parts = client.partitions()
    except (SlurmError, OSError) as e:
        parts = {}
        f.notes.append(f"scontrol show partition failed ({e}): size from the history's peak")
    mine = parts.get(partition) if partition else next((p for p in parts.values() if p.is_default), None)
    if mine is not None:
        f.partition, f.nodes, f.max_time_s = mine.name, int(mine.total_nodes) or None, mine.max_time_s
        nodes = set(expand_hostlist(mine.nodes))
        f.sharing = {mine.name} | {p.name for p in parts.values() if nodes and nodes & set(expand_hostlist(p.nodes))}
    else:
        f.sharing = {partition} if partition else set()
    try:
        res = runner.run(["scontrol", "show", "config"], 60)
        text = res.stdout if res.ok else ""
    except (ChainrunError, OSError):
        text = ""
    if text:
        f.priority, f.priority_config, f.size_weight_s, notes = priority_from_config(text)
        f.notes += notes
    else:
        f.priority, f.priority_config, f.size_weight_s, notes = _from_sprio(runner)
        f.notes += notes
    return f


def _from_sprio(runner: "Runner") -> tuple[str, dict | None, float, list[str]]:
    """``sprio -w``'s weights when ``scontrol show config`` is not readable (no max age or
    half-life there: Slurm's defaults, 7 days each)."""
    try:
        res = runner.run(["sprio", "-w", "-o", "%A|%F|%J"], 60)
    except (ChainrunError, OSError):
        res = None
    lines = [ln for ln in (res.stdout.splitlines() if res is not None and res.ok else []) if "|" in ln]
    try:
        age, fs, size = (float(x) for x in lines[-1].split("|")[:3])
    except (IndexError, ValueError):
        return "age", None, 0.0, ["priority weights unreadable (scontrol show config, sprio -w): age-only priority"]
    note = ["priority weights from sprio -w (max age and half-life: Slurm's defaults, 7 days)"]
    if age <= 0:
        return "age", None, 0.0, note + ["PriorityWeightAge is 0: age-only priority"]
    if fs > 0:
        return "fairshare", {"PriorityWeightAge": age, "PriorityWeightFairshare": fs, "PriorityWeightJobSize": size,
                             "PriorityMaxAge": 7, "PriorityDecayHalfLife": "7-0"}, 0.0, note
    return "multifactor", None, size / age * 7 * 86400.0, note


def work_for(shape: dict):
    """The replay's chain (ChainWork) for a shape; the per-boundary costs (restart, hand-off, signal
    lead) are the evaluation's, scaled down for segments under 100 minutes so they stay a small part."""
    from chainrun.sim.chains import ChainWork

    seg = shape["segment_s"]
    small = min(1.0, seg / 6000.0)
    return ChainWork(work_s=shape["work_s"], segment_s=seg, restart_s=600.0 * small, handoff_s=300.0 * small,
                     signal_lead_s=min(shape["signal_lead_s"], seg / 10), tick_s=max(60.0, 600.0 * small),
                     oracle_step_s=max(60.0, 600.0 * small))


def partition_history(hist: "pd.DataFrame", sharing: set) -> "pd.DataFrame":
    """The rows of the partitions sharing the nodes (a job asking for several lists them with
    commas; an empty partition is kept: the history did not say)."""
    if not sharing or "partition" not in hist:
        return hist
    parts = hist["partition"].fillna("").astype(str)
    keep = parts.map(lambda p: p == "" or any(x in sharing for x in p.split(",")))
    return hist[keep.to_numpy(bool)]


def recent(hist: "pd.DataFrame", days: float = TUNE_DAYS) -> "pd.DataFrame":
    """The jobs submitted in the last ``days`` of the history."""
    import numpy as np

    sub = hist["submit"].to_numpy(float)
    if not len(sub):
        return hist
    return hist[sub >= np.nanmax(sub) - days * 86400.0]


def as_seen_at(trace: "pd.DataFrame", as_of: float) -> "pd.DataFrame":
    """The history a refresh at ``as_of`` read: jobs submitted before it; a start or end after it
    unknown (a job pending then never ran in this history; one running holds its nodes to the end
    of what is known)."""
    import numpy as np

    t = trace[trace["submit"].to_numpy(float) < as_of].copy()
    for col in ("start", "end"):
        v = t[col].to_numpy(float)
        t[col] = np.where(v > as_of, np.nan, v)
    return t


def choose(trace: "pd.DataFrame", *, nodes: int | None, shape: dict, in_force: dict, priority: str = "age",
           priority_config: dict | None = None, size_weight_s: float = 0.0, as_of: float | None = None,
           workers: int = 1, predictor=None, progress: Callable[[int, int], None] | None = None,
           check_s: float | None = None, min_choice: int | None = None, min_check: int | None = None,
           cands=None, warmup_s: float = WARMUP_S, chains_every_s: float = CHAINS_EVERY_S, seed: int = 0,
           job_budget: int | None = None) -> dict:
    """One self-tuning step (the module's docstring). Returns the outcome: ``adopted``, ``reason``,
    ``chosen`` and ``previous`` (values), ``window``, ``check`` (the paired gain and the check's
    scores beside reactive, the oracle and the best fixed lead), ``fidelity``. The keywords after
    ``progress`` are for small test traces (``cands`` must hold the shipped values). A history of more
    jobs than ``job_budget`` (default ``thinning.JOB_BUDGET``) is replayed thinned (chainrun/sim/thinning.py):
    the outcome's ``thinned`` says how, and the fidelity is the thinned replay's."""
    import numpy as np

    from chainrun.sim import chain_replay, rolling as R
    from chainrun.sim.chain_replay import ChainsConfig, chain_points, setup
    from chainrun.sim.chains import PolicySpec
    from chainrun.sim.thinning import JOB_BUDGET, thin

    check_s = R.CHECK_S if check_s is None else check_s
    min_choice = R.MIN_CHOICE if min_choice is None else min_choice
    min_check = R.MIN_CHECK if min_check is None else min_check
    t_begin = time.monotonic()
    work = work_for(shape)
    if as_of is None:
        as_of = float(np.nanmax(trace[["submit", "start", "end"]].to_numpy(float))) + 1.0
    seen = as_seen_at(trace, as_of)
    out: dict = {"as_of": as_of, "shape": shape, "previous": {k: in_force[k] for k in _KEYS}, "adopted": False,
                 "procedure": "chainrun.sim.selftune (rolling.grid, tune.pick, rolling.beats)",
                 "fidelity_floor": FIDELITY_FLOOR, "priority": priority}
    ran = seen[seen["start"].notna()]
    span_d = (as_of - float(ran["start"].min())) / 86400.0 if len(ran) else 0.0
    need_d = (warmup_s + min_choice * chains_every_s + check_s + work.work_s) / 86400.0
    if span_d < need_d:
        return {**out, "reason": f"history too short: {span_d:.1f} days of jobs that ran, the choice needs at "
                                 f"least {need_d:.1f} (7-day warm-up, {min_choice} chains to choose on, "
                                 f"{check_s / 86400:g} days to check on, one chain's work)"}
    cands = cands or R.grid(work.segment_s)
    ship = R.shipped(cands)
    fixed, refs = R.fixed_specs(), [PolicySpec("reactive", "reactive"), PolicySpec("oracle", "oracle")]
    force = _spec_for(in_force, cands, work.segment_s)
    full = list({s.name: s for s in [*cands, force, *fixed, *refs]}.values())
    memo = _Fits(predictor)
    cfg = ChainsConfig(nodes=nodes, chains_every_s=chains_every_s, warmup_s=warmup_s, chain_nodes=(shape["nodes"],),
                       work=work, specs=refs[:1], priority=priority, priority_config=priority_config,
                       size_weight_s=size_weight_s, workers=workers, predictor=memo, seed=seed,
                       stop_at=as_of)  # a chain still going at as_of is no past: not followed further
    if nodes is not None and int(seen["nodes"].max()) > nodes:  # a job of a sharing partition wider than this one
        cfg = replace(cfg, nodes=int(seen["nodes"].max()))
    seen, thin_nodes, thinned = thin(seen, cfg.nodes, shape["nodes"], seed=seed,
                                     budget=JOB_BUDGET if job_budget is None else job_budget)
    if thinned is not None:
        cfg = replace(cfg, nodes=thin_nodes)
        out["thinned"] = thinned
    w, n_nodes, sizes = setup(seen, cfg)
    fid = chain_replay._SHARED["fid"]
    out.update(fidelity=fid, nodes=n_nodes)
    # every point that may end by as_of: chain_points stops a chain's life before the last job, so
    # ask it as if the background ran on past as_of, and keep what can be done in time
    life = chain_replay.chain_life_s(work.work_s)
    pts = [p for p in chain_points(as_of + life, chain_replay._SHARED["first"], cfg, sizes)
           if p[0] + work.work_s < as_of]
    if sum(t < as_of - check_s for t, _ in pts) < min_choice:
        return {**out, "reason": f"history too short: {sum(t < as_of - check_s for t, _ in pts)} chains to choose "
                                 f"on (needs {min_choice})"}
    _fit_every_week(memo, w, chain_replay._SHARED, cfg, as_of)
    by_point, ended, loads = _replay_points(pts, full, workers, progress)
    past = [k for k in by_point if ended[k] < as_of]
    check = [k for k in past if k[0] >= as_of - check_s]
    choice = [k for k in past if k[0] < as_of - check_s]
    out["window"] = {"choice_from": _iso(min((k[0] for k in choice), default=None)),
                     "choice_until": _iso(as_of - check_s), "check_from": _iso(as_of - check_s),
                     "check_until": _iso(as_of), "choice_chains": len(choice), "check_chains": len(check)}
    if len(choice) < min_choice or len(check) < min_check:
        return {**out, "reason": f"too little history: {len(choice)} chains to choose on (needs {min_choice}), "
                                 f"{len(check)} to check on (needs {min_check})",
                "seconds": round(time.monotonic() - t_begin, 1)}
    best, chk = _choose_and_check(out, by_point, choice, check, full, loads, cands, fixed, refs, force, seed)
    out["seconds"] = round(time.monotonic() - t_begin, 1)
    adopted, reason = verdict(same=best.name == force.name or R.values(best) == out["previous"], check=chk,
                              spearman=fid.get("spearman"))
    return {**out, "adopted": adopted, "reason": reason}


def _replay_points(pts, full, workers: int, progress) -> tuple[dict, dict, dict]:
    """Every candidate on every point, in a few batches (a progress step after each): the rows by
    point, when each point's last chain ended, and the load level of each point."""
    from chainrun.sim.chain_replay import load_levels, run_points

    runs = []
    nb = min(PROGRESS_STEPS, len(pts))
    batches = [pts[round(len(pts) * i / nb):round(len(pts) * (i + 1) / nb)] for i in range(nb)]
    for i, b in enumerate(batches):
        more, _ = run_points([(t, n, full) for t, n in b], workers)
        runs += more
        if progress:
            progress(i + 1, len(batches))
    by_point: dict = {}
    for r in runs:
        by_point.setdefault((r.t0, r.nodes), {})[r.policy] = r
    ended = {k: max(r.ended for r in v.values()) for k, v in by_point.items()}
    return by_point, ended, load_levels(runs)


def _choose_and_check(out: dict, by_point, choice, check, full, loads, cands, fixed, refs, force, seed):
    """The frozen procedure on the older chains (tune.pick), the paired check on the newer ones
    (rolling.beats), and the check's scores beside reactive, the oracle and the best fixed lead,
    written into ``out``. Returns the choice and the check."""
    from chainrun.sim import rolling as R, tune

    pol = R.rows(by_point, choice, full, loads, seed)
    best = tune.pick(pol, cands)
    best_fixed = tune.pick(pol, fixed)
    chk = R.beats(by_point, check, best.name, force.name, seed)
    score = R.rows(by_point, check, list({s.name: s for s in [best, force, best_fixed, *refs]}.values()), loads, seed)
    out["chosen"] = R.values(best)
    out["chosen_name"] = best.name
    out["best_fixed_lead_s"] = best_fixed.lead_s
    out["check"] = {**chk, "scores_h": {"chosen": _mean(score[best.name]), "in_force": _mean(score[force.name]),
                                        "reactive": _mean(score["reactive"]), "oracle": _mean(score["oracle"]),
                                        "best_fixed": _mean(score[best_fixed.name])},
                    "stuck": {"chosen": score[best.name]["stuck"], "in_force": score[force.name]["stuck"]}}
    return best, chk


def verdict(*, same: bool, check: dict, spearman: float | None) -> tuple[bool, str]:
    """Adopt the choice? Only when it differs from the values in force, beats them on the check by
    more than the check's noise (``rolling.beats``' ``adopt``) and the replay's start-order Spearman
    is at least FIDELITY_FLOOR; the reason in every case."""
    gain = f"{_h(check.get('mean_gain_h'))} a chain, 90 % interval {_h((check.get('ci90_h') or [None])[0])} .. " \
           f"{_h((check.get('ci90_h') or [None, None])[1])}"
    if same:
        return False, "the choice is the values in force: nothing to change"
    if not check.get("adopt"):
        return False, f"the choice does not beat the values in force on the check by more than its noise ({gain})"
    if spearman is None or spearman != spearman or spearman < FIDELITY_FLOOR:
        rho = "none" if spearman is None or spearman != spearman else f"{spearman:.2f}"
        return False, f"the replay's fidelity is too low to act on (start-order Spearman {rho} < {FIDELITY_FLOOR})"
    return True, f"beats the values in force on the check ({gain}); replay fidelity {spearman:.2f}"


_KEYS = ("rule", "transition_cost_s", "lead_share", "floor_s")


class _Fits:
    """The replay's predictor factory (``Knowledge``'s), each weekly refit made once: the batches and
    the forked workers reuse the fits made beforehand in this process (``_fit_every_week``)."""

    def __init__(self, factory=None) -> None:
        from chainrun.sim.knowledge import chainrun_predictor

        self.factory = factory or chainrun_predictor
        self.__name__ = getattr(self.factory, "__name__", "model")
        self.done: dict = {}

    def __call__(self, history, until: float):
        if until not in self.done:
            try:
                self.done[until] = (True, self.factory(history, until))
            except Exception as e:  # noqa: BLE001 -- Knowledge decides what a failed fit means
                self.done[until] = (False, e)
        ok, v = self.done[until]
        if not ok:
            raise v
        return v


def _fit_every_week(memo: "_Fits", w, shared: dict, cfg, as_of: float) -> None:
    """Make every weekly refit up to ``as_of`` here, before the workers fork (they inherit them)."""
    from chainrun.sim.knowledge import Knowledge

    kn = Knowledge(w.table, shared["starts"], factory=memo, retrain_every_s=cfg.retrain_every_s,
                   first_retrain=shared["first"])
    t = shared["first"]
    while t <= as_of + cfg.work.horizon_s and t <= as_of + cfg.retrain_every_s:
        kn.predictor(t)
        t += cfg.retrain_every_s


def _spec_for(values: dict, cands: list, segment_s: float):
    """The grid point with these values, or a spec of its own (pinned values off the grid)."""
    from chainrun.chain.policies import predict_quantile
    from chainrun.sim import rolling as R
    from chainrun.sim.chains import PolicySpec

    want = {k: values[k] for k in _KEYS}
    for s in cands:
        if R.values(s) == want:
            return s
    q = predict_quantile(segment_s, want["transition_cost_s"]) if want["rule"] == "quantile" else None
    return PolicySpec("predicted_in_force", "predicted", lead_s=float(want["floor_s"]), target=q,
                      lead_share=float(want["lead_share"]), adaptive=True, rule=want["rule"],
                      cost_s=float(want["transition_cost_s"]))


def _mean(row: dict) -> float | None:
    return row.get("mean_overhead_h")


def _h(x: float | None) -> str:
    return "?" if x is None or x != x else f"{x:+.2f} h"


def _iso(t: float | None) -> str | None:
    if t is None or (isinstance(t, float) and math.isinf(t)):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def tuner(runner: "Runner", *, cluster: str, workers: int = 1,
          progress: Callable[[str, int, int], None] | None = None) -> Callable[["pd.DataFrame", bool], dict]:
    """What ``predict.service.refresh(tuner=...)`` calls with the history it just trained on."""
    return lambda history, all_users: refresh_tuning(runner, cluster=cluster, history=history, all_users=all_users,
                                                     workers=workers, progress=progress)


def refresh_tuning(runner: "Runner", *, cluster: str, history: "pd.DataFrame", all_users: bool,
                   partitions: list[str] | None = None, workers: int = 1,
                   progress: Callable[[str, int, int], None] | None = None, by: str = "refresh") -> dict:
    """Tune every partition asked (default: the cluster's default one and those of the user's chains
    here), record each outcome in ``chainrun.chain.tuned`` and return ``{partition: outcome}``.
    A partition that cannot be tuned keeps what is in force, with the reason. ``by`` names the
    command that chose (``refresh`` or ``tune``), so the history says which run made each choice."""
    from chainrun.chain import tuned

    default = read_facts(runner, "")
    wanted = list(dict.fromkeys([*(partitions or [default.partition]), *([] if partitions else _chain_partitions(cluster))]))
    out: dict = {}
    for part in [p for p in wanted if p]:
        facts = default if part == default.partition else read_facts(runner, part)
        doc = tuned.load(cluster)
        e = doc["partitions"].get(part) or {}
        force = {k: v for k, v in tuned.in_force(cluster, part).items()}
        shape = chain_shape(cluster, part, facts.max_time_s, history)
        base = {"facts": facts.as_dict(), "shape": shape, "previous": force, "adopted": False}
        if not all_users:
            res = {**base, "reason": "other users' jobs are hidden (PrivateData): the replay needs the whole queue"}
        elif history is None or history.empty:
            res = {**base, "reason": "no history"}
        else:
            hist = partition_history(recent(history), facts.sharing)
            step = (lambda d, n, p=part: progress(p, d, n)) if progress else None
            try:
                res = choose(hist, nodes=facts.nodes, shape=shape, in_force=force, priority=facts.priority,
                             priority_config=facts.priority_config, size_weight_s=facts.size_weight_s,
                             workers=workers, progress=step)
            except ChainrunError as err:  # e.g. no job of the partition ran: keep, say why
                res = {**base, "reason": f"cannot replay this history: {err}"}
            except Exception as err:  # a bug in the replay must not fail the refresh (cron) after the model is saved
                log.warning("tuning %s/%s failed; the values in force are kept", cluster, part, exc_info=True)
                res = {**base, "reason": f"the replay failed ({type(err).__name__}: {err}); kept what is in force "
                                         "(a chainrun bug: the log has the traceback)"}
            res["facts"] = facts.as_dict()
        if e.get("pinned") and res.get("adopted"):
            res["reason"] += "; not put in force: the values in force are pinned (chainrun model tune --unpin)"
        from chainrun.sim.jsonsafe import finite

        res = finite(res)
        res["put_in_force"] = bool(res.get("adopted")) and not e.get("pinned")
        res["by"] = by
        force_after = {**res["chosen"], "source": "chosen"} if res["put_in_force"] else \
            (e.get("in_force") or {**force, "source": "shipped"})
        res["summary"] = summary_line(res, force_after)
        entry = tuned.record(cluster, part, res, default_partition=default.partition or None)
        res["in_force"] = {k: entry["in_force"][k] for k in tuned.KEYS}
        out[part] = res
    return out


def _chain_partitions(cluster: str) -> list[str]:
    from chainrun.paths import state_db

    if not state_db().exists():
        return []
    from chainrun.state.store import Store

    store = Store(state_db())
    try:
        return sorted({c.partition for c in store.chains() if c.cluster == cluster and c.partition})
    finally:
        store.close()


def check_partitions(cluster: str, partitions: list[str]) -> None:
    """Raise unless every partition asked is one the cluster's model or tuning record knows: a typo
    would be tuned on no job and recorded as a partition of its own. An unreadable tuning file
    counts as no record (the model still names its partitions)."""
    from chainrun.chain import tuned

    doc, _ = tuned.read(tuned.path(cluster))
    for part in partitions:
        tuned.check_partition(cluster, part, doc or {"partitions": {}})


def tune_now(runner: "Runner", *, cluster: str, partitions: list[str] | None = None, workers: int = 1,
             progress: Callable[[str, int, int], None] | None = None) -> dict:
    """`chainrun model tune`: the refresh's tuning step on the cached history (no sacct call)."""
    from chainrun.errors import ModelError
    from chainrun.predict import ingest

    hist, info = ingest.load_cache(cluster)
    if hist is None:
        raise ModelError(f"no history cached for cluster {cluster!r}", hint=f"run: chainrun model refresh --cluster "
                                                                             f"{cluster}")
    check_partitions(cluster, partitions or [])
    return refresh_tuning(runner, cluster=cluster, history=hist, all_users=bool(info.get("all_users", True)),
                          partitions=partitions, workers=workers, progress=progress, by="tune")


def tuning_status(cluster: str) -> dict:
    """What `model status` shows per partition (chainrun/chain/tuned.py ``status``)."""
    from chainrun.chain import tuned

    return tuned.status(cluster)
