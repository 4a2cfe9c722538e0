"""What a move costs, measured (issue 26): the checkpoint's size and the copy rate to a site, which the
mover records on the chain after a verified copy and the site decision then reads (site_plan.transfer_s);
the chain's seconds per step, read from its progress, by which the mover chooses between waiting for the
final checkpoint and resuming from the copy ahead (move_steps.resume_from)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from chainrun.chain import move_steps as ms
from chainrun.chain import planning, progress, site_plan, summary
from chainrun.chain.mover import Mover, costs, dest_pace
from chainrun.chain.site_pace import DECLARED, MEASURED, SitePace
from chainrun.chain.tick_context import TickContext
from chainrun.runner.local import LocalRunner
from chainrun.state.records import RUNNING, Chain, Segment
from tests.chain.test_site_pace import H, T0, chain, seg, tick

SIZE = 41943139  # the real test's checkpoint (tests/ssh/test_move_slurm.py): copied in 20.1 s
SECONDS = 20.1


def copied(step: int, size: int = SIZE, gen: int = 1) -> dict:
    return {"kind": "folder", "name": f"step-{step}.g{gen}", "generation": gen, "step": step, "files": 2,
            "bytes": size, "path": f"latest.g{gen}.json", "sha256": "0" * 64}


def harvest(mover: Mover, c: Chain, mv: dict, result: dict) -> None:
    """The mover's harvest of a finished copy thread, as its tick does it."""
    fut: Future = Future()
    fut.set_result(result)
    mover._jobs[(c.id, 3)] = fut
    mover._harvest(c, Segment(chain_id=c.id, idx=3, cluster="b"), mv, (c.id, 3))


def moving(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))  # no config.toml: nothing declared
    c = chain("a")
    cur = Segment(chain_id=c.id, idx=2, phase=RUNNING, start=T0, cluster=None)
    t = tick(tmp_path, c, [cur], {"a": 2, "b": 0})
    return c, cur, t, Mover(t.store, lambda n: None, clock=lambda: T0)


def test_a_verified_copy_records_the_size_and_rate_and_the_next_decision_weighs_them(tmp_path, monkeypatch):
    c, cur, t, mover = moving(tmp_path, monkeypatch)
    assert site_plan.transfer_s(c, "b") == site_plan.DEFAULT_TRANSFER_S  # nothing measured: 15 min
    mv = {"to": "b", "from": "a", "phase": ms.AHEAD}
    harvest(mover, c, mv, {"copied": copied(100), "copy_Bps": SIZE / SECONDS, "seconds": SECONDS})
    assert c.extra["checkpoint_bytes"] == SIZE
    assert c.extra["copy_Bps"] == {"a>b": pytest.approx(SIZE / SECONDS, rel=1e-6)}  # kept for the pair a>b
    assert site_plan.transfer_s(c, "b") == pytest.approx(SECONDS, rel=1e-6)
    t.store.save(c)  # the mover's tick saves the chain with the move: the keys live on in the store
    c = t.store.chain(c.id)
    assert c.extra["checkpoint_bytes"] == SIZE and site_plan.transfer_s(c, "b") == pytest.approx(SECONDS, rel=1e-6)
    # the watcher's next decision charges the measured 20 s, not the 15 min default (event and status --json)
    move = planning._where(t, c, cur, 20 * H, None, T0)
    assert move is not None and move.site == "b"
    est = {e["site"]: e for e in c.extra["site_choice"]["estimates"]}
    assert est["b"]["transfer_s"] == pytest.approx(SECONDS, abs=0.1) and est["a"]["transfer_s"] == 0.0
    said = [e.message for _, e in t.store.events(c.id, limit=10) if e.kind == "site"]
    assert said and "(start ~0 min, transfer 20 s)" in said[0], said
    assert c.extra["site_choice"]["transfers"] == {"b": {"transfer_s": 20.1, "from": "size over the rate measured a>b"}}


