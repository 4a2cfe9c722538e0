"""The shipped policies, asked the way the watcher asks them: what ships is what is measured.

``SimWatcher.ask`` builds the ``PolicyView`` that ``planning.plan`` builds (the chain record, the
current segment, the hand-over point = its end minus the signal lead, and a ``predict_wait``
callable) and calls the policy class from ``chainrun.chain.policies`` (``get_policy``). The
wait estimate is the watcher's own: ``chainrun.chain.prediction._estimate`` on the rows of a
simulated ``squeue --all`` (everyone's pending and running jobs plus the chain's live segment,
which ``_estimate`` removes from the snapshot and uses for the request, exactly as on a cluster)
and a history that is the masked simulated past plus the chain's own earlier segments (what
``sacct`` shows the watcher). ``_estimate`` asks the wall clock for "now"; here that clock reads
the simulated time. There is no idle-partition shortcut: every ask with a model runs the model.

The model's answer itself comes from ``chainrun.predict.columnar`` when the model is the
chainrun one (``fast``, the default): the same universe, features and prediction as
``Predictor.predict`` on the simulated squeue and sacct frames, computed from the trace's arrays
(kept once) instead of DataFrames built per ask; ``_estimate`` then gets only the chain's own row,
which it needs for the request. tests/sim/test_fast_asks.py checks both give the same answers.

Mirage's ``avg`` is not a shipped policy; ``AvgLead`` implements it on the same interface.

Elastic shapes: ``shape_waits`` is ``shape_plan.shape_waits`` in the replay: the watcher's
``_shape_waits`` (one ``predict_many`` for every shape of the chain, the median wait of each) on
the same simulated queue and masked past, and ``sbatch --test-only``'s answer per shape
(``test_only_start``: what Slurm's planner knows, every job to its limit, no future arrivals);
with both, the later, as the engine does.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from chainrun.chain.policies import Decision, PolicyView, Predicted, WaitEstimate, get_policy
from chainrun.state.records import PENDING, RUNNING, Chain, Segment

CHAIN_USER = "chainrun-chain"


class AvgLead:
    """Mirage's baseline: lead = mean wait of the last 100 jobs that started (no hand-off logic)."""

    name = "avg"

    def __init__(self, knowledge) -> None:
        self.k = knowledge

    def decide(self, view: PolicyView) -> Decision:
        if view.current.phase != RUNNING or view.handover_at is None:
            return Decision(False)
        lead = self.k.mean_recent_wait(view.now)
        est = WaitEstimate(seconds=lead, model="avg")
        if view.handover_at - view.now <= lead:
            return Decision(True, f"avg lead {lead:.0f}s", estimate=est)
        return Decision(False, estimate=est)


def engine_chain(work, lead_s: float, policy: str = "") -> Chain:
    """The chain record the watcher holds for a replayed chain (``--total`` = the replay's work)."""
    return Chain(id="sim", name="sim", cluster="sim", script="", workdir="", run_dir="", checkpoint_dir="",
                 total_s=int(work.work_s), segment_s=int(work.segment_s), policy=policy,
                 lead_s=int(lead_s), signal="USR2", signal_lead_s=int(work.signal_lead_s), retries=1,
                 sbatch_args=[], partition="")


def engine_segment(cur, running: bool) -> Segment:
    """The watcher's record of a replayed segment: pending, or running since its job started, with
    its payload's start once known (the wrapper's state file, which the engine reads before it sizes
    a successor: a segment that took over trains from its predecessor's release, not its job start)."""
    seg = Segment(chain_id="sim", idx=cur.idx, phase=RUNNING if running else PENDING, job_id=f"sim{cur.jid}",
                  time_limit_s=int(cur.limit), submit=cur.submit, eligible=cur.submit,
                  start=cur.start if running else None,
                  end=(cur.start + cur.limit) if running else None)
    train = getattr(cur, "train_start", float("nan"))
    if running and train == train:
        seg.extra["payload_start"] = float(train)
    return seg


class _SimClock:
    now = 0.0

    def time(self) -> float:
        return self.now

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


_CLOCK = _SimClock()


@contextmanager
def _sim_time(now: float):
    """``chainrun.chain.prediction`` reads ``time.time()`` for the request's submit time."""
    from chainrun.chain import prediction

    saved = prediction.time
    _CLOCK.now = now
    prediction.time = _CLOCK
    try:
        yield
    finally:
        prediction.time = saved


