"""--race (chain/site_race.py; its driver chain/race_driver.py): which racer of segment 0 is kept, ties, what
is cancelled, and the driver's order (the winner recorded before its go-ahead; the go-ahead on the winner's
site only). Fast: a real store, each site a small stand-in for its Slurm client and runner. The real thing,
on two Slurm clusters: tests/ssh/test_race_slurm.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chainrun.chain import race_driver, site_race
from chainrun.chain.planning import plan
from chainrun.errors import SlurmError
from chainrun.state.records import ACTIVE, CANCELLED, CANCELLED_OUT, ENDED, PENDING, RUNNING, Chain, ChainSite
from chainrun.state.store import Store


def test_the_first_started_is_kept_and_a_tie_goes_to_the_preferred_site():
    order = ["a", "b", "c"]
    assert site_race.winner({"a": {"phase": PENDING}, "b": {"phase": PENDING}}, order) is None
    assert site_race.winner({"a": {"phase": PENDING}, "b": {"phase": RUNNING}}, order) == "b"
    assert site_race.winner({"a": {"phase": RUNNING}, "b": {"phase": RUNNING}}, order) == "a"  # tie: --cluster order
    assert site_race.winner({"c": {"phase": RUNNING}, "b": {"phase": RUNNING}}, order) == "b"
    assert site_race.winner({"a": {"phase": ENDED}, "c": {"phase": RUNNING}}, order) == "c"


def test_every_live_racer_but_the_winner_is_cancelled_and_all_of_them_without_one():
    racers = {"a": {"phase": RUNNING}, "b": {"phase": PENDING}, "c": {"phase": ENDED}}
    race = {"phase": site_race.WON, "winner": "a", "sites": ["a", "b", "c"], "racers": racers}
    assert site_race.to_cancel(race) == ["b"]  # c ended by itself: nothing to cancel
    assert site_race.to_cancel({**race, "phase": site_race.RACING, "winner": None}) == []  # b is not the winner
    assert site_race.to_cancel({**race, "phase": site_race.NONE_STARTED, "winner": None}) == ["a", "b"]
    assert site_race.held_s({"start": 100.0}, 160.0) == 60.0 and site_race.held_s({}, 160.0) == 0.0


# ------------------------------------------------------------------ the driver, on stand-ins
class Site:
    """One cluster: its queue (what squeue shows), sacct, scancel and the files written there."""

    def __init__(self, name: str) -> None:
        self.name, self.rows, self.cancelled, self.files, self.fail_cancel = name, {}, [], {}, ""
        self.names: set[str] = set()
        self.submitted: list[tuple[list, list]] = []
        self.slurm = SimpleNamespace(accounting=lambda ids, since=None: [], cancel=self._cancel, submit=self._submit,
                                     reservations=lambda: [])
        self.runner = SimpleNamespace(write_file=lambda path, text, mode: self.files.__setitem__(path, text),
                                      run=self._run)

    def _submit(self, path, args, script_args=()):
        self.submitted.append((list(args), list(script_args)))
        job = f"{self.name}{len(self.submitted)}"
        self.show(job, "PENDING")
        return job, None

    def _run(self, argv, timeout):
        if argv[:2] == ["rm", "-f"]:
            self.files.pop(argv[-1], None)
        if argv[:2] == ["ls", "-1"]:  # the control folder: the files written there, and those given
            names = self.names | {f.rsplit("/", 1)[1] for f in self.files}
            return SimpleNamespace(ok=True, stdout="\n".join(sorted(names)))
        return SimpleNamespace(ok=True)

    def _cancel(self, ids):
        if self.fail_cancel:
            return {j: self.fail_cancel for j in ids}
        self.cancelled += list(ids)
        for j in ids:
            self.rows.pop(j, None)
        return {}

    def show(self, job: str, state: str, start: float | None = None) -> None:
        self.rows[job] = SimpleNamespace(job_id=job, name="", state=state, start=start, end=None)


def _racing(store, cid="r-0001", jobs=("11", "21"), submit=1.0):
    """A chain racing segment 0 on a and b, its racers pending there as jobs ``jobs``."""
    c = Chain(id=cid, name="r", cluster="a", script="/a/s", workdir="/a", run_dir="/a/run", checkpoint_dir="/a/ck",
              total_s=7200, segment_s=3600, policy="lead", lead_s=600, signal="USR2", signal_lead_s=60, retries=1,
              sbatch_args=[], partition="p", created=1.0,
              extra={"sites": ["a", "b"], "race": {"phase": site_race.RACING, "idx": 0, "sites": ["a", "b"], "racers": {
                  n: {"phase": PENDING, "job_id": j, "intent_at": submit, "submit": submit, "time_limit_s": limit}
                  for n, j, limit in (("a", jobs[0], 3600), ("b", jobs[1], 3000))}}})
    store.add_chain(c, [ChainSite(c.id, n, i, f"/{n}", f"/{n}/run", f"/{n}/ck", f"/{n}/s", [], {"segment_s": 3600})
                        for i, n in enumerate(["a", "b"])])


@pytest.fixture
def race(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    _racing(store)
    c = store.chain("r-0001")
    sites = {"a": Site("a"), "b": Site("b")}
    for s, j in (("a", "11"), ("b", "21")):
        sites[s].show(j, "PENDING")
    clock = [100.0]
    drv = race_driver.Race(store, lambda n: sites[n], lambda n: list(sites[n].rows.values()), clock=lambda: clock[0])
    yield SimpleNamespace(store=store, sites=sites, drv=drv, clock=clock, id=c.id)
    store.close()


def test_nothing_is_kept_while_every_racer_pends_and_planning_leaves_the_chain_alone(race):
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["phase"] == site_race.RACING and race.store.segments(c.id) == []
    assert race.sites["a"].files == {} and race.sites["b"].files == {}  # no go-ahead anywhere
    assert race.sites["a"].cancelled == [] and race.sites["b"].cancelled == []
    t = SimpleNamespace(clock=lambda: 100.0)  # planning returns before reading anything else of the tick
    plan(t, c, [], SimpleNamespace(submitted=0))


def test_the_racer_that_started_is_kept_on_its_site_and_the_pending_one_cancelled(race):
    race.sites["b"].show("21", "RUNNING", start=90.0)
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["phase"] == site_race.WON and c.extra["race"]["winner"] == "b"
    # kept first (the racer no longer gives its nodes back when not kept in time), then its go-ahead
    assert list(race.sites["b"].files) == ["/b/run/control/kept.21", "/b/run/control/go.0"] and race.sites["a"].files == {}
    assert "seg=0" in race.sites["b"].files["/b/run/control/go.0"]
    seg, = race.store.segments(c.id)
    assert (seg.idx, seg.job_id, seg.cluster, seg.phase, seg.start, seg.time_limit_s) == (0, "21", "b", RUNNING, 90.0, 3000)
    assert (c.cluster, c.run_dir) == ("b", "/b/run")  # the chain's row takes the winner's site
    assert race.sites["a"].cancelled == ["11"] and race.sites["b"].cancelled == []
    a = c.extra["race"]["racers"]["a"]
    assert (a["phase"], a["outcome"], a["held_s"]) == (ENDED, CANCELLED_OUT, 0.0)
    assert not site_race.to_cancel(c.extra["race"])
    note = site_race.summary(c.extra["race"])
    assert "b job 21 started first: kept as segment 0" in note and "a job 11 cancelled while pending" in note


def test_both_started_by_the_same_tick_the_preferred_is_kept_the_other_held_its_nodes(race):
    race.sites["a"].show("11", "RUNNING", start=80.0)
    race.sites["b"].show("21", "RUNNING", start=40.0)  # earlier, but seen on the same tick: the tie rule
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["winner"] == "a" and c.cluster == "a"
    assert list(race.sites["a"].files) == ["/a/run/control/kept.11", "/a/run/control/go.0"] and race.sites["b"].files == {}
    assert race.sites["b"].cancelled == ["21"]
    assert c.extra["race"]["racers"]["b"]["held_s"] == 60.0 and c.extra["race"]["held_twice_s"] == 60.0
    assert any("held its nodes 60s" in e.message for _, e in race.store.events(c.id))


def test_a_scancel_that_fails_is_asked_again_and_the_decision_is_never_made_twice(race):
    race.sites["a"].fail_cancel = "Access denied"
    race.sites["b"].show("21", "RUNNING", start=90.0)
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["racers"]["a"]["cancel_failed"] == "Access denied" and site_race.open_racers(c)
    race.sites["a"].fail_cancel = ""
    race.sites["a"].show("11", "RUNNING", start=120.0)  # it starts meanwhile: still the loser
    race.clock[0] = 150.0
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["winner"] == "b" and race.sites["a"].files == {}
    assert race.sites["a"].cancelled == ["11"] and not site_race.to_cancel(c.extra["race"])
    assert len(race.store.segments(c.id)) == 1


def test_a_winner_recorded_by_a_watcher_that_died_before_its_go_ahead_stays_the_winner(race):
    c = race.store.chain(race.id)
    c.extra["race"]["winner"] = "b"  # recorded, then the watcher died before writing go.0
    race.store.save(c)
    race.sites["a"].show("11", "RUNNING", start=95.0)  # the preferred site starts meanwhile
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["winner"] == "b" and race.sites["a"].files == {} and "/b/run/control/go.0" in race.sites["b"].files
    assert race.sites["a"].cancelled == ["11"]


def test_a_chain_cancelled_while_racing_cancels_every_racer(race):
    c = race.store.chain(race.id)
    c.status = CANCELLED
    race.store.save(c)
    race.drv.tick()
    c = race.store.chain(race.id)
    assert sorted(race.sites["a"].cancelled + race.sites["b"].cancelled) == ["11", "21"]
    assert race.sites["a"].files == {} and race.sites["b"].files == {}
    assert c.extra["race"]["phase"] == site_race.NONE_STARTED and c.status == CANCELLED


def test_every_racer_ended_before_starting_falls_back_to_the_rule(race):
    race.sites["a"].rows.clear()
    race.sites["b"].rows.clear()
    final = lambda ids, since=None: [SimpleNamespace(job_id=j, state="CANCELLED", end=50.0) for j in ids]  # noqa: E731
    race.sites["a"].slurm.accounting = race.sites["b"].slurm.accounting = final
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["phase"] == site_race.NONE_STARTED and c.status == ACTIVE
    assert not site_race.live(c) and race.store.segments(c.id) == []


def _sacct(site, calls, state="CANCELLED", fail=""):
    """The site's sacct: each call recorded (ids, since); every job asked for ended ``state``, or the call fails."""
    def accounting(ids, since=None):
        calls.append((site, sorted(ids), since))
        if fail:
            raise SlurmError(f"sacct failed: {fail}")
        return [SimpleNamespace(job_id=j, state=state, end=50.0) for j in ids]
    return accounting


