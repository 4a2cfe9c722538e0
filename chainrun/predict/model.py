"""The saved queue-delay model as it answers: a request in, a wait distribution out.

One cluster-wide model plus per-user ones (chosen at training, chainrun/predict/training.py):
LightGBM quantile boosters of log10 wait at QUANTILES, or one quantile forest
(chainrun/predict/forest.py), each with its split-conformal shifts (chainrun/predict/calibration.py)
in ``meta.json``. A request's features are built from recent history plus the live snapshot, with
every fact after the moment asked masked out; the boosters' answers plus the shifts, kept
monotone, are the learned levels of a :class:`~chainrun.predict.distribution.Prediction`.
Saved as LightGBM text files plus ``meta.json``; never pickle.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from chainrun.errors import ModelError
from chainrun.predict.distribution import QUANTILES, Prediction, qname
from chainrun.predict.features import FEATURES, build_features
from chainrun.predict.prep import prepare

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

FORMAT = 2
HISTORY_DAYS = 8.0  # history a prediction needs: 7-day usage window + slack


@dataclass(frozen=True)
class WaitRequest:
    """One question: how long would this job wait if submitted at ``submit`` (epoch s; None = now)?"""

    user: str
    nodes: int
    gpus: int
    cpus: int
    timelimit_s: float
    partition: str = ""
    qos: str = ""
    submit: float | None = None


class Predictor:
    """Cluster model + selected per-user models; see the module doc."""

    def __init__(self, boosters: dict[str, dict[float, object]], meta: dict, forests: dict | None = None) -> None:
        self.boosters = boosters  # "cluster" or "user:<name>" -> {q: lightgbm.Booster} (or {"forest": ...})
        self.meta = meta
        self.forests = forests or {}  # name -> chainrun.predict.forest.LeafForest

    # ------------------------------------------------------------ prediction
    def model_for(self, user: str) -> str:
        key = f"user:{user}"
        return key if key in self.boosters else "cluster"

    def features_for(self, request: WaitRequest, snapshot: "pd.DataFrame | None", history: "pd.DataFrame | None"):
        import numpy as np
        import pandas as pd

        now = float(request.submit) if request.submit is not None else time.time()
        universe = _universe(now, request.user, snapshot, history)
        partition = request.partition or _usual_partition(universe, request.user)
        q = pd.DataFrame({
            "user": [request.user], "t": [now], "nodes": [request.nodes], "gpus": [request.gpus],
            "cpus": [request.cpus], "timelimit_s": [float(request.timelimit_s)],
            "partition": [partition], "qos": [request.qos or ""],
        })
        X = build_features(q, universe, capacity=self.meta["capacity"], all_users=self.meta["all_users"],
                           categories=self.meta["categories"])
        return np.asarray(X, float)

    def predict(self, request: WaitRequest, snapshot: "pd.DataFrame | None" = None,
                history: "pd.DataFrame | None" = None) -> Prediction:
        """The wait distribution of one request (quantiles and P(wait <= H)); see :class:`Prediction`."""
        return self.predict_many([request], snapshot, history)[0]

    def predict_many(self, requests: "list[WaitRequest]", snapshot: "pd.DataFrame | None" = None,
                     history: "pd.DataFrame | None" = None) -> "list[Prediction]":
        """Distributions for several request shapes asked at the same moment (elastic shapes,
        ``--exclusive`` or not, one partition or another): one feature pass per shape."""
        return [self.predict_with_features(request, snapshot, history)[0] for request in requests]

    def predict_with_features(self, request: WaitRequest, snapshot: "pd.DataFrame | None" = None,
                              history: "pd.DataFrame | None" = None) -> "tuple[Prediction, np.ndarray]":
        """:meth:`predict` and the feature row it answered (chainrun.predict.doubt reads it
        against the training ranges in ``meta["feature_ranges"]``)."""
        X = self.features_for(request, snapshot, history)
        name = self.model_for(request.user)
        row = self.predict_matrix(X, [name])[0]
        vals = tuple(float(10**v) for v in row)
        by = dict(zip(QUANTILES, vals))
        return Prediction(by[0.1], by[0.5], by[0.9], name, tuple(QUANTILES), vals), X[0]

    def predict_matrix(self, X, models: list[str], *, calibrated: bool = True) -> "np.ndarray":
        """log10-wait quantiles (rows x len(QUANTILES)) for a feature matrix; ``models`` per row
        or one for all. Calibration shifts (chainrun.predict.calibration) are added, then rows are sorted."""
        import numpy as np

        out = np.empty((len(X), len(QUANTILES)))
        anchor = anchor_of(X, self.meta["anchor_fallback"]) if self.meta.get("anchor", True) else \
            np.full(len(X), self.meta["anchor_fallback"])
        names = np.asarray(models * len(X) if len(models) == 1 else models)
        cal = self.meta.get("calibration", {}) if calibrated else {}
        for name in np.unique(names):
            rows = names == name
            shift = cal.get(str(name), {})
            if str(name) in self.forests:
                out[rows] = self.forests[str(name)].quantiles(X[rows], QUANTILES) + \
                    np.array([shift.get(qname(q), 0.0) for q in QUANTILES])
                continue
            for j, q in enumerate(QUANTILES):
                out[rows, j] = anchor[rows] + self.boosters[name][q].predict(X[rows], num_threads=1) + shift.get(qname(q), 0.0)
        out = np.maximum(out, 0.0)
        # quantile models are fitted apart: keep them ordered (a running max keeps the learned
        # upper levels where a lower one crossed them, instead of swapping levels)
        return np.maximum.accumulate(out, axis=1)

    # ------------------------------------------------------------ storage
    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        files = {}
        for i, (name, models) in enumerate(sorted(self.boosters.items())):
            stem = "cluster" if name == "cluster" else f"user{i:04d}"
            files[name] = {}
            for q, b in models.items():
                key = q if isinstance(q, str) else qname(q)
                fn = f"{stem}_{key}.txt"
                b.save_model(str(d / fn))
                files[name][key] = fn
        meta = {**self.meta, "files": files}
        if self.forests:
            meta["forests"] = {name: f.encode() for name, f in self.forests.items()}
        tmp = d / ".meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, d / "meta.json")  # meta last: a half-written model has no meta
        return d


def load_predictor(directory: str | Path, cluster: str | None = None) -> Predictor:
    """Load a saved predictor; refuses a model built for another feature list. ``cluster`` names
    the cluster in the hint (a bare `model refresh` refreshes local's model, not this one)."""
    import lightgbm as lgb

    d = Path(directory)
    try:
        meta = json.loads((d / "meta.json").read_text())
    except FileNotFoundError:
        raise ModelError(f"no queue-delay model in {d}",
                         hint="run: chainrun model refresh" + (f" --cluster {cluster}" if cluster else "")) from None
    except (OSError, ValueError) as e:
        raise ModelError(f"unreadable model metadata {d / 'meta.json'}: {e}", hint="run: chainrun model refresh") from None
    if meta.get("format") != FORMAT:
        raise ModelError(f"model in {d} has format {meta.get('format')}, this chainrun reads {FORMAT}",
                         hint="run: chainrun model refresh")
    if list(meta.get("features", [])) != list(FEATURES):
        missing = sorted(set(FEATURES) - set(meta.get("features", [])))
        extra = sorted(set(meta.get("features", [])) - set(FEATURES))
        raise ModelError(
            f"model in {d} was trained on a different feature list (missing {missing or 'none'}, "
            f"unknown {extra or 'none'}, or another order)", hint="run: chainrun model refresh")
    boosters: dict[str, dict[float, object]] = {}
    forest_blobs = meta.pop("forests", None) or {}
    for name, per_q in meta["files"].items():
        boosters[name] = {}
        for q in (["forest"] if name in forest_blobs else QUANTILES):
            path = d / per_q[q if isinstance(q, str) else qname(q)]
            try:
                b = lgb.Booster(model_file=str(path))
            except Exception as e:  # lightgbm raises its own error type for bad files
                raise ModelError(f"cannot load {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            if b.feature_name() != list(FEATURES):
                raise ModelError(f"{path} was trained on other features than its meta.json says",
                                 hint="run: chainrun model refresh")
            boosters[name][q] = b
    meta.pop("files", None)
    forests = {}
    if forest_blobs:
        from chainrun.predict.forest import LeafForest

        for name, blob in forest_blobs.items():
            try:
                forests[name] = LeafForest.decode(boosters[name]["forest"], blob)
            except (KeyError, ValueError) as e:
                raise ModelError(f"unreadable forest tables in {d / 'meta.json'}: {e}", hint="run: chainrun model refresh") from None
    return Predictor(boosters, meta, forests)


def anchor_of(X, fallback: float) -> "np.ndarray":
    """Mean log10 wait of the user's last 20 jobs, or ``fallback`` for a user without any."""
    import numpy as np

    a = X[:, FEATURES.index("user_mean_wait20")]
    return np.where(np.isnan(a), fallback, a)




def close_gone(history: "pd.DataFrame | None", live_ids, read_at: float | None) -> "pd.DataFrame | None":
    """The cached ``history`` as the live queue shows it: a job the cache saw pending (start
    unknown) or running (end unknown) that is not among ``live_ids`` (the job ids of a live
    squeue snapshot) has left the queue since; its end is set to ``read_at``, when the cache was
    read (sacct's ``last_refresh``), else to the history's newest fact.

    Closed, not dropped: training saw a job that left the queue as one with an end (a pending job
    that never started has an end and no start, as a cancelled one has), and it still counts in
    the user's submissions of the week; only its start, which nobody knows, stays unknown, so no
    invented wait enters the wait features. Any end between the cache read and now gives the same
    features: they compare ends with the time asked only. Only for a history read before the
    snapshot (the CLI's ``predict`` and the watcher); the replay's history is exact at its
    moment and its own segments are open on purpose, so it never calls this."""
    import numpy as np

    if history is None or not len(history):
        return history
    start, end = history["start"].to_numpy(float), history["end"].to_numpy(float)
    gone = (np.isnan(start) | np.isnan(end)) & ~history["job_id"].astype(str).isin(
        {str(i) for i in live_ids}).to_numpy()
    if not gone.any():
        return history
    if read_at is None:
        facts = np.concatenate([history["submit"].to_numpy(float), start, end])
        read_at = float(np.nanmax(facts))
    h = history.copy()
    # never before its own submit or start: a job cannot leave the queue before it came into it
    floor = np.fmax(h["submit"].to_numpy(float), start)
    h.loc[gone, "end"] = np.fmax(floor[gone], float(read_at))
    return h


def _usual_partition(universe: "pd.DataFrame", user: str) -> str:
    """No partition asked for: Slurm will use the default; guess it as the user's most used
    partition, else the cluster's ("" when the history has none)."""
    parts = universe["partition"].astype(str)
    parts = parts[parts != ""]
    if not len(parts):
        return ""
    mine = parts[universe.loc[parts.index, "user"].astype(str) == str(user)]
    return str((mine if len(mine) else parts).value_counts().index[0])


def _universe(now: float, user: str, snapshot, history) -> "pd.DataFrame":
    """Recent history + the live snapshot, with every fact after ``now`` masked out."""
    import numpy as np
    import pandas as pd

    from chainrun.traces import CANONICAL_COLUMNS

    parts = []
    snap_ids: set = set()
    if snapshot is not None and len(snapshot):
        s = snapshot.copy()
        st = s["state"].astype(str).str.upper()
        s = s[st.isin(["PENDING", "RUNNING"])].copy()
        st = s["state"].astype(str).str.upper()
        s.loc[st == "PENDING", ["start", "end"]] = np.nan  # squeue's start of a pending job is a guess
        s.loc[st == "RUNNING", "end"] = np.nan  # ... and the end of a running one too
        snap_ids = set(s["job_id"].astype(str))
        parts.append(s)
    if history is not None and len(history):
        h = history
        start, end = h["start"].to_numpy(float), h["end"].to_numpy(float)
        lo = now - HISTORY_DAYS * 86400.0
        keep = (h["submit"].to_numpy(float) < now) & ((start >= lo) | (end >= lo) | np.isnan(end))
        mine = (h["user"].astype(str) == str(user)).to_numpy() & ~np.isnan(start)
        if mine.any():  # the user's last jobs count however old they are
            last = np.flatnonzero(mine)[np.argsort(start[mine])[-40:]]
            keep[last] = True
        h = h[keep]
        if snap_ids:
            h = h[~h["job_id"].astype(str).isin(snap_ids)]
        h = h.copy()
        for c in ("start", "end"):  # a history that knows the future must not leak it
            h.loc[h[c] >= now, c] = np.nan
        parts.append(h)
    if not parts:
        return prepare(pd.DataFrame({c: pd.Series(dtype=float) for c in CANONICAL_COLUMNS}).astype(
            {"user": str, "eligible_known": bool}), now=now)
    u = pd.concat(parts, ignore_index=True)
    if "eligible_known" not in u:
        u["eligible_known"] = False
    u["eligible_known"] = u["eligible_known"].fillna(False).astype(bool)
    if "eligible" not in u:
        u["eligible"] = u["submit"]
    return prepare(u, now=now)


