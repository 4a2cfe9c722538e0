"""One chain, two real clusters (issue 26): the chain moves to where it finishes first, with its checkpoint.

``local`` is this process's Slurm cluster, ``b`` a second cluster with its own ClusterName reached through
a real OpenSSH server (the fixtures of tests/ssh/test_sites_slurm.py). The chain's jobs may only use n4
on ``local``; once its segment 0 runs there, another user's job holds n4 for an hour after it (the
cluster is full for the chain), so Slurm's own estimate for a successor on ``local`` is an hour away and
on ``b`` now. The rule moves the chain: the successor is submitted on ``b``, gated; the driver fences
``local`` (moved.<G>), asks segment 0 to hand off, copies its final checkpoint, verifies it on ``b`` and
writes the go-ahead; the successor resumes there. Then ``local`` frees (the blocking job is cancelled)
and at the next boundary the rule keeps the chain on ``b`` (moving back would cost a transfer).

The watcher is killed (SIGKILL: no chance to finish anything) while a checkpoint copy runs, and started
again: the move goes on, nothing is lost and nothing is sent twice (one job per segment, one go-ahead).

Everything is read from the trainer's own record on both clusters: one unbroken run of steps, no two
jobs training at once, the successor resuming from the step segment 0 saved.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.ssh.conftest import TOY_DIR
from tests.ssh.test_sites_slurm import configure, env, second_cluster, site_b  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]

# local's checkpoints are 40 MiB and copies out of local go at 2 MiB/s: each copy takes ~20 s, long
# enough for the test to see one under way (the watcher saves its progress every tick) and kill the watcher
PAD_KIB, BWLIMIT_KIB = 40 << 10, 2 << 10
SITES = f"""
[clusters.b.sbatch]
partition = "long"

[clusters.b.job]
script = "{TOY_DIR}/toy_train.sh"

[copy.local]
bwlimit_kbps = {BWLIMIT_KIB}
"""
ONLY_N4 = "--exclude=n1,n2,n3"  # the chain's jobs: n4 alone (other tests' jobs may use n1-n3)
# ...and n4 whole: a successor cannot slip in beside its predecessor (backfill would let a 2-minute
# job run before an hour-long one that waits for the predecessor's end anyway)
WHOLE = "--exclusive"


def status(env, chain: str) -> dict:
    p = run_cli("status", chain, "--json", home=env["home"], env=env["extra"])
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["data"][0]


def read(env, chain: str):
    """The chain, its segments and its events, from the store (read beside the running watcher)."""
    from chainrun.state.store import Store

    store = Store(env["home"] / "state.sqlite")
    try:
        return store.chain(chain), store.segments(chain), [e for _, e in store.events(chain, limit=1000)]
    finally:
        store.close()


def queue_on_n4() -> str:
    """Another user's hour-long job for n4 of local (it runs once n4 is free); its job id."""
    return subprocess.run(["sbatch", "--parsable", "-J", "other-user", "-p", "long", "-w", "n4", "--exclusive", "-t",
                           "60", "--wrap", "sleep 3600"], capture_output=True, text=True,
                          check=True).stdout.strip().split(";")[0]


