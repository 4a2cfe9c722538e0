"""What the ``chainrun model ...`` and ``chainrun predict`` commands do (no printing here)."""

from __future__ import annotations

import getpass
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from chainrun.errors import ChainrunError, ModelError, SlurmError, UsageError

if TYPE_CHECKING:
    from chainrun.predict.doubt import Answer, SlurmView
    from chainrun.runner.base import Runner

CRON_MARK = "# chainrun-model-refresh"


def model_dir(cluster: str) -> Path:
    from chainrun.paths import models_dir

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in cluster) or "default"
    return models_dir() / safe


def has_model(cluster: str) -> bool:
    """A saved queue-delay model for this cluster (what the `predicted` policy needs)."""
    return (model_dir(cluster) / "meta.json").exists()


def refresh(runner: "Runner", *, cluster: str = "default", now: float | None = None,
            lookback_days: float | None = None, slurm_cluster: str | None = None,
            window_days: float | None = None, tuner=None) -> dict:
    """Fetch new sacct rows, merge them into the cache, retrain, save; then ``tuner(history, all_users)``
    if given (the self-tuning of `predicted`, chainrun/sim/selftune.py ``tuner``: it sits above predict/,
    so it is handed in, not imported), whose answer is the summary's ``tuning``. Returns a summary."""
    from chainrun.predict import ingest
    from chainrun.predict.training import fit_predictor

    t0 = time.time()
    now = time.time() if now is None else now
    old, info = ingest.load_cache(cluster)
    if old is not None and info.get("last_refresh"):
        since = float(info["last_refresh"]) - ingest.OVERLAP_S
    else:
        since = now - (lookback_days or ingest.LOOKBACK_DAYS) * 86400.0
    was_all = info.get("all_users", True)
    read: dict = {"frames": [], "saved_at": time.monotonic()}

    def keep(frame, until: float, all_users: bool) -> None:
        # the windows read so far into the cache (atomically, as save_cache writes), at most once per
        # ingest.SAVE_EVERY_S: a failure at window k keeps what was saved, and the next refresh reads on
        # from there (less the overlap). Gated by time: each save rewrites the whole cache (1 s per 1 M
        # rows), and a save per window made a fast 60-day first read of 1 M rows 20 s slower
        read["frames"].append(frame)
        if time.monotonic() - read["saved_at"] < ingest.SAVE_EVERY_S:
            return
        so_far = ingest.merge_history(old, pd.concat(read["frames"], ignore_index=True))
        ingest.save_cache(cluster, so_far, {"last_refresh": until, "all_users": bool(all_users and was_all),
                                            "rows": int(len(so_far))})
        read["saved_at"] = time.monotonic()

    import pandas as pd

    fetched = ingest.fetch_history(runner, since=since, now=now, cluster=slurm_cluster,
                                   window_days=window_days or ingest.WINDOW_DAYS, on_window=keep)
    hist = ingest.merge_history(old, fetched.frame)
    all_users = bool(fetched.all_users and was_all)  # and the check over all windows' users
    info = {"last_refresh": now, "all_users": all_users, "rows": int(len(hist))}
    ingest.save_cache(cluster, hist, info)
    t_fetch = time.time() - t0
    nodes = ingest.node_count(runner)  # the real node count; the history's guess counts shared nodes twice
    predictor = fit_predictor(hist, all_users=all_users, capacity=nodes)
    predictor.meta["cluster"] = cluster
    path = predictor.save(model_dir(cluster))
    out = {
        "cluster": cluster, "new_rows": _queue_rows(fetched.frame),
        "history_rows": int(len(hist)),
        "all_users": all_users, "sacct_calls": fetched.calls, "model_dir": str(path),
        "train_rows": predictor.meta["training_window"]["rows"], "user_models": sorted(predictor.meta["user_models"]),
        "seconds": {"fetch": round(t_fetch, 2), "total": round(time.time() - t0, 2)},
    }
    if tuner is not None:
        t_tune = time.time()
        out["tuning"] = tuner(hist, all_users)
        out["seconds"].update(tune=round(time.time() - t_tune, 2), total=round(time.time() - t0, 2))
    return out


