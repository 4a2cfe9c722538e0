"""chainrun.chain.site_pace: a chain's pace and restart cost per cluster (measured, else declared, else the
default), and the site choice weighing them (chain/site_plan.py's option and choose)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chainrun.chain import progress, site_plan
from chainrun.chain.policies import WaitEstimate
from chainrun.chain.site_pace import (DECLARED, DEFAULT, HERE, MEASURED, Declared, Measured, SitePace, measured,
                                      restart_of, site_paces)
from chainrun.state.records import ENDED, RUNNING, Chain, ChainSite, Segment
from chainrun.state.store import Store

H = 3600.0
T0 = 1.7e9


def chain(cluster="a") -> Chain:
    return Chain(id="train-1a2b", name="train", cluster=cluster, script="/s.sh", workdir="/w", run_dir="/w/r",
                 checkpoint_dir="/w/c", total_s=int(40 * H), segment_s=int(4 * H), policy="predicted", lead_s=60,
                 signal="USR2", signal_lead_s=300, retries=1, sbatch_args=[], partition="gpu",
                 extra={"sites": ["a", "b"]})


def reported(first_t: float, steps_per_s: float, lines: int = 20, every_s: float = 30.0, batch=None) -> dict:
    """A segment's progress as the watcher keeps it: rank 0's lines (with samples when ``batch`` is given)
    parsed by the contract's own parser."""
    def line(i):
        step = 1000 + i * every_s * steps_per_s
        return progress.format_line(step, None if batch is None else step * batch, t=first_t + i * every_s)

    text = "".join(line(i) for i in range(lines))
    return progress.segment_progress({(0, "n1"): progress.parse_lines(text)}, read_at=first_t + lines * every_s)


def seg(idx, cluster=None, *, start=T0, sps=None, payload_after=None, restart=120.0, batch=None, **extra) -> Segment:
    """A segment whose payload began ``payload_after`` s after its job (None: not known) and reported
    its first progress line ``restart`` s after the payload began, at ``sps`` steps per second."""
    s = Segment(chain_id="train-1a2b", idx=idx, phase=ENDED, start=start, cluster=cluster, extra=dict(extra))
    began = start + (payload_after or 0.0)
    if payload_after is not None:
        s.extra["payload_start"] = began
    if sps is not None:
        s.extra["progress"] = reported(began + restart, sps, batch=batch)
    return s


# ------------------------------------------------------------------ measured
def test_the_median_pace_and_restart_per_site_from_the_segments_that_reported_progress():
    c = chain("a")
    segs = [seg(0, "b", sps=3.0, payload_after=0, restart=100),
            seg(1, "b", sps=2.0, payload_after=600, restart=300),  # waited 10 min for the hand-off: not a restart
            seg(2, "b", sps=30.0, payload_after=0, restart=200),
            seg(3, "b"),  # no progress contract: no measurement
            seg(4, None, sps=10.0, payload_after=0, restart=60)]  # None: the chain's site now
    m = measured(c, segs)
    assert set(m) == {"a", "b"}
    assert m["b"].steps_per_s == pytest.approx(3.0) and m["b"].pace_n == 3  # the median, not the mean
    assert m["b"].restart_s == pytest.approx(200) and m["b"].restart_n == 3
    assert m["a"] == Measured(pytest.approx(10.0), 1, pytest.approx(60), 1)


def test_a_segment_without_progress_gives_nothing():
    c = chain("a")
    assert measured(c, [seg(0), seg(1, "b", payload_after=0)]) == {}
    empty = seg(2, "b")
    empty.extra["progress"] = progress.segment_progress({}, read_at=T0)  # read, nothing reported
    assert measured(c, [empty]) == {}