def test_racers_of_several_chains_that_left_squeue_cost_one_sacct_per_site_per_tick(race):
    """The house rule: one batched sacct per cluster and tick, never one per job (issue 26 follow-up)."""
    _racing(race.store, "r-0002", ("12", "22"), submit=0.5)  # submitted earlier: sacct looks back to it
    calls = []
    for n in ("a", "b"):
        race.sites[n].rows.clear()  # every racer of both chains left its squeue
        race.sites[n].slurm.accounting = _sacct(n, calls)
    assert race.drv.tick() == []
    assert sorted(calls) == [("a", ["11", "12"], 0.5), ("b", ["21", "22"], 0.5)]
    for cid, jobs in (("r-0001", ("11", "21")), ("r-0002", ("12", "22"))):
        r = race.store.chain(cid).extra["race"]
        assert r["phase"] == site_race.NONE_STARTED, cid  # as before: every racer ended, the rule places it
        for n, j in zip("ab", jobs):
            got = r["racers"][n]
            assert (got["job_id"], got["phase"], got["slurm_state"], got["end"]) == (j, ENDED, "CANCELLED", 50.0)
            assert got["reason"] == "ended CANCELLED before it was kept"


def test_a_site_whose_sacct_fails_leaves_the_other_sites_racers_handled(race):
    """a's sacct fails: a's racers wait for the next tick (one warning line per chain), b's are handled, and
    a chain whose racer started on b is kept there and a's racer cancelled."""
    _racing(race.store, "r-0002", ("12", "22"))
    calls = []
    race.sites["a"].rows.clear()
    race.sites["b"].rows.clear()
    race.sites["b"].show("22", "RUNNING", start=95.0)  # r-0002's racer started on b
    race.sites["a"].slurm.accounting = _sacct("a", calls, fail="slurmdbd down")
    race.sites["b"].slurm.accounting = _sacct("b", calls)
    warnings = race.drv.tick()
    assert sorted(calls) == [("a", ["11", "12"], 1.0), ("b", ["21"], 1.0)]
    r1 = race.store.chain("r-0001").extra["race"]
    assert r1["phase"] == site_race.RACING  # a's racer is not known to have ended: no fallback yet
    assert (r1["racers"]["a"]["phase"], r1["racers"]["b"]["phase"], r1["racers"]["b"]["slurm_state"]) == (
        PENDING, ENDED, "CANCELLED")
    c2 = race.store.chain("r-0002")
    assert c2.extra["race"]["winner"] == "b" and "/b/run/control/go.0" in race.sites["b"].files
    assert race.sites["a"].cancelled == ["12"]  # in no squeue: it runs nowhere, cancelling it is safe
    assert warnings == ["r-0001: race of segment 0: a: sacct failed: slurmdbd down",
                        "r-0002: race of segment 0: a: sacct failed: slurmdbd down"]
    race.sites["a"].slurm.accounting = _sacct("a", calls)  # a answers again: its racer is followed
    calls.clear()
    assert race.drv.tick() == []
    assert calls == [("a", ["11"], 1.0)]
    r1 = race.store.chain("r-0001").extra["race"]
    assert r1["phase"] == site_race.NONE_STARTED and r1["racers"]["a"]["slurm_state"] == "CANCELLED"


