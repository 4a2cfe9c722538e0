"""`chainrun submit --cluster local,b --race` on two real Slurm clusters (issue 26, the race of segment 0).

``local`` is this process's Slurm cluster, ``b`` a second cluster with its own ClusterName reached through a
real OpenSSH server (the fixtures of tests/ssh/test_sites_slurm.py). The chain's jobs may only use n4 on
``local``, and another user's job holds n4 for an hour: segment 0 is submitted on both clusters, gated;
b's starts, the watcher keeps it (go.0 on b), cancels local's while it still pends, and the chain runs
to the end on b. Read from the trainer's own record on both clusters: nothing trained on local, one job
at a time on b.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.ssh.conftest import TOY_DIR
from tests.ssh.test_move_slurm import ONLY_N4, WHOLE, queue_on_n4, read, status, steps, wait_for, _watcher
from tests.ssh.test_sites_slurm import configure, env, second_cluster, site_b  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]

SITES = f"""
[clusters.b.sbatch]
partition = "long"

[clusters.b.job]
script = "{TOY_DIR}/toy_train.sh"
"""


def _hold_n4() -> str:
    """Another user's job on n4 of local for an hour, running (not just queued)."""
    job = queue_on_n4()
    wait_for("the blocker to run", lambda: subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                                                          text=True).stdout.strip() == "RUNNING", 60)
    return job


def test_race_keeps_the_cluster_that_starts_first_and_cancels_the_other_while_it_pends(env, tmp_path):
    configure(env, SITES)
    script = tmp_path / "train.sh"
    script.write_text((Path(__file__).parents[2] / "templates" / "toy_train.sh").read_text())
    (tmp_path / "toy_trainer.py").write_text((Path(__file__).parents[2] / "templates" / "toy_trainer.py").read_text())
    blocker = _hold_n4()
    watch = None
    try:
        p = run_cli("submit", str(script), "--cluster", "local,b", "--race", "--total", "3m", "--segment", "2m",
                    "--signal", "USR2@40", "--policy", "lead", "--lead", "60s", "--json",
                    "--", ONLY_N4, WHOLE, home=env["home"], cwd=tmp_path, env=env["extra"], timeout=600)
        assert p.returncode == 0, p.stderr
        data = json.loads(p.stdout)["data"]
        chain, jobs = data["chain"], data["race"]
        assert set(jobs) == {"local", "b"} and all(jobs.values()), data
        c, segs, _ = read(env, chain)
        assert segs == [] and c.extra["race"]["phase"] == "racing", c.extra  # no segment 0 until one is kept
        here = subprocess.run(["squeue", "-h", "-j", jobs["local"], "-o", "%j %T"], capture_output=True, text=True)
        assert here.stdout.split() == [f"cr.{chain}.0", "PENDING"], here.stdout  # n4 is held: it pends
        watch = _watcher(env)
        wait_for("segment 0 kept on b", lambda: read(env, chain)[0].extra["race"].get("phase") == "won", 300, watch)
        c, segs, _ = read(env, chain)
        assert c.cluster == "b" and segs[0].cluster == "b" and segs[0].job_id == jobs["b"], (c.extra, segs)
        gone = subprocess.run(["squeue", "-h", "-j", jobs["local"], "-o", "%T"], capture_output=True, text=True)
        assert gone.stdout.strip() in ("", "CANCELLED", "COMPLETING"), gone.stdout  # cancelled while pending
        out, err = watch.communicate(timeout=900)
        assert watch.returncode == 0, err
    finally:
        if watch is not None and watch.poll() is None:
            watch.kill()
        subprocess.run(["scancel", blocker], capture_output=True, timeout=60)
    st = status(env, chain)
    assert st["status"] == "COMPLETED", (st, out)
    c, segs, events = read(env, chain)
    text = "\n".join(f"{e.idx} {e.kind} {e.message}" for e in events)
    race = c.extra["race"]
    assert race["winner"] == "b" and race["racers"]["local"]["outcome"] == "cancelled", race
    assert race["racers"]["local"].get("held_s") == 0.0 and not race.get("held_twice_s"), race  # it never started
    acct = subprocess.run(["sacct", "-n", "-X", "-j", jobs["local"], "-o", "State%20"], capture_output=True, text=True)
    assert acct.stdout.split()[:1] == ["CANCELLED"], acct.stdout
    for said in ("segment 0 raced on local, b", "segment 0 kept on b (job", "wrote go.0 there",
                 f"racer on local (job {jobs['local']}) cancelled: segment 0 runs on b; it never started"):
        assert said in text, (said, text)
    assert all(s.cluster == "b" for s in segs), text  # the rule kept every later segment on b (local is full)
    assert "b job " + jobs["b"] + " started first: kept as segment 0" in st["race_note"], st["race_note"]
    # the trainer's record: nothing trained on local; on b one unbroken run of steps, one job at a time
    a, b = data["sites"]
    assert not Path(a["checkpoint_dir"], "steps.log").exists()
    there = steps(env["server"].ssh(f"cat {b['checkpoint_dir']}/steps.log").stdout)
    # b's racer waited, gated, for the watcher's go-ahead before it trained (the wrapper's own record)
    seg0 = env["server"].ssh(f"cat {b['run_dir']}/control/seg-0.outcome").stdout
    assert "go=0" in seg0.split() and f"job={jobs['b']}" in seg0.split(), seg0
    trained = [(t, j) for k, _, t, j in there if k == "step"]
    assert trained and trained[0][1] == jobs["b"], there[:3]
    spans = {}
    for t, j in trained:
        lo, hi = spans.get(j, (t, t))
        spans[j] = (min(lo, t), max(hi, t))
    ordered = sorted(spans.values())
    assert all(prev[1] < nxt[0] for prev, nxt in zip(ordered, ordered[1:])), ("two jobs trained at once", spans)
    numbers = [s for k, s, _, _ in there if k == "step"]
    assert sorted(set(numbers)) == list(range(1, max(numbers) + 1)), "a step was never trained"
    # `status` (plain) says what raced, which won and what was cancelled
    plain = run_cli("status", chain, "--plain", home=env["home"], env=env["extra"])
    assert "race: segment 0 raced on local, b:" in plain.stdout and "cancelled while pending" in plain.stdout, plain.stdout


