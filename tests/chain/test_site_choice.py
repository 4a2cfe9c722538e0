"""chainrun.chain.site_choice: where the next segment runs (issue #26), the pure rule the replay and the
driver share."""

import pytest

from chainrun.chain.site_choice import SiteChoice, SiteOption, choose_site, quantile_fn, race_sites, start_estimate

H = 3600.0


def opt(name, wait_h, transfer_h=0.0, pace=1.0, restart_s=600.0):
    return SiteOption(name, {0.1: wait_h * H * 0.5, 0.5: wait_h * H, 0.9: wait_h * H * 1.5}, transfer_h * H,
                      restart_s, pace)


def test_stays_unless_another_site_gains_more_than_the_margin():
    # b's queue is 2 h shorter; a move costs 15 min of transfer: it gains 1.75 h
    small = choose_site("a", [opt("a", 4), opt("b", 2, transfer_h=0.25)], remaining_s=100 * H, margin_s=2 * H)
    assert (small.site, small.move) == ("a", False)
    assert "not more than the margin 2.0 h" in small.reason and "saves 1.8 h" in small.reason
    big = choose_site("a", [opt("a", 4), opt("b", 2, transfer_h=0.25)], remaining_s=100 * H, margin_s=H)
    assert (big.site, big.move) == ("b", True)
    assert big.reason.startswith("move to b:") and "transfer 15 min" in big.reason
    assert big.finish_s["a"] - big.finish_s["b"] == pytest.approx(1.75 * H)


def test_the_transfer_is_charged_in_full_even_when_it_could_hide_in_a_queue_wait():
    c = choose_site("a", [opt("a", 1), opt("b", 0.5, transfer_h=1)], remaining_s=10 * H, margin_s=0)
    assert c.site == "a"  # b starts 30 min sooner but needs an hour of copying
    assert c.finish_s["b"] - c.finish_s["a"] == pytest.approx(0.5 * H)


def test_a_slower_site_pays_for_its_pace_and_its_extra_segments():
    c = choose_site("a", [opt("a", 2), opt("b", 0, pace=0.5)], remaining_s=40 * H, margin_s=0, segment_s=47 * H,
                    boundary_s=H)
    est = {e.name: e for e in c.estimates}
    assert est["b"].segments == 2 and est["a"].segments == 1  # 80 h of wall time at half the pace
    assert c.site == "a" and est["b"].finish_s == pytest.approx(est["b"].wait_s + 600 + 80 * H + H)


def test_a_wait_shorter_than_the_time_to_the_hand_over_point_gains_nothing():
    # both successors would start before the live segment's hand-over point in 6 h: no reason to move
    c = choose_site("a", [opt("a", 3), opt("b", 0)], remaining_s=50 * H, margin_s=0, ready_in_s=6 * H)
    assert c.site == "a" and c.finish_s["a"] == c.finish_s["b"]


def test_a_first_placement_starts_from_the_preferred_site_and_is_never_a_move():
    same = choose_site(None, [opt("a", 1), opt("b", 1)], remaining_s=10 * H, margin_s=0)
    assert (same.site, same.move) == ("a", False) and same.reason.startswith("start on a")
    other = choose_site(None, [opt("a", 10), opt("b", 1)], remaining_s=10 * H, margin_s=H)
    assert (other.site, other.move) == ("b", False) and other.reason.startswith("start on b")
    kept = choose_site(None, [opt("a", 1.5), opt("b", 1)], remaining_s=10 * H, margin_s=H)
    assert kept.site == "a"  # 30 min better is within the margin: the preference holds


def test_a_current_site_that_is_not_an_option_is_left_for_the_earliest_finish():
    c = choose_site("gone", [opt("a", 3), opt("b", 1, transfer_h=0.25)], remaining_s=H, margin_s=10 * H)
    assert (c.site, c.move) == ("b", True) and "gone is not available" in c.reason


def test_wait_distributions_mapping_function_or_prediction():
    q = quantile_fn({0.9: 300.0, 0.1: 100.0, 0.5: 50.0})  # unordered, not monotone: made monotone
    assert q(0.05) == 100.0 and q(0.5) == 100.0 and q(0.99) == 300.0 and q(0.7) == pytest.approx(200.0)
    assert start_estimate(lambda lv: lv * 1000) == 500.0 and start_estimate(lambda lv: lv * 1000, 900.0) == 900.0
    # the median, not a mean over a tail the model may blow up (thousands of hours at p90)
    assert start_estimate({0.1: 60.0, 0.5: 3600.0, 0.9: 1e7}) == 3600.0

    class Pred:
        def quantile(self, lv):
            return 7.0

    assert start_estimate(Pred(), ready_in_s=5.0) == 7.0 and start_estimate(Pred(), ready_in_s=9.0) == 9.0
    assert choose_site("a", [SiteOption("a", Pred())], remaining_s=H, margin_s=0).as_dict()["site"] == "a"


@pytest.mark.parametrize("options,fragment", [
    ([], "no site"),
    ([opt("a", 1), opt("a", 2)], "listed twice"),
    ([opt("a", 1, pace=0.0)], "pace must be positive"),
])
def test_bad_options_raise(options, fragment):
    with pytest.raises(ValueError, match=fragment):
        choose_site("a", options, remaining_s=H, margin_s=0)


def test_a_race_skips_a_site_where_the_chain_started_at_once_is_done_later_than_on_the_rules_site():
    # c runs at 0.6 of the pace: 100 h of work take it 167 h, later than a's 4 h wait plus 100 h
    choice = choose_site(None, [opt("a", 4), opt("b", 6), opt("c", 0, pace=0.6)], remaining_s=100 * H, margin_s=0)
    raced, skipped = race_sites(choice, ["a", "b", "c"])
    assert choice.site == "a" and raced == ["a", "b"]  # b, like a, is done sooner if it starts sooner
    assert list(skipped) == ["c"] and skipped["c"].startswith("not raced on c: done in ~166.8 h even starting now") and "on a" in skipped["c"]
    # a queue on a long enough for the slower site to win by starting now: it races too
    long = choose_site(None, [opt("a", 70), opt("c", 0, pace=0.6)], remaining_s=100 * H, margin_s=0)
    assert race_sites(long, ["a", "c"]) == (["a", "c"], {})


def test_a_race_takes_every_site_alike_and_every_site_not_weighed():
    alike = choose_site(None, [opt("a", 0), opt("b", 3)], remaining_s=50 * H, margin_s=H)
    assert race_sites(alike, ["a", "b"]) == (["a", "b"], {})  # equal pace, no transfer: b ties at best
    moved = choose_site("a", [opt("a", 0.1), opt("b", 0, transfer_h=0.25)], remaining_s=50 * H, margin_s=0)
    assert race_sites(moved, ["a", "b"])[0] == ["a"]  # b's copy alone takes longer than a's wait
    assert race_sites(None, ["a", "b"]) == (["a", "b"], {})
    unweighed = SiteChoice("a", False, "start on a, the first cluster: its wait is unknown", moved.estimates[1:])
    assert race_sites(unweighed, ["a", "b"]) == (["a", "b"], {})  # the rule's own site has no estimate