def test_race_without_several_clusters_is_one_line_and_exit_2(tmp_path):
    from tests.conftest import run_cli

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    p = run_cli("submit", str(script), "--total", "1h", "--race", home=tmp_path / "home", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "chainrun: error: --race needs several clusters (e.g. --cluster a,b --race)"], p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "chainrun-runs").exists()


@pytest.mark.parametrize("outcome, go_left", [("unstarted", False), ("continue", True)])
def test_a_kept_racer_that_ended_before_training_takes_its_go_ahead_with_it(race, outcome, go_left):
    """Its go.0 would make every later segment there end `stale`; one that trained leaves it (it claimed)."""
    race.sites["b"].show("21", "RUNNING", start=90.0)
    race.drv.tick()
    c = race.store.chain(race.id)
    race.drv.tick()  # segment 0 still runs: nothing to settle
    assert "/b/run/control/go.0" in race.sites["b"].files and site_race.open_racers(race.store.chain(race.id))
    seg, = race.store.segments(c.id)
    seg.phase, seg.outcome = ENDED, outcome
    race.store.save(c, [seg])
    race.drv.tick()
    c = race.store.chain(race.id)
    assert ("/b/run/control/go.0" in race.sites["b"].files) == go_left
    assert c.extra["race"]["settled"] and not site_race.open_racers(c)


