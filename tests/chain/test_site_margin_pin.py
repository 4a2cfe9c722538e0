"""Pin, unpin and roll back a site margin (chainrun/chain/site_tuned.py, `chainrun model sites a,b --pin |
--unpin | --rollback`), with `model tune`'s semantics (chain/tuned.py): a pinned list records later choices
and keeps its margin; a rollback puts the margin in force before the current one back (the shipped one when
none) and pins it; bad input is one line, a non-zero exit and the file unchanged. Real files under a tmp
CHAINRUN_HOME; the CLI in a subprocess."""

from __future__ import annotations

import json

import pytest

from chainrun.chain import site_tuned
from chainrun.chain.create import SubmitRequest
from chainrun.chain.site_choice import SHIPPED_MARGIN_S
from chainrun.chain.sites import with_site_margin
from chainrun.sim import site_selftune as SS
from tests.cli.test_cli_errors import no_traceback
from tests.conftest import run_cli

H = 3600.0
AB = ["local", "b"]


def chose(margin_s: float | None, names=AB) -> dict:
    """One choice's outcome as choose_now records it (the replay itself: tests/sim/test_site_selftune.py)."""
    res = {"clusters": names, "chosen": margin_s is not None, "margin_s": margin_s,
           "reason": "test" if margin_s else "history too short on b: test"}
    return site_tuned.record(names, {**res, "summary": SS.summary_line(res, site_tuned.in_force(names),
                                                                       pinned=site_tuned.is_pinned(names))})


def config(home) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text('[clusters.b]\nhost = "127.0.0.1"\n\n[clusters.c]\nhost = "127.0.0.1"\n')


def test_a_pinned_margin_stays_while_choices_are_recorded_and_rollback_goes_back_then_to_the_shipped(chainrun_home):
    chose(3 * H)
    assert site_tuned.in_force(AB)["margin_s"] == 3 * H and not site_tuned.is_pinned(AB)
    e = site_tuned.pin(AB)
    assert e["pinned"] and e["in_force"]["source"] == "chosen"
    e = chose(6 * H)  # recorded, not put in force: pinned
    assert site_tuned.in_force(AB)["margin_s"] == 3 * H
    assert e["last"] == {**e["last"], "chosen": True, "put_in_force": False} and e["history"][-1]["margin_s"] == 6 * H
    assert e["last"]["summary"].startswith("chosen 6h, recorded; kept the pinned margin 3h (chainrun model sites "
                                           "local,b --unpin lets choices in): ")
    assert site_tuned.in_force(["b", "local"]) == site_tuned.shipped()  # the other order is another list
    site_tuned.pin(AB, on=False)
    chose(6 * H)
    assert site_tuned.in_force(AB)["margin_s"] == 6 * H
    chose(None)  # a choice that could not be made changes nothing, and is no margin to roll back to
    e = site_tuned.rollback(AB)  # back to what was in force before, pinned
    assert e["pinned"] and e["in_force"]["source"] == "rollback" and e["set_aside"] is None
    assert (e["in_force"]["margin_s"], e["in_force"]["rolled_back_from"]) == (3 * H, 6 * H)
    st = site_tuned.status(AB)["lists"]["local,b"]
    assert (st["pinned"], st["source"], st["in_force"]["margin_s"]) == (True, "rollback", 3 * H)
    assert [h["put_in_force"] for h in st["recent"]] == [False, True, False, True]  # newest first
    req = with_site_margin(SubmitRequest(script="/x", script_text="", total_s=3600, workdir="/w"), AB)
    assert req.site_margin_s == 3 * H and req.site_margin_source.startswith("rolled back ")
    chose(1 * H)  # pinned after a rollback: the next choice does not put anything back
    assert site_tuned.in_force(AB)["margin_s"] == 3 * H
    e = site_tuned.rollback(AB)  # 3h had the shipped margin before it
    assert e["in_force"]["margin_s"] == SHIPPED_MARGIN_S and e["pinned"]


