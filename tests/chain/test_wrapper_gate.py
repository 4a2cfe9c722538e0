"""Moving between sites (issue 26, part 4): the wrapper's side, run for real in bash without Slurm (fast).

Two sites are two run folders, each with its own fake ``squeue`` (tests/chain/test_wrapper_ownership.py's
``Chain``): no file of one is seen by the other, as between clusters. The test plays the driver: it writes
``control/moved.<G>`` into the old site's control folder, the hand-off request, and ``control/go.<G>`` into
the new site's. Every payload logs its steps with its job id, so each test checks from that record that no
two jobs of the chain trained at once on either site. The same on real Slurm: tests/chain/test_wrapper_gate_slurm.py.
"""

from __future__ import annotations

import hashlib
import signal
import time
from pathlib import Path

import pytest

from chainrun.chain.contract import go_text, handoff_text, moved_text, parse_outcome
from tests.chain.test_wrapper_ownership import Chain

GATED = {"CHAINRUN_GATED": "1", "CHAINRUN_GATE_POLL": "1"}


@pytest.fixture
def sites(tmp_path):
    a, b = Chain(tmp_path / "a"), Chain(tmp_path / "b")
    yield a, b
    a.kill_all()
    b.kill_all()


def _ctl(site: Chain) -> Path:
    return site.run_dir / "control"


def _file(site: Chain, name: str) -> dict:
    p = _ctl(site) / name
    return parse_outcome(p.read_text()) if p.exists() else {}


def _owners(site: Chain) -> list[str]:
    return sorted(p.name for p in _ctl(site).glob("owner.*"))


def _steps_of(site: Chain, job: str) -> list[float]:
    return [t for _, j, t in site.steps() if j == job]


def _gens_of(site: Chain, job: str) -> set[str]:
    log = site.ckpt / "steps.log"
    return {ln.split()[3] for ln in log.read_text().splitlines() if ln.startswith(f"step {job} ")}


def _polls(site: Chain, seg: int) -> int:
    st = site.state(seg)
    return int(st["polls"]) if st.get("mode") == "gated" and st.get("polls", "").isdigit() else 0


def _wait_polls(site: Chain, seg: int, more: int = 2) -> None:
    """Until the gated segment has looked for its go-ahead ``more`` more times (each look is a decision:
    a check made after it that it does not train tests the protocol, not the machine's speed)."""
    start = _polls(site, seg)
    site.wait_for(lambda: _polls(site, seg) >= start + more, timeout=60,
                  what=f"segment {seg} to look {more} more times")


def _write(site: Chain, name: str, text: str) -> None:
    tmp = _ctl(site) / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(_ctl(site) / name)


def _manifest(site: Chain, text: str = "ckpt 1234 abcd\n") -> str:
    (site.ckpt / "MANIFEST").write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def _go(site: Chain, gen: int, sha: str | None = None, chain: str = "c1", seg: int | None = None) -> None:
    _write(site, f"go.{gen}", go_text(chain, gen, seg=seg, ckpt_gen=gen - 1, step=42,
                                      manifest="MANIFEST" if sha else None, manifest_sha256=sha, at=time.time()))


def _train(site: Chain, seg: int, job: str, **env: str) -> None:
    site.start(seg, job, **env)
    site.wait_for(lambda: site.training(job), what=f"job {job} to train")


def _stop(site: Chain, job: str) -> int:
    site.jobs[job].send_signal(signal.SIGUSR2)
    return site.finish(job)


def _never_two_at_once(*sites: Chain) -> None:
    windows = []
    for s in sites:
        windows += [(a, b, j) for j, (a, b) in s.training_windows().items()]
    windows.sort()
    for (_, ea, ja), (sb, _, jb) in zip(windows, windows[1:]):
        assert sb >= ea, f"jobs {ja} and {jb} trained at the same time ({ea - sb:.2f}s)"