def test_the_restart_counts_from_the_payloads_start_never_a_wait_for_the_chain():
    # the wrapper's payload start is known: from it
    assert restart_of(seg(5, payload_after=900, sps=1.0, restart=150)) == pytest.approx(150)
    # not known: the job's start only where nothing can have been waited for
    first = seg(0, sps=1.0, restart=90)
    assert restart_of(first) is None and restart_of(first, first=True) == pytest.approx(90)
    assert restart_of(seg(3, sps=1.0, restart=90, gap_s=40.0)) == pytest.approx(90)  # started after its predecessor
    assert restart_of(seg(3, sps=1.0, restart=90, gap_s=-600.0)) is None  # started early: it may have waited
    assert restart_of(seg(3, sps=1.0, restart=90, gap_s=40.0, move={"to": "b"})) is None  # waited for its go-ahead
    # a requeued job's file begins with the run before: no measurement
    assert restart_of(seg(4, payload_after=0, sps=1.0, restart=-300)) is None


def test_segments_of_the_chains_site_keep_their_measurement_after_a_move():
    # before the move: segments name no site (the chain's own, a); the driver names a on each at the move
    before = chain("a")
    segs = [seg(0, None, sps=10.0), seg(1, "b", sps=5.0)]
    assert measured(before, segs)["a"].steps_per_s == pytest.approx(10.0)
    after = chain("b")
    for s in segs:
        s.cluster = s.cluster or "a"
    m = measured(after, segs)
    assert (m["a"].steps_per_s, m["b"].steps_per_s) == (pytest.approx(10.0), pytest.approx(5.0))


# ------------------------------------------------------------------ measured beats declared beats default
def test_measured_beats_declared_beats_the_default_and_the_current_site_is_one():
    found = {"a": Measured(10.0, 2, 60.0, 2), "b": Measured(3.0, 1, None, 0)}
    declared = {"a": Declared(1.0, 30), "b": Declared(0.9, 600), "c": Declared(0.5, None)}
    p = site_paces("a", ["a", "b", "c", "d"], found, declared)
    assert p["a"] == SitePace(1.0, HERE, 60.0, MEASURED)
    assert p["b"] == SitePace(pytest.approx(0.3), MEASURED, 600.0, DECLARED)  # measured pace, declared restart
    assert p["c"] == SitePace(0.5, DECLARED, 0.0, DEFAULT)
    assert p["d"] == SitePace(1.0, DECLARED, 0.0, DEFAULT)  # undeclared: 1.0 against the current site's 1.0
    assert site_paces("a", ["a", "b"], {}, {})["b"] == SitePace()


def test_samples_are_the_work_where_both_sites_report_them():
    # b's own script trains half the batch at the same steps per second: half the work per second
    c = chain("a")
    both = [seg(0, "b", sps=10.0, batch=32), seg(1, None, sps=10.0, batch=64)]
    m = measured(c, both)
    assert (m["b"].samples_per_s, m["a"].samples_per_s) == (pytest.approx(320), pytest.approx(640))
    assert site_paces("a", ["a", "b"], m, {})["b"] == SitePace(pytest.approx(0.5), MEASURED, 120.0, MEASURED)
    # one site reports no samples: steps per second are all there is to compare
    steps_only = measured(c, [seg(0, "b", sps=10.0, batch=32), seg(1, None, sps=10.0)])
    assert site_paces("a", ["a", "b"], steps_only, {})["b"].pace == pytest.approx(1.0)


def test_factors_are_against_the_site_the_chain_is_on_now():
    found = {"a": Measured(10.0, 1), "b": Measured(5.0, 1)}
    assert site_paces("b", ["a", "b"], found, {})["a"].pace == pytest.approx(2.0)
    assert site_paces("b", ["a", "b"], found, {})["b"].pace == 1.0
    # declared against a cluster at 1.0: a chain now on the declared-slow site sees the others faster
    declared = {"b": Declared(0.5)}
    assert site_paces("b", ["a", "b"], {}, declared)["a"] == SitePace(2.0, DECLARED)
    # a measured site against an unmeasured current one has nothing to compare with: the declared ratio
    assert site_paces("b", ["a", "b"], {"a": Measured(10.0, 1)}, declared)["a"] == SitePace(2.0, DECLARED)