def test_rollback_of_choices_recorded_before_pins_existed_goes_to_the_choice_before(chainrun_home):
    """An older chainrun stored no ``put_in_force``/``previous``: every choice went in force."""
    old = {"version": 1, "lists": {"local,b": {
        "in_force": {"margin_s": 6 * H, "source": "chosen", "since": 2.0},
        "history": [{"chosen": True, "margin_s": 2 * H, "at": 1.0}, {"chosen": False, "margin_s": None, "at": 1.5},
                    {"chosen": True, "margin_s": 6 * H, "at": 2.0}]}}}
    site_tuned.save(old)
    assert site_tuned.rollback(AB)["in_force"]["margin_s"] == 2 * H
    assert site_tuned.rollback(AB)["in_force"]["margin_s"] == SHIPPED_MARGIN_S


def test_pin_refuses_an_unreadable_file_and_rollback_sets_it_aside_for_the_shipped_margin_pinned(chainrun_home):
    from chainrun.errors import ModelError

    p = site_tuned.path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("{not json")
    for on in (True, False):
        with pytest.raises(ModelError, match="unreadable"):
            site_tuned.pin(AB, on=on)
    assert p.read_text() == "{not json" and not list(p.parent.glob("site_margins.json.corrupt-*"))
    e = site_tuned.rollback(AB)
    kept = list(p.parent.glob("site_margins.json.corrupt-*"))
    assert e["set_aside"]["moved_to"] == str(kept[0]) and kept[0].read_text() == "{not json"
    assert e["pinned"] and e["in_force"]["margin_s"] == SHIPPED_MARGIN_S
    assert json.loads(p.read_text())["lists"]["local,b"]["pinned"] is True


@pytest.mark.parametrize("args,code,words", [
    (["local", "--pin"], 2, "got 1 cluster"),
    (["local,zz", "--rollback"], 2, "no cluster 'zz'"),
    (["local,b", "--pin", "--unpin"], 2, "give one of --show, --pin, --unpin, --rollback"),
    (["local,b", "--rollback", "--show"], 2, "give one of"),
    (["--unpin"], 2, "need the clusters"),
    (["b,c", "--rollback"], 3, "no site margin stored for b,c: nothing to roll back"),
])
def test_bad_input_is_one_line_a_non_zero_exit_and_the_file_unchanged(chainrun_home, args, code, words):
    config(chainrun_home)
    chose(3 * H)
    before = site_tuned.path().read_text()
    out = run_cli("model", "sites", *args, home=chainrun_home)
    errors = no_traceback(out)
    assert out.returncode == code and out.stdout == "" and len(errors) == 1 and words in errors[0], out.stderr
    assert site_tuned.path().read_text() == before


def test_the_command_pins_unpins_rolls_back_and_shows_pinned_and_source(chainrun_home):
    config(chainrun_home)
    chose(3 * H)
    chose(6 * H)
    out = run_cli("model", "sites", "local,b", "--pin", home=chainrun_home)
    assert out.returncode == 0 and out.stdout.startswith("site margin for local,b: pinned 6h (chosen "), out.stderr
    # re-choosing a pinned list (no history cached here: not chosen) records and keeps the pinned margin, and says so
    out = run_cli("model", "sites", "local,b", home=chainrun_home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("site margin for local,b: kept the pinned margin 6h (chainrun model sites local,b "
                                 "--unpin lets choices in): no history cached for local"), out.stdout
    assert "in force: 6h (chosen " in out.stdout and "; pinned)" in out.stdout
    out = run_cli("model", "sites", "local,b", "--unpin", "--json", home=chainrun_home)
    data = json.loads(out.stdout)["data"]
    assert (data["pinned"], data["source"], data["in_force"]["margin_s"]) == (False, "chosen", 6 * H)
    out = run_cli("model", "sites", "local,b", "--rollback", home=chainrun_home)
    line = out.stdout.strip()
    assert out.returncode == 0 and line.startswith("site margin for local,b: rolled back to 3h (rolled back 20"), line
    assert line.endswith(" from 6h); pinned"), line
    show = run_cli("model", "sites", "--show", home=chainrun_home)
    assert show.returncode == 0 and show.stdout.startswith("local,b: 3h (rolled back ") and "; pinned)" in show.stdout
    data = json.loads(run_cli("model", "sites", "local,b", "--show", "--json", home=chainrun_home).stdout)["data"]
    e = data["lists"]["local,b"]
    assert (e["pinned"], e["source"], e["in_force"]["margin_s"]) == (True, "rollback", 3 * H)
    assert len(json.loads(site_tuned.path().read_text())["lists"]["local,b"]["history"]) == 3