def test_gated_segment_waits_for_its_go_ahead_then_claims_that_generation(sites):
    """The whole move: the successor on site b waits without training; moved.1 on site a does not stop the
    owner, which trains on until the driver asks it to hand off; it releases; the go-ahead on b lets the
    successor claim generation 1 there (b has no owner.0) and train."""
    a, b = sites
    _train(a, 0, "100")
    b.start(1, "201", **GATED)
    _wait_polls(b, 1)
    assert not b.training("201") and not _owners(b) and b.state(1)["phase"] == "waiting"
    _write(a, "moved.1", moved_text("c1", 1, to="b", at=time.time()))
    moved = time.time()
    a.wait_for(lambda: len([t for t in _steps_of(a, "100") if t > moved]) >= 5,
               what="the owner to train on after moved")
    assert _owners(a) == ["owner.0"] and a.jobs["100"].poll() is None
    _write(a, "handoff.0", handoff_text(time.time(), by="driver", seg=1))  # on the successor's behalf
    assert a.finish("100") == 0
    assert a.outcome(0)["outcome"] == "handoff" and _file(a, "released.0")
    assert not b.training("201")
    _go(b, 1, _manifest(b))
    b.wait_for(lambda: b.training("201"), what="the gated segment to train after its go-ahead")
    assert _owners(b) == ["owner.1"] and _file(b, "owner.1")["job"] == "201"
    assert _gens_of(b, "201") == {"1"}  # the payload trains as generation 1: above the copied checkpoint's 0
    st = b.state(1)
    assert st["phase"] == "training" and st["go"] == "1" and st["go_step"] == "42" and st["go_ckpt_gen"] == "0", st
    assert _stop(b, "201") == 0
    out = b.outcome(1)
    assert out["outcome"] == "continue" and out["go"] == "1" and out["handoff_mode"] == "gated", out
    assert min(_steps_of(b, "201")) > max(_steps_of(a, "100"))
    _never_two_at_once(a, b)


def test_gated_segment_without_a_go_ahead_ends_unstarted_on_its_signal(sites):
    """No go-ahead before its own limit: its signal ends the wait at once (the default 10 s poll is cut
    short), nothing is claimed, nothing trains, no retry is spent (unstarted)."""
    _, b = sites
    p = b.start(1, "301", CHAINRUN_GATED="1")
    b.wait_for(lambda: _polls(b, 1) >= 1, what="the gated segment to wait")
    p.send_signal(signal.SIGUSR2)
    assert b.finish("301") == 0
    out = b.outcome(1)
    assert out["outcome"] == "unstarted" and out["stopped_by"] == "USR2" and out["handoff_mode"] == "gated", out
    assert not _owners(b) and not b.steps() and not list(_ctl(b).glob("released.*"))
    assert "while waiting for the go-ahead" in (b.tmp / "job-301.out").read_text()


def test_a_go_ahead_for_another_chain_segment_or_a_changed_checkpoint_is_no_go_ahead(sites):
    _, b = sites
    b.start(1, "401", **GATED)
    _wait_polls(b, 1)
    _go(b, 1, chain="other-chain")
    b.wait_for(lambda: "does not name chain c1" in b.state(1).get("note", ""), what="the wrong chain to be noted")
    _wait_polls(b, 1)
    sha = _manifest(b)
    _manifest(b, "ckpt 1234 changed-after-the-check\n")  # the checkpoint changed after the driver verified it
    _go(b, 1, sha)
    b.wait_for(lambda: "the go-ahead says " + sha in b.state(1).get("note", ""), what="the checksum to be refused")
    _wait_polls(b, 1, 2)
    _go(b, 1, _manifest(b), seg=2)  # verified again, but for another segment
    b.wait_for(lambda: "is for segment 2" in b.state(1).get("note", ""), what="the other segment's go to be noted")
    _wait_polls(b, 1, 2)
    assert not b.training("401") and not _owners(b)
    _go(b, 1, _manifest(b), seg=1)  # this segment's
    b.wait_for(lambda: b.training("401"), what="the segment to train after a valid go-ahead")
    _stop(b, "401")


