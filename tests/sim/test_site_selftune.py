"""The site margin chosen on the clusters' past (chainrun/sim/site_selftune.py), stored per ordered cluster
list (chainrun/chain/site_tuned.py) and taken by `submit --cluster a,b` (chain/sites.py), on small
synthetic histories: the choice is the frozen ``site_tune.pick`` on the chains ended before now and
depends on nothing after it; too little past, a missing history or hidden users keep the shipped
margin and say why; a corrupt store is set aside, never a traceback."""

from __future__ import annotations

import json

import pytest

from chainrun.chain import site_tuned
from chainrun.chain.create import SubmitRequest
from chainrun.chain.site_choice import SHIPPED_MARGIN_S
from chainrun.chain.sites import with_site_margin
from chainrun.predict import ingest
from chainrun.sim import site_selftune as SS
from chainrun.sim import site_tune
from chainrun.sim.knowledge import RecentWaits
from tests.conftest import run_cli

from .tracegen import T0, frame, steady

H, DAY = 3600.0, 86400.0
SHAPE = {"source": "test", "nodes": 1, "segment_s": 12 * H, "work_s": 30 * H, "signal_lead_s": 300.0}
KNOBS = dict(shape=SHAPE, predictor=RecentWaits, warmup_s=5 * DAY, chains_every_s=DAY)
AS_OF = T0 + 24 * DAY


