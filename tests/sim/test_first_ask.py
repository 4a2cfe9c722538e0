"""The replay's first ask of a poll (chainrun/sim/chains.py ``first_ask``), shared by the one-cluster
and the several-cluster replay: predicted's guard skips the asks before it opens, and the first ask
is the watcher's first tick at or after that moment, on the tick grid from the segment's start."""

from __future__ import annotations

from chainrun.sim.chains import first_ask

TICK = 600.0
START = 1000.0


class _Guarded:
    def __init__(self, earliest):
        self._earliest = earliest

    def earliest(self, view):
        assert view == "view"  # built only when the policy has a guard
        return self._earliest


def _view():
    return "view"


def test_a_guard_opening_between_ticks_is_first_asked_on_the_next_tick():
    assert first_ask(START, START, _Guarded(START + 2.5 * TICK), _view, TICK) == START + 3 * TICK
    assert first_ask(START, START, _Guarded(START + 0.01), _view, TICK) == START + TICK


def test_a_guard_opening_on_a_tick_is_asked_on_that_tick():
    assert first_ask(START, START, _Guarded(START + 4 * TICK), _view, TICK) == START + 4 * TICK


def test_candidates_whose_guards_open_within_one_tick_ask_first_at_the_same_moment():
    firsts = {first_ask(START, START, _Guarded(START + 7 * TICK + d), _view, TICK) for d in (1.0, 200.0, 599.0)}
    assert firsts == {START + 8 * TICK}


def test_no_guard_or_a_guard_already_open_keeps_the_poll_where_it_is():
    class Plain:  # reactive, lead: no earliest at all
        pass

    later = START + 5 * TICK + 17.0  # a poll that resumes off the grid stays there
    assert first_ask(later, START, Plain(), _view, TICK) == later
    assert first_ask(later, START, _Guarded(None), _view, TICK) == later
    assert first_ask(later, START, _Guarded(START + TICK), _view, TICK) == later