def test_the_rate_is_the_median_of_the_last_whole_copies_and_a_resumed_copy_only_updates_the_size(
        tmp_path, monkeypatch):
    c, _, _, mover = moving(tmp_path, monkeypatch)
    mv = {"to": "b", "from": "a", "phase": ms.AHEAD}
    for rate in (2e6, 20e6, 3e6):  # one copy unusually fast (a quiet link): the median does not follow it
        harvest(mover, c, mv, {"copied": copied(100), "copy_Bps": rate, "seconds": SIZE / rate})
    assert c.extra["copy_Bps"]["a>b"] == 3e6 and c.extra["copy_Bps_seen"]["a>b"] == [2e6, 20e6, 3e6]
    for _ in range(site_plan.COPY_RATES_KEPT):
        harvest(mover, c, mv, {"copied": copied(100), "copy_Bps": 1e6, "seconds": SIZE / 1e6})
    assert c.extra["copy_Bps"]["a>b"] == 1e6 and len(c.extra["copy_Bps_seen"]["a>b"]) == site_plan.COPY_RATES_KEPT
    # rsync resumed a cut copy: ckpt_copy gives no rate (part was sent before); the checkpoint grew
    harvest(mover, c, mv, {"copied": copied(200, size=2 * SIZE), "copy_Bps": None, "seconds": 3.0})
    assert c.extra["copy_Bps"]["a>b"] == 1e6 and c.extra["checkpoint_bytes"] == 2 * SIZE
    assert site_plan.transfer_s(c, "b") == pytest.approx(2 * SIZE / 1e6)


def test_the_size_is_known_from_a_copys_start_before_any_rate(tmp_path, monkeypatch):
    """The copy's manifest gives the checkpoint's size as soon as the copy starts: the next decision
    weighs that size at the default rate until the copy finishes and measures one."""
    c, _, _, mover = moving(tmp_path, monkeypatch)
    key = (c.id, 3)
    mover._progress[key] = {"state": "copying", "checkpoint_bytes": SIZE, "bytes_total": 2 * SIZE, "bytes_done": 5}
    mover._jobs[key] = Future()  # still running
    mv = {"to": "b", "from": "a", "phase": ms.AHEAD}
    mover._harvest(c, Segment(chain_id=c.id, idx=3, cluster="b"), mv, key)
    assert c.extra["checkpoint_bytes"] == SIZE and "copy_Bps" not in c.extra  # the legs' total is not the size
    assert site_plan.transfer_s(c, "b") == pytest.approx(SIZE / site_plan.DEFAULT_COPY_BPS)
    # the predecessor's final checkpoint, read before its copy: its size too
    harvest(mover, c, mv, {"final": copied(120, size=3 * SIZE)})
    assert c.extra["checkpoint_bytes"] == 3 * SIZE


def test_the_chains_pace_from_its_progress_sets_seconds_per_step(tmp_path):
    c = chain("a")
    c.run_dir = str(tmp_path / "run")
    (tmp_path / "run" / "control").mkdir(parents=True)
    s = Segment(chain_id=c.id, idx=2, phase=RUNNING, start=T0)
    t = TickContext(None, None, LocalRunner(), clock=lambda: T0 + 900)
    t.read_progress(c, s)  # no progress file (the contract is optional): nothing is made up
    assert "step_s" not in c.extra
    lines = "".join(progress.format_line(1000 + 15 * i, t=T0 + 30 * i) for i in range(20))  # 0.5 steps/s
    (tmp_path / "run" / "control" / "seg-2.progress.0.n1").write_text(lines)
    t.read_progress(c, s)
    assert c.extra["step_s"] == pytest.approx(2.0)
    assert costs(c, {"to": "b"})["step_s"] == pytest.approx(2.0)


def seen(step_s: float, rate: float, *, ahead: int, final: int, c: Chain | None = None,
         pace: SitePace | None = None) -> ms.Seen:
    """A fenced move whose predecessor released: the copy ahead verified at step ``ahead``, the final
    checkpoint at ``final`` (SIZE bytes), the costs as the mover reads them off the chain (``pace``: the
    new site's against the old; None: not known, 1.0)."""
    c = c or chain("a")
    c.extra.update({"step_s": step_s, "copy_Bps": {"a>b": rate}})
    return ms.Seen(successor=RUNNING, predecessor_live=False, released=True,
                   newest=ms.Checkpoint(1, final, SIZE), copied=ms.Checkpoint(1, ahead, SIZE), copying=False,
                   **costs(c, {"from": "a", "to": "b"}, pace))