# ------------------------------------------------------------------ a successor raced (planning's first step)
def _after_segment_0(race, outcome="continue"):
    """Segment 0 kept on a, trained, ended: nothing of the chain is live."""
    race.sites["a"].show("11", "RUNNING", start=90.0)
    race.drv.tick()
    c = race.store.chain(race.id)
    seg, = race.store.segments(c.id)
    seg.phase, seg.outcome, seg.credit_s = ENDED, outcome, 3000.0
    race.store.save(c, [seg])
    race.drv.tick()  # settles segment 0's race
    race.sites["a"].names |= {"owner.0", "released.0"}
    return race.store.chain(race.id), race.store.segments(race.id)


def _tick_context(race, wait_h=None):
    """The tick's view of both sites; each site's model answers ``wait_h[site]`` hours (default 2 h each)."""
    from chainrun.chain.policies import WaitEstimate

    wait_h = wait_h or {"a": 2.0, "b": 2.0}

    def model(n):
        return lambda view, probe, queue: WaitEstimate(seconds=wait_h[n] * 3600, model=f"m-{n}", p50=wait_h[n] * 3600)

    slurm_of = {n: SimpleNamespace(**{**vars(s.slurm)}) for n, s in race.sites.items()}
    return SimpleNamespace(store=race.store, slurm=slurm_of["a"], predictor=model("a"), queue=[],
                           sites=SimpleNamespace(engine=lambda n: SimpleNamespace(slurm=slurm_of[n], predictor=model(n)),
                                                 queue=lambda n: []))


def test_a_successor_planned_while_nothing_is_live_is_raced_on_every_site(race, monkeypatch):
    import chainrun.chain.site_race as sr

    monkeypatch.setattr(sr, "read_reservations", lambda slurm: [])
    c, segs = _after_segment_0(race)
    assert not site_race.open_racers(c)
    assert site_race.begin(_tick_context(race), c, segs, remaining_s=2000.0) is True
    c = race.store.chain(race.id)
    r = c.extra["race"]
    assert (r["idx"], r["phase"], r["sites"], r["pred"]) == (1, site_race.RACING, ["a", "b"], 0)
    assert c.extra["races_done"] == [{"idx": 0, "phase": site_race.WON, "winner": "a", "held_twice_s": 0.0}]
    for n in ("a", "b"):
        (args, script_args), = race.sites[n].submitted
        assert script_args == ["1", "gated", "race"] and f"--job-name=cr.{c.id}.1" in args, args
    assert r["racers"]["a"]["time_limit_s"] < 3600  # sized for the work left, not a whole segment
    assert site_race.live(c) and race.store.segments(c.id) == segs  # no row for segment 1 until one is kept
    assert site_race.begin(_tick_context(race), c, segs, remaining_s=2000.0) is None  # the race is open