class _Cached:
    """The refit model, answering from the cache when the simulated state was seen before, else
    from ``answer`` (the columnar path: requests -> predictions) when given."""

    def __init__(self, model, cache: dict, key, answer=None) -> None:
        self.model, self.cache, self.key, self.answer = model, cache, key, answer

    def _cached(self, compute):
        """The state's cached answer, else ``compute()``'s, kept (None marks a state the model failed on)."""
        if self.key in self.cache:
            got = self.cache[self.key]
            if got is None:
                raise ValueError("the model failed on this state before")
            return got
        got = self.cache[self.key] = compute()
        return got

    def predict(self, req, snapshot, history):
        return self._cached(lambda: self.answer([req])[0] if self.answer is not None
                            else self.model.predict(req, snapshot, history))


class _CachedAssessed(_Cached):
    """``_Cached`` for the chainrun model: answers with its feature row and meta, so that
    ``_estimate`` widens and leans exactly as the watcher does (chainrun.predict.doubt); the cache
    holds (prediction, row)."""

    @property
    def meta(self) -> dict:
        return self.model.meta

    def predict_with_features(self, req, snapshot, history):
        return self._cached(lambda: self.answer([req], features=True)[0] if self.answer is not None
                            else self.model.predict_with_features(req, snapshot, history))

    def predict(self, req, snapshot, history):
        return self.predict_with_features(req, snapshot, history)[0]


class _Columnar:
    """``predict_many`` answered by the columnar path (for ``_shape_waits``)."""

    def __init__(self, answer) -> None:
        self.answer = answer

    def predict_many(self, requests, snapshot=None, history=None):
        return self.answer(list(requests))


class _Many:
    """``predict_many`` for a stand-in predictor that has only ``predict``."""

    def __init__(self, model) -> None:
        self.model = model

    def predict_many(self, requests, snapshot=None, history=None):
        return [self.model.predict(r, snapshot, history) for r in requests]


PROBE_JID = -5  # a job id no one else uses (the oracle's probe is -2)


def test_only_start(sim, nodes: int, limit_s: float, horizon_s: float) -> float:
    """When ``sbatch --test-only`` would say a job of ``nodes`` nodes starts if submitted now:
    Slurm plans with what it knows, so on a fork of the simulated partition every running and
    pending job runs to its time limit, nothing more arrives, and jobs held by a dependency are
    skipped (the backfill planner skips them too); nan if not within ``horizon_s``."""
    import heapq

    f = sim.fork()
    f.ai = len(f.arrivals)
    f.running = [(end, jid, n) for end, jid, n, _ in f.limits]
    heapq.heapify(f.running)
    f.pending = [p[:5] + (p[4],) + p[6:] for p in f.pending]  # (key, seq, jid, nodes, limit, runtime=limit, ...)
    f.held = {}
    f.submit(PROBE_JID, nodes, limit_s, limit_s)
    return f.run_until_started(PROBE_JID, f.now + horizon_s)