def _queue_rows(frame) -> int:
    """Rows of the queue's history in a fetch: chainrun's own scheduled ticks are read, then left out."""
    from chainrun.predict import ingest

    if "name" not in frame:
        return int(len(frame))
    return int((~frame["name"].isin(ingest.IGNORED_JOB_NAMES)).sum())


def status(cluster: str = "default", user: str | None = None) -> dict:
    from chainrun.predict import ingest

    d = model_dir(cluster)
    meta_path = d / "meta.json"
    _, info = ingest.load_cache(cluster)
    out: dict = {"cluster": cluster, "model_dir": str(d), "history": info, "model": None}
    if not meta_path.exists():
        return out
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as e:
        raise ModelError(f"unreadable {meta_path}: {e}", hint="run: chainrun model refresh") from None
    user = user or getpass.getuser()
    out["model"] = {
        "trained_at": meta.get("trained_at"), "training_window": meta.get("training_window"),
        "all_users": meta.get("all_users"), "capacity_nodes": meta.get("capacity"),
        "capacity_source": meta.get("capacity_source", "history"), "quantiles": meta.get("quantiles"),
        "calibration": meta.get("calibration", {}).get("cluster"), "refit": bool(meta.get("refit", False)),
        "user_models": sorted(meta.get("user_models", {})), "versions": meta.get("versions"),
        "train_metrics": meta.get("train_metrics"), "fit_seconds": meta.get("fit_seconds"),
        "answers_for_you": f"user:{user}" if user in meta.get("user_models", {}) else "cluster",
        "user": user,
    }
    out["model"]["support"] = support_summary(meta)
    return out


def support_summary(meta: dict) -> dict:
    """What the model's history covers (chainrun/predict/doubt.py): how many waits it learned
    from against the rows the acted-on level needs, and the busiest queue it has seen. Beyond
    either, ``predict`` and the watcher lean on Slurm's own estimate."""
    from chainrun.predict.doubt import ACTED_LEVEL, backed_level, rows_backing, short_history

    n = int((meta.get("training_window") or {}).get("rows") or 0)
    return {"training_rows": n, "short_history": short_history(n), "rows_for_full_support": rows_backing(),
            "acted_level": ACTED_LEVEL, "backed_level": round(backed_level(n), 4),
            "busiest_queue_seen": meta.get("feature_ranges") or None}


# the watcher's default tick (`chainrun watch --interval`): a wait shorter than one tick cannot
# change what it does, so `model status` compares waits at this resolution in every verdict
def predict_now(runner: "Runner", *, cluster: str, nodes: int, gpus: int, cpus: int, timelimit_s: float,
                partition: str = "", qos: str = "", user: str | None = None, live: bool = True) -> "Answer":
    """One prediction for a job submitted now: saved model + cached history + live squeue, widened
    by what the model has not seen and leaning on Slurm's own estimate where the model is out of
    its depth (chainrun/predict/doubt.py). ``live=False``: no Slurm call at all (the model alone)."""
    from chainrun.predict import ingest
    from chainrun.predict.doubt import answer
    from chainrun.predict.model import WaitRequest, load_predictor

    if nodes < 1 or gpus < 0 or cpus < 0 or timelimit_s <= 0:
        raise UsageError("--nodes must be >= 1, --gpus and --cpus >= 0, --time > 0")
    predictor = load_predictor(model_dir(cluster), cluster)
    history, info = ingest.load_cache(cluster)
    now = time.time()
    req = WaitRequest(user=user or getpass.getuser(), nodes=nodes, gpus=gpus, cpus=cpus,
                      timelimit_s=timelimit_s, partition=partition, qos=qos, submit=now)
    if not live:
        return answer(predictor, req, None, history, None)
    from chainrun.predict.model import close_gone
    from chainrun.predict.snapshot import snapshot_from_rows
    from chainrun.slurm.client import SlurmClient

    check_request(runner, nodes=nodes, partition=partition)
    rows = SlurmClient(runner, timeout=60.0).queue(all_users=True)
    view = slurm_view(runner, rows, cluster=cluster, now=now, nodes=nodes, gpus=gpus, cpus=cpus,
                      timelimit_s=timelimit_s, partition=partition, qos=qos)
    snapshot = snapshot_from_rows(rows)
    # the cache's pending and running jobs that squeue no longer shows have left the queue
    history = close_gone(history, snapshot["job_id"], info.get("last_refresh"))
    return answer(predictor, req, snapshot, history, view)


