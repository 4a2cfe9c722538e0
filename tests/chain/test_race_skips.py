"""--race does not race on a cluster where it cannot win (issue 26; site_choice.race_sites): segment 0 at
submit is weighed by the first placement's rule (sites._place_first, which places nothing for a race),
and a cluster where the chain, even started at once, is done later than on the rule's cluster after its
median wait (here: a declared pace of 0.3) gets no racer; the race's events say why. With clusters alike
every cluster races (tests/ssh/test_race_slurm.py on two real Slurm clusters)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from chainrun.chain import site_pace, site_plan, site_race
from chainrun.chain.site_choice import race_sites
from chainrun.chain.sites import _place_first
from chainrun.slurm.client import SlurmClient
from chainrun.state.records import ChainSite
from chainrun.state.store import Store
from tests.chain.test_first_wait import Queue, chain
from tests.reliability.fakeslurm import FakeSlurm


@pytest.fixture(autouse=True)
def b_is_slow(monkeypatch, tmp_path):
    monkeypatch.setattr(site_plan, "declared_by_site", lambda names: {"b": site_pace.Declared(pace=0.3)})
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))  # no model trained anywhere


def test_segment_0_is_weighed_for_a_race_but_not_placed():
    c = chain()
    sites = [SimpleNamespace(name=n, slurm=Queue(), notes={}) for n in ("a", "b")]
    choice = _place_first(c, sites, {"a": c, "b": c}, {"a": time.time() + 1800, "b": time.time()}, race=True)
    assert choice.site == "a" and "first_placement" not in c.extra and "site_choice" not in c.extra
    raced, skipped = race_sites(choice, ["a", "b"])
    assert raced == ["a"] and skipped == {"b": "not raced on b: done in ~34.0 h even starting now, against ~10.7 h "
                                                "on a (start ~30 min)"}, skipped
    # without the declared pace both would race: b, started now, is done no later than a after its wait
    alike = site_plan.first_site(c, ["a", "b"], {})
    assert race_sites(alike, ["a", "b"]) == (["a", "b"], {})


def test_a_racer_is_submitted_only_where_it_could_win(tmp_path):
    store = Store(tmp_path / "state.db")
    c = chain()
    c.id, c.total_s, c.segment_s, c.policy = "race-0001", 600, 1200, "reactive"
    c.extra["race"] = {"phase": "preparing", "idx": 0, "sites": ["a"], "racers": {},
                       "skipped": {"b": "not raced on b: done in ~33.5 h even starting now"}}
    sites = [ChainSite(c.id, n, i, f"/{n}", f"/{n}/run", f"/{n}/ck", "/s", [], {"segment_s": 1200})
             for i, n in enumerate("ab")]
    store.add_chain(c, sites)
    fakes = {n: FakeSlurm(now=time.time()) for n in "ab"}
    first = site_race.start(store, c, sites, lambda n: (SlurmClient(fakes[n]), fakes[n]))
    race = store.chain(c.id).extra["race"]
    assert first.cluster == "a" and first.job_id and race["sites"] == ["a"] and list(race["racers"]) == ["a"]
    assert fakes["b"].jobs == {} and [j.name for j in fakes["a"].jobs.values()] == [f"cr.{c.id}.0"]
    said = [e.message for _, e in store.events(c.id, kind="race")]
    assert said == ["segment 0 raced on a: the first to start trains, the others are cancelled",
                    "not raced on b: done in ~33.5 h even starting now"], said
    store.close()