def _state_here(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()


# ~250 s: CI's lane A would pass 30 minutes with it; run with CHAINRUN_SLOW=1 (tests/conftest.py). Its
# parts run in CI elsewhere: the race of segment 0 (above), the move after a cancelled pending successor
# (test_move_slurm.py), the raced successor's bookkeeping (tests/chain/test_site_race.py)
@pytest.mark.slow
def test_a_successor_raced_after_its_predecessor_ended_moves_the_chain_with_its_checkpoint(env, tmp_path):
    """`--policy reactive`: every successor is asked for once its predecessor ended, nothing live: raced.
    Segment 0: both racers started before the watcher looks (a tie): the preferred, local, is kept and b's
    cancelled after holding its nodes. While it trains another job queues for local's n4: segment 1's
    racer on local pends, b's starts and is kept, which is a move: local fenced, the final checkpoint
    copied and verified on b, then go.<G> there; the chain completes on b from the step local saved."""
    configure(env, SITES)
    script = tmp_path / "train.sh"
    script.write_text((Path(__file__).parents[2] / "templates" / "toy_train.sh").read_text())
    (tmp_path / "toy_trainer.py").write_text((Path(__file__).parents[2] / "templates" / "toy_trainer.py").read_text())
    p = run_cli("submit", str(script), "--cluster", "local,b", "--race", "--total", "3m", "--segment", "2m",
                "--signal", "USR2@40", "--policy", "reactive", "--json",
                "--", ONLY_N4, WHOLE, home=env["home"], cwd=tmp_path, env=env["extra"], timeout=600)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    chain, jobs = data["chain"], data["race"]
    blocker, watch = None, None
    try:
        wait_for("both racers of segment 0 to start", lambda: _state_here(jobs["local"]) == "RUNNING" and env["server"].ssh(
            f"squeue -h -j {jobs['b']} -o %T").stdout.strip() == "RUNNING", 180)
        watch = _watcher(env)
        wait_for("segment 0 kept", lambda: read(env, chain)[0].extra["race"].get("phase") == "won", 120, watch)
        # another user's job queues for local's n4 behind segment 0: segment 1's racer there will pend
        blocker = queue_on_n4()
        wait_for("the chain to move to b", lambda: read(env, chain)[0].cluster == "b", 600, watch)
        out, err = watch.communicate(timeout=900)
        assert watch.returncode == 0, err
    finally:
        if watch is not None and watch.poll() is None:
            watch.kill()
        if blocker:
            subprocess.run(["scancel", blocker], capture_output=True, timeout=60)
    st = status(env, chain)
    assert st["status"] == "COMPLETED", (st, out)
    c, segs, events = read(env, chain)
    text = "\n".join(f"{e.idx} {e.kind} {e.message}" for e in events)
    # segment 0: a tie, the preferred cluster kept, b's racer cancelled after holding its nodes
    first = c.extra["races_done"][0]
    assert first["idx"] == 0 and first["winner"] == "local" and first["held_twice_s"] > 0, c.extra
    assert f"segment 0 kept on local (job {jobs['local']}, started first, preferred of those started)" in text, text
    assert re.search(rf"racer on b \(job {jobs['b']}\) cancelled: segment 0 runs on local; it started before the "
                     r"watcher noticed and held its nodes \d+s", text), text
    # segment 1: raced, kept on b, a move
    assert segs[0].cluster == "local" and segs[0].outcome == "continue", (segs[0], text)
    s1 = segs[1]
    assert s1.cluster == "b" and s1.extra["move"]["phase"] == "done" and s1.extra["move"]["from"] == "local", s1.extra
    assert "segment 1 raced on local, b" in text and "segment 1 kept on b (job" in text, text
    raced1 = [r for r in c.extra.get("races_done", []) + [c.extra["race"]] if r.get("idx") == 1]
    assert raced1 and raced1[0].get("winner") == "b", c.extra
    gen = s1.extra["move"]["gen"]
    for said in (f"wrote moved.{gen} on local", "copied to b and verified", f"wrote go.{gen} on b",
                 "the chain moved from local to b"):
        assert said in text, (said, text)
    assert all(s.cluster == "b" for s in segs[1:]), text
    # the trainer's record on both clusters: one unbroken run, one job at a time, resumed from local's save
    a, b = data["sites"]
    here = steps(Path(a["checkpoint_dir"], "steps.log").read_text())
    there = steps(env["server"].ssh(f"cat {b['checkpoint_dir']}/steps.log").stdout)
    saved = [s for k, s, _, _ in here if k == "save"]
    first_b = [s for k, s, _, _ in there if k == "step"][0]
    assert saved and first_b == saved[-1] + 1, (saved, there[:3])
    assert {j for k, _, _, j in here if k == "step"} == {jobs["local"]}  # b's segment-0 racer trained nothing
    assert max(t for _, _, t, _ in here) < min(t for _, _, t, _ in there), "two jobs trained at once"
    trained = [s for k, s, _, _ in here + there if k == "step"]
    assert sorted(set(trained)) == list(range(1, max(trained) + 1)), "a step was never trained"


def test_cancelling_a_chain_while_it_races_cancels_every_racer_on_its_own_cluster(env, tmp_path):
    configure(env, SITES)
    script = tmp_path / "train.sh"
    script.write_text((Path(__file__).parents[2] / "templates" / "toy_train.sh").read_text())
    p = run_cli("submit", str(script), "--cluster", "local,b", "--race", "--total", "2m", "--signal", "USR2@40",
                "--policy", "lead", "--json", "--", ONLY_N4, "--hold", home=env["home"], cwd=tmp_path, env=env["extra"], timeout=600)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    chain, jobs = data["chain"], data["race"]
    st = status(env, chain)
    assert st["race"]["phase"] == "racing" and "racing segment 0 on local, b" in st["race_note"], st
    assert _state_here(jobs["local"]) == "PENDING"
    assert env["server"].ssh(f"squeue -h -j {jobs['b']} -o %T").stdout.strip() == "PENDING"
    q = run_cli("cancel", chain, home=env["home"], env=env["extra"], timeout=300)
    assert q.returncode == 0, q.stderr
    assert _state_here(jobs["local"]) in ("", "CANCELLED")
    assert env["server"].ssh(f"squeue -h -j {jobs['b']} -o %T").stdout.strip() in ("", "CANCELLED")
    c, segs, events = read(env, chain)
    assert c.status == "CANCELLED" and segs == [] and not c.extra["race"].get("winner"), c.extra
    assert all(r["outcome"] == "cancelled" for r in c.extra["race"]["racers"].values()), c.extra["race"]


def test_a_race_skips_a_cluster_where_the_chain_could_only_finish_later(env, tmp_path):
    """b declared 20 times slower: 2 minutes of work take it 40 there even started at once, against local's
    2 minutes after its wait (its node is free); so segment 0 races on local alone and an event says why."""
    configure(env, SITES + "pace = 0.05\n")
    script = tmp_path / "train.sh"
    script.write_text((Path(__file__).parents[2] / "templates" / "toy_train.sh").read_text())
    p = run_cli("submit", str(script), "--cluster", "local,b", "--race", "--total", "2m", "--signal", "USR2@40",
                "--policy", "lead", "--json", "--", ONLY_N4, "--hold", home=env["home"], cwd=tmp_path, env=env["extra"],
                timeout=600)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    chain, jobs = data["chain"], data["race"]
    try:
        assert list(jobs) == ["local"] and _state_here(jobs["local"]) == "PENDING", data
        c, segs, events = read(env, chain)
        race = c.extra["race"]
        assert race["sites"] == ["local"] and list(race["skipped"]) == ["b"], race
        said = [e.message for e in events if e.kind == "race"]
        assert any(m.startswith("not raced on b: done in ~") and "even starting now" in m for m in said), said
        mine = env["server"].ssh("squeue -h -o %j").stdout
        assert f"cr.{chain}." not in mine, mine  # nothing submitted on b
    finally:
        q = run_cli("cancel", chain, home=env["home"], env=env["extra"], timeout=300)
        assert q.returncode == 0, q.stderr


def test_a_racer_no_watcher_keeps_gives_its_nodes_back(env, tmp_path):
    """No watcher runs: local's racer starts, waits gated, and after CHAINRUN_RACE_KEEP (5 s here, from the
    submitting environment; 30 min by default) ends unstarted and leaves its node, long before its limit."""
    configure(env, SITES)
    script = tmp_path / "train.sh"
    script.write_text((Path(__file__).parents[2] / "templates" / "toy_train.sh").read_text())
    p = run_cli("submit", str(script), "--cluster", "local,b", "--race", "--total", "3m", "--segment", "2m",
                "--signal", "USR2@40", "--policy", "lead", "--json", "--", ONLY_N4, WHOLE, home=env["home"],
                cwd=tmp_path, env={**env["extra"], "CHAINRUN_RACE_KEEP": "5", "CHAINRUN_GATE_POLL": "2"}, timeout=600)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    chain, jobs = data["chain"], data["race"]
    try:
        c, _, _ = read(env, chain)
        outcome = Path(c.run_dir) / "control" / "seg-0.outcome"
        wait_for("local's racer to give up", lambda: outcome.exists() and _state_here(jobs["local"]) == "", 100)
        text = outcome.read_text()
        assert "outcome=unstarted" in text and "reason=racer not kept within 5s" in text, text
        acct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", jobs["local"], "-o", "State,ElapsedRaw"],
                              capture_output=True, text=True).stdout.split()
        state, elapsed = acct[0].split("|")
        assert state == "COMPLETED" and int(elapsed) < 60, acct  # its limit is 2 minutes
        steps = Path(c.checkpoint_dir) / "steps.log"
        assert not steps.exists() or f" {jobs['local']} " not in steps.read_text()  # it trained nothing
    finally:
        q = run_cli("cancel", chain, home=env["home"], env=env["extra"], timeout=300)
        assert q.returncode == 0, q.stderr