# ------------------------------------------------------------------ the choice
def tick(tmp_path, c: Chain, segs: list[Segment], waits_h: dict[str, float]):
    """What choose reads of a tick: the real store; each site's wait model answers a fixed median."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = Store(tmp_path / "state.db")
    store.add_chain(c, [ChainSite(chain_id=c.id, cluster=n, rank=i, workdir="/w", run_dir=f"/w/{n}",
                                  checkpoint_dir="/c", script="/s.sh") for i, n in enumerate(waits_h)])
    store.save(c, segs)

    def model(site):
        return lambda view, probe, queue: WaitEstimate(seconds=waits_h[site] * H, model="m", p50=waits_h[site] * H)

    engines = {n: SimpleNamespace(predictor=model(n), slurm=None) for n in waits_h}
    sites = site_plan.SiteAccess(lambda n: engines[n])
    sites.queue = lambda n: []
    return SimpleNamespace(store=store, predictor=model(c.cluster), queue=[], sites=sites)


def test_a_site_measured_much_slower_loses_to_a_short_wait_at_the_usual_pace(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))  # no config.toml: nothing declared
    c = chain("a")
    cur = Segment(chain_id=c.id, idx=2, phase=RUNNING, start=T0, cluster=None)
    # b starts at once, a in 2 h: with equal paces, b saves 2 h less the 15 min copy (> the 1 h margin)
    choice, _ = site_plan.choose(tick(tmp_path / "1", c, [cur], {"a": 2, "b": 0}), c, cur,
                                 remaining_s=20 * H, handover_at=None, now=T0)
    assert (choice.site, choice.move) == ("b", True)
    # the chain ran on b before, at 0.3 of a's steps per second: 20 h of work there take 67 h
    segs = [seg(0, "b", sps=3.0, payload_after=0, restart=300), seg(1, None, sps=10.0, payload_after=0, restart=60),
            cur]
    choice, _ = site_plan.choose(tick(tmp_path / "2", c, segs, {"a": 2, "b": 0}), c, cur,
                                 remaining_s=20 * H, handover_at=None, now=T0)
    est = {e.name: e for e in choice.estimates}
    assert (choice.site, choice.move) == ("a", False)
    assert est["b"].pace == pytest.approx(0.3) and est["b"].restart_s == pytest.approx(300)
    # a segment trains its 4 h less the 300 s signal lead; each boundary costs the hand-off (the signal
    # lead until one is measured): 18 segments on b, 6 on a (as the replay counts them)
    assert (est["b"].segments, est["a"].segments) == (18, 6)
    assert est["b"].finish_s == pytest.approx(900 + 300 + 20 * H / 0.3 + 17 * 300)
    assert est["a"].finish_s == pytest.approx(2 * H + 60 + 20 * H + 5 * 300)
    assert choice.reason.startswith("stay on a: done in ~22.4 h (start ~2.0 h, restart 1 min), the earliest; "
                                    "next b ~68.4 h"), choice.reason


def test_the_watchers_decision_keeps_where_each_sites_wait_came_from(tmp_path, monkeypatch):
    """planning records every site decision for `status --json` (``site_choice``), each site's median wait
    and its source with it; a change of mind is a site event."""
    from chainrun.chain import planning

    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    c = chain("a")
    cur = Segment(chain_id=c.id, idx=2, phase=RUNNING, start=T0, cluster=None)
    t = tick(tmp_path, c, [cur], {"a": 2, "b": 0})
    move = planning._where(t, c, cur, 20 * H, None, T0)
    assert move is not None and move.site == "b"
    assert c.extra["site_choice"]["waits"] == {"a": {"wait_s": 2 * H, "from": "m"}, "b": {"wait_s": 0.0, "from": "m"}}
    assert c.extra["site_choice"]["for"] == 3
    said = [e.message for _, e in t.store.events(c.id, limit=10) if e.kind == "site"]
    assert said and said[0].startswith("next segment: move to b:"), said


def test_a_declared_pace_and_restart_weigh_before_any_measurement(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[clusters.b]\nhost = "b.example.org"\n\n'
                                      '[clusters.b.job]\npace = 0.3\nrestart = "45s"\n')
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    c = chain("a")
    cur = Segment(chain_id=c.id, idx=0, phase=RUNNING, start=T0)
    choice, _ = site_plan.choose(tick(tmp_path, c, [cur], {"a": 2, "b": 0}), c, cur,
                                 remaining_s=20 * H, handover_at=None, now=T0)
    assert (choice.site, choice.move) == ("a", False)
    assert choice.reason == "stay on a: done in ~22.4 h (start ~2.0 h), the earliest; next b ~68.3 h", choice.reason
    assert {e.name: (e.pace, e.restart_s) for e in choice.estimates} == {"a": (1.0, 0.0), "b": (0.3, 45.0)}
    # once measured on b at a's pace, the measurement wins and the short wait there is worth a move
    segs = [seg(0, "b", sps=10.0, payload_after=0, restart=30), seg(1, None, sps=10.0, payload_after=0), cur]
    segs[-1].idx = 2
    choice, _ = site_plan.choose(tick(tmp_path / "2", c, segs, {"a": 2, "b": 0}), c, cur,
                                 remaining_s=20 * H, handover_at=None, now=T0)
    assert (choice.site, choice.move) == ("b", True)
    assert {e.name: (e.pace, e.restart_s) for e in choice.estimates}["b"] == (1.0, pytest.approx(30))
    assert "(start ~0 min, transfer 15 min, restart 30 s) against ~22.4 h on a (start ~2.0 h, restart 2 min)" \
        in choice.reason, choice.reason


def test_option_without_a_pace_is_the_default():
    o = site_plan.option(chain("a"), "b", 600.0)
    assert (o.pace, o.restart_s, o.transfer_s) == (1.0, 0.0, site_plan.DEFAULT_TRANSFER_S)
    o = site_plan.option(chain("a"), "a", 600.0, SitePace(1.0, HERE, 90.0, MEASURED))
    assert (o.pace, o.restart_s, o.transfer_s) == (1.0, 90.0, 0.0)


def test_a_config_file_broken_while_the_chain_runs_leaves_the_defaults(tmp_path, monkeypatch, caplog):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[clusters.b]\nhost = "b.example.org"\n[clusters.b.job]\npace = 0.3\n')
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    assert site_plan.declared_by_site(["a", "b"]) == {"b": Declared(0.3, None)}
    (home / "config.toml").write_text('[clusters.b.job]\npace = \n')  # a half-saved edit
    assert site_plan.declared_by_site(["a", "b"]) == {}
    assert "declared pace and restart not read" in caplog.text


# ------------------------------------------------------------------ segment 0's site (site_plan.first_site)
def test_segment_0_starts_where_the_chain_is_expected_to_finish_first_by_more_than_the_margin(monkeypatch):
    """At submit the rule places segment 0 (not a move: no transfer) on each site's wait, here Slurm's
    expected starts (chain/first_wait.py gives a model's where a site has one)."""
    monkeypatch.setattr(site_plan, "declared_by_site", lambda names: {})
    c = chain("a")
    c.extra["site_margin_s"] = 1800

    def slurm(**starts):
        return {n: site_plan.test_only_wait(None if t is None else T0 + t, T0) for n, t in starts.items()}

    full = site_plan.first_site(c, ["a", "b"], slurm(a=5 * H, b=60))  # a full for 5 h
    assert full.site == "b" and not full.move and full.reason.startswith("start on b:"), full.reason
    assert all(e.transfer_s == 0 for e in full.estimates)
    near = site_plan.first_site(c, ["a", "b"], slurm(a=1200, b=0))  # 20 min sooner < the margin
    assert near.site == "a" and near.reason.startswith("start on a:"), near.reason
    unknown = site_plan.first_site(c, ["a", "b"], slurm(a=5 * H, b=None))  # no start: the first, b named
    assert unknown.site == "a" and unknown.left_out == (("b", site_plan.NO_START),), unknown.reason
    # segments as the replay sizes them: 40 h of work in 4 h segments less the 300 s lead, each boundary
    # after the first costing the hand-off (the signal lead before one was measured)
    est = {e.name: e for e in full.estimates}
    assert est["a"].segments == 11 and est["a"].finish_s == pytest.approx(5 * H + 40 * H + 10 * 300)
    # a site declared at a third of the pace loses despite starting at once
    monkeypatch.setattr(site_plan, "declared_by_site", lambda names: {"b": Declared(0.3, None)})
    slow = site_plan.first_site(c, ["a", "b"], slurm(a=5 * H, b=0))
    assert slow.site == "a", slow.reason
