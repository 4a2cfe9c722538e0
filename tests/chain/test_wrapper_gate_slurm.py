"""Moving between clusters (issue 26, part 4): the wrapper's side on the real local Slurm.

Two sites are two run folders (two control folders, two checkpoint folders) of one chain on the test
cluster: a wrapper sees only its own folder, as on two clusters without a shared filesystem. The test plays
the driver the way docs/remote-clusters.md ("Moving between clusters: never two copies") says it acts:
``moved.1`` into the old site's control folder first, then the hand-off request on the successor's behalf,
the release awaited, the checkpoint copied (staged under a partial name, then renamed) with a manifest,
and only then ``go.1`` into the new site's control folder. Segments are submitted with sbatch the way the
watcher does it (tests/chain/test_wrapper_field_slurm.py's ``FieldChain``: ``--signal=B:USR2@N``,
``--open-mode=append``), and everything is judged from the bash trainer's own per-step record of both
sites (job id, Slurm's restart count, generation, time): no two runs trained at once, and each resumed from
the last checkpoint saved before it, whichever site saved it.

The three scenarios run side by side: about 30 s together on an idle test cluster, at most about 90 s
(the gated segment left without a go-ahead lives until its 1-minute limit's signal, which Slurm sends
20-50 s before the limit).
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

import pytest

from chainrun.chain.contract import go_text, handoff_text, moved_text
from tests.chain.test_wrapper_field_slurm import FieldChain, _sacct, _stop, _trains
from tests.reliability import harness as h

pytestmark = pytest.mark.slurm

GATED = "CHAINRUN_GATED=1,CHAINRUN_GATE_POLL=3"
JOBS: list[str] = []  # every job of the module, cancelled at its end whatever happened


class TwoSites:
    """One chain on two sites: ``a`` (where it trains first) and ``b`` (where it moves)."""

    def __init__(self, base: Path, name: str):
        self.a, self.b = FieldChain(base / "a", name), FieldChain(base / "b", name)

    def records(self) -> list[tuple]:
        return sorted(self.a.records() + self.b.records(), key=lambda r: r[5])

    def describe(self) -> str:
        return f"site a: {self.a.describe()}\nsite b: {self.b.describe()}"

    def submit(self, site: FieldChain, seg: int, **kw) -> str:
        job = site.submit(seg, **kw)
        JOBS.append(job)
        return job

    def assert_alone_and_continuous(self) -> None:
        FieldChain.assert_alone_and_continuous(self)  # the same judge over both sites' records


def _write(folder: Path, name: str, text: str) -> None:
    """As the driver writes a control file: whole, under a temporary name, then renamed."""
    tmp = folder / f".{name}.partial"
    tmp.write_text(text)
    tmp.rename(folder / name)


def _polls(fc: FieldChain, seg: int) -> int:
    st = fc.file(f"seg-{seg}.state")
    return int(st["polls"]) if st.get("mode") == "gated" and st.get("polls", "").isdigit() else 0


def _owners(fc: FieldChain) -> list[str]:
    return sorted(p.name for p in fc.ctl.glob("owner.*"))


def _move(base: Path) -> dict:
    """Segment 0 trains on site a; segment 1, gated, waits on site b; the driver moves the chain to b
    at generation 1; then the old owner is requeued and a late segment starts on a: neither trains."""
    s = TwoSites(base, "move")
    a, b = s.a, s.b
    j0 = s.submit(a, 0)
    _trains(a, j0, 6)
    j1 = s.submit(b, 1, env=GATED)
    b.wait_for(lambda: _polls(b, 1) >= 1, 180, "the gated segment to wait for its go-ahead")
    looked = _polls(b, 1)
    b.wait_for(lambda: _polls(b, 1) >= looked + 2, 120, "the gated segment to look twice more")
    waited = {"steps": b.steps_of(j1), "owners": _owners(b), "state": b.file("seg-1.state")}
    # the driver, 1: moved.1 on the old site; the owner trains on until asked
    _write(a.ctl, "moved.1", moved_text("move", 1, to="b", at=time.time()))
    before = len(a.steps_of(j0))
    _trains(a, j0, before + 4)
    owners_after_moved = _owners(a)
    # 2: the hand-off request on the successor's behalf; the owner saves and releases
    _write(a.ctl, "handoff.0", handoff_text(time.time(), by="driver", seg=1))
    a.wait_for(lambda: (a.ctl / "released.0").exists(), 180, "the owner to release")
    owners_at_release = _owners(a)
    trained_before_go = b.steps_of(j1)
    # 3: the checkpoint follows (part 2 copies it over SSH), 4: the go-ahead on the new site
    ckpt = _copy_and_go(s, "move")
    _trains(b, j1, 3)
    # the old owner requeued after the move, and a late segment of the old site
    a.wait_for(lambda: a.ended(j0), 120, f"job {j0} to end after its hand-off")
    subprocess.run(["scontrol", "requeue", j0], check=True, capture_output=True, timeout=60)
    a.release_requeued(j0)
    a.wait_for(lambda: a.file("seg-0.rerun-1").get("restart") == "1" and a.ended(j0), 240,
               f"the rerun of {j0} to end")
    j2 = s.submit(a, 2)
    a.wait_for(lambda: a.ended(j2), 180, f"the late segment {j2} to end")
    j1_state = b.state(j1)
    _stop(b, j1)
    return {"s": s, "j0": j0, "j1": j1, "j2": j2, "waited": waited, "before": before,
            "owners_after_moved": owners_after_moved, "owners_at_release": owners_at_release, "ckpt": ckpt,
            "trained_before_go": trained_before_go, "j1_state": j1_state, "acct2": _sacct(j2, "State,ExitCode"),
            "out0": (a.base / "seg-0.out").read_text()}


def _copy_and_go(s: TwoSites, name: str) -> int:
    """The driver's last steps once the old site's owner released: the checkpoint copied (staged under a
    partial name, renamed) with its manifest, and the go-ahead for generation 1 on the new site."""
    ckpt = (s.a.ckpt / "ckpt").read_text()
    _write(s.b.ckpt, "ckpt", ckpt)
    manifest = f"ckpt {hashlib.sha256(ckpt.encode()).hexdigest()} {len(ckpt)}\n"
    _write(s.b.ckpt, "MANIFEST", manifest)
    _write(s.b.ctl, "go.1", go_text(name, 1, ckpt_gen=0, step=int(ckpt), manifest="MANIFEST",
                                    manifest_sha256=hashlib.sha256(manifest.encode()).hexdigest(), at=time.time()))
    return int(ckpt)


def _requeued_mid_move(base: Path) -> dict:
    """The owner is requeued (as by a node failure or preemption) after moved.1, before the driver asked it
    to hand off: its run saves on TERM and releases, its rerun claims nothing; the driver goes on from that
    release and the gated segment resumes from the checkpoint saved on TERM."""
    s = TwoSites(base, "midmove")
    a, b = s.a, s.b
    j0 = s.submit(a, 0)
    _trains(a, j0, 6)
    j1 = s.submit(b, 1, env=GATED)
    b.wait_for(lambda: _polls(b, 1) >= 1, 180, "the gated segment to wait for its go-ahead")
    _write(a.ctl, "moved.1", moved_text("midmove", 1, to="b", at=time.time()))
    _trains(a, j0, len(a.steps_of(j0)) + 2)
    subprocess.run(["scontrol", "requeue", j0], check=True, capture_output=True, timeout=60)
    a.wait_for(lambda: (a.ctl / "released.0").exists(), 180, "the requeued owner's run to release")
    ckpt = _copy_and_go(s, "midmove")
    a.release_requeued(j0)
    _trains(b, j1, 3)
    a.wait_for(lambda: a.file("seg-0.rerun-1").get("restart") == "1" and a.ended(j0), 240, f"the rerun of {j0} to end")
    j1_state = b.state(j1)
    _stop(b, j1)
    return {"s": s, "j0": j0, "j1": j1, "ckpt": ckpt, "j1_state": j1_state}


def _no_go(base: Path) -> dict:
    """A gated segment whose go-ahead never comes: a 1-minute limit, the signal 20 s before it."""
    fc = FieldChain(base, "nogo", signal_lead=20)
    j = fc.submit(1, minutes=1, env=GATED)
    JOBS.append(j)
    fc.wait_for(lambda: _polls(fc, 1) >= 1, 180, "the gated segment to wait")
    fc.wait_for(lambda: fc.ended(j), 240, "the gated segment to end at its limit")
    return {"fc": fc, "j": j, "acct": _sacct(j, "State,ExitCode,ElapsedRaw"), "out": (base / "seg-1.out").read_text()}


SCENARIOS = {"move": _move, "midmove": _requeued_mid_move, "nogo": _no_go}


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    try:
        yield h.run_side_by_side([SCENARIOS], tmp_path_factory, "CHAINRUN_GATE_SCENARIOS")
    finally:
        if JOBS:
            subprocess.run(["scancel", *JOBS], capture_output=True, timeout=60)


def _ok(res: dict) -> dict:
    assert "error" not in res, res.get("error")
    return res


def test_gated_segment_waits_then_trains_from_the_moved_checkpoint(runs):
    res = _ok(runs["move"])
    s, j1 = res["s"], res["j1"]
    waited = res["waited"]
    assert not waited["steps"] and not waited["owners"], waited  # it looked three times and trained nothing
    assert waited["state"]["phase"] == "waiting", waited["state"]
    assert not res["trained_before_go"]  # nor during the move, before its go-ahead
    assert _owners(s.b) == ["owner.1"] and s.b.file("owner.1")["job"] == j1
    resume = next(r for r in s.b.records() if r[0] == "resume" and r[2] == j1)
    assert resume[1] == res["ckpt"] and resume[4] == "1", resume  # from the copied checkpoint, as generation 1
    assert res["j1_state"] == "RUNNING"  # the requeued owner and the late segment of site a left it alone
    out1 = s.b.file("seg-1.outcome")
    assert out1["outcome"] == "continue" and out1["go"] == "1" and out1["go_step"] == str(res["ckpt"]), out1
    s.assert_alone_and_continuous()


def test_owner_trains_on_after_moved_until_asked_and_releases(runs):
    res = _ok(runs["move"])
    a, j0 = res["s"].a, res["j0"]
    assert res["owners_after_moved"] == ["owner.0"] and res["owners_at_release"] == ["owner.0"]
    assert len([r for r in a.records() if r[0] == "step" and r[2] == j0 and r[3] == 0]) >= res["before"] + 4
    out0 = a.file("seg-0.outcome")
    assert out0["outcome"] == "handoff" and out0["restart"] == "0", out0
    saved = [r for r in a.records() if r[0] == "saved" and r[2] == j0]
    assert saved and saved[-1][1] == res["ckpt"]  # its save on the hand-off is the checkpoint that moved


def test_requeued_and_late_segments_of_the_old_site_train_nothing(runs):
    res = _ok(runs["move"])
    a, j0, j2 = res["s"].a, res["j0"], res["j2"]
    rerun = a.file("seg-0.rerun-1")
    assert rerun["outcome"] == "unstarted" and rerun["moved"] == "1" and rerun["reason"].startswith("moved:"), rerun
    late = a.file("seg-2.outcome")
    assert late["outcome"] == "unstarted" and late["moved"] == "1" and late["job"] == j2, late
    assert res["acct2"]["State"] == "COMPLETED", res["acct2"]
    assert _owners(a) == ["owner.0"]  # neither claimed anything on the old site
    assert not [r for r in a.records() if (r[2], r[3]) in ((j0, 1), (j2, 0))]
    assert "handed off" in res["out0"] and "moved to another site" in res["out0"], res["out0"]  # one log, both runs


def test_owner_requeued_during_the_move_saves_and_its_rerun_trains_nothing(runs):
    res = _ok(runs["midmove"])
    s, j0, j1 = res["s"], res["j0"], res["j1"]
    a, b = s.a, s.b
    out0 = a.file("seg-0.outcome")
    assert out0["outcome"] == "continue" and out0["signaled"] == "1" and out0["restart"] == "0", out0  # saved on TERM
    rerun = a.file("seg-0.rerun-1")
    assert rerun["outcome"] == "unstarted" and rerun["moved"] == "1", rerun
    assert _owners(a) == ["owner.0"] and not a.steps_of(j0, restart=1)
    saved = [r for r in a.records() if r[0] == "saved" and r[2] == j0]
    resume = next(r for r in b.records() if r[0] == "resume" and r[2] == j1)
    assert saved[-1][1] == res["ckpt"] == resume[1], (saved[-1], resume)
    assert res["j1_state"] == "RUNNING"
    s.assert_alone_and_continuous()


def test_gated_segment_without_its_go_ahead_ends_unstarted_at_its_limit(runs):
    res = _ok(runs["nogo"])
    fc = res["fc"]
    out = fc.file("seg-1.outcome")
    assert out["outcome"] == "unstarted" and out["handoff_mode"] == "gated", out
    assert out["stopped_by"] in ("USR2", "TERM"), out  # its signal; TERM if Slurm's limit came first
    assert not fc.records() and not _owners(fc) and not list(fc.ctl.glob("released.*"))
    assert res["acct"]["State"] in ("COMPLETED", "TIMEOUT"), res["acct"]
    assert "while waiting for the go-ahead" in res["out"], res["out"]