def check_request(runner: "Runner", *, nodes: int, partition: str = "") -> None:
    """UsageError for a request Slurm would refuse: a partition the cluster does not have, or more
    nodes than the partition (the asked one, else the default) has; ``scontrol show partition``, as
    ``submit`` checks its partition. Unreadable partitions: nothing to check against here
    (``slurm_view`` still refuses a partition ``sbatch --test-only`` calls invalid)."""
    from chainrun.slurm.client import SlurmClient

    try:
        parts = SlurmClient(runner, timeout=30.0).partitions()
    except (SlurmError, OSError):
        return
    if not parts:
        return
    if partition:
        first = partition.split(",")[0]  # Slurm takes a list; the first names the nodes here, as submit reads it
        if first not in parts:
            raise UsageError(f"no partition {first!r} on this cluster", hint=f"partitions: {', '.join(parts)}")
        info = parts[first]
    else:
        info = next((p for p in parts.values() if p.is_default), None)
    if info is not None and info.total_nodes and nodes > info.total_nodes:
        raise UsageError(f"--nodes {nodes}: partition {info.name!r} has {info.total_nodes} node"
                         f"{'s' if info.total_nodes != 1 else ''}")


def slurm_view(runner: "Runner", rows: list, *, cluster: str, now: float, nodes: int, gpus: int, cpus: int,
               timelimit_s: float, partition: str = "", qos: str = "") -> "SlurmView":
    """Slurm's own view of this request: ``sbatch --test-only`` (submits nothing; it uses up a job
    id) and the jobs pending ahead of it in its partition (from the squeue rows we already have).
    A part Slurm cannot answer is left empty: the prediction stands without it."""
    from chainrun.clusters import site_options
    from chainrun.durations import to_slurm_time
    from chainrun.predict.doubt import SlurmView, queue_ahead
    from chainrun.slurm.parsers import parse_test_only

    jobs, ahead_nodes, ahead_start = queue_ahead(rows, sharing_partitions(runner, partition), now)
    argv = ["sbatch", "--test-only", *site_options(cluster), "-N", str(nodes), "-t", to_slurm_time(int(timelimit_s))]
    argv += ["-p", partition] if partition else []
    argv += ["--qos", qos] if qos else []
    argv += ["--gpus", str(gpus)] if gpus else []
    argv += ["-n", str(cpus)] if cpus else []
    test_only = None
    res = None
    try:
        res = runner.run([*argv, "--wrap", "true"], 30)
        start = parse_test_only(res.stderr + "\n" + res.stdout)
        test_only = None if start is None else max(0.0, start - now)
    except (ChainrunError, OSError):  # e.g. a dropped SSH connection: the model answers without it
        pass
    if res is not None and not res.ok and "invalid partition" in (res.stderr + res.stdout).lower():
        # the partitions were unreadable (check_request passed), but Slurm itself names it: no answer
        raise UsageError(f"no partition {partition!r} on this cluster (sbatch --test-only: {res.first_error_line()})")
    # another refusal (no node with 99 GPUs, an unknown QOS) leaves the model to answer alone, but is said:
    # a 2 s wait for a job Slurm will never run misled; a timeout or a dropped connection is no refusal
    text = "" if res is None or res.ok else res.stderr + "\n" + res.stdout
    refused = next((ln.strip() for ln in text.splitlines() if "submission failed" in ln.lower()
                    or "allocation failure" in ln.lower()), "")
    if refused and any(w in refused.lower() for w in ("timed out", "timeout", "try again", "unable to contact")):
        refused = ""
    return SlurmView(test_only_s=test_only, ahead_jobs=jobs, ahead_nodes=ahead_nodes, ahead_start_s=ahead_start,
                     refused=refused)