def test_the_successor_resumes_from_the_older_copy_when_redoing_costs_less_than_waiting():
    rate = SIZE / SECONDS  # the final checkpoint's copy: 20.1 s
    # 5 steps since the copy ahead at 2 s a step: 10 s of training redone beats a 20 s wait
    got = seen(2.0, rate, ahead=100, final=105)
    assert ms.resume_from(got) == ms.Checkpoint(1, 100, SIZE)
    step = ms.next_step(ms.FENCED, got)
    assert step.phase == ms.GO and step.actions == [(ms.GO_AHEAD, ms.Checkpoint(1, 100, SIZE))]
    # 20 steps since: 40 s redone; waiting for the final checkpoint's 20 s copy costs less
    got = seen(2.0, rate, ahead=100, final=120)
    assert ms.resume_from(got) == ms.Checkpoint(1, 120, SIZE)
    step = ms.next_step(ms.FENCED, got)
    assert step.phase == ms.FENCED and step.actions == [(ms.COPY, ms.Checkpoint(1, 120, SIZE))]
    # a slow link (200 s for the final) makes the same 20 steps worth redoing
    assert ms.resume_from(seen(2.0, rate / 10, ahead=100, final=120)) == ms.Checkpoint(1, 100, SIZE)
    # no pace measured: the final checkpoint (nothing redone)
    assert ms.resume_from(seen(0.0, rate, ahead=100, final=101)) == ms.Checkpoint(1, 101, SIZE)


def test_a_moves_own_rate_comes_before_the_chains():
    c = chain("a")
    c.extra["copy_Bps"] = {"a>b": 1e6, "b>a": 9e9}
    assert costs(c, {"from": "a", "to": "b"})["throughput_bps"] == 1e6
    assert costs(c, {"from": "a", "to": "b", "copy_Bps": 4e6})["throughput_bps"] == 4e6
    assert costs(chain("a"), {"to": "b"}) == {"step_s": 0.0, "throughput_bps": 0.0, "pace": 1.0}


def test_the_redone_steps_cost_what_they_take_on_the_new_site_at_its_pace():
    """step_s is measured where the chain trained (a); the steps since the copy ahead are redone on b:
    each takes step_s / pace there (site_pace: pace = work per wall second on b over a's)."""
    rate = SIZE / SECONDS  # the final checkpoint's copy: 20.1 s
    # 5 steps at 2 s on a: 10 s; on b at 0.4 of a's pace they take 25 s, more than the 20 s wait
    slow = seen(2.0, rate, ahead=100, final=105, pace=SitePace(0.4, DECLARED))
    assert ms.resume_from(slow) == ms.Checkpoint(1, 105, SIZE)
    assert ms.resume_cost(slow).redo_s == pytest.approx(25.0)
    # 15 steps: 30 s on a, but b trains twice as fast: 15 s there beats the 20 s wait
    fast = seen(2.0, rate, ahead=100, final=115, pace=SitePace(2.0, MEASURED))
    assert ms.resume_from(fast) == ms.Checkpoint(1, 100, SIZE)
    assert ms.next_step(ms.FENCED, fast).actions == [(ms.GO_AHEAD, ms.Checkpoint(1, 100, SIZE))]
    assert ms.resume_from(seen(2.0, rate, ahead=100, final=115)) == ms.Checkpoint(1, 115, SIZE)  # at a's pace: 30 s
    # a pace that is no number leaves the cost unknown: the final checkpoint (nothing redone)
    assert ms.resume_from(seen(2.0, rate, ahead=100, final=101, pace=SitePace(0.0))) == ms.Checkpoint(1, 101, SIZE)


