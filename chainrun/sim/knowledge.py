"""What a policy may know at time ``now``: the simulated past, never the future.

All views come from the *simulated* world (the trace replayed alone, see fidelity.py, plus the
live queue of the experiment), because that is the world the successor will queue in. Every
fact is masked at ``now``: a start or end after ``now`` is NaN, a job submitted after ``now``
is absent. Models are refit every ``retrain_every_s`` on what was known at the refit time.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("chainrun.sim")
HISTORY_WINDOW_S = 9 * 86400.0  # the chainrun predictor uses 7 days of usage + slack


class WaitPredictor(Protocol):
    def predict(self, request, snapshot_df, history_df): ...  # -> chainrun.predict.Prediction


# fit(history known at `until`, until) -> predictor
PredictorFactory = Callable[["pd.DataFrame", float], WaitPredictor]


def chainrun_predictor(history: "pd.DataFrame", until: float) -> WaitPredictor:
    """The real chainrun predictor (chainrun.predict), fit on what was known at ``until``."""
    from chainrun.predict import fit_predictor

    return fit_predictor(history, until=until)


class RecentWaits:
    """Stand-in predictor: quantiles of the last ``n`` known waits. Used where the chainrun model
    cannot be fit (too little history), and in tests."""

    def __init__(self, history: "pd.DataFrame", until: float, n: int = 200) -> None:
        import numpy as np

        started = history[history["start"].notna() & (history["start"] <= until)].sort_values("start")
        w = (started["start"] - started["submit"]).to_numpy(float)[-n:]
        self.q = np.quantile(w, [0.1, 0.5, 0.9]) if len(w) else np.zeros(3)

    def predict(self, request, snapshot_df=None, history_df=None):
        from chainrun.predict import Prediction

        return Prediction(float(self.q[0]), float(self.q[1]), float(self.q[2]), "recent-waits")


class Knowledge:
    """Masked views of the simulated past, and the periodically refit predictor."""

    def __init__(self, table: "pd.DataFrame", sim_start, *, factory: PredictorFactory, retrain_every_s: float,
                 first_retrain: float) -> None:
        import numpy as np
        import pandas as pd

        world = table.copy()
        world["start"] = np.asarray(sim_start, float)
        world["end"] = world["start"] + (table["end"] - table["start"]).clip(upper=table["timelimit_s"])
        world.index = np.arange(len(world))  # the table's rows (the replay's job ids), kept through the sort
        world = world.sort_values("submit", kind="stable")
        rows = world.index.to_numpy()  # world row -> table row
        self.world = world.reset_index(drop=True)
        # One key for a trace job wherever the model meets it: the simulated squeue names a job by the
        # trace's JobID, as sacct's history does, so ``model._universe`` drops the history copy of every
        # job the live queue shows (as on a cluster). ``job_ids`` by table row for the squeue rows;
        # ``keys``, one code per distinct JobID (grouped as the string match groups them), by table
        # row for the columnar snapshot, and ``_world_keys`` by world row for the columnar history.
        ids = table["job_id"].astype(str)
        self.job_ids: list[str] = ids.tolist()
        self.keys = pd.factorize(ids)[0].astype(np.int64)
        self._world_keys = self.keys[rows]
        self._submit = self.world["submit"].to_numpy(float)
        self._start = self.world["start"].to_numpy(float)
        self._end = self.world["end"].to_numpy(float)
        self._state = self.world["state"].to_numpy(object)
        self._exit = self.world["exit_code"].to_numpy(object)
        # for the "avg" baseline: waits in order of (simulated) start
        order = np.argsort(self.world["start"].to_numpy(float), kind="stable")
        self._start_sorted = self.world["start"].to_numpy(float)[order]
        waits = (self.world["start"] - self.world["submit"]).to_numpy(float)[order]
        self._wait_cumsum = np.concatenate([[0.0], np.cumsum(waits)])
        self.table = table
        self.factory = factory
        self.retrain_every_s = retrain_every_s
        self.first_retrain = first_retrain
        self._models: dict[int, WaitPredictor] = {}
        self.model_kinds: set[str] = set()
        self.fallbacks = 0  # predictions answered by the stand-in because the model failed
        self.cost = {"fits": 0, "fit_s": 0.0, "predictions": 0, "predict_s": 0.0}
        self._columns: tuple | None = None  # (names, the world as JobColumns), built on first use

    def history(self, now: float, *, window_s: float | None = HISTORY_WINDOW_S) -> "pd.DataFrame":
        import numpy as np

        lo = 0 if window_s is None else int(np.searchsorted(self._submit, now - window_s, "left"))
        hi = int(np.searchsorted(self._submit, now, "left"))  # submitted strictly before now
        h = self.world.iloc[lo:hi].copy()
        start, end = self._start[lo:hi], self._end[lo:hi]
        started, ended = start <= now, end <= now
        h["start"] = np.where(started, start, np.nan)
        h["end"] = np.where(ended, end, np.nan)
        # state and exit code are facts of the end: unknown while a job pends or runs
        h["state"] = np.where(ended, self._state[lo:hi], np.where(started, "RUNNING", "PENDING"))
        h["exit_code"] = np.where(ended, self._exit[lo:hi], "")
        h["priority"] = np.nan  # recorded at some later time: never known at `now`
        return h

    def history_columns(self, now: float, names, *, window_s: float = HISTORY_WINDOW_S):
        """:meth:`history` as ``chainrun.predict.columnar.JobColumns`` (the same rows, order and
        masks; ``names`` numbers users and partitions). A row's ``key`` is its JobID's code
        (``keys``), the key ``SimWatcher.snapshot_columns`` gives the same job in the live queue."""
        import numpy as np

        world = self._world_columns(names)
        lo = int(np.searchsorted(self._submit, now - window_s, "left"))
        hi = int(np.searchsorted(self._submit, now, "left"))  # submitted strictly before now
        h = world.take(slice(lo, hi))
        h.start = np.where(h.start <= now, h.start, np.nan)
        h.end = np.where(h.end <= now, h.end, np.nan)
        return h

    def _world_columns(self, names):
        import numpy as np

        from chainrun.predict.columnar import JobColumns

        if self._columns is None or self._columns[0] is not names:
            w = self.world
            self._columns = (names, JobColumns(
                key=self._world_keys, user=names.codes(w["user"].astype(str).tolist(), "user"),
                part=names.codes(w["partition"].astype(str).tolist(), "part"), submit=self._submit,
                eligible=w["eligible"].to_numpy(float), start=self._start, end=self._end,
                limit=w["timelimit_s"].to_numpy(float), nodes=w["nodes"].to_numpy(float),
                known=w["eligible_known"].fillna(False).astype(bool).to_numpy() if "eligible_known" in w
                else np.zeros(len(w), bool)))
        return self._columns[1]

    def mean_recent_wait(self, now: float, n: int = 100) -> float:
        """Mirage's "avg": mean wait of the last ``n`` jobs that started before ``now``."""
        import numpy as np

        k = int(np.searchsorted(self._start_sorted, now, "right"))
        if k == 0:
            return 0.0
        j = max(0, k - n)
        return float((self._wait_cumsum[k] - self._wait_cumsum[j]) / (k - j))

    def predictor(self, now: float) -> WaitPredictor:
        """The model of the latest refit at or before ``now``."""
        from chainrun.errors import ChainrunError

        k = max(0, int((now - self.first_retrain) // self.retrain_every_s))
        if k not in self._models:
            until = self.first_retrain + k * self.retrain_every_s
            hist = self.history(until, window_s=None)
            t_fit = time.monotonic()
            try:
                self._models[k] = self.factory(hist, until)
                self.model_kinds.add(getattr(self.factory, "__name__", "model"))
            except (ChainrunError, ValueError) as e:  # too little history to fit: say so, use the stand-in
                log.info("predictor fit at %s failed (%s); using recent waits", until, e)
                self._models[k] = RecentWaits(hist, until)
                self.model_kinds.add("recent-waits")
            self.cost["fits"] += 1
            self.cost["fit_s"] += time.monotonic() - t_fit
        return self._models[k]

    def snapshot(self, now: float, pending: list[int], running: list[tuple[int, float]]) -> "pd.DataFrame":
        """The live ``squeue`` at ``now`` from the simulated queue, in canonical columns."""
        import numpy as np
        import pandas as pd

        ids = pending + [jid for jid, _ in running if jid < len(self.table)]
        starts = [np.nan] * len(pending) + [s for jid, s in running if jid < len(self.table)]
        snap = self.table.iloc[ids].copy() if ids else self.table.iloc[:0].copy()
        snap["start"] = np.asarray(starts, float)
        snap["end"] = np.nan
        snap["state"] = np.where(snap["start"].isna(), "PENDING", "RUNNING")
        snap["exit_code"] = ""  # facts of the end (and the trace's after-the-fact priority): unknown now
        snap["priority"] = np.nan
        return pd.DataFrame(snap)