def test_moved_ends_a_waiting_local_successor_without_cutting_the_owner(sites):
    """The old site's successor, waiting for an owner that ignores the signal, stops waiting once moved.1
    is there: it never claims, never sends TERM or scancel, and its hand-off request stays (the owner is to
    release anyway). The owner trains on."""
    a, _ = sites
    _train(a, 0, "500", IGNORE_SIGNAL="1")
    a.start(1, "501", CHAINRUN_HANDOFF_TIMEOUT="600")
    a.wait_for(lambda: a.state(1).get("phase") == "waiting", what="the successor to wait")
    a.wait_asked("500")
    _write(a, "moved.1", moved_text("c1", 1, to="b"))
    assert a.finish("501", timeout=60) == 0
    out = a.outcome(1)
    assert out["outcome"] == "unstarted" and out["reason"].startswith("moved:") and out["moved"] == "1", out
    assert _owners(a) == ["owner.0"] and not (_ctl(a) / "cancel.0").exists() and (_ctl(a) / "handoff.0").exists()
    ended = time.time()
    a.wait_for(lambda: any(t > ended for t in _steps_of(a, "500")), what="the owner to train on")
    assert a.jobs["500"].poll() is None
    a.jobs["500"].send_signal(signal.SIGTERM)  # its limit
    a.finish("500")
    assert a.outcome(0)["outcome"] in ("continue", "handoff") and _file(a, "released.0")


def test_requeued_and_late_segments_on_the_old_site_train_nothing(sites):
    a, _ = sites
    _train(a, 0, "600")
    _write(a, "moved.1", moved_text("c1", 1, to="b"))
    _write(a, "handoff.0", handoff_text(time.time(), by="driver", seg=1))
    a.finish("600")
    assert a.outcome(0)["outcome"] == "handoff"
    (a.queue / "600").write_text("1")
    assert a.start(0, "600", SLURM_RESTART_COUNT="1").wait(30) == 0  # the predecessor, requeued after the move
    rerun = _file(a, "seg-0.rerun-1")
    assert rerun["outcome"] == "unstarted" and rerun["moved"] == "1" and "moved" in rerun["reason"], rerun
    assert a.outcome(0)["outcome"] == "handoff"  # the run that trained keeps the job's outcome
    assert a.start(2, "602").wait(30) == 0  # a late segment of the old site
    assert a.outcome(2)["outcome"] == "unstarted" and a.outcome(2)["moved"] == "1"
    assert _owners(a) == ["owner.0"] and set(a.training_windows()) == {"600"}


def test_a_claim_racing_the_move_is_given_back_untrained(sites):
    """The successor claims at the moment the driver writes moved.1 (its release check saw released.0, its
    last look at moved was before): after the claim it looks again, gives generation 1 back (released.1)
    and ends unstarted. Claim-then-look against the driver's write-then-look: one sees the other."""
    a, _ = sites
    _train(a, 0, "700", IGNORE_SIGNAL="1")
    a.start(1, "701", CHAINRUN_HANDOFF_TIMEOUT="600")
    a.wait_for(lambda: a.state(1).get("phase") == "waiting", what="the successor to wait")
    asked = a.asked("700", "running")
    a.wait_asked("700", after=asked)  # it just looked at moved and Slurm: the next look is 10 s away
    _write(a, "released.0", "job=700\n")  # as the owner would on exit; it is stopped below
    _write(a, "moved.1", moved_text("c1", 1, to="b"))
    assert a.finish("701", timeout=60) == 0
    a.jobs["700"].send_signal(signal.SIGTERM)
    a.finish("700")
    out = a.outcome(1)
    assert out["outcome"] == "unstarted" and out["moved"] == "1" and out["gen"] == "1", out
    assert _file(a, "owner.1")["job"] == "701" and _file(a, "released.1")["job"] == "701"
    assert not a.training("701")