def sharing_partitions(runner: "Runner", partition: str = "") -> set[str]:
    """The request's partition (the default one when none is asked) and every partition that shares
    a node with it: their pending jobs compete for the same nodes. Empty when unreadable (all count)."""
    from chainrun.slurm.client import SlurmClient
    from chainrun.slurm.parsers import expand_hostlist

    try:
        parts = SlurmClient(runner, timeout=30.0).partitions()
    except (SlurmError, OSError):
        return set()
    mine = parts.get(partition) if partition else next((p for p in parts.values() if p.is_default), None)
    if mine is None:
        return {partition} if partition else set()
    nodes = set(expand_hostlist(mine.nodes))
    return {mine.name} | {p.name for p in parts.values() if nodes and nodes & set(expand_hostlist(p.nodes))}


def time_limit_note(runner: "Runner", *, timelimit_s: float, partition: str = "") -> str | None:
    """A warning when no partition (or not the asked one) allows ``timelimit_s``; None if one
    does, or if the partitions cannot be read (the prediction stands on its own)."""
    from chainrun.slurm.client import SlurmClient

    try:
        parts = SlurmClient(runner, timeout=30.0).partitions()
    except (SlurmError, OSError):
        return None
    if not parts:
        return None

    def fmt(s: float) -> str:
        if s < 3600:
            return f"{s / 60:.3g}m"
        return f"{s / 86400:.3g}d" if s >= 86400 and s % 86400 == 0 else f"{s / 3600:.3g}h"

    if partition and partition in parts:
        mx = parts[partition].max_time_s
        if mx is not None and mx < timelimit_s:
            return (f"partition {partition} allows at most {fmt(mx)}, less than the asked {fmt(timelimit_s)}: "
                    "Slurm will refuse or hold this job; chainrun submit cuts a run into segments under the limit")
        return None
    limits = [(p.max_time_s, name) for name, p in parts.items()]
    if any(mx is None for mx, _ in limits):
        return None  # an UNLIMITED partition
    mx, name = max(limits)
    if mx < timelimit_s:
        return (f"the longest partition ({name}) allows {fmt(mx)}, less than the asked {fmt(timelimit_s)}: "
                "no partition runs this job as asked; chainrun submit cuts a run into segments under the limit")
    return None


def cron_line(cluster: str) -> str:
    """The refresh entry's schedule and command line (what --print-cron shows)."""
    from chainrun import schedule
    from chainrun.paths import home, logs_dir

    command = schedule.tick_command(home=home(), source=None, argv=schedule.refresh_argv(cluster),
                                    log=logs_dir() / "model-refresh.log", environ=os.environ)
    return f"{schedule.cron_spec(6 * 3600, minute=17)} {command}"


def install_cron(runner: "Runner", cluster: str) -> tuple[str, bool]:
    """Put the refresh entry in the user's crontab (scrontab where cron is barred), replacing ours for
    this cluster: the same code as `chainrun watch --install-schedule` (chainrun/schedule.py). Idempotent."""
    from chainrun import schedule

    res = schedule.install_refresh(runner, cluster, old_tag=f"{CRON_MARK} {cluster}")
    return next(ln for ln in res.lines if not ln.startswith("#")), res.changed


def eval_trace(trace: str | None, *, cluster: str, train_until: str | None, test_until: str | None,
               refit_every_s: float | None = None, random_forest: bool = True) -> dict:
    import numpy as np

    from chainrun.predict import ingest
    from chainrun.predict.evaluate import evaluate
    from chainrun.traces import read_trace

    if trace:
        df = read_trace(trace)
    else:
        df, _ = ingest.load_cache(cluster)
        if df is None:
            raise ModelError(f"no history cached for cluster {cluster!r}", hint="give --trace FILE or run: chainrun model refresh")
    sub = df["submit"].to_numpy(float)
    lo, hi = float(np.nanmin(sub)), float(np.nanmax(sub))
    tr = parse_date(train_until, "--train-until") if train_until else lo + 0.8 * (hi - lo)
    te = parse_date(test_until, "--test-until") if test_until else hi + 1.0
    from chainrun.predict.evaluate import REFIT_EVERY_S

    return evaluate(df, train_until=tr, test_until=te, random_forest=random_forest,
                    refit_every_s=refit_every_s or REFIT_EVERY_S)


def parse_date(text: str, what: str) -> float:
    """A date or ISO time, read as UTC -- the same clock the trace reader uses for naive times."""
    from datetime import datetime, timezone

    try:
        d = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"{what}: not a date: {text!r}", hint="use YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()
