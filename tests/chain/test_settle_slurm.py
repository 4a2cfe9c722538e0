"""What `status` shows of a segment that did not end on its own terms, against what Slurm and the trainer recorded.

Two chains on the real test cluster, moved by `chainrun watch --once` ticks as cron would:
- one is cancelled by the user while segment 0 trains: its end, the time it held its allocation and
  what it trained must be sacct's End/Elapsed and the trainer's own record, not start + limit and 0 s;
- one runs a trainer that ignores the signal, so Slurm kills it at its limit (exit 143): it must not be
  reported as "checkpointed on the signal", but as stopped at its limit, with its last checkpoint's time.
Neither chain may warn that one of its own jobs "now names another job".
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

TOY = REPO / "templates" / "toy_train.sh"
# ignores USR2; a bash loop without a TERM trap dies of TERM at the limit (exit 143); a checkpoint every 20 steps
IGNORING = """#!/bin/bash
#SBATCH --cpus-per-task=1
#SBATCH --mem=100M
trap '' USR2
n=0
while :; do
  n=$((n + 1)); echo "step $n $(date +%s) $SLURM_JOB_ID" >> "$CHAINRUN_CHECKPOINT_DIR/steps.log"
  if ((n % 20 == 0)); then echo "$n" > "$CHAINRUN_CHECKPOINT_DIR/ckpt.new"; mv "$CHAINRUN_CHECKPOINT_DIR/ckpt.new" "$CHAINRUN_CHECKPOINT_DIR/ckpt"; fi
  sleep 1
done
"""


def _status(home: Path, chain: str) -> dict:
    p = run_cli("status", chain, "--json", home=home)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["data"][0]


def _tick(home: Path) -> None:
    p = run_cli("watch", "--once", "--plain", home=home, timeout=300)
    assert p.returncode == 0, p.stderr


def _sacct(job: str) -> dict:
    for _ in range(30):  # End/Elapsed may lag the job's end by a moment
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "--format=JobIDRaw,Start,End,Elapsed,State"],
                             capture_output=True, text=True, env={**os.environ, "SLURM_TIME_FORMAT": "%s"}).stdout
        for line in out.splitlines():
            jid, start, end, elapsed, state = line.split("|")
            if jid == job and end.isdigit():
                h, m, s = (["0"] + elapsed.split(":"))[-3:]
                return {"start": float(start), "end": float(end), "elapsed": int(h) * 3600 + int(m) * 60 + int(s),
                        "state": state}
        time.sleep(1)
    raise AssertionError(f"sacct has no end for job {job}")


def _events(home: Path, chain: str) -> list[str]:
    from chainrun.state.store import Store

    store = Store(home / "state.sqlite")
    try:
        return [e.message for _, e in store.events(chain, limit=1000)]
    finally:
        store.close()


@pytest.fixture(scope="module")
def chains(slurm_cluster, tmp_path_factory):
    home = tmp_path_factory.mktemp("settle-home")
    made = {}
    for name, script, args in [
        ("cancelled", TOY, ["--total", "10m", "--policy", "reactive", "--", "--nodelist=n1"]),
        ("ignoring", None, ["--total", "3m", "--policy", "reactive", "--", "--nodelist=n2"]),
    ]:
        work = tmp_path_factory.mktemp(name)
        if script is None:
            script = work / "ignoring.sh"
            script.write_text(IGNORING)
        p = run_cli("submit", str(script), "--name", name, "--signal", "USR2@50", "--json", *args, home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        data = json.loads(p.stdout)["data"]
        made[name] = {"id": data["chain"], "ckpt": Path(data["checkpoint_dir"])}
    cancelled, ignoring = made["cancelled"], made["ignoring"]
    deadline = time.time() + 600
    while time.time() < deadline:
        _tick(home)
        a, b = _status(home, cancelled["id"]), _status(home, ignoring["id"])
        steps = cancelled["ckpt"] / "steps.log"
        if a["status"] == "ACTIVE" and steps.exists() and sum(1 for ln in steps.read_text().splitlines()
                                                               if ln.startswith("step")) >= 20:
            p = run_cli("cancel", cancelled["id"], home=home)  # while segment 0 trains
            assert p.returncode == 0, p.stderr
        b0 = b["segments_detail"][0]
        if b["status"] == "ACTIVE" and b0["phase"] == "ENDED":
            ignoring["mtime"] = (ignoring["ckpt"] / "ckpt").stat().st_mtime
            p = run_cli("cancel", ignoring["id"], home=home)  # segment 0 was read; no need to run on
            assert p.returncode == 0, p.stderr
        a, b = _status(home, cancelled["id"]), _status(home, ignoring["id"])
        if a["status"] != "ACTIVE" and b["status"] != "ACTIVE" and not any(
                s["settling"] for s in a["segments_detail"] + b["segments_detail"]):
            break
        time.sleep(2)
    else:
        pytest.fail("the chains were not cancelled and settled in 10 minutes")
    return home, made


def test_a_cancelled_training_segment_shows_what_slurm_and_the_trainer_recorded(chains):
    home, made = chains
    v = _status(home, made["cancelled"]["id"])
    assert v["status"] == "CANCELLED"
    s0 = v["segments_detail"][0]
    acct = _sacct(s0["job_id"])
    assert s0["slurm_state"] == acct["state"].split()[0] == "CANCELLED"
    assert s0["start"] == acct["start"] and s0["end"] == acct["end"]  # not start + limit
    assert s0["end"] - s0["start"] < s0["time_limit_s"] - 30
    assert abs(v["allocated_s"] - sum(_sacct(s["job_id"])["elapsed"] for s in v["segments_detail"]
                                      if s["start"] is not None)) <= 1
    # trained: the payload's run time, bracketing the trainer's own first and last step
    stamps = [float(ln.split()[3]) for ln in (made["cancelled"]["ckpt"] / "steps.log").read_text().splitlines()
              if ln.startswith("step")]
    assert stamps[-1] - stamps[0] - 1 <= s0["credit_s"] <= acct["elapsed"] + 1  # whole seconds on both clocks (CI saw 13 vs 12)
    assert v["trained_s"] == pytest.approx(sum(s["credit_s"] for s in v["segments_detail"]))
    assert not [m for m in _events(home, made["cancelled"]["id"]) if "now names another job" in m]


def test_a_trainer_killed_at_its_limit_is_not_said_to_have_checkpointed(chains):
    home, made = chains
    ign = made["ignoring"]
    v = _status(home, ign["id"])
    s0 = v["segments_detail"][0]
    assert s0["slurm_state"] == "TIMEOUT" and s0["outcome"] == "continue"
    events = _events(home, ign["id"])
    said = next((m for m in events if m.startswith(f"segment 0 (job {s0['job_id']})") and "of training" in m),
                "\n".join(events))
    assert "checkpointed" not in said
    assert "stopped at its time limit without reacting to the USR2 signal (killed by TERM, exit 143)" in said
    assert f"the last checkpoint is from {time.strftime('%H:%M:%S', time.localtime(ign['mtime']))}" in said
    assert not [m for m in _events(home, ign["id"]) if "now names another job" in m]
    for s in v["segments_detail"]:  # what the cancel stopped later is settled from sacct too
        if s["start"] is not None:
            assert s["end"] == _sacct(s["job_id"])["end"]


# ignores the hand-off signal and TERM alike: only its successor's scancel (after the save timeout) ends it
DEAF = """#!/bin/bash
#SBATCH --cpus-per-task=1
#SBATCH --mem=100M
trap '' USR2 TERM
n=0
while :; do
  n=$((n + 1)); echo "step $n $(date +%s.%N) $SLURM_JOB_ID" >> "$CHAINRUN_CHECKPOINT_DIR/steps.log"
  sleep 1
