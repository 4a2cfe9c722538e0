"""Segment 0's placement names the clusters it could not weigh (issue 26: "say every decision and its
numbers"): a cluster with no wait at submit (no model answer, and ``sbatch --test-only`` gave no start)
is named with why in the decision's reason (the ``segment 0:`` site event), in ``site_choice.left_out``
(``status --json``) and in ``status CHAIN``, as later decisions name theirs (test_site_left_out.py);
the decision says why the preferred cluster was used."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from chainrun.chain import site_plan, summary
from chainrun.chain.sites import _place_first
from chainrun.cli import tables
from tests.chain.test_first_wait import H, T0, Queue, chain

NO_START = "Slurm gives it no start (sbatch --test-only)"


@pytest.fixture(autouse=True)
def nothing_declared(monkeypatch, tmp_path):
    monkeypatch.setattr(site_plan, "declared_by_site", lambda names: {})
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))  # no model trained anywhere


def slurm(**starts):
    """Each site's wait as Slurm's ``--test-only`` start gives it (None: it gave none)."""
    return {n: site_plan.test_only_wait(None if s is None else T0 + s, T0) for n, s in starts.items()}


def test_a_second_cluster_without_a_wait_is_named_and_the_first_is_used():
    choice = site_plan.first_site(chain(), ["a", "b"], slurm(a=60, b=None))
    assert (choice.site, choice.move) == ("a", False)
    assert choice.left_out == (("b", NO_START),)
    assert choice.reason == ("start on a, the first cluster: done in ~10.2 h (start ~1 min); no other cluster has "
                             f"a wait to weigh against it; b not weighed: {NO_START}"), choice.reason
    assert choice.as_dict()["left_out"] == {"b": NO_START} and [e.name for e in choice.estimates] == ["a"]


def test_a_first_cluster_without_a_wait_is_kept_and_the_decision_says_why():
    """b would start at once, but a's wait is unknown: no comparison, the order of preference decides."""
    choice = site_plan.first_site(chain(), ["a", "b"], slurm(a=None, b=0))
    assert choice.site == "a" and choice.left_out == (("a", NO_START),)
    assert choice.reason == ("start on a, the first cluster: its wait is unknown, so it cannot be weighed against "
                             f"the others (b done in ~10.2 h (start ~0 min)); a not weighed: {NO_START}"), choice.reason
    none = site_plan.first_site(chain(), ["a", "b"], slurm(a=None, b=None))
    assert none.site == "a" and dict(none.left_out) == {"a": NO_START, "b": NO_START} and none.estimates == ()
    assert none.reason.startswith("start on a, the first cluster: no cluster has a wait to weigh; a not weighed"), \
        none.reason


def test_with_three_clusters_the_ones_with_a_wait_are_weighed_and_the_other_named():
    c = chain()
    c.extra["sites"] = ["a", "b", "c"]
    choice = site_plan.first_site(c, ["a", "b", "c"], slurm(a=5 * H, b=0, c=None))
    assert choice.site == "b" and choice.reason.startswith("start on b: done in ~"), choice.reason
    assert choice.reason.endswith(f"; c not weighed: {NO_START}") and choice.left_out == (("c", NO_START),)


def test_the_placement_is_recorded_with_the_cluster_left_out_and_status_shows_it():
    c = chain()
    sites = [SimpleNamespace(name=n, slurm=Queue(), notes={}) for n in ("a", "b")]
    _place_first(c, sites, {"a": c, "b": c}, {"a": time.time() + 60, "b": None})  # b: no start from Slurm
    rec = c.extra["site_choice"]
    assert rec["site"] == "a" and rec["for"] == 0 and rec["left_out"] == {"b": NO_START}, rec
    assert set(rec["waits"]) == {"a"} and rec["waits"]["a"]["from"] == site_plan.TEST_ONLY
    placed = c.extra["first_placement"]  # create_chain's `segment 0:` site event says this reason
    assert placed["site"] == "a" and f"b not weighed: {NO_START}; waits: a " in placed["reason"], placed
    lines = tables.site_lines(summary.view_chain(c, [], rec["at"]), rec["at"])
    assert any(ln.startswith("placement of segment 0 (") and ln.endswith(f"b not weighed: {NO_START}")
               for ln in lines), lines
