"""Real clusters (issue #16) on the real local Slurm: multi-node segments under srun, a maintenance
window, why a segment is pending, and site options from config.toml.

The scenarios run side by side, each with its own chainrun home and `chainrun watch`:
1. a 2-node chain whose payload is `srun` of the toy trainer on both nodes: the signal reaches
   every rank, rank 0 checkpoints, the next segment resumes;
2. the same payload reaching its total steps: rank 0's done file ends the chain;
3. a rank that dies without a signal: srun --kill-on-bad-exit ends the step, a crash;
4. a MAINT reservation on the chain's node starting in a few minutes: the first segment is
   planned to end before it instead of waiting behind it;
5. a segment that waits for a busy node: status says why in words, and every segment carries
   the site option set for the cluster in config.toml.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.chain.test_chain_slurm import assert_continuous_and_exclusive
from tests.reliability import harness as h

pytestmark = pytest.mark.slurm

SRUN_TOY = h.REPO / "templates" / "toy_train_srun.sh"
SIG = ["--signal", "USR2@40"]


def _submit(home: Path, work: Path, name: str, script: Path, *args: str) -> str:
    work.mkdir(parents=True, exist_ok=True)
    p = h.cli("submit", str(script), "--name", name, "--json", *args, home=home, cwd=work)
    if p.returncode != 0:
        raise RuntimeError(f"submit {name} failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)["data"]["chain"]


def _detail(home: Path, chain: str) -> dict:
    return json.loads(h.cli("status", chain, "--json", home=home).stdout)["data"][0]


def _drive(home: Path, chain: str, *, poll=None) -> dict:
    watcher = subprocess.Popen(h.watch_argv(3), env={**os.environ, "CHAINRUN_HOME": str(home)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    seen = poll(home, chain, watcher) if poll else None
    log, _ = watcher.communicate(timeout=900)
    return {"rc": watcher.returncode, "log": log, "detail": _detail(home, chain), "seen": seen,
            "plain": h.cli("status", chain, home=home, env={"COLUMNS": "200"}).stdout}


def _multinode(base: Path, *extra: str, total: str = "3m", retries: str = "1") -> dict:
    home = base / "home"
    chain = _submit(home, base / "w", base.name[:8], SRUN_TOY, "--total", total, "--policy", "lead", "--lead", "60s",
                    "--retries", retries, *SIG, "--", "--nodelist=n1,n2", *extra)
    out = _drive(home, chain)
    out["logs"] = {p.name: p.read_text() for p in (Path(out["detail"]["run_dir"]) / "logs").glob("*.out")}
    return out


def _maintenance(base: Path) -> dict:
    """The window starts in 4 minutes; the chain wants 4 minutes of training in 10-minute segments:
    segment 0 is cut to end before the window, and so is every later one (or it starts after it)."""
    home = base / "home"
    name = f"maint_{os.getpid()}"
    subprocess.run(["scontrol", "create", "reservation", f"reservationname={name}", "starttime=now+4minutes",
                    "duration=10", "nodes=n4", "flags=maint", "users=root"], check=True, capture_output=True)

    def poll(home, chain, watcher):  # once segment 1 is planned, the rest would wait out the window: stop
        deadline = time.time() + 300
        while time.time() < deadline and watcher.poll() is None:
            segs = _detail(home, chain)["segments_detail"]
            if len(segs) > 1:
                break
            time.sleep(2)
        h.cli("cancel", chain, home=home)

    try:
        t0 = time.time()
        chain = _submit(home, base / "w", "maint", h.TOY, "--total", "4m", "--segment", "10m", "--policy", "reactive",
                        *SIG, "--",
                        "--partition=long", "--nodelist=n4")
        out = _drive(home, chain, poll=poll)
        out["submitted_at"] = t0
        out["events"] = h.events(home, "submitted")
        return out
    finally:
        subprocess.run(["scontrol", "delete", f"reservationname={name}"], capture_output=True)


def _pending(base: Path) -> dict:
    home = base / "home"
    home.mkdir(parents=True)
    (home / "config.toml").write_text('[sbatch]\nlocal = ["--comment=site-opt", "--mem=100M"]\n')
    blocker = subprocess.run(["sbatch", "--parsable", "-J", "blocker", "--exclusive", "-w", "n3", "--time=1",
                              "--wrap", "sleep 45"], capture_output=True, text=True, check=True).stdout.strip()
    chain = _submit(home, base / "w", "pending", h.TOY, "--total", "1m", *SIG, "--", "--nodelist=n3", "--exclusive")

    def poll(home, chain, watcher):
        deadline = time.time() + 60
        while time.time() < deadline:
            seg = _detail(home, chain)["segments_detail"][0]
            if seg["pending_reason"] not in ("", "None"):  # "None": the scheduler has not looked at it yet
                comment = subprocess.run(["squeue", "-h", "-j", seg["job_id"], "-o", "%k"], capture_output=True,
                                         text=True).stdout.strip()
                return {"seg": seg, "comment": comment,
                        "table": h.cli("status", chain, home=home, env={"COLUMNS": "200"}).stdout}
            time.sleep(1)
        return None

    out = _drive(home, chain, poll=poll)
    out["blocker"] = blocker
    return out


SCENARIOS = {
    "multinode": lambda b: _multinode(b),
    "multidone": lambda b: _multinode(b, "--export=ALL,TOY_TOTAL_STEPS=40", total="10m"),
    "multicrash": lambda b: _multinode(b, "--export=ALL,TOY_CRASH_AT_STEP=6,TOY_CRASH_RANK=1", retries="0"),
    "maint": _maintenance,
    "pending": _pending,
}


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    return h.run_side_by_side([SCENARIOS], tmp_path_factory, "CHAINRUN_CLUSTER_SCENARIOS")


def _ok(res: dict) -> dict:
    assert "error" not in res, res.get("error")
    assert res["rc"] == 0, res["log"][-3000:]
    assert "Traceback" not in res["log"], res["log"][-3000:]
    return res


def _steps_ok(res: dict) -> None:
    assert_continuous_and_exclusive(SimpleNamespace(result={"checkpoint_dir": res["detail"]["checkpoint_dir"]}))


def test_multinode_segments_signal_every_rank_and_resume(runs):
    res = _ok(runs["multinode"])
    d = res["detail"]
    assert d["status"] == "COMPLETED", d["reason"]
    ended = [s for s in d["segments_detail"] if s["outcome"] in ("continue", "handoff")]
    assert len(ended) >= 2, [s["outcome"] for s in d["segments_detail"]]
    for s in ended:  # both ranks (srun --label: "0:" and "1:") got the signal and stopped cleanly
        log = next(text for name, text in res["logs"].items() if name.endswith(f"-{s['job_id']}.out"))
        for rank in (0, 1):
            assert any(line.startswith(f"{rank}:") and "-> saved step" in line for line in log.splitlines()), log
    _steps_ok(res)
    progress = list((Path(d["run_dir"]) / "control").glob("*progress*"))
    assert {p.name.split(".")[-1] for p in progress} >= {"n1", "n2"}, progress  # one file per rank and node


def test_rank_zero_done_file_ends_a_multinode_chain(runs):
    res = _ok(runs["multidone"])
    d = res["detail"]
    assert d["status"] == "COMPLETED" and "finished" in d["reason"], d["reason"]
    assert any(s["outcome"] == "done" for s in d["segments_detail"])


def test_a_rank_that_dies_fails_the_step_and_is_a_crash(runs):
    res = _ok(runs["multicrash"])
    d = res["detail"]
    assert d["status"] == "FAILED" and "no retries left" in d["reason"], d["reason"]
    assert d["segments_detail"][0]["outcome"] == "crash"


def test_segment_fits_before_a_maintenance_window(runs):
    res = _ok(runs["maint"])
    d = res["detail"]
    first, second = d["segments_detail"][:2]
    assert first["time_limit_s"] <= 2 * 60, first  # 4m40s wanted; the window starts in 4 min
    assert first["start"] - res["submitted_at"] < 60, "the first segment waited behind the maintenance"
    assert "shortened to 2m: maintenance at" in first["note"], first["note"]
    # the next one is planned around the same window (cut shorter still, or left to start after it)
    assert "maintenance at" in second["note"], second["note"]
    assert any("maintenance" in e for e in res["events"]), res["events"]
    assert first["outcome"] in ("continue", "handoff") and first["credit_s"] > 0, first


def test_pending_segment_says_why_and_carries_site_options(runs):
    res = _ok(runs["pending"])
    seen = res["seen"]
    assert seen, "segment 0 was never seen pending"
    assert seen["seg"]["pending_reason"] in ("Resources", "Priority"), seen["seg"]
    assert "pending: waiting for" in seen["seg"]["note"] and "waited" in seen["seg"]["note"], seen["seg"]["note"]
    assert "pending: waiting for" in seen["table"], seen["table"]
    assert seen["comment"] == "site-opt"  # the [sbatch] option from config.toml reached sbatch
    d = res["detail"]
    assert d["status"] == "COMPLETED", d["reason"]
    assert all("--comment=site-opt" in s["request"] for s in d["segments_detail"] if s["job_id"])
