"""The site margin chosen week by week on its own past (chainrun/sim/site_rolling.py), on hand-made runs:
no week sees a run that ended after it started, weeks without enough past say so, every point is
scored once with its week's margin."""

from chainrun.sim import site_rolling, site_tune
from chainrun.sim.chain_replay import ChainsConfig
from chainrun.sim.chains import ChainRun
from chainrun.sim.site_chain import SiteRun

from .tracegen import T0

H, DAY = 3600.0, 86400.0
WORK = 3 * DAY
MARGINS = (0.0, H)
NAMES = ["a", "b"]
LEVELS = ("low", "medium", "heavy")


def _pts(days: float = 35) -> list[tuple[float, int]]:
    return [(T0 + i * 12 * H, 1 if i % 2 == 0 else 8) for i in range(int(days * 2))]


def _run(cls, policy, t0, nodes, overhead_h, **kw):
    fin = t0 + WORK + overhead_h * H
    return cls(policy, t0, nodes, WORK, first_start=t0, finish=fin, segments=2, ended=fin, **kw)


def _runs(pts, multi_h, race=False) -> list:
    """Every row at every point: reactive 5 h, the singles 3 h and 4 h, the multi-site runs ``multi_h(margin,
    t0)`` hours (the race 0.5 h more)."""
    out = []
    for t0, k in pts:
        out += [_run(ChainRun, "reactive:a", t0, k, 5.0), _run(ChainRun, "predicted:a", t0, k, 3.0),
                _run(ChainRun, "predicted:b", t0, k, 4.0)]
        for m in MARGINS:
            out.append(_run(SiteRun, site_tune.multi_name(m), t0, k, multi_h(m, t0), sites=["a", "a"]))
            if race:
                out.append(_run(SiteRun, site_tune.race_name(m), t0, k, multi_h(m, t0) + 0.5, sites=["b", "b"]))
    return out


def _loads(pts) -> dict:
    return {p: LEVELS[i % 3] for i, p in enumerate(pts)}


def _margins(runs, pts, starts) -> list[float]:
    ended = site_tune.ended_by_point(runs)
    return [site_rolling.week_margin(runs, _loads(pts), ChainsConfig(), ended, a, MARGINS)[0] for a in starts]


def test_a_weeks_margin_does_not_see_runs_that_ended_after_it_started():
    pts = _pts()
    runs = _runs(pts, lambda m, t0: 1.0 if m == 0 else 2.0)  # 0 is better everywhere
    wk = site_rolling.weeks(pts)
    third, fifth = wk[2][0], wk[4][0]
    assert _margins(runs, pts, [third, fifth]) == [0.0, 0.0]
    # margin 0 turns bad on every run that ended from the third week on: the third week cannot know
    worse = [_run(SiteRun, r.policy, r.t0, r.nodes, 10.0, sites=r.sites)
             if r.policy == site_tune.multi_name(0.0) and r.ended >= third else r for r in runs]
    assert all(w.ended >= third for w, r in zip(worse, runs) if w is not r)
    assert _margins(worse, pts, [third]) == [0.0]
    assert _margins(worse, pts, [fifth]) == [H]  # a later week, whose past holds them, does see it


def test_weeks_with_too_little_past_take_the_default_and_say_so():
    pts = _pts()
    runs = _runs(pts, lambda m, t0: 1.0 if m == 0 else 2.0)
    out = site_rolling.rolling(runs, _loads(pts), ChainsConfig(), NAMES, pts, MARGINS)
    first, second, third = out["weeks"][:3]
    assert first["choice_chains"] == 0 and not first["chosen"] and first["margin_s"] == site_tune.DEFAULT_MARGIN_S
    # week 2: the chains of the first 4 days (3 days of work and 1 h) ended before it: 8, fewer than 10
    assert second["choice_finished"] == 8 < site_tune.MIN_CHOICE and not second["chosen"]
    assert second["margin_s"] == site_tune.DEFAULT_MARGIN_S and "fewer than 10" in second["note"]
    assert third["chosen"] and third["margin_s"] == 0.0 and "chosen" in third["note"]


def test_every_point_is_scored_once_with_its_weeks_margin():
    pts = _pts()
    runs = _runs(pts, lambda m, t0: 1.0 if m == 0 else 2.0, race=True)
    out = site_rolling.rolling(runs, _loads(pts), ChainsConfig(), NAMES, pts, MARGINS, race=True)
    n = sum(w["n"] for w in out["weeks"])
    assert n == len(pts) and len(out["weeks"]) == 5
    pols = out["policies"]
    assert list(pols) == ["reactive:a", "predicted:a", "predicted:b", "predicted_multi", "predicted_multi_race",
                          "best_single_hindsight"]
    assert all(p["n"] == n for p in pols.values())
    # the default weeks (1 h) ran at 2 h, the chosen ones (0) at 1 h
    default_n = sum(w["n"] for w in out["weeks"] if w["margin_s"] == H)
    want = (default_n * 2.0 + (n - default_n) * 1.0) / n
    assert abs(pols["predicted_multi"]["mean_overhead_h"] - want) < 1e-9
    assert abs(pols["predicted_multi_race"]["mean_overhead_h"] - (want + 0.5)) < 1e-9
    assert abs(pols["best_single_hindsight"]["mean_overhead_h"] - 3.0) < 1e-9
    assert sum(pols["predicted_multi"]["by_load"][lv]["n"] for lv in LEVELS) == n


def test_the_json_shape():
    pts = _pts(20)
    runs = _runs(pts, lambda m, t0: 1.0)
    out = site_rolling.rolling(runs, _loads(pts), ChainsConfig(), NAMES, pts, MARGINS)
    assert set(out) == {"weeks", "policies", "targets", "note"}
    for w in out["weeks"]:
        assert set(w) == {"start", "end", "n", "choice_chains", "choice_finished", "margin_s", "chosen", "note"}
        assert len(w["start"]) == 19 and w["start"] < w["end"]
    assert [w["start"] for w in out["weeks"][1:]] == [w["end"] for w in out["weeks"][:-1]]
    assert {"low", "medium", "heavy", "moves_ok", "stuck", "gpu_h_twice_ok"} <= set(out["targets"])
    assert out["policies"]["predicted_multi"]["moves"] == 0.0
    assert out["weeks"][-1]["margin_s"] == 1.0 * H  # all tie: the largest margin, as pick's tie rule says
