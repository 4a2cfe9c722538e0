"""A model that has seen little is not sure (chainrun/predict/doubt.py): the rules, on their own
and on a model trained on a short, idle history. The real-cluster case is test_slurm_doubt.py."""

from __future__ import annotations

import numpy as np
import pytest

from chainrun.predict.doubt import (
    FREE_FEATURES, LOAD_FEATURES, SlurmView, Support, answer, assess, backed_level, lean_on, queue_ahead,
    read_level, rows_backing, short_history, support_of, widen,
)
from chainrun.predict.distribution import QUANTILES, Prediction
from chainrun.predict.features import FEATURES
from chainrun.predict.model import WaitRequest
from chainrun.predict.training import fit_predictor
from chainrun.slurm.parsers import QueueRow

from .predict_helpers import synthetic_history

FLAT = Prediction(1.0, 1.0, 1.0, "cluster", QUANTILES, (1.0, 1.0, 1.0, 1.5, 2.0))


def test_the_read_level_moves_with_the_history_size_only():
    # the binomial bound of the rank: wide with 29 waits, nothing with 10 000
    assert read_level(0.9, 29) == pytest.approx(0.9 + 1.6449 * (0.09 / 29) ** 0.5, rel=1e-4)
    assert read_level(0.98, 10_000) - 0.98 < 0.0025 and read_level(0.5, 29) == 0.5
    assert read_level(0.1, 29) < 0.1
    assert [read_level(0.98, n) - 0.98 for n in (30, 300, 3000)] == sorted(
        [read_level(0.98, n) - 0.98 for n in (30, 300, 3000)], reverse=True)


def test_short_means_the_acted_on_level_is_beyond_what_the_waits_vouch_for():
    n = rows_backing()
    assert short_history(n - 1) and not short_history(n) and not short_history(10 * n)
    assert read_level(0.98, n) < backed_level(n) <= read_level(0.98, n - 1) + 1.0 / n
    assert short_history(29) and short_history(0)


def test_widen_is_monotone_and_fades_with_many_rows():
    p = Prediction(10.0, 100.0, 1000.0, "cluster", QUANTILES, (10.0, 100.0, 1000.0, 2000.0, 4000.0))
    few, many = widen(p, 29), widen(p, 100_000)
    assert few.p10 < p.p10 and few.p50 == pytest.approx(p.p50) and few.p90 > p.p90
    assert list(few.values) == sorted(few.values)
    assert many.values == pytest.approx(p.values, rel=0.05)


def test_lean_on_raises_the_median_and_above_to_slurms_estimate_only():
    leaned = lean_on(FLAT, 600.0)
    assert leaned.p10 == FLAT.p10  # jobs end before their limits: the low levels stay the model's
    assert leaned.p50 == pytest.approx(600.0) and leaned.values[-1] > leaned.p90 > 600.0
    assert 0.45 < leaned.prob_within(600) < 0.55
    big = Prediction(10.0, 5000.0, 9000.0, "cluster", QUANTILES, (10.0, 5000.0, 9000.0, 9500.0, 9900.0))
    assert lean_on(big, 60.0).values == big.values  # never lowers the model's answer


def test_assess_leans_only_when_out_of_depth_and_slurm_answered():
    view = SlurmView(test_only_s=540.0, ahead_jobs=4, ahead_nodes=4)
    sure = assess(FLAT, Support(rows=5000, short=False), view)
    assert not sure.leaned and not sure.reasons and sure.prediction.p50 == pytest.approx(1.0)
    short = assess(FLAT, Support(rows=29, short=True), view)
    assert short.leaned and short.prediction.p50 == pytest.approx(540.0)
    assert short.reasons == ("the model learned from 29 jobs (q98 needs %d)" % rows_backing(),)
    busy = assess(FLAT, Support(rows=5000, short=False, outside={"q_pending_jobs": (4.0, 0.0, 0.0)}), view)
    assert busy.leaned and "pending jobs 4 (at most 0 seen)" in busy.reasons[0]
    blind = assess(FLAT, Support(rows=29, short=True), SlurmView())
    assert not blind.leaned and blind.reasons and blind.prediction.values[-1] > FLAT.values[-1]  # still widened
    d = short.as_dict()
    assert d["leaned_on_slurm"] and d["slurm"]["source"] == "sbatch --test-only" and d["slurm"]["wait_s"] == 540.0