done
"""


def test_an_owner_its_successor_cancelled_after_the_save_timeout_is_chainruns_doing(slurm_cluster, tmp_path):
    """Segment 1 starts while segment 0 trains, asks for the hand-off, and after the save timeout (10 s
    here, through the job's environment) sends TERM, then cancels it. sacct says CANCELLED, yet chainrun
    did it: the watcher reads control/cancel.0 and reports who cut it and why, and the chain goes on
    (it used to fail as 'cancelled outside chainrun')."""
    home, work = tmp_path / "home", tmp_path / "w"
    work.mkdir()
    (work / "deaf.sh").write_text(DEAF)
    knobs = "--export=ALL,CHAINRUN_HANDOFF_TIMEOUT=10,CHAINRUN_HANDOFF_GRACE=10"
    p = run_cli("submit", str(work / "deaf.sh"), "--name", "cut", "--signal", "USR2@30", "--total", "10m", "--json",
                "--policy", "lead", "--lead", "100s", "--", knobs, home=home, cwd=work)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    chain, ckpt = data["chain"], Path(data["checkpoint_dir"])
    owner0 = Path(data["run_dir"]) / "control" / "owner.0"
    try:
        # the first tick submits segment 1 (the lead covers the whole segment): only once segment 0 holds
        # generation 0, so that segment 1 is its successor. (A segment 1 that starts and claims first, as
        # under a loaded CI, leaves segment 0 the successor: roles swapped, still one copy, not this test.)
        deadline = time.time() + 400
        while time.time() < deadline and not owner0.exists():
            time.sleep(1)
        while time.time() < deadline:
            _tick(home)
            v = _status(home, chain)
            if v["segments_detail"][0]["phase"] == "ENDED" or v["status"] != "ACTIVE":
                break
            time.sleep(2)
        else:
            pytest.fail("segment 0 did not end in 400 s")
    finally:
        run_cli("cancel", chain, home=home)
    s0 = v["segments_detail"][0]
    assert v["status"] == "ACTIVE", v["reason"]  # not failed: the cancel was chainrun's own
    assert _sacct(s0["job_id"])["state"].startswith("CANCELLED")
    cut = dict(ln.split("=", 1) for ln in (Path(data["run_dir"]) / "control" / "cancel.0").read_text().splitlines())
    s1 = next(s for s in v["segments_detail"] if s["job_id"] == cut["by"])
    assert (cut["job"], cut["how"], cut["timeout"]) == (s0["job_id"], "scancel", "10"), cut
    assert s0["outcome"] == "continue" and s0["credit_s"] > 0
    said = next(m for m in _events(home, chain) if m.startswith(f"segment 0 (job {s0['job_id']}) was cancelled"))
    assert (f"segment {s1['idx']} (job {s1['job_id']}) sent it TERM, then cancelled it: it had not handed off "
            "within 10s of the request") in said and "--save-timeout" in said, said
    assert not [m for m in _events(home, chain) if "outside chainrun" in m]
    # never two copies: the successor's first step comes after the cut owner's last
    steps = [ln.split() for ln in (ckpt / "steps.log").read_text().splitlines()]
    mine = [float(t) for _, _, t, j in steps if j == s0["job_id"]]
    theirs = [float(t) for _, _, t, j in steps if j == s1["job_id"]]
    assert not theirs or min(theirs) > max(mine), (max(mine), theirs[:3])
