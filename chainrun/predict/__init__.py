"""Queue-delay prediction: how long will a job wait in the Slurm queue?

Public interface (used by the chain submitter, the simulator and the CLI)::

    from chainrun.predict import WaitRequest, Prediction, load_predictor, fit_predictor

    predictor = fit_predictor(history_df)      # canonical frame (chainrun.traces columns)
    dist = predictor.predict(request, snapshot_df, history_df)   # the wait distribution
    dist.p10, dist.p50, dist.p90, dist.model   # seconds; "cluster" or "user:<name>"
    dist.qs, dist.values                       # every learned level (0.1 .. 0.98) and its wait
    dist.quantile(0.98)                        # any level, from one monotone curve
    dist.prob_within(6 * 3600)                 # P(wait <= 6 h | submitted at request.submit)
    predictor.predict_many([req_a, req_b], snapshot_df, history_df)   # several shapes, same moment
    predictor.save(directory); load_predictor(directory)

``WaitRequest(user, nodes, gpus, cpus, timelimit_s, partition="", qos="", submit=None)``:
``submit`` is "now" in epoch seconds on the same clock as the frames (None: time.time());
``cpus=0`` means unknown.

``snapshot_df``: canonical rows of the jobs pending or running at ``submit`` (state
"PENDING"/"RUNNING"); for pending rows start/end are ignored, for running rows end is.
Leave out jobs pending for a dependency or a hold: they are not ahead of anyone
(:func:`chainrun.predict.ingest.live_snapshot` builds it from one ``squeue`` call).
``history_df``: canonical rows of jobs known before ``submit`` (finished ones at least);
facts after ``submit`` are masked, so passing a whole trace is safe, only slower.

``fit_predictor(history, *, since=None, until=None, per_user="auto", all_users=None,
capacity=None)`` trains on jobs whose wait was known before ``until`` (default: all) and
became eligible after ``since`` (default: the data's own warm-up, first start + 7 days, when
the history spans 4 weeks or more; else its start). ~1-3 s on the 11k-job LS6 training
months. ``all_users`` defaults to "more than one user in the history"; without it the queue
features are empty. ``capacity``: the cluster's node count (default: estimated from the
history). Models are LightGBM quantile boosters at 0.1/0.5/0.9/0.95/0.98 of log10 wait,
calibrated on the most recent training jobs (split conformal, Kaplan-Meier for jobs still
waiting; docs/model.md), saved as LightGBM text + ``meta.json``; :func:`load_predictor`
raises :class:`chainrun.errors.ModelError` for a model of another format or feature list.
"""

from chainrun.predict.distribution import Prediction
from chainrun.predict.model import Predictor, WaitRequest, load_predictor
from chainrun.predict.training import fit_predictor

__all__ = ["Prediction", "Predictor", "WaitRequest", "fit_predictor", "load_predictor"]