def test_slurms_estimate_no_later_than_the_model_is_not_said_to_have_moved_the_answer():
    """A short model on an idle cluster: Slurm expects a start at once, the model a few minutes. The
    answer is the widened model's; saying it "leans on Slurm's estimate" (as predict did, with the
    model alone's 98 % beside the widened one) credited Slurm with the widening (#24 audit)."""
    from chainrun.cli.model_cmd import _support_lines

    p = Prediction(10.0, 120.0, 600.0, "cluster", QUANTILES, (10.0, 120.0, 600.0, 1200.0, 5400.0))
    idle = assess(p, Support(rows=40, short=True), SlurmView(test_only_s=0.0))
    assert not idle.leaned and not idle.as_dict()["leaned_on_slurm"]
    assert idle.prediction.values == widen(p, 40).values  # widened, nothing else
    lines = _support_lines(idle)
    assert not any("leans on Slurm" in ln for ln in lines), lines
    assert lines[-1].startswith("Slurm's estimate is no later than the model's: the answer is the model's, only "
                                "widened by the short history (the model alone said 2m"), lines
    busy = assess(p, Support(rows=5000, short=False, outside={"q_pending_jobs": (4.0, 0.0, 0.0)}),
                  SlurmView(test_only_s=60.0))
    assert not busy.leaned and _support_lines(busy)[-1].endswith("the model's answer stands")
    later = assess(p, Support(rows=40, short=True), SlurmView(test_only_s=3600.0))
    assert later.leaned and later.prediction.p50 == pytest.approx(3600.0)
    assert _support_lines(later)[-1].startswith("so the answer leans on Slurm's estimate")


def test_the_queue_ahead_is_what_pends_for_the_queue_in_the_sharing_partitions():
    def row(i, state, reason, part, start=None, nodes=1):
        return QueueRow(job_id=str(i), user="u", state=state, reason=reason, submit=0.0, start=start, end=None,
                        time_limit_s=60.0, elapsed_s=0.0, partition=part, qos="", nodes=nodes, cpus=1, gpus=0,
                        dependency="", comment="", name="j")

    rows = [row(1, "PENDING", "Resources", "long", 1300.0, 2), row(2, "PENDING", "Priority", "short", 1100.0),
            row(3, "PENDING", "Dependency", "long", None), row(4, "PENDING", "JobHeldUser", "short"),
            row(5, "RUNNING", "None", "long", 900.0), row(6, "PENDING", "Priority", "gpu", 5000.0)]
    assert queue_ahead(rows, {"short", "long"}, 1000.0) == (2, 3, 300.0)
    assert queue_ahead(rows, "short", 1000.0) == (1, 1, 100.0)
    assert queue_ahead(rows, "", 1000.0) == (3, 4, 4000.0)
    assert SlurmView(ahead_start_s=300.0).source == "squeue --start of the jobs ahead"


