"""What the ``chainrun model ...`` and ``chainrun predict`` commands do (no printing here)."""

from __future__ import annotations

import getpass
import json
import math
import shlex
import shutil
import sys
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
            window_days: float | None = None) -> dict:
    """Fetch new sacct rows, merge them into the cache, retrain, save. Returns a summary."""
    from chainrun.predict import ingest
    from chainrun.predict.training import fit_predictor

    t0 = time.time()
    now = time.time() if now is None else now
    old, info = ingest.load_cache(cluster)
    if old is not None and info.get("last_refresh"):
        since = float(info["last_refresh"]) - ingest.OVERLAP_S
    else:
        since = now - (lookback_days or ingest.LOOKBACK_DAYS) * 86400.0
    fetched = ingest.fetch_history(runner, since=since, now=now, cluster=slurm_cluster,
                                   window_days=window_days or ingest.WINDOW_DAYS)
    hist = ingest.merge_history(old, fetched.frame)
    all_users = bool(fetched.all_users and info.get("all_users", True))
    info = {"last_refresh": now, "all_users": all_users, "rows": int(len(hist))}
    ingest.save_cache(cluster, hist, info)
    t_fetch = time.time() - t0
    nodes = ingest.node_count(runner)  # the real node count; the history's guess counts shared nodes twice
    predictor = fit_predictor(hist, all_users=all_users, capacity=nodes)
    predictor.meta["cluster"] = cluster
    path = predictor.save(model_dir(cluster))
    return {
        "cluster": cluster, "new_rows": int(len(fetched.frame)), "history_rows": int(len(hist)),
        "all_users": all_users, "sacct_calls": fetched.calls, "model_dir": str(path),
        "train_rows": predictor.meta["training_window"]["rows"], "user_models": sorted(predictor.meta["user_models"]),
        "seconds": {"fetch": round(t_fetch, 2), "total": round(time.time() - t0, 2)},
    }


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
    out["live_error"] = live_error(cluster)
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


def live_error(cluster: str) -> dict:
    """How the predictions the watcher acted on compare with the waits that followed.

    Read from the state store: every segment submitted under the `predicted` policy keeps the
    wait it acted on (the target quantile, see chain.policies.predict_quantile) beside its
    measured wait (start - eligible). Scored as it was used: the share of waits at or below
    the acted-on quantile (nominal = the target) and its ``verdict`` (:func:`coverage_verdict`),
    and the deadline hit rate (the segment started before its predecessor ended), beside the
    chance of it that the policy acted on when it submitted (``prob_in_time``: the slack rule
    decides on the whole distribution, not on one quantile); MAE and within 2x of the acted-on
    quantile for comparison. Every comparison is at one resolution (RESOLUTION_S): waits under
    a watcher tick count as one tick, so the verdicts cannot disagree about a 2 s wait.
    """
    from chainrun.chain.policies import predict_quantile
    from chainrun.paths import state_db
    from chainrun.state.store import Store

    pairs: list[tuple[float, float]] = []
    targets: list[float] = []
    deadline: list[bool] = []
    acted: list[tuple[float, bool]] = []  # (P(start in time) when submitted, started in time)
    if state_db().exists():
        store = Store(state_db())
        try:
            for c in store.chains():
                if c.cluster != cluster:
                    continue
                segs = store.segments(c.id)
                for i, seg in enumerate(segs):
                    if seg.predicted_wait_s is None:
                        continue
                    prev = next((p for p in reversed(segs[:i]) if p.start is not None), None)
                    if seg.wait_s is not None:
                        pairs.append((seg.predicted_wait_s, seg.wait_s))
                        targets.append(predict_quantile(c.segment_s))
                    if prev is not None and prev.end is not None and not prev.is_live:
                        # decided once the predecessor ended: started by then, or missed
                        deadline.append(seg.start is not None and seg.start <= prev.end)
                        if seg.extra.get("prob_in_time") is not None:
                            acted.append((float(seg.extra["prob_in_time"]), deadline[-1]))
        finally:
            store.close()
    out: dict = {"n": len(pairs), "resolution_s": RESOLUTION_S}
    if deadline:
        out.update(deadline_n=len(deadline), deadline_hit_rate=sum(deadline) / len(deadline))
    if acted:
        out.update(acted_prob_n=len(acted), acted_prob_mean=sum(p for p, _ in acted) / len(acted),
                   acted_prob_hit_rate=sum(hit for _, hit in acted) / len(acted))
    if not pairs:
        return out
    # every verdict compares waits at one resolution: the watcher's tick (RESOLUTION_S), so a
    # 2 s wait against a predicted 1 s is neither "late" nor "outside 2x"
    r = [(max(p, RESOLUTION_S), max(a, RESOLUTION_S)) for p, a in pairs]
    errs = [abs(math.log10(p) - math.log10(a)) for p, a in r]
    hits = [p / a <= 2 and a / p <= 2 for p, a in r]
    covered = [a <= p for p, a in r]
    nominal = sum(targets) / len(targets)
    cov = sum(covered) / len(covered)
    out.update(mae_log10=sum(errs) / len(errs), within_2x=sum(hits) / len(hits),
               waited_longer_than_predicted=1.0 - cov, acted_quantile=nominal, acted_quantile_coverage=cov,
               verdict=coverage_verdict(cov, nominal, len(covered)))
    return out


