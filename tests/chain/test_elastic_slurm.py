"""Elastic segments on the real test cluster (4 nodes, 2 GPUs each): one chain, `--shapes 4,2 --time-min 1m`.

Scenario (about 3 minutes):
1. A reservation on n4 (for another user) starts 100 s after submit: segment 0, 4 nodes asking for
   2 minutes, can only start now with a shorter limit, which `--time-min 1m` allows. It must get the
   signal before its real (shortened) end and checkpoint.
2. Once it ended, a blocker job of ours holds two nodes exclusively for 30 minutes (its limit) and
   the reservation is deleted: 4 nodes would start only after the blocker, 2 nodes now. The watcher
   plans segment 1 (`sbatch --test-only` per shape) and must ask for 2 nodes, say why, and record the
   change as an event; the chain must complete with --total counted at the reference shape.
3. The toy trainer (one rank per node under srun, `--gres=gpu:2`) keeps its global batch through
   gradient accumulation: batch.log says so per segment, steps.log shows one unbroken step count.

The watcher is `chainrun watch --once` run by the test between the scenario's steps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slurm

TOTAL_S = 45
TRAINER = REPO / "templates" / "toy_trainer.py"
PAYLOAD = f"""#!/bin/bash
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=100M
#SBATCH --gres=gpu:2
exec srun --kill-on-bad-exit=1 --label python3 {TRAINER}
"""


def _sh(*argv: str, check: bool = True) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p.stdout.strip()


def _job_state(job: str) -> str:
    return _sh("squeue", "-h", "-j", job, "-o", "%T", check=False)


def _wait(what: str, cond, timeout: float, tick=None, every: float = 2.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if tick:
            tick()
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="module")
def elastic(slurm_cluster, tmp_path_factory):
    home = tmp_path_factory.mktemp("elastic-home")
    work = tmp_path_factory.mktemp("elastic")
    script = work / "train.sh"
    script.write_text(PAYLOAD)
    resv = f"cr-elastic-{os.getpid()}"
    blocker = ""
    log: list[str] = []

    def tick() -> None:
        p = run_cli("watch", "--once", "--plain", home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        log.extend(p.stdout.splitlines())

    def status() -> dict:
        p = run_cli("status", chain, "--json", home=home)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["data"][0]

    _sh("scontrol", "create", "reservation", f"ReservationName={resv}", "StartTime=now+100", "Duration=1",
        "Nodes=n4", "Users=slurm", "Flags=IGNORE_JOBS")
    try:
        p = run_cli("submit", str(script), "--name", "elastic", "--total", f"{TOTAL_S}s", "--shapes", "4,2",
                    "--time-min", "1m", "--signal", "USR2@20", "--policy", "reactive", "--json", home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        sub = json.loads(p.stdout)["data"]
        chain, first = sub["chain"], sub["first_job"]
        # 1. segment 0 runs with the shortened limit; the watcher sees it run (granted limit, payload start)
        _wait("segment 0 to start", lambda: _job_state(first) == "RUNNING", 150, tick=tick)
        granted = _sh("squeue", "-h", "-j", first, "-o", "%l")
        tick()  # the watcher sees it run: the limit Slurm granted, the payload's start
        # no tick until the blocker holds its nodes: with `reactive` the tick that sees segment 0 end plans the next
        _wait("segment 0 to end", lambda: _job_state(first) in ("", "COMPLETING") or None, 150)
        _sh("scontrol", "delete", f"ReservationName={resv}", check=False)
        # 2. two nodes held for a long time, then the watcher plans segment 1
        blocker = _sh("sbatch", "--parsable", "-p", "long", "-N2", "--exclusive", "-t", "30", "-J", "cr-elastic-blocker",
                      "-o", "/dev/null", "--wrap", "sleep 600").split(";")[0]
        _wait("the blocker to hold two nodes", lambda: _job_state(blocker) == "RUNNING", 120)
        _wait("the chain to complete", lambda: status()["status"] in ("COMPLETED", "FAILED", "CANCELLED"), 240,
              tick=tick, every=3)
        result = status()
        ckpt = Path(result["checkpoint_dir"])
        return {"home": home, "chain": chain, "result": result, "log": log, "granted": granted,
                "batch": (ckpt / "batch.log").read_text().splitlines(),
                "steps": (ckpt / "steps.log").read_text().splitlines(),
                "nnodes": {s["job_id"]: _sh("sacct", "-X", "-n", "-P", "-j", s["job_id"], "-o", "NNodes").splitlines()[0]
                           for s in result["segments_detail"] if s["start"] is not None}}
    finally:
        if blocker:
            _sh("scancel", blocker, check=False)
        _sh("scontrol", "delete", f"ReservationName={resv}", check=False)
        run_cli("cancel", "elastic", home=home)


def test_next_segment_runs_on_two_nodes_and_keeps_the_global_batch(elastic):
    r = elastic["result"]
    assert r["status"] == "COMPLETED", (r["reason"], elastic["log"])
    segs = [s for s in r["segments_detail"] if s["start"] is not None]
    assert segs[0]["shape_nodes"] == 4 and elastic["nnodes"][segs[0]["job_id"]] == "4"
    later = segs[1:]
    assert later and all(s["shape_nodes"] == 2 for s in later), [(s["idx"], s["shape_nodes"]) for s in segs]
    assert all(elastic["nnodes"][s["job_id"]] == "2" for s in later)
    s1 = later[0]
    assert s1["shape_reason"].startswith("2 nodes: start in ~"), s1["shape_reason"]
    opts = {o["nodes"]: o for o in s1["shape_options"]}
    assert opts[4]["wait_s"] >= 600 and opts[2]["wait_s"] < 300, opts  # Slurm's own answer (test-only)
    assert {o["wait_source"] for o in opts.values()} <= {"test-only", "model+test-only"}
    assert "shape 2 nodes" in s1["note"]
    assert any(re.search(r"shape: segment \d+ asks for 2 nodes instead of 4", line) for line in elastic["log"]), \
        elastic["log"]
    # the trainer's own account: one global batch, accumulation = reference GPUs / GPUs
    batches = [dict(kv.split("=", 1) for kv in line.split()) for line in elastic["batch"]]
    assert {b["global_batch"] for b in batches} == {"64"}, batches
    by_seg = {b["segment"]: b for b in batches}
    assert (by_seg["0"]["devices"], by_seg["0"]["ref_devices"], by_seg["0"]["accumulate"]) == ("8", "8", "1")
    assert (by_seg[str(s1["idx"])]["devices"], by_seg[str(s1["idx"])]["accumulate"]) == ("4", "2")
    # one unbroken step count across shapes: every step once, the resumed segment starts where the last saved
    steps = [int(line.split()[2]) for line in elastic["steps"] if line.startswith("step ")]
    assert steps == list(range(1, len(steps) + 1)), steps
    saves = [line.split() for line in elastic["steps"] if line.startswith("save ")]
    assert int(by_seg[str(s1["idx"])]["start_step"]) == int(saves[0][2])
    # a step on 2 nodes is the same work and took about twice as long: the measured rate says so
    assert 0.3 < s1["rate"] < 0.7, s1["rate"]


def test_a_time_min_segment_checkpoints_before_its_real_end_and_counts_right(elastic):
    r = elastic["result"]
    s0 = r["segments_detail"][0]
    # it asked for 65 s (Slurm: 2 minutes, its unit), the reservation left room for one: Slurm granted 1:00
    assert s0["time_limit_s"] == TOTAL_S + 20 and elastic["granted"] == "1:00", (s0["time_limit_s"], elastic["granted"])
    assert "--time-min=0-00:01:00" in s0["request"]
    assert s0["granted_s"] == 60 and "Slurm granted 1m" in s0["note"]
    # the signal came before the real end: it checkpointed and ended on its own, well before 60 s
    assert s0["outcome"] == "continue" and s0["slurm_state"] == "COMPLETED", s0
    assert s0["end"] - s0["start"] < 60 and s0["credit_s"] > 0
    # --total is work at the reference shape: segment 0's training at rate 1, the 2-node ones at their rate
    ran = [s for s in r["segments_detail"] if s["work_s"] is not None]
    assert min(sum(s["work_s"] for s in ran), TOTAL_S) == pytest.approx(r["done_s"], abs=1)  # shown up to --total
    assert r["done_s"] >= TOTAL_S - 3, r["done_s"]
    assert sum(s["credit_s"] for s in ran) > r["done_s"]  # training on 2 nodes counted at about half


@pytest.mark.parametrize("args, fragment", [
    (["--shapes", "5,2"], "--shapes '5,2': 5 nodes, but the partition has 4"),
    (["--shapes", "4,2", "--", "--nodes=3"], "starts with 4 nodes (the reference shape) but --nodes=3 is given after --"),
    (["--time-min", "5m"], "--time-min 5m is longer than a segment (2m)"),
])
def test_bad_shapes_against_the_partition_are_one_line_errors(slurm_cluster, chainrun_home, tmp_path, args, fragment):
    script = tmp_path / "t.sh"
    script.write_text(PAYLOAD)
    p = run_cli("submit", str(script), "--total", "5m", "--signal", "USR2@30", *args, home=chainrun_home, cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("chainrun: error")]
    assert len(errors) == 1 and fragment in errors[0], p.stderr
    assert "Traceback" not in p.stderr