def test_a_successor_is_not_raced_where_its_checkpoint_copy_alone_takes_longer_than_the_wait_here(race, monkeypatch):
    import chainrun.chain.site_plan as sp
    import chainrun.chain.site_race as sr

    monkeypatch.setattr(sr, "read_reservations", lambda slurm: [])
    monkeypatch.setattr(sp, "declared_by_site", lambda names: {})
    c, segs = _after_segment_0(race)
    # a's model: 5 minutes; b: none at all, but the checkpoint's copy there takes 15 min (the default)
    assert site_race.begin(_tick_context(race, {"a": 5 / 60, "b": 0.0}), c, segs, remaining_s=2000.0) is True
    c = race.store.chain(race.id)
    r = c.extra["race"]
    assert r["sites"] == ["a"] and list(r["racers"]) == ["a"] and race.sites["b"].submitted == []
    assert r["skipped"]["b"].startswith("not raced on b: done in ~")
    assert site_race.summary(r) == "racing segment 1 on a: a job a1 pending; b not raced (cannot win there)", \
        site_race.summary(r)
    said = [e.message for _, e in race.store.events(c.id, kind="race")]
    assert r["skipped"]["b"] in said and "segment 1 raced on a: the first to start trains" in " ".join(said)


def test_a_successor_kept_where_the_checkpoint_is_gets_the_next_generation(race, monkeypatch):
    import chainrun.chain.site_race as sr

    monkeypatch.setattr(sr, "read_reservations", lambda slurm: [])
    c, segs = _after_segment_0(race)
    site_race.begin(_tick_context(race), c, segs, remaining_s=2000.0)
    race.sites["a"].show("a1", "RUNNING", start=200.0)
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["winner"] == "a" and c.extra["race"]["gen"] == 1 and c.cluster == "a"
    assert "go.1" in {f.rsplit("/", 1)[1] for f in race.sites["a"].files}
    assert "seg=1" in race.sites["a"].files["/a/run/control/go.1"]
    seg1 = [s for s in race.store.segments(c.id) if s.idx == 1][0]
    assert (seg1.cluster, seg1.job_id, seg1.phase) == ("a", "a1", RUNNING) and "move" not in seg1.extra
    assert race.sites["b"].cancelled == ["21", "b1"]  # segment 0's racer there, then segment 1's


def test_a_successor_kept_on_another_site_is_a_move_whose_driver_writes_the_go_ahead(race, monkeypatch):
    import chainrun.chain.site_race as sr

    monkeypatch.setattr(sr, "read_reservations", lambda slurm: [])
    c, segs = _after_segment_0(race)
    race.sites["b"].names |= {"moved.3"}  # the chain left b at generation 3 once: it claims only above
    site_race.begin(_tick_context(race), c, segs, remaining_s=2000.0)
    race.sites["b"].show("b1", "RUNNING", start=200.0)
    race.drv.tick()
    c = race.store.chain(race.id)
    seg1 = [s for s in race.store.segments(c.id) if s.idx == 1][0]
    mv = seg1.extra["move"]
    assert (seg1.cluster, mv["from"], mv["to"], mv["gen"], mv["pred"], mv["phase"]) == ("b", "a", "b", 4, 0, "ahead")
    # kept (it waits for its go-ahead), but no go-ahead before the copy; the row stays on a
    assert list(race.sites["b"].files) == ["/b/run/control/kept.b1"] and c.cluster == "a"
    assert race.sites["a"].cancelled == ["a1"] and not site_race.open_racers(c)


def test_a_successor_race_where_none_started_leaves_that_segment_to_the_rule(race, monkeypatch):
    import chainrun.chain.site_race as sr

    monkeypatch.setattr(sr, "read_reservations", lambda slurm: [])
    c, segs = _after_segment_0(race)
    site_race.begin(_tick_context(race), c, segs, remaining_s=2000.0)
    for n in ("a", "b"):
        race.sites[n].rows.clear()
        race.sites[n].slurm.accounting = lambda ids, since=None: [SimpleNamespace(job_id=j, state="CANCELLED", end=1.0)
                                                                  for j in ids]
    race.drv.tick()
    c = race.store.chain(race.id)
    assert c.extra["race"]["phase"] == site_race.NONE_STARTED
    assert site_race.begin(_tick_context(race), c, segs, remaining_s=2000.0) is False