def test_a_model_of_an_idle_history_is_out_of_its_depth_in_a_busy_queue():
    """The issue's case without Slurm: 30 jobs that never queued, asked with 12 jobs pending."""
    rng = np.random.default_rng(3)
    n = 30
    submit = 1_700_000_000 + np.arange(n) * 600.0
    import pandas as pd

    hist = pd.DataFrame({
        "job_id": [str(i) for i in range(n)], "user": [f"u{i % 3}" for i in range(n)], "name": "j",
        "partition": "short", "qos": "", "account": "", "submit": submit, "eligible": submit,
        "start": submit + rng.uniform(0, 2, n), "end": submit + 60.0, "timelimit_s": 120.0, "nodes": 1,
        "gpus": 0, "cpus": 1, "state": "COMPLETED", "exit_code": "0:0", "eligible_known": True, "priority": np.nan,
    })
    model = fit_predictor(hist, capacity=4)
    ranges = model.meta["feature_ranges"]
    assert set(ranges) <= set(LOAD_FEATURES) | set(FREE_FEATURES) and ranges["q_pending_jobs"] == [0.0, 0.0]
    now = float(submit[-1] + 3600)
    snap = pd.DataFrame({
        "job_id": [f"s{i}" for i in range(16)], "user": "v", "name": "x", "partition": "short", "qos": "",
        "account": "", "submit": now - 300, "eligible": now - 300,
        "start": [now - 200] * 4 + [np.nan] * 12, "end": np.nan, "timelimit_s": 3600.0, "nodes": 1, "gpus": 0,
        "cpus": 4, "state": ["RUNNING"] * 4 + ["PENDING"] * 12, "exit_code": "0:0", "eligible_known": True,
        "priority": np.nan,
    })
    req = WaitRequest(user="u1", nodes=1, gpus=0, cpus=1, timelimit_s=120, partition="short", submit=now)
    a = answer(model, req, snap, hist, SlurmView(test_only_s=3400.0, ahead_jobs=12, ahead_nodes=12))
    assert a.support.short and a.support.rows == 30 and "q_pending_jobs" in a.support.outside
    assert a.model_only.quantile(0.98) < 60 and a.leaned  # the model alone: "a few seconds"
    assert a.prediction.p50 >= 3400.0 and a.prediction.prob_within(3600) < 0.6
    p, x = model.predict_with_features(req, snap, hist)
    assert p == model.predict(req, snap, hist) and support_of(model.meta, x, FEATURES) == a.support


def test_a_long_history_of_the_same_queue_is_trusted():
    hist = synthetic_history(2000)
    model = fit_predictor(hist, per_user="never")
    req = WaitRequest(user="u1", nodes=1, gpus=4, cpus=32, timelimit_s=3600, partition="gpu",
                      submit=float(hist["submit"].max()))
    a = answer(model, req, None, hist, SlurmView(test_only_s=10 * 86400.0))
    assert not a.support.short and not a.leaned and not a.reasons
    # widened by the binomial spread of ~1600 waits: a few percent of the level, not a decade
    assert a.prediction.values == pytest.approx(a.model_only.values, rel=0.25)


def test_the_watcher_leans_on_the_queue_ahead_from_its_own_squeue_rows(tmp_path):
    """chain.prediction._estimate: the tick's squeue rows give the jobs ahead and their
    squeue --start; a model of 30 idle jobs acts on them instead of on its 1-2 s answer."""
    import time

    import pandas as pd

    from chainrun.chain.prediction import _estimate
    from chainrun.state.records import RUNNING, Chain, Segment

    now = time.time()
    n = 30
    submit = now - 86400 + np.arange(n) * 600.0
    hist = pd.DataFrame({
        "job_id": [str(i) for i in range(n)], "user": [f"u{i % 3}" for i in range(n)], "name": "j",
        "partition": "short", "qos": "", "account": "", "submit": submit, "eligible": submit,
        "start": submit + 1.0, "end": submit + 60.0, "timelimit_s": 120.0, "nodes": 1, "gpus": 0, "cpus": 1,
        "state": "COMPLETED", "exit_code": "0:0", "eligible_known": True, "priority": np.nan,
    })
    model = fit_predictor(hist, capacity=4)
    chain = Chain(id="c", name="c", cluster="local", script="/s", workdir="/w", run_dir="/r", checkpoint_dir="/c",
                  total_s=600, segment_s=120, policy="predicted", lead_s=60, signal="USR2", signal_lead_s=30,
                  retries=1, sbatch_args=[], partition="short")
    seg = Segment(chain_id="c", idx=0, phase=RUNNING, job_id="900", start=now - 30)

    def row(i, state, start, reason="None"):
        return QueueRow(job_id=str(i), user="v", state=state, reason=reason, submit=now - 60, start=start,
                        end=None, time_limit_s=600.0, elapsed_s=None, partition="short", qos="", nodes=1, cpus=4,
                        gpus=0, dependency="", comment="", name="x")

    mine = QueueRow(job_id="900", user="u1", state="RUNNING", reason="None", submit=now - 40, start=now - 30,
                    end=now + 90, time_limit_s=120.0, elapsed_s=30.0, partition="short", qos="", nodes=1, cpus=1,
                    gpus=0, dependency="", comment="", name="cr.c.0")
    busy = [row(i, "RUNNING", now - 100) for i in range(4)] + \
        [row(10 + i, "PENDING", now + 500 + 10 * i, "Priority") for i in range(4)] + [mine]
    est = _estimate(model, hist, chain, seg, busy)
    # the latest squeue --start ahead is 530 s from when the rows were read
    assert est.p50 >= 520 and est.p90 > est.p50 and est.seconds >= est.p50 * (1 - 1e-9)
    assert est.model == "cluster, leaning on Slurm's squeue --start"
    idle = _estimate(model, hist, chain, seg, [mine])
    assert idle.p50 < 60 and idle.model == "cluster"  # nothing ahead and nothing to lean on: the (widened) model's answer


