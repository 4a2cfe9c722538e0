"""Never two copies training, on the real local Slurm: the hand-off holes of issue #10.

Every scenario runs a real chain of the toy trainer (2-minute partition, `watch --interval 5`)
and is judged from the trainer's own record (every step with its job id and time): no two
jobs of a chain ever trained at once, every step was done, and sacct shows one job per
segment. The scenarios run side by side (one thread each, own chainrun home and watcher):
1. a trainer that ignores the signal, successors submitted long before the limit (the reported
   case: a successor's own early signal arrives while it waits for the hand-off);
2. a successor killed (SIGKILL) while it waits for the hand-off: not a crash, no retry spent;
3. an unconfirmed submission (sbatch fails, no job) re-planned under a new index while its
   predecessor trains;
4. a payload that crashes while checkpointing after the signal, every time: the chain stops;
5. a predecessor whose heartbeat stops while its payload keeps training;
6. the adaptive hand-off: a successor that starts within the watcher's wait windows of its
   predecessor's hand-over point waits for it instead of cutting it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.chain.test_chain_slurm import assert_continuous_and_exclusive
from tests.reliability import harness as h

pytestmark = pytest.mark.slurm

SIG = ["--signal", "USR2@40"]
IGNORES = ["--export=ALL,TOY_IGNORE_SIGNAL=1"]


def _detail(home: Path, chain: str) -> dict:
    return json.loads(h.cli("status", chain, "--json", home=home).stdout)["data"][0]


def _control(home: Path, chain: str) -> Path:
    return Path(_detail(home, chain)["run_dir"]) / "control"


def _state(ctl: Path, idx: int) -> dict:
    try:
        text = (ctl / f"seg-{idx}.state").read_text()
    except FileNotFoundError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _watch(home: Path, env: dict | None = None) -> subprocess.Popen:
    full = {**os.environ, **(env or {}), "CHAINRUN_HOME": str(home)}
    return subprocess.Popen(h.watch_argv(5), env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)


def _finish(home: Path, chain: str, watcher: subprocess.Popen, since: float, env: dict | None = None) -> dict:
    log, _ = watcher.communicate(timeout=900)
    detail = _detail(home, chain)
    jobs = [j for j in h.sacct_jobs(since, env) if j["JobName"].startswith(f"cr.{chain}.")]
    return {"home": home, "chain": chain, "rc": watcher.returncode, "log": log, "detail": detail, "jobs": jobs,
            "events": {k: h.events(home, k) for k in ("unstarted", "warning", "error", "retry", "crash",
                                                        "checkpoint-crash")}}


def _ignoring_trainer(base: Path) -> dict:
    home, since = base / "home", time.time()
    chain = h.submit(home, base / "w", "ignores", "--total", "4m", "--policy", "lead", "--lead", "100s", *SIG,
                     "--", "--nodelist=n1", *IGNORES)
    return _finish(home, chain, _watch(home), since)


def _killed_while_waiting(base: Path) -> dict:
    """The first successor seen waiting for its predecessor's hand-off (segment 1, or a later one if
    segment 1 happened to start only once segment 0 had ended) has its batch shell killed."""
    home, since = base / "home", time.time()
    chain = h.submit(home, base / "w", "killwait", "--total", "3m", "--policy", "lead", "--lead", "100s", *SIG,
                     "--retries", "0", "--", "--nodelist=n2", *IGNORES)
    watcher = _watch(home)
    ctl, killed, seen = _control(home, chain), None, {}
    deadline = time.time() + 300
    while killed is None and time.time() < deadline and watcher.poll() is None:
        for idx in range(1, 6):
            st = _state(ctl, idx)
            if st and seen.get(idx, [(0, None)])[-1][1] != st:
                seen.setdefault(idx, []).append((round(time.time() - since, 1), st))
            if st.get("phase") == "waiting":
                start = dict(ln.split("=", 1) for ln in (ctl / f"seg-{idx}.start").read_text().splitlines() if "=" in ln)
                time.sleep(3)
                os.kill(int(start["pid"]), signal.SIGKILL)  # the batch shell dies mid-wait (no outcome written)
                killed = start["job"]
                break
        time.sleep(0.5)
    out = _finish(home, chain, watcher, since)
    out["killed"], out["seen"] = killed, seen
    return out


def _unconfirmed_replanned(base: Path) -> dict:
    """sbatch for segment 1 fails with an error chainrun does not know, creating no job: after
    confirming absence in sacct the engine plans it again as segment 2, while segment 0 trains."""
    home, since = base / "home", time.time()
    real = subprocess.run(["bash", "-c", "command -v sbatch"], capture_output=True, text=True).stdout.strip()
    bindir, state = base / "bin", base / "shim"
    bindir.mkdir(parents=True)
    state.mkdir(parents=True)
    (bindir / "sbatch").write_text(f"""#!/bin/bash
