"""docs/model.md says what is: its number blocks are rendered from the code's settings and the bench
scripts' results (bench/predict_render.py), its prose quotes no number a block does not show, and
the claims the prose makes about those numbers hold in the results files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.doc_numbers import stray_numbers

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "model.md"
# numbers in the prose that are names, not measurements or settings
NAMES = {"4.0": "the trace's licence, CC BY 4.0"}


def _results(name: str) -> dict:
    return json.loads((REPO / "docs" / "results" / f"{name}.json").read_text())


def test_the_blocks_are_rendered_from_the_code_and_the_results_files():
    p = subprocess.run([sys.executable, str(REPO / "bench" / "predict_render.py"), "--check"], capture_output=True,
                       text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, f"docs/model.md is out of date: run .venv/bin/python bench/predict_render.py\n{p.stderr}"


def test_every_number_in_the_prose_is_one_a_block_shows():
    stray = stray_numbers(DOC.read_text(), NAMES, min_blocks=8)
    assert not stray, f"numbers in docs/model.md's prose that no block shows: {stray}"


def test_the_prose_claims_hold_in_the_results():
    ev, six, tune = _results("predict_eval"), _results("predict_eval_6h"), _results("predict_tune")
    levels = {"q50": 0.05, "q90": 0.05, "q98": 0.03}  # the coverage targets (issue 12)
    for run in (ev, ev["without_dependency_rule"]):
        cal = run["models"]["lightgbm"]["calibration"]
        assert all(abs(cal[q] - float(q[1:]) / 100) <= tol for q, tol in levels.items()), cal
        raw = run["models"]["lightgbm_uncalibrated"]["calibration"]
        assert raw["q90"] < 0.90 - 0.05 and raw["q98"] < 0.98 - 0.03  # "uncalibrated, q90 and q98 fall short"
    # "the forests are a little better on this month but lost on the validation window"
    m = ev["models"]
    assert m["random_forest"]["mean_pinball"] < m["lightgbm"]["mean_pinball"]
    assert m["lightgbm_forest"]["mean_pinball"] < m["lightgbm"]["mean_pinball"]
    chosen = next(c for c in tune["configs"] if c["model"] == "lightgbm" and c["config"] == tune["chosen"]["lightgbm"])
    others = [c for c in tune["configs"] if c["model"] in ("lightgbm", "random_forest") and c is not chosen]
    assert all(c["mean_pinball"] > chosen["mean_pinball"] for c in others)
    # "with the calibration off, the user anchor on, or no refit: each scored worse"
    for k in ("chosen_without_calibration", "anchor_ablation", "refit_ablation"):
        assert tune[k]["mean_pinball"] > chosen["mean_pinball"], k
    # "the cron refreshes more often than the replay, which helps a little"
    assert six["models"]["lightgbm"]["mean_pinball"] < m["lightgbm"]["mean_pinball"]
    dl = _results("predict_deadline")["horizons"]
    for h in ("1h", "6h"):  # "the deadline accuracy target (0.90) is not met on the test month"
        assert m["lightgbm"]["deadline"][h]["accuracy"] < 0.90
    # "cross-validated inside the test month a classifier still misses the target at the shorter horizon,
    # while twin jobs mostly agree"
    assert dl["1h"]["ceiling_cv_inside_test"] < 0.90 <= dl["6h"]["ceiling_cv_inside_test"]
    assert all(dl[h]["ceiling_twin"]["twin_accuracy"] > dl[h]["ceiling_twin"]["lightgbm_accuracy_on_same_jobs"]
               for h in ("1h", "6h"))
    # "the test month is unlike the training months: far fewer short waits"
    assert all(dl[h]["share_within_test"] < dl[h]["base_rate_train_at_test"] - 0.1 for h in ("1h", "6h"))
    assert _results("predict_recency")["chosen_half_life_days"] is None  # "weighting recent jobs does not help"
    qf = _results("predict_queue_future")
    assert all(qf["horizons"][h]["existing+sim"]["fit_on_train_months"] <= qf["horizons"][h]["existing"]
               ["fit_on_train_months"] for h in ("1h", "6h"))
    assert qf["long_waits_test"]["share_whose_nodes_were_free_at_eligible"] > 0.5  # "most long waits began with nodes free"