def bursts(days: float) -> list[dict]:
    """Two nodes kept full: six 8 h jobs at once every day, recorded one pair after another."""
    rows = []
    for d in range(int(days)):
        for k in range(6):
            start = d * DAY + (k // 2) * 8 * H
            rows.append({"submit": d * DAY + k, "start": start, "end": start + 8 * H, "limit_s": 10 * H,
                         "nodes": 1, "user": f"u{k}"})
    return rows


def histories(days: float = 30):
    return [frame(steady(days, every_s=2 * H, run_s=5 * H)), frame(bursts(days))]


@pytest.fixture(scope="module")
def chosen():
    return SS.choose(histories(), ["a", "b"], as_of=AS_OF, **KNOBS)


def test_the_margin_is_the_frozen_pick_on_the_chains_ended_before_now(chosen):
    assert chosen["chosen"] is True and chosen["window"]["finished"] >= site_tune.MIN_CHOICE
    rows = {float(m): r for m, r in chosen["rows"].items()}
    assert set(rows) == set(site_tune.MARGINS_S)  # the whole grid, unchanged
    assert chosen["margin_s"] == site_tune.pick(rows)
    assert all(r["n"] == chosen["window"]["finished"] for r in rows.values())
    assert chosen["reason"].startswith(f"chosen on {chosen['window']['finished']} chains that ended before now")


def test_the_choice_depends_on_nothing_after_now(chosen):
    longer = histories(40)  # ten more days after AS_OF
    later = SS.choose(longer, ["a", "b"], as_of=AS_OF, **KNOBS)
    keys = ("chosen", "margin_s", "rows", "window")
    assert {k: later[k] for k in keys} == {k: chosen[k] for k in keys}
    # the days after are real: seen at their end, they give more chains to choose on
    end = SS.choose(longer, ["a", "b"], as_of=T0 + 40 * DAY, **KNOBS)
    assert end["window"]["finished"] > chosen["window"]["finished"]


def test_too_short_a_history_keeps_the_shipped_margin_and_says_why():
    short = [frame(steady(30, every_s=2 * H, run_s=5 * H)), frame(bursts(12))]
    r = SS.choose(short, ["a", "b"], as_of=AS_OF, **KNOBS)
    assert r["chosen"] is False and r["margin_s"] is None
    assert r["reason"].startswith("history too short on b: ") and "\n" not in r["reason"]


def _cache(name: str, df, all_users: bool = True) -> None:
    ingest.save_cache(name, df, {"last_refresh": AS_OF, "all_users": all_users, "rows": len(df)})


def _config(home, *names: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("".join(f'[clusters.{n}]\nhost = "127.0.0.1"\n\n' for n in names))


def test_the_command_records_the_choice_and_submit_takes_it(chainrun_home):
    _config(chainrun_home, "b")
    a, b = histories()
    _cache("local", a)
    _cache("b", b)
    res = SS.choose_now(["local", "b"], now=AS_OF + 3600, **KNOBS)
    assert res["chosen"] and res["in_force"]["source"] == "chosen"
    f = site_tuned.in_force(["local", "b"])
    assert f["margin_s"] == res["margin_s"] and f["rows"] == res["rows"] and f["window"]["finished"] >= 10
    assert site_tuned.in_force(["b", "local"]) == site_tuned.shipped()  # the order is part of the key
    req = with_site_margin(SubmitRequest(script="/x", script_text="", total_s=3600, workdir="/w"), ["local", "b"])
    assert req.site_margin_s == int(res["margin_s"]) and req.site_margin_source.startswith("chosen ")
    own = with_site_margin(SubmitRequest(script="/x", script_text="", total_s=3600, workdir="/w", site_margin_s=60),
                           ["local", "b"])
    assert (own.site_margin_s, own.site_margin_source) == (60, "--site-margin")
    st = site_tuned.status(["local", "b"])["lists"]["local,b"]
    assert st["recent"][0]["chosen"] and st["in_force"]["margin_s"] == res["margin_s"]


@pytest.mark.parametrize("why", ["missing", "hidden", "short"])
def test_a_missing_short_or_hidden_history_keeps_the_shipped_margin_recorded_with_why(chainrun_home, why):
    _config(chainrun_home, "b")
    a, b = histories()
    _cache("local", a)
    if why == "hidden":
        _cache("b", b, all_users=False)
    elif why == "short":
        _cache("b", frame(bursts(12)))
    res = SS.choose_now(["local", "b"], now=AS_OF, **KNOBS)
    said = {"missing": "no history cached for b (run: chainrun model refresh --cluster b)",
            "hidden": "other users' jobs are hidden on b", "short": "history too short on b: "}[why]
    assert not res["chosen"] and said in res["reason"]
    assert res["summary"].startswith(f"kept the shipped margin {SHIPPED_MARGIN_S / 3600:g}h: ")
    e = site_tuned.status(["local", "b"])["lists"]["local,b"]
    assert e["in_force"]["source"] == "shipped" and said in e["last"]["reason"]
    req = with_site_margin(SubmitRequest(script="/x", script_text="", total_s=3600, workdir="/w"), ["local", "b"])
    assert req.site_margin_s == SHIPPED_MARGIN_S and req.site_margin_source.startswith("shipped")


def test_a_corrupt_store_is_set_aside_and_never_a_traceback(chainrun_home):
    _config(chainrun_home, "b")
    p = site_tuned.path()
    p.write_text('{"version": 1, "lists": {"local,b": {"in_force": {"margin_s": "soon"}}}}')
    assert site_tuned.in_force(["local", "b"]) == site_tuned.shipped()  # submit goes on with the shipped margin
    show = run_cli("model", "sites", "--show", home=chainrun_home)
    assert show.returncode == 0 and "unreadable site margin file" in show.stdout and "Traceback" not in show.stderr
    got = run_cli("model", "sites", "local,b", "--json", home=chainrun_home)  # no history: kept, with why
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)["data"]
    assert data["set_aside"]["moved_to"].startswith(str(p) + ".corrupt-") and not data["chosen"]
    assert json.loads(p.read_text())["lists"]["local,b"]["in_force"]["source"] == "shipped"
    assert list(p.parent.glob("site_margins.json.corrupt-*"))


@pytest.mark.parametrize("args,words", [(["local"], "got 1 cluster"), (["local,zz"], "no cluster 'zz'"),
                                        ([], "give the clusters"), (["local", "--show"], "got 1 cluster")])
def test_bad_input_is_one_line_exit_2(chainrun_home, args, words):
    _config(chainrun_home, "b")
    p = run_cli("model", "sites", *args, home=chainrun_home)
    assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not site_tuned.path().exists()


def test_refresh_re_chooses_the_stored_lists_holding_the_cluster_pins_respected_others_untouched(chainrun_home):
    """`model refresh --cluster local`'s last step (SS.refresh_margins): both lists holding local are
    re-chosen on the caches; the pinned one records its choice and keeps its margin; b,c is not touched."""
    _config(chainrun_home, "b", "c")
    a, b = histories()
    _cache("local", a)
    _cache("b", b)
    _cache("c", b)
    for names in (["local", "b"], ["local", "c"], ["b", "c"]):
        site_tuned.record(names, {"chosen": False, "reason": "stored before"})
    site_tuned.pin(["local", "c"])
    untouched = json.loads(site_tuned.path().read_text())["lists"]["b,c"]
    out = SS.refresh_margins("local", **KNOBS)
    assert sorted(out["lists"]) == ["local,b", "local,c"] and "unreadable" not in out
    ab, ac = out["lists"]["local,b"], out["lists"]["local,c"]
    assert ab["chosen"] and ab["put_in_force"] and site_tuned.in_force(["local", "b"])["margin_s"] == ab["margin_s"]
    assert ac["chosen"] and not ac["put_in_force"] and ac["pinned"]
    assert site_tuned.in_force(["local", "c"]) == site_tuned.shipped()
    assert ac["summary"].startswith(f"chosen {ac['margin_s'] / 3600:g}h, recorded; kept the pinned margin")
    doc = json.loads(site_tuned.path().read_text())["lists"]
    assert doc["b,c"] == untouched
    assert [len(doc[k]["history"]) for k in ("local,b", "local,c")] == [2, 2]
