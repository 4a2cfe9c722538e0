"""Issue 24's case on the real cluster: a model trained on ~30 jobs of an idle cluster is asked
while every CPU is busy and 4 jobs pend. It used to answer `expected wait 1s (80 % between 1s
and 1s, 98 % within 2s); starts within 1h: 100 %`; now it says it is not sure and leans on
Slurm's own estimate (chainrun/predict/doubt.py)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from chainrun.cli.main import main

pytestmark = pytest.mark.slurm


def _sbatch(*args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return out.strip().split(";")[0]


def _states(ids: list[str]) -> dict[str, tuple[str, str]]:
    out = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T|%S"], capture_output=True, text=True,
                         timeout=30).stdout
    return {i: (st, start) for i, st, start in (ln.split("|") for ln in out.splitlines() if ln.count("|") == 2)}


def _wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(2)


def _cpus() -> int:
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "long", "-o", "%N %c"], capture_output=True, text=True,
                         timeout=30).stdout
    return sum(int(c) for _, c in {tuple(ln.split()) for ln in out.splitlines() if ln.strip()})


@pytest.fixture(scope="module")
def idle_history(slurm_cluster) -> float:
    """~30 jobs of history on an idle cluster, each waiting a second or two; returns when it began."""
    t0 = time.time()
    hist = [_sbatch("-J", f"crdoubt-h{i}", "-t", "1", "--wrap", "sleep 1") for i in range(30)]
    _wait_until(lambda: not _states(hist), 180, "the history jobs to end")
    time.sleep(3)  # sacct fills Start/End a moment after the end
    return t0


def _lookback(t0: float) -> str:
    return f"{int(time.time() - t0) + 120}s"  # the idle history, and what ran just before it


def test_a_model_of_30_idle_jobs_leans_on_slurm_when_every_cpu_is_busy(idle_history, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path))
    lookback = _lookback(idle_history)
    assert main(["model", "refresh", "--cluster", "local", "--lookback", lookback, "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)["data"]["train_rows"]
    assert 20 <= trained < 221  # a short history by the rule (doubt.rows_backing)

    fill: list[str] = []
    try:
        # every CPU busy for 10 minutes, then 4 more jobs pending behind them
        fill = [_sbatch("-J", f"crdoubt-f{i}", "-p", "long", "-n", "1", "-t", "10", "--wrap", "sleep 600")
                for i in range(_cpus())]
        _wait_until(lambda: sum(st == "RUNNING" for st, _ in _states(fill).values()) == len(fill), 120,
                    "every CPU to be busy")
        pend = [_sbatch("-J", f"crdoubt-p{i}", "-p", "long", "-n", "1", "-t", "5", "--wrap", "sleep 1")
                for i in range(4)]
        fill += pend
        # backfill has planned the pending jobs (squeue --start is filled)
        _wait_until(lambda: all(st == "PENDING" and start not in ("N/A", "") for st, start in _states(pend).values())
                    and len(_states(pend)) == 4, 60, "Slurm's start estimate of the pending jobs")

        assert main(["predict", "--nodes", "1", "--time", "2m", "--json"]) == 0
        p = json.loads(capsys.readouterr().out)["data"]
        sup = p["support"]
        slurm_wait = sup["slurm"]["wait_s"]
        # Slurm expects the start when the fill jobs reach their limits, minutes from now
        assert sup["slurm"]["source"] == "sbatch --test-only" and slurm_wait > 300
        assert sup["slurm"]["ahead_jobs"] >= 4
        assert sup["short_history"] and sup["training_rows"] == trained and sup["leaned_on_slurm"]
        # what the model alone said is the reported answer: a second or so
        assert sup["model_only"]["quantiles_s"]["p98"] < 60
        # the answer now: no longer "1s, 100 % within 10 minutes"
        assert p["p50_s"] >= slurm_wait and p["quantiles_s"]["p98"] > p["p50_s"]
        assert p["p_start_within"]["10m"] < 0.9

        assert main(["predict", "--nodes", "1", "--time", "2m"]) == 0
        out = capsys.readouterr().out
        assert "expected wait 1s" not in out and "Slurm's estimate (sbatch --test-only): start in" in out
        assert "the model alone is not sure: the model learned from" in out and "leans on Slurm" in out

        assert main(["model", "status", "--cluster", "local", "--json"]) == 0
        st = json.loads(capsys.readouterr().out)["data"]["model"]["support"]
        assert st["short_history"] and st["training_rows"] == trained
    finally:
        if fill:
            subprocess.run(["scancel", *fill], timeout=30)


def test_a_predicted_chain_on_the_busy_cluster_acts_on_slurms_estimate(idle_history, tmp_path):
    """The issue's chain: with the same short-history model and the cluster full, the watcher's
    estimate for the successor leans on the squeue --start of the jobs ahead, and the segment
    it submits records so (its predicted wait is minutes, not a second)."""
    import os
    import sys

    from tests.conftest import REPO, run_cli

    home = tmp_path / "home"
    r = run_cli("model", "refresh", "--lookback", _lookback(idle_history), "--json", home=home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"]["train_rows"] < 221  # short

    jobs: list[str] = []
    chain = ""
    watcher = None
    try:
        # 3-minute segments: the guard lets the watcher ask from 60 s in, the floor (10 s) is far off
        p = run_cli("submit", str(REPO / "templates" / "toy_train.sh"), "--name", "busy", "--total", "5m",
                    "--segment", "3m", "--policy", "predicted", "--lead", "10s", "--signal", "USR2@30", "--json",
                    "--", "--partition=long", "--nodelist=n4", "-n", "1", home=home, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        data = json.loads(p.stdout)["data"]
        chain, first = data["chain"], data["first_job"]
        _wait_until(lambda: _states([first]).get(first, ("",))[0] == "RUNNING", 120, "segment 0 to run")
        # every other CPU busy for 10 minutes, then 4 jobs pending in the chain's partition behind them
        jobs = [_sbatch("-J", f"crdoubt-f{i}", "-p", "long", "-n", "1", "-t", "10", "--wrap", "sleep 600")
                for i in range(_cpus() - 1)]
        _wait_until(lambda: sum(st == "RUNNING" for st, _ in _states(jobs).values()) == len(jobs), 120,
                    "every CPU to be busy")
        pend = [_sbatch("-J", f"crdoubt-p{i}", "-p", "long", "-n", "1", "-t", "2", "--wrap", "sleep 1")
                for i in range(4)]
        jobs += pend
        _wait_until(lambda: len(_states(pend)) == 4 and all(st == "PENDING" and start not in ("N/A", "")
                                                            for st, start in _states(pend).values()),
                    60, "Slurm's start estimate of the pending jobs")
        watcher = subprocess.Popen([sys.executable, "-m", "chainrun.cli.main", "watch", "--plain", "--interval", "3"],
                                   env={**os.environ, "CHAINRUN_HOME": str(home)}, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

        def successor():
            s = run_cli("status", chain, "--json", home=home)
            segs = json.loads(s.stdout)["data"][0]["segments_detail"] if s.returncode == 0 else []
            return next((x for x in segs if x["idx"] == 1 and x.get("job_id")), None)

        _wait_until(lambda: successor() is not None, 240, "the watcher to submit segment 1")
        seg1 = successor()
        assert seg1["predicted_model"] == "cluster, leaning on Slurm's squeue --start", seg1
        assert seg1["predicted_wait_s"] > 300  # the jobs ahead start when the fill ends, minutes away
    finally:
        if watcher is not None:
            watcher.terminate()
            watcher.wait(timeout=30)
        if chain:
            run_cli("cancel", chain, home=home)
        if jobs:
            subprocess.run(["scancel", *jobs], timeout=30)
