"""The driver's steps for a move between clusters (chain/move_steps.py): the order that keeps one copy."""

from __future__ import annotations

import itertools
import random

from chainrun.chain.move_steps import (
    ABANDONED, AHEAD, ASK_HANDOFF, COPY, FENCE, FENCED, GO, GO_AHEAD, Checkpoint, Seen, next_step, resume_from,
)

C10 = Checkpoint(generation=3, step=10, size_bytes=8 << 30)
C20 = Checkpoint(generation=3, step=20, size_bytes=8 << 30)


def seen(**kw) -> Seen:
    base = dict(successor="PENDING", predecessor_live=True, released=False, newest=C10, copied=None)
    return Seen(**{**base, **kw})


def kinds(step) -> list[str]:
    return [a for a, _ in step.actions]


def test_while_the_predecessor_trains_the_newest_checkpoint_is_copied_ahead_once():
    s = next_step(AHEAD, seen())
    assert s.phase == AHEAD and s.actions == [(COPY, C10)]
    assert next_step(AHEAD, seen(copying=True)).actions == []  # one copy at a time
    assert next_step(AHEAD, seen(copied=C10)).actions == []  # already there
    assert next_step(AHEAD, seen(newest=C20, copied=C10)).actions == [(COPY, C20)]  # a newer one appeared


def test_a_running_successor_fences_the_old_site_then_asks_the_predecessor_to_hand_off():
    s = next_step(AHEAD, seen(successor="RUNNING", copied=C10))
    assert s.phase == FENCED and kinds(s) == [FENCE, ASK_HANDOFF]


def test_while_copies_to_the_new_site_fail_the_predecessor_is_not_asked_to_stop_training():
    # a broken route (no transport for copies, rsync missing, disk full there): fenced, but it trains on
    s = next_step(AHEAD, seen(successor="RUNNING", copy_failing=True))
    assert s.phase == FENCED and kinds(s) == [FENCE, COPY] and "predecessor trains on" in s.why
    s = next_step(FENCED, seen(successor="RUNNING", copy_failing=True))
    assert ASK_HANDOFF not in kinds(s)
    # a copy works again: asked now, once
    s = next_step(FENCED, seen(successor="RUNNING", copied=C10))
    assert kinds(s) == [ASK_HANDOFF]
    assert ASK_HANDOFF not in kinds(next_step(FENCED, seen(successor="RUNNING", copied=C10, asked=True)))
    # never when it stopped by itself meanwhile
    assert ASK_HANDOFF not in kinds(next_step(FENCED, seen(successor="RUNNING", released=True, copied=C10)))


def test_a_predecessor_that_ended_first_is_fenced_but_not_asked():
    s = next_step(AHEAD, seen(predecessor_live=False, copied=C10))
    assert s.phase == FENCED and kinds(s) == [FENCE]


def test_no_go_ahead_while_the_predecessor_may_still_train():
    assert kinds(next_step(FENCED, seen(successor="RUNNING", copied=C10, asked=True))) == []
    # site A does not answer: nothing is known to have stopped, so the move stalls
    s = next_step(FENCED, seen(successor="RUNNING", predecessor_live=None, released=None, newest=None, copied=C10))
    assert s.phase == FENCED and GO_AHEAD not in kinds(s)


def test_after_the_release_the_final_checkpoint_is_copied_then_verified_then_go():
    s = next_step(FENCED, seen(successor="RUNNING", released=True, newest=C20, copied=C10))
    assert s.phase == FENCED and s.actions == [(COPY, C20)]
    assert next_step(FENCED, seen(successor="RUNNING", released=True, newest=C20, copied=C10, copying=True)).actions == []
    s = next_step(FENCED, seen(successor="RUNNING", released=True, newest=C20, copied=C20))
    assert s.phase == GO and s.actions == [(GO_AHEAD, C20)]


def test_resume_from_the_copy_ahead_when_redoing_its_steps_costs_less_than_the_transfer():
    # 10 steps of 1 s to redo against 8 GiB at 100 MB/s (86 s): resume from the copy ahead
    fast = seen(released=True, newest=C20, copied=C10, step_s=1.0, throughput_bps=100e6)
    assert resume_from(fast) == C10
    assert next_step(FENCED, fast).actions == [(GO_AHEAD, C10)]
    # 10 steps of 60 s against the same transfer: wait for the final checkpoint
    slow = seen(released=True, newest=C20, copied=C10, step_s=60.0, throughput_bps=100e6)
    assert resume_from(slow) == C20
    # costs unknown: no work is thrown away
    assert resume_from(seen(released=True, newest=C20, copied=C10)) == C20


def test_a_successor_that_ended_before_its_go_ahead_abandons_the_move():
    for phase in (AHEAD, FENCED):
        assert next_step(phase, seen(successor="ENDED")).phase == ABANDONED
    assert next_step(GO, seen(successor="ENDED")).phase == GO  # after the go-ahead it is a normal segment


def test_never_a_go_ahead_unless_the_predecessor_stopped_and_the_named_checkpoint_is_on_the_new_site():
    rng = random.Random(7)
    ckpts = [None, C10, C20]
    cases = itertools.product([AHEAD, FENCED], ["SUBMITTING", "PENDING", "RUNNING", "ENDED"], [True, False, None],
                              [True, False, None], ckpts, ckpts, [False, True], [False, True], [False, True])
    n = 0
    for phase, succ, live, released, newest, copied, copying, failing, asked in cases:
        s = seen(successor=succ, predecessor_live=live, released=released, newest=newest, copied=copied,
                 copying=copying, step_s=rng.choice([0.0, 1.0, 60.0]), throughput_bps=rng.choice([0.0, 1e8]),
                 copy_failing=failing, asked=asked)
        step = next_step(phase, s)
        for kind, target in step.actions:
            if kind == ASK_HANDOFF:
                assert not failing and live is not False and released is not True, (phase, s)
                assert not (asked and phase == FENCED), "asked once"
            if kind == GO_AHEAD:
                n += 1
                assert live is False or released is True, (phase, s)
                assert copied is not None and target == copied, (phase, s)
                assert phase == FENCED, "the old site is fenced in an earlier tick than the go-ahead"
            if kind == COPY:
                assert not copying, "one copy at a time"
        if step.phase == GO:
            assert kinds(step) == [GO_AHEAD]
    assert n > 0