def test_a_chain_moving_back_claims_its_go_generation_and_stale_segments_stay_out(sites):
    """Site a held generations 1-2 (moved here at 1), then the chain left at 3 (moved.3); it comes back at 5
    (go.5). Before go.5 a gated segment waits; a stale segment of the first stay never trains; the gated one
    claims 5; a later local successor takes 6 from it by the usual hand-off."""
    a, _ = sites
    for g, seg in ((1, 1), (2, 2)):
        _write(a, f"owner.{g}", f"job=8{g}\nrestart=0\nseg={seg}\n")
        _write(a, f"released.{g}", f"job=8{g}\n")
    _write(a, "go.1", go_text("c1", 1))
    _write(a, "moved.3", moved_text("c1", 3, to="b"))
    a.start(6, "806", **GATED)
    _wait_polls(a, 6)
    assert a.start(2, "802").wait(30) == 0  # a late copy of segment 2: the site is closed
    assert a.outcome(2)["moved"] == "3"
    _go(a, 5)
    assert a.start(3, "803").wait(30) == 0  # not gated, would claim 3 < 5: stale
    assert a.outcome(3)["outcome"] == "unstarted" and a.outcome(3)["reason"].startswith("stale"), a.outcome(3)
    a.wait_for(lambda: a.training("806"), what="the gated segment to claim 5")
    assert _file(a, "owner.5")["job"] == "806" and _gens_of(a, "806") == {"5"}
    a.start(7, "807")  # the next segment on this site: the usual protocol
    a.wait_for(lambda: a.training("807"), what="the local successor to take over")
    assert _file(a, "owner.6")["job"] == "807" and a.outcome(6)["outcome"] == "handoff"
    _stop(a, "807")
    assert _owners(a) == ["owner.1", "owner.2", "owner.5", "owner.6"]
    _never_two_at_once(a)


def test_stale_gated_rerun_on_a_site_the_chain_left_ends_at_once(sites):
    """The segment that moved to b, requeued after the chain moved on from b: it does not wait for a
    go-ahead that is not its own (that would hold an allocation to its limit), it ends unstarted."""
    _, b = sites
    _go(b, 1)
    _write(b, "owner.1", "job=901\nrestart=0\nseg=1\n")
    _write(b, "released.1", "job=901\n")
    _write(b, "moved.3", moved_text("c1", 3, to="a"))
    (b.queue / "901").write_text("1")
    assert b.start(1, "901", SLURM_RESTART_COUNT="1", **GATED).wait(30) == 0
    out = _file(b, "seg-1.outcome")
    assert out["outcome"] == "unstarted" and out["reason"].startswith("superseded"), out
    assert _owners(b) == ["owner.1"] and not b.steps()


def test_owner_is_fenced_by_a_generation_claimed_by_a_go_ahead(sites):
    """A go-ahead may skip numbers (the generation comes from the other site): the owner's fencing looks for
    any later generation, not only G+1 (a run Slurm lost on the site the chain moves back to)."""
    a, _ = sites
    _train(a, 0, "950", IGNORE_SIGNAL="1")
    _write(a, "owner.4", "job=954\nseg=4\n")
    claimed = time.time()
    a.wait_for(lambda: a.jobs["950"].poll() is not None, timeout=15, what="the fenced owner to end")
    assert max(_steps_of(a, "950")) < claimed + 2 + 1  # one monitor period (2 s) + one step
    fenced = _file(a, "seg-0.fenced")
    assert fenced["by_job"] == "954" and fenced["by_gen"] == "4", fenced


