"""The filler on the real test cluster (4 nodes, 2 GPUs each): one chain, `--shapes 2,1`.

Scenario (about 2.5 minutes):
1. A hold job of ours takes three nodes in the `long` partition (8-minute limit): Slurm's
   `sbatch --test-only` says 2 nodes start only when it ends, 1 node now. `chainrun submit` makes
   segment 0 a filler on 1 node (the reference, 2 nodes, would only queue meanwhile).
2. The tick that sees the filler run submits segment 1 on 2 nodes at once (with `reactive`, which
   would otherwise wait for the filler's end); it queues behind the hold.
3. The test cancels the hold: segment 1 starts and the hand-off stops the filler (no adaptive wait
   rule is written for a filler's successor); the chain completes its --total.
4. Never two copies training: the toy trainer's steps are one unbroken sequence, the filler's last
   step before segment 1's first, and the global batch is the same on 1 and 2 nodes.

Why `2,1` and not `4,2`: on a 4-node cluster a 4-node reference needs the filler's own nodes, so it
could only start once the filler ended (the filler then reaches its end first and the chain goes
on with the queued reference); the cut needs a reference that fits beside the filler.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slurm

TOTAL_S = 60
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


def _steps(path: Path) -> list[list[str]]:
    return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def filler(slurm_cluster, tmp_path_factory):
    home = tmp_path_factory.mktemp("filler-home")
    work = tmp_path_factory.mktemp("filler")
    script = work / "train.sh"
    script.write_text(PAYLOAD)
    name = f"cr-filler-hold-{os.getpid()}"
    hold = ""
    log: list[str] = []

    def tick() -> None:
        p = run_cli("watch", "--once", "--plain", home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        log.extend(p.stdout.splitlines())

    def status() -> dict:
        p = run_cli("status", "filler", "--json", home=home)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["data"][0]

    try:
        # 1. three nodes held (other tests' jobs may still run: wait, generously, until it holds them)
        hold = _sh("sbatch", "--parsable", "-p", "long", "-N3", "--exclusive", "-t", "8", "-J", name,
                   "-o", "/dev/null", "--wrap", "sleep 600").split(";")[0]
        _wait("the hold to run on three nodes", lambda: _job_state(hold) == "RUNNING", 180)
        p = run_cli("submit", str(script), "--name", "filler", "--total", f"{TOTAL_S}s", "--shapes", "2,1", "--filler", "6",
                    "--signal", "USR2@20", "--policy", "reactive", "--json", home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        sub = json.loads(p.stdout)["data"]
        first = sub["first_job"]
        at_submit = status()
        # 2. the filler runs; the tick that sees it run asks for the reference at once
        _wait("the filler to run", lambda: _job_state(first) == "RUNNING", 120)
        tick()
        queued = status()
        ckpt = Path(queued["checkpoint_dir"])
        # let it train a few steps (1 s each on 1 node: accumulation 2), so the cut is visible
        _wait("the filler to train", lambda: sum(s[0] == "step" for s in _steps(ckpt / "steps.log")) >= 5, 60)
        # 3. the hold goes: the reference starts beside the filler and takes over
        _sh("scancel", hold)
        cancelled_at = time.time()
        _wait("the chain to complete", lambda: status()["status"] in ("COMPLETED", "FAILED", "CANCELLED"), 240,
              tick=tick, every=3)
        result = status()
        return {"at_submit": at_submit, "queued": queued, "result": result, "log": log, "cancelled_at": cancelled_at,
                "rule": (Path(result["run_dir"]) / "control" / "handoff-rule.1").exists(), "batch": (ckpt / "batch.log").read_text().splitlines(),
                "steps": _steps(ckpt / "steps.log"),
                "nnodes": {s["job_id"]: _sh("sacct", "-X", "-n", "-P", "-j", s["job_id"], "-o", "NNodes").splitlines()[0]
                           for s in result["segments_detail"] if s["start"] is not None}}
    finally:
        if hold:
            _sh("scancel", hold, check=False)
        run_cli("cancel", "filler", home=home)


def test_segment_0_is_a_filler_and_the_reference_is_queued_as_soon_as_it_runs(filler):
    s0 = filler["at_submit"]["segments_detail"][0]
    assert s0["shape_nodes"] == 1, s0
    assert s0["shape_reason"].startswith("filler on 1 nodes while 2 nodes queue"), s0["shape_reason"]
    opts = {o["nodes"]: o for o in s0["shape_options"]}
    assert opts[2]["wait_s"] >= 300 and opts[1]["wait_s"] < 60, opts  # Slurm's own answer (test-only)
    # 1 node does half the 2-node work: 0.5 x (wait - 20 s boundary) >= 6 boundaries (120 s)
    assert opts[1]["gain_s"] == pytest.approx(0.5 * (opts[2]["wait_s"] - opts[1]["wait_s"] - 20), abs=1)
    q = filler["queued"]["segments_detail"]
    assert len(q) == 2 and q[1]["shape_nodes"] == 2, q
    assert "asked as soon as the filler (segment 0, 1 nodes) runs" in q[1]["shape_reason"]
    said = " ".join(" ".join(filler["log"]).split())  # `watch` wraps long lines
    assert "segment 1 submitted as job" in said and "(filler segment 0 is running:" in said, said
    assert q[0]["start"] is not None and q[1]["start"] is None  # queued while the filler trains


def test_the_reference_takes_over_and_the_chain_completes(filler):
    r = filler["result"]
    assert r["status"] == "COMPLETED", (r["reason"], filler["log"])
    segs = r["segments_detail"]
    s0, s1 = segs[0], segs[1]
    assert filler["nnodes"][s0["job_id"]] == "1" and filler["nnodes"][s1["job_id"]] == "2"
    # the hold went, the reference started, the filler was stopped by the hand-off (not by its own limit)
    assert s1["start"] >= filler["cancelled_at"] - 5
    assert s0["outcome"] == "handoff", s0
    assert not filler["rule"]  # no adaptive wait rule for a filler's successor: it cuts
    assert s0["end"] < s0["start"] + s0["time_limit_s"] - 20, s0
    assert r["done_s"] >= TOTAL_S - 3, r["done_s"]
    # the filler's training counted at its rate (1 of 2 nodes: about half), the reference's at 1
    assert 0.3 < s0["rate"] < 0.7 and s1["rate"] == pytest.approx(1.0), (s0["rate"], s1["rate"])


def test_never_two_copies_training_and_one_global_batch(filler):
    steps = [s for s in filler["steps"] if s[0] == "step"]
    numbers = [int(s[2]) for s in steps]
    assert numbers == list(range(1, len(numbers) + 1)), numbers  # every step once, in order
    by_seg = {}
    for s in steps:
        by_seg.setdefault(s[1], []).append(float(s[3]))
    assert set(by_seg) >= {"0", "1"}, by_seg.keys()
    assert max(by_seg["0"]) < min(by_seg["1"])  # the filler's last step before the reference's first
    saves = [s for s in filler["steps"] if s[0] == "save" and s[1] == "0"]
    batches = {b["segment"]: b for b in (dict(kv.split("=", 1) for kv in ln.split()) for ln in filler["batch"])}
    assert saves and int(batches["1"]["start_step"]) == int(saves[-1][2])  # resumed where the filler saved
    assert {b["global_batch"] for b in batches.values()} == {"64"}, batches
    assert (batches["0"]["devices"], batches["0"]["ref_devices"], batches["0"]["accumulate"]) == ("2", "4", "2")
    assert (batches["1"]["devices"], batches["1"]["accumulate"]) == ("4", "1")