def test_the_moves_record_and_event_say_the_pace_the_redone_steps_were_weighed_at(tmp_path, monkeypatch):
    """The new site's pace as the site rule weighs it (measured > declared > 1.0), against the site the
    chain trains on; the choice is kept on the move (status --json: move.resume) and said once."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[clusters.b]\nhost = "b.example.org"\n[clusters.b.job]\npace = 0.4\n')
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    c = chain("a")
    mv = {"from": "a", "to": "b", "phase": ms.FENCED}
    assert dest_pace(c, [], mv) == SitePace(0.4, DECLARED)
    # measured: b's segments trained at 3 steps/s, a's at 6: b runs at half a's pace, whatever was declared
    segs = [seg(0, "b", sps=3.0, payload_after=0), seg(1, None, sps=6.0, payload_after=0)]
    pace = dest_pace(c, segs, mv)
    assert (pace.pace, pace.pace_from) == (pytest.approx(0.5), MEASURED)
    got = seen(2.0, SIZE / SECONDS, ahead=100, final=105, c=c, pace=pace)
    said = Mover._weighed(mv, got, pace, "b")
    assert mv["resume"] == {"ahead_step": 100, "final_step": 105, "step_s": 2.0, "pace": 0.5, "redo_s": 20.0,
                            "transfer_s": 20.1, "resume_step": 100, "pace_from": MEASURED}
    assert said == ("move to b: resume from step 100: redo 5 steps from the copy at step 100 (2 s a step where "
                    "it trained; pace 0.5 there, measured: 20 s) < wait 20.1 s for step 105's transfer"), said
    assert Mover._weighed(mv, got, pace, "b") == ""  # the same choice next tick: no new event
    assert "resuming from step 100 (redo from step 100: 20.0 s at pace 0.5 (measured); transfer of step 105: " \
           "20.1 s)" in summary.move_note(mv)  # status, while the move waits for its go-ahead
    # no choice to make (the copy ahead is the final checkpoint): nothing said, nothing kept anew
    same = seen(2.0, SIZE / SECONDS, ahead=105, final=105, c=c, pace=pace)
    assert Mover._weighed({}, same, pace, "b") == ""


def test_rates_are_kept_per_pair_of_sites_and_an_older_stores_per_destination_rate_still_counts(tmp_path, monkeypatch):
    """The transfer is the checkpoint's size over the throughput measured between the two sites: a copy
    from a into b says nothing of one from c into b, or of b back into a. A chain recorded before the
    pairs kept one rate per destination: it is read when no pair was measured (no migration)."""
    c, _, _, mover = moving(tmp_path, monkeypatch)
    c.extra["sites"] = ["a", "b", "c"]
    harvest(mover, c, {"to": "b", "from": "a", "phase": ms.AHEAD},
            {"copied": copied(100), "copy_Bps": SIZE / SECONDS, "seconds": SECONDS})
    assert set(c.extra["copy_Bps"]) == {"a>b"} and set(c.extra["copy_Bps_seen"]) == {"a>b"}
    assert site_plan.transfer_s(c, "b") == pytest.approx(SECONDS, rel=1e-6)  # from the chain's site, a
    assert site_plan.transfer_s(c, "b", src="c") == pytest.approx(SIZE / site_plan.DEFAULT_COPY_BPS)
    c.cluster = "b"  # the chain moved to b: a copy back to a is another link
    assert site_plan.transfer_s(c, "a") == pytest.approx(SIZE / site_plan.DEFAULT_COPY_BPS)
    assert costs(c, {"from": "b", "to": "a"})["throughput_bps"] == 0.0
    assert site_plan.transfer_sources(c, ["a", "b"]) == {
        "a": {"transfer_s": round(SIZE / site_plan.DEFAULT_COPY_BPS, 1), "from": "size over the default rate"}}
    # an older store: one rate per destination, read for any copy into it until that pair is measured
    old = chain("a")
    old.extra.update({"checkpoint_bytes": SIZE, "copy_Bps": {"b": 1e6}, "copy_Bps_seen": {"b": [1e6]}})
    assert site_plan.copy_rate(old, "a", "b") == (1e6, "b") and site_plan.transfer_s(old, "b") == SIZE / 1e6
    assert costs(old, {"from": "a", "to": "b"})["throughput_bps"] == 1e6
    said = site_plan.transfer_sources(old, ["b"])["b"]["from"]
    assert said == "size over the rate measured into b (kept per destination)", said
    site_plan.record_copy(old, "b", src="a", copy_Bps=4e6)
    assert site_plan.copy_rate(old, "a", "b") == (4e6, "a>b")  # the pair, measured now, comes first
    assert site_plan.copy_rate(old, "c", "b") == (1e6, "b")