def test_race_of_segment_0_only_the_racer_given_go_0_trains_and_a_withdrawn_go_0_frees_the_site(sites):
    """--race (chain/site_race.py), the wrapper's side: segment 0 gated on both sites. Neither trains until
    the driver's go.0 (seg=0, no manifest: nothing to resume from) on one site; that one claims generation
    0 there; the other never claims. A go.0 left by a kept racer that ended before training would make a
    later non-gated segment end `stale`: once the driver removes it, that segment claims generation 0."""
    a, b = sites
    a.start(0, "400", **GATED)
    b.start(0, "500", **GATED)
    _wait_polls(a, 0)
    _wait_polls(b, 0)
    assert not a.training("400") and not b.training("500") and not _owners(a) and not _owners(b)
    _go(b, 0, seg=0)
    b.wait_for(lambda: b.training("500"), what="the kept racer to train after go.0")
    assert _owners(b) == ["owner.0"] and _gens_of(b, "500") == {"0"}
    _wait_polls(a, 0)  # the other racer looked again after b trained: it still waits, claims nothing
    assert not a.training("400") and not _owners(a)
    a.jobs["400"].send_signal(signal.SIGTERM)  # the driver's scancel
    assert a.finish("400") == 0 and a.outcome(0)["outcome"] == "unstarted"
    assert _stop(b, "500") == 0 and b.outcome(0)["go"] == "0"
    _never_two_at_once(a, b)
    # a kept racer that ended before it trained: its go.0 stays, and a later segment there cannot claim
    _go(a, 0, seg=0)
    a.start(1, "401")
    assert a.finish("401") == 0
    assert a.outcome(1)["reason"].startswith("stale: generation 0 moves here") and not _owners(a)
    (_ctl(a) / "go.0").unlink()  # the driver withdraws it (race_driver.Race._withdraw)
    _train(a, 2, "402")
    assert _owners(a) == ["owner.0"] and _file(a, "owner.0")["job"] == "402"


def test_a_racer_not_kept_in_time_gives_its_nodes_back_and_a_kept_one_waits_on(sites):
    """--race with the watcher down: a racer (``gated race``) that no watcher kept (control/kept.<job>)
    within CHAINRUN_RACE_KEEP of its start ends unstarted, training nothing, instead of holding its nodes
    to its limit. A kept one waits on for its go-ahead (a move's copy may take long), and a gated segment
    that is not a racer (a move's successor) never gives up this way."""
    a, b = sites
    race = {"CHAINRUN_GATE_POLL": "1", "CHAINRUN_RACE_KEEP": "3"}
    t0 = time.time()
    a.start(0, "600", args=("gated", "race"), **race)
    b.start(0, "700", args=("gated", "race"), **race)
    _write(b, "kept.700", "chain=c1\nseg=0\ngen=0\n")  # the watcher kept b's racer
    mover = b.start(1, "701", args=("gated",), **race)  # a move's successor: gated, not a racer
    assert a.finish("600") == 0 and time.time() - t0 >= 3
    out = a.outcome(0)
    assert out["outcome"] == "unstarted" and out["race_keep"] == "3" and out["handoff_mode"] == "gated", out
    assert out["reason"] == "racer not kept within 3s (is the watcher running?): giving its nodes back", out
    assert not _owners(a) and not a.steps()
    b.wait_for(lambda: time.time() - t0 > 5, timeout=10, what="the keep bound to pass")
    _wait_polls(b, 0)
    _wait_polls(b, 1)
    assert b.jobs["700"].poll() is None and mover.poll() is None and not b.training("700") and not _owners(b)
    _go(b, 0, seg=0)
    b.wait_for(lambda: b.training("700"), what="the kept racer to train after go.0")
    assert _stop(b, "700") == 0 and b.outcome(0)["go"] == "0"
    mover.send_signal(signal.SIGUSR2)
    assert b.finish("701") == 0 and b.outcome(1)["outcome"] == "unstarted" and b.outcome(1)["stopped_by"] == "USR2"
    _never_two_at_once(a, b)
