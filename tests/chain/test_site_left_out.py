"""A site the decision could not weigh (issue 26): the decision's event and its record (``status --json``:
``site_choice``) name it and why, instead of reading as if the chain had one site."""

from __future__ import annotations

from types import SimpleNamespace

from chainrun.chain import planning, site_plan
from chainrun.errors import TransientSlurmError
from chainrun.state.records import RUNNING, Segment
from tests.chain.test_site_pace import H, T0, chain, tick

DEAD = "ssh b: ssh: connect to host 127.0.0.1 port 1: Connection refused\r\nsecond line never shown"


def unreachable(t, site: str) -> None:
    """``site``'s cluster does not answer: its squeue (its model reads the queue) fails as over a dead port."""
    def fails(view, probe, queue):
        raise TransientSlurmError(DEAD)

    t.sites.engine(site).predictor = fails


def site_events(t, c) -> list[str]:
    return [e.message for _, e in t.store.events(c.id, limit=20) if e.kind == "site"]


def test_an_unreachable_site_is_named_with_why_in_the_event_and_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    c = chain("a")
    cur = Segment(chain_id=c.id, idx=2, phase=RUNNING, start=T0, cluster=None)
    t = tick(tmp_path, c, [cur], {"a": 0, "b": 0})
    unreachable(t, "b")
    assert planning._where(t, c, cur, 20 * H, None, T0) is None  # stays on a, the one site weighed
    rec = c.extra["site_choice"]
    why = "cannot reach it (ssh b: ssh: connect to host 127.0.0.1 port 1: Connection refused)"
    assert rec["site"] == "a" and rec["left_out"] == {"b": why}, rec
    assert [e["site"] for e in rec["estimates"]] == ["a"]
    assert rec["reason"].endswith(f"the earliest; b not weighed: {why}"), rec["reason"]
    assert site_events(t, c) == [f"next segment: {rec['reason']}"]
    # the same decision next tick is no news; b answering again is (the event no longer names it)
    planning._where(t, c, cur, 20 * H, None, T0 + 60)
    assert len(site_events(t, c)) == 1
    t.sites.engine("b").predictor = t.predictor
    planning._where(t, c, cur, 20 * H, None, T0 + 120)
    said = site_events(t, c)
    assert len(said) == 2 and "not weighed" not in said[-1] and "next b" in said[-1], said
    assert "left_out" not in c.extra["site_choice"]


def test_a_site_slurm_gives_no_start_is_named_too(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    c = chain("a")
    cur = Segment(chain_id=c.id, idx=2, phase=RUNNING, start=T0, cluster=None)
    t = tick(tmp_path, c, [cur], {"a": 1, "b": 0})
    b = t.sites.engine("b")
    b.predictor, b.slurm = None, SimpleNamespace(test_only=lambda *a, **k: None)  # no model; Slurm: no start
    choice, waits = site_plan.choose(t, c, cur, remaining_s=20 * H, handover_at=None, now=T0)
    assert choice.site == "a" and set(waits) == {"a"}
    assert choice.left_out == (("b", "Slurm gives it no start (sbatch --test-only)"),)
    assert choice.reason.endswith("; b not weighed: Slurm gives it no start (sbatch --test-only)"), choice.reason


def test_a_long_error_is_cut_to_one_clause():
    long = TransientSlurmError("x" * 300 + "\nmore")
    got = site_plan._short(long)
    assert len(got) == 120 and got.endswith("...") and "\n" not in got
