"""refresh and predict end to end against the real local Slurm test cluster."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from chainrun.cli.main import main

pytestmark = pytest.mark.slurm


def _started_jobs_last_day() -> int:
    out = subprocess.run(["sacct", "-X", "-P", "-n", "-a", "-S", "now-1days", "--format=Start"],
                         capture_output=True, text=True, timeout=30).stdout
    return sum(1 for ln in out.splitlines() if ln.strip() and ln.strip() not in ("Unknown", "None"))


def _ensure_history(n: int = 25) -> None:
    """A fresh cluster may have too few jobs to learn from: run some tiny ones."""
    missing = n - _started_jobs_last_day()
    for i in range(max(0, missing)):
        subprocess.run(["sbatch", "-Q", "-J", f"crpred-test{i}", "-t", "1", "--wrap", "sleep 1"],
                       capture_output=True, timeout=30, check=True)
    deadline = time.time() + 90
    while _started_jobs_last_day() < n and time.time() < deadline:
        time.sleep(2)


def test_refresh_status_predict(slurm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    _ensure_history()
    assert main(["model", "refresh", "--cluster", "local", "--lookback", "2d", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["data"]
    assert res["history_rows"] >= 25 and res["train_rows"] >= 20 and res["sacct_calls"] >= 1
    assert (tmp_path / "models" / "local" / "meta.json").exists()

    # a second refresh reads only since the last one and keeps one row per job
    assert main(["model", "refresh", "--cluster", "local", "--json"]) == 0
    res2 = json.loads(capsys.readouterr().out)["data"]
    assert res2["history_rows"] >= res["history_rows"] and res2["new_rows"] <= res2["history_rows"]

    assert main(["model", "status", "--cluster", "local", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["data"]
    assert st["model"]["answers_for_you"] in ("cluster", f"user:{st['model']['user']}")
    # the node count comes from scontrol, not from jobs sharing nodes (the test cluster has 4)
    nodes = int(subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True,
                               timeout=30).stdout.count("NodeName="))
    assert st["model"]["capacity_nodes"] == nodes and st["model"]["capacity_source"] == "scontrol"
    assert set(st["model"]["calibration"] or {}) <= {"p10", "p50", "p90", "p95", "p98"}

    t0 = time.perf_counter()
    assert main(["predict", "--nodes", "1", "--gpus", "1", "--time", "10m", "--partition", "short", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["data"]
    assert 0 < p["p10_s"] <= p["p50_s"] <= p["p90_s"] and p["model"] in ("cluster", "user:root")
    assert time.perf_counter() - t0 < 10

    assert 0 <= p["p_start_within"]["1h"] <= 1
    # the test cluster's "short" partition allows 2 minutes: said, and the prediction still made
    assert p["warnings"] == ["partition short allows at most 2m, less than the asked 10m: Slurm will refuse or hold "
                             "this job; chainrun submit cuts a run into segments under the limit"]

    assert main(["predict", "--nodes", "2", "--time", "30m"]) == 0
    assert "expected wait" in capsys.readouterr().out

    # longer than any partition allows: said, on one line, and the prediction still printed
    assert main(["predict", "--nodes", "1", "--time", "300d"]) == 0
    cap = capsys.readouterr()
    assert "expected wait" in cap.out and cap.err.count("warning:") == 1 and "allows" in cap.err

    # a request Slurm would refuse gets no answer: one line, exit 2 (audit 24, gap 4; sbatch
    # --test-only refuses both: "invalid partition", "Requested node configuration is not available")
    assert main(["predict", "-p", "nosuch", "--time", "1m"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "no partition 'nosuch'" in cap.err and "short" in cap.err
    assert main(["predict", "-p", "long", "--nodes", str(nodes + 5), "--time", "1m"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and f"partition 'long' has {nodes} nodes" in cap.err
    assert main(["predict", "--nodes", str(nodes + 5), "--time", "1m"]) == 2  # the default partition's size
    assert f"partition 'short' has {nodes} nodes" in capsys.readouterr().err
    assert main(["predict", "-p", "long", "--nodes", str(nodes), "--time", "1m"]) == 0  # the whole partition: fine
    assert "expected wait" in capsys.readouterr().out


def test_print_cron(slurm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    assert main(["model", "refresh", "--cluster", "local", "--print-cron"]) == 0
    out = capsys.readouterr().out.strip()
    assert "model refresh --cluster local" in out and out.startswith("17 */6 ")
