"""The elastic-shape rule (chainrun.chain.shapes): parsing, rates, and the choice."""

import pytest

from chainrun.chain.pace import shape_rate
from chainrun.chain.shapes import choose_shape, finish_estimate, parse_shapes
from chainrun.errors import UsageError


def test_parse_shapes_keeps_order_first_is_reference():
    assert parse_shapes("8,4,2") == (8, 4, 2)
    assert parse_shapes(" 4 , 2 ") == (4, 2)


@pytest.mark.parametrize("text, words", [
    ("0", "at least 1 node"), ("4,x", "'x' is not a node count"), ("4,,2", "separated by commas"),
    ("4,4", "listed twice"), ("5", "the partition has 4"), ("-1", "is not a node count"), ("2.5", "not a node"),
])
def test_parse_shapes_errors_are_one_line(text, words):
    with pytest.raises(UsageError) as e:
        parse_shapes(text, max_nodes=4)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_rate_linear_then_measured():
    assert shape_rate(2, 4) == pytest.approx(0.5)
    assert shape_rate(2, 4, efficiency={2: 0.8}) == pytest.approx(0.4)
    # measured on both shapes: the ratio of paces, whatever the efficiency says
    assert shape_rate(2, 4, measured={4: 10.0, 2: 6.0}, efficiency={2: 0.5}) == pytest.approx(0.6)
    # measured on the reference only: linear from it
    assert shape_rate(2, 4, measured={4: 10.0}) == pytest.approx(0.5)
    # measured on the small shape only: the reference is scaled from it
    assert shape_rate(2, 4, measured={2: 6.0}) == pytest.approx(0.5)
    assert shape_rate(4, 4, measured={2: 6.0}) == pytest.approx(1.0)


def test_finish_counts_boundaries_of_the_slower_shape():
    assert finish_estimate(10 * 3600, 0, 1.0, segment_s=10 * 3600, boundary_s=600) == (10 * 3600, 1)
    t, n = finish_estimate(10 * 3600, 0, 0.5, segment_s=10 * 3600, boundary_s=600)
    assert n == 2 and t == 20 * 3600 + 600


def test_small_shape_wins_when_the_big_one_waits_long():
    c = choose_shape(4 * 3600, (4, 2), {4: 12 * 3600, 2: 60}, segment_s=48 * 3600, boundary_s=3600)
    assert c.nodes == 2 and "2 nodes" in c.reason
    assert [o.nodes for o in c.options] == [4, 2]


def test_reference_kept_unless_the_saving_beats_the_margin():
    # 2 nodes would finish 5 min earlier: not worth a change of shape
    c = choose_shape(3600, (4, 2), {4: 3600 + 300, 2: 0}, segment_s=48 * 3600, boundary_s=0)
    assert c.nodes == 4 and "reference" in c.reason


def test_no_prediction_keeps_the_reference():
    assert choose_shape(3600, (8, 4), {}, segment_s=3600, boundary_s=0).nodes == 8
    # a shape without a prediction is not a candidate
    c = choose_shape(3600, (8, 4), {8: 10.0}, segment_s=3600, boundary_s=0)
    assert c.nodes == 8 and [o.nodes for o in c.options] == [8]


# ---- the filler (choose_filler): a smaller shape while the reference only queues ---------------
def test_filler_when_the_reference_queues_long_and_a_smaller_shape_starts_now():
    from chainrun.chain.shapes import choose_filler

    # 4 nodes in 2 h, 2 nodes now: 2 nodes do 0.5 x (7200 - 0 - 300) = 3450 s of 4-node work first
    c = choose_filler((4, 2, 1), {4: 7200, 2: 0, 1: 0}, boundary_s=300, margin=2)
    assert c is not None and c.filler and c.nodes == 2
    gains = {o.nodes: o.gain_s for o in c.options}
    assert gains == pytest.approx({4: 0.0, 2: 3450.0, 1: 1725.0})  # the larger gain wins
    assert c.reason.startswith("filler on 2 nodes while 4 nodes queue (~2.0 h)")
    assert c.as_dict()["filler"] is True and c.as_dict()["options"][1]["gain_s"] == 3450.0


def test_no_filler_when_the_gain_does_not_pay_the_margin():
    from chainrun.chain.shapes import choose_filler

    # 0.5 x (1500 - 0 - 300) = 600: exactly the margin (2 boundaries of 300 s) is enough, a second less is not
    assert choose_filler((4, 2), {4: 1500, 2: 0}, boundary_s=300, margin=2).nodes == 2
    assert choose_filler((4, 2), {4: 1499, 2: 0}, boundary_s=300, margin=2) is None
    # in the chain's own scale: a 20 s boundary, 2 nodes gain 0.5 x (300 - 20) = 140 s >= 6 x 20 s
    assert choose_filler((4, 2), {4: 300, 2: 0}, boundary_s=20, margin=6).nodes == 2
    assert choose_filler((4, 2), {4: 250, 2: 0}, boundary_s=20, margin=6) is None  # 115 s < 120 s
    # ... but never less than a minute of reference work: 0.5 x (130 - 20) = 55 s, 2 boundaries 40 s
    assert choose_filler((4, 2), {4: 130, 2: 0}, boundary_s=20, margin=2) is None
    # the smaller shape waits as long as the reference: nothing to fill
    assert choose_filler((4, 2), {4: 7200, 2: 7200}, boundary_s=300, margin=6) is None
    # no prediction for the reference (or no other shape): None
    assert choose_filler((4, 2), {2: 0}, boundary_s=300, margin=6) is None
    assert choose_filler((4,), {4: 7200}, boundary_s=300, margin=6) is None
    # the shipped default: no filler at all (the replay's pick), whatever the gain
    assert choose_filler((4, 2, 1), {4: 7200, 2: 0, 1: 0}, boundary_s=300) is None


def test_filler_option_is_a_positive_number_of_boundaries():
    from chainrun.chain.shapes import parse_filler
    from chainrun.errors import UsageError

    assert parse_filler(None) is None and parse_filler(6) == 6.0 and parse_filler(0.5) == 0.5
    for bad in (0, -2, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="--filler"):
            parse_filler(bad)


def test_filler_gain_uses_the_measured_rate():
    from chainrun.chain.shapes import choose_filler

    # 2 nodes measured at 0.3 of the 4-node pace: 0.3 x (3600 - 600) = 900 < 1200, linear would say 1500
    assert choose_filler((4, 2), {4: 3600, 2: 0}, boundary_s=600, measured={4: 10.0, 2: 3.0}, margin=2) is None
    assert choose_filler((4, 2), {4: 3600, 2: 0}, boundary_s=600, margin=2).nodes == 2
