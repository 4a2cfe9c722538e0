"""Fault tests on real Slurm: a watcher killed at random, a flaky sbatch, a controller that goes away.

The three scenarios run at the same time (one thread each, separate chainrun homes) so the
whole module costs the length of one chain, ~4-5 minutes. Chains run on node n4 of the main
test cluster (other suites pin n1-n3); the controller scenario runs on a second, private
cluster (scripts/start-cluster.sh /tmp/chainrun-slurm-r) whose slurmctld we may stop.
The long version (50+ kills) is bench/kill_soak.py and the ``slow`` test below.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
import threading
import time
import traceback
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.reliability import harness as h

pytestmark = pytest.mark.slurm

N4 = ["--", "--exclude=n1,n2,n3"]
CI_KILLS = 10
CONTROLLER_DOWN_S = 35  # longer than several ticks (interval 3 s) and than the backoff's first steps


def _kill_scenario(base: Path, kills: int, seed: int, total: str = "3m", max_s: float = 8) -> dict:
    home = base / "home"
    shim_state = base / "shim"
    h.kill_after_sbatch_shim(base / "bin", shim_state)
    h.train_model(home)  # the predicted chain must decide with a model, not fall back to --lead
    since = time.time()
    chains = [
        h.submit(home, base / "dep", "kdep", "--total", total, "--policy", "dependency", *h.SEG, *N4),
        h.submit(home, base / "lead", "klead", "--total", total, "--policy", "lead", "--lead", "10s", *h.SEG, *N4),
        # 2-minute segments: the model's decision comes before the signal ends the segment
        h.submit(home, base / "pred", "kpred", "--total", total, "--policy", "predicted", "--lead", "50s",
                 "--segment", "2m", "--signal", "USR2@20", *N4),
    ]
    env = {"PATH": f"{base / 'bin'}:{os.environ['PATH']}"}
    stats = h.kill_loop(home, kills=kills, rng=random.Random(seed), log=base / "watch.log", env=env,
                        shim_state=shim_state, min_shim_kills=3, min_s=1, max_s=max_s)
    return {"home": home, "chains": chains, "stats": stats, "audit": h.audit(home, since),
            "predicted": h.model_decisions(home, chains[2]),
            "adopted": h.events(home, "adopted"), "log": (base / "watch.log").read_text()}


def _flaky_scenario(base: Path) -> dict:
    home = base / "home"
    h.flaky_sbatch_shim(base / "bin", base / "shim", k=2)
    since = time.time()
    chain = h.submit(home, base / "work", "flaky", "--total", "2m", "--policy", "dependency", *h.SEG, *N4)
    env = {**os.environ, "CHAINRUN_HOME": str(home), "PATH": f"{base / 'bin'}:{os.environ['PATH']}"}
    p = subprocess.run(h.watch_argv(2), env=env, capture_output=True, text=True, timeout=900,
                       stdin=subprocess.DEVNULL)
    return {"home": home, "chain": chain, "watch": p, "audit": h.audit(home, since),
            "calls": int((base / "shim" / "calls").read_text()), "adopted": h.events(home, "adopted"),
            "landed": (base / "shim" / "landed").read_text().split() if (base / "shim" / "landed").exists() else []}


def _controller_scenario(base: Path, env: dict) -> dict:
    home = base / "home"
    since = time.time()
    chain = h.submit(home, base / "work", "ctld", "--total", "2m", "--policy", "dependency", *h.SEG, env=env)
    full = {**os.environ, **env, "CHAINRUN_HOME": str(home)}
    watcher = subprocess.Popen(h.watch_argv(3), env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, stdin=subprocess.DEVNULL)
    out = {"home": home, "chain": chain}
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # wait until segment 0 runs, then pull the controller away
            q = subprocess.run(["squeue", "-h", "-n", f"cr.{chain}.0", "-o", "%T"], env=full, capture_output=True,
                               text=True).stdout.strip()
            if q == "RUNNING":
                break
            time.sleep(1)
        time.sleep(5)
        out["down_at"] = time.time()
        h.stop_ctld()
        time.sleep(CONTROLLER_DOWN_S)
        h.start_private_cluster()
        out["up_at"] = time.time()
        text, _ = watcher.communicate(timeout=600)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    out["rc"], out["log"] = watcher.returncode, text
    out["audit"] = h.audit(home, since, env)
    return out


def _run(results: dict, key: str, fn, *args) -> None:
    try:
        results[key] = fn(*args)
    except Exception:
        results[key] = {"error": traceback.format_exc()}


@pytest.fixture(scope="module")
def private_cluster(slurm_cluster):
    # two test runs on one machine would stop each other's controller: one at a time
    lock = open(f"{h.PRIVATE_DIR}.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        try:
            env = h.start_private_cluster()
        except Exception as e:
            if IN_CI:
                pytest.fail(str(e))
            pytest.skip(str(e))
        yield env
        h.stop_private_cluster()
    finally:
        lock.close()


@pytest.fixture(scope="module")
def faults(slurm_cluster, private_cluster, tmp_path_factory):
    results: dict = {}
    threads = [
        threading.Thread(target=_run, args=(results, "kill", _kill_scenario, tmp_path_factory.mktemp("kill"),
                                            CI_KILLS, int(os.environ.get("CHAINRUN_KILL_SEED", "6")))),
        threading.Thread(target=_run, args=(results, "flaky", _flaky_scenario, tmp_path_factory.mktemp("flaky"))),
        threading.Thread(target=_run, args=(results, "ctld", _controller_scenario, tmp_path_factory.mktemp("ctld"),
                                            private_cluster)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if out := os.environ.get("CHAINRUN_RELIABILITY_JSON"):  # numbers for docs/reliability.md
        Path(out).write_text(json.dumps({k: {"stats": v.get("stats").__dict__ if v.get("stats") else None,
                                             "audit": v.get("audit"), "calls": v.get("calls"),
                                             "adopted": len(v.get("adopted") or []), "error": v.get("error"),
                                             "down_s": (v["up_at"] - v["down_at"]) if "up_at" in v else None}
                                         for k, v in results.items()}, indent=1, default=str))
    return results


def _ok(res: dict) -> dict:
    assert "error" not in res, res.get("error")
    return res


def _clean(audit: dict) -> None:
    for cid, c in audit["chains"].items():
        assert c["status"] == "COMPLETED", f"{cid}: {c['status']} ({c['reason']})"
        assert not c["duplicates"] and not c["unrecorded_jobs"], f"{cid}: submitted twice: {c}"
        assert not c["lost_segments"], f"{cid}: lost {c['lost_segments']}"
        assert c["training"] == "ok", f"{cid}: {c['training']}"
    assert audit["duplicates"] == audit["losses"] == audit["unfinished"] == audit["training_faults"] == 0


def test_watcher_killed_at_random_moments_loses_and_duplicates_nothing(faults):
    res = _ok(faults["kill"])
    st = res["stats"]
    assert st.kills >= CI_KILLS, f"only {st.kills} kills before the chains ended; {st}"
    assert st.final_rc == 0 and not st.odd_exits, (st, res["log"][-3000:])
    assert len(res["audit"]["chains"]) == 3
    _clean(res["audit"])
    # every early submission of the predicted chain carried the model's estimate, not the lead fallback
    pred = res["predicted"]
    assert pred["later_segments"] >= 1 and pred["with_model"] == pred["later_segments"], pred
    # a watcher killed right after sbatch never recorded the job: the next one must adopt it
    assert st.shim_kills >= 3 and len(res["adopted"]) >= st.shim_kills, (res["adopted"], st)


def test_flaky_sbatch_chain_completes_exactly_once(faults):
    res = _ok(faults["flaky"])
    assert res["watch"].returncode == 0, res["watch"].stderr[-2000:]
    assert res["calls"] > 2  # both failures happened, then real submissions
    _clean(res["audit"])
    # the second failure created its job (a lost reply): that job was adopted, not duplicated
    assert res["landed"] and any(res["landed"][0] in m for m in res["adopted"]), (res["landed"], res["adopted"])
    assert "Traceback" not in res["watch"].stdout + res["watch"].stderr


def test_chain_survives_the_controller_going_away(faults):
    res = _ok(faults["ctld"])
    assert res["rc"] == 0, res["log"][-3000:]
    assert res["up_at"] - res["down_at"] >= CONTROLLER_DOWN_S
    assert "did not answer" in res["log"] and "Traceback" not in res["log"]
    _clean(res["audit"])


@pytest.mark.slow
def test_kill_soak_50(slurm_cluster, tmp_path):
    """The long version: 50 kills over longer chains (about 8 minutes). Runs only with -m slow."""
    res = _kill_scenario(tmp_path, 50, seed=int(os.environ.get("CHAINRUN_KILL_SEED", "50")), total="6m", max_s=10)
    st = res["stats"]
    assert st.kills >= 50 and st.final_rc == 0 and not st.odd_exits, st
    _clean(res["audit"])
    assert len(res["adopted"]) >= st.shim_kills