def wait_for(what: str, cond, timeout: float, watch: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if watch is not None and watch.poll() is not None:
            raise AssertionError(f"the watcher ended ({watch.returncode}) before {what}: {watch.stderr.read()}")
        time.sleep(1)
    raise AssertionError(f"timed out ({timeout:.0f}s) waiting for {what}")


def steps(text: str) -> list[tuple[str, int, float, str]]:
    """(kind, step, time, job) per whole line of a toy trainer's steps.log."""
    out = []
    for ln in text.splitlines()[: text.count("\n")]:
        kind, _seg, step, t, job, *_ = ln.split()
        out.append((kind, int(step), float(t), job))
    return out


def _watcher(env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "chainrun.cli.main", "watch", "--plain", "--interval", "3", "--until-done"],
        env={**os.environ, "CHAINRUN_HOME": str(env["home"]), **env["extra"]},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def _copy_running(env, chain: str) -> dict | None:
    """The copy progress of a move whose copy is sending bytes (as the watcher last saved it), else None."""
    for s in read(env, chain)[1]:
        cp = (s.extra.get("move") or {}).get("copy") or {}
        if cp.get("state") == "copying" and (cp.get("bytes_done") or 0) < (cp.get("bytes_total") or 0):
            return cp
    return None


def test_a_full_cluster_moves_the_chain_with_its_checkpoint_and_it_stays_once_the_first_frees(env, tmp_path):
    configure(env, SITES)
    script = tmp_path / "train.sh"
    script.write_text((Path(__file__).parents[2] / "templates" / "toy_train.sh").read_text()
                      .replace("exec python3", f"export TOY_CKPT_PAD_KIB={PAD_KIB}\nexec python3"))
    (tmp_path / "toy_trainer.py").write_text((Path(__file__).parents[2] / "templates" / "toy_trainer.py").read_text())
    p = run_cli("submit", str(script), "--cluster", "local,b", "--total", "4m", "--segment", "2m",
                "--signal", "USR2@40", "--policy", "lead", "--lead", "60s", "--site-margin", "5m", "--json",
                "--", ONLY_N4, WHOLE, home=env["home"], cwd=tmp_path, env=env["extra"], timeout=600)
    assert p.returncode == 0, p.stderr
    chain = json.loads(p.stdout)["data"]["chain"]
    blocker = None
    watch = _watcher(env)
    try:
        # segment 0 runs on n4 of local; then another job is queued for n4, for an hour after it
        wait_for("segment 0 to run", lambda: read(env, chain)[1][0].phase == "RUNNING", 300, watch)
        blocker = queue_on_n4()
        # a copy to b runs: the watcher is killed mid-copy, then started again
        copying = wait_for("a copy to b to run", lambda: _copy_running(env, chain), 420, watch)
        watch.kill()
        watch.wait(30)
        watch = _watcher(env)
        # the chain moves: the go-ahead written on b, then the row names b
        wait_for("the chain to move to b", lambda: read(env, chain)[0].cluster == "b", 420, watch)
        subprocess.run(["scancel", blocker], capture_output=True, timeout=60)  # local frees
        out, err = watch.communicate(timeout=900)
        assert watch.returncode == 0, err
    finally:
        if watch.poll() is None:
            watch.kill()
        if blocker:
            subprocess.run(["scancel", blocker], capture_output=True, timeout=60)
    st = status(env, chain)
    assert st["status"] == "COMPLETED", (st, out)
    _, segs, events = read(env, chain)
    text = "\n".join(f"{e.idx} {e.kind} {e.message}" for e in events)
    ran = [s for s in segs if s.outcome != "cancelled"]  # a successor held back on local was cancelled
    assert [s.cluster for s in ran][:2] == ["local", "b"], text
    assert all(s.cluster == "b" for s in ran[1:]), text  # it stayed on b once local freed
    mv = ran[1].extra["move"]
    assert mv["phase"] == "done" and mv["from"] == "local" and mv["to"] == "b", mv
    for said in (f"wrote moved.{mv['gen']} on local", "asked segment 0 on local to hand off", "copied to b and verified",
                 f"wrote go.{mv['gen']} on b", "the chain moved from local to b"):
        assert said in text, (said, text)
    assert segs[0].outcome == "handoff", (segs[0], text)
    # the watcher killed mid-copy lost nothing and sent nothing twice: the copy went on from a new watcher,
    # each checkpoint was verified on b once, one go-ahead, one job per segment
    assert copying["bytes_done"] < copying["bytes_total"], copying
    verified = re.findall(r"checkpoint step (\d+) copied to b and verified", text)
    assert verified and len(verified) == len(set(verified)), text
    assert text.count(f"wrote go.{mv['gen']} on b") == 1, text
    jobs = [(s.cluster, s.job_id) for s in segs if s.job_id]
    assert len(jobs) == len(set(jobs)), jobs
    # a successor held back on local was weighed against b by Slurm's own plan for it, and cancelled
    assert any(e.kind == "site" and "cancelled while pending on local (Slurm expects it to start at" in e.message
               for e in events), text
    # every later decision stayed on b, by the rule; the last ones saw local free: local is weighed at its
    # wait there and the checkpoint's transfer back (its measured size at the default rate: no copy went
    # that way), either after b or sooner by no more than the margin
    later = [e.message for e in events if e.kind == "site" and e.idx is not None and e.idx >= ran[1].idx]
    assert later and all(m.startswith("next segment: stay on b") for m in later), later
    assert re.search(r"(next local ~\d+ min|local ~\d+ min saves \d+ min, not more than the margin 5 min)$",
                     later[-1]), later
    # what the move measured is kept on the chain and weighed by the later decisions (not the 15 min default):
    # the checkpoint's size (its manifest), the rate local>b of a whole copy, the trainer's seconds per step
    c = read(env, chain)[0]
    sizes = {int(n) for n in re.findall(r"copied to b and verified \((\d+) bytes", text)}
    assert c.extra["checkpoint_bytes"] in sizes and c.extra["checkpoint_bytes"] > PAD_KIB << 10, (c.extra, sizes)
    if mv.get("copy_Bps"):  # a whole copy (one rsync resumed after the kill gives no rate)
        assert 0 < c.extra["copy_Bps"]["local>b"] <= 2 * (BWLIMIT_KIB << 10), c.extra  # kept for the link
    assert 0 < c.extra["step_s"] < 60, c.extra  # the toy reports its progress
    back = {e["site"]: e for e in st["site_choice"]["estimates"]}["local"]  # a copy back: size at the default rate
    assert 0 < back["transfer_s"] < 900, st["site_choice"]
    assert st["site_choice"]["transfers"]["local"]["from"] == "size over the default rate", st["site_choice"]
    # status shows where each segment ran and the move that brought the chain to b
    detail = {d["idx"]: d for d in st["segments_detail"]}
    assert detail[ran[1].idx]["cluster"] == "b" and "move local->b: done; resumed from step" in detail[ran[1].idx]["note"]
    assert st["sites"] == ["local", "b"] and st["site_choice"]["site"] == "b", st["site_choice"]
    # the trainer's record on both clusters: one run of steps, one job at a time, resumed from the save
    a, b = json.loads(p.stdout)["data"]["sites"]
    here = steps(Path(a["checkpoint_dir"], "steps.log").read_text())
    there = steps(env["server"].ssh(f"cat {b['checkpoint_dir']}/steps.log").stdout)
    saved = [s for k, s, _, _ in here if k == "save"]
    first_b = [s for k, s, _, _ in there if k == "step"][0]
    assert saved and first_b == saved[-1] + 1, (saved, there[:3])
    assert max(t for _, _, t, _ in here) < min(t for _, _, t, _ in there), "two jobs trained at once"
    trained = [s for k, s, _, _ in here + there if k == "step"]
    assert sorted(set(trained)) == list(range(1, max(trained) + 1)), "a step was never trained"