def test_the_validation_table_in_model_md_is_the_benchs_json():
    """docs/model.md quotes bench/predict_doubt.py's results: every row as the JSON has it."""
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "model.md").read_text()
    d = json.loads((repo / "docs" / "results" / "predict_doubt.json").read_text())
    for n, r in d["sizes"].items():
        a, w = r["alone"], r["widened"]
        cov = lambda c: " / ".join(f"{c[k]:.3f}" for k in ("q50", "q90", "q98"))  # noqa: E731
        row = (f"| {n} | {'yes' if r['short_history'] else 'no'} | {r['jobs']} | {cov(a['coverage'])} | "
               f"{a['mean_pinball']:.4f} | {cov(w['coverage'])} | {w['mean_pinball']:.4f} |")
        assert row in doc, row
        assert r["short_history"] == short_history(int(n))
    short = [r for r in d["sizes"].values() if r["short_history"]]
    # the claims in the prose: widening lifts q98 coverage and lowers the loss where the history is short
    assert all(r["widened"]["coverage"]["q98"] > r["alone"]["coverage"]["q98"] + 0.1 for r in short)
    assert all(r["widened"]["mean_pinball"] < r["alone"]["mean_pinball"] for r in short)
    assert all(abs(r["widened"]["coverage"]["q98"] - 0.98) < 0.05 for r in short)
    rest = [r for r in d["sizes"].values() if not r["short_history"]]
    assert rest and all(abs(r["widened"]["mean_pinball"] - r["alone"]["mean_pinball"]) < 0.005 and
                        abs(r["widened"]["coverage"]["q98"] - r["alone"]["coverage"]["q98"]) < 0.03 for r in rest)


def test_predict_all_says_which_clusters_model_is_not_sure(chainrun_home, monkeypatch, capsys):
    """`predict --cluster all` ranks on the assessed answers; it said nothing of a model that was not
    sure, as `predict` for one cluster does (#24 audit)."""
    import json

    from chainrun.cli import model_cmd
    from chainrun.cli.main import main
    from chainrun.predict import service

    p = Prediction(10.0, 120.0, 600.0, "cluster", QUANTILES, (10.0, 120.0, 600.0, 1200.0, 5400.0))
    got = assess(p, Support(rows=40, short=True), SlurmView(test_only_s=3600.0))

    class Quiet:
        def close(self):
            pass

    monkeypatch.setattr(model_cmd, "_runner", lambda name="local": Quiet())
    monkeypatch.setattr(service, "predict_now", lambda runner, **kw: got)
    assert main(["predict", "--cluster", "all", "--time", "2m"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1. local: expected wait 1.0h") and "the model alone is not sure: the model learned " \
        "from 40 jobs" in out and out.rstrip().endswith("so it leans on Slurm's estimate"), out
    assert main(["predict", "--cluster", "all", "--time", "2m", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["data"]["ranked"][0]
    assert row["leaned_on_slurm"] and row["not_sure"] == list(got.reasons) and row["p50_s"] == pytest.approx(3600.0)