if [[ " $* " == *" --job-name=cr."*".1 "* && ! -e "{state}/failed" ]]; then
  touch "{state}/failed"
  echo "sbatch: error: Batch job submission failed: Unexpected message received" >&2
  exit 1
fi
exec {real} "$@"
""")
    (bindir / "sbatch").chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    chain = h.submit(home, base / "w", "replan", "--total", "3m", "--policy", "lead", "--lead", "100s", *SIG,
                     "--", "--nodelist=n3", *IGNORES, env=env)
    out = _finish(home, chain, _watch(home, env), since)
    out["shim_failed"] = (state / "failed").exists()
    return out


def _checkpoint_crash(base: Path) -> dict:
    home, since = base / "home", time.time()
    chain = h.submit(home, base / "w", "ckptcrash", "--total", "6m", "--policy", "reactive", *SIG, "--retries", "3",
                     "--", "--nodelist=n4", "--export=ALL,TOY_CRASH_ON_SAVE=1")
    return _finish(home, chain, _watch(home), since)


def _silent_heartbeat(base: Path) -> dict:
    home, since = base / "home", time.time()
    chain = h.submit(home, base / "w", "heartbeat", "--total", "4m", "--policy", "lead", "--lead", "100s", *SIG,
                     "--", "--nodelist=n4")
    watcher = _watch(home)
    ctl, stopped = _control(home, chain), None
    deadline = time.time() + 120
    while stopped is None and time.time() < deadline:
        if (ctl / "seg-0.monitor").exists() and _state(ctl, 0).get("phase") == "training":
            pid = int((ctl / "seg-0.monitor").read_text())
            os.kill(pid, signal.SIGSTOP)  # the heartbeat stops (a hung monitor); the payload trains on
            stopped = pid
        time.sleep(0.5)
    out = _finish(home, chain, watcher, since)
    out["stopped"] = stopped
    return out


def _adaptive_wait(base: Path) -> dict:
    """3-minute segments (long partition) training 120 s each, 150 s of work, --lead 80s: segment 1
    is submitted ~80 s before segment 0's hand-over point (well before Slurm's signal, which may
    come 30 s early) and starts at once. Nothing is measured yet, so the hand-off takes the signal
    lead (60 s) and the watcher's rule waits for any start within 90 s of the hand-over point (a
    cut would need a third segment for the lost minute)."""
    home, since = base / "home", time.time()
    chain = h.submit(home, base / "w", "adaptive", "--total", "150s", "--segment", "3m", "--policy", "lead",
                     "--lead", "80s", "--signal", "USR2@60", "--",
                     "--partition=long", "--export=ALL,TOY_TOTAL_STEPS=300")
    out = _finish(home, chain, _watch(home), since)
    ctl = _control(home, chain)
    out["control"] = {p.name: p.read_text() for p in ctl.iterdir() if p.is_file() and not p.name.endswith(".tail")}
    return out


SCENARIOS = {"ignores": _ignoring_trainer, "killwait": _killed_while_waiting, "replan": _unconfirmed_replanned,
             "ckptcrash": _checkpoint_crash, "heartbeat": _silent_heartbeat, "adaptive": _adaptive_wait}


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    return h.run_side_by_side([SCENARIOS], tmp_path_factory, "CHAINRUN_HANDOFF_SCENARIOS")


def _ok(res: dict, *, payload_traceback: bool = False) -> dict:
    assert "error" not in res, res.get("error")
    assert res["rc"] == 0, res["log"][-3000:]
    # chainrun's own tracebacks never reach the screen (a payload's may, in the log tail it shows)
    assert payload_traceback or "Traceback" not in res["log"], res["log"][-3000:]
    assert "chainrun/chain/" not in res["log"] and "chainrun/cli/" not in res["log"], res["log"][-3000:]
    return res


def _one_job_per_segment(res: dict) -> None:
    per_name = Counter(j["JobName"] for j in res["jobs"])
    assert per_name and max(per_name.values()) == 1, per_name
    recorded = {s["job_id"] for s in res["detail"]["segments_detail"] if s["job_id"]}
    assert {j["JobIDRaw"] for j in res["jobs"]} == recorded


def _trained_alone(res: dict) -> None:
    assert_continuous_and_exclusive(SimpleNamespace(result={"checkpoint_dir": res["detail"]["checkpoint_dir"]}))
    assert res["detail"]["payload_overlaps"] == [] and not res["events"]["error"], res["events"]["error"]


def _completed(res: dict) -> None:
    d = res["detail"]
    assert d["status"] == "COMPLETED", d["reason"]
    # --total is training time: reached when less than a minute (5 % of a short total) is missing
    assert d["trained_s"] >= d["total_s"] - min(60, 0.05 * d["total_s"]), (d["trained_s"], d["total_s"])


def test_signal_ignoring_trainer_never_trains_twice(runs):
    res = _ok(runs["ignores"])
    _completed(res)
    _trained_alone(res)
    _one_job_per_segment(res)
    segs = res["detail"]["segments_detail"]
    # successors started long before their predecessor stopped and waited; those whose own signal
    # came first ended cleanly: never a crash, never a retry
    assert not [s for s in segs if s["outcome"] == "crash"], [(s["idx"], s["outcome"], s["reason"]) for s in segs]
    assert res["detail"]["retries_used"] == 0 and not res["events"]["retry"]


def test_segment_killed_while_waiting_for_the_handoff_is_not_a_crash(runs):
    res = _ok(runs["killwait"])
    assert res["killed"], (f"no successor ever waited for a hand-off; the successors' states seen: {res['seen']}\n"
                           f"{json.dumps(res['detail']['segments_detail'], default=str)[:3000]}\n{res['log'][-3000:]}")
    _completed(res)  # with --retries 0: a crash would have failed the chain
    _trained_alone(res)
    _one_job_per_segment(res)
    killed = next(s for s in res["detail"]["segments_detail"] if s["job_id"] == res["killed"])
    assert killed["outcome"] == "unstarted" and killed["credit_s"] == 0, killed


def test_unconfirmed_submission_replanned_while_predecessor_trains(runs):
    res = _ok(runs["replan"])
    assert res["shim_failed"]
    _completed(res)
    _trained_alone(res)
    _one_job_per_segment(res)
    segs = {s["idx"]: s for s in res["detail"]["segments_detail"]}
    assert segs[1]["job_id"] is None and segs[1]["outcome"] == "cancelled"  # never created, then re-planned


def test_checkpoint_that_crashes_after_the_signal_stops_the_chain(runs):
    res = _ok(runs["ckptcrash"], payload_traceback=True)
    d = res["detail"]
    assert d["status"] == "FAILED" and "checkpointing 2 times in a row" in d["reason"], d["reason"]
    outcomes = [s["outcome"] for s in d["segments_detail"]]
    assert outcomes[:2] == ["checkpoint-crash", "checkpoint-crash"], outcomes
    assert any("RuntimeError" in w for w in res["events"]["warning"]), res["events"]["warning"]  # the log tail
    _trained_alone(res)


def test_silent_heartbeat_does_not_let_a_successor_in(runs):
    res = _ok(runs["heartbeat"])
    assert res["stopped"], "segment 0 never trained"
    s0, s1 = res["detail"]["segments_detail"][:2]
    # segment 1 waited beside a payload whose heartbeat had stopped for longer than the 30 s after
    # which the old wrapper "took over"; it may end unstarted (its own signal can come first)
    assert s0["end"] - s1["start"] >= 35, (s0, s1)
    _completed(res)
    _trained_alone(res)
    _one_job_per_segment(res)


def test_successor_within_the_rule_waits_and_its_predecessor_is_not_cut(runs):
    res = _ok(runs["adaptive"])
    _completed(res)
    _trained_alone(res)  # zero overlap, from the trainer's own per-job record
    _one_job_per_segment(res)
    ctl = {k: dict(ln.split("=", 1) for ln in v.splitlines() if "=" in ln) for k, v in res["control"].items()}
    s0, s1 = res["detail"]["segments_detail"][:2]
    assert s1["start"] < s0["end"], ("segment 1 started only after segment 0 ended: the cluster was too busy "
                                     "to test the early start", s0, s1)
    rule = ctl["handoff-rule.1"]
    assert rule["for_job"] == s0["job_id"] and rule["signal_lead"] == "60", rule
    # segment 1 waited by the rule: no hand-off request; segment 0 stopped at its own signal
    assert "handoff.0" not in ctl, ctl.get("handoff.0")
    assert ctl["seg-1.outcome"]["handoff_mode"] == "wait", ctl["seg-1.outcome"]
    assert int(ctl["seg-1.outcome"]["handoff_wait"]) >= 5, ctl["seg-1.outcome"]
    assert s0["outcome"] == "continue" and ctl["seg-0.outcome"]["outcome"] == "continue", (s0, ctl["seg-0.outcome"])