# the watcher's default tick (`chainrun watch --interval`): a wait shorter than one tick cannot
# change what it does, so `model status` compares waits at this resolution in every verdict
RESOLUTION_S = 60.0


def coverage_verdict(coverage: float, nominal: float, n: int) -> str:
    """'too optimistic', 'too cautious' or 'as promised': the coverage of the acted-on quantile
    against its nominal level, beyond the binomial spread of n segments (one-sided 95 %)."""
    from chainrun.predict.doubt import Z

    spread = Z * math.sqrt(nominal * (1.0 - nominal) / n) + 1.0 / n
    if coverage < nominal - spread:
        return "too optimistic"
    if coverage > nominal + spread:
        return "too cautious"
    return "as promised"


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
    predictor = load_predictor(model_dir(cluster))
    history, _ = ingest.load_cache(cluster)
    now = time.time()
    req = WaitRequest(user=user or getpass.getuser(), nodes=nodes, gpus=gpus, cpus=cpus,
                      timelimit_s=timelimit_s, partition=partition, qos=qos, submit=now)
    if not live:
        return answer(predictor, req, None, history, None)
    from chainrun.predict.snapshot import snapshot_from_rows
    from chainrun.slurm.client import SlurmClient

    rows = SlurmClient(runner, timeout=60.0).queue(all_users=True)
    view = slurm_view(runner, rows, cluster=cluster, now=now, nodes=nodes, gpus=gpus, cpus=cpus,
                      timelimit_s=timelimit_s, partition=partition, qos=qos)
    return answer(predictor, req, snapshot_from_rows(rows), history, view)


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
    try:
        res = runner.run([*argv, "--wrap", "true"], 30)
        start = parse_test_only(res.stderr + "\n" + res.stdout)
        test_only = None if start is None else max(0.0, start - now)
    except (ChainrunError, OSError):  # e.g. a dropped SSH connection: the model answers without it
        pass
    return SlurmView(test_only_s=test_only, ahead_jobs=jobs, ahead_nodes=ahead_nodes, ahead_start_s=ahead_start)


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
    beside = Path(sys.executable).parent / "chainrun"  # the venv's script, even when not on PATH
    exe = shutil.which("chainrun") or (str(beside) if beside.exists() else f"{sys.executable} -m chainrun.cli.main")
    return f"17 */6 * * * {exe} -q model refresh --cluster {shlex.quote(cluster)} {CRON_MARK} {cluster}"


def install_cron(runner: "Runner", cluster: str) -> tuple[str, bool]:
    """Put the refresh line in the user's crontab, replacing ours for this cluster. Idempotent."""
    line = cron_line(cluster)
    cur = runner.run(["crontab", "-l"], 30)
    if cur.returncode == 127:
        raise SlurmError("crontab is not installed here", hint="add this line with your scheduler: " + line)
    existing = cur.stdout.splitlines() if cur.ok else []  # "no crontab for user" is rc 1
    tag = f"{CRON_MARK} {cluster}"
    kept = [ln for ln in existing if not ln.rstrip().endswith(tag)]
    if line in existing and len(kept) == len(existing) - 1:
        return line, False
    new = "\n".join([*kept, line]) + "\n"
    res = runner.run(["crontab", "-"], 30, stdin=new)
    if not res.ok:
        raise SlurmError(f"crontab refused the new table: {res.first_error_line()}")
    return line, True


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