class SimWatcher:
    fast = True  # the chainrun model answers from arrays (chainrun.predict.columnar): the same answers

    def __init__(self, knowledge, *, gpus_per_node: int = 3) -> None:
        self.k = knowledge
        self.gpn = gpus_per_node
        t = knowledge.table
        self._user = t["user"].astype(str).tolist()
        self._name = t["name"].astype(str).tolist()
        self._part = t["partition"].astype(str).tolist()
        self._qos = t["qos"].astype(str).tolist()
        self._submit = t["submit"].astype(float).tolist()
        self._limit = t["timelimit_s"].astype(float).tolist()
        self._nodes = t["nodes"].astype(int).tolist()
        self._gpus = t["gpus"].fillna(0).astype(int).tolist()
        self._cpus = t["cpus"].fillna(0).astype(int).tolist()
        self._job_id = knowledge.job_ids  # the key the history names a job by (Knowledge: one key for both)
        self.n = len(t)
        self.fallbacks = 0  # asks where the model failed and the policy fell back to --lead
        self.cost = {"predictions": 0, "predict_s": 0.0}
        self._cache: dict = {}
        self._past: dict = {}  # now -> the masked past (Knowledge.history)
        self._within: dict = {}  # estimate's cache key -> its distribution's Remembered prob_within
        self.test_only = True  # shape_waits: also Slurm's --test-only answer, as the engine asks it
        self.test_only_horizon_s = 14 * 86400.0
        self._arrays: dict | None = None  # the trace's per-job arrays for the columnar path, built on first use

    def policy(self, spec):
        if spec.policy == "avg":
            return AvgLead(self.k)
        if spec.policy == "oracle":
            return None
        if spec.policy == "predicted" and any(getattr(spec, k, None) is not None for k in ("lead_share", "rule", "cost_s")):
            # a tuning candidate: its guard, rule and boundary cost (None: the shipped values)
            return Predicted(max_lead_share=spec.lead_share, rule=spec.rule, transition_cost_s=spec.cost_s)
        return get_policy(spec.policy)

    @staticmethod
    def view(cur, handover: float, lead_s: float, work) -> PolicyView:
        """A view of the running segment ``cur`` without a model (for the guard's first moment)."""
        return PolicyView(now=cur.start, chain=engine_chain(work, lead_s, "predicted"),
                          current=engine_segment(cur, True), handover_at=handover)

    def ask(self, policy, sim, now: float, cur, segs, *, running: bool, lead_s: float, nodes: int, work,
            target: float | None = None, cut_allowance_s: float | None = None) -> Decision:
        chain = engine_chain(work, lead_s, getattr(policy, "name", ""))
        seg = engine_segment(cur, running)
        handover = (seg.end - work.signal_lead_s) if running else None
        view = PolicyView(now=now, chain=chain, current=seg, handover_at=handover,
                          predict_wait=lambda: self.estimate(sim, now, chain, seg, cur, segs, nodes, target),
                          cut_allowance_s=cut_allowance_s)
        return policy.decide(view)

    def shape_waits(self, sim, now: float, cur, segs, shapes: tuple[int, ...], *, lead_s: float,
                    work) -> dict[int, float]:
        """The watcher's median wait per node count (``_shape_waits``: one ``predict_many``), asked
        at ``now`` on the simulated queue with the chain's live segment ``cur`` (``cur.nodes``
        nodes) and the masked past; {} where the model fails (the rule then keeps the reference).
        Cached on the simulated state like ``estimate``."""
        from chainrun.chain.prediction import _shape_waits
        from chainrun.errors import ChainrunError

        t0 = time.monotonic()
        running = cur.start == cur.start and cur.start <= now
        key = ("shapes", tuple(shapes), now, sim.seq, sim.free, sim.ai, len(sim.pending), cur.nodes,
               tuple((s.submit, s.start, s.exit) for s in segs if s.submit < now))
        if key in self._cache:
            self.cost["cache_hits"] = self.cost.get("cache_hits", 0) + 1
            return self._cache[key]
        if len(self._cache) > 20000:
            self._cache.clear()
        seg = engine_segment(cur, running)
        model = self.k.predictor(now)
        answer = self._columnar(model, sim, now, segs, cur.nodes)
        if answer is not None:
            model, rows, history = _Columnar(answer), self.queue_rows(sim, now, seg, cur, cur.nodes, only_own=True), None
        else:
            if not hasattr(model, "predict_many"):  # the stand-in used where no model could be fit
                model = _Many(model)
            rows, history = self.queue_rows(sim, now, seg, cur, cur.nodes), self.history(now, segs, cur.nodes)
        try:
            with _sim_time(now):
                out = _shape_waits(model, history, engine_chain(work, lead_s, "predicted"), seg, rows, list(shapes))
        except (ChainrunError, ValueError):  # as in estimate: counted; the rule keeps the reference
            self.fallbacks += 1
            out = {}
        if self.test_only:
            for n in shapes:  # the engine asks sbatch --test-only per shape; with the model too, the later
                start = test_only_start(sim, n, work.segment_s, self.test_only_horizon_s)
                if start == start:
                    out[n] = max(out.get(n, 0.0), start - now)
        self._cache[key] = out
        self.cost["predictions"] += 1
        self.cost["predict_s"] += time.monotonic() - t0
        return out

    # ---- the watcher's estimate, on the simulated queue and the masked past -------------------
    def estimate(self, sim, now: float, chain: Chain, seg: Segment, cur, segs, nodes: int,
                 target: float | None = None) -> WaitEstimate | None:
        """The watcher's estimate (``_estimate``). ``target`` replaces the target probability
        ``predict_quantile`` gives (for the tuning procedure: the replay then reads the same
        distribution at that level). The model's answer is cached on the simulated state, so
        policies that share a timeline (until one of them submits) share a prediction."""
        from dataclasses import replace

        from chainrun.chain.prediction import _estimate
        from chainrun.errors import ChainrunError

        t0 = time.monotonic()
        key = (now, sim.seq, sim.free, sim.ai, len(sim.pending), nodes,
               tuple((s.submit, s.start, s.exit) for s in segs if s.submit < now))
        hit = key in self._cache
        if not hit and len(self._cache) > 20000:
            self._cache.clear()
            self._within.clear()
        predictor = self.k.predictor(now)
        answer = None if hit else self._columnar(predictor, sim, now, segs, nodes)
        assessed = hasattr(predictor, "predict_with_features")  # the chainrun model; a stand-in answers alone
        model = (_CachedAssessed if assessed else _Cached)(predictor, self._cache, key, answer)
        if hit or answer is not None:  # the frames are not read: only the chain's own row, for the request
            rows, history = self.queue_rows(sim, now, seg, cur, nodes, only_own=True), None
        else:
            rows, history = self.queue_rows(sim, now, seg, cur, nodes), self.history(now, segs, nodes)
        try:
            with _sim_time(now):
                est = _estimate(model, history, chain, seg, rows, slurm=lambda: self.slurm_view(sim, now, key))
            if target is not None and est.quantile is not None:  # the same (widened, leaned) distribution
                est = replace(est, target=target, seconds=float(est.quantile(target)))
            if est.prob_within is not None:  # the same distribution for every ask of this state
                est = replace(est, prob_within=self._remembered(key, est.prob_within))
        except (ChainrunError, ValueError):
            # the watcher logs a ChainrunError and falls back to --lead; the model also raises
            # ValueError when no job in its window ever waited: the same fallback, counted
            self._cache[key] = None
            self.fallbacks += 1
            est = None
        if not hit:
            self.cost["predictions"] += 1
            self.cost["predict_s"] += time.monotonic() - t0
        else:
            self.cost["cache_hits"] = self.cost.get("cache_hits", 0) + 1
        return est

    def _columnar(self, model, sim, now: float, segs, nodes: int):
        """requests -> predictions by ``chainrun.predict.columnar`` on the simulated squeue and the
        masked past (what ``queue_rows`` and ``history`` hold), or None where it does not apply
        (``fast`` off, or a model other than chainrun's: it gets the frames)."""
        from chainrun.predict.model import Predictor

        if not self.fast or not isinstance(model, Predictor):
            return None

        def answer(requests, features: bool = False):
            from chainrun.predict.columnar import predict_at, predict_with_features_at, universe_at

            names = self._columns()["names"]
            snap, hist = self.snapshot_columns(sim), self.history_columns(now, segs, nodes)
            out: list = [None] * len(requests)
            groups: dict = {}
            for i, r in enumerate(requests):  # one universe per (user, moment), as features_for builds it
                groups.setdefault((r.user, now if r.submit is None else float(r.submit)), []).append(i)
            for (user, t), idx in groups.items():
                u = universe_at(t, names.user(user), snap, hist)
                ask = predict_with_features_at if features else predict_at
                for i, p in zip(idx, ask(model, t, [requests[i] for i in idx], u, names)):
                    out[i] = p
            return out

        return answer

    def slurm_view(self, sim, now: float, key):
        """What the watcher's squeue rows say of the queue ahead (``doubt.queue_ahead``): the trace's
        pending jobs, and the latest start Slurm's backfill plans for them (``squeue --start``; the
        replay's rows carry no start of their own). Asked only when the model is out of its depth."""
        from chainrun.predict.doubt import SlurmView

        vkey = ("slurm",) + key
        view = self._cache.get(vkey)
        if view is None:
            pending, _ = sim.queue_view()
            trace = [j for j in pending if 0 <= j < self.n]
            latest = sim.latest_expected_start(lambda j: 0 <= j < self.n)
            view = self._cache[vkey] = SlurmView(
                ahead_jobs=len(trace), ahead_nodes=sum(max(1, int(self._nodes[j] or 1)) for j in trace),
                ahead_start_s=None if latest is None else max(0.0, latest - now))
            self.cost["slurm_plans"] = self.cost.get("slurm_plans", 0) + 1
        return view

    def _columns(self) -> dict:
        import numpy as np

        from chainrun.predict.columnar import Names

        if self._arrays is None:
            names = Names()
            self._arrays = {
                "names": names, "user": names.codes(self._user, "user"), "part": names.codes(self._part, "part"),
                "submit": np.asarray(self._submit, float), "limit": np.asarray(self._limit, float),
                "nodes": np.asarray(self._nodes, float), "chain_user": names.user(CHAIN_USER), "no_part": names.part(""),
            }
        return self._arrays

    def snapshot_columns(self, sim):
        """``queue_rows`` (without the chain's own row) as the snapshot ``_universe`` reads:
        pending jobs, then running ones, keyed as the history keys them (``Knowledge.keys``: the
        trace's JobID), so a job the queue shows is not also counted from the history."""
        import numpy as np

        from chainrun.predict.columnar import JobColumns

        a = self._columns()
        pending, running = sim.queue_view()
        pj = [j for j in pending if 0 <= j < self.n]
        rj = [(j, s) for j, s in running if 0 <= j < self.n]
        jid = np.array(pj + [j for j, _ in rj], np.int64)
        start = np.array([np.nan] * len(pj) + [s for _, s in rj], float)
        submit = a["submit"][jid]
        return JobColumns(key=self.k.keys[jid], user=a["user"][jid], part=a["part"][jid], submit=submit,
                          eligible=submit, start=start, end=np.full(len(jid), np.nan), limit=a["limit"][jid],
                          nodes=a["nodes"][jid], known=np.ones(len(jid), bool))

    def history_columns(self, now: float, segs, nodes: int):
        """``history`` as columns: the masked past plus the chain's own segments."""
        import numpy as np

        from chainrun.predict.columnar import NO_KEY, JobColumns

        a = self._columns()
        h = self.k.history_columns(now, a["names"])
        own = [s for s in segs if s.submit < now]
        if not own:
            return h
        k = len(own)
        sub = np.array([s.submit for s in own], float)
        mine = JobColumns(
            key=np.full(k, NO_KEY, np.int64), user=np.full(k, a["chain_user"], np.int64),
            part=np.full(k, a["no_part"], np.int64), submit=sub, eligible=sub,
            start=np.array([s.start if (s.start == s.start and s.start <= now) else np.nan for s in own], float),
            end=np.array([s.exit if (s.exit == s.exit and s.exit <= now) else np.nan for s in own], float),
            limit=np.array([s.limit for s in own], float), nodes=np.full(k, float(nodes)), known=np.zeros(k, bool))
        return JobColumns.concat([h, mine])

    def _remembered(self, key, prob_within):
        """``prob_within`` answering from memory: the slack rule asks the same distribution at the
        same few hundred points on every ask of a state (a pure function of the cached prediction)."""
        from chainrun.chain.policies import Remembered

        r = self._within.get(key)
        if r is None:
            r = self._within[key] = Remembered(prob_within)
        return r

    def queue_rows(self, sim, now: float, seg: Segment, cur, nodes: int, only_own: bool = False) -> list:
        from chainrun.slurm.parsers import QueueRow

        pending, running = ([], []) if only_own else sim.queue_view()
        rows = []
        for jid in pending:
            if 0 <= jid < self.n:
                rows.append(self._row(jid, "PENDING", None))
        for jid, start in running:
            if 0 <= jid < self.n:
                rows.append(self._row(jid, "RUNNING", start))
        rows.append(QueueRow(job_id=seg.job_id, user=CHAIN_USER, state="RUNNING", reason="None", submit=cur.submit,
                             start=cur.start, end=cur.start + cur.limit, time_limit_s=cur.limit,
                             elapsed_s=now - cur.start, partition="", qos="", nodes=nodes, cpus=0,
                             gpus=nodes * self.gpn, dependency="", comment="", name="sim"))
        return rows

    def _row(self, jid: int, state: str, start):
        from chainrun.slurm.parsers import QueueRow

        return QueueRow(job_id=self._job_id[jid], user=self._user[jid], state=state,
                        reason="Priority" if state == "PENDING" else "None", submit=self._submit[jid],
                        start=start, end=None, time_limit_s=self._limit[jid], elapsed_s=None,
                        partition=self._part[jid], qos=self._qos[jid], nodes=self._nodes[jid], cpus=self._cpus[jid],
                        gpus=self._gpus[jid], dependency="", comment="", name=self._name[jid])

    def history(self, now: float, segs, nodes: int):
        """The masked past plus the chain's own segments, as sacct shows them at ``now``."""
        import numpy as np
        import pandas as pd

        h = self._past.get(now)
        if h is None:  # the masked past depends on the clock only: asked by many states at the same tick
            if len(self._past) >= 64:
                self._past.clear()
            h = self._past[now] = self.k.history(now)  # read, never changed, by the model (_universe)
        own = [s for s in segs if s.submit < now]
        if not own:
            return h
        rows = []
        for s in own:
            started = s.start == s.start and s.start <= now
            ended = s.exit == s.exit and s.exit <= now
            rows.append({
                "job_id": f"sim{s.jid}", "user": CHAIN_USER, "name": "sim", "partition": "", "qos": "",
                "account": "", "submit": s.submit, "eligible": s.submit, "start": s.start if started else np.nan,
                "end": s.exit if ended else np.nan, "timelimit_s": s.limit, "nodes": nodes,
                "gpus": nodes * self.gpn, "cpus": 0,
                "state": "COMPLETED" if ended else ("RUNNING" if started else "PENDING"),
                "exit_code": "0:0" if ended else "", "eligible_known": False, "priority": np.nan,
            })
        return pd.concat([h, pd.DataFrame(rows)[h.columns]], ignore_index=True)
