"""``chainrun model eval``: the JSON interface external checks read, and its metrics."""

from __future__ import annotations

import json

import numpy as np

from chainrun.cli.main import main
from chainrun.predict.evaluate import metrics


def test_metrics_small_wait_rule_and_coverage():
    y = np.log10([10.0, 30.0, 1000.0, 1000.0])
    pred = np.log10([[1, 50, 100], [40, 100, 200], [100, 1900, 5000], [1, 2100, 3000]])
    m = metrics(y, pred)
    # 10 vs 50: both under 60 s -> hit; 30 vs 100 -> miss; 1000 vs 1900 -> hit; 1000 vs 2100 -> miss
    assert m["within_2x"] == 0.5
    assert m["coverage_p10_p90"] == 0.75 and m["n_test"] == 4
    assert set(m["pinball"]) == {"p10", "p50", "p90"}


def test_eval_json_on_a_slice_of_the_real_trace(ls6_slice, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    rc = main(["model", "eval", "--trace", str(ls6_slice), "--train-until", "2023-01-05",
               "--test-until", "2023-01-20", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    res = json.loads(out)
    assert set(res) >= {"models", "train", "test"}
    for name in ("lightgbm", "user_median", "global_median", "random_forest"):
        m = res["models"][name]
        assert set(m) >= {"within_2x", "mae_log10", "pinball", "coverage_p10_p90", "n_test"}
        assert set(m["pinball"]) == {"p10", "p50", "p90"} and m["n_test"] == res["test"]["n"] > 100
        assert 0 <= m["within_2x"] <= 1 and 0 <= m["coverage_p10_p90"] <= 1
    # warm-up comes from the data: first start of the slice + 7 days
    assert res["train"]["warmup_until"].startswith("2022-12-0")
    assert res["test"]["from"] >= "2023-01-05"


def test_eval_bad_input_is_one_line(ls6_slice, capsys):
    assert main(["model", "eval", "--trace", str(ls6_slice), "--train-until", "yesterday", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--train-until" in err
    assert main(["model", "eval", "--trace", str(ls6_slice), "--train-until", "2023-01-10",
                 "--test-until", "2023-01-01"]) == 2
